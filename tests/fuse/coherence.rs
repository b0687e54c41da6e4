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
