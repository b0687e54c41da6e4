//! The filesystem core of one volume: every operation of the mount, on the volume's
//! backing directory, with no FUSE types in sight (the [`super::adapter`] translates).
//!
//! ```text
//!   kernel ──/dev/fuse──▶ fuser ──▶ adapter ──▶ VolumeFs (this module) ──*at() syscalls──▶ backing dir
//!                                      │              │
//!                                      │              ├── InodeTable: node id ⇄ O_PATH fd, keyed by (dev, ino)
//!                                      │              ├── Handles: fh → open fd (+ I/O mode, dir stream)
//!                                      │              └── Enforcement (super::quota): the daemon's byte
//!                                      │                  count, or an XFS project quota (super::projquota)
//!                                      └── passthrough: registers a handle's fd with the kernel
//! ```
//!
//! **Inodes.** The kernel names files by node id. Each id the kernel holds maps to an
//! `O_PATH|O_NOFOLLOW` descriptor of the backing inode, opened from the descriptor of
//! its parent by a single name component. Ids are the backing inode numbers (so `stat`
//! and `readdir` agree with each other and with the backing directory), except the
//! root, which FUSE fixes at 1, and the rare inode of another device or a colliding
//! number, which gets an id from a private range. An entry lives while the kernel's
//! lookup count on it is above zero (`forget`). Holding the fd keeps the backing inode
//! from being freed, so a number is never reused while the kernel still knows it.
//!
//! **Confinement.** No operation resolves a path: names are single components (no
//! `/`, checked here), `..` of the root is the root, and every `*at()` call uses
//! `O_NOFOLLOW`/`AT_SYMLINK_NOFOLLOW` or `AT_EMPTY_PATH`. A symlink in the backing tree
//! is data to the daemon: it is returned by `readlink` and resolved, if at all, by the
//! kernel of the client in the client's own namespace. Rename and link only ever take
//! parents that are inodes of this volume, so nothing can be moved across the boundary.
//!
//! **Ownership.** The daemon runs as root; the kernel checks permissions
//! (`default_permissions`) with the caller's credentials before a request arrives, so
//! the core creates as root and then hands the new inode to the caller's uid (and gid,
//! unless the parent directory is set-group-ID and the inode inherits its group).
//!
//! **I/O modes.** A regular file is opened in one of three modes (see [`IoMode`]):
//! kernel passthrough (the kernel reads and writes the backing file itself, the
//! daemon never sees the I/O), FUSE direct I/O (every write comes straight from the
//! writer's buffer to [`VolumeFs::write`], no FUSE page cache), or the ordinary
//! cached FUSE path (writes come to the daemon write-through, reads are served from
//! the page cache). Which one depends on who enforces the quota
//! ([`super::quota::Enforcement`], chosen once at mount):
//!
//! - **backend mode** (an XFS project quota on the volume directory): the backing
//!   filesystem stops a writer at the limit with `ENOSPC` whoever it is, the daemon's
//!   own credentials included, so a write need not pass through the daemon. Every
//!   open is passthrough, writable ones too. The exception is a writable open of a
//!   set-user/group-ID file: a passthrough write runs with the daemon's credentials
//!   (`CAP_FSETID`), which would keep the bits a write by the caller must clear
//!   (observed on Linux 6.12), so such a writer gets the daemon-mode treatment below.
//!   The check is made at open: a set-ID bit set (by the owner or root) while a
//!   passthrough writer holds the file open survives that writer's later writes;
//! - **daemon mode** (no backend quota): the daemon counts every byte, so writes must
//!   reach it. Read-only opens use passthrough, write-only opens direct I/O,
//!   read-write opens the cached path. Passthrough is never used for writes: the
//!   kernel would write to the backing file without asking the daemon, and no
//!   headroom heuristic bounds how much a writer appends before the daemon could
//!   notice (one `pwrite` at a far offset grows the apparent size by any amount, a
//!   passthrough open cannot be revoked once granted, and the only size limit the
//!   kernel applies to such a write is the *writer's* `RLIMIT_FSIZE`).
//!
//! The kernel requires every open of an inode that has passthrough opens to be a
//! passthrough open too (anything else fails with EIO), and refuses passthrough while
//! cached opens exist. Hence:
//!
//! - a read-only open is passthrough unless the inode has cached opens; then it is
//!   cached too. Write-only direct opens do not stand in its way. In backend mode the
//!   same holds for writable opens;
//! - in daemon mode only, a writable open of an inode that passthrough opens hold
//!   waits up to a second for them to be released (the kernel reports a close
//!   asynchronously, so a reader that has just closed may not be released yet), then
//!   is refused with `ETXTBSY` ("file busy", as for writing a running executable)
//!   instead of being given a passthrough write the quota cannot see. Writers that
//!   open first are never refused. `tessera mount --no-passthrough` removes the
//!   restriction, at the cost of every read and write crossing into the daemon.
//!
//! In backend mode the quota calls of the core ([`Enforcement::reserve`] and friends)
//! grant everything; a write the daemon does itself (direct or cached opens) is held
//! to the limit by the backing filesystem like any other.
//!
//! **Errors.** Every failure is an [`FsError`]; [`FsError::errno`] is the one place
//! where failures become errno values for the kernel.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::projquota::BackendQuotaError;
use super::quota::{Enforcement, Mode, Usage};
use super::sys::{self, Errno, Op, SysError};

/// A node id as the kernel knows it (and the `st_ino` it shows).
pub type NodeId = u64;

/// FUSE's fixed id of the root directory.
pub const ROOT_ID: NodeId = 1;

/// Ids handed out when an inode's own number cannot be used (another device, or a
/// number that collides with the root's id or a previous allocation).
const PRIVATE_IDS: u64 = 1 << 63;

/// How long a writable open waits for passthrough readers of the file to be released
/// before it fails as busy (see the module docs on I/O modes).
const RELEASE_GRACE: Duration = Duration::from_secs(1);

/// Block size statfs reports capacities in.
const STATFS_BSIZE: u64 = 4096;

/// Errors of the filesystem core.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A syscall on the backing directory failed.
    #[error("{} on the backing directory failed: {}", .0.op, .0.errno)]
    Sys(SysError),
    /// The kernel named a node id the daemon does not know (forgotten or never given).
    #[error("unknown node id {0}")]
    UnknownInode(NodeId),
    /// The kernel named a file handle the daemon does not know.
    #[error("unknown file handle {0}")]
    UnknownHandle(u64),
    /// A name that is not a single path component.
    #[error("invalid file name {0:?}")]
    InvalidName(std::ffi::OsString),
    /// A change on a read-only mount.
    #[error("the volume is mounted read-only")]
    ReadOnly,
    /// Growth past the volume's capacity.
    #[error("the volume's quota is exhausted")]
    QuotaExceeded,
    /// An operation this filesystem deliberately does not offer.
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    /// An operation refused for every caller.
    #[error("{0} is not permitted")]
    NotPermitted(&'static str),
    /// An operation on an inode of the wrong type (e.g. open of a directory).
    #[error("{0} on the wrong type of file")]
    WrongType(&'static str),
    /// A writable open of a file that readers hold open in passthrough mode.
    #[error("the file is open for passthrough reads; it cannot be opened for writing now")]
    Busy,
    /// Reading the backing filesystem's project quota failed.
    #[error("reading the project quota")]
    Quota(#[source] BackendQuotaError),
    /// The caller lacks permission (only for `access`, which the kernel leaves to us).
    #[error("access denied")]
    AccessDenied,
}

impl FsError {
    /// The errno the kernel gets: the single mapping from failures to errno values.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Sys(e) => e.errno as i32,
            FsError::UnknownInode(_) => libc::ESTALE,
            FsError::UnknownHandle(_) => libc::EBADF,
            FsError::InvalidName(_) => libc::EINVAL,
            FsError::ReadOnly => libc::EROFS,
            FsError::QuotaExceeded => libc::ENOSPC,
            FsError::Unsupported(_) => libc::EOPNOTSUPP,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::WrongType(_) => libc::EINVAL,
            FsError::Busy => libc::ETXTBSY,
            FsError::Quota(BackendQuotaError::Sys(e)) => e.errno as i32,
            FsError::Quota(_) => libc::EIO,
            FsError::AccessDenied => libc::EACCES,
        }
    }
}

impl From<SysError> for FsError {
    fn from(e: SysError) -> Self {
        FsError::Sys(e)
    }
}

pub type Result<T, E = FsError> = std::result::Result<T, E>;

/// File types, as the core reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    fn from_mode(mode: u32) -> Self {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => FileKind::Regular,
        }
    }

    fn from_dtype(d_type: u8) -> Option<Self> {
        Some(match d_type {
            libc::DT_REG => FileKind::Regular,
            libc::DT_DIR => FileKind::Directory,
            libc::DT_LNK => FileKind::Symlink,
            libc::DT_FIFO => FileKind::Fifo,
            libc::DT_SOCK => FileKind::Socket,
            libc::DT_CHR => FileKind::CharDevice,
            libc::DT_BLK => FileKind::BlockDevice,
            _ => return None,
        })
    }
}

