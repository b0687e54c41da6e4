//! The inode table: node id ⇄ backing inode, keyed by (dev, ino), with the kernel's
//! lookup count of each; and the bounded cache of descriptors of the hot inodes.
//!
//! ```text
//!   lookup: openat(parent fd, name, O_PATH|O_NOFOLLOW) ─▶ name_to_handle_at ─▶ Inode { handle }
//!                                          └─ the fd itself ─▶ hot cache (CLOCK, bounded)
//!   any request: InodeTable::fd(inode) ─▶ hot fd, or open_by_handle_at(root's mount, handle)
//! ```
//!
//! **Naming.** The kernel names files by node id. Ids are the backing inode numbers (so
//! `stat` and `readdir` agree with each other and with the backing directory), except
//! the root, which FUSE fixes at 1, and the rare inode of another device or a
//! colliding number, which gets an id from a private range. An entry lives while the
//! kernel's lookup count on it is above zero (`forget`). Each entry holds the inode's
//! kernel file handle ([`FileHandle`]: bytes), not a descriptor: a walk of a million
//! files needs no million descriptors, and a successor daemon could reopen every inode
//! the kernel knows from [`InodeTable::records`]. Descriptors of recently used inodes
//! stay open in a CLOCK cache of [`InodeTable::hot_capacity`] entries; a miss reopens
//! the inode by its handle. Where handles cannot be used (the backing filesystem
//! cannot make or open them, the daemon lacks `CAP_DAC_READ_SEARCH`: [`Naming`]), or
//! for an inode on another mount beneath the volume, the entry pins its `O_PATH`
//! descriptor for its whole life instead, as every entry did before.
//!
//! **Confinement.** `open_by_handle_at` opens any inode of the filesystem, wherever it
//! lies. The table only ever opens handles it made itself with `name_to_handle_at` on a
//! descriptor it had just opened by one name component beneath the root (lookup,
//! create, readdirplus), and only on the root's own mount (an inode reached through a
//! mount beneath the volume is pinned, never named by a handle that the root's
//! filesystem would decode as something else). So a handle reopens exactly the inode
//! an earlier lookup beneath the root found, which is what the pinned descriptor of
//! before referred to as well; a reopened inode is checked to still be that (dev, ino)
//! and kind. Renames and links behind the daemon's back change nothing either way (the
//! descriptor, like the handle, follows the inode, not a path; through the mount no
//! rename or link leaves the volume; a directory an administrator moves out of the
//! volume on the host stays served, as it did with a pinned descriptor). An unlinked
//! inode still open somewhere (nlink 0) reopens as itself, in no directory, so nothing
//! else is reached through it. An inode freed (unlinked and closed) and its
//! number reused: the handle carries the generation, so the old handle opens nothing
//! (`ESTALE`), and a lookup that finds the number under a different handle makes a
//! new entry, never reusing the old one's. A handle is not a capability for more than
//! its inode, and no handle ever comes from outside the daemon.
//!
//! Unlike a pinned descriptor, a handle does not keep an unlinked inode alive: a node
//! id the kernel still holds whose inode was freed answers `ESTALE`. An inode open
//! through the mount is kept alive by its open descriptor, so `fstat` of an unlinked
//! open file works as before.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

use super::fhandle::FileHandle;
use super::record::{InodeSlot, Recorder};
use super::types::IoState;
use super::{FileKind, FsError, NodeId, ROOT_ID, Result, lock};
use crate::sys::{self, Errno, Op, SysError};

/// Ids handed out when an inode's own number cannot be used (another device, or a
/// number that collides with the root's id or a previous allocation).
const PRIVATE_IDS: u64 = 1 << 63;

/// How the table names the inodes the kernel knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// By kernel file handles, with a bounded cache of open descriptors.
    FileHandles,
    /// By one pinned `O_PATH` descriptor each, because handles failed with this errno
    /// (`EOPNOTSUPP`: the filesystem makes none; `EPERM`: no `CAP_DAC_READ_SEARCH`).
    Descriptors(Errno),
}

impl Naming {
    pub fn as_str(self) -> &'static str {
        match self {
            Naming::FileHandles => "file-handles",
            Naming::Descriptors(_) => "descriptors",
        }
    }
}

