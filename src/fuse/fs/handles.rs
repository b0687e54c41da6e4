//! The open-handle table: file handle (`fh`) → open file or directory, with the I/O
//! mode of a file and the reading position of a directory.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::dirs::DirStream;
use super::inodes::Inode;
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

/// The open handles of a mount, by `fh`.
#[derive(Debug)]
pub(super) struct HandleTable {
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
}

impl HandleTable {
    pub(super) fn new() -> Self {
        HandleTable {
            handles: RwLock::default(),
            next_fh: AtomicU64::new(1),
        }
    }

    pub(super) fn get(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(FsError::UnknownHandle(fh))
    }

    /// Add an open handle; returns its new `fh`.
    pub(super) fn add(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(handle));
        fh
    }

    /// Whether any handle of inode `ino` is open.
    pub(super) fn any_open(&self, ino: NodeId) -> bool {
        self.handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|h| h.inode.id == ino)
    }

    /// Remove `fh` (release); the file closes when the last user lets go.
    pub(super) fn take(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh)
            .ok_or(FsError::UnknownHandle(fh))
    }
}

impl VolumeFs {
    /// The open file or directory `fh`.
    pub fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles.get(fh)
    }
}
