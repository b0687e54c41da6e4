//! Prometheus metrics and the small HTTP endpoint that serves them (`/metrics`,
//! `/healthz`, `/readyz`), shared by the controller and the node agent.
//!
//! Metric names carry the `tessera_` prefix. The endpoint speaks just enough HTTP/1.1
//! for Prometheus and kubelet probes; it is not a general web server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Labels naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `volume`, `attachment`, `reaper`, …
    pub controller: String,
}

/// Labels of an API request: a write, or a read outside the watches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The kind written or read.
    pub kind: String,
    /// Writes: `create`, `apply`, `patch`, `status`, `delete`; reads: `get`, `list`.
    pub verb: String,
}

/// The metrics of the controller and the node agent.
pub struct Metrics {
    registry: Registry,
    /// Reconciles run, per controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciles that failed, per controller.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// Reconcile duration in seconds, per controller.
    pub reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    /// Writes sent to the API server, per kind and verb.
    pub api_writes: Family<RequestLabels, Counter>,
    /// Reads sent to the API server outside the watches (re-checks), per kind and verb.
    pub api_reads: Family<RequestLabels, Counter>,
    /// Seconds from a ticket's first sighting to its first satisfied status.
    pub ticket_satisfied_seconds: Histogram,
    /// Tickets removed by the reaper.
    pub tickets_reaped: Counter,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tessera");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        let reconcile_duration = Family::<ControllerLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 14))) as fn() -> Histogram,
        );
        let api_writes = Family::<RequestLabels, Counter>::default();
        let api_reads = Family::<RequestLabels, Counter>::default();
        let ticket_satisfied_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        let tickets_reaped = Counter::default();
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed",
            reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration",
            reconcile_duration.clone(),
        );
        registry.register(
            "api_writes",
            "Writes sent to the API server",
            api_writes.clone(),
        );
        registry.register(
            "api_reads",
            "Reads sent to the API server outside the watches",
            api_reads.clone(),
        );
        registry.register(
            "ticket_satisfied_seconds",
            "Seconds from a ticket's first sighting to its first satisfied status",
            ticket_satisfied_seconds.clone(),
        );
        registry.register(
            "tickets_reaped",
            "Tickets removed by the reaper",
            tickets_reaped.clone(),
        );
        Metrics {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            api_writes,
            api_reads,
            ticket_satisfied_seconds,
            tickets_reaped,
            ready: AtomicBool::new(false),
        }
    }

    /// Count one API read made outside the watches.
    pub fn read(&self, kind: &str, verb: &str) {
        self.api_reads
            .get_or_create(&RequestLabels {
                kind: kind.into(),
                verb: verb.into(),
            })
            .inc();
    }

    /// Count one API write.
    pub fn write(&self, kind: &str, verb: &str) {
        self.api_writes
            .get_or_create(&RequestLabels {
                kind: kind.into(),
                verb: verb.into(),
            })
            .inc();
    }

    /// Record one reconcile of `controller` that took `elapsed` and failed or not.
    pub fn reconciled(&self, controller: &str, elapsed: Duration, failed: bool) {
        let labels = ControllerLabels {
            controller: controller.into(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if failed {
            self.reconcile_errors.get_or_create(&labels).inc();
        }
    }

    /// Mark the process ready (`/readyz` answers 200).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `addr` until the task is dropped.
/// Returns the bound address (useful with port 0).
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let n = match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                    .await
                {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
                let request = String::from_utf8_lossy(&buf[..n]);
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (status, body, ctype) = match path {
                    "/metrics" => (
                        "200 OK",
                        metrics.encode(),
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                    "/healthz" | "/livez" => ("200 OK", "ok\n".to_string(), "text/plain"),
                    "/readyz" if metrics.ready.load(Ordering::Relaxed) => {
                        ("200 OK", "ok\n".to_string(), "text/plain")
                    }
                    "/readyz" => (
                        "503 Service Unavailable",
                        "not ready\n".to_string(),
                        "text/plain",
                    ),
                    _ => ("404 Not Found", "not found\n".to_string(), "text/plain"),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok(local)
}
