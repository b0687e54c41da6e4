//! The API chain floor of one attach (issue 15, item 4): the API writes and watch
//! hops Tessera's design needs for an attach, issued with plain kube clients and no
//! Tessera process, timed in the same rounds as Tessera and the no-op driver.
//!
//! ```text
//!  "CSI driver" ──merge patch: ticket──▶ tessera.io VolumeAttachment
//!  "controller" watch sees it ──POST──▶ MountPod (the controller's body: labels,
//!       owner, agent finalizer, desired_spec)
//!  "agent" watch (its node's label) sees it ──SSA status Ready──▶ MountPod
//!  "controller" watch sees Ready ──SSA status, ticket satisfied──▶ VolumeAttachment
//!       (the status Tessera writes: one ticket status, Ready condition, counts;
//!        resourceVersion precondition, as for a single-node volume)
//!  "CSI driver" watch sees the ticket satisfied  ◀── the round's time ends here
//! ```
//!
//! A round is timed from just before the ticket's merge patch to the CSI driver's
//! watch event that shows the ticket satisfied. Each component has its own `Client`
//! (its own connections) and its own watches, started before the first round, as
//! the components have: the controller watches the VolumeAttachment and the
//! MountPods, the agent its node's MountPods, the CSI driver the VolumeAttachment by
//! name. What the floor leaves out, because Tessera does it on top of the chain: the
//! CSI driver's reads before its patch and its watch request after it (Tessera opens
//! that watch from the patched version; here it is already open), the controller's
//! decision and caches, the node agent's directories and settings files, and the
//! FUSE daemon's start (measured on its own by `daemon_start`, where asked for).
//!
//! The floor's Volume and VolumeAttachment (created once, as Tessera has them) and
//! its MountPods carry `tessera.io/test=<id>-floor`: the benchmark's own controller
//! and agent select `tessera.io/test=<id>` (an equality selector), so no Tessera
//! process ever acts on them. Between rounds (not timed) the ticket is removed, the
//! status reset to the one Tessera writes for no tickets, and the MountPod deleted
//! and its finalizer removed, as the agent does once unmounted; each round uses a
//! new ticket id of the same length (`csi-<sha256>`), and the controller only takes
//! the MountPod it created for that ticket (by uid) as its proof.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use tessera_api::CONDITION_READY;
use tessera_api::CONTROLLER_FIELD_MANAGER;
use tessera_api::{
    self as api, AppliedSettings, AttacherType, AttachmentTicket, AttachmentTicketStatus,
    LABEL_NODE, LABEL_VOLUME, MountPhase, MountPod, MountPodStatus, MountTask, Volume,
    VolumeAttachment, VolumeAttachmentSpec, VolumeAttachmentStatus, condition_status,
};
use tessera_controller::attachment::desired_spec;
use tessera_controller::attachment::status::REASON_TICKETS_SATISFIED;
use tessera_controller::owner::owner_reference;

use crate::csi_attach::va_name;
use crate::support::fixtures::{self, TEST_LABEL};
use crate::{Run, ms, pct};

/// The floor's three "components" and what the CSI driver's watch saw.
pub struct Floor {
    /// The Volume and VolumeAttachment (same name).
    name: String,
    node: String,
    csi: Client,
    controller: Client,
    agent: Client,
    satisfied: Arc<Satisfied>,
    tasks: Vec<JoinHandle<()>>,
    round: usize,
}

/// When the CSI driver's watch first saw each ticket satisfied.
#[derive(Default)]
struct Satisfied {
    at: Mutex<HashMap<String, Instant>>,
    changed: Notify,
}

impl Satisfied {
    async fn wait(&self, id: &str, timeout: Duration) -> Option<Instant> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(at) = self.at.lock().unwrap().get(id) {
                return Some(*at);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.at.lock().unwrap().get(id).copied();
            }
        }
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(CONTROLLER_FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

fn cond(type_: &str, reason: &str, message: String, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.into(),
        status: condition_status::TRUE.into(),
        reason: reason.into(),
        message,
        last_transition_time: now(),
        observed_generation: generation,
    }
}

