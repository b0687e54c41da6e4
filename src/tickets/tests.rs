//! Table tests, one per arbitration rule, then property tests over random worlds.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use proptest::sample::select;

use super::*;
use crate::api::{AccessMode, AttacherType as T, AttachmentTicket, TicketReason as R};

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
    let made = |state: MountState, read_only: bool, node: &str| MountView {
        removes_data: removes_data(node),
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
        if m.state != MountState::Terminating && m.removes_data != removes_data(node) {
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
            MountState::Failed(_) => made(MountState::Starting, want.read_only, node),
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

// ---------------------------------------------------------------------------------
// Table tests
// ---------------------------------------------------------------------------------

#[test]
fn rwo_single_ticket_attaches() {
    let mut i = input(RWO, vec![tk("csi-a", T::CsiAttacher, "node-a").at(0)], &[]);
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "csi-a", R::Attaching, &["node-a", "created"]);

    i.mounts.insert("node-a".into(), starting());
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "csi-a", R::Attaching, &["starting"]);

    i.mounts.insert("node-a".into(), ready());
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(
        &d,
        "csi-a",
        R::Attached,
        &["attached to node-a, mount ready"],
    );
    assert_eq!(outcome(&d, "csi-a").generation, 1);
}

#[test]
fn rwo_second_ticket_on_other_node_is_held_naming_the_holder() {
    for mode in [RWO, RWOP] {
        let i = input(
            mode,
            vec![
                tk("csi-abc", T::CsiAttacher, "node-a").at(0),
                tk("csi-def", T::CsiAttacher, "node-b").at(1),
            ],
            &[("node-a", ready())],
        );
        let d = decide(&i);
        assert_eq!(nodes(&d), [("node-a", false)]);
        assert_reason(&d, "csi-abc", R::Attached, &[]);
        assert_reason(
            &d,
            "csi-def",
            R::HeldByOtherNode,
            &[
                &format!(
                    "volume is {mode} and attached to node-a for ticket csi-abc (csi-attacher)"
                ),
                "waits until that ticket is removed",
            ],
        );
    }
}

#[test]
fn rwo_holder_removed_means_detach_then_attach() {
    let mut world = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a").at(0),
            tk("csi-b", T::CsiAttacher, "node-b").at(1),
        ],
        &[("node-a", ready())],
    );
    let d = decide(&world);
    assert_reason(&d, "csi-b", R::HeldByOtherNode, &["node-a", "csi-a"]);

    // The pod on node-a goes away: its ticket is removed.
    world.tickets.retain(|t| t.ticket.id != "csi-a");
    let trace = converge(world, 10);
    let steps: Vec<(Vec<&str>, Vec<&str>, R)> = trace
        .iter()
        .map(|(w, d)| {
            (
                w.mounts.keys().map(String::as_str).collect(),
                d.nodes.keys().map(String::as_str).collect(),
                outcome(d, "csi-b").reason,
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            (vec!["node-a"], vec![], R::WaitingForDetach), // node-a to be removed
            (vec!["node-a"], vec![], R::WaitingForDetach), // node-a terminating
            (vec![], vec!["node-b"], R::Attaching),        // detached: attach
            (vec!["node-b"], vec!["node-b"], R::Attaching),
            (vec!["node-b"], vec!["node-b"], R::Attached),
        ]
    );
    assert_reason(
        &trace[0].1,
        "csi-b",
        R::WaitingForDetach,
        &["node-a (MountPod to be removed)", "node-b"],
    );
    assert_reason(
        &trace[1].1,
        "csi-b",
        R::WaitingForDetach,
        &["node-a (MountPod being removed)"],
    );
    // Never two mounts at once.
    assert!(trace.iter().all(|(w, _)| w.mounts.len() <= 1));
}

#[test]
fn rwo_manual_does_not_preempt_csi_on_another_node() {
    let i = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a").at(5),
            tk("manual-b", T::Manual, "node-b").at(0),
        ],
        &[("node-a", ready())],
    );
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "csi-a", R::Attached, &[]);
    assert_reason(
        &d,
        "manual-b",
        R::HeldByOtherNode,
        &["node-a", "csi-a (csi-attacher)"],
    );
    // Restore (2000) does not preempt either.
    let mut i = i;
    i.tickets.push(tk("restore-c", T::VolumeRestore, "node-c"));
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "restore-c", R::HeldByOtherNode, &["csi-a"]);
}

#[test]
fn rwo_free_race_is_won_by_priority_and_losers_say_why() {
    let i = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a").at(0),
            tk("manual-b", T::Manual, "node-b").at(5),
        ],
        &[],
    );
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-b", false)]);
    assert_reason(&d, "manual-b", R::Attaching, &[]);
    assert_reason(
        &d,
        "csi-a",
        R::LowerPriority,
        &["manual-b (manual)", "node-b", "priority 1000 > 900"],
    );
}

