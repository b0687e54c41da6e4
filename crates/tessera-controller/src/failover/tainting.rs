//! The opt-in fence taint, the I/O: write what [`taint::plan`] decided to the Nodes
//! (a JSON patch of each Node, its resourceVersion tested: a Node changed meanwhile is
//! planned again at the next decision), and say once of each node the share kept
//! from it.
//!
//! ```text
//!  plan.add ─▶ add_patch ─┐
//!  plan.remove ─▶ remove_patch ─┴▶ PATCH nodes/<node> ─▶ the node's taints as written
//!  plan.held ─▶ a warning, once per node while held
//! ```

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube::api::{Api, Patch};
use tracing::{info, warn};

use super::taint::{self, FENCE_TAINT, Plan};
use crate::Context;
use crate::context::merge_params;

/// A node's taints and the version they were read at.
pub(crate) struct NodeTaints {
    pub version: String,
    pub taints: Vec<Taint>,
}

impl NodeTaints {
    pub(crate) fn of(n: &Node) -> NodeTaints {
        NodeTaints {
            version: n.resource_version().unwrap_or_default(),
            taints: n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        }
    }

    /// Whether it carries the controller's fence taint.
    pub(crate) fn fenced(&self) -> bool {
        self.taints.iter().any(|t| t.key == FENCE_TAINT)
    }
}

/// Add and remove the fence taint as `plan` says; `node_taints`: each node's taints,
/// updated with what was written; `held`: the nodes said to be held.
pub(super) async fn apply(
    ctx: &Context,
    plan: &Plan,
    node_taints: &mut BTreeMap<String, NodeTaints>,
    held: &mut BTreeSet<String>,
) {
    for (node, adding) in plan
        .add
        .iter()
        .map(|n| (n, true))
        .chain(plan.remove.iter().map(|n| (n, false)))
    {
        let Some(t) = node_taints.get(node) else {
            continue;
        };
        let patch = if adding {
            Some(taint::add_patch(&t.version, &t.taints))
        } else {
            taint::remove_patch(&t.version, &t.taints)
        };
        let Some(patch) = patch.and_then(|p| serde_json::from_value(p).ok()) else {
            continue;
        };
        let res = Api::<Node>::all(ctx.client.clone())
            .patch(node, &merge_params(), &Patch::<()>::Json(patch))
            .await;
        match res {
            Ok(n) => {
                if adding {
                    warn!(
                        node,
                        taint = taint::FENCE_TAINT,
                        "fenced while Ready: tainted NoSchedule, its tickets may go"
                    );
                } else {
                    info!(
                        node,
                        taint = taint::FENCE_TAINT,
                        "the node's agent renewed: fence taint removed"
                    );
                }
                node_taints.insert(node.clone(), NodeTaints::of(&n));
            }
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 || s.code == 404 => {
                info!(node, code = s.code, message = %s.message, "the fence taint: the Node changed meanwhile");
            }
            Err(e) => warn!(node, adding, error = %e, "writing the fence taint failed"),
        }
    }
    let now: BTreeSet<String> = plan.held.iter().cloned().collect();
    held.retain(|n| now.contains(n));
    for node in &plan.held {
        if held.insert(node.clone()) {
            warn!(
                node,
                taint = taint::FENCE_TAINT,
                "fenced while Ready, but the share of nodes that may carry the fence taint is reached: not tainted, its tickets stay until Kubernetes marks it not Ready"
            );
        }
    }
}
