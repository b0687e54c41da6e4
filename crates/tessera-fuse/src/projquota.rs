//! The volume's quota enforced by the backing filesystem: an XFS project quota on the
//! volume directory (`tessera mount --quota=backend`, or `auto` where it is available).
//!
//! **Why XFS only.** The point of a backend-enforced quota is that writes no longer
//! have to pass through the daemon (kernel passthrough, see [`super::fs`]), so the limit
//! must hold for a writer the daemon never sees, and that writer is the daemon's own
//! credentials (root: passthrough I/O runs with the credentials of whoever registered
//! the backing file). XFS enforces a project quota's hard limit on root as on anyone
//! and fails the write with `ENOSPC`. ext4 answers `EDQUOT` instead, and lets a caller
//! with `CAP_SYS_RESOURCE`, i.e. root, past the limit, so it would not hold.
//!
//! **What this module owns.** Detecting support ([`probe`]: statfs type XFS, project
//! quota accounting *and* enforcement on, via `quotactl_fd(2)` on a descriptor of the
//! volume directory, no block device path needed); giving the volume directory its
//! project id ([`ProjectQuota::setup`]); setting the block hard limit to the capacity
//! ([`ProjectQuota::set_capacity`], again on SIGHUP) and reading limit and usage back
//! for statfs ([`ProjectQuota::usage`]).
//!
//! **Project ids.** A directory that already carries a non-zero project id with
//! `FS_XFLAG_PROJINHERIT` keeps it (a remount, or an id an administrator assigned),
//! unless its parent directory carries the same id: then the id was merely inherited
//! (a backing root with `PROJINHERIT` would otherwise hand one id to every volume,
//! which would then share one limit). Otherwise an id nobody uses on that filesystem is
//! drawn at random from `[2^24, 2^31)` (no dquot, or one with no usage and no limits),
//! everything already below the directory is tagged with it (directories also with
//! `PROJINHERIT`, so all that is created later inherits it; symlinks and special files,
//! which cannot be opened for the ioctl, are replaced by tagged copies, see
//! [`recreate`]), and the directory itself is tagged last, so a setup cut short is
//! redone from scratch at the next mount. XFS refuses to rename or hard-link an inode
//! into a `PROJINHERIT` directory of another project (`EXDEV`), so nothing enters the
//! tree uncounted later, and an untagged inode left inside could not be renamed.
//!
//! **What is counted.** Allocated blocks (512-byte basic blocks in the quota calls),
//! not apparent sizes: a sparse file costs what it allocates, and directory blocks,
//! xattr blocks and speculative preallocation count too (XFS trims preallocation near
//! the limit and retries before failing a write).

use std::collections::hash_map::RandomState;
use std::ffi::CString;
use std::hash::BuildHasher;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::sys::{
    self, Errno, FS_QUOTA_PDQ_ACCT, FS_QUOTA_PDQ_ENFD, FS_XFLAG_PROJINHERIT, Op, SysError,
};
use super::usage::Usage;

/// statfs `f_type` of XFS.
pub const XFS_SUPER_MAGIC: i64 = 0x5846_5342;

/// Unit of the quota calls' block counts.
const BASIC_BLOCK: u64 = 512;

/// Range project ids are drawn from: clear of the small ids administrators assign by
/// hand (`/etc/projid`), and of anything that could be mistaken for a negative number.
const ID_RANGE: std::ops::Range<u32> = (1 << 24)..(1 << 31);

/// Ids tried before giving up on finding an unused one.
const ID_TRIES: u32 = 64;

/// Why the backing filesystem cannot enforce the quota, or setting it up failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendQuotaError {
    /// The volume directory is not on XFS.
    #[error("the backing filesystem is not XFS (statfs type {0:#x})")]
    NotXfs(i64),
    /// `quotactl_fd` is missing, or the kernel has no quota support for XFS.
    #[error(
        "the kernel has no quotactl_fd (Linux 5.14+) or no XFS quota support (CONFIG_XFS_QUOTA)"
    )]
    NoKernelSupport,
    /// Project quotas are not accounted on the filesystem.
    #[error("project quotas are off on the backing XFS filesystem (mount it with -o prjquota)")]
    NotAccounted,
    /// Project quotas are accounted but limits are not enforced.
    #[error(
        "project quotas are accounted but not enforced on the backing XFS filesystem (pqnoenforce)"
    )]
    NotEnforced,
    /// A syscall failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// Every id tried was in use.
    #[error("found no unused project id in {0} tries")]
    NoFreeId(u32),
}

