//! The Detaching Event's rule: which terminating MountPods are slow detaches, when
//! the next one is due, and that each is reported once.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{decision, mountpod};
use crate::api::MountPod;
use crate::controller::attachment::detaching::{
    DETACH_QUIET, Reported, SlowDetaches, slow_detaches,
};
use crate::tickets::Decision;

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
