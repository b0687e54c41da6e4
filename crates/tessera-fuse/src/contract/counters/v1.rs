//! The previous layout of the counters file (`TSRFUSE1`, until durations were added),
//! read by the agent so that a daemon of the previous release, still serving its mount
//! during an upgrade, keeps its counters exported. Never written: a daemon replaces a
//! v1 file with one of the current layout.
//!
//! A header slot with [`MAGIC`] and the slot count ([`SLOTS`]), then one 64-byte slot
//! per counter: the operations (the first [`N_OPS`] kinds of [`Op::ALL`], in that
//! order), the errno classes ([`ErrnoClass::ALL`]), then read bytes, written bytes,
//! quota used and quota limit. Frozen: this file describes what old daemons write.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{ErrnoClass, FILE_LEN, Op, Snapshot};

/// "TSRFUSE1".
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSRFUSE1");
/// Operation kinds in a v1 file.
pub const N_OPS: usize = 22;
/// Errno classes in a v1 file.
pub const N_ERRNOS: usize = 9;
/// Every slot of a v1 file: operations, errno classes, four more.
pub const SLOTS: usize = N_OPS + N_ERRNOS + 4;

// A kind or class of the v1 file means the same in the current lists (a new one may
// only be appended, under a new magic).
const _: () = assert!(Op::ALL.len() >= N_OPS && ErrnoClass::ALL.len() >= N_ERRNOS);

/// One counter on a cache line of its own.
#[repr(C, align(64))]
struct Cell(AtomicU64);

/// The v1 layout.
#[repr(C)]
pub struct Table {
    header: [AtomicU64; 8],
    cells: [Cell; SLOTS],
}

const _: () = assert!(size_of::<Table>() <= FILE_LEN);

impl Table {
    /// The values now, if this is a v1 table.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let valid = self.header[0].load(Ordering::Acquire) == MAGIC
            && self.header[1].load(Ordering::Relaxed) == SLOTS as u64;
        if !valid {
            return None;
        }
        let v = |i: usize| self.cells[i].0.load(Ordering::Relaxed);
        let base = N_OPS + N_ERRNOS;
        Some(Snapshot {
            ops: std::array::from_fn(|i| if i < N_OPS { v(i) } else { 0 }),
            errors: std::array::from_fn(|i| if i < N_ERRNOS { v(N_OPS + i) } else { 0 }),
            read_bytes: v(base),
            written_bytes: v(base + 1),
            quota_used: v(base + 2),
            quota_limit: v(base + 3),
            durations: None,
        })
    }
}
