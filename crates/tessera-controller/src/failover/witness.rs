//! What this process saw of the nodes' liveness Leases, on its own monotonic clock,
//! from its start: a standby replica watches them too, so that when it becomes leader
//! (say because the leader died with its node) it counts each node's wait from the
//! last change it saw, not from its takeover.
//!
//! ```text
//!  standby: Lease watch ─▶ Witness::observe ─┐
//!  leader (failover::run): Lease watch ──────┴▶ Observer (one per process) ─▶ liveness
//! ```
//!
//! Safe to carry across a takeover: a change is noted when this process sees it, never
//! before the API server stored it, so a seen instant is never earlier than the
//! renewal it stands for; a watch that lags only notes changes later (a longer wait);
//! and the leader marks a Lease only at the resourceVersion its own fresh watch
//! read, which fails if the node renewed meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::warn;

use super::Observer;

/// The process's [`Observer`] and the clock it counts on.
pub struct Witness {
    origin: tokio::time::Instant,
    observer: Mutex<Observer>,
}

impl Default for Witness {
    fn default() -> Self {
        Witness::new()
    }
}

impl Witness {
    /// A witness whose clock starts now: every Lease it sees first counts as changed
    /// when seen.
    pub fn new() -> Witness {
        Witness {
            origin: tokio::time::Instant::now(),
            observer: Mutex::new(Observer::new(Duration::ZERO)),
        }
    }

    /// Now on the witness's clock.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// A liveness Lease as it is now; its node, or `None` for another Lease.
    pub fn saw(&self, l: &Lease) -> Option<String> {
        let node = node_of(l)?;
        let now = self.now();
        let version = l.resource_version().unwrap_or_default();
        self.lock().observe(&node, &version, now);
        Some(node)
    }

    /// A liveness Lease deleted; its node, or `None` for another Lease.
    pub fn saw_deleted(&self, l: &Lease) -> Option<String> {
        let node = node_of(l)?;
        self.lock().forget(&node);
        Some(node)
    }

    /// What was seen so far.
    pub fn observer(&self) -> Observer {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Observer> {
        // A panic while holding it cannot leave an Observer half-changed in a way that
        // matters: each change is one map entry.
        self.observer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The node a liveness Lease stands for.
fn node_of(l: &Lease) -> Option<String> {
    tessera_api::liveness_lease_node(&l.name_any()).map(str::to_owned)
}

/// Watch the liveness Leases of `namespace` into `witness` until dropped (a standby's
/// part; the leader's failover loop watches them itself).
pub async fn watch(client: Client, namespace: String, witness: Arc<Witness>) {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                witness.saw(&l);
            }
            Ok(watcher::Event::Delete(l)) => {
                witness.saw_deleted(&l);
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(e) => warn!(error = %e, "standing by: watching the liveness Leases"),
        }
    }
}
