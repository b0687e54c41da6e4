//! `VolumeAttachment` (`volumeattachments.tessera.io`): who wants the volume where.
//!
//! One per Volume, with the same name. The shape is Longhorn's
//! (`longhorn.io/v1beta2` VolumeAttachment): `spec.attachmentTickets` is a map keyed by
//! ticket id; `status.attachmentTicketStatuses` is the same map with `satisfied`,
//! `generation` and a `Satisfied` condition whose reason and message say exactly what
//! blocks the ticket. Writers of tickets: the CSI driver (`csi-attacher`), GitOps
//! users (`manual`), and Tessera's own controllers (background work). The ticket map
//! is a granular map, so server-side apply merges it per key: a GitOps tool that owns
//! one ticket never removes a ticket that another manager owns.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::names::inline_ticket_id;

/// Spec of a VolumeAttachment: the tickets.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "tessera.io",
    version = "v1alpha1",
    doc = "One per Volume, same name: attachment tickets (spec) and their statuses (status).",
    kind = "VolumeAttachment",
    plural = "volumeattachments",
    shortname = "tva",
    category = "tessera",
    status = "VolumeAttachmentStatus",
    validation = Rule::new("self.metadata.name == self.spec.volume").message("a VolumeAttachment must have the same name as its Volume (spec.volume)"),
    printcolumn(name = "Tickets", type_ = "integer", json_path = ".status.ticketCount"),
    printcolumn(name = "Satisfied", type_ = "integer", json_path = ".status.satisfiedCount"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Nodes", type_ = "string", json_path = ".status.nodeList"),
    printcolumn(name = "Waiting", type_ = "string", json_path = ".status.waiting"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAttachmentSpec {
    /// Name of the Volume these tickets are for. Immutable.
    #[x_kube(
        validation = Rule::new("self == oldSelf").message("spec.volume is immutable"),
        validation = Rule::new(super::common::DNS_SUBDOMAIN_RULE).message("spec.volume must be a valid object name (lowercase letters, digits, '-' and '.')")
    )]
    #[schemars(length(min = 1, max = 253))]
    pub volume: String,

    /// Attachment tickets, keyed by ticket id. Each key must equal its ticket's `id`.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self.all(k, self[k].id == k)").message("each key of spec.attachmentTickets must equal the ticket's id"))]
    #[schemars(extend("maxProperties" = MAX_TICKETS))]
    pub attachment_tickets: BTreeMap<String, AttachmentTicket>,
}

/// The most tickets one VolumeAttachment holds (`maxProperties` of
/// `spec.attachmentTickets`): about 820 bytes each once satisfied, so the stored object
/// stays under etcd's 1.5 MiB request limit. A volume wanted on more nodes than this
/// waits for one of them to let go (docs/scaling-tickets.md).
pub const MAX_TICKETS: usize = 1024;

/// A request to attach the volume to a node, on behalf of someone.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentTicket {
    /// The ticket id; equal to its key in the map. CSI tickets are named like the
    /// storage.k8s.io VolumeAttachment they stand for (`csi-<sha256>`).
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("ticket id must consist of lowercase letters, digits, '-' and '.', and start and end with a letter or digit"))]
    #[schemars(length(min = 1, max = 253))]
    pub id: String,

    /// Who asks, which sets the priority: volume-restore, volume-expansion (2000) >
    /// manual (1000) > csi-attacher, csi-ephemeral, share-manager (900) > snapshot, backup, clone,
    /// cleanup (800, background: interruptible) > idle-mount (700, background).
    #[serde(rename = "type")]
    pub type_: AttacherType,

    /// The node to attach to.
    #[serde(rename = "nodeID")]
    #[x_kube(validation = Rule::new(super::common::DNS_SUBDOMAIN_RULE).message("nodeID must be a valid node name (lowercase letters, digits, '-' and '.')"))]
    #[schemars(length(min = 1, max = 253))]
    pub node_id: String,

    /// Attachment parameters. Known keys: `readOnly` (`"true"`/`"false"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(
        validation = Rule::new("!has(self.readOnly) || self.readOnly in ['true', 'false']").message("parameters.readOnly must be \"true\" or \"false\""),
        validation = Rule::new("self.all(k, k.size() <= 63)").message("parameters: keys of at most 63 characters")
    )]
    #[schemars(extend("maxProperties" = 16, "additionalProperties" = {"type": "string", "maxLength": 1024}))]
    pub parameters: BTreeMap<String, String>,

    /// Bumped by the ticket's owner whenever it changes what it asks for; a ticket is
    /// satisfied only once its status reports the same generation.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub generation: i64,

    /// When the ticket stops being honoured (RFC 3339): from then on it is not
    /// satisfied (reason Expired) and its node is detached unless another ticket wants
    /// it. Tessera removes its own expired tickets, never one another field manager owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
}

