//! What Tessera does to the host outside FUSE, with no Kubernetes in sight: read the
//! mount table, bind and unmount, probe a mount point ([`mounts`]), and refuse any
//! path from a request or a custom resource that could reach outside where it must
//! stay ([`paths`]). Below the kubelet directory, mounts are made and undone only
//! through file descriptors ([`beneath`]); volume data is created, copied ([`copy`]) and removed only
//! beneath the backend roots the administrator allows, through file descriptors too
//! ([`roots`]).
//!
//! A crate of its own, below everything that runs on a node: it knows nothing of
//! Kubernetes (its manifest allows no kube, k8s-openapi or tokio; `tests/arch/deps.sh`
//! checks it). Used by the node agent (`tessera::node`) and the CSI Node service
//! (`tessera::csi::node`), which share one [`mounts::Mounts`] in `tessera node`, and by
//! the FUSE handoff, which reads the mount table.
//!
//! | module | owns |
//! |---|---|
//! | [`mounts`] | the mount table and the mount syscalls behind [`mounts::Mounts`]: bind, unmount, probe |
//! | [`beneath`] | mounts made and undone through file descriptors, below the kubelet directory |
//! | [`paths`] | validation of every path from a request or a custom resource |
//! | [`roots`] | the backend roots the administrator allows, and the only ways to touch what is beneath them |
//! | [`copy`] | copying one volume's data into another, through file descriptors |
//! | [`shared`] | whether a backend root declared Shared is one filesystem with its anchor's (a marker file) |
//! | [`preflight`] | `tessera preflight`: what one node offers Tessera, read before install |

pub mod beneath;
pub mod copy;
pub mod mounts;
pub mod paths;
pub mod preflight;
pub mod roots;
pub mod shared;

/// Tessera's own directory on the node (the DaemonSet's `tessera-dir`, created by
/// the kubelet): a NodeLocal root beneath it, such as the default
/// `/var/lib/tessera/volumes`, is created at start on a fresh node.
pub const TESSERA_DIR: &str = "/var/lib/tessera";
