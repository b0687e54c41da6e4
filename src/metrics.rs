//! Prometheus metrics and the small HTTP endpoint that serves them (`/metrics`,
//! `/healthz`, `/readyz`), shared by the controller and the node agent.
//!
//! Each role has its own registry: [`Metrics::controller`] exports the reconcile,
//! ticket, leader and state families, [`Metrics::agent`] only what the agent does
//! (its API requests, and with [`Metrics::with_collector`] its mounts' FUSE counters,
//! `node::mount_counters`); both export `tessera_build_info`. Every family is described in
//! `docs/metrics.md`. Metric names carry the `tessera_` prefix. The endpoint speaks
//! just enough HTTP/1.1 for Prometheus and kubelet probes; it is not a general web
//! server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

/// Labels of one HTTP request to the API server (see `runtime::requests`, which
/// classifies the path): never an object's name or namespace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    /// The HTTP method: `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub verb: String,
    /// The API group (`tessera.io`, `storage.k8s.io`; empty for the core group).
    pub group: String,
    /// The resource (plural: `volumes`, `mountpods`); `discovery`, `version` or
    /// `other` for a request outside the resource paths.
    pub resource: String,
    /// The subresource (`status`, …), empty for none.
    pub subresource: String,
    /// The response's status code (`200`, `404`), or `error` when no response came.
    pub code: String,
}

/// Every request the API client sends, by [`ApiRequestLabels`].
pub type ApiRequests = Family<ApiRequestLabels, Counter>;

/// Labels of a reconcile result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `volume`, `attachment`, …
    pub controller: String,
    /// `success` or `error`.
    pub result: String,
}

/// Labels of `tessera_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: String,
}

/// One label, `state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// A Volume state (`Attached`, …), or `Unknown` before the first status.
    pub state: String,
}

/// One label, `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A ticket reason (`HeldByOtherNode`, …).
    pub reason: String,
}

/// Labels of the MountPod gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// A MountPod phase (`Ready`, …), or `Unknown` before the agent reports one.
    pub phase: String,
    /// The node.
    pub node: String,
}

/// What the controller's caches hold, counted (the state gauges).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Volumes by state.
    pub volumes: std::collections::BTreeMap<String, i64>,
    /// Tickets not satisfied, by reason.
    pub tickets_waiting: std::collections::BTreeMap<String, i64>,
    /// MountPods by (phase, node).
    pub mountpods: std::collections::BTreeMap<(String, String), i64>,
}

/// The metrics of the controller and the node agent.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by controller and result (`success`, `error`).
    pub reconcile_results: Family<ResultLabels, Counter>,
    /// 1 while this replica leads (controller).
    pub leader: Gauge,
    /// Volumes by state (controller, from its cache).
    pub volumes: Family<StateLabels, Gauge>,
    /// Tickets not satisfied, by reason (controller, from its cache).
    pub tickets_waiting: Family<ReasonLabels, Gauge>,
    /// MountPods by phase and node (controller, from its cache).
    pub mountpods: Family<PhaseLabels, Gauge>,
    /// Reconciles run, per controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciles that failed, per controller.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// Reconcile duration in seconds, per controller.
    pub reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    /// Requests the API client sent, by verb, resource and response code.
    pub api_requests: ApiRequests,
    /// Seconds from a ticket's first sighting to its first satisfied status.
    pub ticket_satisfied_seconds: Histogram,
    /// Tickets removed by the reaper.
    pub tickets_reaped: Counter,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::controller()
    }
}

/// Which role's families a registry exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Controller,
    Agent,
}

impl Metrics {
    /// The controller's metrics (every family but the agent's).
    pub fn controller() -> Self {
        Self::for_role(Role::Controller)
    }

    /// The node agent's metrics: build info and its API requests, no controller family.
    pub fn agent() -> Self {
        Self::for_role(Role::Agent)
    }

