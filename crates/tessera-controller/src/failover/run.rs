//! Fenced failover, the controller's I/O: watch the nodes' liveness Leases in
//! Tessera's namespace, note on the controller's own monotonic clock when each one
//! changes (into the process's [`Witness`], which a standby fed before this replica
//! led), and every `interval` apply the pure decision: for a fenced node, mark
//! its Lease (resourceVersion precondition) and only then release its tickets of
//! opted-in single-writer volumes (Event `FailedOver`). A node with the
//! `node.kubernetes.io/out-of-service` taint gives up every ticket at once.
//!
//! ```text
//!  Node watch ─▶ the nodes with the out-of-service taint
//!  Lease watch ─▶ Witness::observe(node, resourceVersion) ─▶ the Observer
//!  every interval (`--fence-taint`: first the fence taint on nodes past the wait but
//!      Ready, off nodes renewed, within a share: `tainting`)
//!  every interval: liveness per node ─▶ releases(VolumeAttachments, Volumes)
//!      └─ per fenced node: Lease + tessera.io/fenced (replace; 409: it changed, wait again)
//!           └─ per ticket (a node fenced by its Lease, and not Ready): the Pods bound to
//!              the volume there deleted at once (Event DeletedOnFencedNode), a
//!              csi-attacher ticket's storage.k8s.io VolumeAttachment deleted; then the
//!              ticket: JSON patch test-and-remove, Event FailedOver on the Volume
//!  a fenced node's MountPods of those volumes, once deleted: the dead agent's
//!      finalizer dropped (the agent, back, tears the orphaned mount down)
//!  per fenced node not Ready (or out-of-service): the released volumes' entries
//!      removed from its status.volumesInUse (`unlist`: JSON patch, a test per index)
//!  then, once both watches have listed: the conditions NodeFailover (Volumes) and
//!      Fenced (MountPods) written where they change (`report`)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVolumeAttachment;
use kube::api::{Api, DeleteParams, Patch, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use tessera_api::{
    ANNOTATION_FENCED, AttacherType, MOUNT_FINALIZER, MountPod, NodeFailover, VolumeAttachment,
};
use tessera_runtime::metrics::failover::WhyLabels;

use super::tainting::NodeTaints;
use super::{
    Holding, Liveness, NodeView, OUT_OF_SERVICE_TAINT, Observer, Release, Step, Timing, liveness,
    releases, stranded, witness::Witness,
};
use crate::Context;
use crate::context::merge_params;
use crate::echoes::Echoes;
use crate::events::{publish_objects, publish_tickets};

/// Watch the Leases of `namespace` and release fenced nodes' tickets until dropped;
/// `echoes` are the attachment controller's (the conditions written here trigger no
/// reconcile of it); `witness`: what this process saw of the Leases so far;
/// `fence_taint`: the share of nodes (percent) that may carry the fence taint, when
/// the controller taints at all.
pub async fn run(
    ctx: Arc<Context>,
    echoes: Arc<Echoes>,
    witness: Arc<Witness>,
    namespace: String,
    margin: Duration,
    interval: Duration,
    fence_taint: Option<u8>,
) {
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut seen = Seen {
        observer: witness.observer(),
        leases: BTreeMap::new(),
        told: BTreeSet::new(),
        released: BTreeMap::new(),
        listed: Listed::default(),
        carrying: true,
        in_use: BTreeMap::new(),
        unlisted: BTreeMap::new(),
        node_taints: BTreeMap::new(),
        valve_held: BTreeSet::new(),
        fence_taint,
    };
    let mut events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut tainted: BTreeSet<String> = BTreeSet::new();
    let mut ready: BTreeSet<String> = BTreeSet::new();
    let mut nodes = watcher(
        Api::<Node>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!(namespace = %namespace, margin = ?margin, "fenced failover: watching the nodes' liveness Leases");
    loop {
        tokio::select! {
            ev = events.next() => {
                match ev {
                    Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l))) => {
                        if let Some(node) = witness.saw(&l) {
                            seen.leases.insert(node, l);
                        }
                    }
                    Some(Ok(watcher::Event::Delete(l))) => {
                        if let Some(node) = witness.saw_deleted(&l) {
                            seen.leases.remove(&node);
                        }
                    }
                    Some(Ok(watcher::Event::InitDone)) => seen.listed.leases = true,
                    Some(Ok(watcher::Event::Init)) => {}
                    Some(Err(e)) => warn!(error = %e, "watching the liveness Leases"),
                    None => return,
                }
            }
            ev = nodes.next() => match ev {
                Some(Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))) => {
                    for (set, has) in [(&mut tainted, out_of_service(&n)), (&mut ready, kube_ready(&n))] {
                        if has {
                            set.insert(n.name_any());
                        } else {
                            set.remove(&n.name_any());
                        }
                    }
                    match tessera_in_use(&n) {
                        Some(list) => seen.in_use.insert(n.name_any(), list),
                        None => seen.in_use.remove(&n.name_any()),
                    };
                    seen.node_taints.insert(n.name_any(), NodeTaints::of(&n));
                }
                Some(Ok(watcher::Event::Delete(n))) => {
                    tainted.remove(&n.name_any());
                    ready.remove(&n.name_any());
                    seen.in_use.remove(&n.name_any());
                    seen.node_taints.remove(&n.name_any());
                }
                Some(Ok(watcher::Event::InitDone)) => seen.listed.nodes = true,
                Some(Ok(watcher::Event::Init)) => {}
                Some(Err(e)) => warn!(error = %e, "watching the Nodes' taints"),
                None => return,
            },
            _ = tick.tick() => {
                seen.observer = witness.observer();
                let now = witness.now();
                let nodes = Nodes { tainted: &tainted, ready: &ready };
                act(&ctx, &echoes, &api, &mut seen, nodes, margin, now).await;
            }
        }
    }
}

