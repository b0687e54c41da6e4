//! Tests of the filesystem core on a temporary directory (daemon-mode quota).

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::types::IoState;
use super::*;
use crate::quota::{Accounting, Enforcement};

mod inodes;

fn daemon_quota(capacity: u64, used: u64) -> Arc<Enforcement> {
    Arc::new(Accounting::new(capacity, used).into())
}

const ROOT: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

fn volume(capacity: u64) -> (tempfile::TempDir, VolumeFs) {
    let dir = tempfile::tempdir().unwrap();
    let fs = VolumeFs::new(dir.path(), Options::default(), daemon_quota(capacity, 0)).unwrap();
    (dir, fs)
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

#[test]
fn dotdot_of_the_root_is_the_root() {
    let (_dir, fs) = volume(1 << 20);
    assert_eq!(fs.lookup(ROOT_ID, os("..")).unwrap().ino, ROOT_ID);
    assert_eq!(fs.lookup(ROOT_ID, os(".")).unwrap().ino, ROOT_ID);
}

#[test]
fn names_are_single_components() {
    let (_dir, fs) = volume(1 << 20);
    for bad in ["a/b", "/etc", "../x", ""] {
        let err = fs.lookup(ROOT_ID, os(bad)).unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL, "{bad}: {err}");
    }
    let err = fs.mkdir(ROOT, ROOT_ID, os(".."), 0o755).unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
}

#[test]
fn symlinks_are_never_followed() {
    let (dir, fs) = volume(1 << 20);
    std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
    let link = fs.lookup(ROOT_ID, os("etc")).unwrap();
    assert_eq!(link.kind, FileKind::Symlink);
    assert_eq!(fs.readlink(link.ino).unwrap(), b"/etc");
    // Looking inside the link, opening or truncating through it all fail.
    assert_eq!(
        fs.lookup(link.ino, os("passwd")).unwrap_err().errno(),
        libc::ENOTDIR
    );
    assert_eq!(fs.opendir(link.ino).unwrap_err().errno(), libc::ENOTDIR);
    assert!(fs.open(link.ino, libc::O_RDONLY).is_err());
    let set = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert!(fs.setattr(link.ino, set).is_err());
    // Ownership changes apply to the link, not to /etc.
    let before = std::fs::metadata("/etc").unwrap();
    let set = SetAttr {
        uid: Some(4242),
        ..SetAttr::default()
    };
    fs.setattr(link.ino, set).unwrap();
    assert_eq!(std::fs::metadata("/etc").unwrap().uid(), before.uid());
    assert_eq!(
        std::fs::symlink_metadata(dir.path().join("etc"))
            .unwrap()
            .uid(),
        4242
    );
}

#[test]
fn writes_stop_at_the_quota_and_keep_what_was_written() {
    let (dir, fs) = volume(10_000);
    let (_, f) = fs
        .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_WRONLY)
        .unwrap();
    assert_eq!(fs.write(f.fh, 0, &[1u8; 6000], None).unwrap(), 6000);
    // Partly fits: cut at the boundary.
    assert_eq!(fs.write(f.fh, 6000, &[2u8; 6000], None).unwrap(), 4000);
    let err = fs.write(f.fh, 10_000, &[3u8; 1], None).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC);
    // Overwriting inside the file needs no space.
    assert_eq!(fs.write(f.fh, 0, &[4u8; 100], None).unwrap(), 100);
    fs.release(f.fh).unwrap();
    let data = std::fs::read(dir.path().join("f")).unwrap();
    assert_eq!(data.len(), 10_000);
    assert!(data[..100].iter().all(|&b| b == 4));
    assert!(data[100..6000].iter().all(|&b| b == 1));
    assert!(data[6000..].iter().all(|&b| b == 2));
    assert_eq!(fs.usage().unwrap().used, 10_000);
    fs.unlink(ROOT_ID, os("f")).unwrap();
    assert_eq!(fs.usage().unwrap().used, 0);
}

