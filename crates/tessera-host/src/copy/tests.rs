use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::PathBuf;

use super::*;

fn beneath(root: &Path, volume: &str) -> Beneath {
    Beneath {
        root: root.to_path_buf(),
        rel: PathBuf::from(volume),
    }
}

/// A tree with nested directories, a file, an empty file, a mode, and a symlink that
/// points out of the volume.
fn tree(root: &Path) -> PathBuf {
    let v = root.join("vol-a");
    fs::create_dir_all(v.join("d/e")).unwrap();
    fs::write(v.join("d/e/f.txt"), b"hello").unwrap();
    fs::write(v.join("empty"), b"").unwrap();
    fs::write(v.join("big"), vec![7u8; 3 * 1024 * 1024 + 5]).unwrap();
    fs::set_permissions(v.join("d/e/f.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    symlink("/etc/passwd", v.join("out")).unwrap();
    symlink("../d", v.join("d/e/up")).unwrap();
    v
}

fn copy(root: &Path, budget: u64) -> Result<CopyStats, CopyError> {
    copy_volume(
        &beneath(root, "vol-a"),
        &beneath(root, "vol-b"),
        budget,
        &mut |_| {},
    )
}

#[test]
fn a_tree_is_copied_with_its_links_as_links() {
    let t = tempfile::tempdir().unwrap();
    tree(t.path());
    let stats = copy(t.path(), u64::MAX).unwrap();
    let b = t.path().join("vol-b");
    assert_eq!(fs::read(b.join("d/e/f.txt")).unwrap(), b"hello");
    assert_eq!(fs::read(b.join("empty")).unwrap(), b"");
    assert_eq!(
        fs::read(b.join("big")).unwrap(),
        vec![7u8; 3 * 1024 * 1024 + 5]
    );
    let mode = fs::metadata(b.join("d/e/f.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    // Links stay links, with their targets as they were: never followed.
    assert!(
        fs::symlink_metadata(b.join("out"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        fs::read_link(b.join("out")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(fs::read_link(b.join("d/e/up")).unwrap(), Path::new("../d"));
    assert_eq!(
        (stats.files, stats.dirs, stats.symlinks, stats.bytes),
        (3, 2, 2, 5 + 3 * 1024 * 1024 + 5)
    );
}

#[test]
fn the_copy_stops_at_the_budget() {
    let t = tempfile::tempdir().unwrap();
    tree(t.path());
    let err = copy(t.path(), 1024 * 1024).unwrap_err();
    assert!(
        matches!(err, CopyError::Budget { budget, .. } if budget == 1024 * 1024),
        "{err}"
    );
    // Exactly the data fits.
    copy(t.path(), 5 + 3 * 1024 * 1024 + 5).unwrap();
}

#[test]
fn a_volume_never_written_copies_to_an_empty_volume() {
    let t = tempfile::tempdir().unwrap();
    let stats = copy(t.path(), 10).unwrap();
    assert_eq!(stats, CopyStats::default());
    assert_eq!(fs::read_dir(t.path().join("vol-b")).unwrap().count(), 0);
}

#[test]
fn what_the_destination_held_before_is_gone() {
    let t = tempfile::tempdir().unwrap();
    tree(t.path());
    fs::create_dir_all(t.path().join("vol-b/stale")).unwrap();
    fs::write(t.path().join("vol-b/stale/x"), b"old").unwrap();
    copy(t.path(), u64::MAX).unwrap();
    assert!(!t.path().join("vol-b/stale").exists());
}

#[test]
fn a_source_that_is_a_symlink_out_of_the_root_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"s").unwrap();
    symlink(outside.path(), t.path().join("vol-a")).unwrap();
    let err = copy(t.path(), u64::MAX).unwrap_err();
    assert!(
        matches!(
            err,
            CopyError::Io {
                errno: Errno::ELOOP | Errno::ENOTDIR,
                ..
            }
        ),
        "{err}"
    );
    assert!(!t.path().join("vol-b/secret").exists());
}

#[test]
fn a_filesystem_is_synced_through_an_fd() {
    let t = tempfile::tempdir().unwrap();
    sync_filesystem(t.path()).unwrap();
    assert_eq!(
        sync_filesystem(&t.path().join("missing")),
        Err(Errno::ENOENT)
    );
}
