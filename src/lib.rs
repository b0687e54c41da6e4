//! Tessera: a Kubernetes storage operator. Pods get volumes through FUSE mounts;
//! who may hold a volume is decided by Longhorn-style attachment tickets.
//!
//! This crate is the `tessera` binary's roles over the crates below it. Module map
//! (a module imports only those below it, and no module imports its way back to
//! itself: `tests/arch` checks both):
//!
//! ```text
//!   cli         wires the roles (controller, node, mount, crds): the one place where
//!    │          the controllers meet the CSI Controller service and the node agent
//!    │          the CSI Node service
//!   plugin      what `kubectl tessera` reads and says (src/bin/kubectl-tessera)
//!   controller  Volume, VolumeAttachment and reaper controllers (kube-runtime)
//!   csi         the CSI driver: Identity, Controller (tickets in, awaited by watch),
//!    │          Node (bind mounts)
//!   node        the node agent: MountPods of this node, FUSE daemons, repairs
//!    │          (csi and node never import each other)
//!   fuse        the FUSE filesystem of one volume (knows nothing of Kubernetes)
//!   runtime     what every role shares: tracing, client, metrics endpoint, signals,
//!    │          CSI serving, watch backoff, error chains and kube error context
//!   metrics     Prometheus registry + /metrics, /healthz, /readyz
//!   labels      label selectors from the command line
//! ```
//!
//! Crates below (each manifest states what it may depend on; `tests/arch/deps.sh`):
//!
//! ```text
//!   tessera-api        CRD types, `names` (labels, annotations, finalizers, field
//!    │                 managers), `tickets`: pure arbitration (no runtime, no client)
//!   tessera-host       mount table, mount syscalls, fd-based paths, backend roots
//!    │                 (no Kubernetes)
//!   tessera-csi-proto  the generated CSI gRPC code
//!   tessera-text       quantities of bytes, bounded echoes (no dependencies)
//! ```

// The crates below this one, under the names the modules of this crate use.
pub use tessera_api as api;
pub use tessera_api::tickets;
pub use tessera_fuse as fuse;
pub use tessera_host as host;

pub mod cli;
pub mod controller;
pub mod csi;
pub mod labels;
pub mod metrics;
pub mod node;
pub mod plugin;
pub mod runtime;
