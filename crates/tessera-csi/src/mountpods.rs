//! One MountPod list-watch for the whole CSI Controller service, which each
//! ControllerUnpublish consults and is woken by while it waits for its node's MountPod
//! to go, instead of a GET and a watch of its own (the 500-node detach sent 500 GETs
//! and about 495 watches), and each ControllerPublish while it waits for its node's
//! mount to be decided ([`MountPodWatch::wait_for`], [`super::controller::grant`]).
//!
//! ```text
//!  watch MountPods (--watch-selector) ─▶ reflector ─▶ Store (by name: volume + node)
//!                                          └─ each event ─▶ wake the waiters of that name
//!                                             relist done ─▶ ready; wake every waiter
//!  waiter: subscribe to the name ─▶ ready? no: None (the caller asks the API server)
//!                                  ─▶ in the store? no: done; yes: sleep until woken, again
//! ```
//!
//! The rules that keep a waiter from a wrong answer:
//! - **Subscribed before it looks.** The store is updated before the waiters of the
//!   name are woken, and a waiter subscribes before each look: a change after the look
//!   wakes it.
//! - **Never from a store not listed yet.** Until the first list is complete,
//!   [`MountPodWatch::wait_gone`] answers `None` at once and the caller reads the
//!   API server, as before.
//! - **Relists.** A relist replaces the store only at its end (kube's reflector buffers
//!   it), and deletions missed while the watch was down come with no event of their
//!   own: every waiter is woken at the end of each relist, and looks again.
//! - **Only presence is trusted.** The MountPod's name is a function of its volume and
//!   node ([`api::mountpod_name`]), so the store's own key is the index by volume and
//!   node. A MountPod the store does not hold may have been created a moment ago: the
//!   caller asks the API server about such a one (one GET, as before); the wait is for
//!   one the store holds, until the store no longer holds that object (its uid: one
//!   deleted and made again between two looks counts as gone, as a watch of it saw).
//!
//! [`api::mountpod_name`]: tessera_api::mountpod_name

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, warn};

use tessera_api::MountPod;
use tessera_runtime::backoff::ShortBackoff;
use tessera_runtime::labels::Labels;

/// The shared MountPod cache and its waiters (cheap to clone).
#[derive(Clone)]
pub struct MountPodWatch {
    store: Store<MountPod>,
    waits: Waits,
}

/// The waiters by MountPod name, and whether the store has had its first list.
#[derive(Clone, Default)]
struct Waits {
    by_name: Arc<Mutex<HashMap<String, watch::Sender<()>>>>,
    ready: Arc<std::sync::atomic::AtomicBool>,
}

/// One waiter's subscription to a name; the name's entry goes with its last waiter.
struct Subscription {
    rx: watch::Receiver<()>,
    name: String,
    waits: Waits,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut by_name = self.waits.by_name.lock().expect("waiters poisoned");
        // This receiver is still alive here: the last one counts 1.
        if by_name
            .get(&self.name)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            by_name.remove(&self.name);
        }
    }
}

impl Waits {
    fn subscribe(&self, name: &str) -> Subscription {
        let mut by_name = self.by_name.lock().expect("waiters poisoned");
        let rx = by_name
            .entry(name.to_string())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        Subscription {
            rx,
            name: name.to_string(),
            waits: self.clone(),
        }
    }

