//! The CSI driver `csi.tessera.io`: a thin shim from CSI calls to tickets and mounts.
//!
//! ```text
//!  external-provisioner ─▶ CreateVolume/DeleteVolume ─▶ Volume objects
//!  external-attacher ─▶ ControllerPublish ─▶ upsert ticket csi-<sha256> ─▶ await satisfied (watch)
//!                     ─▶ ControllerUnpublish ─▶ remove ticket ─▶ await gone
//!  external-resizer ─▶ ControllerExpandVolume ─▶ Volume spec.size grows ─▶ quota grows online
//!  kubelet ─▶ NodeStage/NodePublish ─▶ bind the node's FUSE mount; reference on the MountPod
//!  kubelet ─▶ NodePublish (inline) ─▶ Volume + csi-ephemeral ticket first ([`node::ephemeral`])
//! ```
//!
//! The driver never arbitrates: it only adds, removes and awaits tickets. Identity and
//! Controller are served by `tessera controller` ([`controller_services`]), Identity
//! and Node by `tessera node` ([`node_services`]), each on a unix socket
//! ([`tessera_runtime::csi`] serves it). It imports nothing of the node agent: both
//! use [`tessera_host`] for mounts and paths.
//!
//! | module | owns |
//! |---|---|
//! | [`identity`] | plugin name, version and capabilities (the same on every instance) |
//! | [`controller`] | volumes as `Volume` objects, publishes as tickets |
//! | [`node`] | stage/publish bind mounts and the MountPod's references |
//! | [`watch`] | waiting for a condition on one object by watch |
//! | [`shared_watch`] | one watch per VolumeAttachment for every call waiting on it |
//! | [`mountpods`] | one MountPod list-watch for every unpublish waiting on a MountPod |
//! | [`topology`] | where a volume may be used (nodes, Shared roots) and how much fits where: pure |
//! | this one | what both services share: ticket ids, the in-flight guard and volume turns, required fields, how an error becomes a status |
//!
//! Errors: each service has one `Error` enum and one `From<Error> for Status`; a
//! status message is the error chain (`status`), and whatever a request sent is
//! cut to [`SHOWN`] characters where an error quotes it.

pub mod controller;
pub mod identity;
pub mod mountpods;
pub mod node;
pub mod shared_watch;
pub mod topology;
pub mod watch;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tonic::service::Routes;

use tessera_api::CSI_DRIVER_NAME;
use tessera_csi_proto as proto;
use tessera_runtime::error_chain;
use tessera_text::truncated;

use proto::controller_server::ControllerServer;
use proto::identity_server::IdentityServer;
use proto::node_server::NodeServer;

/// Prefix of the `volume_context` keys the kubelet and the sidecars set themselves.
pub const CSI_KEY_PREFIX: &str = "csi.storage.k8s.io/";

/// The ticket id of a CSI attachment: the name Kubernetes gives the storage.k8s.io
/// VolumeAttachment of (volume handle, driver, node), so the two can be matched (and the
/// reaper can tell when the VolumeAttachment is gone).
pub fn csi_ticket_id(volume_id: &str, node_id: &str) -> String {
    let digest = Sha256::digest(format!("{volume_id}{CSI_DRIVER_NAME}{node_id}").as_bytes());
    format!("csi-{}", hex::encode(digest))
}

/// The id of the `idle-mount` ticket that keeps an idle mount of a volume on a node
/// ([`tessera_api::AttacherType::IdleMount`]): one per (volume, node), like the CSI one.
pub fn idle_ticket_id(volume_id: &str, node_id: &str) -> String {
    let digest = Sha256::digest(format!("{volume_id}{CSI_DRIVER_NAME}{node_id}").as_bytes());
    format!("idle-{}", hex::encode(digest))
}

/// The resourceVersion of `o` as an integer (etcd's revision), if it is one: how the
/// CSI driver orders the copies of an object it holds (its writes' answers, the shared
/// feed, the publish caches).
pub(crate) fn resource_version<K: kube::Resource>(o: &K) -> Option<u64> {
    o.meta().resource_version.as_deref()?.parse().ok()
}

/// How much of a caller's string (a volume id, a name, a parameter) an error echoes.
pub const SHOWN: usize = 128;

/// Whether `s` can be a Kubernetes object name (a DNS-1123 subdomain): a volume or
/// node id that cannot is no volume or node at all, NOT_FOUND rather than a retryable
/// error from the API server.
pub fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// `id` if it can be an object name, else the `not_found` error of the service.
pub(crate) fn existing_id<E>(id: &str, not_found: impl FnOnce(String) -> E) -> Result<&str, E> {
    if is_object_name(id) {
        Ok(id)
    } else {
        Err(not_found(shown(id)))
    }
}

/// `s` as an error message may echo it: at most [`SHOWN`] characters.
pub(crate) fn shown(s: &str) -> String {
    truncated(s, SHOWN).into_owned()
}

/// The longest message a status carries.
pub const MESSAGE_MAX: usize = 1024;

/// The status of an RPC that failed with `e`: `code`, and the chain of `e` as the
/// message (at most [`MESSAGE_MAX`] characters).
pub(crate) fn status(code: tonic::Code, e: &dyn std::error::Error) -> tonic::Status {
    tonic::Status::new(code, truncated(&error_chain(e), MESSAGE_MAX))
}

