//! Locks that cross mounts: two `tessera mount`s of one backend directory (two nodes
//! of a ReadWriteMany volume) must see each other's `flock` and `fcntl` locks, as two
//! bind mounts of the same directory do. Every check runs on both pairs, the bind
//! mounts first: they are the comparator (what the backend itself answers), so a check
//! that fails there is a wrong test, not a Tessera bug.
//!
//! Lock holders are forked children that only make raw syscalls ([`Locker`]): POSIX
//! locks belong to a process, so each side of a check needs its own.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::Mount;

/// Two views of one backend directory.
pub enum Pair {
    Bind {
        a: PathBuf,
        b: PathBuf,
        _dir: tempfile::TempDir,
    },
    Tessera {
        a: Box<Mount>,
        b: Box<Mount>,
    },
}

impl Pair {
    pub fn bind() -> Pair {
        let dir = tempfile::Builder::new()
            .prefix("tessera-bind-")
            .tempdir()
            .unwrap();
        let (source, a, b) = (
            dir.path().join("backend"),
            dir.path().join("a"),
            dir.path().join("b"),
        );
        for d in [&source, &a, &b] {
            fs::create_dir(d).unwrap();
        }
        for m in [&a, &b] {
            nix::mount::mount(
                Some(&source),
                m,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .expect("bind mount");
        }
        Pair::Bind { a, b, _dir: dir }
    }

    /// Two daemons of one volume directory, each told the directory is shared (as it
    /// is): the cache lifetimes and close-to-open of a shared backend.
    pub fn tessera() -> Pair {
        let a = Mount::builder().arg("--shared-backend").mount();
        let b = Mount::builder()
            .source(&a.source)
            .arg("--shared-backend")
            .mount();
        Pair::Tessera {
            a: Box::new(a),
            b: Box::new(b),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Pair::Bind { .. } => "bind",
            Pair::Tessera { .. } => "tessera",
        }
    }

    pub fn a(&self, rel: &str) -> PathBuf {
        match self {
            Pair::Bind { a, .. } => a.join(rel),
            Pair::Tessera { a, .. } => a.path(rel),
        }
    }

    pub fn b(&self, rel: &str) -> PathBuf {
        match self {
            Pair::Bind { b, .. } => b.join(rel),
            Pair::Tessera { b, .. } => b.path(rel),
        }
    }

    /// `rel` in the backend directory itself.
    pub fn source(&self, rel: &str) -> PathBuf {
        match self {
            Pair::Bind { a, .. } => a.join(rel),
            Pair::Tessera { a, .. } => a.backing(rel),
        }
    }

    /// The pids of the daemons (none for bind mounts).
    pub fn daemons(&self) -> Vec<i32> {
        match self {
            Pair::Bind { .. } => Vec::new(),
            Pair::Tessera { a, b } => vec![a.pid().as_raw(), b.pid().as_raw()],
        }
    }

    pub fn is_tessera(&self) -> bool {
        matches!(self, Pair::Tessera { .. })
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        if let Pair::Bind { a, b, .. } = self {
            for m in [a, b] {
                let _ = nix::mount::umount2(m.as_path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// Which lock a [`Locker`] takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum How {
    /// `flock(2)`.
    Flock,
    /// A classic POSIX `fcntl` lock of `len` bytes at `start` (0: to the end).
    Posix { start: i64, len: i64 },
}

impl How {
    pub const WHOLE: How = How::Posix { start: 0, len: 0 };
}

fn flock_struct(typ: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: plain old data; zero is a valid value of every field.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    fl
}

/// A forked child holding (or waiting for) one lock on a file; it reports the errno
/// of its attempt (0: taken) and then obeys one-byte commands: `o` opens and closes
/// another descriptor of the file, `u` unlocks, `c` closes the locked descriptor; EOF
/// or anything else makes it exit. Killed when dropped.
pub struct Locker {
    pub pid: i32,
    ctl: Option<fs::File>,
    status: fs::File,
}

extern "C" fn on_sigusr1(_: i32) {}

fn pipe() -> (fs::File, fs::File) {
    let mut fds = [0; 2];
    // SAFETY: valid output array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh descriptors we own.
    unsafe { (fs::File::from_raw_fd(fds[0]), fs::File::from_raw_fd(fds[1])) }
}

impl Locker {
    /// Fork a child that opens `path` read-write and takes the lock.
    pub fn spawn(path: &Path, how: How, exclusive: bool, wait: bool) -> Locker {
        Self::spawn_with(path, libc::O_RDWR, how, exclusive, wait)
    }

    /// Fork a child that opens `path` with `flags` and takes the lock.
    pub fn spawn_with(path: &Path, flags: i32, how: How, exclusive: bool, wait: bool) -> Locker {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let (ctl_r, ctl_w) = pipe();
        let (st_r, st_w) = pipe();
        let typ = if exclusive {
            libc::F_WRLCK
        } else {
            libc::F_RDLCK
        };
        let fl = match how {
            How::Posix { start, len } => flock_struct(typ, start, len),
            How::Flock => flock_struct(typ, 0, 0),
        };
        let unlock = match how {
            How::Posix { start, len } => flock_struct(libc::F_UNLCK, start, len),
            How::Flock => flock_struct(libc::F_UNLCK, 0, 0),
        };
        // SAFETY: the child makes only async-signal-safe raw syscalls and exits with
        // _exit; it allocates nothing.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: see above; every pointer is to memory prepared before the fork.
            unsafe {
                // Only the two pipes stay open: a child holding another Locker's
                // command pipe would keep that one from seeing EOF.
                let (lo, hi) = {
                    let (r, w) = (ctl_r.as_raw_fd() as u32, st_w.as_raw_fd() as u32);
                    (r.min(w), r.max(w))
                };
                for (first, last) in [(3, lo.wrapping_sub(1)), (lo + 1, hi - 1), (hi + 1, !0)] {
                    if first <= last {
                        libc::syscall(libc::SYS_close_range, first, last, 0);
                    }
                }
                // SIGUSR1 interrupts a wait (no SA_RESTART) instead of killing.
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_sigusr1 as *const () as usize;
                libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
                let report = |e: i32| {
                    libc::write(st_w.as_raw_fd(), (&e as *const i32).cast(), 4);
                };
                let errno = || *libc::__errno_location();
                let fd = libc::open(c.as_ptr(), flags);
                if fd < 0 {
                    report(1000 + errno());
                    libc::_exit(1);
                }
                let r = match how {
                    How::Flock => libc::flock(
                        fd,
                        if exclusive {
                            libc::LOCK_EX
                        } else {
                            libc::LOCK_SH
                        } | if wait { 0 } else { libc::LOCK_NB },
                    ),
                    How::Posix { .. } => {
                        libc::fcntl(fd, if wait { libc::F_SETLKW } else { libc::F_SETLK }, &fl)
                    }
                };
                report(if r < 0 { errno() } else { 0 });
                loop {
                    let mut cmd = 0u8;
                    if libc::read(ctl_r.as_raw_fd(), (&mut cmd as *mut u8).cast(), 1) != 1 {
                        libc::_exit(0);
                    }
                    let r = match cmd {
                        b'o' => {
                            let other = libc::open(c.as_ptr(), libc::O_RDONLY);
                            if other < 0 { -1 } else { libc::close(other) }
                        }
                        b'u' => match how {
                            How::Flock => libc::flock(fd, libc::LOCK_UN),
                            How::Posix { .. } => libc::fcntl(fd, libc::F_SETLK, &unlock),
                        },
                        b'c' => libc::close(fd),
                        _ => libc::_exit(0),
                    };
                    report(if r < 0 { errno() } else { 0 });
                }
            }
        }
        drop((ctl_r, st_w));
        Locker {
            pid,
            ctl: Some(ctl_w),
            status: st_r,
        }
    }

    /// The next report, if one comes within `timeout`.
    pub fn report(&mut self, timeout: Duration) -> Option<i32> {
        let mut pfd = libc::pollfd {
            fd: self.status.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
        if n <= 0 {
            return None;
        }
        let mut buf = [0u8; 4];
        self.status
            .read_exact(&mut buf)
            .expect("the locker reported");
        Some(i32::from_ne_bytes(buf))
    }

    /// The errno of the lock attempt, which must come within 10 s.
    pub fn result(&mut self) -> i32 {
        self.report(Duration::from_secs(10))
            .expect("the locker answered within 10 s")
    }

    /// Send a command and return its errno.
    pub fn command(&mut self, cmd: u8) -> i32 {
        self.ctl.as_mut().unwrap().write_all(&[cmd]).unwrap();
        self.result()
    }

    /// Let the child exit (closing all its descriptors) and reap it.
    pub fn exit(mut self) {
        self.ctl = None;
        // SAFETY: our own child.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
        self.pid = 0;
    }

    /// Send the child a signal.
    pub fn signal(&self, sig: i32) {
        // SAFETY: our own child.
        unsafe { libc::kill(self.pid, sig) };
    }

    /// SIGKILL the child and reap it.
    pub fn kill(mut self) {
        self.kill_now();
    }

    fn kill_now(&mut self) {
        if self.pid > 0 {
            // SAFETY: our own child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
            self.pid = 0;
        }
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// The errno a non-blocking attempt of `how` through `path` gets now (0: it would be
/// granted; the probe lets go at once).
pub fn probe(path: &Path, how: How, exclusive: bool) -> i32 {
    let mut l = Locker::spawn(path, how, exclusive, false);
    let r = l.result();
    // A granted flock is let go by LOCK_UN, answered before it returns: the release at
    // exit would reach a FUSE daemon only after the exit (see `after_release`), and
    // the next check could still meet the probe's own lock.
    if r == 0 && matches!(how, How::Flock) {
        assert_eq!(l.command(b'u'), 0, "the probe's LOCK_UN");
    }
    l.exit();
    r
}

/// `F_GETLK` of an exclusive lock of the whole file through `path`, from this process:
/// (type, start, len, pid) of the lock in the way.
pub fn getlk(path: &Path) -> (i32, i64, i64, i32) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut fl = flock_struct(libc::F_WRLCK, 0, 0);
    // SAFETY: valid descriptor and flock struct.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) };
    assert_eq!(r, 0, "F_GETLK: {}", std::io::Error::last_os_error());
    (fl.l_type as i32, fl.l_start, fl.l_len, fl.l_pid)
}

pub const EAGAIN: i32 = libc::EAGAIN;

pub fn both_pairs(mut check: impl FnMut(&Pair)) {
    for pair in [Pair::bind(), Pair::tessera()] {
        check(&pair);
    }
}

#[test]
fn flock_through_one_mount_is_seen_through_the_other() {
    both_pairs(|p| {
        let n = p.name();
        fs::write(p.a("f"), b"data").unwrap();
        let mut holder = Locker::spawn(&p.a("f"), How::Flock, true, false);
        assert_eq!(holder.result(), 0, "{n}: flock -x through A");
        assert_eq!(probe(&p.b("f"), How::Flock, true), EAGAIN, "{n}: -x on B");
        assert_eq!(probe(&p.b("f"), How::Flock, false), EAGAIN, "{n}: -s on B");
        // A flock is the open file's: closing another descriptor keeps it.
        assert_eq!(holder.command(b'o'), 0);
        assert_eq!(probe(&p.b("f"), How::Flock, true), EAGAIN, "{n}: after o");
        // flock and POSIX locks do not see each other (Linux).
        assert_eq!(probe(&p.b("f"), How::WHOLE, true), 0, "{n}: fcntl on B");
        assert_eq!(holder.command(b'u'), 0);
        assert_eq!(probe(&p.b("f"), How::Flock, true), 0, "{n}: after unlock");
        // Shared locks share.
        let mut reader = Locker::spawn(&p.a("f"), How::Flock, false, false);
        assert_eq!(reader.result(), 0);
        assert_eq!(probe(&p.b("f"), How::Flock, false), 0, "{n}: -s beside -s");
        assert_eq!(
            probe(&p.b("f"), How::Flock, true),
            EAGAIN,
            "{n}: -x beside -s"
        );
        // Closing the locked descriptor releases a flock: through bind mounts before
        // close(2) returns; through FUSE when the RELEASE the kernel sends after close(2)
        // has returned reaches the daemon (docs/locks.md).
        assert_eq!(reader.command(b'c'), 0);
        let (r, waited) = after_release(p, &p.b("f"), How::Flock);
        assert_eq!(r, 0, "{n}: after close (waited {waited:?})");
        eprintln!("{n}: the flock was free {waited:?} after the close");
    });
}

/// How long after the last close a flock may still be seen through another Tessera
/// mount: the kernel sends FUSE_RELEASE (with FUSE_RELEASE_FLOCK_UNLOCK) after close(2)
/// or exit has returned, so the window is the daemon's scheduling delay; generous for
/// a loaded 2-core machine.
pub const FLOCK_RELEASE_BOUND: Duration = Duration::from_secs(2);

/// An exclusive probe of `how` through `path` after the holder closed or exited: once
/// through bind mounts, whose release is done when close(2) returns, and for POSIX
/// locks, which FLUSH releases before close(2) returns; retried for a flock through
/// Tessera until it gives 0 or [`FLOCK_RELEASE_BOUND`] passes. The last result and how
/// long it took.
pub fn after_release(p: &Pair, path: &Path, how: How) -> (i32, Duration) {
    let start = Instant::now();
    loop {
        let r = probe(path, how, true);
        let retry = p.is_tessera() && how == How::Flock;
        if r == 0 || !retry || start.elapsed() >= FLOCK_RELEASE_BOUND {
            return (r, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn fcntl_locks_through_one_mount_are_seen_through_the_other() {
    both_pairs(|p| {
        let n = p.name();
        fs::write(p.a("f"), vec![0u8; 100]).unwrap();
        let head = How::Posix { start: 0, len: 10 };
        let mut holder = Locker::spawn(&p.a("f"), head, true, false);
        assert_eq!(holder.result(), 0, "{n}: F_SETLK through A");
        assert_eq!(probe(&p.b("f"), head, true), EAGAIN, "{n}: same range on B");
        assert_eq!(
            probe(&p.b("f"), How::WHOLE, false),
            EAGAIN,
            "{n}: read lock on B"
        );
        let tail = How::Posix { start: 10, len: 10 };
        assert_eq!(probe(&p.b("f"), tail, true), 0, "{n}: the next range on B");
        let (typ, start, len, pid) = getlk(&p.b("f"));
        assert_eq!((typ, start, len), (libc::F_WRLCK, 0, 10), "{n}: F_GETLK");
        if p.is_tessera() {
            // The holder may be on another node: its pid means nothing here.
            assert!(pid == holder.pid || pid == 0, "{n}: F_GETLK pid {pid}");
        } else {
            assert_eq!(pid, holder.pid, "{n}: F_GETLK pid");
        }
        // flock does not see POSIX locks.
        assert_eq!(probe(&p.b("f"), How::Flock, true), 0, "{n}: flock on B");
        // POSIX: closing any descriptor of the file releases the process's locks.
        assert_eq!(holder.command(b'o'), 0);
        assert_eq!(
            probe(&p.b("f"), head, true),
            0,
            "{n}: after another fd closed"
        );
        assert_eq!(getlk(&p.b("f")).0, libc::F_UNLCK, "{n}: F_GETLK after");
    });
}

#[test]
fn a_waiter_through_one_mount_wakes_when_the_other_releases() {
    both_pairs(|p| {
        let n = p.name();
        fs::write(p.a("f"), b"data").unwrap();
        for how in [How::WHOLE, How::Flock] {
            let mut holder = Locker::spawn(&p.a("f"), how, true, false);
            assert_eq!(holder.result(), 0, "{n} {how:?}: holder");
            let mut waiter = Locker::spawn(&p.b("f"), how, true, true);
            assert_eq!(
                waiter.report(Duration::from_millis(500)),
                None,
                "{n} {how:?}: the waiter must wait"
            );
            let released = Instant::now();
            assert_eq!(holder.command(b'u'), 0);
            assert_eq!(waiter.result(), 0, "{n} {how:?}: the waiter gets it");
            eprintln!(
                "{n} {how:?}: waiter woke {:?} after the release",
                released.elapsed()
            );
            assert_eq!(
                probe(&p.a("f"), how, true),
                EAGAIN,
                "{n} {how:?}: now B holds"
            );
            // Let go before the exit, whose flock release would come late through FUSE.
            assert_eq!(waiter.command(b'u'), 0);
            waiter.exit();
            // Holder and waiter through one mount: a release there wakes the wait
            // at once instead of at its next retry.
            let mut holder = Locker::spawn(&p.a("f"), how, true, false);
            assert_eq!(holder.result(), 0);
            let mut waiter = Locker::spawn(&p.a("f"), how, true, true);
            assert_eq!(waiter.report(Duration::from_millis(500)), None);
            let released = Instant::now();
            assert_eq!(holder.command(b'u'), 0);
            assert_eq!(waiter.result(), 0, "{n} {how:?}: same mount");
            eprintln!(
                "{n} {how:?}: a waiter on the same mount woke {:?} after the release",
                released.elapsed()
            );
        }
    });
}

/// Two SQLite writers, one per view, each 1,000 transactions into one database file
/// at once (the workload of the real-node test, `crate::sqlite_workload`): the file
/// is sound and holds every row. Through two mounts that each kept their locks to
/// themselves, both writers would commit at once and the file would be corrupt or
/// short of rows.
#[test]
fn sqlite_writers_through_both_mounts_keep_every_row() {
    use crate::sqlite_workload as sql;
    both_pairs(|p| {
        let n = p.name();
        let start = Instant::now();
        let writers: Vec<_> = [("a", p.a("db")), ("b", p.b("db"))]
            .into_iter()
            .map(|(who, db)| {
                let script = sql::script(db.to_str().unwrap(), who, sql::TRANSACTIONS);
                let child = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(script)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("sh");
                (who, child)
            })
            .collect();
        for (who, child) in writers {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{n}: writer {who}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let took = start.elapsed();
        assert_eq!(
            sql::check(&p.source("db")),
            sql::expected(&["a", "b"], sql::TRANSACTIONS),
            "{n}"
        );
        eprintln!(
            "{n}: 2 x {} SQLite transactions in {took:?}",
            sql::TRANSACTIONS
        );
    });
}

#[test]
fn exit_and_sigkill_release_every_lock() {
    both_pairs(|p| {
        let n = p.name();
        fs::write(p.a("f"), b"data").unwrap();
        for how in [How::WHOLE, How::Flock] {
            let mut holder = Locker::spawn(&p.a("f"), how, true, false);
            assert_eq!(holder.result(), 0);
            holder.exit();
            let (r, waited) = after_release(p, &p.b("f"), how);
            assert_eq!(r, 0, "{n} {how:?}: after exit (waited {waited:?})");
            let mut holder = Locker::spawn(&p.a("f"), how, true, false);
            assert_eq!(holder.result(), 0);
            let mut waiter = Locker::spawn(&p.b("f"), how, true, true);
            assert_eq!(waiter.report(Duration::from_millis(300)), None);
            // A waiter killed while it waits goes away, and takes nothing with it.
            waiter.kill();
            holder.kill();
            let (r, waited) = after_release(p, &p.b("f"), how);
            assert_eq!(r, 0, "{n} {how:?}: after SIGKILL (waited {waited:?})");
            assert_eq!(probe(&p.a("f"), how, true), 0, "{n} {how:?}: through A too");
        }
    });
}

#[test]
fn a_signal_ends_a_wait_with_eintr_and_takes_nothing() {
    both_pairs(|p| {
        let n = p.name();
        fs::write(p.a("f"), b"data").unwrap();
        for how in [How::WHOLE, How::Flock] {
            let mut holder = Locker::spawn(&p.a("f"), how, true, false);
            assert_eq!(holder.result(), 0);
            let mut waiter = Locker::spawn(&p.b("f"), how, true, true);
            assert_eq!(waiter.report(Duration::from_millis(300)), None);
            // Ctrl-C on an application that handles SIGINT, say.
            waiter.signal(libc::SIGUSR1);
            assert_eq!(waiter.result(), libc::EINTR, "{n} {how:?}: the wait ends");
            assert_eq!(
                probe(&p.b("f"), how, true),
                EAGAIN,
                "{n} {how:?}: still held"
            );
            holder.exit();
            // The interrupted waiter took nothing: a third process gets the lock.
            let (r, waited) = after_release(p, &p.b("f"), how);
            assert_eq!(r, 0, "{n} {how:?}: free (waited {waited:?})");
            waiter.exit();
        }
    });
}

/// Lock and unlock `rounds` times through `path` (no contention); mean per pair.
fn lock_cycle(path: &Path, how: How, rounds: u32) -> Duration {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let fd = f.as_raw_fd();
    let (lk, un) = (
        flock_struct(libc::F_WRLCK, 0, 0),
        flock_struct(libc::F_UNLCK, 0, 0),
    );
    let t = Instant::now();
    for _ in 0..rounds {
        // SAFETY: valid descriptor and flock structs.
        let r = unsafe {
            match how {
                How::Flock => libc::flock(fd, libc::LOCK_EX) | libc::flock(fd, libc::LOCK_UN),
                How::Posix { .. } => {
                    libc::fcntl(fd, libc::F_SETLK, &lk) | libc::fcntl(fd, libc::F_SETLK, &un)
                }
            }
        };
        assert_eq!(r, 0);
    }
    t.elapsed() / rounds
}

#[test]
fn lock_latency_through_tessera_and_a_bind_mount() {
    let mut figures = Vec::new();
    both_pairs(|p| {
        fs::write(p.a("f"), b"data").unwrap();
        for how in [How::WHOLE, How::Flock] {
            let per = lock_cycle(&p.a("f"), how, 2000);
            figures.push(format!("{} {how:?}: lock+unlock {per:?}", p.name()));
        }
    });
    eprintln!("{}", figures.join("\n"));
}
