//! What a daemon must serve ([`DaemonSpec`]) and the command line of `tessera mount`
//! built from it, used by both mount modes (a `setsid` child of the agent in process
//! mode, the container's arguments of a mount Pod in pod mode), so that a daemon is
//! started the same way whatever runs it. The flags are the daemon's own
//! ([`MountArgs`], in `tessera_fuse::contract`): the agent fills that struct, and it
//! renders itself.
//!
//! ```text
//!  DaemonSpec ──daemon_args()──▶ MountArgs ──to_args()──▶ ["mount", "--source", S, …]
//!                                  ├─ supervisor::HostDaemons: + ready_fd, Command::args
//!                                  └─ pods::spec: container args (+ standby)
//! ```

use std::ffi::OsString;
use std::path::PathBuf;

use tessera_fuse::contract::args::MountArgs;

/// What a daemon must serve: the arguments of `tessera mount`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSpec {
    /// The volume (names the log, capacity and record files).
    pub volume: String,
    /// The MountPod served (a mount Pod's owner).
    pub mountpod: String,
    /// Its uid (empty when unknown: a mount Pod then has no owner reference).
    pub mountpod_uid: String,
    /// The volume's directory.
    pub source: PathBuf,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Quota in bytes (also written to the capacity file).
    pub capacity_bytes: u64,
    /// The file the daemon re-reads the quota from on SIGHUP.
    pub capacity_file: PathBuf,
    /// The file the daemon keeps its counters in, for the agent's metrics.
    pub counters_file: PathBuf,
    /// Mount read-only.
    pub read_only: bool,
    /// Treat the backend as shared with other nodes (`--shared-backend`).
    pub shared_backend: bool,
    /// Extra mount options.
    pub options: Vec<String>,
    /// CPU and memory (pod mode: the mount container's requests and limits, over the
    /// agent's defaults; process mode: not bounded).
    pub resources: Option<tessera_api::MountResources>,
    /// The settings file the daemon reads at start and on SIGHUP (`--settings-file`:
    /// the attribute cache lifetime, changed live).
    pub settings_file: Option<PathBuf>,
    /// The node's fence file, for a self-fencing daemon (`--fence-file`).
    pub fence_file: Option<PathBuf>,
    /// The fd holder's socket and the handoff state file (`--holder`,
    /// `--handoff-state`), when the agent runs a holder.
    pub handoff: Option<(PathBuf, PathBuf)>,
    /// The agent mounted and gave the connection to the holder (`--mounted`): the
    /// daemon serves it and never mounts.
    pub mounted: bool,
}

impl DaemonSpec {
    /// What `tessera mount` is told for this spec. `--mountpoint` is always given as
    /// two arguments (`contract::args::is_mount_command` recognizes a daemon by it);
    /// the starter adds `ready_fd` (process mode) or `standby` (an upgrade's Pod).
    pub fn daemon_args(&self) -> MountArgs {
        // The /dev/fuse descriptor holder and the handoff state (docs/handoff.md), when
        // the agent runs a holder. The state directory is mounted into mount Pods at
        // the same path (pods::spec), so the paths hold in either mode.
        let (holder, handoff_state) = match &self.handoff {
            Some((holder, state)) => (Some(holder.clone()), Some(state.clone())),
            None => (None, None),
        };
        MountArgs {
            capacity_file: Some(self.capacity_file.clone()),
            counters_file: Some(self.counters_file.clone()),
            settings_file: self.settings_file.clone(),
            fence_file: self.fence_file.clone(),
            read_only: self.read_only,
            shared_backend: self.shared_backend,
            options: self.options.clone(),
            mounted: self.mounted && holder.is_some(),
            holder,
            handoff_state,
            ..MountArgs::new(
                self.source.clone(),
                self.mountpoint.clone(),
                self.capacity_bytes,
            )
        }
    }
}

/// Arguments as strings (a Pod spec's `args`). The paths come from validated UTF-8
/// (the MountPod spec and the agent's flags), so nothing is lost.
pub fn strings(args: Vec<OsString>) -> Vec<String> {
    args.into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn spec() -> DaemonSpec {
        DaemonSpec {
            volume: "v".into(),
            mountpod: "v-1".into(),
            mountpod_uid: "uid-1".into(),
            source: "/b/v".into(),
            mountpoint: "/m/v".into(),
            capacity_bytes: 1024,
            capacity_file: "/s/mounts/v.capacity".into(),
            counters_file: "/s/mounts/v.counters".into(),
            read_only: false,
            shared_backend: false,
            options: vec![],
            resources: None,
            settings_file: None,
            fence_file: None,
            handoff: None,
            mounted: false,
        }
    }

    #[test]
    fn arguments_of_each_setting() {
        let base = "mount --source /b/v --mountpoint /m/v --capacity-bytes 1024 \
                    --capacity-file /s/mounts/v.capacity --counters-file /s/mounts/v.counters";
        type Change = fn(&mut DaemonSpec);
        let table: [(Change, &str); 6] = [
            (|_| {}, ""),
            (|s| s.read_only = true, " --read-only"),
            (|s| s.shared_backend = true, " --shared-backend"),
            (
                |s| s.options = vec!["ro".into(), "noatime".into()],
                " --options=ro,noatime",
            ),
            (
                |s| {
                    s.read_only = true;
                    s.shared_backend = true;
                    s.options = vec!["noexec".into()];
                },
                " --read-only --shared-backend --options=noexec",
            ),
            (
                |s| s.handoff = Some(("/s/holder.sock".into(), "/s/mounts/v.handoff".into())),
                " --holder /s/holder.sock --handoff-state /s/mounts/v.handoff",
            ),
        ];
        for (change, tail) in table {
            let mut s = spec();
            change(&mut s);
            assert_eq!(
                strings(s.daemon_args().to_args()).join(" "),
                format!("{base}{tail}")
            );
        }
        // What the starters add: process mode's readiness pipe, an upgrade's standby.
        let mut m = spec().daemon_args();
        m.ready_fd = Some(3);
        assert_eq!(
            strings(m.to_args()).join(" "),
            format!("{base} --ready-fd=3")
        );
        m.ready_fd = None;
        m.standby = true;
        assert_eq!(strings(m.to_args()).join(" "), format!("{base} --standby"));
    }

    /// What the daemon's own parser makes of them: the same spec back.
    #[test]
    fn the_daemon_parses_them() {
        let mut s = spec();
        s.read_only = true;
        s.options = vec!["noatime".into()];
        s.handoff = Some(("/s/holder.sock".into(), "/s/mounts/v.handoff".into()));
        let m = MountArgs::from_args(s.daemon_args().to_args()).unwrap();
        assert_eq!(m, s.daemon_args());
        assert_eq!(m.source, s.source);
        assert_eq!(m.mountpoint, s.mountpoint);
        assert_eq!(m.capacity_bytes, 1024);
        assert_eq!(m.capacity_file.as_deref(), Some(s.capacity_file.as_path()));
        assert!(m.read_only && !m.shared_backend);
        assert_eq!(m.options, vec!["noatime".to_string()]);
        assert_eq!(
            m.holder.as_deref(),
            Some(std::path::Path::new("/s/holder.sock"))
        );
        assert_eq!(
            m.handoff_state.as_deref(),
            Some(std::path::Path::new("/s/mounts/v.handoff"))
        );
    }
}
