//! Locks held on the backing files, so that two mounts of one shared backend (two
//! nodes of a ReadWriteMany volume) see each other's locks as the backend sees them.
//!
//! ```text
//!   F_SETLK/F_GETLK (owner = the process's files) ──▶ OFD lock on an fd of (inode, owner)
//!   flock (owner = the open file)                  ──▶ flock on the handle's backing fd
//!   close of any fd by the owner (FLUSH)           ──▶ the owner's fd closed: its locks go
//!   last close of the open file (RELEASE)          ──▶ LOCK_UN on the handle's fd
//! ```
//!
//! **POSIX locks** are taken as open-file-description locks (`F_OFD_SETLK`) on a
//! backing descriptor of their own per (inode, kernel lock owner): the owner is the
//! process (its file table), so one process's locks merge and split as POSIX says, two
//! processes' locks conflict, and closing the owner's descriptor drops them all. The
//! kernel sends a FLUSH with the owner on every `close` (the adapter never sets
//! `FOPEN_NOFLUSH` when locks are on), which is when POSIX drops a process's locks on
//! a file; a process that exits closes everything. **flock** locks belong to the open
//! file, so they are taken on the handle's own backing descriptor.
//!
//! Waiting (`F_SETLKW`, blocking `flock`) is not done on a request thread: see
//! [`Waiters`]. The holder's pid that `F_GETLK` reports is the pid of a holder through
//! this mount; a holder elsewhere (another node) is reported as pid 0, as NFS does.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::{FsError, NodeId, Result, VolumeFs, lock};
use crate::sys::{self, Errno, Op, SysError};

pub(crate) mod wait;

pub use self::wait::Waiters;

/// `OFFSET_MAX`: the end the kernel sends for "to the end of the file".
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// A lock as FUSE describes it: a type (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`) over the
/// inclusive byte range `start..=end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockSpec {
    pub typ: i32,
    pub start: u64,
    pub end: u64,
}

/// What `F_GETLK` answers: the lock in the way (with its holder's pid, 0 when it is
/// unknown), or `F_UNLCK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    pub lock: LockSpec,
    pub pid: u32,
}

impl LockSpec {
    /// The `struct flock` of this lock for an OFD lock call (`l_pid` must be 0).
    pub fn to_flock(self) -> Result<libc::flock, Errno> {
        if !matches!(self.typ, libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK)
            || self.start > OFFSET_MAX
            || self.end < self.start
        {
            return Err(Errno::EINVAL);
        }
        // SAFETY: plain old data; zero is a valid value of every field.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = self.typ as i16;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = self.start as i64;
        fl.l_len = if self.end >= OFFSET_MAX {
            0
        } else {
            (self.end - self.start + 1) as i64
        };
        Ok(fl)
    }

    /// The lock a `struct flock` from `F_OFD_GETLK` describes.
    pub fn from_flock(fl: &libc::flock) -> LockSpec {
        let start = fl.l_start.max(0) as u64;
        let end = if fl.l_len <= 0 {
            OFFSET_MAX
        } else {
            start.saturating_add(fl.l_len as u64 - 1).min(OFFSET_MAX)
        };
        LockSpec {
            typ: fl.l_type as i32,
            start,
            end,
        }
    }

    /// The `flock(2)` operation for this lock's type.
    pub fn flock_op(self, wait: bool) -> Result<i32, Errno> {
        let op = match self.typ {
            libc::F_RDLCK => libc::LOCK_SH,
            libc::F_WRLCK => libc::LOCK_EX,
            libc::F_UNLCK => return Ok(libc::LOCK_UN),
            _ => return Err(Errno::EINVAL),
        };
        Ok(if wait { op } else { op | libc::LOCK_NB })
    }
}

/// One lock owner's descriptor of one backing file.
#[derive(Debug)]
struct OwnerFd {
    fd: Arc<OwnedFd>,
    /// The pid that last took a lock as this owner (0: not visible to the daemon).
    pid: u32,
}

/// The lock owners' descriptors of a mount, by (inode, owner).
#[derive(Debug, Default)]
pub(super) struct LockTable {
    owners: std::sync::Mutex<HashMap<(NodeId, u64), OwnerFd>>,
}

