//! The node agent against the real control plane, with real FUSE mounts (root and
//! /dev/fuse needed): the real `tessera controller` turns tickets into MountPods and
//! one or two real `tessera node` processes (distinct node names, mount roots, state
//! and kubelet dirs, all in temporary directories) mount them with `tessera mount`.
//! Volumes keep their data under a temporary backend root.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use tessera_api::{MountPhase, MountPod, Volume};

use crate::support;
// The shared set-up with a backend root and the test's controller, waits bounded by
// WAIT.
use support::env::AgentEnv as Env;
use support::fixtures::{
    self, AgentProcess, NodesGuard, add_references, eventually, set_references,
};

const WAIT: Duration = Duration::from_secs(60);

/// Nodes are named `<prefix>-<test id>-n<i>`: `prefix` lets a test sort its nodes
/// first among CSINodes (the controller picks the first one for data cleanup).
async fn env(prefix: &str, nodes: usize) -> Env {
    Env::new(prefix, nodes, WAIT).await
}

impl Env {
    /// Create the ReadWriteOnce Volume `<id>-<suffix>` under the backend root.
    async fn volume_at(&self, suffix: &str, retain: bool) -> String {
        let name = self.volume_name(suffix);
        let vol = fixtures::volume_at(
            &name,
            &self.id,
            "ReadWriteOnce",
            self.backend.path(),
            retain,
        );
        self.create_volume(&vol).await
    }

    fn source(&self, volume: &str) -> PathBuf {
        self.backend.path().join(volume)
    }
}

fn status(mp: &MountPod) -> tessera_api::MountPodStatus {
    mp.status.clone().unwrap_or_default()
}

