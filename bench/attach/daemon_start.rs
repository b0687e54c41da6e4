//! The FUSE daemon's start alone, timed in the single-attach rounds next to the API
//! chain floor (bench/attach/chain.rs): what an attach needs on the node on top of
//! the API chain, so that no-op driver + chain + start is the whole floor.
//!
//! ```text
//!  t0 ─▶ supervisor::HostDaemons::start (fork+exec `tessera mount`, --ready-fd=3)
//!        loop, as the agent's await_answer: exited? probe (stat + statfs) answers?
//!             else wait for the readiness byte (at most 200 ms)
//!  ─▶ the mount answers: the round's time ends here
//!  (untimed) SIGTERM: the daemon unmounts and exits; lazy unmount if it did not
//! ```
//!
//! The daemon is started the way the agent starts it (the same `HostDaemons`, the same
//! arguments and readiness pipe) on an empty volume directory under the benchmark's
//! backend root, with its capacity file written beforehand (the agent writes it
//! before the spawn, outside this hop). What it leaves out: the agent's directories
//! and files, and the fd holder (`--holder`) that the agent of a DaemonSet runs, so
//! this is a floor too.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tessera_host::mounts::{Probe, probe_blocking};
use tessera_node::daemon_spec::DaemonSpec;
use tessera_node::supervisor::{Daemons, HostDaemons, Liveness};

/// The FUSE daemon start, one round at a time.
pub struct DaemonStart {
    daemons: HostDaemons,
    spec: DaemonSpec,
    log: PathBuf,
}

impl DaemonStart {
    /// Directories under `dir` (mount point, state) and a volume directory under the
    /// backend `root`; daemons log to `logs`/daemon-start.log.
    pub fn new(dir: &Path, root: &Path, logs: &Path) -> DaemonStart {
        let source = root.join("daemon-start");
        let mountpoint = dir.join("daemon-start-mnt");
        let state = dir.join("daemon-start-state");
        for d in [&source, &mountpoint, &state] {
            std::fs::create_dir_all(d).unwrap();
        }
        let capacity_bytes = 1 << 30;
        let capacity_file = state.join("capacity");
        std::fs::write(&capacity_file, capacity_bytes.to_string()).unwrap();
        let spec = DaemonSpec {
            volume: "daemon-start".into(),
            mountpod: "daemon-start".into(),
            mountpod_uid: String::new(),
            source,
            mountpoint,
            capacity_bytes,
            capacity_file,
            counters_file: state.join("counters"),
            read_only: false,
            shared_backend: false,
            options: vec![],
            resources: None,
            settings_file: None,
            fence_file: None,
            handoff: None,
            mounted: false,
        };
        DaemonStart {
            daemons: HostDaemons::new(env!("CARGO_BIN_EXE_tessera").into()),
            spec,
            log: logs.join("daemon-start.log"),
        }
    }

    /// One start: spawn to the mount answering (`None` if it exited or did not answer
    /// within `timeout`); then, untimed, stopped and unmounted.
    pub fn round(&self, timeout: Duration) -> Option<Duration> {
        let mountpoint = &self.spec.mountpoint;
        let t0 = Instant::now();
        let daemon = match self.daemons.start(&self.spec, &self.log) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("  warning: starting tessera mount: {e}");
                return None;
            }
        };
        let answered = loop {
            if let Liveness::Exited(why) = self.daemons.liveness(daemon, mountpoint) {
                eprintln!("  warning: {why} (see {})", self.log.display());
                break None;
            }
            if let Probe::Answers { .. } = probe_blocking(mountpoint) {
                break Some(t0.elapsed());
            }
            let left = timeout.saturating_sub(t0.elapsed());
            if left.is_zero() {
                eprintln!("  warning: tessera mount did not answer within {timeout:?}");
                break None;
            }
            self.daemons
                .await_mounted(daemon, left.min(Duration::from_millis(200)));
        };
        if let Err(e) = self
            .daemons
            .stop(daemon, mountpoint, Duration::from_secs(5))
        {
            eprintln!("  warning: stopping tessera mount: {e}");
        }
        unmount(mountpoint);
        answered
    }
}

/// Lazily unmount whatever is still mounted on `path`.
fn unmount(path: &Path) {
    while !matches!(probe_blocking(path), Probe::NotMounted | Probe::Missing) {
        if nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).is_err() {
            return;
        }
    }
}

impl Drop for DaemonStart {
    fn drop(&mut self) {
        unmount(&self.spec.mountpoint);
    }
}
