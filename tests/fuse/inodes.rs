//! Many more inodes than the daemon may hold descriptors: a tree walk through a mount
//! whose daemon runs with `RLIMIT_NOFILE` at 1,024 (before inodes were named by file
//! handles, each inode the kernel knew held a descriptor, and a walk failed with
//! EMFILE once the kernel knew about 1,000 of them).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::Mount;

const PER_DIR: usize = 1000;

/// The name of the `i`th file.
fn file(i: usize) -> String {
    format!("d{}/f{}", i / PER_DIR, i % PER_DIR)
}

/// `files` empty files, `PER_DIR` to a directory, but the first and the last hold
/// one byte each.
fn tree(dir: &Path, files: usize) {
    for d in 0..files.div_ceil(PER_DIR) {
        let sub = dir.join(format!("d{d}"));
        fs::create_dir(&sub).unwrap();
        for f in 0..PER_DIR.min(files - d * PER_DIR) {
            fs::File::create(sub.join(format!("f{f}"))).unwrap();
        }
    }
    for i in [0, files - 1] {
        fs::write(dir.join(file(i)), b"x").unwrap();
    }
}

/// `find DIR -type f`: (files listed, time, find's own peak RSS in KiB).
fn find(dir: &Path) -> (usize, Duration, u64) {
    let start = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%M", "find"])
        .arg(dir)
        .args(["-type", "f"])
        .output()
        .expect("run find under /usr/bin/time");
    let took = start.elapsed();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rss = stderr.trim().lines().last().and_then(|l| l.parse().ok());
    let listed = out.stdout.iter().filter(|&&b| b == b'\n').count();
    (listed, took, rss.unwrap_or_else(|| panic!("{stderr}")))
}

/// readdir + lstat of every entry (what `find -size` does): (files, bytes, time).
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
    let (native, native_took, native_rss) = find(&m.source);
    assert_eq!(native, files);
    let (found, took, _) = find(&m.mnt);
    assert_eq!(found, files, "{}", m.log());
    // Once more with an lstat of each, now that the kernel knows every inode.
    let (seen, bytes, again_took) = walk(&m.mnt);
    assert_eq!((seen, bytes), (files, 2), "{}", m.log());
    // The first and the last file are still readable.
    for i in [0, files - 1] {
        assert_eq!(fs::read(m.path(&file(i))).unwrap(), b"x");
    }
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    assert!((fds as u64) < limit, "{fds} descriptors open");
    assert!(
        m.log().contains("inodes named by file handles"),
        "{}",
        m.log()
    );
    eprintln!(
        "{files} files, RLIMIT_NOFILE {limit}: find through the mount {took:.2?}, then \
         readdir+lstat {again_took:.2?}; daemon peak RSS {} MiB, {fds} descriptors open \
         after the walks. find on the backend directly: {native_took:.2?}, its peak RSS \
         {} MiB",
        status_kb(pid, "VmHWM") / 1024,
        native_rss / 1024
    );
}

#[test]
fn a_walk_of_20000_files_works_with_1024_descriptors() {
    walk_with_descriptor_limit(20_000, 1024);
}

/// By hand: `cargo test --test fuse -- --ignored --nocapture inodes::` (a million
/// inodes in the temporary directory for a few minutes).
#[test]
#[ignore = "a million files take minutes to create and walk"]
fn a_walk_of_a_million_files_works_with_1024_descriptors() {
    walk_with_descriptor_limit(1_000_000, 1024);
}
