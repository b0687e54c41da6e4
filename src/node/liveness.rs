//! The node's liveness Lease (docs/failover.md): the agent renews
//! `tessera-node-<node>` in its namespace every `--renew-interval`, and after each
//! successful renewal tells the node's self-fencing daemons, through the fence file,
//! the boot-clock instant it *sent* that renewal.
//!
//! ```text
//!  t = boottime_ns() ─▶ next_lease(read Lease) ─▶ create │ replace (resourceVersion precondition)
//!     ok  ─▶ <state>/node.fence = News { epoch: spec.leaseTransitions, t, fenceAfter }
//!     409 ─▶ read again at once, no news (the controller's mark, or a racing writer)
//!     err ─▶ no news; the daemons fence themselves fenceAfter after the last one
//! ```
//!
//! A Lease the controller marked fenced (`tessera.io/fenced`) is taken again under a
//! new epoch (`leaseTransitions` + 1): the fence file's new epoch revokes every daemon
//! that served under the old one, for good. [`next_lease`] is pure.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

use super::supervisor::StateDir;
use crate::api::{ANNOTATION_FENCED, liveness_lease};
use crate::fuse::contract::fence::{News, boottime_ns};

/// How the agent renews its node's Lease.
#[derive(Debug, Clone)]
pub struct Renewal {
    pub namespace: String,
    pub node: String,
    pub interval: Duration,
    pub fence_after: Duration,
}

/// What one attempt writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// No Lease yet: create it (epoch 0).
    Create,
    /// Ours and not fenced: renew it, same epoch.
    Renew,
    /// Fenced by the controller (or held by someone else): take it again, new epoch.
    Retake,
}

/// The Lease to write after reading `current` (none: it does not exist), at wall
/// time `now` (informational: nobody compares it across machines).
pub fn next_lease(
    current: Option<&Lease>,
    node: &str,
    fence_after: Duration,
    now: jiff::Timestamp,
) -> (Step, Lease) {
    // The controller waits leaseDurationSeconds (+ its margin): never less than the
    // daemons' fenceAfter.
    let secs = i32::try_from(fence_after.as_millis().div_ceil(1000)).unwrap_or(i32::MAX);
    let Some(current) = current else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(liveness_lease(node)),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(node.to_owned()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return (Step::Create, lease);
    };
    let mut lease = current.clone();
    let fenced = lease
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_FENCED));
    let spec = lease.spec.get_or_insert_with(Default::default);
    let ours = spec.holder_identity.as_deref() == Some(node);
    let step = if fenced || !ours {
        if let Some(a) = lease.metadata.annotations.as_mut() {
            a.remove(ANNOTATION_FENCED);
        }
        spec.holder_identity = Some(node.to_owned());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        Step::Retake
    } else {
        Step::Renew
    };
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(secs);
    (step, lease)
}

/// The epoch of a Lease as written.
fn epoch(lease: &Lease) -> u64 {
    let t = lease.spec.as_ref().and_then(|s| s.lease_transitions);
    u64::try_from(t.unwrap_or(0)).unwrap_or(0)
}

/// Renew until the future is dropped.
pub async fn run(client: Client, state: StateDir, r: Renewal) {
    let api: Api<Lease> = Api::namespaced(client, &r.namespace);
    let name = liveness_lease(&r.node);
    let mut current: Option<Option<Lease>> = None;
    info!(lease = %name, namespace = %r.namespace, interval = ?r.interval, fence_after = ?r.fence_after, "renewing the node's liveness Lease");
    loop {
        let read = match current.take() {
            Some(l) => l,
            None => match api.get_opt(&name).await {
                Ok(l) => l,
                Err(e) => {
                    warn!(lease = %name, error = %e, "reading the liveness Lease failed");
                    tokio::time::sleep(r.interval).await;
                    continue;
                }
            },
        };
        // Read before sending: never later than the moment the renewal is stored.
        let sent = boottime_ns();
        let (step, lease) = next_lease(
            read.as_ref(),
            &r.node,
            r.fence_after,
            jiff::Timestamp::now(),
        );
        let written = match step {
            Step::Create => api.create(&PostParams::default(), &lease).await,
            Step::Renew | Step::Retake => api.replace(&name, &PostParams::default(), &lease).await,
        };
        match written {
            Ok(stored) => {
                let news = News {
                    epoch: epoch(&stored),
                    renewed_ns: sent,
                    fence_after: r.fence_after,
                };
                if step == Step::Retake {
                    warn!(lease = %name, epoch = news.epoch, "the node was fenced (or its Lease taken): took the Lease again under a new epoch; daemons of the old one are revoked");
                }
                if let Err(e) = state.write_fence(&news) {
                    warn!(error = %e, "writing the fence file failed: the daemons hear no news");
                }
                current = Some(Some(stored));
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                info!(lease = %name, "the liveness Lease changed under the agent: reading it again");
                continue;
            }
            Err(e) => warn!(lease = %name, error = %e, "renewing the liveness Lease failed"),
        }
        tokio::time::sleep(r.interval).await;
    }
}

/// The annotations of a Lease marked fenced (the controller's write; tests).
pub fn fenced_mark() -> BTreeMap<String, String> {
    [(ANNOTATION_FENCED.to_owned(), "true".to_owned())].into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn transitions(l: &Lease) -> Option<i32> {
        l.spec.as_ref().unwrap().lease_transitions
    }

    #[test]
    fn create_renew_retake() {
        let f = Duration::from_millis(20_500);
        let (step, created) = next_lease(None, "n1", f, now());
        assert_eq!(step, Step::Create);
        let spec = created.spec.as_ref().unwrap();
        assert_eq!(created.metadata.name.as_deref(), Some("tessera-node-n1"));
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(
            spec.lease_duration_seconds,
            Some(21),
            "rounded up, never less"
        );
        assert_eq!(transitions(&created), Some(0));

        let (step, renewed) = next_lease(Some(&created), "n1", f, now());
        assert_eq!(step, Step::Renew);
        assert_eq!(transitions(&renewed), Some(0));

        let mut marked = renewed.clone();
        marked.metadata.annotations = Some(fenced_mark());
        let (step, retaken) = next_lease(Some(&marked), "n1", f, now());
        assert_eq!(step, Step::Retake);
        assert_eq!(transitions(&retaken), Some(1));
        assert!(
            !retaken
                .metadata
                .annotations
                .unwrap()
                .contains_key(ANNOTATION_FENCED)
        );

        let mut other = renewed;
        other.spec.as_mut().unwrap().holder_identity = Some("n2".into());
        let (step, retaken) = next_lease(Some(&other), "n1", f, now());
        assert_eq!(step, Step::Retake);
        assert_eq!(epoch(&retaken), 1);
    }
}
