//! The write journal: a WRITE the kernel resends after a takeover is not applied a
//! second time.
//!
//! ```text
//!  WRITE (unique U) ─▶ begin: slot {U, fh, offset, len, size before, append} "in progress"
//!                      pwrite ─▶ applied: "n bytes"
//!                      reply  ─▶ clear (the guard's drop)
//!  ✗ dies between pwrite and reply: the kernel resends U (FUSE_NOTIFY_RESEND, resend bit)
//!  successor: the predecessor's slots carried into its own journal (so a third daemon
//!             still finds them) ─▶ resent U: [`replay`] decides from the slot
//! ```
//!
//! The slots live in the handoff state file (`Recorder::journal_*`), so recording
//! costs plain memory stores; without `--handoff-state` nothing is recorded. The
//! decision ([`replay`]) is pure: an applied write is answered with its count; a write
//! at an explicit offset still in progress is written again (the same bytes at the
//! same place); an append still in progress is looked for where it would have landed
//! (the size recorded before it): found whole, it is answered; found in part where
//! the file ends, the rest is appended; otherwise it is written.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::lock;
use super::record::{JournalSlot, Recorder};

/// What a resent WRITE does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Not applied, or harmless to apply again: write as any request.
    Write,
    /// Applied: answer with this count, write nothing.
    Answer(usize),
    /// The first `skip` bytes of an append landed: append the rest, answer the whole.
    Rest { skip: usize },
}

/// What to do with a resent WRITE of `len` bytes on `fh` whose predecessor's slot is
/// `slot` (`None`: none recorded, i.e. the predecessor never began writing it).
/// `landed`: how many leading bytes of the data the backing file holds at
/// `slot.size_before`, and `size` its size now (only looked at for an append in
/// progress). A part of an append counts as landed only where the file ends: bytes
/// followed by more are taken for another writer's that happen to start alike.
pub fn replay(slot: Option<&JournalSlot>, fh: u64, len: usize, landed: usize, size: u64) -> Replay {
    let Some(s) = slot else {
        return Replay::Write;
    };
    if s.fh != fh || s.len != len as u64 {
        return Replay::Write;
    }
    match (s.applied, s.append) {
        (Some(n), _) => Replay::Answer(n.min(len as u64) as usize),
        (None, false) => Replay::Write,
        (None, true) if landed >= len => Replay::Answer(len),
        (None, true) if landed > 0 && size == s.size_before + landed as u64 => {
            Replay::Rest { skip: landed }
        }
        (None, true) => Replay::Write,
    }
}

/// The journal of one daemon: its state file, and the slots carried over from a
/// predecessor, by unique, until the kernel resends them.
#[derive(Debug, Default)]
pub(super) struct Journal {
    state: OnceLock<Arc<dyn Recorder>>,
    carried: Mutex<HashMap<u64, (JournalSlot, Option<u32>)>>,
}

/// A WRITE recorded in flight: dropped once answered, which empties its slot.
#[derive(Debug)]
pub struct Journaled {
    state: Arc<dyn Recorder>,
    slot: u32,
}

impl Journaled {
    /// The data is written: `n` bytes.
    pub(super) fn applied(&self, n: usize) {
        self.state.journal_applied(self.slot, n as u64);
    }
}

impl Drop for Journaled {
    fn drop(&mut self) {
        self.state.journal_clear(self.slot);
    }
}

impl Journal {
    /// A predecessor's slots, kept until the kernel resends their requests.
    pub(super) fn restore(&self, slots: &[JournalSlot]) {
        let mut map = lock(&self.carried);
        for s in slots {
            tracing::debug!(slot = ?s, "a WRITE the predecessor had begun and not answered");
            map.insert(s.unique, (*s, None));
        }
    }

    /// Record in `state` from now on, starting with the carried slots (so a daemon
    /// after this one still finds them).
    pub(super) fn record_into(&self, state: Arc<dyn Recorder>) {
        for (rec, slot) in lock(&self.carried).values_mut() {
            *slot = state.journal_begin(rec);
        }
        let _ = self.state.set(state);
    }

    /// Record a WRITE before its data is written (`None`: no state file, or no slot
    /// free even after dropping the carried ones).
    pub(super) fn begin(&self, rec: &JournalSlot) -> Option<Journaled> {
        let state = self.state.get()?;
        let slot = match state.journal_begin(rec) {
            Some(s) => s,
            None => {
                // Full: what a predecessor left that was never resent goes first.
                let mut carried = lock(&self.carried);
                for (_, (_, slot)) in carried.drain() {
                    if let Some(slot) = slot {
                        state.journal_clear(slot);
                    }
                }
                drop(carried);
                state.journal_begin(rec)?
            }
        };
        Some(Journaled {
            state: state.clone(),
            slot,
        })
    }

