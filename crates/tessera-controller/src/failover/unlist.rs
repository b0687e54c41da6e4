//! Tessera's released volumes out of a fenced node's `status.volumesInUse`, the I/O:
//! every decision, for each node that lists a volume of Tessera's in use and that
//! [`in_use::may_unlist`] allows, gather what [`in_use::plan`] needs from the caches
//! and write its JSON patch to `nodes/status`.
//!
//! ```text
//!  Node watch ─▶ volumesInUse of the nodes listing a csi.tessera.io entry
//!  per such node, fenced and not Ready (or out-of-service):
//!      its entries' Volumes as the decision sees them there (stand-ins) + the tickets
//!      on the node now ─▶ in_use::released ─▶ in_use::plan
//!          └─ Some: JSON patch of nodes/status (422: the list changed, planned again next time)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch};
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use tessera_api::NodeFailover;

use super::in_use::{GaveUp, handle, may_unlist, plan, released};
use super::{Holding, Liveness};
use crate::Context;
use crate::context::merge_params;

/// What the Node watch says, and what this decision released.
pub(super) struct Look<'a> {
    pub nodes: &'a BTreeMap<String, Liveness>,
    /// The nodes whose kubelet reports them Ready.
    pub ready: &'a BTreeSet<String>,
    /// The nodes with the out-of-service taint.
    pub tainted: &'a BTreeSet<String>,
    /// The nodes with the controller's fence taint (`--fence-taint`).
    pub fence_tainted: &'a BTreeSet<String>,
    /// The nodes whose liveness Lease carries the controller's fenced mark.
    pub marked: &'a BTreeSet<String>,
    /// (node, volume) of the tickets this decision released: gone, whatever the cache
    /// says yet.
    pub just: &'a BTreeSet<(String, String)>,
}

/// Remove the released volumes' entries from the `volumesInUse` of the nodes that
/// may lose them; `in_use`: each node's list as last seen, updated with what was
/// written; `done`: the entries removed from each node while it stays fenced, not
/// removed again (a kubelet alive after all reports its own truth, unfought).
pub(super) async fn unlist(
    ctx: &Context,
    look: &Look<'_>,
    in_use: &mut BTreeMap<String, Vec<String>>,
    done: &mut BTreeMap<String, BTreeSet<String>>,
) {
    done.retain(|n, _| matches!(look.nodes.get(n), Some(Liveness::Fenced { .. })));
    for (node, list) in in_use.iter_mut() {
        let gave_up = GaveUp {
            ready: look.ready.contains(node),
            out_of_service: look.tainted.contains(node),
            fence_tainted: look.fence_tainted.contains(node),
        };
        let marked = look.marked.contains(node);
        if !may_unlist(look.nodes.get(node), marked, gave_up) {
            continue;
        }
        let before = done.get(node);
        let handles: BTreeSet<&str> = list.iter().filter_map(|e| handle(e)).collect();
        let stand_ins: Vec<Holding> = handles
            .iter()
            .filter_map(|h| stand_in(ctx, h, node))
            .collect();
        let holding: BTreeSet<String> = handles
            .iter()
            .filter(|h| !look.just.contains(&(node.clone(), h.to_string())))
            .filter(|h| holds(ctx, h, node))
            .map(|h| h.to_string())
            .collect();
        let mut gone = released(look.nodes, &stand_ins, &holding);
        gone.retain(|v| !before.is_some_and(|d| d.contains(v)));
        let Some(u) = plan(list, &gone) else {
            continue;
        };
        let patch = match serde_json::from_value(u.patch) {
            Ok(p) => p,
            Err(e) => {
                warn!(node, error = %e, "the volumesInUse patch is not a JSON patch");
                continue;
            }
        };
        let res = Api::<Node>::all(ctx.client.clone())
            .patch_status(node, &merge_params(), &Patch::<()>::Json(patch))
            .await;
        let removed: Vec<&str> = u.removed.iter().map(|(_, e)| e.as_str()).collect();
        match res {
            Ok(n) => {
                warn!(node, removed = ?removed, "fenced node: Tessera's released volumes removed from its volumesInUse");
                let d = done.entry(node.clone()).or_default();
                d.extend(
                    u.removed
                        .iter()
                        .filter_map(|(_, e)| handle(e))
                        .map(str::to_owned),
                );
                *list = n.status.and_then(|s| s.volumes_in_use).unwrap_or_default();
            }
            Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy") => {
                warn!(node, removed = ?removed, message = %s.message, "removing volumes from a fenced node's volumesInUse: refused by admission")
            }
            // A test failed (the kubelet or another writer changed the list) or the
            // Node is gone: planned again on what the watch brings.
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 || s.code == 404 => {
                info!(node, code = s.code, message = %s.message, "removing volumes from a fenced node's volumesInUse: the Node changed meanwhile")
            }
            Err(e) => {
                warn!(node, removed = ?removed, error = %e, "removing volumes from a fenced node's volumesInUse failed")
            }
        }
    }
}

/// Whether `volume` has a ticket on `node` in the cache.
fn holds(ctx: &Context, volume: &str, node: &str) -> bool {
    ctx.caches
        .attachments
        .get(&ObjectRef::new(volume))
        .is_some_and(|va| {
            va.spec
                .attachment_tickets
                .values()
                .any(|t| t.node_id == node)
        })
}

/// A ticket of `volume` on `node` as the decision would see it (as `holdings` builds
/// them): none for a Volume not in the cache.
fn stand_in(ctx: &Context, volume: &str, node: &str) -> Option<Holding> {
    let v = ctx.caches.volumes.get(&ObjectRef::new(volume))?;
    let fences = ctx
        .caches
        .mountpods_of(volume)
        .iter()
        .filter(|mp| mp.spec.node_name == node)
        .all(|mp| mp.spec.self_fence);
    Some(Holding {
        volume: volume.to_owned(),
        ticket: String::new(),
        node: node.to_owned(),
        single_writer: !v.spec.access_mode.is_multi_node(),
        failover: if fences {
            v.spec.node_failover.unwrap_or_default()
        } else {
            NodeFailover::Off
        },
    })
}
