//! The filesystem core of one volume: every operation of the mount, on the volume's
//! backing directory, with no FUSE types in sight (the [`super::adapter`] translates).
//!
//! ```text
//!   kernel ──/dev/fuse──▶ fuser ──▶ adapter ──▶ VolumeFs ──*at() syscalls──▶ backing dir
//!                                      │           │
//!                                      │           ├── inodes: node id ⇄ file handle (+ hot O_PATH fds), keyed by (dev, ino)
//!                                      │           ├── handles: fh → open fd (+ I/O mode, dir stream)
//!                                      │           └── quota::Enforcement: the daemon's Accounting,
//!                                      │               or an XFS project quota (super::projquota)
//!                                      └── passthrough: registers a handle's fd with the kernel
//! ```
//!
//! **A request.** The kernel names inodes by node id and open files by handle. An
//! operation finds the inode (an `O_PATH` descriptor of it) in the inode table or the open
//! file in the handle table, checks that a name is a single component, asks the quota
//! for any growth, and makes one `*at()` call relative to that descriptor; nothing
//! ever resolves a path, so no request leaves the volume. The answer is a plain type
//! or an [`FsError`], whose [`FsError::errno`] is the one errno mapping.
//!
//! **Where to look.**
//!
//! | module | holds |
//! | --- | --- |
//! | `inodes` | the inode table: node ids, file handles, hot `O_PATH` descriptors, the kernel's lookup counts |
//! | `fhandle` | kernel file handles (`name_to_handle_at`, `open_by_handle_at`) |
//! | `handles` | the open-handle table, and where reading an open directory stopped |
//! | `record` | the records of both tables and the journal, written through a `Recorder` (the handoff's state file) |
//! | `restore` | a successor serving again what its predecessor's records say |
//! | `journal` | WRITE requests in flight, so a successor does not apply a resent one twice |
//! | `iomode` | the rules that pick passthrough, cached or direct I/O per open |
//! | `locks` | POSIX and flock locks taken on the backing files, waits for them |
//! | `entries` | lookup, create, mknod, mkdir, symlink, link, unlink, rmdir, rename; confinement, ownership |
//! | `attrs` | getattr, setattr, access |
//! | `perms` | the permission decisions the daemon makes itself; the caller's supplementary groups |
//! | `data` | open, read, write, copy_file_range, fallocate, truncation, fsync, release; the quota per write |
//! | `dirs` | opendir, readdir, readdirplus |
//! | `xattrs` | extended attributes |
//! | `types`, `error` | what the core answers in, an open's [`IoMode`], an inode's I/O state; [`FsError`] |
//!
//! This module holds [`VolumeFs`] itself and what is the whole volume's: its quota
//! (usage, statfs) and the backing filesystem.

mod attrs;
mod data;
mod dirs;
mod entries;
mod error;
mod fhandle;
mod handles;
mod inodes;
mod iomode;
mod journal;
mod locks;
mod perms;
mod record;
mod restore;
mod types;
mod xattrs;

#[cfg(test)]
mod tests;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use self::handles::HandleTable;
use self::inodes::{Inode, InodeFd, InodeTable};
use super::quota::{Enforcement, Mode};
use super::sys::{self, Op};
use super::usage::Usage;

pub use self::error::{FsError, Result};
pub use self::fhandle::FileHandle;
pub use self::handles::Handle;
pub use self::inodes::{InodeRecord, Naming};
pub use self::journal::{Journaled, Replay, replay};
pub use self::locks::wait::WaitEnd;
pub use self::locks::{Conflict, LockSpec, Waiters, is_contended, probe_locks};
pub use self::record::{HandleKind, HandleSlot, InodeSlot, JournalSlot, Recorder, Records};
pub use self::restore::Restored;
pub use self::types::{
    Attr, Caller, DirEntry, FileKind, IoMode, NodeId, Opened, Options, ROOT_ID, SetAttr, SetTime,
    StatFs, Stats, WriteReq, Xattr,
};

/// At most this many cached descriptors of hot inodes (fewer under a low
/// `RLIMIT_NOFILE`).
const HOT_FDS_MAX: u64 = 8192;

/// Block size statfs reports capacities in.
const STATFS_BSIZE: u64 = 4096;

/// The filesystem of one volume.
#[derive(Debug)]
pub struct VolumeFs {
    inodes: InodeTable,
    handles: HandleTable,
    quota: Arc<Enforcement>,
    /// `/proc/self/fd`, to re-open `O_PATH` descriptors for I/O.
    proc_fd: OwnedFd,
    options: Options,
    passthrough: AtomicBool,
    stats: Stats,
    locks: locks::LockTable,
    /// WRITE requests in flight, for a successor (see `journal`).
    journal: journal::Journal,
}

