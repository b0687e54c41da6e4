//! How the kernel does I/O on each open regular file, and the rules that pick it.
//!
//! A regular file is opened in one of three modes (see [`IoMode`]):
//! kernel passthrough (the kernel reads and writes the backing file itself, the
//! daemon never sees the I/O), FUSE direct I/O (every write comes straight from the
//! writer's buffer to [`VolumeFs::write`], no FUSE page cache), or the ordinary
//! cached FUSE path (writes come to the daemon write-through, reads are served from
//! the page cache). Which one depends on who enforces the quota
//! ([`crate::quota::Mode`], chosen once at mount):
//!
//! - **backend mode** (an XFS project quota on the volume directory): the backing
//!   filesystem stops a writer at the limit with `ENOSPC` whoever it is, the daemon's
//!   own credentials included, so a write need not pass through the daemon. Every
//!   open is passthrough, writable ones too. The exception is a writable open of a
//!   set-user/group-ID file: a passthrough write runs with the daemon's credentials
//!   (`CAP_FSETID`), which would keep the bits a write by the caller must clear
//!   (observed on Linux 6.12), so such a writer gets the daemon-mode treatment below.
//!   The check is made at open: a set-ID bit set (by the owner or root) while a
//!   passthrough writer holds the file open survives that writer's later writes;
//! - **daemon mode** (no backend quota): the daemon counts every byte, so writes must
//!   reach it. Read-only opens use passthrough, write-only opens direct I/O,
//!   read-write opens the cached path. Passthrough is never used for writes: the
//!   kernel would write to the backing file without asking the daemon, and no
//!   headroom heuristic bounds how much a writer appends before the daemon could
//!   notice (one `pwrite` at a far offset grows the apparent size by any amount, a
//!   passthrough open cannot be revoked once granted, and the only size limit the
//!   kernel applies to such a write is the *writer's* `RLIMIT_FSIZE`).
//!
//! The kernel requires every open of an inode that has passthrough opens to be a
//! passthrough open too (anything else fails with EIO), and refuses passthrough while
//! cached opens exist. Hence:
//!
//! - a read-only open is passthrough unless the inode has cached opens; then it is
//!   cached too. Write-only direct opens do not stand in its way. In backend mode the
//!   same holds for writable opens;
//! - in daemon mode only, a writable open of an inode that passthrough opens hold
//!   waits up to a second for them to be released (the kernel reports a close
//!   asynchronously, so a reader that has just closed may not be released yet), then
//!   is refused with `ETXTBSY` ("file busy", as for writing a running executable)
//!   instead of being given a passthrough write the quota cannot see. Writers that
//!   open first are never refused. `tessera mount --no-passthrough` removes the
//!   restriction, at the cost of every read and write crossing into the daemon.

use std::os::fd::BorrowedFd;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::handles::Handle;
use super::inodes::Inode;
use super::types::IoState;
use super::{FsError, IoMode, Result, VolumeFs, lock};
use crate::quota::Mode;
use crate::sys::{self, Op};

/// How long a writable open waits for passthrough readers of the file to be released
/// before it fails as busy (see the module docs).
const RELEASE_GRACE: Duration = Duration::from_secs(1);

/// Whether a write by a caller without `CAP_FSETID` would have to clear mode bits:
/// set-user-ID, or set-group-ID with group execute (without it, set-group-ID marks
/// mandatory locking, not privilege).
fn has_set_id_bits(file: BorrowedFd<'_>) -> Result<bool> {
    let mode = sys::fstat(file).op("fstat")?.st_mode;
    Ok(mode & libc::S_ISUID != 0
        || mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP)
}

