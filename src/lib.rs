//! Tessera: a Kubernetes storage operator. Pods get volumes through FUSE mounts;
//! who may hold a volume is decided by Longhorn-style attachment tickets.
//!
//! Module map (dependencies point downwards only):
//!
//! ```text
//!   cli        wires the roles (controller, node, mount, crds)
//!    │
//!   controller Volume, VolumeAttachment and reaper controllers (kube-runtime)
//!    │         metrics: Prometheus registry + /metrics, /healthz, /readyz
//!   fuse       the FUSE filesystem of one volume (knows nothing of Kubernetes)
//!    │
//!   tickets    pure arbitration: tickets in, decision out (no I/O)
//!    │
//!   api        CRD types: Volume, VolumeAttachment, MountPod (imports nothing of ours)
//! ```

// kube's `#[kube(printcolumn(..))]` repeats `type_ = …` per column, which clippy's
// duplicated_attributes lint mistakes for a duplicate.
#![allow(clippy::duplicated_attributes)]

pub mod api;
pub mod cli;
pub mod controller;
pub mod csi;
pub mod fuse;
pub mod labels;
pub mod metrics;
pub mod node;
pub mod runtime;
pub mod tickets;
