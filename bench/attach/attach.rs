//! Benchmark: attach latency through the real external-attacher (issue #6).
//!
//! For each driver — Tessera (`tessera controller --csi-endpoint`, release build) and a
//! baseline whose attach does nothing (`csi-noop-driver`, see `bench/attach/refdriver`) —
//! a real `csi-attacher` (target/harness/bin) serves that driver's socket with the same
//! settings. The benchmark creates Node + CSINode, PersistentVolumes (csi source) and
//! then storage.k8s.io VolumeAttachments directly (no kubelet, no attach-detach
//! controller), and watches the VolumeAttachments for `status.attached: true`. A
//! VolumeAttachment's latency runs from a client-side timestamp taken just before its
//! create call to the watch event that shows it attached (the server's
//! creationTimestamp has 1 s granularity, so it is not used).
//!
//! Scenarios: single attaches (`BENCH_ROUNDS`, default 20, sequential attach/detach
//! rounds of one volume), then bursts of N volumes created at once (`BENCH_SCALES`,
//! default `1,100,1000`; "1" means the single-attach rounds). The two drivers take
//! turns within each scenario; in the single-attach rounds round by round
//! (`BENCH_ROUND_ORDER=blocks`: all rounds of one, then the next, as before
//! 2026-12-02), with two more contenders: the API chain floor (bench/attach/chain.rs:
//! the API writes and watch hops Tessera's design needs, issued by plain clients) and
//! the FUSE daemon's start alone (bench/attach/daemon_start.rs;
//! `BENCH_DAEMON_START=0`: not). Tessera's tickets are satisfied by the real node
//! agent (`tessera node`, real FUSE mounts) up to `BENCH_REAL_AGENT_MAX` volumes
//! (default 100), above that by the test fixtures' stand-in agent, which reports
//! MountPods Ready as the agent would.
//!
//! Ends with one `BENCH attach key=value …` line (bench/bench_line.rs): per scenario
//! `s<N>_…` (N volumes at once; `s1` is the single-attach rounds, with `s1_chain_…`
//! for the chain floor and `s1_daemon_start_…` for the daemon start; `s1_floor_…` =
//! the no-op driver's + the chain's and `s1_floor_start_…` = those + the start's, at
//! p50 and p99; `s1_tessera_over_floor_…`, `s1_tessera_over_floor_start_…`).
//!
//! Run: `make bench-attach` (or `bash bench/attach/run.sh`). Figures and their
//! analysis: bench/attach/README.md.

#[path = "../bench_line.rs"]
mod bench_line;
mod chain;
#[path = "../csi_attach.rs"]
mod csi_attach;
mod daemon_start;
mod settle;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVa;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use tessera_api::{CSI_DRIVER_NAME, Volume};

use bench_line::{BenchLine, loadavg};
use csi_attach::{
    NOOP_DRIVER, Seen, Sidecar, create_csinode, env_or, start_noop_driver, va_name, wait_socket,
    watch_attachments,
};
use support::fixtures::{self, AgentProcess, ControllerProcess, FakeAgent, TEST_LABEL};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Tessera,
    Noop,
}

impl Kind {
    fn driver(self) -> &'static str {
        match self {
            Kind::Tessera => CSI_DRIVER_NAME,
            Kind::Noop => NOOP_DRIVER,
        }
    }
    fn short(self) -> &'static str {
        match self {
            Kind::Tessera => "t",
            Kind::Noop => "n",
        }
    }
}

struct Bench {
    client: Client,
    id: String,
    node: String,
    seen: Arc<Seen>,
    /// Backend root of Tessera's volumes.
    root: PathBuf,
}

/// Per-VolumeAttachment results of one scenario for one driver (or the chain floor).
#[derive(Default)]
struct Run {
    attach: Vec<Duration>,
    detach: Vec<Duration>,
    /// From the first create call to the last VolumeAttachment attached.
    makespan: Duration,
    failed: usize,
    /// FUSE daemons running under the agent's mount root while everything was attached,
    /// and their resident memory (KiB).
    daemons: Option<(usize, u64)>,
}

