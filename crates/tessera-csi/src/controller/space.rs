//! The nodes' free space as their agents report it, for GetCapacity: one watch of the
//! liveness Leases in Tessera's namespace (started at the first GetCapacity, so only
//! the replica whose external-provisioner leads ever opens it).
//!
//! ```text
//!  watch Leases tessera-node-* ─▶ per node: free bytes (tessera.io/free-bytes),
//!                                  when its resourceVersion last changed (this clock)
//!  GetCapacity ─▶ listed once? (waits ≤ LIST_WAIT) ─▶ NodeSpace per node
//!                 fresh: renewed within STALE_AFTER × its leaseDurationSeconds
//! ```
//!
//! Freshness is judged on this process's monotonic clock when the watch sees a
//! change, never by comparing the node's timestamps with ours.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

use tessera_api::ANNOTATION_FREE_BYTES;
use tessera_api::free_bytes::parse_free;

use crate::topology::NodeSpace;

/// A node whose Lease has not changed for this many lease durations has no space.
const STALE_AFTER: u32 = 3;
/// How long a GetCapacity waits for the first list of the Leases.
const LIST_WAIT: Duration = Duration::from_secs(10);

/// One node as last seen.
#[derive(Debug, Clone)]
struct Seen {
    free: BTreeMap<String, u64>,
    version: String,
    changed: Instant,
    duration: Duration,
}

/// The nodes' reported space (cheap to clone).
#[derive(Clone)]
pub struct NodeSpaces {
    client: Client,
    namespace: String,
    started: Arc<OnceLock<watch::Receiver<bool>>>,
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
}

impl NodeSpaces {
    /// The Leases of `namespace`, not watched until first asked.
    pub fn new(client: Client, namespace: String) -> Self {
        NodeSpaces {
            client,
            namespace,
            started: Arc::default(),
            seen: Arc::default(),
        }
    }

    /// Each node's space now (empty if the Leases could not be listed in time).
    pub async fn now(&self) -> BTreeMap<String, NodeSpace> {
        let mut listed = self.started.get_or_init(|| self.start()).clone();
        if tokio::time::timeout(LIST_WAIT, listed.wait_for(|l| *l))
            .await
            .is_err()
        {
            warn!(namespace = %self.namespace, "the nodes' liveness Leases are not listed yet: no capacity known");
        }
        let now = Instant::now();
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .map(|(node, s)| {
                let fresh = now.duration_since(s.changed) <= s.duration * STALE_AFTER;
                let space = NodeSpace {
                    free: s.free.clone(),
                    fresh,
                };
                (node.clone(), space)
            })
            .collect()
    }

    fn start(&self) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let seen = self.seen.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                        observe(&mut seen, &l, Instant::now());
                    }
                    Ok(watcher::Event::Delete(l)) => {
                        if let Some(node) = node_of(&l) {
                            seen.lock().unwrap_or_else(|p| p.into_inner()).remove(&node);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        tx.send_replace(true);
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(e) => {
                        warn!(error = %e, "watching the nodes' liveness Leases for their free space")
                    }
                }
            }
        });
        rx
    }
}

/// The node a liveness Lease is of.
fn node_of(l: &Lease) -> Option<String> {
    tessera_api::liveness_lease_node(&l.name_any())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
}

/// Note `l` as seen at `at`: its time moves only when its resourceVersion does.
fn observe(seen: &mut BTreeMap<String, Seen>, l: &Lease, at: Instant) {
    let Some(node) = node_of(l) else { return };
    let version = l.resource_version().unwrap_or_default();
    let free = l
        .annotations()
        .get(ANNOTATION_FREE_BYTES)
        .map(|s| parse_free(s))
        .unwrap_or_default();
    let secs = l
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(0)
        .clamp(1, 3600);
    let duration = Duration::from_secs(u64::try_from(secs).unwrap_or(1));
    let changed = match seen.get(&node) {
        Some(s) if s.version == version => s.changed,
        _ => at,
    };
    seen.insert(
        node,
        Seen {
            free,
            version,
            changed,
            duration,
        },
    );
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;

    use super::*;

    fn lease(name: &str, version: &str, free: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                annotations: Some([(ANNOTATION_FREE_BYTES.to_owned(), free.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                lease_duration_seconds: Some(20),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_lease_is_as_recent_as_its_last_change_here() {
        let mut seen = BTreeMap::new();
        let t0 = Instant::now();
        observe(&mut seen, &lease("tessera-node-a", "1", r#"{"/r": 7}"#), t0);
        observe(&mut seen, &lease("other-lease", "1", "{}"), t0);
        observe(&mut seen, &lease("tessera-node-", "1", "{}"), t0);
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(seen["a"].free["/r"], 7);
        assert_eq!(seen["a"].duration, Duration::from_secs(20));
        // The same version seen again (a relist) is no renewal.
        let later = t0 + Duration::from_secs(30);
        observe(
            &mut seen,
            &lease("tessera-node-a", "1", r#"{"/r": 7}"#),
            later,
        );
        assert_eq!(seen["a"].changed, t0);
        observe(
            &mut seen,
            &lease("tessera-node-a", "2", r#"{"/r": 9}"#),
            later,
        );
        assert_eq!((seen["a"].changed, seen["a"].free["/r"]), (later, 9));
        // A malformed report is no space, not an error.
        observe(&mut seen, &lease("tessera-node-a", "3", "{"), later);
        assert!(seen["a"].free.is_empty());
    }
}
