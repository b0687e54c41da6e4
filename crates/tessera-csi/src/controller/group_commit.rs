//! Group commit of the CSI controller's ticket writes: the ticket changes for one
//! volume that arrive while a write of that volume is in flight go out together in
//! the next single merge patch of its VolumeAttachment.
//!
//! ```text
//!  publish/unpublish ─▶ TicketWriter::write(volume, changes)
//!      Batches::push ─┬─ no write of the volume in flight: spawn its writer task
//!                     └─ one in flight: wait for the next batch
//!  writer task: loop Batches::take(volume) ─▶ one merge patch of every change taken
//!      ─▶ each caller gets the object written (or, a batch failing, its own change
//!         written alone and its own answer) ─▶ nothing left: the volume is idle
//! ```
//!
//! n tickets arriving at once cost a handful of writes instead of n writes of an
//! object that grows with n (O(n²) bytes for the API server). The batch grows with the
//! load by itself, and a large VolumeAttachment (≥ 100 tickets) is written at most
//! once per 2 s ([`tessera_runtime::spacing`]), so a long burst on a volume used by
//! hundreds of nodes goes out in fewer, larger batches; a lone call on a smaller one
//! waits for nothing.
//!
//! Callers change disjoint keys of `spec.attachmentTickets` (the publish and
//! unpublish of one volume on one node hold that pair's in-flight slot, and a ticket
//! id names its volume and node), so the changes of one batch commute and a merge
//! patch without a resourceVersion is as correct as the separate patches it replaces.
//! [`Batches`] is the pure core; [`TicketWriter`] the thin I/O around it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::api::{Api, Patch};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;
use tracing::debug;

use tessera_api::VolumeAttachment;
use tessera_runtime::spacing::Spacing;
use tessera_runtime::{KubeContext, KubeError};

/// Changes to one volume's tickets: ticket id → the ticket, or `null` to remove it.
pub type Changes = BTreeMap<String, Value>;

/// The changes queued per volume, and which volumes have a write in flight. No I/O.
#[derive(Debug)]
pub struct Batches<W> {
    /// A volume is present while its writer runs; its queue is what the next write
    /// takes.
    volumes: HashMap<String, Vec<(Changes, W)>>,
}

impl<W> Default for Batches<W> {
    fn default() -> Self {
        Batches {
            volumes: HashMap::new(),
        }
    }
}

impl<W> Batches<W> {
    /// Queue `changes` of `volume` for `waiter`. True when no writer of the volume
    /// runs: the caller starts one (which then [`take`](Self::take)s until idle).
    pub fn push(&mut self, volume: &str, changes: Changes, waiter: W) -> bool {
        match self.volumes.get_mut(volume) {
            Some(queue) => {
                queue.push((changes, waiter));
                false
            }
            None => {
                self.volumes
                    .insert(volume.to_string(), vec![(changes, waiter)]);
                true
            }
        }
    }

    /// The writer's next batch: everything queued for `volume` since its last take.
    /// `None` when nothing is: the volume is idle, and the writer ends.
    pub fn take(&mut self, volume: &str) -> Option<Vec<(Changes, W)>> {
        let queue = self.volumes.get_mut(volume)?;
        if queue.is_empty() {
            self.volumes.remove(volume);
            return None;
        }
        Some(std::mem::take(queue))
    }

    /// Whether a writer of `volume` runs.
    pub fn writing(&self, volume: &str) -> bool {
        self.volumes.contains_key(volume)
    }
}

/// The merge patch writing every change of `batch` (a later change of one ticket
/// wins over an earlier one).
pub fn merged<'a>(batch: impl IntoIterator<Item = &'a Changes>) -> Value {
    let mut tickets = Map::new();
    for changes in batch {
        for (id, v) in changes {
            tickets.insert(id.clone(), v.clone());
        }
    }
    json!({"spec": {"attachmentTickets": tickets}})
}

/// What a caller waits for: the VolumeAttachment written with its change.
type Answer = Result<VolumeAttachment, KubeError>;

