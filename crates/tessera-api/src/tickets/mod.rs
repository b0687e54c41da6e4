//! Ticket arbitration: tickets in, decision out. Pure — no kube client, no I/O, no
//! clock (the time is part of the input). The VolumeAttachment controller gathers an [`Input`] from the API objects,
//! calls [`decide`], and turns the [`Decision`] into MountPods and ticket statuses.
//!
//! # Data flow
//!
//! ```text
//!  tickets + mounts ──▶ eligibility ──▶ node choice ──▶ one outcome per ticket
//!                      (params, pin,    (single-node:     (Attached, or the reason
//!                       deleting)        keep / move;      and a sentence naming
//!                                        multi-node: all)  what blocks it)
//! ```
//!
//! The controller creates a MountPod on every node of [`Decision::nodes`] that has
//! none, deletes MountPods on every other node, and writes each [`TicketOutcome`] into
//! `status.attachmentTicketStatuses`. It then calls [`decide`] again on the new world:
//! a volume moves between nodes in several rounds (detach, then attach), and every
//! round is decided from scratch, so a controller crash between rounds loses nothing.
//!
//! # Rules
//!
//! - **Order.** Tickets are ordered by [`priority`] (descending), then `requested_at`
//!   (earliest first, unknown last), then id. The input order never matters.
//! - **Eligibility.** A ticket is never chosen if it is past its `expiresAt` (Expired,
//!   from the first decision, even on a node that holds the volume for it), if its node
//!   does not exist (NodeNotFound), if its `readOnly` parameter is not
//!   `"true"`/`"false"` (InvalidParameters), if the volume is pinned to another node
//!   (NodeLocalElsewhere), or if the volume is being deleted (VolumeDeleting) — except
//!   `cleanup` tickets, and workload tickets on a node whose serving mount already
//!   holds the volume, which are not displaced. Snapshot, backup and clone tickets are not served at all
//!   on a volume being deleted.
//! - **Holding.** A node holds the volume when it has a MountPod that is not
//!   Terminating (Starting, Ready or Failed). A Terminating MountPod is detaching.
//! - **Single-node modes** (RWO, RWOP) attach to at most one node. A holder with an
//!   eligible workload ticket is kept whatever waits elsewhere (no preemption). A
//!   holder with only background tickets is kept unless an eligible workload ticket
//!   wants another node; then its background tickets are Interrupted. A holder with no
//!   eligible ticket is dropped. If several nodes hold (an inconsistent world, e.g.
//!   after a crash) only one is kept: the one with the first workload ticket (or,
//!   when no workload wants the volume, the first background ticket). With nothing
//!   kept, the first eligible ticket wins, but its node is attached only once no
//!   MountPod is left anywhere (WaitingForDetach): moving is detach, then attach.
//! - **Multi-node modes** (ROX, RWX) attach to the node of every eligible ticket; a
//!   node whose previous MountPod is still Terminating stays chosen and waits.
//! - **Read-only.** A chosen node mounts read-only if the volume is ReadOnlyMany or
//!   every chosen ticket on it asks `readOnly: "true"`.
//! - **Cleanup.** A chosen node whose chosen tickets are all `cleanup` tickets gets a
//!   mount that removes the data ([`NodeMount::removes_data`]); a cleanup ticket on a
//!   node that also serves other tickets waits for them (InUse).
//! - **Populate.** A chosen node whose chosen tickets are all `volume-restore` tickets
//!   gets a read-write mount that fills the volume from its data source (a snapshot or
//!   another volume: [`NodeMount::populates`]) and then reports Ready; a restore
//!   ticket on a node that serves other tickets waits for them (InUse).
//! - **Satisfied** means proven: the ticket's node is chosen, its MountPod is Ready,
//!   of the right task (removing the data for a cleanup ticket, serving otherwise) and
//!   compatible (a read-write ticket needs a read-write mount; a ReadOnlyMany volume
//!   needs a read-only one). Every outcome carries a reason and a non-empty message.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::{ANNOTATION_ABANDON_DATA, AccessMode, AttacherType, AttachmentTicket, TicketReason};

