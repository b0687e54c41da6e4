//! The command line of `tessera mount`: one pure function, used by both mount modes
//! (a `setsid` child of the agent in process mode, the container's arguments of a
//! mount Pod in pod mode), so that a daemon is started the same way whatever runs it.
//!
//! ```text
//!  DaemonSpec ──mount_args()──▶ ["mount", "--source", S, "--mountpoint", M, …]
//!                                 ├─ supervisor::HostDaemons: Command::args
//!                                 └─ pods::spec: container args (entrypoint: tessera)
//! ```

use std::ffi::OsString;

use super::supervisor::DaemonSpec;

/// The arguments after the program name: `mount --source … --mountpoint … …`.
/// `--mountpoint` is always given as two arguments (`supervisor::is_mount_daemon`
/// recognizes a daemon by it).
pub fn mount_args(spec: &DaemonSpec) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "mount".into(),
        "--source".into(),
        spec.source.clone().into(),
        "--mountpoint".into(),
        spec.mountpoint.clone().into(),
        "--capacity-bytes".into(),
        spec.capacity_bytes.to_string().into(),
        "--capacity-file".into(),
        spec.capacity_file.clone().into(),
        "--counters-file".into(),
        spec.counters_file.clone().into(),
    ];
    if let Some(f) = &spec.settings_file {
        args.extend(["--settings-file".into(), f.clone().into()]);
    }
    if spec.read_only {
        args.push("--read-only".into());
    }
    if spec.shared_backend {
        args.push("--shared-backend".into());
    }
    if !spec.options.is_empty() {
        args.push(format!("--options={}", spec.options.join(",")).into());
    }
    // The /dev/fuse descriptor holder and the handoff state (docs/handoff.md), when
    // the agent runs a holder (process mode today). The state directory is mounted
    // into mount Pods at the same path (pods::spec), so the paths hold in either mode.
    if let Some((holder, state)) = &spec.handoff {
        args.extend([
            "--holder".into(),
            holder.clone().into(),
            "--handoff-state".into(),
            state.clone().into(),
        ]);
    }
    args
}

/// The same arguments as strings (a Pod spec's `args`). The paths come from validated
/// UTF-8 (the MountPod spec and the agent's flags), so nothing is lost.
pub fn mount_args_strings(spec: &DaemonSpec) -> Vec<String> {
    mount_args(spec)
        .into_iter()
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
            handoff: None,
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
            assert_eq!(mount_args_strings(&s).join(" "), format!("{base}{tail}"));
        }
    }

    /// What the daemon's own parser makes of them: the same spec back.
    #[test]
    fn the_daemon_parses_them() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: Cmd,
        }
        #[derive(clap::Subcommand)]
        enum Cmd {
            Mount(crate::fuse::MountArgs),
        }
        let mut s = spec();
        s.read_only = true;
        s.options = vec!["noatime".into()];
        s.handoff = Some(("/s/holder.sock".into(), "/s/mounts/v.handoff".into()));
        let mut argv = vec![OsString::from("tessera")];
        argv.extend(mount_args(&s));
        let Cmd::Mount(m) = Cli::try_parse_from(argv).unwrap().cmd;
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
