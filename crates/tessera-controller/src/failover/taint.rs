//! The opt-in fence taint (`--fence-taint`, docs/failover.md), the pure part: a node
//! whose liveness Lease went unrenewed for fenceAfter + margin while its kubelet still
//! reports it Ready gets `tessera.io/fenced:NoSchedule`, so the scheduler puts no
//! replacement there and the controller may release the node's tickets at its fence
//! time instead of after Kubernetes' node-monitor grace period; the taint goes once
//! the node's agent took its Lease back. A safety valve: never more than a share of
//! the cluster's nodes carry it at once (a node-wide taint once made a whole cluster
//! unschedulable, piraeus-ha-controller's `--disable-node-taints`).
//!
//! ```text
//!  each node: liveness (taint not counted), Ready, carries the taint?
//!      ─▶ plan ─▶ add (past the wait, Ready, within the share) │ remove (renewed) │ held (beyond the share)
//!  a node's taints + resourceVersion ─▶ add_patch / remove_patch (JSON patch, resourceVersion tested)
//! ```

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value, json};

use super::{Liveness, Why};

/// The taint's key; its effect is `NoSchedule`.
pub const FENCE_TAINT: &str = "tessera.io/fenced";

/// The taint the controller puts on a node.
pub fn fence_taint() -> Taint {
    Taint {
        key: FENCE_TAINT.into(),
        effect: "NoSchedule".into(),
        value: Some("true".into()),
        time_added: None,
    }
}

/// What the plan knows of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Its liveness as if it carried no fence taint.
    pub liveness: Liveness,
    /// Its kubelet reports it Ready.
    pub ready: bool,
    /// It carries the fence taint now.
    pub carries: bool,
    /// It holds a ticket its Lease fence would release (a single-writer volume that
    /// opted in): a node with nothing to hand on is not tainted.
    pub holds: bool,
}

/// What to do with the taint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nodes to taint.
    pub add: Vec<String>,
    /// Nodes to untaint.
    pub remove: Vec<String>,
    /// Nodes that would be tainted but for the share.
    pub held: Vec<String>,
}

/// How many nodes of `total` may carry the taint at once: `percent` of them, rounded
/// down, at least one where there are two nodes or more, none on a single node (where
/// nothing could go elsewhere).
pub fn allowed(total: usize, percent: u8) -> usize {
    if total < 2 {
        return 0;
    }
    (total * usize::from(percent.min(100)) / 100).max(1)
}

/// Whether a node past its wait would be tainted: its Lease went unrenewed for
/// fenceAfter + margin, its kubelet still reports it Ready, and it holds a ticket
/// that would move.
fn wants(s: &Seen) -> bool {
    s.holds
        && match s.liveness {
            Liveness::AgentGone { .. } => true,
            Liveness::Fenced {
                why: Why::LeaseExpired,
                ..
            } => s.ready,
            _ => false,
        }
}

/// Whether a node carrying the taint should lose it: its agent renewed its Lease (not
/// marked any more: it took the Lease back under a new epoch), or it has none.
fn done(s: &Seen) -> bool {
    matches!(
        s.liveness,
        Liveness::Alive | Liveness::Suspect { .. } | Liveness::NoLease
    )
}

/// The taints to add and remove, within `percent` of the nodes (`nodes`: every
/// node of the cluster); candidates by name, so the same ones win each time.
pub fn plan(nodes: &BTreeMap<String, Seen>, percent: u8) -> Plan {
    let mut out = Plan::default();
    let mut carrying = 0;
    for (name, s) in nodes {
        if s.carries && done(s) {
            out.remove.push(name.clone());
        } else if s.carries {
            carrying += 1;
        }
    }
    let room = allowed(nodes.len(), percent).saturating_sub(carrying);
    let wanted = nodes
        .iter()
        .filter(|(_, s)| !s.carries && wants(s))
        .map(|(n, _)| n.clone());
    for (i, name) in wanted.enumerate() {
        if i < room {
            out.add.push(name);
        } else {
            out.held.push(name);
        }
    }
    out
}

/// The JSON patch that adds the fence taint to a Node whose taints are `taints` at
/// `resource_version` (a Node changed meanwhile fails it).
pub fn add_patch(resource_version: &str, taints: &[Taint]) -> Value {
    let rv = json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version});
    let add = if taints.is_empty() {
        json!({"op": "add", "path": "/spec/taints", "value": [fence_taint()]})
    } else {
        json!({"op": "add", "path": "/spec/taints/-", "value": fence_taint()})
    };
    json!([rv, add])
}

