//! Table tests of the reconcile's plan, phase by phase: what is written, in which
//! order, and when the reconcile comes back, from what was read and the time.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::runtime::controller::Action;

use tessera_api::ATTACHMENT_FINALIZER;

use super::*;
use crate::attachment::mountpods::Synced;
use crate::attachment::plan::{
    AFTER_PIN, AfterSync, Facts, Hold, Next, PAST_EXPIRY, PAST_SPACING, PAST_WAIT, Plan,
    SAFETY_NET, Start, Step, after_sync, start, without_volume, writes,
};
use crate::pace::ATTACH_QUIET;

const NOW: i64 = 100;

/// Facts at `NOW` on nodes n1 and n2; every ticket first seen now.
fn facts(volume: Volume, mut va: VolumeAttachment) -> Facts {
    va.metadata.resource_version = Some("1".into());
    Facts {
        first_seen: va
            .spec
            .attachment_tickets
            .keys()
            .map(|id| (id.clone(), t(NOW)))
            .collect::<BTreeMap<_, _>>(),
        va: Arc::new(va),
        volume: Arc::new(volume),
        nodes: ["n1".to_string(), "n2".to_string()].into(),
        now: t(NOW),
    }
}

/// The MountPod the controller wants on `node`, in `phase`.
fn mp(volume: &Volume, node: &str, phase: Option<MountPhase>) -> Arc<MountPod> {
    let mut mp = mountpod(node, phase);
    mp.spec = desired_spec(volume, node, false, MountTask::Serve).unwrap();
    mp.metadata.uid = Some(format!("uid-{node}"));
    Arc::new(mp)
}

fn ready(volume: &Volume, node: &str) -> Arc<MountPod> {
    mp(volume, node, Some(MountPhase::Ready))
}

fn protected(mut va: VolumeAttachment) -> VolumeAttachment {
    va.metadata.finalizers = Some(vec![ATTACHMENT_FINALIZER.into()]);
    va
}

fn one(node: &str) -> VolumeAttachment {
    va(&[ticket("t1", AttacherType::CsiAttacher, node)])
}

/// A step in a few words.
fn describe(step: &Step) -> String {
    match step {
        Step::ReleaseFinalizer => "release finalizer".into(),
        Step::PinVolume { node, .. } => format!("pin to {node}"),
        Step::ReportSlowDetaches { due, .. } => {
            let nodes: Vec<&str> = due.iter().map(|(n, _)| n.as_str()).collect();
            format!("report slow detaches {nodes:?}")
        }
        Step::WriteStatuses(w) => format!(
            "statuses: attachment {}{}, volume {}, {}",
            if w.attachment.status.is_some() {
                "written"
            } else {
                "as is"
            },
            w.attachment
                .precondition
                .as_ref()
                .map_or(String::new(), |rv| format!(" if at {rv}")),
            match &w.volume {
                Some(v) => format!(
                    "on {:?}",
                    v.mountpods
                        .iter()
                        .map(|mp| mp.spec.node_name.as_str())
                        .collect::<Vec<_>>()
                ),
                None => "waits".into(),
            },
            if w.in_turn { "in turn" } else { "at once" },
        ),
        Step::DeletionBlocked { holders, .. } => format!("deletion blocked by {holders:?}"),
    }
}

fn described(plan: &Plan) -> Vec<String> {
    plan.steps.iter().map(describe).collect()
}

/// (what, volume, VolumeAttachment, MountPods first, what the sync did, MountPods
/// after it, spacing left, steps, next)
type SyncCase<'a> = (
    &'a str,
    &'a Volume,
    VolumeAttachment,
    Vec<Arc<MountPod>>,
    Synced,
    Option<Vec<Arc<MountPod>>>,
    Option<Duration>,
    Vec<String>,
    String,
);

/// (what, volume, VolumeAttachment, MountPods, re-check reads, steps, then)
type WriteCase<'a> = (
    &'a str,
    &'a Volume,
    VolumeAttachment,
    Vec<Arc<MountPod>>,
    Option<Vec<Arc<MountPod>>>,
    Vec<&'a str>,
    Action,
);