    /// After the store applied `event`: wake whom it concerns, mark the store ready.
    fn observe(&self, event: &watcher::Event<MountPod>) {
        let by_name = self.by_name.lock().expect("waiters poisoned");
        match event {
            watcher::Event::Apply(mp) | watcher::Event::Delete(mp) => {
                if let Some(tx) = by_name.get(&mp.name_any()) {
                    tx.send_replace(());
                }
            }
            watcher::Event::InitDone => {
                self.ready.store(true, std::sync::atomic::Ordering::Release);
                for tx in by_name.values() {
                    tx.send_replace(());
                }
            }
            // Buffered by the reflector: the store changes at InitDone.
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    fn ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The number of names waited on (for tests).
    #[cfg(test)]
    fn names(&self) -> usize {
        self.by_name.lock().expect("waiters poisoned").len()
    }
}

impl MountPodWatch {
    /// Start the watch of the MountPods carrying `labels` (the controller's
    /// `--watch-selector`, which it puts on every MountPod it makes) on the current
    /// tokio runtime, for the life of the process.
    pub fn start(client: &Client, labels: &Labels) -> Self {
        let wc = labels.watcher_config();
        let (store, writer) = reflector::store();
        let waits = Waits::default();
        let stream = watcher(Api::<MountPod>::all(client.clone()), wc)
            .backoff(ShortBackoff::default())
            .modify(|mp: &mut MountPod| mp.managed_fields_mut().clear());
        tokio::spawn({
            let waits = waits.clone();
            async move {
                let mut events = reflector::reflector(writer, stream).boxed();
                while let Some(event) = events.next().await {
                    match event {
                        Ok(e) => {
                            if matches!(e, watcher::Event::InitDone) {
                                debug!("MountPod cache ready");
                            }
                            waits.observe(&e);
                        }
                        Err(e) => warn!(error = %e, "MountPod watch failed; retrying"),
                    }
                }
            }
        });
        MountPodWatch { store, waits }
    }

    /// Wait until MountPod `name` is gone, if the store holds it: `None` at once when
    /// the store has not had its first list or does not hold it (the caller asks the
    /// API server), else `Some(())` once its deletion was seen. Callers bound the
    /// wait with a timeout.
    pub async fn wait_gone(&self, name: &str) -> Option<()> {
        let mut sub = self.waits.subscribe(name);
        if !self.waits.ready() {
            return None;
        }
        let held = self.uid(name)?;
        loop {
            // Woken by every change of the name and every relist's end; the sender
            // lives while this subscription does.
            if sub.rx.changed().await.is_err() {
                return None;
            }
            if self.uid(name).as_ref() != Some(&held) {
                return Some(());
            }
        }
    }

    /// Wait until `cond` holds of the store, looked at now and after each change of
    /// MountPod `name` and each relist's end: `None` at once when the store has not
    /// had its first list (the caller waits otherwise), else `Some(())` once it holds.
    /// Callers bound the wait with a timeout. (ControllerPublish waits here for its
    /// node's new MountPod: [`super::controller::grant`].)
    pub async fn wait_for(&self, name: &str, cond: impl Fn(&Self) -> bool) -> Option<()> {
        let mut sub = self.waits.subscribe(name);
        if !self.waits.ready() {
            return None;
        }
        loop {
            if cond(self) {
                return Some(());
            }
            if sub.rx.changed().await.is_err() {
                return None;
            }
        }
    }

    /// The uid of MountPod `name` as the store holds it: `None` before its first list
    /// (nothing known), `Some(None)` when it holds no such MountPod.
    pub fn uid_held(&self, name: &str) -> Option<Option<String>> {
        self.waits.ready().then(|| self.uid(name))
    }

    /// MountPod `name`, if the store holds it.
    pub fn get(&self, name: &str) -> Option<std::sync::Arc<MountPod>> {
        self.store.get(&ObjectRef::new(name))
    }

    /// How many MountPods of `volume` on nodes other than `node` the store holds (a
    /// scan of the store: for single-node volumes, which have at most a few).
    pub fn others(&self, volume: &str, node: &str) -> usize {
        self.store
            .state()
            .iter()
            .filter(|m| m.spec.volume == volume && m.spec.node_name != node)
            .count()
    }

    /// The uid of the MountPod `name` the store holds (an empty one if it has none).
    fn uid(&self, name: &str) -> Option<String> {
        let mp = self.store.get(&ObjectRef::new(name))?;
        Some(mp.metadata.uid.clone().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use watcher::Event;

    fn mp(name: &str) -> MountPod {
        made(name, "1")
    }

    /// MountPod `name` as made the `nth` time (its uid).
    fn made(name: &str, nth: &str) -> MountPod {
        let spec = serde_json::json!({
            "volume": "v", "nodeName": "n1", "source": "/b/v", "capacityBytes": 1,
        });
        let mut mp = MountPod::new(name, serde_json::from_value(spec).expect("a MountPod spec"));
        mp.metadata.uid = Some(format!("{name}-{nth}"));
        mp
    }

    /// A watch fed by hand: what the watch task does, event by event.
    struct Fed {
        watch: MountPodWatch,
        writer: reflector::store::Writer<MountPod>,
    }

    impl Fed {
        fn new() -> Self {
            let (store, writer) = reflector::store();
            Fed {
                watch: MountPodWatch {
                    store,
                    waits: Waits::default(),
                },
                writer,
            }
        }

        fn feed(&mut self, events: Vec<Event<MountPod>>) {
            for e in events {
                self.writer.apply_watcher_event(&e);
                self.watch.waits.observe(&e);
            }
        }
    }

    /// Whether `wait` is still pending after the other tasks ran.
    async fn pending(wait: &tokio::task::JoinHandle<Option<()>>) -> bool {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        !wait.is_finished()
    }

    async fn done(wait: tokio::task::JoinHandle<Option<()>>) -> Option<()> {
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("the wait ended")
            .unwrap()
    }

    #[tokio::test]
    async fn a_store_not_listed_yet_answers_nothing() {
        let mut fed = Fed::new();
        assert_eq!(fed.watch.wait_gone("a").await, None, "before any list");
        // Listed halfway: still not ready, even for an object the buffer holds.
        fed.feed(vec![Event::Init, Event::InitApply(mp("a"))]);
        assert_eq!(
            fed.watch.wait_gone("a").await,
            None,
            "during the first list"
        );
        assert_eq!(fed.watch.waits.names(), 0, "no waiter left behind");
    }

    #[tokio::test]
    async fn a_wait_for_a_mountpod_ends_when_it_comes_and_not_before() {
        let mut fed = Fed::new();
        let is_there = |w: &MountPodWatch| w.get("a").is_some();
        assert_eq!(fed.watch.wait_for("a", is_there).await, None, "not listed");
        assert_eq!(
            fed.watch.uid_held("a"),
            None,
            "nothing known before the list"
        );
        fed.feed(vec![Event::Init, Event::InitDone]);
        assert_eq!(fed.watch.uid_held("a"), Some(None), "listed: none");
        let w = fed.watch.clone();
        let wait = tokio::spawn(async move { w.wait_for("a", is_there).await });
        assert!(pending(&wait).await, "waits while there is none");
        fed.feed(vec![Event::Apply(mp("b"))]);
        assert!(pending(&wait).await, "another MountPod");
        assert_eq!(fed.watch.others("v", "n2"), 1, "b is on n1, not n2");
        assert_eq!(fed.watch.others("v", "n1"), 0);
        fed.feed(vec![Event::Apply(mp("a"))]);
        assert_eq!(done(wait).await, Some(()));
        assert_eq!(fed.watch.uid_held("a"), Some(Some("a-1".into())));
        assert_eq!(fed.watch.waits.names(), 0, "no waiter left behind");
    }

    #[tokio::test]
    async fn a_wait_ends_on_the_deletion_and_not_before() {
        let mut fed = Fed::new();
        fed.feed(vec![
            Event::Init,
            Event::InitApply(mp("a")),
            Event::InitDone,
        ]);
        // Not in the store: no answer from it (the caller reads the API server).
        assert_eq!(fed.watch.wait_gone("b").await, None);
        let w = fed.watch.clone();
        let wait = tokio::spawn(async move { w.wait_gone("a").await });
        assert!(pending(&wait).await, "waits while the MountPod is there");
        // Changes of it, and of others, wake it; it goes on waiting.
        fed.feed(vec![Event::Apply(mp("a")), Event::Apply(mp("b"))]);
        assert!(pending(&wait).await, "a change is no deletion");
        fed.feed(vec![Event::Delete(mp("b"))]);
        assert!(pending(&wait).await, "another's deletion");
        fed.feed(vec![Event::Delete(mp("a"))]);
        assert_eq!(done(wait).await, Some(()));
        assert_eq!(fed.watch.waits.names(), 0, "no waiter left behind");
    }

    #[tokio::test]
    async fn a_deletion_missed_while_the_watch_was_down_ends_the_wait_at_the_relist() {
        let mut fed = Fed::new();
        fed.feed(vec![
            Event::Init,
            Event::InitApply(mp("a")),
            Event::InitDone,
        ]);
        let waits: Vec<_> = (0..3)
            .map(|_| {
                let w = fed.watch.clone();
                tokio::spawn(async move { w.wait_gone("a").await })
            })
            .collect();
        for wait in &waits {
            assert!(pending(wait).await);
        }
        // The relist: "a" is not listed again. Until its end the store is as before.
        fed.feed(vec![Event::Init, Event::InitApply(mp("b"))]);
        for wait in &waits {
            assert!(pending(wait).await, "the relist is not done");
        }
        fed.feed(vec![Event::InitDone]);
        for wait in waits {
            assert_eq!(done(wait).await, Some(()));
        }
        // Listed again in a relist: still there, the wait goes on.
        let w = fed.watch.clone();
        let wait = tokio::spawn(async move { w.wait_gone("b").await });
        fed.feed(vec![
            Event::Init,
            Event::InitApply(mp("b")),
            Event::InitDone,
        ]);
        assert!(pending(&wait).await, "still listed");
        wait.abort();
        let _ = wait.await;
        assert_eq!(
            fed.watch.waits.names(),
            0,
            "an aborted waiter leaves nothing"
        );
    }

    #[tokio::test]
    async fn one_deleted_and_made_again_between_two_looks_is_gone() {
        let mut fed = Fed::new();
        fed.feed(vec![
            Event::Init,
            Event::InitApply(mp("a")),
            Event::InitDone,
        ]);
        let w = fed.watch.clone();
        let wait = tokio::spawn(async move { w.wait_gone("a").await });
        assert!(pending(&wait).await);
        // Both events before the waiter looks again: another object of that name.
        fed.feed(vec![Event::Delete(mp("a")), Event::Apply(made("a", "2"))]);
        assert_eq!(done(wait).await, Some(()));
        // Made again and missed by a relist too.
        let w = fed.watch.clone();
        let wait = tokio::spawn(async move { w.wait_gone("a").await });
        assert!(pending(&wait).await, "waits on the second one");
        fed.feed(vec![
            Event::Init,
            Event::InitApply(made("a", "3")),
            Event::InitDone,
        ]);
        assert_eq!(done(wait).await, Some(()));
    }

    #[tokio::test]
    async fn a_deletion_between_the_subscription_and_the_wait_is_not_missed() {
        let mut fed = Fed::new();
        fed.feed(vec![
            Event::Init,
            Event::InitApply(mp("a")),
            Event::InitDone,
        ]);
        // Subscribed and looked (held), then deleted before the waiter sleeps.
        let mut sub = fed.watch.waits.subscribe("a");
        assert!(fed.watch.uid("a").is_some());
        fed.feed(vec![Event::Delete(mp("a"))]);
        let woken = tokio::time::timeout(Duration::from_secs(1), sub.rx.changed()).await;
        assert!(matches!(woken, Ok(Ok(()))), "the deletion woke it");
        assert!(fed.watch.uid("a").is_none());
    }
}
