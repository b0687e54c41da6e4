//! Kernel passthrough backing ids: one per inode, registered at its first
//! passthrough open, shared by that inode's passthrough opens and unregistered with
//! the last of them; recorded in the handoff state, and taken over from a
//! predecessor daemon by a successor ([`BackingAdopter`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use fuser::{BackingId, Notifier};

use super::super::fs::{Opened, VolumeFs};
use super::Adapter;

/// Backing ids registered with the kernel for passthrough.
#[derive(Debug, Default)]
pub(super) struct Backing {
    /// The inode's id while any passthrough open holds it (the kernel refuses two
    /// different backing files for one inode).
    by_ino: HashMap<u64, Weak<BackingId>>,
    by_fh: HashMap<u64, Arc<BackingId>>,
}

impl Adapter {
    /// What takes over a predecessor daemon's passthrough backing ids once the
    /// session (and so the connection's notifier) exists.
    pub fn backing_adopter(&self) -> BackingAdopter {
        BackingAdopter(self.backing.clone())
    }

    /// The kernel's backing id for `fh`'s inode: the inode's existing one, or a new
    /// registration of `fh`'s backing file.
    pub(super) fn backing_id(
        &self,
        opened: Opened,
        register: impl FnOnce(&VolumeFs) -> std::io::Result<BackingId>,
    ) -> Result<Arc<BackingId>, std::io::Error> {
        let handle = self.fs.handle(opened.fh).map_err(std::io::Error::other)?;
        let mut b = self.backing.lock().unwrap_or_else(|p| p.into_inner());
        let id = match b.by_ino.get(&handle.ino()).and_then(Weak::upgrade) {
            Some(id) => id,
            None => {
                let id = Arc::new(register(&self.fs)?);
                b.by_ino.insert(handle.ino(), Arc::downgrade(&id));
                id
            }
        };
        b.by_fh.insert(opened.fh, id.clone());
        self.fs.note_backing_id(opened.fh, id.id());
        Ok(id)
    }

    /// Registering a backing file failed: fall back to cached I/O for this open, and
    /// stop trying passthrough if the kernel will never accept it.
    pub(super) fn passthrough_failed(&self, fh: u64, err: &std::io::Error) {
        let _ = self.fs.passthrough_failed(fh);
        let permanent = matches!(
            err.raw_os_error(),
            Some(libc::EPERM | libc::ENOTTY | libc::EOPNOTSUPP | libc::ENOSYS | libc::ELOOP)
        );
        if permanent {
            self.fs.set_passthrough(false);
        }
        tracing::warn!(fh, error = %err, permanent, "kernel passthrough refused; using cached I/O");
    }

    /// `fh` is released: the inode's last passthrough open unregisters its backing
    /// file from the kernel.
    pub(super) fn release_backing(&self, fh: u64) {
        if let Ok(handle) = self.fs.handle(fh) {
            let mut b = self.backing.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(id) = b.by_fh.remove(&fh)
                && Arc::strong_count(&id) == 1
            {
                // Dropping `id` unregisters the backing file.
                b.by_ino.remove(&handle.ino());
            }
        }
    }
}

/// Takes over the passthrough backing ids a predecessor daemon registered on the
/// connection (see [`Adapter::backing_adopter`]): the inode's later passthrough opens
/// share them, and the last release unregisters them, as if this daemon had
/// registered them.
#[derive(Debug)]
pub struct BackingAdopter(Arc<Mutex<Backing>>);

impl BackingAdopter {
    /// `fh` (of inode `ino`) was opened with backing id `id`.
    pub fn adopt(&self, notifier: &Notifier, fh: u64, ino: u64, id: u32) {
        let mut b = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let shared = b
            .by_ino
            .get(&ino)
            .and_then(Weak::upgrade)
            .filter(|held| held.id() == id);
        let held = match shared {
            Some(held) => held,
            None => {
                // SAFETY: the predecessor registered `id` on this connection and is
                // gone; nothing else closes it.
                let held = Arc::new(unsafe { notifier.wrap_backing(id) });
                b.by_ino.insert(ino, Arc::downgrade(&held));
                held
            }
        };
        b.by_fh.insert(fh, held);
    }
}
