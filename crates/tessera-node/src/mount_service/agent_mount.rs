//! The agent's own FUSE mount (`--mounter=agent`): `/dev/fuse` opened and mounted
//! here with the daemon's [`kernel_mount::Plan`], the descriptor given to the fd
//! holder, where the daemon started beside (`--mounted`) claims it and answers the
//! kernel's INIT. The mount exists, and Pods can bind it, before any daemon runs;
//! their requests wait until it answers.
//!
//! ```text
//!  start ─▶ agent_mount: plan ─▶ Mounts::mount_fuse ─fd─▶ holder (MOUNTED) ─▶ Progress::Mounted
//!        ─▶ daemon --mounted: CLAIM ─▶ fresh fd ─▶ INIT answered ─▶ serves
//!  no daemon in time (its start failed, or the repair of one that never answered)
//!        ─▶ abandon: the holder drops it (waiting requests: ENOTCONN), detached
//! ```

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use tracing::{info, warn};

use tessera_fuse::contract::kernel_mount;

use super::{Error, MountService, Want};

/// Test only: `TESSERA_FAULT_DAEMON_DELAY_MS=<ms>` in the agent's environment makes
/// it start each daemon (pod mode: create each mount Pod) that long after its own
/// mount, so a test sees a Pod's volume set up before its volume's daemon exists
/// (tests/pods/startup_order.rs). Never set it on a real node.
pub const DAEMON_DELAY: &str = "TESSERA_FAULT_DAEMON_DELAY_MS";

pub(super) fn late_daemon() {
    if let Some(ms) = std::env::var(DAEMON_DELAY)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        warn!(
            env = DAEMON_DELAY,
            ms, "test-only fault point: the daemon is started late"
        );
        std::thread::sleep(Duration::from_millis(ms));
    }
}

impl MountService {
    /// Mount `want` from the agent (`/dev/fuse`, `mount(2)`) and give the connection
    /// to the fd holder, for the daemon to claim (`--mounted`): `Ok(false)` when the
    /// daemon is to mount (agent mounts off, no holder answering, a holder of an
    /// earlier release). Its previous handoff state goes first: nobody must resume
    /// a fresh connection from it.
    pub(super) fn agent_mount(&self, want: &Want) -> Result<bool, Error> {
        let Some(h) = self.holder.as_ref().filter(|_| self.config.agent_mounts) else {
            return Ok(false);
        };
        if let Err(e) = h.ensure() {
            warn!(volume = %want.volume, error = %e, "the fd holder does not answer: the daemon mounts");
            return Ok(false);
        }
        let plan = kernel_mount::plan(&want.source, want.read_only, &want.options)?;
        let state = self.state.handoff_file(&want.volume);
        if let Err(e) = std::fs::remove_file(&state)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(Error::Dir {
                action: "removing the handoff state",
                path: state,
                source: e,
            });
        }
        let fd =
            self.mounts
                .mount_fuse(&want.mountpoint, &plan.fsname, plan.flags(), &|fd, mode| {
                    plan.data(fd, mode)
                })?;
        match h.deposit(&want.mountpoint, fd.as_fd()) {
            Ok(true) => {
                info!(volume = %want.volume, mountpoint = %want.mountpoint.display(), "mounted; the connection waits at the fd holder for its daemon");
                Ok(true)
            }
            r => {
                warn!(volume = %want.volume, answer = ?r.map_err(|e| e.to_string()), "the fd holder did not take the mount: the daemon mounts");
                drop(fd);
                self.mounts.unmount_all_lazy(&want.mountpoint, 16)?;
                Ok(false)
            }
        }
    }

    /// Give up a mount the agent made that no daemon serves: the holder lets the
    /// connection go (requests waiting on it fail with ENOTCONN) and it is detached.
    pub(super) fn abandon(&self, mountpoint: &Path) {
        if let Some(h) = &self.holder {
            h.remove(mountpoint);
        }
        if let Err(e) = self.mounts.unmount_all_lazy(mountpoint, 16) {
            warn!(mountpoint = %mountpoint.display(), error = %e, "the abandoned mount was not detached");
        }
    }
}
