//! Wires the three controllers to the shared watches and one [`Context`] (the
//! attachment controller's with its own state beside it), and runs them until the
//! process ends.
//!
//! ```text
//!  watch Volume ───────────┬─▶ volume controller ◀── watch VolumeAttachment (same name)
//!                          └─▶ attachment controller ◀─┬─ watch VolumeAttachment
//!                                                      ├─ watch MountPod (spec.volume; indexed by it)
//!                                                      ├─ watch Node metadata (tickets on it)
//!                                                      └─ watch CSINode (agent registered?)
//!  reaper: every reap interval, over the VolumeAttachment cache
//!  state gauges: every 5 s, counted from the caches
//! ```
//!
//! Each object a watch event asks a reconcile of counts as queued until its reconcile
//! starts (`tessera_reconcile_queue_depth`, `metrics::queue`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, controller, reflector, watcher};
use kube::{Api, Client, ResourceExt};

use tessera_api::{CSI_DRIVER_NAME, MountPod, Volume, VolumeAttachment};
use tessera_runtime::metrics::Metrics;

use super::context::{Caches, mountpods_by_volume};
use super::echoes::Echoes;
use super::error::log_run_error;
use super::watch::{
    CachesReady, Projection, Sink, every_change, fan_out, no_managed_fields, spec_managers_only,
};
use super::{Context, ControllerArgs, attachment, reaper, state_metrics, volume};