/// A required field of a request is empty (INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is required")]
pub struct Missing(pub &'static str);

/// A field of a request that can be missing: an empty string or list, or `None`.
pub trait Field {
    /// What the field holds when it is there.
    type Value;
    /// The value, or `None` when it is missing.
    fn present(self) -> Option<Self::Value>;
}

impl<'a> Field for &'a String {
    type Value = &'a str;
    fn present(self) -> Option<&'a str> {
        (!self.is_empty()).then_some(self.as_str())
    }
}

impl<'a, T> Field for &'a Vec<T> {
    type Value = &'a [T];
    fn present(self) -> Option<&'a [T]> {
        (!self.is_empty()).then_some(self.as_slice())
    }
}

impl<'a, T> Field for Option<&'a T> {
    type Value = &'a T;
    fn present(self) -> Option<&'a T> {
        self
    }
}

/// The value of the required request field `name`, or [`Missing`].
pub fn required<F: Field>(name: &'static str, field: F) -> Result<F::Value, Missing> {
    field.present().ok_or(Missing(name))
}

/// Identity and Controller: the services of the socket `tessera controller` serves.
pub fn controller_services(service: controller::ControllerService) -> Routes {
    Routes::new(IdentityServer::new(identity::IdentityService))
        .add_service(ControllerServer::new(service))
}

/// Identity and Node: the services of the socket `tessera node` serves.
pub fn node_services(service: node::NodeService) -> Routes {
    Routes::new(IdentityServer::new(identity::IdentityService))
        .add_service(NodeServer::new(service))
}

/// A per-volume in-flight guard: a second concurrent call on the same volume gets
/// [`Pending`], which each service answers with `ABORTED`, as the CSI spec asks
/// ("an operation is pending for the volume").
#[derive(Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<String>>>);

/// Holds a volume's slot until dropped.
pub struct InFlightGuard {
    set: Arc<Mutex<HashSet<String>>>,
    key: String,
}

/// Another call on the same volume is in progress (ABORTED).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an operation on volume {0} is already in progress")]
pub struct Pending(String);

impl InFlight {
    /// Take the slot of `key`, or fail with [`Pending`] when a call holds it.
    pub fn start(&self, key: &str) -> Result<InFlightGuard, Pending> {
        let mut set = self.0.lock().expect("in-flight set poisoned");
        if !set.insert(key.to_string()) {
            return Err(Pending(shown(key)));
        }
        Ok(InFlightGuard {
            set: self.0.clone(),
            key: key.to_string(),
        })
    }
}

/// Turns on a volume: calls on one volume with different targets (NodePublish and
/// NodeUnpublish of the Pods that share it on a node) wait for each other instead of
/// failing with ABORTED, which the kubelet retries on a backoff that grows to two
/// minutes (25 Pods of one volume deleted at once took minutes to detach). The same
/// call repeated while it runs is still [`Pending`] (its [`InFlight`] key has the
/// target).
#[derive(Clone, Default)]
pub struct VolumeTurns(Arc<Mutex<HashMap<String, std::sync::Weak<tokio::sync::Mutex<()>>>>>);

impl VolumeTurns {
    /// Wait for `volume`'s turn; it lasts until the guard is dropped.
    pub async fn take(&self, volume: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = {
            let mut map = self.0.lock().expect("volume turns poisoned");
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(volume).and_then(std::sync::Weak::upgrade) {
                Some(t) => t,
                None => {
                    let t = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(volume.to_string(), Arc::downgrade(&t));
                    t
                }
            }
        };
        turn.lock_owned().await
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

    #[tokio::test]
    async fn calls_on_one_volume_take_turns_and_other_volumes_do_not_wait() {
        use std::time::Duration;
        let turns = VolumeTurns::default();
        let first = turns.take("v1").await;
        // Another volume goes ahead at once.
        let other = tokio::time::timeout(Duration::from_millis(100), turns.take("v2")).await;
        assert!(other.is_ok(), "v2 waited for v1");
        // The same volume waits until the first turn ends, then gets its own.
        let t = turns.clone();
        let second = tokio::spawn(async move { t.take("v1").await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "v1's second call did not wait");
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), second)
            .await
            .expect("v1's second call ran once the first was done")
            .unwrap();
        // Nothing kept for volumes no call holds.
        drop(other);
        let _ = turns.take("v3").await;
        assert!(turns.0.lock().unwrap().len() <= 1);
    }

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
    fn required_fields() {
        let (empty, id) = (String::new(), "v1".to_string());
        assert_eq!(required("volume_id", &id), Ok("v1"));
        assert_eq!(required("volume_id", &empty), Err(Missing("volume_id")));
        assert_eq!(
            required("volume_capabilities", &Vec::<u8>::new()),
            Err(Missing("volume_capabilities"))
        );
        assert_eq!(required("volume_capabilities", &vec![1u8]), Ok(&[1u8][..]));
        assert_eq!(
            required("capacity_range", None::<&u8>),
            Err(Missing("capacity_range"))
        );
        assert_eq!(Missing("volume_id").to_string(), "volume_id is required");
    }

    #[test]
    fn in_flight_guard_aborts_concurrent_calls() {
        let f = InFlight::default();
        let g = f.start("v1").unwrap();
        assert_eq!(f.start("v1").err(), Some(Pending("v1".into())));
        assert!(f.start("v2").is_ok());
        drop(g);
        assert!(f.start("v1").is_ok());
    }
}
