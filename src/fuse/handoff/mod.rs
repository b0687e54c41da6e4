//! /dev/fuse handoff: the kernel connection of a mount outlives the daemon serving
//! it, and a successor daemon takes it over without the mount ever going away.
//!
//! ```text
//!  daemon A ── mount(2) ── fd ──dup──▶ holder (node agent; `holder`)
//!     │  every inode / open handle change ──▶ state file (shared mapping; `state`)
//!     ✗ killed (requests it had read stay in the connection's processing queue,
//!       because the holder's duplicate keeps that queue's device open)
//!  daemon B ── GET fd from the holder ── read A's state file ── reopen inodes by
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

pub mod holder;
pub mod state;

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use self::state::{InitRecord, Snapshot};

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
fn is_fuse_mount(mountpoint: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| {
            crate::host::mounts::parse_mountinfo(&text)
                .iter()
                .any(|m| m.mount_point == mountpoint && m.fs_type.starts_with("fuse"))
        })
        .unwrap_or(false)
}

/// What the holder at `socket` and the state at `state` offer for `mountpoint`:
/// a takeover, or `None` (with the reason logged) when the daemon must mount anew.
pub fn find(socket: &Path, mountpoint: &Path, state: &Path) -> Option<Takeover> {
    let fd = match holder::take(socket, mountpoint) {
        Ok(Some(fd)) => fd,
        Ok(None) => {
            tracing::info!("handoff: the holder has no connection for this mount point");
            return None;
        }
        Err(e) => {
            tracing::info!(error = %e, "handoff: no holder to ask");
            return None;
        }
    };
    if holder::connection_ended(fd.as_fd()) {
        tracing::info!("handoff: the held connection has ended");
        return None;
    }
    if !is_fuse_mount(mountpoint) {
        tracing::warn!("handoff: a connection is held, but the mount point is not a FUSE mount");
        return None;
    }
    let snapshot = match state::read(state) {
        Ok(Some(s)) => s,
        Ok(None) => {
            tracing::warn!(state = %state.display(), "handoff: no state file of this layout");
            return None;
        }
        Err(e) => {
            tracing::warn!(state = %state.display(), error = %e, "handoff: state file unreadable");
            return None;
        }
    };
    let Some(init) = snapshot.init else {
        tracing::warn!("handoff: the state has no recorded INIT");
        return None;
    };
    if snapshot.overflow {
        tracing::warn!("handoff: the state overflowed its tables; cannot take over");
        return None;
    }
    Some(Takeover {
        fd,
        init: fuser::ResumeInit {
            abi: fuser::Version(init.abi_major, init.abi_minor),
            flags: init.flags,
            max_readahead: init.max_readahead,
        },
        snapshot,
    })
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
