//! Late renewals on a real node move nothing (docs/failover.md "Flapping", and a node
//! whose agent alone is gone): a Pod on node A writes fsynced records to a claim of a
//! `nodeFailover: Fenced` class while A's node agent is stopped (SIGSTOP), once for
//! less than fenceAfter, once for longer than fenceAfter + margin with A's kubelet
//! still reporting (the Node stays Ready).
//!
//! ```text
//!  agent stopped 10 s (< fenceAfter 20 s)  ─▶ writes go on; nothing fenced, nothing moves
//!  agent stopped 40 s (> fenceAfter + 5 s) ─▶ the daemon fences itself: writes wait
//!    Node still Ready ─▶ AgentGone: no release, no Pod deleted
//!  agent back (SIGCONT, or the kubelet restarted it) ─▶ the waiting write completes,
//!    no error, the same Pod on A
//! ```

use super::*;

/// The records the app wrote, as read through the host's own GlusterFS client.
fn count(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// The pid of node `node`'s agent (`tessera node`, in the node's cgroup), from /proc.
fn agent_pid(node: &str) -> Option<i32> {
    let marker = format!("/{node}/");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_agent = args.len() > 1 && args[0].ends_with(b"tessera") && args[1] == b"node";
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
        (is_agent && cgroup.contains(&marker)).then_some(pid)
    })
}

/// Stop `pid` for `d`, noting the records written meanwhile every 250 ms; continue
/// it. The longest time the count stood still, and the count at the end.
async fn stopped_for(pid: i32, d: Duration, records: &Path) -> (Duration, usize) {
    assert_eq!(
        unsafe { libc::kill(pid, libc::SIGSTOP) },
        0,
        "SIGSTOP {pid}"
    );
    let start = Instant::now();
    let (mut last, mut since, mut still) = (count(records), Instant::now(), Duration::ZERO);
    while start.elapsed() < d {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = count(records);
        if now != last {
            (last, since) = (now, Instant::now());
        }
        still = still.max(since.elapsed());
    }
    // The kubelet may have restarted the agent meanwhile (its liveness probe): then
    // `pid` is gone and this fails harmlessly.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    (still, last)
}

/// Events of these reasons in the namespace or on the Volume (empty: none).
fn moves(ns: &str) -> String {
    let mut out = String::new();
    for reason in ["DeletedOnFencedNode", "FailedOver"] {
        for scope in [vec!["-n", ns], vec!["-A"]] {
            let selector = format!("reason={reason}");
            let mut args = vec!["get", "events"];
            args.extend(scope);
            args.extend(["--field-selector", &selector, "-o", "name"]);
            out.push_str(&kubectl_output(&args));
        }
    }
    out
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn late_renewals_and_a_stopped_agent_move_nothing_and_lose_no_write() {
    let client = support::client().await;
    let nodes = Nodes::load();
    let a = nodes.names()[0].clone();
    let ns = namespace(&client, "pods-fence").await;
    let ClassClaim { class, pv, volume } = class_claim(
        &client,
        &ns,
        "fence",
        json!({"nodeFailover": "Fenced"}),
        "data",
        None,
    )
    .await;
    let records = backend_dir(&nodes, &volume).join("records");
    // Exits (the Pod fails: restartPolicy Never) at the first failed write or fsync.
    let script = "n=0; while :; do n=$((n + 1)); echo $n >> /data/records || exit 3; sync -d /data/records || exit 4; sleep 0.2; done";
    pod(&client, &ns, "app", &a, "data", script).await;
    wait_phase(&client, &ns, "app", "Running").await;
    let uid = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("app")
        .await
        .unwrap()
        .uid();
    eventually(WAIT, "the first records", || async {
        (count(&records) >= 5).then_some(())
    })
    .await;
    let pid = agent_pid(&a).expect("node A's agent runs");

    // Late, within fenceAfter: the writes never stop for long.
    let (still, _) = stopped_for(pid, Duration::from_secs(10), &records).await;
    assert!(
        still < Duration::from_secs(5),
        "writes stood still {still:?} while the agent was 10 s late"
    );

    // Silent past fenceAfter + margin, the kubelet still reporting: the daemon fences
    // itself (the writes wait), nothing is released or deleted.
    let pid = eventually(WAIT, "node A's agent", || async { agent_pid(&a) }).await;
    let (still, at_end) = stopped_for(pid, Duration::from_secs(40), &records).await;
    assert!(
        still >= Duration::from_secs(10),
        "the writes should wait once the node is fenced (longest pause {still:?})"
    );
    let resumed = Instant::now();
    eventually(
        WAIT,
        "the writes going on after the agent is back",
        || async { (count(&records) > at_end + 5).then_some(()) },
    )
    .await;
    let after = resumed.elapsed();
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("app")
        .await
        .unwrap();
    assert_eq!(pod.uid(), uid, "the same Pod");
    assert_eq!(
        pod.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "no write failed"
    );
    assert_eq!(
        attachments(&client, &pv).await,
        vec![a.clone()],
        "still on A"
    );
    let moved = moves(&ns);
    assert!(moved.trim().is_empty(), "nothing moves: {moved}");
    eprintln!(
        "REAL NODES agent of {a} stopped 40 s: writes waited {:.1} s, went on {:.1} s after it was back, no error, nothing moved",
        still.as_secs_f64(),
        after.as_secs_f64()
    );
    delete_pod(&client, &ns, "app").await;
    // Nothing left behind: the Helm stage after these tests replaces the install only
    // when no Tessera volume is left (CI once failed there on this claim).
    let data = backend_dir(&nodes, &volume);
    delete_claim(&client, &ns, "data", &pv, &volume.name_any(), &data).await;
    delete_class(&client, &class).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}