    fn for_role(role: Role) -> Self {
        let mut registry = Registry::with_prefix("tessera");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        let reconcile_duration = Family::<ControllerLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 14))) as fn() -> Histogram,
        );
        let api_requests = ApiRequests::default();
        let ticket_satisfied_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        let tickets_reaped = Counter::default();
        let reconcile_results = Family::<ResultLabels, Counter>::default();
        let leader = Gauge::default();
        let volumes = Family::<StateLabels, Gauge>::default();
        let tickets_waiting = Family::<ReasonLabels, Gauge>::default();
        let mountpods = Family::<PhaseLabels, Gauge>::default();
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; the version of the running binary",
            build_info,
        );
        registry.register(
            "api_requests",
            "Requests sent to the API server, by HTTP verb, resource and response code",
            api_requests.clone(),
        );
        if role == Role::Controller {
            Self::register_controller(
                &mut registry,
                &reconciles,
                &reconcile_errors,
                &reconcile_duration,
                &ticket_satisfied_seconds,
                &tickets_reaped,
            );
            registry.register(
                "reconcile_results",
                "Reconciles by controller and result (success or error)",
                reconcile_results.clone(),
            );
            registry.register(
                "leader",
                "1 while this controller replica holds the leader Lease",
                leader.clone(),
            );
            registry.register(
                "volumes",
                "Volumes by state, as the controller's cache shows them",
                volumes.clone(),
            );
            registry.register(
                "tickets_waiting",
                "Tickets not satisfied, by the reason of their Satisfied condition",
                tickets_waiting.clone(),
            );
            registry.register(
                "mountpods",
                "MountPods by phase and node, as the controller's cache shows them",
                mountpods.clone(),
            );
        }
        Metrics {
            registry,
            reconcile_results,
            leader,
            volumes,
            tickets_waiting,
            mountpods,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            api_requests,
            ticket_satisfied_seconds,
            tickets_reaped,
            ready: AtomicBool::new(false),
        }
    }

    fn register_controller(
        registry: &mut Registry,
        reconciles: &Family<ControllerLabels, Counter>,
        reconcile_errors: &Family<ControllerLabels, Counter>,
        reconcile_duration: &Family<ControllerLabels, Histogram, fn() -> Histogram>,
        ticket_satisfied_seconds: &Histogram,
        tickets_reaped: &Counter,
    ) {
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
            "ticket_satisfied_seconds",
            "Seconds from a ticket's first sighting to its first satisfied status",
            ticket_satisfied_seconds.clone(),
        );
        registry.register(
            "tickets_reaped",
            "Tickets removed by the reaper",
            tickets_reaped.clone(),
        );
    }

    /// Set the state gauges to `counts` (families emptied first, so a state that
    /// no object is in any more is gone).
    pub fn set_states(&self, counts: &StateCounts) {
        self.volumes.clear();
        for (state, n) in &counts.volumes {
            self.volumes
                .get_or_create(&StateLabels {
                    state: state.clone(),
                })
                .set(*n);
        }
        self.tickets_waiting.clear();
        for (reason, n) in &counts.tickets_waiting {
            self.tickets_waiting
                .get_or_create(&ReasonLabels {
                    reason: reason.clone(),
                })
                .set(*n);
        }
        self.mountpods.clear();
        for ((phase, node), n) in &counts.mountpods {
            self.mountpods
                .get_or_create(&PhaseLabels {
                    phase: phase.clone(),
                    node: node.clone(),
                })
                .set(*n);
        }
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
        self.reconcile_results
            .get_or_create(&ResultLabels {
                controller: controller.into(),
                result: if failed { "error" } else { "success" }.into(),
            })
            .inc();
    }

    /// Also export what `collector` encodes on each scrape (the agent's per-mount FUSE
    /// counters).
    pub fn with_collector(
        mut self,
        collector: Box<dyn prometheus_client::collector::Collector>,
    ) -> Self {
        self.registry.register_collector(collector);
        self
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The family names in an encoded registry, after every family got a sample.
    fn families(m: &Metrics) -> Vec<String> {
        m.api_requests
            .get_or_create(&ApiRequestLabels {
                verb: "PATCH".into(),
                group: "tessera.io".into(),
                resource: "mountpods".into(),
                subresource: "status".into(),
                code: "200".into(),
            })
            .inc();
        m.reconciled("attachment", Duration::from_millis(1), false);
        m.ticket_satisfied_seconds.observe(0.1);
        m.tickets_reaped.inc();
        m.leader.set(1);
        let mut counts = StateCounts::default();
        counts.volumes.insert("Attached".into(), 1);
        counts.tickets_waiting.insert("Attaching".into(), 1);
        counts.mountpods.insert(("Ready".into(), "n1".into()), 1);
        m.set_states(&counts);
        m.encode()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn the_agent_exports_no_controller_family() {
        let controller = families(&Metrics::controller());
        let agent = families(&Metrics::agent());
        for f in ["tessera_build_info", "tessera_api_requests"] {
            assert!(agent.contains(&f.to_string()), "{f} in {agent:?}");
            assert!(controller.contains(&f.to_string()), "{f} in {controller:?}");
        }
        for f in [
            "tessera_reconciles",
            "tessera_reconcile_results",
            "tessera_leader",
            "tessera_volumes",
            "tessera_tickets_waiting",
            "tessera_mountpods",
            "tessera_ticket_satisfied_seconds",
            "tessera_tickets_reaped",
        ] {
            assert!(controller.contains(&f.to_string()), "{f} in {controller:?}");
            assert!(
                !agent.contains(&f.to_string()),
                "{f} in the agent's {agent:?}"
            );
        }
        let text = Metrics::agent().encode();
        assert!(
            text.contains(&format!(
                "tessera_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
    }

    #[test]
    fn reconcile_results_and_state_gauges() {
        let m = Metrics::controller();
        m.reconciled("volume", Duration::from_millis(1), false);
        m.reconciled("volume", Duration::from_millis(1), true);
        m.reconciled("volume", Duration::from_millis(1), false);
        let mut counts = StateCounts::default();
        counts.volumes.insert("Attached".into(), 2);
        counts.tickets_waiting.insert("HeldByOtherNode".into(), 1);
        counts.mountpods.insert(("Ready".into(), "n1".into()), 3);
        m.set_states(&counts);
        let text = m.encode();
        for line in [
            "tessera_reconcile_results_total{controller=\"volume\",result=\"success\"} 2",
            "tessera_reconcile_results_total{controller=\"volume\",result=\"error\"} 1",
            "tessera_volumes{state=\"Attached\"} 2",
            "tessera_tickets_waiting{reason=\"HeldByOtherNode\"} 1",
            "tessera_mountpods{phase=\"Ready\",node=\"n1\"} 3",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // A state nothing is in any more is gone.
        m.set_states(&StateCounts::default());
        assert!(!m.encode().contains("tessera_volumes{"));
    }
}
