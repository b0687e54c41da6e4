//! Table tests of the lock conversions, and the waiter's behaviour with scripted
//! attempts.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wait::{MAX_BACKOFF, WaitEnd, Waiters, backoff};
use super::{LockSpec, OFFSET_MAX};

fn spec(typ: i32, start: u64, end: u64) -> LockSpec {
    LockSpec { typ, start, end }
}

#[test]
fn fuse_ranges_become_flock_structs_and_back() {
    // (FUSE lock, l_start, l_len)
    let table = [
        (spec(libc::F_WRLCK, 0, OFFSET_MAX), 0, 0),
        (spec(libc::F_RDLCK, 0, 9), 0, 10),
        (spec(libc::F_WRLCK, 10, 10), 10, 1),
        (spec(libc::F_UNLCK, 5, OFFSET_MAX), 5, 0),
        // The last byte of off_t.
        (
            spec(libc::F_WRLCK, OFFSET_MAX - 1, OFFSET_MAX - 1),
            i64::MAX - 1,
            1,
        ),
        (spec(libc::F_WRLCK, OFFSET_MAX, OFFSET_MAX), i64::MAX, 0),
    ];
    for (lock, l_start, l_len) in table {
        let fl = lock.to_flock().unwrap();
        assert_eq!(
            (
                fl.l_type as i32,
                fl.l_whence as i32,
                fl.l_start,
                fl.l_len,
                fl.l_pid
            ),
            (lock.typ, libc::SEEK_SET, l_start, l_len, 0),
            "{lock:?}"
        );
        assert_eq!(LockSpec::from_flock(&fl), lock, "{lock:?} back");
    }
}

#[test]
fn malformed_fuse_locks_are_refused() {
    for lock in [
        spec(libc::F_WRLCK, 10, 9),
        spec(libc::F_WRLCK, OFFSET_MAX + 1, u64::MAX),
        spec(99, 0, 1),
    ] {
        assert_eq!(
            lock.to_flock().err(),
            Some(nix::errno::Errno::EINVAL),
            "{lock:?}"
        );
    }
}

#[test]
fn lock_types_become_flock_operations() {
    let table = [
        (libc::F_RDLCK, false, Some(libc::LOCK_SH | libc::LOCK_NB)),
        (libc::F_RDLCK, true, Some(libc::LOCK_SH)),
        (libc::F_WRLCK, false, Some(libc::LOCK_EX | libc::LOCK_NB)),
        (libc::F_WRLCK, true, Some(libc::LOCK_EX)),
        (libc::F_UNLCK, false, Some(libc::LOCK_UN)),
        (42, false, None),
    ];
    for (typ, wait, op) in table {
        assert_eq!(
            spec(typ, 0, OFFSET_MAX).flock_op(wait).ok(),
            op,
            "{typ} {wait}"
        );
    }
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let table = [
        (0, 1),
        (1, 2),
        (2, 4),
        (5, 32),
        (6, 50),
        (30, 50),
        (u32::MAX, 50),
    ];
    for (tries, ms) in table {
        assert_eq!(backoff(tries), Duration::from_millis(ms), "{tries}");
    }
    assert_eq!(MAX_BACKOFF, Duration::from_millis(50));
}

/// A wait whose attempts answer from `script` (the last answer repeats), and the
/// channel its end arrives on.
fn scripted(
    waiters: &Arc<Waiters>,
    unique: u64,
    script: Vec<Result<bool, i32>>,
) -> (mpsc::Receiver<WaitEnd>, Arc<AtomicU32>) {
    let (tx, rx) = mpsc::channel();
    let tries = Arc::new(AtomicU32::new(0));
    let t = tries.clone();
    let script = Mutex::new(script);
    waiters.wait(
        unique,
        Box::new(move || {
            let n = t.fetch_add(1, Ordering::SeqCst) as usize;
            let s = script.lock().unwrap();
            s[n.min(s.len() - 1)]
        }),
        Box::new(move |end| tx.send(end).unwrap()),
    );
    (rx, tries)
}

const LONG: Duration = Duration::from_secs(5);

#[test]
fn a_wait_ends_when_its_attempt_takes_the_lock_or_fails() {
    let w = Waiters::new(8);
    let (taken, tries) = scripted(&w, 1, vec![Ok(false), Ok(false), Ok(true)]);
    let (failed, _) = scripted(&w, 2, vec![Ok(false), Err(libc::EBADF)]);
    assert_eq!(taken.recv_timeout(LONG), Ok(WaitEnd::Taken));
    assert_eq!(tries.load(Ordering::SeqCst), 3);
    assert_eq!(failed.recv_timeout(LONG), Ok(WaitEnd::Failed(libc::EBADF)));
    // The waiter thread goes with the last wait.
    let deadline = std::time::Instant::now() + LONG;
    while w.running() {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter thread stayed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(w.is_empty());
}

#[test]
fn an_interrupt_ends_a_wait_before_or_after_it_arrives() {
    let w = Waiters::new(8);
    let (waiting, _) = scripted(&w, 7, vec![Ok(false)]);
    std::thread::sleep(Duration::from_millis(20));
    w.interrupt(7);
    assert_eq!(waiting.recv_timeout(LONG), Ok(WaitEnd::Interrupted));
    // The interrupt of a request that has not reached the waiters yet.
    w.interrupt(8);
    let (early, tries) = scripted(&w, 8, vec![Ok(false)]);
    assert_eq!(early.recv_timeout(LONG), Ok(WaitEnd::Interrupted));
    assert_eq!(tries.load(Ordering::SeqCst), 0);
    // Another request is not touched by it.
    let (other, _) = scripted(&w, 9, vec![Ok(false), Ok(true)]);
    assert_eq!(other.recv_timeout(LONG), Ok(WaitEnd::Taken));
}

#[test]
fn waits_beyond_the_cap_fail_with_enolck() {
    let w = Waiters::new(2);
    let (a, _) = scripted(&w, 1, vec![Ok(false)]);
    let (b, _) = scripted(&w, 2, vec![Ok(false)]);
    let (c, _) = scripted(&w, 3, vec![Ok(false)]);
    assert_eq!(c.recv_timeout(LONG), Ok(WaitEnd::TooMany));
    assert_eq!(w.len(), 2);
    w.interrupt(1);
    w.interrupt(2);
    assert_eq!(a.recv_timeout(LONG), Ok(WaitEnd::Interrupted));
    assert_eq!(b.recv_timeout(LONG), Ok(WaitEnd::Interrupted));
}

/// Two mount daemons of one ReadWriteMany volume on two nodes are each pid 1 in their
/// Pod and probe the volume's shared directory at the same moment, on a backend
/// without `O_TMPFILE` (GlusterFS): a probe file named after the pid alone was made by
/// one and refused to the other (EEXIST), whose mount then kept its locks on its own
/// node while its MountPod said otherwise. Here: threads of one process (one pid) in
/// one directory.
#[test]
fn probes_with_one_pid_in_one_directory_do_not_collide() {
    let dir = tempfile::tempdir().unwrap();
    let d = std::fs::File::open(dir.path()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..200 {
                    super::probe_locks_in(std::os::fd::AsFd::as_fd(&d), true, false)
                        .expect("a probe beside another one");
                }
            });
        }
    });
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "probe files left"
    );
}
