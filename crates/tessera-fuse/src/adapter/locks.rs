//! Locks through the adapter: negotiating FUSE_POSIX_LOCKS and FUSE_FLOCK_LOCKS, and
//! serving getlk, setlk (blocking ones through the core's [`Waiters`]), the owner's
//! unlock on flush, the flock's on release, and interrupts of waits. What a lock is
//! on the backend is the core's business ([`crate::fs`] `locks`).

use std::sync::Arc;

use fuser::{Errno, INodeNo, InitFlags, KernelConfig, ReplyEmpty, ReplyLock};

use super::{Adapter, errno};
use crate::fs::{LockSpec, VolumeFs, WaitEnd, is_contended};

/// Lock waits a mount keeps at once; more fail with ENOLCK.
pub const MAX_WAITS: usize = 4096;

impl Adapter {
    /// Ask for both lock capabilities when the backend holds locks (`options.locks`);
    /// whether the kernel gave them.
    pub(super) fn negotiate_locks(&self, config: &mut KernelConfig) -> bool {
        if !self.options.locks {
            return false;
        }
        let both = InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
        config.capabilities().contains(both) && config.add_capabilities(both).is_ok()
    }

    /// FLUSH: `owner` closed a descriptor of `fh`'s file; its POSIX locks go.
    pub(super) fn unlock_owner(&self, fh: u64, owner: u64) {
        self.fs.unlock_owner(fh, owner);
        self.waiters.retry_now();
    }

    /// RELEASE: the open file's flock goes, when it had one.
    pub(super) fn release_flock(&self, fh: u64, flock: bool) {
        if flock {
            let _ = self.fs.release_locks(fh, true);
            self.waiters.retry_now();
        }
    }

    pub(super) fn serve_getlk(&self, fh: u64, owner: u64, spec: LockSpec, reply: ReplyLock) {
        match self.fs.getlk(fh, owner, spec) {
            Ok(Some(c)) => reply.locked(c.lock.start, c.lock.end, c.lock.typ, c.pid),
            Ok(None) => reply.locked(spec.start, spec.end, libc::F_UNLCK, 0),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// setlk, and setlkw: tried at once; if the lock is held elsewhere and the
    /// caller waits, the wait goes to the waiter thread and this request thread is
    /// free again.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn serve_setlk(
        &self,
        unique: u64,
        ino: INodeNo,
        fh: u64,
        owner: u64,
        spec: LockSpec,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let taken = (spec.typ != libc::F_UNLCK)
            .then(|| self.on_lock_taken(ino))
            .flatten();
        match self.fs.setlk(fh, owner, spec, pid, flock) {
            Ok(()) => {
                if let Some(invalidate) = taken {
                    invalidate();
                }
                reply.ok();
                if spec.typ == libc::F_UNLCK {
                    self.waiters.retry_now();
                }
            }
            Err(e) if sleep && is_contended(&e) => {
                let fs: Arc<VolumeFs> = self.fs.clone();
                self.waiters.wait(
                    unique,
                    Box::new(move || match fs.setlk(fh, owner, spec, pid, flock) {
                        Ok(()) => Ok(true),
                        Err(e) if is_contended(&e) => Ok(false),
                        Err(e) => Err(e.errno()),
                    }),
                    Box::new(move |end| match end {
                        WaitEnd::Taken => {
                            if let Some(invalidate) = taken {
                                invalidate();
                            }
                            reply.ok()
                        }
                        WaitEnd::Failed(e) => reply.error(Errno::from_i32(e)),
                        WaitEnd::Interrupted => reply.error(Errno::EINTR),
                        WaitEnd::TooMany => reply.error(Errno::ENOLCK),
                    }),
                );
            }
            Err(e) => reply.error(errno(&e)),
        }
    }
}
