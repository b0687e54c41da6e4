//! The agent mounts, the daemon serves what it is given (`--mounter=agent`, the
//! default): with the real agent (process mode, its own fd holder), a control plane
//! from the harness and real FUSE mounts. The daemon is held back at its start by the
//! test-only fault point `TESSERA_FAULT_HOLD_START` (it waits while a file exists), as
//! a mount Pod that is slow to start, or never comes, would be:
//! - the MountPod is Ready (`AwaitingDaemon`) and can be bound while no daemon runs yet; a
//!   write through the bind waits in the kernel and completes once the daemon comes;
//! - the agent's mount is the one the daemon makes itself (`--mounter=daemon`): the
//!   same flags and options in the mount table;
//! - a daemon that never comes: past the start timeout the waiting write fails with
//!   ENOTCONN (not a hang), and once a daemon comes the mount is redone and new I/O
//!   through the Pod's target works.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tessera_api::{MountPhase, MountPod, MountPodStatus};

use crate::support;
use support::env::AgentEnv as Env;
use support::fixtures::{self, AgentProcess};

const WAIT: Duration = Duration::from_secs(60);
const HOLD: &str = "TESSERA_FAULT_HOLD_START";

fn status(mp: &MountPod) -> MountPodStatus {
    mp.status.clone().unwrap_or_default()
}

