//! What the agent does on the node for one MountPod, without any Kubernetes client:
//! serve (start, adopt, repair, apply spec changes), tear down, remove data.
//!
//! ```text
//!  MountPodSpec ──want()──▶ Want (paths validated; refused references listed)
//!                             │
//!  serve(Want) ── record? ──no──────────────────────────────▶ start ─┐
//!                   │yes                                             │
//!                 health(record)                                     │
//!                   ├─ Healthy ─▶ capacity changed? ─▶ file + SIGHUP │
//!                   │            readOnly/options changed? ─┬─ no references ─▶ stop ▶ start
//!                   │                                        └─ references ─▶ remount blocked
//!                   ├─ Starting ─▶ wait for it to answer             │
//!                   ├─ Slow (answered before; silent < hang grace) ─▶ as Healthy
//!                   └─ Broken(cause) ─▶ stop, lazy-unmount ─▶ start ─┤ (a repair: cause reported)
//!                                                                    ▼
//!                     answers? ─▶ re-bind every reference (stale bind detached, ro remount)
//! ```
//!
//! Everything here blocks (process waits, probes bounded by a timeout), so the agent
//! runs it on the blocking thread pool. The kernel and the processes are reached only
//! through [`Mounts`] and [`Daemons`], and the only other state is the
//! [`StateDir`], so a restarted agent reaches the same decisions from the same
//! records: a record whose daemon still runs and whose mount answers is adopted as it
//! is.
//!
//! [`want`] validates a MountPod spec into a [`Want`]; [`populate`] fills a volume
//! from its data source; `health` says how a recorded mount is doing
//! ([`MountService::health`], with [`hung`]'s grace for a slow one); `agent_mount` makes the mount itself before any
//! daemon runs (`--mounter=agent`).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use tessera_fuse::contract::control;
use tessera_host::mounts::{self, Mounts, Probe};
use tessera_host::paths;
use tessera_host::roots::{self, RootError};
use tessera_runtime::error_chain;

use super::daemon_spec::DaemonSpec;
use super::holder_process::HolderProcess;
use super::supervisor::{self, Daemon, Daemons, Liveness, Record, StateDir};

mod agent_mount;
mod health;
mod hung;
mod want;

pub use hung::{HungSince, hang_grace};
pub use want::{Config, Target, Want, want};

