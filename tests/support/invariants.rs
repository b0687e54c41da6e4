//! Invariants of single-node (RWO) volumes, checked continuously for one test's
//! objects while chaos happens, not sampled at the end.
//!
//! [`SingleNodeWatch`] runs two watches (label `tessera.io/test=<id>`, or every object
//! of a set of volumes): one over MountPods, one over VolumeAttachments. A watch of one resource delivers its events
//! in resourceVersion order, so replaying them rebuilds every intermediate state the
//! API server held, and each state is checked:
//!
//! - **MountPods**: at most one MountPod object of a volume exists at any revision, in
//!   any phase and whether or not it is being deleted (moving is detach, then attach:
//!   the new node's MountPod is created only once the old one is gone, so this is
//!   stricter than "two Ready at once").
//! - **VolumeAttachments**: the tickets satisfied at one revision (in spec, and
//!   satisfied at their generation in status) are all on one node; and a ticket, once
//!   satisfied, never turns unsatisfied while it stays in spec at the same generation
//!   (a "flip": a restarted controller or agent must not take back a proven attach).
//!   The nodes they were on, in order, are each volume's history (how often it moved).
//!
//! A re-list (the watch restarted) would hide the revisions in between: it is counted,
//! and the state is checked again once the list is complete. Every test volume must be
//! single-node. [`MountPoller`] looks at the same rule in the kernel's mount table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use tessera_api::{MountPod, VolumeAttachment};

use super::fixtures::TEST_LABEL;

/// What the watches saw so far.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// MountPod events replayed.
    pub mountpod_events: u64,
    /// VolumeAttachment events replayed.
    pub attachment_events: u64,
    /// The most MountPods of one volume that existed at one revision.
    pub max_mountpods_per_volume: usize,
    /// The most nodes with a satisfied ticket of one volume at one revision.
    pub max_satisfied_nodes: usize,
    /// Tickets that went from satisfied to unsatisfied (same generation, still in spec).
    pub flips: Vec<String>,
    /// The (volume, ticket) pairs satisfied at the latest revision.
    pub satisfied: BTreeSet<(String, String)>,
    /// States that broke the single-node rule, in words (the first 20).
    pub violations: Vec<String>,
    /// Watch restarts after the first list (each hides the revisions in between).
    pub relists: u32,
    /// Watch errors (retried).
    pub errors: u32,
    /// Per volume, the nodes its satisfied tickets were on, in order, each time they
    /// were on one node other than the last one listed: `[a, b]` moved once, a to b.
    pub history: BTreeMap<String, Vec<String>>,
}

/// The two watches; they stop when this is dropped.
pub struct SingleNodeWatch {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    seen: Arc<Mutex<Seen>>,
    synced: Arc<AtomicU32>,
}

impl SingleNodeWatch {
    /// Start watching the objects of test `test_id`; returns once both watches have
    /// listed.
    pub async fn start(client: Client, test_id: &str) -> Self {
        let wc = watcher::Config::default().labels(&format!("{TEST_LABEL}={test_id}"));
        Self::start_with(client, wc, None).await
    }

    /// Start watching the objects of the volumes named in `volumes` (objects of
    /// Tessera deployed in a cluster carry no test label); returns once both watches
    /// have listed.
    pub async fn start_for(client: Client, volumes: BTreeSet<String>) -> Self {
        Self::start_with(client, watcher::Config::default(), Some(Arc::new(volumes))).await
    }

    async fn start_with(client: Client, wc: watcher::Config, only: Only) -> Self {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let synced: Arc<AtomicU32> = Arc::default();
        let tasks = vec![
            tokio::spawn(watch_mountpods(
                Api::all(client.clone()),
                wc.clone(),
                only.clone(),
                seen.clone(),
                synced.clone(),
            )),
            tokio::spawn(watch_attachments(
                Api::all(client),
                wc,
                only,
                seen.clone(),
                synced.clone(),
            )),
        ];
        let w = SingleNodeWatch {
            tasks,
            seen,
            synced,
        };
        super::fixtures::eventually(
            Duration::from_secs(30),
            "the invariant watches listed",
            || async { (w.synced.load(Ordering::SeqCst) >= 2).then_some(()) },
        )
        .await;
        w
    }

