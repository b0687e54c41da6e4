//! The Kubernetes side of the node agent: watches this node's MountPods, hands the
//! node-side work to [`MountService`] on the blocking pool, and reports the outcome in the
//! MountPod's status.
//!
//! ```text
//!  MountPods labelled tessera.io/node=<node> (+ --watch-selector)
//!        │ kube-runtime Controller             health loop (every --health-interval)
//!        ▼                                      │ reap children; probe every answered mount
//!  reconcile ◀───── ObjectRef of a broken mount ┘
//!        │ finalizer tessera.io/mount first (set already when the controller created it)
//!        ├─ Serve ──────▶ MountService::serve (start | adopt | repair | SIGHUP | remount)
//!        ├─ RemoveData ─▶ MountService::remove_data
//!        ├─ Populate ───▶ MountService::populate (copy of the data source; [`populate`])
//!        └─ deleted ────▶ references remain? refuse (Terminating) : MountService::teardown, drop finalizer
//!        ▼
//!  status subresource, server-side apply as tessera-node-<node>, only when it changed
//! ```
//!
//! Status fields: `phase` (Mounting, written only when a first start takes over a
//! second, → Ready only once the mount answers), `pid`,
//! `mountPoint`, `restarts` (daemon restarts after a failure), `lastError` and its
//! time, `referenceCount` (= `spec.references`), conditions (`Ready`; `SpecApplied`
//! when a remount waits for references to go; `References` when a reference is
//! refused or could not be re-bound; `DataRemoved` for a RemoveData task) and
//! `observedGeneration`, and `applied` (the running mount's `readOnly`/`mountOptions`).
//! `observedGeneration` and `applied` are left behind while the running mount does not
//! have the spec's `readOnly`/`mountOptions`, so `MountPod::is_ready()` only holds for
//! a mount that is what the spec says, and keeps holding while a new reference waits
//! for the agent. [`status`] builds these fields
//! without I/O; this module writes them.
//!
//! Rolling image upgrades (one mount at a time, claimed by the health loop) are
//! [`upgrade`]'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, debug, info, info_span, warn};

use tessera_api::{MountPhase, MountPod, MountPodStatus, MountTask};
use tessera_runtime::metrics::Metrics;
use tessera_runtime::metrics::objects::{Claim, MountLabels};
use tessera_runtime::{KubeContext, error_chain};

use super::mount_service::{self, Health, MountService, Progress};
use super::{Error, FINALIZER, Labels};
use status::{Report, cond, next_status, serve_report};

mod missing;
mod oom;
mod populate;
mod status;
mod upgrade;

/// What every reconcile needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// This node's name.
    pub node: String,
    /// Field manager of every write: `tessera-node-<node>`.
    pub field_manager: String,
    /// The node-side work.
    pub host: Arc<MountService>,
    /// Metrics (reconciles, durations, writes).
    pub metrics: Arc<Metrics>,
    /// Publishes Kubernetes Events.
    pub recorder: tessera_runtime::recorder::Recorders,
    /// When each failing MountPod may be tried again.
    pub backoff: super::backoff::Backoffs,
    /// Pod mode: the namespace of the mount Pods (their OOM kills are reported).
    pub mount_namespace: Option<String>,
    /// The mount being upgraded (its MountPod, and since when): one at a time.
    pub upgrading: std::sync::Mutex<Option<(String, Instant)>>,
    /// When a failed upgrade of each mount may be tried again.
    pub upgrade_retries: crate::upgrade::Retries,
}

/// How long a first start may take before the MountPod says Mounting.
const MOUNTING_QUIET: Duration = Duration::from_secs(1);

