//! `tessera mount --read-only`: everything reads, every change fails with EROFS.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use crate::support::{Mount, errno_of, rename2, setxattr};

#[test]
fn read_only_mount_reads_and_refuses_every_change() {
    let m = Mount::builder()
        .read_only()
        .prepare(|src| {
            fs::write(src.join("f"), b"content").unwrap();
            fs::create_dir(src.join("d")).unwrap();
        })
        .mount();
    assert_eq!(fs::read(m.path("f")).unwrap(), b"content");
    assert_eq!(fs::read_dir(m.path("d")).unwrap().count(), 0);
    let erofs = [
        ("create", errno_of(fs::write(m.path("new"), b"x"))),
        (
            "open for write",
            errno_of(fs::OpenOptions::new().write(true).open(m.path("f"))),
        ),
        (
            "append",
            errno_of(fs::OpenOptions::new().append(true).open(m.path("f"))),
        ),
        ("mkdir", errno_of(fs::create_dir(m.path("d2")))),
        ("rmdir", errno_of(fs::remove_dir(m.path("d")))),
        ("unlink", errno_of(fs::remove_file(m.path("f")))),
        ("rename", errno_of(rename2(&m.path("f"), &m.path("g"), 0))),
        ("link", errno_of(fs::hard_link(m.path("f"), m.path("g")))),
        (
            "symlink",
            errno_of(std::os::unix::fs::symlink("f", m.path("s"))),
        ),
        (
            "chmod",
            errno_of(fs::set_permissions(
                m.path("f"),
                fs::Permissions::from_mode(0o600),
            )),
        ),
        (
            "chown",
            errno_of(std::os::unix::fs::chown(m.path("f"), Some(1), Some(1))),
        ),
        ("setxattr", errno_of(setxattr(&m.path("f"), "user.a", b"b"))),
    ];
    for (op, err) in erofs {
        assert_eq!(err, libc::EROFS, "{op}");
    }
    assert_eq!(fs::read(m.backing("f")).unwrap(), b"content");
    assert_eq!(fs::read_dir(&m.source).unwrap().count(), 2);
}
