//! The shared watches: one watch per kind fills the cache the reconcilers read and
//! fans every touched object out to the controllers it triggers, and says when its
//! cache has had its first full list.
//!
//! ```text
//!  watch(kind) ─▶ lean ─▶ reflector ─▶ Store (cache) ─── read by every reconcile
//!                     │ each event ─▶ its Index, if any (MountPods by volume)
//!                     │ InitDone ─▶ CachesReady flag
//!                     └─ each object ─▶ forward? ─▶ one stream per triggered controller
//!                                                    (less its own writes: [`Echoes`])
//! ```
//!
//! Each object is made lean first (the `managedFields` no reader of the cache reads
//! are dropped: [`no_managed_fields`], [`spec_managers_only`]), cached once and handed
//! to the controllers as the same `Arc`, not as copies.
//!
//! Every object reaches the cache; only those whose [`Projection`] changed reach the
//! controllers, for kinds of which the controllers read only a part: a Node's
//! existence, whether a CSINode lists the driver. Each such change reconciles every
//! volume with a ticket on that node, so an update of anything else (a Node's status
//! as the kubelet and the attach-detach controller write it, on every attach) would
//! reconcile them all for nothing.
//!
//! A broken watch (an API server restart) is retried after at most 1 s
//! ([`tessera_runtime::backoff::ShortBackoff`]) and re-lists, so the caches catch up soon after the server is back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::{debug, warn};

use tessera_runtime::backoff::ShortBackoff;

use super::echoes::Echoes;
use super::index::Index;

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

/// Where a watch's events go first: the cache, and an index of it if the kind has one.
pub(super) struct Sink<K: kube::Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// The cache's writer.
    pub writer: reflector::store::Writer<K>,
    /// An index of the cache, updated from the same events right after the cache.
    pub index: Option<Arc<RwLock<Index<K>>>>,
}

impl<K: kube::Resource + Clone + 'static> From<reflector::store::Writer<K>> for Sink<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn from(writer: reflector::store::Writer<K>) -> Self {
        Sink {
            writer,
            index: None,
        }
    }
}

/// Run one watch of a kind into `sink` (the cache, and its index) and hand every touched object to
/// each of `outputs` consumers, so two controllers share one watch. Each object is
/// passed through `lean` before it is cached. `ready` is set when the first full list
/// has reached the cache. A consumer given [`Echoes`] is not handed the versions its
/// controller wrote itself.
pub(super) fn fan_out<K>(
    api: Api<K>,
    wc: watcher::Config,
    lean: fn(&mut K),
    sink: Sink<K>,
    ready: Arc<AtomicBool>,
    outputs: Vec<Option<Arc<Echoes>>>,
    mut forward: impl FnMut(&K, bool) -> bool + Send + 'static,
) -> (
    impl std::future::Future<Output = ()>,
    Vec<UnboundedReceiverStream<Arc<K>>>,
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
    let (txs, rxs): (Vec<_>, Vec<_>) = outputs
        .into_iter()
        .map(|echoes| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            ((tx, echoes), UnboundedReceiverStream::new(rx))
        })
        .unzip();
    let kind = K::kind(&Default::default()).to_string();
    let run = async move {
        let watch = watcher(api, wc)
            .backoff(ShortBackoff::default())
            .modify(lean);
        let Sink { writer, index } = sink;
        let mut events = reflector(writer, watch).boxed();
        while let Some(event) = events.next().await {
            // The index before anyone is handed the object: a reconcile it triggers
            // finds it there.
            if let (Ok(e), Some(index)) = (&event, &index) {
                index.write().expect("index poisoned").apply(e);
            }
            // The object, whether it comes as a change (not listed, not deleted), and
            // whether it was deleted.
            let (obj, change, deleted) = match event {
                Ok(watcher::Event::Apply(o)) => (o, true, false),
                Ok(watcher::Event::InitApply(o)) => (o, false, false),
                Ok(watcher::Event::Delete(o)) => (o, false, true),
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
            if !forward(&obj, deleted) {
                continue;
            }
            let obj = Arc::new(obj);
            for (tx, echoes) in &txs {
                let echo = echoes.as_ref().is_some_and(|e| {
                    let rv = obj.meta().resource_version.as_deref();
                    e.seen(&kind, &obj.name_any(), rv, change)
                });
                if !echo {
                    let _ = tx.send(obj.clone());
                }
            }
        }
    };
    (run, rxs)
}

/// Drop every `managedFields` entry: for kinds whose cache no reader asks who wrote
/// what. They are most of a small object, and each cached copy would carry them.
pub(super) fn no_managed_fields<K: kube::Resource>(o: &mut K) {
    o.managed_fields_mut().clear();
}

/// Keep the `managedFields` entries of the object itself (who wrote each ticket: the
/// reaper's [`ticket_managers`](super::reaper::ticket_managers)), drop those of its
/// status, which name the controller and grow with every ticket's status.
pub(super) fn spec_managers_only<K: kube::Resource>(o: &mut K) {
    o.managed_fields_mut()
        .retain(|e| e.subresource.as_deref().unwrap_or_default().is_empty());
}

/// Every object, every change: for kinds whose controllers read all of them.
pub(super) fn every_change<K>(_: &K, _: bool) -> bool {
    true
}

/// The part of each object of a kind that its controllers read, by name, as last
/// forwarded: [`changed`](Self::changed) says whether a new version matters to them.
#[derive(Debug)]
pub(super) struct Projection<V> {
    last: HashMap<String, V>,
}

impl<V> Default for Projection<V> {
    fn default() -> Self {
        Projection {
            last: HashMap::new(),
        }
    }
}

impl<V: PartialEq> Projection<V> {
    /// Whether object `name`, now projected to `now` (`None`: deleted), differs from
    /// what was last forwarded: new, changed in its projection, or gone.
    pub(super) fn changed(&mut self, name: &str, now: Option<V>) -> bool {
        match now {
            None => {
                self.last.remove(name);
                true
            }
            Some(v) if self.last.get(name) == Some(&v) => false,
            Some(v) => {
                self.last.insert(name.to_string(), v);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn only_a_change_of_the_projection_is_forwarded() {
        let mut p = Projection::default();
        // (name, projection now or None for a deletion, forwarded)
        let steps = [
            ("n1", Some(false), true),  // first sighting
            ("n1", Some(false), false), // another update, same projection
            ("n1", Some(true), true),   // the driver registered
            ("n1", Some(true), false),
            ("n2", Some(true), true), // another node
            ("n1", None, true),       // deleted
            ("n1", Some(true), true), // back
            ("n3", None, true),       // a deletion never seen before still counts
        ];
        for (i, (name, now, want)) in steps.into_iter().enumerate() {
            assert_eq!(p.changed(name, now), want, "step {i}: {name} {now:?}");
        }
    }
}