/// Errors of the node-side work. Each names the action that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The state directory or a daemon.
    #[error(transparent)]
    Supervisor(#[from] supervisor::Error),
    /// A mount syscall.
    #[error(transparent)]
    Mount(#[from] mounts::Error),
    /// A directory could not be created or removed.
    #[error("{action} {path}")]
    Dir {
        /// What was being done.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The backend root of the volume does not exist on this node.
    #[error("the backend root {0} does not exist on this node")]
    NoBackendRoot(PathBuf),
    /// A path from the MountPod is refused.
    #[error(transparent)]
    Path(#[from] paths::PathError),
    /// A source outside the allowed backend roots.
    #[error(transparent)]
    Root(#[from] RootError),
    /// The backend root, declared Shared, is not the anchor node's filesystem here.
    #[error(transparent)]
    NotShared(#[from] tessera_host::shared::NotShared),
    /// Creating or removing data beneath an allowed root failed (a symlink on the way,
    /// a path leaving the root, …).
    #[error("{action} {path} beneath its backend root: {errno}")]
    Beneath {
        /// What was being done.
        action: &'static str,
        /// The data directory.
        path: PathBuf,
        /// Why not.
        errno: nix::errno::Errno,
    },
    /// Copying the data source failed.
    #[error(transparent)]
    Copy(#[from] tessera_host::copy::CopyError),
    /// The MountPod asks for a self-fencing daemon and this agent renews no liveness
    /// Lease (its daemon would never be told the node is alive).
    #[error(
        "the MountPod asks for self-fencing (spec.selfFence) and this agent renews no liveness Lease"
    )]
    NoLivenessLease,
    /// `mountOptions` the FUSE mount cannot take.
    #[error(transparent)]
    MountOption(#[from] tessera_fuse::contract::kernel_mount::BadOption),
    /// The data is still served by a mount on this node.
    #[error("{source_dir} is still served by the mount at {mountpoint}")]
    StillMounted {
        /// The data directory.
        source_dir: PathBuf,
        /// The mount serving it.
        mountpoint: PathBuf,
    },
}

/// How a daemon is started: anew, as the successor of a dead one, or replacing a
/// running one (an upgrade).
#[derive(Debug, Clone, Copy)]
enum Launch {
    Start,
    Successor(Daemon),
    Replace(Daemon),
}

/// How a recorded mount is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// The daemon runs and the mount answers.
    Healthy,
    /// The daemon runs and was started recently; its mount does not answer yet.
    Starting,
    /// The daemon runs and its mount answered before, but has not answered for less
    /// than [`hang_grace`]: a loaded node or a slow backend. Left alone (a repair
    /// would unmount the connection its Pods hold); why, in words.
    Slow(String),
    /// The mount must be repaired; why, in words.
    Broken(String),
}

/// Reported while [`MountService::serve`] works, so the agent can publish phase Mounting
/// before the mount answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// A daemon is being started; `cause` is set when it replaces a broken one.
    Starting {
        /// Why the previous daemon was replaced.
        cause: Option<String>,
    },
    /// The agent has mounted: the kernel mount exists and can be bound into Pods,
    /// whose requests wait for the daemon being started.
    Mounted,
}

/// What [`MountService::serve`] achieved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    /// The daemon serving the mount (if one runs).
    pub daemon: Option<Daemon>,
    /// The mount answers.
    pub answers: bool,
    /// A broken daemon was replaced; why it broke.
    pub repaired: Option<String>,
    /// The mount could not be served; why (the daemon exited while starting, …).
    pub failure: Option<String>,
    /// readOnly or mountOptions changed while references remain: the running mount
    /// still has the old settings.
    pub remount_blocked: bool,
    /// References re-bound onto a new mount.
    pub rebound: usize,
    /// References that could not be re-bound, in words.
    pub rebind_errors: Vec<String>,
    /// How long a repair took, from the decision to restart to the mount answering
    /// with every reference re-bound.
    pub repair_time: Option<Duration>,
    /// The repair was a takeover: a successor serves the held connection, the mount
    /// never went away, nothing was re-bound.
    pub taken_over: bool,
    /// The daemon was started with `--shared-backend`.
    pub shared_backend: bool,
    /// The agent made the mount (`--mounted`): it exists, and can be bound, even
    /// while its daemon does not answer yet.
    pub agent_mounted: bool,
    /// The image the daemon runs (pod mode).
    pub image: Option<String>,
    /// Whether other nodes see the locks taken through the mount: `None` on a
    /// node-local backend (one mount serves the node), else whether the backend took
    /// an OFD lock and a flock on a probe file (`Err`: why not).
    pub locks: Option<Result<(), String>>,
}

/// Whether the backend of `want` holds locks for other nodes to see, as the daemon
/// decides it (`tessera mount` probes the same way): `None` on a node-local filesystem
/// unless the daemon was started with `--shared-backend` (`shared`).
fn backend_locks(want: &Want, shared: bool) -> Option<Result<(), String>> {
    let dir = match roots::create_beneath(&want.beneath) {
        Ok(dir) => dir,
        Err(errno) => return Some(Err(format!("opening the volume directory: {errno}"))),
    };
    let fs_type = nix::sys::statfs::fstatfs(&dir).ok()?.filesystem_type().0 as i64;
    if tessera_fuse::adapter::is_local_fs(fs_type) && !shared {
        return None;
    }
    Some(tessera_fuse::fs::probe_locks(dir.as_fd(), !want.read_only).map_err(|e| e.to_string()))
}

/// The node: its mounts, its daemons, its state directory.
pub struct MountService {
    /// Settings.
    pub config: Config,
    /// Mount syscalls.
    pub mounts: Arc<dyn Mounts>,
    /// The daemons.
    pub daemons: Arc<dyn Daemons>,
    /// Records, capacity files, logs.
    pub state: StateDir,
    /// The fd holder daemons hand their /dev/fuse descriptors to (`None`: no
    /// handoff; a dead daemon is repaired by remounting). Every daemon is told its
    /// socket, answering or not.
    pub holder: Option<Arc<HolderProcess>>,
    /// The Shared roots verified on this node (per anchor).
    pub shared: tessera_host::shared::Verified,
    /// Since when mounts that answered before have been silent.
    pub hung: HungSince,
}

impl MountService {
    /// Make the node serve `want`: adopt, start, repair or change the mount.
    pub fn serve(&self, want: &Want, progress: &dyn Fn(Progress)) -> Result<Served, Error> {
        let mut served = self.serve_mount(want, progress)?;
        if served.answers {
            served.locks = backend_locks(want, served.shared_backend);
        }
        Ok(served)
    }

    fn serve_mount(&self, want: &Want, progress: &dyn Fn(Progress)) -> Result<Served, Error> {
        let mut cause = None;
        if let Some(mut record) = self.state.load(&want.volume)? {
            let same_place = record.mountpoint == want.mountpoint && record.source == want.source;
            match self.health(&record) {
                Health::Healthy | Health::Slow(_) if same_place => {
                    if let Some(served) = self.apply_changes(&mut record, want)? {
                        return Ok(served);
                    }
                    info!(volume = %want.volume, "remounting for new readOnly/mountOptions");
                }
                Health::Starting if same_place => {
                    return self.await_answer(&record, want, None, Instant::now(), false);
                }
                Health::Broken(why) if same_place && self.can_take_over(&record) => {
                    warn!(volume = %want.volume, cause = %why, "fuse daemon gone, its connection held: starting a successor");
                    let begun = Instant::now();
                    progress(Progress::Starting {
                        cause: Some(why.clone()),
                    });
                    match self.start_successor(want, &record) {
                        Ok(record) => {
                            return self.await_answer(&record, want, Some(why), begun, true);
                        }
                        Err(e) => {
                            warn!(volume = %want.volume, error = %error_chain(&e), "no successor took the connection over; repairing");
                            cause = Some(why);
                        }
                    }
                }
                Health::Broken(why) if same_place => {
                    warn!(volume = %want.volume, cause = %why, "mount broken; repairing");
                    cause = Some(why);
                }
                _ => {
                    info!(volume = %want.volume, "replacing a mount of another source or mount point")
                }
            }
            // A broken daemon gets little time to exit cleanly: every second counts.
            let grace = if cause.is_some() {
                self.config.stop_grace.min(Duration::from_millis(500))
            } else {
                self.config.stop_grace
            };
            self.daemons
                .stop(record.daemon, &record.mountpoint, grace)?;
            self.mounts.unmount_all_lazy(&record.mountpoint, 16)?;
        }
        let begun = Instant::now();
        progress(Progress::Starting {
            cause: cause.clone(),
        });
        let record = self.start(want, progress)?;
        self.await_answer(&record, want, cause, begun, false)
    }

    /// Whether `record`'s daemon is gone and the holder has its live connection, so
    /// a successor can take the mount over as it is.
    fn can_take_over(&self, record: &Record) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|h| h.ensure().is_ok() && h.holds(&record.mountpoint))
            && matches!(
                self.daemons.liveness(record.daemon, &record.mountpoint),
                Liveness::Exited(_)
            )
    }

    /// Replace the daemon of `want` on purpose (an upgrade): it exits without
    /// unmounting (`Daemons::leave`: SIGUSR1; in pod mode SIGUSR2 then the Pod's
    /// deletion, whose SIGTERM then leaves the mount), and a successor (in pod mode a
    /// new mount Pod, of the desired image) takes its held connection over.
    /// Applications see a pause, never an error. Refused (`Ok(None)`) when no
    /// connection is held for the mount or no daemon serves it: never a remount.
    pub fn replace_daemon(&self, want: &Want) -> Result<Option<Served>, Error> {
        let Some(record) = self.state.load(&want.volume)? else {
            return Ok(None);
        };
        let same_place = record.mountpoint == want.mountpoint && record.source == want.source;
        if !same_place
            || !self.holds(&record.mountpoint)
            || self.daemons.liveness(record.daemon, &record.mountpoint) != Liveness::Running
        {
            return Ok(None);
        }
        let begun = Instant::now();
        let record = self.spawn_as(want, Launch::Replace(record.daemon), record.agent_mounted)?;
        let why = "planned replacement".to_string();
        self.await_answer(&record, want, Some(why), begun, true)
            .map(Some)
    }

    /// Whether the fd holder holds the connection of `mountpoint`.
    pub fn holds(&self, mountpoint: &Path) -> bool {
        self.holder.as_ref().is_some_and(|h| h.holds(mountpoint))
    }

    /// The image serving `record` (asked of the daemons, and recorded, when the
    /// record predates the field).
    pub fn image_of(&self, record: &Record) -> Option<String> {
        if record.image.is_some() {
            return record.image.clone();
        }
        let image = self.daemons.serving_image(&record.mountpoint)?;
        let mut r = record.clone();
        r.image = Some(image.clone());
        if let Err(e) = self.state.save(&r) {
            warn!(volume = %r.volume, error = %error_chain(&e), "recording the image of a mount");
        }
        Some(image)
    }

    /// Start a daemon that takes over the held connection of `want`'s mount point:
    /// nothing is unmounted, the mount point stays as it is. `dead`: the daemon that
    /// died (the daemons may restart it on their own, as the kubelet does in pod mode).
    fn start_successor(&self, want: &Want, dead: &Record) -> Result<Record, Error> {
        self.spawn_as(want, Launch::Successor(dead.daemon), dead.agent_mounted)
    }

    /// Capacity and mount-setting changes on a healthy mount. `None`: the mount must
    /// be restarted with the new settings.
    fn apply_changes(&self, record: &mut Record, want: &Want) -> Result<Option<Served>, Error> {
        if !record.answered {
            record.answered = true;
            self.state.save(record)?;
        }
        if record.capacity_bytes != want.capacity_bytes {
            self.state
                .write_capacity(&want.volume, want.capacity_bytes)?;
            self.daemons
                .signal(record.daemon, &record.mountpoint, control::RELOAD)?;
            info!(volume = %want.volume, from = record.capacity_bytes, to = want.capacity_bytes, "capacity changed online");
            record.capacity_bytes = want.capacity_bytes;
            self.state.save(record)?;
        }
        if record.attr_cache_seconds != want.attr_cache_seconds {
            self.state
                .write_settings(&want.volume, want.attr_cache_seconds)?;
            self.daemons
                .signal(record.daemon, &record.mountpoint, control::RELOAD)?;
            info!(volume = %want.volume, from = ?record.attr_cache_seconds, to = ?want.attr_cache_seconds, "attribute cache lifetime changed online");
            record.attr_cache_seconds = want.attr_cache_seconds;
            self.state.save(record)?;
        }
        // Not `shared_backend`: a running daemon (one adopted from before the field
        // existed, say) keeps serving, and the setting applies at its next start.
        let settings_changed =
            record.read_only != want.read_only || record.mount_options != want.options;
        if settings_changed && want.references.is_empty() {
            return Ok(None);
        }
        let mut served = Served {
            daemon: Some(record.daemon),
            answers: true,
            shared_backend: record.shared_backend,
            agent_mounted: record.agent_mounted,
            image: record.image.clone(),
            remount_blocked: settings_changed,
            ..Served::default()
        };
        self.rebind_stale(want, &mut served)?;
        Ok(Some(served))
    }

    /// Re-bind references still bound to an earlier instance of the mount (an agent
    /// that died between restarting a daemon and re-binding). A target with nothing
    /// mounted is left alone: binding it is NodePublish's job, which may be under way.
    fn rebind_stale(&self, want: &Want, served: &mut Served) -> Result<(), Error> {
        if want.references.is_empty() {
            return Ok(());
        }
        let table = self.mounts.table()?;
        let top = |p: &Path| table.iter().rev().find(|m| m.mount_point == p);
        let Some(current) = top(&want.mountpoint) else {
            return Ok(());
        };
        for target in &want.references {
            let stale = top(&target.path).is_some_and(|m| {
                m.dev != current.dev && m.fs_type == current.fs_type && m.source == current.source
            });
            if stale {
                match self.rebind(&want.mountpoint, target) {
                    Ok(()) => served.rebound += 1,
                    Err(e) => served.rebind_errors.push(format!(
                        "re-binding {}: {}",
                        target.path.display(),
                        error_chain(&e)
                    )),
                }
            }
        }
        Ok(())
    }

    /// Start a daemon for `want` on a clean mount point and record it: the agent
    /// mounts first where it can ([`Self::agent_mount`]; `Progress::Mounted`).
    fn start(&self, want: &Want, progress: &dyn Fn(Progress)) -> Result<Record, Error> {
        // A mount left behind without a record (an agent killed mid-start).
        self.mounts.unmount_all_lazy(&want.mountpoint, 16)?;
        // Nothing held for a mount point that is gone (the daemon had died).
        if let Some(h) = &self.holder {
            h.remove(&want.mountpoint);
        }
        // A Shared root first: on a node that does not see its anchor's marker nothing
        // is created, not even the volume's directory.
        if let Some(anchor) = &want.anchor {
            self.shared.check(&want.beneath.root, &want.node, anchor)?;
        }
        let backend_root = want.source.parent().unwrap_or(Path::new("/"));
        if !backend_root.is_dir() {
            return Err(Error::NoBackendRoot(backend_root.to_path_buf()));
        }
        // The data directory through file descriptors from its allowed root: never
        // through a symlink, never outside.
        roots::create_beneath(&want.beneath).map_err(|errno| Error::Beneath {
            action: "creating",
            path: want.source.clone(),
            errno,
        })?;
        std::fs::create_dir_all(&want.mountpoint).map_err(|source| Error::Dir {
            action: "creating",
            path: want.mountpoint.clone(),
            source,
        })?;
        let mounted = self.agent_mount(want)?;
        if mounted {
            progress(Progress::Mounted);
            agent_mount::late_daemon();
        }
        self.spawn_as(want, Launch::Start, mounted)
            .inspect_err(|_| {
                if mounted {
                    // No daemon will come for this start: the requests waiting on the
                    // mount fail (ENOTCONN) rather than wait; the retry mounts anew.
                    self.abandon(&want.mountpoint);
                }
            })
    }

    /// Start the daemon of `want` as `launch` says (`mounted`: the agent mounted,
    /// `--mounted`) and record it.
    fn spawn_as(&self, want: &Want, launch: Launch, mounted: bool) -> Result<Record, Error> {
        // A self-fencing daemon without an agent renewing the Lease would wait forever.
        if want.self_fence && !self.config.fencing {
            return Err(Error::NoLivenessLease);
        }
        self.state
            .write_capacity(&want.volume, want.capacity_bytes)?;
        self.state
            .write_settings(&want.volume, want.attr_cache_seconds)?;
        let spec = DaemonSpec {
            volume: want.volume.clone(),
            mountpod: want.mountpod.clone(),
            mountpod_uid: want.mountpod_uid.clone(),
            source: want.source.clone(),
            mountpoint: want.mountpoint.clone(),
            capacity_bytes: want.capacity_bytes,
            capacity_file: self.state.capacity_file(&want.volume),
            counters_file: self.state.counters_file(&want.volume),
            read_only: want.read_only,
            shared_backend: want.shared_backend,
            options: want.options.clone(),
            resources: want.resources.clone(),
            settings_file: Some(self.state.settings_file(&want.volume)),
            fence_file: want.self_fence.then(|| self.state.fence_file()),
            // Whether or not the holder answers now (process mode: started here if
            // it can be): the daemon hands its descriptor over once it does, retrying,
            // so a holder that comes (back) later still makes this daemon's crash a
            // takeover. Its Pod's arguments never change: without `--holder` now,
            // the mount could never be taken over for the daemon's life.
            handoff: self.holder.as_ref().map(|h| {
                if let Err(e) = h.ensure() {
                    warn!(volume = %want.volume, error = %e, "the fd holder does not answer; the daemon hands its descriptor over once it does");
                }
                (
                    h.path().to_path_buf(),
                    self.state.handoff_file(&want.volume),
                )
            }),
            mounted,
        };
        let log = self.state.log_file(&want.volume);
        let daemon = match launch {
            Launch::Successor(dead) => self.daemons.successor(&spec, &log, dead)?,
            Launch::Start => self.daemons.start(&spec, &log)?,
            Launch::Replace(old) => {
                self.daemons
                    .replace(old, &spec, &log, self.config.stop_grace)?
            }
        };
        info!(volume = %want.volume, pid = daemon.pid, mountpoint = %want.mountpoint.display(), "fuse daemon started");
        let record = Record {
            mountpod: want.mountpod.clone(),
            volume: want.volume.clone(),
            daemon,
            started_at: jiff::Timestamp::now().to_string(),
            source: want.source.clone(),
            mountpoint: want.mountpoint.clone(),
            capacity_bytes: want.capacity_bytes,
            read_only: want.read_only,
            mount_options: want.options.clone(),
            attr_cache_seconds: want.attr_cache_seconds,
            shared_backend: want.shared_backend,
            answered: false,
            // A successor may be a restart of the old container (pod mode: its image
            // is the Pod's, not necessarily the desired one).
            image: match launch {
                Launch::Successor(_) => self
                    .daemons
                    .serving_image(&want.mountpoint)
                    .or_else(|| self.daemons.image()),
                Launch::Start | Launch::Replace(_) => self.daemons.image(),
            },
            agent_mounted: mounted,
        };
        self.state.save(&record)?;
        Ok(record)
    }

    /// Wait (up to the start timeout, counted from the daemon's start) until the
    /// mount answers, then re-bind the references (not after a takeover: the mount
    /// they are bound to never went away).
    fn await_answer(
        &self,
        record: &Record,
        want: &Want,
        cause: Option<String>,
        begun: Instant,
        taken_over: bool,
    ) -> Result<Served, Error> {
        let deadline = Instant::now() + self.config.start_timeout.saturating_sub(record.age());
        let mut served = Served {
            daemon: Some(record.daemon),
            shared_backend: record.shared_backend,
            agent_mounted: record.agent_mounted,
            image: record.image.clone(),
            repaired: cause,
            taken_over,
            ..Served::default()
        };
        loop {
            if let Liveness::Exited(why) = self.daemons.liveness(record.daemon, &record.mountpoint)
            {
                let tail = self.state.log_tail(&want.volume, 4096);
                served.failure = Some(if tail.is_empty() {
                    why
                } else {
                    format!("{why}; log: {tail}")
                });
                served.daemon = None;
                return Ok(served);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let probe = self.mounts.probe(
                &record.mountpoint,
                self.config
                    .probe_timeout
                    .min(left.max(Duration::from_millis(50))),
            );
            if let Probe::Answers { .. } = probe {
                break;
            }
            if Instant::now() >= deadline {
                // Still Mounting; the next reconcile sees a daemon older than the
                // start timeout and repairs it.
                return Ok(served);
            }
            // A new mount usually answers within tens of milliseconds, and its ticket
            // (and so the pod's attach) waits for this: probe again as soon as the
            // daemon says it mounted (or exited), or after a short pause if it cannot
            // say (bounded, so liveness and the deadline are looked at again).
            self.daemons
                .await_mounted(record.daemon, left.min(Duration::from_millis(200)));
        }
        served.answers = true;
        tracing::debug!(volume = %want.volume, "mount answers");
        if !record.answered {
            let mut answered = record.clone();
            answered.answered = true;
            self.state.save(&answered)?;
        }
        let rebind = if taken_over {
            &[][..]
        } else {
            &want.references[..]
        };
        for target in rebind {
            match self.rebind(&want.mountpoint, target) {
                Ok(()) => served.rebound += 1,
                Err(e) => served.rebind_errors.push(format!(
                    "re-binding {}: {}",
                    target.path.display(),
                    error_chain(&e)
                )),
            }
        }
        if served.repaired.is_some() {
            served.repair_time = Some(begun.elapsed());
        }
        Ok(served)
    }

    /// Replace whatever is bound on `target` by a fresh bind of `mountpoint`.
    fn rebind(&self, mountpoint: &Path, target: &Target) -> Result<(), Error> {
        paths::resolves_under(&target.path, &self.config.kubelet_dir)?;
        // Detach first: `stat` of a bind of a dead FUSE mount fails with ENOTCONN.
        self.mounts
            .unmount_beneath(&self.config.kubelet_dir, &target.path, 16)?;
        match std::fs::symlink_metadata(&target.path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::Dir {
                    action: "binding onto (not a directory)",
                    path: target.path.clone(),
                    source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
                });
            }
            Err(source) => {
                return Err(Error::Dir {
                    action: "binding onto",
                    path: target.path.clone(),
                    source,
                });
            }
        }
        self.mounts.bind_beneath(
            mountpoint,
            &self.config.kubelet_dir,
            &target.path,
            target.read_only,
        )?;
        info!(target = %target.path.display(), read_only = target.read_only, "reference re-bound");
        Ok(())
    }

    /// Stop the daemon of `volume`, unmount it, remove its mount point and its
    /// records. Idempotent.
    pub fn teardown(&self, volume: &str, mountpoint: &Path) -> Result<(), Error> {
        if let Some(record) = self.state.load(volume)? {
            self.daemons
                .stop(record.daemon, &record.mountpoint, self.config.stop_grace)?;
            // Dropping the held descriptor of a connection no daemon serves any more
            // ends it: nothing stays blocked on a mount that is going away.
            if let Some(h) = &self.holder {
                h.remove(&record.mountpoint);
            }
            if record.mountpoint != mountpoint {
                self.unmount_and_remove(&record.mountpoint)?;
            }
        }
        if let Some(h) = &self.holder {
            h.remove(mountpoint);
        }
        self.unmount_and_remove(mountpoint)?;
        self.state.remove(volume)?;
        info!(volume, "unmounted");
        Ok(())
    }

    fn unmount_and_remove(&self, mountpoint: &Path) -> Result<(), Error> {
        self.mounts.unmount_all_lazy(mountpoint, 16)?;
        match std::fs::remove_dir(mountpoint) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            // Never delete what lies under a mount point: it is not ours.
            Err(source) => Err(Error::Dir {
                action: "removing mount point",
                path: mountpoint.to_path_buf(),
                source,
            }),
        }
    }

    /// Before a task that writes beneath the root of `source` (a volume's directory):
    /// when the MountPod names an anchor (a Shared root), this node must see its
    /// marker there.
    pub fn check_shared(
        &self,
        source: &str,
        volume: &str,
        node: &str,
        anchor: Option<&str>,
    ) -> Result<(), Error> {
        let Some(anchor) = anchor else {
            return Ok(());
        };
        let beneath = self.config.allowed_roots.check_source(source, volume)?;
        Ok(self.shared.check(&beneath.root, node, anchor)?)
    }

    /// Remove a deleted volume's data directory `source` of `volume`: only a volume's
    /// directory beneath an allowed root, through file descriptors from that root
    /// (symlinks removed, never followed). Refused while a mount on this node serves it.
    pub fn remove_data(&self, source: &str, volume: &str) -> Result<bool, Error> {
        let beneath = self.config.allowed_roots.check_source(source, volume)?;
        let source = beneath.full();
        if let Some(r) = self.state.list()?.into_iter().find(|r| r.source == source) {
            return Err(Error::StillMounted {
                source_dir: source,
                mountpoint: r.mountpoint,
            });
        }
        let removed = roots::remove_beneath(&beneath).map_err(|errno| Error::Beneath {
            action: "removing",
            path: source.clone(),
            errno,
        })?;
        if removed {
            info!(source = %source.display(), "volume data removed");
        }
        Ok(removed)
    }
}

mod populate;

#[cfg(test)]
mod tests;
