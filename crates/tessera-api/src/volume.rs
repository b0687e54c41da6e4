//! `Volume`: the volume itself — size, access mode, where its data lives.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{ANNOTATION_POPULATED, AccessMode};

/// A Tessera volume. Cluster-scoped, like a PersistentVolume; created by the CSI
/// driver's CreateVolume or applied directly by a GitOps user.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    doc = "A Tessera volume: size, access mode and where its data lives.",
    kind = "Volume",
    plural = "volumes",
    shortname = "tvol",
    category = "tessera",
    status = "VolumeStatus",
    printcolumn(name = "Size", type_ = "string", json_path = ".spec.size"),
    printcolumn(name = "Access", type_ = "string", json_path = ".spec.accessMode"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "string",
        json_path = ".status.attachedNodeList"
    ),
    printcolumn(
        name = "Backend",
        type_ = "string",
        json_path = ".spec.backend.root",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    /// Capacity of the volume, as a Kubernetes quantity (`1Gi`, `500M`). Enforced as a
    /// quota by the FUSE mount. It may grow (volume expansion) but never shrink.
    #[x_kube(
        validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))")
            .message("size must be a positive quantity such as 1Gi"),
        validation = Rule::new("!isQuantity(string(self)) || (quantity(string(self)).isInteger() && quantity(string(self)).asInteger() >= 1 && quantity(string(self)).asInteger() <= 1152921504606846976)")
            .message("size must be a whole number of bytes from 1 to 1Ei, such as 1Gi (no fractions of a byte, no milli-units)"),
        validation = Rule::new("!isQuantity(string(self)) || !isQuantity(string(oldSelf)) || quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0")
            .message("size may grow but never shrink")
    )]
    pub size: Quantity,

    /// How many nodes may hold the volume at once: ReadWriteOnce, ReadWriteOncePod,
    /// ReadOnlyMany or ReadWriteMany. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("accessMode is immutable; create a new Volume instead"))]
    pub access_mode: AccessMode,

    /// Where the volume's data lives.
    pub backend: VolumeBackend,

    /// Options passed to the FUSE mount, from a fixed list: ro, rw, exec, noexec,
    /// nosuid, nodev, atime, noatime, relatime, sync, async, dirsync, allow_other,
    /// default_permissions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new(super::common::MOUNT_OPTIONS_RULE).message(super::common::MOUNT_OPTIONS_MESSAGE))]
    #[schemars(length(max = 32), inner(length(max = 32)))]
    pub mount_options: Vec<String>,

    /// How long a node keeps its mount of the volume after the last workload there
    /// left (seconds, at most a day; unset or 0: unmounted at once). A Pod that comes
    /// back to the node within the delay finds the same mount, with no new mount. The
    /// mount is held by an `idle-mount` ticket that expires at the end of the delay
    /// and yields to a workload that wants the volume on another node. Read when the
    /// last workload leaves: a change applies to the next idle period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub idle_mount_delay_seconds: Option<i64>,

    /// CPU and memory requests and limits of the volume's mount daemons (the
    /// StorageClass's `mountCPURequest`, `mountCPULimit`, `mountMemoryRequest`,
    /// `mountMemoryLimit`); unset amounts take the node agent's defaults. Applied to
    /// a mount Pod when it is (re)created: a change reaches a running mount at its
    /// next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_resources: Option<super::MountResources>,

    /// How long, in seconds, the kernel may cache attributes and names on the
    /// volume's mounts (0 to an hour; unset: 60 s on a node-local backend, 1 s on a
    /// shared one). Changeable live (a VolumeAttributesClass's `attrCacheSeconds`):
    /// running mounts take it without a remount (their MountPods'
    /// `status.applied.attrCacheSeconds` say when).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub attr_cache_seconds: Option<i64>,

    /// The data the volume starts with: a copy of another volume's directory (a
    /// snapshot's Volume for a restore, the source Volume for a clone, the source for
    /// a snapshot). Filled once, by a `volume-restore` ticket, before the volume is
    /// used. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("dataSource is immutable"))]
    pub data_source: Option<DataSource>,

    /// Fenced failover of a single-writer volume when its node dies (the
    /// StorageClass's `nodeFailover`; docs/failover.md). Unset: `Off`. Taken by a
    /// MountPod when it is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_failover: Option<super::NodeFailover>,
}

impl Volume {
    /// Whether the volume's data source was copied into it (or it has none).
    pub fn populated(&self) -> bool {
        self.spec.data_source.is_none()
            || self
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_POPULATED))
                .is_some_and(|v| v == "true")
    }
}

