//! Table tests of the decision, and the safety property against the daemon's own
//! fence machine (`fuse::contract::fence`): under bounded clock-rate drift, the
//! controller never releases while a daemon of the node could still complete a write.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use tessera_fuse::contract::fence::{Fence, News, Verdict};

use super::*;

const S: Duration = Duration::from_secs(1);

fn timing() -> Timing {
    Timing {
        fence_after: 20 * S,
        margin: 5 * S,
    }
}

#[test]
fn liveness_by_the_controllers_own_observation() {
    let t = timing();
    let table: &[(&str, Option<Duration>, bool, Duration, Liveness)] = &[
        (
            "just renewed",
            Some(100 * S),
            false,
            100 * S,
            Liveness::Alive,
        ),
        (
            "late, within fenceAfter",
            Some(100 * S),
            false,
            119 * S,
            Liveness::Alive,
        ),
        (
            "fenceAfter passed",
            Some(100 * S),
            false,
            120 * S,
            Liveness::Suspect { fenced_at: 125 * S },
        ),
        (
            "within the margin",
            Some(100 * S),
            false,
            125 * S - Duration::from_nanos(1),
            Liveness::Suspect { fenced_at: 125 * S },
        ),
        (
            "fenceAfter + margin passed",
            Some(100 * S),
            false,
            125 * S,
            Liveness::Fenced {
                since: 125 * S,
                why: Why::LeaseExpired,
            },
        ),
        (
            "long dead: fenced since then",
            Some(100 * S),
            false,
            900 * S,
            Liveness::Fenced {
                since: 125 * S,
                why: Why::LeaseExpired,
            },
        ),
        (
            "the taint fences at once",
            Some(100 * S),
            true,
            101 * S,
            Liveness::Fenced {
                since: 101 * S,
                why: Why::OutOfService,
            },
        ),
        (
            "no Lease: never fenced by time",
            None,
            false,
            900 * S,
            Liveness::NoLease,
        ),
        (
            "no Lease, tainted",
            None,
            true,
            900 * S,
            Liveness::Fenced {
                since: 900 * S,
                why: Why::OutOfService,
            },
        ),
    ];
    for (name, last, oos, now, want) in table {
        let n = NodeView {
            last_change: *last,
            marked: false,
            out_of_service: *oos,
            kube_ready: false,
            fence_tainted: false,
        };
        assert_eq!(liveness(n, t, *now), *want, "{name}");
        // A Node its kubelet still reports Ready: the same, but a Lease fence only
        // says the agent is gone, and the taint still fences at once.
        let ready = NodeView {
            kube_ready: true,
            ..n
        };
        let want_ready = match want {
            Liveness::Fenced {
                since,
                why: Why::LeaseExpired,
            } => Liveness::AgentGone { fenced_at: *since },
            w => *w,
        };
        assert_eq!(liveness(ready, t, *now), want_ready, "{name}, Node Ready");
        // Ready but carrying the fence taint (`--fence-taint`): the scheduler puts
        // nothing there, so a Lease fence fences as on a node not Ready.
        let tainted = NodeView {
            fence_tainted: true,
            ..ready
        };
        assert_eq!(
            liveness(tainted, t, *now),
            *want,
            "{name}, Ready, fence taint"
        );
    }
    // The controller's own mark: fenced at once (it was written only once fenced).
    let marked = NodeView {
        last_change: Some(100 * S),
        marked: true,
        out_of_service: false,
        kube_ready: true,
        fence_tainted: false,
    };
    assert_eq!(
        liveness(marked, t, 101 * S),
        Liveness::Fenced {
            since: 101 * S,
            why: Why::LeaseExpired
        }
    );
}