/// Run the agent's controller and health loop until the future is dropped.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    host: Arc<MountService>,
    node: String,
    selector: Labels,
    health_interval: Duration,
    mount_pods: Option<String>,
) {
    let mut labels = selector.0.clone();
    labels.insert(tessera_api::LABEL_NODE.into(), node.clone());
    let wc = watcher::Config::default().labels(&Labels(labels).selector());
    let api: Api<MountPod> = Api::all(client.clone());
    let field_manager = format!("tessera-node-{node}");
    let ctx = Arc::new(Context {
        recorder: tessera_runtime::recorder::Recorders::new(
            client.clone(),
            Reporter {
                controller: field_manager.clone(),
                instance: Some(node.clone()),
            },
        ),
        client,
        node,
        field_manager,
        host,
        metrics: metrics.clone(),
        backoff: Default::default(),
        mount_namespace: mount_pods.clone(),
        upgrading: Default::default(),
        upgrade_retries: Default::default(),
    });
    // Every MountPod a watch event or the health loop asks a reconcile of is counted
    // queued until its reconcile starts (`tessera_reconcile_queue_depth{controller=
    // "mountpod"}`, as the controller's are). The stream is the one `Controller::new`
    // builds, with the count on it.
    let ask = {
        let metrics = metrics.clone();
        move |name: &str| metrics.reconcile_asked("mountpod", name)
    };
    let (store, writer) = reflector::store();
    let own = reflector(writer, watcher(api, wc))
        .applied_objects()
        .inspect({
            let ask = ask.clone();
            move |mp: &Result<MountPod, watcher::Error>| {
                if let Ok(mp) = mp {
                    ask(&mp.name_any());
                }
            }
        });
    let (trigger, triggered) = mpsc::unbounded();
    let triggered = triggered.inspect({
        let ask = ask.clone();
        move |mp: &ObjectRef<MountPod>| ask(&mp.name)
    });
    let mut controller = Controller::for_stream(own, store.clone()).reconcile_on(triggered);
    if let Some(namespace) = mount_pods {
        // Pod mode: a change of a mount Pod reconciles its MountPod (its owner).
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let pwc = watcher::Config::default()
            .labels(&crate::pods::spec::selector())
            .fields(&format!("spec.nodeName={}", ctx.node));
        controller = controller.watches(pods, pwc, move |pod: Pod| {
            let owner = pod
                .owner_references()
                .iter()
                .find(|o| o.kind == "MountPod" && o.controller == Some(true))
                .map(|o| ObjectRef::new(&o.name));
            if let Some(o) = &owner {
                ask(&o.name);
            }
            owner
        });
    }
    let health = health_loop(ctx.clone(), store.clone(), trigger, health_interval);
    let ready = {
        let metrics = metrics.clone();
        let store = store.clone();
        async move {
            let _ = store.wait_until_ready().await;
            metrics.set_ready(true);
        }
    };
    let run = controller
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                debug!(error = %error_chain(&e), "mountpod reconcile");
            }
        });
    tokio::join!(run, health, ready);
}

/// Reconcile one MountPod of this node.
pub async fn reconcile(mp: Arc<MountPod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = info_span!("mountpod", mountpod = %mp.name_any(), volume = %mp.spec.volume, node = %ctx.node);
    async {
        debug!(resource_version = ?mp.resource_version(), "mountpod reconcile");
        ctx.metrics.reconcile_started("mountpod", &mp.name_any());
        // The claim its volume's metrics are labelled with (until its deletion).
        if mp.metadata.deletion_timestamp.is_none()
            && let Ok(mut claims) = ctx.metrics.claims.write()
        {
            claims.insert(
                mp.spec.volume.clone(),
                Claim::from_annotations(mp.annotations()),
            );
        }
        let start = Instant::now();
        let res = reconcile_inner(&mp, &ctx).await;
        ctx.metrics
            .reconciled("mountpod", start.elapsed(), res.is_err());
        match &res {
            // The MountPod (or what the pass wrote) is already gone: nothing to do.
            Err(e) if tessera_runtime::is_not_found(e) => {
                debug!(error = %error_chain(e), "reconcile: already gone");
            }
            Err(e) => warn!(error = %error_chain(e), "reconcile failed"),
            Ok(_) => {}
        }
        res
    }
    .instrument(span)
    .await
}

