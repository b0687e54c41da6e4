//! What a volume's FUSE mount asks of the kernel, decided once from the daemon's
//! command line: the daemon's own mount (through fuser) and the node agent's
//! (`mount(2)` with `fd=N`, the daemon then serving the descriptor it is given) are
//! made from the same [`Plan`], so both give the kernel the same flags and options.
//!
//! ```text
//!  --source, --read-only, --options ──plan()──▶ Plan { fsname, read_only, devices, options }
//!     daemon: Plan ─▶ fuser MountOptions ─▶ Session::new (mounts)
//!     agent:  Plan ─▶ flags() + data(fd, rootmode) ─▶ mount(2) "fuse" ─▶ fd to the holder
//! ```
//!
//! Always: `default_permissions` (the kernel checks mode bits), `allow_other` (Pods
//! run as any uid), `nosuid` and `nodev` unless asked otherwise. Refused: options
//! that need the setuid `fusermount3` helper (`auto_unmount`, `allow_root`) and the
//! two names Tessera sets itself (`fsname=`, `subtype=`).

use std::path::Path;

use nix::mount::MsFlags;

/// An option of `--options` the mount cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mount option {0:?} is not supported")]
pub struct BadOption(pub String);

/// One accepted option, beside the ones always set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opt {
    Exec,
    NoExec,
    Suid,
    NoSuid,
    Dev,
    NoDev,
    Atime,
    NoAtime,
    Sync,
    Async,
    DirSync,
    /// Passed to the kernel as it is (`max_read=…`, `context=…`, …).
    Custom(String),
}

/// The mount of one volume, as the kernel is to see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The mount's source in the mount table (the volume's directory).
    pub fsname: String,
    pub read_only: bool,
    /// Device files are honoured (`dev` asked for).
    pub devices: bool,
    /// The accepted options, in the order given, each once.
    pub options: Vec<Opt>,
}

/// The plan for a daemon started with `source`, `read_only` and `options`.
pub fn plan(source: &Path, read_only: bool, options: &[String]) -> Result<Plan, BadOption> {
    let mut plan = Plan {
        fsname: source.display().to_string(),
        read_only,
        devices: false,
        options: Vec::new(),
    };
    for o in options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let opt = match o {
            "ro" => {
                plan.read_only = true;
                continue;
            }
            "rw" => continue,
            "exec" => Opt::Exec,
            "noexec" => Opt::NoExec,
            "suid" => Opt::Suid,
            "nosuid" => Opt::NoSuid,
            "dev" => {
                plan.devices = true;
                Opt::Dev
            }
            "nodev" => {
                plan.devices = false;
                Opt::NoDev
            }
            "atime" => Opt::Atime,
            "noatime" => Opt::NoAtime,
            "sync" => Opt::Sync,
            "async" => Opt::Async,
            "dirsync" => Opt::DirSync,
            // Always on: pods run as any uid, and the kernel checks permissions.
            "allow_other" | "default_permissions" => continue,
            // Needs the setuid fusermount helper, which Tessera never uses.
            "auto_unmount" | "allow_root" => return Err(BadOption(o.to_owned())),
            _ if o.starts_with("fsname=") || o.starts_with("subtype=") => {
                return Err(BadOption(o.to_owned()));
            }
            other => Opt::Custom(other.to_owned()),
        };
        if !plan.options.contains(&opt) {
            plan.options.push(opt);
        }
    }
    Ok(plan)
}

impl Plan {
    /// The `mount(2)` flags, as fuser sets them for the daemon's own mount: `nodev`
    /// and `nosuid` unless `dev`/`suid` was asked, then each flag option.
    pub fn flags(&self) -> MsFlags {
        let mut flags = MsFlags::empty();
        if !self.options.contains(&Opt::Dev) {
            flags |= MsFlags::MS_NODEV;
        }
        if !self.options.contains(&Opt::Suid) {
            flags |= MsFlags::MS_NOSUID;
        }
        for o in &self.options {
            flags |= match o {
                Opt::NoExec => MsFlags::MS_NOEXEC,
                Opt::NoSuid => MsFlags::MS_NOSUID,
                Opt::NoDev => MsFlags::MS_NODEV,
                Opt::NoAtime => MsFlags::MS_NOATIME,
                Opt::Sync => MsFlags::MS_SYNCHRONOUS,
                Opt::DirSync => MsFlags::MS_DIRSYNC,
                _ => MsFlags::empty(),
            };
        }
        if self.read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        flags
    }

    /// The options the kernel's FUSE parses (`mount(2)`'s data), for the connection
    /// `fd` and a mount point of mode `rootmode` (file type bits included).
    pub fn data(&self, fd: i32, rootmode: u32) -> String {
        let mut data = format!("fd={fd},rootmode={rootmode:o},user_id=0,group_id=0");
        for o in &self.options {
            if let Opt::Custom(c) = o {
                data.push(',');
                data.push_str(c);
            }
        }
        data.push_str(",default_permissions,allow_other");
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_defaults_are_nosuid_nodev_allow_other_default_permissions() {
        let p = plan(Path::new("/srv/v"), false, &[]).unwrap();
        assert_eq!(p.flags(), MsFlags::MS_NOSUID | MsFlags::MS_NODEV);
        assert_eq!(
            p.data(7, 0o40755),
            "fd=7,rootmode=40755,user_id=0,group_id=0,default_permissions,allow_other"
        );
        assert_eq!(p.fsname, "/srv/v");
    }

    #[test]
    fn options_become_flags_or_kernel_options() {
        let p = plan(
            Path::new("/srv/v"),
            false,
            &opts(&[
                "suid",
                "dev",
                "noexec",
                "ro",
                "noatime",
                "max_read=131072",
                "",
            ]),
        )
        .unwrap();
        assert!(p.read_only && p.devices);
        assert_eq!(
            p.flags(),
            MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME | MsFlags::MS_RDONLY
        );
        assert!(p.data(3, 0o40700).contains(",max_read=131072,"));
    }

    #[test]
    fn what_needs_fusermount_or_is_tesseras_own_is_refused() {
        for bad in ["auto_unmount", "allow_root", "fsname=x", "subtype=y"] {
            assert_eq!(
                plan(Path::new("/s"), false, &opts(&[bad])),
                Err(BadOption(bad.into()))
            );
        }
        // Always on anyway: accepted, not repeated.
        let p = plan(Path::new("/s"), false, &opts(&["allow_other", "rw"])).unwrap();
        assert!(p.options.is_empty());
    }

    #[test]
    fn a_context_is_passed_to_the_kernel() {
        let ctx = "context=\"system_u:object_r:container_file_t:s0:c1,c2\"";
        let p = plan(Path::new("/s"), false, &opts(&[ctx])).unwrap();
        assert_eq!(p.options, vec![Opt::Custom(ctx.into())]);
        assert!(p.data(3, 0o40755).contains(ctx));
    }
}