/// The kind of requester behind a ticket.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum AttacherType {
    /// Restoring data into the volume (system work that must not be interrupted).
    VolumeRestore,
    /// Offline expansion of the volume.
    VolumeExpansion,
    /// A person or GitOps tool asked for the volume on a node.
    Manual,
    /// The CSI driver, on behalf of a storage.k8s.io VolumeAttachment (a pod).
    CsiAttacher,
    /// The CSI Node service, for a CSI ephemeral inline volume of a Pod on its node
    /// (no storage.k8s.io VolumeAttachment exists for those): written by NodePublish,
    /// removed by NodeUnpublish, and by the controller once the Pod is gone.
    CsiEphemeral,
    /// A share manager exporting the volume.
    ShareManager,
    /// Taking a snapshot (background).
    Snapshot,
    /// Taking a backup (background).
    Backup,
    /// Cloning into another volume (background).
    Clone,
    /// Removing a deleted volume's data (background, system).
    Cleanup,
    /// Keeping an idle mount for the volume's `idleMountDelaySeconds` after its last
    /// workload left the node (background, lowest: yields to everything). Written by
    /// the CSI driver's ControllerUnpublish in place of the `csi-attacher` ticket, with
    /// `expiresAt` at the end of the delay.
    IdleMount,
}

impl AttacherType {
    /// Every attacher type, in priority order.
    pub const ALL: [AttacherType; 11] = [
        AttacherType::VolumeRestore,
        AttacherType::VolumeExpansion,
        AttacherType::Manual,
        AttacherType::CsiAttacher,
        AttacherType::CsiEphemeral,
        AttacherType::ShareManager,
        AttacherType::Snapshot,
        AttacherType::Backup,
        AttacherType::Clone,
        AttacherType::Cleanup,
        AttacherType::IdleMount,
    ];

    /// The name used in manifests (`csi-attacher`, `manual`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            AttacherType::VolumeRestore => "volume-restore",
            AttacherType::VolumeExpansion => "volume-expansion",
            AttacherType::Manual => "manual",
            AttacherType::CsiAttacher => "csi-attacher",
            AttacherType::CsiEphemeral => "csi-ephemeral",
            AttacherType::ShareManager => "share-manager",
            AttacherType::Snapshot => "snapshot",
            AttacherType::Backup => "backup",
            AttacherType::Clone => "clone",
            AttacherType::Cleanup => "cleanup",
            AttacherType::IdleMount => "idle-mount",
        }
    }
}