/// The labels of `mp`'s mount in the agent's per-volume metrics.
pub(super) fn mount_labels(ctx: &Context, mp: &MountPod) -> MountLabels {
    MountLabels::new(
        &mp.spec.volume,
        &ctx.node,
        Claim::from_annotations(mp.annotations()),
    )
}

/// Back off after an error.
pub fn error_policy(_mp: Arc<MountPod>, _err: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile_inner(mp: &MountPod, ctx: &Context) -> Result<Action, Error> {
    if mp.spec.node_name != ctx.node {
        warn!(spec_node = %mp.spec.node_name, "labelled for this node but spec.nodeName differs; ignored");
        return Ok(Action::await_change());
    }
    if mp.metadata.deletion_timestamp.is_some() {
        return delete(mp, ctx).await;
    }
    if !mp.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = mp.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        patch_finalizers(mp, ctx, finalizers).await?;
    }
    if let Err(msg) = owned_by_its_volume(mp) {
        return refuse(mp, ctx, msg).await;
    }
    if mp.spec.task == MountTask::Serve
        && let Some(left) = ctx
            .backoff
            .wait(&mp.name_any(), mp.metadata.generation, Instant::now())
    {
        // A failing mount is retried when its backoff is over, not on every event
        // (its own status writes among them).
        return Ok(Action::requeue(left));
    }
    match mp.spec.task {
        MountTask::Serve => serve(mp, ctx).await,
        MountTask::RemoveData => remove_data(mp, ctx).await,
        MountTask::Populate => populate::populate(mp, ctx).await,
    }
}

/// The MountPod reason of a failure of the node-side work: `BackendNotShared` when
/// this node does not see a Shared root's marker (nothing was created), else
/// `MountFailed`.
pub(crate) fn failure_reason(e: &mount_service::Error) -> &'static str {
    match e {
        mount_service::Error::NotShared(_) => "BackendNotShared",
        _ => "MountFailed",
    }
}

/// A MountPod the agent does not serve: only the controller's, owned by their Volume,
/// are (a hand-made one could name any directory of the node).
pub(crate) fn owned_by_its_volume(mp: &MountPod) -> Result<(), String> {
    let owned = mp.owner_references().iter().any(|o| {
        o.kind == "Volume"
            && o.api_version == "tessera.io/v1alpha1"
            && o.name == mp.spec.volume
            && o.controller == Some(true)
    });
    if owned {
        Ok(())
    } else {
        Err(format!(
            "not served: a MountPod must be owned (controller ownerReference) by its Volume {:?}",
            tessera_text::truncated(&mp.spec.volume, tessera_host::paths::SHOWN)
        ))
    }
}

/// Report an unusable spec once (no write when the status says so already).
async fn refuse(mp: &MountPod, ctx: &Context, msg: String) -> Result<Action, Error> {
    let mut current = mp.status.clone().unwrap_or_default();
    let known = current.last_error.as_deref() == Some(msg.as_str())
        && current.phase == Some(MountPhase::Failed);
    let report = Report::failed("InvalidSpec", msg.clone());
    write_status(mp, ctx, &mut current, report).await?;
    if !known {
        warn!(%msg, "MountPod refused");
        publish(ctx, mp, EventType::Warning, "InvalidSpec", &msg).await;
    }
    Ok(Action::await_change())
}