/// Whether the administrator said the node is shut down.
fn out_of_service(n: &Node) -> bool {
    let taints = n.spec.as_ref().and_then(|s| s.taints.as_deref());
    taints
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == OUT_OF_SERVICE_TAINT)
}

/// Whether the Node's kubelet reports it Ready.
fn kube_ready(n: &Node) -> bool {
    let conditions = n.status.as_ref().and_then(|s| s.conditions.as_deref());
    conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The Node's `status.volumesInUse` when it lists a volume of Tessera's.
fn tessera_in_use(n: &Node) -> Option<Vec<String>> {
    let list = n.status.as_ref()?.volumes_in_use.as_ref()?;
    list.iter()
        .any(|e| super::in_use::handle(e).is_some())
        .then(|| list.clone())
}

/// What the Node watch says: which nodes have the out-of-service taint, which are
/// Ready.
#[derive(Clone, Copy)]
struct Nodes<'a> {
    tainted: &'a BTreeSet<String>,
    ready: &'a BTreeSet<String>,
}

fn marked(l: &Lease) -> bool {
    l.annotations().contains_key(ANNOTATION_FENCED)
}

/// The daemons' fenceAfter as the node's agent wrote it (leaseDurationSeconds).
fn fence_after(l: &Lease) -> Duration {
    let secs = l.spec.as_ref().and_then(|s| s.lease_duration_seconds);
    Duration::from_secs(u64::try_from(secs.unwrap_or(0)).unwrap_or(0).max(1))
}

/// Every ticket of a VolumeAttachment, as the decision sees it.
fn holdings(ctx: &Context) -> Vec<Holding> {
    let mut out = vec![];
    for va in ctx.caches.attachments.state() {
        let name = va.name_any();
        let Some(volume) = ctx.caches.volumes.get(&ObjectRef::new(&name)) else {
            continue;
        };
        let mountpods = ctx.caches.mountpods_of(&name);
        for t in va.spec.attachment_tickets.values() {
            // Only where the node's daemon fences itself (its MountPod says so from
            // its creation), or where no daemon serves the volume.
            let fences = mountpods
                .iter()
                .filter(|mp| mp.spec.node_name == t.node_id)
                .all(|mp| mp.spec.self_fence);
            let opted_in = volume.spec.node_failover.unwrap_or_default();
            out.push(Holding {
                volume: name.clone(),
                ticket: t.id.clone(),
                node: t.node_id.clone(),
                single_writer: !volume.spec.access_mode.is_multi_node(),
                failover: if fences { opted_in } else { NodeFailover::Off },
            });
        }
    }
    out
}

