//! Errors of the filesystem core. Every failure is an [`FsError`]; [`FsError::errno`]
//! is the one place where failures become errno values for the kernel.

use super::NodeId;
use crate::projquota::BackendQuotaError;
use crate::sys::SysError;

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