/// One caller in a batch: what it does (for its error) and where its answer goes.
#[derive(Debug)]
struct Waiter {
    action: String,
    answer: oneshot::Sender<Answer>,
}

/// Writes ticket changes, grouped per volume (see the module docs).
#[derive(Clone)]
pub struct TicketWriter {
    api: Api<VolumeAttachment>,
    batches: Arc<Mutex<Batches<Waiter>>>,
    /// The resourceVersion of the last object written, per volume (the newest of the
    /// answers): a cached copy at least that new shows every change of ours.
    written: Arc<Mutex<HashMap<String, u64>>>,
    /// When each large volume's next write may start.
    spacing: Arc<Spacing>,
}

impl TicketWriter {
    /// A writer patching VolumeAttachments through `api`.
    pub fn new(api: Api<VolumeAttachment>) -> Self {
        TicketWriter {
            api,
            batches: Arc::default(),
            written: Arc::default(),
            spacing: Arc::default(),
        }
    }

    /// The resourceVersion of the last VolumeAttachment of `volume` this writer wrote
    /// (0: none yet, in this process).
    pub fn last_written(&self, volume: &str) -> u64 {
        let written = self.written.lock().expect("written versions poisoned");
        written.get(volume).copied().unwrap_or(0)
    }

    /// Write `changes` to `volume`'s VolumeAttachment, together with the changes of
    /// other callers queued meanwhile; the object as written. `action` says what the
    /// change does, for the error.
    pub async fn write(&self, volume: &str, changes: Changes, action: String) -> Answer {
        let (tx, rx) = oneshot::channel();
        let start = self.batches.lock().expect("ticket batches poisoned").push(
            volume,
            changes,
            Waiter { action, answer: tx },
        );
        if start {
            // A task of its own: a caller giving up (its RPC cancelled) stops no one's
            // write.
            tokio::spawn(self.clone().run(volume.to_string()));
        }
        let answer = rx.await.unwrap_or_else(|_| {
            unreachable!("the writer answers every waiter it takes before dropping it")
        });
        if let Some(rv) = answer.as_ref().ok().and_then(crate::resource_version) {
            let mut written = self.written.lock().expect("written versions poisoned");
            let last = written.entry(volume.to_string()).or_default();
            *last = (*last).max(rv);
        }
        answer
    }

