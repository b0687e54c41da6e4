//! Benchmark: 1,000 Volumes, one ticket each, through a real `tessera controller`
//! (release build) on the cluster under test. MountPod status is driven as a node agent
//! would (the stand-in agent of the test fixtures). Prints: time from the first ticket
//! to the last satisfied status, the ticket latency percentiles, API requests per
//! reconcile, and the controller's peak resident memory.
//!
//! Run: `make bench-controller` (or `cargo bench --bench controller`; `BENCH_VOLUMES=N`
//! changes the count).

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use support::fixtures::{self, ControllerProcess, FakeAgent, TEST_LABEL};
use tessera::api::{Volume, VolumeAttachment};

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// User+system CPU seconds of `pid` (and its reaped children), from /proc.
fn proc_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // utime, stime, cutime, cstime are fields 14..=17 (1-based); `rest` starts at field 3.
    let ticks = f.get(11..15).map(|v| v.iter().sum()).unwrap_or(0.0);
    ticks / 100.0
}

/// CPU seconds of the controller and, on the local control plane, of its components.
fn cpu_seconds(controller: u32) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    out.insert(
        "tessera controller".to_string(),
        proc_cpu_seconds(controller),
    );
    out.insert(
        "this benchmark (+ stand-in agent)".to_string(),
        proc_cpu_seconds(std::process::id()),
    );
    let pids = support::repo_root().join("target/cluster/pids");
    if std::env::var_os("KUBECONFIG").is_none() {
        for c in ["kube-apiserver", "etcd", "kube-controller-manager"] {
            if let Some(pid) = std::fs::read_to_string(pids.join(format!("{c}.pid")))
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                out.insert(c.to_string(), proc_cpu_seconds(pid));
            }
        }
    }
    out
}

/// Watch the test's VolumeAttachments until `n` of them report ticket `csi-a`
/// satisfied; returns when each was first seen satisfied, measured from `t0`.
async fn watch_satisfied(
    vas: Api<VolumeAttachment>,
    id: String,
    n: usize,
    t0: Instant,
) -> BTreeMap<String, Duration> {
    let wc = watcher::Config::default().labels(&format!("{TEST_LABEL}={id}"));
    let mut events = watcher(vas, wc).default_backoff().applied_objects().boxed();
    let mut satisfied_at = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while satisfied_at.len() < n {
        let next = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("not all tickets satisfied within 300 s");
        let Some(Ok(va)) = next else { continue };
        let ok = va
            .status
            .as_ref()
            .and_then(|s| s.attachment_ticket_statuses.get("csi-a"))
            .is_some_and(|s| s.satisfied);
        if ok {
            satisfied_at
                .entry(va.name_any())
                .or_insert_with(|| t0.elapsed());
        }
    }
    satisfied_at
}

