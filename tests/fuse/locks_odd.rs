//! Odd and hostile lock use through two mounts of one backend, each answered as the
//! backend answers it through two bind mounts: byte ranges at the ends of `off_t`, a
//! lock on a directory, a thousand waiters (the daemon keeps serving meanwhile, and
//! its threads and descriptors return to where they were once they are gone).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::locks::{EAGAIN, How, Locker, after_release, both_pairs, probe};

/// The errno of a non-blocking attempt through `path` opened with `flags`.
fn probe_with(path: &Path, flags: i32, how: How, exclusive: bool) -> i32 {
    let mut l = Locker::spawn_with(path, flags, how, exclusive, false);
    let r = l.result();
    l.exit();
    r
}

#[test]
fn byte_ranges_at_the_ends_of_off_t_answer_as_on_the_backend() {
    let max = i64::MAX;
    let held = How::Posix {
        start: max - 1,
        len: 1,
    };
    let probes = [
        held,
        How::Posix { start: max, len: 1 },
        How::Posix {
            start: max - 2,
            len: 1,
        },
        How::Posix {
            start: max - 10,
            len: 0,
        },
        How::Posix { start: 0, len: 0 },
        How::Posix { start: max, len: 2 },
        How::Posix {
            start: 100,
            len: -50,
        },
        How::Posix { start: -1, len: 1 },
    ];
    let mut answers = Vec::new();
    both_pairs(|p| {
        fs::write(p.a("f"), b"x").unwrap();
        let mut holder = Locker::spawn(&p.a("f"), held, true, false);
        let mut got = vec![holder.result()];
        got.extend(probes.iter().map(|&how| probe(&p.b("f"), how, true)));
        answers.push((p.name(), got));
    });
    eprintln!("{answers:?}");
    let (bind, tessera) = (&answers[0].1, &answers[1].1);
    assert!(
        bind.contains(&EAGAIN) && bind.contains(&0) && bind.contains(&libc::EINVAL),
        "the comparator sees conflicts, grants and refusals: {bind:?}"
    );
    assert_eq!(tessera, bind, "(probes: {probes:?})");
}

#[test]
fn a_lock_on_a_directory_is_kept_by_each_mount() {
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY;
    both_pairs(|p| {
        let n = p.name();
        fs::create_dir(p.a("d")).unwrap();
        for (how, exclusive) in [(How::Flock, true), (How::WHOLE, false)] {
            let mut holder = Locker::spawn_with(&p.a("d"), dir_flags, how, exclusive, false);
            assert_eq!(holder.result(), 0, "{n} {how:?}: a lock on a directory");
            let conflict = match how {
                How::Flock => probe_with(&p.a("d"), dir_flags, How::Flock, true),
                How::Posix { .. } => probe(&p.a("d/.."), How::WHOLE, false),
            };
            if how == How::Flock {
                assert_eq!(conflict, EAGAIN, "{n}: flock -x beside it, same mount");
            }
            // Through the other mount: the backend sees it through bind mounts; FUSE
            // has no lock operation for directories (the kernel keeps them, per
            // mount), so through Tessera the other node does not.
            let other = probe_with(&p.b("d"), dir_flags, How::Flock, true);
            if how == How::Flock {
                let expected = if p.is_tessera() { 0 } else { EAGAIN };
                assert_eq!(other, expected, "{n}: flock -x through the other mount");
            }
            holder.exit();
        }
    });
}

/// (threads, open descriptors) of a process.
fn counts(pid: i32) -> (usize, usize) {
    let n = |d: String| fs::read_dir(d).map(|r| r.count()).unwrap_or(0);
    (n(format!("/proc/{pid}/task")), n(format!("/proc/{pid}/fd")))
}

#[test]
fn a_thousand_waiters_leave_the_daemon_serving_and_nothing_behind() {
    const WAITERS: usize = 1000;
    let mut figures = Vec::new();
    both_pairs(|p| {
        let n = p.name();
        fs::write(p.a("f"), b"x").unwrap();
        fs::write(p.a("made-through-a"), b"y").unwrap();
        // Both mounts know both files before counting (each inode the kernel holds
        // costs the daemon a descriptor).
        for f in ["f", "made-through-a"] {
            fs::metadata(p.a(f)).unwrap();
            fs::metadata(p.b(f)).unwrap();
        }
        let daemons = p.daemons();
        let before: Vec<_> = daemons.iter().map(|&d| counts(d)).collect();
        let mut posix = Locker::spawn(&p.a("f"), How::WHOLE, true, false);
        let mut flock = Locker::spawn(&p.a("f"), How::Flock, true, false);
        assert_eq!((posix.result(), flock.result()), (0, 0), "{n}: holders");
        let spawned = Instant::now();
        let mut waiters: Vec<Locker> = (0..WAITERS)
            .map(|i| {
                let how = if i % 2 == 0 { How::WHOLE } else { How::Flock };
                Locker::spawn(&p.b("f"), how, true, true)
            })
            .collect();
        let spawn_time = spawned.elapsed();
        // Every waiter waits.
        std::thread::sleep(Duration::from_millis(500));
        for w in waiters.iter_mut() {
            assert_eq!(w.report(Duration::ZERO), None, "{n}: a waiter got the lock");
        }
        let during: Vec<_> = daemons.iter().map(|&d| counts(d)).collect();
        // Meanwhile the mount answers: lookups of names it never saw, so each one is
        // a round trip to the daemon, and stats of a file another mount made.
        let mut worst = Duration::ZERO;
        for i in 0..100 {
            let t = Instant::now();
            assert!(fs::metadata(p.b(&format!("missing-{i}"))).is_err());
            assert_eq!(fs::metadata(p.b("made-through-a")).unwrap().len(), 1);
            worst = worst.max(t.elapsed());
        }
        assert!(
            worst < Duration::from_millis(100),
            "{n}: stat took {worst:?}"
        );
        // Kill them all while they wait (their Pods deleted): the locks stay held.
        let killed = Instant::now();
        for w in waiters.drain(..) {
            w.kill();
        }
        let kill_time = killed.elapsed();
        assert_eq!(
            probe(&p.b("f"), How::WHOLE, true),
            EAGAIN,
            "{n}: still held"
        );
        assert_eq!(
            probe(&p.b("f"), How::Flock, true),
            EAGAIN,
            "{n}: still held"
        );
        posix.exit();
        flock.exit();
        assert_eq!(probe(&p.b("f"), How::WHOLE, true), 0, "{n}: released");
        let (r, waited) = after_release(p, &p.b("f"), How::Flock);
        assert_eq!(r, 0, "{n}: released (waited {waited:?})");
        // The daemons' threads and descriptors come back to where they were.
        // (Descriptors may end below: inodes the kernel forgot meanwhile.)
        let back = |after: &[(usize, usize)]| {
            after
                .iter()
                .zip(&before)
                .all(|(a, b)| a.0 == b.0 && a.1 <= b.1)
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut after: Vec<_> = daemons.iter().map(|&d| counts(d)).collect();
        while !back(&after) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            after = daemons.iter().map(|&d| counts(d)).collect();
        }
        assert!(
            back(&after),
            "{n}: daemon (threads, fds) before {before:?}, after {after:?}"
        );
        figures.push(format!(
            "{n}: {WAITERS} waiters spawned in {spawn_time:?}, killed in {kill_time:?}; \
             slowest of 100 lookup+stat pairs {worst:?}; daemons (threads, fds) \
             before {before:?} during {during:?} after {after:?}"
        ));
    });
    eprintln!("{}", figures.join("\n"));
}
