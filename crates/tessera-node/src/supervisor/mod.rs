//! The FUSE daemons of this node: starting, watching, signalling and stopping
//! `tessera mount` processes, and the state directory that lets a restarted agent
//! find them again.
//!
//! ```text
//!  start ──▶ /proc/self/exe mount --source S --mountpoint M --capacity-file F …
//!            own session (setsid), stdin /dev/null, stdout+stderr ▶ <state>/logs/<volume>.log
//!        ──▶ <state>/mounts/<volume>.json   Record { pid, process start time, spec, … }
//!
//!  agent restarts ──▶ Record read back ──▶ same pid + same start time + cmdline
//!                     `tessera mount … --mountpoint M` ──▶ adopted as it is
//! ```
//!
//! Daemons run in their own session, so they survive the agent (a restart, a crash,
//! an upgrade) and keep serving I/O. A daemon the agent started is its child until
//! the agent exits; [`HostDaemons::reap`] waits for exited children so none stay
//! zombies, and remembers how each ended ("signal 9"). A daemon adopted from a
//! previous agent is not a child; it is watched through `/proc/<pid>/stat`, where the
//! start time (in clock ticks since boot) tells the process apart from a later one
//! that reuses its pid.
//!
//! A daemon the agent starts gets the write end of a pipe (`--ready-fd 3`) and writes
//! to it once its mount is in place; [`Daemons::await_mounted`] waits on the read end,
//! so the agent probes the new mount as soon as it is there instead of polling. The
//! pipe also ends (EOF) when the daemon exits before mounting.
//!
//! The state directory (records, quota and settings files, logs) is [`state`]'s.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use tessera_fuse::contract::args::is_mount_command;
use tessera_fuse::contract::{control, ready};

use super::daemon_spec::DaemonSpec;

mod state;

pub use state::{Record, StateDir};

