//! The counters file: classes, slot order, buckets, the byte layout both sides rely
//! on, and the two layouts an agent reads (this one and an old daemon's v1).

use super::*;

#[test]
fn errnos_fall_into_their_classes() {
    for (errno, class) in [
        (libc::ENOENT, "ENOENT"),
        (libc::EEXIST, "EEXIST"),
        (libc::EACCES, "EACCES"),
        (libc::EPERM, "EACCES"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::EDQUOT, "ENOSPC"),
        (libc::EROFS, "EROFS"),
        (libc::EIO, "EIO"),
        (libc::EINVAL, "EINVAL"),
        (libc::EXDEV, "other"),
        (libc::ENAMETOOLONG, "other"),
    ] {
        assert_eq!(ErrnoClass::of(errno).as_str(), class, "errno {errno}");
    }
}

#[test]
fn slot_order_is_the_order_of_the_lists() {
    for (i, op) in Op::ALL.iter().enumerate() {
        assert_eq!(*op as usize, i, "{op:?}");
    }
    for (i, class) in ErrnoClass::ALL.iter().enumerate() {
        assert_eq!(*class as usize, i, "{class:?}");
    }
    for op in Op::ALL {
        let h = HISTOGRAM_OF[op as usize];
        match TIMED.iter().position(|t| *t == op) {
            Some(i) => assert_eq!(h as usize, i, "{op:?}"),
            None => assert_eq!(h, u8::MAX, "{op:?}"),
        }
    }
}

#[test]
fn durations_fall_into_their_buckets() {
    for (ns, want) in [
        (0, 0),
        (4_999, 0),
        (5_000, 0),
        (5_001, 1),
        (10_000, 1),
        (99_999, 4),
        (100_000, 4),
        (1_000_000, 7),
        (1_000_001, 8),
        (999_999_999, 14),
        (1_000_000_000, 14),
        (1_000_000_001, 15),
        (u64::MAX, 15),
    ] {
        assert_eq!(bucket(ns), want, "{ns} ns");
    }
    assert!(BUCKETS_NS.is_sorted_by(|a, b| a < b), "strictly rising");
}

#[test]
fn a_table_counts_into_its_slots() {
    let t = Table::new();
    t.op(Op::Read);
    t.op(Op::Read);
    t.op(Op::Lookup);
    t.took(Op::Read, 7_000);
    t.took(Op::Read, 2_000_000_000);
    t.took(Op::Lookup, 1_000);
    t.took(Op::Rename, 300);
    t.error(libc::ENOSPC);
    t.error(libc::EDQUOT);
    t.bytes(Slot::ReadBytes, 10);
    t.bytes(Slot::WrittenBytes, 7);
    t.set_quota(100, 1000);
    let s = t.snapshot();
    assert_eq!(s.ops[Op::Read as usize], 2);
    assert_eq!(s.ops[Op::Lookup as usize], 1);
    assert_eq!(s.ops.iter().sum::<u64>(), 3);
    assert_eq!(s.errors[ErrnoClass::Enospc as usize], 2);
    assert_eq!(s.errors.iter().sum::<u64>(), 2);
    assert_eq!(
        (s.read_bytes, s.written_bytes, s.quota_used, s.quota_limit),
        (10, 7, 100, 1000)
    );
    let d = s.durations.expect("this layout has durations");
    assert_eq!(d.nanos[Op::Read as usize], 2_000_007_000);
    assert_eq!(d.nanos[Op::Lookup as usize], 1_000);
    assert_eq!(
        d.nanos[Op::Rename as usize],
        300,
        "untimed kinds have a total"
    );
    let read = TIMED.iter().position(|t| *t == Op::Read).unwrap();
    let mut want = [0; N_BUCKETS];
    want[1] = 1; // 7 µs: (5 µs, 10 µs]
    want[N_BUCKETS - 1] = 1; // 2 s: above 1 s
    assert_eq!(d.buckets[read], want);
    assert_eq!(d.buckets.iter().flatten().sum::<u64>(), 3);
}