fn requeue(d: Duration) -> Action {
    Action::requeue(d)
}

#[test]
fn without_a_volume() {
    let ms = Duration::from_millis;
    // (what, VolumeAttachment, steps, then)
    let cases = [
        (
            "deleted, protected: lets go",
            deleting(protected(one("n1"))),
            vec!["release finalizer"],
            Action::await_change(),
        ),
        (
            "deleted, not protected: nothing",
            deleting(one("n1")),
            vec![],
            Action::await_change(),
        ),
        (
            "tickets before their Volume: says so",
            one("n1"),
            vec!["statuses: attachment written, volume waits, at once"],
            Action::await_change(),
        ),
    ];
    for (what, va, steps, then) in cases {
        let plan = without_volume(&va, &t(NOW));
        assert_eq!(described(&plan), steps, "{what}");
        assert_eq!(plan.then, then, "{what}");
    }
    // Said once: the same status again is not written.
    let mut said = one("n1");
    said.status = Some(crate::attachment::status::missing_volume_status(
        &said,
        &t(NOW),
    ));
    let plan = without_volume(&said, &t(NOW + 1));
    assert_eq!(
        described(&plan),
        ["statuses: attachment as is, volume waits, at once"]
    );
    assert_eq!(super::super::plan::not_ready().then, requeue(ms(200)));
}

#[test]
fn the_first_decision_pins_a_node_local_volume() {
    let local = |node: Option<&str>| {
        let mut v = volume(AccessMode::ReadWriteOnce);
        v.spec.backend.scope = BackendScope::NodeLocal;
        v.spec.backend.node = node.map(String::from);
        v
    };
    // (what, volume, tickets' node, pinned to)
    let cases = [
        ("node-local, unpinned", local(None), "n2", Some("n2")),
        ("node-local, pinned", local(Some("n2")), "n2", None),
        ("shared", volume(AccessMode::ReadWriteOnce), "n2", None),
    ];
    for (what, v, node, pin) in cases {
        match (start(&facts(v, one(node)), vec![]), pin) {
            (Start::Done(plan), Some(pin)) => {
                assert_eq!(described(&plan), [format!("pin to {pin}")], "{what}");
                assert_eq!(plan.then, requeue(AFTER_PIN), "{what}");
            }
            (Start::Sync(d), None) => assert!(d.decision.nodes.contains_key(node), "{what}"),
            (other, _) => panic!("{what}: {other:?}"),
        }
    }
}

