//! Table tests of arbitration, property tests over random worlds, and the builders
//! they share.
//!
//! | module | holds |
//! |---|---|
//! | [`tables`] | one table test per arbitration rule |
//! | [`properties`] | proptest invariants of `decide` and of convergence over random worlds |
//! | [`expiry`] | expired tickets and tickets for missing nodes (issue 13) |
//!
//! The builders here (`tk`, `input`, `actuate`, `converge`, …) are shared by all three.

mod expiry;
mod populate;
mod properties;
mod tables;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::{AccessMode, AttacherType as T, AttachmentTicket, TicketReason as R};
use AccessMode::{
    ReadOnlyMany as ROX, ReadWriteMany as RWX, ReadWriteOnce as RWO, ReadWriteOncePod as RWOP,
};

// ---------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------

fn tk(id: &str, type_: AttacherType, node: &str) -> TicketInput {
    TicketInput {
        ticket: AttachmentTicket {
            id: id.to_string(),
            type_,
            node_id: node.to_string(),
            parameters: BTreeMap::new(),
            generation: 1,
            expires_at: None,
        },
        requested_at: None,
    }
}

fn time(seconds: i64) -> Time {
    Time(Timestamp::from_second(1_700_000_000 + seconds).unwrap())
}

trait TicketExt {
    fn at(self, seconds: i64) -> Self;
    fn read_only(self) -> Self;
    fn param(self, key: &str, value: &str) -> Self;
    fn generation(self, g: i64) -> Self;
}

impl TicketExt for TicketInput {
    fn at(mut self, seconds: i64) -> Self {
        self.requested_at = Some(time(seconds));
        self
    }
    fn read_only(self) -> Self {
        self.param("readOnly", "true")
    }
    fn param(mut self, key: &str, value: &str) -> Self {
        self.ticket
            .parameters
            .insert(key.to_string(), value.to_string());
        self
    }
    fn generation(mut self, g: i64) -> Self {
        self.ticket.generation = g;
        self
    }
}

fn mount(state: MountState, read_only: bool) -> MountView {
    MountView {
        state,
        read_only,
        removes_data: false,
        populates: false,
    }
}
fn ready() -> MountView {
    mount(MountState::Ready, false)
}
fn starting() -> MountView {
    mount(MountState::Starting, false)
}
fn terminating() -> MountView {
    mount(MountState::Terminating, false)
}

fn input(
    access_mode: AccessMode,
    tickets: Vec<TicketInput>,
    mounts: &[(&str, MountView)],
) -> Input {
    Input {
        access_mode,
        deleting: false,
        pinned_node: None,
        tickets,
        mounts: mounts
            .iter()
            .map(|(n, m)| (n.to_string(), m.clone()))
            .collect(),
        now: time(0),
        missing_nodes: Default::default(),
    }
}

fn nodes(d: &Decision) -> Vec<(&str, bool)> {
    d.nodes
        .iter()
        .map(|(n, m)| (n.as_str(), m.read_only))
        .collect()
}

fn outcome<'a>(d: &'a Decision, id: &str) -> &'a TicketOutcome {
    d.tickets
        .get(id)
        .unwrap_or_else(|| panic!("no outcome for {id}: {d:#?}"))
}

#[track_caller]
fn assert_reason(d: &Decision, id: &str, reason: TicketReason, needles: &[&str]) {
    let o = outcome(d, id);
    assert_eq!(o.reason, reason, "{id}: {o:#?}");
    assert_eq!(o.satisfied, reason == R::Attached, "{id}: {o:#?}");
    for needle in needles {
        assert!(
            o.message.contains(needle),
            "{id}: message {:?} lacks {needle:?}",
            o.message
        );
    }
}

/// What the controller and node agents do with a decision, one round: MountPods not in
/// the decision start terminating, then disappear; missing ones are created
/// (Starting), then become Ready with the decided mode; a Ready mount of the wrong
/// mode is re-specified (Starting again); a failed one is repaired.
///
/// A mount that removes the data where the decision says so, else a serving one; a
/// mount of the other task is replaced.
fn actuate(mounts: &BTreeMap<String, MountView>, d: &Decision) -> BTreeMap<String, MountView> {
    let removes_data = |node: &str| d.nodes.get(node).is_some_and(|n| n.removes_data);
    let populates = |node: &str| d.nodes.get(node).is_some_and(|n| n.populates);
    let made = |state: MountState, read_only: bool, node: &str| MountView {
        removes_data: removes_data(node),
        populates: populates(node),
        ..mount(state, read_only)
    };
    let mut next = BTreeMap::new();
    for (node, m) in mounts {
        let Some(want) = d.nodes.get(node) else {
            if m.state != MountState::Terminating {
                next.insert(
                    node.clone(),
                    MountView {
                        state: MountState::Terminating,
                        ..m.clone()
                    },
                );
            }
            continue;
        };
        if m.state != MountState::Terminating
            && (m.removes_data != removes_data(node) || m.populates != populates(node))
        {
            next.insert(
                node.clone(),
                MountView {
                    state: MountState::Terminating,
                    ..m.clone()
                },
            );
            continue;
        }
        let now = match m.state {
            // Gone this round; created again next round.
            MountState::Terminating => continue,
            MountState::Starting => made(MountState::Ready, want.read_only, node),
            MountState::Failed(_) | MountState::NotShared(_) => {
                made(MountState::Starting, want.read_only, node)
            }
            MountState::Ready if m.read_only != want.read_only => {
                made(MountState::Starting, want.read_only, node)
            }
            MountState::Ready => m.clone(),
        };
        next.insert(node.clone(), now);
    }
    for (node, want) in &d.nodes {
        if !mounts.contains_key(node) {
            next.insert(
                node.clone(),
                made(MountState::Starting, want.read_only, node),
            );
        }
    }
    next
}

/// Decides and actuates until the world stops changing; returns every round's world
/// and decision, the last one being the fixpoint. Panics if it does not converge.
fn converge(mut world: Input, max_rounds: usize) -> Vec<(Input, Decision)> {
    let mut trace = Vec::new();
    for _ in 0..max_rounds {
        let d = decide(&world);
        let next = actuate(&world.mounts, &d);
        let done = next == world.mounts;
        trace.push((world.clone(), d));
        if done {
            return trace;
        }
        world.mounts = next;
    }
    panic!("no fixpoint within {max_rounds} rounds: {trace:#?}");
}

fn holders(i: &Input) -> BTreeSet<&str> {
    holders_of(&i.mounts)
}

fn holders_of(mounts: &BTreeMap<String, MountView>) -> BTreeSet<&str> {
    mounts
        .iter()
        .filter(|(_, m)| m.state != MountState::Terminating)
        .map(|(n, _)| n.as_str())
        .collect()
}
