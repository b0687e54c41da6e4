//! The mount table and the mount syscalls the node agent and the CSI Node service
//! need, behind [`Mounts`].
//!
//! They only ever ask four things of the kernel: what is
//! mounted where ([`Mounts::table`], from `/proc/self/mountinfo`), bind a path onto
//! another ([`Mounts::bind`]; below the kubelet directory only through file
//! descriptors, [`Mounts::bind_beneath`]), detach a mount lazily
//! ([`Mounts::unmount_lazy`], [`Mounts::unmount_beneath`]) and whether a mount point
//! answers ([`Mounts::probe`]). [`HostMounts`] does them for
//! real (root needed for the first three); unit tests substitute an in-memory table.
//!
//! A probe is a `stat` and a `statfs` of the mount point. Against a hung FUSE daemon
//! both block in the kernel for as long as the daemon does not answer, so the probe
//! runs on a thread of its own and the caller waits at most the given timeout. While
//! a probe of a path is under way, a new probe of the same path starts no thread: it
//! shares the result of the one under way (the agent's health loop and a reconcile
//! probe the same mount at once, and a busy daemon is not a hung one), or, once that
//! one has been stuck longer than the new caller's timeout, reports
//! [`Probe::TimedOut`] at once, so a hung mount costs one thread, not one per health
//! check.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

use super::paths::PathError;

