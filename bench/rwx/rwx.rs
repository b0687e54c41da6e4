//! Benchmark: one ReadWriteMany volume used by many nodes, through the real
//! external-attacher and a real `tessera controller --csi-endpoint` (release build) on
//! the cluster under test. For each scale N (`BENCH_RWX_SCALES`, default
//! `50,50,50,500`: the small scale thrice, its phases last about half a second): N
//! Nodes with their CSINodes, one RWX Volume and its PersistentVolume, then N
//! storage.k8s.io VolumeAttachments, one per node, created at once (as the
//! attach-detach controller would for N Pods on N nodes); the `csi-attacher`
//! (bench/csi_attach.rs, `BENCH_ATTACHER_*`) calls ControllerPublish for each, which
//! puts a ticket on the volume's Tessera VolumeAttachment and waits until it is
//! satisfied. MountPod status is driven by the test fixtures' stand-in agent. Timed
//! from the first create to the last VolumeAttachment seen `attached`; then all are
//! deleted (ControllerUnpublish) and the time until all are gone is reported too.
//! Past `MAX_TICKETS` nodes (1024: the most tickets one VolumeAttachment holds),
//! Tessera attaches on that many and the phase ends once every other one has been
//! refused for the cap (its attach error says so): BENCH keys `n<N>_failed` (not
//! attached) and `n<N>_tickets`, `n<N>_object_bytes` (the stored object).
//! Just before, at each scale, the same N attaches and detaches go through the no-op
//! baseline driver (bench/attach/refdriver: ControllerPublish returns at once) behind
//! a csi-attacher of the same settings, on the same nodes: the floor of the attach
//! path (attacher, API server, etcd), and Tessera's time and CPU as ratios to it.
//!
//! Prints per scale: wall time, the CPU seconds of kube-apiserver and etcd (the
//! control plane is the bottleneck here), of the controller and the attacher, the
//! requests the API server served for Tessera's kinds by resource and verb (its own
//! `apiserver_request_total`) and per ticket, and the size of the Tessera
//! VolumeAttachment once all were attached (bytes per ticket in spec, status and
//! managedFields). Then the ratios of the largest scale to each smaller one (keys
//! `cpu_n<L>_over_n<S>`, …), against linear in the nodes and in the tickets held
//! (issue 15: 500 at most 15× 50; issue 34: 5,000 at most 10× 500); a scale run more
//! than once counts by its medians, and its median run (by the attach's API server +
//! etcd CPU) gives its keys of the BENCH line.
//!
//! Ends with one `BENCH rwx key=value …` line (bench/bench_line.rs), keys `n<N>_…`.
//!
//! Run: `make bench-rwx` (or `cargo bench --bench rwx`). Figures: bench/rwx/README.md.

mod attachments;
#[path = "../bench_line.rs"]
mod bench_line;
#[path = "../csi_attach.rs"]
mod csi_attach;
#[path = "../procs.rs"]
mod procs;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use tessera_api::{CSI_DRIVER_NAME, MAX_TICKETS, MOUNT_FINALIZER, MountPod, VolumeAttachment};

use attachments::Attachments;
use bench_line::{BenchLine, loadavg};
use csi_attach::{
    NOOP_DRIVER, Seen, Sidecar, create_csinode, start_noop_driver, wait_socket, watch_attachments,
};
use support::fixtures::{self, ControllerProcess, FakeAgent, TEST_LABEL};