#[test]
fn a_guard_times_its_request_until_dropped() {
    let t: &'static Table = Box::leak(Box::new(Table::new()));
    let timed = t.timed(Op::Write);
    assert_eq!(t.snapshot().ops[Op::Write as usize], 1, "counted on entry");
    std::thread::sleep(std::time::Duration::from_millis(2));
    drop(timed);
    let d = t.snapshot().durations.unwrap();
    let ns = d.nanos[Op::Write as usize];
    assert!((2_000_000..1_000_000_000).contains(&ns), "{ns} ns");
    let write = TIMED.iter().position(|t| *t == Op::Write).unwrap();
    assert_eq!(d.buckets[write][bucket(ns)], 1);
}

/// The byte offsets a reader of this layout relies on, read back from a real file.
#[test]
fn the_layout_is_where_the_doc_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.counters");
    let file = CountersFile::open(&path).unwrap();
    let t = file.table();
    t.op(Op::Lookup); // kind 0
    t.took(Op::Lookup, 20_000); // bucket 2 of histogram 0
    t.op(Op::Lock); // kind 21
    t.took(Op::Lock, 9);
    t.error(libc::ENOENT); // class 0
    t.set_quota(11, 12);
    t.took(Op::Fsync, 2_000_000_000); // histogram 5, bucket 15
    let bytes = std::fs::read(&path).unwrap();
    let word = |off: usize| u64::from_ne_bytes(bytes[off..off + 8].try_into().unwrap());
    let ops = 64;
    let cells = ops + 64 * N_OPS;
    let hists = cells + 64 * SLOTS;
    for (what, off, want) in [
        ("magic", 0, u64::from_le_bytes(*b"TSRFUSE2")),
        ("shape", 8, SHAPE),
        ("lookup count", ops, 1),
        ("lookup nanos", ops + 8, 20_000),
        ("lock count", ops + 64 * 21, 1),
        ("lock nanos", ops + 64 * 21 + 8, 9),
        ("ENOENT", cells, 1),
        ("quota used", cells + 64 * (N_ERRNOS + 2), 11),
        ("quota limit", cells + 64 * (N_ERRNOS + 3), 12),
        ("lookup (5 µs, 25 µs]", hists + 8 * 2, 1),
        ("fsync above 1 s", hists + 128 * 5 + 8 * 15, 1),
    ] {
        assert_eq!(word(off), want, "{what} at {off}");
    }
    assert_eq!(hists + 128 * N_TIMED, size_of::<Table>());
    assert_eq!(SHAPE, 22 | 9 << 8 | 4 << 16 | 6 << 24 | 16 << 32);
}

/// A v1 file as a daemon of the previous release writes it: the magic, the slot count
/// (35), then a 64-byte slot per counter (22 kinds, 9 classes, 4 more).
fn v1_file(slots: u64, values: &[(usize, u64)]) -> Vec<u8> {
    let mut bytes = vec![0u8; 4096];
    bytes[..8].copy_from_slice(b"TSRFUSE1");
    bytes[8..16].copy_from_slice(&slots.to_ne_bytes());
    for (slot, v) in values {
        let off = 64 + 64 * slot;
        bytes[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }
    bytes
}

#[test]
fn an_old_daemons_v1_file_is_read_without_durations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.counters");
    // 3 reads, 2 writes, 1 lock; 4 ENOSPC; 100 bytes read, 200 written; quota 5 of 6.
    let values = [
        (9, 3),
        (10, 2),
        (21, 1),
        (22 + 4, 4),
        (31, 100),
        (32, 200),
        (33, 5),
        (34, 6),
    ];
    std::fs::write(&path, v1_file(35, &values)).unwrap();
    let s = read(&path).unwrap().expect("a v1 file is read");
    assert_eq!(s.ops[Op::Read as usize], 3);
    assert_eq!(s.ops[Op::Write as usize], 2);
    assert_eq!(s.ops[Op::Lock as usize], 1);
    assert_eq!(s.ops.iter().sum::<u64>(), 6);
    assert_eq!(s.errors[ErrnoClass::Enospc as usize], 4);
    assert_eq!(s.errors.iter().sum::<u64>(), 4);
    assert_eq!(
        (s.read_bytes, s.written_bytes, s.quota_used, s.quota_limit),
        (100, 200, 5, 6)
    );
    assert_eq!(s.durations, None);
    // A v1 magic with another slot count is not a v1 file.
    std::fs::write(&path, v1_file(36, &values)).unwrap();
    assert_eq!(read(&path).unwrap(), None);
}