fn ready_reason(mp: &MountPod) -> String {
    status(mp)
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

/// A write of `data` to `path` on a thread of its own (it may wait in the kernel).
fn write_in_background(
    path: PathBuf,
    data: &'static [u8],
) -> std::thread::JoinHandle<std::io::Result<()>> {
    std::thread::spawn(move || {
        let mut f = std::fs::File::create(&path)?;
        f.write_all(data)?;
        f.sync_all()
    })
}

/// The mount table's line for `path` after its mount ids: the mount's options, then
/// (after ` - `) the type, source and the filesystem's own options.
fn mount_line(path: &Path) -> String {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let needle = format!(" {} ", path.display());
    let line = table
        .lines()
        .rfind(|l| l.contains(&needle))
        .unwrap_or_else(|| panic!("{} not in the mount table", path.display()));
    let fields: Vec<&str> = line.split(' ').collect();
    fields[5..].join(" ")
}

#[tokio::test]
async fn the_agent_mounts_before_the_daemon_and_requests_wait_for_it() {
    let e = Env::new("nagentmnt", 1, WAIT).await;
    let hold = tempfile::NamedTempFile::new().unwrap();
    let hold_path = hold.path().display().to_string();
    let agent = AgentProcess::start_with_env(&e.id, &e.nodes[0], &[], &[(HOLD, &hold_path)]);
    let name = e.volume_name("v");
    let vol = fixtures::volume_at(&name, &e.id, "ReadWriteOnce", e.backend.path(), true);
    let vol = e.create_volume(&vol).await;
    let asked = Instant::now();
    e.attach(&vol, "manual-a", "manual", &agent.node).await;
    let mp = e
        .mounted_mountpod(&vol, &agent.node, "Ready, mounted by the agent", |mp| {
            status(mp).phase == Some(MountPhase::Ready)
        })
        .await;
    let ready = asked.elapsed();
    assert_eq!(
        ready_reason(&mp),
        "AwaitingDaemon",
        "Ready before its daemon answers: {:?}",
        status(&mp)
    );
    let mountpoint = agent.mountpoint(&vol);
    assert!(
        mount_line(&mountpoint).contains(" - fuse "),
        "a FUSE mount: {}",
        mount_line(&mountpoint)
    );
    // Bound into the "Pod" while no daemon runs; its first write waits for one.
    let target = fixtures::add_references(&e.client, &agent, &vol, &[("app", false)])
        .await
        .remove(0);
    let issued = Instant::now();
    let write = write_in_background(target.join("first.txt"), b"written before the daemon");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !write.is_finished(),
        "the write did not wait for the daemon"
    );
    let daemon_let_go = issued.elapsed();
    drop(hold);
    write.join().unwrap().expect("the waiting write");
    let done = issued.elapsed();
    println!(
        "agent mount: MountPod Ready {} ms after the ticket, first write issued then, \
         daemon let start {} ms later, the write answered {} ms after it was issued",
        ready.as_millis(),
        daemon_let_go.as_millis(),
        done.as_millis()
    );
    // What the application wrote is what the backend directory has.
    assert_eq!(
        std::fs::read(e.backend.path().join(&vol).join("first.txt")).unwrap(),
        b"written before the daemon"
    );
    e.ready_mountpod(&vol, &agent.node, "served by its daemon", |mp| {
        status(mp).pid.is_some() && ready_reason(mp) == "Mounted" && status(mp).reference_count == 1
    })
    .await;
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn the_agents_mount_is_the_mount_the_daemon_would_make() {
    let mut lines = Vec::new();
    for (prefix, args) in [
        ("nagentsame", vec![]),
        ("ndaemonsame", vec!["--mounter=daemon".to_string()]),
    ] {
        let e = Env::new(prefix, 1, WAIT).await;
        let agent = AgentProcess::start_with(&e.id, &e.nodes[0], &args);
        let name = e.volume_name("v");
        let mut vol = fixtures::volume_at(&name, &e.id, "ReadWriteOnce", e.backend.path(), true);
        vol.spec.mount_options = vec!["noatime".into(), "noexec".into()];
        let vol = e.create_volume(&vol).await;
        e.attach(&vol, "manual-a", "manual", &agent.node).await;
        e.ready_mountpod(&vol, &agent.node, "served", |mp| {
            status(mp).phase == Some(MountPhase::Ready) && ready_reason(mp) == "Mounted"
        })
        .await;
        let mountpoint = agent.mountpoint(&vol);
        std::fs::write(mountpoint.join("f"), b"x").unwrap();
        // The source is the volume's directory: the same but for its root and name.
        let line = mount_line(&mountpoint)
            .replace(&e.backend.path().display().to_string(), "ROOT")
            .replace(&vol, "VOLUME");
        lines.push(line);
        e.cleanup(&[vol]).await;
    }
    println!(
        "mount table, agent's mount:  {}\nmount table, daemon's mount: {}",
        lines[0], lines[1]
    );
    assert_eq!(lines[0], lines[1], "agent's mount vs the daemon's");
    assert!(lines[0].contains("noexec") && lines[0].contains("default_permissions"));
}

#[tokio::test]
async fn a_daemon_that_never_comes_fails_the_waiting_requests_then_the_mount_is_redone() {
    let e = Env::new("nagentlate", 1, WAIT).await;
    let hold = tempfile::NamedTempFile::new().unwrap();
    let hold_path = hold.path().display().to_string();
    let bound = Duration::from_secs(3);
    let agent = AgentProcess::start_with_env(
        &e.id,
        &e.nodes[0],
        &[format!("--start-timeout={}s", bound.as_secs())],
        &[(HOLD, &hold_path)],
    );
    let name = e.volume_name("v");
    let vol = fixtures::volume_at(&name, &e.id, "ReadWriteOnce", e.backend.path(), true);
    let vol = e.create_volume(&vol).await;
    e.attach(&vol, "manual-a", "manual", &agent.node).await;
    e.mounted_mountpod(&vol, &agent.node, "Ready, mounted by the agent", |mp| {
        status(mp).phase == Some(MountPhase::Ready)
    })
    .await;
    let target = fixtures::add_references(&e.client, &agent, &vol, &[("app", false)])
        .await
        .remove(0);
    let issued = Instant::now();
    let write = write_in_background(target.join("waits.txt"), b"never");
    let err = tokio::task::spawn_blocking(move || write.join().unwrap())
        .await
        .unwrap()
        .expect_err("a write with no daemon ever succeeded");
    let failed_after = issued.elapsed();
    println!(
        "a daemon that never comes: the waiting write failed after {} ms (start timeout {} s): {err}",
        failed_after.as_millis(),
        bound.as_secs()
    );
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    assert!(
        failed_after < Duration::from_secs(30),
        "the bound did not hold: {failed_after:?}"
    );
    // Said on the MountPod (and on the Pods bound to it: this one has no Pod object).
    let mountpod = tessera_api::mountpod_name(&vol, &agent.node);
    let notes = fixtures::eventually(WAIT, "a DaemonMissing Event", || async {
        let notes =
            support::event_notes(&e.client, &mountpod, "DaemonMissing", Some("Warning")).await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    println!("Event DaemonMissing: {}", notes[0]);
    assert!(notes[0].contains("ENOTCONN"), "{notes:?}");
    // The daemon comes: the mount is redone and the Pod's target works again.
    drop(hold);
    e.ready_mountpod(&vol, &agent.node, "served by its daemon", |mp| {
        status(mp).pid.is_some() && ready_reason(mp) == "Mounted" && status(mp).reference_count == 1
    })
    .await;
    fixtures::eventually(WAIT, "a new write through the target", || async {
        std::fs::write(target.join("after.txt"), b"the daemon came").ok()
    })
    .await;
    assert_eq!(
        std::fs::read(e.backend.path().join(&vol).join("after.txt")).unwrap(),
        b"the daemon came"
    );
    e.cleanup(&[vol]).await;
}
