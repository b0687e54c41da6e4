//! The Detaching rules: which terminating MountPods are slow detaches, when the next
//! one is due, that each is reported once, and when the Volume status waits.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use tessera_api::tickets::Decision;
use tessera_api::{AccessMode, AppliedSettings, MountPhase, MountPod, Volume};

use super::{decision, mountpod, volume};
use crate::attachment::detaching::{
    DETACH_QUIET, Reported, SlowDetaches, slow_detaches, volume_status_waits,
};
use crate::attachment::status::volume_status;

fn at(ms: i64) -> Time {
    Time(jiff::Timestamp::from_millisecond(ms).unwrap())
}

/// Node `node`'s MountPod, deleted at `deleted_ms` (`None`: not being deleted).
fn mp(node: &str, deleted_ms: Option<i64>) -> Arc<MountPod> {
    let mut mp = mountpod(node, None);
    mp.metadata.uid = Some(format!("uid-{node}"));
    mp.metadata.deletion_timestamp = deleted_ms.map(at);
    Arc::new(mp)
}

fn due(nodes: &[&str]) -> Vec<(String, String)> {
    nodes
        .iter()
        .map(|n| (n.to_string(), format!("uid-{n}")))
        .collect()
}

struct Case {
    what: &'static str,
    mountpods: Vec<Arc<MountPod>>,
    decision: Decision,
    now_ms: i64,
    want: SlowDetaches,
}

#[test]
fn a_detach_is_reported_once_it_is_slow() {
    let ms = Duration::from_millis;
    let cases = [
        Case {
            what: "not being deleted",
            mountpods: vec![mp("a", None)],
            decision: decision(&[], &[]),
            now_ms: 10_000,
            want: SlowDetaches::default(),
        },
        Case {
            what: "deleted just now: quiet for the rest",
            mountpods: vec![mp("a", Some(10_000))],
            decision: decision(&[], &[]),
            now_ms: 10_500,
            want: SlowDetaches {
                due: vec![],
                left: Some(ms(1_500)),
            },
        },
        Case {
            what: "deleted the quiet time ago",
            mountpods: vec![mp("a", Some(10_000))],
            decision: decision(&[], &[]),
            now_ms: 12_000,
            want: SlowDetaches {
                due: due(&["a"]),
                left: None,
            },
        },
        Case {
            what: "its node chosen again: a replacement, not a detach",
            mountpods: vec![mp("a", Some(10_000))],
            decision: decision(&["a"], &[]),
            now_ms: 20_000,
            want: SlowDetaches::default(),
        },
        Case {
            what: "a clock behind the API server's: the whole quiet time",
            mountpods: vec![mp("a", Some(10_000))],
            decision: decision(&[], &[]),
            now_ms: 9_000,
            want: SlowDetaches {
                due: vec![],
                left: Some(DETACH_QUIET),
            },
        },
        Case {
            what: "one due, two quiet: the sooner of theirs",
            mountpods: vec![
                mp("a", Some(7_000)),
                mp("b", Some(9_500)),
                mp("c", Some(9_000)),
                mp("d", None),
            ],
            decision: decision(&["d"], &[]),
            now_ms: 10_000,
            want: SlowDetaches {
                due: due(&["a"]),
                left: Some(ms(1_000)),
            },
        },
    ];
    for c in cases {
        let got = slow_detaches(&c.mountpods, &c.decision, &at(c.now_ms), DETACH_QUIET);
        assert_eq!(got, c.want, "{}", c.what);
    }
}

#[test]
fn each_slow_detach_is_reported_once_and_forgotten_when_gone() {
    let r = Reported::default();
    let a = due(&["a"]);
    assert_eq!(r.fresh("v", &a, ["uid-a"]), ["a"]);
    assert!(r.fresh("v", &a, ["uid-a"]).is_empty(), "not again");
    assert_eq!(r.fresh("w", &a, ["uid-a"]), ["a"], "volumes apart");
    let ab = due(&["a", "b"]);
    assert_eq!(r.fresh("v", &ab, ["uid-a", "uid-b"]), ["b"]);
    // Both MountPods gone: nothing kept for the volume.
    assert!(r.fresh("v", &[], []).is_empty());
    assert!(r.fresh("w", &[], []).is_empty());
    assert_eq!(r.volumes(), 0);
    // A new MountPod of the same node (another uid) is a detach of its own.
    let again = vec![("a".to_string(), "uid-a2".to_string())];
    assert_eq!(r.fresh("v", &again, ["uid-a2"]), ["a"]);
}

