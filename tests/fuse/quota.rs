//! The volume quota through a real mount: ENOSPC at the limit with earlier data
//! intact, space given back by deletes, usage counted at start, and a capacity that
//! grows on SIGHUP.

use std::fs;
use std::io::Write;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{FNV_OFFSET, Mount, Pattern, checksum_file, errno, fnv1a, statvfs};

const MIB: u64 = 1 << 20;

/// Write 1 MiB chunks of a pattern until the first error; returns (bytes written,
/// checksum of them, the error's errno).
fn fill(path: &std::path::Path, seed: u64, max: u64) -> (u64, u64, i32) {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let mut p = Pattern::new(seed);
    let mut buf = vec![0u8; MIB as usize];
    let (mut written, mut hash) = (0u64, FNV_OFFSET);
    while written < max {
        p.fill(&mut buf);
        // write (not write_all): a write cut at the quota is short, the next fails.
        match f.write(&buf) {
            Ok(n) => {
                hash = fnv1a(hash, &buf[..n]);
                written += n as u64;
            }
            Err(e) => return (written, hash, errno(&e)),
        }
    }
    (written, hash, 0)
}

#[test]
fn writes_past_the_quota_fail_with_enospc_and_keep_earlier_data() {
    let m = Mount::builder().capacity(8 * MIB + 12345).mount();
    let (written, hash, err) = fill(&m.path("f"), 1, 64 * MIB);
    assert_eq!(err, libc::ENOSPC);
    assert_eq!(written, 8 * MIB + 12345, "filled exactly to the quota");
    assert_eq!(checksum_file(&m.path("f")).unwrap(), (hash, written));
    assert_eq!(checksum_file(&m.backing("f")).unwrap(), (hash, written));
    // Other ways of growing fail too; nothing changed the file.
    let e = fs::write(m.path("g"), b"x").unwrap_err();
    assert_eq!(errno(&e), libc::ENOSPC);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(m.path("f"))
        .unwrap();
    assert_eq!(errno(&f.set_len(9 * MIB).unwrap_err()), libc::ENOSPC);
    assert_eq!(checksum_file(&m.backing("f")).unwrap(), (hash, written));
    assert_eq!(statvfs(&m.mnt).blocks_available(), 0);
    drop(f);
    // Deleting gives the space back.
    fs::remove_file(m.path("f")).unwrap();
    fs::remove_file(m.path("g")).ok();
    let (written, _, err) = fill(&m.path("h"), 2, 4 * MIB);
    assert_eq!((written, err), (4 * MIB, 0));
}

#[test]
fn bytes_already_in_the_volume_count_from_the_start() {
    let m = Mount::builder()
        .capacity(4 * MIB)
        .prepare(|src| {
            fs::write(src.join("old"), vec![1u8; 3 * MIB as usize]).unwrap();
            fs::hard_link(src.join("old"), src.join("old-link")).unwrap();
        })
        .mount();
    let st = statvfs(&m.mnt);
    assert_eq!(st.blocks_free() * st.fragment_size(), MIB);
    let (written, _, err) = fill(&m.path("new"), 3, 8 * MIB);
    assert_eq!((written, err), (MIB, libc::ENOSPC));
}

#[test]
fn sighup_rereads_a_grown_capacity_file() {
    let m = Mount::builder()
        .capacity(MIB)
        .capacity_file(2 * MIB)
        .mount();
    // The file wins over --capacity-bytes.
    let st = statvfs(&m.mnt);
    assert_eq!(st.blocks() * st.fragment_size(), 2 * MIB);
    let (written, hash1, err) = fill(&m.path("f"), 4, 16 * MIB);
    assert_eq!((written, err), (2 * MIB, libc::ENOSPC));

    fs::write(&m.capacity_file, (16 * MIB).to_string()).unwrap();
    m.signal(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = statvfs(&m.mnt);
        if st.blocks() * st.fragment_size() == 16 * MIB {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "capacity not reloaded:\n{}",
            m.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (more, _, err) = fill(&m.path("g"), 5, 64 * MIB);
    assert_eq!((more, err), (14 * MIB, libc::ENOSPC));
    // The first file is untouched.
    assert_eq!(checksum_file(&m.backing("f")).unwrap(), (hash1, 2 * MIB));
    // A capacity file that makes no sense is ignored; the daemon keeps serving.
    fs::write(&m.capacity_file, "lots").unwrap();
    m.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_millis(200));
    let st = statvfs(&m.mnt);
    assert_eq!(st.blocks() * st.fragment_size(), 16 * MIB);
}

#[test]
fn unlinked_open_files_hold_their_space_until_closed() {
    let m = Mount::builder().capacity(4 * MIB).mount();
    let mut f = fs::File::create(m.path("f")).unwrap();
    f.write_all(&vec![0u8; 3 * MIB as usize]).unwrap();
    fs::remove_file(m.path("f")).unwrap();
    // Still open: still counted, as the disk space is still in use.
    assert_eq!(
        errno(&fs::write(m.path("g"), vec![0u8; 2 * MIB as usize]).unwrap_err()),
        libc::ENOSPC
    );
    drop(f);
    fs::remove_file(m.path("g")).ok();
    let deadline = Instant::now() + Duration::from_secs(5);
    // Release reaches the daemon asynchronously after close.
    while statvfs(&m.mnt).blocks_free() * statvfs(&m.mnt).fragment_size() != 4 * MIB {
        assert!(Instant::now() < deadline, "space not given back");
        std::thread::sleep(Duration::from_millis(20));
    }
    fs::write(m.path("g"), vec![0u8; 3 * MIB as usize]).unwrap();
}
