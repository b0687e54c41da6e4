//! Tessera: a Kubernetes storage operator. Pods get volumes through FUSE mounts;
//! who may hold a volume is decided by Longhorn-style attachment tickets.
//!
//! This crate is the `tessera` and `kubectl-tessera` binaries: [`cli`] wires the
//! roles, each a crate of its own that cannot reach another role (their manifests
//! say so and `tests/arch/deps.sh` checks it; CONTRIBUTING.md draws the tree):
//!
//! ```text
//!   tessera (this crate: cli)       tessera-plugin (kubectl-tessera's judgements)
//!     │
//!     ├── tessera-controller   Volume, VolumeAttachment, reaper, failover controllers
//!     ├── tessera-csi          the CSI Identity, Controller and Node services
//!     └── tessera-node         the node agent: MountPods, FUSE daemons, repairs
//!           │   (controller, csi and node never depend on one another)
//!   tessera-runtime    what the roles share: tracing, client, metrics, signals, CSI serving
//!   tessera-fuse       the FUSE filesystem of one volume (nothing of Kubernetes)
//!   tessera-api        CRD types, names, pure ticket arbitration
//!   tessera-host       the Linux host: mounts, fd-based paths, roots, preflight facts
//!   tessera-csi-proto  the generated CSI gRPC code
//!   tessera-text       durations, quantities of bytes, bounded echoes
//! ```

pub mod cli;