#[test]
fn the_observer_counts_from_changes_it_saw() {
    let mut o = Observer::new(50 * S);
    assert_eq!(o.last_change("a"), None);
    // A Lease first seen counts as changed when seen, however old it is.
    o.observe("a", "1", 60 * S);
    assert_eq!(o.last_change("a"), Some(60 * S));
    // The same version seen again (a resync) restarts nothing.
    o.observe("a", "1", 70 * S);
    assert_eq!(o.last_change("a"), Some(60 * S));
    assert!(!o.renewed("a"), "only seen, never seen renewed");
    o.observe("a", "2", 80 * S);
    assert_eq!(o.last_change("a"), Some(80 * S));
    assert!(o.renewed("a"));
    assert!(!o.renewed("b"));
    // A restarted controller starts from its own start.
    let mut fresh = Observer::new(500 * S);
    fresh.observe("a", "2", 400 * S);
    assert_eq!(fresh.last_change("a"), Some(500 * S));
    o.forget("a");
    assert_eq!(o.last_change("a"), None);
}

fn holding(volume: &str, node: &str, single_writer: bool, failover: NodeFailover) -> Holding {
    Holding {
        volume: volume.into(),
        ticket: format!("csi-{volume}"),
        node: node.into(),
        single_writer,
        failover,
    }
}

#[test]
fn which_tickets_a_fenced_node_gives_up() {
    use NodeFailover::{Fenced, Off};
    let nodes: BTreeMap<String, Liveness> = [
        ("alive", Liveness::Alive),
        ("suspect", Liveness::Suspect { fenced_at: 125 * S }),
        (
            "dead",
            Liveness::Fenced {
                since: 125 * S,
                why: Why::LeaseExpired,
            },
        ),
        (
            "tainted",
            Liveness::Fenced {
                since: 3 * S,
                why: Why::OutOfService,
            },
        ),
        ("old-agent", Liveness::NoLease),
    ]
    .into_iter()
    .map(|(n, l)| (n.to_owned(), l))
    .collect();
    let holdings = [
        holding("a-rwo-fenced", "alive", true, Fenced),
        holding("s-rwo-fenced", "suspect", true, Fenced),
        holding("d-rwo-fenced", "dead", true, Fenced),
        holding("d-rwo-off", "dead", true, Off),
        holding("d-rwx-fenced", "dead", false, Fenced),
        holding("t-rwo-off", "tainted", true, Off),
        holding("t-rwx-off", "tainted", false, Off),
        holding("o-rwo-fenced", "old-agent", true, Fenced),
        holding("u-rwo-fenced", "unknown-node", true, Fenced),
    ];
    let got: Vec<(String, Why)> = releases(&nodes, &holdings)
        .into_iter()
        .map(|r| (r.volume, r.why))
        .collect();
    assert_eq!(
        got,
        vec![
            ("d-rwo-fenced".to_owned(), Why::LeaseExpired),
            ("t-rwo-off".to_owned(), Why::OutOfService),
            ("t-rwx-off".to_owned(), Why::OutOfService),
        ]
    );
    // What stays on the dead node, and is said: its single-writer volume that did not
    // opt in (an RWX volume's other nodes keep it; the taint releases everything).
    let stays: Vec<&str> = stranded(&nodes, &holdings)
        .into_iter()
        .map(|h| h.volume.as_str())
        .collect();
    assert_eq!(stays, ["d-rwo-off"]);
}

// ---- the safety property -------------------------------------------------------

/// A clock running at `1 + ppm/10⁶` of real time, from `offset`.
#[derive(Debug, Clone, Copy)]
struct Clock {
    offset: u64,
    ppm: i64,
}

impl Clock {
    /// Its reading at real time `t` (nanoseconds).
    fn at(&self, t: u64) -> u64 {
        let drift = i128::from(t) * i128::from(self.ppm) / 1_000_000;
        (i128::from(self.offset) + i128::from(t) + drift) as u64
    }
}

/// One renewal by the agent: sent `gap` after the previous one ended, stored by the
/// API server after `store`, seen by the controller `observe` after that, its news
/// in the fence file `news` after the store (the response).
#[derive(Debug, Clone, Copy)]
struct Attempt {
    gap: u64,
    ok: bool,
    store: u64,
    observe: u64,
    news: u64,
}

#[derive(Debug)]
struct Violation {
    release: u64,
    writable_at: u64,
}