/// What the loop keeps between decisions.
struct Seen {
    observer: Observer,
    /// The liveness Leases by node.
    leases: BTreeMap<String, Lease>,
    /// (volume, node) of the tickets left on a down node already told of, so that it
    /// is said once, not every second.
    told: BTreeSet<(String, String)>,
    /// The node each volume's ticket was released from, while its failover may be
    /// under way (`report`: its NodeFailover condition).
    released: BTreeMap<String, String>,
    listed: Listed,
    /// Whether the last report found an object with a failover condition (true until
    /// the first one): with no node fenced and none, there is nothing to look at.
    carrying: bool,
    /// The `status.volumesInUse` of the nodes that list a volume of Tessera's.
    in_use: BTreeMap<String, Vec<String>>,
    /// The entries removed from each fenced node's `volumesInUse`, not removed again
    /// while it stays fenced (a kubelet that reports them again is not fought).
    unlisted: BTreeMap<String, BTreeSet<String>>,
    /// Every node's taints, as the watch or the last write left them.
    node_taints: BTreeMap<String, NodeTaints>,
    /// The nodes the share kept from the fence taint, said once.
    valve_held: BTreeSet<String>,
    /// The share of nodes (percent) that may carry the fence taint, if it is on.
    fence_taint: Option<u8>,
}

/// Which watches have listed everything once: until both have, a node not seen yet
/// is not known to be alive, and no condition is cleared on that.
#[derive(Default)]
struct Listed {
    leases: bool,
    nodes: bool,
}

