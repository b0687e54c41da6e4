//! Nothing reaches outside the volume directory through a mount: not `..`, not a
//! symlink planted in the backing tree (the daemon never follows one, even when a
//! directory the kernel still caches is swapped for a symlink behind its back), not a
//! rename or link.

use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::support::{Mount, errno_of, rename2};

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn dotdot_of_the_mount_root_is_not_the_backends_directory() {
    let m = Mount::new();
    // A neighbouring volume on the same backend.
    let neighbour = m.source.parent().unwrap().join("neighbour");
    fs::create_dir(&neighbour).unwrap();
    fs::write(neighbour.join("secret"), b"not yours").unwrap();
    fs::write(m.path("mine"), b"mine").unwrap();

    // `..` of the root is resolved in the caller's view: the mount point's parent.
    let up = names(&m.path(".."));
    assert!(up.contains(&"mnt".to_owned()), "{up:?}");
    assert!(!up.contains(&"neighbour".to_owned()), "{up:?}");
    for path in [
        "../neighbour/secret",
        "../../neighbour/secret",
        "../volume/mine",
    ] {
        assert_eq!(errno_of(fs::read(m.path(path))), libc::ENOENT, "{path}");
    }
    // Inside the mount, `..` climbs back to the root and no further.
    fs::create_dir_all(m.path("a/b")).unwrap();
    assert_eq!(fs::read(m.path("a/b/../../mine")).unwrap(), b"mine");
    assert_eq!(
        fs::metadata(m.path("a/b/../..")).unwrap().ino(),
        fs::metadata(&m.mnt).unwrap().ino()
    );
}

#[test]
fn symlinks_planted_in_the_backing_dir_are_links_not_doors() {
    let m = Mount::builder()
        .prepare(|src| {
            std::os::unix::fs::symlink("/etc", src.join("etc")).unwrap();
            std::os::unix::fs::symlink("/etc/passwd", src.join("passwd")).unwrap();
            std::os::unix::fs::symlink("../../../../../../../../etc", src.join("up")).unwrap();
        })
        .mount();
    for (name, target) in [
        ("etc", "/etc"),
        ("passwd", "/etc/passwd"),
        ("up", "../../../../../../../../etc"),
    ] {
        let md = fs::symlink_metadata(m.path(name)).unwrap();
        assert!(md.file_type().is_symlink(), "{name}");
        assert_eq!(fs::read_link(m.path(name)).unwrap(), Path::new(target));
    }
    // Acting on the link itself never touches its target.
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(m.path("passwd"))
        ),
        libc::ELOOP
    );
    let before = fs::metadata("/etc/passwd").unwrap();
    std::os::unix::fs::lchown(m.path("passwd"), Some(4242), Some(4242)).unwrap();
    let after = fs::metadata("/etc/passwd").unwrap();
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    assert_eq!(
        fs::symlink_metadata(m.backing("passwd")).unwrap().uid(),
        4242
    );
    // Removing or renaming the link works on the link.
    fs::rename(m.path("passwd"), m.path("pw")).unwrap();
    fs::remove_file(m.path("pw")).unwrap();
    assert!(Path::new("/etc/passwd").exists());
}

#[test]
fn a_cached_directory_swapped_for_a_symlink_does_not_lead_outside() {
    // Long cache lifetimes: the kernel keeps using the node id it has for `d`, so the
    // daemon is asked to act inside `d` after `d` became a symlink in the backing dir.
    let m = Mount::builder().arg("--attr-timeout").arg("600").mount();
    let outside = m.dir().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"host data").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/inside"), b"volume data").unwrap();

    fs::rename(m.backing("d"), m.backing("d-moved")).unwrap();
    std::os::unix::fs::symlink(&outside, m.backing("d")).unwrap();

    // Everything still happens in the directory the kernel named, never outside.
    assert_eq!(errno_of(fs::read(m.path("d/secret"))), libc::ENOENT);
    fs::write(m.path("d/new"), b"written through d").unwrap();
    assert!(!outside.join("new").exists());
    assert_eq!(
        fs::read(m.backing("d-moved/new")).unwrap(),
        b"written through d"
    );
    assert_eq!(names(&outside), ["secret"]);
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"host data");
}

#[test]
fn renames_and_links_cannot_cross_the_boundary() {
    let m = Mount::new();
    let outside = m.dir().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("host-file"), b"host").unwrap();
    fs::write(m.path("f"), b"volume").unwrap();
    std::os::unix::fs::symlink(&outside, m.path("door")).unwrap();

    for to in [
        outside.join("f"),
        m.path("../f"),
        m.path("door/f"),
        m.source.parent().unwrap().join("f"),
    ] {
        assert_eq!(
            errno_of(fs::rename(m.path("f"), &to)),
            libc::EXDEV,
            "{to:?}"
        );
        assert_eq!(
            errno_of(rename2(&m.path("f"), &to, libc::RENAME_EXCHANGE)),
            libc::EXDEV,
            "{to:?}"
        );
        assert_eq!(
            errno_of(fs::hard_link(m.path("f"), &to)),
            libc::EXDEV,
            "{to:?}"
        );
    }
    assert_eq!(
        errno_of(fs::rename(outside.join("host-file"), m.path("in"))),
        libc::EXDEV
    );
    assert_eq!(
        errno_of(fs::hard_link(outside.join("host-file"), m.path("in"))),
        libc::EXDEV
    );
    assert_eq!(fs::read(m.backing("f")).unwrap(), b"volume");
    assert_eq!(fs::read(outside.join("host-file")).unwrap(), b"host");
    assert!(!m.backing("in").exists());
}