/// Play the attempts; the first real instant at or after the controller's release at
/// which the daemon would still complete a write, if any.
fn first_violation(
    timing: Timing,
    controller: Clock,
    daemon: Clock,
    attempts: &[Attempt],
) -> Option<Violation> {
    // The agent sends one renewal at a time; the first one at real time 0 is
    // stored, seen and heard at once (the node's start).
    struct Renewal {
        sent: u64,
        stored: u64,
        seen: u64,
        heard: u64,
    }
    let mut renewals = vec![Renewal {
        sent: 0,
        stored: 0,
        seen: 0,
        heard: 0,
    }];
    let mut end = 0u64;
    let mut last_seen = 0u64;
    for a in attempts {
        let sent = end + a.gap;
        let stored = sent + a.store;
        end = stored + a.news;
        if a.ok {
            // A watch delivers changes in order.
            last_seen = last_seen.max(stored + a.observe);
            renewals.push(Renewal {
                sent,
                stored,
                seen: last_seen,
                heard: end,
            });
        }
    }
    let mono = |t: u64| Duration::from_nanos(controller.at(t));
    // The controller: from the last change seen, wait; a change seen before the wait
    // ends restarts it; a change stored but not yet seen makes the mark fail (its
    // resourceVersion precondition), and the controller has then seen it.
    let mut observer = Observer::new(mono(0));
    observer.observe("n", "0", mono(0));
    let (mut seen_at, mut k) = (0u64, 0usize);
    let release = loop {
        // The first real instant at which the pure decision says Fenced.
        let (mut lo, mut hi) = (seen_at, seen_at + 4 * timing.wait().as_nanos() as u64);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let n = NodeView {
                last_change: observer.last_change("n"),
                ..NodeView::default()
            };
            let l = liveness(n, timing, mono(mid));
            if matches!(l, Liveness::Fenced { .. }) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let r = lo;
        match renewals.get(k + 1) {
            Some(next) if next.seen <= r || next.stored <= r => {
                k += 1;
                seen_at = next.seen.min(r);
                observer.observe("n", &k.to_string(), mono(seen_at));
            }
            _ => break r,
        }
    };
    // The daemon: news of every renewal stored before the mark, in order; a renewal
    // stored after it fails on the precondition and is never heard.
    let heard: Vec<&Renewal> = renewals.iter().filter(|x| x.stored < release).collect();
    let mut checks: Vec<u64> = vec![release];
    checks.extend(heard.iter().map(|x| x.heard).filter(|&h| h >= release));
    for t in checks {
        let mut fence = Fence::new();
        for x in heard.iter().filter(|x| x.heard <= t) {
            fence.hear(&News {
                epoch: 1,
                renewed_ns: daemon.at(x.sent),
                fence_after: timing.fence_after,
            });
        }
        if fence.verdict(daemon.at(t)) == Verdict::Writable {
            return Some(Violation {
                release,
                writable_at: t,
            });
        }
    }
    None
}

/// Rate error bound of the model: 1000 ppm, far beyond any real oscillator.
const PPM: i64 = 1000;

fn attempt() -> impl Strategy<Value = Attempt> {
    const MS: u64 = 1_000_000;
    (
        prop_oneof![0..3_000 * MS, 15_000 * MS..30_000 * MS],
        prop::bool::weighted(0.8),
        0..2_000 * MS,
        0..3_000 * MS,
        0..1_000 * MS,
    )
        .prop_map(|(gap, ok, store, observe, news)| Attempt {
            gap,
            ok,
            store,
            observe,
            news,
        })
}

fn clock() -> impl Strategy<Value = Clock> {
    (0..1u64 << 50, -PPM..=PPM).prop_map(|(offset, ppm)| Clock { offset, ppm })
}

