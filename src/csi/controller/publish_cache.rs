//! What ControllerPublish reads, from caches the Controller service keeps, so that a
//! publish writes its ticket without a read round trip first.
//!
//! ```text
//!  watch Volumes (--watch-selector)        ─▶ reflector ─▶ Store ─┐
//!  watch Node metadata (every node)        ─▶ reflector ─▶ Store ─┼─▶ publish: lookup
//!  watch VolumeAttachments (--watch-selector) ─▶ reflector ─▶ Store ─┘    │ hit: in hand
//!                                                                         └ miss: quorum GET
//! ```
//!
//! Each cache answers only what it may answer from a copy:
//! - a Volume's access mode (immutable: any copy of the Volume tells it);
//! - that a Node exists (the watch lag is the window in which a Node deleted a moment
//!   ago still counts; the controller does not honour its ticket either way);
//! - a VolumeAttachment, only at a resourceVersion at least this process's last write
//!   of it ([`freshest`]): every ticket of ours is in the copy, as written, so the
//!   "published otherwise" check, the ticket's generation and the idle-mount swap see
//!   what a quorum read would; others' changes (statuses, the idle ticket's removal)
//!   may lag by a watch hop, as they would between a read and the patch anyway.
//!
//! A miss (a Volume created a moment ago, a new Node, an object outside the watch
//! selector, a cache not listed yet) is a quorum GET, so NOT_FOUND is still answered
//! only after the API server said so. The caches drop `managedFields` (unused here).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{debug, warn};

use crate::api::{Volume, VolumeAttachment};
use crate::controller::ShortBackoff;
use crate::csi::resource_version;
use crate::labels::Labels;

/// Where a publish's copy of an object came from (a log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The service's cache (a reflector).
    Cache,
    /// The shared feed of the VolumeAttachment ([`crate::csi::shared_watch`]).
    Feed,
    /// A quorum read from the API server.
    Api,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Cache => "cache",
            Source::Feed => "feed",
            Source::Api => "api",
        })
    }
}

/// The caches of the Controller service (cheap to clone: the stores are shared).
#[derive(Clone)]
pub struct PublishCaches {
    volumes: Store<Volume>,
    nodes: Store<PartialObjectMeta<Node>>,
    attachments: Store<VolumeAttachment>,
}

/// Of the copies of one VolumeAttachment in hand, the newest whose resourceVersion is
/// at least `at_least` (this process's last write of it; 0: none): `None` when no copy
/// shows that write, and the caller reads it from the API server. A copy whose
/// resourceVersion is no integer cannot be ordered: never used.
pub fn freshest<I>(copies: I, at_least: u64) -> Option<(u64, VolumeAttachment)>
where
    I: IntoIterator<Item = VolumeAttachment>,
{
    copies
        .into_iter()
        .filter_map(|va| resource_version(&va).map(|rv| (rv, va)))
        .filter(|(rv, _)| *rv >= at_least)
        .max_by_key(|(rv, _)| *rv)
}

impl PublishCaches {
    /// Start the three watches (on the current tokio runtime, for the life of the
    /// process); Volumes and VolumeAttachments carrying `labels` (the controller's
    /// `--watch-selector`), every Node's metadata.
    pub fn start(client: &Client, labels: &Labels) -> Self {
        let wc = if labels.0.is_empty() {
            watcher::Config::default()
        } else {
            watcher::Config::default().labels(&labels.selector())
        };
        PublishCaches {
            volumes: spawn(Api::all(client.clone()), wc.clone()),
            nodes: spawn(Api::all(client.clone()), watcher::Config::default()),
            attachments: spawn(Api::all(client.clone()), wc),
        }
    }

    /// The cached Volume `name`, if the cache holds it.
    pub fn volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.volumes.get(&reflector::ObjectRef::new(name))
    }

    /// Whether the cache holds Node `name`.
    pub fn node_known(&self, name: &str) -> bool {
        self.nodes.get(&reflector::ObjectRef::new(name)).is_some()
    }

    /// The cached VolumeAttachment `name`, if the cache holds it.
    pub fn attachment(&self, name: &str) -> Option<VolumeAttachment> {
        self.attachments
            .get(&reflector::ObjectRef::new(name))
            .map(|va| VolumeAttachment::clone(&va))
    }
}

/// Run a watch of `api` into a new store, without `managedFields`; the store.
fn spawn<K>(api: Api<K>, wc: watcher::Config) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let kind = K::kind(&Default::default()).to_string();
    let stream = watcher(api, wc)
        .backoff(ShortBackoff::default())
        .modify(|o: &mut K| o.managed_fields_mut().clear());
    tokio::spawn(async move {
        let mut events = reflector::reflector(writer, stream).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitDone) => debug!(%kind, "publish cache ready"),
                Ok(_) => {}
                Err(e) => warn!(%kind, error = %e, "publish cache watch failed; retrying"),
            }
        }
    });
    store
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::VolumeAttachmentSpec;

    fn va(rv: Option<&str>) -> VolumeAttachment {
        let mut va = VolumeAttachment::new("v", VolumeAttachmentSpec::default());
        va.metadata.resource_version = rv.map(Into::into);
        va
    }

    #[test]
    fn a_copy_counts_only_once_it_shows_this_process_s_last_write() {
        let rvs = |c: Option<(u64, VolumeAttachment)>| c.map(|(rv, _)| rv);
        // Copies (their resourceVersions), this process's last write, the copy taken.
        type Case<'a> = (&'a [Option<&'a str>], u64, Option<u64>);
        let cases: [Case; 8] = [
            // Nothing written by this process: any copy, the newest.
            (&[Some("5")], 0, Some(5)),
            (&[Some("5"), Some("9")], 0, Some(9)),
            (&[Some("9"), Some("5")], 0, Some(9)),
            // The last write at 7: the copy at 5 misses it, the one at 9 shows it.
            (&[Some("5")], 7, None),
            (&[Some("5"), Some("9")], 7, Some(9)),
            // The write itself.
            (&[Some("7")], 7, Some(7)),
            // No copy, or none whose version can be ordered.
            (&[], 0, None),
            (&[None, Some("x")], 0, None),
        ];
        for (copies, at_least, want) in cases {
            let got = freshest(copies.iter().map(|rv| va(*rv)), at_least);
            assert_eq!(rvs(got), want, "{copies:?} at least {at_least}");
        }
    }
}