#[test]
fn rwo_background_is_interrupted_by_a_workload_on_another_node() {
    let i = input(
        RWO,
        vec![
            tk("snapshot-s1", T::Snapshot, "node-a").at(0),
            tk("csi-b", T::CsiAttacher, "node-b").at(9),
        ],
        &[("node-a", ready())],
    );
    let trace = converge(i, 10);
    let (_, first) = &trace[0];
    assert!(first.nodes.is_empty());
    assert_reason(
        first,
        "snapshot-s1",
        R::Interrupted,
        &["csi-b (csi-attacher)", "node-b"],
    );
    assert_reason(first, "csi-b", R::WaitingForDetach, &["node-a"]);
    // Still interrupted while node-a detaches.
    assert_reason(&trace[1].1, "snapshot-s1", R::Interrupted, &["csi-b"]);
    let (_, last) = trace.last().unwrap();
    assert_eq!(nodes(last), [("node-b", false)]);
    assert_reason(last, "csi-b", R::Attached, &[]);
    assert_reason(
        last,
        "snapshot-s1",
        R::HeldByOtherNode,
        &["node-b", "csi-b"],
    );
}

#[test]
fn rwo_background_is_not_interrupted_by_background() {
    let i = input(
        RWO,
        vec![
            tk("backup-1", T::Backup, "node-a").at(5),
            tk("cleanup-1", T::Cleanup, "node-b").at(0),
        ],
        &[("node-a", ready())],
    );
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "backup-1", R::Attached, &[]);
    assert_reason(
        &d,
        "cleanup-1",
        R::HeldByOtherNode,
        &["backup-1 (backup)", "node-a"],
    );
}

#[test]
fn rwo_background_shares_the_node_of_a_workload() {
    let i = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("snapshot-1", T::Snapshot, "node-a"),
            tk("csi-b", T::CsiAttacher, "node-b"),
        ],
        &[("node-a", ready())],
    );
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "csi-a", R::Attached, &[]);
    assert_reason(&d, "snapshot-1", R::Attached, &[]);
    assert_reason(&d, "csi-b", R::HeldByOtherNode, &["csi-a"]);
}

#[test]
fn rwo_holder_without_tickets_is_dropped_and_the_winner_waits() {
    let i = input(
        RWO,
        vec![tk("csi-b", T::CsiAttacher, "node-b")],
        &[("node-a", ready())],
    );
    let d = decide(&i);
    assert!(d.nodes.is_empty());
    assert_reason(&d, "csi-b", R::WaitingForDetach, &["node-a", "node-b"]);
    // No tickets at all: detach everything.
    let d = decide(&input(RWO, vec![], &[("node-a", ready())]));
    assert_eq!(d, Decision::default());
}

#[test]
fn rwx_attaches_on_three_nodes() {
    let i = input(
        RWX,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("csi-b", T::CsiAttacher, "node-b").read_only(),
            tk("manual-c", T::Manual, "node-c"),
            tk("backup-c", T::Backup, "node-c").read_only(),
        ],
        &[],
    );
    let trace = converge(i, 10);
    let (_, last) = trace.last().unwrap();
    assert_eq!(
        nodes(last),
        [("node-a", false), ("node-b", true), ("node-c", false)]
    );
    assert!(last.tickets.values().all(|o| o.satisfied), "{last:#?}");
}

#[test]
fn rwx_node_with_terminating_mount_stays_chosen_and_waits() {
    let i = input(
        RWX,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("csi-b", T::CsiAttacher, "node-b"),
        ],
        &[("node-a", terminating()), ("node-b", ready())],
    );
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false), ("node-b", false)]);
    assert_reason(
        &d,
        "csi-a",
        R::WaitingForDetach,
        &["previous mount on node-a is still being removed"],
    );
    assert_reason(&d, "csi-b", R::Attached, &[]);
}

#[test]
fn rox_is_read_only_everywhere() {
    let i = input(
        ROX,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("csi-b", T::CsiAttacher, "node-b").param("readOnly", "false"),
        ],
        &[
            ("node-a", mount(MountState::Ready, true)),
            ("node-b", ready()),
        ],
    );
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", true), ("node-b", true)]);
    assert_reason(&d, "csi-a", R::Attached, &["read-only"]);
    // A writable mount of a ReadOnlyMany volume is not proof: it must be remounted.
    assert_reason(
        &d,
        "csi-b",
        R::GenerationPending,
        &["read-write", "remounted read-only"],
    );
}

#[test]
fn pinned_volume_is_never_attached_elsewhere() {
    let mut i = input(
        RWX,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("manual-b", T::Manual, "node-b"),
        ],
        &[],
    );
    i.pinned_node = Some("node-a".into());
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(
        &d,
        "manual-b",
        R::NodeLocalElsewhere,
        &["node-local to node-a", "node-b"],
    );

    // RWO: the higher-priority ticket elsewhere does not win the race.
    i.access_mode = RWO;
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "csi-a", R::Attaching, &[]);
    assert_reason(&d, "manual-b", R::NodeLocalElsewhere, &["node-a"]);
}

