//! The FUSE filesystem of one volume on one node (`tessera mount`), a crate of its own
//! that knows nothing of Kubernetes (its manifest allows no kube, k8s-openapi or API
//! crate; `tests/arch/deps.sh` checks it): it serves one directory (`--source`) at one
//! mount point, within a quota. The node agent (`tessera::node`) starts it through
//! [`contract`], the one definition both sides import.
//!
//! ```text
//!            ┌──────────────────────── tessera mount ───────────────────────────┐
//!  kernel ◀──┤ fuser session: N worker threads, each with its own /dev/fuse fd    │
//!  (FUSE)    │   └─▶ adapter (fuser::Filesystem) ─▶ fs::VolumeFs ─▶ backing dir   │
//!            │                                         └─▶ quota::Enforcement     │
//!            │                                              daemon: Accounting    │
//!            │                                              backend: projquota ───┼─▶ XFS project
//!            │ signal thread: SIGTERM/SIGINT → unmount; SIGHUP → re-read capacity │   quota (limit)
//!            └───────────────────────────────────────────────────────────────────┘
//!  passthrough opens: the kernel reads (backend mode: and writes) the backing file
//!  directly; read-only opens in daemon mode, every open in backend mode
//! ```
//!
//! The modules, top to bottom (a module imports only those below it):
//!
//! | module | owns |
//! |---|---|
//! | `signals` | the signal thread: unmount, re-read the capacity, hand over |
//! | [`handoff`] | the state file and the takeover of a held connection |
//! | [`adapter`] | the thin `fuser::Filesystem` over [`fs`] |
//! | [`fd_holder`] | the holder itself (`tessera fd-holder`) |
//! | [`fence_gate`] | self-fencing: the gate every request that changes the volume passes, and the fence file's reader |
//! | [`fs`] | the filesystem core (no FUSE types) |
//! | [`quota`] | the quota modes and the daemon's accounting |
//! | [`projquota`] | the XFS project quota |
//! | [`contract`] | what the node agent and this daemon share: the command line, the counters file, signals, the capacity and settings files, the readiness pipe, the fd holder's socket |
//! | [`usage`] | what both quotas measure |
//! | [`budget`] | the memory limit and what is sized to it (worker threads, hot descriptors) |
//! | `sys` | the syscalls |
//! | this one | the process: it chooses the quota mode, mounts (or takes a held connection over), and serves until unmounted |
//!
//! **Quota mode** (`--quota`, default `auto`). `backend` when the volume directory is
//! on XFS with project quotas accounted and enforced: the directory gets a project id
//! and a block hard limit equal to the capacity, and writes may bypass the daemon.
//! Otherwise `daemon`: the daemon scans the volume and counts every write. `auto`
//! picks backend where it can (never for a read-only mount, which writes nothing and
//! must not tag the backend) and says in the log which mode it chose and why;
//! `--quota=backend` fails the mount where the filesystem cannot enforce.
//!
//! **Lifecycle.** `run` chooses the quota mode (scanning the source for the bytes in
//! use in daemon mode), mounts with `mount(2)`
//! (the daemon runs as root, so no `fusermount3` is needed), and serves. SIGTERM or
//! SIGINT unmounts (lazily if files are still open); the daemon keeps serving what
//! still refers to the connection (open files, the mount bound or propagated
//! elsewhere) for `--stop-grace` (2 s), then exits, which ends the connection for
//! them; a second stop signal exits at once. SIGHUP
//! re-reads `--capacity-file` (in backend mode: sets the project's new limit). When the kernel ends the connection (unmount, by us or
//! anyone), the daemon logs its counters and exits 0.
//!
//! **Handoff** (`--holder S --handoff-state F`, see `docs/handoff.md`): the daemon
//! hands a duplicate of its `/dev/fuse` descriptor to the fd holder at `S` and keeps
//! what the kernel refers to in `F`; on start it takes over the connection the holder
//! keeps for its mount point instead of mounting, if there is one. SIGUSR1 then exits
//! without unmounting (a planned replacement); SIGUSR2 makes the next stop signal do
//! the same (a mount Pod deleted for an upgrade: the kubelet's SIGTERM must not
//! unmount); otherwise a stop signal first tells the holder to let go.
//!
//! **Permissions.** The mount is `allow_other` (pods run as any uid) and
//! `default_permissions` (the kernel checks mode bits with the caller's credentials
//! before a request reaches the daemon), and `nosuid,nodev` unless `--options` says
//! `suid`/`dev`.