#[cfg(test)]
mod tests;

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
    /// The time of the decision: a ticket whose `expiresAt` is not after it is expired.
    pub now: Time,
    /// Nodes that tickets name but that do not exist (no Node object): their tickets
    /// are not honoured.
    pub missing_nodes: BTreeSet<String>,
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
    /// Whether the MountPod removes the volume's data (task RemoveData) instead of
    /// serving it: only such a mount, Ready, satisfies a cleanup ticket, and only a
    /// serving one satisfies any other ticket.
    pub removes_data: bool,
    /// Whether the MountPod fills the volume from its data source (task Populate)
    /// instead of serving it: only such a mount, Ready, satisfies a `volume-restore`
    /// ticket, and only a serving one satisfies a workload ticket.
    pub populates: bool,
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
    /// Refused by the node's agent because the node does not share the volume's
    /// backend root, declared Shared, with the root's anchor (reason
    /// `BackendNotShared`): nothing was created there; the message says which node
    /// and root.
    NotShared(String),
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
    /// Remove the volume's data instead of serving it (MountPod task RemoveData): every
    /// ticket chosen on the node is a cleanup ticket.
    pub removes_data: bool,
    /// Fill the volume from its data source (a snapshot or another volume) instead of
    /// serving it (MountPod task Populate): every ticket chosen on the node is a
    /// `volume-restore` ticket.
    pub populates: bool,
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
        AttacherType::CsiAttacher | AttacherType::CsiEphemeral | AttacherType::ShareManager => 900,
        AttacherType::Snapshot
        | AttacherType::Backup
        | AttacherType::Clone
        | AttacherType::Cleanup => 800,
        // An idle mount kept for a while yields to any work that wants the volume.
        AttacherType::IdleMount => 700,
    }
}

/// Background tickets are interruptible: they yield to a workload ticket on another node.
pub fn is_background(t: AttacherType) -> bool {
    priority(t) <= 800
}

/// The `readOnly` parameter of a ticket: `Some(false)` when absent, `None` when it is
/// neither `"true"` nor `"false"` (the CRD rejects that, but arbitration must not trust
/// it).
pub fn ticket_read_only(ticket: &AttachmentTicket) -> Option<bool> {
    match ticket.parameters.get("readOnly").map(String::as_str) {
        None | Some("false") => Some(false),
        Some("true") => Some(true),
        Some(_) => None,
    }
}

/// Compares two tickets in arbitration order: priority (higher first), then
/// `requested_at` (earlier first, `None` last), then id.
pub fn ticket_order(a: &TicketInput, b: &TicketInput) -> Ordering {
    order_key(a).cmp(&order_key(b))
}

fn order_key(t: &TicketInput) -> (Reverse<u32>, bool, Option<&Time>, &str) {
    (
        Reverse(priority(t.ticket.type_)),
        t.requested_at.is_none(),
        t.requested_at.as_ref(),
        &t.ticket.id,
    )
}

/// Decide which nodes the volume should be attached to and the status of every ticket.
pub fn decide(input: &Input) -> Decision {
    let tickets = in_order(&input.tickets);
    let holders: BTreeSet<&str> = input
        .mounts
        .iter()
        .filter(|(_, m)| m.state != MountState::Terminating)
        .map(|(n, _)| n.as_str())
        .collect();

    let mut out = Outcomes::default();
    let mut eligible = Vec::new();
    for t in tickets {
        match ineligible(input, t, &holders) {
            Some((reason, message)) => out.set(t, false, reason, message),
            None => eligible.push(Candidate {
                t,
                // `ineligible` has rejected invalid parameters.
                read_only: ticket_read_only(&t.ticket) == Some(true),
            }),
        }
    }

    let nodes = if input.access_mode.is_multi_node() {
        multi_node(input, &eligible, &mut out)
    } else {
        single_node(input, &eligible, &holders, &mut out)
    };
    Decision {
        nodes,
        tickets: out.0,
    }
}

/// The earliest `expiresAt` after the decision's time: when the decision changes
/// without any object changing, so the caller decides again then.
pub fn next_expiry(input: &Input) -> Option<&Time> {
    input
        .tickets
        .iter()
        .filter_map(|t| t.ticket.expires_at.as_ref())
        .filter(|e| e.0 > input.now.0)
        .min_by_key(|e| e.0)
}

/// An eligible ticket.
#[derive(Clone, Copy)]
struct Candidate<'a> {
    t: &'a TicketInput,
    /// The ticket asks for a read-only mount.
    read_only: bool,
}

impl<'a> Candidate<'a> {
    fn node(&self) -> &'a str {
        &self.t.ticket.node_id
    }
    fn workload(&self) -> bool {
        !is_background(self.t.ticket.type_)
    }
    /// `csi-abc (csi-attacher)`: how messages name a ticket.
    fn name(&self) -> String {
        format!("{} ({})", self.t.ticket.id, self.t.ticket.type_)
    }
}

#[derive(Default)]
struct Outcomes(BTreeMap<String, TicketOutcome>);