    /// The writer of `volume`: batches until none is left.
    async fn run(self, volume: String) {
        let params = super::merge_params();
        loop {
            // A large VolumeAttachment waits out the period of its last write
            // (runtime::spacing); changes arriving meanwhile join the batch.
            if let Some(left) = self.spacing.left(&volume, Instant::now()) {
                tokio::time::sleep(left).await;
            }
            let batch = self
                .batches
                .lock()
                .expect("ticket batches poisoned")
                .take(&volume);
            let Some(batch) = batch else { return };
            let patch = merged(batch.iter().map(|(c, _)| c));
            let began = Instant::now();
            let res = self
                .api
                .patch(&volume, &params, &Patch::Merge(&patch))
                .await;
            debug!(%volume, changes = batch.len(), ok = res.is_ok(), "ticket batch written");
            match res {
                Ok(va) => {
                    let tickets = va.spec.attachment_tickets.len();
                    self.spacing.wrote(&volume, began, tickets);
                    for (_, w) in batch {
                        let _ = w.answer.send(Ok(va.clone()));
                    }
                }
                // One change alone, or each change alone after a batch failed: every
                // caller gets the answer to its own change.
                Err(e) if batch.len() == 1 => {
                    let (_, w) = batch.into_iter().next().expect("one");
                    let _ = w.answer.send(Err(e).context(|| w.action.clone()));
                }
                Err(_) => {
                    for (changes, w) in batch {
                        let patch = merged([&changes]);
                        let res = self
                            .api
                            .patch(&volume, &params, &Patch::Merge(&patch))
                            .await;
                        let _ = w.answer.send(res.context(|| w.action.clone()));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn change(id: &str, v: Value) -> Changes {
        [(id.to_string(), v)].into()
    }

    #[test]
    fn the_first_change_starts_a_writer_and_the_next_ones_wait_for_its_next_batch() {
        let mut b = Batches::default();
        assert!(b.push("v", change("a", json!(1)), 1));
        assert!(!b.push("v", change("b", json!(2)), 2), "a writer runs");
        assert!(b.push("w", change("c", json!(3)), 3), "another volume");
        let first = b.take("v").unwrap();
        assert_eq!(first.iter().map(|(_, w)| *w).collect::<Vec<_>>(), [1, 2]);
        // Arriving while the first batch is written: the next batch.
        assert!(!b.push("v", change("d", json!(4)), 4));
        assert!(!b.push("v", change("e", json!(5)), 5));
        let second = b.take("v").unwrap();
        assert_eq!(second.iter().map(|(_, w)| *w).collect::<Vec<_>>(), [4, 5]);
        assert!(b.take("v").is_none(), "nothing left: idle");
        assert!(!b.writing("v"));
        assert!(b.push("v", change("f", json!(6)), 6), "idle: a new writer");
        assert!(b.writing("w"));
    }

    #[test]
    fn a_batch_is_one_patch_of_every_change() {
        let cases: [(&[(&str, Value)], Value); 4] = [
            (&[], json!({})),
            (
                &[("a", json!({"nodeID": "n1"}))],
                json!({"a": {"nodeID": "n1"}}),
            ),
            // An upsert and a removal (the idle-mount ticket swap) in one patch.
            (
                &[("csi-a", json!({"nodeID": "n1"})), ("idle-a", Value::Null)],
                json!({"csi-a": {"nodeID": "n1"}, "idle-a": null}),
            ),
            // The same ticket twice: the later change wins.
            (&[("a", json!(1)), ("a", Value::Null)], json!({"a": null})),
        ];
        for (changes, want) in cases {
            let batch: Vec<Changes> = changes
                .iter()
                .map(|(id, v)| change(id, v.clone()))
                .collect();
            assert_eq!(
                merged(&batch),
                json!({"spec": {"attachmentTickets": want}}),
                "{changes:?}"
            );
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u8),
        Take(u8),
    }

    proptest! {
        /// Whatever the interleaving: every change is written in exactly one batch, in
        /// the order pushed; at most one writer per volume; a volume whose writer found
        /// nothing to take is idle, and its next change starts a writer.
        #[test]
        fn every_change_is_taken_once_by_the_one_writer(ops in prop::collection::vec(
            prop_oneof![(0u8..3).prop_map(Op::Push), (0u8..3).prop_map(Op::Take)], 0..64)
        ) {
            let mut b = Batches::default();
            let mut writers = [false; 3];
            let mut pushed: Vec<Vec<usize>> = vec![vec![]; 3];
            let mut taken: Vec<Vec<usize>> = vec![vec![]; 3];
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Push(v) => {
                        let v = usize::from(v);
                        let start = b.push(&v.to_string(), change(&i.to_string(), json!(i)), i);
                        prop_assert_eq!(start, !writers[v], "a writer starts iff none runs");
                        writers[v] = true;
                        pushed[v].push(i);
                    }
                    // Only a running writer takes.
                    Op::Take(v) if writers[usize::from(v)] => {
                        let v = usize::from(v);
                        match b.take(&v.to_string()) {
                            Some(batch) => {
                                prop_assert!(!batch.is_empty());
                                taken[v].extend(batch.into_iter().map(|(_, w)| w));
                            }
                            None => writers[v] = false,
                        }
                    }
                    Op::Take(_) => {}
                }
            }
            // The writers drain what is left.
            for (v, running) in writers.into_iter().enumerate() {
                if running {
                    while let Some(batch) = b.take(&v.to_string()) {
                        taken[v].extend(batch.into_iter().map(|(_, w)| w));
                    }
                }
                prop_assert!(!b.writing(&v.to_string()));
            }
            prop_assert_eq!(pushed, taken);
        }
    }
}