pub mod adapter;
pub mod budget;
pub mod contract;
pub mod fd_holder;
pub mod fence_gate;
pub mod fs;
pub mod handoff;
pub mod projquota;
pub mod quota;
mod signals;
mod sys;
pub mod usage;

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};
use nix::sys::signal::{SigSet, Signal};

use self::adapter::{Adapter, AdapterOptions};
use self::budget::Budget;
use self::contract::args::{MountArgs, QuotaChoice};
use self::contract::counters;
use self::contract::kernel_mount::{self, Opt};
use self::fs::{FsError, Naming, Options, VolumeFs};
use self::projquota::{BackendQuotaError, IdOrigin, ProjectQuota};
use self::quota::{Accounting, Enforcement};
use self::sys::SysError;

/// `--capacity-bytes` ([`MountArgs`]): bytes or a Kubernetes quantity (`10Gi`, `500M`).
fn parse_capacity(s: &str) -> Result<u64, String> {
    tessera_text::quantity::quantity_bytes(s).map_err(|e| e.to_string())
}

/// Errors of the mount role.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--quota=backend` with `--fence-file`.
    #[error("--quota=backend cannot be fenced: passthrough writes bypass the daemon")]
    FencedBackendQuota,
    /// The fence thread could not start.
    #[error("starting the fence thread")]
    Fence(#[source] std::io::Error),
    /// The capacity file could not be read.
    #[error("reading the capacity file {path}")]
    ReadCapacity {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The capacity file does not hold a byte count.
    #[error("the capacity file {path} does not hold a decimal byte count: {value:?}")]
    ParseCapacity { path: PathBuf, value: String },
    /// The volume directory could not be opened.
    #[error("opening the volume directory {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: FsError,
    },
    /// Walking the volume to count its bytes failed.
    #[error("scanning {path} for the bytes in use")]
    Scan {
        path: PathBuf,
        #[source]
        errno: nix::errno::Errno,
    },
    /// `--quota=backend` on a filesystem that cannot enforce it, or setting it up
    /// failed.
    #[error("enforcing the quota of {path} with an XFS project quota")]
    BackendQuota {
        path: PathBuf,
        #[source]
        source: BackendQuotaError,
    },
    /// An option of `--options` that cannot be honoured.
    #[error("mount option {0:?} is not supported")]
    MountOption(String),
    /// `--attr-timeout` or `--negative-timeout` out of range.
    #[error("{0} must be a finite number of seconds >= 0, not {1}")]
    Timeout(&'static str, f64),
    /// Setting up signal handling failed.
    #[error("setting up signal handling")]
    Signals(#[source] nix::errno::Errno),
    /// The kernel refused the mount.
    #[error("mounting {mountpoint}")]
    Mount {
        mountpoint: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A live connection is held for the mount point but cannot be taken over; the
    /// holder was told to let it go (the agent then repairs by remounting).
    #[error("taking over the held connection of the mount point")]
    Handoff(#[from] handoff::Refused),
    /// Serving ended with an error.
    #[error("serving {mountpoint}")]
    Serve {
        mountpoint: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Install a stderr subscriber unless the binary already has one; `RUST_LOG`
/// overrides the default level (info).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .try_init();
}

/// The daemon holds one descriptor per inode the kernel knows: lift the soft limit.
fn raise_nofile_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit to fill and then pass back.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn read_capacity(path: &Path) -> Result<u64, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadCapacity {
        path: path.to_owned(),
        source,
    })?;
    contract::control::parse_capacity(&text).ok_or_else(|| Error::ParseCapacity {
        path: path.to_owned(),
        value: text.trim().chars().take(64).collect(),
    })
}

fn open_source(path: &Path) -> Result<std::fs::File, Error> {
    std::fs::File::open(path).map_err(|e| Error::Open {
        path: path.to_owned(),
        source: FsError::Sys(SysError {
            op: "open",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        }),
    })
}

/// Decide who enforces the capacity (`--quota`), set that up, and say so in the log.
fn choose_quota(args: &MountArgs, capacity: u64, read_only: bool) -> Result<Enforcement, Error> {
    let reason = match args.quota {
        QuotaChoice::Daemon => "--quota=daemon".to_owned(),
        // A backend quota lets writable opens use passthrough, whose writes the
        // daemon never sees and so could not fence.
        QuotaChoice::Backend if args.fence_file.is_some() => return Err(Error::FencedBackendQuota),
        QuotaChoice::Auto if args.fence_file.is_some() => {
            "self-fencing: every write must reach the daemon".to_owned()
        }
        // Nothing is written through a read-only mount, so nothing needs passthrough
        // writes, and setting a project up would write to the backend (project ids on
        // every inode) on behalf of a mount that must not write.
        QuotaChoice::Auto if read_only => "read-only mount".to_owned(),
        QuotaChoice::Auto | QuotaChoice::Backend => {
            let dir = open_source(&args.source)?;
            match ProjectQuota::setup(dir.into(), capacity) {
                Ok((project, origin)) => {
                    let usage = project.usage().ok();
                    tracing::info!(
                        source = %args.source.display(),
                        quota = "backend",
                        projid = project.projid(),
                        projid_reused = origin == IdOrigin::Reused,
                        tagged = match origin {
                            IdOrigin::Assigned { tagged } => tagged,
                            IdOrigin::Reused => 0,
                        },
                        capacity,
                        used = usage.map(|u| u.used),
                        why = "the backing XFS filesystem enforces project quotas",
                        "quota mode chosen: an XFS project quota holds the volume; writable opens may use passthrough"
                    );
                    return Ok(Enforcement::Backend(project));
                }
                Err(source) if args.quota == QuotaChoice::Backend => {
                    return Err(Error::BackendQuota {
                        path: args.source.clone(),
                        source,
                    });
                }
                Err(e) => format!("no backend quota: {e}"),
            }
        }
    };
    let dir = open_source(&args.source)?;
    let scan = quota::scan(dir.as_fd()).map_err(|errno| Error::Scan {
        path: args.source.clone(),
        errno,
    })?;
    tracing::info!(
        source = %args.source.display(),
        quota = "daemon",
        capacity,
        used = scan.bytes,
        files = scan.files,
        dirs = scan.dirs,
        why = reason.as_str(),
        "quota mode chosen: the daemon counts every write; writable opens do not use passthrough"
    );
    Ok(Enforcement::Daemon(Accounting::new(capacity, scan.bytes)))
}

/// Mount options for the kernel from the command line (`contract::kernel_mount`,
/// the plan the node agent mounts with too).
fn mount_options(args: &MountArgs) -> Result<(Vec<MountOption>, Options), Error> {
    let plan = kernel_mount::plan(&args.source, args.read_only, &args.options)
        .map_err(|e| Error::MountOption(e.0))?;
    let mut opts = vec![
        MountOption::FSName(plan.fsname.clone()),
        MountOption::Subtype("tessera".into()),
        MountOption::DefaultPermissions,
    ];
    opts.extend(plan.options.iter().map(|o| match o {
        Opt::Exec => MountOption::Exec,
        Opt::NoExec => MountOption::NoExec,
        Opt::Suid => MountOption::Suid,
        Opt::NoSuid => MountOption::NoSuid,
        Opt::Dev => MountOption::Dev,
        Opt::NoDev => MountOption::NoDev,
        Opt::Atime => MountOption::Atime,
        Opt::NoAtime => MountOption::NoAtime,
        Opt::Sync => MountOption::Sync,
        Opt::Async => MountOption::Async,
        Opt::DirSync => MountOption::DirSync,
        Opt::Custom(c) => MountOption::CUSTOM(c.clone()),
    }));
    opts.push(if plan.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    Ok((
        opts,
        Options {
            read_only: plan.read_only,
            devices: plan.devices,
        },
    ))
}

/// Serve the volume until unmounted or signalled.
pub fn run(args: MountArgs) -> Result<(), Error> {
    init_tracing();
    for (name, t) in [
        ("--attr-timeout", args.attr_timeout),
        ("--negative-timeout", args.negative_timeout),
    ] {
        if let Some(t) = t
            && (!t.is_finite() || t < 0.0)
        {
            return Err(Error::Timeout(name, t));
        }
    }
    adapter::fault::warn_if_armed();
    adapter::fault::late_start();
    let (mount_options, options) = mount_options(&args)?;
    // The kernel applies the caller's umask before a create reaches us; ours must not
    // apply a second one. Set before any thread exists (umask is per process).
    // SAFETY: umask has no failure mode.
    unsafe { libc::umask(0) };
    raise_nofile_limit();

    let capacity = match &args.capacity_file {
        Some(path) if path.exists() => read_capacity(path)?,
        _ => args.capacity_bytes,
    };
    let quota = Arc::new(choose_quota(&args, capacity, options.read_only)?);
    // Threads and cached descriptors sized to the cgroup's memory limit, if any.
    let budget = Budget::for_limit(
        budget::memory_limit(),
        args.threads,
        VolumeFs::default_hot_fds(),
    );
    tracing::info!(
        memory_limit = budget.limit,
        threads = budget.threads,
        hot_fds = budget.hot_fds,
        "memory budget"
    );
    let fs = Arc::new(
        VolumeFs::with_hot_fds(&args.source, options, quota.clone(), budget.hot_fds).map_err(
            |source| Error::Open {
                path: args.source.clone(),
                source,
            },
        )?,
    );
    match fs.inode_naming() {
        (naming @ Naming::FileHandles, hot_fds) => {
            tracing::info!(
                naming = naming.as_str(),
                hot_fds,
                "inodes named by file handles"
            );
        }
        (naming @ Naming::Descriptors(errno), _) => tracing::warn!(
            naming = naming.as_str(),
            reason = %errno,
            "the backing filesystem gives no usable file handles: one descriptor held per inode"
        ),
    }
    let backing_fs_type = fs.backing_fs_type().ok();
    let cache = CachePolicy::new(
        backing_fs_type.is_some_and(adapter::is_local_fs) && !args.shared_backend,
        args.attr_timeout,
        args.negative_timeout,
    );
    tracing::info!(
        backing_fs_type = backing_fs_type.map(|t| format!("{t:#x}")),
        local = cache.local,
        attr_timeout = ?cache.ttl,
        negative_timeout = ?cache.negative_ttl,
        "kernel cache lifetimes"
    );
    // On a node-local backend one mount serves every Pod of the node: the kernel's
    // own locks are seen by all of them, without a round trip per lock or close.
    let locks = !cache.local && backend_holds_locks(&args.source, options.read_only);
    // The settings file's lifetime, if it sets one, over the default; a file that
    // cannot be used leaves the default (and says so).
    let ttl = adapter::LiveTtl::new(match &args.settings_file {
        Some(path) => match contract::settings::Settings::read(path) {
            Ok(s) => s.ttl(cache.ttl),
            Err(e) => {
                tracing::error!(error = %e, cause = ?std::error::Error::source(&e).map(|c| c.to_string()), "settings file not used");
                cache.ttl
            }
        },
        None => cache.ttl,
    });
    tracing::info!(attr_timeout = ?ttl.get(), "attribute cache lifetime in effect");
    // Handoff: a held connection to take over (its state restored), or none; and
    // the state file this daemon keeps for its own successor.
    let prepared = handoff::prepare(
        args.holder.as_deref(),
        args.handoff_state.as_deref(),
        &args.mountpoint,
        &fs,
        args.standby,
        args.mounted,
    )?;
    // Self-fencing: a successor serves under its predecessor's epoch (a revoked
    // daemon's successor is revoked too), and each daemon records its own for the next.
    let fence = match &args.fence_file {
        Some(path) => {
            let gate =
                fence_gate::Gate::start(path, prepared.fence_epoch()).map_err(Error::Fence)?;
            if let Some(state) = prepared.state() {
                gate.on_bound(move |epoch| state.set_fence_epoch(epoch));
            }
            Some(gate)
        }
        None => None,
    };
    let adapter = Adapter::new(
        fs.clone(),
        AdapterOptions {
            fence,
            ttl: ttl.clone(),
            negative_ttl: cache.negative_ttl,
            passthrough: !args.no_passthrough,
            locks,
            close_to_open: !cache.local,
        },
    );
    let notifier = adapter.notifier_slot();

    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = SessionACL::All;
    config.n_threads = Some(budget.threads as usize);
    // With a holder, every worker reads the one descriptor the holder duplicates:
    // the kernel fails what a closed clone had read instead of resending it.
    config.clone_fd = args.holder.is_none();

    // Only the signal thread takes these signals: block them before fuser starts its
    // workers, which inherit the mask.
    let mut signals = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        contract::control::RELOAD,
        contract::control::LEAVE,
        contract::control::LEAVE_ON_STOP,
    ] {
        signals.add(s);
    }
    signals.thread_block().map_err(Error::Signals)?;
    // After the mask: the counters' thread must not take the signals either.
    if let Some(path) = &args.counters_file {
        count_into(path, fs.clone());
    }

    let (mut session, resumed) = handoff::open_session(
        adapter,
        &args.mountpoint,
        config,
        prepared,
        args.holder.as_deref(),
    )
    .map_err(|source| Error::Mount {
        mountpoint: args.mountpoint.clone(),
        source,
    })?;
    let _ = notifier.set(session.notifier());
    contract::ready::say_mounted(args.ready_fd);
    let unmounter = session.unmount_callable();
    let signal_ctx = signals::SignalContext {
        signals,
        unmounter,
        quota: quota.clone(),
        capacity_file: args.capacity_file.clone(),
        settings_file: args.settings_file.clone(),
        ttl,
        default_ttl: cache.ttl,
        mountpoint: args.mountpoint.clone(),
        grace: Duration::from_secs_f64(args.stop_grace),
        fs: fs.clone(),
        holder: args.holder.clone(),
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || signal_ctx.run())
        .map_err(|source| Error::Serve {
            mountpoint: args.mountpoint.clone(),
            source,
        })?;
    tracing::info!(
        mountpoint = %args.mountpoint.display(),
        read_only = options.read_only,
        devices = options.devices,
        threads = budget.threads,
        resumed,
        "{}",
        if resumed { "serving the held connection" } else { "mounted" }
    );

    let served = session.run();
    log_counters(&fs, &args.mountpoint, "unmounted");
    served.map_err(|source| Error::Serve {
        mountpoint: args.mountpoint.clone(),
        source,
    })
}

/// Whether the backend holds the locks Tessera serves locks with (OFD and flock,
/// tried on a probe file); when it does not, each mount's kernel keeps its own locks,
/// which other nodes do not see.
fn backend_holds_locks(source: &Path, read_only: bool) -> bool {
    let probe = std::fs::File::open(source)
        .map_err(|e| e.to_string())
        .and_then(|dir| crate::fs::probe_locks(dir.as_fd(), !read_only).map_err(|e| e.to_string()));
    match probe {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(
                %error,
                "the backend cannot hold locks: flock and fcntl locks stay on this node"
            );
            false
        }
    }
}

/// Count into the file at `path` (a daemon that cannot still serves, uncounted), and
/// refresh the quota gauges there every second.
fn count_into(path: &Path, fs: Arc<VolumeFs>) {
    if let Err(e) = counters::install(path) {
        tracing::warn!(path = %path.display(), error = %e, "no counters for the node agent");
        return;
    }
    let refresh = move || {
        loop {
            if let Ok(u) = fs.usage() {
                counters::table().set_quota(u.used, u.capacity);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("counters".into())
        .spawn(refresh)
    {
        tracing::warn!(error = %e, "no quota gauges for the node agent");
    }
}

/// The daemon's last line: what it served, and the quota at the end.
fn log_counters(fs: &VolumeFs, mountpoint: &Path, message: &'static str) {
    let stats = fs.stats();
    // Reads and writes as the node agent sees them: the one count the adapter keeps.
    let counted = counters::table().snapshot();
    let usage = fs.usage().ok();
    tracing::info!(
        mountpoint = %mountpoint.display(),
        reads = counted.ops[counters::Op::Read as usize],
        read_bytes = counted.read_bytes,
        writes = counted.ops[counters::Op::Write as usize],
        write_bytes = counted.written_bytes,
        opens_passthrough = stats.opens_passthrough.load(Ordering::Relaxed),
        opens_cached = stats.opens_cached.load(Ordering::Relaxed),
        opens_direct = stats.opens_direct.load(Ordering::Relaxed),
        opens_busy = stats.opens_busy.load(Ordering::Relaxed),
        passthrough_failures = stats.passthrough_failures.load(Ordering::Relaxed),
        quota = fs.quota_mode().as_str(),
        used = usage.map(|u| u.used),
        capacity = usage.map(|u| u.capacity),
        "{message}"
    );
}

/// How long the kernel may cache names, attributes and non-existence.
///
/// The kernel keeps its caches coherent with every change made *through* the mount;
/// the lifetimes only bound how long a change made *behind* it stays unseen. Who can
/// change the backing directory behind the mount depends on where it lives:
///
/// - **node-local backing filesystem** (ext4, xfs, btrfs, tmpfs, overlayfs, …): the
///   volume is pinned to this node, and the node runs one `tessera mount` per volume,
///   shared by every pod that uses it. Nothing but this daemon changes the directory
///   (short of someone editing it on the host), so caching is long: 60 s for names and
///   attributes, and names that do not exist are remembered as long (a `$PATH` or
///   library search then costs no round trip per miss).
/// - **anything else** (NFS, CephFS, another FUSE filesystem, …): other nodes may
///   mount the same volume (RWX) and change it at any time, so names and attributes
///   live 1 s (JuiceFS's and libfuse's default) and non-existence is never cached, so
///   a file another node creates is visible at once. Every open also drops the
///   file's cached attributes (close-to-open, as NFS promises): what another node
///   wrote and closed before is what the open reads, whole, with its size and times.
///
/// `--attr-timeout` and `--negative-timeout` override either default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachePolicy {
    pub local: bool,
    pub ttl: Duration,
    pub negative_ttl: Duration,
}

impl CachePolicy {
    /// Lifetimes on a node-local backing filesystem.
    pub const LOCAL_TTL: Duration = Duration::from_secs(60);
    /// Lifetimes on a backing filesystem other nodes may share.
    pub const SHARED_TTL: Duration = Duration::from_secs(1);

    pub fn new(local: bool, attr_timeout: Option<f64>, negative_timeout: Option<f64>) -> Self {
        let ttl = attr_timeout
            .map(Duration::from_secs_f64)
            .unwrap_or(if local {
                Self::LOCAL_TTL
            } else {
                Self::SHARED_TTL
            });
        let negative_ttl = negative_timeout
            .map(Duration::from_secs_f64)
            .unwrap_or(if local { ttl } else { Duration::ZERO });
        CachePolicy {
            local,
            ttl,
            negative_ttl,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_lifetimes_are_long_only_where_nobody_else_writes() {
        let local = CachePolicy::new(true, None, None);
        assert_eq!(local.ttl, CachePolicy::LOCAL_TTL);
        assert_eq!(local.negative_ttl, CachePolicy::LOCAL_TTL);
        let shared = CachePolicy::new(false, None, None);
        assert_eq!(shared.ttl, Duration::from_secs(1));
        assert_eq!(shared.negative_ttl, Duration::ZERO);
        let set = CachePolicy::new(false, Some(5.0), Some(0.5));
        assert_eq!(set.ttl, Duration::from_secs(5));
        assert_eq!(set.negative_ttl, Duration::from_millis(500));
        // An explicit attribute timeout also bounds negative entries on a local fs.
        assert_eq!(
            CachePolicy::new(true, Some(2.0), None).negative_ttl,
            Duration::from_secs(2)
        );
    }
}
