//! Ticket arbitration: tickets in, decision out. Pure — no kube client, no I/O, no
//! clock. The VolumeAttachment controller gathers an [`Input`] from the API objects,
//! calls [`decide`], and turns the [`Decision`] into MountPods and ticket statuses.
//!
//! (Interface fixed; the implementation and tests are being written.)

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{AccessMode, AttachmentTicket, AttacherType, TicketReason};

/// Everything arbitration looks at, for one volume.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    /// The volume's access mode.
    pub access_mode: AccessMode,
    /// The volume is being deleted: no new attachment except for `cleanup` tickets.
    pub deleting: bool,
    /// For node-local volumes: the only node the volume can ever be attached to.
    pub pinned_node: Option<String>,
    /// The tickets (order carries no meaning).
    pub tickets: Vec<TicketInput>,
    /// The mounts (MountPods) that exist now, by node.
    pub mounts: BTreeMap<String, MountView>,
}

/// One ticket, with when the controller first saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct TicketInput {
    /// The ticket as in `spec.attachmentTickets`.
    pub ticket: AttachmentTicket,
    /// When the controller first saw the ticket (`status…requestedAt`); `None` sorts last.
    pub requested_at: Option<Time>,
}

/// What arbitration needs to know of a MountPod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountView {
    /// Where the mount is.
    pub state: MountState,
    /// Whether the MountPod's spec asks for a read-only mount.
    pub read_only: bool,
}

/// The state of a MountPod, as far as arbitration cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountState {
    /// Created or being (re)mounted, or Ready for an older spec generation.
    Starting,
    /// Ready for its current spec (phase Ready, observedGeneration == generation).
    Ready,
    /// Failed; the message says why (the MountPod's lastError).
    Failed(String),
    /// Being deleted (deletionTimestamp set): the volume is detaching from this node.
    Terminating,
}

/// The outcome of arbitration for one volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Nodes that should have a MountPod now, with whether it must be read-only.
    /// MountPods on other nodes are to be deleted.
    pub nodes: BTreeMap<String, NodeMount>,
    /// One outcome per ticket id.
    pub tickets: BTreeMap<String, TicketOutcome>,
}

/// How a chosen node mounts the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeMount {
    /// Mount read-only.
    pub read_only: bool,
}

/// The status arbitration gives one ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketOutcome {
    /// Satisfied: chosen, mount Ready and compatible, generation current.
    pub satisfied: bool,
    /// Why (always set, satisfied or not).
    pub reason: TicketReason,
    /// A sentence for a person, naming what blocks the ticket (holder ticket and node,
    /// the failing mount's error, …).
    pub message: String,
    /// The ticket generation this outcome describes.
    pub generation: i64,
}

/// Priority of an attacher type (higher wins).
pub fn priority(t: AttacherType) -> u32 {
    match t {
        AttacherType::VolumeRestore | AttacherType::VolumeExpansion => 2000,
        AttacherType::Manual => 1000,
        AttacherType::CsiAttacher | AttacherType::ShareManager => 900,
        AttacherType::Snapshot | AttacherType::Backup | AttacherType::Clone | AttacherType::Cleanup => 800,
    }
}

/// Background tickets are interruptible: they yield to a workload ticket on another node.
pub fn is_background(t: AttacherType) -> bool {
    priority(t) <= 800
}

/// Decide which nodes the volume should be attached to and the status of every ticket.
pub fn decide(_input: &Input) -> Decision {
    unimplemented!("being written")
}

#[allow(dead_code)]
fn _unused(_: BTreeSet<String>) {}