/// The VolumeAttachment status Tessera writes for `va` with no tickets, or with
/// ticket `id` (on `node`) satisfied.
fn va_status(va: &VolumeAttachment, satisfied: Option<(&str, &str)>) -> VolumeAttachmentStatus {
    let generation = va.metadata.generation;
    let Some((id, node)) = satisfied else {
        return VolumeAttachmentStatus {
            observed_generation: generation,
            conditions: vec![cond(
                CONDITION_READY,
                REASON_TICKETS_SATISFIED,
                "no tickets".into(),
                generation,
            )],
            ..Default::default()
        };
    };
    let ticket = AttachmentTicketStatus {
        id: id.into(),
        satisfied: true,
        generation: 0,
        requested_at: Some(now()),
        // As the controller writes a satisfied ticket: no condition.
        conditions: vec![],
    };
    VolumeAttachmentStatus {
        attachment_ticket_statuses: BTreeMap::from([(id.to_string(), ticket)]),
        ticket_count: 1,
        satisfied_count: 1,
        nodes: vec![node.into()],
        node_list: node.into(),
        waiting: None,
        observed_generation: generation,
        conditions: vec![cond(
            CONDITION_READY,
            REASON_TICKETS_SATISFIED,
            "all 1 tickets satisfied".into(),
            generation,
        )],
    }
}

/// Server-side apply of `status` on VolumeAttachment `name` with the controller's
/// field manager; with `rv`, only if the object is still at that version.
async fn write_va_status(
    api: &Api<VolumeAttachment>,
    name: &str,
    rv: Option<String>,
    status: &VolumeAttachmentStatus,
) -> kube::Result<VolumeAttachment> {
    let mut body =
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment", "status": status});
    if let Some(rv) = rv {
        body["metadata"] = json!({"name": name, "resourceVersion": rv});
    }
    api.patch_status(
        name,
        &PatchParams::apply(CONTROLLER_FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
}

/// The MountPod the controller POSTs for `volume` on `node`: its apply body (watch
/// labels, node and volume labels, owner reference, desired spec) with the agent's
/// finalizer, as for a node with a registered agent.
fn mountpod_body(volume: &Volume, labels: &BTreeMap<String, String>, node: &str) -> MountPod {
    let spec = desired_spec(volume, node, false, MountTask::Serve).expect("a servable Volume");
    let name = volume.name_any();
    let mut labels = labels.clone();
    labels.insert(LABEL_NODE.into(), node.into());
    labels.insert(LABEL_VOLUME.into(), name.clone());
    serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "MountPod",
        "metadata": {
            "name": api::mountpod_name(&name, node),
            "labels": labels,
            "ownerReferences": [owner_reference(volume)],
            "finalizers": [api::MOUNT_FINALIZER],
        },
        "spec": {
            "volume": spec.volume,
            "nodeName": spec.node_name,
            "source": spec.source,
            "task": spec.task,
            "capacityBytes": spec.capacity_bytes,
            "readOnly": spec.read_only,
            "sharedBackend": spec.shared_backend,
            "mountOptions": spec.mount_options,
            "resources": spec.resources,
            "attrCacheSeconds": spec.attr_cache_seconds,
        }
    }))
    .expect("a well-formed MountPod")
}

/// The status the agent writes once a mount answers.
fn ready_status(mp: &MountPod) -> MountPodStatus {
    let pid = i64::from(std::process::id());
    let mount_point = format!("/var/lib/tessera/mounts/{}", mp.spec.volume);
    MountPodStatus {
        phase: Some(MountPhase::Ready),
        pid: Some(pid),
        conditions: vec![cond(
            "Ready",
            "Mounted",
            format!("fuse daemon {pid} serves {mount_point}"),
            mp.metadata.generation,
        )],
        mount_point: Some(mount_point),
        observed_generation: mp.metadata.generation,
        applied: Some(AppliedSettings::of(&mp.spec)),
        ..Default::default()
    }
}

/// A watch event, as the floor's components use it.
enum Seen {
    Va(Box<VolumeAttachment>),
    Mp(Box<MountPod>),
    MpGone(String),
    Synced,
    Other,
}

fn seen_va(ev: Result<Event<VolumeAttachment>, watcher::Error>) -> Seen {
    match ev {
        Ok(Event::Apply(va) | Event::InitApply(va)) => Seen::Va(Box::new(va)),
        Ok(Event::InitDone) => Seen::Synced,
        Ok(_) => Seen::Other,
        Err(e) => {
            eprintln!("  (floor: VolumeAttachment watch error, resuming: {e})");
            Seen::Other
        }
    }
}

fn seen_mp(ev: Result<Event<MountPod>, watcher::Error>) -> Seen {
    match ev {
        Ok(Event::Apply(mp) | Event::InitApply(mp)) => Seen::Mp(Box::new(mp)),
        Ok(Event::Delete(mp)) => Seen::MpGone(mp.name_any()),
        Ok(Event::InitDone) => Seen::Synced,
        Ok(_) => Seen::Other,
        Err(e) => {
            eprintln!("  (floor: MountPod watch error, resuming: {e})");
            Seen::Other
        }
    }
}