/// What one scale measured.
struct Run {
    n: usize,
    /// From the first storage VolumeAttachment created to the last seen attached.
    wall: Duration,
    /// VolumeAttachments not attached within the timeout.
    failed: usize,
    /// From the first delete to the last VolumeAttachment gone (detach).
    detach: Duration,
    /// CPU seconds by process, while attaching.
    cpu: BTreeMap<String, f64>,
    /// API server requests by "resource[/subresource] VERB", while attaching.
    requests: BTreeMap<String, f64>,
    /// Bytes of the Tessera VolumeAttachment's JSON once all were attached: spec,
    /// status, managedFields.
    bytes: (usize, usize, usize),
    /// The whole object's bytes (as stored: the JSON a GET returns), and the tickets
    /// it held (fewer than `n` past `MAX_TICKETS` nodes).
    object_bytes: usize,
    tickets: usize,
    /// PATCHes of the Tessera VolumeAttachment (the tickets) and status writes, by the
    /// controller process (its CSI service and its reconciler).
    ticket_writes: f64,
    va_status_writes: f64,
    /// Watch events the API server sent of Tessera VolumeAttachments, and their bytes
    /// (every watcher: the controller's, each waiting ControllerPublish's).
    watch_events: (f64, f64),
    /// The most sockets the controller process held (its API server connections),
    /// while attaching and while detaching.
    peak_sockets: (usize, usize),
    /// CPU seconds by process and API server requests, while detaching.
    detach_cpu: BTreeMap<String, f64>,
    detach_requests: BTreeMap<String, f64>,
    /// The same attach and detach through the no-op driver, just before.
    noop: Baseline,
}

/// N VolumeAttachments of one PersistentVolume of the no-op driver on the same nodes,
/// through its own csi-attacher of the same settings: the floor of the attach path
/// (attacher, API server, etcd) at this scale.
struct Baseline {
    wall: Duration,
    failed: usize,
    detach: Duration,
    /// API server + etcd CPU seconds, attaching and detaching.
    cpu: f64,
    detach_cpu: f64,
}

/// Attach and detach the no-op driver's PersistentVolume on `nodes` (their CSINodes
/// name it), through a csi-attacher of the same settings.
async fn baseline(
    client: &kube::Client,
    id: &str,
    nodes: &[String],
    seen: &Seen,
    sidecar: &Sidecar,
    logs: &Path,
) -> Baseline {
    let sock = logs.join(format!("{id}-noop.sock"));
    let _driver = start_noop_driver(&sock, &logs.join(format!("{id}-noop-driver.log")));
    wait_socket(&sock, "csi-noop-driver's socket").await;
    let n = nodes.len();
    let _attacher = sidecar.start(&sock, &logs.join(format!("csi-attacher-noop-{n}.log")));
    let name = format!("{id}-noop");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(&PostParams::default(), &pv(&name, NOOP_DRIVER, id))
        .await
        .expect("creating the no-op driver's PersistentVolume");
    let attachments = Attachments {
        client,
        id,
        driver: NOOP_DRIVER,
        pv: &name,
        nodes,
        seen,
    };
    let plane = || {
        procs::cluster_pids(&support::repo_root(), &["kube-apiserver", "etcd"])
            .into_values()
            .map(procs::proc_cpu_seconds)
            .sum::<f64>()
    };
    let cpu0 = plane();
    let (wall, failed) = attachments.attach(Duration::from_secs(900), None).await;
    let cpu1 = plane();
    let detach = attachments.detach(Duration::from_secs(600)).await;
    let detach_cpu = plane() - cpu1;
    let _ = pvs.delete(&name, &DeleteParams::default()).await;
    Baseline {
        wall,
        failed,
        detach,
        cpu: cpu1 - cpu0,
        detach_cpu,
    }
}

/// The API server's count and bytes of watch events of Tessera VolumeAttachments
/// (`apiserver_watch_events_total`, `apiserver_watch_events_sizes_sum`).
fn watch_events() -> (f64, f64) {
    let text = support::kubectl_output(&["get", "--raw", "/metrics"]);
    let get = |metric: &str| {
        procs::samples(&text, metric, &["group", "resource"])
            .get("tessera.io volumeattachments")
            .copied()
            .unwrap_or(0.0)
    };
    (
        get("apiserver_watch_events_total"),
        get("apiserver_watch_events_sizes_sum"),
    )
}

