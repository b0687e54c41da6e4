//! The mount daemons visible in `/proc` (the agent runs in the host's PID namespace),
//! found by one scan shared by every caller within [`FRESH`]. A burst of starting
//! mounts used to read every process's command line once per waiting mount every
//! 20 ms: with 50 mounts starting on a node that is 2,500 scans of /proc a second, which
//! starved the very kubelet and daemons being waited for. Now the node's /proc is read
//! at most once per [`FRESH`], however many mounts wait.
//!
//! ```text
//!  find(uid, M) ─▶ last scan younger than FRESH? ─no─▶ scan(): every /proc/<pid>/cmdline,
//!       │                                               and for `tessera mount …` ones
//!       │                                               their cgroup and stat
//!       └─▶ pick(): the `tessera mount … --mountpoint M` in a cgroup of the Pod `uid`
//! ```

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_fuse::contract::args::{is_mount_command, is_mount_process};

use crate::supervisor::{Daemon, proc_stat};

/// How old a scan may be and still answer. Also how long a waiter sleeps between
/// looks: looking sooner would only read the same scan.
pub const FRESH: Duration = Duration::from_millis(50);

/// A `tessera mount` process seen in a scan.
#[derive(Debug, Clone)]
struct Seen {
    daemon: Daemon,
    cmdline: Vec<u8>,
    cgroup: String,
}

/// The last scan, shared by the callers of one agent.
pub struct ProcScan {
    fresh: Duration,
    last: Mutex<Option<(Instant, Vec<Seen>)>>,
    scans: AtomicU64,
}

impl Default for ProcScan {
    fn default() -> Self {
        ProcScan::new(FRESH)
    }
}

impl ProcScan {
    /// Scans that answer for `fresh` ([`FRESH`] but in tests).
    pub fn new(fresh: Duration) -> Self {
        ProcScan {
            fresh,
            last: Mutex::new(None),
            scans: AtomicU64::new(0),
        }
    }

    /// The daemon of the Pod `uid` serving `mountpoint`, as the last scan (at most
    /// [`FRESH`] old) saw it. A caller that finds a stale scan makes the next one;
    /// callers meanwhile wait for it and share it.
    pub fn find(&self, uid: &str, mountpoint: &Path) -> Option<Daemon> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= self.fresh)
        {
            let at = Instant::now();
            *last = Some((at, scan()));
            self.scans.fetch_add(1, Ordering::Relaxed);
        }
        last.as_ref()
            .and_then(|(_, seen)| pick(seen, uid, mountpoint))
    }

    /// How many scans of /proc this has made.
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::Relaxed)
    }
}

/// Every live `tessera mount` process in `/proc`.
fn scan() -> Vec<Seen> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut seen = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if !is_mount_process(&cmdline) {
            continue;
        }
        let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if let Some((state, start_ticks)) = proc_stat(pid)
            && state != 'Z'
            && state != 'X'
        {
            seen.push(Seen {
                daemon: Daemon { pid, start_ticks },
                cmdline,
                cgroup,
            });
        }
    }
    seen
}

/// The process of `seen` serving `mountpoint` in a cgroup of the Pod `uid`.
fn pick(seen: &[Seen], uid: &str, mountpoint: &Path) -> Option<Daemon> {
    seen.iter()
        .find(|s| is_mount_command(&s.cmdline, mountpoint) && cgroup_of_pod(&s.cgroup, uid))
        .map(|s| s.daemon)
}