fn pct(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() as f64 * p).ceil() as usize)
        .saturating_sub(1)
        .min(v.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Bench {
    fn pv_name(&self, kind: Kind, scenario: &str, i: usize) -> String {
        format!("{}-{}{scenario}-{i}", self.id, kind.short())
    }

    /// Create the PVs (and, for Tessera, the Volumes, waiting for their ticket objects).
    async fn create_volumes(&self, kind: Kind, names: &[String]) {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let volumes: Api<Volume> = Api::all(self.client.clone());
        stream::iter(names.iter().map(|name| {
            let (pvs, volumes) = (pvs.clone(), volumes.clone());
            async move {
                if kind == Kind::Tessera {
                    let v = fixtures::volume_at(name, &self.id, "ReadWriteOnce", &self.root, false);
                    volumes
                        .create(&PostParams::default(), &v)
                        .await
                        .unwrap_or_else(|e| panic!("creating Volume {name}: {e}"));
                }
                let pv: PersistentVolume = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": name, "labels": {TEST_LABEL: self.id}},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "volumeMode": "Filesystem",
                        "csi": {"driver": kind.driver(), "volumeHandle": name},
                    }
                }))
                .unwrap();
                pvs.create(&PostParams::default(), &pv)
                    .await
                    .unwrap_or_else(|e| panic!("creating PV {name}: {e}"));
            }
        }))
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
        if kind == Kind::Tessera {
            let tvas: Api<tessera_api::VolumeAttachment> = Api::all(self.client.clone());
            fixtures::eventually(
                Duration::from_secs(120),
                "Tessera VolumeAttachments of the new Volumes",
                || async {
                    let have = tvas
                        .list_metadata(
                            &ListParams::default().labels(&format!("{TEST_LABEL}={}", self.id)),
                        )
                        .await
                        .ok()?;
                    let have: std::collections::HashSet<String> = have
                        .items
                        .into_iter()
                        .filter_map(|m| m.metadata.name)
                        .collect();
                    names.iter().all(|n| have.contains(n)).then_some(())
                },
            )
            .await;
        }
    }

    /// Delete the PVs (and Tessera's Volumes), waiting until they are gone.
    async fn delete_volumes(&self, kind: Kind, names: &[String]) {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let volumes: Api<Volume> = Api::all(self.client.clone());
        stream::iter(names.iter().map(|name| {
            let (pvs, volumes) = (pvs.clone(), volumes.clone());
            async move {
                let _ = pvs.delete(name, &DeleteParams::default()).await;
                if kind == Kind::Tessera {
                    let _ = volumes.delete(name, &DeleteParams::default()).await;
                }
            }
        }))
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
        let t = Instant::now();
        loop {
            let mut left = 0;
            for name in names {
                if pvs.get_opt(name).await.ok().flatten().is_some() {
                    left += 1;
                    if t.elapsed() > Duration::from_secs(30) {
                        // The attacher's PV finalizer outlived the benchmark: drop it.
                        let patch = json!({"metadata": {"finalizers": null}});
                        let _ = pvs
                            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await;
                    }
                }
                if kind == Kind::Tessera && volumes.get_opt(name).await.ok().flatten().is_some() {
                    left += 1;
                }
            }
            if left == 0 {
                return;
            }
            if t.elapsed() > Duration::from_secs(180) {
                eprintln!("  warning: {left} PVs/Volumes of {kind:?} still present after 180 s");
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn va(&self, kind: Kind, pv: &str) -> StorageVa {
        serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": va_name(pv, kind.driver(), &self.node), "labels": {TEST_LABEL: self.id}},
            "spec": {"attacher": kind.driver(), "nodeName": self.node, "source": {"persistentVolumeName": pv}},
        }))
        .unwrap()
    }

    /// Create the VolumeAttachments of `pvs` at once, wait for all attached; then delete
    /// them at once and wait for all gone.
    async fn burst(
        &self,
        kind: Kind,
        pvs: &[String],
        timeout: Duration,
        mount_root: Option<&Path>,
    ) -> Run {
        let api: Api<StorageVa> = Api::all(self.client.clone());
        let names: Vec<String> = pvs
            .iter()
            .map(|pv| va_name(pv, kind.driver(), &self.node))
            .collect();
        for n in &names {
            self.seen.attached.lock().unwrap().remove(n);
            self.seen.gone.lock().unwrap().remove(n);
        }
        let t0 = Instant::now();
        let created: Vec<(String, Instant)> = stream::iter(pvs.iter().map(|pv| {
            let api = api.clone();
            let va = self.va(kind, pv);
            async move {
                let name = va.name_any();
                let at = Instant::now();
                api.create(&PostParams::default(), &va)
                    .await
                    .unwrap_or_else(|e| panic!("creating VolumeAttachment {name}: {e}"));
                (name, at)
            }
        }))
        .buffer_unordered(64)
        .collect()
        .await;
        let all = self
            .seen
            .wait(timeout, |s| {
                let a = s.attached.lock().unwrap();
                names.iter().all(|n| a.contains_key(n))
            })
            .await;
        let attached = self.seen.attached.lock().unwrap().clone();
        let mut attach = Vec::new();
        let mut last = t0;
        for (name, at) in &created {
            if let Some(done) = attached.get(name) {
                attach.push(done.saturating_duration_since(*at));
                last = last.max(*done);
                trace_attach(kind, name, *at, *done);
            }
        }
        let failed = names.len() - attach.len();
        if !all {
            eprintln!(
                "  warning: {failed} of {} VolumeAttachments of {kind:?} not attached within {timeout:?}",
                names.len()
            );
        }
        let makespan = last.saturating_duration_since(t0);
        let daemons = mount_root.map(|root| {
            let pids = fixtures::mount_daemons_under(root);
            let rss = pids
                .iter()
                .map(|p| support::proc_status_kib(*p as u32, "VmRSS"))
                .sum();
            (pids.len(), rss)
        });

        // Detach: delete them all, wait until the attacher has let them go.
        let deleted: Vec<(String, Instant)> = stream::iter(names.iter().map(|name| {
            let api = api.clone();
            async move {
                let at = Instant::now();
                let _ = api.delete(name, &DeleteParams::default()).await;
                (name.clone(), at)
            }
        }))
        .buffer_unordered(64)
        .collect()
        .await;
        let gone_all = self
            .seen
            .wait(Duration::from_secs(300), |s| {
                let g = s.gone.lock().unwrap();
                names.iter().all(|n| g.contains_key(n))
            })
            .await;
        if !gone_all {
            eprintln!(
                "  warning: VolumeAttachments of {kind:?} still present after 300 s; removing finalizers"
            );
            for name in &names {
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
        }
        let gone = self.seen.gone.lock().unwrap().clone();
        let detach = deleted
            .iter()
            .filter_map(|(n, at)| gone.get(n).map(|g| g.saturating_duration_since(*at)))
            .collect();
        Run {
            attach,
            detach,
            makespan,
            failed,
            daemons,
        }
    }
}