fn cpu_now(controller: u32, attacher: u32) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> =
        procs::cluster_pids(&support::repo_root(), &["kube-apiserver", "etcd"])
            .into_iter()
            .map(|(c, pid)| (c, procs::proc_cpu_seconds(pid)))
            .collect();
    out.insert(
        "tessera-controller".into(),
        procs::proc_cpu_seconds(controller),
    );
    out.insert("csi-attacher".into(), procs::proc_cpu_seconds(attacher));
    out.insert("bench".into(), procs::proc_cpu_seconds(std::process::id()));
    out
}

fn delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// The controller process's requests to the API server on VolumeAttachments:
/// (PATCHes of the object, i.e. ticket writes; writes of its status).
fn va_writes(ctrl: &ControllerProcess) -> (f64, f64) {
    let mut out = (0.0, 0.0);
    for (l, v) in support::api_requests(&ctrl.metrics().unwrap_or_default()) {
        if l["resource"] != "volumeattachments" || l["group"] != "tessera.io" {
            continue;
        }
        match (l["verb"].as_str(), l["subresource"].as_str()) {
            ("PATCH", "") => out.0 += v,
            (verb, "status") if verb != "GET" => out.1 += v,
            _ => {}
        }
    }
    out
}

/// What the node agent does once a MountPod being deleted is unmounted, and the
/// stand-in agent does not: drop its `tessera.io/mount` finalizer, for every MountPod
/// of test `id` (so that ControllerUnpublish, waiting for the MountPod to go,
/// returns). Stops when dropped.
struct ReleaseMounts(tokio::task::JoinHandle<()>);

impl ReleaseMounts {
    fn start(client: kube::Client, id: &str) -> Self {
        use kube::runtime::{WatchStreamExt, watcher};
        let api: Api<MountPod> = Api::all(client);
        let wc = watcher::Config::default().labels(&format!("{TEST_LABEL}={id}"));
        ReleaseMounts(tokio::spawn(async move {
            let mut stream = watcher(api.clone(), wc).applied_objects().boxed();
            while let Some(res) = stream.next().await {
                let Ok(mp) = res else { continue };
                let held = mp
                    .metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| f.iter().any(|f| f == MOUNT_FINALIZER));
                if mp.metadata.deletion_timestamp.is_none() || !held {
                    continue;
                }
                let name = mp.metadata.name.clone().unwrap_or_default();
                let patch = json!({"metadata": {"finalizers": null}});
                let api = api.clone();
                tokio::spawn(async move {
                    let _ = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                });
            }
        }))
    }
}

impl Drop for ReleaseMounts {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A ReadWriteMany PersistentVolume of `driver` for volume handle `name`.
fn pv(name: &str, driver: &str, id: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {TEST_LABEL: id}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "volumeMode": "Filesystem",
            "csi": {"driver": driver, "volumeHandle": name},
        }
    }))
    .unwrap()
}

