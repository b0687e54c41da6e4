//! The CSI driver `csi.tessera.io`: a thin shim from CSI calls to tickets and mounts.
//!
//! ```text
//!  external-provisioner ─▶ CreateVolume/DeleteVolume ─▶ Volume objects
//!  external-attacher ─▶ ControllerPublish ─▶ upsert ticket csi-<sha256> ─▶ await satisfied (watch)
//!                     ─▶ ControllerUnpublish ─▶ remove ticket ─▶ await gone
//!  external-resizer ─▶ ControllerExpandVolume ─▶ Volume spec.size grows ─▶ quota grows online
//!  kubelet ─▶ NodeStage/NodePublish ─▶ bind the node's FUSE mount; reference on the MountPod
//! ```
//!
//! The driver never arbitrates: it only adds, removes and awaits tickets. Identity and
//! Controller are served by `tessera controller`, Identity and Node by `tessera node`,
//! each on a unix socket.

pub mod controller;
pub mod identity;
pub mod node;
pub mod paths;
pub mod proto;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tonic::Status;

use crate::api::CSI_DRIVER_NAME;

/// Topology key of node-local volumes.
pub const TOPOLOGY_NODE_KEY: &str = "topology.tessera.io/node";

/// The ticket id of a CSI attachment: the name Kubernetes gives the storage.k8s.io
/// VolumeAttachment of (volume handle, driver, node), so the two can be matched (and the
/// reaper can tell when the VolumeAttachment is gone).
pub fn csi_ticket_id(volume_id: &str, node_id: &str) -> String {
    let digest = Sha256::digest(format!("{volume_id}{CSI_DRIVER_NAME}{node_id}").as_bytes());
    format!("csi-{}", hex::encode(digest))
}

/// Errors of serving CSI.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket path is taken by something that is not a socket.
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    /// Binding or serving failed.
    #[error("serving CSI on {path}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server on {0}")]
    Transport(PathBuf, #[source] tonic::transport::Error),
}

/// Bind a unix socket at `path`, removing a stale socket (and only a socket) first.
pub fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, ServeError> {
    use std::os::unix::fs::FileTypeExt;
    let io = |source| ServeError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(io)?,
        Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    tokio::net::UnixListener::bind(path).map_err(io)
}

/// Parse a CSI endpoint (`unix:///abs/path` or a bare absolute path) into a path.
pub fn endpoint_path(endpoint: &str) -> PathBuf {
    PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint))
}

/// A per-volume in-flight guard: a second concurrent call on the same volume gets
/// `ABORTED`, as the CSI spec asks ("an operation is pending for the volume").
#[derive(Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<String>>>);

/// Holds a volume's slot until dropped.
pub struct InFlightGuard {
    set: Arc<Mutex<HashSet<String>>>,
    key: String,
}

impl InFlight {
    /// Take the slot of `key`, or fail with ABORTED when a call holds it.
    pub fn start(&self, key: &str) -> Result<InFlightGuard, Status> {
        let mut set = self.0.lock().expect("in-flight set poisoned");
        if !set.insert(key.to_string()) {
            return Err(Status::aborted(format!(
                "an operation on volume {key} is already in progress"
            )));
        }
        Ok(InFlightGuard {
            set: self.0.clone(),
            key: key.to_string(),
        })
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            set.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_id_is_the_kubernetes_attachment_name() {
        // sha256("pvc-1csi.tessera.ionode-a"), as Kubernetes' getAttachmentName computes it.
        let id = csi_ticket_id("pvc-1", "node-a");
        assert!(id.starts_with("csi-") && id.len() == 68, "{id}");
        let digest = Sha256::digest(b"pvc-1csi.tessera.ionode-a");
        assert_eq!(id, format!("csi-{}", hex::encode(digest)));
        assert_ne!(csi_ticket_id("pvc-1", "node-b"), id);
    }

    #[test]
    fn in_flight_guard_aborts_concurrent_calls() {
        let f = InFlight::default();
        let g = f.start("v1").unwrap();
        assert_eq!(f.start("v1").err().unwrap().code(), tonic::Code::Aborted);
        assert!(f.start("v2").is_ok());
        drop(g);
        assert!(f.start("v1").is_ok());
    }
}