/// One backing inode the kernel knows.
#[derive(Debug)]
pub(super) struct Inode {
    pub(super) id: NodeId,
    key: (u64, u64),
    pub(super) kind: FileKind,
    /// How this and a successor daemon reopen the inode, if the filesystem names it.
    handle: Option<FileHandle>,
    /// `O_PATH|O_NOFOLLOW` descriptor held for the inode's whole life: the root, and
    /// any inode without a usable handle.
    pinned: Option<OwnedFd>,
    /// The cached `O_PATH` descriptor of a handle-named inode, while it is hot.
    hot: Mutex<Option<Arc<OwnedFd>>>,
    /// Used since the cache's hand last passed (CLOCK's second chance).
    referenced: AtomicBool,
    pub(super) io: Mutex<IoState>,
    /// Signalled when a passthrough open of this inode is released.
    pub(super) io_released: Condvar,
    /// Serializes size-changing operations on this inode, so the growth reserved in
    /// the quota is computed from a size nobody else changes meanwhile.
    pub(super) size_lock: Mutex<()>,
}

/// An `O_PATH` descriptor of an inode, valid while this lives.
#[derive(Debug)]
pub(super) enum InodeFd<'a> {
    Pinned(BorrowedFd<'a>),
    Hot(Arc<OwnedFd>),
}

impl AsFd for InodeFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            InodeFd::Pinned(fd) => *fd,
            InodeFd::Hot(fd) => fd.as_fd(),
        }
    }
}

/// What a successor daemon needs to serve a node id the kernel holds: plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeRecord {
    pub id: NodeId,
    /// The backing (dev, ino), to check a reopened inode against.
    pub key: (u64, u64),
    pub kind: FileKind,
    /// `None` for an inode only a pinned descriptor names (see [`Naming`]).
    pub handle: Option<FileHandle>,
    /// The kernel's lookup count, which its FORGETs will bring down to zero.
    pub lookups: u64,
}

#[derive(Debug)]
struct TableEntry {
    inode: Arc<Inode>,
    lookups: u64,
    /// Its slot in the handoff state file, if one is kept.
    slot: Option<u32>,
}

#[derive(Debug, Default)]
struct Tables {
    by_id: HashMap<NodeId, TableEntry>,
    by_key: HashMap<(u64, u64), NodeId>,
    next_private: u64,
}

/// The root's mount, for `open_by_handle_at`.
#[derive(Debug)]
struct HandleMount {
    fd: OwnedFd,
    id: i32,
}

/// The hot descriptors' CLOCK ring: one slot per inode whose `hot` is set.
#[derive(Debug, Default)]
struct Clock {
    ring: Vec<Weak<Inode>>,
    hand: usize,
}

#[derive(Debug)]
pub(super) struct InodeTable {
    root_key: (u64, u64),
    naming: Naming,
    mount: Option<HandleMount>,
    hot_capacity: usize,
    clock: Mutex<Clock>,
    tables: Mutex<Tables>,
    /// Where every change is recorded (the handoff's state file; see `record`).
    state: OnceLock<Arc<dyn Recorder>>,
}

/// The code a state file keeps for a kind: its `S_IFMT` bits, shifted.
pub(super) fn kind_code(kind: FileKind) -> u8 {
    let mode = match kind {
        FileKind::Regular => libc::S_IFREG,
        FileKind::Directory => libc::S_IFDIR,
        FileKind::Symlink => libc::S_IFLNK,
        FileKind::Fifo => libc::S_IFIFO,
        FileKind::Socket => libc::S_IFSOCK,
        FileKind::CharDevice => libc::S_IFCHR,
        FileKind::BlockDevice => libc::S_IFBLK,
    };
    (mode >> 12) as u8
}

fn slot_of(inode: &Inode, lookups: u64) -> InodeSlot {
    InodeSlot {
        id: inode.id,
        key: inode.key,
        kind: kind_code(inode.kind),
        handle: inode.handle.clone(),
        lookups,
    }
}

impl InodeTable {
    /// A table holding the root, whose descriptor is `root` (stat'ed as `st`), with
    /// at most `hot_capacity` cached descriptors besides the pinned ones.
    pub(super) fn new(root: OwnedFd, st: &libc::stat, hot_capacity: usize) -> Self {
        let (naming, mount, root_handle) = match Self::probe(root.as_fd(), st) {
            Ok((handle, mount)) => (Naming::FileHandles, Some(mount), Some(handle)),
            Err(errno) => (Naming::Descriptors(errno), None, None),
        };
        let table = InodeTable {
            root_key: (st.st_dev, st.st_ino),
            naming,
            mount,
            hot_capacity: hot_capacity.max(1),
            clock: Mutex::default(),
            tables: Mutex::default(),
            state: OnceLock::new(),
        };
        table.add(root, st, root_handle);
        table
    }