impl VolumeFs {
    /// The descriptor of `owner` on `fh`'s file: its existing one, or a new open file
    /// description of the same file (read-write when the backing file allows, else
    /// with the handle's access mode).
    fn owner_fd(&self, fh: u64, owner: u64, pid: u32) -> Result<Arc<OwnedFd>> {
        let h = self.handle(fh)?;
        let key = (h.ino(), owner);
        if let Some(o) = lock(&self.locks.owners).get_mut(&key) {
            if pid != 0 {
                o.pid = pid;
            }
            return Ok(o.fd.clone());
        }
        let reopen = |flags| sys::reopen(self.proc_fd.as_fd(), h.file.as_fd(), flags);
        let access = if h.writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        let fd = match reopen(libc::O_RDWR | libc::O_CLOEXEC) {
            Ok(fd) => fd,
            Err(_) => reopen(access | libc::O_CLOEXEC).op("open for a lock")?,
        };
        let fd = Arc::new(fd);
        let mut owners = lock(&self.locks.owners);
        // Another request of the same owner may have raced us here: keep the first.
        let entry = owners.entry(key).or_insert(OwnerFd { fd, pid });
        Ok(entry.fd.clone())
    }

    /// `F_GETLK`: the lock that would stop `owner` taking `spec` on `fh`'s file.
    pub fn getlk(&self, fh: u64, owner: u64, spec: LockSpec) -> Result<Option<Conflict>> {
        let fd = self.owner_fd(fh, owner, 0)?;
        let mut fl = spec.to_flock().op("F_GETLK")?;
        sys::ofd_lock(fd.as_fd(), libc::F_OFD_GETLK, &mut fl).op("F_GETLK")?;
        if fl.l_type as i32 == libc::F_UNLCK {
            return Ok(None);
        }
        let found = LockSpec::from_flock(&fl);
        let ino = self.handle(fh)?.ino();
        Ok(Some(Conflict {
            lock: found,
            pid: self.local_holder(ino, owner, spec, found),
        }))
    }

    /// The pid of the owner through this mount that holds `found` (the answer to
    /// `spec` for `asker`): the one from whose descriptor the same question no longer
    /// finds it. 0 when the holder is not here (another node) or not known.
    fn local_holder(&self, ino: NodeId, asker: u64, spec: LockSpec, found: LockSpec) -> u32 {
        let others: Vec<(Arc<OwnedFd>, u32)> = lock(&self.locks.owners)
            .iter()
            .filter(|((i, o), _)| *i == ino && *o != asker)
            .map(|(_, o)| (o.fd.clone(), o.pid))
            .collect();
        for (fd, pid) in others {
            let Ok(mut fl) = spec.to_flock() else {
                return 0;
            };
            if sys::ofd_lock(fd.as_fd(), libc::F_OFD_GETLK, &mut fl).is_ok()
                && (fl.l_type as i32 == libc::F_UNLCK || LockSpec::from_flock(&fl) != found)
            {
                return pid;
            }
        }
        0
    }

    /// Take, change or drop a lock without waiting: a POSIX lock of `owner`, or with
    /// `flock` the open file's flock. A conflicting lock fails with EAGAIN.
    pub fn setlk(&self, fh: u64, owner: u64, spec: LockSpec, pid: u32, flock: bool) -> Result<()> {
        if flock {
            let h = self.handle(fh)?;
            let op = spec.flock_op(false).op("flock")?;
            return Ok(sys::flock(h.file.as_fd(), op).op("flock")?);
        }
        let key = (self.handle(fh)?.ino(), owner);
        if spec.typ == libc::F_UNLCK && !lock(&self.locks.owners).contains_key(&key) {
            // Nothing held, nothing to open a descriptor for.
            return Ok(());
        }
        loop {
            let fd = self.owner_fd(fh, owner, pid)?;
            let mut fl = spec.to_flock().op("F_SETLK")?;
            sys::ofd_lock(fd.as_fd(), libc::F_OFD_SETLK, &mut fl).op("F_SETLK")?;
            // A close by the same owner (FLUSH) may have dropped the descriptor
            // meanwhile: the lock just taken goes with it, so take it again.
            let current = lock(&self.locks.owners).get(&key).map(|o| o.fd.clone());
            if spec.typ == libc::F_UNLCK || current.is_some_and(|c| Arc::ptr_eq(&c, &fd)) {
                return Ok(());
            }
        }
    }

    /// `owner` closed a descriptor of `fh`'s file (FLUSH): POSIX drops all its locks
    /// on the file.
    pub fn unlock_owner(&self, fh: u64, owner: u64) {
        if let Ok(h) = self.handle(fh) {
            // Closing the owner's descriptor releases its OFD locks.
            lock(&self.locks.owners).remove(&(h.ino(), owner));
        }
    }

