//! The shared watches: one watch per kind fills the cache the reconcilers read and
//! fans every touched object out to the controllers it triggers, and says when its
//! cache has had its first full list.
//!
//! ```text
//!  watch(kind) ─▶ reflector ─▶ Store (cache) ─── read by every reconcile
//!                     │ InitDone ─▶ CachesReady flag
//!                     └─ each object ─▶ one stream per triggered controller
//! ```
//!
//! A broken watch (an API server restart) is retried after at most 1 s
//! ([`ShortBackoff`]) and re-lists, so the caches catch up soon after the server is back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::{debug, warn};

/// One flag per shared watch, set once its cache has had its first full list.
#[derive(Clone, Debug, Default)]
pub struct CachesReady {
    /// The Volume cache.
    pub volumes: Arc<AtomicBool>,
    /// The VolumeAttachment cache.
    pub attachments: Arc<AtomicBool>,
    /// The MountPod cache.
    pub mountpods: Arc<AtomicBool>,
    /// The Node (metadata) cache.
    pub nodes: Arc<AtomicBool>,
}

impl CachesReady {
    /// Whether every cache has had its first full list.
    pub fn all(&self) -> bool {
        [
            &self.volumes,
            &self.attachments,
            &self.mountpods,
            &self.nodes,
        ]
        .iter()
        .all(|r| r.load(Ordering::Acquire))
    }
}

/// The watches' retry delays: 100 ms doubling up to 1 s, back to 100 ms once an event
/// arrives. kube's default climbs to 30 s, so a watch broken by an API server restart
/// could resume half a minute after the server is back; this one resumes within a
/// second (the cost: at most one failed request per second while it is away).
#[derive(Clone, Debug)]
pub struct ShortBackoff {
    next: Duration,
}

impl ShortBackoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(1);
}

impl Default for ShortBackoff {
    fn default() -> Self {
        ShortBackoff { next: Self::MIN }
    }
}

impl Iterator for ShortBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(Self::MAX);
        Some(now)
    }
}

impl kube::runtime::utils::Backoff for ShortBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

/// Run one watch of a kind into `writer` (the cache) and hand every touched object to
/// each of `outputs` consumers, so two controllers share one watch. `ready` is set when
/// the first full list has reached the cache.
pub(super) fn fan_out<K>(
    api: Api<K>,
    wc: watcher::Config,
    writer: reflector::store::Writer<K>,
    ready: Arc<AtomicBool>,
    outputs: usize,
) -> (
    impl std::future::Future<Output = ()>,
    Vec<UnboundedReceiverStream<Result<K, watcher::Error>>>,
)
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..outputs)
        .map(|_| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (tx, UnboundedReceiverStream::new(rx))
        })
        .unzip();
    let kind = K::kind(&Default::default()).to_string();
    let run = async move {
        let mut events =
            reflector(writer, watcher(api, wc).backoff(ShortBackoff::default())).boxed();
        while let Some(event) = events.next().await {
            let obj = match event {
                Ok(
                    watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o),
                ) => o,
                Ok(watcher::Event::InitDone) => {
                    ready.store(true, Ordering::Release);
                    debug!(%kind, "cache ready");
                    continue;
                }
                Ok(watcher::Event::Init) => continue,
                Err(e) => {
                    warn!(%kind, error = %e, "watch failed; retrying");
                    continue;
                }
            };
            for tx in &txs {
                let _ = tx.send(Ok(obj.clone()));
            }
        }
    };
    (run, rxs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_backoff_is_short_and_capped() {
        use kube::runtime::utils::Backoff;
        let mut b = ShortBackoff::default();
        let ms: Vec<u128> = b.by_ref().take(7).map(|d| d.as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(100)));
    }

    #[test]
    fn caches_are_ready_only_when_every_one_is() {
        let ready = CachesReady::default();
        assert!(!ready.all());
        for flag in [&ready.volumes, &ready.attachments, &ready.mountpods] {
            flag.store(true, Ordering::Release);
            assert!(!ready.all());
        }
        ready.nodes.store(true, Ordering::Release);
        assert!(ready.all());
    }
}