/// The "controller": for each new ticket, POST the MountPod; once the MountPod it
/// created for that ticket is Ready, write the ticket satisfied.
fn controller(
    client: Client,
    volume: Volume,
    selector: String,
    ready: tokio::sync::oneshot::Sender<()>,
) -> JoinHandle<()> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let mps: Api<MountPod> = Api::all(client);
    let cfg = watcher::Config::default().labels(&selector);
    let va_events = watcher::watcher(vas.clone(), cfg.clone()).map(seen_va);
    let mp_events = watcher::watcher(mps.clone(), cfg).map(seen_mp);
    let labels = volume.labels().clone();
    tokio::spawn(async move {
        let mut events = stream::select(va_events.boxed(), mp_events.boxed());
        let mut ready = Some(ready);
        let mut synced = 0;
        let mut va: Option<VolumeAttachment> = None;
        let mut cache: HashMap<String, MountPod> = HashMap::new();
        // The uid of the MountPod created for each ticket; the tickets written satisfied.
        let mut created: HashMap<String, String> = HashMap::new();
        let mut done: HashSet<String> = HashSet::new();
        while let Some(ev) = events.next().await {
            match ev {
                Seen::Va(v) => va = Some(*v),
                Seen::Mp(mp) => {
                    cache.insert(mp.name_any(), *mp);
                }
                Seen::MpGone(name) => {
                    cache.remove(&name);
                }
                Seen::Synced => {
                    synced += 1;
                    if synced == 2
                        && let Some(tx) = ready.take()
                    {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Seen::Other => continue,
            }
            let Some(va) = &va else { continue };
            for (id, ticket) in &va.spec.attachment_tickets {
                let node = &ticket.node_id;
                let Some(uid) = created.get(id) else {
                    let body = mountpod_body(&volume, &labels, node);
                    let params = PostParams {
                        field_manager: Some(CONTROLLER_FIELD_MANAGER.into()),
                        ..Default::default()
                    };
                    match mps.create(&params, &body).await {
                        Ok(mp) => {
                            created.insert(id.clone(), mp.uid().unwrap_or_default());
                        }
                        Err(e) => eprintln!("  (floor: creating MountPod for {id}: {e})"),
                    }
                    continue;
                };
                let mp_name = api::mountpod_name(&volume.name_any(), node);
                let proven = cache
                    .get(&mp_name)
                    .is_some_and(|mp| mp.uid().as_ref() == Some(uid) && mp.is_ready());
                if done.contains(id) || !proven {
                    continue;
                }
                let status = va_status(va, Some((id, node)));
                let name = va.name_any();
                let mut res = write_va_status(&vas, &name, va.resource_version(), &status).await;
                if let Err(kube::Error::Api(s)) = &res
                    && s.code == 409
                {
                    // The cache was behind: decide on a fresh read, as a requeue would.
                    let fresh = vas.get(&name).await.ok().and_then(|v| v.resource_version());
                    res = write_va_status(&vas, &name, fresh, &status).await;
                }
                match res {
                    Ok(_) => {
                        done.insert(id.clone());
                    }
                    Err(e) => eprintln!("  (floor: writing ticket {id} satisfied: {e})"),
                }
            }
        }
    })
}

/// The "agent": each new MountPod of its node is reported Ready (server-side apply,
/// the agent's field manager).
fn agent(
    client: Client,
    selector: String,
    node: String,
    ready: tokio::sync::oneshot::Sender<()>,
) -> JoinHandle<()> {
    let mps: Api<MountPod> = Api::all(client);
    let cfg = watcher::Config::default().labels(&format!("{selector},{LABEL_NODE}={node}"));
    let field_manager = format!("tessera-node-{node}");
    tokio::spawn(async move {
        let mut events = watcher::watcher(mps.clone(), cfg).map(seen_mp).boxed();
        let mut ready = Some(ready);
        let mut served: HashSet<String> = HashSet::new();
        while let Some(ev) = events.next().await {
            let mp = match ev {
                Seen::Mp(mp) => mp,
                Seen::Synced => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                _ => continue,
            };
            let uid = mp.uid().unwrap_or_default();
            if mp.metadata.deletion_timestamp.is_some() || served.contains(&uid) {
                continue;
            }
            let body = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
                "status": ready_status(&mp)});
            match mps
                .patch_status(
                    &mp.name_any(),
                    &PatchParams::apply(&field_manager).force(),
                    &Patch::Apply(&body),
                )
                .await
            {
                Ok(_) => {
                    served.insert(uid);
                }
                Err(e) => eprintln!("  (floor: Ready status of {}: {e})", mp.name_any()),
            }
        }
    })
}