/// Lock a mutex of the core (inode I/O state, size locks, tables, dir streams).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another worker must not take the whole mount down with poisoning.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl VolumeFs {
    /// Serve the directory `source` (trusted: it comes from the node agent, and may
    /// itself be reached through symlinks).
    pub fn new(source: &Path, options: Options, quota: Arc<Enforcement>) -> Result<Self> {
        // A quarter of the descriptor limit for hot inodes; the rest stays for open
        // files and directories.
        Self::with_hot_fds(source, options, quota, Self::default_hot_fds())
    }

    /// The hot descriptors cached without a memory budget: a quarter of the
    /// descriptor limit, at most [`HOT_FDS_MAX`].
    pub fn default_hot_fds() -> usize {
        (sys::nofile_limit() / 4).clamp(16, HOT_FDS_MAX) as usize
    }

    /// Like [`Self::new`], with at most `hot` cached descriptors of inodes.
    pub fn with_hot_fds(
        source: &Path,
        options: Options,
        quota: Arc<Enforcement>,
        hot: usize,
    ) -> Result<Self> {
        let c = sys::cstring(source.as_os_str()).op("open source")?;
        // SAFETY: AT_FDCWD stands for the working directory in *at() calls for as
        // long as the process lives; relative sources resolve as they would for open().
        let cwd = unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) };
        let root = sys::openat(cwd, &c, libc::O_PATH | libc::O_DIRECTORY, 0).op("open source")?;
        let st = sys::fstat(root.as_fd()).op("stat source")?;
        let proc_fd = sys::openat(cwd, c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY, 0)
            .op("open /proc/self/fd")?;
        Ok(VolumeFs {
            inodes: InodeTable::new(root, &st, hot),
            handles: HandleTable::new(),
            quota,
            proc_fd,
            options,
            passthrough: AtomicBool::new(false),
            stats: Stats::default(),
            locks: locks::LockTable::default(),
            journal: journal::Journal::default(),
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn usage(&self) -> Result<Usage> {
        self.quota.usage().map_err(FsError::Quota)
    }

    /// Who enforces the capacity.
    pub fn quota_mode(&self) -> Mode {
        self.quota.mode()
    }

    /// Inodes the kernel currently holds (the root included).
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// Descriptors the inode table holds open (pinned and cached).
    pub fn inode_fds(&self) -> usize {
        self.inodes.open_fds()
    }

    /// How inodes are named, and how many descriptors of hot inodes stay open.
    pub fn inode_naming(&self) -> (Naming, usize) {
        (self.inodes.naming(), self.inodes.hot_capacity())
    }

    /// The node ids the kernel holds, as a successor daemon would need them.
    pub fn inode_records(&self) -> Vec<InodeRecord> {
        self.inodes.records()
    }

    /// The source directory's filesystem type (statfs `f_type`).
    pub fn backing_fs_type(&self) -> Result<i64> {
        let root = self.inodes.get(ROOT_ID)?;
        Ok(sys::fstatfs_type(self.fd(&root)?.as_fd()).op("statfs")?)
    }

    fn writable(&self) -> Result<()> {
        if self.options.read_only {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    fn inode(&self, id: NodeId) -> Result<Arc<Inode>> {
        self.inodes.get(id)
    }

    /// An `O_PATH` descriptor of `inode` (see [`InodeTable::fd`]).
    fn fd<'a>(&self, inode: &'a Arc<Inode>) -> Result<InodeFd<'a>> {
        self.inodes.fd(inode)
    }

    /// Add the inode behind a fresh `O_PATH` fd to the table (one lookup).
    fn register(&self, fd: OwnedFd) -> Result<(Arc<Inode>, Attr)> {
        let st = sys::fstat(fd.as_fd()).op("stat")?;
        let inode = self.inodes.insert(fd, &st);
        let attr = Attr::from_stat(&st, inode.id);
        Ok((inode, attr))
    }

    fn stat_inode(&self, inode: &Arc<Inode>) -> Result<Attr> {
        let st = self.inodes.stat(inode)?;
        Ok(Attr::from_stat(&st, inode.id))
    }

    /// Capacity and free space from the quota (the daemon's count or the project
    /// quota's limit and usage; free capped by what the backing filesystem really
    /// has), inodes from the backing filesystem.
    pub fn statfs(&self) -> Result<StatFs> {
        let root = self.inode(ROOT_ID)?;
        let vfs = sys::fstatvfs(self.fd(&root)?.as_fd()).op("statfs")?;
        let u = self.usage()?;
        let backing_avail = vfs.f_bavail.saturating_mul(vfs.f_frsize);
        let free = u.free();
        Ok(StatFs {
            blocks: u.capacity / STATFS_BSIZE,
            // `df` shows used = blocks - bfree: keep that equal to the quota's count.
            bfree: free / STATFS_BSIZE,
            bavail: free.min(backing_avail) / STATFS_BSIZE,
            files: vfs.f_files,
            ffree: vfs.f_favail,
            bsize: STATFS_BSIZE as u32,
            namelen: vfs.f_namemax as u32,
            frsize: STATFS_BSIZE as u32,
        })
    }
}
