//! kstatus's abnormal-true conditions (`Reconciling`, `Stalled`) on the Volume and the
//! VolumeAttachment: which one each state calls for, never both, absent once settled,
//! and stable while nothing changes (no status write).

use super::status::{input_requested, ready_on, starting_on};
use super::*;
use crate::attachment::status::missing_volume_status;

/// The abnormal-true conditions of `conditions` as (type, reason), checking that each
/// says True and carries `generation`.
fn abnormal(conditions: &[Condition], generation: i64) -> Vec<(String, String)> {
    conditions
        .iter()
        .filter(|c| c.type_ == api::CONDITION_RECONCILING || c.type_ == api::CONDITION_STALLED)
        .map(|c| {
            assert_eq!(c.status, "True", "{}: abnormal-true only", c.type_);
            assert_eq!(c.observed_generation, Some(generation), "{}", c.type_);
            (c.type_.clone(), c.reason.clone())
        })
        .collect()
}

fn one(type_: &str, reason: &str) -> Vec<(String, String)> {
    vec![(type_.to_string(), reason.to_string())]
}

#[test]
fn the_volume_reconciles_while_it_moves_and_stalls_when_a_mount_failed() {
    let rwo = volume(AccessMode::ReadWriteOnce);
    let failed = outcome(false, TicketReason::MountFailed, "boom");
    let none = vec![];
    let cases = vec![
        (
            "detached",
            rwo.clone(),
            vec![],
            decision(&[], &[]),
            none.clone(),
        ),
        (
            "attached",
            rwo.clone(),
            vec![ready_on("n1")],
            decision(&["n1"], &[]),
            none.clone(),
        ),
        (
            "attaching",
            rwo.clone(),
            vec![starting_on("n1")],
            decision(&["n1"], &[]),
            one("Reconciling", "Attaching"),
        ),
        (
            "detaching",
            rwo.clone(),
            vec![ready_on("n1")],
            decision(&[], &[]),
            one("Reconciling", "Detaching"),
        ),
        (
            "faulted",
            rwo.clone(),
            vec![],
            decision(&["n1"], &[("a", failed)]),
            one("Stalled", "MountFailed"),
        ),
        (
            "deleting",
            deleting(rwo.clone()),
            vec![],
            decision(&[], &[]),
            one("Reconciling", "Deleting"),
        ),
    ];
    for (what, mut v, mps, d, want) in cases {
        let s = volume_status(&v, &mps, &d, &t(100));
        assert_eq!(abnormal(&s.conditions, 4), want, "{what}");
        // The same world later: the same status, nothing to write.
        v.status = Some(s.clone());
        assert_eq!(volume_status(&v, &mps, &d, &t(200)), s, "{what}: stable");
    }
}

#[test]
fn the_reconciling_condition_goes_when_the_volume_settles_and_keeps_its_time_while_it_holds() {
    let mut v = volume(AccessMode::ReadWriteOnce);
    let attaching = decision(&["n1"], &[]);
    let s1 = volume_status(&v, &[starting_on("n1")], &attaching, &t(10));
    v.status = Some(s1);
    // Still attaching later: same reason, same transition time.
    let s2 = volume_status(&v, &[starting_on("n1")], &attaching, &t(20));
    let reconciling = |s: &VolumeStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == api::CONDITION_RECONCILING)
            .map(|c| c.last_transition_time.clone())
    };
    assert_eq!(reconciling(&s2), Some(t(10)));
    v.status = Some(s2);
    let s3 = volume_status(&v, &[ready_on("n1")], &attaching, &t(30));
    assert_eq!(reconciling(&s3), None, "attached: no Reconciling condition");
    assert!(abnormal(&s3.conditions, 4).is_empty());
}

