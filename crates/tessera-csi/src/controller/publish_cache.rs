//! What ControllerPublish and ControllerUnpublish read, from caches the Controller
//! service keeps, so that a publish writes its ticket without a read round trip first
//! and n nodes detaching from one volume do not each read an object that grows with n.
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
//! An unpublish takes a VolumeAttachment copy only when it holds the node's ticket: a
//! ticket missing from a copy may be another process's, written a moment ago. Or when
//! this process refused that ticket at the volume's cap ([`RefusedAtCap`]): a
//! DaemonSet on 5,000 nodes leaves 3,976 nodes refused, and each of their unpublishes
//! read the 860 KB object (3,976 reads, 639 s of API server CPU in bench-rwx). A ticket
//! another process wrote meanwhile for such a node is the reaper's, once its
//! storage.k8s.io VolumeAttachment is gone.
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

use tessera_api::{Volume, VolumeAttachment};
use tessera_runtime::KubeContext;
use tessera_runtime::backoff::ShortBackoff;
use tessera_runtime::labels::Labels;

use super::memo::Bounded;
use super::{ControllerService, Error};
use crate::{csi_ticket_id, resource_version, shown};

/// Where a publish's copy of an object came from (a log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The service's cache (a reflector).
    Cache,
    /// The shared feed of the VolumeAttachment ([`crate::shared_watch`]).
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
        let wc = labels.watcher_config();
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

/// The reads of publish and unpublish: from the caches and the feed where they may
/// answer, else from the API server.
impl ControllerService {
    /// The Volume a publish names: from the cache (its access mode never changes),
    /// else read (NOT_FOUND only when the API server says so). A cached Volume being
    /// deleted is read too: its name may come back as a new Volume, of another mode.
    pub(super) async fn published_volume(
        &self,
        volume_id: &str,
    ) -> Result<(std::sync::Arc<Volume>, Source), Error> {
        if let Some(v) = self
            .caches
            .volume(volume_id)
            .filter(|v| v.metadata.deletion_timestamp.is_none())
        {
            return Ok((v, Source::Cache));
        }
        let v = self
            .volumes()
            .get_opt(volume_id)
            .await
            .context(|| format!("reading Volume {}", shown(volume_id)))?
            .ok_or_else(|| Error::VolumeNotFound(shown(volume_id)))?;
        Ok((v.into(), Source::Api))
    }

    /// That the Node a publish names exists: from the cache, else read (its metadata).
    pub(super) async fn node_exists(&self, node_id: &str) -> Result<Source, Error> {
        if self.caches.node_known(node_id) {
            return Ok(Source::Cache);
        }
        Api::<Node>::all(self.client.clone())
            .get_metadata_opt(node_id)
            .await
            .context(|| format!("reading Node {}", shown(node_id)))?
            .ok_or_else(|| Error::NodeNotFound(shown(node_id)))?;
        Ok(Source::Api)
    }

    /// The VolumeAttachment of `volume_id` as a publish reads it: the newest copy in
    /// hand (the shared feed other calls wait on, the cache) that shows this process's
    /// last write of it (our tickets are written by this process alone, and a stale
    /// view of others' changes is harmless to a publish), else a read.
    pub(super) async fn attachment(
        &self,
        volume_id: &str,
    ) -> Result<(Option<VolumeAttachment>, Source), Error> {
        let last = self.tickets.last_written(volume_id);
        let feed = self.watches.latest(volume_id, last);
        let from_feed = feed.as_ref().and_then(resource_version);
        let copies = feed.into_iter().chain(self.caches.attachment(volume_id));
        if let Some((rv, va)) = freshest(copies, last) {
            let from = if Some(rv) == from_feed {
                Source::Feed
            } else {
                Source::Cache
            };
            return Ok((Some(va), from));
        }
        let va = self
            .attachments()
            .get_opt(volume_id)
            .await
            .context(|| format!("reading VolumeAttachment {volume_id}"))?;
        Ok((va, Source::Api))
    }

    /// The VolumeAttachment an unpublish of `volume_id` from `node` works on: a copy
    /// in hand ([`Self::attachment`]) when it holds the node's ticket, else read from
    /// the API server. A copy shows every ticket this process wrote as written, but a
    /// ticket missing from it may be one written a moment ago by another process (the
    /// CSI leader before a failover): absence, and the every-node unpublish, are asked
    /// of the API server. A ticket status lagging in a copy (satisfied a watch hop
    /// ago) only forgoes an idle mount; the removal itself is a merge patch, as right
    /// on any copy. (A read of a VolumeAttachment used by n nodes is O(n) for the API
    /// server: n nodes detaching at once, each reading it, was O(n²).)
    pub(super) async fn unpublished_attachment(
        &self,
        volume_id: &str,
        node: &str,
    ) -> Result<Option<VolumeAttachment>, Error> {
        if !node.is_empty() {
            let (copy, from) = self.attachment(volume_id).await?;
            let ticket = csi_ticket_id(volume_id, node);
            if from == Source::Api
                || self.refused.contains(&ticket)
                || copy
                    .as_ref()
                    .is_some_and(|va| va.spec.attachment_tickets.contains_key(&ticket))
            {
                debug!(%from, "VolumeAttachment to unpublish from");
                return Ok(copy);
            }
        }
        self.attachments()
            .get_opt(volume_id)
            .await
            .context(|| format!("reading VolumeAttachment {}", shown(volume_id)))
            .map_err(Into::into)
    }
}

/// The CSI tickets this process last refused at their volume's cap (a publish
/// answered [`Error::TicketsFull`], nothing written), until it writes them or an
/// unpublish of them reads: an unpublish of such a node trusts a copy without its ticket.
/// Bounded: past [`RefusedAtCap::CAP`] entries it starts over (a forgotten refusal
/// costs one read).
#[derive(Clone)]
pub struct RefusedAtCap(Bounded<String, ()>);

impl Default for RefusedAtCap {
    fn default() -> Self {
        RefusedAtCap(Bounded::new(Self::CAP))
    }
}

impl RefusedAtCap {
    /// The most entries kept.
    pub const CAP: usize = 65_536;

    /// Ticket `id` was refused at its volume's cap.
    pub fn record(&self, id: &str) {
        self.0.insert(id.to_string(), ());
    }

    /// Ticket `id` was written, or an unpublish of it read its VolumeAttachment.
    pub fn forget(&self, id: &str) {
        self.0.remove(id);
    }

    /// Whether ticket `id` was refused and neither written nor unpublished since.
    pub fn contains(&self, id: &str) -> bool {
        self.0.get(id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use tessera_api::VolumeAttachmentSpec;

    use super::*;

    fn va(rv: Option<&str>) -> VolumeAttachment {
        let mut va = VolumeAttachment::new("v", VolumeAttachmentSpec::default());
        va.metadata.resource_version = rv.map(Into::into);
        va
    }

    #[test]
    fn a_refusal_is_kept_until_written_or_unpublished_and_bounded() {
        let refused = RefusedAtCap::default();
        assert!(!refused.contains("csi-a"));
        refused.record("csi-a");
        refused.record("csi-b");
        assert!(refused.contains("csi-a") && refused.contains("csi-b"));
        refused.forget("csi-a");
        assert!(!refused.contains("csi-a") && refused.contains("csi-b"));
        for i in 0..RefusedAtCap::CAP {
            refused.record(&format!("csi-{i}"));
        }
        assert!(!refused.contains("csi-b"), "full: started over");
        assert!(refused.0.kept() <= RefusedAtCap::CAP);
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
