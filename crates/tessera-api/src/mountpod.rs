//! `MountPod`: one shared, reference-counted FUSE mount of one volume on one node.
//!
//! The volume controller creates a MountPod for every node that arbitration picked;
//! the node agent of that node (which watches only MountPods labelled with its node)
//! starts the `tessera mount` process and reports readiness in the status. CSI
//! NodePublish adds a reference (a target path and who owns it), NodeUnpublish removes
//! it; a MountPod with no references is deleted, optionally after a delay.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Spec of a MountPod.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    doc = "One shared, reference-counted FUSE mount of one volume on one node.",
    kind = "MountPod",
    plural = "mountpods",
    shortname = "mp",
    category = "tessera",
    status = "MountPodStatus",
    printcolumn(name = "Volume", type_ = "string", json_path = ".spec.volume"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Refs", type_ = "integer", json_path = ".status.referenceCount"),
    printcolumn(name = "Restarts", type_ = "integer", json_path = ".status.restarts"),
    printcolumn(
        name = "PID",
        type_ = "integer",
        json_path = ".status.pid",
        priority = 1
    ),
    printcolumn(
        name = "Mount Point",
        type_ = "string",
        json_path = ".status.mountPoint",
        priority = 1
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".status.image",
        priority = 1
    ),
    printcolumn(
        name = "Last Error",
        type_ = "string",
        json_path = ".status.lastError",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MountPodSpec {
    /// The Volume mounted. Immutable.
    #[x_kube(
        validation = Rule::new("self == oldSelf").message("spec.volume is immutable"),
        validation = Rule::new(super::common::DNS_SUBDOMAIN_RULE).message("spec.volume must be a valid object name (lowercase letters, digits, '-' and '.')")
    )]
    #[schemars(length(min = 1, max = 253))]
    pub volume: String,

    /// The node the mount runs on. Immutable.
    #[x_kube(
        validation = Rule::new("self == oldSelf").message("spec.nodeName is immutable"),
        validation = Rule::new(super::common::DNS_SUBDOMAIN_RULE).message("spec.nodeName must be a valid node name (lowercase letters, digits, '-' and '.')")
    )]
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,

    /// The directory on the node that the mount serves (the volume's directory under
    /// its backend root).
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.matches('(^|/)\\\\.\\\\.?(/|$)')")
        .message("spec.source must be an absolute path without '.' or '..' components"))]
    #[schemars(length(min = 1, max = 4096))]
    pub source: String,

    /// What the node agent does for this MountPod: serve the volume (the usual), or
    /// remove the volume's data (the node-side work of a deleted volume's `cleanup`
    /// ticket). Immutable.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.task is immutable"))]
    pub task: MountTask,

    /// For task Populate: the data copied into the volume (the Volume's `dataSource`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub populate_from: Option<super::DataSource>,

    /// Quota in bytes, enforced by the mount and reported through statfs.
    #[schemars(range(min = 1))]
    pub capacity_bytes: i64,

    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,

    /// The backend root is shared with other nodes (the Volume's `backend.scope:
    /// Shared`): the daemon then holds flock and fcntl locks on the backend and
    /// revalidates on open (close-to-open) even when the backing filesystem's type is
    /// a node-local one (`tessera mount --shared-backend`). Taken when the daemon
    /// starts: a running daemon keeps the setting it was started with.
    #[serde(default)]
    pub shared_backend: bool,

    /// For a volume of scope Shared: the node whose view of the backend root holds the
    /// data served from it (the root's anchor, chosen by the controller). The agent
    /// on that node leaves the marker `.tessera-shared-<node>` under the root; an
    /// agent on any other node serves, creates or removes nothing there unless it
    /// sees that marker through its own mount of the root (else the MountPod fails
    /// with reason `BackendNotShared`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(super::common::DNS_SUBDOMAIN_RULE).message("spec.sharedRootAnchor must be a valid node name (lowercase letters, digits, '-' and '.')"))]
    #[schemars(length(min = 1, max = 253))]
    pub shared_root_anchor: Option<String>,

    /// Options passed to the FUSE mount (the Volume's, from the same fixed list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new(super::common::MOUNT_OPTIONS_RULE).message(super::common::MOUNT_OPTIONS_MESSAGE))]
    #[schemars(length(max = 32), inner(length(max = 32)))]
    pub mount_options: Vec<String>,

    /// Target paths bound to this mount and who owns them. A list map keyed by
    /// `targetPath`, so concurrent NodePublish calls merge under server-side apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["targetPath".into()]))]
    #[schemars(length(max = 1024))]
    pub references: Vec<MountReference>,

    /// How long a MountPod without references is kept before it is deleted, so a pod
    /// that is restarted at once finds its mount still there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub retain_seconds: Option<i64>,

    /// CPU and memory of the mount daemon (the Volume's `mountResources`). Taken when
    /// the daemon's mount Pod is created: a running daemon keeps what it was started
    /// with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<super::MountResources>,

    /// How long, in seconds, the kernel may cache attributes and names (the Volume's
    /// `attrCacheSeconds`). Applied to a running daemon without a remount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub attr_cache_seconds: Option<i64>,

    /// The daemon fences itself: it completes no write while the node has not
    /// renewed its liveness Lease for the node's `fenceAfter` (a single-writer
    /// volume whose StorageClass says `nodeFailover: Fenced`; docs/failover.md).
    /// Taken when the daemon starts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub self_fence: bool,
}

/// The node-side work a MountPod stands for.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum MountTask {
    /// Mount the volume with FUSE and keep it mounted.
    #[default]
    Serve,
    /// Remove the volume's directory under its backend root, then report Ready.
    RemoveData,
    /// Fill the volume's directory with a copy of `spec.populateFrom` (its Volume's
    /// `dataSource`: a snapshot or another volume), then report Ready. The node-side
    /// work of a `volume-restore` ticket.
    Populate,
}

