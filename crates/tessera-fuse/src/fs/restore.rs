//! A successor's side of a daemon handoff: serve again what a predecessor's
//! [`Records`] say the kernel refers to, and keep recording from then on.
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

use super::handles::{DirStream, Handle};
use super::record::{HandleKind, HandleSlot, Recorder, Records};
use super::{FileKind, IoMode, Result, VolumeFs, lock};
use crate::sys::{self, Op};

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
