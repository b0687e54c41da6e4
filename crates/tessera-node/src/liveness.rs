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
//! Each renewal also carries the free bytes of the backend roots the node has
//! (`tessera.io/free-bytes`, coarsened; sampled every [`SAMPLE_EVERY`] by a task of
//! its own, so a hung backend never delays a renewal): the CSI controller's
//! GetCapacity reads them (`api::free_bytes`).
//!
//! A Lease the controller marked fenced (`tessera.io/fenced`) is taken again under a
//! new epoch (`leaseTransitions` + 1): the fence file's new epoch revokes every daemon
//! that served under the old one, for good. [`next_lease`] is pure.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

use tessera_api::free_bytes::{coarse, free_annotation};
use tessera_api::{ANNOTATION_FENCED, ANNOTATION_FREE_BYTES, liveness_lease};
use tessera_fuse::contract::fence::{News, boottime_ns};

use super::supervisor::StateDir;

/// How the agent renews its node's Lease.
#[derive(Debug, Clone)]
pub struct Renewal {
    pub namespace: String,
    pub node: String,
    pub interval: Duration,
    pub fence_after: Duration,
    /// The backend roots whose free space each renewal reports.
    pub roots: Vec<PathBuf>,
}

/// How often the free space of the roots is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(15);
/// How long the first renewal waits for the first sample.
const FIRST_SAMPLE_WAIT: Duration = Duration::from_secs(2);

/// The free bytes of each of `roots` this node has (a directory that answers statvfs),
/// coarsened.
pub fn sample(roots: &[PathBuf]) -> BTreeMap<String, u64> {
    roots
        .iter()
        .filter(|r| r.is_dir())
        .filter_map(|r| {
            let s = nix::sys::statvfs::statvfs(r.as_path()).ok()?;
            let free = s.blocks_available().saturating_mul(s.fragment_size());
            Some((r.to_string_lossy().into_owned(), coarse(free)))
        })
        .collect()
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
/// time `now` (informational: nobody compares it across machines), reporting `free`.
pub fn next_lease(
    current: Option<&Lease>,
    node: &str,
    fence_after: Duration,
    now: jiff::Timestamp,
    free: &BTreeMap<String, u64>,
) -> (Step, Lease) {
    let (step, mut lease) = next_lease_spec(current, node, fence_after, now);
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_FREE_BYTES.to_owned(), free_annotation(free));
    (step, lease)
}

fn next_lease_spec(
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
    let free = Arc::new(Mutex::new(BTreeMap::new()));
    let (_sampler, first) = Sampler::start(r.roots.clone(), free.clone());
    // The first renewal carries the first sample if it comes soon (the external-
    // provisioner may ask GetCapacity as soon as Tessera is installed); a hung
    // backend delays it by FIRST_SAMPLE_WAIT at most.
    let _ = tokio::time::timeout(FIRST_SAMPLE_WAIT, first).await;
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
        let reported = free.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (step, lease) = next_lease(
            read.as_ref(),
            &r.node,
            r.fence_after,
            jiff::Timestamp::now(),
            &reported,
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

/// The task sampling the roots' free space into the shared map, aborted on drop.
struct Sampler(tokio::task::JoinHandle<()>);

impl Sampler {
    /// The sampling task, and a future that ends with its first sample.
    fn start(
        roots: Vec<PathBuf>,
        into: Arc<Mutex<BTreeMap<String, u64>>>,
    ) -> (Sampler, tokio::sync::oneshot::Receiver<()>) {
        let (done, first) = tokio::sync::oneshot::channel();
        let mut done = Some(done);
        let task = tokio::spawn(async move {
            loop {
                let roots = roots.clone();
                // A hung backend hangs this task only: the renewals go on with the
                // last sample.
                if let Ok(m) = tokio::task::spawn_blocking(move || sample(&roots)).await {
                    *into.lock().unwrap_or_else(|p| p.into_inner()) = m;
                }
                if let Some(done) = done.take() {
                    let _ = done.send(());
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        });
        (Sampler(task), first)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.0.abort();
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

    fn free() -> BTreeMap<String, u64> {
        [("/var/lib/tessera/volumes".to_owned(), 1 << 30)].into()
    }

    fn transitions(l: &Lease) -> Option<i32> {
        l.spec.as_ref().unwrap().lease_transitions
    }

    #[test]
    fn create_renew_retake() {
        let f = Duration::from_millis(20_500);
        let (step, created) = next_lease(None, "n1", f, now(), &free());
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

        let reported =
            created.metadata.annotations.as_ref().unwrap()[ANNOTATION_FREE_BYTES].clone();
        assert_eq!(tessera_api::free_bytes::parse_free(&reported), free());
        let (step, renewed) = next_lease(Some(&created), "n1", f, now(), &free());
        assert_eq!(step, Step::Renew);
        assert_eq!(transitions(&renewed), Some(0));

        let mut marked = renewed.clone();
        marked.metadata.annotations = Some(fenced_mark());
        let (step, retaken) = next_lease(Some(&marked), "n1", f, now(), &free());
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
        let (step, retaken) = next_lease(Some(&other), "n1", f, now(), &free());
        assert_eq!(step, Step::Retake);
        assert_eq!(epoch(&retaken), 1);
    }

    #[test]
    fn a_sample_reports_the_roots_present_and_skips_the_others() {
        let dir = std::env::temp_dir();
        let missing = dir.join("tessera-no-such-root-for-sample");
        let m = sample(&[dir.clone(), missing]);
        assert_eq!(m.len(), 1, "{m:?}");
        let free = m[&dir.to_string_lossy().into_owned()];
        assert!(free > 0 && coarse(free) == free, "{free}");
    }
}
