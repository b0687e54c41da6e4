//! Directories: opendir, readdir and readdirplus (resuming where the kernel's reply
//! was full), releasedir, fsyncdir.

use std::ffi::{CString, OsStr};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Mutex;
use std::sync::atomic::AtomicU8;

use super::handles::{DIR_BUF, DirStream, Handle};
use super::{Attr, DirEntry, FileKind, FsError, IoMode, NodeId, ROOT_ID, Result, VolumeFs, lock};
use crate::sys::{self, Errno, Op, SysError};

impl VolumeFs {
    pub fn opendir(&self, id: NodeId) -> Result<u64> {
        let inode = self.inode(id)?;
        if inode.kind != FileKind::Directory {
            return Err(FsError::Sys(SysError {
                op: "opendir",
                errno: Errno::ENOTDIR,
            }));
        }
        let file = sys::openat(
            self.fd(&inode)?.as_fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .op("opendir")?;
        Ok(self.handles.add(
            Handle {
                inode,
                file,
                mode: AtomicU8::new(IoMode::Cached as u8),
                writable: false,
                append: false,
                dir: Some(Mutex::new(DirStream::new())),
            },
            libc::O_RDONLY | libc::O_DIRECTORY,
        ))
    }

    pub fn releasedir(&self, fh: u64) -> Result<()> {
        self.handles.take(fh).map(drop)
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
                if buf.is_empty() {
                    buf.resize(DIR_BUF, 0);
                }
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
}