/// The "CSI driver"'s watch of the VolumeAttachment `name`: when each ticket was
/// first seen satisfied.
fn csi_watch(
    client: Client,
    name: &str,
    satisfied: Arc<Satisfied>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> JoinHandle<()> {
    let vas: Api<VolumeAttachment> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = watcher::watcher(vas, cfg).map(seen_va).boxed();
        let mut ready = Some(ready);
        while let Some(ev) = events.next().await {
            let at = Instant::now();
            match ev {
                Seen::Va(va) => {
                    let mut seen = satisfied.at.lock().unwrap();
                    for id in va.spec.attachment_tickets.keys() {
                        if va.ticket_satisfied(id) {
                            seen.entry(id.clone()).or_insert(at);
                        }
                    }
                }
                Seen::Synced => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
            satisfied.changed.notify_waiters();
        }
    })
}

impl Floor {
    /// Create the floor's Volume (backend `root`) and VolumeAttachment for test `id`
    /// on `node`, start the three components' watches, and wait until they have listed.
    pub async fn start(
        config: &Config,
        client: &Client,
        id: &str,
        node: &str,
        root: &Path,
    ) -> Floor {
        let client_of = || Client::try_from(config.clone()).expect("client");
        let (csi, controller_client, agent_client) = (client_of(), client_of(), client_of());
        let floor_id = format!("{id}-floor");
        let name = floor_id.clone();
        let volume = fixtures::volume_at(&name, &floor_id, "ReadWriteOnce", root, false);
        let volume = Api::<Volume>::all(client.clone())
            .create(&PostParams::default(), &volume)
            .await
            .unwrap_or_else(|e| panic!("creating the floor's Volume {name}: {e}"));
        let mut va = VolumeAttachment::new(
            &name,
            VolumeAttachmentSpec {
                volume: name.clone(),
                attachment_tickets: BTreeMap::new(),
            },
        );
        va.metadata.labels = Some(volume.labels().clone());
        va.metadata.owner_references = Some(vec![owner_reference(&volume)]);
        let vas: Api<VolumeAttachment> = Api::all(controller_client.clone());
        let va = vas
            .create(&PostParams::default(), &va)
            .await
            .unwrap_or_else(|e| panic!("creating the floor's VolumeAttachment {name}: {e}"));
        write_va_status(&vas, &name, None, &va_status(&va, None))
            .await
            .expect("the floor's VolumeAttachment status");

        let selector = format!("{TEST_LABEL}={floor_id}");
        let satisfied = Arc::new(Satisfied::default());
        let (tx, rx): (Vec<_>, Vec<_>) = (0..3).map(|_| tokio::sync::oneshot::channel()).unzip();
        let mut tx = tx.into_iter();
        let tasks = vec![
            controller(
                controller_client.clone(),
                volume,
                selector.clone(),
                tx.next().unwrap(),
            ),
            agent(
                agent_client.clone(),
                selector,
                node.into(),
                tx.next().unwrap(),
            ),
            csi_watch(csi.clone(), &name, satisfied.clone(), tx.next().unwrap()),
        ];
        for r in rx {
            r.await.expect("the floor's watches started");
        }
        Floor {
            name,
            node: node.into(),
            csi,
            controller: controller_client,
            agent: agent_client,
            satisfied,
            tasks,
            round: 0,
        }
    }

    /// One round: the ticket's merge patch to the CSI driver's watch seeing it
    /// satisfied (`None` if not within `timeout`); then, untimed, back to no ticket.
    pub async fn round(&mut self, timeout: Duration) -> Option<Duration> {
        self.round += 1;
        let id = va_name(
            &format!("{}-r{}", self.name, self.round),
            api::CSI_DRIVER_NAME,
            &self.node,
        );
        let mut ticket = AttachmentTicket::new(&id, AttacherType::CsiAttacher, &self.node);
        ticket.parameters.insert("readOnly".into(), "false".into());
        let vas: Api<VolumeAttachment> = Api::all(self.csi.clone());
        let t0 = Instant::now();
        vas.patch(
            &self.name,
            &patch_params(),
            &Patch::Merge(ticket.upsert_patch()),
        )
        .await
        .unwrap_or_else(|e| panic!("floor: adding ticket {id}: {e}"));
        let done = self.satisfied.wait(&id, timeout).await;
        if done.is_none() {
            eprintln!("  warning: floor ticket {id} not satisfied within {timeout:?}");
        }
        self.reset(&id).await;
        done.map(|at| at.saturating_duration_since(t0))
    }