async fn serve(mp: &MountPod, ctx: &Context) -> Result<Action, Error> {
    // A new OOM kill of the mount container is recorded and announced first; the rest
    // goes on from the status written.
    let checked = oom::check(mp, ctx).await;
    let mp = checked.as_ref().unwrap_or(mp);
    let name = mp.name_any();
    let mut current = mp.status.clone().unwrap_or_default();
    let (mut want, refused) = match mount_service::want(&name, &mp.spec, &ctx.host.config) {
        Ok(w) => w,
        Err(msg) => return refuse(mp, ctx, msg).await,
    };
    want.mountpod_uid = mp.uid().unwrap_or_default();
    if ctx.upgrade_slot().as_ref().is_some_and(|(n, _)| *n == name) {
        upgrade::replace(mp, ctx, &want).await;
        *ctx.upgrade_slot() = None;
    }
    let prev = mp.status.clone().unwrap_or_default();
    let now = jiff::Timestamp::now();
    let (tx, mut rx) = mpsc::unbounded();
    let host = ctx.host.clone();
    let w = want.clone();
    let job = blocking(move || {
        host.serve(&w, &|p| {
            let _ = tx.unbounded_send(p);
        })
    });
    let retrying = prev.phase == Some(MountPhase::Failed);
    // The agent's mount was waiting for its daemon when this pass began.
    let was_awaiting = missing::awaits_daemon(&prev);
    // A first start says Mounting only once it has taken MOUNTING_QUIET: a mount that
    // answers before has Ready as its one status write. A restart of a broken daemon
    // says so at once.
    let quiet_until = tokio::time::Instant::now() + MOUNTING_QUIET;
    let mut pending: Option<Report> = None;
    loop {
        let progress = tokio::select! {
            p = rx.next() => p,
            () = tokio::time::sleep_until(quiet_until), if pending.is_some() => {
                let report = pending.take().expect("a pending report");
                write_status_from(mp, ctx, &prev, &mut current, report, now).await?;
                continue;
            }
        };
        let cause = match progress {
            Some(Progress::Starting { cause }) => cause,
            Some(Progress::Mounted) => {
                // The kernel mount exists: NodePublish may bind it now; the Pods'
                // requests wait for the daemon being started (bounded by the start
                // timeout: then they fail with ENOTCONN and the mount is redone).
                pending = None;
                let report = Report::awaiting_daemon(&want.mountpoint);
                write_status_from(mp, ctx, &prev, &mut current, report, now).await?;
                continue;
            }
            None => break,
        };
        if retrying {
            // A retry after a failure says Failed until it works: no Mounting/Failed
            // flip-flop on every attempt.
            continue;
        }
        let restart = cause.is_some();
        let report = Report {
            phase: MountPhase::Mounting,
            pid: None,
            mount_point: Some(want.mountpoint.display().to_string()),
            error: cause.clone(),
            restarted: restart,
            ready: cond(
                "Ready",
                false,
                "Starting",
                format!("starting the fuse daemon for {}", want.mountpoint.display()),
            ),
            extra: vec![],
            observed: true,
            image: None,
        };
        if restart || tokio::time::Instant::now() >= quiet_until {
            pending = None;
            write_status_from(mp, ctx, &prev, &mut current, report, now).await?;
        } else {
            pending = Some(report);
        }
    }
    let served = match job.await.map_err(Error::Join)? {
        Ok(s) => s,
        Err(e) => {
            let msg = error_chain(&e);
            let mounted_here = missing::awaits_daemon(&current);
            let delay = ctx
                .backoff
                .failed(&name, mp.metadata.generation, Instant::now());
            // A root that failed is verified again on the next try.
            ctx.host.shared.forget(&want.beneath.root);
            let reason = failure_reason(&e);
            warn!(error = %msg, reason, retry_in_ms = delay.as_millis() as u64, "mount failed");
            write_status(mp, ctx, &mut current, Report::failed(reason, msg.clone())).await?;
            // One Event per distinct failure, not one per attempt.
            if prev.last_error.as_deref() != Some(msg.as_str()) {
                publish(ctx, mp, EventType::Warning, reason, &msg).await;
            }
            // Mounted in this pass (or waiting before it), and no daemon came: the
            // connection was let go under the Pods bound to it.
            if was_awaiting || mounted_here {
                missing::announce(ctx, mp, &msg).await;
            }
            return Ok(Action::requeue(delay));
        }
    };
    let (report, mut action) = serve_report(&want, &served, &refused, mp, &prev);
    if served.failure.is_some() {
        action = Action::requeue(
            ctx.backoff
                .failed(&name, mp.metadata.generation, Instant::now()),
        );
    } else if served.answers {
        ctx.backoff.succeeded(&name);
    }
    if served.answers {
        ctx.metrics.mount_served(&mount_labels(ctx, mp));
    }
    if let Some(cause) = &served.repaired
        && was_awaiting
    {
        missing::announce(ctx, mp, cause).await;
    }
    if let Some(cause) = &served.repaired {
        let took = served.repair_time.unwrap_or_default();
        info!(cause = %cause, repair_ms = took.as_millis() as u64, rebound = served.rebound, "mount repaired");
        if served.answers && served.taken_over {
            // The same mount, on the same kernel connection: nothing was re-bound.
            let note = format!(
                "{cause}; a successor took the held connection over in {} ms (no remount)",
                took.as_millis()
            );
            ctx.metrics.handoff(mount_labels(ctx, mp), "takeover");
            publish(ctx, mp, EventType::Warning, "TakenOver", &note).await;
        } else if served.answers {
            let note = format!(
                "{cause}; remounted and re-bound {} reference(s) in {} ms",
                served.rebound,
                took.as_millis()
            );
            publish(ctx, mp, EventType::Warning, "Repaired", &note).await;
        }
    }
    if let Some(f) = &served.failure
        && prev.last_error.as_deref() != Some(f.as_str())
    {
        publish(ctx, mp, EventType::Warning, "MountFailed", f).await;
    }
    // Reference problems are announced once, when they change.
    let references_message = |st: &MountPodStatus| {
        st.conditions
            .iter()
            .find(|c| c.type_ == "References")
            .map(|c| c.message.clone())
    };
    let known = references_message(&prev);
    for msg in refused.iter().chain(&served.rebind_errors) {
        if known.as_deref().is_none_or(|k| !k.contains(msg.as_str())) {
            warn!(%msg, "reference");
            publish(ctx, mp, EventType::Warning, "ReferenceFailed", msg).await;
        }
    }
    write_status_from(mp, ctx, &prev, &mut current, report, now).await?;
    Ok(action)
}

