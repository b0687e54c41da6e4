//! Tessera: a Kubernetes storage operator. Pods get volumes through FUSE mounts;
//! who may hold a volume is decided by Longhorn-style attachment tickets.
//!
//! Module map (dependencies point downwards only):
//!
//! ```text
//!   cli         wires the roles (controller, node, mount, crds): the one place where
//!    │          the node agent meets the CSI Node service
//!   controller  Volume, VolumeAttachment and reaper controllers (kube-runtime)
//!   csi         the CSI driver: Identity, Controller (tickets in, awaited by watch),
//!    │          Node (bind mounts); the generated gRPC code
//!   node        the node agent: MountPods of this node, FUSE daemons, repairs
//!    │          (csi and node never import each other)
//!   host        mount table, mount syscalls, path validation (no Kubernetes)
//!   fuse        the FUSE filesystem of one volume (knows nothing of Kubernetes)
//!    │
//!   runtime     what every role shares: tracing, client, metrics endpoint, signals,
//!    │          CSI serving, error chains and kube error context
//!   metrics     Prometheus registry + /metrics, /healthz, /readyz
//!   tickets     pure arbitration: tickets in, decision out (no I/O)
//!    │
//!   api         CRD types: Volume, VolumeAttachment, MountPod (imports nothing of ours)
//!   labels      label selectors from the command line
//! ```

// kube's `#[kube(printcolumn(..))]` repeats `type_ = …` per column, which clippy's
// duplicated_attributes lint mistakes for a duplicate.
#![allow(clippy::duplicated_attributes)]

pub mod api;
pub mod cli;
pub mod controller;
pub mod csi;
pub mod fuse;
pub mod host;
pub mod labels;
pub mod metrics;
pub mod node;
pub mod plugin;
pub mod runtime;
pub mod tickets;
