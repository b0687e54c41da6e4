//! What the benchmarks read about processes and the API server: CPU seconds from
//! /proc, the local control plane's pids, and request counters from metrics text (the
//! API server's own among them).

use std::collections::BTreeMap;

/// User+system CPU seconds of `pid` (and its reaped children), from /proc.
pub fn proc_cpu_seconds(pid: u32) -> f64 {
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

/// How many sockets `pid` holds open (its connections to the API server, mostly: a
/// kube client keeps each idle connection for 90 s).
pub fn socket_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| {
        fds.filter_map(Result::ok)
            .filter(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            })
            .count()
    })
}

/// Samples `socket_count(pid)` every 100 ms until dropped; `peak()` is the most seen.
pub struct SocketPeak {
    peak: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SocketPeak {
    pub fn start(pid: u32) -> SocketPeak {
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = peak.clone();
        let task = tokio::spawn(async move {
            loop {
                seen.fetch_max(socket_count(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
        SocketPeak { peak, task }
    }

    pub fn peak(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for SocketPeak {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The pids of the local control plane's `components` (target/cluster/pids), when the
/// benchmark runs against it (no other KUBECONFIG).
pub fn cluster_pids(repo: &std::path::Path, components: &[&str]) -> BTreeMap<String, u32> {
    let pids = repo.join("target/cluster/pids");
    let local = repo.join("target/cluster/kubeconfig");
    let mut out = BTreeMap::new();
    if std::env::var_os("KUBECONFIG").is_none_or(|k| std::path::Path::new(&k) == local) {
        for c in components {
            if let Some(pid) = std::fs::read_to_string(pids.join(format!("{c}.pid")))
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                out.insert(c.to_string(), pid);
            }
        }
    }
    out
}

/// The value of every sample of `metric` in Prometheus text, keyed by the values of
/// `labels` joined with spaces (a missing label is empty).
pub fn samples(text: &str, metric: &str, labels: &[&str]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(metric).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((set, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let field = |k: &str| {
            let start = set.find(&format!("{k}=\""))? + k.len() + 2;
            let end = set[start..].find('"')? + start;
            Some(set[start..end].to_string())
        };
        let key: Vec<String> = labels
            .iter()
            .map(|k| field(k).unwrap_or_default())
            .collect();
        if let Ok(v) = value.parse::<f64>() {
            *out.entry(key.join(" ")).or_default() += v;
        }
    }
    out
}

/// The API server's request counters for Tessera's kinds and Events (its own
/// `apiserver_request_total`: every client counts), by "resource[/subresource] VERB",
/// read with `kubectl get --raw /metrics`.
pub fn apiserver_requests() -> BTreeMap<String, f64> {
    let text = crate::support::kubectl_output(&["get", "--raw", "/metrics"]);
    samples(
        &text,
        "apiserver_request_total",
        &["group", "resource", "subresource", "verb"],
    )
    .into_iter()
    .filter(|(k, _)| k.starts_with("tessera.io ") || k.contains(" events "))
    .map(|(k, v)| {
        let f: Vec<&str> = k.split(' ').collect();
        let resource = if f[2].is_empty() {
            f[1].to_string()
        } else {
            format!("{}/{}", f[1], f[2])
        };
        (format!("{resource} {}", f[3]), v)
    })
    .collect()
}

/// Watch events the API server sent for Tessera's kinds (its own
/// `apiserver_watch_events_total`, every watcher counts), by resource.
#[allow(dead_code)] // the controller benchmark's; not every benchmark reads it
pub fn apiserver_watch_events() -> BTreeMap<String, f64> {
    let text = crate::support::kubectl_output(&["get", "--raw", "/metrics"]);
    samples(
        &text,
        "apiserver_watch_events_total",
        &["group", "resource"],
    )
    .into_iter()
    .filter_map(|(k, v)| Some((k.strip_prefix("tessera.io ")?.to_string(), v)))
    .collect()
}