impl std::fmt::Display for AttacherType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Observed state of the tickets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAttachmentStatus {
    /// One status per ticket, keyed by ticket id.
    #[serde(default)]
    pub attachment_ticket_statuses: BTreeMap<String, AttachmentTicketStatus>,
    /// Number of tickets (for `kubectl get`).
    #[serde(default)]
    pub ticket_count: i32,
    /// Number of satisfied tickets (for `kubectl get`).
    #[serde(default)]
    pub satisfied_count: i32,
    /// Nodes the volume is attached to, or being attached to, as arbitration decided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// The same nodes, comma-separated (for `kubectl get`, which prints a list as JSON).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_list: String,
    /// The first blocked ticket and what it waits for (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: True when every ticket is satisfied; False with the reason and message
    /// of the first ticket that is not (or VolumeNotFound, NoAgent).
    /// `kubectl wait --for=condition=Ready volumeattachment.tessera.io/NAME`. And
    /// kstatus's `Reconciling` (True while tickets wait for Tessera) or `Stalled` (True
    /// when a ticket waits for a person: a failed mount, a ticket that cannot be
    /// honoured, a missing Volume, node or agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The status of one ticket.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentTicketStatus {
    /// The ticket id.
    pub id: String,
    /// Whether the volume is attached as the ticket asks (generation included).
    pub satisfied: bool,
    /// The ticket generation this status describes.
    #[serde(default)]
    pub generation: i64,
    /// When the controller first saw the ticket; orders tickets of equal priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<Time>,
    /// The `Satisfied` condition of a ticket not satisfied: its reason (Attaching,
    /// HeldByOtherNode, WaitingForDetach, LowerPriority, Interrupted,
    /// NodeLocalElsewhere, GenerationPending, MountFailed, VolumeDeleting,
    /// InvalidParameters, Expired, NodeNotFound, VolumeNotFound or InUse) and message
    /// name what blocks it. A satisfied ticket carries none (`satisfied: true` says
    /// it, reason Attached): every write of a VolumeAttachment costs the API server
    /// in proportion to the fields of all its tickets, so those of a volume on
    /// hundreds of nodes stay few.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Condition type on ticket statuses.
pub const CONDITION_SATISFIED: &str = "Satisfied";

/// Why a ticket is, or is not, satisfied: the `reason` of its `Satisfied` condition.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum TicketReason {
    /// The volume is attached to the ticket's node and the mount is ready.
    Attached,
    /// The ticket won; the MountPod on its node is not ready yet.
    Attaching,
    /// A single-node volume is held by another ticket on another node.
    HeldByOtherNode,
    /// A single-node volume is detaching from another node; attach follows.
    WaitingForDetach,
    /// Another ticket of higher priority (or earlier) was chosen.
    LowerPriority,
    /// A background ticket yielded to a workload ticket on another node.
    Interrupted,
    /// A node-local volume cannot be attached on another node.
    NodeLocalElsewhere,
    /// The ticket's generation is newer than what is attached.
    GenerationPending,
    /// The MountPod for the ticket's node failed.
    MountFailed,
    /// The volume is being deleted; only cleanup tickets are served.
    VolumeDeleting,
    /// The parameters conflict with the access mode or with other tickets on the node.
    InvalidParameters,
    /// The ticket is past its `expiresAt`: it is no longer honoured.
    Expired,
    /// The ticket's node does not exist (never did, or no longer does).
    NodeNotFound,
    /// The ticket's Volume does not exist (not yet, or no longer).
    VolumeNotFound,
    /// A cleanup ticket waits: its node still serves the volume to other tickets.
    InUse,
    /// The volume's backend root is declared Shared, but the ticket's node does not
    /// see it as the node holding its data does (the root's marker is not there):
    /// nothing is created or served on that node.
    BackendNotShared,
}

impl TicketReason {
    /// Every reason, in declaration order.
    pub const ALL: [TicketReason; 16] = [
        TicketReason::Attached,
        TicketReason::Attaching,
        TicketReason::HeldByOtherNode,
        TicketReason::WaitingForDetach,
        TicketReason::LowerPriority,
        TicketReason::Interrupted,
        TicketReason::NodeLocalElsewhere,
        TicketReason::GenerationPending,
        TicketReason::MountFailed,
        TicketReason::VolumeDeleting,
        TicketReason::InvalidParameters,
        TicketReason::Expired,
        TicketReason::NodeNotFound,
        TicketReason::VolumeNotFound,
        TicketReason::InUse,
        TicketReason::BackendNotShared,
    ];

    /// The reason string written to the condition.
    pub fn as_str(self) -> &'static str {
        match self {
            TicketReason::Attached => "Attached",
            TicketReason::Attaching => "Attaching",
            TicketReason::HeldByOtherNode => "HeldByOtherNode",
            TicketReason::WaitingForDetach => "WaitingForDetach",
            TicketReason::LowerPriority => "LowerPriority",
            TicketReason::Interrupted => "Interrupted",
            TicketReason::NodeLocalElsewhere => "NodeLocalElsewhere",
            TicketReason::GenerationPending => "GenerationPending",
            TicketReason::MountFailed => "MountFailed",
            TicketReason::VolumeDeleting => "VolumeDeleting",
            TicketReason::InvalidParameters => "InvalidParameters",
            TicketReason::Expired => "Expired",
            TicketReason::NodeNotFound => "NodeNotFound",
            TicketReason::VolumeNotFound => "VolumeNotFound",
            TicketReason::InUse => "InUse",
            TicketReason::BackendNotShared => "BackendNotShared",
        }
    }
}

