//! Fenced failover in status (docs/failover.md): the condition `NodeFailover` of a
//! Volume that leaves a fenced node (reason `FailedOver`) or stays on a down one
//! (`StaysOnDownNode`), and the condition `Fenced` of a MountPod on a fenced node.
//! Pure: from what the decision knows (each node's [`Liveness`], the tickets released
//! or stranded) and the object's conditions before, to its conditions after.
//!
//! ```text
//!  nodes' liveness, released now / remembered, stranded, old conditions, attached nodes
//!      ─▶ volume_note ─▶ FailedOver(node) │ StaysOnDownNode(node) │ none
//!      ─▶ volume_conditions ─▶ the Volume's conditions, NodeFailover replaced or dropped
//!  the MountPod's node fenced? (why), selfFence ─▶ mountpod_conditions ─▶ Fenced or dropped
//! ```
//!
//! Both are True while they hold and absent otherwise, never False: a volume nobody
//! failed over has the conditions it always had, and neither type is one kstatus or
//! the Argo CD health script reads (`Ready`, `Reconciling`, `Stalled`), so neither
//! makes a healthy object look unhealthy. The Volume's `Ready`, `Reconciling` and
//! `Stalled` stay the attachment controller's, which carries `NodeFailover` over
//! unchanged. Each keeps its lastTransitionTime while its reason stays (the MountPod's
//! says since when the node is fenced), and its message is made of the node and the
//! reason only, so an unchanged world yields equal conditions and nothing is written.
//!
//! `FailedOver` holds from the release until the volume is attached on another node or
//! the node is fenced no more. The node comes from the release, from the loop's memory,
//! or, after a restart of the controller, from the condition itself (its message
//! starts with `node <name> `): the condition is its own record. A controller that
//! just started has not waited long enough to find a down node fenced again: until
//! it has seen a node's Lease renewed, what its conditions say of that node stays as
//! written (`report`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use tessera_api::{CONDITION_FENCED, CONDITION_NODE_FAILOVER};

use super::{Liveness, NodeFailover, OUT_OF_SERVICE_TAINT, Why};
use crate::attachment::status::condition;

/// Reason of `NodeFailover`: the volume's ticket on a fenced node was released.
pub const REASON_FAILED_OVER: &str = "FailedOver";
/// Reason of `NodeFailover`: a down node holds the volume, which did not opt in.
pub const REASON_STAYS_ON_DOWN_NODE: &str = "StaysOnDownNode";
/// Reason of `Fenced`: no renewal of the node's Lease seen for fenceAfter + margin.
pub const REASON_LEASE_EXPIRED: &str = "LeaseExpired";
/// Reason of `Fenced`: the node has the out-of-service taint.
pub const REASON_OUT_OF_SERVICE: &str = "OutOfService";

/// What fenced failover says of one Volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeNote {
    /// Its ticket on `node`, fenced for `why`, was released: it moves.
    FailedOver { node: String, why: Why },
    /// `node` is down and holds it; it did not opt in: it stays.
    StaysOnDownNode { node: String },
}

/// The node a `NodeFailover` condition of reason `FailedOver` names (its message
/// starts with `node <name> `).
pub fn failed_over_node(conditions: &[Condition]) -> Option<&str> {
    named_node(conditions).filter(|_| {
        conditions
            .iter()
            .any(|c| c.type_ == CONDITION_NODE_FAILOVER && c.reason == REASON_FAILED_OVER)
    })
}

/// The node the `NodeFailover` condition names, whatever its reason.
pub fn named_node(conditions: &[Condition]) -> Option<&str> {
    let c = conditions
        .iter()
        .find(|c| c.type_ == CONDITION_NODE_FAILOVER)?;
    c.message
        .strip_prefix("node ")?
        .split_whitespace()
        .next()
        .filter(|n| !n.is_empty())
}

/// What to say of a Volume: `released` is the node whose ticket of it was released
/// (now, or remembered since), `stays_on` a down node that holds it without the
/// opt-in, `old` its conditions, `attached` its attached nodes. A failover holds while
/// its node is fenced and the volume is attached nowhere else.
pub fn volume_note(
    nodes: &BTreeMap<String, Liveness>,
    released: Option<&str>,
    stays_on: Option<&str>,
    old: &[Condition],
    attached: &[String],
) -> Option<VolumeNote> {
    let moving = released.or_else(|| failed_over_node(old)).and_then(|node| {
        let Some(Liveness::Fenced { why, .. }) = nodes.get(node) else {
            return None;
        };
        let elsewhere = attached.iter().any(|n| n != node);
        (!elsewhere).then(|| VolumeNote::FailedOver {
            node: node.to_owned(),
            why: *why,
        })
    });
    moving.or_else(|| {
        stays_on.map(|node| VolumeNote::StaysOnDownNode {
            node: node.to_owned(),
        })
    })
}

