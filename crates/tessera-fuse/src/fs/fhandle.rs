//! Kernel file handles (`name_to_handle_at`/`open_by_handle_at`): a filesystem's own
//! name for an inode, as bytes, valid for as long as the inode exists and in any
//! process, so an inode can be named without holding a descriptor open.
//!
//! For the local filesystems a volume lives on (ext4, XFS, btrfs, tmpfs) a handle
//! carries the inode number and its generation: once the inode is freed, the handle
//! opens nothing (`ESTALE`), even if the number is reused. `open_by_handle_at` needs
//! `CAP_DAC_READ_SEARCH` (the daemon runs as root) and can open *any* inode of the
//! filesystem, so the inode table only ever opens handles it made itself, from
//! descriptors it opened beneath the volume's root (see [`super::inodes`]).
//!
//! The two syscalls are wrapped here, small and safe, beside the type they work on.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::sys::{Errno, SysResult};

/// The largest handle the kernel hands out (`MAX_HANDLE_SZ`).
pub const MAX_HANDLE_SZ: usize = 128;

/// A kernel file handle: its type and opaque bytes, as `name_to_handle_at` gave them.
/// Plain data, so a successor process can be given it and open the same inode.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct FileHandle {
    handle_type: i32,
    bytes: Box<[u8]>,
}

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: libc::c_uint,
    handle_type: libc::c_int,
    f_handle: [u8; MAX_HANDLE_SZ],
}

impl FileHandle {
    /// A handle from its parts (e.g. read back from a successor's state); `None` if
    /// the bytes cannot be a handle.
    pub fn from_parts(handle_type: i32, bytes: &[u8]) -> Option<Self> {
        (!bytes.is_empty() && bytes.len() <= MAX_HANDLE_SZ).then(|| FileHandle {
            handle_type,
            bytes: bytes.into(),
        })
    }

    pub fn handle_type(&self) -> i32 {
        self.handle_type
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The handle of the inode `fd` refers to (any kind of descriptor, `O_PATH`
    /// included) and the id of the mount `fd` was reached through.
    pub fn of(fd: BorrowedFd<'_>) -> SysResult<(FileHandle, i32)> {
        let mut raw = RawHandle {
            handle_bytes: MAX_HANDLE_SZ as libc::c_uint,
            handle_type: 0,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        let mut mount_id: libc::c_int = 0;
        // SAFETY: `raw` is a `struct file_handle` whose `handle_bytes` says how much
        // room follows it; "" with AT_EMPTY_PATH names `fd` itself, never a path.
        let ret = unsafe {
            libc::name_to_handle_at(
                fd.as_raw_fd(),
                c"".as_ptr(),
                (&raw mut raw).cast::<libc::file_handle>(),
                &mut mount_id,
                libc::AT_EMPTY_PATH,
            )
        };
        if ret == -1 {
            return Err(Errno::last());
        }
        let len = (raw.handle_bytes as usize).min(MAX_HANDLE_SZ);
        let handle = FileHandle::from_parts(raw.handle_type, &raw.f_handle[..len])
            .ok_or(Errno::EOVERFLOW)?;
        Ok((handle, mount_id))
    }

    /// Open the inode this handle names on the filesystem `mount_fd` is on.
    pub fn open(&self, mount_fd: BorrowedFd<'_>, flags: i32) -> SysResult<OwnedFd> {
        let mut raw = RawHandle {
            handle_bytes: self.bytes.len() as libc::c_uint,
            handle_type: self.handle_type,
            f_handle: [0; MAX_HANDLE_SZ],
        };
        raw.f_handle[..self.bytes.len()].copy_from_slice(&self.bytes);
        loop {
            // SAFETY: `raw` is a valid `struct file_handle` of `handle_bytes` bytes;
            // the kernel only reads it.
            let ret = unsafe {
                libc::open_by_handle_at(
                    mount_fd.as_raw_fd(),
                    (&raw mut raw).cast::<libc::file_handle>(),
                    flags | libc::O_CLOEXEC,
                )
            };
            match ret {
                -1 if Errno::last() == Errno::EINTR => continue,
                -1 => return Err(Errno::last()),
                // SAFETY: a new descriptor that nothing else owns.
                fd => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::sys;

    #[test]
    fn parts_round_trip_and_bad_lengths_are_refused() {
        let h = FileHandle::from_parts(1, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(
            FileHandle::from_parts(h.handle_type(), h.bytes()),
            Some(h.clone())
        );
        assert_eq!(FileHandle::from_parts(1, &[]), None);
        assert_eq!(FileHandle::from_parts(1, &[0; MAX_HANDLE_SZ + 1]), None);
        assert!(FileHandle::from_parts(1, &[0; MAX_HANDLE_SZ]).is_some());
    }

    /// Where the filesystem of the temporary directory gives handles (and the test
    /// runs as root), a handle opens the very inode it was made from, and nothing
    /// once that inode is gone.
    #[test]
    fn a_handle_opens_its_inode_and_goes_stale_with_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let cwd = std::fs::File::open(dir.path()).unwrap();
        let fd = sys::openat(cwd.as_fd(), c"f", libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        let (h, _) = match FileHandle::of(fd.as_fd()) {
            Ok(h) => h,
            Err(Errno::EOPNOTSUPP) => return eprintln!("no handles on this filesystem"),
            Err(e) => panic!("name_to_handle_at: {e}"),
        };
        let again = match h.open(cwd.as_fd(), libc::O_PATH) {
            Ok(fd) => fd,
            Err(Errno::EPERM) => return eprintln!("not root: open_by_handle_at refused"),
            Err(e) => panic!("open_by_handle_at: {e}"),
        };
        let (a, b) = (
            sys::fstat(fd.as_fd()).unwrap(),
            sys::fstat(again.as_fd()).unwrap(),
        );
        assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
        drop((fd, again));
        std::fs::remove_file(dir.path().join("f")).unwrap();
        // The last link and the last descriptor are gone: the inode is freed.
        assert_eq!(h.open(cwd.as_fd(), libc::O_PATH).err(), Some(Errno::ESTALE));
    }
}