    /// Back to no ticket: ticket removed (CSI driver), status for no tickets and
    /// MountPod deleted (controller), finalizer removed (agent); waits until gone.
    async fn reset(&self, id: &str) {
        let vas: Api<VolumeAttachment> = Api::all(self.csi.clone());
        let va = vas
            .patch(
                &self.name,
                &patch_params(),
                &Patch::Merge(api::tickets_removal_patch([id])),
            )
            .await
            .unwrap_or_else(|e| panic!("floor: removing ticket {id}: {e}"));
        let ctrl_vas: Api<VolumeAttachment> = Api::all(self.controller.clone());
        if let Err(e) = write_va_status(&ctrl_vas, &self.name, None, &va_status(&va, None)).await {
            eprintln!("  (floor: resetting the status: {e})");
        }
        let mp_name = api::mountpod_name(&self.name, &self.node);
        let mps: Api<MountPod> = Api::all(self.controller.clone());
        let _ = mps.delete(&mp_name, &DeleteParams::default()).await;
        let _ = Api::<MountPod>::all(self.agent.clone())
            .patch(
                &mp_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let t = Instant::now();
        while mps.get_opt(&mp_name).await.ok().flatten().is_some() {
            if t.elapsed() > Duration::from_secs(30) {
                eprintln!("  warning: floor MountPod {mp_name} still present after 30 s");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stop the components and delete the floor's objects.
    pub async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        let dp = DeleteParams::default();
        let _ = Api::<VolumeAttachment>::all(self.csi.clone())
            .delete(&self.name, &dp)
            .await;
        let _ = Api::<Volume>::all(self.csi.clone())
            .delete(&self.name, &dp)
            .await;
    }
}

/// The floor of an attach through the csi-attacher: the no-op driver's time plus the
/// API chain's (`floor_ms = noop + chain`, at p50 and at p99), with the FUSE daemon's
/// start where asked, and Tessera's time ÷ it. `runs`: Tessera, no-op, chain, start.
pub struct Figures {
    pub p50: Duration,
    pub p99: Duration,
    pub ratio_p50: f64,
    pub ratio_p99: f64,
}

impl Figures {
    pub fn of(runs: &[Option<Run>], with_start: bool) -> Option<Figures> {
        let parts: Vec<&Run> = [&runs[1], &runs[2]]
            .into_iter()
            .chain(with_start.then_some(&runs[3]))
            .map(|r| r.as_ref().filter(|r| !r.attach.is_empty()))
            .collect::<Option<_>>()?;
        let t = runs[0].as_ref().filter(|r| !r.attach.is_empty())?;
        let sum = |q| parts.iter().map(|r| pct(&r.attach, q)).sum::<Duration>();
        let (p50, p99) = (sum(0.5), sum(0.99));
        Some(Figures {
            p50,
            p99,
            ratio_p50: pct(&t.attach, 0.5).as_secs_f64() / p50.as_secs_f64(),
            ratio_p99: pct(&t.attach, 0.99).as_secs_f64() / p99.as_secs_f64(),
        })
    }
}

/// The human table's rows of the API chain floor and of the daemon start, for the
/// contenders that ran in this scenario.
pub fn table_rows(label: &str, runs: &[Option<Run>]) -> Vec<String> {
    let cell = |r: &Run| {
        let failed = if r.failed > 0 {
            format!(" ({} failed)", r.failed)
        } else {
            String::new()
        };
        format!(
            "{:.1} / {:.1}{failed}",
            ms(pct(&r.attach, 0.5)),
            ms(pct(&r.attach, 0.99))
        )
    };
    let floor = |with_start| match Figures::of(runs, with_start) {
        Some(f) => format!(
            "{:.0} / {:.0} | tessera ÷ floor: {:.2} / {:.2}",
            ms(f.p50),
            ms(f.p99),
            f.ratio_p50,
            f.ratio_p99
        ),
        None => "- | -".into(),
    };
    let mut rows = Vec::new();
    if let Some(c) = &runs[2] {
        rows.push(format!(
            "| {label}: API chain floor | chain: {} | floor = noop + chain: {} | - | plain kube clients, no Tessera process (bench/attach/chain.rs) |",
            cell(c),
            floor(false)
        ));
    }
    if let Some(s) = &runs[3] {
        rows.push(format!(
            "| {label}: FUSE daemon start | start: {} | floor = noop + chain + start: {} | - | spawn to mount answers (bench/attach/daemon_start.rs) |",
            cell(s),
            floor(true)
        ));
    }
    rows
}