#[test]
fn truncate_and_fallocate_are_counted() {
    let (_dir, fs) = volume(1 << 20);
    let (attr, f) = fs
        .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_RDWR)
        .unwrap();
    let grow = SetAttr {
        size: Some(4096),
        fh: Some(f.fh),
        ..SetAttr::default()
    };
    fs.setattr(attr.ino, grow).unwrap();
    assert_eq!(fs.usage().unwrap().used, 4096);
    let too_big = SetAttr {
        size: Some(2 << 20),
        ..SetAttr::default()
    };
    assert_eq!(
        fs.setattr(attr.ino, too_big).unwrap_err().errno(),
        libc::ENOSPC
    );
    fs.fallocate(f.fh, 0, 8192, 0).unwrap();
    assert_eq!(fs.usage().unwrap().used, 8192);
    let err = fs
        .fallocate(f.fh, 0, 1 << 30, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap_err();
    assert_eq!(err.errno(), libc::EOPNOTSUPP);
    fs.fallocate(
        f.fh,
        0,
        4096,
        libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE,
    )
    .unwrap();
    assert_eq!(fs.usage().unwrap().used, 8192);
    let shrink = SetAttr {
        size: Some(100),
        ..SetAttr::default()
    };
    fs.setattr(attr.ino, shrink).unwrap();
    assert_eq!(fs.usage().unwrap().used, 100);
    fs.release(f.fh).unwrap();
}

#[test]
fn unlinked_open_files_leave_the_quota_at_last_close() {
    let (_dir, fs) = volume(1 << 20);
    let (_, f) = fs
        .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_RDWR)
        .unwrap();
    fs.write(f.fh, 0, &[0u8; 1000], None).unwrap();
    fs.unlink(ROOT_ID, os("f")).unwrap();
    assert_eq!(fs.usage().unwrap().used, 1000);
    fs.write(f.fh, 1000, &[0u8; 500], None).unwrap();
    assert_eq!(fs.usage().unwrap().used, 1500);
    fs.release(f.fh).unwrap();
    assert_eq!(fs.usage().unwrap().used, 0);
}

#[test]
fn rename_over_a_file_frees_it_and_flags_are_honoured() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), [0u8; 10]).unwrap();
    std::fs::write(dir.path().join("b"), [0u8; 20]).unwrap();
    let fs = VolumeFs::new(dir.path(), Options::default(), daemon_quota(1 << 20, 30)).unwrap();
    let err = fs
        .rename(ROOT_ID, os("a"), ROOT_ID, os("b"), libc::RENAME_NOREPLACE)
        .unwrap_err();
    assert_eq!(err.errno(), libc::EEXIST);
    fs.rename(ROOT_ID, os("a"), ROOT_ID, os("b"), libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(std::fs::read(dir.path().join("a")).unwrap().len(), 20);
    assert_eq!(fs.usage().unwrap().used, 30);
    // After the exchange `b` holds the 10 bytes; renaming `a` over it frees them.
    fs.rename(ROOT_ID, os("a"), ROOT_ID, os("b"), 0).unwrap();
    assert_eq!(fs.usage().unwrap().used, 20);
    assert!(!dir.path().join("a").exists());
}

#[test]
fn new_inodes_belong_to_the_caller() {
    let (dir, fs) = volume(1 << 20);
    let user = Caller {
        uid: 1234,
        gid: 5678,
        pid: 0,
    };
    let (_, f) = fs
        .create(user, ROOT_ID, os("f"), 0o4755, libc::O_WRONLY)
        .unwrap();
    fs.release(f.fh).unwrap();
    fs.mkdir(user, ROOT_ID, os("d"), 0o755).unwrap();
    fs.symlink(user, ROOT_ID, os("l"), Path::new("f")).unwrap();
    for name in ["f", "d", "l"] {
        let m = std::fs::symlink_metadata(dir.path().join(name)).unwrap();
        assert_eq!((m.uid(), m.gid()), (1234, 5678), "{name}");
    }
    // chown cleared set-user-ID; it was put back.
    let m = std::fs::metadata(dir.path().join("f")).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o4755);
}

