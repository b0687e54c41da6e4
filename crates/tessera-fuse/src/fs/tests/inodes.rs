//! Tests of inode naming: file handles with a bounded cache of hot descriptors, what a
//! successor would recover, and the fallback to pinned descriptors.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use super::super::*;
use crate::quota::{Accounting, Enforcement};
use crate::sys::Errno;

const HOT: usize = 8;

fn quota() -> Arc<Enforcement> {
    Arc::new(Accounting::new(1 << 30, 0).into())
}

/// A volume whose inodes are named by handles, or `None` where this process cannot
/// use them (not root: no `CAP_DAC_READ_SEARCH`).
fn handle_volume(files: usize) -> Option<(tempfile::TempDir, VolumeFs)> {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..files {
        std::fs::write(dir.path().join(format!("f{i}")), format!("{i}")).unwrap();
    }
    let fs = VolumeFs::with_hot_fds(dir.path(), Options::default(), quota(), HOT).unwrap();
    match fs.inode_naming() {
        (Naming::FileHandles, HOT) => Some((dir, fs)),
        (Naming::Descriptors(errno), _) if !nix::unistd::geteuid().is_root() => {
            eprintln!("skipped: not root, handles refused ({errno})");
            None
        }
        other => panic!("the temporary directory's filesystem gives handles: {other:?}"),
    }
}

fn name(i: usize) -> String {
    format!("f{i}")
}

#[test]
fn a_thousand_inodes_hold_no_more_descriptors_than_the_cache() {
    let Some((_dir, fs)) = handle_volume(1000) else {
        return;
    };
    let mut ids = Vec::new();
    for i in 0..1000 {
        let attr = fs.lookup(ROOT_ID, OsStr::new(&name(i))).unwrap();
        ids.push(attr.ino);
        assert!(fs.inode_fds() <= HOT + 1, "after {i}: {}", fs.inode_fds());
    }
    assert_eq!(fs.inode_count(), 1001);
    // Every inode answers, cold or hot, and is still itself.
    for (i, &id) in ids.iter().enumerate() {
        let fh = fs.open(id, libc::O_RDONLY).unwrap().fh;
        let mut buf = [0u8; 8];
        let n = fs.read(fh, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], i.to_string().as_bytes());
        fs.release(fh).unwrap();
        assert_eq!(fs.getattr(id, None).unwrap().ino, id);
    }
    assert!(fs.inode_fds() <= HOT + 1, "{}", fs.inode_fds());
    for &id in &ids {
        fs.forget(id, 1);
    }
    assert_eq!(fs.inode_count(), 1);
    assert_eq!(fs.inode_fds(), 1, "only the root's descriptor is left");
}

#[test]
fn the_records_name_every_inode_for_a_successor() {
    let Some((dir, fs)) = handle_volume(20) else {
        return;
    };
    for i in 0..20 {
        for _ in 0..=i % 3 {
            fs.lookup(ROOT_ID, OsStr::new(&name(i))).unwrap();
        }
    }
    let records = fs.inode_records();
    assert_eq!(records.len(), 21);
    assert_eq!(
        (records[0].id, records[0].kind),
        (ROOT_ID, FileKind::Directory)
    );
    // A successor has only the bytes and its own descriptor of the root.
    let root = std::fs::File::open(dir.path()).unwrap();
    for r in &records[1..] {
        let bytes = r.handle.as_ref().expect("a handle for every inode");
        let handle = FileHandle::from_parts(bytes.handle_type(), bytes.bytes()).unwrap();
        let fd = handle.open(root.as_fd(), libc::O_PATH).unwrap();
        let st = crate::sys::fstat(fd.as_fd()).unwrap();
        assert_eq!((st.st_dev, st.st_ino), r.key);
        assert_eq!(r.id, st.st_ino);
        let i: usize = std::fs::read_to_string(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(r.lookups, 1 + (i % 3) as u64, "f{i}");
    }
}

#[test]
fn a_freed_inode_is_stale_and_its_reused_number_gets_a_new_id() {
    let Some((dir, fs)) = handle_volume(1) else {
        return;
    };
    let old = fs.lookup(ROOT_ID, OsStr::new("f0")).unwrap();
    // Removed behind the daemon's back; other lookups push it out of the cache, so
    // nothing holds it and the backing filesystem frees it.
    std::fs::remove_file(dir.path().join("f0")).unwrap();
    for i in 0..2 * HOT {
        std::fs::write(dir.path().join(format!("g{i}")), b"").unwrap();
        let a = fs.lookup(ROOT_ID, OsStr::new(&format!("g{i}"))).unwrap();
        fs.forget(a.ino, 1);
    }
    assert_eq!(fs.getattr(old.ino, None).unwrap_err().errno(), libc::ESTALE);
    // Whatever inode number the next file gets, it is never served as the old id.
    let mut reused = false;
    for i in 0..200 {
        let n = format!("h{i}");
        std::fs::write(dir.path().join(&n), b"new").unwrap();
        let a = fs.lookup(ROOT_ID, OsStr::new(&n)).unwrap();
        assert_ne!(a.ino, old.ino, "{n}");
        if std::fs::symlink_metadata(dir.path().join(&n))
            .unwrap()
            .ino()
            == old.ino
        {
            reused = true;
            assert_eq!(fs.getattr(a.ino, None).unwrap().size, 3);
            break;
        }
    }
    eprintln!("inode number reused: {reused}");
}

#[test]
fn a_filesystem_without_handles_pins_a_descriptor_per_inode() {
    // procfs makes no file handles.
    let fs = VolumeFs::with_hot_fds(
        Path::new("/proc/sys/kernel"),
        Options::default(),
        quota(),
        HOT,
    )
    .unwrap();
    assert_eq!(fs.inode_naming().0, Naming::Descriptors(Errno::EOPNOTSUPP));
    let attr = fs.lookup(ROOT_ID, OsStr::new("ostype")).unwrap();
    assert_eq!(fs.getattr(attr.ino, None).unwrap().kind, FileKind::Regular);
    assert_eq!(fs.inode_fds(), 2);
    assert_eq!(fs.inode_records()[1].handle, None);
    fs.forget(attr.ino, 1);
    assert_eq!(fs.inode_fds(), 1);
}

#[test]
fn an_inode_on_another_filesystem_beneath_the_volume_is_pinned_not_named_by_handle() {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    let Some((dir, fs)) = handle_volume(0) else {
        return;
    };
    let sub = dir.path().join("tmpfs");
    std::fs::create_dir(&sub).unwrap();
    mount(
        Some("tmpfs"),
        &sub,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = umount2(self.0, MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(&sub);
    std::fs::write(sub.join("x"), b"on tmpfs").unwrap();

    let d = fs.lookup(ROOT_ID, OsStr::new("tmpfs")).unwrap();
    let x = fs.lookup(d.ino, OsStr::new("x")).unwrap();
    // tmpfs makes handles too, but they mean nothing to the root's filesystem.
    let records = fs.inode_records();
    for id in [d.ino, x.ino] {
        let r = records.iter().find(|r| r.id == id).unwrap();
        assert_eq!(r.handle, None, "{r:?}");
    }
    assert_eq!(fs.inode_fds(), 3);
    let fh = fs.open(x.ino, libc::O_RDONLY).unwrap().fh;
    let mut buf = [0u8; 16];
    let n = fs.read(fh, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"on tmpfs");
    fs.release(fh).unwrap();
}
