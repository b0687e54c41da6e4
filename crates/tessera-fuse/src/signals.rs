//! The daemon's signal thread: SIGHUP re-reads the capacity and the settings file; the first SIGTERM or
//! SIGINT unmounts (telling the fd holder first) and the daemon exits once nothing
//! refers to the connection or the grace period ends; SIGUSR1 (with `--holder`) exits
//! without unmounting, for a successor to take the held connection over; SIGUSR2
//! (with `--holder`) makes the next stop signal do that instead of unmounting: a mount
//! Pod deleted for an upgrade gets the kubelet's SIGTERM, and must leave the mount to
//! the Pod that replaces it (the agent arms it, then deletes the Pod).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};

use super::contract::control::{LEAVE, LEAVE_ON_STOP, RELOAD};
use super::fs::VolumeFs;
use super::quota::Enforcement;
use super::{handoff, log_counters, read_capacity};

/// How long a daemon told to leave its connection to a successor waits for a holder
/// to hold it (below the kubelet's 30 s grace for a mount Pod).
const HELD_WAIT: Duration = Duration::from_secs(20);

/// What the signal thread needs.
pub(super) struct SignalContext {
    pub(super) signals: SigSet,
    pub(super) unmounter: fuser::SessionUnmounter,
    pub(super) quota: Arc<Enforcement>,
    pub(super) capacity_file: Option<PathBuf>,
    /// The settings file, and the lifetime it sets (else `default_ttl`).
    pub(super) settings_file: Option<PathBuf>,
    pub(super) ttl: super::adapter::LiveTtl,
    pub(super) default_ttl: Duration,
    pub(super) mountpoint: PathBuf,
    /// How long the connection may outlive the unmount after a stop signal.
    pub(super) grace: Duration,
    pub(super) fs: Arc<VolumeFs>,
    /// The fd holder to tell before an unmount on purpose.
    pub(super) holder: Option<PathBuf>,
}

impl SignalContext {
    /// Takes SIGHUP (reload the capacity) and the stop signals. The first stop signal
    /// unmounts (lazily when busy); the serving loop ends by itself once nothing refers
    /// to the connection any more. Open files and mounts elsewhere (a bind, a copy
    /// propagated to another mount namespace) would keep it alive for ever, so after
    /// the grace period, or at a second stop signal, the daemon exits anyway, which
    /// ends the connection for them.
    pub(super) fn run(mut self) {
        let mut deadline: Option<Instant> = None;
        let mut leave_on_stop = false;
        loop {
            let signal = match deadline {
                None => self.signals.wait().map(Some),
                Some(d) => wait_signal_until(&self.signals, d),
            };
            let signal = match signal {
                Ok(Some(s)) => s,
                Ok(None) => {
                    tracing::warn!(
                        grace = ?self.grace,
                        "still referenced after the unmount (open files, or the mount bound elsewhere): exiting; they lose the mount"
                    );
                    self.exit(0);
                }
                Err(e) => {
                    tracing::error!(error = %e, "waiting for signals failed");
                    return;
                }
            };
            match signal {
                RELOAD => {
                    self.reload_capacity();
                    self.reload_settings();
                }
                LEAVE if self.holder.is_some() => {
                    // A planned replacement: the holder keeps the connection, the
                    // successor takes it over; nothing is unmounted.
                    tracing::info!("SIGUSR1: exiting for a successor, the mount stays");
                    self.hand_over();
                }
                LEAVE_ON_STOP if self.holder.is_some() => {
                    tracing::info!("SIGUSR2: the next stop signal leaves the mount to a successor");
                    leave_on_stop = true;
                }
                LEAVE | LEAVE_ON_STOP => {
                    tracing::warn!(
                        %signal,
                        "without --holder nobody would keep the mount; ignored"
                    );
                }
                _ if leave_on_stop && deadline.is_none() => {
                    tracing::info!(%signal, "stop signal after SIGUSR2: exiting for a successor, the mount stays");
                    self.hand_over();
                }
                _ if deadline.is_some() => {
                    tracing::warn!(%signal, "second stop signal: exiting, open files lose the mount");
                    self.exit(1);
                }
                _ => {
                    tracing::info!(%signal, mountpoint = %self.mountpoint.display(), "unmounting");
                    self.unmount();
                    deadline = Some(Instant::now() + self.grace);
                }
            }
        }
    }