#[test]
fn read_only_refuses_changes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let fs = VolumeFs::new(
        dir.path(),
        Options {
            read_only: true,
            devices: false,
        },
        daemon_quota(1 << 20, 1),
    )
    .unwrap();
    let f = fs.lookup(ROOT_ID, os("f")).unwrap();
    assert_eq!(
        fs.open(f.ino, libc::O_WRONLY).unwrap_err().errno(),
        libc::EROFS
    );
    assert_eq!(
        fs.mkdir(ROOT, ROOT_ID, os("d"), 0o755).unwrap_err().errno(),
        libc::EROFS
    );
    assert_eq!(
        fs.unlink(ROOT_ID, os("f")).unwrap_err().errno(),
        libc::EROFS
    );
    let o = fs.open(f.ino, libc::O_RDONLY).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(fs.read(o.fh, 0, &mut buf).unwrap(), 1);
}

#[test]
fn readdir_resumes_where_the_reply_was_full() {
    let (dir, fs) = volume(1 << 20);
    for i in 0..100 {
        std::fs::write(dir.path().join(format!("f{i:03}")), b"").unwrap();
    }
    let fh = fs.opendir(ROOT_ID).unwrap();
    let mut names = Vec::new();
    let mut offset = 0;
    loop {
        let mut batch = 0;
        let mut last = offset;
        fs.readdir(fh, offset, |e| {
            if batch == 7 {
                return true;
            }
            batch += 1;
            names.push(e.name.to_string_lossy().into_owned());
            last = e.offset;
            false
        })
        .unwrap();
        if batch == 0 {
            break;
        }
        offset = last;
    }
    names.sort();
    assert_eq!(names.len(), 102);
    assert_eq!(names[0], ".");
    assert_eq!(names[1], "..");
    assert_eq!(names[2], "f000");
    fs.releasedir(fh).unwrap();
}

#[test]
fn a_directory_stream_has_no_buffer_until_it_is_read() {
    // A successor restores every stream its predecessor had open: hundreds of
    // streams an application holds must not cost a buffer each before they are read.
    let (dir, fs) = volume(1 << 20);
    std::fs::write(dir.path().join("a"), b"").unwrap();
    let buffer = |fh| {
        let h = fs.handle(fh).unwrap();
        lock(h.dir.as_ref().unwrap()).buf.len()
    };
    let fh = fs.opendir(ROOT_ID).unwrap();
    assert_eq!(buffer(fh), 0, "opened, not read");
    let mut names = Vec::new();
    fs.readdir(fh, 0, |e| {
        names.push(e.name.to_string_lossy().into_owned());
        false
    })
    .unwrap();
    assert!(names.contains(&"a".to_string()), "{names:?}");
    assert_eq!(buffer(fh), super::handles::DIR_BUF, "read");
}

#[test]
fn readdirplus_counts_lookups_only_for_what_was_sent() {
    let (dir, fs) = volume(1 << 20);
    std::fs::write(dir.path().join("a"), b"").unwrap();
    std::fs::write(dir.path().join("b"), b"").unwrap();
    let fh = fs.opendir(ROOT_ID).unwrap();
    let mut sent = 0;
    fs.readdirplus(fh, 0, |e, attr| {
        if e.name == "." || e.name == ".." {
            assert_eq!(attr.kind, FileKind::Directory);
            return false;
        }
        sent += 1;
        sent > 1
    })
    .unwrap();
    // One entry sent, the refused one forgotten again: root + 1 inode.
    assert_eq!(fs.inode_count(), 2);
    fs.releasedir(fh).unwrap();
}