/// Attributes of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: NodeId,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FileKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

fn system_time(secs: i64, nsecs: i64) -> SystemTime {
    let nsecs = nsecs.clamp(0, 999_999_999) as u32;
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs)
    } else {
        UNIX_EPOCH - Duration::new(secs.unsigned_abs(), 0) + Duration::new(0, nsecs)
    }
}

impl Attr {
    /// Placeholder attributes of a name that does not exist (a negative entry: the
    /// kernel only looks at the node id, 0, and the entry's lifetime).
    pub const NEGATIVE: Attr = Attr {
        ino: 0,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        kind: FileKind::Regular,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
    };

    fn from_stat(st: &libc::stat, ino: NodeId) -> Self {
        Attr {
            ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: system_time(st.st_atime, st.st_atime_nsec),
            mtime: system_time(st.st_mtime, st.st_mtime_nsec),
            ctime: system_time(st.st_ctime, st.st_ctime_nsec),
            kind: FileKind::from_mode(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
        }
    }
}

/// Who sends a request (the caller's fsuid/fsgid, from the request header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// A timestamp to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

fn timespec(t: Option<SetTime>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(SetTime::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(SetTime::At(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos() as i64,
            },
            Err(before) => {
                let d = before.duration();
                let (mut secs, mut nsecs) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if nsecs < 0 {
                    secs -= 1;
                    nsecs += 1_000_000_000;
                }
                libc::timespec {
                    tv_sec: secs,
                    tv_nsec: nsecs,
                }
            }
        },
    }
}

/// The changes of one `setattr`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// The open file the change came through (`ftruncate`), if any.
    pub fh: Option<u64>,
    /// Clear set-user-ID and set-group-ID along with a size change: the daemon does
    /// this for the kernel (`FUSE_HANDLE_KILLPRIV_V2`), as a truncation by a caller
    /// without `CAP_FSETID` must.
    pub kill_suidgid: bool,
}

/// How the kernel does I/O on an open regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum IoMode {
    /// Kernel passthrough: reads (and, in backend mode, writes) go straight to the
    /// backing file. Read-only opens in daemon mode, every open in backend mode.
    Passthrough = 0,
    /// Ordinary FUSE I/O through the kernel page cache; writes come to the daemon.
    /// Read-write opens in daemon mode.
    Cached = 1,
    /// FUSE direct I/O: every write comes to the daemon, no page cache. Write-only
    /// opens in daemon mode (the kernel invalidates other handles' cached pages a
    /// direct write overwrites).
    Direct = 2,
}

impl IoMode {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => IoMode::Passthrough,
            1 => IoMode::Cached,
            _ => IoMode::Direct,
        }
    }
}

/// An opened file as the adapter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub fh: u64,
    pub mode: IoMode,
}

/// One directory entry for `readdir`.
#[derive(Debug)]
pub struct DirEntry<'a> {
    pub ino: NodeId,
    /// Where to resume after this entry.
    pub offset: i64,
    pub kind: FileKind,
    pub name: &'a OsStr,
}

/// Filesystem statistics for `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Result of a `getxattr`/`listxattr` that may ask only for the size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// Counters of what reached the daemon; logged when the mount ends.
#[derive(Debug, Default)]
pub struct Stats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub opens_passthrough: AtomicU64,
    pub opens_cached: AtomicU64,
    pub opens_direct: AtomicU64,
    /// Writable opens refused because passthrough readers held the file.
    pub opens_busy: AtomicU64,
    pub passthrough_failures: AtomicU64,
}

/// How a volume is served.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Refuse every change with EROFS.
    pub read_only: bool,
    /// Allow creating character and block device nodes. Only sensible on a mount
    /// with the `dev` option: on the default `nodev` mount they would be inert
    /// through the mount but live device nodes in the backing directory, which
    /// host-side tools may open.
    pub devices: bool,
}

/// Which kinds of open file an inode has, so the I/O modes never conflict.
#[derive(Debug, Default)]
struct IoState {
    cached: u32,
    passthrough: u32,
    open: u32,
    /// Its last link went while it was open: its size leaves the quota at last close.
    orphan: bool,
}

#[derive(Debug)]
struct Inode {
    id: NodeId,
    key: (u64, u64),
    kind: FileKind,
    /// `O_PATH|O_NOFOLLOW` descriptor of the backing inode.
    fd: OwnedFd,
    io: Mutex<IoState>,
    /// Signalled when a passthrough open of this inode is released.
    io_released: Condvar,
    /// Serializes size-changing operations on this inode, so the growth reserved in
    /// the quota is computed from a size nobody else changes meanwhile.
    size_lock: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another worker must not take the whole mount down with poisoning.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
struct InodeTable {
    root_key: (u64, u64),
    tables: Mutex<Tables>,
}

impl InodeTable {
    fn get(&self, id: NodeId) -> Result<Arc<Inode>> {
        lock(&self.tables)
            .by_id
            .get(&id)
            .map(|e| e.inode.clone())
            .ok_or(FsError::UnknownInode(id))
    }

    fn get_by_key(&self, key: (u64, u64)) -> Option<Arc<Inode>> {
        let t = lock(&self.tables);
        t.by_key
            .get(&key)
            .and_then(|id| t.by_id.get(id))
            .map(|e| e.inode.clone())
    }

    /// Count one more kernel reference to the inode behind `fd` (stat'ed as `st`),
    /// adding it to the table if it is new.
    fn insert(&self, fd: OwnedFd, st: &libc::stat) -> Arc<Inode> {
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

    fn add_lookup(&self, id: NodeId) -> Result<()> {
        let mut t = lock(&self.tables);
        let e = t.by_id.get_mut(&id).ok_or(FsError::UnknownInode(id))?;
        e.lookups += 1;
        Ok(())
    }

    fn forget(&self, id: NodeId, n: u64) {
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
    fn dirent_ino(&self, d_ino: u64) -> NodeId {
        if d_ino == self.root_key.1 {
            ROOT_ID
        } else {
            d_ino
        }
    }

    fn len(&self) -> usize {
        lock(&self.tables).by_id.len()
    }
}

/// Position in a directory being read, kept between `readdir` calls.
#[derive(Debug)]
struct DirStream {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The offset the next entry in `buf[start..end]` is at.
    pos: i64,
}

/// An open file or directory.
#[derive(Debug)]
pub struct Handle {
    inode: Arc<Inode>,
    file: OwnedFd,
    mode: AtomicU8,
    writable: bool,
    append: bool,
    dir: Option<Mutex<DirStream>>,
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

/// The filesystem of one volume.
#[derive(Debug)]
pub struct VolumeFs {
    inodes: InodeTable,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    quota: Arc<Enforcement>,
    /// `/proc/self/fd`, to re-open `O_PATH` descriptors for I/O.
    proc_fd: OwnedFd,
    options: Options,
    passthrough: AtomicBool,
    stats: Stats,
}

/// Whether a write by a caller without `CAP_FSETID` would have to clear mode bits:
/// set-user-ID, or set-group-ID with group execute (without it, set-group-ID marks
/// mandatory locking, not privilege).
fn has_set_id_bits(file: BorrowedFd<'_>) -> Result<bool> {
    let mode = sys::fstat(file).op("fstat")?.st_mode;
    Ok(mode & libc::S_ISUID != 0
        || mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP)
}

/// A single name component, as the kernel may send it (no `/`, not empty, no NUL).
fn component(name: &OsStr) -> Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(FsError::InvalidName(name.to_owned()));
    }
    sys::cstring(name).map_err(|_| FsError::InvalidName(name.to_owned()))
}

const S_ISGID: u32 = libc::S_ISGID;

impl VolumeFs {
    /// Serve the directory `source` (trusted: it comes from the node agent, and may
    /// itself be reached through symlinks).
    pub fn new(source: &Path, options: Options, quota: Arc<Enforcement>) -> Result<Self> {
        let c = sys::cstring(source.as_os_str()).op("open source")?;
        // SAFETY: AT_FDCWD stands for the working directory in *at() calls for as
        // long as the process lives; relative sources resolve as they would for open().
        let cwd = unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) };
        let root = sys::openat(cwd, &c, libc::O_PATH | libc::O_DIRECTORY, 0).op("open source")?;
        let st = sys::fstat(root.as_fd()).op("stat source")?;
        let proc_fd = sys::openat(cwd, c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY, 0)
            .op("open /proc/self/fd")?;
        let inodes = InodeTable {
            root_key: (st.st_dev, st.st_ino),
            tables: Mutex::default(),
        };
        inodes.insert(root, &st);
        Ok(VolumeFs {
            inodes,
            handles: RwLock::default(),
            next_fh: AtomicU64::new(1),
            quota,
            proc_fd,
            options,
            passthrough: AtomicBool::new(false),
            stats: Stats::default(),
        })
    }

