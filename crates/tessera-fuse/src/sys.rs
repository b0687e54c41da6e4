//! The Linux syscalls the filesystem core is built on, as small safe wrappers.
//!
//! Everything here works on file descriptors: the core never hands a path to the
//! kernel except a single name component relative to a directory fd it already holds
//! (`*at()` calls with `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW`), or `""` with
//! `AT_EMPTY_PATH` to act on the fd itself. That is what keeps every request inside the
//! volume directory: no `..`, no symlink in the backing tree is ever resolved by the
//! daemon.
//!
//! A few operations have no fd-relative form that works on `O_PATH` descriptors
//! (re-opening a file for I/O, xattrs); those go through `/proc/self/fd/N`, whose
//! "magic link" jumps straight to the inode the fd refers to without resolving any
//! path in the backing tree. The core only does that for regular files and
//! directories, never for symlinks (opening a symlink's magic link would follow it).

use std::ffi::{CStr, CString, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

pub use nix::errno::Errno;

/// Result of a raw syscall: the errno is all the core needs to know.
pub type SysResult<T> = Result<T, Errno>;

/// A syscall that failed, named by what the caller was doing: the one error for a
/// failed syscall in the filesystem core ([`super::fs::FsError::Sys`]) and the project
/// quota ([`super::projquota::BackendQuotaError::Sys`]). [`Op::op`] makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{op} failed: {errno}")]
pub struct SysError {
    pub op: &'static str,
    pub errno: Errno,
}

/// Names the operation of a raw syscall result: `sys::fstat(fd).op("stat")?`.
pub trait Op<T> {
    fn op(self, op: &'static str) -> Result<T, SysError>;
}

impl<T> Op<T> for SysResult<T> {
    fn op(self, op: &'static str) -> Result<T, SysError> {
        self.map_err(|errno| SysError { op, errno })
    }
}

const EMPTY: &CStr = c"";

fn cvt(ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: libc::ssize_t) -> SysResult<usize> {
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(ret as usize)
    }
}

/// Retry a syscall interrupted by a signal: worker threads block the signals the
/// daemon handles, but other signals (or a ptrace attach) can still interrupt.
fn retry<T>(mut f: impl FnMut() -> SysResult<T>) -> SysResult<T> {
    loop {
        match f() {
            Err(Errno::EINTR) => continue,
            other => return other,
        }
    }
}

/// A NUL-free copy of `s` for the kernel.
/// A shared mapping (`MAP_SHARED`) of the first `len` bytes of `fd`, read-only or
/// read-write: how a daemon shares a file with the node agent or a successor (the
/// counters, the handoff state). Page-aligned; the caller unmaps it with `munmap`, or
/// keeps it for the life of the process.
pub fn mmap_shared(fd: BorrowedFd<'_>, len: usize, writable: bool) -> SysResult<*mut libc::c_void> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh mapping of an open file; the address is the kernel's choice, so
    // no existing memory is touched.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(Errno::last());
    }
    Ok(addr)
}

pub fn cstring(s: &OsStr) -> SysResult<CString> {
    CString::new(s.as_bytes()).map_err(|_| Errno::EINVAL)
}

pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> SysResult<OwnedFd> {
    let fd = retry(|| {
        // SAFETY: `name` is a valid C string; the returned fd is owned by us.
        cvt(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })
    })?;
    // SAFETY: a fresh fd returned by the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `stat` of the fd itself (which may be an `O_PATH` fd of a symlink).
pub fn fstat(fd: BorrowedFd<'_>) -> SysResult<libc::stat> {
    stat_at(fd, EMPTY, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)
}

/// `lstat` of a name in a directory.
pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<libc::stat> {
    stat_at(dir, name, libc::AT_SYMLINK_NOFOLLOW)
}

