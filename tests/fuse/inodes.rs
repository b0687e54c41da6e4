//! Many more inodes than the daemon may hold descriptors: a tree walk through a mount
//! whose daemon runs with `RLIMIT_NOFILE` at 1,024 (before inodes were named by file
//! handles, each inode the kernel knew held a descriptor, and a walk failed with
//! EMFILE once the kernel knew about 1,000 of them).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::Mount;

const PER_DIR: usize = 1000;

/// `files` files of one byte each, `PER_DIR` to a directory.
fn tree(dir: &Path, files: usize) {
    for d in 0..files.div_ceil(PER_DIR) {
        let sub = dir.join(format!("d{d}"));
        fs::create_dir(&sub).unwrap();
        for f in 0..PER_DIR.min(files - d * PER_DIR) {
            fs::write(sub.join(format!("f{f}")), b"x").unwrap();
        }
    }
}

/// readdir + lstat of every entry (what `find -size` does): (entries, bytes, time).
fn walk(root: &Path) -> (usize, u64, Duration) {
    let start = Instant::now();
    let (mut n, mut bytes) = (0, 0);
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("readdir {dir:?}: {e}")) {
            let path = e.unwrap().path();
            let md = fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("lstat {path:?}: {e}"));
            if md.is_dir() {
                dirs.push(path);
            } else {
                n += 1;
                bytes += md.len();
            }
        }
    }
    (n, bytes, start.elapsed())
}

/// A status field of the daemon, in kB (VmHWM: peak RSS).
fn status_kb(pid: i32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or_else(|| panic!("{field} in {status}"))
}

fn walk_with_descriptor_limit(files: usize, limit: u64) {
    let m = Mount::builder()
        .nofile(limit)
        .prepare(move |src| tree(src, files))
        .mount();
    let pid = m.pid().as_raw();
    let (native, _, native_took) = walk(&m.source);
    assert_eq!(native, files);
    let (seen, bytes, took) = walk(&m.mnt);
    assert_eq!((seen, bytes), (files, files as u64), "{}", m.log());
    // Once more, now that the kernel knows every inode (each a cached node id).
    let (again, _, again_took) = walk(&m.mnt);
    assert_eq!(again, files);
    // Every file is still readable.
    assert_eq!(fs::read(m.path("d0/f0")).unwrap(), b"x");
    let last = files - 1;
    let last = format!("d{}/f{}", last / PER_DIR, last % PER_DIR);
    assert_eq!(fs::read(m.path(&last)).unwrap(), b"x");
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    assert!((fds as u64) < limit, "{fds} descriptors open");
    assert!(
        m.log().contains("inodes named by file handles"),
        "{}",
        m.log()
    );
    eprintln!(
        "{files} files, RLIMIT_NOFILE {limit}: walk through the mount {took:.2?} \
         (again {again_took:.2?}), native {native_took:.2?}; daemon peak RSS {} MiB, \
         {fds} descriptors open after the walks",
        status_kb(pid, "VmHWM") / 1024
    );
}

#[test]
fn a_walk_of_20000_files_works_with_1024_descriptors() {
    walk_with_descriptor_limit(20_000, 1024);
}

/// By hand: `cargo test --release --test fuse -- --ignored --nocapture inodes::`.
#[test]
#[ignore = "a million files take minutes to create and walk"]
fn a_walk_of_a_million_files_works_with_1024_descriptors() {
    walk_with_descriptor_limit(1_000_000, 1024);
}
