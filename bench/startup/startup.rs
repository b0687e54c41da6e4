//! Benchmark: what a user feels — how much later a Pod with a Tessera claim runs than
//! the same Pod without one (issue 34 item 3), on the harness's real nodes (kubelet,
//! containerd, runc; Tessera deployed from `config/`; its volumes on the GlusterFS
//! backend).
//!
//! Sets of N Pods (`BENCH_STARTUP_PODS`, default 100), placed by the scheduler, each
//! created as fast as the API server takes them and timed from its create to the
//! watch seeing it `Running`:
//!  * `emptydir`: busybox with an `emptyDir` (the baseline);
//!  * `claim`: the same Pod with a claim of its own, created just before it (as a
//!    StatefulSet's volumeClaimTemplates do): dynamic provisioning, attach (a ticket,
//!    a MountPod, a mount daemon), NodePublish;
//!  * `rwx`: the same Pod, all N on one ReadWriteMany claim made (and bound) before;
//!  * `pair`: the design's floor for a claim each: per Pod, first another emptyDir
//!    Pod (as a claim's mount Pod is one), and once it runs the Pod itself on the same
//!    node, timed from the first's create: twice the sandboxes and containers, one
//!    after the other, with none of Tessera's work.
//!
//! The emptyDir, pair and own-claim sets alternate (`BENCH_STARTUP_ROUNDS`, default
//! 2: E P C E P C) so that a machine getting busier or quieter does not favour one; each set
//! is deleted, claims and PVs included, before the next begins. Reported per kind:
//! p50, p99 and max of create → Running, and the total (first create → last
//! Running); the ratios of the totals to the emptyDir baseline's (medians over
//! rounds). Ends with one `BENCH startup …` line.
//!
//! Run: `make bench-startup` (real nodes started and stopped by bench/startup/run.sh,
//! or `KUBECONFIG` of a cluster with Tessera). Figures: bench/startup/README.md.

#[path = "../bench_line.rs"]
mod bench_line;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;

use bench_line::{BenchLine, loadavg};

const BUSYBOX: &str = "harness.tessera.io/busybox:1.35";
/// The bound of one set's wait for its Pods, and of its cleanup.
const SET_TIMEOUT: Duration = Duration::from_secs(900);
/// Creates in flight at once.
const CONCURRENCY: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    EmptyDir,
    Claim,
    Rwx,
    Pair,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::EmptyDir => "emptydir",
            Kind::Claim => "claim",
            Kind::Rwx => "rwx",
            Kind::Pair => "pair",
        }
    }
}

/// One set's figures.
struct Set {
    kind: Kind,
    /// Create → Running of each Pod that ran.
    each: Vec<Duration>,
    /// First create → last Running.
    total: Duration,
    /// Pods not Running within the timeout.
    missing: usize,
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The value at quantile `q` (nearest rank) of `sorted`.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    quantile(&v, 0.5)
}

fn pod_json(name: &str, set: &str, volume: serde_json::Value, node: Option<&str>) -> Pod {
    let selector = node.map(|n| json!({"kubernetes.io/hostname": n}));
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench.tessera.io/set": set}},
        "spec": {
            "nodeSelector": selector,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [volume],
        }
    }))
    .expect("a Pod")
}

fn claim_json(name: &str, set: &str, class: &str, mode: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench.tessera.io/set": set}},
        "spec": {
            "accessModes": [mode],
            "storageClassName": class,
            "resources": {"requests": {"storage": "64Mi"}},
        }
    }))
    .expect("a claim")
}

