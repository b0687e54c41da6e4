//! Real `tessera mount` daemons for the FUSE tests.
//!
//! [`Mount::builder`] lays out a private temporary directory (`backend/volume/` the
//! volume, `mnt/` the mount point, the capacity file and the daemon's log), starts the
//! release-or-debug `tessera` binary Cargo built for this test run, and waits until the
//! mount answers. Dropping a [`Mount`] always unmounts: SIGTERM, then a lazy unmount
//! and SIGKILL if the daemon does not go, so a failing (panicking) test never leaves a
//! mount behind. Every test gets its own directories, so tests run in parallel.
//!
//! The tests need root and `/dev/fuse`, like the daemon in production.
//!
//! **Quota mode.** Daemons run with `--quota=daemon` unless a test asks otherwise
//! ([`Builder::quota`]), so the tests of the daemon's own quota and I/O modes do not
//! change meaning with the filesystem `/tmp` is on. With `TESSERA_TEST_BACKEND_ROOT`
//! set to a directory on an XFS filesystem mounted with `prjquota`, volumes are made
//! there instead and daemons run with `--quota=backend`: that runs the mode-agnostic
//! suites (`posix`, `security`, `readonly`) over a backend-enforced quota, with
//! passthrough for writable opens.

#![allow(dead_code)]

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// statfs `f_type` of a FUSE mount.
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Fills the volume directory before the mount.
type Prepare = Box<dyn FnOnce(&Path)>;

/// How to start a daemon.
pub struct Builder {
    capacity: u64,
    capacity_file: Option<u64>,
    read_only: bool,
    args: Vec<String>,
    prepare: Option<Prepare>,
    source: Option<PathBuf>,
    quota: Option<String>,
    nofile: Option<u64>,
    envs: Vec<(String, String)>,
}

impl Builder {
    /// An environment variable of this daemon only (not of a successor started by
    /// [`Mount::respawn`]): the test-only fault points.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Quota in bytes (`--capacity-bytes`).
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }

    /// Also write `bytes` to a capacity file and pass `--capacity-file`.
    pub fn capacity_file(mut self, bytes: u64) -> Self {
        self.capacity_file = Some(bytes);
        self
    }

    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Extra command-line arguments of `tessera mount`.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }

    /// Serve this existing directory instead of a fresh one in the temporary
    /// directory (e.g. one on a filesystem the test set up, or a volume mounted
    /// before).
    pub fn source(mut self, dir: &Path) -> Self {
        self.source = Some(dir.to_owned());
        self
    }

    /// `--quota` (default: `daemon`, or `backend` under `TESSERA_TEST_BACKEND_ROOT`).
    pub fn quota(mut self, mode: &str) -> Self {
        self.quota = Some(mode.to_owned());
        self
    }

    /// Start the daemon with `RLIMIT_NOFILE` at `limit`, soft and hard (the daemon
    /// raises its soft limit to the hard one).
    pub fn nofile(mut self, limit: u64) -> Self {
        self.nofile = Some(limit);
        self
    }

    /// Fill the volume directory before mounting.
    pub fn prepare(mut self, f: impl FnOnce(&Path) + 'static) -> Self {
        self.prepare = Some(Box::new(f));
        self
    }

    pub fn mount(self) -> Mount {
        require_root();
        let dir = tempfile::Builder::new()
            .prefix("tessera-fuse-")
            .tempdir()
            .expect("tempdir");
        // Like production: the volume is one directory of a backend root shared with
        // other volumes, and the mount point is elsewhere.
        let backend_root = std::env::var_os("TESSERA_TEST_BACKEND_ROOT").map(PathBuf::from);
        let quota = self.quota.unwrap_or_else(|| {
            if backend_root.is_some() {
                "backend"
            } else {
                "daemon"
            }
            .to_owned()
        });
        let source = self.source.unwrap_or_else(|| match &backend_root {
            Some(root) => tempfile::Builder::new()
                .prefix("volume-")
                .tempdir_in(root)
                .expect("volume dir in TESSERA_TEST_BACKEND_ROOT")
                .keep(),
            None => dir.path().join("backend").join("volume"),
        });
        let mnt = dir.path().join("mnt");
        fs::create_dir_all(&source).unwrap();
        fs::create_dir(&mnt).unwrap();
        if let Some(prepare) = self.prepare {
            prepare(&source);
        }
        let capacity_file = dir.path().join("capacity");
        let log = dir.path().join("daemon.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.arg("mount")
            .arg("--source")
            .arg(&source)
            .arg("--mountpoint")
            .arg(&mnt)
            .arg("--capacity-bytes")
            .arg(self.capacity.to_string())
            .arg(format!("--quota={quota}"));
        if let Some(bytes) = self.capacity_file {
            fs::write(&capacity_file, bytes.to_string()).unwrap();
            cmd.arg("--capacity-file").arg(&capacity_file);
        }
        if self.read_only {
            cmd.arg("--read-only");
        }
        if let Some(limit) = self.nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::last_os_error())
                    }
                });
            }
        }
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        let argv = cmd.get_args().map(|a| a.to_owned()).collect();
        let child = cmd.spawn().expect("spawn tessera mount");
        let mut m = Mount {
            argv,
            source,
            mnt,
            capacity_file,
            log,
            child: Some(child),
            dir,
        };
        m.wait_mounted();
        m
    }
}

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the FUSE tests mount real filesystems and must run as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "the FUSE tests need /dev/fuse"
    );
}

