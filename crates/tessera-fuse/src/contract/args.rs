//! The command lines the node agent starts: `tessera mount` (the daemon of one
//! volume) and `tessera fd-holder`. Each is defined once, here: the daemon parses
//! [`MountArgs`] (clap), and the agent builds the same struct and renders it with
//! [`MountArgs::to_args`], which writes only what differs from the defaults, so an
//! agent and a daemon of different releases agree on every flag both know.
//!
//! ```text
//!  node agent: DaemonSpec ─▶ MountArgs { … } ─to_args()─▶ ["mount", "--source", S, …]
//!                                                              │ exec / Pod args
//!  tessera mount: clap ─▶ MountArgs ◀──────────────────────────┘  (from_args: the same parse)
//!  node agent, later: /proc/<pid>/cmdline ─is_mount_command()─▶ the daemon of M?
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The subcommand of the daemon.
pub const MOUNT: &str = "mount";
/// The subcommand of the fd holder.
pub const FD_HOLDER: &str = "fd-holder";
/// `--threads` when not given.
pub const DEFAULT_THREADS: u16 = 4;
/// `--stop-grace` when not given, in seconds.
pub const DEFAULT_STOP_GRACE: f64 = 2.0;

/// Command line of `tessera mount`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct MountArgs {
    /// The volume's directory on the node (the backend root joined with the volume name).
    #[arg(long)]
    pub source: PathBuf,
    /// Where to mount the filesystem.
    #[arg(long)]
    pub mountpoint: PathBuf,
    /// Quota: bytes or a Kubernetes quantity (`10Gi`, `500M`).
    #[arg(long, value_parser = crate::parse_capacity)]
    pub capacity_bytes: u64,
    /// A file holding the quota in bytes (decimal); re-read on SIGHUP, so the quota can
    /// grow on a mounted volume.
    #[arg(long)]
    pub capacity_file: Option<PathBuf>,
    /// Mount read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Extra mount options (comma separated, as in mount -o).
    #[arg(long, value_delimiter = ',')]
    pub options: Vec<String>,
    /// Threads serving requests (each with its own /dev/fuse descriptor). At least
    /// two: a writable open may wait for a release, which another thread serves.
    #[arg(long, default_value_t = DEFAULT_THREADS, value_parser = clap::value_parser!(u16).range(2..=64))]
    pub threads: u16,
    /// How long, in seconds, the kernel may cache names and attributes. Longer is
    /// faster; shorter notices changes made to the backing directory behind the mount
    /// (e.g. by another node on a shared backend) sooner. Default: 60 s on a
    /// node-local backing filesystem (ext4, xfs, btrfs, tmpfs, overlayfs, f2fs, zfs),
    /// 1 s on any other (see `CachePolicy`).
    #[arg(long)]
    pub attr_timeout: Option<f64>,
    /// How long, in seconds, the kernel may remember that a name does not exist
    /// (0: never). Default: the attribute timeout on a node-local backing filesystem,
    /// 0 otherwise.
    #[arg(long)]
    pub negative_timeout: Option<f64>,
    /// A settings file (JSON, `{"attrCacheSeconds": 30}`) read at start and on
    /// SIGHUP: what it sets overrides `--attr-timeout` on the running mount (see
    /// `fuse::settings`).
    #[arg(long)]
    pub settings_file: Option<PathBuf>,
    /// The node's fence file (docs/failover.md): with it, every request that changes
    /// or commits the volume waits while the node has not renewed its liveness Lease
    /// for the file's fenceAfter, and fails (EIO) once the node lost its Lease. Every
    /// write then reaches the daemon (no backend quota, no passthrough writes).
    #[arg(long)]
    pub fence_file: Option<PathBuf>,
    /// Never use kernel passthrough, even where the kernel supports it.
    #[arg(long)]
    pub no_passthrough: bool,
    /// Treat the backing directory as shared with other nodes even on a node-local
    /// filesystem type (e.g. one directory served to several nodes of one host): the
    /// cache lifetimes of a shared backend, and close-to-open revalidation.
    #[arg(long)]
    pub shared_backend: bool,
    /// Who holds the volume to its capacity: `backend` (an XFS project quota on
    /// `--source`, which lets writable opens use kernel passthrough too; the mount
    /// fails if the filesystem cannot enforce one), `daemon` (the daemon counts every
    /// write, which must then reach it), or `auto` (backend where possible, else
    /// daemon).
    #[arg(long, value_enum, default_value_t = QuotaChoice::Auto)]
    pub quota: QuotaChoice,
    /// After a stop signal, how long, in seconds, open files and mounts elsewhere (a
    /// bind or a propagated copy of this mount) may keep the connection alive before
    /// the daemon exits anyway; then they see ENOTCONN.
    #[arg(long, default_value_t = DEFAULT_STOP_GRACE, value_parser = parse_grace)]
    pub stop_grace: f64,
    /// A file to keep the mount's counters in (operations, errors, bytes, quota),
    /// mapped into memory and read by the node agent for its metrics; kept across
    /// daemon restarts (see `fuse::counters`).
    #[arg(long)]
    pub counters_file: Option<PathBuf>,
    /// The fd holder's socket (the node agent's `holder.sock`): the daemon hands it a
    /// duplicate of the mount's /dev/fuse descriptor, and on start takes over the
    /// connection it holds for `--mountpoint`, if any, instead of mounting (see
    /// `docs/handoff.md`). Needs `--handoff-state`.
    #[arg(long, requires = "handoff_state")]
    pub holder: Option<PathBuf>,
    /// Where the daemon keeps what the kernel refers to (inodes, open handles, the
    /// negotiated INIT) for a successor: a file in shared memory, beside the counters
    /// file. Needs `--holder`.
    #[arg(long, requires = "holder")]
    pub handoff_state: Option<PathBuf>,
    /// Start beside the daemon serving `--mountpoint` (an upgrade): wait until it has
    /// left the held connection, then take it over; never mount. Needs `--holder`.
    #[arg(long, requires = "holder")]
    pub standby: bool,
    /// The node agent has mounted `--mountpoint` and given the connection to the
    /// holder: take it from there (answering the kernel's INIT), never mount. Needs
    /// `--holder`.
    #[arg(long, requires = "holder")]
    pub mounted: bool,
    /// The write end of a pipe (a descriptor inherited from the node agent): one byte
    /// is written to it, and it is closed, once the mount is in place, so the agent
    /// probes the mount at once instead of polling. Ignored unless it is a pipe.
    #[arg(long, hide = true)]
    pub ready_fd: Option<i32>,
}

