//! Benchmark: 1,000 Volumes, one ticket each, through a real `tessera controller`
//! (release build) on the cluster under test. MountPod status is driven as a node agent
//! would (the stand-in agent of the test fixtures). Prints: time from the first ticket
//! to the last satisfied status, the ticket latency percentiles, API requests per
//! reconcile, status writes per reconcile and per volume (coalescing), the requests per
//! attach by kind (the controller's own count, and the API server's count of every
//! client's), the watch events the API server sent, CPU by process, the CPU each kind
//! of segment cost per volume (the API server with etcd, and the clients), and the
//! controller's peak resident memory.
//!
//! Baseline in the same run, the *API floor*: the benchmark writes the same objects
//! itself for as many other volumes (ticket, MountPod, the agent's MountPod status, the
//! VolumeAttachment and Volume statuses, copied from what the controller wrote for a
//! warm-up volume), 64 volumes at once, with no controller in between: once with the
//! least an attach needs (5 requests a volume, the MountPod created with a POST) and
//! once with the controller's request mix (6: the Attached Event too). No controller
//! on this cluster can beat the floor; the controller's time divided by it is the
//! controller's own overhead. A third floor, the *chain* (chain.rs), issues the mix's
//! writes each when a watch shows the one before, holding the watches the controller
//! segment holds: what any watch-driven controller and agent pay on this cluster.
//!
//! The machine is shared, so the floor and the controller are measured in alternation:
//! `BENCH_ROUNDS` rounds (default 5), each a chunk of the volumes through the
//! controller between a minimal floor and a mix floor of the same size (their order
//! alternates), the chain next to the controller (before it, then after it). Each round gives a ratio; the benchmark reports the ratio of the sums,
//! the median of the rounds' ratios and their spread. Counts are summed over the
//! controller segments only. The controller's volumes stay attached, so it holds all
//! of them at the end.
//!
//! Ends with one `BENCH controller key=value …` line (bench/bench_line.rs).
//!
//! Run: `make bench-controller` (or `cargo bench --bench controller`; `BENCH_VOLUMES=N`
//! changes the count, `BENCH_ROUNDS=R` the rounds, `BENCH_CONTROLLER_ARGS` adds flags to
//! the controller's command line; `BENCH_FLOOR_SHAPE=controller` gives
//! the floors' objects the controller's finalizers and first statuses before their
//! clock starts). Figures and their analysis:
//! bench/controller/README.md.

#[path = "../bench_line.rs"]
mod bench_line;
#[path = "../procs.rs"]
mod procs;
#[path = "../../tests/support/mod.rs"]
mod support;

mod chain;
mod floor;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;

use tessera_api::{LABEL_VOLUME, MountPod, Volume, VolumeAttachment};

use bench_line::{BenchLine, loadavg};
use chain::chain;
use floor::{FLOOR_PIPELINES, FirstShape, Mix, Template, floor, wait_gone};
use support::fixtures::{self, ControllerProcess, FakeAgent, TEST_LABEL};

/// CPU seconds of the controller and, on the local control plane, of its components.
fn cpu_seconds(controller: u32) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    out.insert(
        "tessera controller".to_string(),
        procs::proc_cpu_seconds(controller),
    );
    out.insert(
        "this benchmark (+ stand-in agent)".to_string(),
        procs::proc_cpu_seconds(std::process::id()),
    );
    let components = ["kube-apiserver", "etcd", "kube-controller-manager"];
    for (c, pid) in procs::cluster_pids(&support::repo_root(), &components) {
        out.insert(c, procs::proc_cpu_seconds(pid));
    }
    out
}

/// Watch the test's VolumeAttachments until each of `names` reports ticket `csi-a`
/// satisfied; returns when each was first seen satisfied, measured from `t0`.
async fn watch_satisfied(
    vas: Api<VolumeAttachment>,
    id: String,
    names: BTreeSet<String>,
    t0: Instant,
) -> BTreeMap<String, Duration> {
    let n = names.len();
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
        if ok && names.contains(&va.name_any()) {
            satisfied_at
                .entry(va.name_any())
                .or_insert_with(|| t0.elapsed());
        }
    }
    satisfied_at
}