#[test]
fn deleting_serves_cleanup_and_keeps_an_attached_workload() {
    let mut i = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("snapshot-a", T::Snapshot, "node-a"),
            tk("manual-b", T::Manual, "node-b"),
            tk("cleanup-c", T::Cleanup, "node-c"),
        ],
        &[("node-a", ready())],
    );
    i.deleting = true;
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "csi-a", R::Attached, &[]);
    assert_reason(&d, "snapshot-a", R::VolumeDeleting, &["snapshot"]);
    assert_reason(
        &d,
        "manual-b",
        R::VolumeDeleting,
        &["no new attachment to node-b"],
    );
    assert_reason(&d, "cleanup-c", R::HeldByOtherNode, &["csi-a", "node-a"]);

    // The workload leaves: cleanup runs, after node-a has detached.
    i.tickets.retain(|t| t.ticket.id != "csi-a");
    let trace = converge(i, 10);
    let (w, last) = trace.last().unwrap();
    assert_eq!(nodes(last), [("node-c", false)]);
    assert_eq!(w.mounts.keys().collect::<Vec<_>>(), ["node-c"]);
    assert_reason(last, "cleanup-c", R::Attached, &[]);
    assert_reason(last, "manual-b", R::VolumeDeleting, &[]);
}

#[test]
fn cleanup_is_satisfied_only_by_a_mount_that_removed_the_data() {
    let removing = MountView {
        removes_data: true,
        ..ready()
    };
    // Deleted while attached: the node serves the workload; the cleanup ticket on the
    // same node waits for it, and is not satisfied by the serving mount.
    let mut i = input(
        RWO,
        vec![
            tk("manual-a", T::Manual, "node-a"),
            tk("cleanup-data", T::Cleanup, "node-a"),
        ],
        &[("node-a", ready())],
    );
    i.deleting = true;
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "manual-a", R::Attached, &[]);
    assert_reason(
        &d,
        "cleanup-data",
        R::InUse,
        &["node-a", "manual-a (manual)"],
    );

    // A workload ticket is not satisfied by a mount that removes the data.
    let i = input(
        RWO,
        vec![tk("manual-a", T::Manual, "node-a")],
        &[("node-a", removing.clone())],
    );
    assert_reason(&decide(&i), "manual-a", R::GenerationPending, &["removes"]);

    // The workload leaves: the serving mount is replaced by one that removes the data,
    // and only that one satisfies the cleanup ticket.
    let mut i = input(
        RWO,
        vec![tk("cleanup-data", T::Cleanup, "node-a")],
        &[("node-a", ready())],
    );
    i.deleting = true;
    assert_reason(
        &decide(&i),
        "cleanup-data",
        R::GenerationPending,
        &["node-a", "replaced"],
    );
    let trace = converge(i.clone(), 10);
    let (w, last) = trace.last().unwrap();
    assert_eq!(w.mounts["node-a"], removing);
    assert_reason(last, "cleanup-data", R::Attached, &[]);

    // Its node is gone: the message says how to give the data up.
    i.missing_nodes.insert("node-a".into());
    i.mounts.clear();
    assert_reason(
        &decide(&i),
        "cleanup-data",
        R::NodeNotFound,
        &["node-a", "tessera.io/abandon-data=true"],
    );
}

#[test]
fn data_is_removed_only_where_every_chosen_ticket_is_cleanup() {
    let expired = |mut t: TicketInput| {
        t.ticket.expires_at = Some(time(-1));
        t
    };
    let cases: Vec<(&str, Vec<TicketInput>, Option<bool>)> = vec![
        (
            "only cleanup",
            vec![tk("cleanup-data", T::Cleanup, "node-a")],
            Some(true),
        ),
        (
            "cleanup and a workload",
            vec![
                tk("cleanup-data", T::Cleanup, "node-a"),
                tk("csi-1", T::CsiAttacher, "node-a"),
            ],
            Some(false),
        ),
        (
            "cleanup and an expired workload ticket (not honoured)",
            vec![
                tk("cleanup-data", T::Cleanup, "node-a"),
                expired(tk("manual-1", T::Manual, "node-a")),
            ],
            Some(true),
        ),
        (
            "another background ticket",
            vec![tk("backup-1", T::Backup, "node-a")],
            Some(false),
        ),
    ];
    for (what, tickets, removes) in cases {
        let d = decide(&input(RWO, tickets, &[]));
        assert_eq!(
            d.nodes.get("node-a").map(|n| n.removes_data),
            removes,
            "{what}"
        );
    }
}

#[test]
fn failed_mount_reports_its_error() {
    let i = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("csi-b", T::CsiAttacher, "node-b"),
        ],
        &[(
            "node-a",
            mount(
                MountState::Failed("ENOTCONN: transport endpoint".into()),
                false,
            ),
        )],
    );
    let d = decide(&i);
    // A failed mount still holds the volume: its workload is not displaced.
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(
        &d,
        "csi-a",
        R::MountFailed,
        &["node-a", "ENOTCONN: transport endpoint"],
    );
    assert_reason(&d, "csi-b", R::HeldByOtherNode, &["csi-a"]);
}

