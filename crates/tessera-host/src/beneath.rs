//! Mounting through file descriptors, for paths below the kubelet directory: resolve
//! the target with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from an fd of the
//! directory, then mount onto that fd with the new mount API (`open_tree` of the
//! source, `mount_setattr` for read-only, `move_mount` onto the fd) and unmount through
//! `/proc/self/fd/<fd>`. A racer swapping a directory on the way for a symlink gets
//! the resolution refused; nothing is ever looked up by name twice.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::mount::MntFlags;
use nix::sys::stat::Mode;

// From <linux/mount.h> (not in libc 0.2).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn how() -> OpenHow {
    OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
}

fn open_dir(dir: &Path) -> Result<OwnedFd, Errno> {
    nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// An `O_PATH` fd of the directory `rel` beneath `dir`, with no symlink on the way.
pub fn open(dir: &Path, rel: &Path) -> Result<OwnedFd, Errno> {
    let root = open_dir(dir)?;
    nix::fcntl::openat2(&root, rel, how())
}

/// As [`open`], creating missing directories (0750) one component at a time.
pub fn open_creating(dir: &Path, rel: &Path) -> Result<OwnedFd, Errno> {
    let mut cur = open_dir(dir)?;
    for c in rel.components() {
        let name = c.as_os_str();
        match nix::sys::stat::mkdirat(&cur, name, Mode::from_bits_truncate(0o750)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e),
        }
        cur = nix::fcntl::openat2(&cur, name, how())?;
    }
    Ok(cur)
}

fn fd_path(fd: &impl AsRawFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Bind `source` (a path Tessera owns: a FUSE mount point) onto the directory `target`
/// is an fd of; read-only on the new mount only, before it is attached.
pub fn bind_onto(source: &Path, target: &impl AsFd, read_only: bool) -> Result<(), Errno> {
    let src = CString::new(source.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: plain syscalls on a valid C string and fds; a returned fd is owned here.
    let tree = unsafe {
        let fd = libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        );
        OwnedFd::from_raw_fd(Errno::result(fd)? as i32)
    };
    let empty = c"";
    if read_only {
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: `attr` lives across the call and its size is passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        Errno::result(rc)?;
    }
    // SAFETY: valid fds and C strings.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_fd().as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    Errno::result(rc).map(drop)
}

/// Detach the mount whose root `fd` is (`EINVAL`: `fd` is no mount's root).
pub fn unmount_fd(fd: &impl AsRawFd) -> Result<(), Errno> {
    nix::mount::umount2(fd_path(fd).as_str(), MntFlags::MNT_DETACH)
}

/// Remove the empty directory `rel` beneath `dir` by its parent's fd (`Ok(false)` when
/// it is not there).
pub fn remove_dir(dir: &Path, rel: &Path) -> Result<bool, Errno> {
    let name = rel.file_name().ok_or(Errno::EINVAL)?;
    let parent = match rel.parent() {
        Some(p) if !p.as_os_str().is_empty() => open(dir, p),
        _ => open_dir(dir),
    };
    let parent = match parent {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e),
    };
    match nix::unistd::unlinkat(&parent, name, nix::unistd::UnlinkatFlags::RemoveDir) {
        Ok(()) => Ok(true),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}
