//! /dev/fuse handoff: the kernel connection of a mount outlives the daemon serving
//! it, and a successor daemon takes it over without the mount ever going away.
//!
//! ```text
//!  daemon A ── mount(2) ── fd ──dup──▶ holder (`fuse::fd_holder`; `contract::holder_socket`)
//!     │  every inode / open handle change ──▶ state file (shared mapping; `state`)
//!     ✗ killed (requests it had read stay in the connection's processing queue,
//!       because the holder's duplicate keeps that queue's device open)
//!  daemon B ── CLAIM fd from the holder (only once A is gone; `--standby`: wait
//!     for that, started beside a live A) ── read A's state file ── reopen inodes by
//!     file handle, open files with their flags, same fh numbers ── resume the
//!     session without INIT ── FUSE_NOTIFY_RESEND (the kernel queues again what A
//!     had read and not answered) ── serve
//! ```
//!
//! Handoff mode (`--holder`) reads every request through the one descriptor the
//! holder duplicates, not through `FUSE_DEV_IOC_CLONE` clones: the kernel fails the
//! requests a closed clone had read (`ECONNABORTED`) instead of keeping them for a
//! resend.
//!
//! What a successor recovers and what an application may still observe: see
//! `docs/handoff.md`.

pub mod state;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fuser::{Config, Session, SessionACL};

use self::state::{InitRecord, Snapshot, StateFile};
use super::adapter::Adapter;
use super::contract::holder_socket;
use super::fs::VolumeFs;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A held connection a successor can serve, with its predecessor's state.
#[derive(Debug)]
pub struct Takeover {
    pub fd: OwnedFd,
    pub snapshot: Snapshot,
    pub init: fuser::ResumeInit,
}

/// Whether `mountpoint` is a FUSE mount in this mount namespace (read from
/// mountinfo: never a syscall on the mount point itself, which would wait for a
/// daemon that is not there).
pub(crate) fn is_fuse_mount(mountpoint: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| {
            tessera_host::mounts::parse_mountinfo(&text)
                .iter()
                .any(|m| m.mount_point == mountpoint && m.fs_type.starts_with("fuse"))
        })
        .unwrap_or(false)
}

/// Why a held, live connection cannot be taken over.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("a connection is held, but the mount point is not a FUSE mount")]
    NotMounted,
    #[error("no handoff state of this layout at {0}")]
    NoState(std::path::PathBuf),
    #[error("the handoff state is unreadable")]
    Unreadable(#[source] io::Error),
    #[error("the handoff state has no recorded INIT")]
    NoInit,
    #[error("the handoff state overflowed its tables")]
    Overflow,
    #[error("another daemon serves or takes over the held connection")]
    Busy,
    #[error("a standby found no held connection to take over")]
    NothingHeld,
    #[error(
        "started to serve the node agent's mount (--mounted), but the holder holds no connection for it (the agent gave up waiting, or tore the volume down)"
    )]
    NotHeldForUs,
}

/// How long a standby waits for its predecessor to leave.
pub const STANDBY_WAIT: Duration = Duration::from_secs(300);

/// How long a standby keeps asking when the holder went away or holds nothing (yet):
/// a holder restarting beside the same upgrade, the serving daemon not having handed
/// its descriptor to the new one yet (it waits for that before it leaves, at most
/// 20 s: `signals`).
pub const STANDBY_HOLDER_WAIT: Duration = Duration::from_secs(25);