fn stat_at(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is written by the kernel on success.
    cvt(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded.
    Ok(unsafe { st.assume_init() })
}

pub fn fstatvfs(fd: BorrowedFd<'_>) -> SysResult<libc::statvfs> {
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `st` is written by the kernel on success.
    cvt(unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded.
    Ok(unsafe { st.assume_init() })
}

pub fn fstatfs_type(fd: BorrowedFd<'_>) -> SysResult<i64> {
    let mut st = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `st` is written by the kernel on success.
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatfs succeeded.
    let st = unsafe { st.assume_init() };
    // `f_type` is i64 on x86_64 but narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

/// The soft `RLIMIT_NOFILE` of this process (unlimited: `u64::MAX`).
pub fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the kernel to fill.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => lim.rlim_cur,
        _ => 1024,
    }
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> SysResult<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> SysResult<()> {
    // SAFETY: valid C string.
    cvt(unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            mode as libc::mode_t,
            rdev as libc::dev_t,
        )
    })?;
    Ok(())
}

pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    // SAFETY: valid C strings.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

/// Hard-link the inode `fd` refers to as `dir/name` (`AT_EMPTY_PATH`: no path of the
/// source is resolved; needs `CAP_DAC_READ_SEARCH`, which the daemon has as root).
pub fn link_fd(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    // SAFETY: valid C strings.
    cvt(unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    })?;
    Ok(())
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> SysResult<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

pub fn renameat2(
    old_dir: BorrowedFd<'_>,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
    flags: u32,
) -> SysResult<()> {
    // SAFETY: valid C strings.
    cvt(unsafe {
        libc::renameat2(
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            flags as libc::c_uint,
        )
    })?;
    Ok(())
}

/// Target of the symlink `fd` (an `O_PATH|O_NOFOLLOW` fd of the link itself).
pub fn readlink_fd(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `buf` is writable for its length.
    let n = cvt_size(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// `lchown` of the inode `fd` refers to; `None` leaves that id unchanged.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> SysResult<()> {
    // SAFETY: valid C string; -1 means "unchanged".
    cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            uid.unwrap_or(u32::MAX),
            gid.unwrap_or(u32::MAX),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// `chmod` of the inode an `O_PATH` fd refers to. `fchmodat2(AT_EMPTY_PATH)` (Linux
/// 6.6) does it directly; older kernels go through the fd's magic link. The caller
/// never passes a symlink (the kernel resolves chmod on symlinks to their target).
pub fn chmod_fd(proc_fd: BorrowedFd<'_>, fd: BorrowedFd<'_>, mode: u32) -> SysResult<()> {
    // SAFETY: valid C string.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            mode as libc::mode_t,
            libc::AT_EMPTY_PATH,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    match Errno::last() {
        Errno::ENOSYS | Errno::EINVAL => {
            let name = fd_name(fd.as_raw_fd());
            // SAFETY: valid C string; follows the magic link to the inode.
            cvt(unsafe {
                libc::fchmodat(proc_fd.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, 0)
            })?;
            Ok(())
        }
        e => Err(e),
    }
}

/// Timestamps of the inode `fd` refers to (not following a symlink).
pub fn utimens_fd(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> SysResult<()> {
    // SAFETY: valid C string and a two-element array.
    cvt(unsafe {
        libc::utimensat(
            fd.as_raw_fd(),
            EMPTY.as_ptr(),
            times.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// The decimal name of an fd, for use relative to a `/proc/self/fd` dir fd.
pub fn fd_name(fd: RawFd) -> CString {
    CString::new(fd.to_string()).expect("digits have no NUL")
}

/// Open the inode behind `fd` (an `O_PATH` fd of a regular file or directory) for
/// I/O, through its magic link in `/proc/self/fd`.
pub fn reopen(proc_fd: BorrowedFd<'_>, fd: BorrowedFd<'_>, flags: i32) -> SysResult<OwnedFd> {
    openat(proc_fd, &fd_name(fd.as_raw_fd()), flags, 0)
}

pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> SysResult<()> {
    let len = i64::try_from(len).map_err(|_| Errno::EFBIG)?;
    retry(|| {
        // SAFETY: plain syscall on a valid fd.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })
    })?;
    Ok(())
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> SysResult<()> {
    let off = i64::try_from(offset).map_err(|_| Errno::EFBIG)?;
    let len = i64::try_from(len).map_err(|_| Errno::EFBIG)?;
    retry(|| {
        // SAFETY: plain syscall on a valid fd.
        cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, off, len) })
    })?;
    Ok(())
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> SysResult<()> {
    retry(|| {
        // SAFETY: plain syscall on a valid fd.
        cvt(unsafe {
            if datasync {
                libc::fdatasync(fd.as_raw_fd())
            } else {
                libc::fsync(fd.as_raw_fd())
            }
        })
    })?;
    Ok(())
}

/// `close(dup(fd))`: what a close of the file would do on the backing filesystem
/// (network filesystems flush on close) without giving up our descriptor.
pub fn flush(fd: BorrowedFd<'_>) -> SysResult<()> {
    // SAFETY: dup of a valid fd; the copy is closed right away.
    let dup = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: `dup` is ours to close.
    cvt(unsafe { libc::close(dup) })?;
    Ok(())
}

/// An open-file-description lock call (`F_OFD_SETLK`, `F_OFD_GETLK`) on `fd`.
pub fn ofd_lock(fd: BorrowedFd<'_>, cmd: i32, fl: &mut libc::flock) -> SysResult<()> {
    retry(|| {
        // SAFETY: valid fd and flock struct.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, fl as *mut libc::flock) })
    })?;
    Ok(())
}

/// `flock(2)` on `fd`.
pub fn flock(fd: BorrowedFd<'_>, op: i32) -> SysResult<()> {
    retry(|| {
        // SAFETY: plain syscall on a valid fd.
        cvt(unsafe { libc::flock(fd.as_raw_fd(), op) })
    })?;
    Ok(())
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> SysResult<usize> {
    let off = i64::try_from(offset).map_err(|_| Errno::EINVAL)?;
    retry(|| {
        // SAFETY: `buf` is writable for its length.
        cvt_size(unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), off) })
    })
}

pub fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], offset: u64) -> SysResult<usize> {
    let off = i64::try_from(offset).map_err(|_| Errno::EFBIG)?;
    retry(|| {
        // SAFETY: `buf` is readable for its length.
        cvt_size(unsafe { libc::pwrite(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), off) })
    })
}

pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: u64,
) -> SysResult<usize> {
    let mut off_in = i64::try_from(off_in).map_err(|_| Errno::EINVAL)?;
    let mut off_out = i64::try_from(off_out).map_err(|_| Errno::EFBIG)?;
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    retry(|| {
        // SAFETY: the offsets are valid, writable i64s.
        cvt_size(unsafe {
            libc::copy_file_range(
                fd_in.as_raw_fd(),
                &mut off_in,
                fd_out.as_raw_fd(),
                &mut off_out,
                len,
                0,
            ) as libc::ssize_t
        })
    })
}

pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> SysResult<i64> {
    // SAFETY: plain syscall on a valid fd.
    let ret = unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

/// Raw `getdents64` into `buf`; 0 at the end of the directory.
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> SysResult<usize> {
    retry(|| {
        // SAFETY: `buf` is writable for its length.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if ret == -1 {
            Err(Errno::last())
        } else {
            Ok(ret as usize)
        }
    })
}

/// Extended attributes go through the magic link (`getxattr` and friends have no
/// `AT_EMPTY_PATH` form before Linux 6.13), so `path` is `/proc/self/fd/N`.
pub fn getxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: valid C strings, `buf` writable for its length (null when empty).
    cvt_size(unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            if buf.is_empty() {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            buf.len(),
        )
    })
}

pub fn listxattr(path: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: valid C string, `buf` writable for its length (null when empty).
    cvt_size(unsafe {
        libc::listxattr(
            path.as_ptr(),
            if buf.is_empty() {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            buf.len(),
        )
    })
}

pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> SysResult<()> {
    // SAFETY: valid C strings, `value` readable for its length.
    cvt(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })?;
    Ok(())
}

pub fn removexattr(path: &CStr, name: &CStr) -> SysResult<()> {
    // SAFETY: valid C strings.
    cvt(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) })?;
    Ok(())
}