async fn run_scale(client: &kube::Client, n: usize, sidecar: &Sidecar, logs: &Path) -> Run {
    let id = support::unique_name("rwx");
    let nodes: Vec<String> = (0..n).map(|i| format!("{id}-n{i}")).collect();
    fixtures::create_nodes(client, &nodes).await;
    stream::iter(
        nodes
            .iter()
            .map(|node| create_csinode(client, node, &[CSI_DRIVER_NAME, NOOP_DRIVER])),
    )
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;
    let sock = logs.join(format!("{id}.sock"));
    let ctrl = ControllerProcess::start(
        &id,
        &[
            "--no-leader-election",
            &format!("--csi-endpoint=unix://{}", sock.display()),
        ],
    );
    let sockets = procs::SocketPeak::start(ctrl.child.id());
    let _agent = FakeAgent::start(client.clone(), &id);
    let _release = ReleaseMounts::start(client.clone(), &id);
    wait_socket(&sock, "tessera controller's CSI socket").await;
    let attacher = sidecar.start(&sock, &logs.join(format!("csi-attacher-{n}.log")));
    let name = format!("{id}-v");
    fixtures::create_volume(
        client,
        &fixtures::volume(&name, &id, "ReadWriteMany"),
        Duration::from_secs(60),
    )
    .await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(&PostParams::default(), &pv(&name, CSI_DRIVER_NAME, &id))
        .await
        .expect("creating the PersistentVolume");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    // Settle: the controller has written the empty VolumeAttachment's first status.
    fixtures::eventually(Duration::from_secs(60), "first status", || async {
        vas.get(&name).await.ok()?.status.map(|_| ())
    })
    .await;
    let (seen, ready) = watch_attachments(client.clone(), &id);
    ready.await.expect("VolumeAttachment watch started");
    let noop = baseline(client, &id, &nodes, &seen, sidecar, logs).await;
    let tessera = Attachments {
        client,
        id: &id,
        driver: CSI_DRIVER_NAME,
        pv: &name,
        nodes: &nodes,
        seen: &seen,
    };

    let writes0 = va_writes(&ctrl);
    let events0 = watch_events();
    let req0 = procs::apiserver_requests();
    let cpu0 = cpu_now(ctrl.child.id(), attacher.0.id());
    // Past MAX_TICKETS nodes, that many attach and the rest are refused for the cap.
    let cap = (n > MAX_TICKETS).then_some(MAX_TICKETS);
    let (wall, failed) = tessera.attach(Duration::from_secs(900), cap).await;
    let cpu = delta(&cpu_now(ctrl.child.id(), attacher.0.id()), &cpu0);
    let requests = delta(&procs::apiserver_requests(), &req0);
    let writes1 = va_writes(&ctrl);
    let events1 = watch_events();
    let va =
        serde_json::to_value(vas.get(&name).await.expect("reading the VolumeAttachment")).unwrap();
    let size = |v: &serde_json::Value| v.to_string().len();
    let bytes = (
        size(&va["spec"]),
        size(&va["status"]),
        size(&va["metadata"]["managedFields"]),
    );
    let object_bytes = size(&va);
    let tickets = va["spec"]["attachmentTickets"]
        .as_object()
        .map_or(0, |t| t.len());

    let attach_sockets = sockets.peak();
    drop(sockets);

    // Detach: delete them all (ControllerUnpublish for each), wait until all are gone.
    let sockets = procs::SocketPeak::start(ctrl.child.id());
    let req1 = procs::apiserver_requests();
    let cpu1 = cpu_now(ctrl.child.id(), attacher.0.id());
    let detach = tessera.detach(Duration::from_secs(600)).await;
    let detach_cpu = delta(&cpu_now(ctrl.child.id(), attacher.0.id()), &cpu1);
    let detach_requests = delta(&procs::apiserver_requests(), &req1);
    let detach_sockets = sockets.peak();

    // Clean up: the PV (its attacher finalizer), the Volume (its MountPods and
    // VolumeAttachment go with it), then the nodes, and wait until the MountPods are
    // gone before the next scale.
    drop(attacher);
    let _ = pvs.delete(&name, &DeleteParams::default()).await;
    let patch = json!({"metadata": {"finalizers": null}});
    let _ = pvs
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    fixtures::delete_volumes(client, std::slice::from_ref(&name)).await;
    let mps: Api<MountPod> = Api::all(client.clone());
    let selector = ListParams::default().labels(&format!("{TEST_LABEL}={id}"));
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(300) {
        let left = mps
            .list_metadata(&selector)
            .await
            .map_or(1, |l| l.items.len());
        let va_left = vas.get_opt(&name).await.ok().flatten().is_some();
        if left == 0 && !va_left {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let csinodes: Api<CSINode> = Api::all(client.clone());
    stream::iter(nodes.iter().map(|node| {
        let csinodes = csinodes.clone();
        async move {
            let _ = csinodes.delete(node, &DeleteParams::default()).await;
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;
    fixtures::delete_nodes(client, &nodes).await;
    drop(ctrl);
    Run {
        n,
        wall,
        failed,
        detach,
        cpu,
        requests,
        bytes,
        object_bytes,
        tickets,
        ticket_writes: writes1.0 - writes0.0,
        va_status_writes: writes1.1 - writes0.1,
        watch_events: (events1.0 - events0.0, events1.1 - events0.1),
        peak_sockets: (attach_sockets, detach_sockets),
        detach_cpu,
        detach_requests,
        noop,
    }
}

impl Run {
    /// Tessera's attach, API server + etcd CPU while attaching, and detach, each over
    /// the no-op driver's at this scale.
    fn over_noop(&self) -> (f64, f64, f64) {
        let b = &self.noop;
        (
            self.wall.as_secs_f64() / b.wall.as_secs_f64().max(0.001),
            plane_cpu(&self.cpu) / b.cpu.max(0.01),
            self.detach.as_secs_f64() / b.detach.as_secs_f64().max(0.001),
        )
    }
}

/// " (N NOT attached)", or nothing when all were.
fn not_attached(failed: usize) -> String {
    match failed {
        0 => String::new(),
        n => format!(" ({n} NOT attached)"),
    }
}

fn print_run(r: &Run) {
    let n = r.n as f64;
    println!();
    println!("RWX: one volume, {} tickets on {} nodes", r.n, r.n);
    println!(
        "  all attached after                         {:>8.2} s{}",
        r.wall.as_secs_f64(),
        not_attached(r.failed)
    );
    println!(
        "  all detached after                         {:>8.2} s",
        r.detach.as_secs_f64()
    );
    let b = &r.noop;
    let (wall_x, cpu_x, detach_x) = r.over_noop();
    println!(
        "  no-op driver, same attacher settings: attached after {:.2} s{} ({:.2}× for Tessera), detached after {:.2} s ({:.2}×); API server + etcd CPU {:.2} s attaching ({:.2}×), {:.2} s detaching",
        b.wall.as_secs_f64(),
        not_attached(b.failed),
        wall_x,
        b.detach.as_secs_f64(),
        detach_x,
        b.cpu,
        cpu_x,
        b.detach_cpu
    );
    println!(
        "  controller peak open sockets               {:>8} attaching, {} detaching",
        r.peak_sockets.0, r.peak_sockets.1
    );
    for (phase, cpu, requests) in [
        ("attaching", &r.cpu, &r.requests),
        ("detaching", &r.detach_cpu, &r.detach_requests),
    ] {
        println!("  CPU seconds, {phase}");
        for (k, v) in cpu {
            println!("    {k:<40} {v:>8.2}");
        }
        println!("  API server requests (per ticket), {phase}");
        for (k, v) in requests {
            println!("    {k:<40} {v:>8.0} ({:.2})", v / n);
        }
    }
    println!(
        "  Tessera VolumeAttachment writes by the controller process: tickets {:.0} ({:.3} per ticket), status {:.0} ({:.3} per ticket)",
        r.ticket_writes,
        r.ticket_writes / n,
        r.va_status_writes,
        r.va_status_writes / n
    );
    println!(
        "  watch events of Tessera VolumeAttachments sent: {:.0} ({:.1} per ticket), {:.1} MB ({:.1} KB per ticket)",
        r.watch_events.0,
        r.watch_events.0 / n,
        r.watch_events.1 / 1e6,
        r.watch_events.1 / 1e3 / n
    );
    let (spec, status, managed) = r.bytes;
    let t = r.tickets.max(1) as f64;
    println!(
        "  VolumeAttachment: {} tickets, {} bytes; spec {spec} ({:.0}/ticket), status {status} ({:.0}/ticket), managedFields {managed} ({:.0}/ticket)",
        r.tickets,
        r.object_bytes,
        spec as f64 / t,
        status as f64 / t,
        managed as f64 / t
    );
}

/// The runs of one scale, and which is the median by the attach's control-plane CPU.
struct Scale {
    n: usize,
    runs: Vec<Run>,
    median: usize,
}

/// The runs grouped by scale, smallest first.
fn by_scale(runs: Vec<Run>) -> Vec<Scale> {
    let mut groups: BTreeMap<usize, Vec<Run>> = BTreeMap::new();
    for r in runs {
        groups.entry(r.n).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(n, mut runs)| {
            runs.sort_by(|a, b| plane_cpu(&a.cpu).total_cmp(&plane_cpu(&b.cpu)));
            let median = (runs.len() - 1) / 2;
            Scale { n, runs, median }
        })
        .collect()
}

/// kube-apiserver + etcd CPU seconds among `cpu`.
fn plane_cpu(cpu: &BTreeMap<String, f64>) -> f64 {
    cpu.get("kube-apiserver").copied().unwrap_or(0.0) + cpu.get("etcd").copied().unwrap_or(0.0)
}

/// The median of `v` (the mean of the middle two for an even count; 0 if empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        k if k % 2 == 1 => v[k / 2],
        k => (v[k / 2 - 1] + v[k / 2]) / 2.0,
    }
}

/// Writes (anything but reads and watches) among `requests`.
fn writes(requests: &BTreeMap<String, f64>) -> f64 {
    requests
        .iter()
        .filter(|(k, _)| !["GET", "LIST", "WATCH"].iter().any(|v| k.ends_with(v)))
        .map(|(_, v)| v)
        .sum()
}

/// Reads (GET and LIST, not watches) among `requests`.
fn reads(requests: &BTreeMap<String, f64>) -> f64 {
    requests
        .iter()
        .filter(|(k, _)| ["GET", "LIST"].iter().any(|v| k.ends_with(v)))
        .map(|(_, v)| v)
        .sum()
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("RWX benchmark: run it with `cargo bench --bench rwx`");
        return;
    }
    let scales: Vec<usize> = std::env::var("BENCH_RWX_SCALES")
        .unwrap_or_else(|_| "50,50,50,500".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let sidecar = Sidecar::from_env();
    let load_before = loadavg();
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let logs = tempfile::Builder::new()
        .prefix("tessera-bench-rwx-")
        .tempdir()
        .unwrap()
        .keep();
    println!(
        "csi-attacher {}; logs: {}",
        sidecar.describe(),
        logs.display()
    );
    let mut runs = Vec::new();
    for n in scales {
        let r = run_scale(&client, n, &sidecar, &logs).await;
        print_run(&r);
        runs.push(r);
    }
    let scales = by_scale(runs);
    let mut line = BenchLine::new("rwx");
    for s in &scales {
        let r = &s.runs[s.median];
        let p = format!("n{}", r.n);
        line = line.field(&format!("{p}_runs"), s.runs.len());
        let api_cpu = r.cpu.get("kube-apiserver").copied().unwrap_or(0.0);
        let etcd_cpu = r.cpu.get("etcd").copied().unwrap_or(0.0);
        let (wall_x, cpu_x, detach_x) = r.over_noop();
        // Bytes per ticket are per ticket held (fewer than the nodes past the cap).
        let held = r.tickets.max(1) as f64;
        line = line
            .num(&format!("{p}_wall_s"), r.wall.as_secs_f64(), 2)
            .num(&format!("{p}_failed"), r.failed as f64, 0)
            .field(&format!("{p}_tickets"), r.tickets)
            .field(&format!("{p}_object_bytes"), r.object_bytes)
            .num(&format!("{p}_noop_wall_s"), r.noop.wall.as_secs_f64(), 2)
            .num(&format!("{p}_noop_failed"), r.noop.failed as f64, 0)
            .num(&format!("{p}_wall_over_noop"), wall_x, 2)
            .num(&format!("{p}_cpu_over_noop"), cpu_x, 2)
            .num(&format!("{p}_detach_over_noop"), detach_x, 2)
            .num(
                &format!("{p}_watch_kb_per_ticket"),
                r.watch_events.1 / 1e3 / r.n as f64,
                1,
            )
            .num(&format!("{p}_detach_s"), r.detach.as_secs_f64(), 2)
            .field(&format!("{p}_attach_peak_sockets"), r.peak_sockets.0)
            .field(&format!("{p}_detach_peak_sockets"), r.peak_sockets.1)
            .num(
                &format!("{p}_detach_apiserver_cpu_s"),
                r.detach_cpu.get("kube-apiserver").copied().unwrap_or(0.0),
                2,
            )
            .num(
                &format!("{p}_detach_reads_per_ticket"),
                reads(&r.detach_requests) / r.n as f64,
                2,
            )
            .num(
                &format!("{p}_ticket_writes_per_ticket"),
                r.ticket_writes / r.n as f64,
                3,
            )
            .num(&format!("{p}_apiserver_cpu_s"), api_cpu, 2)
            .num(&format!("{p}_etcd_cpu_s"), etcd_cpu, 2)
            .num(
                &format!("{p}_controller_cpu_s"),
                r.cpu.get("tessera-controller").copied().unwrap_or(0.0),
                2,
            )
            .num(
                &format!("{p}_writes_per_ticket"),
                writes(&r.requests) / r.n as f64,
                2,
            )
            .num(
                &format!("{p}_va_status_writes_per_ticket"),
                r.va_status_writes / r.n as f64,
                3,
            )
            .num(
                &format!("{p}_status_bytes_per_ticket"),
                r.bytes.1 as f64 / held,
                0,
            )
            .num(
                &format!("{p}_spec_bytes_per_ticket"),
                r.bytes.0 as f64 / held,
                0,
            )
            .num(
                &format!("{p}_managed_fields_bytes_per_ticket"),
                r.bytes.2 as f64 / held,
                0,
            );
    }
    // The largest scale against each smaller one (issue 34's goal is against 500).
    let pairs = scales
        .iter()
        .filter_map(|s| scales.last().filter(|l| s.n < l.n).map(|l| (s, l)));
    for (small, large) in pairs {
        let med = |s: &Scale, f: &dyn Fn(&Run) -> f64| median(s.runs.iter().map(f).collect());
        let wall = |r: &Run| r.wall.as_secs_f64();
        let cpu = |r: &Run| plane_cpu(&r.cpu);
        let detach_cpu = |r: &Run| plane_cpu(&r.detach_cpu);
        let held = |r: &Run| r.tickets as f64;
        let wall_ratio = med(large, &wall) / med(small, &wall).max(0.001);
        let cpu_ratio = med(large, &cpu) / med(small, &cpu).max(0.01);
        let detach_ratio = med(large, &detach_cpu) / med(small, &detach_cpu).max(0.01);
        let nodes = large.n as f64 / small.n as f64;
        let tickets = med(large, &held) / med(small, &held).max(1.0);
        println!();
        println!(
            "{} nodes against {} ({} and {} runs, medians): wall {wall_ratio:.1}×, API server + etcd CPU {cpu_ratio:.1}× (linear: {nodes:.0}× the nodes, {tickets:.1}× the tickets held); detaching, API server + etcd CPU {detach_ratio:.1}×",
            large.n,
            small.n,
            large.runs.len(),
            small.runs.len(),
        );
        if small.runs.len() > 1 {
            let per_run: Vec<String> = small
                .runs
                .iter()
                .map(|r| format!("{:.2}", cpu(r)))
                .collect();
            println!(
                "  API server + etcd CPU of each {}-ticket attach: {} s",
                small.n,
                per_run.join(", ")
            );
        }
        line = line
            .num(
                &format!("wall_n{}_over_n{}", large.n, small.n),
                wall_ratio,
                2,
            )
            .num(&format!("cpu_n{}_over_n{}", large.n, small.n), cpu_ratio, 2)
            .num(
                &format!("detach_cpu_n{}_over_n{}", large.n, small.n),
                detach_ratio,
                2,
            );
    }
    line.field("load_before", load_before)
        .field("load_after", loadavg())
        .print();
}