#[test]
fn terminating_mount_blocks_attach_elsewhere_and_on_its_own_node() {
    let tickets = vec![tk("csi-b", T::CsiAttacher, "node-b")];
    let d = decide(&input(RWO, tickets.clone(), &[("node-a", terminating())]));
    assert!(d.nodes.is_empty());
    assert_reason(
        &d,
        "csi-b",
        R::WaitingForDetach,
        &["node-a (MountPod being removed)", "node-b"],
    );

    let d = decide(&input(RWO, tickets, &[("node-b", terminating())]));
    assert!(d.nodes.is_empty());
    assert_reason(
        &d,
        "csi-b",
        R::WaitingForDetach,
        &["node-b (previous MountPod being removed)"],
    );
}

#[test]
fn read_only_change_is_not_satisfied_until_the_mount_matches() {
    // node-a is mounted read-only for a read-only ticket; the ticket now asks for
    // read-write (new generation).
    let world = input(
        RWO,
        vec![tk("manual-a", T::Manual, "node-a").generation(2)],
        &[("node-a", mount(MountState::Ready, true))],
    );
    let trace = converge(world, 10);
    let (_, first) = &trace[0];
    assert_eq!(nodes(first), [("node-a", false)]);
    assert_reason(
        first,
        "manual-a",
        R::GenerationPending,
        &["read-only", "remounted read-write"],
    );
    assert_eq!(outcome(first, "manual-a").generation, 2);
    assert_reason(&trace[1].1, "manual-a", R::Attaching, &[]);
    let (w, last) = trace.last().unwrap();
    assert_eq!(w.mounts["node-a"], mount(MountState::Ready, false));
    assert_reason(last, "manual-a", R::Attached, &["read-write"]);

    // A read-only ticket is served by a read-write mount.
    let d = decide(&input(
        RWX,
        vec![tk("csi-a", T::CsiAttacher, "node-a").read_only()],
        &[("node-a", ready())],
    ));
    assert_eq!(nodes(&d), [("node-a", true)]);
    assert_reason(&d, "csi-a", R::Attached, &[]);
}

#[test]
fn ties_are_broken_by_requested_at_then_id() {
    // Same priority: earlier wins, whatever the ids.
    let d = decide(&input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a").at(5),
            tk("csi-z", T::CsiAttacher, "node-z").at(1),
        ],
        &[],
    ));
    assert_eq!(nodes(&d), [("node-z", false)]);
    assert_reason(
        &d,
        "csi-a",
        R::LowerPriority,
        &["csi-z", "requested earlier"],
    );

    // Unknown request time sorts last.
    let d = decide(&input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("csi-z", T::CsiAttacher, "node-z").at(9),
        ],
        &[],
    ));
    assert_eq!(nodes(&d), [("node-z", false)]);

    // Same time: smaller id.
    let d = decide(&input(
        RWO,
        vec![
            tk("csi-b", T::CsiAttacher, "node-b").at(1),
            tk("csi-a", T::CsiAttacher, "node-a").at(1),
        ],
        &[],
    ));
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "csi-b", R::LowerPriority, &["csi-a", "smaller id"]);
}

#[test]
fn two_holders_after_a_crash_keep_one() {
    let i = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a").at(2),
            tk("csi-b", T::CsiAttacher, "node-b").at(1),
            tk("backup-c", T::Backup, "node-c").at(0),
        ],
        &[
            ("node-a", ready()),
            ("node-b", starting()),
            ("node-c", ready()),
        ],
    );
    let d = decide(&i);
    assert_eq!(nodes(&d), [("node-b", false)]);
    assert_reason(&d, "csi-b", R::Attaching, &[]);
    assert_reason(&d, "csi-a", R::HeldByOtherNode, &["csi-b", "node-b"]);
    assert_reason(&d, "backup-c", R::HeldByOtherNode, &["csi-b"]);
    let trace = converge(i, 10);
    let (w, last) = trace.last().unwrap();
    assert_eq!(w.mounts.keys().collect::<Vec<_>>(), ["node-b"]);
    assert_reason(last, "csi-b", R::Attached, &[]);
}

#[test]
fn invalid_parameters_are_never_chosen() {
    let d = decide(&input(
        RWO,
        vec![
            tk("manual-a", T::Manual, "node-a").param("readOnly", "yes"),
            tk("csi-b", T::CsiAttacher, "node-b"),
        ],
        &[],
    ));
    assert_eq!(nodes(&d), [("node-b", false)]);
    assert_reason(&d, "manual-a", R::InvalidParameters, &["\"yes\""]);
}

#[test]
fn duplicate_ids_do_not_make_the_order_matter() {
    let a = tk("dup", T::CsiAttacher, "node-a").at(1);
    let b = tk("dup", T::CsiAttacher, "node-b").at(1);
    let one = decide(&input(RWO, vec![a.clone(), b.clone()], &[]));
    let two = decide(&input(RWO, vec![b, a], &[]));
    assert_eq!(one, two);
    assert_eq!(one.tickets.len(), 1);
}

