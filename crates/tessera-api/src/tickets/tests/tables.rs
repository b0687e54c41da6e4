//! Table tests, one per arbitration rule.

use super::*;

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
fn a_node_that_does_not_share_the_root_is_refused_and_says_so() {
    let i = input(
        RWX,
        vec![
            tk("csi-a", T::CsiAttacher, "node-a"),
            tk("csi-b", T::CsiAttacher, "node-b"),
        ],
        &[
            ("node-a", mount(MountState::Ready, false)),
            (
                "node-b",
                mount(
                    MountState::NotShared("node-b does not see the marker".into()),
                    false,
                ),
            ),
        ],
    );
    let d = decide(&i);
    assert_reason(&d, "csi-a", R::Attached, &["node-a"]);
    assert_reason(
        &d,
        "csi-b",
        R::BackendNotShared,
        &["node-b", "does not share", "marker"],
    );
    assert!(R::BackendNotShared.stalls());
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

/// An idle mount (the `idle-mount` ticket that replaces a workload's CSI ticket when
/// the volume keeps idle mounts): kept while nothing else wants the volume, and
/// until it expires; on a single-node volume it yields to a workload on another node
/// (no waiting for the delay), and to any other background work.
#[test]
fn an_idle_mount_is_kept_until_it_expires_or_something_else_wants_the_volume() {
    let mut idle = tk("idle-a", T::IdleMount, "node-a").at(0);
    idle.ticket.expires_at = Some(time(30));
    // Alone: kept, satisfied by the mount that is there.
    let d = decide(&input(RWO, vec![idle.clone()], &[("node-a", ready())]));
    assert_eq!(nodes(&d), [("node-a", false)]);
    assert_reason(&d, "idle-a", R::Attached, &[]);

    // A workload on another node: interrupted at once, the volume moves.
    let i = input(
        RWO,
        vec![idle.clone(), tk("csi-b", T::CsiAttacher, "node-b").at(5)],
        &[("node-a", ready())],
    );
    let trace = converge(i, 10);
    assert_reason(
        &trace[0].1,
        "idle-a",
        R::Interrupted,
        &["csi-b (csi-attacher)", "node-b"],
    );
    let (_, last) = trace.last().unwrap();
    assert_eq!(nodes(last), [("node-b", false)]);
    assert_reason(last, "csi-b", R::Attached, &[]);

    // Other background work elsewhere goes first too (lowest priority).
    let d = decide(&input(
        RWO,
        vec![idle.clone(), tk("snapshot-b", T::Snapshot, "node-b").at(5)],
        &[],
    ));
    assert_eq!(nodes(&d), [("node-b", false)]);
    assert_reason(&d, "idle-a", R::LowerPriority, &["priority 800 > 700"]);

    // A read-only idle mount stays read-only (the ticket keeps the CSI ticket's
    // parameters), and an RWX volume keeps it beside a workload elsewhere.
    let d = decide(&input(
        RWX,
        vec![
            idle.clone().read_only(),
            tk("csi-b", T::CsiAttacher, "node-b").at(5),
        ],
        &[
            ("node-a", mount(MountState::Ready, true)),
            ("node-b", ready()),
        ],
    ));
    assert_eq!(nodes(&d), [("node-a", true), ("node-b", false)]);

    // Expired: the node is dropped.
    let mut later = input(RWO, vec![idle], &[("node-a", ready())]);
    later.now = time(30);
    let d = decide(&later);
    assert!(d.nodes.is_empty(), "{d:#?}");
    assert_reason(&d, "idle-a", R::Expired, &[]);
}