/// One bind mount of the volume into a pod.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MountReference {
    /// Absolute path that the bind mount targets (kubelet's publish path).
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.matches('(^|/)\\\\.\\\\.?(/|$)')")
        .message("targetPath must be an absolute path without '.' or '..' components"))]
    #[schemars(length(min = 1, max = 4096))]
    pub target_path: String,
    /// Who owns the reference (`pod/<uid>`, `csi/<volume id>`), for garbage collection.
    #[schemars(length(min = 1, max = 512))]
    pub owner: String,
    /// Whether the bind mount is read-only.
    #[serde(default)]
    pub read_only: bool,
    /// The Pod the target path is for (from the kubelet's pod info), so that what
    /// happens to the mount (an OOM kill of its daemon) is told on that Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// A Pod, by namespace and name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// The Pod's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The Pod's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Observed state of a MountPod, written by the node agent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MountPodStatus {
    /// Where the mount is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MountPhase>,
    /// Process id of the FUSE daemon on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i64>,
    /// Where the FUSE filesystem is mounted on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_point: Option<String>,
    /// How many times the FUSE daemon was restarted after a failure.
    #[serde(default)]
    pub restarts: i32,
    /// The last failure, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the last failure happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_time: Option<Time>,
    /// Number of references bound (for `kubectl get`).
    #[serde(default)]
    pub reference_count: i32,
    /// Conditions (`Ready`, …; kstatus's `Reconciling` while the mount starts or waits,
    /// `Stalled` when it failed; `Fenced`, True while its node is fenced, written by
    /// the controller: docs/failover.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How many times the kernel killed the mount daemon for exceeding its memory
    /// limit (pod mode: its container's last termination reason `OOMKilled`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_kills: i32,
    /// When the daemon was last OOM-killed (the container's finish time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_oom_kill_time: Option<Time>,
    /// The settings the running mount has (while Ready). A new reference changes the
    /// spec's generation but not the mount; these tell whether the mount still is what
    /// the spec asks while the agent catches up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedSettings>,
    /// The image of the FUSE daemon serving the mount (pod mode: its mount Pod's). The
    /// agent replaces daemons of another image than its desired one through the
    /// /dev/fuse handoff (rolling upgrades; see docs/operations.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// The spec settings a running mount was made with.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedSettings {
    /// Mounted read-only.
    #[serde(default)]
    pub read_only: bool,
    /// The FUSE mount options it was mounted with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 32)))]
    pub mount_options: Vec<String>,
    /// The attribute cache lifetime it serves with (unset: the daemon's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attr_cache_seconds: Option<i64>,
}

impl AppliedSettings {
    /// The settings `spec` asks for.
    pub fn of(spec: &MountPodSpec) -> Self {
        AppliedSettings {
            read_only: spec.read_only,
            mount_options: spec.mount_options.clone(),
            attr_cache_seconds: spec.attr_cache_seconds,
        }
    }
}

/// Life of a mount.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum MountPhase {
    /// Created; no agent has acted yet.
    Pending,
    /// The FUSE daemon is starting (or restarting after a failure).
    Mounting,
    /// The mount answers.
    Ready,
    /// The mount failed and could not be repaired; see `lastError`.
    Failed,
    /// Unmounting.
    Terminating,
}

impl MountPod {
    /// The application Pods bound to the mount: references owned by `pod/<uid>` whose
    /// Pod the CSI node recorded, each once, as `(namespace, name, uid)`.
    pub fn app_pods(&self) -> Vec<(String, String, String)> {
        let mut out: Vec<(String, String, String)> = Vec::new();
        for r in &self.spec.references {
            let (Some(uid), Some(pod)) = (r.owner.strip_prefix("pod/"), r.pod.as_ref()) else {
                continue;
            };
            if out.iter().any(|(_, _, u)| u == uid) {
                continue;
            }
            out.push((pod.namespace.clone(), pod.name.clone(), uid.to_string()));
        }
        out
    }

    /// Whether a mount is up and may take one more bind: Ready and not being deleted,
    /// whether or not the agent has observed the latest spec yet (a new reference
    /// changes the spec, and a second NodePublish must not wait for that).
    pub fn is_serving(&self) -> bool {
        self.metadata.deletion_timestamp.is_none()
            && self
                .status
                .as_ref()
                .is_some_and(|s| s.phase == Some(MountPhase::Ready) && s.mount_point.is_some())
    }

    /// Whether the node agent reports this MountPod ready for its current spec: Ready,
    /// and either the agent has observed this generation or the running mount already
    /// has the spec's `readOnly` and `mountOptions` (a new reference bumps the
    /// generation, and a satisfied ticket must not read "starting" until the agent
    /// has seen it).
    pub fn is_ready(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        let current = status.observed_generation == self.metadata.generation
            || status
                .applied
                .as_ref()
                .is_some_and(|a| *a == AppliedSettings::of(&self.spec));
        self.metadata.deletion_timestamp.is_none()
            && status.phase == Some(MountPhase::Ready)
            && current
    }
}

/// The name of the MountPod of `volume` on `node`: `<volume>-<hash>`, where the hash
/// is of the node name, so that the name is unique, stable and a valid object name
/// whatever the lengths of both names.
pub fn mountpod_name(volume: &str, node: &str) -> String {
    // FNV-1a, 64 bit: stable across releases and platforms (unlike std's hasher).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let suffix = format!("{h:016x}");
    let max_prefix = 253 - 1 - suffix.len();
    let prefix: String = volume.chars().take(max_prefix).collect();
    let prefix = prefix.trim_end_matches(['-', '.']);
    format!("{prefix}-{suffix}")
}