/// Whether a `/proc/<pid>/cgroup` text places the process in the Pod `uid`: the
/// kubelet names a Pod's cgroup `pod<uid>` (cgroupfs driver) or
/// `kubepods-…-pod<uid with _>.slice` (systemd driver).
fn cgroup_of_pod(text: &str, uid: &str) -> bool {
    if uid.is_empty() {
        return false;
    }
    let systemd = uid.replace('-', "_");
    text.lines().any(|l| {
        l.split('/').any(|c| {
            c.strip_prefix("pod") == Some(uid)
                || (c.ends_with(".slice") && c.contains(&format!("pod{systemd}.slice")))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "3f0c7c1e-1b7a-4e6b-9d2d-0a1b2c3d4e5f";

    #[test]
    fn finds_the_pod_in_a_cgroup_path() {
        let table = [
            (
                "0::/kubepods/burstable/pod3f0c7c1e-1b7a-4e6b-9d2d-0a1b2c3d4e5f/abc123\n",
                true,
            ),
            (
                "0::/../../burstable/pod3f0c7c1e-1b7a-4e6b-9d2d-0a1b2c3d4e5f/abc123\n",
                true,
            ),
            (
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f0c7c1e_1b7a_4e6b_9d2d_0a1b2c3d4e5f.slice/cri-containerd-abc.scope\n",
                true,
            ),
            (
                "12:pids:/kubepods/pod3f0c7c1e-1b7a-4e6b-9d2d-0a1b2c3d4e5f/x\n1:name=systemd:/\n",
                true,
            ),
            (
                "0::/kubepods/burstable/pod3f0c7c1e-1b7a-4e6b-9d2d-0a1b2c3d4e5e/abc\n",
                false,
            ),
            ("0::/kubepods/burstable/pod3f0c7c1e/abc\n", false),
            ("0::/\n", false),
        ];
        for (text, want) in table {
            assert_eq!(cgroup_of_pod(text, UID), want, "{text}");
        }
        assert!(!cgroup_of_pod("0::/kubepods/pod/x", ""));
    }

    #[test]
    fn picks_the_mountpoints_daemon_in_the_pods_cgroup() {
        let seen = |pid, mp: &str, pod: &str| Seen {
            daemon: Daemon {
                pid,
                start_ticks: 7,
            },
            cmdline: format!("tessera\0mount\0--mountpoint\0{mp}\0").into_bytes(),
            cgroup: format!("0::/kubepods/burstable/pod{pod}/c\n"),
        };
        let other = "00000000-0000-0000-0000-000000000000";
        let all = [
            seen(10, "/m/v", other),
            seen(11, "/m/w", UID),
            seen(12, "/m/v", UID),
        ];
        let found = |uid, mp: &str| pick(&all, uid, Path::new(mp)).map(|d| d.pid);
        assert_eq!(found(UID, "/m/v"), Some(12));
        assert_eq!(found(other, "/m/v"), Some(10));
        assert_eq!(found(UID, "/m/w"), Some(11));
        assert_eq!(found(other, "/m/w"), None);
        assert_eq!(found(UID, "/m/x"), None);
    }

    /// A process whose command line reads `… mount --mountpoint M` (a shell reading
    /// the script named `mount`) is seen by the scan; callers within FRESH share
    /// one scan.
    #[test]
    fn a_scan_sees_a_mount_process_and_is_shared() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mount"), "sleep 30\n").unwrap();
        let mp = dir.path().join("mnt");
        let mut child = std::process::Command::new("/bin/sh")
            .arg0("tessera")
            .arg("mount")
            .arg("--mountpoint")
            .arg(&mp)
            .current_dir(dir.path())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start_ticks = crate::supervisor::proc_start_ticks(pid).unwrap();
        let seen = (0..100)
            .find_map(|_| {
                let s = scan();
                let me = s.into_iter().find(|s| s.daemon.pid == pid);
                if me.is_none() {
                    std::thread::sleep(Duration::from_millis(10));
                }
                me
            })
            .expect("the scan sees the mount process");
        assert_eq!(seen.daemon.start_ticks, start_ticks);
        assert!(is_mount_command(&seen.cmdline, &mp));
        assert!(!seen.cgroup.is_empty());

        // Not in a Pod's cgroup: found by nobody, but scanned.
        let shared = ProcScan::new(Duration::from_secs(3600));
        for _ in 0..10 {
            assert_eq!(shared.find(UID, &mp), None);
        }
        assert_eq!(shared.scans(), 1, "ten looks within `fresh`, one scan");
        let stale = ProcScan::new(Duration::ZERO);
        for _ in 0..3 {
            assert_eq!(stale.find(UID, &mp), None);
        }
        assert_eq!(stale.scans(), 3, "a stale scan is made again");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
