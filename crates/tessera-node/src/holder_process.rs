//! The agent's fd holder: a `tessera fd-holder` process of its own session (like the
//! FUSE daemons), so the /dev/fuse descriptors it holds outlive the agent; the agent
//! talks to it over its socket (`<state-dir>/holder.sock`) and starts it when nothing
//! answers there. See `docs/handoff.md`.
//!
//! ```text
//!  agent ── ensure: connect? ──no──▶ /proc/self/exe fd-holder --socket S (setsid)
//!        ── holds(M): GET M ──▶ a live descriptor? (dropped at once)
//!        ── remove(M): DROP M ──▶ the holder closes it (ending a connection no daemon serves)
//!        ── deposit(M, fd): MOUNTED M + fd ──▶ a connection the agent mounted, for its daemon
//! ```
//!
//! In pod mode the agent starts no holder (`connect_only`): the `tessera-fd-holder`
//! DaemonSet runs one on the same socket, outside the agent's container.
//!
//! A holder that does not answer is asked again on every health tick ([`HolderProcess::check`];
//! process mode: started again): daemons are told its socket all the same and hand
//! their descriptors over once it answers.

use std::fs::OpenOptions;
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tessera_fuse::contract::args::HolderArgs;
use tessera_fuse::contract::holder_socket;

/// The holder process, as the agent sees it.
#[derive(Debug)]
pub struct HolderProcess {
    program: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    /// The holder this agent started (reaped when it exits).
    child: Mutex<Option<Child>>,
    /// Whether the agent starts the holder when none answers (process mode), or one
    /// runs on its own (pod mode: the `tessera-fd-holder` DaemonSet).
    spawns: bool,
    /// Whether it answered at the last [`Self::check`].
    answering: AtomicBool,
}

impl HolderProcess {
    /// A holder at `socket`, started from `program` (logging to `log`) when none
    /// answers there.
    pub fn new(program: PathBuf, socket: PathBuf, log: PathBuf) -> Self {
        HolderProcess {
            program,
            socket,
            log,
            child: Mutex::default(),
            spawns: true,
            answering: AtomicBool::new(true),
        }
    }

    /// A holder the agent only talks to: it runs on its own (pod mode: a DaemonSet of
    /// its own, so it outlives the agent's container and every mount Pod).
    pub fn connect_only(socket: PathBuf) -> Self {
        HolderProcess {
            program: PathBuf::new(),
            socket,
            log: PathBuf::new(),
            child: Mutex::default(),
            spawns: false,
            answering: AtomicBool::new(true),
        }
    }

    /// The holder's socket.
    pub fn path(&self) -> &Path {
        &self.socket
    }

    /// Start the holder unless one answers (one from a previous agent is used as it
    /// is); wait up to a second for it to answer. A connect-only holder: whether it
    /// answers.
    pub fn ensure(&self) -> std::io::Result<()> {
        if !self.spawns {
            return UnixStream::connect(&self.socket).map(drop);
        }
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = child.as_mut()
            && let Ok(Some(_)) = c.try_wait()
        {
            *child = None;
        }
        if UnixStream::connect(&self.socket).is_ok() {
            return Ok(());
        }
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(&self.program);
        if let Ok(exe) = std::env::current_exe() {
            cmd.arg0(exe);
        }
        let args = HolderArgs {
            socket: self.socket.clone(),
        };
        cmd.args(args.to_args())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG");
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
        *child = Some(cmd.spawn()?);
        let deadline = Instant::now() + Duration::from_secs(1);
        while UnixStream::connect(&self.socket).is_err() {
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the fd holder did not come up",
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!(socket = %self.socket.display(), "fd holder started");
        Ok(())
    }

    /// [`Self::ensure`], saying when the holder stops or starts answering (the agent's
    /// start and health loop).
    pub fn check(&self) {
        let res = self.ensure();
        let was = self.answering.swap(res.is_ok(), Ordering::Relaxed);
        match res {
            Ok(()) if !was => {
                tracing::info!(socket = %self.socket.display(), "the fd holder answers again; daemons hand it their descriptors")
            }
            Err(e) if was => {
                tracing::warn!(socket = %self.socket.display(), error = %e, "the fd holder does not answer: until it does, a crashed daemon is repaired by remounting; asked again on every health tick")
            }
            _ => {}
        }
    }

    /// Whether the holder has a live connection for `mountpoint`.
    pub fn holds(&self, mountpoint: &Path) -> bool {
        matches!(holder_socket::take(&self.socket, mountpoint), Ok(Some(_)))
    }

    /// Give the holder the connection the agent has just mounted at `mountpoint`, for
    /// the daemon to claim. `Ok(false)`: the holder is of an earlier release.
    pub fn deposit(&self, mountpoint: &Path, fd: BorrowedFd<'_>) -> std::io::Result<bool> {
        holder_socket::deposit_mounted(&self.socket, mountpoint, fd)
    }

    /// Make the holder let go of `mountpoint`'s connection.
    pub fn remove(&self, mountpoint: &Path) {
        if let Err(e) = holder_socket::forget(&self.socket, mountpoint)
            && e.kind() != std::io::ErrorKind::NotFound
            && e.kind() != std::io::ErrorKind::ConnectionRefused
        {
            tracing::warn!(mountpoint = %mountpoint.display(), error = %e, "the fd holder was not told to let go");
        }
    }
}
