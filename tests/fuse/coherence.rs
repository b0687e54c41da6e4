//! Close-to-open through two mounts of one backend (two nodes of a ReadWriteMany
//! volume, with the cache lifetimes Tessera uses for a shared backend): what one mount
//! writes and closes is what the other reads when it opens the file next — data, size
//! and mtime — compared with two bind mounts of the same directory.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use crate::locks::{Pair, both_pairs};
use crate::support::Pattern;

/// xorshift64: the sizes of the rewrites, reproducible.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn fstat(f: &fs::File) -> libc::stat {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid descriptor and output buffer.
    assert_eq!(unsafe { libc::fstat(f.as_raw_fd(), st.as_mut_ptr()) }, 0);
    // SAFETY: fstat succeeded.
    unsafe { st.assume_init() }
}

fn rewrites(p: &Pair, rounds: u32) {
    let n = p.name();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = Vec::new();
    for round in 0..rounds {
        // 0 to 256 KiB, often across a page boundary, sometimes empty.
        let len = (next(&mut rng) % ((256 << 10) + 1)) as usize;
        buf.resize(len, 0);
        Pattern::new(round as u64 + 1).fill(&mut buf);
        let mut w = fs::File::create(p.a("shared")).unwrap();
        w.write_all(&buf).unwrap();
        drop(w);
        // Read-only opens may use kernel passthrough; read-write ones are served
        // through the kernel's page cache.
        let mut r = fs::OpenOptions::new()
            .read(true)
            .write(round % 2 == 1)
            .open(p.b("shared"))
            .unwrap();
        let mut got = Vec::with_capacity(len);
        r.read_to_end(&mut got).unwrap();
        // fstat(2), as C programs ask: std's metadata() asks statx for the birth
        // time too, which FUSE never caches, so it would always see fresh attributes.
        let st = fstat(&r);
        let truth = fs::metadata(p.source("shared")).unwrap();
        assert_eq!(got.len(), len, "{n} round {round}: bytes read through B");
        assert!(got == buf, "{n} round {round}: data through B");
        assert_eq!(
            st.st_size as usize, len,
            "{n} round {round}: size through B"
        );
        assert_eq!(
            (st.st_mtime, st.st_mtime_nsec),
            (truth.mtime(), truth.mtime_nsec()),
            "{n} round {round}: mtime through B"
        );
    }
}

#[test]
fn a_file_rewritten_through_one_mount_reads_back_whole_and_new_through_the_other() {
    both_pairs(|p| rewrites(p, 1000));
}

/// An OFD lock (`F_OFD_SETLKW`) of the whole file, or its release.
fn ofd(f: &fs::File, typ: i32) {
    // SAFETY: plain old data; zero is valid for every field.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: valid descriptor and flock struct.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLKW, &fl) };
    assert_eq!(r, 0, "F_OFD_SETLKW: {}", std::io::Error::last_os_error());
}

/// What SQLite does: both sides keep the file open; a writer changes it under a write
/// lock, and a reader that takes a read lock afterwards reads the new bytes, not the
/// pages its kernel cached before.
#[test]
fn data_written_under_a_lock_is_read_under_the_next_lock() {
    use std::os::unix::fs::FileExt;
    both_pairs(|p| {
        let n = p.name();
        const LEN: usize = 64 << 10;
        let mut expected = vec![0u8; LEN];
        Pattern::new(7).fill(&mut expected);
        fs::write(p.a("db"), &expected).unwrap();
        let open = |path| {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap()
        };
        let (writer, reader) = (open(p.a("db")), open(p.b("db")));
        let mut got = vec![0u8; LEN];
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for round in 0..200 {
            // The reader's kernel caches the pages.
            ofd(&reader, libc::F_RDLCK);
            reader.read_exact_at(&mut got, 0).unwrap();
            assert!(got == expected, "{n} round {round}: before the write");
            ofd(&reader, libc::F_UNLCK);
            // One 4 KiB page rewritten under a write lock on the other side.
            let page = (next(&mut rng) % (LEN as u64 / 4096)) as usize * 4096;
            Pattern::new(round + 100).fill(&mut expected[page..page + 4096]);
            ofd(&writer, libc::F_WRLCK);
            writer
                .write_all_at(&expected[page..page + 4096], page as u64)
                .unwrap();
            ofd(&writer, libc::F_UNLCK);
            ofd(&reader, libc::F_RDLCK);
            reader.read_exact_at(&mut got, 0).unwrap();
            ofd(&reader, libc::F_UNLCK);
            assert!(
                got == expected,
                "{n} round {round}: page {page} after the write"
            );
        }
    });
}

/// A name another client made after this mount's kernel saw it missing (two nodes
/// creating one file at once; made certain here by a long negative cache and a file
/// created on the backend): `open(O_CREAT)` without `O_EXCL` opens what is there, as
/// it does on the backend itself, never EEXIST (SQLite then falls back to a read-only
/// open and fails its writes); with `O_TRUNC` it truncates it; `O_EXCL` is EEXIST.
#[test]
fn create_of_a_name_made_elsewhere_opens_it() {
    let m = crate::support::Mount::builder()
        .arg("--negative-timeout=60")
        .mount();
    for name in ["late", "late-trunc", "late-excl"] {
        let missing = fs::metadata(m.path(name)).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{name}");
        fs::write(m.backing(name), b"theirs").unwrap();
    }
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(m.path("late"))
        .expect("O_CREAT of a name made elsewhere opens it");
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "theirs");
    f.write_all(b", ours").unwrap();
    drop(f);
    assert_eq!(fs::read(m.backing("late")).unwrap(), b"theirs, ours");

    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("late-trunc"))
        .expect("O_CREAT|O_TRUNC of a name made elsewhere opens it");
    assert_eq!(f.metadata().unwrap().len(), 0);
    drop(f);
    assert_eq!(fs::metadata(m.backing("late-trunc")).unwrap().len(), 0);

    let e = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.path("late-excl"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    assert_eq!(fs::read(m.backing("late-excl")).unwrap(), b"theirs");
}