#[test]
fn fenced_failovers_condition_is_carried_over_and_changes_no_health() {
    use crate::failover::Why;
    use crate::failover::conditions::{VolumeNote, volume_conditions};
    let mut v = volume(AccessMode::ReadWriteOnce);
    let attached = decision(&["n1"], &[]);
    let mps = vec![ready_on("n1")];
    let settled = volume_status(&v, &mps, &attached, &t(10));
    // The failover loop adds NodeFailover to what the attachment controller wrote.
    let note = VolumeNote::StaysOnDownNode { node: "n1".into() };
    let mut with = settled.clone();
    with.conditions = volume_conditions(&settled.conditions, Some(&note), Some(4), &t(20));
    v.status = Some(with.clone());
    // The attachment controller's next status carries it over: equal, nothing written.
    assert_eq!(volume_status(&v, &mps, &attached, &t(30)), with);
    assert!(abnormal(&with.conditions, 4).is_empty(), "still settled");
    // A change of its own keeps the failover's condition as it is.
    let gone = VolumeNote::FailedOver {
        node: "n1".into(),
        why: Why::LeaseExpired,
    };
    with.conditions = volume_conditions(&settled.conditions, Some(&gone), Some(4), &t(40));
    v.status = Some(with.clone());
    let detaching = volume_status(&v, &mps, &decision(&[], &[]), &t(50));
    let failover = |s: &VolumeStatus| {
        s.conditions
            .iter()
            .filter(|c| c.type_ == api::CONDITION_NODE_FAILOVER)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(failover(&detaching), failover(&with));
    assert_eq!(
        abnormal(&detaching.conditions, 4),
        one("Reconciling", "Detaching")
    );
}

#[test]
fn the_attachment_reconciles_with_the_first_waiting_reason_and_stalls_on_what_needs_a_person() {
    let a = ticket("a", AttacherType::CsiAttacher, "n1");
    let b = ticket("b", AttacherType::CsiAttacher, "n2");
    let attached = || outcome(true, TicketReason::Attached, "attached to n1");
    let none: &[&str] = &[];
    type Case<'a> = (&'a str, Decision, &'a [&'a str], Vec<(String, String)>);
    let cases: Vec<Case> = vec![
        (
            "all satisfied",
            decision(&["n1"], &[("a", attached())]),
            none,
            vec![],
        ),
        (
            "attaching",
            decision(
                &["n1"],
                &[("a", outcome(false, TicketReason::Attaching, "mounting"))],
            ),
            none,
            one("Reconciling", "Attaching"),
        ),
        (
            "the first waiting ticket's reason",
            decision(
                &["n1"],
                &[
                    ("a", attached()),
                    (
                        "b",
                        outcome(false, TicketReason::HeldByOtherNode, "held by a"),
                    ),
                ],
            ),
            none,
            one("Reconciling", "HeldByOtherNode"),
        ),
        (
            "a failed mount behind a waiting ticket still stalls",
            decision(
                &["n1", "n2"],
                &[
                    (
                        "a",
                        outcome(false, TicketReason::WaitingForDetach, "detaching"),
                    ),
                    ("b", outcome(false, TicketReason::MountFailed, "boom")),
                ],
            ),
            none,
            one("Stalled", "MountFailed"),
        ),
        (
            "a node without an agent",
            decision(
                &["n2"],
                &[
                    ("a", attached()),
                    ("b", outcome(false, TicketReason::Attaching, "mounting")),
                ],
            ),
            &["n2"],
            one("Stalled", "NoAgent"),
        ),
    ];
    for (what, d, without, want) in cases {
        let without = without.iter().map(|n| n.to_string()).collect();
        let mut v = va(&[a.clone(), b.clone()]);
        let s = attachment_status(&v, &d, &input_requested(&[]), &without, &t(5));
        assert_eq!(abnormal(&s.conditions, 7), want, "{what}");
        v.status = Some(s.clone());
        let again = attachment_status(&v, &d, &input_requested(&[]), &without, &t(50));
        assert_eq!(again, s, "{what}: stable");
    }
}

#[test]
fn every_ticket_reason_makes_the_attachment_reconcile_or_stall() {
    let a = ticket("a", AttacherType::Manual, "n1");
    for reason in TicketReason::ALL {
        if reason == TicketReason::Attached {
            continue;
        }
        let d = decision(&["n1"], &[("a", outcome(false, reason, "why"))]);
        let s = attachment_status(
            &va(std::slice::from_ref(&a)),
            &d,
            &input_requested(&[]),
            &Default::default(),
            &t(5),
        );
        let want = if reason.stalls() {
            "Stalled"
        } else {
            "Reconciling"
        };
        assert_eq!(
            abnormal(&s.conditions, 7),
            one(want, reason.as_str()),
            "{reason}"
        );
        let c = s.conditions.iter().find(|c| c.type_ == want).unwrap();
        assert_eq!(c.message, "a: why", "{reason}");
    }
}

#[test]
fn an_attachment_without_its_volume_is_stalled() {
    let mut v = va(&[ticket("a", AttacherType::Manual, "n1")]);
    let s = missing_volume_status(&v, &t(10));
    assert_eq!(abnormal(&s.conditions, 7), one("Stalled", "VolumeNotFound"));
    v.status = Some(s.clone());
    assert_eq!(missing_volume_status(&v, &t(20)), s, "stable");
}