fn parse_grace(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=300.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: seconds from 0 to 300")),
    }
}

/// `tessera mount --quota`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaChoice {
    Auto,
    Daemon,
    Backend,
}

impl MountArgs {
    /// What the daemon of `source` at `mountpoint` runs with when nothing else is
    /// said: every other flag at its default.
    pub fn new(source: PathBuf, mountpoint: PathBuf, capacity_bytes: u64) -> MountArgs {
        MountArgs {
            source,
            mountpoint,
            capacity_bytes,
            capacity_file: None,
            read_only: false,
            options: Vec::new(),
            threads: DEFAULT_THREADS,
            attr_timeout: None,
            negative_timeout: None,
            settings_file: None,
            fence_file: None,
            no_passthrough: false,
            shared_backend: false,
            quota: QuotaChoice::Auto,
            stop_grace: DEFAULT_STOP_GRACE,
            counters_file: None,
            holder: None,
            handoff_state: None,
            standby: false,
            mounted: false,
            ready_fd: None,
        }
    }

    /// The arguments after the program name: `mount --source … --mountpoint …
    /// --capacity-bytes …`, then each flag that differs from its default. The order
    /// is fixed (agents of earlier releases wrote these flags in this order), and
    /// `--mountpoint` is always two arguments ([`is_mount_command`] looks for it).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            MOUNT.into(),
            "--source".into(),
            self.source.clone().into(),
            "--mountpoint".into(),
            self.mountpoint.clone().into(),
            "--capacity-bytes".into(),
            self.capacity_bytes.to_string().into(),
        ];
        let mut path = |flag: &str, p: &Option<PathBuf>| {
            if let Some(p) = p {
                args.extend([flag.into(), p.clone().into()]);
            }
        };
        path("--capacity-file", &self.capacity_file);
        path("--counters-file", &self.counters_file);
        path("--settings-file", &self.settings_file);
        path("--fence-file", &self.fence_file);
        if self.read_only {
            args.push("--read-only".into());
        }
        if self.shared_backend {
            args.push("--shared-backend".into());
        }
        if !self.options.is_empty() {
            args.push(format!("--options={}", self.options.join(",")).into());
        }
        // Both or neither: each requires the other.
        if let (Some(holder), Some(state)) = (&self.holder, &self.handoff_state) {
            args.extend([
                "--holder".into(),
                holder.clone().into(),
                "--handoff-state".into(),
                state.clone().into(),
            ]);
        }
        if self.threads != DEFAULT_THREADS {
            args.push(format!("--threads={}", self.threads).into());
        }
        if let Some(t) = self.attr_timeout {
            args.push(format!("--attr-timeout={t}").into());
        }
        if let Some(t) = self.negative_timeout {
            args.push(format!("--negative-timeout={t}").into());
        }
        if self.no_passthrough {
            args.push("--no-passthrough".into());
        }
        if self.quota != QuotaChoice::Auto {
            let quota = match self.quota {
                QuotaChoice::Auto => "auto",
                QuotaChoice::Daemon => "daemon",
                QuotaChoice::Backend => "backend",
            };
            args.push(format!("--quota={quota}").into());
        }
        if self.stop_grace != DEFAULT_STOP_GRACE {
            args.push(format!("--stop-grace={}", self.stop_grace).into());
        }
        if self.standby {
            args.push("--standby".into());
        }
        if self.mounted {
            args.push("--mounted".into());
        }
        if let Some(fd) = self.ready_fd {
            args.push(format!("--ready-fd={fd}").into());
        }
        args
    }

    /// The daemon's parse of `args` (as [`MountArgs::to_args`] writes them, the
    /// subcommand first): what `tessera mount` makes of a command line.
    pub fn from_args<I, T>(args: I) -> Result<MountArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        use clap::Parser;
        #[derive(clap::Parser)]
        #[command(no_binary_name = true)]
        struct Cli {
            #[command(subcommand)]
            cmd: Cmd,
        }
        #[derive(clap::Subcommand)]
        enum Cmd {
            #[command(name = MOUNT)]
            Mount(MountArgs),
        }
        let Cmd::Mount(m) = Cli::try_parse_from(args)?.cmd;
        Ok(m)
    }
}