    /// Whether handles work here: the root's handle must reopen the root.
    fn probe(root: BorrowedFd<'_>, st: &libc::stat) -> sys::SysResult<(FileHandle, HandleMount)> {
        let (handle, id) = FileHandle::of(root)?;
        // open_by_handle_at takes no `O_PATH` descriptor for the mount.
        let fd = sys::openat(root, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let again = handle.open(fd.as_fd(), libc::O_PATH | libc::O_DIRECTORY)?;
        let again = sys::fstat(again.as_fd())?;
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
            return Err(Errno::ESTALE);
        }
        Ok((handle, HandleMount { fd, id }))
    }

    pub(super) fn naming(&self) -> Naming {
        self.naming
    }

    pub(super) fn hot_capacity(&self) -> usize {
        self.hot_capacity
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

    /// A descriptor of `inode`: its pinned one, its cached one, or reopened by its
    /// handle (and then cached).
    pub(super) fn fd<'a>(&self, inode: &'a Arc<Inode>) -> Result<InodeFd<'a>> {
        Ok(self.fd_and_stat(inode)?.0)
    }

    /// `fstat` of `inode`: one syscall when its descriptor is at hand, and none more
    /// than the reopen's own check when it is not.
    pub(super) fn stat(&self, inode: &Arc<Inode>) -> Result<libc::stat> {
        match self.fd_and_stat(inode)? {
            (_, Some(st)) => Ok(st),
            (fd, None) => Ok(sys::fstat(fd.as_fd()).op("stat")?),
        }
    }

    /// A descriptor of `inode`, and its stat if reopening it took one.
    fn fd_and_stat<'a>(&self, inode: &'a Arc<Inode>) -> Result<(InodeFd<'a>, Option<libc::stat>)> {
        if let Some(fd) = &inode.pinned {
            return Ok((InodeFd::Pinned(fd.as_fd()), None));
        }
        inode.referenced.store(true, Ordering::Relaxed);
        if let Some(fd) = lock(&inode.hot).clone() {
            return Ok((InodeFd::Hot(fd), None));
        }
        let stale = FsError::Sys(SysError {
            op: "open by handle",
            errno: Errno::ESTALE,
        });
        let (Some(handle), Some(mount)) = (&inode.handle, &self.mount) else {
            return Err(stale);
        };
        let fd = handle
            .open(mount.fd.as_fd(), libc::O_PATH | libc::O_NOFOLLOW)
            .op("open by handle")?;
        let st = sys::fstat(fd.as_fd()).op("stat")?;
        if (st.st_dev, st.st_ino) != inode.key || FileKind::from_mode(st.st_mode) != inode.kind {
            return Err(stale);
        }
        Ok((InodeFd::Hot(self.make_hot(inode, fd)), Some(st)))
    }

    /// Cache `fd` as `inode`'s descriptor (unless another is cached already), taking
    /// the slot of an inode not used since the hand last passed if the cache is full.
    fn make_hot(&self, inode: &Arc<Inode>, fd: OwnedFd) -> Arc<OwnedFd> {
        let fd = Arc::new(fd);
        {
            let mut slot = lock(&inode.hot);
            if let Some(cached) = &*slot {
                return cached.clone();
            }
            *slot = Some(fd.clone());
        }
        let evicted = {
            let mut clock = lock(&self.clock);
            let new = Arc::downgrade(inode);
            if clock.ring.len() < self.hot_capacity {
                clock.ring.push(new);
                None
            } else {
                let Clock { ring, hand } = &mut *clock;
                let i = clock_victim(hand, ring.len(), |i| {
                    ring[i]
                        .upgrade()
                        .is_some_and(|old| old.referenced.swap(false, Ordering::Relaxed))
                });
                std::mem::replace(&mut ring[i], new)
                    .upgrade()
                    .and_then(|old| lock(&old.hot).take())
            }
        };
        // Closed here, outside the cache's lock.
        drop(evicted);
        fd
    }

    /// Count one more kernel reference to the inode behind `fd` (stat'ed as `st`), an
    /// `O_PATH` descriptor just opened beneath the root, adding it to the table if it
    /// is new.
    pub(super) fn insert(&self, fd: OwnedFd, st: &libc::stat) -> Arc<Inode> {
        let handle = self.mount.as_ref().and_then(|mount| {
            FileHandle::of(fd.as_fd())
                .ok()
                .filter(|(_, id)| *id == mount.id && st.st_dev == self.root_key.0)
                .map(|(handle, _)| handle)
        });
        self.add(fd, st, handle)
    }

    fn add(&self, fd: OwnedFd, st: &libc::stat, handle: Option<FileHandle>) -> Arc<Inode> {
        let key = (st.st_dev, st.st_ino);
        let mut t = lock(&self.tables);
        if let Some(id) = t.by_key.get(&key).copied() {
            let entry = t.by_id.get_mut(&id).expect("tables agree");
            // A pinned inode cannot have been freed, so its number is still its own;
            // otherwise the number may have been reused, and the handles tell.
            if entry.inode.pinned.is_some() || entry.inode.handle == handle {
                entry.lookups += 1;
                if let (Some(slot), Some(state)) = (entry.slot, self.state.get()) {
                    state.set_lookups(slot, entry.lookups);
                }
                let inode = entry.inode.clone();
                drop(t);
                if inode.pinned.is_none() {
                    self.make_hot(&inode, fd);
                }
                return inode;
            }
            // The old entry stays until the kernel forgets it; the number is the new one's.
            t.by_key.remove(&key);
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
        let pinned = handle.is_none() || id == ROOT_ID;
        let (pinned, spare) = if pinned {
            (Some(fd), None)
        } else {
            (None, Some(fd))
        };
        let inode = Arc::new(Inode {
            id,
            key,
            kind: FileKind::from_mode(st.st_mode),
            handle,
            pinned,
            hot: Mutex::default(),
            referenced: AtomicBool::new(true),
            io: Mutex::default(),
            io_released: Condvar::new(),
            size_lock: Mutex::new(()),
        });
        t.by_key.insert(key, id);
        let slot = self
            .state
            .get()
            .and_then(|state| state.add_inode(&slot_of(&inode, 1)));
        t.by_id.insert(
            id,
            TableEntry {
                inode: inode.clone(),
                lookups: 1,
                slot,
            },
        );
        drop(t);
        if let Some(fd) = spare {
            self.make_hot(&inode, fd);
        }
        inode
    }

    pub(super) fn add_lookup(&self, id: NodeId) -> Result<()> {
        let mut t = lock(&self.tables);
        let e = t.by_id.get_mut(&id).ok_or(FsError::UnknownInode(id))?;
        e.lookups += 1;
        if let (Some(slot), Some(state)) = (e.slot, self.state.get()) {
            state.set_lookups(slot, e.lookups);
        }
        Ok(())
    }

    pub(super) fn forget(&self, id: NodeId, n: u64) {
        let removed = {
            let mut t = lock(&self.tables);
            let Some(e) = t.by_id.get_mut(&id) else {
                return;
            };
            e.lookups = e.lookups.saturating_sub(n);
            let state = self.state.get();
            if e.lookups > 0 || id == ROOT_ID {
                if let (Some(slot), Some(state)) = (e.slot, state) {
                    state.set_lookups(slot, e.lookups);
                }
                return;
            }
            if let (Some(slot), Some(state)) = (e.slot, state) {
                state.remove_inode(slot);
            }
            let key = e.inode.key;
            if t.by_key.get(&key) == Some(&id) {
                t.by_key.remove(&key);
            }
            t.by_id.remove(&id)
        };
        // The last reference may close a descriptor and let the backing filesystem
        // free the inode: not while the table is locked, which every request takes.
        drop(removed);
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

    /// Descriptors the table holds open now: pinned and cached.
    pub(super) fn open_fds(&self) -> usize {
        let pinned = lock(&self.tables)
            .by_id
            .values()
            .filter(|e| e.inode.pinned.is_some())
            .count();
        let hot = lock(&self.clock)
            .ring
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|inode| lock(&inode.hot).is_some())
            .count();
        pinned + hot
    }

    /// Record every inode in `state` from now on, starting with those known now.
    pub(super) fn record_into(&self, state: Arc<dyn Recorder>) {
        let mut t = lock(&self.tables);
        for e in t.by_id.values_mut() {
            if e.slot.is_none() {
                e.slot = state.add_inode(&slot_of(&e.inode, e.lookups));
            }
        }
        let _ = self.state.set(state);
    }

    /// Serve again an inode a predecessor daemon served (read from its state file):
    /// reopen it by its handle (only handles a daemon made itself reach the state
    /// file, which is root's), and check it is still the same (dev, ino) and kind, on
    /// the root's filesystem. The root is the table's own already.
    pub(super) fn restore(&self, rec: &InodeSlot) -> Result<()> {
        let stale = FsError::Sys(SysError {
            op: "open by handle",
            errno: Errno::ESTALE,
        });
        if rec.id == ROOT_ID {
            return Ok(());
        }
        let (Some(handle), Some(mount)) = (&rec.handle, &self.mount) else {
            return Err(stale);
        };
        let kind = FileKind::from_mode(u32::from(rec.kind) << 12);
        if rec.key.0 != self.root_key.0 {
            return Err(stale);
        }
        let fd = handle
            .open(mount.fd.as_fd(), libc::O_PATH | libc::O_NOFOLLOW)
            .op("open by handle")?;
        let st = sys::fstat(fd.as_fd()).op("stat")?;
        if (st.st_dev, st.st_ino) != rec.key || FileKind::from_mode(st.st_mode) != kind {
            return Err(stale);
        }
        let inode = Arc::new(Inode {
            id: rec.id,
            key: rec.key,
            kind,
            handle: Some(handle.clone()),
            pinned: None,
            hot: Mutex::default(),
            referenced: AtomicBool::new(true),
            io: Mutex::default(),
            io_released: Condvar::new(),
            size_lock: Mutex::new(()),
        });
        {
            let mut t = lock(&self.tables);
            if t.by_id.contains_key(&rec.id) {
                return Ok(());
            }
            t.by_key.insert(rec.key, rec.id);
            if rec.id > PRIVATE_IDS {
                t.next_private = t.next_private.max(rec.id - PRIVATE_IDS);
            }
            t.by_id.insert(
                rec.id,
                TableEntry {
                    inode: inode.clone(),
                    lookups: rec.lookups.max(1),
                    slot: None,
                },
            );
        }
        self.make_hot(&inode, fd);
        Ok(())
    }

    /// Every inode the kernel knows, as a successor would need it.
    pub(super) fn records(&self) -> Vec<InodeRecord> {
        let t = lock(&self.tables);
        let mut v: Vec<_> = t
            .by_id
            .values()
            .map(|e| InodeRecord {
                id: e.inode.id,
                key: e.inode.key,
                kind: e.inode.kind,
                handle: e.inode.handle.clone(),
                lookups: e.lookups,
            })
            .collect();
        v.sort_by_key(|r| r.id);
        v
    }
}