#[test]
fn a_new_daemon_replaces_a_v1_file_and_counts_from_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.counters");
    std::fs::write(&path, v1_file(35, &[(9, 3), (31, 100)])).unwrap();
    // The agent may have the old file mapped: it keeps its pages and counts.
    let held = File::open(&path).unwrap();
    let file = CountersFile::open(&path).unwrap();
    file.table().op(Op::Read);
    file.table().took(Op::Read, 1_000);
    let s = read(&path).unwrap().unwrap();
    assert_eq!(s.ops[Op::Read as usize], 1, "counted from zero");
    assert_eq!(s.read_bytes, 0);
    assert_eq!(s.durations.unwrap().nanos[Op::Read as usize], 1_000);
    let mut old = vec![0u8; FILE_LEN];
    std::io::Read::read_exact(&mut &held, &mut old).unwrap();
    assert_eq!(
        old,
        v1_file(35, &[(9, 3), (31, 100)]),
        "the old file untouched"
    );
}

#[test]
fn files_of_another_size_or_magic_are_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.counters");
    std::fs::write(&short, [0u8; 64]).unwrap();
    assert_eq!(read(&short).unwrap(), None);
    let zeros = dir.path().join("zeros.counters");
    std::fs::write(&zeros, vec![0u8; FILE_LEN]).unwrap();
    assert_eq!(read(&zeros).unwrap(), None);
    // This magic with another shape (a kind added without a new magic) is not read.
    let mut other = vec![0u8; FILE_LEN];
    other[..8].copy_from_slice(b"TSRFUSE2");
    other[8..16].copy_from_slice(&(SHAPE + 1).to_ne_bytes());
    let reshaped = dir.path().join("reshaped.counters");
    std::fs::write(&reshaped, &other).unwrap();
    assert_eq!(read(&reshaped).unwrap(), None);
    let link = dir.path().join("link.counters");
    std::os::unix::fs::symlink(&zeros, &link).unwrap();
    assert!(read(&link).is_err(), "a symlink is not followed");
    assert!(read(&dir.path().join("missing.counters")).is_err());
}

#[test]
fn a_reader_sees_what_the_writer_counts_and_a_restart_counts_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.counters");
    // An unusable file in the way (a reader may have it mapped) is replaced.
    std::fs::write(&path, vec![1u8; FILE_LEN]).unwrap();
    let held = File::open(&path).unwrap();
    let writer = map_for_counting(&path).unwrap();
    writer.table().op(Op::Write);
    writer.table().took(Op::Write, 30_000);
    writer.table().bytes(Slot::WrittenBytes, 4096);
    let seen = read(&path).unwrap().expect("a counters file");
    assert_eq!(seen.ops[Op::Write as usize], 1);
    assert_eq!(seen.written_bytes, 4096);
    assert_eq!(
        held.metadata().unwrap().len(),
        FILE_LEN as u64,
        "not truncated"
    );
    drop(writer);
    // A restarted daemon keeps the counts and the durations.
    let again = map_for_counting(&path).unwrap();
    again.table().op(Op::Write);
    again.table().took(Op::Write, 10_000);
    let s = read(&path).unwrap().unwrap();
    assert_eq!(s.ops[Op::Write as usize], 2);
    assert_eq!(s.durations.unwrap().nanos[Op::Write as usize], 40_000);
}

/// The hot path's cost, printed (`cargo test -p tessera-fuse --release -- --nocapture
/// hot_path`): a timed request (count, two clock reads, nanoseconds, bucket) against
/// the count alone. Bounded loosely so that only a gross regression fails.
#[test]
fn hot_path_cost() {
    let t: &'static Table = Box::leak(Box::new(Table::new()));
    const N: u32 = 1_000_000;
    let per = |f: &dyn Fn()| {
        let start = Instant::now();
        for _ in 0..N {
            f();
        }
        start.elapsed().as_nanos() as f64 / f64::from(N)
    };
    let counted = per(&|| t.op(std::hint::black_box(Op::Read)));
    let timed = per(&|| drop(t.timed(std::hint::black_box(Op::Read))));
    println!("BENCH counters count_ns={counted:.1} timed_ns={timed:.1}");
    assert!(timed < 2_000.0, "a timed request costs {timed:.1} ns");
}