async fn act(
    ctx: &Context,
    echoes: &Echoes,
    api: &Api<Lease>,
    seen: &mut Seen,
    k8s: Nodes<'_>,
    margin: Duration,
    now: Duration,
) {
    let Seen {
        observer,
        leases,
        told,
        released,
        listed,
        carrying,
        in_use,
        unlisted,
        node_taints,
        valve_held,
        fence_taint,
    } = seen;
    let tainted = k8s.tainted;
    let live = |node: &str, fence_tainted: bool| {
        let l = leases.get(node);
        let view = NodeView {
            last_change: l.and(observer.last_change(node)),
            marked: l.is_some_and(marked),
            out_of_service: tainted.contains(node),
            kube_ready: k8s.ready.contains(node),
            fence_tainted,
        };
        let timing = Timing {
            fence_after: l.map_or(Duration::ZERO, fence_after),
            margin,
        };
        liveness(view, timing, now)
    };
    // The fence taint first (`--fence-taint`), on what each node's liveness would be
    // without it; a node tainted now is fenced in this very decision.
    // Only once the Node watch has listed every node: the share counts them all.
    if let Some(percent) = fence_taint.filter(|_| listed.nodes) {
        // The caches are scanned only when a node is past its wait (idle, nothing).
        let past = node_taints.keys().any(|n| {
            matches!(
                live(n, false),
                Liveness::AgentGone { .. } | Liveness::Fenced { .. }
            )
        });
        let moving: BTreeSet<String> = if past {
            holdings(ctx)
                .into_iter()
                .filter(|h| h.single_writer && h.failover == NodeFailover::Fenced)
                .map(|h| h.node)
                .collect()
        } else {
            BTreeSet::new()
        };
        let each: BTreeMap<String, super::taint::Seen> = node_taints
            .iter()
            .map(|(node, t)| {
                let s = super::taint::Seen {
                    liveness: live(node, false),
                    ready: k8s.ready.contains(node),
                    carries: t.fenced(),
                    holds: moving.contains(node),
                };
                (node.clone(), s)
            })
            .collect();
        let plan = super::taint::plan(&each, percent);
        super::tainting::apply(ctx, &plan, node_taints, valve_held).await;
    }
    let carries =
        |node: &str| fence_taint.is_some() && node_taints.get(node).is_some_and(|t| t.fenced());
    let names: BTreeSet<&String> = leases.keys().chain(tainted).collect();
    let nodes: BTreeMap<String, Liveness> = names
        .into_iter()
        .map(|node| (node.clone(), live(node, carries(node))))
        .collect();
    let mut states: BTreeMap<&str, i64> = BTreeMap::new();
    for l in nodes.values() {
        *states.entry(state_name(l)).or_default() += 1;
    }
    ctx.metrics.failover.set_nodes(states);
    let any_fenced = nodes.values().any(|l| matches!(l, Liveness::Fenced { .. }));
    let report = listed.leases && listed.nodes && (*carrying || any_fenced);
    let report = report && ctx.caches_ready().await;
    // Nodes not fenced now, but not seen renewing either since this controller
    // started: what was said of them stays until they do, or are fenced again.
    let unsure: BTreeSet<String> = nodes
        .iter()
        .filter(|(n, l)| {
            !matches!(l, Liveness::Fenced { .. }) && leases.contains_key(*n) && !observer.renewed(n)
        })
        .map(|(n, _)| n.clone())
        .collect();
    let view = super::report::View {
        nodes: &nodes,
        unsure: &unsure,
        now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now()
                .round(jiff::Unit::Second)
                .unwrap_or(jiff::Timestamp::now()),
        ),
    };
    if !any_fenced {
        told.clear();
        unlisted.clear();
        if report {
            *carrying = super::report::all(ctx, echoes, &view, released, &[]).await;
        }
        return;
    }
    let held = holdings(ctx);
    let stays = stranded(&nodes, &held);
    tell_stranded(ctx, &stays, told);
    let all = releases(&nodes, &held);
    let_go(ctx, &nodes).await;
    let mut just: BTreeSet<(String, String)> = BTreeSet::new();
    let mut by_node: BTreeMap<&str, Vec<&Release>> = BTreeMap::new();
    for r in &all {
        by_node.entry(r.node.as_str()).or_default().push(r);
    }
    for (node, rs) in by_node {
        // A node without a Lease is fenced only by the taint: nothing to mark.
        if let Some(lease) = leases.get(node).filter(|l| !marked(l)) {
            match mark(api, lease).await {
                Ok(stored) => {
                    warn!(
                        node,
                        "fenced: no renewal of its liveness Lease seen for fenceAfter + margin; marked it"
                    );
                    leases.insert(node.to_owned(), stored);
                }
                Err(e) => {
                    // 409: the agent renewed meanwhile; the watch brings the change.
                    info!(node, error = %e, "marking the liveness Lease fenced failed: not releasing");
                    continue;
                }
            }
        }
        for r in rs {
            if release(ctx, r).await {
                just.insert((r.node.clone(), r.volume.clone()));
                released.insert(r.volume.clone(), r.node.clone());
                let why = match r.why {
                    super::Why::LeaseExpired => "lease_expired",
                    super::Why::OutOfService => "out_of_service",
                };
                let labels = WhyLabels { why: why.into() };
                ctx.metrics.failover.released.get_or_create(&labels).inc();
                if let (super::Why::LeaseExpired, Some(last)) = (r.why, observer.last_change(node))
                {
                    let held = now.saturating_sub(last).as_secs_f64();
                    ctx.metrics.failover.seconds.observe(held);
                }
            }
        }
    }
    // After the release steps (the Pods deleted, the ticket gone): the attach-detach
    // controller detaches what the dead kubelet no longer says it uses.
    let marked_nodes: BTreeSet<String> = leases
        .iter()
        .filter(|(_, l)| marked(l))
        .map(|(n, _)| n.clone())
        .collect();
    let fence_tainted: BTreeSet<String> =
        node_taints.keys().filter(|n| carries(n)).cloned().collect();
    let look = super::unlist::Look {
        nodes: &nodes,
        ready: k8s.ready,
        tainted,
        fence_tainted: &fence_tainted,
        marked: &marked_nodes,
        just: &just,
    };
    super::unlist::unlist(ctx, &look, in_use, unlisted).await;
    if report {
        *carrying = super::report::all(ctx, echoes, &view, released, &stays).await;
    }
}

