//! Tessera's released volumes out of a fenced node's `status.volumesInUse`, the pure
//! part (docs/failover.md, "Kubernetes' own attachment"): a dead kubelet never
//! updates that list, and the attach-detach controller does not detach a volume a
//! node lists there, so once the controller has released a volume from a node that is
//! fenced *and* that Kubernetes gave up on (not Ready, or the out-of-service taint) it
//! removes that volume's entry, and nothing else.
//!
//! ```text
//!  liveness + Ready + taint ─▶ may_unlist ─┐
//!  volumes the rule releases there, holding no ticket there ─▶ released ─┤
//!  the Node's volumesInUse ─────────────────────────────────────────────┴▶ plan ─▶ JSON patch
//!      (a test of each removed index and its value, then the removes, highest first)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use tessera_api::CSI_DRIVER_NAME;

use super::{Holding, Liveness, Why, releases};

/// The `status.volumesInUse` entry of a CSI volume of Tessera's (the kubelet's unique
/// volume name: `kubernetes.io/csi/<driver>^<volume handle>`).
pub fn entry(handle: &str) -> String {
    format!("kubernetes.io/csi/{CSI_DRIVER_NAME}^{handle}")
}

/// The volume handle of a `status.volumesInUse` entry of Tessera's driver, if it is one.
pub fn handle(entry: &str) -> Option<&str> {
    entry
        .strip_prefix("kubernetes.io/csi/")?
        .strip_prefix(CSI_DRIVER_NAME)?
        .strip_prefix('^')
        .filter(|h| !h.is_empty())
}

/// Whether the controller may take its volumes out of the node's `volumesInUse`: the
/// node is fenced, by the out-of-service taint or by its Lease once the Lease carries
/// the controller's mark (`marked`: written before anything is released; the agent
/// clears it only under a new epoch, which revokes its daemons), and Kubernetes marked
/// it not Ready, or it has the out-of-service taint or the controller's fence taint
/// (`gave_up`; a node fenced by its Lease while its kubelet still reports, untainted,
/// is left to its kubelet).
pub fn may_unlist(liveness: Option<&Liveness>, marked: bool, gave_up: GaveUp) -> bool {
    match liveness {
        Some(Liveness::Fenced {
            why: Why::OutOfService,
            ..
        }) => true,
        Some(Liveness::Fenced {
            why: Why::LeaseExpired,
            ..
        }) => marked && (!gave_up.ready || gave_up.out_of_service || gave_up.fence_tainted),
        _ => false,
    }
}

/// What Kubernetes (or the controller's taint) says of a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GaveUp {
    /// Its Ready condition is True.
    pub ready: bool,
    /// It has the out-of-service taint.
    pub out_of_service: bool,
    /// It has the controller's fence taint.
    pub fence_tainted: bool,
}

/// Of `stand_ins` (one per Tessera volume the node lists in use, as the decision
/// would see a ticket of it on that node), the volumes the controller released there:
/// the rule releases them on that node, and they hold no ticket there any more
/// (`holding`: the volumes with a ticket on the node now).
pub fn released(
    nodes: &BTreeMap<String, Liveness>,
    stand_ins: &[Holding],
    holding: &BTreeSet<String>,
) -> BTreeSet<String> {
    releases(nodes, stand_ins)
        .into_iter()
        .filter(|r| !holding.contains(&r.volume))
        .map(|r| r.volume)
        .collect()
}

/// What to write to one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unlist {
    /// The entries removed, with their index in the list as read.
    pub removed: Vec<(usize, String)>,
    /// The JSON patch of `status.volumesInUse`: a `test` of each removed index and
    /// its value (a list the kubelet changed meanwhile fails it), then the removes from
    /// the highest index down (each leaves the lower ones where they were).
    pub patch: serde_json::Value,
}