/// CLOCK (second chance) over a ring of `len` slots: from `hand` on, the first slot
/// whose referenced bit was clear; `test_and_clear` clears the bits it passes. Ends
/// within two turns. Leaves `hand` after the slot chosen.
fn clock_victim(
    hand: &mut usize,
    len: usize,
    mut test_and_clear: impl FnMut(usize) -> bool,
) -> usize {
    loop {
        let i = *hand % len;
        *hand = (i + 1) % len;
        if !test_and_clear(i) {
            return i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::clock_victim;

    #[test]
    fn clock_gives_the_first_unreferenced_slot_a_second_chance_to_the_rest() {
        // (referenced bits, hand) → (victim, bits after, hand after)
        type Row = (&'static [bool], usize, usize, &'static [bool], usize);
        let table: &[Row] = &[
            (&[false, false, false], 0, 0, &[false, false, false], 1),
            (&[true, false, true], 0, 1, &[false, false, true], 2),
            (&[true, true, false], 1, 2, &[true, false, false], 0),
            // All referenced: one full turn clears them, the hand's slot goes.
            (&[true, true, true], 1, 1, &[false, false, false], 2),
            (&[true], 0, 0, &[false], 0),
            // A hand past the end (the ring was shorter) wraps.
            (&[false, true], 5, 0, &[false, false], 1),
        ];
        for &(bits, hand, victim, after, hand_after) in table {
            let mut b = bits.to_vec();
            let mut h = hand;
            let got = clock_victim(&mut h, b.len(), |i| std::mem::replace(&mut b[i], false));
            assert_eq!(
                (got, b.as_slice(), h),
                (victim, after, hand_after),
                "{bits:?} from {hand}"
            );
        }
    }
}