    /// What was seen so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for SingleNodeWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The volumes checked (`None`: every one the watch sees).
type Only = Option<Arc<BTreeSet<String>>>;

/// Whether volume `name` is one of `only`.
fn checked(only: &Only, name: &str) -> bool {
    only.as_ref().is_none_or(|o| o.contains(name))
}

/// Replays watch events into a map of objects, calling `check` on the state after
/// each change (after a complete list, for a re-list).
struct Replay<K> {
    objects: BTreeMap<String, K>,
    buffer: Option<BTreeMap<String, K>>,
    lists: u32,
}

impl<K: kube::Resource> Replay<K> {
    fn new() -> Self {
        Replay {
            objects: BTreeMap::new(),
            buffer: None,
            lists: 0,
        }
    }

    /// Apply one event; the names whose state changed (all of them after a list), or
    /// None while a list is in progress.
    fn apply(&mut self, ev: watcher::Event<K>) -> Option<Vec<String>> {
        match ev {
            watcher::Event::Init => {
                self.buffer = Some(BTreeMap::new());
                None
            }
            watcher::Event::InitApply(o) => {
                if let Some(b) = self.buffer.as_mut() {
                    b.insert(o.name_any(), o);
                }
                None
            }
            watcher::Event::InitDone => {
                self.objects = self.buffer.take().unwrap_or_default();
                self.lists += 1;
                Some(self.objects.keys().cloned().collect())
            }
            watcher::Event::Apply(o) => {
                let name = o.name_any();
                self.objects.insert(name.clone(), o);
                Some(vec![name])
            }
            watcher::Event::Delete(o) => {
                let name = o.name_any();
                self.objects.remove(&name);
                Some(vec![name])
            }
        }
    }
}

async fn watch_mountpods(
    api: Api<MountPod>,
    wc: watcher::Config,
    only: Only,
    seen: Arc<Mutex<Seen>>,
    synced: Arc<AtomicU32>,
) {
    let mut replay = Replay::new();
    let mut announced = false;
    let mut stream = watcher(api, wc)
        .backoff(tessera_runtime::backoff::ShortBackoff::default())
        .boxed();
    while let Some(ev) = stream.next().await {
        let Ok(ev) = ev else {
            seen.lock().unwrap().errors += 1;
            continue;
        };
        let Some(changed) = replay.apply(ev) else {
            continue;
        };
        let volumes: BTreeSet<String> = changed
            .iter()
            .map(|n| {
                replay
                    .objects
                    .get(n)
                    .map(|mp| mp.spec.volume.clone())
                    .unwrap_or_default()
            })
            .collect();
        let mut s = seen.lock().unwrap();
        s.mountpod_events += 1;
        s.relists = replay.lists.saturating_sub(1);
        for volume in volumes
            .iter()
            .filter(|v| !v.is_empty() && checked(&only, v))
        {
            let on: Vec<(String, bool)> = replay
                .objects
                .values()
                .filter(|mp| &mp.spec.volume == volume)
                .map(|mp| {
                    (
                        mp.spec.node_name.clone(),
                        mp.metadata.deletion_timestamp.is_some(),
                    )
                })
                .collect();
            s.max_mountpods_per_volume = s.max_mountpods_per_volume.max(on.len());
            if on.len() > 1 && s.violations.len() < 20 {
                s.violations.push(format!(
                    "{} MountPods of {volume} at once (node, deleting): {on:?}",
                    on.len()
                ));
            }
        }
        if replay.lists == 1 && !announced {
            announced = true;
            synced.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn watch_attachments(
    api: Api<VolumeAttachment>,
    wc: watcher::Config,
    only: Only,
    seen: Arc<Mutex<Seen>>,
    synced: Arc<AtomicU32>,
) {
    let mut replay = Replay::new();
    let mut announced = false;
    // Tickets satisfied at the last state: (volume, ticket) → generation.
    let mut satisfied: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut stream = watcher(api, wc)
        .backoff(tessera_runtime::backoff::ShortBackoff::default())
        .boxed();
    while let Some(ev) = stream.next().await {
        let Ok(ev) = ev else {
            seen.lock().unwrap().errors += 1;
            continue;
        };
        let Some(changed) = replay.apply(ev) else {
            continue;
        };
        let mut s = seen.lock().unwrap();
        s.attachment_events += 1;
        s.relists = replay.lists.saturating_sub(1);
        for name in changed.into_iter().filter(|n| checked(&only, n)) {
            let now: BTreeMap<String, (String, i64)> = replay
                .objects
                .get(&name)
                .map(|va| {
                    va.spec
                        .attachment_tickets
                        .iter()
                        .filter(|(id, _)| va.ticket_satisfied(id))
                        .map(|(id, t)| (id.clone(), (t.node_id.clone(), t.generation)))
                        .collect()
                })
                .unwrap_or_default();
            let nodes: BTreeSet<&String> = now.values().map(|(n, _)| n).collect();
            s.max_satisfied_nodes = s.max_satisfied_nodes.max(nodes.len());
            if nodes.len() > 1 && s.violations.len() < 20 {
                s.violations.push(format!(
                    "{name}: tickets satisfied on {} nodes at once: {now:?}",
                    nodes.len()
                ));
            }
            if let [node] = nodes.iter().collect::<Vec<_>>()[..] {
                let history = s.history.entry(name.clone()).or_default();
                if history.last() != Some(*node) {
                    history.push((*node).clone());
                }
            }
            let tickets = replay
                .objects
                .get(&name)
                .map(|va| va.spec.attachment_tickets.clone())
                .unwrap_or_default();
            let before: Vec<(String, i64)> = satisfied
                .iter()
                .filter(|((v, _), _)| v == &name)
                .map(|((_, id), g)| (id.clone(), *g))
                .collect();
            for (id, generation) in before {
                let still_asked = tickets.get(&id).is_some_and(|t| t.generation == generation);
                if still_asked && !now.contains_key(&id) {
                    let why = replay
                        .objects
                        .get(&name)
                        .and_then(|va| va.ticket_status(&id))
                        .and_then(|st| st.conditions.first())
                        .map(|c| format!("{}: {}", c.reason, c.message))
                        .unwrap_or_else(|| "no condition".into());
                    s.flips.push(format!("{name}/{id} ({why})"));
                }
                satisfied.remove(&(name.clone(), id));
            }
            for (id, (_, generation)) in now {
                satisfied.insert((name.clone(), id), generation);
            }
        }
        s.satisfied = satisfied.keys().cloned().collect();
        if replay.lists == 1 && !announced {
            announced = true;
            synced.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Polls this host's mount table every 10 ms until stopped, for a volume FUSE-mounted
/// under more than one of some roots (two agents' mount roots) in one sample. A
/// sample, not every state: the API-side watches are the exact check, this one looks
/// at what the kernel serves.
pub struct MountPoller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(u64, Vec<String>)>>,
}

impl MountPoller {
    /// Start polling the mounts under `roots` (the agents' mount roots).
    pub fn start(roots: Vec<PathBuf>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut samples, mut doubles) = (0u64, Vec::new());
            while !s.load(Ordering::Relaxed) {
                let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
                let mut on: BTreeMap<String, usize> = BTreeMap::new();
                for m in tessera_host::mounts::parse_mountinfo(&table) {
                    if !m.fs_type.starts_with("fuse") {
                        continue;
                    }
                    for root in &roots {
                        if let Ok(rest) = m.mount_point.strip_prefix(root) {
                            *on.entry(rest.display().to_string()).or_default() += 1;
                        }
                    }
                }
                doubles.extend(on.into_iter().filter(|(_, n)| *n > 1).map(|(v, _)| v));
                samples += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            (samples, doubles)
        });
        MountPoller {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop; the samples taken and the volumes seen mounted twice.
    pub fn finish(mut self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}
