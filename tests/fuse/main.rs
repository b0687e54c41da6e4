//! The FUSE tests: real `tessera mount` daemons (root and `/dev/fuse` needed), one
//! module per area, all in one test binary (`cargo test --test fuse`; one area:
//! `cargo test --test fuse posix::`). [`support`] starts and stops the daemons.
//!
//! The `backend_quota` tests that need XFS project quotas are `#[ignore]`d; `tests/run.sh`
//! runs them, and only them, with `cargo test --test fuse -- --ignored backend_quota::`
//! (on the host, or in a VM through `tests/vm/xfs-quota.sh`).

mod support;

mod backend_quota;
mod coherence;
mod groups;
mod handoff;
mod inodes;
mod lifecycle;
mod locks;
mod locks_odd;
mod passthrough;
mod posix;
mod quota;
mod readonly;
mod security;
#[path = "../support/sqlite.rs"]
mod sqlite_workload;
