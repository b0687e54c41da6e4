//! The inode table: node id ⇄ `O_PATH` descriptor of the backing inode, keyed by
//! (dev, ino), with the kernel's lookup count of each.
//!
//! The kernel names files by node id. Each id the kernel holds maps to an
//! `O_PATH|O_NOFOLLOW` descriptor of the backing inode, opened from the descriptor of
//! its parent by a single name component. Ids are the backing inode numbers (so `stat`
//! and `readdir` agree with each other and with the backing directory), except the
//! root, which FUSE fixes at 1, and the rare inode of another device or a colliding
//! number, which gets an id from a private range. An entry lives while the kernel's
//! lookup count on it is above zero (`forget`). Holding the fd keeps the backing inode
//! from being freed, so a number is never reused while the kernel still knows it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex};

use super::iomode::IoState;
use super::{FileKind, FsError, NodeId, ROOT_ID, Result, lock};

/// Ids handed out when an inode's own number cannot be used (another device, or a
/// number that collides with the root's id or a previous allocation).
const PRIVATE_IDS: u64 = 1 << 63;

/// One backing inode the kernel knows.
#[derive(Debug)]
pub(super) struct Inode {
    pub(super) id: NodeId,
    key: (u64, u64),
    pub(super) kind: FileKind,
    /// `O_PATH|O_NOFOLLOW` descriptor of the backing inode.
    pub(super) fd: OwnedFd,
    pub(super) io: Mutex<IoState>,
    /// Signalled when a passthrough open of this inode is released.
    pub(super) io_released: Condvar,
    /// Serializes size-changing operations on this inode, so the growth reserved in
    /// the quota is computed from a size nobody else changes meanwhile.
    pub(super) size_lock: Mutex<()>,
}

#[derive(Debug)]
struct TableEntry {
    inode: Arc<Inode>,
    lookups: u64,
}

#[derive(Debug, Default)]
struct Tables {
    by_id: HashMap<NodeId, TableEntry>,
    by_key: HashMap<(u64, u64), NodeId>,
    next_private: u64,
}

#[derive(Debug)]
pub(super) struct InodeTable {
    root_key: (u64, u64),
    tables: Mutex<Tables>,
}

impl InodeTable {
    /// A table holding the root, whose descriptor is `root` (stat'ed as `st`).
    pub(super) fn new(root: OwnedFd, st: &libc::stat) -> Self {
        let table = InodeTable {
            root_key: (st.st_dev, st.st_ino),
            tables: Mutex::default(),
        };
        table.insert(root, st);
        table
    }

    pub(super) fn get(&self, id: NodeId) -> Result<Arc<Inode>> {
        lock(&self.tables)
            .by_id
            .get(&id)
            .map(|e| e.inode.clone())
            .ok_or(FsError::UnknownInode(id))
    }

    pub(super) fn get_by_key(&self, key: (u64, u64)) -> Option<Arc<Inode>> {
        let t = lock(&self.tables);
        t.by_key
            .get(&key)
            .and_then(|id| t.by_id.get(id))
            .map(|e| e.inode.clone())
    }

    /// Count one more kernel reference to the inode behind `fd` (stat'ed as `st`),
    /// adding it to the table if it is new.
    pub(super) fn insert(&self, fd: OwnedFd, st: &libc::stat) -> Arc<Inode> {
        let key = (st.st_dev, st.st_ino);
        let mut t = lock(&self.tables);
        if let Some(id) = t.by_key.get(&key).copied() {
            let entry = t.by_id.get_mut(&id).expect("tables agree");
            entry.lookups += 1;
            return entry.inode.clone();
        }
        let natural = if key == self.root_key {
            ROOT_ID
        } else if key.0 == self.root_key.0 && key.1 > ROOT_ID && key.1 < PRIVATE_IDS {
            key.1
        } else {
            0
        };
        let id = if natural != 0 && !t.by_id.contains_key(&natural) {
            natural
        } else {
            loop {
                t.next_private += 1;
                let id = PRIVATE_IDS + t.next_private;
                if !t.by_id.contains_key(&id) {
                    break id;
                }
            }
        };
        let inode = Arc::new(Inode {
            id,
            key,
            kind: FileKind::from_mode(st.st_mode),
            fd,
            io: Mutex::default(),
            io_released: Condvar::new(),
            size_lock: Mutex::new(()),
        });
        t.by_key.insert(key, id);
        t.by_id.insert(
            id,
            TableEntry {
                inode: inode.clone(),
                lookups: 1,
            },
        );
        inode
    }

    pub(super) fn add_lookup(&self, id: NodeId) -> Result<()> {
        let mut t = lock(&self.tables);
        let e = t.by_id.get_mut(&id).ok_or(FsError::UnknownInode(id))?;
        e.lookups += 1;
        Ok(())
    }

    pub(super) fn forget(&self, id: NodeId, n: u64) {
        let mut t = lock(&self.tables);
        let Some(e) = t.by_id.get_mut(&id) else {
            return;
        };
        e.lookups = e.lookups.saturating_sub(n);
        if e.lookups == 0 && id != ROOT_ID {
            let key = e.inode.key;
            t.by_id.remove(&id);
            t.by_key.remove(&key);
        }
    }

    /// The id `readdir` reports for a backing inode number of the root's device.
    pub(super) fn dirent_ino(&self, d_ino: u64) -> NodeId {
        if d_ino == self.root_key.1 {
            ROOT_ID
        } else {
            d_ino
        }
    }

    pub(super) fn len(&self) -> usize {
        lock(&self.tables).by_id.len()
    }
}