    /// The open file `fh` is being released; with `flock` (the kernel sends
    /// FUSE_RELEASE_FLOCK_UNLOCK when the open file had a flock) its flock goes.
    pub fn release_locks(&self, fh: u64, flock: bool) -> Result<()> {
        let h = self.handle(fh)?;
        if flock {
            sys::flock(h.file.as_fd(), libc::LOCK_UN).op("flock")?;
        }
        Ok(())
    }

    /// Drop the descriptors of every owner of `ino` once no handle of it is open: no
    /// process here can hold a POSIX lock on a file it has no descriptor of.
    pub(super) fn forget_lock_owners(&self, ino: NodeId) {
        let mut owners = lock(&self.locks.owners);
        if owners.keys().any(|(i, _)| *i == ino) && !self.handles.any_open(ino) {
            owners.retain(|(i, _), _| *i != ino);
        }
    }
}

/// Whether the backing filesystem holds the locks Tessera takes, tried on a probe
/// file in the directory `dir` (an `O_TMPFILE`, or a name unlinked at once): an OFD
/// write lock and an exclusive flock. On a read-only mount (`writable` false) the
/// directory itself is tried (read lock, shared flock).
pub fn probe_locks(dir: std::os::fd::BorrowedFd<'_>, writable: bool) -> Result<(), SysError> {
    probe_locks_in(dir, writable, true)
}

/// [`probe_locks`]; without `tmpfile`, as on a backend without `O_TMPFILE`.
fn probe_locks_in(
    dir: std::os::fd::BorrowedFd<'_>,
    writable: bool,
    tmpfile: bool,
) -> Result<(), SysError> {
    let (file, typ, op) = if writable {
        let tmp = if tmpfile {
            sys::openat(
                dir,
                c".",
                libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        } else {
            Err(Errno::EOPNOTSUPP)
        };
        let file = match tmp {
            Ok(f) => f,
            Err(_) => named_probe_file(dir)?,
        };
        (file, libc::F_WRLCK, libc::LOCK_EX)
    } else {
        let f = sys::openat(
            dir,
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
        .op("open the volume directory")?;
        (f, libc::F_RDLCK, libc::LOCK_SH)
    };
    let whole = |typ| LockSpec {
        typ,
        start: 0,
        end: OFFSET_MAX,
    };
    let mut fl = whole(typ).to_flock().op("F_OFD_SETLK")?;
    sys::ofd_lock(file.as_fd(), libc::F_OFD_SETLK, &mut fl).op("F_OFD_SETLK")?;
    let mut fl = whole(libc::F_UNLCK).to_flock().op("F_OFD_SETLK")?;
    sys::ofd_lock(file.as_fd(), libc::F_OFD_SETLK, &mut fl).op("F_OFD_SETLK")?;
    sys::flock(file.as_fd(), op | libc::LOCK_NB).op("flock")?;
    sys::flock(file.as_fd(), libc::LOCK_UN).op("flock")?;
    Ok(())
}

/// Probe files made at once: beside another prober (a daemon of the same volume on
/// another node, pid 1 in its Pod as this one is) a name may be taken; a new one is
/// drawn.
const PROBE_NAMES: usize = 8;

/// A new, already unlinked file in `dir` for the lock probe, made under a name no
/// other prober draws (pid, time and random bits: two daemons of one volume on two
/// nodes are each pid 1 in their Pod and probe the same shared directory at once).
fn named_probe_file(dir: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd, SysError> {
    let mut last = Errno::EEXIST;
    for _ in 0..PROBE_NAMES {
        let name = std::ffi::CString::new(format!(
            ".tessera-lock-probe.{}.{:016x}",
            std::process::id(),
            unique_bits()
        ))
        .expect("no NUL");
        match sys::openat(
            dir,
            &name,
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600,
        ) {
            Ok(f) => {
                let _ = sys::unlinkat(dir, &name, 0);
                return Ok(f);
            }
            Err(Errno::EEXIST) => last = Errno::EEXIST,
            Err(e) => return Err(e).op("create the lock probe file"),
        }
    }
    Err(last).op("create the lock probe file")
}

/// 64 bits no other process draws: the kernel's random bytes, else the clock.
fn unique_bits() -> u64 {
    let mut bits = [0u8; 8];
    // SAFETY: writes at most 8 bytes into `bits`.
    let n = unsafe { libc::getrandom(bits.as_mut_ptr().cast(), bits.len(), libc::GRND_NONBLOCK) };
    if n == 8 {
        return u64::from_ne_bytes(bits);
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Whether a failed non-blocking attempt means "held by someone else, try later".
pub fn is_contended(e: &FsError) -> bool {
    matches!(e, FsError::Sys(s) if matches!(s.errno, Errno::EAGAIN | Errno::EACCES))
}

#[cfg(test)]
mod tests;
