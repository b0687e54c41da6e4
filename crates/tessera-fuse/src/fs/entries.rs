//! Names: lookup, and everything that makes, links, moves or removes an entry of a
//! directory (mknod, mkdir, symlink, link, create, unlink, rmdir, rename).
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
//! **Quota.** Removing the last link of a regular file frees its bytes, or, while it
//! is still open through the mount, at its last close (see `account_unlinked`).

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::inodes::Inode;
use super::{
    Attr, Caller, FileKind, FsError, NodeId, Opened, ROOT_ID, Result, SetAttr, VolumeFs, lock,
};
use crate::sys::{self, Op};

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
        let fd = sys::openat(self.fd(&p)?.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0)
            .op("lookup")?;
        Ok(self.register(fd)?.1)
    }

    pub fn forget(&self, id: NodeId, nlookup: u64) {
        self.inodes.forget(id, nlookup);
    }

    pub fn readlink(&self, id: NodeId) -> Result<Vec<u8>> {
        let inode = self.inode(id)?;
        if inode.kind != FileKind::Symlink {
            return Err(FsError::WrongType("readlink"));
        }
        Ok(sys::readlink_fd(self.fd(&inode)?.as_fd()).op("readlink")?)
    }

    /// Give a new inode to the caller: the daemon created it as root.
    fn set_owner(
        &self,
        caller: Caller,
        parent: &Arc<Inode>,
        fd: BorrowedFd<'_>,
        kind: FileKind,
        mode: u32,
    ) -> Result<()> {
        if caller.uid == 0 && caller.gid == 0 {
            // Root's new inode already has root's ids, or the parent's group when
            // the parent is set-group-ID: exactly what the caller would get.
            return Ok(());
        }
        let pst = sys::fstat(self.fd(parent)?.as_fd()).op("stat parent")?;
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
        p: &Arc<Inode>,
        name: &CStr,
        kind: FileKind,
        mode: u32,
    ) -> Result<Attr> {
        let pfd = self.fd(p)?;
        let finish = || -> Result<Attr> {
            let fd = sys::openat(pfd.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)
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
            let _ = sys::unlinkat(pfd.as_fd(), name, flags);
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
            self.fd(&p)?.as_fd(),
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
        sys::mkdirat(self.fd(&p)?.as_fd(), &c, mode & 0o7777).op("mkdir")?;
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
        sys::symlinkat(&t, self.fd(&p)?.as_fd(), &c).op("symlink")?;
        self.adopt_new(caller, &p, &c, FileKind::Symlink, 0o777)
    }

    pub fn link(&self, id: NodeId, new_parent: NodeId, new_name: &OsStr) -> Result<Attr> {
        self.writable()?;
        let inode = self.inode(id)?;
        let p = self.inode(new_parent)?;
        let c = component(new_name)?;
        sys::link_fd(self.fd(&inode)?.as_fd(), self.fd(&p)?.as_fd(), &c).op("link")?;
        self.inodes.add_lookup(inode.id)?;
        self.stat_inode(&inode)
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
        // O_EXCL always, so we know we made the inode. The kernel creates only after
        // a negative lookup, but the name may have been made since by another client
        // of the backend (another node of a shared volume) or beside the mount.
        let pfd = self.fd(&p)?;
        let file = match sys::openat(
            pfd.as_fd(),
            &c,
            Self::backing_flags(flags) | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            mode & 0o7777,
        ) {
            Err(sys::Errno::EEXIST) if flags & libc::O_EXCL == 0 => {
                return self.open_existing(caller, parent, name, flags);
            }
            r => r.op("create")?,
        };
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
            let _ = sys::unlinkat(pfd.as_fd(), &c, 0);
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

    /// `create` of a name that exists after all, without `O_EXCL`: open it, as
    /// `open(2)` does on the backend — never EEXIST, which applications do not expect
    /// without `O_EXCL` (SQLite then opens its database read-only). The kernel checked
    /// only the directory's permissions, so the file's are checked here with the
    /// caller's ids and supplementary groups, as `default_permissions` would have
    /// (see `perms`). Anything but a regular file
    /// stays EEXIST (a symlink would have to be followed by the kernel).
    fn open_existing(
        &self,
        caller: Caller,
        parent: NodeId,
        name: &OsStr,
        flags: i32,
    ) -> Result<(Attr, Opened)> {
        let attr = self.lookup(parent, name)?;
        let id = attr.ino;
        let opened = (|| {
            if attr.kind != FileKind::Regular {
                return Err(FsError::Sys(sys::SysError {
                    op: "create",
                    errno: sys::Errno::EEXIST,
                }));
            }
            let mut mask = match flags & libc::O_ACCMODE {
                libc::O_RDONLY => libc::R_OK,
                libc::O_WRONLY => libc::W_OK,
                _ => libc::R_OK | libc::W_OK,
            };
            if flags & libc::O_TRUNC != 0 {
                mask |= libc::W_OK;
            }
            self.access(caller, id, mask)?;
            self.open(id, flags)
        })();
        let opened = opened.and_then(|opened| {
            if flags & libc::O_TRUNC == 0 {
                return Ok((attr, opened));
            }
            // The kernel truncates through setattr after an open, not after a create
            // (it made the file empty, it thinks): truncate here, where the quota
            // sees it, and as the kernel would for a caller without CAP_FSETID.
            let set = SetAttr {
                size: Some(0),
                fh: Some(opened.fh),
                kill_suidgid: (caller.uid != 0).then_some(caller),
                ..SetAttr::default()
            };
            match self.setattr(id, set) {
                Ok(attr) => Ok((attr, opened)),
                Err(e) => {
                    let _ = self.release(opened.fh);
                    Err(e)
                }
            }
        });
        match opened {
            Ok(r) => Ok(r),
            Err(e) => {
                // The kernel gets no entry: drop the lookup we counted.
                self.inodes.forget(id, 1);
                Err(e)
            }
        }
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
        let pfd = self.fd(&p)?;
        let mut st = sys::fstatat(pfd.as_fd(), &c).op("unlink")?;
        let victim = self.inodes.get_by_key((st.st_dev, st.st_ino));
        let _size = victim.as_ref().map(|v| lock(&v.size_lock));
        if victim.is_some() {
            // Stat again under the size lock: the size we release must be final.
            st = sys::fstatat(pfd.as_fd(), &c).op("unlink")?;
        }
        sys::unlinkat(pfd.as_fd(), &c, 0).op("unlink")?;
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink == 1 {
            self.account_unlinked(victim.as_deref(), st.st_size as u64);
        }
        Ok(())
    }

    pub fn rmdir(&self, parent: NodeId, name: &OsStr) -> Result<()> {
        self.writable()?;
        let p = self.inode(parent)?;
        let c = component(name)?;
        Ok(sys::unlinkat(self.fd(&p)?.as_fd(), &c, libc::AT_REMOVEDIR).op("rmdir")?)
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
        let (pfd, npfd) = (self.fd(&p)?, self.fd(&np)?);
        // A plain rename over a regular file unlinks that file.
        let mut replaces_file = false;
        let mut victim = None;
        if flags & libc::RENAME_EXCHANGE == 0
            && let Ok(st) = sys::fstatat(npfd.as_fd(), &nc)
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && st.st_nlink == 1
        {
            let src = sys::fstatat(pfd.as_fd(), &c).op("rename")?;
            if (src.st_dev, src.st_ino) != (st.st_dev, st.st_ino) {
                replaces_file = true;
                victim = self.inodes.get_by_key((st.st_dev, st.st_ino));
            }
        }
        let _size = victim.as_ref().map(|v| lock(&v.size_lock));
        // Stat again under the size lock: the size we release must be final.
        let replaced = replaces_file
            .then(|| sys::fstatat(npfd.as_fd(), &nc).ok())
            .flatten()
            .filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink == 1);
        sys::renameat2(pfd.as_fd(), &c, npfd.as_fd(), &nc, flags).op("rename")?;
        if let Some(st) = replaced {
            self.account_unlinked(victim.as_deref(), st.st_size as u64);
        }
        Ok(())
    }
}
