//! CSI ephemeral inline volumes: a Pod that declares a `csi.tessera.io` volume inline
//! gets a node-local Volume of its own, served through the same ticket and MountPod
//! path as any other, and removed with its data when the Pod goes.
//!
//! ```text
//!  NodePublish (volume_context csi.storage.k8s.io/ephemeral=true, no ControllerPublish)
//!    volumeAttributes checked ([`InlineSpec::parse`]) ──▶ Volume inline-<hash(pod uid, volume name)>
//!    (NodeLocal, this node; created once) ──▶ ticket csi-ephemeral on this node
//!    ──▶ await satisfied (watch) ──▶ the usual bind + reference
//!  NodeUnpublish: unbind, reference removed ──▶ ticket removed ──▶ Volume deleted
//!    (its data goes through the cleanup ticket, as for any deleted Volume)
//!  Pod gone without NodeUnpublish (node lost): the controller's reaper
//!    ([`tessera_controller::inline`]) removes the ticket and deletes the Volume
//! ```
//!
//! `volumeAttributes` are written by Pod authors, so they are untrusted: only
//! [`KEY_SIZE`] and [`KEY_BACKEND_ROOT`] are read, the size is bounded
//! ([`Settings::max_bytes`]), the root must be an allowed backend root, and any other key
//! (except the kubelet's own `csi.storage.k8s.io/…`) is INVALID_ARGUMENT; nothing
//! is created before all of it is checked. The Pod's uid and volume name come from
//! the target path the kubelet chose (`<kubelet>/pods/<uid>/volumes/kubernetes.io~csi/
//! <name>/mount`), so NodeUnpublish, which gets no volume context, finds the same
//! Volume, and a retried NodePublish is idempotent.
//!
//! No ownerReference to the Pod: a cluster-scoped Volume cannot be owned by a
//! namespaced Pod (the garbage collector treats such a reference as unresolvable and
//! never deletes the dependent). The Volume carries the Pod's namespace, name and uid
//! in annotations instead, and the reaper compares them with the Pod that exists.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;
use tracing::info;

use tessera_api::{
    self as api, ANNOTATION_INLINE_CSI_VOLUME, ANNOTATION_INLINE_POD, ANNOTATION_INLINE_POD_UID,
    AccessMode, BackendScope, CSI_NODE_FIELD_MANAGER, LABEL_INLINE, TicketReason, Volume,
    VolumeAttachment, inline_ticket, inline_ticket_id, inline_volume_name, quantity_of,
};
use tessera_host::roots::AllowedRoots;
use tessera_runtime::KubeContext;
use tessera_runtime::labels::Labels;

use super::error::InlineError;
use super::{Error, NodeService};
use crate::watch::{WatchError, await_from};
use crate::{CSI_KEY_PREFIX, shown};

/// `volume_context` key the kubelet sets on an inline volume's NodePublish.
pub const CTX_EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// `volume_context` keys of the Pod (the CSIDriver's `podInfoOnMount`).
pub const CTX_POD_NAME: &str = "csi.storage.k8s.io/pod.name";
/// See [`CTX_POD_NAME`].
pub const CTX_POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
/// See [`CTX_POD_NAME`].
pub const CTX_POD_UID: &str = "csi.storage.k8s.io/pod.uid";
/// `volumeAttributes` key: the size (a quantity, `64Mi`).
pub const KEY_SIZE: &str = "size";
/// `volumeAttributes` key: the backend root (one of the allowed ones).
pub const KEY_BACKEND_ROOT: &str = "backendRoot";

/// Size of an inline volume whose attributes name none.
pub const DEFAULT_SIZE: u64 = 1 << 30;
/// Default bound of an inline volume's size.
pub const DEFAULT_MAX_BYTES: u64 = 10 << 30;

