//! Extended attributes, through each inode's `/proc/self/fd` magic link (never for a
//! symlink, whose magic link would be followed).

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use super::inodes::{Inode, InodeFd};
use super::{FileKind, FsError, NodeId, Result, VolumeFs, Xattr};
use crate::sys::{self, Errno, Op, SysError};

impl VolumeFs {
    /// `/proc/self/fd/N` of an inode, for the xattr calls, with the descriptor it
    /// names (never for a symlink: its magic link would be followed).
    fn xattr_path<'a>(&self, inode: &'a Arc<Inode>) -> Result<Option<(InodeFd<'a>, CString)>> {
        if inode.kind == FileKind::Symlink {
            return Ok(None);
        }
        let fd = self.fd(inode)?;
        let path = CString::new(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
            .expect("no NUL in a number");
        Ok(Some((fd, path)))
    }

    pub fn getxattr(&self, id: NodeId, name: &OsStr, size: u32) -> Result<Xattr> {
        let inode = self.inode(id)?;
        let Some((_fd, path)) = self.xattr_path(&inode)? else {
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
        let Some((_fd, path)) = self.xattr_path(&inode)? else {
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
        let (_fd, path) = self
            .xattr_path(&inode)?
            .ok_or(FsError::NotPermitted("xattrs on symlinks"))?;
        let n = sys::cstring(name).op("setxattr")?;
        Ok(sys::setxattr(&path, &n, value, flags).op("setxattr")?)
    }

    pub fn removexattr(&self, id: NodeId, name: &OsStr) -> Result<()> {
        self.writable()?;
        let inode = self.inode(id)?;
        let (_fd, path) = self
            .xattr_path(&inode)?
            .ok_or(FsError::NotPermitted("xattrs on symlinks"))?;
        let n = sys::cstring(name).op("removexattr")?;
        Ok(sys::removexattr(&path, &n).op("removexattr")?)
    }
}