type Result<T, E = BackendQuotaError> = std::result::Result<T, E>;

/// Whether the filesystem `dir` is on can enforce a project quota on root.
pub fn probe(dir: BorrowedFd<'_>) -> Result<()> {
    let fs_type = sys::fstatfs_type(dir).op("statfs")?;
    if fs_type != XFS_SUPER_MAGIC {
        return Err(BackendQuotaError::NotXfs(fs_type));
    }
    let flags = match sys::project_quota_flags(dir) {
        Ok(flags) => flags,
        Err(Errno::ENOSYS) => return Err(BackendQuotaError::NoKernelSupport),
        Err(errno) => {
            return Err(SysError {
                op: "quotactl_fd(Q_XGETQSTATV)",
                errno,
            }
            .into());
        }
    };
    if flags & FS_QUOTA_PDQ_ACCT == 0 {
        Err(BackendQuotaError::NotAccounted)
    } else if flags & FS_QUOTA_PDQ_ENFD == 0 {
        Err(BackendQuotaError::NotEnforced)
    } else {
        Ok(())
    }
}

/// How [`ProjectQuota::setup`] came by the project id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdOrigin {
    /// The directory already had it (with `PROJINHERIT`).
    Reused,
    /// Newly drawn; `tagged` inodes below the directory (and the directory) were set.
    Assigned { tagged: u64 },
}

/// An XFS project quota holding one volume directory to its capacity.
#[derive(Debug)]
pub struct ProjectQuota {
    /// The volume directory, opened for reading (the quota calls and ioctls need a
    /// descriptor that is not `O_PATH`).
    dir: OwnedFd,
    projid: u32,
}

impl ProjectQuota {
    /// Check support, give `dir` its project id and set the limit to `capacity`.
    pub fn setup(dir: OwnedFd, capacity: u64) -> Result<(Self, IdOrigin)> {
        probe(dir.as_fd())?;
        let fx = sys::fsgetxattr(dir.as_fd()).op("FS_IOC_FSGETXATTR")?;
        let (projid, origin) = if fx.projid != 0
            && fx.xflags & FS_XFLAG_PROJINHERIT != 0
            && !same_id_as_parent(dir.as_fd(), fx.projid)?
        {
            (fx.projid, IdOrigin::Reused)
        } else {
            let id = unused_id(dir.as_fd())?;
            let tagged = tag_tree(dir.as_fd(), id)?;
            (id, IdOrigin::Assigned { tagged })
        };
        let quota = ProjectQuota { dir, projid };
        quota.set_capacity(capacity)?;
        Ok((quota, origin))
    }

    pub fn projid(&self) -> u32 {
        self.projid
    }

    /// Set the block hard limit to `capacity` bytes (rounded up to whole basic
    /// blocks; XFS rounds up again to filesystem blocks). 0 would mean "no limit" to
    /// XFS, so a capacity of 0 becomes the smallest limit there is (one block).
    pub fn set_capacity(&self, capacity: u64) -> Result<()> {
        let hard = capacity.div_ceil(BASIC_BLOCK).max(1);
        sys::set_project_block_limits(self.dir.as_fd(), self.projid, hard, 0)
            .op("quotactl_fd(Q_XSETQLIM)")?;
        Ok(())
    }

    /// Limit and blocks in use, from the filesystem.
    pub fn usage(&self) -> Result<Usage> {
        let q = match sys::get_project_quota(self.dir.as_fd(), self.projid) {
            Ok(q) => q,
            // XFS answers ENOENT for an id whose quota is all zeros.
            Err(Errno::ENOENT) => sys::FsDiskQuota::default(),
            Err(errno) => {
                return Err(SysError {
                    op: "quotactl_fd(Q_XGETQUOTA)",
                    errno,
                }
                .into());
            }
        };
        Ok(Usage {
            capacity: q.blk_hardlimit.saturating_mul(BASIC_BLOCK),
            used: q.bcount.saturating_mul(BASIC_BLOCK),
        })
    }
}