impl TicketReason {
    /// Whether a ticket blocked for this reason waits for a person rather than for
    /// Tessera: a failed mount, a ticket that can never be honoured as written
    /// (invalid, expired, node-local elsewhere), a node or Volume that does not exist,
    /// a root declared Shared that the node does not share.
    /// Such a wait makes the VolumeAttachment `Stalled` (kstatus: Failed); any other
    /// (attaching, waiting for another node or a detach, a lower priority…) makes it
    /// `Reconciling` (kstatus: InProgress).
    pub fn stalls(self) -> bool {
        match self {
            TicketReason::MountFailed
            | TicketReason::NodeLocalElsewhere
            | TicketReason::InvalidParameters
            | TicketReason::Expired
            | TicketReason::NodeNotFound
            | TicketReason::VolumeNotFound
            | TicketReason::BackendNotShared => true,
            TicketReason::Attached
            | TicketReason::Attaching
            | TicketReason::HeldByOtherNode
            | TicketReason::WaitingForDetach
            | TicketReason::LowerPriority
            | TicketReason::Interrupted
            | TicketReason::GenerationPending
            | TicketReason::VolumeDeleting
            | TicketReason::InUse => false,
        }
    }
}

impl std::fmt::Display for TicketReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TicketReason {
    type Err = UnknownReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TicketReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownReason(s.chars().take(64).collect()))
    }
}

/// A condition reason that is not a [`TicketReason`] (at most 64 characters of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown ticket reason {0:?}")]
pub struct UnknownReason(pub String);

impl AttachmentTicket {
    /// A ticket of `type_` for `node_id`, generation 0, no parameters, no expiry.
    pub fn new(id: impl Into<String>, type_: AttacherType, node_id: impl Into<String>) -> Self {
        AttachmentTicket {
            id: id.into(),
            type_,
            node_id: node_id.into(),
            parameters: BTreeMap::new(),
            generation: 0,
            expires_at: None,
        }
    }

    /// The merge-patch body that adds this ticket, or replaces the fields it sets.
    pub fn upsert_patch(&self) -> serde_json::Value {
        serde_json::json!({ "spec": { "attachmentTickets": { &self.id: self } } })
    }

    /// The JSON patch that removes this ticket only if it still names the same node
    /// (a ticket re-created for another node in the meantime is left alone: the
    /// server answers 422).
    pub fn remove_if_unchanged_patch(&self) -> json_patch::Patch {
        let path = format!(
            "/spec/attachmentTickets/{}",
            self.id.replace('~', "~0").replace('/', "~1")
        );
        serde_json::from_value(serde_json::json!([
            {"op": "test", "path": format!("{path}/nodeID"), "value": self.node_id},
            {"op": "remove", "path": path},
        ]))
        .expect("a well-formed JSON patch")
    }
}

/// The merge-patch body that removes the tickets `ids` (absent ones are no-ops).
pub fn tickets_removal_patch<'a>(ids: impl IntoIterator<Item = &'a str>) -> serde_json::Value {
    let removals: serde_json::Map<String, serde_json::Value> = ids
        .into_iter()
        .map(|id| (id.to_owned(), serde_json::Value::Null))
        .collect();
    serde_json::json!({ "spec": { "attachmentTickets": removals } })
}

impl AttachmentTicketStatus {
    /// Whether this status says `ticket` is satisfied as it is now: satisfied, and for
    /// the ticket's current generation.
    pub fn satisfies(&self, ticket: &AttachmentTicket) -> bool {
        self.satisfied && self.generation == ticket.generation
    }

    /// Why the ticket is or is not satisfied: its `Satisfied` condition's reason, or
    /// `Attached` for a satisfied ticket without one (as the controller writes them).
    pub fn reason(&self) -> Option<&str> {
        self.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_SATISFIED)
            .map(|c| c.reason.as_str())
            .or(self.satisfied.then_some(TicketReason::Attached.as_str()))
    }

    /// The reason and message of the `Satisfied` condition, if it carries a known reason.
    pub fn blocked_by(&self) -> Option<(TicketReason, &str)> {
        let c = self
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_SATISFIED)?;
        Some((c.reason.parse().ok()?, c.message.as_str()))
    }
}

