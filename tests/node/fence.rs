//! Self-fencing (docs/failover.md) with a real `tessera node` renewing its node's
//! liveness Lease on the real API server and a real `tessera mount` of a MountPod
//! that asks for it (`spec.selfFence`): a writer appends a record and fsyncs it in a
//! loop; the agent stopped (SIGSTOP) for less than `fenceAfter` fences nothing; the
//! agent killed for longer fences the writes (they wait, none fails) until the
//! restarted agent renews again; the Lease marked fenced by the controller revokes
//! the daemon: its writes fail with EIO.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use tessera_api::{MountPhase, MountPod, Volume};

use crate::support;
use support::fixtures::{self, AgentProcess, TEST_LABEL, eventually};

const WAIT: Duration = Duration::from_secs(60);
const RENEW: Duration = Duration::from_millis(300);
const FENCE_AFTER: Duration = Duration::from_secs(3);
/// The Leases of these tests: in the namespace every cluster has.
const NAMESPACE: &str = "default";

/// One fsynced append: when it started, when it returned, and how.
#[derive(Debug, Clone)]
struct Done {
    start: Instant,
    end: Instant,
    errno: Option<i32>,
}

/// Append a record and fsync it every 20 ms until `stop`.
fn writer(path: std::path::PathBuf, stop: Arc<AtomicBool>, log: Arc<Mutex<Vec<Done>>>) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let start = Instant::now();
        let r = f
            .write_all(format!("record {seq}\n").as_bytes())
            .and_then(|()| f.sync_data());
        let end = Instant::now();
        let errno = r.err().map(|e| e.raw_os_error().unwrap_or(-1));
        log.lock().unwrap().push(Done { start, end, errno });
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The longest time between two completed writes, within `[from, to]`.
fn longest_gap(log: &[Done], from: Instant, to: Instant) -> Duration {
    let ends: Vec<Instant> = log
        .iter()
        .map(|d| d.end)
        .filter(|&e| e >= from && e <= to)
        .collect();
    ends.windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

#[tokio::test]
async fn writes_wait_without_renewals_and_fail_once_revoked() {
    let env = support::env::Env::new("fence", 1, WAIT).await;
    let node = env.nodes[0].clone();
    let extra = [
        format!("--renew-interval={}ms", RENEW.as_millis()),
        format!("--fence-after={}s", FENCE_AFTER.as_secs()),
        format!("--mount-namespace={NAMESPACE}"),
    ];
    let mut agent = AgentProcess::start_with(&env.id, &node, &extra);
    let backend = support::temp_dir("tessera-backend-");
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), NAMESPACE);
    let lease_name = tessera_api::liveness_lease(&node);

    // A Volume, and its MountPod made by hand (no controller runs) asking for a
    // self-fencing daemon.
    let volume = env.volume_name("v");
    let owner = Api::<Volume>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &fixtures::volume_at(&volume, &env.id, "ReadWriteOnce", backend.path(), true),
        )
        .await
        .unwrap();
    let source = backend.path().join(&volume);
    let mp: MountPod = serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
        "metadata": {"name": format!("{volume}-a"), "ownerReferences": [{
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume", "name": volume,
            "uid": owner.uid().unwrap(), "controller": true}],
            "labels": {TEST_LABEL: env.id, "tessera.io/node": node, "tessera.io/volume": volume}},
        "spec": {"volume": volume, "nodeName": node, "source": source.display().to_string(),
                 "capacityBytes": 1 << 30, "selfFence": true},
    }))
    .unwrap();
    let mountpods: Api<MountPod> = Api::all(env.client.clone());
    mountpods.create(&PostParams::default(), &mp).await.unwrap();
    eventually(WAIT, "the self-fencing mount is Ready", || async {
        let mp = mountpods.get(&format!("{volume}-a")).await.ok()?;
        (mp.status?.phase? == MountPhase::Ready).then_some(())
    })
    .await;
    let lease = leases.get(&lease_name).await.unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(node.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(3));
    let daemon_cmdline = fixtures::mount_daemons_under(&agent.mount_root())
        .into_iter()
        .map(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
        .collect::<Vec<_>>();
    assert!(
        daemon_cmdline
            .iter()
            .any(|c| String::from_utf8_lossy(c).contains("--fence-file")),
        "the daemon fences itself"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let file = agent.mountpoint(&volume).join("records");
    let w = {
        let (stop, log, file) = (stop.clone(), log.clone(), file.clone());
        std::thread::spawn(move || writer(file, stop, log))
    };
    let agent_pid = Pid::from_raw(agent.pid().unwrap() as i32);

    // Flapping: renewals late by 1.5 s, within fenceAfter: nothing waits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    kill(agent_pid, Signal::SIGSTOP).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    kill(agent_pid, Signal::SIGCONT).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t1 = Instant::now();
    let flap_gap = longest_gap(&log.lock().unwrap(), t0, t1);
    eprintln!("late renewals within fenceAfter: longest gap between writes {flap_gap:?}");
    assert!(
        flap_gap < Duration::from_millis(700),
        "a renewal late but within fenceAfter fenced the writes: {flap_gap:?}"
    );

    // The agent killed: the daemon fences itself fenceAfter after the last renewal
    // it heard of; writes wait (none fails) until the restarted agent renews.
    let killed = Instant::now();
    agent.kill();
    tokio::time::sleep(FENCE_AFTER + Duration::from_secs(3)).await;
    let restarted = Instant::now();
    agent.restart();
    eventually(WAIT, "writes go on after the renewal", || async {
        let l = log.lock().unwrap();
        l.iter().any(|d| d.end > restarted).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    {
        let l = log.lock().unwrap();
        let last_before = l
            .iter()
            .filter(|d| d.end < restarted)
            .max_by_key(|d| d.end)
            .unwrap();
        let first_after = l.iter().find(|d| d.end > restarted).unwrap();
        let fenced_at = last_before.end - killed;
        eprintln!(
            "agent killed: last write completed {fenced_at:?} after the kill (fenceAfter {FENCE_AFTER:?}, renewals every {RENEW:?}); \
             writes resumed {:?} after the restart; the waiting write waited {:?}",
            first_after.end - restarted,
            first_after.end - first_after.start
        );
        // Not fenced at once: writable until about fenceAfter after the last renewal
        // (a loaded machine renews late, hence only half of it)...
        assert!(
            fenced_at >= FENCE_AFTER / 2,
            "fenced too early: {fenced_at:?}"
        );
        // ...and no write begun after the deadline (the last renewal before the kill
        // + fenceAfter) completed before the agent was back: a write is admitted
        // after it begins, and only before the deadline.
        assert!(
            last_before.start < killed + FENCE_AFTER,
            "a write begun {:?} after the kill completed, past fenceAfter",
            last_before.start - killed
        );
        assert!(
            first_after.start < restarted,
            "the write that waited is the one that completes"
        );
        let errors: Vec<&Done> = l.iter().filter(|d| d.errno.is_some()).collect();
        assert!(
            errors.is_empty(),
            "a fenced write must wait, not fail: {errors:?}"
        );
    }

    // Reads go on while fenced; then the controller's mark: the agent's renewal fails
    // on it, it takes the Lease again under a new epoch, the daemon is revoked.
    let before = log.lock().unwrap().len();
    let marked = Instant::now();
    leases
        .patch(
            &lease_name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {tessera_api::ANNOTATION_FENCED: "true"}}}),
            ),
        )
        .await
        .unwrap();
    let revoked = eventually(Duration::from_secs(10), "writes fail with EIO", || async {
        let l = log.lock().unwrap();
        l[before..]
            .iter()
            .find(|d| d.errno.is_some())
            .map(|d| (d.errno, d.end - marked))
    })
    .await;
    eprintln!(
        "the Lease marked fenced: writes fail with {:?} after {:?}",
        revoked.0, revoked.1
    );
    assert_eq!(revoked.0, Some(libc::EIO));
    let lease = leases.get(&lease_name).await.unwrap();
    assert_eq!(
        lease.spec.unwrap().lease_transitions,
        Some(1),
        "a new epoch"
    );
    assert!(
        !lease
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(tessera_api::ANNOTATION_FENCED),
        "the agent took the Lease again"
    );
    // Revoked for good, though the node renews again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .and_then(|mut f| f.write_all(b"late\n"))
            .is_err(),
        "a revoked daemon writes nothing"
    );
    // Reads still work.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("record 1\n"));

    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();
    let _ = mountpods
        .delete(&format!("{volume}-a"), &DeleteParams::default())
        .await;
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    drop(agent);
}