/// With `BENCH_ATTACH_TRACE=<file>`: one line per attach appended to it, `<driver>
/// <VolumeAttachment> <created> <attached>` (wall clock, RFC 3339 with microseconds),
/// to line up with the components' logs for a per-hop breakdown.
fn trace_attach(kind: Kind, name: &str, created: Instant, attached: Instant) {
    use std::io::Write;
    let Ok(path) = std::env::var("BENCH_ATTACH_TRACE") else {
        return;
    };
    let now = Instant::now();
    let wall = |i: Instant| {
        let back =
            jiff::SignedDuration::try_from(now.saturating_duration_since(i)).unwrap_or_default();
        jiff::Timestamp::now()
            .checked_sub(back)
            .unwrap_or_default()
            .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
            .to_string()
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(
            f,
            "{} {name} {} {}",
            kind.short(),
            wall(created),
            wall(attached)
        );
    }
}

fn merge(runs: Vec<Run>) -> Run {
    let mut out = Run::default();
    for r in runs {
        out.attach.extend(r.attach);
        out.detach.extend(r.detach);
        out.makespan = out.makespan.max(r.makespan);
        out.failed += r.failed;
        out.daemons = out.daemons.max(r.daemons);
    }
    out
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("attach benchmark: run it with `make bench-attach`");
        return;
    }
    let scales: Vec<usize> = std::env::var("BENCH_SCALES")
        .unwrap_or_else(|_| "1,100,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rounds: usize = env_or("BENCH_ROUNDS", 20);
    let real_max: usize = env_or("BENCH_REAL_AGENT_MAX", 100);
    let kinds: Vec<Kind> = match std::env::var("BENCH_DRIVERS").as_deref() {
        Ok("tessera") => vec![Kind::Tessera],
        Ok("noop") => vec![Kind::Noop],
        _ => vec![Kind::Tessera, Kind::Noop],
    };
    let sidecar = Sidecar::from_env();

    let load_before = loadavg();
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let id = support::unique_name("batt");
    let node = format!("{id}-n0");
    let dir = tempfile::Builder::new()
        .prefix("tessera-bench-attach-")
        .tempdir()
        .unwrap();
    let logs = std::env::temp_dir().join(format!("tessera-bench-attach-{id}"));
    std::fs::create_dir_all(&logs).unwrap();
    let root = dir.path().join("backend");
    std::fs::create_dir_all(&root).unwrap();
    fixtures::create_nodes(&client, std::slice::from_ref(&node)).await;
    create_csinode(&client, &node, &[CSI_DRIVER_NAME, NOOP_DRIVER]).await;

    // Drivers and their attachers.
    let tessera_sock = dir.path().join("tessera.sock");
    let noop_sock = dir.path().join("noop.sock");
    let _ctrl = ControllerProcess::start(
        &id,
        &[
            "--no-leader-election",
            &format!("--csi-endpoint=unix://{}", tessera_sock.display()),
        ],
    );
    let _noop = start_noop_driver(&noop_sock, &logs.join("noop-driver.log"));
    wait_socket(&tessera_sock, "tessera controller's CSI socket").await;
    wait_socket(&noop_sock, "csi-noop-driver's socket").await;
    let _attacher_t = sidecar.start(&tessera_sock, &logs.join("csi-attacher-tessera.log"));
    let _attacher_n = sidecar.start(&noop_sock, &logs.join("csi-attacher-noop.log"));

    let (seen, ready) = watch_attachments(client.clone(), &id);
    ready.await.expect("VolumeAttachment watch started");
    let bench = Bench {
        client: client.clone(),
        id: id.clone(),
        node: node.clone(),
        seen,
        root,
    };

    println!();
    println!(
        "attach benchmark: storage.k8s.io VolumeAttachment created -> status.attached=true (client clock, watch)"
    );
    println!("  csi-attacher {}", sidecar.describe());
    println!(
        "  baseline: csi-noop-driver (bench/attach/refdriver: ControllerPublish records the attachment, nothing else)"
    );
    println!("  logs: {}", logs.display());

    // Let the attachers finish starting (their informers sync) before timing anything:
    // one warm-up attach per driver, not counted.
    for &kind in &kinds {
        let pv = vec![bench.pv_name(kind, "w", 0)];
        let mut _agent = None;
        if kind == Kind::Tessera {
            _agent = Some(AgentProcess::start(&id, &node));
        }
        bench.create_volumes(kind, &pv).await;
        let r = bench.burst(kind, &pv, Duration::from_secs(120), None).await;
        assert_eq!(
            r.failed,
            0,
            "warm-up attach of {kind:?} failed; see {}",
            logs.display()
        );
        bench.delete_volumes(kind, &pv).await;
    }

    // The API chain floor, in the single-attach rounds: started (and warmed up with
    // one round, not counted) once the drivers are.
    let mut floor = None;
    if scales.contains(&1) {
        let config = support::config().await;
        let mut f = chain::Floor::start(&config, &client, &id, &node, &bench.root).await;
        assert!(
            f.round(Duration::from_secs(60)).await.is_some(),
            "warm-up round of the API chain floor failed"
        );
        floor = Some(f);
    }
    // The FUSE daemon's start alone, in the same rounds (`BENCH_DAEMON_START=0`: not).
    let mut start = None;
    if scales.contains(&1) && env_or("BENCH_DAEMON_START", 1) == 1 {
        let s = daemon_start::DaemonStart::new(dir.path(), &bench.root, &logs);
        assert!(
            s.round(Duration::from_secs(10)).is_some(),
            "warm-up start of the FUSE daemon failed; see {}",
            logs.display()
        );
        start = Some(s);
    }

    let mut rows: Vec<(usize, String, String, Vec<Option<Run>>)> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    // Tessera's detach tail in the single-attach rounds (p50, p99 ms), if waited for.
    let mut tail_line: Option<(f64, f64)> = None;
    for &scale in &scales {
        let real = scale <= real_max;
        let mode = if real {
            "real tessera node agent (FUSE)"
        } else {
            "stand-in agent (fixtures::FakeAgent)"
        };
        // Tessera, the no-op driver; in the single-attach rounds the API chain floor and
        // the FUSE daemon's start.
        let mut per_kind: Vec<Option<Run>> = vec![None, None, None, None];
        // The agent serving Tessera's MountPods in this scenario.
        let mut agent: Option<AgentProcess> = None;
        let mut fake: Option<FakeAgent> = None;
        if kinds.contains(&Kind::Tessera) {
            if real {
                agent = Some(AgentProcess::start(&id, &node));
            } else {
                fake = Some(FakeAgent::start(client.clone(), &id));
            }
        }
        let label = if scale == 1 {
            format!("1 volume, {rounds} rounds")
        } else {
            format!("{scale} volumes at once")
        };
        eprintln!("[bench-attach] {label} ({mode}) ...");
        let scenario = format!("s{scale}");
        let order: Vec<(usize, Kind, Vec<String>)> = [Kind::Tessera, Kind::Noop]
            .into_iter()
            .enumerate()
            .filter(|(_, kind)| kinds.contains(kind))
            .map(|(k, kind)| {
                let pvs = (0..scale)
                    .map(|i| bench.pv_name(kind, &scenario, i))
                    .collect();
                (k, kind, pvs)
            })
            .collect();
        let mount_root = |kind: Kind| {
            agent
                .as_ref()
                .filter(|_| kind == Kind::Tessera)
                .map(|a| a.mount_root())
        };
        let mut note = |run: &Run| {
            if let Some((n, kib)) = run.daemons.filter(|d| d.0 > 0) {
                notes.push(format!(
                    "{label}: {n} tessera FUSE daemons while attached, {:.1} MiB resident in all, {:.1} MiB each",
                    kib as f64 / 1024.0,
                    kib as f64 / 1024.0 / n as f64
                ));
            }
        };
        if scale == 1 {
            // Round by round: each driver in turn, then the chain floor, then the
            // daemon start (`BENCH_ROUND_ORDER=blocks`: all rounds of one, then the next).
            for (_, kind, pvs) in &order {
                bench.create_volumes(*kind, pvs).await;
            }
            let mut runs: Vec<Vec<Run>> = vec![vec![], vec![]];
            let (mut chain_run, mut start_run) = (Run::default(), Run::default());
            let timeout = Duration::from_secs(60);
            let contenders: Vec<usize> = order.iter().map(|(k, _, _)| *k).chain([2, 3]).collect();
            let blocks = std::env::var("BENCH_ROUND_ORDER").as_deref() == Ok("blocks");
            // After each Tessera round, wait (untimed) until its detach has finished on
            // Tessera's side too (`BENCH_SETTLE=0`: not, as before 2026-12-02).
            let settle_rounds = env_or("BENCH_SETTLE", 1) == 1;
            let mut tails: Vec<Duration> = Vec::new();
            let schedule: Vec<usize> = if blocks {
                contenders.iter().flat_map(|&c| vec![c; rounds]).collect()
            } else {
                (0..rounds)
                    .flat_map(|_| contenders.iter().copied())
                    .collect()
            };
            for contender in schedule {
                match contender {
                    2 => {
                        if let Some(floor) = floor.as_mut() {
                            match floor.round(timeout).await {
                                Some(d) => chain_run.attach.push(d),
                                None => chain_run.failed += 1,
                            }
                        }
                    }
                    3 => {
                        if let Some(start) = &start {
                            let took = tokio::task::block_in_place(|| {
                                start.round(Duration::from_secs(10))
                            });
                            match took {
                                Some(d) => start_run.attach.push(d),
                                None => start_run.failed += 1,
                            }
                        }
                    }
                    k => {
                        let (_, kind, pvs) = order.iter().find(|(i, _, _)| *i == k).unwrap();
                        let root = mount_root(*kind);
                        runs[k].push(bench.burst(*kind, pvs, timeout, root.as_deref()).await);
                        if *kind == Kind::Tessera && settle_rounds {
                            let tail = settle::detached(&client, &pvs[0], &node, timeout).await;
                            tails.extend(tail);
                        }
                    }
                }
            }
            for (k, kind, pvs) in &order {
                let run = merge(std::mem::take(&mut runs[*k]));
                note(&run);
                bench.delete_volumes(*kind, pvs).await;
                per_kind[*k] = Some(run);
            }
            if floor.is_some() {
                per_kind[2] = Some(chain_run);
            }
            if start.is_some() {
                per_kind[3] = Some(start_run);
            }
            if !tails.is_empty() {
                notes.push(format!(
                    "{label}: Tessera's detach finished (MountPod gone, Volume Detached) {:.0} ms p50 / {:.0} ms p99 after its VolumeAttachment was gone (waited for before the next round)",
                    ms(pct(&tails, 0.5)),
                    ms(pct(&tails, 0.99))
                ));
                tail_line = Some((ms(pct(&tails, 0.5)), ms(pct(&tails, 0.99))));
            }
        } else {
            for (k, kind, pvs) in &order {
                bench.create_volumes(*kind, pvs).await;
                let timeout = Duration::from_secs(60 + scale as u64);
                let root = mount_root(*kind);
                let run = bench.burst(*kind, pvs, timeout, root.as_deref()).await;
                note(&run);
                bench.delete_volumes(*kind, pvs).await;
                per_kind[*k] = Some(run);
            }
        }
        drop(fake);
        drop(agent);
        rows.push((scale, label, mode.to_string(), per_kind));
    }

    println!();
    println!(
        "| scenario | tessera p50 / p99 (ms) | noop p50 / p99 (ms) | ratio p50 / p99 | all attached (s) t / n | tessera agent |"
    );
    println!("|---|---|---|---|---|---|");
    let mut line = BenchLine::new("attach")
        .field("rounds", rounds)
        .field("real_agent_max", real_max)
        .field("attacher_workers", sidecar.workers)
        .field("attacher_qps", sidecar.qps)
        .field("attacher_burst", sidecar.burst)
        .field("attacher_timeout", &sidecar.timeout);
    for (scale, label, mode, runs) in &rows {
        let cell = |r: &Option<Run>| match r {
            Some(r) => format!(
                "{:.0} / {:.0}{}",
                ms(pct(&r.attach, 0.5)),
                ms(pct(&r.attach, 0.99)),
                if r.failed > 0 {
                    format!(" ({} failed)", r.failed)
                } else {
                    String::new()
                }
            ),
            None => "-".into(),
        };
        let ratio = match (&runs[0], &runs[1]) {
            (Some(t), Some(n)) if !n.attach.is_empty() && !t.attach.is_empty() => format!(
                "{:.2} / {:.2}",
                pct(&t.attach, 0.5).as_secs_f64() / pct(&n.attach, 0.5).as_secs_f64(),
                pct(&t.attach, 0.99).as_secs_f64() / pct(&n.attach, 0.99).as_secs_f64()
            ),
            _ => "-".into(),
        };
        let span = |r: &Option<Run>| {
            r.as_ref()
                .map(|r| format!("{:.2}", r.makespan.as_secs_f64()))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "| {label} | {} | {} | {ratio} | {} / {} | {mode} |",
            cell(&runs[0]),
            cell(&runs[1]),
            span(&runs[0]),
            span(&runs[1]),
        );
        for row in chain::table_rows(label, runs) {
            println!("{row}");
        }
        line = bench_fields(line, *scale, runs);
    }
    println!();
    println!("detach (VolumeAttachment delete -> gone), p50 / p99 ms:");
    for (_, label, _, runs) in &rows {
        let d = |r: &Option<Run>| match r {
            Some(r) => format!(
                "{:.0} / {:.0}",
                ms(pct(&r.detach, 0.5)),
                ms(pct(&r.detach, 0.99))
            ),
            None => "-".into(),
        };
        println!("  {label}: tessera {}   noop {}", d(&runs[0]), d(&runs[1]));
    }
    for n in notes {
        println!("  note: {n}");
    }

    // Clean up.
    if let Some(f) = floor {
        f.stop().await;
    }
    drop(start);
    support::kubectl()
        .args([
            "delete",
            "csinode",
            &node,
            "--ignore-not-found",
            "--wait=false",
        ])
        .stdout(Stdio::null())
        .status()
        .ok();
    fixtures::delete_nodes(&client, &[node]).await;
    if let Some((p50, p99)) = tail_line {
        line = line.num("s1_tessera_detach_tail_p50_ms", p50, 1).num(
            "s1_tessera_detach_tail_p99_ms",
            p99,
            1,
        );
    }
    line.field("load_before", load_before)
        .field("load_after", loadavg())
        .print();
}