async fn remove_data(mp: &MountPod, ctx: &Context) -> Result<Action, Error> {
    let current = mp.status.clone().unwrap_or_default();
    let host = ctx.host.clone();
    let source = mp.spec.source.clone();
    let volume = mp.spec.volume.clone();
    let (node, anchor) = (
        mp.spec.node_name.clone(),
        mp.spec.shared_root_anchor.clone(),
    );
    // Never "removed" from a directory that is not the one holding the data.
    let res = blocking(move || {
        host.check_shared(&source, &volume, &node, anchor.as_deref())?;
        host.remove_data(&source, &volume)
    })
    .await
    .map_err(Error::Join)?;
    let report = match res {
        Ok(_) => Report::task_done(
            "DataRemoved",
            "Removed",
            format!("{} removed", mp.spec.source),
        ),
        Err(e) => {
            let msg = error_chain(&e);
            let failure = match failure_reason(&e) {
                "BackendNotShared" => "BackendNotShared",
                _ => "RemoveDataFailed",
            };
            publish(ctx, mp, EventType::Warning, failure, &msg).await;
            Report::task_failed(failure, "DataRemoved", "RemoveFailed", msg)
        }
    };
    finish_task(mp, ctx, current, report).await
}

/// Write a one-shot task's outcome; a failed one is tried again in 10 s.
async fn finish_task(
    mp: &MountPod,
    ctx: &Context,
    mut current: MountPodStatus,
    report: Report,
) -> Result<Action, Error> {
    let failed = report.phase == MountPhase::Failed;
    write_status(mp, ctx, &mut current, report).await?;
    Ok(if failed {
        Action::requeue(Duration::from_secs(10))
    } else {
        Action::await_change()
    })
}

