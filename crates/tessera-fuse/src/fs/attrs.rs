//! Attributes of an inode: getattr, setattr (mode, owner, size, times) and access.

use std::os::fd::AsFd;

use super::perms;
use super::types::timespec;
use super::{Attr, Caller, FileKind, FsError, NodeId, Result, SetAttr, VolumeFs};
use crate::sys::{self, Op};

impl VolumeFs {
    pub fn getattr(&self, id: NodeId, fh: Option<u64>) -> Result<Attr> {
        if let Some(h) = fh.and_then(|fh| self.handle(fh).ok()) {
            let st = sys::fstat(h.file.as_fd()).op("fstat")?;
            return Ok(Attr::from_stat(&st, h.inode.id));
        }
        self.stat_inode(&self.inode(id)?)
    }

    pub fn setattr(&self, id: NodeId, set: SetAttr) -> Result<Attr> {
        self.writable()?;
        let inode = self.inode(id)?;
        let handle = set.fh.and_then(|fh| self.handle(fh).ok());
        if let Some(mode) = set.mode {
            if inode.kind == FileKind::Symlink {
                return Err(FsError::Unsupported("chmod of a symlink"));
            }
            let fd = self.fd(&inode)?;
            sys::chmod_fd(self.proc_fd.as_fd(), fd.as_fd(), mode & 0o7777).op("chmod")?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            sys::chown_fd(self.fd(&inode)?.as_fd(), set.uid, set.gid).op("chown")?;
        }
        if let Some(size) = set.size {
            self.truncate(&inode, handle.as_deref(), size)?;
            if let Some(caller) = set.kill_suidgid.filter(|_| set.mode.is_none()) {
                self.kill_suidgid(&inode, caller, None)?;
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            sys::utimens_fd(
                self.fd(&inode)?.as_fd(),
                &[timespec(set.atime), timespec(set.mtime)],
            )
            .op("utimensat")?;
        }
        self.stat_inode(&inode)
    }

    /// `access(2)`. With `default_permissions` the kernel answers it itself; this is
    /// the answer for mounts without it, and for `create` of a name that exists after
    /// all: from the mode bits and the caller's ids and groups (see `perms`).
    pub fn access(&self, caller: Caller, id: NodeId, mask: i32) -> Result<()> {
        let inode = self.inode(id)?;
        let st = sys::fstat(self.fd(&inode)?.as_fd()).op("access")?;
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
        let file = (st.st_uid, st.st_gid, mode);
        if perms::permits(caller, file, mask, || perms::of_process(caller)) {
            Ok(())
        } else {
            Err(FsError::AccessDenied)
        }
    }
}