/// Why a node is fenced, in words.
fn fenced_because(why: Why) -> String {
    match why {
        Why::LeaseExpired => {
            "no renewal of its liveness Lease for fenceAfter + margin, and the Node is not Ready"
                .into()
        }
        Why::OutOfService => format!("the {OUT_OF_SERVICE_TAINT} taint"),
    }
}

/// `old` with its `NodeFailover` condition as `note` says (dropped when none), for a
/// Volume at `generation`.
pub fn volume_conditions(
    old: &[Condition],
    note: Option<&VolumeNote>,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = old
        .iter()
        .filter(|c| c.type_ != CONDITION_NODE_FAILOVER)
        .cloned()
        .collect();
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(old, type_, ok, reason, message, generation, now)
    };
    match note {
        None => {}
        Some(VolumeNote::FailedOver { node, why }) => out.push(cond(
            CONDITION_NODE_FAILOVER,
            true,
            REASON_FAILED_OVER,
            format!(
                "node {node} is fenced ({}): its ticket of this volume was released; the volume attaches where its next ticket asks",
                fenced_because(*why)
            ),
        )),
        Some(VolumeNote::StaysOnDownNode { node }) => out.push(cond(
            CONDITION_NODE_FAILOVER,
            true,
            REASON_STAYS_ON_DOWN_NODE,
            format!(
                "node {node} is down ({}) and holds this volume; its nodeFailover is not {:?} (or its mount daemon there does not fence itself), so it stays there until the node is back or has the {OUT_OF_SERVICE_TAINT} taint",
                fenced_because(Why::LeaseExpired),
                NodeFailover::Fenced
            ),
        )),
    }
    out
}

