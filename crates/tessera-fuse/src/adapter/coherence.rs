//! Coherence with other nodes on a shared backend, as NFS gives it:
//!
//! - close-to-open: every open drops the kernel's cached attributes of the file
//!   (FUSE_NOTIFY_INVAL_INODE, attributes only), so the first read or stat after it
//!   asks the daemon, which stats the backing file. Without it, a file another node
//!   rewrote within the attribute lifetime is read up to its old, cached size (the
//!   data of a non-passthrough open is dropped at open anyway, as Tessera never sets
//!   FOPEN_KEEP_CACHE; FUSE_AUTO_INVAL_DATA drops it again when the fresh mtime or
//!   size differs);
//! - an open of a name this kernel still caches (the entry lifetime) whose backing
//!   file another node has since deleted or replaced is answered ESTALE, so the
//!   kernel looks the name up again (LOOKUP_REVAL) and opens, or creates, what the
//!   name is now, as NFS's open revalidates it. Without it, SQLite's `O_CREAT` open of
//!   its journal, deleted and created anew by another node a moment before, wrote into
//!   the deleted file, and the journal's unlink then failed (a disk I/O error);
//! - lock-to-read: taking a lock drops the file's cached attributes and pages before
//!   the lock is answered, so what another node wrote under its lock is what is read
//!   under this one, by a process that kept the file open all along (SQLite).
//!   Writes need nothing: without a writeback cache they reach the daemon, and the
//!   backend, before `write` returns.

use std::sync::{Arc, OnceLock};

use fuser::{INodeNo, Notifier};

use super::{Adapter, OVERLAYFS_SUPER_MAGIC};

/// Local filesystems, where closing a file does nothing a later reader on another
/// node could depend on: no FLUSH round trip on close for them.
const LOCAL_FILESYSTEMS: [i64; 7] = [
    0xef53,      // ext2/3/4
    0x5846_5342, // xfs
    0x9123_683e, // btrfs
    0x0102_1994, // tmpfs
    OVERLAYFS_SUPER_MAGIC,
    0xf2f5_2010, // f2fs
    0x2fc1_2fc1, // zfs
];

/// Whether a backing filesystem (statfs `f_type`) is local to this node.
pub fn is_local_fs(fs_type: i64) -> bool {
    LOCAL_FILESYSTEMS.contains(&fs_type)
}

impl Adapter {
    /// Where the session's notifier goes once the session exists (the adapter is
    /// built before it).
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// Drop the cached attributes of `ino` before the open of it is answered.
    pub(super) fn revalidate(&self, ino: INodeNo) {
        if self.options.close_to_open {
            invalidate(&self.notifier, ino, -1);
        }
    }

    /// Whether an open of `ino` must be refused with ESTALE: on a shared backend, its
    /// backing file is in no directory any more (another node deleted or replaced
    /// it). The kernel then retries the open with a fresh lookup of the name; a file
    /// opened through /proc/<pid>/fd after its deletion gets ESTALE itself.
    pub(super) fn stale(&self, ino: INodeNo) -> bool {
        self.options.close_to_open && self.fs.getattr(ino.0, None).is_ok_and(|a| a.nlink == 0)
    }

    /// What drops the cached attributes and pages of `ino` once a lock on it is
    /// taken (None on a node-local backend); called before the lock is answered.
    pub(super) fn on_lock_taken(&self, ino: INodeNo) -> Option<impl FnOnce() + Send + use<>> {
        let notifier = self.notifier.clone();
        self.options
            .close_to_open
            .then_some(move || invalidate(&notifier, ino, 0))
    }
}

/// FUSE_NOTIFY_INVAL_INODE: the attributes of `ino`, and its pages from `offset` on
/// (none when negative).
fn invalidate(notifier: &OnceLock<Notifier>, ino: INodeNo, offset: i64) {
    if let Some(n) = notifier.get()
        && let Err(e) = n.inval_inode(ino, offset, 0)
    {
        // ENOENT: the kernel no longer holds the inode; nothing to drop.
        if e.raw_os_error() != Some(libc::ENOENT) {
            tracing::debug!(ino = ino.0, error = %e, "invalidating the kernel's cache");
        }
    }
}