/// Node `node`'s MountPod in `phase` (Ready: with the settings applied, as the agent
/// says), deleted at `deleted_ms` (`None`: not deleted; the API server bumps the
/// generation of an object it marks deleted).
fn mp_in(node: &str, phase: MountPhase, deleted_ms: Option<i64>) -> Arc<MountPod> {
    let mut mp = mountpod(node, Some(phase));
    if let Some(s) = mp.status.as_mut().filter(|_| phase == MountPhase::Ready) {
        s.applied = Some(AppliedSettings::of(&mp.spec));
    }
    if let Some(ms) = deleted_ms {
        mp.metadata.deletion_timestamp = Some(at(ms));
        mp.metadata.generation = mp.metadata.generation.map(|g| g + 1);
    }
    Arc::new(mp)
}

#[test]
fn the_volume_status_waits_only_for_a_young_detach_that_changes_nothing_else() {
    use MountPhase::{Failed, Ready, Terminating};
    // Attached on a and b, as written at 5 s.
    let mut v = volume(AccessMode::ReadWriteMany);
    let both = [mp_in("a", Ready, None), mp_in("b", Ready, None)];
    v.status = Some(volume_status(
        &v,
        &both,
        &decision(&["a", "b"], &[]),
        &at(5_000),
    ));
    let unwritten = volume(AccessMode::ReadWriteMany);
    // (what, the Volume, its MountPods, the nodes chosen, now, whether the status waits)
    type Row<'a> = (
        &'a str,
        &'a Volume,
        Vec<Arc<MountPod>>,
        &'a [&'a str],
        i64,
        bool,
    );
    let cases: Vec<Row> = vec![
        (
            "nothing detaching",
            &v,
            both.to_vec(),
            &["a", "b"],
            10_000,
            false,
        ),
        (
            "b's ticket gone, its MountPod deleted just now: the status waits",
            &v,
            vec![mp_in("a", Ready, None), mp_in("b", Ready, Some(10_000))],
            &["a"],
            10_500,
            true,
        ),
        (
            "both detaching, young",
            &v,
            vec![
                mp_in("a", Ready, Some(9_000)),
                mp_in("b", Ready, Some(10_000)),
            ],
            &[],
            10_500,
            true,
        ),
        (
            "b's detach past its quiet time: written (slow)",
            &v,
            vec![mp_in("a", Ready, None), mp_in("b", Ready, Some(8_000))],
            &["a"],
            10_000,
            false,
        ),
        (
            "b's MountPod gone: written (done)",
            &v,
            vec![mp_in("a", Ready, None)],
            &["a"],
            10_000,
            false,
        ),
        (
            "b detaching, young, and a's mount failed: written",
            &v,
            vec![mp_in("a", Failed, None), mp_in("b", Ready, Some(10_000))],
            &["a"],
            10_500,
            false,
        ),
        (
            "b's mount kept by its references (agent says Terminating): written",
            &v,
            vec![
                mp_in("a", Ready, None),
                mp_in("b", Terminating, Some(10_000)),
            ],
            &["a"],
            10_500,
            false,
        ),
        (
            "b's node chosen again (a replacement): not a detach",
            &v,
            vec![mp_in("a", Ready, None), mp_in("b", Ready, Some(10_000))],
            &["a", "b"],
            10_500,
            false,
        ),
        (
            "no status written yet",
            &unwritten,
            vec![mp_in("b", Ready, Some(10_000))],
            &[],
            10_500,
            false,
        ),
    ];
    for (what, volume, mountpods, nodes, now_ms, want) in cases {
        let got = volume_status_waits(
            volume,
            &mountpods,
            &decision(nodes, &[]),
            &at(now_ms),
            DETACH_QUIET,
        );
        assert_eq!(got, want, "{what}");
    }
}