/// Whether `dir`'s parent (on the same filesystem) carries project id `projid`.
fn same_id_as_parent(dir: BorrowedFd<'_>, projid: u32) -> Result<bool> {
    let parent =
        sys::openat(dir, c"..", libc::O_RDONLY | libc::O_DIRECTORY, 0).op("open parent")?;
    let (st, pst) = (
        sys::fstat(dir).op("stat")?,
        sys::fstat(parent.as_fd()).op("stat parent")?,
    );
    if st.st_dev != pst.st_dev || (st.st_dev, st.st_ino) == (pst.st_dev, pst.st_ino) {
        return Ok(false);
    }
    Ok(sys::fsgetxattr(parent.as_fd())
        .op("FS_IOC_FSGETXATTR parent")?
        .projid
        == projid)
}

/// A project id with no usage and no limits on the filesystem of `dir`.
fn unused_id(dir: BorrowedFd<'_>) -> Result<u32> {
    let seed = RandomState::new();
    let span = ID_RANGE.end - ID_RANGE.start;
    for attempt in 0..ID_TRIES {
        let id = ID_RANGE.start + (seed.hash_one(attempt) % u64::from(span)) as u32;
        match sys::get_project_quota(dir, id) {
            Err(Errno::ENOENT) => return Ok(id),
            Ok(q)
                if q.bcount == 0
                    && q.icount == 0
                    && q.blk_hardlimit == 0
                    && q.blk_softlimit == 0
                    && q.ino_hardlimit == 0
                    && q.ino_softlimit == 0 =>
            {
                return Ok(id);
            }
            Ok(_) => continue,
            Err(errno) => {
                return Err(SysError {
                    op: "quotactl_fd(Q_XGETQUOTA)",
                    errno,
                }
                .into());
            }
        }
    }
    Err(BackendQuotaError::NoFreeId(ID_TRIES))
}

/// Set project id `id` on the inode `fd` (and `PROJINHERIT` on a directory); false
/// if it already had both.
fn tag(fd: BorrowedFd<'_>, id: u32, dir: bool) -> Result<bool> {
    let mut fx = sys::fsgetxattr(fd).op("FS_IOC_FSGETXATTR")?;
    let xflags = if dir {
        fx.xflags | FS_XFLAG_PROJINHERIT
    } else {
        fx.xflags
    };
    if fx.projid == id && fx.xflags == xflags {
        return Ok(false);
    }
    fx.projid = id;
    fx.xflags = xflags;
    sys::fssetxattr(fd, &fx).op("FS_IOC_FSSETXATTR")?;
    Ok(true)
}