/// What the Node service needs for inline volumes.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The backend roots a `backendRoot` attribute may name.
    pub allowed_roots: AllowedRoots,
    /// The largest size an inline volume may ask for.
    pub max_bytes: u64,
    /// Labels put on every inline Volume (the controller's `--watch-selector`).
    pub labels: Labels,
    /// How long NodePublish waits for the inline volume's ticket.
    pub timeout: Duration,
}

impl Settings {
    /// Inline volumes under `allowed_roots` (the first is the default), bounded by the
    /// default size, with no extra labels.
    pub fn new(allowed_roots: AllowedRoots) -> Self {
        Settings {
            allowed_roots,
            max_bytes: DEFAULT_MAX_BYTES,
            labels: Labels::default(),
            timeout: Duration::from_secs(60),
        }
    }
}

/// What an inline volume asks for, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineSpec {
    /// The Pod's namespace.
    pub pod_namespace: String,
    /// The Pod's name.
    pub pod_name: String,
    /// The Pod's uid.
    pub pod_uid: String,
    /// The volume's name in the Pod.
    pub volume_name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Backend root.
    pub backend_root: String,
}

/// Whether a NodePublish is for an inline (ephemeral) volume.
pub fn is_inline(ctx: &HashMap<String, String>) -> bool {
    ctx.get(CTX_EPHEMERAL).is_some_and(|v| v == "true")
}

/// Whether `id` is the kubelet's handle of an inline volume: `csi-` and the 64 hex
/// digits of a SHA-256 of the Pod's uid and the volume's name (68 characters: not an
/// object name, whose labels are at most 63).
pub fn is_kubelet_handle(id: &str) -> bool {
    id.len() == 68
        && id.starts_with("csi-")
        && id[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The Pod uid and volume name of a target path relative to the kubelet directory:
/// `pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`, nothing else.
pub fn pod_volume(rel: &Path) -> Option<(String, String)> {
    let parts: Vec<&str> = rel
        .components()
        .map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    match parts.as_slice() {
        ["pods", uid, "volumes", "kubernetes.io~csi", name, "mount"]
            if is_uid(uid) && crate::is_object_name(name) =>
        {
            Some((uid.to_string(), name.to_string()))
        }
        _ => None,
    }
}

fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

impl InlineSpec {
    /// Check an inline NodePublish: its attributes (`ctx`) and its target path relative
    /// to the kubelet directory (`rel_target`), which must be the path of the Pod the
    /// kubelet names. Nothing unknown, nothing unbounded, no root not allowed.
    pub fn parse(
        ctx: &HashMap<String, String>,
        rel_target: &Path,
        settings: &Settings,
    ) -> Result<Self, InlineError> {
        let mut size = None;
        let mut root = None;
        // Sorted, so the first unknown key reported is always the same one.
        let keys: BTreeMap<&String, &String> = ctx.iter().collect();
        for (k, v) in keys {
            match k.as_str() {
                KEY_SIZE => size = Some(v),
                KEY_BACKEND_ROOT => root = Some(v),
                k if k.starts_with(CSI_KEY_PREFIX) => {}
                other => return Err(InlineError::UnknownKey(shown(other))),
            }
        }
        let pod = |key: &'static str| {
            ctx.get(key)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or(InlineError::NoPodInfo(key))
        };
        let (pod_namespace, pod_name, pod_uid) = (
            pod(CTX_POD_NAMESPACE)?,
            pod(CTX_POD_NAME)?,
            pod(CTX_POD_UID)?,
        );
        let not_pod_path = || InlineError::NotPodPath(shown(&rel_target.display().to_string()));
        let (uid, volume_name) = pod_volume(rel_target).ok_or_else(not_pod_path)?;
        if uid != pod_uid {
            return Err(not_pod_path());
        }
        let bytes = match size {
            None => DEFAULT_SIZE.min(settings.max_bytes),
            Some(s) => {
                let b = api::quantity_bytes(s).map_err(|_| InlineError::Size(shown(s)))?;
                if b == 0 {
                    return Err(InlineError::Size(shown(s)));
                }
                if b > settings.max_bytes {
                    return Err(InlineError::TooLarge {
                        asked: shown(s),
                        max: settings.max_bytes,
                    });
                }
                b
            }
        };
        let backend_root = match root {
            Some(r) => {
                settings
                    .allowed_roots
                    .check_root(r)
                    .map_err(InlineError::BackendRoot)?;
                r.clone()
            }
            None => settings
                .allowed_roots
                .roots()
                .first()
                .ok_or(InlineError::NoRoot)?
                .display()
                .to_string(),
        };
        Ok(InlineSpec {
            pod_namespace,
            pod_name,
            pod_uid,
            volume_name,
            bytes,
            backend_root,
        })
    }

    /// The Volume name of this inline volume.
    pub fn volume(&self) -> String {
        inline_volume_name(&self.pod_uid, &self.volume_name)
    }

    /// The Volume to create for it on `node`: node-local there, ReadWriteOnce.
    pub fn object(
        &self,
        node: &str,
        csi_volume_id: &str,
        labels: &Labels,
    ) -> Result<Volume, serde_json::Error> {
        let mut all_labels = labels.0.clone();
        all_labels.insert(LABEL_INLINE.into(), "true".into());
        serde_json::from_value(json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
            "metadata": {
                "name": self.volume(),
                "labels": all_labels,
                "annotations": {
                    ANNOTATION_INLINE_POD: format!("{}/{}", self.pod_namespace, self.pod_name),
                    ANNOTATION_INLINE_POD_UID: self.pod_uid,
                    ANNOTATION_INLINE_CSI_VOLUME: csi_volume_id,
                },
            },
            "spec": {
                "size": quantity_of(self.bytes),
                "accessMode": AccessMode::ReadWriteOnce,
                "backend": {"root": self.backend_root, "scope": BackendScope::NodeLocal, "node": node},
            }
        }))
    }

    /// Whether `existing` is the Volume this request would create (a retried
    /// NodePublish), rather than another Pod's or another request's.
    pub fn same_as(&self, existing: &Volume, node: &str) -> bool {
        existing.labels().get(LABEL_INLINE).map(String::as_str) == Some("true")
            && existing.annotations().get(ANNOTATION_INLINE_POD_UID) == Some(&self.pod_uid)
            && api::quantity_bytes(&existing.spec.size.0).ok() == Some(self.bytes)
            && existing.spec.backend.root == self.backend_root
            && existing.spec.backend.node.as_deref() == Some(node)
    }
}