/// A running `tessera mount`.
pub struct Mount {
    /// The daemon's command line, to start a successor with.
    argv: Vec<std::ffi::OsString>,
    pub source: PathBuf,
    pub mnt: PathBuf,
    pub capacity_file: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    // Last: removed after the unmount in Drop.
    dir: tempfile::TempDir,
}

pub fn statfs_type(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: valid C string and output buffer.
    if unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statfs succeeded.
    #[allow(clippy::unnecessary_cast)]
    Ok(unsafe { st.assume_init() }.f_type as i64)
}

impl Mount {
    pub fn builder() -> Builder {
        Builder {
            capacity: 1 << 30,
            capacity_file: None,
            read_only: false,
            args: Vec::new(),
            prepare: None,
            source: None,
            quota: None,
            nofile: None,
            envs: Vec::new(),
        }
    }

    /// A read-write mount with a 1 GiB quota.
    pub fn new() -> Mount {
        Self::builder().mount()
    }

    /// `rel` under the mount point.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// `rel` under the volume directory (behind the mount).
    pub fn backing(&self, rel: &str) -> PathBuf {
        self.source.join(rel)
    }

    /// The temporary directory holding source and mount point.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    pub fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal the daemon");
    }

    /// `kill -9` the daemon and reap it; the mount stays (dead, or held).
    pub fn kill_daemon(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start a daemon with the same command line (a successor), its log appended to
    /// the first one's, without waiting for anything.
    pub fn respawn(&mut self) {
        self.respawn_with(&[]);
    }

    /// [`Self::respawn`] with these environment variables (fault points).
    pub fn respawn_with(&mut self, envs: &[(&str, &str)]) {
        assert!(self.child.is_none(), "the daemon still runs");
        let log = fs::OpenOptions::new().append(true).open(&self.log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(&self.argv)
            .envs(envs.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the successor");
        self.child = Some(child);
    }

    /// Another daemon with the same arguments and `extra`, beside the running one
    /// (logging to the same file); [`Mount::adopt`] makes it the mount's daemon.
    pub fn spawn_beside(&self, extra: &[&str]) -> Child {
        let log = fs::OpenOptions::new().append(true).open(&self.log).unwrap();
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(&self.argv)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn a daemon beside")
    }

    /// Make `child` (from [`Mount::spawn_beside`]) the daemon of this mount.
    pub fn adopt(&mut self, child: Child) {
        assert!(self.child.is_none(), "the daemon still runs");
        self.child = Some(child);
    }

    /// What the daemon has logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_mounted(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "tessera mount exited ({status}) before mounting:\n{}",
                    self.log()
                );
            }
            if statfs_type(&self.mnt).ok() == Some(FUSE_SUPER_MAGIC) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the mount did not come up in time:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait up to `timeout` for the daemon to exit; its exit status, or None if it
    /// still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Unmount with SIGTERM and wait for the daemon to exit; returns its log.
    pub fn stop(&mut self) -> String {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(
                        status.success(),
                        "tessera mount failed: {status}\n{}",
                        self.log()
                    );
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("tessera mount did not stop on SIGTERM:\n{}", self.log());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        assert_ne!(
            statfs_type(&self.mnt).ok(),
            Some(FUSE_SUPER_MAGIC),
            "still mounted after the daemon exited"
        );
        self.log()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Never panic here: this also runs while a failed test unwinds.
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Ok(None) = child.try_wait() {
                let _ = nix::mount::umount2(&self.mnt, nix::mount::MntFlags::MNT_DETACH);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if statfs_type(&self.mnt).ok() == Some(FUSE_SUPER_MAGIC) {
            let _ = nix::mount::umount2(&self.mnt, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The counters of the daemon's "unmounted" log line.
pub fn counters(log: &str) -> std::collections::HashMap<String, u64> {
    let line = log
        .lines()
        .rfind(|l| l.contains(" unmounted "))
        .unwrap_or_else(|| panic!("no unmounted line in:\n{log}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        .collect()
}

/// The errno of a failed std call.
pub fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// Run `f` and return the errno of its failure, or 0.
pub fn errno_of<T>(r: io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => errno(&e),
    }
}

/// A reproducible byte stream (xorshift64*), to write and verify large files.
pub struct Pattern(u64);

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Pattern(seed | 1)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// FNV-1a, 64 bits: a checksum without extra dependencies.
pub fn fnv1a(mut hash: u64, data: &[u8]) -> u64 {
    for &b in data {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Checksum of a whole file, read in 1 MiB chunks.
pub fn checksum_file(path: &Path) -> io::Result<(u64, u64)> {
    use std::io::Read;
    let mut f = fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut hash, mut len) = (FNV_OFFSET, 0u64);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok((hash, len));
        }
        hash = fnv1a(hash, &buf[..n]);
        len += n as u64;
    }
}

/// `statvfs` of a path.
pub fn statvfs(path: &Path) -> nix::sys::statvfs::Statvfs {
    nix::sys::statvfs::statvfs(path).expect("statvfs")
}

/// Run a shell command as `uid:gid` (supplementary groups dropped); returns success.
pub fn sh_as(uid: u32, gid: u32, script: &str) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(uid)
        .gid(gid)
        .output()
        .expect("run sh")
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `renameat2(2)` with flags.
pub fn rename2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (f, t) = (cstr(from), cstr(to));
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub fn setxattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    // SAFETY: valid C strings and value buffer.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub fn getxattr(path: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and output buffer.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

pub fn listxattr(path: &Path) -> io::Result<Vec<String>> {
    let p = cstr(path);
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C string and output buffer.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(buf[..r as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect())
}

pub fn removexattr(path: &Path, name: &str) -> io::Result<()> {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    // SAFETY: valid C strings.
    if unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