impl VolumeAttachment {
    /// Whether the Volume of uid `volume_uid` owns this object (an owner reference
    /// names it). False for an empty uid.
    pub fn owned_by(&self, volume_uid: &str) -> bool {
        !volume_uid.is_empty()
            && self
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == volume_uid)
    }

    /// Whether ticket `id` can be written without taking the object past
    /// [`MAX_TICKETS`]: it is there already (rewritten in place), it takes the place
    /// of ticket `replacing` removed in the same write, or there is room.
    pub fn has_room_for(&self, id: &str, replacing: Option<&str>) -> bool {
        let tickets = &self.spec.attachment_tickets;
        tickets.contains_key(id)
            || replacing.is_some_and(|r| tickets.contains_key(r))
            || tickets.len() < MAX_TICKETS
    }

    /// Whether ticket `id` exists and its status says it is satisfied at its generation.
    pub fn ticket_satisfied(&self, id: &str) -> bool {
        let Some(ticket) = self.spec.attachment_tickets.get(id) else {
            return false;
        };
        self.ticket_status(id).is_some_and(|s| s.satisfies(ticket))
    }

    /// The status of ticket `id`, if the controller wrote one.
    pub fn ticket_status(&self, id: &str) -> Option<&AttachmentTicketStatus> {
        self.status.as_ref()?.attachment_ticket_statuses.get(id)
    }

    /// The generation for ticket `id` written anew: above the ticket's own, and above
    /// any status the object still has for that id — a ticket removed a moment ago
    /// keeps its (satisfied) status until the controller next writes, and that status
    /// must not satisfy the new ticket. 0 for an id the object knows nothing of.
    pub fn next_ticket_generation(&self, id: &str) -> i64 {
        let spec = self.spec.attachment_tickets.get(id).map(|t| t.generation);
        let status = self.ticket_status(id).map(|s| s.generation);
        spec.into_iter()
            .chain(status)
            .max()
            .map_or(0, |g| g.saturating_add(1))
    }
}