/// Call `f` with the name of every entry of the directory `dir` but `.` and `..`,
/// reading through `buf`, until the end of the directory or `f`'s first error.
/// `sys_error` turns a failed `getdents64` (or a name with a NUL byte, `EINVAL`, which
/// the kernel never returns) into the caller's error type.
pub fn for_each_entry<E>(
    dir: BorrowedFd<'_>,
    buf: &mut [u8],
    sys_error: impl Fn(Errno) -> E,
    mut f: impl FnMut(&CStr) -> Result<(), E>,
) -> Result<(), E> {
    loop {
        let n = getdents64(dir, buf).map_err(&sys_error)?;
        if n == 0 {
            return Ok(());
        }
        let mut pos = 0;
        while let Some(ent) = parse_dirent(&buf[pos..n]) {
            pos += ent.reclen;
            if ent.name == b"." || ent.name == b".." {
                continue;
            }
            let name = CString::new(ent.name).map_err(|_| sys_error(Errno::EINVAL))?;
            f(&name)?;
        }
    }
}

/// One record of a `getdents64` buffer.
#[derive(Debug, Clone, Copy)]
pub struct Dirent<'a> {
    pub ino: u64,
    /// Position of the *next* record (what `lseek` takes to resume after this one).
    pub off: i64,
    /// `DT_*` type, `DT_UNKNOWN` on filesystems that do not fill it in.
    pub kind: u8,
    pub name: &'a [u8],
    /// Length of the record in the buffer.
    pub reclen: usize,
}

/// Parse the record at the start of `buf` (a slice of what `getdents64` returned).
pub fn parse_dirent(buf: &[u8]) -> Option<Dirent<'_>> {
    // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
    const HEADER: usize = 19;
    if buf.len() < HEADER {
        return None;
    }
    let ino = u64::from_ne_bytes(buf[0..8].try_into().ok()?);
    let off = i64::from_ne_bytes(buf[8..16].try_into().ok()?);
    let reclen = u16::from_ne_bytes(buf[16..18].try_into().ok()?) as usize;
    let kind = buf[18];
    if reclen < HEADER || reclen > buf.len() {
        return None;
    }
    let raw = &buf[HEADER..reclen];
    let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    Some(Dirent {
        ino,
        off,
        kind,
        name: &raw[..len],
        reclen,
    })
}

/// `struct fsxattr` of `FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR` (linux/fs.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FsXattr {
    pub xflags: u32,
    pub extsize: u32,
    pub nextents: u32,
    pub projid: u32,
    pub cowextsize: u32,
    pub pad: [u8; 8],
}

/// The inode flag that makes new children inherit the directory's project id.
pub const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
/// `_IOR('X', 31, struct fsxattr)` and `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;

/// Project id and flags of the inode `fd` (opened for reading, not `O_PATH`).
pub fn fsgetxattr(fd: BorrowedFd<'_>) -> SysResult<FsXattr> {
    let mut fx = FsXattr::default();
    // SAFETY: the kernel fills a struct of exactly this layout.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSGETXATTR, &mut fx) })?;
    Ok(fx)
}

pub fn fssetxattr(fd: BorrowedFd<'_>, fx: &FsXattr) -> SysResult<()> {
    // SAFETY: the kernel reads a struct of exactly this layout.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSSETXATTR, fx) })?;
    Ok(())
}

/// `struct fs_disk_quota` (linux/dqblk_xfs.h): limits and usage of one quota id, in
/// 512-byte basic blocks.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FsDiskQuota {
    pub version: i8,
    pub flags: i8,
    pub fieldmask: u16,
    pub id: u32,
    pub blk_hardlimit: u64,
    pub blk_softlimit: u64,
    pub ino_hardlimit: u64,
    pub ino_softlimit: u64,
    pub bcount: u64,
    pub icount: u64,
    pub itimer: i32,
    pub btimer: i32,
    pub iwarns: u16,
    pub bwarns: u16,
    pub itimer_hi: i8,
    pub btimer_hi: i8,
    pub rtbtimer_hi: i8,
    pub padding2: i8,
    pub rtb_hardlimit: u64,
    pub rtb_softlimit: u64,
    pub rtbcount: u64,
    pub rtbtimer: i32,
    pub rtbwarns: u16,
    pub padding3: i16,
    pub padding4: [u8; 8],
}

/// `struct fs_qfilestatv`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FsQfileStatv {
    ino: u64,
    nblks: u64,
    nextents: u32,
    pad: u32,
}