/// A mount syscall that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `mount(2)` with `MS_BIND` failed.
    #[error("bind-mounting {from} onto {target}: {errno}")]
    Bind {
        /// What was bound.
        from: PathBuf,
        /// Where.
        target: PathBuf,
        /// Why not.
        errno: Errno,
    },
    /// Remounting a bind mount read-only failed.
    #[error("remounting {target} read-only: {errno}")]
    RemountReadOnly {
        /// The bind mount.
        target: PathBuf,
        /// Why not.
        errno: Errno,
    },
    /// `umount2(2)` failed.
    #[error("unmounting {target}: {errno}")]
    Unmount {
        /// The mount point.
        target: PathBuf,
        /// Why not.
        errno: Errno,
    },
    /// A target path is refused.
    #[error(transparent)]
    Refused(#[from] PathError),
    /// A path below the kubelet directory could not be resolved or created beneath it
    /// (a symlink on the way, a path leaving it, …), or the mount by fd failed.
    #[error("{action} {target}: {errno}")]
    Beneath {
        /// What was being done.
        action: &'static str,
        /// The path.
        target: PathBuf,
        /// Why not.
        errno: Errno,
    },
    /// `/proc/self/mountinfo` could not be read.
    #[error("reading /proc/self/mountinfo")]
    MountInfo(#[source] std::io::Error),
    /// A FUSE mount made by the agent (`/dev/fuse`, then `mount(2)`) failed.
    #[error("mounting FUSE at {target} ({step}): {errno}")]
    Fuse {
        /// The mount point.
        target: PathBuf,
        /// Which step failed.
        step: &'static str,
        /// Why not.
        errno: Errno,
    },
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Unique id of the mount (changes when something is remounted).
    pub mount_id: u64,
    /// Id of the parent mount.
    pub parent_id: u64,
    /// `major:minor` of the filesystem (a bind shares it with what it binds).
    pub dev: String,
    /// The directory of the source filesystem that is mounted (`/` for a whole fs).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `ro`, `nosuid`, …).
    pub options: String,
    /// Filesystem type (`fuse.tessera`, `ext4`, …).
    pub fs_type: String,
    /// Filesystem-specific source.
    pub source: String,
}

impl MountInfo {
    /// Whether the mount is read-only.
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// What a probe of a mount point found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Something is mounted there (its device differs from the parent's) and it
    /// answered `stat` and `statfs`.
    Answers {
        /// Device of the mount.
        dev: u64,
        /// Inode of its root (1 for a FUSE filesystem).
        ino: u64,
    },
    /// The directory exists but nothing is mounted on it.
    NotMounted,
    /// The path does not exist.
    Missing,
    /// The mount is there but broken: `ENOTCONN` (the daemon is gone), `ENXIO`, …
    Broken(Errno),
    /// No answer within the timeout (a hung daemon).
    TimedOut,
}

/// The kernel's mount operations, as the agent uses them.
pub trait Mounts: Send + Sync {
    /// The mount table of the agent's mount namespace, in mount order.
    fn table(&self) -> Result<Vec<MountInfo>, Error>;
    /// Bind `source` onto `target` (an existing directory); then, if `read_only`,
    /// remount the bind read-only.
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), Error>;
    /// Detach the top mount on `target` (`umount2(MNT_DETACH)`). `Ok(false)` when
    /// nothing is mounted there (or the path does not exist).
    fn unmount_lazy(&self, target: &Path) -> Result<bool, Error>;
    /// Whether a mount on `path` answers, waiting at most `timeout`.
    fn probe(&self, path: &Path, timeout: Duration) -> Probe;

    /// Mount a FUSE filesystem on `mountpoint` (an existing directory) on a new
    /// `/dev/fuse` connection, and return the connection's descriptor, which nobody
    /// serves yet: requests wait (killably) until a daemon answers its INIT. `data`
    /// makes the FUSE options from the descriptor's number and the mount point's mode.
    /// Unsupported (ENOSYS) by default: in-memory tables have no kernel.
    fn mount_fuse(
        &self,
        mountpoint: &Path,
        source: &str,
        flags: MsFlags,
        data: &dyn Fn(i32, u32) -> String,
    ) -> Result<OwnedFd, Error> {
        let _ = (source, flags, data);
        Err(Error::Fuse {
            target: mountpoint.to_path_buf(),
            step: "mount",
            errno: Errno::ENOSYS,
        })
    }

    /// The mounts whose mount point is `path`, bottom first.
    fn mounts_at(&self, path: &Path) -> Result<Vec<MountInfo>, Error> {
        Ok(self
            .table()?
            .into_iter()
            .filter(|m| m.mount_point == path)
            .collect())
    }

    /// Create `target` (a directory strictly under `dir`) and bind `source` onto it,
    /// with no symlink anywhere below `dir` and nothing outside it, even while someone
    /// swaps the directories on the way. [`HostMounts`] resolves and mounts through
    /// file descriptors; this default, for in-memory tables, checks the names and
    /// calls [`Mounts::bind`].
    fn bind_beneath(
        &self,
        source: &Path,
        dir: &Path,
        target: &Path,
        read_only: bool,
    ) -> Result<(), Error> {
        super::paths::under_without_symlinks(&target.to_string_lossy(), dir)?;
        std::fs::create_dir_all(target).map_err(|e| Error::Beneath {
            action: "creating",
            target: target.to_path_buf(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        self.bind(source, target, read_only)
    }

    /// Detach every mount stacked on `target` (strictly under `dir`, reached with no
    /// symlink), at most `limit`. Returns how many were detached. [`HostMounts`]
    /// resolves the target through file descriptors each time and unmounts by fd.
    fn unmount_beneath(&self, dir: &Path, target: &Path, limit: usize) -> Result<usize, Error> {
        super::paths::under_without_symlinks(&target.to_string_lossy(), dir)?;
        self.unmount_all_lazy(target, limit)
    }

    /// Detach every mount stacked on `path` (at most `limit`, against loops).
    /// Returns how many were detached.
    fn unmount_all_lazy(&self, path: &Path, limit: usize) -> Result<usize, Error> {
        let mut n = 0;
        while n < limit && self.unmount_lazy(path)? {
            n += 1;
        }
        Ok(n)
    }
}

/// The real mount table and syscalls of this host (mount namespace).
#[derive(Default)]
pub struct HostMounts {
    /// Probes whose thread has not come back yet, by path.
    probes: Arc<Mutex<HashMap<PathBuf, Arc<InFlight>>>>,
}

/// A probe under way: when it started, and its result once its thread comes back.
struct InFlight {
    started: Instant,
    result: Mutex<Option<Probe>>,
    done: Condvar,
}

impl InFlight {
    fn new(started: Instant) -> Self {
        InFlight {
            started,
            result: Mutex::new(None),
            done: Condvar::new(),
        }
    }

    /// Its result, waiting until `timeout` after it started; TimedOut if it has none
    /// by then.
    fn wait(&self, timeout: Duration) -> Probe {
        let left = timeout.saturating_sub(self.started.elapsed());
        let result = self.result.lock().unwrap_or_else(|e| e.into_inner());
        let (result, _) = self
            .done
            .wait_timeout_while(result, left, |r| r.is_none())
            .unwrap_or_else(|e| e.into_inner());
        result.unwrap_or(Probe::TimedOut)
    }
}

impl HostMounts {
    /// A new handle.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Mounts for HostMounts {
    fn table(&self) -> Result<Vec<MountInfo>, Error> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").map_err(Error::MountInfo)?;
        Ok(parse_mountinfo(&text))
    }

    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), Error> {
        nix::mount::mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|errno| Error::Bind {
            from: source.to_path_buf(),
            target: target.to_path_buf(),
            errno,
        })?;
        if read_only {
            let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
            if let Err(errno) =
                nix::mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
            {
                // Never leave a writable bind where a read-only one was asked for.
                let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
                return Err(Error::RemountReadOnly {
                    target: target.to_path_buf(),
                    errno,
                });
            }
        }
        Ok(())
    }

    fn mount_fuse(
        &self,
        mountpoint: &Path,
        source: &str,
        flags: MsFlags,
        data: &dyn Fn(i32, u32) -> String,
    ) -> Result<OwnedFd, Error> {
        let fail = |step, errno| Error::Fuse {
            target: mountpoint.to_path_buf(),
            step,
            errno,
        };
        let errno = |e: std::io::Error| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
        let mode = std::fs::metadata(mountpoint)
            .map_err(|e| fail("reading the mount point", errno(e)))?
            .mode();
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|e| fail("opening /dev/fuse", errno(e)))?;
        let fd = OwnedFd::from(dev);
        let data = data(fd.as_raw_fd(), mode);
        nix::mount::mount(
            Some(source),
            mountpoint,
            Some("fuse"),
            flags,
            Some(data.as_str()),
        )
        .map_err(|e| fail("mount(2)", e))?;
        Ok(fd)
    }

    fn bind_beneath(
        &self,
        source: &Path,
        dir: &Path,
        target: &Path,
        read_only: bool,
    ) -> Result<(), Error> {
        let rel = super::paths::under(&target.to_string_lossy(), dir)?;
        let rel = rel.strip_prefix(dir).expect("under() checked it");
        let fail = |action, errno| Error::Beneath {
            action,
            target: target.to_path_buf(),
            errno,
        };
        let target_fd = super::beneath::open_creating(dir, rel)
            .map_err(|errno| fail("resolving beneath the kubelet directory", errno))?;
        super::beneath::bind_onto(source, &target_fd, read_only)
            .map_err(|errno| fail("binding onto", errno))
    }

    fn unmount_beneath(&self, dir: &Path, target: &Path, limit: usize) -> Result<usize, Error> {
        let rel = super::paths::under(&target.to_string_lossy(), dir)?;
        let rel = rel.strip_prefix(dir).expect("under() checked it");
        let mut n = 0;
        while n < limit {
            let fd = match super::beneath::open(dir, rel) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => break,
                Err(errno) => {
                    return Err(Error::Beneath {
                        action: "resolving beneath the kubelet directory",
                        target: target.to_path_buf(),
                        errno,
                    });
                }
            };
            match super::beneath::unmount_fd(&fd) {
                Ok(()) => n += 1,
                Err(Errno::EINVAL) => break,
                Err(errno) => {
                    return Err(Error::Unmount {
                        target: target.to_path_buf(),
                        errno,
                    });
                }
            }
        }
        Ok(n)
    }

    fn unmount_lazy(&self, target: &Path) -> Result<bool, Error> {
        match nix::mount::umount2(target, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => Ok(true),
            Err(Errno::EINVAL | Errno::ENOENT) => Ok(false),
            Err(errno) => Err(Error::Unmount {
                target: target.to_path_buf(),
                errno,
            }),
        }
    }

    fn probe(&self, path: &Path, timeout: Duration) -> Probe {
        let flight = {
            let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(under_way) = probes.get(path) {
                under_way.clone()
            } else {
                let flight = Arc::new(InFlight::new(Instant::now()));
                probes.insert(path.to_path_buf(), flight.clone());
                let (table, mine, owned) =
                    (self.probes.clone(), flight.clone(), path.to_path_buf());
                let spawned = std::thread::Builder::new()
                    .name("mount-probe".into())
                    .spawn(move || {
                        let result = probe_blocking(&owned);
                        table
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&owned);
                        *mine.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                        mine.done.notify_all();
                    });
                if spawned.is_err() {
                    probes.remove(path);
                    return Probe::TimedOut;
                }
                flight
            }
        };
        flight.wait(timeout)
    }
}

