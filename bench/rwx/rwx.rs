//! Benchmark: one ReadWriteMany volume used by many nodes, through a real `tessera
//! controller` (release build) on the cluster under test. For each scale N
//! (`BENCH_RWX_SCALES`, default `50,250`): N Nodes, one RWX Volume, then N tickets,
//! one per node, added at once (32 in flight, as many CSI ControllerPublish calls
//! would), MountPod status driven by the test fixtures' stand-in agent. Timed from the
//! first ticket to the VolumeAttachment's status saying all N satisfied.
//!
//! Prints per scale: wall time, the CPU seconds of kube-apiserver and etcd (the
//! control plane is the bottleneck here), the requests the API server served by
//! resource and verb (its own `apiserver_request_total`, so the tickets and the
//! stand-in agent count too) and per ticket, and the size of the VolumeAttachment at
//! the end (bytes per ticket in spec, status and managedFields). Then the ratios of
//! the largest scale to the smallest, against the goal (linear, not quadratic: 500
//! tickets at most 15× 50, so 250 at most 7.5×). 250, not 500: the CRD allows at most
//! 256 tickets on one VolumeAttachment (`maxProperties`), and the 257th is refused.
//!
//! Ends with one `BENCH rwx key=value …` line (bench/bench_line.rs), keys `n<N>_…`.
//!
//! Run: `make bench-rwx` (or `cargo bench --bench rwx`). Figures: bench/README.md.

#[path = "../bench_line.rs"]
mod bench_line;
#[path = "../procs.rs"]
mod procs;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bench_line::{BenchLine, loadavg};
use futures::{StreamExt, stream};
use kube::api::{Api, ListParams};
use kube::runtime::wait::await_condition;
use serde_json::json;
use support::fixtures::{self, ControllerProcess, FakeAgent, TEST_LABEL};
use tessera::api::{MountPod, VolumeAttachment};

/// What one scale measured.
struct Run {
    n: usize,
    wall: Duration,
    /// CPU seconds by process.
    cpu: BTreeMap<String, f64>,
    /// API server requests by "resource[/subresource] VERB".
    requests: BTreeMap<String, f64>,
    /// Bytes of the VolumeAttachment's JSON at the end: spec, status, managedFields.
    bytes: (usize, usize, usize),
    /// Status writes on the VolumeAttachment by the controller.
    va_status_writes: f64,
}

fn cpu_now(controller: u32) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> =
        procs::cluster_pids(&support::repo_root(), &["kube-apiserver", "etcd"])
            .into_iter()
            .map(|(c, pid)| (c, procs::proc_cpu_seconds(pid)))
            .collect();
    out.insert(
        "tessera-controller".into(),
        procs::proc_cpu_seconds(controller),
    );
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

async fn run_scale(client: &kube::Client, n: usize) -> Run {
    let id = support::unique_name("rwx");
    let nodes: Vec<String> = (0..n).map(|i| format!("{id}-n{i}")).collect();
    fixtures::create_nodes(client, &nodes).await;
    let ctrl = ControllerProcess::start(&id, &["--no-leader-election"]);
    let _agent = FakeAgent::start(client.clone(), &id);
    let name = format!("{id}-v");
    fixtures::create_volume(
        client,
        &fixtures::volume(&name, &id, "ReadWriteMany"),
        Duration::from_secs(60),
    )
    .await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    // Settle: the controller has written the empty VolumeAttachment's first status.
    fixtures::eventually(Duration::from_secs(60), "first status", || async {
        vas.get(&name).await.ok()?.status.map(|_| ())
    })
    .await;

    let writes = |m: &str| {
        procs::samples(m, "tessera_api_writes_total", &["kind", "verb"])
            .get("VolumeAttachment status")
            .copied()
            .unwrap_or(0.0)
    };
    let va_writes0 = writes(&ctrl.metrics().unwrap_or_default());
    let req0 = procs::apiserver_requests();
    let cpu0 = cpu_now(ctrl.child.id());
    let t0 = Instant::now();
    let all = {
        let n = i32::try_from(n).unwrap();
        let (vas, name) = (vas.clone(), name.clone());
        tokio::spawn(async move {
            let all = await_condition(vas, &name, move |va: Option<&VolumeAttachment>| {
                va.and_then(|va| va.status.as_ref())
                    .is_some_and(|s| s.satisfied_count == n && s.ticket_count == n)
            });
            tokio::time::timeout(Duration::from_secs(900), all).await
        })
    };
    stream::iter(nodes.iter().enumerate().map(|(i, node)| {
        let name = name.clone();
        async move {
            let id = format!("csi-{i:04}");
            fixtures::put_ticket(client, &name, &id, "csi-attacher", node, json!({})).await
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;
    all.await
        .expect("wait task")
        .expect("all tickets satisfied within 900 s")
        .expect("watching the VolumeAttachment");
    let wall = t0.elapsed();
    let cpu = delta(&cpu_now(ctrl.child.id()), &cpu0);
    let requests = delta(&procs::apiserver_requests(), &req0);
    let va_status_writes = writes(&ctrl.metrics().unwrap_or_default()) - va_writes0;

    let va =
        serde_json::to_value(vas.get(&name).await.expect("reading the VolumeAttachment")).unwrap();
    let size = |v: &serde_json::Value| v.to_string().len();
    let bytes = (
        size(&va["spec"]),
        size(&va["status"]),
        size(&va["metadata"]["managedFields"]),
    );

    // Clean up: the tickets (a node serving a workload ticket keeps the data, and so
    // the Volume), the Volume (its MountPods and VolumeAttachment go with it), then the
    // nodes, and wait until the MountPods are gone before the next scale.
    vas.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"attachmentTickets": null}})),
    )
    .await
    .expect("removing the tickets");
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
    fixtures::delete_nodes(client, &nodes).await;
    drop(ctrl);
    Run {
        n,
        wall,
        cpu,
        requests,
        bytes,
        va_status_writes,
    }
}