    /// Exit without unmounting and without telling the holder: it keeps the
    /// connection for the successor. Not while no holder holds it (one restarting
    /// beside an upgrade): the daemon keeps serving until the hand-over thread has
    /// given the descriptor to the new holder, at most [`HELD_WAIT`] (the kubelet's
    /// grace for a mount Pod is 30 s); past that it goes anyway, and says so.
    fn hand_over(&self) -> ! {
        let begun = Instant::now();
        if super::contract::holder_socket::wait_held(Duration::ZERO) {
            // Held: go at once (the common case).
        } else if super::contract::holder_socket::wait_held(HELD_WAIT) {
            tracing::info!(waited = ?begun.elapsed(), "the holder holds the connection again: leaving it to the successor");
        } else {
            tracing::error!(waited = ?HELD_WAIT, "no fd holder holds the connection: leaving anyway, the mount ends with this daemon");
        }
        log_counters(&self.fs, &self.mountpoint, "handed over");
        std::process::exit(0)
    }

    fn exit(&self, code: i32) -> ! {
        log_counters(&self.fs, &self.mountpoint, "unmounted");
        std::process::exit(code)
    }

    fn reload_settings(&self) {
        let Some(path) = &self.settings_file else {
            return;
        };
        match super::contract::settings::Settings::read(path) {
            Ok(s) => {
                let ttl = s.ttl(self.default_ttl);
                let old = self.ttl.set(ttl);
                if old != ttl {
                    tracing::info!(from = ?old, to = ?ttl, "attribute cache lifetime changed");
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "settings not reloaded; keeping the old ones")
            }
        }
    }

    fn reload_capacity(&self) {
        let Some(path) = &self.capacity_file else {
            tracing::warn!("SIGHUP without --capacity-file: nothing to reload");
            return;
        };
        match read_capacity(path) {
            Ok(capacity) => match self.quota.set_capacity(capacity) {
                Ok(old) => {
                    let used = self.quota.usage().ok().map(|u| u.used);
                    let quota = self.quota.mode().as_str();
                    tracing::info!(quota, old, capacity, used, "capacity reloaded");
                }
                Err(e) => {
                    tracing::error!(error = %e, "capacity not set; keeping the old one");
                }
            },
            Err(e) => tracing::error!(error = %e, "capacity not reloaded; keeping the old one"),
        }
    }

    fn unmount(&mut self) {
        if let Some(socket) = &self.holder
            && let Err(e) = super::contract::holder_socket::forget(socket, &self.mountpoint)
        {
            tracing::warn!(error = %e, "the holder was not told to forget the connection");
        }
        // A session that took over a held connection did not mount: unmount by name.
        let unmounted = match self.unmounter.unmount() {
            Ok(()) if handoff::is_fuse_mount(&self.mountpoint) => {
                nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::empty())
                    .map_err(io::Error::from)
            }
            r => r,
        };
        match unmounted {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                // Files are open: detach now, keep serving them until they are closed.
                tracing::warn!("mount busy: detaching lazily");
                if let Err(e) =
                    nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH)
                {
                    tracing::error!(error = %e, "lazy unmount failed");
                }
            }
            Err(e) => tracing::error!(error = %e, "unmount failed"),
        }
    }
}

/// The next of `signals` (blocked in this thread) before `deadline`, or None.
fn wait_signal_until(signals: &SigSet, deadline: Instant) -> nix::Result<Option<Signal>> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(left.subsec_nanos()),
        };
        // SAFETY: a valid signal set and timespec; no siginfo wanted.
        let r = unsafe { libc::sigtimedwait(signals.as_ref(), std::ptr::null_mut(), &ts) };
        if r >= 0 {
            return Signal::try_from(r).map(Some);
        }
        match nix::errno::Errno::last() {
            nix::errno::Errno::EAGAIN => return Ok(None),
            nix::errno::Errno::EINTR => continue,
            e => return Err(e),
        }
    }
}
