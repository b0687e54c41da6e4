//! Permissions the daemon decides itself count the caller's supplementary groups, as
//! the backend's do (a Pod's `fsGroup` is a supplementary group of its processes). A
//! bind mount of the volume's backing directory is the comparator: what the backend
//! itself answers. Each check runs there first, then through the Tessera mount.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::Mount;

/// The caller: fsuid and fsgid.
const USER: (u32, u32) = (4101, 4102);
/// The file's owner, another user (another node's Pod).
const OWNER: u32 = 4201;
/// The file's group: the `fsGroup` the caller may or may not have.
const GROUP: u32 = 4301;

/// A bind mount of `source`, undone on drop.
struct Bind(PathBuf);

impl Bind {
    fn new(source: &Path, at: PathBuf) -> Bind {
        fs::create_dir(&at).unwrap();
        nix::mount::mount(
            Some(source),
            &at,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .expect("bind mount");
        Bind(at)
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// `open(path, O_RDWR|O_CREAT)` (no `O_EXCL`) as [`USER`] with supplementary `groups`;
/// what it reads from the file, or its error.
fn open_creat_as(groups: &[u32], path: &Path) -> Result<String, String> {
    // dash and bash open `<>` with O_RDWR|O_CREAT.
    sh_as(groups, r#"exec 3<>"$1" && cat <&3"#, path)
}

/// `script` (`$1` = `path`) as [`USER`] with supplementary `groups`, in a child that
/// drops root (setgroups, setgid, setuid) before it execs: its output or its error.
fn sh_as(groups: &[u32], script: &str, path: &Path) -> Result<String, String> {
    let groups = groups.to_vec();
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).arg("sh").arg(path);
    // SAFETY: setgroups, setgid and setuid are async-signal-safe and touch nothing of
    // the parent.
    unsafe {
        cmd.pre_exec(move || {
            let ok = libc::setgroups(groups.len(), groups.as_ptr()) == 0
                && libc::setgid(USER.1) == 0
                && libc::setuid(USER.0) == 0;
            if ok {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
    let out = cmd.output().expect("run sh");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `create` without `O_EXCL` of a name another node made after this mount's kernel saw
/// it missing (made certain by a long negative cache and a file created on the
/// backend): the daemon opens what is there, checking the file's mode bits itself.
/// A caller whose supplementary group is the file's group (`0660`, another owner)
/// opens it, on the backend and through Tessera alike; without that group, EACCES on
/// both.
#[test]
fn create_of_a_name_made_elsewhere_counts_the_callers_groups() {
    let m = Mount::builder().arg("--negative-timeout=60").mount();
    let dir = m.backing("d");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let bind = Bind::new(&dir, m.dir().join("bind"));
    for name in ["in", "out"] {
        let missing = fs::metadata(m.path(&format!("d/{name}"))).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound, "{name}");
        let file = dir.join(name);
        fs::write(&file, "theirs").unwrap();
        std::os::unix::fs::chown(&file, Some(OWNER), Some(GROUP)).unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o660)).unwrap();
    }

    for (what, path) in [
        ("bind mount", bind.0.join("in")),
        ("tessera", m.path("d/in")),
    ] {
        assert_eq!(
            open_creat_as(&[GROUP], &path).as_deref(),
            Ok("theirs"),
            "{what}: a caller in the file's group opens it"
        );
    }
    for (what, path) in [
        ("bind mount", bind.0.join("out")),
        ("tessera", m.path("d/out")),
    ] {
        let e = open_creat_as(&[GROUP + 1], &path).unwrap_err();
        assert!(
            e.contains("Permission denied"),
            "{what}: a caller not in the file's group: {e}"
        );
    }
    for name in ["in", "out"] {
        assert_eq!(fs::read(dir.join(name)).unwrap(), b"theirs", "{name}");
    }
}

/// A write or truncation by a caller without `CAP_FSETID` of a set-group-ID file that
/// is not group-executable keeps the bit when the caller is in the file's group
/// (through a supplementary group) and drops it otherwise, as the backend's kernel
/// does; the daemon makes that call when the kernel leaves it to it
/// (`FUSE_HANDLE_KILLPRIV_V2`).
#[test]
fn writes_keep_set_group_id_for_a_member_of_the_files_group() {
    let m = Mount::new();
    let dir = m.backing("d");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let bind = Bind::new(&dir, m.dir().join("bind"));
    let ops = [
        ("append", r#"printf x >> "$1""#),
        ("ftruncate", r#"truncate -s 1 "$1""#),
        ("O_TRUNC", r#": > "$1""#),
    ];
    let mut got = Vec::new();
    for (what, base) in [("bind", bind.0.clone()), ("tessera", m.path("d"))] {
        for (op, script) in ops {
            for (member, groups) in [("member", [GROUP]), ("other", [GROUP + 1])] {
                let name = format!("{what}-{op}-{member}");
                let file = dir.join(&name);
                fs::write(&file, "theirs").unwrap();
                std::os::unix::fs::chown(&file, Some(OWNER), Some(GROUP)).unwrap();
                fs::set_permissions(&file, fs::Permissions::from_mode(0o2666)).unwrap();
                sh_as(&groups, script, &base.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
                let mode = fs::metadata(&file).unwrap().permissions().mode() & 0o7777;
                got.push(format!("{op} {member}: {mode:o}"));
            }
        }
    }
    let (bind, tessera) = got.split_at(got.len() / 2);
    assert_eq!(
        bind,
        [
            "append member: 2666",
            "append other: 666",
            "ftruncate member: 2666",
            "ftruncate other: 666",
            "O_TRUNC member: 2666",
            "O_TRUNC other: 666",
        ],
        "the backend"
    );
    assert_eq!(tessera, bind, "through tessera as on the backend");
}