fn print_run(r: &Run) {
    let n = r.n as f64;
    println!();
    println!("RWX: one volume, {} tickets on {} nodes", r.n, r.n);
    println!(
        "  all satisfied after                        {:>8.2} s",
        r.wall.as_secs_f64()
    );
    println!("  CPU seconds");
    for (k, v) in &r.cpu {
        println!("    {k:<40} {v:>8.2}");
    }
    println!("  API server requests (per ticket)");
    for (k, v) in &r.requests {
        println!("    {k:<40} {v:>8.0} ({:.2})", v / n);
    }
    println!(
        "  VolumeAttachment status writes by the controller {:>4.0} ({:.2} per ticket)",
        r.va_status_writes,
        r.va_status_writes / n
    );
    let (spec, status, managed) = r.bytes;
    println!(
        "  VolumeAttachment bytes: spec {spec} ({:.0}/ticket), status {status} ({:.0}/ticket), managedFields {managed} ({:.0}/ticket)",
        spec as f64 / n,
        status as f64 / n,
        managed as f64 / n
    );
}

/// Writes (anything but reads and watches) among `requests`.
fn writes(requests: &BTreeMap<String, f64>) -> f64 {
    requests
        .iter()
        .filter(|(k, _)| !["GET", "LIST", "WATCH"].iter().any(|v| k.ends_with(v)))
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
        .unwrap_or_else(|_| "50,250".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let load_before = loadavg();
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let mut runs = Vec::new();
    for n in scales {
        let r = run_scale(&client, n).await;
        print_run(&r);
        runs.push(r);
    }
    let mut line = BenchLine::new("rwx");
    for r in &runs {
        let p = format!("n{}", r.n);
        let api_cpu = r.cpu.get("kube-apiserver").copied().unwrap_or(0.0);
        let etcd_cpu = r.cpu.get("etcd").copied().unwrap_or(0.0);
        line = line
            .num(&format!("{p}_wall_s"), r.wall.as_secs_f64(), 2)
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
                2,
            )
            .num(
                &format!("{p}_status_bytes_per_ticket"),
                r.bytes.1 as f64 / r.n as f64,
                0,
            )
            .num(
                &format!("{p}_spec_bytes_per_ticket"),
                r.bytes.0 as f64 / r.n as f64,
                0,
            )
            .num(
                &format!("{p}_managed_fields_bytes_per_ticket"),
                r.bytes.2 as f64 / r.n as f64,
                0,
            );
    }
    if let (Some(small), Some(large)) = (runs.first(), runs.last())
        && large.n > small.n
    {
        let cpu = |r: &Run| {
            r.cpu.get("kube-apiserver").copied().unwrap_or(0.0)
                + r.cpu.get("etcd").copied().unwrap_or(0.0)
        };
        let wall_ratio = large.wall.as_secs_f64() / small.wall.as_secs_f64();
        let cpu_ratio = cpu(large) / cpu(small).max(0.01);
        let tickets = large.n as f64 / small.n as f64;
        println!();
        println!(
            "{} tickets against {}: wall {wall_ratio:.1}×, API server + etcd CPU {cpu_ratio:.1}× (linear: {tickets:.0}×; goal ≤ {:.1}×, 1.5× linear)",
            large.n,
            small.n,
            1.5 * tickets
        );
        line = line
            .num(
                &format!("wall_n{}_over_n{}", large.n, small.n),
                wall_ratio,
                2,
            )
            .num(&format!("cpu_n{}_over_n{}", large.n, small.n), cpu_ratio, 2);
    }
    line.field("load_before", load_before)
        .field("load_after", loadavg())
        .print();
}