impl Outcomes {
    fn set(&mut self, t: &TicketInput, satisfied: bool, reason: TicketReason, message: String) {
        debug_assert_eq!(satisfied, reason == TicketReason::Attached);
        debug_assert!(!message.is_empty());
        self.0.insert(
            t.ticket.id.clone(),
            TicketOutcome {
                satisfied,
                reason,
                message,
                generation: t.ticket.generation,
            },
        );
    }
}

/// The tickets in arbitration order, one per id. Ids are map keys in the API, so
/// duplicates should not happen; if they do, the first in order wins, and exact ties
/// are broken on the whole ticket so that the input order still never matters.
fn in_order(tickets: &[TicketInput]) -> Vec<&TicketInput> {
    let mut sorted: Vec<&TicketInput> = tickets.iter().collect();
    sorted.sort_by(|a, b| ticket_order(a, b).then_with(|| format!("{a:?}").cmp(&format!("{b:?}"))));
    let mut seen = BTreeSet::new();
    sorted.retain(|t| seen.insert(t.ticket.id.as_str()));
    sorted
}

/// Why a ticket can never be chosen now, if it cannot.
fn ineligible(
    input: &Input,
    t: &TicketInput,
    holders: &BTreeSet<&str>,
) -> Option<(TicketReason, String)> {
    let ticket = &t.ticket;
    if let Some(expires) = &ticket.expires_at
        && expires.0 <= input.now.0
    {
        return Some((
            TicketReason::Expired,
            format!(
                "ticket expired at {}; it is no longer honoured (remove it, or move its expiresAt)",
                expires.0
            ),
        ));
    }
    if input.missing_nodes.contains(&ticket.node_id) {
        // Whether it never existed or is gone, the cache cannot tell: say neither.
        let message = if ticket.type_ == AttacherType::Cleanup {
            format!(
                "node {} does not exist: the volume's data there cannot be removed while it does not; to delete the Volume without removing its data, annotate it {ANNOTATION_ABANDON_DATA}=true",
                ticket.node_id
            )
        } else {
            format!(
                "node {} does not exist; the ticket is not honoured while it does not",
                ticket.node_id
            )
        };
        return Some((TicketReason::NodeNotFound, message));
    }
    if ticket_read_only(ticket).is_none() {
        let value = ticket
            .parameters
            .get("readOnly")
            .map(String::as_str)
            .unwrap_or_default();
        return Some((
            TicketReason::InvalidParameters,
            format!("parameters.readOnly is {value:?}; it must be \"true\" or \"false\""),
        ));
    }
    if let Some(pinned) = &input.pinned_node
        && *pinned != ticket.node_id
    {
        return Some((
            TicketReason::NodeLocalElsewhere,
            format!(
                "volume is node-local to {pinned}; it cannot be attached to {}",
                ticket.node_id
            ),
        ));
    }
    if input.deleting && ticket.type_ != AttacherType::Cleanup {
        // A workload already holding the volume keeps it (no preemption, even by the
        // deletion); it only cannot start a new attachment. Other background work on a
        // volume that is going away has no purpose, so it is not served at all.
        // (A mount that removes the data holds nothing for a workload.)
        let serves = input
            .mounts
            .get(&ticket.node_id)
            .is_some_and(|m| !m.removes_data);
        let keeps =
            !is_background(ticket.type_) && holders.contains(ticket.node_id.as_str()) && serves;
        if !keeps {
            let message = if is_background(ticket.type_) {
                format!(
                    "volume is being deleted; {} tickets are not served",
                    ticket.type_
                )
            } else {
                format!(
                    "volume is being deleted; no new attachment to {} (only cleanup tickets are served)",
                    ticket.node_id
                )
            };
            return Some((TicketReason::VolumeDeleting, message));
        }
    }
    None
}

/// How a chosen node mounts the volume.
fn node_mount(mode: AccessMode, eligible: &[Candidate], node: &str) -> NodeMount {
    let only = |t: AttacherType| {
        eligible
            .iter()
            .filter(|c| c.node() == node)
            .all(|c| c.t.ticket.type_ == t)
    };
    let removes_data = only(AttacherType::Cleanup);
    NodeMount {
        // A node filling the volume writes it, whatever its tickets say.
        read_only: node_read_only(mode, eligible, node) && !only(AttacherType::VolumeRestore),
        removes_data,
        populates: !removes_data && only(AttacherType::VolumeRestore),
    }
}

/// Whether a chosen node mounts read-only.
fn node_read_only(mode: AccessMode, eligible: &[Candidate], node: &str) -> bool {
    mode == AccessMode::ReadOnlyMany
        || eligible
            .iter()
            .filter(|c| c.node() == node)
            .all(|c| c.read_only)
}

