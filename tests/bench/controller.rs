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
use kube::api::{Api, ListParams, PostParams};
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
    let requests0 =
        ctrl.metric_sum("tessera_api_writes_total") + ctrl.metric_sum("tessera_api_reads_total");
    let t0 = Instant::now();
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
    let mut satisfied_at: BTreeMap<String, Duration> = BTreeMap::new();
    while satisfied_at.len() < n {
        // A loaded API server may cut a large list short: try again on the next round.
        let Ok(list) = vas.list(&selector).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        for va in list.items {
            let name = va.metadata.name.clone().unwrap();
            let ok = va
                .status
                .as_ref()
                .and_then(|s| s.attachment_ticket_statuses.get("csi-a"))
                .is_some_and(|s| s.satisfied);
            if ok {
                satisfied_at.entry(name).or_insert_with(|| t0.elapsed());
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "not all tickets satisfied within 300 s"
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    let total = t0.elapsed();
    let reconciles = ctrl.metric_sum("tessera_reconciles_total") - reconciles0;
    let requests = ctrl.metric_sum("tessera_api_writes_total")
        + ctrl.metric_sum("tessera_api_reads_total")
        - requests0;
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