/// `tessera_api_writes_total` and `tessera_api_reads_total` by kind and verb, from
/// the metrics text.
fn requests_by_kind(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("tessera_api_writes_total{") || l.starts_with("tessera_api_reads_total{")
        })
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            let field = |k: &str| {
                let start = labels.find(&format!("{k}=\""))? + k.len() + 2;
                let end = labels[start..].find('"')? + start;
                Some(labels[start..end].to_string())
            };
            Some((
                format!("{} {}", field("kind")?, field("verb")?),
                value.parse().ok()?,
            ))
        })
        .collect()
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("controller benchmark: run it with `cargo bench --bench controller`");
        return;
    }
    let n: usize = std::env::var("BENCH_VOLUMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let id = support::unique_name("bench");
    let node = format!("{id}-n0");
    fixtures::create_nodes(&client, std::slice::from_ref(&node)).await;
    let ctrl = ControllerProcess::start(&id, &["--no-leader-election"]);
    let _agent = FakeAgent::start(client.clone(), &id);
    let volumes: Api<Volume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let names: Vec<String> = (0..n).map(|i| format!("{id}-v{i}")).collect();

    // Volumes first (their VolumeAttachments are the controller's work, not timed).
    let t = Instant::now();
    stream::iter(names.iter().map(|name| {
        let volumes = volumes.clone();
        let id = id.clone();
        async move {
            volumes
                .create(
                    &PostParams::default(),
                    &fixtures::volume(name, &id, "ReadWriteOnce"),
                )
                .await
                .map(|_| ())
        }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<()>>()
    .await
    .expect("creating volumes");
    let selector = ListParams::default().labels(&format!("{TEST_LABEL}={id}"));
    loop {
        if vas
            .list_metadata(&selector)
            .await
            .map(|l| l.items.len())
            .unwrap_or(0)
            == n
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let setup = t.elapsed();

    let reconciles0 = ctrl.metric_sum("tessera_reconciles_total");
    let requests_by_kind0 = requests_by_kind(&ctrl.metrics().unwrap_or_default());
    let requests0 =
        ctrl.metric_sum("tessera_api_writes_total") + ctrl.metric_sum("tessera_api_reads_total");
    let cpu0 = cpu_seconds(ctrl.child.id());
    let t0 = Instant::now();
    let watch_task = tokio::spawn(watch_satisfied(vas.clone(), id.clone(), n, t0));
    stream::iter(names.iter().map(|name| {
        let client = client.clone();
        let node = node.clone();
        async move {
            fixtures::put_ticket(&client, name, "csi-a", "csi-attacher", &node, json!({})).await
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;
    let submitted = t0.elapsed();
    // Satisfaction is observed through a watch (started before the burst), not by
    // listing every VolumeAttachment in a loop, which would load the API server too.
    let satisfied_at = watch_task.await.expect("watch task");
    let total = t0.elapsed();
    let reconciles = ctrl.metric_sum("tessera_reconciles_total") - reconciles0;
    let requests = ctrl.metric_sum("tessera_api_writes_total")
        + ctrl.metric_sum("tessera_api_reads_total")
        - requests0;
    let requests_by_kind1 = requests_by_kind(&ctrl.metrics().unwrap_or_default());
    let cpu1 = cpu_seconds(ctrl.child.id());
    let rss_mib = peak_rss_kib(ctrl.child.id()) as f64 / 1024.0;
    let mut lat: Vec<Duration> = satisfied_at.values().copied().collect();
    lat.sort();
    let pct = |p: f64| {
        lat[((lat.len() as f64 * p).ceil() as usize)
            .saturating_sub(1)
            .min(lat.len() - 1)]
    };

    println!();
    println!("controller benchmark: {n} volumes, one csi-attacher ticket each, one node");
    println!(
        "  setup (volumes + their VolumeAttachments)  {:>8.2} s",
        setup.as_secs_f64()
    );
    println!(
        "  tickets submitted in                       {:>8.2} s",
        submitted.as_secs_f64()
    );
    println!(
        "  all tickets satisfied after                {:>8.2} s   (goal < 20 s)",
        total.as_secs_f64()
    );
    println!(
        "  ticket satisfied, since the burst began    p50 {:.2} s  p99 {:.2} s",
        pct(0.5).as_secs_f64(),
        pct(0.99).as_secs_f64()
    );
    println!(
        "  reconciles                                 {:>8.0}",
        reconciles
    );
    println!(
        "  API requests per reconcile (writes+reads)  {:>8.2}",
        requests / reconciles.max(1.0)
    );
    println!(
        "  controller peak resident memory            {:>8.1} MiB (goal < 150 MB)",
        rss_mib
    );
    println!("  controller requests per volume, by kind and verb");
    for (k, v) in &requests_by_kind1 {
        let d = v - requests_by_kind0.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            println!("    {k:<40} {:>8.2}", d / n as f64);
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    println!(
        "  CPU seconds during the burst ({:.1} s wall × {cores} cores = {:.0} CPU-s)",
        total.as_secs_f64(),
        cores as f64 * total.as_secs_f64()
    );
    for (k, v) in &cpu1 {
        println!(
            "    {k:<40} {:>8.1}",
            v - cpu0.get(k).copied().unwrap_or(0.0)
        );
    }

    // Clean up: delete the volumes (their data cleanup runs through tickets too).
    let t = Instant::now();
    for name in &names {
        let _ = volumes.delete(name, &Default::default()).await;
    }
    loop {
        let left = volumes
            .list_metadata(&selector)
            .await
            .map(|l| l.items.len())
            .unwrap_or(usize::MAX);
        if left == 0 || t.elapsed() > Duration::from_secs(300) {
            println!(
                "  deleting {n} volumes (cleanup tickets)    {:>8.2} s ({left} left)",
                t.elapsed().as_secs_f64()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    fixtures::delete_nodes(&client, &[node]).await;
}
