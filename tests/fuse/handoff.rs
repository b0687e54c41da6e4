//! /dev/fuse handoff: a daemon killed with `kill -9` is replaced by a successor that
//! takes over the held connection (the holder, `tessera_fuse::fd_holder`, runs
//! in the test process as the library type the node agent runs), and no application
//! sees an error: a writer's every write succeeds, its records are complete and in
//! order, a directory handle keeps listing, an inode looked up before keeps working.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tessera_fuse::fd_holder::Holder;

use crate::support::{Builder, Mount};

/// A holder socket and a state file outside the mount's own directory.
struct Held {
    dir: tempfile::TempDir,
}

impl Held {
    fn new() -> Held {
        Held {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn socket(&self) -> PathBuf {
        self.dir.path().join("holder.sock")
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("mount.handoff")
    }
    fn mount(&self) -> Mount {
        self.mount_with(|b| b)
    }
    fn mount_with(&self, f: impl FnOnce(Builder) -> Builder) -> Mount {
        f(Mount::builder())
            .arg("--holder")
            .arg(self.socket().to_str().unwrap())
            .arg("--handoff-state")
            .arg(self.state().to_str().unwrap())
            // Every stat reaches the daemon: an inode looked up before the switch
            // must be served by the successor, not the kernel's cache.
            .arg("--attr-timeout=0")
            .mount()
    }
}

/// Writes a 16-byte record every 50 ms through one descriptor, checking each write.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(u64, Duration, Option<String>)>,
}

impl Writer {
    fn start(path: &Path) -> Writer {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut n, mut longest) = (0u64, Duration::ZERO);
            while !s.load(Ordering::Acquire) {
                let rec = format!("record {n:08}\n");
                let t = Instant::now();
                let r = f.write_all(rec.as_bytes());
                longest = longest.max(t.elapsed());
                if let Err(e) = r {
                    return (n, longest, Some(format!("write {n}: {e}")));
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            (n, longest, None)
        });
        Writer { stop, thread }
    }

    fn finish(self) -> (u64, Duration, Option<String>) {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap()
    }
}

fn check_records(path: &Path, n: u64) {
    let text = fs::read_to_string(path).unwrap();
    let want: String = (0..n).map(|i| format!("record {i:08}\n")).collect();
    assert!(
        text == want,
        "records incomplete or out of order: {} bytes, want {} ({n} records)",
        text.len(),
        want.len()
    );
}