async fn delete(mp: &MountPod, ctx: &Context) -> Result<Action, Error> {
    if !mp.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let mut current = mp.status.clone().unwrap_or_default();
    if mp.spec.task == MountTask::Serve {
        if !mp.spec.references.is_empty() {
            let targets: Vec<&str> = mp
                .spec
                .references
                .iter()
                .map(|r| r.target_path.as_str())
                .collect();
            let msg = format!(
                "deletion waits: {} reference(s) remain: {}; the mount is kept until they are removed",
                targets.len(),
                targets.join(", ")
            );
            let mut report = Report::keep(&current, MountPhase::Terminating);
            report.ready = cond("Ready", false, "ReferencesRemain", msg);
            write_status(mp, ctx, &mut current, report).await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
        if let Ok(volume) = tessera_host::paths::component(&mp.spec.volume) {
            let host = ctx.host.clone();
            let volume = volume.to_string();
            let mountpoint = host.config.mount_root.join(&volume);
            let res = blocking(move || host.teardown(&volume, &mountpoint))
                .await
                .map_err(Error::Join)?;
            if let Err(e) = res {
                let msg = error_chain(&e);
                let mut report = Report::keep(&current, MountPhase::Terminating);
                report.ready = cond("Ready", false, "UnmountFailed", msg.clone());
                report.error = Some(msg);
                write_status(mp, ctx, &mut current, report).await?;
                return Err(Error::MountService(e));
            }
        }
        // The mount and its counters are gone: so is its claim (the map stays as
        // small as the node's mounts).
        if let Ok(mut claims) = ctx.metrics.claims.write() {
            claims.remove(&mp.spec.volume);
        }
        ctx.metrics.mount_gone(&mount_labels(ctx, mp));
    }
    let finalizers: Vec<String> = mp
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(mp, ctx, finalizers).await?;
    ctx.backoff.succeeded(&mp.name_any());
    info!("finalizer removed");
    Ok(Action::await_change())
}

/// Run node-side work on the blocking pool, inside the caller's span (volume, node).
fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
}

/// Replace the finalizers, guarded by the resourceVersion the decision was made on.
async fn patch_finalizers(
    mp: &MountPod,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let name = mp.name_any();
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": mp.resource_version()}});
    let params = PatchParams {
        field_manager: Some(ctx.field_manager.clone()),
        ..Default::default()
    };
    Api::<MountPod>::all(ctx.client.clone())
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .context(|| format!("updating the finalizers of MountPod {name}"))?;
    Ok(())
}

async fn write_status(
    mp: &MountPod,
    ctx: &Context,
    current: &mut MountPodStatus,
    report: Report,
) -> Result<(), Error> {
    let prev = mp.status.clone().unwrap_or_default();
    write_status_from(mp, ctx, &prev, current, report, jiff::Timestamp::now()).await
}

/// Compute the status from `prev` (the status this reconcile started from) and
/// apply it if it differs from `current` (what the API server has now). Writes of
/// one reconcile pass the same `now`, so an interim write and the final one agree
/// on every time they share.
async fn write_status_from(
    mp: &MountPod,
    ctx: &Context,
    prev: &MountPodStatus,
    current: &mut MountPodStatus,
    report: Report,
    now: jiff::Timestamp,
) -> Result<(), Error> {
    let status = next_status(prev, mp, report, now);
    if &status == current {
        return Ok(());
    }
    let name = mp.name_any();
    let body = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "MountPod", "status": status});
    Api::<MountPod>::all(ctx.client.clone())
        .patch_status(
            &name,
            &PatchParams::apply(&ctx.field_manager).force(),
            &Patch::Apply(&body),
        )
        .await
        .context(|| format!("writing the status of MountPod {name}"))?;
    debug!(phase = ?status.phase, pid = ?status.pid, restarts = status.restarts, "status written");
    *current = status;
    Ok(())
}

async fn publish(ctx: &Context, mp: &MountPod, type_: EventType, reason: &str, note: &str) {
    publish_on(ctx, &mp.object_ref(&()), type_, reason, note).await;
}

/// Publish an Event about any object (an application Pod, for one).
async fn publish_on(
    ctx: &Context,
    regarding: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.into()),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, regarding).await {
        debug!(error = %error_chain(&e), "publishing event");
    }
}