/// When each Pod of `set` was first seen Running, from a watch started before any is
/// created; the receiver fires once the watch has listed.
fn watch_running(
    client: Client,
    ns: &str,
    set: &str,
) -> (
    tokio::sync::watch::Receiver<HashMap<String, Instant>>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let (tx, rx) = tokio::sync::watch::channel(HashMap::new());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let api: Api<Pod> = Api::namespaced(client, ns);
    let wc = watcher::Config::default().labels(&format!("bench.tessera.io/set={set}"));
    tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut events = watcher::watcher(api, wc).boxed();
        while let Some(ev) = events.next().await {
            let now = Instant::now();
            match ev {
                Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => {
                    let running =
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                    if running {
                        tx.send_modify(|m| {
                            m.entry(p.name_any()).or_insert(now);
                        });
                    }
                }
                Ok(Event::InitDone) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("  (watch error, resuming: {e})");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    (rx, ready_rx)
}

async fn run_set(client: &Client, ns: &str, n: usize, kind: Kind, class: &str, id: usize) -> Set {
    let set = format!("{}-{id}", kind.name());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    if kind == Kind::Rwx {
        // The shared claim exists and is bound before the set: users make it once.
        let c = claim_json(&format!("{set}-shared"), &set, class, "ReadWriteMany");
        claims
            .create(&PostParams::default(), &c)
            .await
            .expect("the RWX claim");
        let deadline = Instant::now() + SET_TIMEOUT;
        loop {
            let c = claims
                .get(&format!("{set}-shared"))
                .await
                .expect("the RWX claim");
            if c.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                break;
            }
            assert!(Instant::now() < deadline, "the RWX claim never bound");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let (mut running, listed) = watch_running(client.clone(), ns, &set);
    listed.await.expect("the watch listed");
    let seen_running = running.clone();
    // At most CONCURRENCY creates in flight; a pair's wait for its first Pod holds
    // no slot (a claim's mount Pods are made for all claims at once, too).
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let created: Vec<(String, Instant)> = stream::iter(0..n)
        .map(|i| {
            let (pods, claims, set) = (pods.clone(), claims.clone(), set.clone());
            let mut running = seen_running.clone();
            let slots = slots.clone();
            async move {
                let name = format!("{set}-{i}");
                let slot = slots.acquire().await.expect("slots");
                let empty = json!({"name": "data", "emptyDir": {}});
                let mut node = None;
                let mut at = None;
                let volume = match kind {
                    Kind::EmptyDir => empty,
                    Kind::Pair => {
                        // The stand-in for a mount Pod: made, Running, then the Pod
                        // on its node.
                        let first = format!("{name}-m");
                        at = Some(Instant::now());
                        pods.create(
                            &PostParams::default(),
                            &pod_json(&first, &set, empty.clone(), None),
                        )
                        .await
                        .expect("a Pod");
                        drop(slot);
                        let _ = tokio::time::timeout(
                            SET_TIMEOUT,
                            running.wait_for(|m| m.contains_key(&first)),
                        )
                        .await;
                        node = pods.get(&first).await.ok().and_then(|p| p.spec?.node_name);
                        empty
                    }
                    Kind::Claim => {
                        claims
                            .create(
                                &PostParams::default(),
                                &claim_json(&name, &set, class, "ReadWriteOnce"),
                            )
                            .await
                            .expect("a claim");
                        json!({"name": "data", "persistentVolumeClaim": {"claimName": name}})
                    }
                    Kind::Rwx => json!({"name": "data",
                        "persistentVolumeClaim": {"claimName": format!("{set}-shared")}}),
                };
                let _slot = match kind {
                    Kind::Pair => Some(slots.acquire().await.expect("slots")),
                    _ => None,
                };
                let at = at.unwrap_or_else(Instant::now);
                pods.create(
                    &PostParams::default(),
                    &pod_json(&name, &set, volume, node.as_deref()),
                )
                .await
                .expect("a Pod");
                (name, at)
            }
        })
        .buffer_unordered(n.max(1))
        .collect()
        .await;
    let first = created.iter().map(|(_, at)| *at).min().expect("Pods");
    let deadline = tokio::time::Instant::now() + SET_TIMEOUT;
    let all = loop {
        let seen = running.borrow_and_update().clone();
        // The Pods themselves (a pair's first Pods are in the map too).
        let main = |name: &String| !name.ends_with("-m");
        if seen.keys().filter(|k| main(k)).count() >= n {
            break seen;
        }
        if tokio::time::timeout_at(deadline, running.changed())
            .await
            .is_err()
        {
            break running.borrow().clone();
        }
    };
    let mut each: Vec<Duration> = created
        .iter()
        .filter_map(|(name, at)| all.get(name).map(|r| r.duration_since(*at)))
        .collect();
    each.sort();
    let last = all.values().max().copied().unwrap_or(first);
    let result = Set {
        kind,
        missing: n - each.len(),
        each,
        total: last.duration_since(first),
    };
    drop((running, seen_running));
    // Printed before the cleanup, which under load can take longer than the set.
    report(&result);
    cleanup(client, ns, &set).await;
    result
}

/// Delete the set's Pods and claims; wait until they, and the claims' PVs, are gone.
async fn cleanup(client: &Client, ns: &str, set: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("bench.tessera.io/set={set}"));
    let pvs: Vec<String> = claims
        .list(&lp)
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|c| c.spec?.volume_name)
                .collect()
        })
        .unwrap_or_default();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let _ = pods.delete_collection(&now, &lp).await;
    let _ = claims
        .delete_collection(&DeleteParams::default(), &lp)
        .await;
    let pv_api: Api<PersistentVolume> = Api::all(client.clone());
    let deadline = Instant::now() + SET_TIMEOUT;
    loop {
        let left_pods = pods.list(&lp).await.map(|l| l.items.len()).unwrap_or(1);
        let left_claims = claims.list(&lp).await.map(|l| l.items.len()).unwrap_or(1);
        let mut left_pvs = 0;
        for pv in &pvs {
            if pv_api.get_opt(pv).await.ok().flatten().is_some() {
                left_pvs += 1;
            }
        }
        if left_pods + left_claims + left_pvs == 0 {
            return;
        }
        if Instant::now() > deadline {
            eprintln!(
                "  (cleanup of {set}: {left_pods} Pods, {left_claims} claims, {left_pvs} PVs left)"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let n = env_usize("BENCH_STARTUP_PODS", 100);
    let rounds = env_usize("BENCH_STARTUP_ROUNDS", 2).max(1);
    let class = std::env::var("BENCH_STARTUP_CLASS").unwrap_or_else(|_| "tessera-shared".into());
    let client = support::client().await;
    let ns = format!("bench-startup-{}", std::process::id());
    let ns_api: Api<Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .expect("the namespace");
    // Real Pods need the namespace's default ServiceAccount (its token).
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    while sas.get_opt("default").await.ok().flatten().is_none() {
        assert!(Instant::now() < deadline, "no default ServiceAccount");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "start-up of {n} Pods, emptyDir vs two Pods in turn vs a claim each ({class}), {rounds} rounds alternated; then {n} on one RWX claim"
    );
    let mut sets = Vec::new();
    let mut id = 0;
    for _ in 0..rounds {
        for kind in [Kind::EmptyDir, Kind::Pair, Kind::Claim] {
            let s = run_set(&client, &ns, n, kind, &class, id).await;
            id += 1;
            sets.push(s);
        }
    }
    let rwx = run_set(&client, &ns, n, Kind::Rwx, &class, id).await;
    sets.push(rwx);
    let _ = ns_api.delete(&ns, &DeleteParams::default()).await;

    let of = |k: Kind| sets.iter().filter(move |s| s.kind == k);
    let total = |k: Kind| median(of(k).map(|s| s.total).collect());
    let pooled = |k: Kind| {
        let mut all: Vec<Duration> = of(k).flat_map(|s| s.each.iter().copied()).collect();
        all.sort();
        all
    };
    let (e, c, r, p) = (
        pooled(Kind::EmptyDir),
        pooled(Kind::Claim),
        pooled(Kind::Rwx),
        pooled(Kind::Pair),
    );
    let base = secs(total(Kind::EmptyDir)).max(1e-3);
    let missing: usize = sets.iter().map(|s| s.missing).sum();
    println!(
        "ratios of the totals to emptyDir's: own claim {:.2}x (goal <= 1.2), one RWX claim {:.2}x; claim p99 {:.1} s (goal <= 5 s)",
        secs(total(Kind::Claim)) / base,
        secs(total(Kind::Rwx)) / base,
        secs(quantile(&c, 0.99))
    );
    println!(
        "the design's floor (two Pods in turn per Pod): {:.2}x emptyDir's total; own claim {:.2}x that floor",
        secs(total(Kind::Pair)) / base,
        secs(total(Kind::Claim)) / secs(total(Kind::Pair)).max(1e-3)
    );
    let mut line = BenchLine::new("startup")
        .field("pods", n)
        .field("rounds", rounds);
    for (name, v, k) in [
        ("emptydir", &e, Kind::EmptyDir),
        ("claim", &c, Kind::Claim),
        ("rwx", &r, Kind::Rwx),
        ("pair", &p, Kind::Pair),
    ] {
        line = line
            .num(&format!("{name}_p50_s"), secs(quantile(v, 0.5)), 2)
            .num(&format!("{name}_p99_s"), secs(quantile(v, 0.99)), 2)
            .num(&format!("{name}_total_s"), secs(total(k)), 2);
    }
    line.num("claim_total_ratio", secs(total(Kind::Claim)) / base, 2)
        .num("rwx_total_ratio", secs(total(Kind::Rwx)) / base, 2)
        .num("pair_total_ratio", secs(total(Kind::Pair)) / base, 2)
        .num(
            "claim_over_pair",
            secs(total(Kind::Claim)) / secs(total(Kind::Pair)).max(1e-3),
            2,
        )
        .field("missing", missing)
        .field("load", loadavg())
        .print();
}

fn report(s: &Set) {
    println!(
        "  {:<8} p50 {:>6.2} s  p99 {:>6.2} s  max {:>6.2} s  total {:>6.2} s{}",
        s.kind.name(),
        secs(quantile(&s.each, 0.5)),
        secs(quantile(&s.each, 0.99)),
        secs(s.each.last().copied().unwrap_or_default()),
        secs(s.total),
        if s.missing > 0 {
            format!(
                "  ({} not Running in {} s)",
                s.missing,
                SET_TIMEOUT.as_secs()
            )
        } else {
            String::new()
        }
    );
}