impl VolumeFs {
    /// Switch kernel passthrough on or off (the adapter does once the kernel agreed to
    /// it in `init`, and off again if registering files fails).
    pub fn set_passthrough(&self, on: bool) {
        self.passthrough.store(on, Ordering::Release);
    }

    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Acquire)
    }

    /// Pick the I/O mode of a new open of `inode` (with `flags`) and count it.
    pub(super) fn choose_mode(
        &self,
        inode: &Inode,
        file: BorrowedFd<'_>,
        flags: i32,
    ) -> Result<IoMode> {
        let io = lock(&inode.io);
        let (mut io, mode) = match self.quota.mode() {
            Mode::Daemon => self.daemon_mode_io(inode, io, flags)?,
            // A passthrough write runs with the daemon's credentials, which may keep
            // set-user/group-ID bits a write by the caller must clear: such writers
            // go through the daemon, which clears them.
            Mode::Backend
                if flags & libc::O_ACCMODE != libc::O_RDONLY && has_set_id_bits(file)? =>
            {
                self.daemon_mode_io(inode, io, flags)?
            }
            Mode::Backend => {
                let mut io = io;
                let mode = Self::backend_mode_io(&mut io, flags, self.passthrough());
                (io, mode)
            }
        };
        io.open += 1;
        match mode {
            IoMode::Passthrough => &self.stats.opens_passthrough,
            IoMode::Cached => &self.stats.opens_cached,
            IoMode::Direct => &self.stats.opens_direct,
        }
        .fetch_add(1, Ordering::Relaxed);
        Ok(mode)
    }

    /// Daemon-enforced quota: every write must reach the daemon, so only read-only
    /// opens may be passthrough, and a writable open of a file that passthrough
    /// readers hold is refused (after waiting up to [`RELEASE_GRACE`]).
    fn daemon_mode_io<'a>(
        &self,
        inode: &'a Inode,
        mut io: MutexGuard<'a, IoState>,
        flags: i32,
    ) -> Result<(MutexGuard<'a, IoState>, IoMode)> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY && io.passthrough > 0 {
            // The kernel sends RELEASE asynchronously after close(): a reader that
            // has just closed may still be counted here. Give its release a moment
            // before calling the file busy.
            io = inode
                .io_released
                .wait_timeout_while(io, RELEASE_GRACE, |io| io.passthrough > 0)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let mode = match flags & libc::O_ACCMODE {
            libc::O_RDONLY if io.cached == 0 && self.passthrough() => {
                io.passthrough += 1;
                IoMode::Passthrough
            }
            // The kernel would only accept a passthrough open, and a passthrough
            // write bypasses the quota.
            libc::O_WRONLY | libc::O_RDWR if io.passthrough > 0 => {
                self.stats.opens_busy.fetch_add(1, Ordering::Relaxed);
                return Err(FsError::Busy);
            }
            libc::O_WRONLY => IoMode::Direct,
            _ => {
                io.cached += 1;
                IoMode::Cached
            }
        };
        Ok((io, mode))
    }

    /// Backend-enforced quota: the backing filesystem stops writers the daemon never
    /// sees, so every open is passthrough while the kernel does passthrough. An inode
    /// that has cached opens (passthrough was refused for one) takes more cached (or,
    /// write-only, direct) opens: the kernel never mixes cached and passthrough opens
    /// of one inode.
    pub(super) fn backend_mode_io(io: &mut IoState, flags: i32, passthrough: bool) -> IoMode {
        if passthrough && io.cached == 0 {
            io.passthrough += 1;
            return IoMode::Passthrough;
        }
        if flags & libc::O_ACCMODE == libc::O_WRONLY {
            IoMode::Direct
        } else {
            io.cached += 1;
            IoMode::Cached
        }
    }

    /// Registering the file for passthrough failed: serve it with cached I/O instead.
    /// (Registration happens at the first passthrough open of an inode, so there is no
    /// other passthrough open the kernel would find in conflict.)
    pub fn passthrough_failed(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        if h.mode.swap(IoMode::Cached as u8, Ordering::AcqRel) == IoMode::Passthrough as u8 {
            let mut io = lock(&h.inode.io);
            io.passthrough -= 1;
            io.cached += 1;
            h.inode.io_released.notify_all();
            drop(io);
            self.handles.mode_changed(fh);
            self.stats
                .passthrough_failures
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Count the released open `h` out of its inode's I/O state, waking writers that
    /// wait for the last passthrough open to go. True when it was the last open of an
    /// inode whose last link went while it was open (its bytes leave the quota now).
    pub(super) fn count_release(h: &Handle) -> bool {
        let mut io = lock(&h.inode.io);
        match h.mode() {
            IoMode::Passthrough => {
                io.passthrough -= 1;
                if io.passthrough == 0 {
                    h.inode.io_released.notify_all();
                }
            }
            IoMode::Cached => io.cached -= 1,
            IoMode::Direct => {}
        }
        io.open -= 1;
        if io.open == 0 && io.orphan {
            io.orphan = false;
            true
        } else {
            false
        }
    }
}
