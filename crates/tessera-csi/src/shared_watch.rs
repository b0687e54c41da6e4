//! One watch per VolumeAttachment for every call in the process waiting on it, as
//! the ControllerPublish calls of one RWX volume on many nodes wait for their tickets.
//!
//! ```text
//!  waiter (object as just read or written, resourceVersion N)
//!    cond holds? ─▶ done
//!    subscribe to the volume's feed (started by the first waiter, from its version)
//!    latest version ≥ N and cond holds? ─▶ done; else wait for the next version
//!  feed task: watch name=<it> ─▶ each event: the latest version, to every waiter
//!       └─ watch ended: again from the last version; error event (410 Gone) or a
//!          failed request: read the object afresh (backing off) and watch from there
//!       └─ no waiter left: the feed ends
//! ```
//!
//! With one watch per waiter, n waiters each receive every change of an object whose
//! size grows with n: O(n²) bytes out of the API server. The feed receives each change
//! once. A waiter sees the latest version (intermediate ones may be skipped, which a
//! condition on the current state does not need), and never one older than the
//! version it started from (resourceVersions compared as the integers etcd makes
//! them; an object whose resourceVersion is no integer is waited for by a watch of its
//! own, [`await_from`]). Callers bound the wait with a timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use kube::api::{Api, WatchEvent};
use kube::core::params::WatchParams;
use tokio::sync::watch;
use tracing::{debug, warn};

use tessera_api::VolumeAttachment;

use super::resource_version;
use super::watch::{WatchError, await_from};

/// The latest version a feed saw.
#[derive(Debug, Clone)]
enum Latest {
    /// The object, and its resourceVersion as an integer.
    Object(u64, Arc<VolumeAttachment>),
    /// Deleted, at that resourceVersion.
    Deleted(u64),
}

impl Latest {
    fn version(&self) -> u64 {
        match self {
            Latest::Object(rv, _) | Latest::Deleted(rv) => *rv,
        }
    }
}

type Feed = Arc<watch::Sender<Latest>>;

/// The feeds of the VolumeAttachments waited on, by name.
#[derive(Clone)]
pub struct SharedWatches {
    api: Api<VolumeAttachment>,
    feeds: Arc<Mutex<HashMap<String, Feed>>>,
}

impl SharedWatches {
    /// Feeds watching through `api`.
    pub fn new(api: Api<VolumeAttachment>) -> Self {
        SharedWatches {
            api,
            feeds: Arc::default(),
        }
    }

    /// Wait until `cond` holds for the VolumeAttachment `from` is a version of (as
    /// [`await_from`], through the object's shared feed). `None`: it was deleted.
    pub async fn wait<F>(
        &self,
        from: VolumeAttachment,
        cond: F,
    ) -> Result<Option<VolumeAttachment>, WatchError>
    where
        F: Fn(Option<&VolumeAttachment>) -> bool + Send + Clone + 'static,
    {
        if cond(Some(&from)) {
            return Ok(Some(from));
        }
        let (Some(name), Some(since)) = (from.metadata.name.clone(), resource_version(&from))
        else {
            return await_from(self.api.clone(), from, cond).await;
        };
        let mut rx = self.subscribe(&name, since, &from);
        loop {
            {
                let latest = rx.borrow_and_update();
                if latest.version() >= since {
                    match &*latest {
                        Latest::Object(_, va) if cond(Some(va)) => {
                            return Ok(Some(VolumeAttachment::clone(va)));
                        }
                        Latest::Deleted(_) if cond(None) => return Ok(None),
                        _ => {}
                    }
                }
            }
            // The feed ends only when no one is subscribed: not while this waits.
            if rx.changed().await.is_err() {
                return await_from(self.api.clone(), from, cond).await;
            }
        }
    }

    /// The latest version of `name` a running feed has seen, if its resourceVersion is
    /// at least `at_least` (the caller's own last write of it): a copy in hand instead
    /// of a read of an object that grows with its tickets, while other calls wait on
    /// it. `None`: no feed runs, or it has not seen that version yet.
    pub fn latest(&self, name: &str, at_least: u64) -> Option<VolumeAttachment> {
        let feeds = self.feeds.lock().expect("feeds poisoned");
        let latest = feeds.get(name)?.borrow();
        match &*latest {
            Latest::Object(rv, va) if *rv >= at_least => Some(VolumeAttachment::clone(va)),
            _ => None,
        }
    }

    /// A receiver of `name`'s feed, starting the feed from `from` (at `rv`) when none
    /// runs.
    fn subscribe(&self, name: &str, rv: u64, from: &VolumeAttachment) -> watch::Receiver<Latest> {
        let mut feeds = self.feeds.lock().expect("feeds poisoned");
        if let Some(feed) = feeds.get(name) {
            return feed.subscribe();
        }
        let (tx, rx) = watch::channel(Latest::Object(rv, Arc::new(from.clone())));
        let feed: Feed = Arc::new(tx);
        feeds.insert(name.to_string(), feed.clone());
        tokio::spawn(self.clone().feed(name.to_string(), rv, feed));
        rx
    }

    /// Watch `name` from `rv` into `feed` until no one is subscribed.
    async fn feed(self, name: String, mut rv: u64, feed: Feed) {
        let wp = WatchParams::default().fields(&format!("metadata.name={name}"));
        let mut fresh = false;
        loop {
            if fresh {
                // Read the object afresh (after an error event or a failed request).
                match self.api.get_opt(&name).await {
                    Ok(Some(va)) => {
                        if let Some(v) = resource_version(&va) {
                            rv = v;
                            feed.send_replace(Latest::Object(v, Arc::new(va)));
                        }
                    }
                    Ok(None) => {
                        feed.send_replace(Latest::Deleted(rv));
                    }
                    Err(e) => warn!(volume = %name, error = %e, "reading the VolumeAttachment"),
                }
                fresh = false;
            }
            let watched = async {
                let stream = self.api.watch(&wp, &rv.to_string()).await?;
                futures::pin_mut!(stream);
                while let Some(event) = stream.try_next().await? {
                    match event {
                        WatchEvent::Added(va) | WatchEvent::Modified(va) => {
                            if let Some(v) = resource_version(&va) {
                                rv = v;
                                feed.send_replace(Latest::Object(v, Arc::new(va)));
                            }
                        }
                        WatchEvent::Deleted(va) => {
                            rv = resource_version(&va).unwrap_or(rv);
                            feed.send_replace(Latest::Deleted(rv));
                        }
                        WatchEvent::Bookmark(b) => {
                            rv = b.metadata.resource_version.parse().unwrap_or(rv);
                        }
                        WatchEvent::Error(e) => {
                            debug!(volume = %name, error = %e, "watch error event: reading afresh");
                            return Ok(true);
                        }
                    }
                }
                Ok::<bool, kube::Error>(false)
            };
            tokio::select! {
                res = watched => match res {
                    Ok(again) => fresh = again,
                    Err(e) => {
                        warn!(volume = %name, error = %e, "watching the VolumeAttachment; again in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        fresh = true;
                    }
                },
                () = feed.closed() => {}
            }
            // No waiter left (checked under the lock, so that none subscribes now):
            // the feed ends.
            let mut feeds = self.feeds.lock().expect("feeds poisoned");
            if feed.receiver_count() == 0 {
                feeds.remove(&name);
                return;
            }
        }
    }
}