/// Whether `v` is an inline Volume created for the kubelet volume handle `volume_id`.
pub fn is_inline_volume_of(v: &Volume, volume_id: &str) -> bool {
    v.labels().get(LABEL_INLINE).map(String::as_str) == Some("true")
        && v.annotations()
            .get(ANNOTATION_INLINE_CSI_VOLUME)
            .map(String::as_str)
            == Some(volume_id)
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(CSI_NODE_FIELD_MANAGER.into()),
        ..Default::default()
    }
}

impl NodeService {
    /// An inline NodePublish up to the point where the volume is attached here: the
    /// Volume (created once), its ticket on this node, satisfied. Returns the Volume's
    /// name, which the rest of the publish uses like any other volume's.
    pub(super) async fn attach_inline(
        &self,
        ctx: &HashMap<String, String>,
        csi_volume_id: &str,
        target: &Path,
        read_only: bool,
    ) -> Result<String, Error> {
        let rel = target.strip_prefix(&self.kubelet_dir).unwrap_or(target);
        let spec = InlineSpec::parse(ctx, rel, &self.inline)?;
        let name = spec.volume();
        let volumes: Api<Volume> = Api::all(self.client.clone());
        match volumes
            .get_opt(&name)
            .await
            .context(|| format!("reading Volume {name}"))?
        {
            Some(v) if v.metadata.deletion_timestamp.is_some() => {
                return Err(Error::InlineBeingDeleted(name));
            }
            Some(v) if !spec.same_as(&v, &self.node_name) => {
                return Err(Error::InlineOtherwise(name));
            }
            Some(_) => {}
            None => {
                let object = spec
                    .object(&self.node_name, csi_volume_id, &self.inline.labels)
                    .map_err(Error::Encode)?;
                let post = PostParams {
                    field_manager: Some(CSI_NODE_FIELD_MANAGER.into()),
                    ..Default::default()
                };
                match volumes.create(&post, &object).await {
                    Ok(_) => {
                        info!(volume = %name, pod = %format!("{}/{}", spec.pod_namespace, spec.pod_name), bytes = spec.bytes, "created inline volume")
                    }
                    // A racing publish created it: checked on the next call.
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => Err(e).context(|| format!("creating Volume {name}"))?,
                }
            }
        }
        self.ticket_satisfied(&name, read_only).await?;
        Ok(name)
    }

