//! What Tessera does to the host outside FUSE, with no Kubernetes in sight: read the
//! mount table, bind and unmount, probe a mount point ([`mounts`]), and refuse any
//! path from a request or a custom resource that could reach outside where it must
//! stay ([`paths`]); mount and unmount below the kubelet directory only through file
//! descriptors ([`beneath`]); the backend roots the administrator allows, and data created and
//! removed beneath them only through file descriptors ([`roots`]).
//!
//! Used by the node agent ([`crate::node`]) and the CSI Node service
//! ([`crate::csi::node`]), which share one [`mounts::Mounts`] in `tessera node`.

pub mod beneath;
pub mod mounts;
pub mod paths;
pub mod roots;