/// After the sync: what is due now, and whether the statuses wait, are written, or
/// are written after a re-check (and of which nodes' MountPods).
#[test]
fn after_the_sync() {
    let rwo = volume(AccessMode::ReadWriteOnce);
    let rwx = volume(AccessMode::ReadWriteMany);
    let two = va(&[
        ticket("t1", AttacherType::CsiAttacher, "n1"),
        ticket("t2", AttacherType::CsiAttacher, "n2"),
    ]);
    let created = Synced {
        created: true,
        deleted: false,
    };
    let both = Synced {
        created: true,
        deleted: true,
    };
    let mut gone = Arc::unwrap_or_clone(ready(&rwo, "n2"));
    gone.metadata.deletion_timestamp = Some(t(5));
    let gone = Arc::new(gone);
    let quiet = ATTACH_QUIET + PAST_WAIT;
    let cases: Vec<SyncCase> = vec![
        (
            "a new attach, its MountPod created: quiet",
            &rwo,
            one("n1"),
            vec![],
            created,
            Some(vec![mp(&rwo, "n1", None)]),
            None,
            vec!["report slow detaches []".into()],
            format!("quiet, requeue {quiet:?}"),
        ),
        (
            "the same while deleted: written",
            &rwo,
            deleting(one("n1")),
            vec![],
            created,
            Some(vec![mp(&rwo, "n1", None)]),
            None,
            vec!["report slow detaches []".into()],
            "write".into(),
        ),
        (
            "satisfied, single-node: re-checked, nothing else to read",
            &rwo,
            one("n1"),
            vec![ready(&rwo, "n1")],
            Synced::default(),
            None,
            None,
            vec!["report slow detaches []".into()],
            "write after reading {} keeping [\"n1\"]".into(),
        ),
        (
            "satisfied, single-node, a ticket elsewhere: its MountPod read",
            &rwo,
            two.clone(),
            vec![ready(&rwo, "n1")],
            Synced::default(),
            None,
            None,
            vec!["report slow detaches []".into()],
            "write after reading {\"n2\"} keeping [\"n1\"]".into(),
        ),
        (
            "satisfied, multi-node: no re-check",
            &rwx,
            one("n1"),
            vec![ready(&rwx, "n1")],
            Synced::default(),
            None,
            None,
            vec!["report slow detaches []".into()],
            "write".into(),
        ),
        (
            "created only: decided again on the MountPods after the sync",
            &rwo,
            one("n1"),
            vec![],
            created,
            Some(vec![ready(&rwo, "n1")]),
            None,
            vec!["report slow detaches []".into()],
            "write after reading {} keeping [\"n1\"]".into(),
        ),
        (
            "created and deleted: the first decision stands",
            &rwo,
            one("n1"),
            vec![],
            both,
            Some(vec![ready(&rwo, "n1")]),
            None,
            vec!["report slow detaches []".into()],
            format!("quiet, requeue {quiet:?}"),
        ),
        (
            "a large VolumeAttachment's spacing: back when it is over",
            &rwo,
            one("n1"),
            vec![ready(&rwo, "n1")],
            Synced::default(),
            None,
            Some(Duration::from_secs(1)),
            vec!["report slow detaches []".into()],
            format!(
                "spaced, requeue {:?}",
                Duration::from_secs(1) + PAST_SPACING
            ),
        ),
        (
            "a slow detach: reported",
            &rwo,
            one("n1"),
            vec![ready(&rwo, "n1"), gone.clone()],
            Synced::default(),
            None,
            None,
            vec!["report slow detaches [\"n2\"]".into()],
            "write after reading {\"n2\"} keeping [\"n1\"]".into(),
        ),
    ];
    for (what, v, va, first, synced, after, spacing_left, steps, next) in cases {
        let facts = facts(v.clone(), va);
        let Start::Sync(decided) = start(&facts, first) else {
            panic!("{what}: not synced");
        };
        let read = AfterSync {
            synced,
            mountpods: after,
            without_agent: Default::default(),
            quiet_time: ATTACH_QUIET,
            spacing_left,
        };
        let settled = after_sync(&facts, decided, read);
        let got: Vec<String> = settled.steps.iter().map(describe).collect();
        assert_eq!(got, steps, "{what}");
        let got = match &settled.next {
            Next::Requeue(a, Hold::Quiet(_)) => format!("quiet, requeue {:?}", requeue_of(a)),
            Next::Requeue(a, Hold::Spaced(_)) => format!("spaced, requeue {:?}", requeue_of(a)),
            Next::Write { recheck: None, .. } => "write".into(),
            Next::Write {
                recheck: Some(r), ..
            } => format!(
                "write after reading {:?} keeping {:?}",
                r.read,
                r.keep
                    .iter()
                    .map(|mp| mp.spec.node_name.as_str())
                    .collect::<Vec<_>>()
            ),
        };
        assert_eq!(got, next, "{what}");
    }
}

/// The requeue of `a` (kube keeps it private): the one of the candidates it equals.
fn requeue_of(a: &Action) -> Duration {
    let ms = Duration::from_millis;
    [
        ATTACH_QUIET + PAST_WAIT,
        Duration::from_secs(1) + PAST_SPACING,
        ms(2) + PAST_WAIT,
    ]
    .into_iter()
    .find(|d| *a == Action::requeue(*d))
    .unwrap_or_else(|| panic!("an unexpected requeue: {a:?}"))
}