/// Errors of the supervisor and the state directory.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of the state directory could not be read or written.
    #[error("{action} {path}")]
    State {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The daemon could not be started.
    #[error("starting tessera mount for {volume}")]
    Spawn {
        /// The volume.
        volume: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A signal could not be sent.
    #[error("sending {signal} to fuse daemon {pid}: {errno}")]
    Signal {
        /// The daemon.
        pid: i32,
        /// The signal.
        signal: Signal,
        /// Why not.
        errno: nix::errno::Errno,
    },
    /// A mount Pod (pod mode) could not be created, started or deleted.
    #[error("mount Pod {name}: {message}")]
    MountPod {
        /// The Pod.
        name: String,
        /// What went wrong, in words (the container's last error when known).
        message: String,
    },
    /// The daemon did not exit after SIGKILL.
    #[error("fuse daemon {pid} did not exit after SIGKILL")]
    Unkillable {
        /// The daemon.
        pid: i32,
    },
}

/// A running daemon: its pid and the start time that tells it apart from a later
/// process with the same pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Daemon {
    /// Process id.
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`: start time in clock ticks after boot.
    pub start_ticks: u64,
}

/// Whether a daemon still runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// It runs, and it is the process that was started for this mount point.
    Running,
    /// It is gone; how it ended, in words ("fuse daemon exited: signal 9").
    Exited(String),
}

/// The processes side of the agent, so the reconcile logic can be tested without
/// starting real daemons.
pub trait Daemons: Send + Sync {
    /// Start a daemon for `spec`, appending its output to `log`.
    fn start(&self, spec: &DaemonSpec, log: &Path) -> Result<Daemon, Error>;
    /// A successor for `spec` after its daemon `dead` died while the fd holder keeps
    /// the mount's connection: it takes that connection over. A new daemon, unless the
    /// daemons restart on their own (a mount Pod's container, restarted by the
    /// kubelet): then the restarted one.
    fn successor(&self, spec: &DaemonSpec, log: &Path, dead: Daemon) -> Result<Daemon, Error> {
        let _ = dead;
        self.start(spec, log)
    }
    /// Whether `daemon` still runs and still is a `tessera mount` of `mountpoint`.
    fn liveness(&self, daemon: Daemon, mountpoint: &Path) -> Liveness;
    /// Send `signal` to `daemon` if it still is that process.
    fn signal(&self, daemon: Daemon, mountpoint: &Path, signal: Signal) -> Result<(), Error>;
    /// SIGTERM, wait up to `grace`, then SIGKILL and wait again. `Ok` once it is gone.
    fn stop(&self, daemon: Daemon, mountpoint: &Path, grace: Duration) -> Result<(), Error> {
        if self.liveness(daemon, mountpoint) != Liveness::Running {
            return Ok(());
        }
        let _ = self.signal(daemon, mountpoint, Signal::SIGTERM);
        if wait_gone(self, daemon, mountpoint, grace) {
            return Ok(());
        }
        let _ = self.signal(daemon, mountpoint, Signal::SIGKILL);
        if wait_gone(self, daemon, mountpoint, Duration::from_secs(5)) {
            return Ok(());
        }
        Err(Error::Unkillable { pid: daemon.pid })
    }
    /// Wait for exited children (no zombies).
    fn reap(&self);
    /// Wait, at most `timeout`, for a sign that `daemon` has mounted (or exited): here
    /// a short pause, for daemons that give no such sign (the caller probes after it).
    fn await_mounted(&self, daemon: Daemon, timeout: Duration) {
        let _ = daemon;
        std::thread::sleep(timeout.min(POLL_PAUSE));
    }
    /// The image daemons started now run (`None`: not an image, process mode).
    fn image(&self) -> Option<String> {
        None
    }
    /// The image the running daemon of `mountpoint` was started from, asked of the
    /// runtime (records written before they kept it).
    fn serving_image(&self, mountpoint: &Path) -> Option<String> {
        let _ = mountpoint;
        None
    }
    /// A planned replacement of `old` (an upgrade): a daemon for `spec` takes the held
    /// connection over. Here `old` leaves, then a successor starts; mount Pods start
    /// the successor first, as a standby, so that only the takeover is in the pause.
    fn replace(
        &self,
        old: Daemon,
        spec: &DaemonSpec,
        log: &Path,
        grace: Duration,
    ) -> Result<Daemon, Error> {
        self.leave(old, &spec.mountpoint, grace)?;
        self.start(spec, log)
    }
    /// Make `daemon` exit without unmounting (the fd holder keeps the connection for
    /// a successor) and not come back: SIGUSR1, SIGKILL after `grace` (the holder
    /// keeps the mount all the same). `Ok` once it is gone.
    fn leave(&self, daemon: Daemon, mountpoint: &Path, grace: Duration) -> Result<(), Error> {
        if self.liveness(daemon, mountpoint) != Liveness::Running {
            return Ok(());
        }
        self.signal(daemon, mountpoint, control::LEAVE)?;
        if wait_gone(self, daemon, mountpoint, grace) {
            return Ok(());
        }
        let _ = self.signal(daemon, mountpoint, Signal::SIGKILL);
        if wait_gone(self, daemon, mountpoint, Duration::from_secs(5)) {
            return Ok(());
        }
        Err(Error::Unkillable { pid: daemon.pid })
    }
}

fn wait_gone<D: Daemons + ?Sized>(
    d: &D,
    daemon: Daemon,
    mountpoint: &Path,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if d.liveness(daemon, mountpoint) != Liveness::Running {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long the agent pauses between probes of a mount that gives no sign of its
/// own: a new mount usually answers within tens of milliseconds, and its ticket (and
/// so the pod's attach) waits for this.
pub const POLL_PAUSE: Duration = Duration::from_millis(5);

/// The descriptor number of the readiness pipe in a daemon the agent starts.
const READY_FD: i32 = 3;

/// Real daemons: `tessera mount` children of this process.
pub struct HostDaemons {
    program: PathBuf,
    children: Mutex<HashMap<i32, Child>>,
    exits: Mutex<HashMap<i32, ExitStatus>>,
    /// The read end of each new daemon's readiness pipe, until it has said it mounted.
    ready: Mutex<HashMap<i32, OwnedFd>>,
}

impl HostDaemons {
    /// Daemons run `program` (normally the agent's own binary, `/proc/self/exe`, so
    /// a daemon is always the same build as the agent that started it).
    pub fn new(program: PathBuf) -> Self {
        HostDaemons {
            program,
            children: Mutex::default(),
            exits: Mutex::default(),
            ready: Mutex::default(),
        }
    }

    fn exit_of(&self, pid: i32) -> Option<ExitStatus> {
        self.reap();
        self.exits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pid)
            .copied()
    }
}

impl Daemons for HostDaemons {
    fn start(&self, spec: &DaemonSpec, log: &Path) -> Result<Daemon, Error> {
        let spawn_err = |source| Error::Spawn {
            volume: spec.volume.clone(),
            source,
        };
        let mut out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(spawn_err)?;
        let _ = writeln!(
            out,
            "=== {} starting tessera mount on {}",
            jiff::Timestamp::now(),
            spec.mountpoint.display()
        );
        let err = out.try_clone().map_err(spawn_err)?;
        let mut cmd = Command::new(&self.program);
        if let Ok(exe) = std::env::current_exe() {
            cmd.arg0(exe);
        }
        // Both ends close on exec; the child's copy of the write end is made READY_FD
        // (not close-on-exec) just before it, so only this daemon inherits it.
        let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| spawn_err(std::io::Error::from(e)))?;
        let ready_raw = ready_w.as_raw_fd();
        let mut args = spec.daemon_args();
        args.ready_fd = Some(READY_FD);
        cmd.args(args.to_args());
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG");
        // SAFETY: setsid, dup2 and fcntl are async-signal-safe and touch no memory of
        // the parent.
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if ready_raw == READY_FD {
                    // dup2 onto itself keeps close-on-exec: clear it instead.
                    if libc::fcntl(READY_FD, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc::dup2(ready_raw, READY_FD) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        // The daemon holds the only write end now: its exit ends the pipe.
        drop(ready_w);
        let pid = child.id() as i32;
        let start_ticks = proc_start_ticks(pid).unwrap_or(0);
        self.exits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pid);
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, child);
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, ready_r);
        Ok(Daemon { pid, start_ticks })
    }

    fn await_mounted(&self, daemon: Daemon, timeout: Duration) {
        let fd = self
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&daemon.pid);
        let Some(fd) = fd else {
            // Adopted, or it said so already: probe at the usual pace.
            std::thread::sleep(timeout.min(POLL_PAUSE));
            return;
        };
        // Mounted (a byte) or exited (EOF): the pipe has said all it will. Not yet
        // (or interrupted): keep it for the next wait.
        if !ready::wait(fd.as_fd(), timeout) {
            self.ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(daemon.pid, fd);
        }
    }

    fn liveness(&self, daemon: Daemon, mountpoint: &Path) -> Liveness {
        // `/proc` first, the reap after: a child that `/proc` shows gone or a zombie
        // has an exit status to collect by then. (Reaping first left a window in
        // which a child dying between the two was told apart by `/proc` alone,
        // without its signal.)
        match proc_liveness(daemon, mountpoint) {
            Liveness::Running => Liveness::Running,
            Liveness::Exited(why) => {
                Liveness::Exited(self.exit_of(daemon.pid).map_or(why, describe_exit))
            }
        }
    }

    fn signal(&self, daemon: Daemon, mountpoint: &Path, signal: Signal) -> Result<(), Error> {
        if self.liveness(daemon, mountpoint) != Liveness::Running {
            return Ok(());
        }
        kill(Pid::from_raw(daemon.pid), signal).map_err(|errno| Error::Signal {
            pid: daemon.pid,
            signal,
            errno,
        })
    }

    fn reap(&self) {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = Vec::new();
        for (pid, child) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                done.push((*pid, status));
            }
        }
        let mut exits = self.exits.lock().unwrap_or_else(|e| e.into_inner());
        let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        for (pid, status) in done {
            children.remove(&pid);
            ready.remove(&pid);
            exits.insert(pid, status);
        }
    }
}

/// Whether `daemon` runs, from `/proc` alone (a daemon that is not this process's
/// child: adopted, or in a mount Pod).
pub fn proc_liveness(daemon: Daemon, mountpoint: &Path) -> Liveness {
    match proc_stat(daemon.pid) {
        None => Liveness::Exited("fuse daemon exited".into()),
        Some((state, _)) if state == 'Z' || state == 'X' => {
            Liveness::Exited("fuse daemon exited".into())
        }
        Some((_, ticks)) if ticks != daemon.start_ticks => {
            Liveness::Exited("fuse daemon exited (its pid now belongs to another process)".into())
        }
        Some(_) if !is_mount_daemon(daemon.pid, mountpoint) => {
            Liveness::Exited("fuse daemon exited (its pid now runs another program)".into())
        }
        Some(_) => Liveness::Running,
    }
}

/// "fuse daemon exited: signal 9" / "fuse daemon exited: status 1".
pub fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("fuse daemon exited: status {code}"),
        (None, Some(sig)) => format!("fuse daemon exited: signal {sig}"),
        _ => "fuse daemon exited".into(),
    }
}

/// State (field 3) and start time (field 22) of `/proc/<pid>/stat`.
pub fn proc_stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<(char, u64)> {
    // The command name (field 2) is in parentheses and may itself contain ") ".
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3; field 22 is 19 further on.
    let ticks = fields.nth(18)?.parse().ok()?;
    Some((state, ticks))
}

/// Start time of a process, in clock ticks after boot.
pub fn proc_start_ticks(pid: i32) -> Option<u64> {
    proc_stat(pid).map(|(_, t)| t)
}

/// Whether `pid` runs `tessera mount … --mountpoint <mountpoint>`.
pub fn is_mount_daemon(pid: i32, mountpoint: &Path) -> bool {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    is_mount_command(&raw, mountpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let line = "1234 (tessera (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 4 0 987654 1000 10 18446744073709551615";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        let me = proc_stat(std::process::id() as i32).unwrap();
        assert!(me.1 > 0);
    }

    /// A stand-in daemon (`sleep`), to check the process bookkeeping without FUSE.
    #[test]
    fn start_watch_reap_and_stop() {
        let dir = tempfile::tempdir().unwrap();
        let daemons = HostDaemons::new("/bin/sleep".into());
        let spec = DaemonSpec {
            volume: "v".into(),
            mountpod: "v-1".into(),
            mountpod_uid: String::new(),
            source: dir.path().join("src"),
            mountpoint: dir.path().join("mnt"),
            capacity_bytes: 1,
            capacity_file: dir.path().join("cap"),
            counters_file: dir.path().join("counters"),
            read_only: false,
            shared_backend: false,
            options: vec![],
            resources: None,
            settings_file: None,
            fence_file: None,
            handoff: None,
            mounted: false,
        };
        // /bin/sleep exits at once on these arguments: the exit is reaped and described.
        let d = daemons.start(&spec, &dir.path().join("log")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            // Until sleep has really exited, a loaded machine may still show it running
            // (as "another program": it is not a mount daemon); only its reaped exit
            // ends the wait.
            if let Liveness::Exited(why) = daemons.liveness(d, &spec.mountpoint)
                && why.starts_with("fuse daemon exited: ")
            {
                assert_eq!(why, "fuse daemon exited: status 1");
                break;
            }
            assert!(Instant::now() < deadline, "sleep did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(proc_stat(d.pid), None, "reaped, not a zombie");
        // The process ran in a session of its own and its output went to the log.
        let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
        assert!(log.contains("starting tessera mount"), "{log}");
    }

    /// A stand-in daemon: a shell script run with the daemon's arguments.
    fn script_daemons(dir: &Path, body: &str) -> HostDaemons {
        use std::os::unix::fs::PermissionsExt;
        let program = dir.join("daemon.sh");
        std::fs::write(&program, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        HostDaemons::new(program)
    }

    fn spec_in(dir: &Path) -> DaemonSpec {
        DaemonSpec {
            source: dir.join("src"),
            mountpoint: dir.join("mnt"),
            capacity_file: dir.join("cap"),
            counters_file: dir.join("counters"),
            ..crate::daemon_spec::tests::spec()
        }
    }

    /// The daemon's byte on its readiness pipe ends the agent's wait, while it runs.
    #[test]
    fn the_readiness_pipe_ends_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let daemons = script_daemons(dir.path(), "printf m >&3\nexec sleep 60");
        let d = daemons
            .start(&spec_in(dir.path()), &dir.path().join("log"))
            .unwrap();
        let t = Instant::now();
        daemons.await_mounted(d, Duration::from_secs(30));
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "waited {:?}",
            t.elapsed()
        );
        assert!(
            proc_stat(d.pid).is_some(),
            "the byte, not the exit, ended the wait"
        );
        // Said once: later waits are the usual short pause.
        let t = Instant::now();
        daemons.await_mounted(d, Duration::from_secs(30));
        assert!(t.elapsed() < Duration::from_secs(20));
        kill(Pid::from_raw(d.pid), Signal::SIGKILL).unwrap();
    }

    /// A daemon that has not said anything keeps the agent waiting (up to the
    /// timeout) until it exits, which ends the wait too.
    #[test]
    fn a_silent_daemon_is_waited_for_until_it_exits() {
        let dir = tempfile::tempdir().unwrap();
        let daemons = script_daemons(dir.path(), "exec sleep 60");
        let d = daemons
            .start(&spec_in(dir.path()), &dir.path().join("log"))
            .unwrap();
        let t = Instant::now();
        daemons.await_mounted(d, Duration::from_millis(300));
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        kill(Pid::from_raw(d.pid), Signal::SIGKILL).unwrap();
        let t = Instant::now();
        daemons.await_mounted(d, Duration::from_secs(30));
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "waited {:?}",
            t.elapsed()
        );
        daemons.reap();
    }

    /// A child killed while the agent looks at it is described by its exit status,
    /// never by the bare "exited" that `/proc` alone can tell (a zombie read
    /// between the reap and the `/proc` check once lost the status).
    #[test]
    fn a_killed_child_is_described_by_its_signal() {
        let dir = tempfile::tempdir().unwrap();
        let daemons = script_daemons(dir.path(), "exec sleep 60");
        let spec = spec_in(dir.path());
        for _ in 0..200 {
            let d = daemons.start(&spec, &dir.path().join("log")).unwrap();
            kill(Pid::from_raw(d.pid), Signal::SIGKILL).unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            let why = loop {
                // While it still runs it is "another program" (sleep is no mount daemon).
                match daemons.liveness(d, &spec.mountpoint) {
                    Liveness::Exited(why) if !why.contains("another program") => break why,
                    _ => assert!(Instant::now() < deadline, "sleep was not killed"),
                }
            };
            assert_eq!(why, "fuse daemon exited: signal 9");
        }
    }

    #[test]
    fn a_process_that_is_not_the_daemon_is_not_running() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let d = Daemon {
            pid,
            start_ticks: proc_start_ticks(pid).unwrap(),
        };
        let daemons = HostDaemons::new("/bin/true".into());
        // A live process whose command line is not `tessera mount`.
        assert!(matches!(
            daemons.liveness(d, Path::new("/m/v")),
            Liveness::Exited(_)
        ));
        // A wrong start time (pid reuse).
        let other = Daemon {
            pid,
            start_ticks: d.start_ticks + 1,
        };
        assert!(matches!(
            daemons.liveness(other, Path::new("/m/v")),
            Liveness::Exited(_)
        ));
        // Signalling a process that is not ours is refused silently.
        daemons
            .signal(d, Path::new("/m/v"), Signal::SIGKILL)
            .unwrap();
        assert_eq!(child.try_wait().unwrap(), None);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