#[test]
fn decide_is_deterministic() {
    let i = input(
        RWO,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("snapshot-b", T::Snapshot, "node-b"),
        ],
        &[("node-b", ready())],
    );
    assert_eq!(decide(&i), decide(&i));
}

// ---------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
const CASES: u32 = 4096;
/// The time of every random decision (seconds after [`time`]'s epoch).
const NOW: i64 = 2;

fn arb_state() -> impl Strategy<Value = MountState> {
    prop_oneof![
        Just(MountState::Starting),
        Just(MountState::Ready),
        Just(MountState::Failed("mount failed: boom".into())),
        Just(MountState::Terminating),
    ]
}

fn arb_read_only_param() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![
        4 => Just(None),
        3 => Just(Some("true")),
        3 => Just(Some("false")),
        1 => Just(Some("yes")),
    ]
}

fn arb_ticket() -> impl Strategy<Value = TicketInput> {
    (
        // Random ids, so that id order is unrelated to anything else; duplicates are
        // removed in `arb_tickets`.
        "[a-h]",
        select(AttacherType::ALL.to_vec()),
        select(NODES.to_vec()),
        proptest::option::of(0i64..4),
        arb_read_only_param(),
        0i64..3,
        // Expiry before, at and after the decision's time, mostly none.
        proptest::option::weighted(0.3, NOW - 2..NOW + 3),
    )
        .prop_map(|(id, type_, node, at, ro, generation, expires)| {
            let mut t = tk(&format!("{}-{id}", type_.as_str()), type_, node).generation(generation);
            t.requested_at = at.map(time);
            t.ticket.expires_at = expires.map(time);
            match ro {
                Some(v) => t.param("readOnly", v),
                None => t,
            }
        })
}

fn arb_tickets() -> impl Strategy<Value = Vec<TicketInput>> {
    proptest::collection::vec(arb_ticket(), 0..=8).prop_map(|mut v| {
        let mut seen = BTreeSet::new();
        v.retain(|t| seen.insert(t.ticket.id.clone()));
        v
    })
}

fn arb_mounts() -> impl Strategy<Value = BTreeMap<String, MountView>> {
    proptest::collection::vec(
        proptest::option::of((arb_state(), any::<bool>(), proptest::bool::weighted(0.2))),
        NODES.len(),
    )
    .prop_map(|v| {
        NODES
            .iter()
            .zip(v)
            .filter_map(|(n, m)| {
                m.map(|(state, read_only, removes_data)| {
                    let m = MountView {
                        removes_data,
                        ..mount(state, read_only)
                    };
                    (n.to_string(), m)
                })
            })
            .collect()
    })
}

fn arb_input() -> impl Strategy<Value = Input> {
    (
        select(vec![RWO, RWOP, ROX, RWX]),
        proptest::bool::weighted(0.25),
        proptest::option::weighted(0.2, select(NODES.to_vec())),
        arb_tickets(),
        arb_mounts(),
        proptest::option::weighted(0.2, select(NODES.to_vec())),
    )
        .prop_map(
            |(access_mode, deleting, pinned, tickets, mounts, missing)| Input {
                access_mode,
                deleting,
                pinned_node: pinned.map(str::to_string),
                tickets,
                mounts,
                now: time(NOW),
                missing_nodes: missing.map(str::to_string).into_iter().collect(),
            },
        )
}

/// The spec of eligibility, restated independently of the implementation.
fn eligible(i: &Input, t: &TicketInput) -> bool {
    let ticket = &t.ticket;
    let current = ticket.expires_at.as_ref().is_none_or(|e| e.0 > i.now.0)
        && !i.missing_nodes.contains(&ticket.node_id);
    let valid = matches!(
        ticket.parameters.get("readOnly").map(String::as_str),
        None | Some("true" | "false")
    );
    let on_pinned = i.pinned_node.as_ref().is_none_or(|p| *p == ticket.node_id);
    let not_deleting = !i.deleting
        || ticket.type_ == T::Cleanup
        || (!is_background(ticket.type_)
            && holders(i).contains(ticket.node_id.as_str())
            && !i.mounts[&ticket.node_id].removes_data);
    current && valid && on_pinned && not_deleting
}

/// The order of the rules, restated independently of [`ticket_order`]: priority
/// descending, then `requested_at` ascending with unknown last, then id.
fn spec_order(a: &TicketInput, b: &TicketInput) -> std::cmp::Ordering {
    let prio = priority(b.ticket.type_).cmp(&priority(a.ticket.type_));
    let at = match (&a.requested_at, &b.requested_at) {
        (Some(x), Some(y)) => x.0.cmp(&y.0),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    };
    prio.then(at).then_with(|| a.ticket.id.cmp(&b.ticket.id))
}

