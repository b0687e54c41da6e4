//! The Events of an attach or detach, and which status writes may wait for a new
//! attach to finish (written once, not per step).

use super::status::input_requested;
use super::*;

#[test]
fn a_node_event_for_each_started_or_finished_attach_and_finished_detach() {
    use crate::attachment::status::{NodeChange, node_changes};
    let status = |attached: &[&str], mounted: &[&str]| VolumeStatus {
        attached_nodes: attached.iter().map(|n| n.to_string()).collect(),
        mounted_nodes: mounted.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    let a = |n: &str| NodeChange::Attached(n.into());
    let s = |n: &str| NodeChange::Attaching(n.into());
    let d = |n: &str| NodeChange::Detached(n.into());
    let cases = vec![
        (
            "first attach",
            None,
            status(&["n1"], &["n1"]),
            vec![a("n1")],
        ),
        // Written only for an attach slower than ATTACH_QUIET.
        ("mount starting", None, status(&[], &["n1"]), vec![s("n1")]),
        (
            "mount still starting",
            Some(status(&[], &["n1"])),
            status(&[], &["n1"]),
            vec![],
        ),
        (
            "slow attach done",
            Some(status(&[], &["n1"])),
            status(&["n1"], &["n1"]),
            vec![a("n1")],
        ),
        (
            "a second node starts while the first is attached",
            Some(status(&["n1"], &["n1"])),
            status(&["n1"], &["n1", "n2"]),
            vec![s("n2")],
        ),
        (
            "still attached",
            Some(status(&["n1"], &["n1"])),
            status(&["n1"], &["n1"]),
            vec![],
        ),
        (
            "detach started",
            Some(status(&["n1"], &["n1"])),
            status(&[], &["n1"]),
            vec![],
        ),
        (
            "detach finished",
            Some(status(&[], &["n1"])),
            status(&[], &[]),
            vec![d("n1")],
        ),
        (
            "one node joins, another leaves",
            Some(status(&["n1"], &["n1", "n2"])),
            status(&["n2"], &["n2"]),
            vec![a("n2"), d("n1")],
        ),
    ];
    for (what, old, new, want) in cases {
        assert_eq!(node_changes(old.as_ref(), &new), want, "{what}");
    }
}

/// When a status write may wait for a new attach to finish.
#[test]
fn only_a_fresh_attach_lets_the_status_writes_wait() {
    use std::time::Duration;

    use crate::attachment::status::quiet_left;
    let quiet = Duration::from_secs(1);
    let ms = |m: i64| Time(jiff::Timestamp::from_millisecond(m).unwrap());
    let attaching = outcome(false, TicketReason::Attaching, "mounting");
    let attached = outcome(true, TicketReason::Attached, "on n1");
    let held = outcome(false, TicketReason::HeldByOtherNode, "held by a");
    // The old status: ticket "a" attached.
    let mut old_va = va(&[]);
    old_va.status = Some(attachment_status(
        &old_va,
        &decision(&["n1"], &[("a", attached.clone())]),
        &input_requested(&[("a", 0)]),
        &Default::default(),
        &ms(0),
    ));
    let old = old_va.status.as_ref();
    let input = |tickets: &[(&str, i64)]| {
        let mut i = input_requested(&[]);
        i.tickets = tickets
            .iter()
            .map(|(id, at)| tessera_api::tickets::TicketInput {
                ticket: ticket(id, AttacherType::CsiAttacher, "n1"),
                requested_at: Some(ms(*at)),
            })
            .collect();
        i
    };
    // (what, old status, decision, requested at (ms), now (ms), time left)
    let cases = vec![
        (
            "a new ticket attaching, 200 ms old",
            None,
            decision(&["n1"], &[("b", attaching.clone())]),
            vec![("b", 1000)],
            1200,
            Some(800),
        ),
        (
            "the same, past the quiet time",
            None,
            decision(&["n1"], &[("b", attaching.clone())]),
            vec![("b", 1000)],
            2000,
            None,
        ),
        (
            "requested in the future (clock skew): the whole quiet time",
            None,
            decision(&["n1"], &[("b", attaching.clone())]),
            vec![("b", 1500)],
            1000,
            Some(1000),
        ),
        (
            "satisfied at once: written now",
            None,
            decision(&["n1"], &[("b", attached.clone())]),
            vec![("b", 1000)],
            1100,
            None,
        ),
        (
            "refused (held by another node): written now",
            old,
            decision(&["n1"], &[("a", attached.clone()), ("b", held.clone())]),
            vec![("a", 0), ("b", 1000)],
            1100,
            None,
        ),
        (
            "a second ticket attaching beside an unchanged one",
            old,
            decision(
                &["n1"],
                &[("a", attached.clone()), ("b", attaching.clone())],
            ),
            vec![("a", 0), ("b", 1000)],
            1300,
            Some(700),
        ),
        (
            "two attaching: the earlier one's time left",
            None,
            decision(
                &["n1"],
                &[("b", attaching.clone()), ("c", attaching.clone())],
            ),
            vec![("b", 1000), ("c", 1400)],
            1500,
            Some(500),
        ),
        (
            "a ticket removed (its status left): written now",
            old,
            decision(&["n1"], &[("b", attaching.clone())]),
            vec![("b", 1000)],
            1100,
            None,
        ),
        (
            "an attached ticket now waits again (mount lost): written now",
            old,
            decision(&["n1"], &[("a", attaching.clone())]),
            vec![("a", 900)],
            1000,
            None,
        ),
        (
            "nothing changed: nothing to wait for",
            old,
            decision(&["n1"], &[("a", attached.clone())]),
            vec![("a", 0)],
            1000,
            None,
        ),
    ];
    let no_agentless = Default::default();
    for (what, old, d, requested, now, want) in cases {
        let got = quiet_left(old, &d, &input(&requested), &no_agentless, &ms(now), quiet);
        assert_eq!(got, want.map(Duration::from_millis), "{what}");
    }

    // A backlog lengthens the quiet time (pace::attach_quiet), but a ticket
    // waiting on a node without an agent is reported at once, whatever the quiet time.
    let agentless: std::collections::BTreeSet<String> = ["n1".to_string()].into();
    let long = Duration::from_secs(30);
    let fresh = decision(&["n1"], &[("b", attaching.clone())]);
    // (what, quiet, nodes without an agent, now (ms), time left)
    let cases = [
        (
            "a long quiet time: 29.8 s left",
            long,
            &no_agentless,
            1200,
            Some(29_800),
        ),
        (
            "a long quiet time, 20 s in",
            long,
            &no_agentless,
            21_000,
            Some(10_000),
        ),
        ("a long quiet time, over", long, &no_agentless, 31_000, None),
        (
            "no agent on the ticket's node: at once",
            long,
            &agentless,
            1200,
            None,
        ),
        (
            "no agent, the usual quiet time: at once",
            quiet,
            &agentless,
            1200,
            None,
        ),
    ];
    for (what, q, without_agent, now, want) in cases {
        let got = quiet_left(
            None,
            &fresh,
            &input(&[("b", 1000)]),
            without_agent,
            &ms(now),
            q,
        );
        assert_eq!(got, want.map(Duration::from_millis), "{what}");
    }
}

/// A status written for something else leaves out the new attaches still in their
/// quiet time, and the nodes with nothing else to show.
#[test]
fn a_status_written_for_something_else_leaves_out_the_quiet_attaches() {
    use std::time::Duration;

    use crate::attachment::status::{Held, attachment_status_holding, held};
    let quiet = Duration::from_secs(1);
    let ms = |m: i64| Time(jiff::Timestamp::from_millisecond(m).unwrap());
    let on = |id: &str, node: &str, at: i64| tessera_api::tickets::TicketInput {
        ticket: ticket(id, AttacherType::CsiAttacher, node),
        requested_at: Some(ms(at)),
    };
    let attaching = outcome(false, TicketReason::Attaching, "mounting");
    let mut input = input_requested(&[]);
    input.tickets = vec![
        on("a", "n1", 0),
        on("h", "n2", 0),
        on("b", "n2", 1000),
        on("b2", "n5", 1100),
        on("c", "n3", 100),
        on("d", "n4", 1000),
    ];
    // Reported before (at 0): a and h, attaching.
    let mut va = va(&[]);
    va.status = Some(attachment_status(
        &va,
        &decision(
            &["n1", "n2"],
            &[("a", attaching.clone()), ("h", attaching.clone())],
        ),
        &input,
        &Default::default(),
        &ms(0),
    ));
    // Now (1200): a is satisfied, so statuses are written. b (200 ms old) and b2 (100
    // ms old) are in their quiet time; c is past it; d waits on a node without an agent
    // (said at once); h was reported already.
    let now = decision(
        &["n1", "n2", "n3", "n4", "n5"],
        &[
            ("a", outcome(true, TicketReason::Attached, "mounted")),
            ("h", attaching.clone()),
            ("b", attaching.clone()),
            ("b2", attaching.clone()),
            ("c", attaching.clone()),
            ("d", attaching.clone()),
        ],
    );
    let agentless = ["n4".to_string()].into();
    let h = held(
        va.status.as_ref(),
        &now,
        &input,
        &agentless,
        &ms(1200),
        quiet,
    );
    assert_eq!(
        h,
        Held {
            tickets: ["b".to_string(), "b2".to_string()].into(),
            // n2 also has h, which is shown.
            nodes: ["n5".to_string()].into(),
            left: Some(Duration::from_millis(800)),
        }
    );
    let s = attachment_status_holding(&va, &now, &input, &agentless, &ms(1200), &h.tickets);
    assert_eq!(
        s.attachment_ticket_statuses.keys().collect::<Vec<_>>(),
        ["a", "c", "d", "h"]
    );
    assert_eq!(
        (s.ticket_count, s.satisfied_count),
        (6, 1),
        "counts count all"
    );
    // Past the quiet time nothing is held.
    let later = held(
        va.status.as_ref(),
        &now,
        &input,
        &agentless,
        &ms(2200),
        quiet,
    );
    assert_eq!(later, Held::default());
}

/// Which Volume status changes may wait with their VolumeAttachment's.
#[test]
fn only_a_node_starting_to_attach_lets_the_volume_status_wait() {
    use crate::attachment::status::only_attaching;
    let status = |state, attached: &[&str], mounted: &[&str]| VolumeStatus {
        state: Some(state),
        attached_nodes: attached.iter().map(|n| n.to_string()).collect(),
        mounted_nodes: mounted.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    let detached = status(VolumeState::Detached, &[], &[]);
    let on_n1 = status(VolumeState::Attached, &["n1"], &["n1"]);
    let cases = vec![
        (
            "first attach starting",
            Some(detached.clone()),
            status(VolumeState::Attaching, &[], &["n1"]),
            true,
        ),
        (
            "no status yet",
            None,
            status(VolumeState::Attaching, &[], &["n1"]),
            true,
        ),
        (
            "a second node starting",
            Some(on_n1.clone()),
            status(VolumeState::Attaching, &["n1"], &["n1", "n2"]),
            true,
        ),
        ("attached", Some(detached.clone()), on_n1.clone(), false),
        (
            "a node left while another starts",
            Some(on_n1.clone()),
            status(VolumeState::Attaching, &[], &["n2"]),
            false,
        ),
        (
            "failed",
            Some(detached),
            status(VolumeState::Faulted, &[], &["n1"]),
            false,
        ),
    ];
    for (what, old, new, want) in cases {
        assert_eq!(only_attaching(old.as_ref(), &new), want, "{what}");
    }
}