/// `old` with the `Fenced` condition of a MountPod on `node`: True when the node is
/// fenced (`fenced`: why), dropped otherwise; `self_fence`: its daemon fences itself.
pub fn mountpod_conditions(
    old: &[Condition],
    node: &str,
    fenced: Option<Why>,
    self_fence: bool,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = old
        .iter()
        .filter(|c| c.type_ != CONDITION_FENCED)
        .cloned()
        .collect();
    let Some(why) = fenced else {
        return out;
    };
    let daemon = if self_fence {
        "its mount daemon fences itself: its writes wait, and fail with EIO once the node comes back revoked"
    } else {
        "its mount daemon does not fence itself"
    };
    let message = format!(
        "node {node} is fenced since this condition's lastTransitionTime ({}); {daemon}. Written by the controller, not the node's agent (which may be unable to)",
        fenced_because(why)
    );
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(old, type_, ok, reason, message, generation, now)
    };
    out.push(match why {
        Why::LeaseExpired => cond(CONDITION_FENCED, true, REASON_LEASE_EXPIRED, message),
        Why::OutOfService => cond(CONDITION_FENCED, true, REASON_OUT_OF_SERVICE, message),
    });
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn t(s: i64) -> Time {
        Time(jiff::Timestamp::from_second(1_800_000_000 + s).unwrap())
    }

    fn fenced(why: Why) -> Liveness {
        Liveness::Fenced {
            since: Duration::from_secs(5),
            why,
        }
    }

    fn ready() -> Condition {
        Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Attached".into(),
            message: "attached to a".into(),
            last_transition_time: t(0),
            observed_generation: Some(1),
        }
    }

    fn nodes(list: &[(&str, Liveness)]) -> BTreeMap<String, Liveness> {
        list.iter().map(|(n, l)| (n.to_string(), *l)).collect()
    }

    #[test]
    fn what_a_volume_says() {
        let lease = fenced(Why::LeaseExpired);
        let taint = fenced(Why::OutOfService);
        let gone = |node: &str, why| VolumeNote::FailedOver {
            node: node.into(),
            why,
        };
        let stays = |node: &str| VolumeNote::StaysOnDownNode { node: node.into() };
        let failed_over_a =
            volume_conditions(&[], Some(&gone("a", Why::LeaseExpired)), Some(1), &t(0));
        let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // (nodes, released, stays on, old conditions, attached nodes, want)
        type Case<'a> = (
            BTreeMap<String, Liveness>,
            Option<&'a str>,
            Option<&'a str>,
            &'a [Condition],
            Vec<String>,
            Option<VolumeNote>,
        );
        let cases: Vec<Case> = vec![
            // Nothing fenced, nothing said.
            (
                nodes(&[("a", Liveness::Alive)]),
                None,
                None,
                &[],
                vec![],
                None,
            ),
            // Released from a fenced node: FailedOver, whatever made it fenced.
            (
                nodes(&[("a", lease)]),
                Some("a"),
                None,
                &[],
                strs(&["a"]),
                Some(gone("a", Why::LeaseExpired)),
            ),
            (
                nodes(&[("a", taint)]),
                Some("a"),
                None,
                &[],
                vec![],
                Some(gone("a", Why::OutOfService)),
            ),
            // The condition is its own record (a restarted controller): kept while the
            // node is fenced and the volume attached nowhere else...
            (
                nodes(&[("a", lease)]),
                None,
                None,
                &failed_over_a,
                vec![],
                Some(gone("a", Why::LeaseExpired)),
            ),
            // ...cleared once attached elsewhere...
            (
                nodes(&[("a", lease), ("b", Liveness::Alive)]),
                None,
                None,
                &failed_over_a,
                strs(&["b"]),
                None,
            ),
            // ...or once the node is back, or its Lease gone.
            (
                nodes(&[("a", Liveness::Alive)]),
                Some("a"),
                None,
                &failed_over_a,
                vec![],
                None,
            ),
            (nodes(&[]), None, None, &failed_over_a, vec![], None),
            // A volume left on a down node says so.
            (
                nodes(&[("a", lease)]),
                None,
                Some("a"),
                &[],
                strs(&["a"]),
                Some(stays("a")),
            ),
            // A failover in progress is what matters most.
            (
                nodes(&[("a", lease), ("c", lease)]),
                Some("a"),
                Some("c"),
                &[],
                vec![],
                Some(gone("a", Why::LeaseExpired)),
            ),
        ];
        for (i, (nodes, released, stays_on, old, attached, want)) in cases.iter().enumerate() {
            assert_eq!(
                volume_note(nodes, *released, *stays_on, old, attached),
                *want,
                "case {i}"
            );
        }
    }

    #[test]
    fn the_volume_condition_is_added_kept_and_dropped_without_touching_the_others() {
        let note = VolumeNote::StaysOnDownNode { node: "a".into() };
        let old = vec![ready()];
        let first = volume_conditions(&old, Some(&note), Some(3), &t(10));
        assert_eq!(first.len(), 2);
        assert_eq!(first[0], ready(), "the others stay as they were");
        let c = &first[1];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("NodeFailover", "True", "StaysOnDownNode")
        );
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(c.last_transition_time, t(10));
        assert!(c.message.starts_with("node a "), "{}", c.message);
        // Unchanged world, later: equal, so nothing is written.
        assert_eq!(
            volume_conditions(&first, Some(&note), Some(3), &t(20)),
            first
        );
        // Another reason: a new transition.
        let gone = VolumeNote::FailedOver {
            node: "a".into(),
            why: Why::LeaseExpired,
        };
        let moved = volume_conditions(&first, Some(&gone), Some(3), &t(30));
        assert_eq!(moved[1].reason, "FailedOver");
        assert_eq!(moved[1].last_transition_time, t(30));
        assert_eq!(failed_over_node(&moved), Some("a"));
        assert_eq!(
            failed_over_node(&first),
            None,
            "only FailedOver names a node to keep"
        );
        assert_eq!(named_node(&first), Some("a"));
        assert_eq!(named_node(&old), None);
        // Cleared: back to exactly the conditions before.
        assert_eq!(volume_conditions(&moved, None, Some(3), &t(40)), old);
        assert_eq!(volume_conditions(&[], None, Some(3), &t(40)), vec![]);
    }

    #[test]
    fn a_mountpod_on_a_fenced_node_says_since_when() {
        let old = vec![ready()];
        let on = mountpod_conditions(&old, "a", Some(Why::LeaseExpired), true, Some(2), &t(10));
        assert_eq!(on[0], ready());
        let c = &on[1];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Fenced", "True", "LeaseExpired")
        );
        assert_eq!(c.last_transition_time, t(10), "since when");
        assert!(c.message.contains("node a"));
        assert!(c.message.contains("fences itself"));
        // Still fenced later: the same condition, its time kept.
        assert_eq!(
            mountpod_conditions(&on, "a", Some(Why::LeaseExpired), true, Some(2), &t(50)),
            on
        );
        let taint = mountpod_conditions(&on, "a", Some(Why::OutOfService), false, Some(2), &t(60));
        assert_eq!(taint[1].reason, "OutOfService");
        assert_eq!(taint[1].last_transition_time, t(60));
        assert!(taint[1].message.contains("does not fence itself"));
        // The node is back: dropped, the rest untouched.
        assert_eq!(
            mountpod_conditions(&on, "a", None, true, Some(2), &t(70)),
            old
        );
        assert_eq!(
            mountpod_conditions(&[], "a", None, true, Some(2), &t(70)),
            vec![]
        );
    }
}
