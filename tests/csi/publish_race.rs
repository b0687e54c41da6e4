//! NodePublish's bind against a symlink race (issue 13, security item 2; root needed):
//! while a racer keeps swapping a directory under the kubelet directory with a symlink
//! to a directory outside it, 1,000 publishes of a target below it must never put a
//! mount outside the kubelet directory, and unpublish must never unmount outside it.
//! The publish and unpublish are the ones the CSI Node service runs
//! ([`Mounts::bind_beneath`], [`Mounts::unmount_beneath`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tessera_host::mounts::{HostMounts, Mounts};

const ATTEMPTS: usize = 1_000;

fn mounts_under(dir: &Path) -> usize {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    tessera_host::mounts::parse_mountinfo(&text)
        .iter()
        .filter(|m| m.mount_point.starts_with(dir))
        .count()
}

#[test]
fn a_symlink_race_never_mounts_outside_the_kubelet_dir() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let kubelet = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    std::fs::write(source.path().join("data"), b"volume").unwrap();
    let kdir = kubelet.path().to_path_buf();
    // `pods/p` flips between a real directory and a symlink to `outside`.
    std::fs::create_dir_all(kdir.join("pods/p")).unwrap();
    std::fs::create_dir_all(kdir.join("spare")).unwrap();
    std::os::unix::fs::symlink(outside.path(), kdir.join("spare/p")).unwrap();
    let target = kdir.join("pods/p/volumes/v/mount");

    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let stop = stop.clone();
        let kdir = kdir.clone();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &kdir.join("pods/p"),
                    nix::fcntl::AT_FDCWD,
                    &kdir.join("spare/p"),
                    nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                );
                swaps += 1;
            }
            swaps
        })
    };

    let m = HostMounts::new();
    let (mut published, mut refused, mut outside_seen) = (0usize, 0usize, 0usize);
    for _ in 0..ATTEMPTS {
        match m.bind_beneath(source.path(), &kdir, &target, false) {
            Ok(()) => published += 1,
            Err(_) => refused += 1,
        }
        if mounts_under(outside.path()) > 0 {
            outside_seen += 1;
            // Clean up what escaped, so the next attempt starts clean.
            let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            for mp in tessera_host::mounts::parse_mountinfo(&text)
                .iter()
                .filter(|mi| mi.mount_point.starts_with(outside.path()))
                .rev()
            {
                let _ = nix::mount::umount2(&mp.mount_point, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let _ = m.unmount_beneath(&kdir, &target, 16);
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    // The race over, the real directory back at `pods/p`: an unpublish removes every
    // mount the race left. (A swap between a publish and its unpublish takes that
    // mount away with the directory, where the unpublish refuses to follow, and the
    // next publishes stack on it once it is back: CI once ended with 12 layers while
    // `pods/p` was the symlink.)
    let at_target = kdir.join("pods/p");
    if std::fs::symlink_metadata(&at_target)
        .unwrap()
        .file_type()
        .is_symlink()
    {
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &at_target,
            nix::fcntl::AT_FDCWD,
            &kdir.join("spare/p"),
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .unwrap();
    }
    let removed = m.unmount_beneath(&kdir, &target, ATTEMPTS + 1);
    let left = mounts_under(&kdir);
    // Whatever is still there goes, so a failure leaves nothing mounted.
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for mi in tessera_host::mounts::parse_mountinfo(&text)
        .iter()
        .filter(|mi| mi.mount_point.starts_with(&kdir))
        .rev()
    {
        let _ = nix::mount::umount2(&mi.mount_point, nix::mount::MntFlags::MNT_DETACH);
    }
    println!(
        "{ATTEMPTS} publish attempts against {swaps} swaps: {published} published under the kubelet dir, {refused} refused, {outside_seen} with a mount outside; {removed:?} left stacked on the target, removed by the last unpublish"
    );
    assert_eq!(outside_seen, 0, "mounts outside the kubelet directory");
    assert!(
        published > 0,
        "no publish succeeded at all: the race test proves nothing"
    );
    assert_eq!(mounts_under(outside.path()), 0);
    assert!(removed.is_ok(), "the last unpublish: {removed:?}");
    assert_eq!(left, 0, "left mounted under the kubelet dir");
}

#[test]
fn a_read_only_publish_through_the_fd_is_read_only_and_unpublish_removes_it() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let kubelet = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    let target = kubelet.path().join("pods/p/volumes/v/mount");
    let m = HostMounts::new();
    m.bind_beneath(source.path(), kubelet.path(), &target, true)
        .unwrap();
    let at = m.mounts_at(&target).unwrap();
    assert_eq!(at.len(), 1, "{at:?}");
    assert!(at[0].read_only(), "{at:?}");
    assert!(std::fs::write(target.join("f"), b"x").is_err(), "writable");
    // Refused: outside the kubelet dir, and through a symlink below it.
    std::os::unix::fs::symlink(source.path(), kubelet.path().join("pods/link")).unwrap();
    assert!(
        m.bind_beneath(
            source.path(),
            kubelet.path(),
            &kubelet.path().join("pods/link/t"),
            false
        )
        .is_err()
    );
    assert!(
        !source.path().join("t").exists(),
        "created through the symlink"
    );
    assert!(
        m.unmount_beneath(kubelet.path(), &kubelet.path().join("pods/link"), 4)
            .is_err()
    );
    assert_eq!(m.unmount_beneath(kubelet.path(), &target, 16).unwrap(), 1);
    assert_eq!(mounts_under(kubelet.path()), 0);
    assert_eq!(m.unmount_beneath(kubelet.path(), &target, 16).unwrap(), 0);
}