/// Where a volume's initial data comes from: another volume's directory.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DataSource {
    /// The Volume whose data is copied.
    #[x_kube(validation = Rule::new(super::common::DNS_SUBDOMAIN_RULE).message("dataSource.volume must be a valid object name (lowercase letters, digits, '-' and '.')"))]
    #[schemars(length(min = 1, max = 253))]
    pub volume: String,
    /// Its directory (`<backend root>/<volume>`), which must lie beneath an allowed
    /// backend root; kept here so that the copy does not depend on the source Volume
    /// still existing.
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.matches('(^|/)\\\\.\\\\.?(/|$)')")
        .message("dataSource.source must be an absolute path without '.' or '..' components"))]
    #[schemars(length(min = 1, max = 4096))]
    pub source: String,
}

/// The backend of a volume: a directory `root/<volume name>` on the node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.scope != 'Shared' || !has(self.node)")
        .message("backend.node is only for scope NodeLocal"),
    validation = Rule::new("!has(oldSelf.node) || (has(self.node) && self.node == oldSelf.node)")
        .message("backend.node is set once and then immutable: a node-local volume cannot move")
)]
pub struct VolumeBackend {
    /// Absolute directory on the node under which the volume's directory lives.
    /// Immutable.
    #[x_kube(
        validation = Rule::new("self.startsWith('/') && !self.matches('(^|/)\\\\.\\\\.?(/|$)')")
            .message("backend.root must be an absolute path without '.' or '..' components"),
        validation = Rule::new("self == oldSelf").message("backend.root is immutable")
    )]
    #[schemars(length(min = 1, max = 4096))]
    pub root: String,

    /// `Shared`: the root is the same filesystem on every node (NFS, CephFS, …), so the
    /// volume can move between nodes. `NodeLocal`: the root is a local disk; the volume
    /// is pinned to `node`. Immutable.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("backend.scope is immutable"))]
    pub scope: BackendScope,

    /// For `NodeLocal` volumes: the node that holds the data. Set once, by the user or
    /// at the first attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(super::common::DNS_SUBDOMAIN_RULE).message("backend.node must be a valid node name (lowercase letters, digits, '-' and '.')"))]
    #[schemars(length(min = 1, max = 253))]
    pub node: Option<String>,
}

/// Whether a backend root is shared by all nodes or local to one.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum BackendScope {
    /// The same data is reachable from every node.
    #[default]
    Shared,
    /// The data lives on one node's disk.
    NodeLocal,
}

/// Observed state of a volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// Summary of the attachment state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<VolumeState>,
    /// Nodes where the volume is mounted and ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attached_nodes: Vec<String>,
    /// The same nodes, comma-separated (for `kubectl get`, which prints a list as JSON).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub attached_node_list: String,
    /// Nodes with a mount of the volume in any phase (being started, ready, failed or
    /// being torn down): a node leaving this list has finished detaching.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounted_nodes: Vec<String>,
    /// The node the volume was last attached to (kept after it detaches), where its
    /// data is removed when the Volume is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attached_node: Option<String>,
    /// Capacity in effect (the quota the mounts enforce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    /// Conditions with reasons and messages: `Ready` (True when the volume is Attached
    /// or Detached as its tickets decided, False while it attaches, detaches, is
    /// deleted or a mount failed; `kubectl wait --for=condition=Ready volume/NAME`),
    /// `Attached`, `Faulted` when a mount failed, kstatus's `Reconciling` (True
    /// while it attaches, detaches or is deleted) or `Stalled` (True when Faulted),
    /// and `NodeFailover` (True or absent: `FailedOver` when its ticket was released
    /// from a fenced node, `StaysOnDownNode` when it waits on a down node without
    /// `nodeFailover: Fenced`; docs/failover.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The life cycle of a volume, as the volume controller reports it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum VolumeState {
    /// The VolumeAttachment and the data directory are being created.
    Creating,
    /// No node holds the volume.
    Detached,
    /// A node was chosen; its mount is not ready yet.
    Attaching,
    /// Every node the tickets chose has a ready mount.
    Attached,
    /// Mounts are being torn down.
    Detaching,
    /// The volume is being deleted (its data is being removed).
    Deleting,
    /// Something needs an operator: see the conditions.
    Faulted,
}

impl VolumeState {
    /// Every state, in declaration order (docs/diagrams/volume-states.dot draws each:
    /// `tests/arch` checks it).
    pub const ALL: [VolumeState; 7] = [
        VolumeState::Creating,
        VolumeState::Detached,
        VolumeState::Attaching,
        VolumeState::Attached,
        VolumeState::Detaching,
        VolumeState::Deleting,
        VolumeState::Faulted,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_is_in_all_once_in_order() {
        // The exhaustive match makes a new variant fail to compile here: a reminder
        // to give it its place in ALL, in the same order.
        let position = |s: VolumeState| match s {
            VolumeState::Creating => 0,
            VolumeState::Detached => 1,
            VolumeState::Attaching => 2,
            VolumeState::Attached => 3,
            VolumeState::Detaching => 4,
            VolumeState::Deleting => 5,
            VolumeState::Faulted => 6,
        };
        for (i, s) in VolumeState::ALL.into_iter().enumerate() {
            assert_eq!(position(s), i, "{s:?}");
        }
    }
}