/// Whether a process's command line (`/proc/<pid>/cmdline`) is a `tessera mount` of
/// any mountpoint: its subcommand is [`MOUNT`].
pub fn is_mount_process(cmdline: &[u8]) -> bool {
    cmdline.split(|b| *b == 0).nth(1) == Some(MOUNT.as_bytes())
}

/// Whether a process's command line (`/proc/<pid>/cmdline`: arguments separated by
/// NULs) is `tessera mount … --mountpoint <mountpoint>`, in either spelling of the
/// flag. The program name is not looked at (the agent starts `/proc/self/exe`).
pub fn is_mount_command(cmdline: &[u8], mountpoint: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if !is_mount_process(cmdline) {
        return false;
    }
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let want = mountpoint.as_os_str().as_bytes();
    args.windows(2)
        .any(|w| w[0] == b"--mountpoint" && w[1] == want)
        || args
            .iter()
            .any(|a| a.strip_prefix(b"--mountpoint=") == Some(want))
}

/// Command line of `tessera fd-holder`.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct HolderArgs {
    /// The unix socket to serve (created 0600; a stale one is replaced).
    #[arg(long)]
    pub socket: PathBuf,
}

impl HolderArgs {
    /// The arguments after the program name: `fd-holder --socket S`.
    pub fn to_args(&self) -> Vec<OsString> {
        vec![
            FD_HOLDER.into(),
            "--socket".into(),
            self.socket.clone().into(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_left_out_and_parse_back_to_the_same() {
        let m = MountArgs::new("/b/v".into(), "/m/v".into(), 1024);
        let args = m.to_args();
        assert_eq!(
            args.join(std::ffi::OsStr::new(" ")),
            "mount --source /b/v --mountpoint /m/v --capacity-bytes 1024"
        );
        assert_eq!(MountArgs::from_args(args).unwrap(), m);
    }

    /// Every flag away from its default: the daemon's parser gives back exactly what
    /// was rendered.
    #[test]
    fn every_flag_round_trips_through_the_daemons_parser() {
        let m = MountArgs {
            capacity_file: Some("/s/v.capacity".into()),
            read_only: true,
            options: vec!["noatime".into(), "noexec".into()],
            threads: 9,
            attr_timeout: Some(0.25),
            negative_timeout: Some(0.0),
            settings_file: Some("/s/v.settings".into()),
            no_passthrough: true,
            shared_backend: true,
            quota: QuotaChoice::Backend,
            stop_grace: 7.5,
            counters_file: Some("/s/v.counters".into()),
            holder: Some("/s/holder.sock".into()),
            handoff_state: Some("/s/v.handoff".into()),
            standby: true,
            mounted: true,
            ready_fd: Some(3),
            ..MountArgs::new("/b/v".into(), "/m/v".into(), 10 << 30)
        };
        assert_eq!(MountArgs::from_args(m.to_args()).unwrap(), m);
        let daemon = MountArgs {
            quota: QuotaChoice::Daemon,
            ..MountArgs::new("/b/v".into(), "/m/v".into(), 1)
        };
        assert_eq!(MountArgs::from_args(daemon.to_args()).unwrap(), daemon);
    }

    #[test]
    fn the_daemon_still_takes_a_quantity_for_its_capacity() {
        let m = MountArgs::from_args([
            "mount",
            "--source",
            "/b",
            "--mountpoint",
            "/m",
            "--capacity-bytes",
            "1Gi",
        ])
        .unwrap();
        assert_eq!(m.capacity_bytes, 1 << 30);
    }

    #[test]
    fn recognizes_the_daemon_command_line() {
        let mp = Path::new("/var/lib/tessera/mounts/v");
        let m = MountArgs::new("/d/v".into(), mp.into(), 1);
        let mut rendered = b"/usr/bin/tessera\0".to_vec();
        for a in m.to_args() {
            rendered.extend_from_slice(a.as_encoded_bytes());
            rendered.push(0);
        }
        assert!(is_mount_command(&rendered, mp));
        assert!(is_mount_command(
            b"/usr/bin/tessera\0mount\0--source\0/d/v\0--mountpoint\0/var/lib/tessera/mounts/v\0",
            mp
        ));
        assert!(is_mount_command(
            b"tessera\0mount\0--mountpoint=/var/lib/tessera/mounts/v\0",
            mp
        ));
        assert!(!is_mount_command(
            b"tessera\0mount\0--mountpoint\0/var/lib/tessera/mounts/w\0",
            mp
        ));
        assert!(!is_mount_command(
            b"tessera\0node\0--mountpoint\0/var/lib/tessera/mounts/v\0",
            mp
        ));
        assert!(is_mount_process(&rendered));
        assert!(!is_mount_process(b"tessera\0node\0mount\0"));
        assert!(!is_mount_process(b"mount\0"));
        assert!(!is_mount_command(b"", mp));
    }

    #[test]
    fn the_holders_command_line() {
        use clap::Parser;
        #[derive(clap::Parser)]
        #[command(no_binary_name = true)]
        struct Cli {
            #[command(subcommand)]
            cmd: Cmd,
        }
        #[derive(clap::Subcommand)]
        enum Cmd {
            #[command(name = FD_HOLDER)]
            FdHolder(HolderArgs),
        }
        let h = HolderArgs {
            socket: "/s/holder.sock".into(),
        };
        assert_eq!(
            h.to_args().join(std::ffi::OsStr::new(" ")),
            "fd-holder --socket /s/holder.sock"
        );
        let Cmd::FdHolder(parsed) = Cli::try_parse_from(h.to_args()).unwrap().cmd;
        assert_eq!(parsed, h);
    }
}
