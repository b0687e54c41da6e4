//! POSIX behaviour through a real `tessera mount`, checked against the volume's
//! backing directory: what is written through the mount is what lands in the source.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::support::{
    FNV_OFFSET, Mount, Pattern, checksum_file, errno_of, fnv1a, getxattr, listxattr, removexattr,
    rename2, setxattr, sh_as, statvfs,
};

/// Write `len` bytes of a seeded pattern through `path` in 1 MiB writes; returns the
/// checksum of what was written.
fn write_pattern(path: &Path, seed: u64, len: u64) -> u64 {
    let mut f = fs::File::create(path).unwrap();
    let mut p = Pattern::new(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut hash = FNV_OFFSET;
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        p.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        hash = fnv1a(hash, &buf[..n]);
        left -= n as u64;
    }
    f.sync_all().unwrap();
    hash
}

#[test]
fn files_of_1_mib_and_100_mib_read_back_and_land_in_the_source() {
    let m = Mount::new();
    for (name, len) in [("one-mib", 1u64 << 20), ("hundred-mib", 100 << 20)] {
        let written = write_pattern(&m.path(name), len, len);
        assert_eq!(
            checksum_file(&m.path(name)).unwrap(),
            (written, len),
            "{name} through the mount"
        );
        assert_eq!(
            checksum_file(&m.backing(name)).unwrap(),
            (written, len),
            "{name} in the source directory"
        );
    }
    // Random access: overwrite a block in the middle, read it back at an offset.
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("one-mib"))
        .unwrap();
    f.seek(SeekFrom::Start(4096 * 7 + 3)).unwrap();
    f.write_all(b"tessera").unwrap();
    f.seek(SeekFrom::Start(4096 * 7)).unwrap();
    let mut buf = [0u8; 10];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(&buf[3..], b"tessera");
    let backing = fs::read(m.backing("one-mib")).unwrap();
    assert_eq!(&backing[4096 * 7 + 3..4096 * 7 + 10], b"tessera");
}