/// The writes: the statuses (in turn after a re-check, with the resourceVersion
/// read), the finalizer, and when to come back.
#[test]
fn the_writes() {
    let rwo = volume(AccessMode::ReadWriteOnce);
    let rwx = volume(AccessMode::ReadWriteMany);
    let mut expiring = ticket("t1", AttacherType::CsiAttacher, "n1");
    expiring.expires_at = Some(t(NOW + 60));
    let expiring = va(&[expiring]);
    let mut young = Arc::unwrap_or_clone(ready(&rwo, "n2"));
    young.metadata.deletion_timestamp = Some(t(NOW));
    let young = Arc::new(young);
    let mut attached = rwo.clone();
    // As written before n2's MountPod was deleted (it holds the volume for t2).
    attached.status = Some(volume_status(
        &rwo,
        &[ready(&rwo, "n1"), ready(&rwo, "n2")],
        &decision(
            &["n1", "n2"],
            &[("t1", outcome(true, TicketReason::Attached, "on n1"))],
        ),
        &t(NOW - 10),
    ));
    let cases: Vec<WriteCase> = vec![
        (
            "multi-node: both at once",
            &rwx,
            one("n1"),
            vec![ready(&rwx, "n1")],
            None,
            vec!["statuses: attachment written, volume on [\"n1\"], at once"],
            requeue(SAFETY_NET),
        ),
        (
            "re-checked: in turn, if still at the version read",
            &rwo,
            one("n1"),
            vec![ready(&rwo, "n1")],
            Some(vec![ready(&rwo, "n1")]),
            vec!["statuses: attachment written if at 1, volume on [\"n1\"], in turn"],
            requeue(SAFETY_NET),
        ),
        (
            "deleted, no workload satisfied (an attach under way, held back): the finalizer goes after the statuses",
            &rwx,
            deleting(protected(one("n1"))),
            vec![mp(&rwx, "n1", None)],
            None,
            vec![
                "statuses: attachment written, volume on [], at once",
                "release finalizer",
            ],
            requeue(ATTACH_QUIET + PAST_WAIT),
        ),
        (
            "deleted, a workload satisfied: blocked after the statuses",
            &rwx,
            deleting(protected(one("n1"))),
            vec![ready(&rwx, "n1")],
            None,
            vec![
                "statuses: attachment written, volume on [\"n1\"], at once",
                "deletion blocked by [\"t1 (csi-attacher on n1)\"]",
            ],
            requeue(SAFETY_NET),
        ),
        (
            "an expiring ticket: back just after it expires",
            &rwx,
            expiring,
            vec![ready(&rwx, "n1")],
            None,
            vec!["statuses: attachment written, volume on [\"n1\"], at once"],
            requeue(Duration::from_secs(60) + PAST_EXPIRY),
        ),
        (
            "a young detach: the Volume status waits; back when it is slow",
            &attached,
            one("n1"),
            vec![ready(&rwo, "n1"), young.clone()],
            Some(vec![ready(&rwo, "n1")]),
            vec!["statuses: attachment written if at 1, volume waits, in turn"],
            requeue(crate::attachment::detaching::DETACH_QUIET + PAST_WAIT),
        ),
    ];
    for (what, v, va, mps, rechecked, steps, then) in cases {
        let facts = facts(v.clone(), va);
        let Start::Sync(decided) = start(&facts, mps) else {
            panic!("{what}: not synced");
        };
        let read = AfterSync {
            synced: Synced::default(),
            mountpods: None,
            without_agent: Default::default(),
            quiet_time: ATTACH_QUIET,
            spacing_left: None,
        };
        let Next::Write { pending, .. } = after_sync(&facts, decided, read).next else {
            panic!("{what}: nothing written");
        };
        let plan = writes(&facts, *pending, rechecked);
        assert_eq!(described(&plan), steps, "{what}");
        assert_eq!(plan.then, then, "{what}");
    }
}