/// A standby's claim: answered once the serving daemon has left. A holder that goes
/// away while the standby waits, or that holds nothing for the mount point, is asked
/// again for up to [`STANDBY_HOLDER_WAIT`] before the standby gives up.
fn standby_claim(socket: &Path, mountpoint: &Path) -> std::io::Result<holder_socket::Claimed> {
    let deadline = Instant::now() + STANDBY_WAIT;
    let mut unheld_since: Option<Instant> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = holder_socket::claim_when_free(socket, mountpoint, left);
        if let Ok(
            holder_socket::Claimed::Fd(_)
            | holder_socket::Claimed::Fresh(_)
            | holder_socket::Claimed::Busy,
        ) = r
        {
            return r;
        }
        let since = *unheld_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= STANDBY_HOLDER_WAIT || Instant::now() >= deadline {
            return r;
        }
        match &r {
            Err(e) => {
                tracing::info!(error = %e, "handoff: standby: the holder went away; asking again")
            }
            Ok(_) => tracing::info!("handoff: standby: the holder holds nothing yet; asking again"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What a daemon found held for its mount point.
#[derive(Debug)]
pub enum Found {
    /// A connection another daemon served: resumed without INIT.
    Takeover(Takeover),
    /// A connection the node agent mounted and nobody initialised: served after
    /// answering its INIT.
    Fresh(OwnedFd),
}

/// What the holder at `socket` and the state at `state` offer for `mountpoint`: a
/// takeover or a fresh connection the agent mounted; `Ok(None)` (the reason logged)
/// when nothing live is held, and the daemon mounts anew; `Err` when a live
/// connection is held but cannot be served.
/// Mounting over it would leave the applications on it blocked for ever, so the
/// caller makes the holder let go (which ends it: they see ENOTCONN) and exits, and
/// the agent repairs by remounting.
pub fn find(
    socket: &Path,
    mountpoint: &Path,
    state: &Path,
    standby: bool,
) -> Result<Option<Found>, Refused> {
    let claimed = if standby {
        tracing::info!("handoff: standby, waiting for the serving daemon to leave");
        standby_claim(socket, mountpoint)
    } else {
        // The predecessor's holder connection may end a moment after its process
        // (the holder has not read the EOF yet): busy that long is not a refusal.
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match holder_socket::claim(socket, mountpoint) {
                Ok(holder_socket::Claimed::Busy) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                r => break r,
            }
        }
    };
    let (fd, fresh) = match claimed {
        Ok(holder_socket::Claimed::Fd(fd)) => (fd, false),
        Ok(holder_socket::Claimed::Fresh(fd)) => (fd, true),
        Ok(holder_socket::Claimed::Busy) => return Err(Refused::Busy),
        Ok(holder_socket::Claimed::None) if standby => return Err(Refused::NothingHeld),
        Ok(holder_socket::Claimed::None) => {
            tracing::info!("handoff: the holder has no connection for this mount point");
            return Ok(None);
        }
        Err(e) if standby => return Err(Refused::Unreadable(e)),
        // A holder of an earlier release (no CLAIM): ask as it did.
        Err(_) => match holder_socket::take(socket, mountpoint) {
            Ok(Some(fd)) => (fd, false),
            Ok(None) => {
                tracing::info!("handoff: the holder has no connection for this mount point");
                return Ok(None);
            }
            Err(e) => {
                tracing::info!(error = %e, "handoff: no holder to ask");
                return Ok(None);
            }
        },
    };
    if holder_socket::connection_ended(fd.as_fd()) {
        tracing::info!("handoff: the held connection has ended");
        return Ok(None);
    }
    if !is_fuse_mount(mountpoint) {
        return Err(Refused::NotMounted);
    }
    let snapshot = match state::read(state) {
        Ok(Some(s)) => Some(s),
        Ok(None) => None,
        Err(e) if !fresh => return Err(Refused::Unreadable(e)),
        Err(_) => None,
    };
    // A fresh connection is resumed only if a daemon had answered its INIT (and
    // recorded it) before dying without handing it back; else INIT is ours to answer.
    let snapshot = match snapshot {
        Some(s) if s.init.is_some() || !fresh => s,
        _ if fresh => {
            tracing::info!("handoff: serving the connection the node agent mounted");
            return Ok(Some(Found::Fresh(fd)));
        }
        _ => return Err(Refused::NoState(state.to_path_buf())),
    };
    let Some(init) = snapshot.init else {
        return Err(Refused::NoInit);
    };
    if snapshot.overflow {
        return Err(Refused::Overflow);
    }
    Ok(Some(Found::Takeover(Takeover {
        fd,
        init: fuser::ResumeInit {
            abi: fuser::Version(init.abi_major, init.abi_minor),
            flags: init.flags,
            max_readahead: init.max_readahead,
        },
        snapshot,
    })))
}

/// The state file's record of a negotiated INIT.
pub fn init_record(init: fuser::ResumeInit) -> InitRecord {
    InitRecord {
        abi_major: init.abi.0,
        abi_minor: init.abi.1,
        flags: init.flags,
        max_readahead: init.max_readahead,
    }
}

/// What a daemon's start decided about the handoff, before its session exists.
#[derive(Debug, Default)]
pub struct Prepared {
    /// A held connection to serve, its predecessor's state restored into the core.
    takeover: Option<Takeover>,
    /// A connection the node agent mounted, to initialise and serve.
    fresh: Option<OwnedFd>,
    /// The state file this daemon keeps (not yet published).
    state: Option<Arc<StateFile>>,
}

impl Prepared {
    /// The fence epoch of the predecessor taken over, if it recorded one.
    pub fn fence_epoch(&self) -> Option<u64> {
        self.takeover.as_ref().and_then(|t| t.snapshot.fence_epoch)
    }

    /// The state file this daemon keeps, if any.
    pub fn state(&self) -> Option<Arc<StateFile>> {
        self.state.clone()
    }
}

/// With `--holder` and `--handoff-state`: look for a held connection of
/// `mountpoint` and restore its predecessor's state into `fs`; then start this
/// daemon's own state file and record `fs`'s tables in it. A live connection that
/// cannot be taken over is let go (see [`find`]) and refused. With `mounted` (the
/// node agent mounts: `--mounted`) the daemon never mounts: nothing held is refused.
pub fn prepare(
    holder: Option<&Path>,
    state: Option<&Path>,
    mountpoint: &Path,
    fs: &VolumeFs,
    standby: bool,
    mounted: bool,
) -> Result<Prepared, Refused> {
    let (Some(socket), Some(path)) = (holder, state) else {
        return Ok(Prepared::default());
    };
    let (takeover, fresh) = match find(socket, mountpoint, path, standby) {
        Ok(Some(Found::Takeover(t))) => (Some(t), None),
        Ok(Some(Found::Fresh(fd))) => (None, Some(fd)),
        Ok(None) if mounted => {
            tracing::error!(error = %Refused::NotHeldForUs, "handoff: nothing to serve");
            return Err(Refused::NotHeldForUs);
        }
        Ok(None) => (None, None),
        // Not ours to take (someone serves it), or nothing to take: leave it be.
        Err(refused @ (Refused::Busy | Refused::NothingHeld)) => {
            tracing::error!(error = %refused, "handoff: not taking the connection over");
            return Err(refused);
        }
        Err(refused) => {
            tracing::error!(error = %refused, "handoff: the held connection cannot be taken over; letting it go");
            if let Err(e) = holder_socket::forget(socket, mountpoint) {
                tracing::warn!(error = %e, "the holder was not told to let go");
            }
            return Err(refused);
        }
    };
    if let Some(t) = &takeover {
        let r = fs.restore(&t.snapshot.records);
        tracing::info!(
            inodes = r.inodes,
            inodes_lost = r.inodes_lost,
            handles = r.handles,
            handles_lost = r.handles_lost,
            writes_in_flight = r.writes_in_flight,
            "handoff: predecessor's state restored"
        );
    }
    let state = match StateFile::create(path) {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "no handoff state: a successor cannot take over");
            None
        }
    };
    if let Some(state) = &state {
        fs.record_into(state.clone());
    }
    Ok(Prepared {
        takeover,
        fresh,
        state,
    })
}