#[test]
fn rename_honours_noreplace_and_exchange() {
    let m = Mount::new();
    fs::write(m.path("a"), b"A").unwrap();
    fs::write(m.path("b"), b"B").unwrap();
    assert_eq!(
        errno_of(rename2(&m.path("a"), &m.path("b"), libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    rename2(&m.path("a"), &m.path("b"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.path("a")).unwrap(), b"B");
    assert_eq!(fs::read(m.backing("b")).unwrap(), b"A");
    rename2(&m.path("a"), &m.path("c"), libc::RENAME_NOREPLACE).unwrap();
    fs::rename(m.path("c"), m.path("b")).unwrap();
    assert!(!m.backing("a").exists() && !m.backing("c").exists());
    assert_eq!(fs::read(m.backing("b")).unwrap(), b"B");
    // Across directories, and a directory itself.
    fs::create_dir_all(m.path("x/y")).unwrap();
    fs::rename(m.path("b"), m.path("x/y/b")).unwrap();
    fs::rename(m.path("x"), m.path("z")).unwrap();
    assert_eq!(fs::read(m.backing("z/y/b")).unwrap(), b"B");
    assert_eq!(
        errno_of(rename2(&m.path("nope"), &m.path("q"), 0)),
        libc::ENOENT
    );
}

#[test]
fn hard_links_and_symlinks() {
    let m = Mount::new();
    fs::write(m.path("f"), b"data").unwrap();
    fs::hard_link(m.path("f"), m.path("g")).unwrap();
    let (f, g) = (
        fs::metadata(m.path("f")).unwrap(),
        fs::metadata(m.path("g")).unwrap(),
    );
    assert_eq!(f.ino(), g.ino());
    assert_eq!(f.nlink(), 2);
    assert_eq!(
        fs::metadata(m.backing("f")).unwrap().ino(),
        fs::metadata(m.backing("g")).unwrap().ino()
    );
    std::os::unix::fs::symlink("f", m.path("rel")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", m.path("abs")).unwrap();
    assert_eq!(fs::read_link(m.path("rel")).unwrap(), Path::new("f"));
    assert_eq!(fs::read(m.path("rel")).unwrap(), b"data");
    assert_eq!(
        fs::read_link(m.backing("abs")).unwrap(),
        Path::new("/nowhere/at/all")
    );
    assert!(
        fs::symlink_metadata(m.path("abs"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    fs::remove_file(m.path("f")).unwrap();
    assert_eq!(fs::metadata(m.path("g")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.backing("g")).unwrap(), b"data");
    // A dangling relative link now.
    assert_eq!(errno_of(fs::read(m.path("rel"))), libc::ENOENT);
}

#[test]
fn extended_attributes() {
    let m = Mount::new();
    fs::write(m.path("f"), b"").unwrap();
    setxattr(&m.path("f"), "user.tessera", b"value").unwrap();
    assert_eq!(getxattr(&m.path("f"), "user.tessera").unwrap(), b"value");
    assert_eq!(getxattr(&m.backing("f"), "user.tessera").unwrap(), b"value");
    assert!(
        listxattr(&m.path("f"))
            .unwrap()
            .contains(&"user.tessera".to_owned())
    );
    removexattr(&m.path("f"), "user.tessera").unwrap();
    assert_eq!(
        errno_of(getxattr(&m.path("f"), "user.tessera")),
        libc::ENODATA
    );
    // Directories carry them too; POSIX ACLs are refused (not enforced here).
    fs::create_dir(m.path("d")).unwrap();
    setxattr(&m.path("d"), "user.k", b"v").unwrap();
    assert_eq!(getxattr(&m.backing("d"), "user.k").unwrap(), b"v");
    // version 2; (tag, perm, id): USER_OBJ rw, USER 1000 r, GROUP_OBJ r, MASK r, OTHER r.
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    assert_eq!(
        errno_of(setxattr(&m.path("d"), "system.posix_acl_access", &acl)),
        libc::EOPNOTSUPP
    );
}

#[test]
fn chmod_chown_and_timestamps() {
    let m = Mount::new();
    fs::write(m.path("f"), b"x").unwrap();
    fs::set_permissions(m.path("f"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(m.backing("f")).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(m.path("f"), Some(1000), Some(2000)).unwrap();
    let b = fs::metadata(m.backing("f")).unwrap();
    assert_eq!((b.uid(), b.gid()), (1000, 2000));
    let through = fs::metadata(m.path("f")).unwrap();
    assert_eq!((through.uid(), through.gid()), (1000, 2000));

    let c = std::ffi::CString::new(m.path("f").into_os_string().into_encoded_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 1_234_567_890,
            tv_nsec: 5,
        },
    ];
    // SAFETY: valid C string and two timespecs.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) },
        0
    );
    for path in [m.path("f"), m.backing("f")] {
        let md = fs::metadata(&path).unwrap();
        assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
        assert_eq!((md.mtime(), md.mtime_nsec()), (1_234_567_890, 5));
    }
    // Truncation through setattr.
    fs::OpenOptions::new()
        .write(true)
        .open(m.path("f"))
        .unwrap()
        .set_len(10_000)
        .unwrap();
    assert_eq!(fs::metadata(m.backing("f")).unwrap().len(), 10_000);
}

#[test]
fn directories() {
    let m = Mount::new();
    fs::create_dir_all(m.path("a/b/c")).unwrap();
    assert!(m.backing("a/b/c").is_dir());
    fs::write(m.path("a/b/c/f"), b"").unwrap();
    assert_eq!(errno_of(fs::remove_dir(m.path("a/b"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(fs::create_dir(m.path("a"))), libc::EEXIST);
    fs::remove_file(m.path("a/b/c/f")).unwrap();
    fs::remove_dir(m.path("a/b/c")).unwrap();
    assert!(!m.backing("a/b/c").exists());
    // A large directory lists completely (several readdir rounds).
    for i in 0..1500 {
        fs::write(m.path(&format!("a/f{i:05}")), b"").unwrap();
    }
    let mut names: Vec<_> = fs::read_dir(m.path("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 1501);
    assert_eq!(names[0], "b");
    assert_eq!(names[1], "f00000");
    assert_eq!(fs::read_dir(m.backing("a")).unwrap().count(), 1501);
}

#[test]
fn statfs_reports_the_quota() {
    let m = Mount::builder().capacity(64 << 20).mount();
    let before = statvfs(&m.mnt);
    assert_eq!(before.blocks() * before.fragment_size(), 64 << 20);
    assert_eq!(before.blocks_free(), before.blocks());
    assert!(before.files() > 0 && before.files_free() > 0);
    let mut f = fs::File::create(m.path("f")).unwrap();
    f.write_all(&vec![7u8; 1 << 20]).unwrap();
    drop(f);
    let after = statvfs(&m.mnt);
    assert_eq!(
        (before.blocks_free() - after.blocks_free()) * after.fragment_size(),
        1 << 20
    );
    assert_eq!(after.blocks_available(), after.blocks_free());
}

#[test]
fn callers_own_what_they_create_and_the_kernel_checks_permissions() {
    let m = Mount::new();
    fs::create_dir(m.path("shared")).unwrap();
    fs::set_permissions(m.path("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(m.path("shared/roots"), b"root's").unwrap();
    fs::set_permissions(m.path("shared/roots"), fs::Permissions::from_mode(0o644)).unwrap();
    let dir = m.path("shared");
    let out = sh_as(
        4321,
        8765,
        &format!(
            "cd {} && echo mine > mine && mkdir sub && ln -s mine link && mkfifo pipe",
            dir.display()
        ),
    );
    assert!(out.status.success(), "{out:?}");
    for name in ["mine", "sub", "link", "pipe"] {
        let md = fs::symlink_metadata(m.backing(&format!("shared/{name}"))).unwrap();
        assert_eq!((md.uid(), md.gid()), (4321, 8765), "{name}");
    }
    // Another user cannot write root's 0644 file, but may read it.
    let out = sh_as(4321, 8765, &format!("echo x >> {}/roots", dir.display()));
    assert!(!out.status.success());
    assert_eq!(fs::read(m.backing("shared/roots")).unwrap(), b"root's");
    let out = sh_as(4321, 8765, &format!("cat {}/roots", dir.display()));
    assert_eq!(out.stdout, b"root's");
}

#[test]
fn fallocate_copy_file_range_and_sparse_files() {
    let m = Mount::new();
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(m.path("f"))
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: valid fd.
    assert_eq!(
        unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, 1 << 20) },
        0
    );
    assert_eq!(fs::metadata(m.backing("f")).unwrap().len(), 1 << 20);
    (&f).write_all(b"hello").unwrap();
    let g = fs::File::create(m.path("g")).unwrap();
    let (mut off_in, mut off_out) = (0i64, 0i64);
    // SAFETY: valid fds and offsets.
    let n = unsafe {
        libc::copy_file_range(
            f.as_raw_fd(),
            &mut off_in,
            g.as_raw_fd(),
            &mut off_out,
            5,
            0,
        )
    };
    assert_eq!(n, 5);
    drop(g);
    assert_eq!(fs::read(m.backing("g")).unwrap(), b"hello");
    // A sparse file: a write far past the end.
    let h = fs::File::create(m.path("h")).unwrap();
    use std::os::unix::fs::FileExt;
    h.write_at(b"end", 10 << 20).unwrap();
    assert_eq!(fs::metadata(m.backing("h")).unwrap().len(), (10 << 20) + 3);
}

#[test]
fn names_cached_as_missing_appear_when_made_through_the_mount() {
    // The backing directory is node-local, so the kernel caches "no such file" (60 s):
    // every way of making a name through the mount must replace that negative entry.
    let m = Mount::new();
    let missing = ["file", "dir", "sym", "hard", "moved", "node"];
    for name in missing {
        assert_eq!(errno_of(fs::metadata(m.path(name))), libc::ENOENT);
        // Twice: the second answer comes from the kernel's cache.
        assert_eq!(errno_of(fs::metadata(m.path(name))), libc::ENOENT);
    }
    fs::write(m.path("file"), b"x").unwrap();
    fs::create_dir(m.path("dir")).unwrap();
    std::os::unix::fs::symlink("file", m.path("sym")).unwrap();
    fs::hard_link(m.path("file"), m.path("hard")).unwrap();
    fs::write(m.path("src"), b"y").unwrap();
    fs::rename(m.path("src"), m.path("moved")).unwrap();
    nix::unistd::mkfifo(
        &m.path("node"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    for name in missing {
        assert!(fs::symlink_metadata(m.path(name)).is_ok(), "{name}");
        assert!(m.backing(name).symlink_metadata().is_ok(), "{name}");
    }
    assert_eq!(fs::read(m.path("moved")).unwrap(), b"y");
    assert_eq!(fs::metadata(m.path("hard")).unwrap().nlink(), 2);
    // And removing them makes them missing again.
    fs::remove_file(m.path("hard")).unwrap();
    fs::remove_dir(m.path("dir")).unwrap();
    assert_eq!(errno_of(fs::metadata(m.path("hard"))), libc::ENOENT);
    assert_eq!(errno_of(fs::metadata(m.path("dir"))), libc::ENOENT);
    assert_eq!(fs::metadata(m.path("file")).unwrap().nlink(), 1);
}