/// The BENCH fields of one scenario: per driver attach p50/p99, all attached, failures,
/// detach p50/p99; then tessera ÷ noop at p50 and p99.
fn bench_fields(mut line: BenchLine, scale: usize, runs: &[Option<Run>]) -> BenchLine {
    let p = format!("s{scale}");
    for (name, run) in ["tessera", "noop"].into_iter().zip(runs) {
        let Some(r) = run else { continue };
        let figures = [
            ("p50_ms", ms(pct(&r.attach, 0.5)), 1),
            ("p99_ms", ms(pct(&r.attach, 0.99)), 1),
            ("all_attached_s", r.makespan.as_secs_f64(), 2),
            ("failed", r.failed as f64, 0),
            ("detach_p50_ms", ms(pct(&r.detach, 0.5)), 1),
            ("detach_p99_ms", ms(pct(&r.detach, 0.99)), 1),
        ];
        for (k, v, decimals) in figures {
            line = line.num(&format!("{p}_{name}_{k}"), v, decimals);
        }
    }
    if let (Some(t), Some(n)) = (&runs[0], &runs[1])
        && !t.attach.is_empty()
        && !n.attach.is_empty()
    {
        for (k, q) in [("ratio_p50", 0.5), ("ratio_p99", 0.99)] {
            let ratio = pct(&t.attach, q).as_secs_f64() / pct(&n.attach, q).as_secs_f64();
            line = line.num(&format!("{p}_{k}"), ratio, 2);
        }
    }
    for (name, run) in [("chain", &runs[2]), ("daemon_start", &runs[3])] {
        if let Some(c) = run {
            line = line
                .num(&format!("{p}_{name}_p50_ms"), ms(pct(&c.attach, 0.5)), 1)
                .num(&format!("{p}_{name}_p99_ms"), ms(pct(&c.attach, 0.99)), 1)
                .field(&format!("{p}_{name}_failed"), c.failed);
        }
    }
    // floor = noop + chain; floor_start = noop + chain + daemon start.
    for (name, with_start) in [("floor", false), ("floor_start", true)] {
        if let Some(f) = chain::Figures::of(runs, with_start) {
            line = line
                .num(&format!("{p}_{name}_p50_ms"), ms(f.p50), 1)
                .num(&format!("{p}_{name}_p99_ms"), ms(f.p99), 1)
                .num(&format!("{p}_tessera_over_{name}_p50"), f.ratio_p50, 2)
                .num(&format!("{p}_tessera_over_{name}_p99"), f.ratio_p99, 2);
        }
    }
    line
}
