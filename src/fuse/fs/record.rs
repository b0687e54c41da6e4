//! What the core records of the kernel's references, so that a successor daemon can
//! serve them again (see `crate::fuse::handoff`): the record types, the [`Recorder`]
//! the inode, handle and journal tables write every change through, and the restore
//! of a predecessor's [`Records`].
//!
//! ```text
//!  inodes / handles / journal ──Recorder (add, set, remove)──▶ handoff::state::StateFile
//!  successor: handoff::state::read ──Records──▶ VolumeFs::restore ──▶ the same tables
//! ```
//!
//! The core owns these types and knows nothing of where they are kept; the handoff
//! implements [`Recorder`] over its state file and hands [`Records`] back, so the
//! handoff depends on the core and not the other way round.
//!
//! A restored open file is reopened from its inode with the flags it was opened with
//! (creation and truncation flags dropped, as for any backing open), keeps its `fh`
//! and I/O mode, and is counted in its inode's I/O state as the open was. A directory
//! handle is reopened at its start: the kernel's next `readdir` carries its offset,
//! and the stream seeks there. The predecessor's write journal is carried over (see
//! `journal`).

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU8;

use super::dirs::DirStream;
use super::fhandle::FileHandle;
use super::handles::Handle;
use super::{FileKind, IoMode, Result, VolumeFs, lock};
use crate::fuse::sys::{self, Op};

/// One inode the kernel holds, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeSlot {
    pub id: u64,
    pub key: (u64, u64),
    pub kind: u8,
    pub handle: Option<FileHandle>,
    pub lookups: u64,
}

/// What an open handle was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleKind {
    File,
    Dir,
}

/// One open file or directory, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleSlot {
    pub fh: u64,
    pub ino: u64,
    pub flags: i32,
    /// `IoMode as u8`.
    pub mode: u8,
    pub backing_id: Option<u32>,
    pub kind: HandleKind,
}

/// One WRITE request in flight, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalSlot {
    /// The request's `unique`, without the kernel's resend bit (never 0).
    pub unique: u64,
    pub fh: u64,
    pub offset: u64,
    pub len: u64,
    /// The backing file's size before the write (where an append lands).
    pub size_before: u64,
    pub append: bool,
    /// `Some(n)`: the data was written, `n` bytes; `None`: in progress.
    pub applied: Option<u64>,
}

/// Every record of a predecessor, as a successor restores them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    pub inodes: Vec<InodeSlot>,
    pub handles: Vec<HandleSlot>,
    pub journal: Vec<JournalSlot>,
}

/// Where the tables record their changes as they happen (the handoff's state file).
/// A record added gets a slot number, by which it is later changed or removed;
/// `None` when there is no room (for inodes and handles, the recorder then says a
/// takeover is impossible; an unrecorded journal entry only loses its replay check).
/// Calls are plain memory stores in the one implementation: they are made with the
/// tables' locks held.
pub trait Recorder: std::fmt::Debug + Send + Sync {
    /// Record a new inode.
    fn add_inode(&self, rec: &InodeSlot) -> Option<u32>;
    /// The kernel's lookup count of the inode in `slot`.
    fn set_lookups(&self, slot: u32, lookups: u64);
    /// The inode in `slot` is forgotten.
    fn remove_inode(&self, slot: u32);
    /// Record a new open handle.
    fn add_handle(&self, rec: &HandleSlot) -> Option<u32>;
    /// The I/O mode (`IoMode as u8`) of the handle in `slot`.
    fn set_handle_mode(&self, slot: u32, mode: u8);
    /// The kernel passthrough backing id of the handle in `slot`.
    fn set_backing_id(&self, slot: u32, id: u32);
    /// The handle in `slot` is released.
    fn remove_handle(&self, slot: u32);
    /// Record a WRITE in flight, before its data is written.
    fn journal_begin(&self, rec: &JournalSlot) -> Option<u32>;
    /// The WRITE of `slot` is done: `n` bytes.
    fn journal_applied(&self, slot: u32, n: u64);
    /// The WRITE of `slot` is answered: forget it.
    fn journal_clear(&self, slot: u32);
}

/// What a successor got back of a predecessor's state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub inodes: usize,
    pub inodes_lost: usize,
    pub handles: usize,
    pub handles_lost: usize,
    /// WRITE requests the predecessor had begun and not answered (journaled).
    pub writes_in_flight: usize,
}

impl VolumeFs {
    /// Record the inode, handle and journal tables in `state` from now on.
    pub fn record_into(&self, state: Arc<dyn Recorder>) {
        self.inodes.record_into(state.clone());
        self.handles.record_into(state.clone());
        self.journal.record_into(state);
    }

    /// `fh`'s passthrough open uses the kernel's backing id `id`.
    pub fn note_backing_id(&self, fh: u64, id: u32) {
        self.handles.set_backing_id(fh, id);
    }

    /// Serve again what a predecessor's state says the kernel holds. Inodes first,
    /// then the handles that refer to them. What cannot be reopened (freed since, or
    /// never named by a handle) is counted as lost: the kernel's requests on it fail
    /// with ESTALE or EBADF, as they would on a freed inode.
    pub fn restore(&self, snap: &Records) -> Restored {
        let mut r = Restored {
            writes_in_flight: snap.journal.len(),
            ..Restored::default()
        };
        self.journal.restore(&snap.journal);
        for rec in &snap.inodes {
            match self.inodes.restore(rec) {
                Ok(()) => r.inodes += 1,
                Err(e) => {
                    r.inodes_lost += 1;
                    tracing::warn!(id = rec.id, error = %e, "inode not restored");
                }
            }
        }
        for h in &snap.handles {
            match self.restore_handle(h) {
                Ok(()) => r.handles += 1,
                Err(e) => {
                    r.handles_lost += 1;
                    tracing::warn!(fh = h.fh, ino = h.ino, error = %e, "open handle not restored");
                }
            }
        }
        r
    }

    fn restore_handle(&self, rec: &HandleSlot) -> Result<()> {
        let inode = self.inode(rec.ino)?;
        let handle = match rec.kind {
            HandleKind::Dir => {
                let file = sys::openat(
                    self.fd(&inode)?.as_fd(),
                    c".",
                    libc::O_RDONLY | libc::O_DIRECTORY,
                    0,
                )
                .op("opendir")?;
                Handle {
                    inode,
                    file,
                    mode: AtomicU8::new(IoMode::Cached as u8),
                    writable: false,
                    append: false,
                    dir: Some(Mutex::new(DirStream::new())),
                }
            }
            HandleKind::File => {
                if inode.kind != FileKind::Regular {
                    return Err(super::FsError::WrongType("open"));
                }
                let file = sys::reopen(
                    self.proc_fd.as_fd(),
                    self.fd(&inode)?.as_fd(),
                    Self::backing_flags(rec.flags),
                )
                .op("open")?;
                let mode = IoMode::from_u8(rec.mode);
                {
                    let mut io = lock(&inode.io);
                    io.open += 1;
                    match mode {
                        IoMode::Passthrough => io.passthrough += 1,
                        IoMode::Cached => io.cached += 1,
                        IoMode::Direct => {}
                    }
                }
                Handle {
                    inode,
                    file,
                    mode: AtomicU8::new(mode as u8),
                    writable: rec.flags & libc::O_ACCMODE != libc::O_RDONLY,
                    append: rec.flags & libc::O_APPEND != 0,
                    dir: None,
                }
            }
        };
        self.handles
            .restore(rec.fh, handle, rec.flags, rec.backing_id);
        Ok(())
    }
}