/// Whether a Ready mount serves a ticket: a read-write ticket needs a read-write mount;
/// a ReadOnlyMany volume is never mounted writable, so its mounts must be read-only.
pub fn compatible(mode: AccessMode, ticket_read_only: bool, mount_read_only: bool) -> bool {
    if mode == AccessMode::ReadOnlyMany {
        mount_read_only
    } else {
        ticket_read_only || !mount_read_only
    }
}

/// A Ready mount of the wrong kind for `c`: one that fills the volume from its data
/// source while `c` wants it served, or the reverse.
fn populate_mismatch(
    eligible: &[Candidate],
    c: &Candidate,
    populates: bool,
) -> (TicketReason, String) {
    let node = c.node();
    if populates {
        return (
            TicketReason::GenerationPending,
            format!(
                "MountPod on {node} fills the volume from its data source; a serving mount follows"
            ),
        );
    }
    // The node serves the volume to other tickets: it is filled only once none is
    // left there (never under a workload).
    let others: Vec<String> = eligible
        .iter()
        .filter(|o| o.node() == node && o.t.ticket.type_ != AttacherType::VolumeRestore)
        .map(Candidate::name)
        .collect();
    if others.is_empty() {
        (
            TicketReason::GenerationPending,
            format!(
                "MountPod on {node} serves the volume; it is replaced by one that fills it from its data source"
            ),
        )
    } else {
        (
            TicketReason::InUse,
            format!(
                "node {node} still serves the volume to ticket(s) {}; it is filled from its data source once they are removed",
                others.join(", ")
            ),
        )
    }
}

/// The outcome of a ticket whose node is in the decision: it depends on the mount.
fn chosen(input: &Input, eligible: &[Candidate], c: &Candidate, out: &mut Outcomes) {
    let node = c.node();
    let (reason, message) = match input.mounts.get(node) {
        None => (
            TicketReason::Attaching,
            format!("attaching to {node}: waiting for its MountPod to be created"),
        ),
        Some(m) => match &m.state {
            MountState::Terminating => (
                TicketReason::WaitingForDetach,
                format!("previous mount on {node} is still being removed; a new one follows"),
            ),
            MountState::Starting => (
                TicketReason::Attaching,
                format!("attaching to {node}: MountPod is starting"),
            ),
            MountState::Failed(error) => (
                TicketReason::MountFailed,
                format!("MountPod on {node} failed: {error}"),
            ),
            MountState::NotShared(error) => (
                TicketReason::BackendNotShared,
                format!("node {node} does not share the volume's backend root: {error}"),
            ),
            MountState::Ready
                if m.populates != (c.t.ticket.type_ == AttacherType::VolumeRestore)
                    && !m.removes_data =>
            {
                populate_mismatch(eligible, c, m.populates)
            }
            MountState::Ready if m.removes_data != (c.t.ticket.type_ == AttacherType::Cleanup) => {
                if m.removes_data {
                    (
                        TicketReason::GenerationPending,
                        format!(
                            "MountPod on {node} removes the volume's data; a serving mount follows"
                        ),
                    )
                } else {
                    // The node serves the volume to other tickets: its data is removed
                    // only once none is left there (never while it is in use).
                    let others: Vec<String> = eligible
                        .iter()
                        .filter(|o| o.node() == node && o.t.ticket.type_ != AttacherType::Cleanup)
                        .map(Candidate::name)
                        .collect();
                    if others.is_empty() {
                        (
                            TicketReason::GenerationPending,
                            format!(
                                "MountPod on {node} serves the volume; it is replaced by one that removes the data"
                            ),
                        )
                    } else {
                        (
                            TicketReason::InUse,
                            format!(
                                "node {node} still serves the volume to ticket(s) {}; its data is removed once they are removed",
                                others.join(", ")
                            ),
                        )
                    }
                }
            }
            // A mount that fills the volume writes it, whatever the access mode.
            MountState::Ready
                if m.populates || compatible(input.access_mode, c.read_only, m.read_only) =>
            {
                let mode = if m.read_only {
                    "read-only"
                } else {
                    "read-write"
                };
                (
                    TicketReason::Attached,
                    format!("attached to {node}, mount ready ({mode})"),
                )
            }
            MountState::Ready => {
                // Ready for the spec it had: the mode the decision asks differs.
                let (has, wants) = if m.read_only {
                    ("read-only", "read-write")
                } else {
                    ("read-write", "read-only")
                };
                (
                    TicketReason::GenerationPending,
                    format!(
                        "mount on {node} is ready but {has}; waiting for it to be remounted {wants}"
                    ),
                )
            }
        },
    };
    out.set(c.t, reason == TicketReason::Attached, reason, message);
}

