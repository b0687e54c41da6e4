//! The open-handle table: file handle (`fh`) → open file or directory, with the I/O
//! mode of a file and the reading position of a directory.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::inodes::Inode;
use super::record::{HandleKind, HandleSlot, Recorder};
use super::{FsError, IoMode, NodeId, Result, VolumeFs};

/// An open file or directory.
#[derive(Debug)]
pub struct Handle {
    pub(super) inode: Arc<Inode>,
    /// The backing file or directory, opened for I/O.
    pub(super) file: OwnedFd,
    /// The [`IoMode`], which may fall back from passthrough to cached once.
    pub(super) mode: AtomicU8,
    pub(super) writable: bool,
    pub(super) append: bool,
    /// Where reading stopped, for a directory.
    pub(super) dir: Option<Mutex<DirStream>>,
}

impl Handle {
    /// The backing file, for registering it with the kernel for passthrough.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    pub fn mode(&self) -> IoMode {
        IoMode::from_u8(self.mode.load(Ordering::Acquire))
    }

    pub fn ino(&self) -> NodeId {
        self.inode.id
    }
}

/// Position in a directory being read, kept between `readdir` calls.
#[derive(Debug)]
pub(super) struct DirStream {
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// The offset the next entry in `buf[start..end]` is at.
    pub(super) pos: i64,
}

/// The buffer a directory stream reads entries into, allocated by its first readdir.
pub(super) const DIR_BUF: usize = 32 * 1024;

impl DirStream {
    /// At the start; a `readdir` at another offset seeks there first (which is how a
    /// successor daemon's stream resumes where the kernel's offset says). No buffer
    /// yet: a stream costs its [`DIR_BUF`] only once it is read, so a successor that
    /// restores every stream its predecessor had open (an application may hold
    /// hundreds) does not pay for them all at once — a daemon OOM-killed for those
    /// buffers was OOM-killed again by each successor restoring them.
    pub(super) fn new() -> Self {
        DirStream {
            buf: Vec::new(),
            start: 0,
            end: 0,
            pos: 0,
        }
    }
}

/// What the handoff state file keeps of an open handle besides the handle itself.
#[derive(Debug, Clone, Copy)]
struct Recorded {
    flags: i32,
    backing_id: Option<u32>,
    slot: Option<u32>,
}

/// An entry of the table.
#[derive(Debug)]
struct Entry {
    handle: Arc<Handle>,
    rec: Recorded,
}

/// The open handles of a mount, by `fh`.
#[derive(Debug)]
pub(super) struct HandleTable {
    handles: RwLock<HashMap<u64, Entry>>,
    next_fh: AtomicU64,
    /// Where every change is recorded (the handoff's state file; see `record`).
    state: OnceLock<Arc<dyn Recorder>>,
}

fn slot_of(fh: u64, h: &Handle, rec: Recorded) -> HandleSlot {
    HandleSlot {
        fh,
        ino: h.inode.id,
        flags: rec.flags,
        mode: h.mode() as u8,
        backing_id: rec.backing_id,
        kind: if h.dir.is_some() {
            HandleKind::Dir
        } else {
            HandleKind::File
        },
    }
}

impl HandleTable {
    pub(super) fn new() -> Self {
        HandleTable {
            handles: RwLock::default(),
            next_fh: AtomicU64::new(1),
            state: OnceLock::new(),
        }
    }

    /// Record every handle in `state` from now on, starting with those open now.
    pub(super) fn record_into(&self, state: Arc<dyn Recorder>) {
        let mut t = self.handles.write().unwrap_or_else(|p| p.into_inner());
        for (fh, e) in t.iter_mut() {
            if e.rec.slot.is_none() {
                e.rec.slot = state.add_handle(&slot_of(*fh, &e.handle, e.rec));
            }
        }
        let _ = self.state.set(state);
    }

    /// Put back handle `fh` of a predecessor daemon, with the same number.
    pub(super) fn restore(&self, fh: u64, handle: Handle, flags: i32, backing_id: Option<u32>) {
        self.next_fh.fetch_max(fh + 1, Ordering::Relaxed);
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                fh,
                Entry {
                    handle: Arc::new(handle),
                    rec: Recorded {
                        flags,
                        backing_id,
                        slot: None,
                    },
                },
            );
    }

    /// `fh`'s open has a kernel passthrough backing id.
    pub(super) fn set_backing_id(&self, fh: u64, id: u32) {
        let mut t = self.handles.write().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = t.get_mut(&fh) {
            e.rec.backing_id = Some(id);
            if let (Some(slot), Some(state)) = (e.rec.slot, self.state.get()) {
                state.set_backing_id(slot, id);
            }
        }
    }

    /// `fh`'s I/O mode changed.
    pub(super) fn mode_changed(&self, fh: u64) {
        let t = self.handles.read().unwrap_or_else(|p| p.into_inner());
        if let (Some(e), Some(state)) = (t.get(&fh), self.state.get())
            && let Some(slot) = e.rec.slot
        {
            state.set_handle_mode(slot, e.handle.mode() as u8);
        }
    }

    pub(super) fn get(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .map(|e| e.handle.clone())
            .ok_or(FsError::UnknownHandle(fh))
    }

    /// Add an open handle, opened with `flags`; returns its new `fh`.
    pub(super) fn add(&self, handle: Handle, flags: i32) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let mut rec = Recorded {
            flags,
            backing_id: None,
            slot: None,
        };
        if let Some(state) = self.state.get() {
            rec.slot = state.add_handle(&slot_of(fh, &handle, rec));
        }
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                fh,
                Entry {
                    handle: Arc::new(handle),
                    rec,
                },
            );
        fh
    }

    /// Whether any handle of inode `ino` is open.
    pub(super) fn any_open(&self, ino: NodeId) -> bool {
        self.handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|e| e.handle.inode.id == ino)
    }

    /// Remove `fh` (release); the file closes when the last user lets go.
    pub(super) fn take(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh)
            .map(|e| {
                if let (Some(slot), Some(state)) = (e.rec.slot, self.state.get()) {
                    state.remove_handle(slot);
                }
                e.handle
            })
            .ok_or(FsError::UnknownHandle(fh))
    }
}

impl VolumeFs {
    /// The open file or directory `fh`.
    pub fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles.get(fh)
    }
}