/// `stat` + `statfs` of `path`, compared with its parent. Blocks as long as a FUSE
/// daemon does.
pub fn probe_blocking(path: &Path) -> Probe {
    let st = match nix::sys::stat::stat(path) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Probe::Missing,
        Err(errno) => return Probe::Broken(errno),
    };
    let parent_dev = path
        .parent()
        .and_then(|p| nix::sys::stat::stat(p).ok())
        .map(|p| p.st_dev);
    if parent_dev == Some(st.st_dev) {
        return Probe::NotMounted;
    }
    // `stat` of a FUSE root may be served from the attribute cache; `statfs` is a
    // round trip to the daemon.
    match nix::sys::statfs::statfs(path) {
        Ok(_) | Err(Errno::ENOSYS) => Probe::Answers {
            dev: st.st_dev,
            ino: st.st_ino,
        },
        Err(errno) => Probe::Broken(errno),
    }
}

/// Parse `/proc/<pid>/mountinfo` (see proc(5)). Lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountInfo> {
    // 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let mount_id = l.next()?.parse().ok()?;
    let parent_id = l.next()?.parse().ok()?;
    let dev = l.next()?.to_string();
    let root = unescape(l.next()?);
    let mount_point = unescape(l.next()?);
    let options = l.next()?.to_string();
    let mut r = right.split(' ');
    let fs_type = r.next()?.to_string();
    let source = unescape(r.next().unwrap_or(""))
        .to_string_lossy()
        .into_owned();
    Some(MountInfo {
        mount_id,
        parent_id,
        dev,
        root,
        mount_point,
        options,
        fs_type,
        source,
    })
}