/// Drop the agent's finalizer from the deleted MountPods a fenced node's agent will
/// never let go of: those whose tickets the decision would release there.
async fn let_go(ctx: &Context, nodes: &BTreeMap<String, Liveness>) {
    for mp in ctx.caches.mountpods.state() {
        let fenced = nodes.get(&mp.spec.node_name);
        let why = match fenced {
            Some(Liveness::Fenced { why, .. }) => *why,
            _ => continue,
        };
        if mp.metadata.deletion_timestamp.is_none()
            || !mp.finalizers().iter().any(|f| f == MOUNT_FINALIZER)
        {
            continue;
        }
        // What the decision would release for this volume on this node (the ticket
        // itself is gone by now: the same rule, on a stand-in holding).
        let volume = ctx.caches.volumes.get(&ObjectRef::new(&mp.spec.volume));
        let stand_in = Holding {
            volume: mp.spec.volume.clone(),
            ticket: String::new(),
            node: mp.spec.node_name.clone(),
            single_writer: volume
                .as_ref()
                .is_some_and(|v| !v.spec.access_mode.is_multi_node()),
            failover: match volume.and_then(|v| v.spec.node_failover) {
                Some(f) if mp.spec.self_fence => f,
                _ => NodeFailover::Off,
            },
        };
        if releases(nodes, std::slice::from_ref(&stand_in)).is_empty() {
            continue;
        }
        let rest: Vec<&String> = mp
            .finalizers()
            .iter()
            .filter(|f| *f != MOUNT_FINALIZER)
            .collect();
        let patch = serde_json::json!({"metadata": {"finalizers": rest}});
        let res = Api::<MountPod>::all(ctx.client.clone())
            .patch(&mp.name_any(), &merge_params(), &Patch::Merge(&patch))
            .await;
        match res {
            Ok(_) => {
                info!(mountpod = %mp.name_any(), node = %mp.spec.node_name, why = ?why, "dropped a fenced node's finalizer from its deleted MountPod")
            }
            Err(e) => {
                warn!(mountpod = %mp.name_any(), error = %e, "dropping a fenced node's finalizer failed")
            }
        }
    }
}

/// The Lease with the fenced mark, written over the version last seen.
async fn mark(api: &Api<Lease>, lease: &Lease) -> Result<Lease, kube::Error> {
    let mut l = lease.clone();
    l.meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_FENCED.into(), "true".into());
    api.replace(&l.name_any(), &PostParams::default(), &l).await
}

/// Say once on each Volume left on a down node (nodeFailover Off) why it stays.
fn tell_stranded(ctx: &Context, stays: &[&Holding], told: &mut BTreeSet<(String, String)>) {
    let now: BTreeSet<(String, String)> = stays
        .iter()
        .map(|h| (h.volume.clone(), h.node.clone()))
        .collect();
    told.retain(|k| now.contains(k));
    for h in stays {
        if !told.insert((h.volume.clone(), h.node.clone())) {
            continue;
        }
        let Some(volume) = ctx.caches.volumes.get(&ObjectRef::new(&h.volume)) else {
            continue;
        };
        let note = format!(
            "node {} is down (no renewal of its liveness Lease for fenceAfter + margin, and the Node is not Ready) and holds this volume; its nodeFailover is not {:?} (or its mount daemon there does not fence itself), so it stays there until the node is back, or until the node has the {OUT_OF_SERVICE_TAINT} taint (put it on a node that is shut down)",
            h.node,
            NodeFailover::Fenced
        );
        warn!(volume = %h.volume, node = %h.node, "a single-writer volume stays on a down node: no nodeFailover");
        crate::events::publish_node(ctx, &volume, "StaysOnDownNode", &h.node, &note);
    }
}

/// A liveness state's name in the metrics.
fn state_name(l: &Liveness) -> &'static str {
    match l {
        Liveness::Alive => "alive",
        Liveness::Suspect { .. } => "suspect",
        Liveness::Fenced { .. } => "fenced",
        Liveness::NoLease => "no_lease",
        Liveness::AgentGone { .. } => "agent_gone",
    }
}