/// `struct fs_quota_statv` (`Q_XGETQSTATV`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FsQuotaStatv {
    version: i8,
    pad1: u8,
    flags: u16,
    incoredqs: u32,
    uquota: FsQfileStatv,
    gquota: FsQfileStatv,
    pquota: FsQfileStatv,
    btimelimit: i32,
    itimelimit: i32,
    rtbtimelimit: i32,
    bwarnlimit: u16,
    iwarnlimit: u16,
    rtbwarnlimit: u16,
    pad3: u16,
    pad4: u32,
    pad2: [u64; 7],
}

/// `FS_QUOTA_PDQ_ACCT` / `FS_QUOTA_PDQ_ENFD` of `qs_flags`.
pub const FS_QUOTA_PDQ_ACCT: u16 = 1 << 4;
pub const FS_QUOTA_PDQ_ENFD: u16 = 1 << 5;
/// `d_fieldmask` bits of `Q_XSETQLIM`.
pub const FS_DQ_BSOFT: u16 = 1 << 2;
pub const FS_DQ_BHARD: u16 = 1 << 3;
const FS_DQUOT_VERSION: i8 = 1;
const FS_PROJ_QUOTA: i8 = 2;
const FS_QSTATV_VERSION1: i8 = 1;
const PRJQUOTA: i32 = 2;
const Q_XSETQLIM: i32 = (b'X' as i32) << 8 | 4;
const Q_XGETQUOTA: i32 = (b'X' as i32) << 8 | 3;
const Q_XGETQSTATV: i32 = (b'X' as i32) << 8 | 8;

/// `quotactl_fd(2)` (Linux 5.14) on the project quotas of the filesystem `fd` is on:
/// no block device path needed.
fn quotactl_prj(fd: BorrowedFd<'_>, cmd: i32, id: u32, addr: *mut libc::c_void) -> SysResult<()> {
    // QCMD(cmd, type) = cmd << 8 | type.
    let qcmd = (cmd << 8) | PRJQUOTA;
    // SAFETY: `addr` points to the struct `cmd` reads or writes.
    let ret = unsafe { libc::syscall(libc::SYS_quotactl_fd, fd.as_raw_fd(), qcmd, id, addr) };
    if ret == -1 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// The project quota state flags (`FS_QUOTA_PDQ_*`) of the filesystem `fd` is on.
pub fn project_quota_flags(fd: BorrowedFd<'_>) -> SysResult<u16> {
    let mut st = FsQuotaStatv {
        version: FS_QSTATV_VERSION1,
        ..Default::default()
    };
    quotactl_prj(fd, Q_XGETQSTATV, 0, (&raw mut st).cast())?;
    Ok(st.flags)
}

/// Limits and usage of project `id` (`ENOENT`: the id has never been used).
pub fn get_project_quota(fd: BorrowedFd<'_>, id: u32) -> SysResult<FsDiskQuota> {
    let mut q = FsDiskQuota::default();
    quotactl_prj(fd, Q_XGETQUOTA, id, (&raw mut q).cast())?;
    Ok(q)
}

/// Set the block limits of project `id`, in 512-byte basic blocks (0: no limit).
pub fn set_project_block_limits(
    fd: BorrowedFd<'_>,
    id: u32,
    hard: u64,
    soft: u64,
) -> SysResult<()> {
    let mut q = FsDiskQuota {
        version: FS_DQUOT_VERSION,
        flags: FS_PROJ_QUOTA,
        fieldmask: FS_DQ_BHARD | FS_DQ_BSOFT,
        id,
        blk_hardlimit: hard,
        blk_softlimit: soft,
        ..Default::default()
    };
    quotactl_prj(fd, Q_XSETQLIM, id, (&raw mut q).cast())
}

#[cfg(test)]
mod quota_layout {
    use super::*;

    #[test]
    fn kernel_struct_sizes() {
        assert_eq!(std::mem::size_of::<FsXattr>(), 28);
        assert_eq!(std::mem::size_of::<FsDiskQuota>(), 112);
        assert_eq!(std::mem::size_of::<FsQuotaStatv>(), 160);
    }
}