/// Every interval: reap exited children, ask the fd holder (start it again in process
/// mode), probe every mount that has answered once, and trigger a reconcile of each
/// broken one. Now and then, tear down mounts whose
/// MountPod no longer exists at all.
async fn health_loop(
    ctx: Arc<Context>,
    store: Store<MountPod>,
    trigger: mpsc::UnboundedSender<ObjectRef<MountPod>>,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let orphan_every =
        (Duration::from_secs(30).as_millis() / interval.as_millis().max(1)).max(1) as u64;
    let mut n: u64 = 0;
    let mut blocked_told = std::collections::HashSet::new();
    loop {
        tick.tick().await;
        n += 1;
        let host = ctx.host.clone();
        let checked = tokio::task::spawn_blocking(move || {
            host.daemons.reap();
            if let Some(h) = &host.holder {
                h.check();
            }
            let desired = host.daemons.image();
            let mut records = host.state.list().unwrap_or_default();
            records.sort_by(|a, b| a.volume.cmp(&b.volume));
            records
                .into_iter()
                .map(|r| {
                    let health = if r.answered {
                        host.health(&r)
                    } else {
                        Health::Starting
                    };
                    let candidate = upgrade::candidate(&host, &r, &health, desired.as_deref());
                    (r, health, candidate)
                })
                .collect::<Vec<_>>()
        })
        .await;
        let Ok(checked) = checked else { continue };
        for (record, health, _) in &checked {
            if let Health::Broken(why) = health {
                debug!(volume = %record.volume, cause = %why, "broken mount; reconciling");
                let _ = trigger.unbounded_send(ObjectRef::new(&record.mountpod));
            }
        }
        upgrade::plan(&ctx, &store, &trigger, &checked, &mut blocked_told).await;
        let checked: Vec<_> = checked.into_iter().map(|(r, h, _)| (r, h)).collect();
        // A MountPod deleted before its asked reconcile started is queued no more.
        ctx.metrics.reconcile_queue_retain("mountpod", |name| {
            store.get(&ObjectRef::new(name)).is_some()
        });
        if n.is_multiple_of(orphan_every) && store.wait_until_ready().await.is_ok() {
            for (record, _) in checked {
                if store.get(&ObjectRef::new(&record.mountpod)).is_none() {
                    teardown_orphan(&ctx, record).await;
                }
            }
        }
    }
}

/// A record whose MountPod is gone from the API server (not just from this agent's
/// view): stop and unmount it.
async fn teardown_orphan(ctx: &Context, record: super::supervisor::Record) {
    match Api::<MountPod>::all(ctx.client.clone())
        .get_opt(&record.mountpod)
        .await
    {
        Ok(None) => {}
        _ => return,
    }
    warn!(volume = %record.volume, mountpod = %record.mountpod, "MountPod is gone; tearing down its mount");
    let host = ctx.host.clone();
    let res =
        tokio::task::spawn_blocking(move || host.teardown(&record.volume, &record.mountpoint))
            .await;
    if let Ok(Err(e)) = res {
        warn!(error = %error_chain(&e), "tearing down an orphaned mount");
    }
}

#[cfg(test)]
mod tests {
    use super::status::tests::mountpod;
    use super::*;

    #[test]
    fn only_mountpods_owned_by_their_volume_are_served() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owner = |kind: &str, name: &str, controller: Option<bool>| OwnerReference {
            api_version: "tessera.io/v1alpha1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller,
            block_owner_deletion: None,
        };
        let table = [
            (vec![], false),
            (vec![owner("Volume", "v", Some(true))], true),
            (vec![owner("Volume", "other", Some(true))], false),
            (vec![owner("Volume", "v", None)], false),
            (vec![owner("VolumeAttachment", "v", Some(true))], false),
            (
                vec![owner("Pod", "x", None), owner("Volume", "v", Some(true))],
                true,
            ),
        ];
        for (owners, ok) in table {
            let mut mp = mountpod(1, 0);
            mp.metadata.owner_references = Some(owners.clone());
            assert_eq!(owned_by_its_volume(&mp).is_ok(), ok, "{owners:?}");
        }
    }
}