/// The margin the design asks for: more than 2ρF/(1−ρ) (40 ms at F = 20 s, ρ = 10⁻³).
fn tight() -> Timing {
    Timing {
        fence_after: 20 * S,
        margin: Duration::from_millis(45),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_controller_never_releases_while_the_daemon_could_write(
        controller in clock(),
        daemon in clock(),
        attempts in prop::collection::vec(attempt(), 0..12),
    ) {
        let v = first_violation(tight(), controller, daemon, &attempts);
        prop_assert!(v.is_none(), "{v:?}");
    }
}

#[test]
fn without_the_margin_drift_alone_gives_two_writers() {
    // The property test above can fail: with no margin, a fast controller clock and a
    // slow daemon clock, the release comes while the daemon still writes.
    let no_margin = Timing {
        fence_after: 20 * S,
        margin: Duration::ZERO,
    };
    let fast = Clock {
        offset: 7,
        ppm: PPM,
    };
    let slow = Clock {
        offset: 1 << 40,
        ppm: -PPM,
    };
    let v = first_violation(no_margin, fast, slow, &[]);
    assert!(
        v.is_some(),
        "a release at the daemon's deadline must be caught"
    );
    assert!(first_violation(tight(), fast, slow, &[]).is_none());
    let v = v.unwrap();
    assert!(v.writable_at >= v.release);
}

#[test]
fn a_released_ticket_takes_its_pods_and_its_csi_attachment_first() {
    let r = |why| Release {
        volume: "v".into(),
        ticket: "csi-1".into(),
        node: "a".into(),
        why,
        since: S,
    };
    let pods = vec![
        ("ns".to_string(), "app-0".to_string(), "u0".to_string()),
        ("ns".to_string(), "app-1".to_string(), "u1".to_string()),
    ];
    let pod = |name: &str, uid: &str| Step::DeletePod {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    };
    let csi = Step::DeleteCsiAttachment {
        name: "csi-1".into(),
    };
    type Row<'a> = (
        &'a str,
        Release,
        bool,
        &'a [(String, String, String)],
        Vec<Step>,
    );
    let table: Vec<Row> = vec![
        (
            "dead node, CSI ticket: its Pods, its storage attachment, then the ticket",
            r(Why::LeaseExpired),
            true,
            &pods,
            vec![
                pod("app-0", "u0"),
                pod("app-1", "u1"),
                csi.clone(),
                Step::RemoveTicket,
            ],
        ),
        (
            "dead node, a manual ticket: no storage attachment to delete",
            r(Why::LeaseExpired),
            false,
            &pods,
            vec![pod("app-0", "u0"), pod("app-1", "u1"), Step::RemoveTicket],
        ),
        (
            "dead node, no Pod bound",
            r(Why::LeaseExpired),
            true,
            &[],
            vec![csi, Step::RemoveTicket],
        ),
        (
            "out-of-service taint: Kubernetes deletes the Pods and detaches itself",
            r(Why::OutOfService),
            true,
            &pods,
            vec![Step::RemoveTicket],
        ),
    ];
    for (what, release, csi_attacher, pods, want) in table {
        assert_eq!(steps(&release, csi_attacher, pods), want, "{what}");
    }
}

/// The release races ControllerUnpublish for the ticket: the external-attacher calls
/// it as soon as the storage attachment is deleted, and it removes the ticket. Found
/// on real nodes: the race lost, the controller saw only its patch fail and reported
/// nothing (no FailedOver Event, no condition, no metric) for a volume it had moved.
#[test]
fn a_ticket_removed_by_unpublish_after_the_storage_attachment_went_is_released() {
    let r = Release {
        volume: "v".into(),
        ticket: "csi-1".into(),
        node: "a".into(),
        why: Why::LeaseExpired,
        since: S,
    };
    let va = |tickets: &[&str]| -> VolumeAttachment {
        let map: serde_json::Map<String, serde_json::Value> = tickets
            .iter()
            .map(|id| {
                let t = serde_json::json!({"id": id, "type": "csi-attacher", "nodeID": "a", "generation": 1});
                (id.to_string(), t)
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
            "metadata": {"name": "v"},
            "spec": {"volume": "v", "attachmentTickets": map},
        }))
        .unwrap()
    };
    let (gone, there) = (va(&["csi-2"]), va(&["csi-1", "csi-2"]));
    let table = [
        (
            "storage attachment deleted, ticket gone",
            true,
            Some(&gone),
            true,
        ),
        (
            "storage attachment deleted, ticket still there",
            true,
            Some(&there),
            false,
        ),
        ("storage attachment deleted, volume gone", true, None, false),
        (
            "no storage attachment deleted (a manual ticket)",
            false,
            Some(&gone),
            false,
        ),
    ];
    for (what, deleted, now, want) in table {
        assert_eq!(released_by_unpublish(&r, deleted, now), want, "{what}");
    }
}
