//! The plain types the core answers in: node ids, attributes, what `setattr` changes,
//! directory entries, statfs, xattr replies, the mount's options and counters, the
//! I/O mode of an open and the I/O state of an inode (`iomode` has the rules).

use std::ffi::OsStr;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A node id as the kernel knows it (and the `st_ino` it shows).
pub type NodeId = u64;

/// FUSE's fixed id of the root directory.
pub const ROOT_ID: NodeId = 1;

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
    pub(super) fn from_mode(mode: u32) -> Self {
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

    pub(super) fn from_dtype(d_type: u8) -> Option<Self> {
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

    pub(super) fn from_stat(st: &libc::stat, ino: NodeId) -> Self {
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

/// Who sends a request (the caller's fsuid/fsgid and pid, from the request header;
/// the pid is 0 when the caller is in a pid namespace the mounter cannot see).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A timestamp to set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

pub(super) fn timespec(t: Option<SetTime>) -> libc::timespec {
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
    /// The caller, when it lacks `CAP_FSETID`: clear set-user-ID and set-group-ID
    /// along with a size change, as its truncation must (the daemon does this for the
    /// kernel, `FUSE_HANDLE_KILLPRIV_V2`; set-group-ID depends on its groups).
    pub kill_suidgid: Option<Caller>,
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

/// Who sent a WRITE: the kernel's `unique` of the request (without its resend bit;
/// 0: not journaled) and whether the kernel resent it after a takeover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteReq {
    pub unique: u64,
    pub resent: bool,
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
    pub(super) fn from_u8(v: u8) -> Self {
        match v {
            0 => IoMode::Passthrough,
            1 => IoMode::Cached,
            _ => IoMode::Direct,
        }
    }
}

/// Which kinds of open file an inode has, so the I/O modes never conflict.
#[derive(Debug, Default)]
pub(super) struct IoState {
    pub(super) cached: u32,
    pub(super) passthrough: u32,
    pub(super) open: u32,
    /// Its last link went while it was open: its size leaves the quota at last close.
    pub(super) orphan: bool,
}
