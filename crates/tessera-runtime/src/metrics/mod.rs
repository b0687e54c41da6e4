//! Prometheus metrics and the small HTTP endpoint that serves them (`/metrics`,
//! `/healthz`, `/readyz`), shared by the controller and the node agent.
//!
//! Each role has its own registry: [`Metrics::controller`] exports the reconcile,
//! queue, ticket, leader and state families (aggregate and per object, [`objects`]),
//! [`Metrics::agent`] only what the agent does (its API requests, its MountPod
//! reconciles, its mounts' handoffs, and with [`Metrics::with_collector`] its mounts'
//! FUSE counters, `node::mount_counters`); both export `tessera_build_info` and the
//! standard `process_*` families ([`process`]). Every family is described in
//! `docs/metrics.md`. Tessera's names carry the `tessera_` prefix. [`serve`] answers
//! `/metrics`, `/healthz` and `/readyz` (`endpoint`).

mod endpoint;
pub mod failover;
pub mod objects;
pub mod process;
pub mod queue;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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

/// What the controller's caches hold, counted (the state gauges), and the per-object
/// series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// The per-object series.
    pub objects: objects::ObjectSeries,
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
    /// The `process_*` families, without the prefix.
    process: Registry,
    /// Reconciles by controller and result (`success`, `error`): `tessera_reconcile_total`
    /// (and, deprecated, `tessera_reconcile_results_total`).
    pub reconcile_results: Family<ResultLabels, Counter>,
    /// Objects whose reconcile was asked for and has not started, per controller.
    pub queue_depth: Family<ControllerLabels, Gauge>,
    /// One series per Volume, 1, labelled with its state.
    pub volume_state: Family<objects::VolumeStateLabels, Gauge>,
    /// MountPods by volume, node and phase.
    pub mountpod_phase: Family<objects::MountPhaseLabels, Gauge>,
    /// Mount daemon restarts by volume and node (from the MountPods' status).
    pub mountpod_restarts: Family<objects::MountLabels, Counter>,
    /// Mount daemon OOM kills by volume and node (from the MountPods' status).
    pub mountpod_oom_kills: Family<objects::MountLabels, Counter>,
    /// Objects left out of the per-object series (over `objects::MAX_OBJECTS`).
    pub objects_omitted: Gauge,
    /// Handoffs of a mount's kernel connection to a new daemon (agent).
    pub handoffs: Family<objects::HandoffLabels, Counter>,
    /// Fenced failover (controller).
    pub failover: failover::Failover,
    /// The claims of the agent's volumes, by volume (its FUSE counters' labels).
    pub claims: objects::Claims,
    /// The objects queued for a reconcile, per controller (`queue_depth`).
    pending: queue::Pending,
    /// 1 while this replica leads (controller).
    pub leader: Gauge,
    /// Volumes by state (controller, from its cache).
    pub volumes: Family<StateLabels, Gauge>,
    /// Tickets not satisfied, by reason (controller, from its cache).
    pub tickets_waiting: Family<ReasonLabels, Gauge>,
    /// MountPods by phase and node (controller, from its cache).
    pub mountpods: Family<PhaseLabels, Gauge>,
    /// Reconciles run, per controller (deprecated: `reconcile_results`).
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciles that failed, per controller (deprecated: `reconcile_results`).
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

    /// The node agent's metrics: build info, process, its API requests, its MountPod
    /// reconciles and handoffs; no controller family.
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
        let queue_depth = Family::<ControllerLabels, Gauge>::default();
        let volume_state = Family::<objects::VolumeStateLabels, Gauge>::default();
        let mountpod_phase = Family::<objects::MountPhaseLabels, Gauge>::default();
        let mountpod_restarts = Family::<objects::MountLabels, Counter>::default();
        let mountpod_oom_kills = Family::<objects::MountLabels, Counter>::default();
        let objects_omitted = Gauge::default();
        let handoffs = Family::<objects::HandoffLabels, Counter>::default();
        let failover = failover::Failover::default();
        let mut process = Registry::default();
        process.register_collector(Box::new(process::ProcessCollector));
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
        registry.register(
            "reconcile",
            "Reconciles by controller and result (success or error)",
            reconcile_results.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration",
            reconcile_duration.clone(),
        );
        // The controller's volume and attachment queues; each agent's mountpod queue.
        registry.register(
            "reconcile_queue_depth",
            "Objects whose reconcile was asked for and has not started yet, per controller",
            queue_depth.clone(),
        );
        if role == Role::Agent {
            registry.register(
                "mount_handoffs",
                "Handoffs of a mount's FUSE connection to a new daemon, by reason (takeover, upgrade)",
                handoffs.clone(),
            );
        }
        if role == Role::Controller {
            Self::register_controller(
                &mut registry,
                &reconciles,
                &reconcile_errors,
                &ticket_satisfied_seconds,
                &tickets_reaped,
            );
            failover.register(&mut registry);
            registry.register(
                "reconcile_results",
                "Deprecated (use tessera_reconcile_total): reconciles by controller and result",
                reconcile_results.clone(),
            );
            Self::register_objects(
                &mut registry,
                &volume_state,
                &mountpod_phase,
                &mountpod_restarts,
                &mountpod_oom_kills,
                &objects_omitted,
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
            process,
            reconcile_results,
            queue_depth,
            volume_state,
            mountpod_phase,
            mountpod_restarts,
            mountpod_oom_kills,
            objects_omitted,
            handoffs,
            failover,
            claims: Default::default(),
            pending: Default::default(),
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

    fn register_objects(
        registry: &mut Registry,
        volume_state: &Family<objects::VolumeStateLabels, Gauge>,
        mountpod_phase: &Family<objects::MountPhaseLabels, Gauge>,
        mountpod_restarts: &Family<objects::MountLabels, Counter>,
        mountpod_oom_kills: &Family<objects::MountLabels, Counter>,
        objects_omitted: &Gauge,
    ) {
        registry.register(
            "volume_state",
            "1 for each Volume, labelled with its state and its claim",
            volume_state.clone(),
        );
        registry.register(
            "mountpod_phase",
            "MountPods by volume, node, claim and phase",
            mountpod_phase.clone(),
        );
        registry.register(
            "mountpod_restarts",
            "Mount daemon restarts by volume and node (status.restarts of its MountPods)",
            mountpod_restarts.clone(),
        );
        registry.register(
            "mountpod_oom_kills",
            "Mount daemon OOM kills by volume and node (status.oomKills of its MountPods)",
            mountpod_oom_kills.clone(),
        );
        registry.register(
            "objects_omitted",
            "Volumes and MountPods left out of the per-object series (over the bound)",
            objects_omitted.clone(),
        );
    }

    fn register_controller(
        registry: &mut Registry,
        reconciles: &Family<ControllerLabels, Counter>,
        reconcile_errors: &Family<ControllerLabels, Counter>,
        ticket_satisfied_seconds: &Histogram,
        tickets_reaped: &Counter,
    ) {
        registry.register(
            "reconciles",
            "Deprecated (use tessera_reconcile_total): reconciles run",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Deprecated (use tessera_reconcile_total{result=\"error\"}): reconciles that failed",
            reconcile_errors.clone(),
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
        self.set_objects(&counts.objects);
    }

    /// Set the per-object series to `s` (emptied first, so a deleted object's go).
    fn set_objects(&self, s: &objects::ObjectSeries) {
        self.volume_state.clear();
        for labels in &s.volume_state {
            self.volume_state.get_or_create(labels).set(1);
        }
        self.mountpod_phase.clear();
        for (labels, n) in &s.mountpod_phase {
            self.mountpod_phase.get_or_create(labels).set(*n);
        }
        self.mountpod_restarts.clear();
        for (labels, n) in &s.mountpod_restarts {
            self.mountpod_restarts.get_or_create(labels).inc_by(*n);
        }
        self.mountpod_oom_kills.clear();
        for (labels, n) in &s.mountpod_oom_kills {
            self.mountpod_oom_kills.get_or_create(labels).inc_by(*n);
        }
        self.objects_omitted.set(s.omitted);
    }

    /// A watch event asked `controller` to reconcile `name`.
    pub fn reconcile_asked(&self, controller: &str, name: &str) {
        self.set_queue_depth(controller, self.pending.asked(controller, name));
    }

    /// `controller` starts reconciling `name`.
    pub fn reconcile_started(&self, controller: &str, name: &str) {
        self.set_queue_depth(controller, self.pending.started(controller, name));
    }

    /// Forget the queued objects of `controller` that `exists` says are gone.
    pub fn reconcile_queue_retain(&self, controller: &str, exists: impl Fn(&str) -> bool) {
        self.set_queue_depth(controller, self.pending.retain(controller, exists));
    }

    /// Set the reconcile queue depth of `controller`.
    fn set_queue_depth(&self, controller: &str, depth: usize) {
        self.queue_depth
            .get_or_create(&ControllerLabels {
                controller: controller.into(),
            })
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// The handoff reasons, each a series of every served mount from 0 on.
    pub const HANDOFF_REASONS: [&'static str; 2] = ["takeover", "upgrade"];

    /// `mount` serves: its handoff series exist from 0, so that `increase()` sees its
    /// first handoff (a series that first appears at 1 shows no increase).
    pub fn mount_served(&self, mount: &objects::MountLabels) {
        for reason in Self::HANDOFF_REASONS {
            // Created at 0; the guard it returns is let go at once.
            drop(self.handoffs.get_or_create(&objects::HandoffLabels {
                mount: mount.clone(),
                reason: reason.into(),
            }));
        }
    }

    /// `mount` is gone: so are its handoff series.
    pub fn mount_gone(&self, mount: &objects::MountLabels) {
        for reason in Self::HANDOFF_REASONS {
            self.handoffs.remove(&objects::HandoffLabels {
                mount: mount.clone(),
                reason: reason.into(),
            });
        }
    }

    /// Count one handoff of a mount (`reason`: `takeover` or `upgrade`).
    pub fn handoff(&self, mount: objects::MountLabels, reason: &str) {
        self.handoffs
            .get_or_create(&objects::HandoffLabels {
                mount,
                reason: reason.into(),
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
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        encode_registry(&mut out, &self.process)
            .and_then(|()| encode_registry(&mut out, &self.registry))
            .and_then(|()| encode_eof(&mut out))
            .expect("writing to a String");
        out
    }
}

pub use endpoint::{respond, serve};

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
        m.set_queue_depth("attachment", 0);
        m.handoff(
            objects::MountLabels::new("v", "n1", objects::Claim::default()),
            "takeover",
        );
        m.ticket_satisfied_seconds.observe(0.1);
        m.tickets_reaped.inc();
        m.leader.set(1);
        let mut counts = StateCounts::default();
        counts.volumes.insert("Attached".into(), 1);
        counts.tickets_waiting.insert("Attaching".into(), 1);
        counts.mountpods.insert(("Ready".into(), "n1".into()), 1);
        counts.objects = object_series();
        m.set_states(&counts);
        m.encode()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn a_served_mounts_handoffs_count_from_zero_and_go_with_it() {
        let m = Metrics::agent();
        let mount = objects::MountLabels::new("v", "n1", objects::Claim::default());
        let series = |m: &Metrics| {
            m.encode()
                .lines()
                .filter(|l| l.starts_with("tessera_mount_handoffs_total{"))
                .map(|l| {
                    let reason = l
                        .split("reason=\"")
                        .nth(1)
                        .unwrap()
                        .split('"')
                        .next()
                        .unwrap();
                    (
                        reason.to_string(),
                        l.rsplit(' ').next().unwrap().to_string(),
                    )
                })
                .collect::<std::collections::BTreeSet<_>>()
        };
        assert!(series(&m).is_empty());
        m.mount_served(&mount);
        assert_eq!(
            series(&m),
            [("takeover", "0"), ("upgrade", "0")]
                .map(|(r, v)| (r.to_string(), v.to_string()))
                .into()
        );
        m.handoff(mount.clone(), "takeover");
        m.mount_served(&mount);
        assert!(series(&m).contains(&("takeover".into(), "1".into())));
        m.mount_gone(&mount);
        assert!(series(&m).is_empty());
    }

    fn object_series() -> objects::ObjectSeries {
        objects::series(
            vec![objects::VolumeView {
                name: "v".into(),
                claim: objects::Claim {
                    pvc: "data".into(),
                    pvc_namespace: "db".into(),
                },
                state: "Attached".into(),
            }],
            vec![objects::MountPodView {
                name: "v-1".into(),
                volume: "v".into(),
                node: "n1".into(),
                claim: objects::Claim {
                    pvc: "data".into(),
                    pvc_namespace: "db".into(),
                },
                phase: "Ready".into(),
                restarts: 2,
                oom_kills: 1,
            }],
            objects::MAX_OBJECTS,
        )
    }

    #[test]
    fn the_agent_exports_no_controller_family() {
        let controller = families(&Metrics::controller());
        let agent = families(&Metrics::agent());
        for f in [
            "tessera_build_info",
            "tessera_api_requests",
            "tessera_reconcile",
            "tessera_reconcile_duration_seconds",
            "tessera_reconcile_queue_depth",
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
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
            "tessera_volume_state",
            "tessera_mountpod_phase",
            "tessera_mountpod_restarts",
            "tessera_mountpod_oom_kills",
            "tessera_objects_omitted",
        ] {
            assert!(controller.contains(&f.to_string()), "{f} in {controller:?}");
            assert!(
                !agent.contains(&f.to_string()),
                "{f} in the agent's {agent:?}"
            );
        }
        assert!(agent.contains(&"tessera_mount_handoffs".to_string()));
        assert!(!controller.contains(&"tessera_mount_handoffs".to_string()));
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
        m.set_queue_depth("volume", 4);
        counts.objects = object_series();
        m.set_states(&counts);
        let text = m.encode();
        for line in [
            // One family, and its deprecated names, counting the same reconciles.
            "tessera_reconcile_total{controller=\"volume\",result=\"success\"} 2",
            "tessera_reconcile_total{controller=\"volume\",result=\"error\"} 1",
            "tessera_reconciles_total{controller=\"volume\"} 3",
            "tessera_reconcile_errors_total{controller=\"volume\"} 1",
            "tessera_reconcile_queue_depth{controller=\"volume\"} 4",
            "tessera_volume_state{volume=\"v\",pvc=\"data\",pvc_namespace=\"db\",state=\"Attached\"} 1",
            "tessera_mountpod_phase{volume=\"v\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\",phase=\"Ready\"} 1",
            "tessera_mountpod_restarts_total{volume=\"v\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\"} 2",
            "tessera_mountpod_oom_kills_total{volume=\"v\",node=\"n1\",pvc=\"data\",pvc_namespace=\"db\"} 1",
            "tessera_objects_omitted 0",
            "tessera_reconcile_results_total{controller=\"volume\",result=\"success\"} 2",
            "tessera_reconcile_results_total{controller=\"volume\",result=\"error\"} 1",
            "tessera_volumes{state=\"Attached\"} 2",
            "tessera_tickets_waiting{reason=\"HeldByOtherNode\"} 1",
            "tessera_mountpods{phase=\"Ready\",node=\"n1\"} 3",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
        // A state nothing is in any more is gone, and a deleted object's series.
        m.set_states(&StateCounts::default());
        let text = m.encode();
        assert!(!text.contains("tessera_volumes{"));
        assert!(!text.contains("tessera_volume_state{"));
        assert!(!text.contains("tessera_mountpod_restarts_total{"));
    }
}