/// Run the watches, the Volume and VolumeAttachment controllers and the reaper.
pub(super) async fn run_controllers(
    client: Client,
    metrics: Arc<Metrics>,
    args: &ControllerArgs,
    identity: String,
    allowed_roots: tessera_host::roots::AllowedRoots,
    witness: Arc<super::failover::Witness>,
) {
    let labels = args.watch_selector.clone().unwrap_or_default();
    let wc = labels.watcher_config();
    let volumes: Api<Volume> = Api::all(client.clone());
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let mountpods: Api<MountPod> = Api::all(client.clone());

    // One watch per kind. Each fills the cache the reconcilers read and fans the
    // objects out to the controllers it triggers: Volumes trigger both controllers,
    // VolumeAttachments both (the volume controller keeps each Volume's attachment),
    // MountPods the attachment controller.
    let ready = CachesReady::default();
    // The attachment controller is not triggered by the versions it wrote itself; the
    // volume controller is (see `echoes`).
    let echoes = Arc::new(Echoes::default());
    let (volume_store, volume_writer) = reflector::store();
    let (volume_watch, mut volume_streams) = fan_out(
        volumes,
        wc.clone(),
        no_managed_fields,
        volume_writer.into(),
        ready.volumes.clone(),
        vec![None, Some(echoes.clone())],
        every_change,
    );
    let (va_store, va_writer) = reflector::store();
    let (va_watch, mut va_streams) = fan_out(
        attachments,
        wc.clone(),
        spec_managers_only,
        va_writer.into(),
        ready.attachments.clone(),
        vec![None, Some(echoes.clone())],
        every_change,
    );
    let (mp_store, mp_writer) = reflector::store();
    let mp_index = Arc::new(std::sync::RwLock::new(mountpods_by_volume()));
    let (mp_watch, mut mp_streams) = fan_out(
        mountpods,
        wc,
        no_managed_fields,
        Sink {
            writer: mp_writer,
            index: Some(mp_index.clone()),
        },
        ready.mountpods.clone(),
        vec![Some(echoes.clone())],
        every_change,
    );
    // Node names, of every node (the watch selector scopes Tessera's own kinds only):
    // a ticket for a node that does not exist is not honoured.
    let (node_store, node_writer) = reflector::store();
    let (node_watch, mut node_streams) = fan_out(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
        no_managed_fields,
        node_writer.into(),
        ready.nodes.clone(),
        vec![None],
        // Reconciles read a Node's existence only.
        {
            let mut seen = Projection::default();
            move |n: &PartialObjectMeta<Node>, deleted| {
                seen.changed(&n.name_any(), (!deleted).then_some(()))
            }
        },
    );

    // CSINodes, to say when a ticket's node has no agent (status messages only: no
    // decision waits for this cache).
    let csinodes_ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (csinode_store, csinode_writer) = reflector::store();
    let (csinode_watch, mut csinode_streams) = fan_out(
        Api::<CSINode>::all(client.clone()),
        watcher::Config::default(),
        no_managed_fields,
        csinode_writer.into(),
        csinodes_ready.clone(),
        vec![None],
        // Reconciles read whether a CSINode lists the driver, nothing else.
        {
            let mut listed = Projection::default();
            move |c: &CSINode, deleted| {
                let has = c.spec.drivers.iter().any(|d| d.name == CSI_DRIVER_NAME);
                listed.changed(&c.name_any(), (!deleted).then_some(has))
            }
        },
    );
    // A Node (or its CSINode) that comes or goes: every VolumeAttachment with a ticket
    // for it.
    let tickets_on = |va_store: reflector::Store<VolumeAttachment>| {
        move |name: String| {
            va_store
                .state()
                .into_iter()
                .filter(|va| {
                    va.spec
                        .attachment_tickets
                        .values()
                        .any(|t| t.node_id == name)
                })
                .map(|va| ObjectRef::from_obj(va.as_ref()))
                .collect::<Vec<_>>()
        }
    };

    // A VolumeAttachment has its Volume's name; a MountPod names its volume. Each
    // controller runs at most `--max-concurrent-reconciles` reconciles at once.
    // Every object a watch event asks a reconcile of is counted queued until its
    // reconcile starts (`tessera_reconcile_queue_depth`).
    let config = controller::Config::default().concurrency(args.max_concurrent_reconciles);
    let asked = |controller: &'static str| {
        let metrics = metrics.clone();
        move |name: &str| metrics.reconcile_asked(controller, name)
    };
    let volume_ctrl = Controller::for_shared_stream(
        volume_streams.remove(0).inspect({
            let ask = asked("volume");
            move |v: &Arc<Volume>| ask(&v.name_any())
        }),
        volume_store.clone(),
    )
    .with_config(config.clone())
    .watches_shared_stream(va_streams.remove(0), {
        let ask = asked("volume");
        move |va: Arc<VolumeAttachment>| {
            ask(&va.name_any());
            Some(ObjectRef::new(&va.name_any()))
        }
    });
    let attachment_ctrl = Controller::for_shared_stream(
        va_streams.remove(0).inspect({
            let ask = asked("attachment");
            move |va: &Arc<VolumeAttachment>| ask(&va.name_any())
        }),
        va_store.clone(),
    )
    .with_config(config)
    .watches_shared_stream(mp_streams.remove(0), {
        let ask = asked("attachment");
        move |mp: Arc<MountPod>| {
            ask(&mp.spec.volume);
            Some(ObjectRef::new(&mp.spec.volume))
        }
    })
    .watches_shared_stream(volume_streams.remove(0), {
        let ask = asked("attachment");
        move |v: Arc<Volume>| {
            ask(&v.name_any());
            Some(ObjectRef::new(&v.name_any()))
        }
    })
    .watches_shared_stream(node_streams.remove(0), {
        let on = tickets_on(va_store.clone());
        let ask = asked("attachment");
        move |node: Arc<PartialObjectMeta<Node>>| {
            let refs = on(node.name_any());
            refs.iter().for_each(|r| ask(&r.name));
            refs
        }
    })
    .watches_shared_stream(csinode_streams.remove(0), {
        let on = tickets_on(va_store.clone());
        let ask = asked("attachment");
        move |node: Arc<CSINode>| {
            let refs = on(node.name_any());
            refs.iter().for_each(|r| ask(&r.name));
            refs
        }
    });

    let caches = Caches {
        volumes: volume_store,
        attachments: va_store,
        mountpods: mp_store,
        mountpods_by_volume: mp_index,
        nodes: node_store,
        csinodes: csinode_store,
        csinodes_ready,
        ready,
    };
    let ctx = Arc::new(Context::new(
        client,
        metrics.clone(),
        Some(identity),
        caches,
        labels,
        allowed_roots,
    ));
    let attachment_ctx = Arc::new(attachment::Ctx::new(ctx.clone(), echoes.clone()));
    metrics.set_ready(true);
    // The controllers run only once this replica leads (or runs without an election).
    metrics.leader.set(1);

    let volume_run = volume_ctrl
        .run(volume::reconcile, volume::error_policy, ctx.clone())
        .for_each(|res| async move {
            if let Err(e) = res {
                log_run_error("volume", &e);
            }
        });
    let attachment_run = attachment_ctrl
        .run(
            attachment::reconcile,
            attachment::error_policy,
            attachment_ctx,
        )
        .for_each(|res| async move {
            if let Err(e) = res {
                log_run_error("attachment", &e);
            }
        });
    let reaper_run = reaper::run(ctx.clone(), args.reap_interval, args.reap_grace);
    let states_run = state_metrics::run(ctx.clone(), Duration::from_secs(5));
    let failover_run = super::failover::run(
        ctx.clone(),
        echoes.clone(),
        witness,
        args.namespace.clone(),
        args.fence_margin,
        Duration::from_secs(1),
        args.fence_taint.then_some(args.fence_taint_max_percent),
    );
    // Each its own task on the runtime's workers, next to the HTTP connections they
    // talk through: polled by the main thread (one `join!`), every watch event and
    // every response crossed threads, and every wake-up polled all nine. The set
    // aborts them all when this future is dropped (leadership lost, shutdown).
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(volume_watch);
    tasks.spawn(va_watch);
    tasks.spawn(mp_watch);
    tasks.spawn(node_watch);
    tasks.spawn(csinode_watch);
    tasks.spawn(volume_run);
    tasks.spawn(attachment_run);
    tasks.spawn(reaper_run);
    tasks.spawn(states_run);
    tasks.spawn(failover_run);
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}