/// The entries of `in_use` (the Node's `status.volumesInUse` as read) of the
/// `released` volumes, and the patch that removes exactly those; `None` when there is
/// nothing to remove (nothing is written).
pub fn plan(in_use: &[String], released: &BTreeSet<String>) -> Option<Unlist> {
    let removed: Vec<(usize, String)> = in_use
        .iter()
        .enumerate()
        .filter(|(_, e)| handle(e).is_some_and(|h| released.contains(h)))
        .map(|(i, e)| (i, e.clone()))
        .collect();
    if removed.is_empty() {
        return None;
    }
    let path = |i: &usize| format!("/status/volumesInUse/{i}");
    let tests = removed
        .iter()
        .map(|(i, e)| serde_json::json!({"op": "test", "path": path(i), "value": e}));
    let removes = removed
        .iter()
        .rev()
        .map(|(i, _)| serde_json::json!({"op": "remove", "path": path(i)}));
    let patch = serde_json::Value::Array(tests.chain(removes).collect());
    Some(Unlist { removed, patch })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use tessera_api::NodeFailover;

    use super::*;

    fn fenced(why: Why) -> Liveness {
        Liveness::Fenced {
            since: Duration::from_secs(100),
            why,
        }
    }

    #[test]
    fn entries_of_tesseras_driver_only() {
        assert_eq!(entry("pvc-1"), "kubernetes.io/csi/csi.tessera.io^pvc-1");
        let table = [
            ("kubernetes.io/csi/csi.tessera.io^pvc-1", Some("pvc-1")),
            ("kubernetes.io/csi/csi.tessera.io^", None),
            ("kubernetes.io/csi/csi.tessera.iox^pvc-1", None),
            ("kubernetes.io/csi/other.example.com^pvc-1", None),
            ("kubernetes.io/csi/csi.tessera.io.evil^pvc-1", None),
            ("kubernetes.io/rbd/csi.tessera.io^pvc-1", None),
            ("csi.tessera.io^pvc-1", None),
        ];
        for (e, want) in table {
            assert_eq!(handle(e), want, "{e}");
        }
    }

    #[test]
    fn only_a_fenced_node_kubernetes_gave_up_on() {
        let lease = Some(fenced(Why::LeaseExpired));
        let oos = Some(fenced(Why::OutOfService));
        let zero = Duration::ZERO;
        // (what, liveness, Lease marked, Ready, out-of-service, may)
        let table = [
            (
                "fenced by its Lease, marked, not Ready",
                lease,
                true,
                false,
                false,
                true,
            ),
            (
                "fenced by its Lease, not marked yet",
                lease,
                false,
                false,
                false,
                false,
            ),
            (
                "fenced by its marked Lease, still Ready",
                lease,
                true,
                true,
                false,
                false,
            ),
            ("out-of-service, Ready", oos, false, true, true, true),
            ("out-of-service, not Ready", oos, false, false, true, true),
            (
                "suspect, not Ready",
                Some(Liveness::Suspect { fenced_at: zero }),
                true,
                false,
                false,
                false,
            ),
            (
                "agent gone, Ready",
                Some(Liveness::AgentGone { fenced_at: zero }),
                true,
                true,
                false,
                false,
            ),
            (
                "alive, not Ready",
                Some(Liveness::Alive),
                false,
                false,
                false,
                false,
            ),
            (
                "no Lease, not Ready",
                Some(Liveness::NoLease),
                false,
                false,
                false,
                false,
            ),
            ("unknown node", None, false, false, false, false),
        ];
        for (what, l, marked, ready, oos, want) in table {
            let k8s = GaveUp {
                ready,
                out_of_service: oos,
                fence_tainted: false,
            };
            assert_eq!(may_unlist(l.as_ref(), marked, k8s), want, "{what}");
            // The fence taint stands for not Ready; without a marked Lease it is nothing.
            let tainted = GaveUp {
                fence_tainted: true,
                ..k8s
            };
            let want_tainted = want || (marked && l == lease);
            assert_eq!(
                may_unlist(l.as_ref(), marked, tainted),
                want_tainted,
                "{what}, fence taint"
            );
        }
    }

    #[test]
    fn released_are_the_volumes_the_rule_lets_go_that_hold_no_ticket_there() {
        use NodeFailover::{Fenced, Off};
        let nodes: BTreeMap<String, Liveness> = [
            ("dead".to_string(), fenced(Why::LeaseExpired)),
            ("off".to_string(), fenced(Why::OutOfService)),
            ("alive".to_string(), Liveness::Alive),
        ]
        .into();
        let h = |volume: &str, node: &str, single_writer: bool, failover: NodeFailover| Holding {
            volume: volume.into(),
            ticket: String::new(),
            node: node.into(),
            single_writer,
            failover,
        };
        let stand_ins = [
            h("opted", "dead", true, Fenced),
            h("still-held", "dead", true, Fenced),
            h("not-opted", "dead", true, Off),
            h("rwx", "dead", false, Fenced),
            h("any", "off", false, Off),
            h("on-alive", "alive", true, Fenced),
        ];
        let holding: BTreeSet<String> = ["still-held".to_string()].into();
        let got = released(&nodes, &stand_ins, &holding);
        let want: BTreeSet<String> = ["opted", "any"].map(String::from).into();
        assert_eq!(got, want);
    }

    type Row = (
        &'static str,
        Vec<String>,
        BTreeSet<String>,
        Option<serde_json::Value>,
    );

    #[test]
    fn the_plan_removes_exactly_the_released_entries_each_under_a_test() {
        let list = |es: &[&str]| es.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        let set = |vs: &[&str]| vs.iter().map(|v| v.to_string()).collect::<BTreeSet<_>>();
        let mine = |v: &str| entry(v);
        let other = "kubernetes.io/csi/other.example.com^a";
        // (what, the list as read, the volumes released, the patch)
        let table: Vec<Row> = vec![
            ("nothing listed", vec![], set(&["a"]), None),
            (
                "nothing released",
                list(&[&mine("a"), other]),
                set(&[]),
                None,
            ),
            (
                "released, but not listed: nothing to write",
                list(&[&mine("b"), other]),
                set(&["a"]),
                None,
            ),
            (
                "another driver's entry of the same handle stays",
                list(&[other]),
                set(&["a"]),
                None,
            ),
            (
                "one entry",
                list(&[other, &mine("a"), &mine("b")]),
                set(&["a"]),
                Some(json!([
                    {"op": "test", "path": "/status/volumesInUse/1", "value": mine("a")},
                    {"op": "remove", "path": "/status/volumesInUse/1"},
                ])),
            ),
            (
                "two entries: tested as read, removed highest first",
                list(&[&mine("a"), other, &mine("c"), &mine("b")]),
                set(&["a", "b"]),
                Some(json!([
                    {"op": "test", "path": "/status/volumesInUse/0", "value": mine("a")},
                    {"op": "test", "path": "/status/volumesInUse/3", "value": mine("b")},
                    {"op": "remove", "path": "/status/volumesInUse/3"},
                    {"op": "remove", "path": "/status/volumesInUse/0"},
                ])),
            ),
        ];
        for (what, in_use, released, want) in table {
            let got = plan(&in_use, &released);
            assert_eq!(got.as_ref().map(|u| &u.patch), want.as_ref(), "{what}");
            // Applied to the list as read, the patch leaves every other entry in order.
            if let Some(u) = got {
                let mut doc = json!({"status": {"volumesInUse": in_use.clone()}});
                let p: json_patch::Patch = serde_json::from_value(u.patch).unwrap();
                json_patch::patch(&mut doc, &p).unwrap();
                let kept: Vec<String> = in_use
                    .iter()
                    .filter(|e| !handle(e).is_some_and(|h| released.contains(h)))
                    .cloned()
                    .collect();
                assert_eq!(doc["status"]["volumesInUse"], json!(kept), "{what}");
                // A list changed meanwhile (an entry added in front) fails the tests.
                let shifted: Vec<String> = std::iter::once(other.to_string())
                    .chain(in_use.iter().cloned())
                    .collect();
                let mut moved = json!({"status": {"volumesInUse": shifted}});
                assert!(
                    json_patch::patch(&mut moved, &p).is_err(),
                    "{what}: shifted list"
                );
            }
        }
    }
}