#[test]
fn io_modes_never_mix_passthrough_and_cached() {
    let (dir, fs) = volume(1 << 20);
    std::fs::write(dir.path().join("f"), b"data").unwrap();
    fs.set_passthrough(true);
    let f = fs.lookup(ROOT_ID, os("f")).unwrap();
    let r1 = fs.open(f.ino, libc::O_RDONLY).unwrap();
    assert_eq!(r1.mode, IoMode::Passthrough);
    let r2 = fs.open(f.ino, libc::O_RDONLY).unwrap();
    assert_eq!(r2.mode, IoMode::Passthrough);
    // A writer would have to be passthrough too, out of the quota's sight.
    for flags in [libc::O_RDWR, libc::O_WRONLY] {
        let err = fs.open(f.ino, flags).unwrap_err();
        assert_eq!(err.errno(), libc::ETXTBSY);
    }
    fs.release(r1.fh).unwrap();
    fs.release(r2.fh).unwrap();
    // Write-only first: direct I/O, and readers may still use passthrough.
    let w = fs.open(f.ino, libc::O_WRONLY).unwrap();
    assert_eq!(w.mode, IoMode::Direct);
    let r3 = fs.open(f.ino, libc::O_RDONLY).unwrap();
    assert_eq!(r3.mode, IoMode::Passthrough);
    fs.release(r3.fh).unwrap();
    // Read-write first: cached, and readers join it in cached mode.
    let rw = fs.open(f.ino, libc::O_RDWR).unwrap();
    assert_eq!(rw.mode, IoMode::Cached);
    let r4 = fs.open(f.ino, libc::O_RDONLY).unwrap();
    assert_eq!(r4.mode, IoMode::Cached);
    for h in [w, rw, r4] {
        fs.release(h.fh).unwrap();
    }
    let r5 = fs.open(f.ino, libc::O_RDONLY).unwrap();
    assert_eq!(r5.mode, IoMode::Passthrough);
    // The kernel refused the backing file: cached, and writers are welcome again.
    fs.passthrough_failed(r5.fh).unwrap();
    let w = fs.open(f.ino, libc::O_RDWR).unwrap();
    assert_eq!(w.mode, IoMode::Cached);
}

#[test]
fn backend_mode_puts_every_open_through_unless_cached_opens_exist() {
    let mut io = IoState::default();
    for flags in [libc::O_RDWR, libc::O_WRONLY, libc::O_RDONLY] {
        assert_eq!(
            VolumeFs::backend_mode_io(&mut io, flags, true),
            IoMode::Passthrough
        );
    }
    assert_eq!((io.passthrough, io.cached), (3, 0));
    // Without passthrough (kernel, or --no-passthrough): the daemon's I/O modes,
    // and once an inode has cached opens, no passthrough joins them.
    let mut io = IoState::default();
    assert_eq!(
        VolumeFs::backend_mode_io(&mut io, libc::O_WRONLY, false),
        IoMode::Direct
    );
    assert_eq!(
        VolumeFs::backend_mode_io(&mut io, libc::O_RDWR, false),
        IoMode::Cached
    );
    assert_eq!(
        VolumeFs::backend_mode_io(&mut io, libc::O_RDONLY, true),
        IoMode::Cached
    );
    assert_eq!((io.passthrough, io.cached), (0, 2));
}

#[test]
fn hard_links_share_one_inode_and_do_not_double_count() {
    let (dir, fs) = volume(1 << 20);
    let (attr, f) = fs
        .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_WRONLY)
        .unwrap();
    fs.write(f.fh, 0, &[0u8; 100], None).unwrap();
    fs.release(f.fh).unwrap();
    let l = fs.link(attr.ino, ROOT_ID, os("g")).unwrap();
    assert_eq!(l.ino, attr.ino);
    assert_eq!(l.nlink, 2);
    fs.unlink(ROOT_ID, os("f")).unwrap();
    assert_eq!(fs.usage().unwrap().used, 100);
    fs.unlink(ROOT_ID, os("g")).unwrap();
    assert_eq!(fs.usage().unwrap().used, 0);
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
}

