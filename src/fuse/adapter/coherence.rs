//! Close-to-open on a shared backend: every open drops the kernel's cached
//! attributes of the file (FUSE_NOTIFY_INVAL_INODE, attributes only), so the first
//! read or stat after it asks the daemon, which stats the backing file. Without it,
//! a file another node rewrote within the attribute lifetime is read up to its old,
//! cached size (the data of a non-passthrough open is dropped at open anyway, as
//! Tessera never sets FOPEN_KEEP_CACHE; FUSE_AUTO_INVAL_DATA drops it again when the
//! fresh mtime or size differs).

use std::sync::{Arc, OnceLock};

use fuser::{INodeNo, Notifier};

use super::Adapter;

impl Adapter {
    /// Where the session's notifier goes once the session exists (the adapter is
    /// built before it).
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// Drop the cached attributes of `ino` before the open of it is answered.
    pub(super) fn revalidate(&self, ino: INodeNo) {
        if !self.options.close_to_open {
            return;
        }
        if let Some(n) = self.notifier.get()
            && let Err(e) = n.inval_inode(ino, -1, 0)
        {
            // ENOENT: the kernel no longer holds the inode; nothing to drop.
            if e.raw_os_error() != Some(libc::ENOENT) {
                tracing::debug!(ino = ino.0, error = %e, "invalidating cached attributes");
            }
        }
    }
}