/// The controller's API requests (`tessera_api_requests_total`) by verb, resource and
/// subresource, from the metrics text.
fn requests_by_kind(metrics: &str) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    for (l, v) in support::api_requests(metrics) {
        let resource = match l["subresource"].as_str() {
            "" => l["resource"].clone(),
            sub => format!("{}/{sub}", l["resource"]),
        };
        *by.entry(format!("{} {resource}", l["verb"])).or_insert(0.0) += v;
    }
    by
}

/// What the controller segments counted, summed over the rounds: each a difference
/// between a reading just before a segment's first ticket and one just after its last
/// satisfied status, so the floor segments in between count nowhere.
#[derive(Default)]
struct Counts {
    reconciles: f64,
    requests: f64,
    /// The controller's requests by "VERB resource[/subresource]".
    by_kind: BTreeMap<String, f64>,
    /// CPU seconds by process.
    cpu: BTreeMap<String, f64>,
    /// The API server's requests (every client) by "resource[/subresource] VERB".
    apiserver: BTreeMap<String, f64>,
    /// Watch events the API server sent (every watcher), by resource.
    watch_events: BTreeMap<String, f64>,
}

/// Which end of a segment a reading is taken at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Edge {
    Start,
    End,
}

impl Counts {
    /// Scraping the metrics costs the API server and the controller CPU of their own
    /// (the API server's are megabytes), which must fall outside the segment: the CPU
    /// is read after the scrapes at its start, before them at its end.
    fn read(ctrl: &ControllerProcess, edge: Edge) -> Counts {
        let cpu_first = (edge == Edge::End).then(|| cpu_seconds(ctrl.child.id()));
        let metrics = ctrl.metrics().unwrap_or_default();
        let sum = |prefix: &str| {
            metrics
                .lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let apiserver = procs::apiserver_requests();
        let watch_events = procs::apiserver_watch_events();
        Counts {
            reconciles: sum("tessera_reconcile_total"),
            requests: sum("tessera_api_requests_total"),
            by_kind: requests_by_kind(&metrics),
            cpu: cpu_first.unwrap_or_else(|| cpu_seconds(ctrl.child.id())),
            apiserver,
            watch_events,
        }
    }

    /// Add `after - before`.
    fn add(&mut self, before: &Counts, after: &Counts) {
        fn add_map(
            to: &mut BTreeMap<String, f64>,
            b: &BTreeMap<String, f64>,
            a: &BTreeMap<String, f64>,
        ) {
            for (k, v) in a {
                *to.entry(k.clone()).or_insert(0.0) += v - b.get(k).copied().unwrap_or(0.0);
            }
        }
        self.reconciles += after.reconciles - before.reconciles;
        self.requests += after.requests - before.requests;
        add_map(&mut self.by_kind, &before.by_kind, &after.by_kind);
        add_map(&mut self.cpu, &before.cpu, &after.cpu);
        add_map(&mut self.apiserver, &before.apiserver, &after.apiserver);
        add_map(
            &mut self.watch_events,
            &before.watch_events,
            &after.watch_events,
        );
    }
}

/// CPU seconds of the API server with etcd, and of the clients (this benchmark with
/// its stand-in agent, and the controller, which is idle outside its own segments):
/// a reading, or what a segment spent (a difference), or a sum of those.
#[derive(Clone, Copy, Default)]
struct SegmentCpu {
    api: f64,
    clients: f64,
}

impl SegmentCpu {
    fn of(cpu: &BTreeMap<String, f64>) -> SegmentCpu {
        let sum = |names: &[&str]| names.iter().filter_map(|n| cpu.get(*n)).sum::<f64>();
        SegmentCpu {
            api: sum(&["kube-apiserver", "etcd"]),
            clients: sum(&["tessera controller", "this benchmark (+ stand-in agent)"]),
        }
    }

    /// What was spent from `before` to this reading.
    fn since(self, before: SegmentCpu) -> SegmentCpu {
        SegmentCpu {
            api: self.api - before.api,
            clients: self.clients - before.clients,
        }
    }

