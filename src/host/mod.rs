//! What Tessera does to the host outside FUSE, with no Kubernetes in sight: read the
//! mount table, bind and unmount, probe a mount point ([`mounts`]), and refuse any
//! path from a request or a custom resource that could reach outside where it must
//! stay ([`paths`]). Below the kubelet directory, mounts are made and undone only
//! through file descriptors ([`beneath`]); volume data is created, copied ([`copy`]) and removed only
//! beneath the backend roots the administrator allows, through file descriptors too
//! ([`roots`]).
//!
//! Used by the node agent ([`crate::node`]) and the CSI Node service
//! ([`crate::csi::node`]), which share one [`mounts::Mounts`] in `tessera node`.

pub mod beneath;
pub mod copy;
pub mod mounts;
pub mod paths;
pub mod roots;