    /// Upsert the inline volume's ticket on this node and wait until it is satisfied.
    async fn ticket_satisfied(&self, name: &str, read_only: bool) -> Result<(), Error> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let timeout = self.inline.timeout;
        // The volume controller creates the VolumeAttachment of a new Volume.
        let exists = await_condition(api.clone(), name, |va: Option<&VolumeAttachment>| {
            va.is_some()
        });
        let va = match tokio::time::timeout(timeout, exists).await {
            Ok(Ok(Some(va))) => va,
            Ok(Ok(None)) | Err(_) => return Err(Error::InlineNoAttachment(name.into())),
            Ok(Err(source)) => {
                return Err(Error::Watch(WatchError::Wait {
                    kind: "VolumeAttachment".into(),
                    name: name.into(),
                    source,
                }));
            }
        };
        let ticket = inline_ticket(name, &self.node_name, read_only);
        let id = ticket.id.clone();
        let current = match va.spec.attachment_tickets.get(&id) {
            Some(t) if t.node_id == ticket.node_id && t.parameters == ticket.parameters => va,
            _ => {
                let va = api
                    .patch(name, &params(), &Patch::Merge(ticket.upsert_patch()))
                    .await
                    .context(|| format!("adding ticket {id} to VolumeAttachment {name}"))?;
                info!(volume = %name, ticket = %id, "inline ticket upserted");
                va
            }
        };
        let wait = await_from(api.clone(), current, {
            let id = id.clone();
            move |va: Option<&VolumeAttachment>| va.is_some_and(|va| va.ticket_satisfied(&id))
        });
        match tokio::time::timeout(timeout, wait).await {
            Ok(res) => res.map(drop).map_err(Error::Watch),
            Err(_) => {
                let va = api
                    .get(name)
                    .await
                    .context(|| format!("reading VolumeAttachment {name}"))?;
                let (reason, message) = va
                    .ticket_status(&id)
                    .and_then(|s| s.blocked_by())
                    .map(|(r, m)| (r, m.to_owned()))
                    .unwrap_or((TicketReason::Attaching, "waiting for the controller".into()));
                Err(Error::InlineNotSatisfied {
                    ticket: id,
                    reason,
                    message,
                })
            }
        }
    }

    /// The inline Volume published to `target` for the kubelet handle `volume_id`, if
    /// `target` is a Pod's path and such a Volume exists.
    pub(super) async fn inline_volume_at(
        &self,
        volume_id: &str,
        target: &Path,
    ) -> Result<Option<String>, Error> {
        let rel = target.strip_prefix(&self.kubelet_dir).unwrap_or(target);
        let Some((uid, volume_name)) = pod_volume(rel) else {
            return Ok(None);
        };
        let name = inline_volume_name(&uid, &volume_name);
        let v = Api::<Volume>::all(self.client.clone())
            .get_opt(&name)
            .await
            .context(|| format!("reading Volume {name}"))?;
        Ok(v.filter(|v| is_inline_volume_of(v, volume_id))
            .map(|_| name))
    }

    /// After an inline volume's target is unbound and its reference removed: its
    /// ticket goes, then the Volume (its data through the cleanup ticket).
    pub(super) async fn release_inline(&self, name: &str) -> Result<(), Error> {
        let id = inline_ticket_id(name, &self.node_name);
        let patch = api::tickets_removal_patch([id.as_str()]);
        match Api::<VolumeAttachment>::all(self.client.clone())
            .patch(name, &params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => Err(e).context(|| format!("removing ticket {id} from {name}"))?,
        }
        match Api::<Volume>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => info!(volume = %name, "inline volume released; its data is removed"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => Err(e).context(|| format!("deleting Volume {name}"))?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tessera_api::AttacherType;

    use super::*;

    const UID: &str = "0b5c2f8e-6b1d-4c39-9d7e-1f0e2a3b4c5d";

    fn settings() -> Settings {
        Settings {
            max_bytes: 1 << 30,
            ..Settings::new(AllowedRoots::new(["/var/lib/tessera/volumes", "/mnt/fast"]).unwrap())
        }
    }

    fn ctx(extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            (CTX_EPHEMERAL, "true"),
            (CTX_POD_NAME, "web"),
            (CTX_POD_NAMESPACE, "apps"),
            (CTX_POD_UID, UID),
            ("csi.storage.k8s.io/serviceAccount.name", "default"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, v) in extra {
            m.insert(k.to_string(), v.to_string());
        }
        m
    }

    fn path(uid: &str) -> String {
        format!("pods/{uid}/volumes/kubernetes.io~csi/scratch/mount")
    }

    #[test]
    fn attributes_of_an_inline_volume() {
        let ok = |extra: &[(&str, &str)]| {
            InlineSpec::parse(&ctx(extra), Path::new(&path(UID)), &settings())
        };
        let spec = ok(&[]).unwrap();
        assert_eq!(
            (spec.bytes, spec.backend_root.as_str()),
            (1 << 30, "/var/lib/tessera/volumes"),
            "defaults: the first allowed root"
        );
        assert_eq!(
            (spec.pod_namespace.as_str(), spec.pod_name.as_str()),
            ("apps", "web")
        );
        assert_eq!(spec.volume_name, "scratch");
        let spec = ok(&[("size", "64Mi"), ("backendRoot", "/mnt/fast")]).unwrap();
        assert_eq!(
            (spec.bytes, spec.backend_root.as_str()),
            (64 << 20, "/mnt/fast")
        );
        for (extra, want) in [
            (&[("sizee", "1Mi")][..], "key \"sizee\" is not known"),
            (&[("scope", "Shared")][..], "key \"scope\" is not known"),
            (&[("size", "2Gi")][..], "above the largest inline volume"),
            (&[("size", "1Ei")][..], "above the largest inline volume"),
            (&[("size", "0")][..], "not a positive quantity"),
            (&[("size", "-1Mi")][..], "not a positive quantity"),
            (&[("size", "lots")][..], "not a positive quantity"),
            (&[("backendRoot", "/etc")][..], "backendRoot"),
            (
                &[("backendRoot", "/var/lib/tessera/volumes/../..")][..],
                "backendRoot",
            ),
            (&[("backendRoot", "relative")][..], "backendRoot"),
        ] {
            let err = ok(extra).unwrap_err();
            assert!(err.to_string().contains(want), "{extra:?}: {err}");
            let status = tonic::Status::from(Error::from(err));
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{extra:?}");
        }
    }

    #[test]
    fn the_target_must_be_the_path_of_the_pod_the_kubelet_names() {
        let s = settings();
        let other = "11111111-2222-3333-4444-555555555555";
        for (p, ok) in [
            (path(UID), true),
            (path(other), false),
            (
                format!("pods/{UID}/volumes/kubernetes.io~csi/scratch"),
                false,
            ),
            (
                format!("pods/{UID}/volumes/kubernetes.io~csi/../mount"),
                false,
            ),
            (
                format!("plugins/{UID}/volumes/kubernetes.io~csi/s/mount"),
                false,
            ),
            (
                format!("pods/{UID}/volumes/kubernetes.io~csi/Bad_Name/mount"),
                false,
            ),
        ] {
            let res = InlineSpec::parse(&ctx(&[]), Path::new(&p), &s);
            assert_eq!(res.is_ok(), ok, "{p}: {res:?}");
        }
        let mut no_uid = ctx(&[]);
        no_uid.remove(CTX_POD_UID);
        let err = InlineSpec::parse(&no_uid, Path::new(&path(UID)), &s).unwrap_err();
        assert!(err.to_string().contains("podInfoOnMount"), "{err}");
    }

    #[test]
    fn the_kubelet_says_which_publish_is_inline_and_names_it() {
        assert!(is_inline(&ctx(&[])));
        assert!(!is_inline(&ctx(&[(CTX_EPHEMERAL, "false")])));
        let mut persistent = ctx(&[]);
        persistent.remove(CTX_EPHEMERAL);
        assert!(!is_inline(&persistent));
        // The handle the kubelet gives an inline volume: no object name.
        let handle = format!("csi-{}", "c6e648ced47e3cac97a96281e993c1b7".repeat(2));
        assert!(is_kubelet_handle(&handle));
        assert!(!crate::is_object_name(&handle));
        for other in [
            "pvc-1234".to_string(),
            "csi-abc".to_string(),
            format!("csi-{}", "C".repeat(64)),
            format!("vol-{}", "a".repeat(64)),
            format!("csi-{}/", "a".repeat(63)),
        ] {
            assert!(!is_kubelet_handle(&other), "{other}");
        }
    }

    #[test]
    fn names_are_stable_bounded_and_distinct() {
        let a = inline_volume_name(UID, "scratch");
        assert_eq!(a, inline_volume_name(UID, "scratch"), "a retry finds it");
        assert_eq!(a.len(), 47);
        assert!(crate::is_object_name(&a), "{a}");
        assert_ne!(a, inline_volume_name(UID, "cache"));
        assert_ne!(a, inline_volume_name("other", "scratch"));
        assert_eq!(inline_volume_name(UID, &"x".repeat(253)).len(), 47);
        let t = inline_ticket_id(&a, "node-a");
        let ticket_chars = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-';
        assert!(t.bytes().all(ticket_chars) && t.len() <= 253, "{t}");
        assert_ne!(t, inline_ticket_id(&a, "node-b"));
    }

    #[test]
    fn a_retry_finds_its_own_volume_and_no_other() {
        let s = settings();
        let spec = InlineSpec::parse(&ctx(&[("size", "64Mi")]), Path::new(&path(UID)), &s).unwrap();
        let v = spec.object("node-a", "csi-abc", &s.labels).unwrap();
        assert_eq!(v.name_any(), spec.volume());
        assert_eq!(v.spec.backend.scope, BackendScope::NodeLocal);
        assert_eq!(v.spec.backend.node.as_deref(), Some("node-a"));
        assert!(is_inline_volume_of(&v, "csi-abc"));
        assert!(!is_inline_volume_of(&v, "csi-other"));
        assert!(spec.same_as(&v, "node-a"));
        assert!(!spec.same_as(&v, "node-b"));
        let bigger = InlineSpec {
            bytes: 128 << 20,
            ..spec.clone()
        };
        assert!(!bigger.same_as(&v, "node-a"));
        let mut not_inline = v.clone();
        not_inline.labels_mut().remove(LABEL_INLINE);
        assert!(!spec.same_as(&not_inline, "node-a"));
        assert!(!is_inline_volume_of(&not_inline, "csi-abc"));
        let t = inline_ticket(&spec.volume(), "node-a", true);
        assert_eq!(t.type_, AttacherType::CsiEphemeral);
        assert_eq!(
            t.parameters.get("readOnly").map(String::as_str),
            Some("true")
        );
    }
}