    fn add(&mut self, spent: SegmentCpu) {
        self.api += spent.api;
        self.clients += spent.clients;
    }
}

/// Reads [`SegmentCpu`] around the timed part of a floor.
struct CpuMeter {
    controller: u32,
}

impl CpuMeter {
    fn read(&self) -> SegmentCpu {
        SegmentCpu::of(&cpu_seconds(self.controller))
    }
}

/// One round's segments: the controller's chunk and the two floors of the same size.
struct Round {
    volumes: usize,
    controller: Duration,
    submitted: Duration,
    floor_minimal: Duration,
    floor_mix: Duration,
    floor_chain: Duration,
}

/// `v` sorted; the median, the least and the greatest.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (median, v[0], v[v.len() - 1])
}

/// Attach `names` through the controller: their Volumes and VolumeAttachments first
/// (untimed; `total` of the test's VolumeAttachments exist then), then one ticket each,
/// 32 at once, timed from the first ticket to the last satisfied status. Returns
/// (time, tickets submitted after, each ticket's time to satisfied, setup time).
async fn controller_segment(
    client: &kube::Client,
    ctrl: &ControllerProcess,
    id: &str,
    node: &str,
    names: &[String],
    total: usize,
    counts: &mut Counts,
) -> (Duration, Duration, Vec<Duration>, Duration) {
    let volumes: Api<Volume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let t = Instant::now();
    stream::iter(names.iter().map(|name| {
        let volumes = volumes.clone();
        async move {
            volumes
                .create(
                    &PostParams::default(),
                    &fixtures::volume(name, id, "ReadWriteOnce"),
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
    while vas
        .list_metadata(&selector)
        .await
        .map_or(0, |l| l.items.len())
        < total
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And their first statuses (written for an empty ticket list), so that those
    // writes do not land in the timed segment; bounded, in case a status never comes.
    let chunk: BTreeSet<&String> = names.iter().collect();
    let settle = Instant::now() + Duration::from_secs(30);
    loop {
        let (vs, ws) = tokio::join!(volumes.list(&selector), vas.list(&selector));
        let unsettled = vs.map_or(1, |l| {
            l.items
                .iter()
                .filter(|v| chunk.contains(&v.name_any()) && v.status.is_none())
                .count()
        }) + ws.map_or(1, |l| {
            l.items
                .iter()
                .filter(|v| chunk.contains(&v.name_any()) && v.status.is_none())
                .count()
        });
        if unsettled == 0 {
            break;
        }
        if Instant::now() > settle {
            eprintln!("  setup: {unsettled} objects still without a status after 30 s");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let setup = t.elapsed();

    let before = Counts::read(ctrl, Edge::Start);
    let t0 = Instant::now();
    let chunk: BTreeSet<String> = names.iter().cloned().collect();
    let watch_task = tokio::spawn(watch_satisfied(vas.clone(), id.to_string(), chunk, t0));
    stream::iter(names.iter().map(|name| async move {
        fixtures::put_ticket(client, name, "csi-a", "csi-attacher", node, json!({})).await
    }))
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;
    let submitted = t0.elapsed();
    // Satisfaction is observed through a watch (started before the burst), not by
    // listing every VolumeAttachment in a loop, which would load the API server too.
    let satisfied_at = watch_task.await.expect("watch task");
    let took = t0.elapsed();
    counts.add(&before, &Counts::read(ctrl, Edge::End));
    (took, submitted, satisfied_at.into_values().collect(), setup)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("controller benchmark: run it with `cargo bench --bench controller`");
        return;
    }
    let env = |k: &str, default: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let n: usize = env("BENCH_VOLUMES", 1000);
    let rounds: usize = env("BENCH_ROUNDS", 5).clamp(1, n.max(1));
    let load_before = loadavg();
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let id = support::unique_name("bench");
    let node = format!("{id}-n0");
    fixtures::create_nodes(&client, std::slice::from_ref(&node)).await;
    // The node's agent is registered, as a real one is (its CSINode lists the driver):
    // otherwise the controller reports every attach at once as waiting for an agent.
    fixtures::create_csinodes(&client, &id, std::slice::from_ref(&node)).await;
    // `BENCH_CONTROLLER_ARGS`: more flags for the controller (an A/B of a setting).
    let extra = std::env::var("BENCH_CONTROLLER_ARGS").unwrap_or_default();
    let mut args = vec!["--no-leader-election"];
    args.extend(extra.split_whitespace());
    let ctrl = ControllerProcess::start(&id, &args);
    // Its connections to the API server, setups included (bursts of new Volumes).
    let sockets = procs::SocketPeak::start(ctrl.child.id());
    let _agent = FakeAgent::start(client.clone(), &id);
    let volumes: Api<Volume> = Api::all(client.clone());
    let names: Vec<String> = (0..n).map(|i| format!("{id}-v{i}")).collect();

    // One volume attached by the controller first: its objects are the templates of
    // the API floor (below).
    let warm = format!("{id}-warm");
    fixtures::create_volume(
        &client,
        &fixtures::volume(&warm, &id, "ReadWriteOnce"),
        Duration::from_secs(30),
    )
    .await;
    let shape = std::env::var("BENCH_FLOOR_SHAPE").unwrap_or_default();
    let first = match shape.as_str() {
        "controller" => Some(FirstShape::capture(&client, &warm).await),
        _ => None,
    };
    fixtures::put_ticket(&client, &warm, "csi-a", "csi-attacher", &node, json!({})).await;
    fixtures::wait_satisfied(&client, &warm, "csi-a").await;
    let mut template = Template::capture(&client, &warm).await;
    template.first = first;
    let template = std::sync::Arc::new(template);
    // The ticket first: a Volume whose node still serves a workload ticket keeps its
    // data (and so itself) until the ticket goes.
    fixtures::remove_ticket(&client, &warm, "csi-a").await;
    fixtures::delete_volumes(&client, std::slice::from_ref(&warm)).await;
    wait_gone(&client, &id).await;

    // Rounds: in each, a chunk of the volumes attached by the controller between two
    // floors of the same size (the API floor: the same objects written by this
    // benchmark directly, with no controller decisions, caches or watches in between;
    // what the API server on this machine needs for the attaches alone). The floor and
    // the controller are thus measured minutes apart at most, under the same load, and
    // the order of the two floors alternates. The controller's volumes stay attached
    // from round to round, so it holds all `n` at the end.
    let mut counts = Counts::default();
    // CPU during the minimal, mix and chain floors.
    let mut cpu = [SegmentCpu::default(); 3];
    let mut all_rounds = Vec::new();
    let mut latencies = Vec::new();
    let mut setup = Duration::ZERO;
    let chunks: Vec<&[String]> = names.chunks(n.div_ceil(rounds)).collect();
    let mut attached = 0;
    for (r, chunk) in chunks.iter().enumerate() {
        let m = chunk.len();
        let first = if r % 2 == 0 {
            Mix::Minimal
        } else {
            Mix::Controller
        };
        let second = if first == Mix::Minimal {
            Mix::Controller
        } else {
            Mix::Minimal
        };
        // The watch-driven floor next to the controller, before it and after it in
        // turn: [minimal, chain, controller, mix], [mix, controller, chain, minimal], …
        let meter = CpuMeter {
            controller: ctrl.child.id(),
        };
        let slot = |mix: Mix| if mix == Mix::Minimal { 0 } else { 1 };
        let (a, spent) = floor(&client, &template, &node, m, first, &meter).await;
        cpu[slot(first)].add(spent);
        let mut floor_chain = Duration::ZERO;
        if r % 2 == 0 {
            let spent;
            (floor_chain, spent) = chain(&client, &template, &node, m, &meter).await;
            cpu[2].add(spent);
        }
        attached += m;
        let (took, submitted, lat, s) =
            controller_segment(&client, &ctrl, &id, &node, chunk, attached, &mut counts).await;
        if r % 2 == 1 {
            let spent;
            (floor_chain, spent) = chain(&client, &template, &node, m, &meter).await;
            cpu[2].add(spent);
        }
        let (b, spent) = floor(&client, &template, &node, m, second, &meter).await;
        cpu[slot(second)].add(spent);
        let (floor_minimal, floor_mix) = if first == Mix::Minimal {
            (a, b)
        } else {
            (b, a)
        };
        println!(
            "  round {}: {m} volumes, controller {:.2} s, floor minimal {:.2} s ({:.2}×), mix {:.2} s ({:.2}×), chain {:.2} s ({:.2}×)",
            r + 1,
            took.as_secs_f64(),
            floor_minimal.as_secs_f64(),
            took.as_secs_f64() / floor_minimal.as_secs_f64(),
            floor_mix.as_secs_f64(),
            took.as_secs_f64() / floor_mix.as_secs_f64(),
            floor_chain.as_secs_f64(),
            took.as_secs_f64() / floor_chain.as_secs_f64(),
        );
        setup += s;
        latencies.extend(lat);
        all_rounds.push(Round {
            volumes: m,
            controller: took,
            submitted,
            floor_minimal,
            floor_mix,
            floor_chain,
        });
    }
    let sum = |f: fn(&Round) -> Duration| all_rounds.iter().map(f).sum::<Duration>();
    let total = sum(|r| r.controller);
    let submitted = sum(|r| r.submitted);
    let floor_minimal = sum(|r| r.floor_minimal);
    let floor_same = sum(|r| r.floor_mix);
    let floor_chain = sum(|r| r.floor_chain);
    let ratios = |f: fn(&Round) -> Duration| {
        spread(
            all_rounds
                .iter()
                .map(|r| r.controller.as_secs_f64() / f(r).as_secs_f64())
                .collect(),
        )
    };
    let over_minimal_rounds = ratios(|r| r.floor_minimal);
    let over_mix_rounds = ratios(|r| r.floor_mix);
    let over_chain_rounds = ratios(|r| r.floor_chain);
    let chain_over_mix = floor_chain.as_secs_f64() / floor_same.as_secs_f64();
    let rss_mib = support::proc_status_kib(ctrl.child.id(), "VmHWM") as f64 / 1024.0;
    let peak_sockets = sockets.peak();
    let lat = {
        let mut l = latencies;
        l.sort();
        l
    };
    let pct = |p: f64| {
        lat[((lat.len() as f64 * p).ceil() as usize)
            .saturating_sub(1)
            .min(lat.len() - 1)]
    };
    let chunk_size = all_rounds.first().map_or(0, |r| r.volumes);

    println!();
    println!(
        "controller benchmark: {n} volumes, one csi-attacher ticket each, one node, in {} rounds of {chunk_size}",
        all_rounds.len()
    );
    println!(
        "  setup (volumes + their VolumeAttachments)  {:>8.2} s",
        setup.as_secs_f64()
    );
    println!(
        "  tickets submitted in (sum of the rounds)   {:>8.2} s",
        submitted.as_secs_f64()
    );
    println!(
        "  all tickets satisfied after (sum)          {:>8.2} s   (goal < 20 s)",
        total.as_secs_f64()
    );
    println!(
        "  ticket satisfied, since its round began    p50 {:.2} s  p99 {:.2} s",
        pct(0.5).as_secs_f64(),
        pct(0.99).as_secs_f64()
    );
    let reconciles = counts.reconciles;
    let requests = counts.requests;
    println!(
        "  reconciles                                 {:>8.0}",
        reconciles
    );
    println!(
        "  API requests per reconcile (all, watches too) {:>6.2}",
        requests / reconciles.max(1.0)
    );
    println!(
        "  controller peak resident memory            {:>8.1} MiB (goal < 150 MB)",
        rss_mib
    );
    println!(
        "  controller peak open sockets               {:>8}",
        peak_sockets
    );
    println!("  controller requests per volume, by verb and resource");
    let mut per_volume = BTreeMap::new();
    for (k, d) in &counts.by_kind {
        if *d > 0.0 {
            println!("    {k:<40} {:>8.2}", d / n as f64);
            per_volume.insert(k.clone(), d / n as f64);
        }
    }
    // Coalescing: kube-runtime runs one reconcile per object at a time and folds the
    // triggers that arrive meanwhile; each reconcile writes a status at most once.
    let status_writes = |kind: &str| {
        counts
            .by_kind
            .get(&format!("PATCH {kind}/status"))
            .copied()
            .unwrap_or(0.0)
    };
    let (va_writes, volume_writes) = (status_writes("volumeattachments"), status_writes("volumes"));
    println!(
        "  status writes per reconcile: VolumeAttachment {:.3}, Volume {:.3}",
        va_writes / reconciles.max(1.0),
        volume_writes / reconciles.max(1.0)
    );
    println!(
        "  reconciles per volume {:.2}; status writes per volume: VolumeAttachment {:.2}, Volume {:.2}",
        reconciles / n as f64,
        va_writes / n as f64,
        volume_writes / n as f64
    );
    // The API server's own count: the tickets, the controller, the stand-in agent and
    // this benchmark's watch, every request it served for Tessera's kinds and Events.
    println!("  API server requests per volume (every client), by resource and verb");
    let mut apiserver_per_volume = BTreeMap::new();
    for (k, d) in &counts.apiserver {
        if *d > 0.0 && !k.ends_with(" WATCH") {
            println!("    {k:<40} {:>8.2}", d / n as f64);
            apiserver_per_volume.insert(k.clone(), d / n as f64);
        }
    }
    let apiserver_writes: f64 = apiserver_per_volume
        .iter()
        .filter(|(k, _)| !k.ends_with(" GET") && !k.ends_with(" LIST"))
        .map(|(_, v)| v)
        .sum();
    println!("    writes, all kinds                        {apiserver_writes:>8.2}");
    println!("  watch events the API server sent per volume (every watcher), by resource");
    let mut watch_per_volume = BTreeMap::new();
    for (k, d) in &counts.watch_events {
        if *d > 0.0 {
            println!("    {k:<40} {:>8.2}", d / n as f64);
            watch_per_volume.insert(k.clone(), d / n as f64);
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    println!(
        "  CPU seconds during the controller segments ({:.1} s wall × {cores} cores = {:.0} CPU-s)",
        total.as_secs_f64(),
        cores as f64 * total.as_secs_f64()
    );
    for (k, d) in &counts.cpu {
        println!("    {k:<40} {d:>8.1}");
    }
    // The same work done four ways: what each cost the API server and the clients.
    let controller_cpu = SegmentCpu::of(&counts.cpu);
    let per_volume_ms = |c: f64| 1000.0 * c / n as f64;
    println!("  CPU ms per volume, by segment: API server + etcd, clients");
    let segments = [
        ("minimal", cpu[0]),
        ("mix", cpu[1]),
        ("chain", cpu[2]),
        ("controller", controller_cpu),
    ];
    for (name, c) in segments {
        println!(
            "    {name:<40} {:>8.2} {:>8.2}",
            per_volume_ms(c.api),
            per_volume_ms(c.clients)
        );
    }

    // Clean up: remove the tickets (as the kubelet's detach would), delete the volumes
    // (their data cleanup runs through tickets too).
    let t = Instant::now();
    stream::iter(names.iter().map(|name| {
        let client = client.clone();
        async move { fixtures::remove_ticket(&client, name, "csi-a").await }
    }))
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;
    for name in &names {
        let _ = volumes.delete(name, &Default::default()).await;
    }
    let selector = ListParams::default().labels(&format!("{TEST_LABEL}={id}"));
    let deleted = loop {
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
            break (t.elapsed(), left);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Their VolumeAttachments and MountPods go after them (garbage collection), and
    // only the controller and the stand-in agent remove their finalizers: left behind,
    // they would stay on the cluster after this process, and its controller, ended.
    wait_gone(&client, &id).await;
    println!(
        "  API floor: the same writes issued directly (no controller), {FLOOR_PIPELINES} volumes at once, sum of the rounds"
    );
    println!(
        "    minimal: ticket, MountPod (POST), its status, each status once (5/volume) {:>6.2} s",
        floor_minimal.as_secs_f64()
    );
    println!(
        "    the controller's mix (+ the Attached Event; 6/volume)               {:>6.2} s",
        floor_same.as_secs_f64()
    );
    println!(
        "    the same mix, each write issued when a watch shows the one before (chain) {:>6.2} s ({chain_over_mix:.2}× the mix)",
        floor_chain.as_secs_f64()
    );
    let over_minimal = total.as_secs_f64() / floor_minimal.as_secs_f64();
    let over_mix = total.as_secs_f64() / floor_same.as_secs_f64();
    let over_chain = total.as_secs_f64() / floor_chain.as_secs_f64();
    println!(
        "  controller time / minimal floor: sums {over_minimal:.2}, rounds median {:.2} (spread {:.2}–{:.2})   (goal ≤ 1.2)",
        over_minimal_rounds.0, over_minimal_rounds.1, over_minimal_rounds.2
    );
    println!(
        "  controller time / floor with the same mix: sums {over_mix:.2}, rounds median {:.2} (spread {:.2}–{:.2})",
        over_mix_rounds.0, over_mix_rounds.1, over_mix_rounds.2
    );
    println!(
        "  controller time / watch-driven chain: sums {over_chain:.2}, rounds median {:.2} (spread {:.2}–{:.2})",
        over_chain_rounds.0, over_chain_rounds.1, over_chain_rounds.2
    );
    fixtures::delete_csinodes(&client, std::slice::from_ref(&node)).await;
    fixtures::delete_nodes(&client, &[node]).await;

    let mut line = BenchLine::new("controller")
        .field("volumes", n)
        .field("rounds", all_rounds.len())
        .field("cores", cores)
        .field("controller_args", &extra)
        .field("floor_shape", &shape)
        .num("setup_s", setup.as_secs_f64(), 2)
        .num("submitted_s", submitted.as_secs_f64(), 2)
        .num("all_satisfied_s", total.as_secs_f64(), 2)
        .num("p50_s", pct(0.5).as_secs_f64(), 2)
        .num("p99_s", pct(0.99).as_secs_f64(), 2)
        .num("floor_minimal_s", floor_minimal.as_secs_f64(), 2)
        .num("floor_mix_s", floor_same.as_secs_f64(), 2)
        .num("floor_chain_s", floor_chain.as_secs_f64(), 2)
        .num("floor_chain_over_mix", chain_over_mix, 2);
    line = ratio_fields(line, "minimal", over_minimal, over_minimal_rounds);
    line = ratio_fields(line, "mix", over_mix, over_mix_rounds);
    line = ratio_fields(line, "chain", over_chain, over_chain_rounds);
    line = line
        .num("reconciles", reconciles, 0)
        .num("reconciles_per_volume", reconciles / n as f64, 2)
        .num("requests_per_reconcile", requests / reconciles.max(1.0), 2)
        .num("requests_per_volume", requests / n as f64, 2)
        .num(
            "va_status_writes_per_reconcile",
            va_writes / reconciles.max(1.0),
            3,
        )
        .num(
            "volume_status_writes_per_reconcile",
            volume_writes / reconciles.max(1.0),
            3,
        )
        .num("controller_peak_rss_mib", rss_mib, 1)
        .field("controller_peak_sockets", peak_sockets)
        .num("delete_s", deleted.0.as_secs_f64(), 2)
        .field("delete_left", deleted.1);
    for (k, v) in &per_volume {
        line = line.num(&format!("req_{}", key(k)), *v, 2);
    }
    for (k, v) in &apiserver_per_volume {
        line = line.num(&format!("apiserver_{}", key(k)), *v, 2);
    }
    line = line.num("apiserver_writes_per_volume", apiserver_writes, 2);
    for (name, c) in segments {
        line = line
            .num(
                &format!("cpu_api_ms_per_volume_{name}"),
                per_volume_ms(c.api),
                2,
            )
            .num(
                &format!("cpu_clients_ms_per_volume_{name}"),
                per_volume_ms(c.clients),
                2,
            );
    }
    for (k, v) in &watch_per_volume {
        line = line.num(&format!("watch_events_{}", key(k)), *v, 2);
    }
    for (k, v) in &counts.cpu {
        line = line.num(&format!("cpu_{}_s", key(k)), *v, 1);
    }
    line.field("load_before", load_before)
        .field("load_after", loadavg())
        .print();
}

/// `over_floor_<floor>` (the ratio of the sums) and its `_median`, `_min` and `_max`
/// over the rounds.
fn ratio_fields(line: BenchLine, floor: &str, sums: f64, rounds: (f64, f64, f64)) -> BenchLine {
    line.num(&format!("over_floor_{floor}"), sums, 2)
        .num(&format!("over_floor_{floor}_median"), rounds.0, 2)
        .num(&format!("over_floor_{floor}_min"), rounds.1, 2)
        .num(&format!("over_floor_{floor}_max"), rounds.2, 2)
}

/// `s` as a key: lower case, words joined by `_`, nothing but letters, digits, `_`.
fn key(s: &str) -> String {
    let words: Vec<String> = s
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    words.join("_")
}