/// ReadOnlyMany / ReadWriteMany: every eligible ticket's node.
fn multi_node(
    input: &Input,
    eligible: &[Candidate],
    out: &mut Outcomes,
) -> BTreeMap<String, NodeMount> {
    let mut nodes = BTreeMap::new();
    for c in eligible {
        nodes
            .entry(c.node().to_string())
            .or_insert_with(|| node_mount(input.access_mode, eligible, c.node()));
        chosen(input, eligible, c, out);
    }
    nodes
}

/// ReadWriteOnce / ReadWriteOncePod: at most one node; keep a holder or move.
fn single_node(
    input: &Input,
    eligible: &[Candidate],
    holders: &BTreeSet<&str>,
    out: &mut Outcomes,
) -> BTreeMap<String, NodeMount> {
    let mode = input.access_mode;
    let holds = |c: &&Candidate| holders.contains(c.node());
    // `eligible` is in order, so the first match is the best ticket. A holder with a
    // workload ticket is kept whatever waits elsewhere: no preemption. Among several
    // holders (a crash), the one with the first workload ticket; never two.
    let wanted_by_workload = eligible.iter().any(Candidate::workload);
    let keeper = eligible
        .iter()
        .filter(holds)
        .find(|c| c.workload())
        .or_else(|| {
            // Background work keeps its node only while no workload wants the volume:
            // background tickets are interruptible.
            if wanted_by_workload {
                None
            } else {
                eligible.iter().find(holds)
            }
        });

    if let Some(k) = keeper {
        // Workload tickets sort before background ones, so `k` is also the first
        // ticket on its node: the one that holds the volume.
        let node = k.node();
        for c in eligible {
            if c.node() == node {
                chosen(input, eligible, c, out);
            } else {
                out.set(
                    c.t,
                    false,
                    TicketReason::HeldByOtherNode,
                    format!(
                        "volume is {mode} and attached to {node} for ticket {}; this ticket waits until that ticket is removed",
                        k.name()
                    ),
                );
            }
        }
        return BTreeMap::from([(node.to_string(), node_mount(mode, eligible, node))]);
    }

    let Some(w) = eligible.first() else {
        return BTreeMap::new();
    };
    let node = w.node();
    // If `w`'s node held the volume, `w` would be the keeper: workload tickets on a
    // holder are always kept, and a background `w` means no workload wants it.
    debug_assert!(!holders.contains(node));
    // Every MountPod left is either a holder being dropped or one terminating. Attach
    // only once all are gone — including an old one on `node` itself — so that there
    // are never two writers, nor two MountPods on one node.
    let blockers: Vec<String> = input
        .mounts
        .iter()
        .map(|(n, m)| match m.state {
            MountState::Terminating if n == node => {
                format!("{n} (previous MountPod being removed)")
            }
            MountState::Terminating => format!("{n} (MountPod being removed)"),
            _ => format!("{n} (MountPod to be removed)"),
        })
        .collect();
    let waiting = !blockers.is_empty();

    for c in eligible {
        if c.node() == node {
            if waiting {
                out.set(
                    c.t,
                    false,
                    TicketReason::WaitingForDetach,
                    format!(
                        "volume is {mode}; waiting for it to detach from {} before attaching to {node}",
                        blockers.join(", ")
                    ),
                );
            } else {
                chosen(input, eligible, c, out);
            }
        } else if !c.workload() && w.workload() && input.mounts.contains_key(c.node()) {
            out.set(
                c.t,
                false,
                TicketReason::Interrupted,
                format!(
                    "background ticket interrupted: workload ticket {} wants the volume on {node}",
                    w.name()
                ),
            );
        } else {
            out.set(
                c.t,
                false,
                TicketReason::LowerPriority,
                format!(
                    "volume is {mode}; ticket {} on {node} goes first ({}); this ticket waits until that ticket is removed",
                    w.name(),
                    why_first(w.t, c.t)
                ),
            );
        }
    }

    if waiting {
        BTreeMap::new()
    } else {
        BTreeMap::from([(node.to_string(), node_mount(mode, eligible, node))])
    }
}

/// Why `winner` sorts before `loser`, for a message.
fn why_first(winner: &TicketInput, loser: &TicketInput) -> String {
    let (pw, pl) = (priority(winner.ticket.type_), priority(loser.ticket.type_));
    if pw != pl {
        format!("priority {pw} > {pl}")
    } else if winner.requested_at != loser.requested_at {
        "same priority, requested earlier".to_string()
    } else {
        "same priority and request time, smaller id".to_string()
    }
}
