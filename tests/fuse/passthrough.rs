//! Kernel passthrough on this kernel (Linux >= 6.9): read-only opens are served by the
//! kernel from the backing file, so no read reaches the daemon; writes still do (that
//! is how the quota sees them). The daemon's counters, logged when it unmounts, tell.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use crate::support::{FNV_OFFSET, Mount, Pattern, checksum_file, counters, fnv1a};

fn write_file(path: &std::path::Path, len: usize) -> u64 {
    let mut buf = vec![0u8; len];
    Pattern::new(len as u64).fill(&mut buf);
    let mut f = fs::File::create(path).unwrap();
    f.write_all(&buf).unwrap();
    fnv1a(FNV_OFFSET, &buf)
}

#[test]
fn reads_of_read_only_opens_bypass_the_daemon() {
    let mut m = Mount::new();
    let hash = write_file(&m.path("f"), 16 << 20);
    for _ in 0..3 {
        assert_eq!(checksum_file(&m.path("f")).unwrap(), (hash, 16 << 20));
    }
    // mmap and pread go through the backing file as well.
    let f = fs::File::open(m.path("f")).unwrap();
    let mut buf = [0u8; 4096];
    f.read_exact_at(&mut buf, 5 << 20).unwrap();
    drop(f);
    let c = counters(&m.stop());
    assert_eq!(c["passthrough_failures"], 0, "{c:?}");
    assert!(c["opens_passthrough"] >= 4, "{c:?}");
    assert_eq!(c["reads"], 0, "a read reached the daemon: {c:?}");
    assert_eq!(
        c["write_bytes"],
        16 << 20,
        "writes go through the daemon: {c:?}"
    );
}

#[test]
fn without_passthrough_reads_reach_the_daemon() {
    let mut m = Mount::builder().arg("--no-passthrough").mount();
    let hash = write_file(&m.path("f"), 1 << 20);
    assert_eq!(checksum_file(&m.path("f")).unwrap(), (hash, 1 << 20));
    let c = counters(&m.stop());
    assert_eq!(c["opens_passthrough"], 0, "{c:?}");
    assert!(c["reads"] > 0, "{c:?}");
}

#[test]
fn write_only_direct_writes_are_seen_by_cached_and_passthrough_readers() {
    let mut m = Mount::new();
    fs::write(m.path("f"), vec![b'a'; 1 << 20]).unwrap();
    // A read-write open makes the readers cached; fill their page cache.
    let rw = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f"))
        .unwrap();
    let cached = fs::File::open(m.path("f")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    cached.read_exact_at(&mut buf, 0).unwrap();
    // A write-only open is direct I/O: its writes must not leave stale cached pages.
    let wo = fs::OpenOptions::new()
        .write(true)
        .open(m.path("f"))
        .unwrap();
    wo.write_all_at(b"cccc", 8192).unwrap();
    cached.read_exact_at(&mut buf[..4], 8192).unwrap();
    assert_eq!(&buf[..4], b"cccc");
    drop((rw, cached));
    // The kernel tells the daemon of those releases asynchronously: let them land.
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Only the write-only open left: a new reader is passthrough and sees the write
    // and the next ones.
    let pt = fs::File::open(m.path("f")).unwrap();
    pt.read_exact_at(&mut buf[..4], 8192).unwrap();
    assert_eq!(&buf[..4], b"cccc");
    wo.write_all_at(b"dddd", 8192).unwrap();
    pt.read_exact_at(&mut buf[..4], 8192).unwrap();
    assert_eq!(&buf[..4], b"dddd");
    drop((wo, pt));
    let c = counters(&m.stop());
    assert!(c["opens_direct"] >= 2, "{c:?}");
    assert!(c["opens_passthrough"] >= 1, "{c:?}");
}

#[test]
fn writers_wait_for_passthrough_readers_and_readers_join_writers() {
    let mut m = Mount::builder().capacity(4 << 20).mount();
    fs::write(m.path("f"), vec![b'a'; 8192]).unwrap();

    // A passthrough reader holds the file: a writer would have to be passthrough as
    // well, out of the quota's sight, so it is refused as busy.
    let reader = fs::File::open(m.path("f")).unwrap();
    let e = fs::OpenOptions::new()
        .write(true)
        .open(m.path("f"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ETXTBSY));
    // truncate(2) needs no open: it goes through the daemon and the quota.
    let path = std::ffi::CString::new(m.path("f").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::truncate(path.as_ptr(), 8192) }, 0);
    drop(reader);

    // Read-write writer first: readers join it in cached mode and see its writes.
    let writer = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("f"))
        .unwrap();
    let mut reader = fs::File::open(m.path("f")).unwrap();
    writer.write_all_at(b"bbbb", 4096).unwrap();
    let mut all = Vec::new();
    reader.read_to_end(&mut all).unwrap();
    assert_eq!(&all[4096..4100], b"bbbb");
    let e = writer.write_all_at(&vec![0u8; 5 << 20], 8192).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    writer.set_len(8192).unwrap();
    drop((reader, writer));

    // Everyone gone: the next reader is passthrough again and sees it all. The kernel
    // tells the daemon of a release asynchronously, so give the releases a moment to
    // land first (an open racing them is served cached, which is correct too).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut again = Vec::new();
    fs::File::open(m.path("f"))
        .unwrap()
        .read_to_end(&mut again)
        .unwrap();
    assert_eq!(again, all);
    let c = counters(&m.stop());
    assert_eq!(c["opens_busy"], 1, "{c:?}");
    assert!(c["opens_passthrough"] >= 2, "{c:?}");
    assert!(c["opens_cached"] >= 2, "{c:?}");
}

#[test]
fn a_reader_that_just_closed_never_makes_a_writer_busy() {
    // close() releases a passthrough open in the kernel at once but tells the daemon
    // asynchronously; the writer right after it must not see the file as busy.
    let mut m = Mount::new();
    fs::write(m.path("f"), b"0").unwrap();
    for i in 0..300 {
        let mut s = String::new();
        fs::File::open(m.path("f"))
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        let mut w = fs::OpenOptions::new()
            .append(true)
            .open(m.path("f"))
            .unwrap_or_else(|e| panic!("round {i}: {e}"));
        w.write_all(b"1").unwrap();
    }
    assert_eq!(fs::read(m.backing("f")).unwrap().len(), 301);
    let c = counters(&m.stop());
    assert_eq!(c["opens_busy"], 0, "{c:?}");
}