/// The session of the daemon: the held connection resumed (the predecessor's
/// passthrough backing ids adopted), or a fresh mount. Then the state file is
/// published with the connection's INIT, the descriptor handed to the holder, and,
/// after a takeover, the kernel asked to resend what the predecessor had read and
/// not answered. Returns the session and whether it took over.
pub fn open_session(
    adapter: Adapter,
    mountpoint: &Path,
    config: Config,
    prepared: Prepared,
    holder: Option<&Path>,
) -> io::Result<(Session<Adapter>, bool)> {
    let Prepared {
        takeover,
        fresh,
        state,
    } = prepared;
    let resumed = takeover.is_some();
    let session = match (takeover, fresh) {
        (Some(t), _) => {
            let adopter = adapter.backing_adopter();
            let session = Session::resume_fd(adapter, t.fd, SessionACL::All, config, t.init)?;
            let notifier = session.notifier();
            for h in &t.snapshot.records.handles {
                if let Some(id) = h.backing_id {
                    adopter.adopt(&notifier, h.fh, h.ino, id);
                }
            }
            session
        }
        // The agent mounted: answer the kernel's INIT on the descriptor, mount nothing.
        (None, Some(fd)) => Session::from_fd(adapter, fd, SessionACL::All, config)?,
        (None, None) => Session::new(adapter, mountpoint, &config)?,
    };
    if let (Some(state), Some(init)) = (&state, session.negotiated()) {
        state.set_init(init_record(init));
        if let Err(e) = state.publish() {
            tracing::warn!(error = %e, "handoff state not published: a successor cannot take over");
        }
    }
    if let Some(socket) = holder {
        let handed = session.as_fd().try_clone_to_owned().and_then(|fd| {
            holder_socket::hand_over(socket.to_path_buf(), mountpoint.to_path_buf(), fd)
        });
        if let Err(e) = handed {
            tracing::warn!(error = %e, "the FUSE descriptor is not handed to the holder");
        }
    }
    if resumed {
        // What the predecessor had read and not answered: queued again, for us.
        match session.notifier().resend() {
            Ok(()) => {
                tracing::info!("handoff: the kernel resends what the predecessor had not answered")
            }
            Err(e) => tracing::warn!(
                error = %e,
                "handoff: FUSE_NOTIFY_RESEND refused; requests the predecessor had read may hang"
            ),
        }
    }
    Ok((session, resumed))
}