/// Undo the octal escapes mountinfo uses for space, tab, newline and backslash.
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_lines() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:45 / /var/lib/tessera/mounts/v\\040one rw,nosuid,nodev,relatime shared:2 - fuse.tessera tessera rw,user_id=0
37 22 8:1 /var/lib/tessera/mounts/v\\040one /var/lib/kubelet/pods/x/vol ro,relatime - fuse.tessera tessera rw
garbage
";
        let t = parse_mountinfo(text);
        assert_eq!(t.len(), 3);
        assert_eq!(t[1].mount_id, 36);
        assert_eq!(t[1].parent_id, 22);
        assert_eq!(t[1].dev, "0:45");
        assert_eq!(
            t[1].mount_point,
            PathBuf::from("/var/lib/tessera/mounts/v one")
        );
        assert_eq!(t[1].fs_type, "fuse.tessera");
        assert!(!t[1].read_only());
        assert!(t[2].read_only());
        assert_eq!(t[2].root, PathBuf::from("/var/lib/tessera/mounts/v one"));
    }

    #[test]
    fn reads_this_process_table() {
        let t = HostMounts::new().table().unwrap();
        assert!(t.iter().any(|m| m.mount_point == Path::new("/")));
    }

    /// Two callers probing one mount at once (the agent's health loop and a
    /// reconcile) share the probe under way: neither reads the other's as a hung
    /// mount (which made a restarted agent re-bind a pod's target under it, and
    /// would replace a healthy daemon older than the start timeout).
    #[test]
    fn a_probe_under_way_is_shared_not_timed_out() {
        let dir = tempfile::tempdir().unwrap();
        let m = HostMounts::new();
        let flight = Arc::new(InFlight::new(Instant::now()));
        m.probes
            .lock()
            .unwrap()
            .insert(dir.path().to_path_buf(), flight.clone());
        let answer = Probe::Answers { dev: 7, ino: 1 };
        let answering = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            *flight.result.lock().unwrap() = Some(answer);
            flight.done.notify_all();
        });
        let asked = Instant::now();
        assert_eq!(m.probe(dir.path(), Duration::from_secs(5)), answer);
        assert!(asked.elapsed() >= Duration::from_millis(150));
        answering.join().unwrap();
    }

    /// A probe stuck for longer than the caller's timeout: TimedOut at once, and no
    /// second thread.
    #[test]
    fn a_probe_stuck_longer_than_the_timeout_times_out_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let m = HostMounts::new();
        let started = Instant::now().checked_sub(Duration::from_secs(3)).unwrap();
        let flight = Arc::new(InFlight::new(started));
        m.probes
            .lock()
            .unwrap()
            .insert(dir.path().to_path_buf(), flight.clone());
        let asked = Instant::now();
        assert_eq!(m.probe(dir.path(), Duration::from_secs(2)), Probe::TimedOut);
        assert!(asked.elapsed() < Duration::from_millis(500));
        assert!(Arc::ptr_eq(&m.probes.lock().unwrap()[dir.path()], &flight));
    }

    #[test]
    fn probes_plain_directories() {
        let dir = tempfile::tempdir().unwrap();
        let m = HostMounts::new();
        assert_eq!(
            m.probe(dir.path(), Duration::from_secs(5)),
            Probe::NotMounted
        );
        assert_eq!(
            m.probe(&dir.path().join("nope"), Duration::from_secs(5)),
            Probe::Missing
        );
        assert!(matches!(
            m.probe(Path::new("/proc"), Duration::from_secs(5)),
            Probe::Answers { .. }
        ));
    }

    #[test]
    fn unmounting_a_plain_directory_is_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        let m = HostMounts::new();
        // EINVAL (not a mount point) as root, EPERM otherwise.
        match m.unmount_lazy(dir.path()) {
            Ok(false) => {}
            Err(Error::Unmount {
                errno: Errno::EPERM,
                ..
            }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}