/// Remove the released ticket (only if unchanged) and say so on the Volume; whether
/// it was removed now.
async fn release(ctx: &Context, r: &Release) -> bool {
    let Some(va) = ctx.caches.attachments.get(&ObjectRef::new(&r.volume)) else {
        return false;
    };
    let Some(ticket) = va.spec.attachment_tickets.get(&r.ticket) else {
        return false;
    };
    let pods = ctx
        .caches
        .mountpods_of(&r.volume)
        .iter()
        .filter(|mp| mp.spec.node_name == r.node)
        .flat_map(|mp| mp.app_pods())
        .collect::<Vec<_>>();
    let csi_attacher = ticket.type_ == AttacherType::CsiAttacher;
    let mut deleted_csi_attachment = false;
    for step in super::steps(r, csi_attacher, &pods) {
        match step {
            Step::DeletePod {
                namespace,
                name,
                uid,
            } => delete_pod(ctx, r, &namespace, &name, &uid).await,
            Step::DeleteCsiAttachment { name } => {
                let res = Api::<StorageVolumeAttachment>::all(ctx.client.clone())
                    .delete(&name, &DeleteParams::default())
                    .await;
                match res {
                    Ok(_) => {
                        deleted_csi_attachment = true;
                        info!(volume = %r.volume, node = %r.node, attachment = %name, "deleted a fenced node's storage.k8s.io VolumeAttachment")
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => deleted_csi_attachment = true,
                    Err(e) => {
                        warn!(volume = %r.volume, attachment = %name, error = %e, "deleting a fenced node's storage.k8s.io VolumeAttachment failed");
                        return false;
                    }
                }
            }
            Step::RemoveTicket => {}
        }
    }
    let res = Api::<VolumeAttachment>::all(ctx.client.clone())
        .patch(
            &r.volume,
            &merge_params(),
            &Patch::<()>::Json(ticket.remove_if_unchanged_patch()),
        )
        .await;
    match res {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 422 && deleted_csi_attachment => {
            let now = Api::<VolumeAttachment>::all(ctx.client.clone())
                .get_opt(&r.volume)
                .await
                .ok()
                .flatten();
            if !super::released_by_unpublish(r, deleted_csi_attachment, now.as_ref()) {
                return false;
            }
            info!(volume = %r.volume, ticket = %r.ticket, "the ticket was removed by ControllerUnpublish of the deleted storage.k8s.io VolumeAttachment");
        }
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 404 => return false,
        Err(e) => {
            warn!(volume = %r.volume, ticket = %r.ticket, error = %e, "releasing a fenced node's ticket failed");
            return false;
        }
    }
    let note = match r.why {
        super::Why::OutOfService => format!(
            "released ticket {} of node {}: the node has the {OUT_OF_SERVICE_TAINT} taint",
            r.ticket, r.node
        ),
        super::Why::LeaseExpired => format!(
            "released ticket {} of node {}: no renewal of its liveness Lease seen for fenceAfter + margin, and the volume's nodeFailover is {:?}",
            r.ticket,
            r.node,
            NodeFailover::Fenced
        ),
    };
    info!(volume = %r.volume, ticket = %r.ticket, node = %r.node, "released a fenced node's ticket");
    if let Some(volume) = ctx.caches.volumes.get(&ObjectRef::new(&r.volume)) {
        let action = format!("RemoveTicket {}", r.ticket);
        publish_tickets(
            ctx,
            &volume,
            Some(&va),
            EventType::Warning,
            "FailedOver",
            &action,
            &note,
        );
    }
    true
}

/// Delete at once a Pod bound to the released volume on the fenced node (only that
/// Pod: uid precondition), and say why on it.
async fn delete_pod(ctx: &Context, r: &Release, namespace: &str, name: &str, uid: &str) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let res = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .delete(name, &params)
        .await;
    match res {
        Ok(_) => {}
        // Gone already, or another Pod of that name now.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
        Err(e) => {
            warn!(pod = %name, namespace, error = %e, "deleting a Pod of a fenced node failed");
            return;
        }
    }
    ctx.metrics.failover.pods_deleted.inc();
    warn!(pod = %name, namespace, node = %r.node, volume = %r.volume, "deleted a Pod of a fenced node: its volume moves");
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    };
    let note = format!(
        "deleted: node {} is down (no renewal of its liveness Lease for fenceAfter + margin, and the Node is not Ready), and volume {} (nodeFailover {:?}) moves to the node of this Pod's replacement",
        r.node,
        r.volume,
        NodeFailover::Fenced
    );
    publish_objects(
        ctx,
        vec![pod],
        EventType::Warning,
        "DeletedOnFencedNode",
        &note,
    );
}