fn wait_log(m: &Mount, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !m.log().contains(what) {
        assert!(Instant::now() < deadline, "no {what:?} in:\n{}", m.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn names(dir: &mut nix::dir::Dir) -> Vec<String> {
    let mut v: Vec<String> = dir
        .iter()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    v.sort();
    v
}

/// How the first daemon goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    /// `kill -9`.
    Kill,
    /// The holder restarts first, then `kill -9`.
    HolderRestartThenKill,
    /// SIGUSR1: a planned replacement (exit without unmounting).
    Planned,
    /// SIGUSR2, then SIGTERM: a mount Pod deleted for an upgrade (the kubelet's
    /// SIGTERM must leave the mount to the new Pod, not unmount it).
    ArmedStop,
    /// The holder goes away, and before it is back the daemon is told to leave
    /// (SIGUSR2, SIGTERM): an upgrade that rolls the fd holder's DaemonSet and the
    /// mounts at once. The daemon must wait until a holder holds the connection.
    HolderGoneThenArmedStop,
}

/// The daemon goes mid-stream and a successor takes the held connection over.
fn crash_and_take_over(end: End) {
    let restart_holder = end == End::HolderRestartThenKill;
    let held = Held::new();
    let mut holder = Some(Holder::serve(&held.socket()).unwrap());
    let mut m = held.mount();
    wait_log(&m, "FUSE descriptor handed to the holder");
    fs::create_dir(m.path("d")).unwrap();
    for f in ["a", "b", "c"] {
        fs::write(m.path(&format!("d/{f}")), f).unwrap();
    }
    let mut dir = nix::dir::Dir::open(
        &m.path("d"),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    assert_eq!(names(&mut dir), ["a", "b", "c"]);
    // Looked up before the switch, and only ever named by its node id after.
    // (An O_PATH descriptor: no open file on the daemon's side, only the inode.)
    let looked_up = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(m.path("d/a"))
        .unwrap();
    let before = nix::sys::stat::fstat(&looked_up).unwrap();

    let writer = Writer::start(&m.path("log"));
    std::thread::sleep(Duration::from_millis(600));
    if restart_holder {
        // The holder (the agent) restarts while the daemon runs: the daemon hands its
        // descriptor to the new one, which then has it for the successor.
        drop(holder.take());
        holder = Some(Holder::serve(&held.socket()).unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !holder.as_ref().unwrap().holds(&m.mnt) {
            assert!(
                Instant::now() < deadline,
                "the daemon did not come back to the restarted holder:\n{}",
                m.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    if end == End::HolderGoneThenArmedStop {
        drop(holder.take());
        m.signal(nix::sys::signal::Signal::SIGUSR2);
        wait_log(&m, "the next stop signal leaves the mount");
        m.signal(nix::sys::signal::Signal::SIGTERM);
        // Nobody holds the connection: leaving now would end it (ENOTCONN for the
        // application). The daemon waits for a holder, serving meanwhile.
        std::thread::sleep(Duration::from_millis(700));
        assert!(
            m.wait_exit(Duration::ZERO).is_none(),
            "the daemon left while no holder held the connection:\n{}",
            m.log()
        );
        holder = Some(Holder::serve(&held.socket()).unwrap());
        let status = m
            .wait_exit(Duration::from_secs(10))
            .expect("exits once the new holder holds the connection");
        assert!(status.success(), "{status}\n{}", m.log());
        assert!(m.log().contains("exiting for a successor"));
    } else if end == End::Planned || end == End::ArmedStop {
        if end == End::ArmedStop {
            m.signal(nix::sys::signal::Signal::SIGUSR2);
            wait_log(&m, "the next stop signal leaves the mount");
            m.signal(nix::sys::signal::Signal::SIGTERM);
        } else {
            m.signal(nix::sys::signal::Signal::SIGUSR1);
        }
        let status = m
            .wait_exit(Duration::from_secs(10))
            .expect("exits on SIGUSR1, or SIGTERM after SIGUSR2");
        assert!(status.success(), "{status}\n{}", m.log());
        assert!(m.log().contains("exiting for a successor"));
    } else {
        m.kill_daemon();
    }
    // Dead for a while: the application waits, it does not fail.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        holder.as_ref().unwrap().holds(&m.mnt),
        "the holder lost the connection"
    );
    m.respawn();
    wait_log(&m, "serving the held connection");
    std::thread::sleep(Duration::from_millis(800));
    let (n, longest, err) = writer.finish();
    println!("handoff ({end:?}): {n} records, longest write {longest:?}");
    assert!(
        err.is_none(),
        "a write failed across the takeover: {err:?}\n{}",
        m.log()
    );
    assert!(
        longest < Duration::from_secs(10),
        "a write stalled {longest:?}"
    );
    check_records(&m.backing("log"), n);
    assert_eq!(
        names(&mut dir),
        ["a", "b", "c"],
        "the directory handle lists"
    );
    let after = nix::sys::stat::fstat(&looked_up).unwrap();
    assert_eq!(
        (after.st_ino, after.st_size),
        (before.st_ino, before.st_size)
    );
    assert_eq!(fs::read_to_string(m.path("d/b")).unwrap(), "b");
    let log = m.log();
    assert!(
        log.contains("handoff: predecessor's state restored"),
        "no restore:\n{log}"
    );
    assert!(!log.contains("not restored"), "something was lost:\n{log}");
    drop(dir);
    drop(looked_up);
    m.stop();
    // An unmount on purpose: the holder forgets the connection.
    assert!(!holder.as_ref().unwrap().holds(&m.mnt));
}

#[test]
fn a_killed_daemon_is_taken_over_without_an_application_error() {
    crash_and_take_over(End::Kill);
}

#[test]
fn a_restarted_holder_gets_the_descriptor_back_before_the_crash() {
    crash_and_take_over(End::HolderRestartThenKill);
}

#[test]
fn a_planned_replacement_exits_without_unmounting_and_is_taken_over() {
    crash_and_take_over(End::Planned);
}

#[test]
fn a_stop_signal_after_sigusr2_leaves_the_mount_to_a_successor() {
    crash_and_take_over(End::ArmedStop);
}

#[test]
fn a_daemon_told_to_leave_while_the_holder_restarts_waits_for_it() {
    crash_and_take_over(End::HolderGoneThenArmedStop);
}

/// An upgrade's order: the successor starts beside the serving daemon as a standby
/// and waits; a daemon started without `--standby` meanwhile finds the connection
/// served and exits without touching it (never two daemons on one connection); the
/// serving one leaves (SIGUSR2, SIGTERM) and the standby takes over at once.
#[test]
fn a_standby_waits_beside_the_serving_daemon_and_takes_over_as_it_leaves() {
    let held = Held::new();
    let holder = Holder::serve(&held.socket()).unwrap();
    let mut m = held.mount();
    wait_log(&m, "FUSE descriptor handed to the holder");
    let writer = Writer::start(&m.path("log"));
    let mut standby = m.spawn_beside(&["--standby"]);
    wait_log(&m, "standby, waiting for the serving daemon to leave");
    let mut intruder = m.spawn_beside(&[]);
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = intruder.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "a second daemon keeps running:\n{}",
            m.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{status}\n{}", m.log());
    let log = m.log();
    assert!(log.contains("another daemon serves or takes over"), "{log}");
    assert!(
        !log.contains("serving the held connection"),
        "taken over while served:\n{log}"
    );
    assert!(
        standby.try_wait().unwrap().is_none(),
        "the standby gave up:\n{log}"
    );
    std::thread::sleep(Duration::from_millis(300));
    m.signal(nix::sys::signal::Signal::SIGUSR2);
    wait_log(&m, "the next stop signal leaves the mount");
    let left = Instant::now();
    m.signal(nix::sys::signal::Signal::SIGTERM);
    let status = m.wait_exit(Duration::from_secs(10)).expect("leaves");
    assert!(status.success(), "{status}\n{}", m.log());
    standby_took_over(m, standby, writer, &holder, left, "standby takeover");
}

#[test]
fn without_a_held_connection_the_daemon_mounts_afresh() {
    let held = Held::new();
    // No holder at all: a fresh mount, which serves as always.
    let mut m = held.mount();
    fs::write(m.path("f"), b"x").unwrap();
    assert_eq!(fs::read(m.path("f")).unwrap(), b"x");
    assert!(m.log().contains("mounted"));
    m.stop();
}

/// A request the dead daemon had read and not answered (a writable open waiting for
/// a passthrough reader's release, which the daemon does for up to a second) is
/// answered by the successor: the kernel queues it again (FUSE_NOTIFY_RESEND). The
/// reader's release, sent while no daemon ran, frees the file for it.
#[test]
fn a_request_the_dead_daemon_had_read_is_answered_by_the_successor() {
    let held = Held::new();
    let _holder = Holder::serve(&held.socket()).unwrap();
    let mut m = held.mount();
    wait_log(&m, "FUSE descriptor handed to the holder");
    fs::write(m.path("busy"), b"data").unwrap();
    let reader = fs::File::open(m.path("busy")).unwrap();
    let path = m.path("busy");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t = Instant::now();
        let r = fs::OpenOptions::new().write(true).open(&path).map(drop);
        let _ = tx.send((r.map_err(|e| e.to_string()), t.elapsed()));
    });
    // The daemon has read the open and waits for the reader's release.
    std::thread::sleep(Duration::from_millis(300));
    m.kill_daemon();
    drop(reader);
    std::thread::sleep(Duration::from_millis(200));
    m.respawn();
    wait_log(&m, "serving the held connection");
    let (r, took) = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| {
            panic!(
                "the open read by the dead daemon was never answered:\n{}",
                m.log()
            )
        });
    println!("open read by the dead daemon answered after {took:?}");
    assert_eq!(r, Ok(()), "{}", m.log());
    m.stop();
}

/// A live connection is held but the successor cannot take it over (its state is
/// gone): it lets the holder drop it and exits, so the connection ends and nothing
/// stays blocked on it (the agent then remounts), instead of mounting on top.
#[test]
fn a_held_connection_without_state_is_let_go_not_mounted_over() {
    let held = Held::new();
    let holder = Holder::serve(&held.socket()).unwrap();
    let mut m = held.mount();
    wait_log(&m, "FUSE descriptor handed to the holder");
    fs::write(m.path("f"), b"x").unwrap();
    m.kill_daemon();
    fs::write(held.state(), b"not a state file").unwrap();
    m.respawn();
    let status = m
        .wait_exit(Duration::from_secs(10))
        .expect("the successor exits");
    assert!(!status.success(), "{}", m.log());
    assert!(m.log().contains("cannot be taken over"), "{}", m.log());
    assert!(!holder.holds(&m.mnt), "the holder let go");
    let mnt = m.mnt.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(fs::metadata(mnt.join("f")).map_err(|e| e.raw_os_error()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a stat of the abandoned mount returns");
    assert_eq!(r.err(), Some(Some(libc::ENOTCONN)), "the connection ended");
    // Nothing answers statfs there any more, so `Mount`'s drop would not see it.
    nix::mount::umount2(&m.mnt, nix::mount::MntFlags::MNT_DETACH).unwrap();
}

/// A daemon dies and no successor comes (the agent is gone too): the holder lets the
/// connection go after its orphan grace, so an application gets ENOTCONN instead of
/// waiting, uninterruptibly, for ever.
#[test]
fn an_orphaned_connection_is_let_go_after_the_grace() {
    let held = Held::new();
    let holder = Holder::serve_with_grace(&held.socket(), Duration::from_secs(2)).unwrap();
    let mut m = held.mount();
    wait_log(&m, "FUSE descriptor handed to the holder");
    fs::write(m.path("f"), b"x").unwrap();
    m.kill_daemon();
    let mnt = m.mnt.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(fs::metadata(mnt.join("f")).map_err(|e| e.raw_os_error()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("a stat of the orphaned mount returns once the grace is over");
    println!("orphaned connection let go after {:?}", t.elapsed());
    // The stat that waited was aborted with the connection; what follows finds none.
    let waited = r.err().flatten();
    assert!(
        waited == Some(libc::ECONNABORTED) || waited == Some(libc::ENOTCONN),
        "the waiting stat ends with the connection: {waited:?}"
    );
    let after = fs::metadata(m.path("f")).map_err(|e| e.raw_os_error());
    assert_eq!(
        after.err(),
        Some(Some(libc::ENOTCONN)),
        "the connection ended"
    );
    assert!(!holder.holds(&m.mnt), "the holder let go");
    nix::mount::umount2(&m.mnt, nix::mount::MntFlags::MNT_DETACH).unwrap();
}

/// Appends `n` records to `path` through a descriptor opened `O_APPEND`, one write
/// each; the first error, if any.
fn append_records(path: &Path, n: u64) -> Result<(), String> {
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    for i in 0..n {
        f.write_all(format!("record {i:08}\n").as_bytes())
            .map_err(|e| format!("write {i}: {e}"))?;
    }
    Ok(())
}

/// The same appends through a bind mount of a plain directory: what the file holds.
fn appended_through_a_bind_mount(n: u64) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (source, bind) = (dir.path().join("source"), dir.path().join("bind"));
    fs::create_dir(&source).unwrap();
    fs::create_dir(&bind).unwrap();
    nix::mount::mount(
        Some(&source),
        &bind,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("bind mount");
    let r = append_records(&bind.join("log"), n);
    let text = fs::read_to_string(source.join("log"));
    nix::mount::umount2(&bind, nix::mount::MntFlags::MNT_DETACH).unwrap();
    r.unwrap();
    text.unwrap()
}

/// A WRITE the dead daemon had applied to its `O_APPEND` backing file but not
/// answered is resent by the kernel after the takeover; the successor answers it
/// from the dead daemon's write journal instead of appending the record again. The
/// daemon dies exactly there (test-only fault point `TESSERA_FAULT_EXIT_AFTER_WRITE`:
/// `_exit(9)` after applying its 5th write, before the reply).
#[test]
fn a_write_applied_but_not_answered_is_not_applied_again() {
    write_applied_then_takeover(false);
}

/// The same, and the successor dies too, right after taking the resent WRITE from
/// its predecessor's journal and before answering it: a third daemon still finds
/// it applied (the successor carried the slot into its own journal).
#[test]
fn a_resent_write_survives_a_second_takeover() {
    write_applied_then_takeover(true);
}

fn write_applied_then_takeover(successor_dies: bool) {
    const RECORDS: u64 = 12;
    let want: String = (0..RECORDS).map(|i| format!("record {i:08}\n")).collect();
    assert_eq!(
        appended_through_a_bind_mount(RECORDS),
        want,
        "the comparator"
    );

    let held = Held::new();
    let _holder = Holder::serve(&held.socket()).unwrap();
    let mut m = held.mount_with(|b| b.env("TESSERA_FAULT_EXIT_AFTER_WRITE", "5"));
    wait_log(&m, "FUSE descriptor handed to the holder");
    let path = m.path("log");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(append_records(&path, RECORDS));
    });
    let status = m
        .wait_exit(Duration::from_secs(10))
        .expect("the daemon exits at its fault point");
    assert_eq!(status.code(), Some(9), "{}", m.log());
    // The application waits for the answer to its 5th record, already in the file.
    std::thread::sleep(Duration::from_millis(200));
    assert!(rx.try_recv().is_err(), "the writer did not wait");
    if successor_dies {
        // Its first write is the resent one.
        m.respawn_with(&[("TESSERA_FAULT_EXIT_AFTER_WRITE", "1")]);
        let status = m
            .wait_exit(Duration::from_secs(10))
            .expect("the successor exits at its fault point");
        assert_eq!(status.code(), Some(9), "{}", m.log());
        assert!(rx.try_recv().is_err(), "the writer did not wait");
    }
    m.respawn();
    wait_log(&m, "serving the held connection");
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("the writer was never answered:\n{}", m.log()));
    assert_eq!(r, Ok(()), "{}", m.log());
    let text = fs::read_to_string(m.backing("log")).unwrap();
    assert!(
        text == want,
        "each record exactly once, as through a bind mount; got:\n{text}\n{}",
        m.log()
    );
    assert!(
        m.log()
            .contains("a WRITE the predecessor had begun, resent"),
        "the resent write was recognised:\n{}",
        m.log()
    );
    m.stop();
}

/// An upgrade that rolls the fd holder's DaemonSet at the same time: the standby
/// waits on the old holder, which goes away; the serving daemon is told to leave
/// meanwhile (and waits for a holder); a new holder starts. The standby asks the new
/// holder again instead of giving up, and takes the connection over once the serving
/// daemon has handed it to the new holder and left: no write fails.
#[test]
fn a_standby_whose_holder_restarts_asks_the_new_one_and_takes_over() {
    let held = Held::new();
    let holder = Holder::serve(&held.socket()).unwrap();
    let mut m = held.mount();
    wait_log(&m, "FUSE descriptor handed to the holder");
    let writer = Writer::start(&m.path("log"));
    let mut standby = m.spawn_beside(&["--standby"]);
    wait_log(&m, "standby, waiting for the serving daemon to leave");
    std::thread::sleep(Duration::from_millis(300));
    drop(holder);
    m.signal(nix::sys::signal::Signal::SIGUSR2);
    wait_log(&m, "the next stop signal leaves the mount");
    let left = Instant::now();
    m.signal(nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        standby.try_wait().unwrap().is_none(),
        "the standby gave up when its holder went away:\n{}",
        m.log()
    );
    let holder = Holder::serve(&held.socket()).unwrap();
    let status = m.wait_exit(Duration::from_secs(15)).expect("leaves");
    assert!(status.success(), "{status}\n{}", m.log());
    standby_took_over(
        m,
        standby,
        writer,
        &holder,
        left,
        "standby takeover across a holder restart",
    );
}

/// The end of a standby case, once the serving daemon left at `left`: the standby
/// serves the held connection, no write failed, every record is in the backend, and
/// an unmount on purpose makes the holder forget the connection.
fn standby_took_over(
    mut m: Mount,
    standby: std::process::Child,
    writer: Writer,
    holder: &Holder,
    left: Instant,
    what: &str,
) {
    m.adopt(standby);
    wait_log(&m, "serving the held connection");
    let took = left.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let (n, longest, err) = writer.finish();
    println!("{what}: {n} records, taken over {took:?} after SIGTERM, longest write {longest:?}");
    assert!(err.is_none(), "a write failed: {err:?}\n{}", m.log());
    check_records(&m.backing("log"), n);
    m.stop();
    assert!(!holder.holds(&m.mnt));
}

/// A daemon revoked (its node's Lease taken again under a new epoch: the controller
/// gave its volume away) and then replaced by a successor on the held connection:
/// the successor serves under its predecessor's epoch, so it is revoked as well and
/// nothing more is applied. A successor that took the node's current epoch as its own
/// would let the application on the old Pod write again (issue 33).
#[test]
fn a_successor_of_a_revoked_daemon_is_revoked_too() {
    use tessera_fuse::contract::fence::{News, boottime_ns, news_text};
    let held = Held::new();
    let _holder = Holder::serve(&held.socket()).unwrap();
    let fence = held.dir.path().join("node.fence");
    let renewal = |epoch| {
        news_text(&News {
            epoch,
            renewed_ns: boottime_ns(),
            fence_after: Duration::from_secs(3600),
        })
    };
    fs::write(&fence, renewal(1)).unwrap();
    let mut m = held.mount_with(|b| b.arg("--fence-file").arg(fence.to_str().unwrap()));
    wait_log(&m, "FUSE descriptor handed to the holder");
    fs::write(m.path("before"), "x").unwrap();

    fs::write(&fence, renewal(2)).unwrap();
    let eio = |name: &str, m: &Mount| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match fs::write(m.path(name), "x") {
                Err(e) if e.raw_os_error() == Some(libc::EIO) => return,
                r => assert!(
                    Instant::now() < deadline,
                    "{name}: {r:?}, not EIO\n{}",
                    m.log()
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    eio("revoked", &m);

    m.kill_daemon();
    m.respawn();
    wait_log(&m, "serving the held connection");
    fs::write(&fence, renewal(2)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let r = fs::write(m.path("after"), "x");
    assert_eq!(
        r.as_ref().map_err(|e| e.raw_os_error()),
        Err(Some(libc::EIO)),
        "the successor of a revoked daemon wrote: {r:?}\n{}",
        m.log()
    );
    assert!(!m.backing("after").exists(), "nothing applied");
    assert_eq!(fs::read_to_string(m.backing("before")).unwrap(), "x");
    m.stop();
}

/// A self-fencing daemon takes its signals as any other: SIGUSR1 leaves the mount to
/// a successor, SIGTERM unmounts, each with a clean exit. (Its fence thread, started
/// before the daemon blocks its signals, once took them and died of them.)
#[test]
fn a_self_fencing_daemon_leaves_and_stops_on_its_signals() {
    use tessera_fuse::contract::fence::{News, boottime_ns, news_text};
    let held = Held::new();
    let holder = Holder::serve(&held.socket()).unwrap();
    let fence = held.dir.path().join("node.fence");
    let news = News {
        epoch: 1,
        renewed_ns: boottime_ns(),
        fence_after: Duration::from_secs(3600),
    };
    fs::write(&fence, news_text(&news)).unwrap();
    let mut m = held.mount_with(|b| b.arg("--fence-file").arg(fence.to_str().unwrap()));
    wait_log(&m, "FUSE descriptor handed to the holder");
    let writer = Writer::start(&m.path("log"));
    std::thread::sleep(Duration::from_millis(300));
    m.signal(nix::sys::signal::Signal::SIGUSR1);
    let status = m
        .wait_exit(Duration::from_secs(10))
        .expect("exits on SIGUSR1");
    assert!(status.success(), "{status}\n{}", m.log());
    assert!(m.log().contains("exiting for a successor"), "{}", m.log());
    assert!(holder.holds(&m.mnt), "the holder kept the connection");
    m.respawn();
    wait_log(&m, "serving the held connection");
    std::thread::sleep(Duration::from_millis(300));
    let (n, _, err) = writer.finish();
    assert!(err.is_none(), "a write failed: {err:?}\n{}", m.log());
    check_records(&m.backing("log"), n);
    m.stop();
}
