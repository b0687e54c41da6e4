//! The watch-driven floor of the controller benchmark: the controller's request mix
//! (ticket, MountPod POST, the mount's Ready status, the two statuses, the Attached
//! Event), each write issued when a watch shows the one before it, as a controller and
//! an agent must, by plain clients holding the watches the controller segment holds:
//! VolumeAttachments twice (the controller's; the benchmark's, which times the end),
//! MountPods twice (the controller's, the agent's) and Volumes once. No caches beyond
//! what a write needs, no decisions, no status building: the bodies are the
//! [`Template`]'s, made before the clock starts.
//!
//! The controller's time over this floor is what Tessera's own work adds; this floor
//! over the mix floor is what the watches and the hops between the writes cost.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kube::runtime::events::Recorder;
use tokio::sync::{mpsc, oneshot};

use super::floor::{attached, create_volumes, delete_volumes, ready, recorder};
use super::*;

/// What the writes of one volume need, made before the clock starts.
struct Prepared {
    mountpod: MountPod,
    object: ObjectReference,
}

/// Attach `n` new volumes through the watch-driven chain; returns the time from the
/// first ticket to the benchmark's watch seeing the last ticket satisfied.
pub(super) async fn chain(
    client: &kube::Client,
    template: &Arc<Template>,
    node: &str,
    n: usize,
    meter: &CpuMeter,
) -> (Duration, SegmentCpu) {
    let id = support::unique_name("chain");
    let names: Vec<String> = (0..n).map(|i| format!("{id}-v{i}")).collect();
    let owners = create_volumes(client, template, &id, &names).await;
    let prepared: Arc<HashMap<String, Prepared>> = Arc::new(
        names
            .iter()
            .zip(owners)
            .map(|(name, (owner, object))| {
                let mountpod = template.mountpod(name, node, &owner, &id);
                (name.clone(), Prepared { mountpod, object })
            })
            .collect(),
    );
    let wc = watcher::Config::default().labels(&format!("{TEST_LABEL}={id}"));
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let volumes: Api<Volume> = Api::all(client.clone());
    let mps: Api<MountPod> = Api::all(client.clone());
    let apply = PatchParams::apply("tessera-bench-floor").force();
    let recorder: Recorder = recorder(client);
    let mut watches = Vec::new();

    // The controller: a new ticket → its MountPod.
    watches.push(follow(vas.clone(), wc.clone(), {
        let (mps, prepared) = (mps.clone(), prepared.clone());
        let mut done = HashSet::new();
        move |va: VolumeAttachment| {
            let name = va.name_any();
            if !va.spec.attachment_tickets.contains_key("csi-a") || !done.insert(name.clone()) {
                return;
            }
            let (mps, prepared) = (mps.clone(), prepared.clone());
            tokio::spawn(async move {
                let mp = &prepared[&name].mountpod;
                report(mps.create(&PostParams::default(), mp).await, "MountPod");
            });
        }
    }));
    // The agent: a new MountPod → Ready.
    watches.push(follow(mps.clone(), wc.clone(), {
        let mps = mps.clone();
        let mut done = HashSet::new();
        move |mp: MountPod| {
            if mp.status.is_some() || !done.insert(mp.name_any()) {
                return;
            }
            let mps = mps.clone();
            tokio::spawn(async move {
                let res = mps
                    .patch_status(
                        &mp.name_any(),
                        &PatchParams::default(),
                        &ready(&mp.spec.volume),
                    )
                    .await;
                report(res, "MountPod status");
            });
        }
    }));
    // The controller: a Ready MountPod → both statuses, then the Event.
    watches.push(follow(mps.clone(), wc.clone(), {
        let (vas, volumes, template, prepared) = (
            vas.clone(),
            volumes.clone(),
            template.clone(),
            prepared.clone(),
        );
        let mut done = HashSet::new();
        move |mp: MountPod| {
            let is_ready =
                mp.status.as_ref().and_then(|s| s.phase) == Some(tessera_api::MountPhase::Ready);
            if !is_ready || !done.insert(mp.spec.volume.clone()) {
                return;
            }
            let (vas, volumes, template, prepared, apply, recorder, node) = (
                vas.clone(),
                volumes.clone(),
                template.clone(),
                prepared.clone(),
                apply.clone(),
                recorder.clone(),
                mp.spec.node_name.clone(),
            );
            tokio::spawn(async move {
                let name = &mp.spec.volume;
                let res = template.write_statuses(&vas, &volumes, &apply, name).await;
                report(res, "statuses");
                let res = recorder
                    .publish(&attached(&node), &prepared[name].object)
                    .await;
                report(res, "Event");
            });
        }
    }));
    // The controller's Volume watch: its own status writes come back.
    watches.push(follow(volumes.clone(), wc.clone(), |_: Volume| {}));
    // The benchmark: each ticket satisfied.
    let (tx, mut satisfied) = mpsc::unbounded_channel();
    watches.push(follow(
        vas.clone(),
        wc.clone(),
        move |va: VolumeAttachment| {
            let ok = va
                .status
                .as_ref()
                .and_then(|s| s.attachment_ticket_statuses.get("csi-a"))
                .is_some_and(|s| s.satisfied);
            if ok {
                let _ = tx.send(va.name_any());
            }
        },
    ));
    let mut tasks = Vec::new();
    for (task, listed) in watches {
        listed.await.expect("a chain watch listed");
        tasks.push(task);
    }

    let cpu = meter.read();
    let t0 = Instant::now();
    stream::iter(names.iter().map(|name| async move {
        fixtures::put_ticket(client, name, "csi-a", "csi-attacher", node, json!({})).await
    }))
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;
    let mut seen = HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while seen.len() < n {
        let name = tokio::time::timeout_at(deadline, satisfied.recv())
            .await
            .expect("not all chain tickets satisfied within 300 s")
            .expect("the benchmark's watch ended");
        seen.insert(name);
    }
    let took = t0.elapsed();
    let cpu = meter.read().since(cpu);
    for task in tasks {
        task.abort();
    }
    delete_volumes(client, &id, &names, node).await;
    (took, cpu)
}

/// Watch `api` and hand every object seen to `on`; the receiver says when the first
/// list is done (the watch is open).
fn follow<K>(
    api: Api<K>,
    wc: watcher::Config,
    mut on: impl FnMut(K) + Send + 'static,
) -> (tokio::task::JoinHandle<()>, oneshot::Receiver<()>)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut events = watcher(api, wc).default_backoff().boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => on(o),
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
    });
    (task, rx)
}

/// Say when a write of the chain failed (its ticket then never counts as satisfied,
/// and the segment times out).
fn report<T>(res: Result<T, kube::Error>, what: &str) {
    if let Err(e) = res {
        eprintln!("  chain floor: writing the {what} failed: {e}");
    }
}