/// The `csi-ephemeral` ticket of an inline volume on `node`.
pub fn inline_ticket(volume: &str, node: &str, read_only: bool) -> AttachmentTicket {
    let mut t = AttachmentTicket::new(
        inline_ticket_id(volume, node),
        AttacherType::CsiEphemeral,
        node,
    );
    t.parameters = [("readOnly".to_string(), read_only.to_string())].into();
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_finds_room_in_place_in_a_removed_ones_place_or_below_the_most() {
        let full = |n: usize| {
            let mut va = VolumeAttachment::new(
                "v",
                VolumeAttachmentSpec {
                    volume: "v".into(),
                    attachment_tickets: BTreeMap::new(),
                },
            );
            for i in 0..n {
                let id = format!("t{i}");
                let t = AttachmentTicket::new(&id, AttacherType::CsiAttacher, format!("n{i}"));
                va.spec.attachment_tickets.insert(id, t);
            }
            va
        };
        // (tickets held, id written, id removed in the same write, room)
        for (n, id, replacing, room) in [
            (0, "new", None, true),
            (MAX_TICKETS - 1, "new", None, true),
            (MAX_TICKETS, "new", None, false),
            (MAX_TICKETS, "t7", None, true),
            (MAX_TICKETS, "new", Some("t7"), true),
            (MAX_TICKETS, "new", Some("gone"), false),
            (MAX_TICKETS + 3, "new", None, false),
        ] {
            assert_eq!(
                full(n).has_room_for(id, replacing),
                room,
                "{n} tickets, writing {id} in place of {replacing:?}"
            );
        }
    }

    #[test]
    fn a_ticket_written_anew_is_above_its_own_generation_and_any_status_left() {
        let va = |spec: Option<i64>, status: Option<(bool, i64)>| {
            let mut va = VolumeAttachment::new(
                "v",
                VolumeAttachmentSpec {
                    volume: "v".into(),
                    attachment_tickets: BTreeMap::new(),
                },
            );
            if let Some(g) = spec {
                let mut t = AttachmentTicket::new("t", AttacherType::CsiAttacher, "n1");
                t.generation = g;
                va.spec.attachment_tickets.insert("t".into(), t);
            }
            if let Some((satisfied, generation)) = status {
                let s = AttachmentTicketStatus {
                    id: "t".into(),
                    satisfied,
                    generation,
                    ..Default::default()
                };
                va.status = Some(VolumeAttachmentStatus {
                    attachment_ticket_statuses: [("t".to_string(), s)].into(),
                    ..Default::default()
                });
            }
            va
        };
        // (what, ticket's generation in the spec, its status (satisfied, generation), want)
        let cases = [
            ("unknown", None, None, 0),
            ("in the spec, no status yet", Some(0), None, 1),
            ("in the spec, satisfied", Some(3), Some((true, 3)), 4),
            (
                "removed a moment ago, its satisfied status still there",
                None,
                Some((true, 0)),
                1,
            ),
            (
                "removed, status of a later generation",
                None,
                Some((true, 5)),
                6,
            ),
        ];
        for (what, spec, status, want) in cases {
            let va = va(spec, status);
            assert_eq!(va.next_ticket_generation("t"), want, "{what}");
            if spec.is_none() && status.is_some() {
                // The reason it matters: with generation 0 the stale status would
                // say the new ticket is satisfied.
                let mut again = va.clone();
                let mut t = AttachmentTicket::new("t", AttacherType::CsiAttacher, "n1");
                t.generation = want;
                again.spec.attachment_tickets.insert("t".into(), t);
                assert!(!again.ticket_satisfied("t"), "{what}");
            }
        }
    }

    #[test]
    fn every_reason_round_trips_through_its_string() {
        // The exhaustive match makes a new variant fail to compile here: a reminder
        // to give it its place in ALL, in the same order.
        let position = |r: TicketReason| match r {
            TicketReason::Attached => 0,
            TicketReason::Attaching => 1,
            TicketReason::HeldByOtherNode => 2,
            TicketReason::WaitingForDetach => 3,
            TicketReason::LowerPriority => 4,
            TicketReason::Interrupted => 5,
            TicketReason::NodeLocalElsewhere => 6,
            TicketReason::GenerationPending => 7,
            TicketReason::MountFailed => 8,
            TicketReason::VolumeDeleting => 9,
            TicketReason::InvalidParameters => 10,
            TicketReason::Expired => 11,
            TicketReason::NodeNotFound => 12,
            TicketReason::VolumeNotFound => 13,
            TicketReason::InUse => 14,
            TicketReason::BackendNotShared => 15,
        };
        for (i, r) in TicketReason::ALL.into_iter().enumerate() {
            assert_eq!(TicketReason::ALL[position(r)], r);
            assert_eq!(position(r), i);
            assert_eq!(r.as_str().parse::<TicketReason>(), Ok(r));
            // The serde name is the same string (conditions written by older builds).
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        let long = "x".repeat(1000);
        assert_eq!(
            long.parse::<TicketReason>().unwrap_err().0.len(),
            64,
            "what is echoed is bounded"
        );
    }

    #[test]
    fn upsert_patch_carries_the_ticket_under_its_id() {
        let mut t = AttachmentTicket::new("csi-1", AttacherType::CsiAttacher, "node-a");
        t.parameters.insert("readOnly".into(), "true".into());
        t.generation = 3;
        assert_eq!(
            t.upsert_patch(),
            serde_json::json!({"spec": {"attachmentTickets": {"csi-1": {
                "id": "csi-1", "type": "csi-attacher", "nodeID": "node-a",
                "parameters": {"readOnly": "true"}, "generation": 3,
            }}}})
        );
    }

    #[test]
    fn removal_patches() {
        assert_eq!(
            tickets_removal_patch(["a", "b"]),
            serde_json::json!({"spec": {"attachmentTickets": {"a": null, "b": null}}})
        );
        let t = AttachmentTicket::new("we/ird~id", AttacherType::Manual, "n");
        assert_eq!(
            serde_json::to_value(t.remove_if_unchanged_patch()).unwrap(),
            serde_json::json!([
                {"op": "test", "path": "/spec/attachmentTickets/we~1ird~0id/nodeID", "value": "n"},
                {"op": "remove", "path": "/spec/attachmentTickets/we~1ird~0id"},
            ])
        );
    }

    #[test]
    fn satisfies_needs_the_same_generation() {
        let mut t = AttachmentTicket::new("t", AttacherType::Manual, "n");
        let s = AttachmentTicketStatus {
            id: "t".into(),
            satisfied: true,
            generation: 0,
            ..Default::default()
        };
        assert!(s.satisfies(&t));
        t.generation = 1;
        assert!(
            !s.satisfies(&t),
            "an older generation's satisfaction is not this one's"
        );
        let unsatisfied = AttachmentTicketStatus {
            satisfied: false,
            generation: 1,
            ..s
        };
        assert!(!unsatisfied.satisfies(&t));
    }
}