#[test]
fn xattrs_and_times() {
    let (dir, fs) = volume(1 << 20);
    let (attr, f) = fs
        .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_WRONLY)
        .unwrap();
    fs.release(f.fh).unwrap();
    fs.setxattr(attr.ino, os("user.k"), b"v", 0).unwrap();
    assert_eq!(
        fs.getxattr(attr.ino, os("user.k"), 0).unwrap(),
        Xattr::Size(1)
    );
    assert_eq!(
        fs.getxattr(attr.ino, os("user.k"), 10).unwrap(),
        Xattr::Data(b"v".to_vec())
    );
    let Xattr::Data(list) = fs.listxattr(attr.ino, 100).unwrap() else {
        panic!("asked for data")
    };
    assert!(list.split(|&b| b == 0).any(|n| n == b"user.k"));
    fs.removexattr(attr.ino, os("user.k")).unwrap();
    assert_eq!(
        fs.getxattr(attr.ino, os("user.k"), 10).unwrap_err().errno(),
        libc::ENODATA
    );
    let t = UNIX_EPOCH + Duration::new(1_000_000, 5);
    let set = SetAttr {
        mtime: Some(SetTime::At(t)),
        atime: Some(SetTime::At(UNIX_EPOCH - Duration::from_secs(10))),
        mode: Some(0o600),
        ..SetAttr::default()
    };
    let a = fs.setattr(attr.ino, set).unwrap();
    assert_eq!(a.mtime, t);
    assert_eq!(a.perm, 0o600);
    let m = std::fs::metadata(dir.path().join("f")).unwrap();
    assert_eq!(m.atime(), -10);
}

#[test]
fn statfs_reports_the_quota() {
    let (_dir, fs) = volume(64 << 20);
    let (_, f) = fs
        .create(ROOT, ROOT_ID, os("f"), 0o644, libc::O_WRONLY)
        .unwrap();
    fs.write(f.fh, 0, &vec![0u8; 1 << 20], None).unwrap();
    let s = fs.statfs().unwrap();
    assert_eq!(s.blocks * s.frsize as u64, 64 << 20);
    assert_eq!(s.bfree * s.frsize as u64, 63 << 20);
    assert!(s.files > 0);
    fs.release(f.fh).unwrap();
}

#[test]
fn each_failure_has_its_errno_and_a_syscall_failure_names_its_operation() {
    use crate::projquota::BackendQuotaError;
    use crate::sys::{Errno, SysError};
    let sys = |op, errno| SysError { op, errno };
    let cases: [(FsError, i32); 9] = [
        (sys("lookup", Errno::ENOENT).into(), libc::ENOENT),
        (FsError::UnknownInode(7), libc::ESTALE),
        (FsError::UnknownHandle(7), libc::EBADF),
        (FsError::ReadOnly, libc::EROFS),
        (FsError::QuotaExceeded, libc::ENOSPC),
        (FsError::Busy, libc::ETXTBSY),
        (
            FsError::Quota(sys("quotactl_fd(Q_XGETQUOTA)", Errno::EPERM).into()),
            libc::EPERM,
        ),
        (FsError::Quota(BackendQuotaError::NotAccounted), libc::EIO),
        (FsError::AccessDenied, libc::EACCES),
    ];
    for (err, errno) in cases {
        assert_eq!(err.errno(), errno, "{err}");
    }
    let err = FsError::from(sys("lookup", Errno::ENOENT));
    assert_eq!(
        err.to_string(),
        format!("lookup on the backing directory failed: {}", Errno::ENOENT)
    );
    let err = BackendQuotaError::from(sys("open scratch", Errno::EACCES));
    assert_eq!(
        err.to_string(),
        format!("open scratch failed: {}", Errno::EACCES)
    );
}