/// Unmount the references' binds (NodeUnpublish) and drop them from the MountPod.
async fn remove_references(
    client: &Client,
    agent: &AgentProcess,
    volume: &str,
    targets: &[PathBuf],
) {
    for target in targets {
        nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    set_references(client, volume, &agent.node, json!(null)).await;
}

fn is_mounted(path: &Path) -> bool {
    !fixtures::mounts_at(path).is_empty()
}

fn pid_alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// 1. ticket → controller → MountPod → agent → FUSE mount → ticket satisfied; a
/// file written through the mount point lands in the volume's directory.
#[tokio::test]
async fn ticket_to_fuse_mount_to_data() {
    let e = env("nmount", 1).await;
    let agent = AgentProcess::start(&e.id, &e.nodes[0]);
    let vol = e.volume_at("v", true).await;
    e.attach(&vol, "manual-a", "manual", &e.nodes[0]).await;

    let mp = e.ready_mountpod(&vol, &e.nodes[0], "Ready", |_| true).await;
    let st = status(&mp);
    let mountpoint = agent.mountpoint(&vol);
    assert_eq!(st.phase, Some(MountPhase::Ready));
    assert_eq!(
        st.mount_point.as_deref(),
        Some(mountpoint.to_str().unwrap())
    );
    assert_eq!(st.restarts, 0);
    assert_eq!(st.reference_count, 0);
    assert!(mp.finalizers().iter().any(|f| f == "tessera.io/mount"));
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "True");
    let pid = st.pid.expect("pid reported");
    assert!(pid_alive(pid));
    let mounts = fixtures::mounts_at(&mountpoint);
    assert_eq!(mounts.len(), 1, "one FUSE mount: {mounts:?}");
    assert!(mounts[0].fs_type.starts_with("fuse"), "{mounts:?}");
    assert_eq!(
        std::fs::metadata(&mountpoint)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap(),
        1
    );

    std::fs::write(mountpoint.join("hello.txt"), b"written through FUSE").unwrap();
    assert_eq!(
        std::fs::read(e.source(&vol).join("hello.txt")).unwrap(),
        b"written through FUSE"
    );

    // Detach: the agent unmounts, stops the daemon and lets the MountPod go.
    e.detach(&vol, "manual-a", &e.nodes[0]).await;
    assert!(!is_mounted(&mountpoint));
    assert!(!mountpoint.exists(), "mount point removed");
    eventually(Duration::from_secs(10), "daemon gone", || async {
        (!pid_alive(pid)).then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read(e.source(&vol).join("hello.txt")).unwrap(),
        b"written through FUSE"
    );
    e.cleanup_waiting(&[vol]).await;
}

/// 2. RWO handover between two agents on this machine sharing the backend root.
#[tokio::test]
async fn rwo_handover_between_two_agents() {
    let e = env("nhand", 2).await;
    let a = AgentProcess::start(&e.id, &e.nodes[0]);
    let b = AgentProcess::start(&e.id, &e.nodes[1]);
    let vol = e.volume_at("v", true).await;

    e.attach(&vol, "manual-a", "manual", &a.node).await;
    e.ready_mountpod(&vol, &a.node, "Ready on A", |_| true)
        .await;
    let data: Vec<u8> = (0..(1 << 20))
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    {
        let mut f = std::fs::File::create(a.mountpoint(&vol).join("data.bin")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }

    fixtures::remove_ticket(&e.client, &vol, "manual-a").await;
    e.attach(&vol, "manual-b", "manual", &b.node).await;
    e.ready_mountpod(&vol, &b.node, "Ready on B", |_| true)
        .await;
    assert!(
        fixtures::mountpod_on(&e.client, &vol, &a.node)
            .await
            .is_none(),
        "A detached before B attached"
    );
    assert!(!is_mounted(&a.mountpoint(&vol)), "A unmounted");
    assert_eq!(
        std::fs::read(b.mountpoint(&vol).join("data.bin")).unwrap(),
        data,
        "data intact on B"
    );

    e.detach(&vol, "manual-b", &b.node).await;
    e.cleanup_waiting(&[vol]).await;
}

/// 3. kill -9 of the FUSE daemon: the agent lazily unmounts the dead mount, starts a
/// new daemon, re-binds the recorded reference, and reports the restart.
#[tokio::test]
async fn killed_fuse_daemon_is_repaired_and_rebound() {
    let e = env("nrepair", 1).await;
    let agent = AgentProcess::start(&e.id, &e.nodes[0]);
    let vol = e.volume_at("v", true).await;
    e.attach(&vol, "manual-a", "manual", &agent.node).await;
    e.ready_mountpod(&vol, &agent.node, "Ready", |_| true).await;

    let targets = add_references(
        &e.client,
        &agent,
        &vol,
        &[("writer", false), ("reader", true)],
    )
    .await;
    let (writer, reader) = (&targets[0], &targets[1]);
    let mp = e
        .ready_mountpod(&vol, &agent.node, "two references", |mp| {
            status(mp).reference_count == 2
        })
        .await;
    let old_pid = status(&mp).pid.unwrap();
    std::fs::write(writer.join("before.txt"), b"before the crash").unwrap();

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    // Through both references: broken at first (ENOTCONN), then working again.
    // Polled every 5 ms to measure the repair.
    let mut data_back = None;
    while killed.elapsed() < Duration::from_secs(30) {
        let w = std::fs::read(writer.join("before.txt"));
        let r = std::fs::read(reader.join("before.txt"));
        if let (Ok(w), Ok(r)) = (w, r) {
            data_back = Some((w, r, killed.elapsed()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (w, r, took) = data_back.expect("data readable through both references within 30 s");
    let mp = e
        .ready_mountpod(&vol, &agent.node, "repaired", |mp| {
            let st = status(mp);
            st.restarts == 1 && st.pid != Some(old_pid) && st.phase == Some(MountPhase::Ready)
        })
        .await;
    let ready_after = killed.elapsed();
    let st = status(&mp);
    println!(
        "repair: data readable through both references {} ms after kill -9; \
         MountPod seen Ready with restarts=1 {} ms after",
        took.as_millis(),
        ready_after.as_millis()
    );
    assert_eq!(w, b"before the crash");
    assert_eq!(r, b"before the crash");
    assert_eq!(
        st.last_error.as_deref(),
        Some("fuse daemon exited: signal 9")
    );
    assert!(st.last_error_time.is_some());
    assert!(pid_alive(st.pid.unwrap()));
    assert!(took < Duration::from_secs(10), "repair took {took:?}");
    // The re-bound targets are the new mount, and writes land in the volume.
    std::fs::write(writer.join("after.txt"), b"after the repair").unwrap();
    assert_eq!(
        std::fs::read(e.source(&vol).join("after.txt")).unwrap(),
        b"after the repair"
    );
    for t in &targets {
        assert_eq!(fixtures::mounts_at(t).len(), 1, "one live bind on {t:?}");
    }
    assert!(
        fixtures::mounts_at(reader)[0].read_only(),
        "read-only reference re-bound read-only"
    );
    assert_eq!(
        std::fs::write(reader.join("nope.txt"), b"x")
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EROFS)
    );

    remove_references(&e.client, &agent, &vol, &targets).await;
    e.detach(&vol, "manual-a", &agent.node).await;
    e.cleanup_waiting(&[vol]).await;
}

/// 4. kill -9 of the agent: the restarted agent adopts the running daemon (same pid,
/// same mount id, no remount) while a reader keeps its file open, and applies an
/// online capacity change to it (SIGHUP, no remount).
#[tokio::test]
async fn restarted_agent_adopts_running_mounts() {
    let e = env("nadopt", 1).await;
    let mut agent = AgentProcess::start(&e.id, &e.nodes[0]);
    let vol = e.volume_at("v", true).await;
    e.attach(&vol, "manual-a", "manual", &agent.node).await;
    let mp = e.ready_mountpod(&vol, &agent.node, "Ready", |_| true).await;
    let pid = status(&mp).pid.unwrap();
    let mountpoint = agent.mountpoint(&vol);
    let mount_id = fixtures::mounts_at(&mountpoint)[0].mount_id;
    std::fs::write(mountpoint.join("open.txt"), b"0123456789").unwrap();

    // A reader with an open file, reading all the time.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, reads) = (stop.clone(), reads.clone());
        let mut f = std::fs::File::open(mountpoint.join("open.txt")).unwrap();
        std::thread::spawn(move || -> Result<(), String> {
            while !stop.load(Ordering::Relaxed) {
                let mut buf = String::new();
                f.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
                f.read_to_string(&mut buf).map_err(|e| e.to_string())?;
                if buf != "0123456789" {
                    return Err(format!("read {buf:?}"));
                }
                reads.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })
    };

    agent.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reads_while_down = reads.load(Ordering::Relaxed);
    agent.restart();
    eventually(WAIT, "restarted agent ready", || async {
        agent.ready().then_some(())
    })
    .await;

    // Grow the volume: the restarted agent must act on the MountPod (observedGeneration)
    // without a remount.
    let before = fixtures::mountpod_on(&e.client, &vol, &agent.node)
        .await
        .unwrap();
    Api::<Volume>::all(e.client.clone())
        .patch(
            &vol,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": "2Gi"}})),
        )
        .await
        .unwrap();
    let mp = e
        .ready_mountpod(&vol, &agent.node, "capacity 2Gi observed", |mp| {
            mp.spec.capacity_bytes == 2 << 30 && mp.metadata.generation > before.metadata.generation
        })
        .await;
    let st = status(&mp);
    assert_eq!(st.pid, Some(pid), "same daemon");
    assert_eq!(st.restarts, 0);
    assert!(pid_alive(pid));
    let mounts = fixtures::mounts_at(&mountpoint);
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(mounts[0].mount_id, mount_id, "not remounted");
    // The quota grew online (statfs of the mount reports the new capacity).
    eventually(Duration::from_secs(10), "statfs reports 2Gi", || async {
        let s = nix::sys::statvfs::statvfs(&mountpoint).ok()?;
        let total = s.blocks() * s.fragment_size();
        (total >= (2u64 << 30) - (1 << 20)).then_some(())
    })
    .await;

    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap().expect("the reader never failed");
    let total_reads = reads.load(Ordering::Relaxed);
    assert!(
        reads_while_down > 0 && total_reads > reads_while_down,
        "reads went on: {reads_while_down} → {total_reads}"
    );

    e.detach(&vol, "manual-a", &agent.node).await;
    e.cleanup_waiting(&[vol]).await;
}

/// 5. A MountPod is not unmounted while references remain; it goes once they are.
#[tokio::test]
async fn deletion_waits_for_references() {
    let e = env("ndel", 1).await;
    let agent = AgentProcess::start(&e.id, &e.nodes[0]);
    let vol = e.volume_at("v", true).await;
    e.attach(&vol, "manual-a", "manual", &agent.node).await;
    e.ready_mountpod(&vol, &agent.node, "Ready", |_| true).await;
    let targets = add_references(&e.client, &agent, &vol, &[("reader", true)]).await;
    let target = &targets[0];
    let mp = e
        .ready_mountpod(&vol, &agent.node, "one reference", |mp| {
            status(mp).reference_count == 1
        })
        .await;
    let pid = status(&mp).pid.unwrap();
    std::fs::write(agent.mountpoint(&vol).join("kept.txt"), b"kept").unwrap();

    // The ticket goes, the controller deletes the MountPod; the agent refuses to
    // unmount under the pod.
    fixtures::remove_ticket(&e.client, &vol, "manual-a").await;
    let target_str = target.display().to_string();
    let mp = eventually(
        WAIT,
        "MountPod Terminating, naming the remaining target",
        || async {
            fixtures::mountpod_on(&e.client, &vol, &agent.node)
                .await
                .filter(|mp| {
                    let st = status(mp);
                    mp.metadata.deletion_timestamp.is_some()
                        && st.phase == Some(MountPhase::Terminating)
                        && st.conditions.iter().any(|c| {
                            c.type_ == "Ready"
                                && c.reason == "ReferencesRemain"
                                && c.message.contains(&target_str)
                        })
                })
        },
    )
    .await;
    assert!(mp.finalizers().iter().any(|f| f == "tessera.io/mount"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(pid_alive(pid), "daemon still runs");
    assert_eq!(
        std::fs::read(target.join("kept.txt")).unwrap(),
        b"kept",
        "still served through the reference"
    );
    assert!(
        std::fs::write(target.join("nope.txt"), b"x").is_err(),
        "the read-only reference is read-only"
    );

    remove_references(&e.client, &agent, &vol, &targets).await;
    e.mountpod_gone(&vol, &agent.node).await;
    assert!(!is_mounted(&agent.mountpoint(&vol)));
    eventually(Duration::from_secs(10), "daemon gone", || async {
        (!pid_alive(pid)).then_some(())
    })
    .await;
    e.cleanup_waiting(&[vol]).await;
}

/// 6. Deleting a Volume removes its data through a cleanup ticket: the agent runs the
/// RemoveData task on the node that a CSINode names.
#[tokio::test]
async fn deleted_volume_data_is_removed_by_the_agent() {
    // The CSINode carries the test's label, so the controller picks it for the cleanup.
    let e = env("0nrm", 1).await;
    fixtures::create_csinodes(&e.client, &e.id, &e.nodes).await;
    let _nodes = NodesGuard(e.nodes.clone());
    let agent = AgentProcess::start(&e.id, &e.nodes[0]);
    let vol = e.volume_at("v", false).await;
    e.attach(&vol, "manual-a", "manual", &agent.node).await;
    e.ready_mountpod(&vol, &agent.node, "Ready", |_| true).await;
    std::fs::create_dir_all(agent.mountpoint(&vol).join("dir/sub")).unwrap();
    std::fs::write(agent.mountpoint(&vol).join("dir/sub/file"), b"data").unwrap();
    // A symlink out of the volume must not be followed by the removal.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"keep me").unwrap();
    std::os::unix::fs::symlink(outside.path(), e.source(&vol).join("link")).unwrap();
    e.detach(&vol, "manual-a", &agent.node).await;
    assert!(e.source(&vol).join("dir/sub/file").exists());

    Api::<Volume>::all(e.client.clone())
        .delete(&vol, &DeleteParams::default())
        .await
        .unwrap();
    let api: Api<Volume> = Api::all(e.client.clone());
    eventually(WAIT, "Volume gone after its data was removed", || async {
        api.get_opt(&vol).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(!e.source(&vol).exists(), "data directory removed");
    assert!(e.backend.path().exists(), "backend root kept");
    assert_eq!(
        std::fs::read(outside.path().join("precious")).unwrap(),
        b"keep me"
    );
    // The RemoveData MountPod went with the Volume (owner reference) once the agent
    // let it go.
    e.mountpod_gone(&vol, &agent.node).await;

    e.cleanup_waiting(&[]).await;
}

/// The `DataRemoved` condition of Volume `name` (reason, message), if it has one.
async fn data_removed_condition(client: &Client, name: &str) -> Option<(String, String)> {
    let v = Api::<Volume>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()?;
    v.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "DataRemoved")
        .map(|c| (c.reason, c.message))
}

/// 7. (issue 13) A Volume deleted while it is attached keeps its data while the
/// workload ticket holds it (its status says so), and loses it, on disk, once the
/// ticket is removed; `DataRemoved` is only published then. A Volume whose mount failed
/// (its backend root is missing) is deleted as well.
#[tokio::test]
async fn volume_deleted_while_attached_loses_its_data_once_detached() {
    let e = env("0ndel", 1).await;
    fixtures::create_csinodes(&e.client, &e.id, &e.nodes).await;
    let _nodes = NodesGuard(e.nodes.clone());
    let agent = AgentProcess::start(&e.id, &e.nodes[0]);
    let api: Api<Volume> = Api::all(e.client.clone());
    let vol = e.volume_at("v", false).await;
    e.attach(&vol, "manual-a", "manual", &agent.node).await;
    e.ready_mountpod(&vol, &agent.node, "Ready", |_| true).await;
    std::fs::write(agent.mountpoint(&vol).join("file"), b"in use").unwrap();

    api.delete(&vol, &DeleteParams::default()).await.unwrap();
    let (reason, message) = eventually(WAIT, "Volume says why its data waits", || async {
        data_removed_condition(&e.client, &vol).await
    })
    .await;
    assert_eq!(reason, "InUse", "{message}");
    assert!(message.contains("manual-a"), "{message}");
    // Still there some time later: the Volume, its data, and the mount in use.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        api.get_opt(&vol).await.unwrap().is_some(),
        "Volume kept while attached"
    );
    assert_eq!(
        std::fs::read(agent.mountpoint(&vol).join("file")).unwrap(),
        b"in use"
    );
    assert!(
        e.source(&vol).join("file").exists(),
        "data kept while attached"
    );
    let removed_events = || {
        support::kubectl_output(&[
            "get",
            "events",
            "-A",
            "--field-selector",
            &format!("involvedObject.name={vol},reason=DataRemoved"),
            "-o",
            "name",
        ])
    };
    assert_eq!(removed_events().trim(), "", "no DataRemoved while attached");

    fixtures::remove_ticket(&e.client, &vol, "manual-a").await;
    eventually(WAIT, "Volume gone after its data was removed", || async {
        api.get_opt(&vol).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(!e.source(&vol).exists(), "data directory removed on disk");
    assert!(!removed_events().trim().is_empty(), "DataRemoved published");

    // A mount that failed: the backend root does not exist on the node.
    let broken = e.volume_name("broken");
    let missing = e.backend.path().join("missing");
    let v = fixtures::volume_at(&broken, &e.id, "ReadWriteOnce", &missing, false);
    e.create_volume(&v).await;
    fixtures::put_ticket(
        &e.client,
        &broken,
        "manual-a",
        "manual",
        &agent.node,
        json!({}),
    )
    .await;
    eventually(WAIT, "the mount of the broken Volume fails", || async {
        let states = fixtures::ticket_states(&e.client, &broken).await;
        (states.get("manual-a")?.reason == "MountFailed").then_some(())
    })
    .await;
    api.delete(&broken, &DeleteParams::default()).await.unwrap();
    fixtures::remove_ticket(&e.client, &broken, "manual-a").await;
    eventually(WAIT, "Volume whose mount failed gone", || async {
        api.get_opt(&broken).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(!missing.exists(), "nothing created for it");

    e.cleanup_waiting(&[]).await;
}

/// The value of the sample `family{volume="<volume>",node="<node>"<extra>}` in a
/// metrics text, 0 if absent.
fn mount_sample(text: &str, family: &str, volume: &str, node: &str, extra: &str) -> f64 {
    // These volumes belong to no claim: their claim labels are empty.
    let head = format!(
        "{family}{{volume=\"{volume}\",node=\"{node}\",pvc=\"\",pvc_namespace=\"\"{extra}}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&head)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Per-mount FUSE counters: I/O through a mount served by an agent's daemon shows in
/// the agent's /metrics (operations, their time, bytes, errors, quota), rising with
/// more I/O, and
/// an agent restarted over the running daemon (adopting it) shows them on.
#[tokio::test]
async fn the_agent_exports_each_mounts_fuse_counters() {
    let e = env("nfusec", 1).await;
    let mut agent = AgentProcess::start(&e.id, &e.nodes[0]);
    let node = e.nodes[0].clone();
    let vol = e.volume_at("v", false).await;
    e.attach(&vol, "manual-a", "manual", &node).await;
    e.ready_mountpod(&vol, &node, "Ready", |_| true).await;
    let mountpoint = agent.mountpoint(&vol);
    let sample =
        |text: &str, family: &str, extra: &str| mount_sample(text, family, &vol, &node, extra);

    std::fs::write(mountpoint.join("a"), vec![7u8; 1 << 20]).unwrap();
    let first = agent.metrics().unwrap_or_default();
    let writes1 = sample(&first, "tessera_fuse_operations_total", ",op=\"write\"");
    let written1 = sample(&first, "tessera_fuse_written_bytes_total", "");
    assert!(writes1 >= 1.0, "write operations counted: {first}");
    assert!(
        written1 >= (1 << 20) as f64,
        "bytes written counted: {first}"
    );
    assert!(sample(&first, "tessera_fuse_operations_total", ",op=\"create\"") >= 1.0);

    // More I/O: the counters rise; an error the kernel cannot answer by itself (a
    // directory not empty) is counted by its errno.
    std::fs::create_dir(mountpoint.join("d")).unwrap();
    std::fs::write(mountpoint.join("d/f"), b"x").unwrap();
    let busy = std::fs::remove_dir(mountpoint.join("d")).unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::ENOTEMPTY));
    std::fs::write(mountpoint.join("b"), vec![1u8; 4096]).unwrap();
    let second = agent.metrics().unwrap_or_default();
    assert!(sample(&second, "tessera_fuse_operations_total", ",op=\"write\"") > writes1);
    assert!(sample(&second, "tessera_fuse_written_bytes_total", "") >= written1 + 4097.0);
    assert!(
        sample(&second, "tessera_fuse_errors_total", ",errno=\"ENOTEMPTY\"") >= 1.0,
        "{second}"
    );
    // Each request is timed: the writes' seconds and histogram (its count catches up
    // with the operations once the last write's handler has returned after its reply).
    eventually(Duration::from_secs(10), "write durations", || async {
        let text = agent.metrics().unwrap_or_default();
        let writes = sample(&text, "tessera_fuse_operations_total", ",op=\"write\"");
        let secs = sample(
            &text,
            "tessera_fuse_operation_seconds_total",
            ",op=\"write\"",
        );
        let timed = sample(
            &text,
            "tessera_fuse_operation_duration_seconds_count",
            ",op=\"write\"",
        );
        let sum = sample(
            &text,
            "tessera_fuse_operation_duration_seconds_sum",
            ",op=\"write\"",
        );
        let mean = secs / writes;
        (timed == writes && sum == secs && mean > 1e-7 && mean < 1.0).then_some(())
    })
    .await;
    // The quota gauges are refreshed every second.
    eventually(Duration::from_secs(10), "quota gauges", || async {
        let text = agent.metrics().unwrap_or_default();
        let used = sample(&text, "tessera_fuse_quota_used_bytes", "");
        let limit = sample(&text, "tessera_fuse_quota_limit_bytes", "");
        (used >= (1 << 20) as f64 && limit == (1u64 << 30) as f64).then_some(())
    })
    .await;

    // A restarted agent adopts the daemon and reads its counters on.
    agent.restart();
    eventually(WAIT, "restarted agent ready", || async {
        agent.ready().then_some(())
    })
    .await;
    let after = agent.metrics().unwrap_or_default();
    assert!(
        sample(&after, "tessera_fuse_written_bytes_total", "") >= written1 + 4097.0,
        "{after}"
    );

    e.detach(&vol, "manual-a", &node).await;
    eventually(
        Duration::from_secs(10),
        "counters gone with the mount",
        || async {
            let text = agent.metrics().unwrap_or_default();
            (!text.contains(&format!("volume=\"{vol}\""))).then_some(())
        },
    )
    .await;
    e.cleanup_waiting(&[vol]).await;
}