/// Properties of one decision (1, 3, 4 and 6 of the brief).
fn check_decision(i: &Input, d: &Decision) -> Result<(), TestCaseError> {
    let held = holders(i);

    // 4: every ticket has an outcome; messages; satisfied ⇔ Attached; generation.
    let ids: BTreeSet<&str> = i.tickets.iter().map(|t| t.ticket.id.as_str()).collect();
    prop_assert_eq!(
        d.tickets
            .keys()
            .map(String::as_str)
            .collect::<BTreeSet<_>>(),
        ids
    );
    for t in &i.tickets {
        let o = &d.tickets[&t.ticket.id];
        prop_assert!(!o.message.is_empty());
        prop_assert_eq!(o.satisfied, o.reason == R::Attached, "{:?}", o);
        prop_assert_eq!(o.generation, t.ticket.generation);
        if o.satisfied {
            // Satisfied means proven: chosen, Ready, compatible.
            let node = &t.ticket.node_id;
            let m = i.mounts.get(node);
            prop_assert!(d.nodes.contains_key(node));
            prop_assert_eq!(m.map(|m| &m.state), Some(&MountState::Ready));
            let m = m.unwrap();
            let ticket_ro = t.ticket.parameters.get("readOnly").map(String::as_str) == Some("true");
            match i.access_mode {
                ROX => prop_assert!(m.read_only),
                _ => prop_assert!(ticket_ro || !m.read_only),
            }
        }
        if !eligible(i, t) {
            prop_assert!(
                matches!(
                    o.reason,
                    R::Expired
                        | R::NodeNotFound
                        | R::InvalidParameters
                        | R::NodeLocalElsewhere
                        | R::VolumeDeleting
                ),
                "{:?}",
                o
            );
        }
    }

    // Every chosen node is wanted by an eligible ticket, with the right mode.
    for (node, nm) in &d.nodes {
        let on_node: Vec<&TicketInput> = i
            .tickets
            .iter()
            .filter(|t| t.ticket.node_id == *node && eligible(i, t))
            .collect();
        prop_assert!(
            !on_node.is_empty(),
            "{} chosen without an eligible ticket",
            node
        );
        let all_ro = on_node
            .iter()
            .all(|t| t.ticket.parameters.get("readOnly").map(String::as_str) == Some("true"));
        prop_assert_eq!(nm.read_only, i.access_mode == ROX || all_ro);
    }

    if i.access_mode.is_multi_node() {
        // Every eligible ticket's node is chosen.
        for t in i.tickets.iter().filter(|t| eligible(i, t)) {
            prop_assert!(d.nodes.contains_key(&t.ticket.node_id));
        }
    } else {
        // 1: one node at most, and never a new one while any MountPod exists.
        prop_assert!(d.nodes.len() <= 1);
        if let Some(node) = d.nodes.keys().next() {
            prop_assert!(
                held.contains(node.as_str()) || i.mounts.is_empty(),
                "attached {} beside {:?}",
                node,
                i.mounts
            );
        }
        // 3: no preemption. The holder of the first eligible workload ticket on any
        // holder stays (there is only one such holder unless the world is inconsistent).
        let mut by_order: Vec<&TicketInput> = i.tickets.iter().collect();
        by_order.sort_by(|a, b| spec_order(a, b));
        let first_held_workload = by_order.iter().find(|t| {
            !is_background(t.ticket.type_)
                && held.contains(t.ticket.node_id.as_str())
                && eligible(i, t)
        });
        if let Some(w) = first_held_workload {
            prop_assert_eq!(d.nodes.keys().collect::<Vec<_>>(), [&w.ticket.node_id]);
        }
        // Background holders yield only to a workload.
        let any_workload = i
            .tickets
            .iter()
            .any(|t| !is_background(t.ticket.type_) && eligible(i, t));
        if !any_workload && d.nodes.is_empty() {
            prop_assert!(
                !i.tickets
                    .iter()
                    .any(|t| eligible(i, t) && held.contains(t.ticket.node_id.as_str()))
            );
        }
        // On a free volume the first eligible ticket in order wins.
        if i.mounts.is_empty() {
            let first = by_order.iter().find(|t| eligible(i, t));
            prop_assert_eq!(d.nodes.keys().next(), first.map(|t| &t.ticket.node_id));
        }
        // ... and do yield: with a workload waiting and none held, no holder is kept.
        if any_workload && first_held_workload.is_none() {
            prop_assert!(
                d.nodes.keys().all(|n| !held.contains(n.as_str())),
                "{:?} kept",
                d.nodes
            );
        }
        for o in d.tickets.values() {
            if o.reason == R::Interrupted {
                prop_assert!(any_workload);
            }
        }
    }

    // 6: pinned and deleting.
    if let Some(p) = &i.pinned_node {
        prop_assert!(d.nodes.keys().all(|n| n == p));
    }
    if i.deleting {
        // Each chosen node has an eligible cleanup ticket, or held the volume for an
        // eligible workload ticket: deleting starts no attachment for anything else.
        for node in d.nodes.keys() {
            let cleanup = i.tickets.iter().any(|t| {
                t.ticket.node_id == *node && t.ticket.type_ == T::Cleanup && eligible(i, t)
            });
            let kept = held.contains(node.as_str())
                && i.tickets.iter().any(|t| {
                    t.ticket.node_id == *node && !is_background(t.ticket.type_) && eligible(i, t)
                });
            prop_assert!(cleanup || kept, "{} chosen while deleting", node);
        }
        for t in &i.tickets {
            if is_background(t.ticket.type_) && t.ticket.type_ != T::Cleanup {
                prop_assert!(!d.tickets[&t.ticket.id].satisfied);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Properties 1, 3, 4 and 6 on random worlds.
    #[test]
    fn prop_decision_rules(i in arb_input()) {
        let d = decide(&i);
        check_decision(&i, &d)?;
    }

    /// Property 2 and determinism: shuffling (or reversing) the tickets changes nothing.
    #[test]
    fn prop_order_does_not_matter(
        (i, shuffled) in arb_input().prop_flat_map(|i| {
            let tickets = i.tickets.clone();
            (Just(i), Just(tickets).prop_shuffle())
        })
    ) {
        let d = decide(&i);
        prop_assert_eq!(&d, &decide(&i));
        let mut other = i.clone();
        other.tickets = shuffled;
        prop_assert_eq!(&d, &decide(&other));
        other.tickets.reverse();
        prop_assert_eq!(&d, &decide(&other));
    }

    /// Property 5: following the decisions converges to a fixpoint where the decision
    /// is stable and every eligible ticket on a chosen node is satisfied.
    #[test]
    fn prop_converges(i in arb_input()) {
        let single = !i.access_mode.is_multi_node();
        let initially_consistent = holders(&i).len() <= 1;
        let trace = converge(i, 8);
        for (k, (w, d)) in trace.iter().enumerate() {
            check_decision(w, d)?;
            if single && initially_consistent {
                // Never two writers, in any round.
                prop_assert!(holders(w).len() <= 1, "round {}: {:?}", k, w.mounts);
            }
            if k > 0 {
                // A MountPod appears only where the previous decision asked for one.
                let (prev, prev_d) = &trace[k - 1];
                for node in w.mounts.keys() {
                    prop_assert!(prev.mounts.contains_key(node) || prev_d.nodes.contains_key(node));
                }
            }
        }
        let (w, d) = trace.last().unwrap();
        // Stable: the world matches the decision, and deciding again changes nothing.
        prop_assert_eq!(&actuate(&w.mounts, d), &w.mounts);
        prop_assert_eq!(&decide(w), d);
        prop_assert_eq!(w.mounts.keys().collect::<Vec<_>>(), d.nodes.keys().collect::<Vec<_>>());
        for (node, m) in &w.mounts {
            prop_assert_eq!(&m.state, &MountState::Ready);
            prop_assert_eq!(m.read_only, d.nodes[node].read_only);
        }
        for t in &w.tickets {
            // A cleanup ticket on a node that serves other tickets waits for them.
            let in_use = t.ticket.type_ == T::Cleanup
                && d.nodes.get(&t.ticket.node_id).is_some_and(|n| !n.removes_data);
            if eligible(w, t) && d.nodes.contains_key(&t.ticket.node_id) {
                if in_use {
                    prop_assert_eq!(d.tickets[&t.ticket.id].reason, R::InUse);
                } else {
                    prop_assert!(d.tickets[&t.ticket.id].satisfied, "{:?}", d.tickets[&t.ticket.id]);
                }
            }
        }
        // Liveness: an eligible ticket means the volume is attached somewhere.
        if w.tickets.iter().any(|t| eligible(w, t)) {
            prop_assert!(!d.nodes.is_empty());
        }
        if single {
            // Everything eligible elsewhere waits for the holder.
            let waiting = w
                .tickets
                .iter()
                .filter(|t| eligible(w, t) && !d.nodes.contains_key(&t.ticket.node_id));
            for t in waiting {
                prop_assert_eq!(d.tickets[&t.ticket.id].reason, R::HeldByOtherNode);
            }
        }
    }

    /// Tickets come and go between rounds: a single-node volume never has two holders,
    /// and a holder with a workload ticket that stays is never detached.
    #[test]
    fn prop_tickets_come_and_go(
        mode in select(vec![RWO, RWOP]),
        ops in proptest::collection::vec(
            prop_oneof![2 => arb_ticket().prop_map(Some), 1 => Just(None)],
            0..24,
        ),
        removals in proptest::collection::vec(any::<prop::sample::Index>(), 24),
    ) {
        let mut world = input(mode, vec![], &[]);
        for (k, op) in ops.into_iter().enumerate() {
            match op {
                Some(t) => {
                    world.tickets.retain(|x| x.ticket.id != t.ticket.id);
                    world.tickets.push(t);
                }
                None if !world.tickets.is_empty() => {
                    let at = removals[k].index(world.tickets.len());
                    world.tickets.remove(at);
                }
                None => {}
            }
            let d = decide(&world);
            check_decision(&world, &d)?;
            let next = actuate(&world.mounts, &d);
            // A holder with an eligible workload ticket keeps its mount.
            for node in holders(&world) {
                let workload = world.tickets.iter().any(|t| {
                    t.ticket.node_id == node
                        && !is_background(t.ticket.type_)
                        && eligible(&world, t)
                });
                // (A mount that removed the data is replaced by a serving one.)
                if workload && !world.mounts[node].removes_data {
                    prop_assert!(holders_of(&next).contains(node));
                }
            }
            world.mounts = next;
            prop_assert!(holders(&world).len() <= 1, "{:?}", world.mounts);
        }
    }
}

// ---------------------------------------------------------------------------------
// Issue 13: expired tickets
// ---------------------------------------------------------------------------------

/// A ticket past its `expiresAt` is never honoured, from the first decision: not
/// chosen on a free volume, and not kept on a node that holds the volume for it.
#[test]
fn an_expired_ticket_is_never_honoured() {
    let mut expired = tk("manual-old", T::Manual, "n1");
    expired.ticket.expires_at = Some(time(-1));
    let free = input(RWO, vec![expired.clone()], &[]);
    let d = decide(&free);
    assert!(d.nodes.is_empty(), "an expired ticket attached: {d:#?}");
    assert_reason(
        &d,
        "manual-old",
        R::Expired,
        &["expired at", "no longer honoured"],
    );

    // Expiring exactly now is expired; a second later is not.
    let mut at_now = tk("manual-now", T::Manual, "n1");
    at_now.ticket.expires_at = Some(time(0));
    let mut later = tk("manual-later", T::Manual, "n2");
    later.ticket.expires_at = Some(time(1));
    let d = decide(&input(RWX, vec![at_now, later], &[("n2", ready())]));
    assert_reason(&d, "manual-now", R::Expired, &[]);
    assert_reason(&d, "manual-later", R::Attached, &[]);
    assert_eq!(nodes(&d), [("n2", false)]);

    // On the node that holds the volume for it: dropped, and a waiting ticket elsewhere
    // follows once the mount is gone. Even a workload ticket of a volume being deleted
    // does not keep its node once expired.
    let waiting = tk("csi-b", T::CsiAttacher, "n2");
    let held = input(
        RWO,
        vec![expired.clone(), waiting.clone()],
        &[("n1", ready())],
    );
    let d = decide(&held);
    assert!(d.nodes.is_empty(), "{d:#?}");
    assert_reason(&d, "manual-old", R::Expired, &[]);
    assert_reason(&d, "csi-b", R::WaitingForDetach, &["n1"]);
    let mut deleting = input(RWO, vec![expired], &[("n1", ready())]);
    deleting.deleting = true;
    let d = decide(&deleting);
    assert!(d.nodes.is_empty(), "{d:#?}");
    assert_reason(&d, "manual-old", R::Expired, &[]);
}

/// A ticket whose node does not exist is never honoured, whoever wrote it, and the
/// message does not claim the node ever existed.
#[test]
fn a_ticket_for_a_missing_node_is_not_honoured() {
    let mut i = input(
        RWO,
        vec![
            tk("manual-ghost", T::Manual, "ghost"),
            tk("csi-b", T::CsiAttacher, "n2"),
        ],
        &[("ghost", ready())],
    );
    i.missing_nodes = ["ghost".to_string()].into();
    let d = decide(&i);
    assert_reason(
        &d,
        "manual-ghost",
        R::NodeNotFound,
        &["node ghost does not exist"],
    );
    assert!(!outcome(&d, "manual-ghost").message.contains("no longer"));
    // It held the volume: the mount there is dropped, the other ticket waits for it.
    assert!(d.nodes.is_empty(), "{d:#?}");
    assert_reason(&d, "csi-b", R::WaitingForDetach, &["ghost"]);
    i.mounts.clear();
    let d = decide(&i);
    assert_eq!(nodes(&d), [("n2", false)]);
}

#[test]
fn the_next_expiry_is_the_earliest_one_still_ahead() {
    let with = |offsets: &[Option<i64>]| {
        let tickets = offsets
            .iter()
            .enumerate()
            .map(|(k, o)| {
                let mut t = tk(&format!("t{k}"), T::Manual, "n1");
                t.ticket.expires_at = o.map(time);
                t
            })
            .collect();
        input(RWX, tickets, &[])
    };
    let cases: [(&[Option<i64>], Option<i64>); 5] = [
        (&[], None),
        (&[None], None),
        (&[Some(-5), Some(0)], None),
        (&[Some(9), None, Some(-1), Some(3)], Some(3)),
        (&[Some(0), Some(1)], Some(1)),
    ];
    for (offsets, want) in cases {
        let i = with(offsets);
        assert_eq!(next_expiry(&i), want.map(time).as_ref(), "{offsets:?}");
    }
}
