//! The Ready conditions of the VolumeAttachment and the Volume (kstatus).

use super::status::{input_requested, ready_on, starting_on};
use super::*;

/// The Ready condition of a VolumeAttachment, as (status, reason, message).
fn ready_of(s: &VolumeAttachmentStatus) -> (String, String, String) {
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(
        c.observed_generation,
        Some(7),
        "kstatus reads observedGeneration"
    );
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn the_attachment_is_ready_when_every_ticket_is_satisfied_else_says_what_blocks() {
    let a = ticket("a", AttacherType::CsiAttacher, "n1");
    let b = ticket("b", AttacherType::CsiAttacher, "n2");
    let attached = || outcome(true, TicketReason::Attached, "attached to n1");
    let attaching = |n: &str| outcome(false, TicketReason::Attaching, &format!("mounting on {n}"));
    let none: &[&str] = &[];
    type Case<'a> = (
        &'a str,
        Decision,
        &'a [&'a str],
        (&'a str, &'a str, &'a str),
    );
    let cases: Vec<Case> = vec![
        (
            "all satisfied",
            decision(&["n1"], &[("a", attached())]),
            none,
            ("True", "TicketsSatisfied", "all 1 tickets satisfied"),
        ),
        (
            "the first blocked ticket's reason",
            decision(
                &["n1"],
                &[
                    ("a", attached()),
                    (
                        "b",
                        outcome(false, TicketReason::HeldByOtherNode, "held by a on n1"),
                    ),
                ],
            ),
            none,
            ("False", "HeldByOtherNode", "b: held by a on n1"),
        ),
        (
            "attaching on a node with an agent",
            decision(&["n2"], &[("b", attaching("n2"))]),
            &["n1"],
            ("False", "Attaching", "b: mounting on n2"),
        ),
        (
            "attaching on a node without an agent",
            decision(&["n2"], &[("a", attached()), ("b", attaching("n2"))]),
            &["n2"],
            (
                "False",
                "NoAgent",
                "b: node n2 has no Tessera agent (no CSINode lists csi.tessera.io): nothing will mount the volume there",
            ),
        ),
        (
            "a satisfied ticket on an agentless node is not blamed",
            decision(&["n1"], &[("a", attached())]),
            &["n1"],
            ("True", "TicketsSatisfied", "all 1 tickets satisfied"),
        ),
    ];
    for (what, d, without, (status, reason, message)) in cases {
        let without = without.iter().map(|n| n.to_string()).collect();
        let s = attachment_status(
            &va(&[a.clone(), b.clone()]),
            &d,
            &input_requested(&[]),
            &without,
            &t(5),
        );
        assert_eq!(
            ready_of(&s),
            (status.into(), reason.into(), message.into()),
            "{what}"
        );
        if reason == "NoAgent" {
            assert_eq!(
                s.waiting.as_deref(),
                Some(message),
                "{what}: the WAITING column says it too"
            );
        }
    }
}

#[test]
fn the_ready_condition_keeps_its_transition_time_while_it_holds() {
    let mut v = va(&[ticket("a", AttacherType::CsiAttacher, "n1")]);
    let attaching = decision(
        &["n1"],
        &[("a", outcome(false, TicketReason::Attaching, "mounting"))],
    );
    let attached = decision(
        &["n1"],
        &[("a", outcome(true, TicketReason::Attached, "attached"))],
    );
    let none = Default::default();
    let s1 = attachment_status(&v, &attaching, &input_requested(&[]), &none, &t(10));
    v.status = Some(s1.clone());
    let s2 = attachment_status(&v, &attaching, &input_requested(&[]), &none, &t(20));
    assert_eq!(s2, s1, "nothing changed: nothing to write");
    let s3 = attachment_status(&v, &attached, &input_requested(&[]), &none, &t(30));
    assert_eq!(s3.conditions[0].last_transition_time, t(30));
    assert_eq!(s3.conditions[0].status, "True");
}

#[test]
fn an_attachment_without_its_volume_says_so() {
    let mut v = va(&[
        ticket("a", AttacherType::Manual, "n1"),
        ticket("b", AttacherType::CsiAttacher, "n2"),
    ]);
    let s = crate::attachment::status::missing_volume_status(&v, &t(10));
    let message = format!("Volume {} does not exist", v.spec.volume);
    assert_eq!(
        ready_of(&s),
        ("False".into(), "VolumeNotFound".into(), message.clone())
    );
    assert_eq!((s.ticket_count, s.satisfied_count), (2, 0));
    assert_eq!(s.waiting, Some(format!("a: {message}")));
    for id in ["a", "b"] {
        let c = satisfied_condition(&s.attachment_ticket_statuses[id]);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "VolumeNotFound", message.as_str()),
            "{id}"
        );
    }
    // Written once: the same later is the same status.
    v.status = Some(s.clone());
    assert_eq!(
        crate::attachment::status::missing_volume_status(&v, &t(20)),
        s
    );
}

#[test]
fn volume_ready_follows_the_state() {
    let rwo = volume(AccessMode::ReadWriteOnce);
    let failed = outcome(false, TicketReason::MountFailed, "boom");
    let cases = vec![
        (
            "detached",
            rwo.clone(),
            vec![],
            decision(&[], &[]),
            ("True", "Detached", "no node holds the volume"),
        ),
        (
            "attached",
            rwo.clone(),
            vec![ready_on("n1")],
            decision(&["n1"], &[]),
            ("True", "Attached", "attached to n1"),
        ),
        (
            "attaching",
            rwo.clone(),
            vec![starting_on("n1")],
            decision(&["n1"], &[]),
            ("False", "Attaching", "waiting for the mount on n1"),
        ),
        (
            "moving",
            rwo.clone(),
            vec![ready_on("n1")],
            decision(&["n2"], &[]),
            ("False", "Detaching", "detaching from n1"),
        ),
        (
            "failed",
            rwo.clone(),
            vec![],
            decision(&["n1"], &[("a", failed)]),
            ("False", "MountFailed", "a: boom"),
        ),
        (
            "deleting",
            deleting(rwo.clone()),
            vec![],
            decision(&[], &[]),
            ("False", "Deleting", "the volume is being deleted"),
        ),
    ];
    for (what, v, mps, d, (status, reason, message)) in cases {
        let s = volume_status(&v, &mps, &d, &t(100));
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect(what);
        assert_eq!(
            (
                c.status.as_str(),
                c.reason.as_str(),
                c.message.as_str(),
                c.observed_generation
            ),
            (status, reason, message, Some(4)),
            "{what}"
        );
        assert_eq!(s.attached_node_list, s.attached_nodes.join(","), "{what}");
    }
}
