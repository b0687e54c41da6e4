//! The controller's fenced-failover families (docs/failover.md): how many nodes are
//! in each liveness state, the tickets released and the Pods deleted, and how long a
//! dead node held its volumes. Set by `controller::failover::run` on every decision.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A liveness state (`alive`, `suspect`, `fenced`, `agent_gone`, `no_lease`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

/// Why a node was fenced (`lease_expired`, `out_of_service`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WhyLabels {
    pub why: String,
}

/// The families.
#[derive(Clone, Debug)]
pub struct Failover {
    /// Nodes by liveness state, as the controller judges them.
    pub nodes: Family<StateLabels, Gauge>,
    /// Tickets of fenced nodes released, by why.
    pub released: Family<WhyLabels, Counter>,
    /// Pods of fenced nodes deleted.
    pub pods_deleted: Counter,
    /// Seconds from the last change of a node's Lease the controller saw to the release
    /// of its ticket (fenceAfter + margin, plus the wait for the Node to turn not Ready).
    pub seconds: Histogram,
}

impl Default for Failover {
    fn default() -> Self {
        Failover {
            nodes: Family::default(),
            released: Family::default(),
            pods_deleted: Counter::default(),
            seconds: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
        }
    }
}

impl Failover {
    /// Register the families under `registry` (prefix `tessera_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "failover_nodes",
            "Nodes by liveness state (alive, suspect, fenced, agent_gone, no_lease), as the controller judges them",
            self.nodes.clone(),
        );
        registry.register(
            "failover_tickets_released",
            "Tickets of fenced nodes released, by why (lease_expired, out_of_service)",
            self.released.clone(),
        );
        registry.register(
            "failover_pods_deleted",
            "Pods on fenced nodes deleted so that their volumes move",
            self.pods_deleted.clone(),
        );
        registry.register(
            "failover_seconds",
            "Seconds from the last change of a node's liveness Lease seen to the release of its ticket",
            self.seconds.clone(),
        );
    }

    /// Set the node gauges to `counts` (emptied first: a state no node is in is gone).
    pub fn set_nodes<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        self.nodes.clear();
        for (state, n) in counts {
            self.nodes
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(n);
        }
    }
}