/// Tag every directory and regular file below `root` with `id`, then `root` itself.
/// Returns how many inodes changed.
fn tag_tree(root: BorrowedFd<'_>, id: u32) -> Result<u64> {
    // Left over from a setup that was cut short: only ever holds fresh copies.
    remove_scratch(root)?;
    sys::mkdirat(root, SCRATCH, 0o700).op("mkdir scratch")?;
    let tagged = sys::openat(root, SCRATCH, libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .op("open scratch")
        .map_err(BackendQuotaError::from)
        .and_then(|scratch| {
            tag(scratch.as_fd(), id, true)?;
            tag_below(root, id, scratch.as_fd())
        });
    remove_scratch(root)?;
    let mut tagged = tagged?;
    // The root last: its PROJINHERIT marks the setup as complete.
    if tag(root, id, true)? {
        tagged += 1;
    }
    Ok(tagged)
}

/// Scratch directory (in the volume root, for the time of the setup) where the
/// copies of symlinks and special files are made; see [`recreate`].
const SCRATCH: &std::ffi::CStr = c".tessera-projid-setup";

fn remove_scratch(root: BorrowedFd<'_>) -> Result<()> {
    let scratch = match sys::openat(
        root,
        SCRATCH,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(errno) => {
            return Err(SysError {
                op: "open scratch",
                errno,
            }
            .into());
        }
    };
    let mut buf = vec![0u8; 16 * 1024];
    sys::for_each_entry(
        scratch.as_fd(),
        &mut buf,
        |errno| {
            BackendQuotaError::from(SysError {
                op: "getdents64",
                errno,
            })
        },
        |name| {
            let _ = sys::unlinkat(scratch.as_fd(), name, 0);
            Ok(())
        },
    )?;
    sys::unlinkat(root, SCRATCH, libc::AT_REMOVEDIR).op("rmdir scratch")?;
    Ok(())
}

/// Give a symlink or special file the project id: the ioctl needs a descriptor such
/// inodes cannot be opened for (before Linux 6.17's `file_setattr`), so make a copy
/// in the scratch directory, which has the id with `PROJINHERIT`, carry over owner
/// and timestamps, and rename it over the original. (XFS would refuse later renames
/// and links of an untagged inode inside the volume with `EXDEV`.) Extended
/// attributes of the original are not carried over, and a special file with several
/// hard links becomes one inode per link.
fn recreate(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    st: &libc::stat,
    scratch: BorrowedFd<'_>,
) -> Result<()> {
    const COPY: &std::ffi::CStr = c"copy";
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        let link = sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0).op("open symlink")?;
        let target = sys::readlink_fd(link.as_fd()).op("readlink")?;
        let target = CString::new(target).map_err(|_| SysError {
            op: "readlink",
            errno: Errno::EINVAL,
        })?;
        sys::symlinkat(&target, scratch, COPY).op("symlink copy")?;
    } else {
        sys::mknodat(scratch, COPY, st.st_mode, st.st_rdev).op("mknod copy")?;
    }
    let copy = sys::openat(scratch, COPY, libc::O_PATH | libc::O_NOFOLLOW, 0).op("open copy")?;
    sys::chown_fd(copy.as_fd(), Some(st.st_uid), Some(st.st_gid)).op("chown copy")?;
    let times = [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ];
    sys::utimens_fd(copy.as_fd(), &times).op("utimensat copy")?;
    sys::renameat2(scratch, COPY, dir, name, 0).op("rename copy")?;
    Ok(())
}

/// Tag everything below `root` (see [`tag_tree`]).
fn tag_below(root: BorrowedFd<'_>, id: u32, scratch: BorrowedFd<'_>) -> Result<u64> {
    let mut tagged = 0;
    let mut stack: Vec<(OwnedFd, bool)> = vec![(
        sys::openat(root, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0).op("open")?,
        true,
    )];
    let mut buf = vec![0u8; 64 * 1024];
    while let Some((dir, is_root)) = stack.pop() {
        sys::for_each_entry(
            dir.as_fd(),
            &mut buf,
            |errno| {
                BackendQuotaError::from(SysError {
                    op: "getdents64",
                    errno,
                })
            },
            |name| {
                let st = match sys::fstatat(dir.as_fd(), name) {
                    Ok(st) => st,
                    Err(Errno::ENOENT) => return Ok(()),
                    Err(errno) => return Err(SysError { op: "stat", errno }.into()),
                };
                let is_dir = match st.st_mode & libc::S_IFMT {
                    libc::S_IFDIR if is_root && name == SCRATCH => return Ok(()),
                    libc::S_IFDIR => true,
                    libc::S_IFREG => false,
                    _ => {
                        recreate(dir.as_fd(), name, &st, scratch)?;
                        tagged += 1;
                        return Ok(());
                    }
                };
                let flags = libc::O_RDONLY
                    | libc::O_NOFOLLOW
                    | libc::O_NOCTTY
                    | libc::O_NONBLOCK
                    | if is_dir { libc::O_DIRECTORY } else { 0 };
                let fd = match sys::openat(dir.as_fd(), name, flags, 0) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT) => return Ok(()),
                    Err(errno) => return Err(SysError { op: "open", errno }.into()),
                };
                if tag(fd.as_fd(), id, is_dir)? {
                    tagged += 1;
                }
                if is_dir {
                    stack.push((fd, false));
                }
                Ok(())
            },
        )?;
    }
    Ok(tagged)
}
