//! `tessera mount`'s life cycle: a stop signal ends the daemon promptly, whatever
//! still refers to the mount.

use std::fs;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::Signal;

use crate::support::{FUSE_SUPER_MAGIC, Mount, statfs_type};

/// A mount that was propagated elsewhere (here: bound to a second place, as a
/// kubelet's bind of a staged volume or a shared mount root would) keeps the FUSE
/// connection alive after the daemon's own mount point is unmounted. The daemon must
/// still exit on the first SIGTERM: lazy unmount, then exit.
#[test]
fn first_sigterm_exits_promptly_although_the_mount_was_propagated_and_files_are_open() {
    let mut m = Mount::builder()
        .prepare(|src| fs::write(src.join("f"), b"data").unwrap())
        .mount();
    let elsewhere = m.dir().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    mount(
        Some(&m.mnt),
        &elsewhere,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("bind the mount elsewhere");
    assert_eq!(fs::read(elsewhere.join("f")).unwrap(), b"data");
    // An open file through each: the daemon's own unmount is busy too.
    let _held = fs::File::open(m.path("f")).unwrap();
    let _held_elsewhere = fs::File::open(elsewhere.join("f")).unwrap();

    let start = Instant::now();
    m.signal(Signal::SIGTERM);
    let status = m.wait_exit(Duration::from_secs(10));
    let took = start.elapsed();
    let _ = umount2(&elsewhere, MntFlags::MNT_DETACH);
    let status = status.unwrap_or_else(|| {
        panic!(
            "tessera mount still runs 10 s after one SIGTERM:\n{}",
            m.log()
        )
    });
    assert!(status.success(), "exit status {status}:\n{}", m.log());
    assert!(
        took < Duration::from_secs(5),
        "took {took:?} to exit on SIGTERM:\n{}",
        m.log()
    );
    assert_ne!(
        statfs_type(&m.mnt).ok(),
        Some(FUSE_SUPER_MAGIC),
        "the daemon's own mount point is still mounted"
    );
    eprintln!("exited {took:?} after SIGTERM");
}