/// The JSON patch that removes the fence taint from a Node whose taints are `taints`
/// at `resource_version`; `None` when it carries none.
pub fn remove_patch(resource_version: &str, taints: &[Taint]) -> Option<Value> {
    let i = taints.iter().position(|t| t.key == FENCE_TAINT)?;
    let path = format!("/spec/taints/{i}");
    Some(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "test", "path": path, "value": taints[i]},
        {"op": "remove", "path": path},
    ]))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn seen(liveness: Liveness, ready: bool, carries: bool) -> Seen {
        Seen {
            liveness,
            ready,
            carries,
            holds: true,
        }
    }

    const Z: Duration = Duration::ZERO;

    #[test]
    fn the_share_is_rounded_down_at_least_one_of_two() {
        let table = [
            (0, 34, 0),
            (1, 100, 0),
            (2, 34, 1),
            (2, 50, 1),
            (3, 34, 1),
            (3, 67, 2),
            (10, 34, 3),
            (10, 0, 1),
            (10, 200, 10),
        ];
        for (total, percent, want) in table {
            assert_eq!(allowed(total, percent), want, "{total} nodes, {percent}%");
        }
    }

    #[test]
    fn which_nodes_gain_and_lose_the_taint() {
        let gone = Liveness::AgentGone { fenced_at: Z };
        let lease = Liveness::Fenced {
            since: Z,
            why: Why::LeaseExpired,
        };
        let oos = Liveness::Fenced {
            since: Z,
            why: Why::OutOfService,
        };
        let suspect = Liveness::Suspect { fenced_at: Z };
        // (what, nodes, percent, add, remove, held)
        type Row = (
            &'static str,
            Vec<(&'static str, Seen)>,
            u8,
            Vec<&'static str>,
            Vec<&'static str>,
            Vec<&'static str>,
        );
        let alive = seen(Liveness::Alive, true, false);
        let table: Vec<Row> = vec![
            (
                "past the wait and Ready: tainted",
                vec![("a", seen(gone, true, false)), ("b", alive)],
                50,
                vec!["a"],
                vec![],
                vec![],
            ),
            (
                "marked Lease, still Ready (a restarted controller): tainted",
                vec![("a", seen(lease, true, false)), ("b", alive)],
                50,
                vec!["a"],
                vec![],
                vec![],
            ),
            (
                "not Ready: Kubernetes' own taints keep Pods off, nothing added",
                vec![("a", seen(lease, false, false)), ("b", alive)],
                50,
                vec![],
                vec![],
                vec![],
            ),
            (
                "suspect, out-of-service, no Lease: not tainted",
                vec![
                    ("a", seen(suspect, true, false)),
                    ("b", seen(oos, true, false)),
                    ("c", seen(Liveness::NoLease, true, false)),
                    ("d", alive),
                ],
                100,
                vec![],
                vec![],
                vec![],
            ),
            (
                "carrying and still past the wait: kept",
                vec![("a", seen(lease, true, true)), ("b", alive)],
                50,
                vec![],
                vec![],
                vec![],
            ),
            (
                "renewed (the Lease taken back), suspect or Lease gone: removed",
                vec![
                    ("a", seen(Liveness::Alive, true, true)),
                    ("b", seen(suspect, true, true)),
                    ("c", seen(Liveness::NoLease, false, true)),
                    ("d", alive),
                ],
                50,
                vec![],
                vec!["a", "b", "c"],
                vec![],
            ),
            (
                "the valve: one of three at 34 %, by name",
                vec![
                    ("a", seen(gone, true, false)),
                    ("b", seen(gone, true, false)),
                    ("c", alive),
                ],
                34,
                vec!["a"],
                vec![],
                vec!["b"],
            ),
            (
                "the valve counts the nodes carrying it already",
                vec![
                    ("a", seen(lease, true, true)),
                    ("b", seen(gone, true, false)),
                    ("c", alive),
                ],
                34,
                vec![],
                vec![],
                vec!["b"],
            ),
            (
                "a node losing it makes room",
                vec![
                    ("a", seen(Liveness::Alive, true, true)),
                    ("b", seen(gone, true, false)),
                    ("c", alive),
                ],
                34,
                vec!["b"],
                vec!["a"],
                vec![],
            ),
            (
                "nothing to hand on: not tainted",
                vec![
                    (
                        "a",
                        Seen {
                            holds: false,
                            ..seen(gone, true, false)
                        },
                    ),
                    ("b", alive),
                ],
                100,
                vec![],
                vec![],
                vec![],
            ),
            (
                "a single node is never tainted",
                vec![("a", seen(gone, true, false))],
                100,
                vec![],
                vec![],
                vec!["a"],
            ),
        ];
        let names = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
        for (what, nodes, percent, add, remove, held) in table {
            let nodes: BTreeMap<String, Seen> =
                nodes.into_iter().map(|(n, s)| (n.to_string(), s)).collect();
            let want = Plan {
                add: names(add),
                remove: names(remove),
                held: names(held),
            };
            assert_eq!(plan(&nodes, percent), want, "{what}");
        }
    }

    #[test]
    fn the_patches_test_the_version_and_touch_only_the_fence_taint() {
        let other = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        };
        let node = |taints: Vec<Taint>| json!({"metadata": {"name": "a", "resourceVersion": "7"}, "spec": {"taints": taints}});
        let apply = |doc: &Value, p: Value| {
            let mut doc = doc.clone();
            let p: json_patch::Patch = serde_json::from_value(p).unwrap();
            json_patch::patch(&mut doc, &p).map(|_| doc)
        };
        // Added to none, to some; removed from among others.
        let bare = json!({"metadata": {"name": "a", "resourceVersion": "7"}, "spec": {}});
        let added = apply(&bare, add_patch("7", &[])).unwrap();
        assert_eq!(added["spec"]["taints"], json!([fence_taint()]));
        let added = apply(
            &node(vec![other.clone()]),
            add_patch("7", std::slice::from_ref(&other)),
        )
        .unwrap();
        assert_eq!(
            added["spec"]["taints"],
            json!([other.clone(), fence_taint()])
        );
        let both = vec![fence_taint(), other.clone()];
        let removed = apply(&node(both.clone()), remove_patch("7", &both).unwrap()).unwrap();
        assert_eq!(removed["spec"]["taints"], json!([other.clone()]));
        assert_eq!(remove_patch("7", std::slice::from_ref(&other)), None);
        // A Node changed meanwhile fails either.
        assert!(
            apply(
                &node(vec![other.clone()]),
                add_patch("6", std::slice::from_ref(&other))
            )
            .is_err()
        );
        assert!(apply(&node(both.clone()), remove_patch("6", &both).unwrap()).is_err());
    }
}