    /// The predecessor's slot of the resent request `unique`, taken out of the
    /// carried ones; its state-file slot stays filled until `Journaled` drops it.
    pub(super) fn take_carried(&self, unique: u64) -> Option<(JournalSlot, Option<Journaled>)> {
        let (rec, slot) = lock(&self.carried).remove(&unique)?;
        let guard = match (slot, self.state.get()) {
            (Some(slot), Some(state)) => Some(Journaled {
                state: state.clone(),
                slot,
            }),
            _ => None,
        };
        Some((rec, guard))
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::{HandleSlot, InodeSlot};
    use super::*;

    fn slot(append: bool, applied: Option<u64>) -> JournalSlot {
        JournalSlot {
            unique: 42,
            fh: 7,
            offset: 100,
            len: 16,
            size_before: 100,
            append,
            applied,
        }
    }

    #[test]
    fn a_resent_write_is_applied_once() {
        use Replay::*;
        // (what, slot, fh, landed, size now, decision); the slot: 16 bytes at 100.
        type Case = (&'static str, Option<JournalSlot>, u64, usize, u64, Replay);
        let cases: &[Case] = &[
            ("never begun", None, 7, 0, 116, Write),
            (
                "applied",
                Some(slot(false, Some(16))),
                7,
                0,
                116,
                Answer(16),
            ),
            (
                "applied append",
                Some(slot(true, Some(16))),
                7,
                0,
                116,
                Answer(16),
            ),
            (
                "applied short",
                Some(slot(true, Some(9))),
                7,
                0,
                109,
                Answer(9),
            ),
            (
                "offset write in progress",
                Some(slot(false, None)),
                7,
                16,
                116,
                Write,
            ),
            (
                "append begun, nothing landed",
                Some(slot(true, None)),
                7,
                0,
                100,
                Write,
            ),
            (
                "append begun, landed whole",
                Some(slot(true, None)),
                7,
                16,
                116,
                Answer(16),
            ),
            (
                "landed whole, more after",
                Some(slot(true, None)),
                7,
                16,
                140,
                Answer(16),
            ),
            (
                "append begun, landed in part",
                Some(slot(true, None)),
                7,
                5,
                105,
                Rest { skip: 5 },
            ),
            (
                "a like start of another's",
                Some(slot(true, None)),
                7,
                5,
                116,
                Write,
            ),
            (
                "another handle",
                Some(slot(true, Some(16))),
                8,
                0,
                116,
                Write,
            ),
        ];
        for (what, s, fh, landed, size, want) in cases {
            assert_eq!(replay(s.as_ref(), *fh, 16, *landed, *size), *want, "{what}");
        }
        assert_eq!(
            replay(Some(&slot(true, Some(16))), 7, 15, 0, 116),
            Write,
            "another length"
        );
    }

    /// A recorder with room for [`FakeRecorder::SLOTS`] journal entries.
    #[derive(Debug, Default)]
    struct FakeRecorder {
        journal: Mutex<Vec<u32>>,
        next: std::sync::atomic::AtomicU32,
    }

    impl FakeRecorder {
        const SLOTS: usize = 8;
    }

    impl Recorder for FakeRecorder {
        fn add_inode(&self, _: &InodeSlot) -> Option<u32> {
            None
        }
        fn set_lookups(&self, _: u32, _: u64) {}
        fn remove_inode(&self, _: u32) {}
        fn add_handle(&self, _: &HandleSlot) -> Option<u32> {
            None
        }
        fn set_handle_mode(&self, _: u32, _: u8) {}
        fn set_backing_id(&self, _: u32, _: u32) {}
        fn remove_handle(&self, _: u32) {}
        fn journal_begin(&self, _: &JournalSlot) -> Option<u32> {
            use std::sync::atomic::Ordering;
            if let Some(slot) = lock(&self.journal).pop() {
                return Some(slot);
            }
            let slot = self.next.fetch_add(1, Ordering::Relaxed);
            if (slot as usize) < Self::SLOTS {
                Some(slot)
            } else {
                self.next.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
        fn journal_applied(&self, _: u32, _: u64) {}
        fn journal_clear(&self, slot: u32) {
            lock(&self.journal).push(slot);
        }
    }

    #[test]
    fn carried_slots_are_kept_until_resent_and_freed_when_full() {
        let state: Arc<dyn Recorder> = Arc::new(FakeRecorder::default());
        let j = Journal::default();
        j.restore(&[slot(true, Some(16))]);
        j.record_into(state.clone());
        // Every slot taken: the carried one is given up for a new write.
        let mut held = Vec::new();
        while let Some(g) = j.begin(&JournalSlot {
            unique: 1000 + held.len() as u64,
            ..slot(false, None)
        }) {
            held.push(g);
            if held.len() > FakeRecorder::SLOTS {
                break;
            }
        }
        assert_eq!(held.len(), FakeRecorder::SLOTS);
        assert!(j.take_carried(42).is_none());
        drop(held);
        let j = Journal::default();
        j.restore(&[slot(true, Some(16))]);
        j.record_into(state);
        let (rec, guard) = j.take_carried(42).unwrap();
        assert_eq!(rec.applied, Some(16));
        assert!(guard.is_some());
        assert!(j.take_carried(42).is_none(), "taken once");
    }
}
