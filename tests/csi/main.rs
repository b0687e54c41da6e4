//! The CSI services, one module per area, all in one test binary (`cargo test --test
//! csi`; one area: `cargo test --test csi csi_chain::`): the whole chain through the
//! real external-provisioner and external-attacher ([`csi_chain`]), csi-sanity, and the
//! cases the sidecars cannot produce at the sockets of a running `tessera controller`
//! and `tessera node`; [`publish_race`] runs the Node service's bind against a symlink
//! race (root, no cluster); [`registrar`] runs the real node-driver-registrar's
//! `/healthz` (its liveness probe in config/) on a `tessera node` socket.
//!
//! Only [`csi_chain`] makes PVCs, Pods or storage VolumeAttachments, which its
//! cluster-wide sidecars act on; the other modules talk to the sockets directly, so
//! they run beside it.

#[path = "../support/mod.rs"]
mod support;

mod csi_capacity;
mod csi_chain;
mod csi_clone_again;
mod csi_default_scope;
mod csi_errors;
mod csi_publish_cache;
mod csi_publish_wait;
mod csi_rwx;
mod csi_sanity;
mod csi_snapshots;
mod publish_race;
mod registrar;