    /// Switch kernel passthrough on or off (the adapter does once the kernel agreed to
    /// it in `init`, and off again if registering files fails).
    pub fn set_passthrough(&self, on: bool) {
        self.passthrough.store(on, Ordering::Release);
    }

    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Acquire)
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

    /// The source directory's filesystem type (statfs `f_type`).
    pub fn backing_fs_type(&self) -> Result<i64> {
        let root = self.inodes.get(ROOT_ID)?;
        Ok(sys::fstatfs_type(root.fd.as_fd()).op("statfs")?)
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

    pub fn handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(FsError::UnknownHandle(fh))
    }

    fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(handle));
        fh
    }

    fn take_handle(&self, fh: u64) -> Result<Arc<Handle>> {
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh)
            .ok_or(FsError::UnknownHandle(fh))
    }

    /// Add the inode behind a fresh `O_PATH` fd to the table (one lookup).
    fn register(&self, fd: OwnedFd) -> Result<(Arc<Inode>, Attr)> {
        let st = sys::fstat(fd.as_fd()).op("stat")?;
        let inode = self.inodes.insert(fd, &st);
        let attr = Attr::from_stat(&st, inode.id);
        Ok((inode, attr))
    }

    fn stat_inode(&self, inode: &Inode) -> Result<Attr> {
        let st = sys::fstat(inode.fd.as_fd()).op("stat")?;
        Ok(Attr::from_stat(&st, inode.id))
    }

    // ---- names -------------------------------------------------------------------

    /// Resolve `name` in `parent` and count a kernel reference to the result.
    pub fn lookup(&self, parent: NodeId, name: &OsStr) -> Result<Attr> {
        let p = self.inode(parent)?;
        let b = name.as_bytes();
        // The kernel resolves `.` and `..` itself; answer them anyway, and never let
        // `..` leave the volume.
        if b == b"." || (b == b".." && p.id == ROOT_ID) {
            self.inodes.add_lookup(p.id)?;
            return self.stat_inode(&p);
        }
        let c = if b == b".." {
            c"..".to_owned()
        } else {
            component(name)?
        };
        let fd = sys::openat(p.fd.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0).op("lookup")?;
        Ok(self.register(fd)?.1)
    }

    pub fn forget(&self, id: NodeId, nlookup: u64) {
        self.inodes.forget(id, nlookup);
    }

    pub fn getattr(&self, id: NodeId, fh: Option<u64>) -> Result<Attr> {
        if let Some(h) = fh.and_then(|fh| self.handle(fh).ok()) {
            let st = sys::fstat(h.file.as_fd()).op("fstat")?;
            return Ok(Attr::from_stat(&st, h.inode.id));
        }
        self.stat_inode(&*self.inode(id)?)
    }

    pub fn setattr(&self, id: NodeId, set: SetAttr) -> Result<Attr> {
        self.writable()?;
        let inode = self.inode(id)?;
        let handle = set.fh.and_then(|fh| self.handle(fh).ok());
        if let Some(mode) = set.mode {
            if inode.kind == FileKind::Symlink {
                return Err(FsError::Unsupported("chmod of a symlink"));
            }
            sys::chmod_fd(self.proc_fd.as_fd(), inode.fd.as_fd(), mode & 0o7777).op("chmod")?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            sys::chown_fd(inode.fd.as_fd(), set.uid, set.gid).op("chown")?;
        }
        if let Some(size) = set.size {
            self.truncate(&inode, handle.as_deref(), size)?;
            if set.kill_suidgid && set.mode.is_none() {
                self.kill_suidgid(&inode, None)?;
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            sys::utimens_fd(
                inode.fd.as_fd(),
                &[timespec(set.atime), timespec(set.mtime)],
            )
            .op("utimensat")?;
        }
        self.stat_inode(&inode)
    }

    /// Drop set-user-ID, and set-group-ID if group-executable (otherwise it marks
    /// mandatory locking, not privilege), as a write or truncation by an unprivileged
    /// caller must. `mode` is the current mode when the caller has it at hand.
    fn kill_suidgid(&self, inode: &Inode, mode: Option<u32>) -> Result<()> {
        let mode = match mode {
            Some(m) => m,
            None => sys::fstat(inode.fd.as_fd()).op("stat")?.st_mode,
        };
        let mut keep = mode & 0o7777 & !libc::S_ISUID;
        if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
            keep &= !libc::S_ISGID;
        }
        if keep != mode & 0o7777 {
            sys::chmod_fd(self.proc_fd.as_fd(), inode.fd.as_fd(), keep).op("chmod")?;
        }
        Ok(())
    }

    fn truncate(&self, inode: &Inode, handle: Option<&Handle>, size: u64) -> Result<()> {
        match inode.kind {
            FileKind::Regular => {}
            FileKind::Directory => {
                return Err(FsError::Sys(SysError {
                    op: "truncate",
                    errno: Errno::EISDIR,
                }));
            }
            _ => return Err(FsError::WrongType("truncate")),
        }
        let _size = lock(&inode.size_lock);
        let reopened;
        let fd = match handle.filter(|h| h.writable) {
            Some(h) => h.file.as_fd(),
            None => {
                reopened = sys::reopen(self.proc_fd.as_fd(), inode.fd.as_fd(), libc::O_WRONLY)
                    .op("open for truncate")?;
                reopened.as_fd()
            }
        };
        let old = sys::fstat(fd).op("fstat")?.st_size as u64;
        if size > old {
            if !self.quota.reserve(size - old) {
                return Err(FsError::QuotaExceeded);
            }
            if let Err(e) = sys::ftruncate(fd, size).op("ftruncate") {
                self.quota.release(size - old);
                return Err(e.into());
            }
        } else {
            sys::ftruncate(fd, size).op("ftruncate")?;
            self.quota.release(old - size);
        }
        Ok(())
    }

    pub fn readlink(&self, id: NodeId) -> Result<Vec<u8>> {
        let inode = self.inode(id)?;
        if inode.kind != FileKind::Symlink {
            return Err(FsError::WrongType("readlink"));
        }
        Ok(sys::readlink_fd(inode.fd.as_fd()).op("readlink")?)
    }

    /// Give a new inode to the caller: the daemon created it as root.
    fn set_owner(
        &self,
        caller: Caller,
        parent: &Inode,
        fd: BorrowedFd<'_>,
        kind: FileKind,
        mode: u32,
    ) -> Result<()> {
        if caller.uid == 0 && caller.gid == 0 {
            // Root's new inode already has root's ids, or the parent's group when
            // the parent is set-group-ID: exactly what the caller would get.
            return Ok(());
        }
        let pst = sys::fstat(parent.fd.as_fd()).op("stat parent")?;
        // In a set-group-ID directory the new inode has inherited the directory's
        // group (and a directory the set-group-ID bit): keep that.
        let gid = (pst.st_mode & S_ISGID == 0).then_some(caller.gid);
        let uid = (caller.uid != 0).then_some(caller.uid);
        sys::chown_fd(fd, uid, gid).op("chown new inode")?;
        // chown clears set-user/group-ID bits of non-directories; the caller asked
        // for them, so put them back.
        if mode & 0o6000 != 0 && !matches!(kind, FileKind::Directory | FileKind::Symlink) {
            sys::chmod_fd(self.proc_fd.as_fd(), fd, mode & 0o7777).op("chmod new inode")?;
        }
        Ok(())
    }

    /// Finish creating `name` in `p`: open it `O_PATH`, hand it to the caller, count
    /// the lookup. On failure the half-made entry is removed again.
    fn adopt_new(
        &self,
        caller: Caller,
        p: &Inode,
        name: &CStr,
        kind: FileKind,
        mode: u32,
    ) -> Result<Attr> {
        let finish = || -> Result<Attr> {
            let fd = sys::openat(p.fd.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)
                .op("open new inode")?;
            self.set_owner(caller, p, fd.as_fd(), kind, mode)?;
            Ok(self.register(fd)?.1)
        };
        finish().inspect_err(|_| {
            let flags = if kind == FileKind::Directory {
                libc::AT_REMOVEDIR
            } else {
                0
            };
            let _ = sys::unlinkat(p.fd.as_fd(), name, flags);
        })
    }

    pub fn mknod(
        &self,
        caller: Caller,
        parent: NodeId,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        self.writable()?;
        let kind = FileKind::from_mode(mode);
        let device = matches!(kind, FileKind::CharDevice | FileKind::BlockDevice);
        if device && !self.options.devices || kind == FileKind::Directory {
            return Err(FsError::NotPermitted(
                "creating device nodes on a nodev mount",
            ));
        }
        let p = self.inode(parent)?;
        let c = component(name)?;
        sys::mknodat(
            p.fd.as_fd(),
            &c,
            (mode & libc::S_IFMT) | (mode & 0o7777),
            rdev as u64,
        )
        .op("mknod")?;
        self.adopt_new(caller, &p, &c, kind, mode)
    }

    pub fn mkdir(&self, caller: Caller, parent: NodeId, name: &OsStr, mode: u32) -> Result<Attr> {
        self.writable()?;
        let p = self.inode(parent)?;
        let c = component(name)?;
        sys::mkdirat(p.fd.as_fd(), &c, mode & 0o7777).op("mkdir")?;
        self.adopt_new(caller, &p, &c, FileKind::Directory, mode)
    }

    pub fn symlink(
        &self,
        caller: Caller,
        parent: NodeId,
        name: &OsStr,
        target: &Path,
    ) -> Result<Attr> {
        self.writable()?;
        let p = self.inode(parent)?;
        let c = component(name)?;
        // The target is stored, never resolved by the daemon.
        let t = sys::cstring(target.as_os_str()).op("symlink")?;
        sys::symlinkat(&t, p.fd.as_fd(), &c).op("symlink")?;
        self.adopt_new(caller, &p, &c, FileKind::Symlink, 0o777)
    }

    pub fn link(&self, id: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Attr> {
        self.writable()?;
        let inode = self.inode(id)?;
        let p = self.inode(new_parent)?;
        let c = component(new_name)?;
        sys::link_fd(inode.fd.as_fd(), p.fd.as_fd(), &c).op("link")?;
        self.inodes.add_lookup(inode.id)?;
        self.stat_inode(&inode)
    }

    /// The last link of a regular file of `size` bytes went away: free its bytes, or,
    /// if it is still open through the mount, free them at its last close.
    fn account_unlinked(&self, inode: Option<&Inode>, size: u64) {
        if let Some(inode) = inode {
            let mut io = lock(&inode.io);
            if io.open > 0 {
                io.orphan = true;
                return;
            }
        }
        self.quota.release(size);
    }

    pub fn unlink(&self, parent: NodeId, name: &OsStr) -> Result<()> {
        self.writable()?;
        let p = self.inode(parent)?;
        let c = component(name)?;
        let mut st = sys::fstatat(p.fd.as_fd(), &c).op("unlink")?;
        let victim = self.inodes.get_by_key((st.st_dev, st.st_ino));
        let _size = victim.as_ref().map(|v| lock(&v.size_lock));
        if victim.is_some() {
            // Stat again under the size lock: the size we release must be final.
            st = sys::fstatat(p.fd.as_fd(), &c).op("unlink")?;
        }
        sys::unlinkat(p.fd.as_fd(), &c, 0).op("unlink")?;
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink == 1 {
            self.account_unlinked(victim.as_deref(), st.st_size as u64);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: NodeId, name: &OsStr) -> Result<()> {
        self.writable()?;
        let p = self.inode(parent)?;
        let c = component(name)?;
        Ok(sys::unlinkat(p.fd.as_fd(), &c, libc::AT_REMOVEDIR).op("rmdir")?)
    }

    /// `renameat2` with `RENAME_NOREPLACE` / `RENAME_EXCHANGE` (`flags`).
    pub fn rename(
        &self,
        parent: NodeId,
        name: &OsStr,
        new_parent: NodeId,
        new_name: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.writable()?;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(FsError::Unsupported(
                "rename flags other than NOREPLACE/EXCHANGE",
            ));
        }
        let p = self.inode(parent)?;
        let np = self.inode(new_parent)?;
        let c = component(name)?;
        let nc = component(new_name)?;
        // A plain rename over a regular file unlinks that file.
        let mut replaces_file = false;
        let mut victim = None;
        if flags & libc::RENAME_EXCHANGE == 0
            && let Ok(st) = sys::fstatat(np.fd.as_fd(), &nc)
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && st.st_nlink == 1
        {
            let src = sys::fstatat(p.fd.as_fd(), &c).op("rename")?;
            if (src.st_dev, src.st_ino) != (st.st_dev, st.st_ino) {
                replaces_file = true;
                victim = self.inodes.get_by_key((st.st_dev, st.st_ino));
            }
        }
        let _size = victim.as_ref().map(|v| lock(&v.size_lock));
        // Stat again under the size lock: the size we release must be final.
        let replaced = replaces_file
            .then(|| sys::fstatat(np.fd.as_fd(), &nc).ok())
            .flatten()
            .filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink == 1);
        sys::renameat2(p.fd.as_fd(), &c, np.fd.as_fd(), &nc, flags).op("rename")?;
        if let Some(st) = replaced {
            self.account_unlinked(victim.as_deref(), st.st_size as u64);
        }
        Ok(())
    }

    // ---- files -------------------------------------------------------------------

    /// Pick the I/O mode of a new open of `inode` (with `flags`) and count it.
    fn choose_mode(&self, inode: &Inode, file: BorrowedFd<'_>, flags: i32) -> Result<IoMode> {
        let io = lock(&inode.io);
        let (mut io, mode) = match self.quota.mode() {
            Mode::Daemon => self.daemon_mode_io(inode, io, flags)?,
            // A passthrough write runs with the daemon's credentials, which may keep
            // set-user/group-ID bits a write by the caller must clear: such writers
            // go through the daemon, which clears them.
            Mode::Backend
                if flags & libc::O_ACCMODE != libc::O_RDONLY && has_set_id_bits(file)? =>
            {
                self.daemon_mode_io(inode, io, flags)?
            }
            Mode::Backend => {
                let mut io = io;
                let mode = Self::backend_mode_io(&mut io, flags, self.passthrough());
                (io, mode)
            }
        };
        io.open += 1;
        match mode {
            IoMode::Passthrough => &self.stats.opens_passthrough,
            IoMode::Cached => &self.stats.opens_cached,
            IoMode::Direct => &self.stats.opens_direct,
        }
        .fetch_add(1, Ordering::Relaxed);
        Ok(mode)
    }

    /// Daemon-enforced quota: every write must reach the daemon, so only read-only
    /// opens may be passthrough, and a writable open of a file that passthrough
    /// readers hold is refused (after waiting up to [`RELEASE_GRACE`]).
    fn daemon_mode_io<'a>(
        &self,
        inode: &'a Inode,
        mut io: MutexGuard<'a, IoState>,
        flags: i32,
    ) -> Result<(MutexGuard<'a, IoState>, IoMode)> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY && io.passthrough > 0 {
            // The kernel sends RELEASE asynchronously after close(): a reader that
            // has just closed may still be counted here. Give its release a moment
            // before calling the file busy.
            io = inode
                .io_released
                .wait_timeout_while(io, RELEASE_GRACE, |io| io.passthrough > 0)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let mode = match flags & libc::O_ACCMODE {
            libc::O_RDONLY if io.cached == 0 && self.passthrough() => {
                io.passthrough += 1;
                IoMode::Passthrough
            }
            // The kernel would only accept a passthrough open, and a passthrough
            // write bypasses the quota.
            libc::O_WRONLY | libc::O_RDWR if io.passthrough > 0 => {
                self.stats.opens_busy.fetch_add(1, Ordering::Relaxed);
                return Err(FsError::Busy);
            }
            libc::O_WRONLY => IoMode::Direct,
            _ => {
                io.cached += 1;
                IoMode::Cached
            }
        };
        Ok((io, mode))
    }

    /// Backend-enforced quota: the backing filesystem stops writers the daemon never
    /// sees, so every open is passthrough while the kernel does passthrough. An inode
    /// that has cached opens (passthrough was refused for one) takes more cached (or,
    /// write-only, direct) opens: the kernel never mixes cached and passthrough opens
    /// of one inode.
    fn backend_mode_io(io: &mut IoState, flags: i32, passthrough: bool) -> IoMode {
        if passthrough && io.cached == 0 {
            io.passthrough += 1;
            return IoMode::Passthrough;
        }
        if flags & libc::O_ACCMODE == libc::O_WRONLY {
            IoMode::Direct
        } else {
            io.cached += 1;
            IoMode::Cached
        }
    }

    /// Flags for the backing open of a file the kernel opens with `flags`.
    fn backing_flags(flags: i32) -> i32 {
        // O_DIRECT: our buffers are not aligned, and the kernel already bypassed its
        // cache for the caller. O_TRUNC: the kernel truncates through setattr (we do
        // not negotiate atomic O_TRUNC), where the quota sees it. O_APPEND stays, so
        // appends land at the backing file's end even if it changed behind us.
        flags
            & !(libc::O_CREAT
                | libc::O_EXCL
                | libc::O_NOCTTY
                | libc::O_NOFOLLOW
                | libc::O_DIRECT
                | libc::O_TRUNC
                | libc::O_CLOEXEC)
    }

    fn new_file_handle(&self, inode: Arc<Inode>, file: OwnedFd, flags: i32) -> Result<Opened> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let mode = self.choose_mode(&inode, file.as_fd(), flags)?;
        let fh = self.add_handle(Handle {
            inode,
            file,
            mode: AtomicU8::new(mode as u8),
            writable,
            append: flags & libc::O_APPEND != 0,
            dir: None,
        });
        Ok(Opened { fh, mode })
    }

    pub fn open(&self, id: NodeId, flags: i32) -> Result<Opened> {
        let inode = self.inode(id)?;
        if inode.kind != FileKind::Regular {
            return Err(FsError::WrongType("open"));
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.writable()?;
        }
        let file = sys::reopen(
            self.proc_fd.as_fd(),
            inode.fd.as_fd(),
            Self::backing_flags(flags),
        )
        .op("open")?;
        self.new_file_handle(inode, file, flags)
    }

    pub fn create(
        &self,
        caller: Caller,
        parent: NodeId,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Opened)> {
        self.writable()?;
        let p = self.inode(parent)?;
        let c = component(name)?;
        // O_EXCL always: the kernel only creates after a negative lookup, so an
        // existing file here was made behind our back; never truncate or reuse it.
        let file = sys::openat(
            p.fd.as_fd(),
            &c,
            Self::backing_flags(flags) | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode & 0o7777,
        )
        .op("create")?;
        let finish = || -> Result<(Arc<Inode>, Attr)> {
            self.set_owner(caller, &p, file.as_fd(), FileKind::Regular, mode)?;
            // The O_PATH descriptor of the very inode we created (no second name lookup).
            let path_fd = sys::openat(
                self.proc_fd.as_fd(),
                &sys::fd_name(file.as_raw_fd()),
                libc::O_PATH,
                0,
            )
            .op("create")?;
            self.register(path_fd)
        };
        let (inode, attr) = finish().inspect_err(|_| {
            let _ = sys::unlinkat(p.fd.as_fd(), &c, 0);
        })?;
        let id = inode.id;
        match self.new_file_handle(inode, file, flags) {
            Ok(opened) => Ok((attr, opened)),
            Err(e) => {
                // The kernel gets no entry: drop the lookup we counted.
                self.inodes.forget(id, 1);
                Err(e)
            }
        }
    }

    /// Registering the file for passthrough failed: serve it with cached I/O instead.
    /// (Registration happens at the first passthrough open of an inode, so there is no
    /// other passthrough open the kernel would find in conflict.)
    pub fn passthrough_failed(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        if h.mode.swap(IoMode::Cached as u8, Ordering::AcqRel) == IoMode::Passthrough as u8 {
            let mut io = lock(&h.inode.io);
            io.passthrough -= 1;
            io.cached += 1;
            h.inode.io_released.notify_all();
            self.stats
                .passthrough_failures
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    pub fn read(&self, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let h = self.handle(fh)?;
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        // FUSE wants the full count except at end of file.
        let mut done = 0;
        while done < buf.len() {
            let n =
                sys::pread(h.file.as_fd(), &mut buf[done..], offset + done as u64).op("read")?;
            if n == 0 {
                break;
            }
            done += n;
        }
        self.stats
            .read_bytes
            .fetch_add(done as u64, Ordering::Relaxed);
        Ok(done)
    }

    /// Write `data` at `offset`, within the quota: the part that would grow the volume
    /// past its capacity is cut off (a short write), and a write of which nothing fits
    /// fails with ENOSPC. Nothing already written is touched.
    ///
    /// `kill_suidgid`: the writer lacks `CAP_FSETID`, so set-user/group-ID bits go
    /// (the kernel leaves that to the daemon, see `FUSE_HANDLE_KILLPRIV_V2`).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8], kill_suidgid: bool) -> Result<usize> {
        self.writable()?;
        let h = self.handle(fh)?;
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        let _size = lock(&h.inode.size_lock);
        let st = sys::fstat(h.file.as_fd()).op("fstat")?;
        if kill_suidgid && st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
            self.kill_suidgid(&h.inode, Some(st.st_mode))?;
        }
        let size = st.st_size as u64;
        let offset = if h.append { size } else { offset };
        let end = offset.checked_add(data.len() as u64).ok_or(SysError {
            op: "write",
            errno: Errno::EFBIG,
        })?;
        let growth = end.saturating_sub(size);
        let granted = self.quota.reserve_up_to(growth);
        let allowed = (data.len() as u64).saturating_sub(growth - granted) as usize;
        if allowed == 0 && !data.is_empty() {
            self.quota.release(granted);
            return Err(FsError::QuotaExceeded);
        }
        let mut done = 0;
        while done < allowed {
            match sys::pwrite(h.file.as_fd(), &data[done..allowed], offset + done as u64)
                .op("write")
            {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if done == 0 => {
                    self.quota.release(granted);
                    return Err(e.into());
                }
                Err(_) => break,
            }
        }
        let grown = (offset + done as u64).saturating_sub(size);
        self.quota.release(granted.saturating_sub(grown));
        self.stats
            .write_bytes
            .fetch_add(done as u64, Ordering::Relaxed);
        Ok(done)
    }

    /// `copy_file_range` between two open files, within the quota like [`Self::write`].
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<usize> {
        self.writable()?;
        let hin = self.handle(fh_in)?;
        let hout = self.handle(fh_out)?;
        let _size = lock(&hout.inode.size_lock);
        let size = sys::fstat(hout.file.as_fd()).op("fstat")?.st_size as u64;
        let in_size = sys::fstat(hin.file.as_fd()).op("fstat")?.st_size as u64;
        // Bytes past the source's end are not copied; do not reserve for them.
        let len = len.min(in_size.saturating_sub(off_in));
        if len == 0 {
            return Ok(0);
        }
        let end = off_out.saturating_add(len);
        let growth = end.saturating_sub(size);
        let granted = self.quota.reserve_up_to(growth);
        let allowed = len.saturating_sub(growth - granted);
        if allowed == 0 {
            self.quota.release(granted);
            return Err(FsError::QuotaExceeded);
        }
        let n = match sys::copy_file_range(
            hin.file.as_fd(),
            off_in,
            hout.file.as_fd(),
            off_out,
            allowed,
        )
        .op("copy_file_range")
        {
            Ok(n) => n,
            Err(e) => {
                self.quota.release(granted);
                return Err(e.into());
            }
        };
        let grown = (off_out + n as u64).saturating_sub(size);
        self.quota.release(granted.saturating_sub(grown));
        Ok(n)
    }

    /// `fallocate`. With the daemon's quota, preallocation past the end of file
    /// (`FALLOC_FL_KEEP_SIZE` without punching a hole) is refused: it takes disk space
    /// without changing the size the daemon counts. A project quota counts blocks, so
    /// there it is allowed.
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.writable()?;
        let h = self.handle(fh)?;
        let _size = lock(&h.inode.size_lock);
        let size = sys::fstat(h.file.as_fd()).op("fstat")?.st_size as u64;
        let end = offset.saturating_add(len);
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let predicted = if mode & libc::FALLOC_FL_INSERT_RANGE != 0 {
            len
        } else if mode & libc::FALLOC_FL_COLLAPSE_RANGE != 0 || keep_size {
            if keep_size && !punch && end > size && self.quota.mode() == Mode::Daemon {
                return Err(FsError::Unsupported("preallocation past the end of file"));
            }
            0
        } else {
            end.saturating_sub(size)
        };
        if !self.quota.reserve(predicted) {
            return Err(FsError::QuotaExceeded);
        }
        if let Err(e) = sys::fallocate(h.file.as_fd(), mode, offset, len).op("fallocate") {
            self.quota.release(predicted);
            return Err(e.into());
        }
        let new = sys::fstat(h.file.as_fd()).op("fstat")?.st_size as u64;
        if new >= size {
            let grown = new - size;
            if grown > predicted {
                self.quota.charge(grown - predicted);
            } else {
                self.quota.release(predicted - grown);
            }
        } else {
            self.quota.release(predicted + (size - new));
        }
        Ok(())
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        let h = self.handle(fh)?;
        Ok(sys::lseek(h.file.as_fd(), offset, whence).op("lseek")?)
    }

    pub fn flush(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        Ok(sys::flush(h.file.as_fd()).op("flush")?)
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        let h = self.handle(fh)?;
        Ok(sys::fsync(h.file.as_fd(), datasync).op("fsync")?)
    }

    pub fn release(&self, fh: u64) -> Result<()> {
        let h = self.take_handle(fh)?;
        let orphan_done = {
            let mut io = lock(&h.inode.io);
            match h.mode() {
                IoMode::Passthrough => {
                    io.passthrough -= 1;
                    if io.passthrough == 0 {
                        h.inode.io_released.notify_all();
                    }
                }
                IoMode::Cached => io.cached -= 1,
                IoMode::Direct => {}
            }
            io.open -= 1;
            if io.open == 0 && io.orphan {
                io.orphan = false;
                true
            } else {
                false
            }
        };
        if orphan_done {
            match sys::fstat(h.file.as_fd()) {
                Ok(st) if st.st_nlink == 0 => self.quota.release(st.st_size as u64),
                // Linked again meanwhile (linkat of an open file): still counted.
                _ => {}
            }
        }
        Ok(())
    }

    // ---- directories -------------------------------------------------------------

    pub fn opendir(&self, id: NodeId) -> Result<u64> {
        let inode = self.inode(id)?;
        if inode.kind != FileKind::Directory {
            return Err(FsError::Sys(SysError {
                op: "opendir",
                errno: Errno::ENOTDIR,
            }));
        }
        let file = sys::openat(
            inode.fd.as_fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .op("opendir")?;
        Ok(self.add_handle(Handle {
            inode,
            file,
            mode: AtomicU8::new(IoMode::Cached as u8),
            writable: false,
            append: false,
            dir: Some(Mutex::new(DirStream {
                buf: vec![0; 32 * 1024],
                start: 0,
                end: 0,
                pos: 0,
            })),
        }))
    }

    pub fn releasedir(&self, fh: u64) -> Result<()> {
        self.take_handle(fh).map(drop)
    }

    pub fn fsyncdir(&self, fh: u64, datasync: bool) -> Result<()> {
        self.fsync(fh, datasync)
    }

    /// Feed directory entries from `offset` on to `emit` until it returns `true`
    /// ("full"); the entry it refused is returned again by the next call.
    pub fn readdir(
        &self,
        fh: u64,
        offset: i64,
        mut emit: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.walk_dir(fh, offset, |h, ent| {
            let ino = if ent.name == b".." && h.inode.id == ROOT_ID {
                ROOT_ID
            } else {
                self.inodes.dirent_ino(ent.ino)
            };
            Ok(emit(DirEntry {
                ino,
                offset: ent.off,
                kind: FileKind::from_dtype(ent.kind).unwrap_or(FileKind::Regular),
                name: OsStr::from_bytes(ent.name),
            }))
        })
    }

    /// Like [`Self::readdir`], with each entry looked up (one kernel reference each,
    /// except `.` and `..`, which the kernel does not link). An entry `emit` refuses
    /// is forgotten again.
    pub fn readdirplus(
        &self,
        fh: u64,
        offset: i64,
        mut emit: impl FnMut(DirEntry<'_>, &Attr) -> bool,
    ) -> Result<()> {
        self.walk_dir(fh, offset, |h, ent| {
            let name = OsStr::from_bytes(ent.name);
            let kind = FileKind::from_dtype(ent.kind).unwrap_or(FileKind::Directory);
            if ent.name == b"." || ent.name == b".." {
                let st = sys::fstat(h.file.as_fd()).op("stat")?;
                let ino = if ent.name == b"." || h.inode.id == ROOT_ID {
                    h.inode.id
                } else {
                    self.inodes.dirent_ino(ent.ino)
                };
                let attr = Attr::from_stat(&st, ino);
                return Ok(emit(
                    DirEntry {
                        ino,
                        offset: ent.off,
                        kind,
                        name,
                    },
                    &attr,
                ));
            }
            let c = CString::new(ent.name).map_err(|_| FsError::InvalidName(name.to_owned()))?;
            let fd = match sys::openat(h.file.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Ok(fd) => fd,
                // Gone since getdents: skip it.
                Err(Errno::ENOENT) => return Ok(false),
                Err(errno) => {
                    return Err(FsError::Sys(SysError {
                        op: "lookup",
                        errno,
                    }));
                }
            };
            let (_, attr) = self.register(fd)?;
            let full = emit(
                DirEntry {
                    ino: attr.ino,
                    offset: ent.off,
                    kind: attr.kind,
                    name,
                },
                &attr,
            );
            if full {
                self.inodes.forget(attr.ino, 1);
            }
            Ok(full)
        })
    }

    fn walk_dir(
        &self,
        fh: u64,
        offset: i64,
        mut f: impl FnMut(&Handle, sys::Dirent<'_>) -> Result<bool>,
    ) -> Result<()> {
        let h = self.handle(fh)?;
        let dir = h.dir.as_ref().ok_or(FsError::WrongType("readdir"))?;
        let mut d = lock(dir);
        if offset != d.pos {
            sys::lseek(h.file.as_fd(), offset, libc::SEEK_SET).op("seekdir")?;
            d.start = 0;
            d.end = 0;
            d.pos = offset;
        }
        loop {
            if d.start >= d.end {
                let DirStream { buf, .. } = &mut *d;
                let n = sys::getdents64(h.file.as_fd(), buf).op("getdents")?;
                if n == 0 {
                    return Ok(());
                }
                d.start = 0;
                d.end = n;
            }
            let ent = sys::parse_dirent(&d.buf[d.start..d.end]).ok_or(SysError {
                op: "getdents",
                errno: Errno::EIO,
            })?;
            let (reclen, off) = (ent.reclen, ent.off);
            if f(&h, ent)? {
                return Ok(());
            }
            d.start += reclen;
            d.pos = off;
        }
    }

    // ---- the rest ----------------------------------------------------------------

    /// Capacity and free space from the quota (the daemon's count or the project
    /// quota's limit and usage; free capped by what the backing filesystem really
    /// has), inodes from the backing filesystem.
    pub fn statfs(&self) -> Result<StatFs> {
        let root = self.inode(ROOT_ID)?;
        let vfs = sys::fstatvfs(root.fd.as_fd()).op("statfs")?;
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

    /// `/proc/self/fd/N` of an inode, for the xattr calls (never for a symlink:
    /// its magic link would be followed).
    fn xattr_path(&self, inode: &Inode) -> Option<CString> {
        (inode.kind != FileKind::Symlink).then(|| {
            CString::new(format!("/proc/self/fd/{}", inode.fd.as_raw_fd()))
                .expect("no NUL in a number")
        })
    }

    pub fn getxattr(&self, id: NodeId, name: &OsStr, size: u32) -> Result<Xattr> {
        let inode = self.inode(id)?;
        let Some(path) = self.xattr_path(&inode) else {
            return Err(FsError::Sys(SysError {
                op: "getxattr",
                errno: Errno::ENODATA,
            }));
        };
        let n = sys::cstring(name).op("getxattr")?;
        if size == 0 {
            let len = sys::getxattr(&path, &n, &mut []).op("getxattr")?;
            return Ok(Xattr::Size(len as u32));
        }
        let mut buf = vec![0u8; size as usize];
        let len = sys::getxattr(&path, &n, &mut buf).op("getxattr")?;
        buf.truncate(len);
        Ok(Xattr::Data(buf))
    }

    pub fn listxattr(&self, id: NodeId, size: u32) -> Result<Xattr> {
        let inode = self.inode(id)?;
        let Some(path) = self.xattr_path(&inode) else {
            return Ok(if size == 0 {
                Xattr::Size(0)
            } else {
                Xattr::Data(Vec::new())
            });
        };
        if size == 0 {
            let len = sys::listxattr(&path, &mut []).op("listxattr")?;
            return Ok(Xattr::Size(len as u32));
        }
        let mut buf = vec![0u8; size as usize];
        let len = sys::listxattr(&path, &mut buf).op("listxattr")?;
        buf.truncate(len);
        Ok(Xattr::Data(buf))
    }

    pub fn setxattr(&self, id: NodeId, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.writable()?;
        // POSIX ACLs would be stored but not enforced (the kernel checks permissions
        // from mode bits alone on this mount): refuse them rather than mislead.
        if name == "system.posix_acl_access" || name == "system.posix_acl_default" {
            return Err(FsError::Unsupported("POSIX ACLs"));
        }
        let inode = self.inode(id)?;
        let path = self
            .xattr_path(&inode)
            .ok_or(FsError::NotPermitted("xattrs on symlinks"))?;
        let n = sys::cstring(name).op("setxattr")?;
        Ok(sys::setxattr(&path, &n, value, flags).op("setxattr")?)
    }

    pub fn removexattr(&self, id: NodeId, name: &OsStr) -> Result<()> {
        self.writable()?;
        let inode = self.inode(id)?;
        let path = self
            .xattr_path(&inode)
            .ok_or(FsError::NotPermitted("xattrs on symlinks"))?;
        let n = sys::cstring(name).op("removexattr")?;
        Ok(sys::removexattr(&path, &n).op("removexattr")?)
    }

    /// `access(2)`. With `default_permissions` the kernel answers it itself; this is
    /// the answer for mounts without it, from the mode bits and the caller's ids.
    pub fn access(&self, caller: Caller, id: NodeId, mask: i32) -> Result<()> {
        let inode = self.inode(id)?;
        let st = sys::fstat(inode.fd.as_fd()).op("access")?;
        if mask == libc::F_OK {
            return Ok(());
        }
        if mask & libc::W_OK != 0 && self.options.read_only {
            return Err(FsError::ReadOnly);
        }
        let mode = st.st_mode;
        let mask = mask as u32 & 0o7;
        if caller.uid == 0 {
            let dir = mode & libc::S_IFMT == libc::S_IFDIR;
            if mask & libc::X_OK as u32 != 0 && !dir && mode & 0o111 == 0 {
                return Err(FsError::AccessDenied);
            }
            return Ok(());
        }
        let bits = if st.st_uid == caller.uid {
            (mode >> 6) & 7
        } else if st.st_gid == caller.gid {
            (mode >> 3) & 7
        } else {
            mode & 7
        };
        if bits & mask == mask {
            Ok(())
        } else {
            Err(FsError::AccessDenied)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::quota::Accounting;
    use std::os::unix::fs::MetadataExt;

    fn daemon_quota(capacity: u64, used: u64) -> Arc<Enforcement> {
        Arc::new(Accounting::new(capacity, used).into())
    }

    const ROOT: Caller = Caller { uid: 0, gid: 0 };

    fn volume(capacity: u64) -> (tempfile::TempDir, VolumeFs) {
        let dir = tempfile::tempdir().unwrap();
        let fs = VolumeFs::new(dir.path(), Options::default(), daemon_quota(capacity, 0)).unwrap();
        (dir, fs)
    }

    fn os(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    #[test]
    fn dotdot_of_the_root_is_the_root() {
        let (_dir, fs) = volume(1 << 20);
        assert_eq!(fs.lookup(ROOT_ID, os("..")).unwrap().ino, ROOT_ID);
        assert_eq!(fs.lookup(ROOT_ID, os(".")).unwrap().ino, ROOT_ID);
    }

    #[test]
    fn names_are_single_components() {
        let (_dir, fs) = volume(1 << 20);
        for bad in ["a/b", "/etc", "../x", ""] {
            let err = fs.lookup(ROOT_ID, os(bad)).unwrap_err();
            assert_eq!(err.errno(), libc::EINVAL, "{bad}: {err}");
        }
        let err = fs.mkdir(ROOT, ROOT_ID, os(".."), 0o755).unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL);
    }

    #[test]
    fn symlinks_are_never_followed() {
        let (dir, fs) = volume(1 << 20);
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        let link = fs.lookup(ROOT_ID, os("etc")).unwrap();
        assert_eq!(link.kind, FileKind::Symlink);
        assert_eq!(fs.readlink(link.ino).unwrap(), b"/etc");
        // Looking inside the link, opening or truncating through it all fail.
        assert_eq!(
            fs.lookup(link.ino, os("passwd")).unwrap_err().errno(),
            libc::ENOTDIR
        );
        assert_eq!(fs.opendir(link.ino).unwrap_err().errno(), libc::ENOTDIR);
        assert!(fs.open(link.ino, libc::O_RDONLY).is_err());
        let set = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        assert!(fs.setattr(link.ino, set).is_err());
        // Ownership changes apply to the link, not to /etc.
        let before = std::fs::metadata("/etc").unwrap();
        let set = SetAttr {
            uid: Some(4242),
            ..SetAttr::default()
        };
        fs.setattr(link.ino, set).unwrap();
        assert_eq!(std::fs::metadata("/etc").unwrap().uid(), before.uid());
        assert_eq!(
            std::fs::symlink_metadata(dir.path().join("etc"))
                .unwrap()
                .uid(),
            4242
        );
    }

    #[test]
    fn writes_stop_at_the_quota_and_keep_what_was_written() {
        let (dir, fs) = volume(10_000);
        let (_, f) = fs
            .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_WRONLY)
            .unwrap();
        assert_eq!(fs.write(f.fh, 0, &[1u8; 6000], false).unwrap(), 6000);
        // Partly fits: cut at the boundary.
        assert_eq!(fs.write(f.fh, 6000, &[2u8; 6000], false).unwrap(), 4000);
        let err = fs.write(f.fh, 10_000, &[3u8; 1], false).unwrap_err();
        assert_eq!(err.errno(), libc::ENOSPC);
        // Overwriting inside the file needs no space.
        assert_eq!(fs.write(f.fh, 0, &[4u8; 100], false).unwrap(), 100);
        fs.release(f.fh).unwrap();
        let data = std::fs::read(dir.path().join("f")).unwrap();
        assert_eq!(data.len(), 10_000);
        assert!(data[..100].iter().all(|&b| b == 4));
        assert!(data[100..6000].iter().all(|&b| b == 1));
        assert!(data[6000..].iter().all(|&b| b == 2));
        assert_eq!(fs.usage().unwrap().used, 10_000);
        fs.unlink(ROOT_ID, os("f")).unwrap();
        assert_eq!(fs.usage().unwrap().used, 0);
    }

    #[test]
    fn truncate_and_fallocate_are_counted() {
        let (_dir, fs) = volume(1 << 20);
        let (attr, f) = fs
            .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_RDWR)
            .unwrap();
        let grow = SetAttr {
            size: Some(4096),
            fh: Some(f.fh),
            ..SetAttr::default()
        };
        fs.setattr(attr.ino, grow).unwrap();
        assert_eq!(fs.usage().unwrap().used, 4096);
        let too_big = SetAttr {
            size: Some(2 << 20),
            ..SetAttr::default()
        };
        assert_eq!(
            fs.setattr(attr.ino, too_big).unwrap_err().errno(),
            libc::ENOSPC
        );
        fs.fallocate(f.fh, 0, 8192, 0).unwrap();
        assert_eq!(fs.usage().unwrap().used, 8192);
        let err = fs
            .fallocate(f.fh, 0, 1 << 30, libc::FALLOC_FL_KEEP_SIZE)
            .unwrap_err();
        assert_eq!(err.errno(), libc::EOPNOTSUPP);
        fs.fallocate(
            f.fh,
            0,
            4096,
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE,
        )
        .unwrap();
        assert_eq!(fs.usage().unwrap().used, 8192);
        let shrink = SetAttr {
            size: Some(100),
            ..SetAttr::default()
        };
        fs.setattr(attr.ino, shrink).unwrap();
        assert_eq!(fs.usage().unwrap().used, 100);
        fs.release(f.fh).unwrap();
    }

    #[test]
    fn unlinked_open_files_leave_the_quota_at_last_close() {
        let (_dir, fs) = volume(1 << 20);
        let (_, f) = fs
            .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_RDWR)
            .unwrap();
        fs.write(f.fh, 0, &[0u8; 1000], false).unwrap();
        fs.unlink(ROOT_ID, os("f")).unwrap();
        assert_eq!(fs.usage().unwrap().used, 1000);
        fs.write(f.fh, 1000, &[0u8; 500], false).unwrap();
        assert_eq!(fs.usage().unwrap().used, 1500);
        fs.release(f.fh).unwrap();
        assert_eq!(fs.usage().unwrap().used, 0);
    }

    #[test]
    fn rename_over_a_file_frees_it_and_flags_are_honoured() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), [0u8; 10]).unwrap();
        std::fs::write(dir.path().join("b"), [0u8; 20]).unwrap();
        let fs = VolumeFs::new(dir.path(), Options::default(), daemon_quota(1 << 20, 30)).unwrap();
        let err = fs
            .rename(ROOT_ID, os("a"), ROOT_ID, os("b"), libc::RENAME_NOREPLACE)
            .unwrap_err();
        assert_eq!(err.errno(), libc::EEXIST);
        fs.rename(ROOT_ID, os("a"), ROOT_ID, os("b"), libc::RENAME_EXCHANGE)
            .unwrap();
        assert_eq!(std::fs::read(dir.path().join("a")).unwrap().len(), 20);
        assert_eq!(fs.usage().unwrap().used, 30);
        // After the exchange `b` holds the 10 bytes; renaming `a` over it frees them.
        fs.rename(ROOT_ID, os("a"), ROOT_ID, os("b"), 0).unwrap();
        assert_eq!(fs.usage().unwrap().used, 20);
        assert!(!dir.path().join("a").exists());
    }

    #[test]
    fn new_inodes_belong_to_the_caller() {
        let (dir, fs) = volume(1 << 20);
        let user = Caller {
            uid: 1234,
            gid: 5678,
        };
        let (_, f) = fs
            .create(user, ROOT_ID, os("f"), 0o4755, libc::O_WRONLY)
            .unwrap();
        fs.release(f.fh).unwrap();
        fs.mkdir(user, ROOT_ID, os("d"), 0o755).unwrap();
        fs.symlink(user, ROOT_ID, os("l"), Path::new("f")).unwrap();
        for name in ["f", "d", "l"] {
            let m = std::fs::symlink_metadata(dir.path().join(name)).unwrap();
            assert_eq!((m.uid(), m.gid()), (1234, 5678), "{name}");
        }
        // chown cleared set-user-ID; it was put back.
        let m = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o4755);
    }

    #[test]
    fn read_only_refuses_changes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let fs = VolumeFs::new(
            dir.path(),
            Options {
                read_only: true,
                devices: false,
            },
            daemon_quota(1 << 20, 1),
        )
        .unwrap();
        let f = fs.lookup(ROOT_ID, os("f")).unwrap();
        assert_eq!(
            fs.open(f.ino, libc::O_WRONLY).unwrap_err().errno(),
            libc::EROFS
        );
        assert_eq!(
            fs.mkdir(ROOT, ROOT_ID, os("d"), 0o755).unwrap_err().errno(),
            libc::EROFS
        );
        assert_eq!(
            fs.unlink(ROOT_ID, os("f")).unwrap_err().errno(),
            libc::EROFS
        );
        let o = fs.open(f.ino, libc::O_RDONLY).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(fs.read(o.fh, 0, &mut buf).unwrap(), 1);
    }

    #[test]
    fn readdir_resumes_where_the_reply_was_full() {
        let (dir, fs) = volume(1 << 20);
        for i in 0..100 {
            std::fs::write(dir.path().join(format!("f{i:03}")), b"").unwrap();
        }
        let fh = fs.opendir(ROOT_ID).unwrap();
        let mut names = Vec::new();
        let mut offset = 0;
        loop {
            let mut batch = 0;
            let mut last = offset;
            fs.readdir(fh, offset, |e| {
                if batch == 7 {
                    return true;
                }
                batch += 1;
                names.push(e.name.to_string_lossy().into_owned());
                last = e.offset;
                false
            })
            .unwrap();
            if batch == 0 {
                break;
            }
            offset = last;
        }
        names.sort();
        assert_eq!(names.len(), 102);
        assert_eq!(names[0], ".");
        assert_eq!(names[1], "..");
        assert_eq!(names[2], "f000");
        fs.releasedir(fh).unwrap();
    }

    #[test]
    fn readdirplus_counts_lookups_only_for_what_was_sent() {
        let (dir, fs) = volume(1 << 20);
        std::fs::write(dir.path().join("a"), b"").unwrap();
        std::fs::write(dir.path().join("b"), b"").unwrap();
        let fh = fs.opendir(ROOT_ID).unwrap();
        let mut sent = 0;
        fs.readdirplus(fh, 0, |e, attr| {
            if e.name == "." || e.name == ".." {
                assert_eq!(attr.kind, FileKind::Directory);
                return false;
            }
            sent += 1;
            sent > 1
        })
        .unwrap();
        // One entry sent, the refused one forgotten again: root + 1 inode.
        assert_eq!(fs.inode_count(), 2);
        fs.releasedir(fh).unwrap();
    }

    #[test]
    fn io_modes_never_mix_passthrough_and_cached() {
        let (dir, fs) = volume(1 << 20);
        std::fs::write(dir.path().join("f"), b"data").unwrap();
        fs.set_passthrough(true);
        let f = fs.lookup(ROOT_ID, os("f")).unwrap();
        let r1 = fs.open(f.ino, libc::O_RDONLY).unwrap();
        assert_eq!(r1.mode, IoMode::Passthrough);
        let r2 = fs.open(f.ino, libc::O_RDONLY).unwrap();
        assert_eq!(r2.mode, IoMode::Passthrough);
        // A writer would have to be passthrough too, out of the quota's sight.
        for flags in [libc::O_RDWR, libc::O_WRONLY] {
            let err = fs.open(f.ino, flags).unwrap_err();
            assert_eq!(err.errno(), libc::ETXTBSY);
        }
        fs.release(r1.fh).unwrap();
        fs.release(r2.fh).unwrap();
        // Write-only first: direct I/O, and readers may still use passthrough.
        let w = fs.open(f.ino, libc::O_WRONLY).unwrap();
        assert_eq!(w.mode, IoMode::Direct);
        let r3 = fs.open(f.ino, libc::O_RDONLY).unwrap();
        assert_eq!(r3.mode, IoMode::Passthrough);
        fs.release(r3.fh).unwrap();
        // Read-write first: cached, and readers join it in cached mode.
        let rw = fs.open(f.ino, libc::O_RDWR).unwrap();
        assert_eq!(rw.mode, IoMode::Cached);
        let r4 = fs.open(f.ino, libc::O_RDONLY).unwrap();
        assert_eq!(r4.mode, IoMode::Cached);
        for h in [w, rw, r4] {
            fs.release(h.fh).unwrap();
        }
        let r5 = fs.open(f.ino, libc::O_RDONLY).unwrap();
        assert_eq!(r5.mode, IoMode::Passthrough);
        // The kernel refused the backing file: cached, and writers are welcome again.
        fs.passthrough_failed(r5.fh).unwrap();
        let w = fs.open(f.ino, libc::O_RDWR).unwrap();
        assert_eq!(w.mode, IoMode::Cached);
    }

    #[test]
    fn backend_mode_puts_every_open_through_unless_cached_opens_exist() {
        let mut io = IoState::default();
        for flags in [libc::O_RDWR, libc::O_WRONLY, libc::O_RDONLY] {
            assert_eq!(
                VolumeFs::backend_mode_io(&mut io, flags, true),
                IoMode::Passthrough
            );
        }
        assert_eq!((io.passthrough, io.cached), (3, 0));
        // Without passthrough (kernel, or --no-passthrough): the daemon's I/O modes,
        // and once an inode has cached opens, no passthrough joins them.
        let mut io = IoState::default();
        assert_eq!(
            VolumeFs::backend_mode_io(&mut io, libc::O_WRONLY, false),
            IoMode::Direct
        );
        assert_eq!(
            VolumeFs::backend_mode_io(&mut io, libc::O_RDWR, false),
            IoMode::Cached
        );
        assert_eq!(
            VolumeFs::backend_mode_io(&mut io, libc::O_RDONLY, true),
            IoMode::Cached
        );
        assert_eq!((io.passthrough, io.cached), (0, 2));
    }

    #[test]
    fn hard_links_share_one_inode_and_do_not_double_count() {
        let (dir, fs) = volume(1 << 20);
        let (attr, f) = fs
            .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_WRONLY)
            .unwrap();
        fs.write(f.fh, 0, &[0u8; 100], false).unwrap();
        fs.release(f.fh).unwrap();
        let l = fs.link(attr.ino, ROOT_ID, os("g")).unwrap();
        assert_eq!(l.ino, attr.ino);
        assert_eq!(l.nlink, 2);
        fs.unlink(ROOT_ID, os("f")).unwrap();
        assert_eq!(fs.usage().unwrap().used, 100);
        fs.unlink(ROOT_ID, os("g")).unwrap();
        assert_eq!(fs.usage().unwrap().used, 0);
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn xattrs_and_times() {
        let (dir, fs) = volume(1 << 20);
        let (attr, f) = fs
            .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_WRONLY)
            .unwrap();
        fs.release(f.fh).unwrap();
        fs.setxattr(attr.ino, os("user.k"), b"v", 0).unwrap();
        assert_eq!(
            fs.getxattr(attr.ino, os("user.k"), 0).unwrap(),
            Xattr::Size(1)
        );
        assert_eq!(
            fs.getxattr(attr.ino, os("user.k"), 10).unwrap(),
            Xattr::Data(b"v".to_vec())
        );
        let Xattr::Data(list) = fs.listxattr(attr.ino, 100).unwrap() else {
            panic!("asked for data")
        };
        assert!(list.split(|&b| b == 0).any(|n| n == b"user.k"));
        fs.removexattr(attr.ino, os("user.k")).unwrap();
        assert_eq!(
            fs.getxattr(attr.ino, os("user.k"), 10).unwrap_err().errno(),
            libc::ENODATA
        );
        let t = UNIX_EPOCH + Duration::new(1_000_000, 5);
        let set = SetAttr {
            mtime: Some(SetTime::At(t)),
            atime: Some(SetTime::At(UNIX_EPOCH - Duration::from_secs(10))),
            mode: Some(0o600),
            ..SetAttr::default()
        };
        let a = fs.setattr(attr.ino, set).unwrap();
        assert_eq!(a.mtime, t);
        assert_eq!(a.perm, 0o600);
        let m = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(m.atime(), -10);
    }

    #[test]
    fn statfs_reports_the_quota() {
        let (_dir, fs) = volume(64 << 20);
        let (_, f) = fs
            .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_WRONLY)
            .unwrap();
        fs.write(f.fh, 0, &vec![0u8; 1 << 20], false).unwrap();
        let s = fs.statfs().unwrap();
        assert_eq!(s.blocks * s.frsize as u64, 64 << 20);
        assert_eq!(s.bfree * s.frsize as u64, 63 << 20);
        assert!(s.files > 0);
        fs.release(f.fh).unwrap();
    }
}
