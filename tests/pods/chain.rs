//! The chain on real Pods: a ReadWriteOnce volume follows its Pod from node A to node
//! B (detached once the kubelet has unpublished it), a ReadWriteMany volume serves
//! Pods on both nodes at once, and a kubelet restarted under a Pod keeps its mount and
//! still lets the volume go.

use super::*;

/// The RWO chain on real Pods: written on A, detached when its Pod goes (the kubelet
/// unpublishing, with the FUSE mount root visible to it), read back on B, deleted.
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn rwo_volume_follows_its_pod_from_node_a_to_node_b() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-rwo", "data", "ReadWriteOnce").await;
    let names = nodes.names();
    assert!(names.len() >= 2, "two nodes needed: {names:?}");
    let (a, b) = (&names[0], &names[1]);

    let write = "dd if=/dev/urandom of=/data/big bs=1M count=8 2>/dev/null && \
                 cd /data && sha256sum big > big.sha256 && sync && touch /data/done && \
                 exec sleep 3600";
    pod(&client, &ns, "writer", a, "data", write).await;
    let to_running = wait_phase(&client, &ns, "writer", "Running").await;
    eventually(WAIT, "the writer's data in the backend", || async {
        data.join("done").exists().then_some(())
    })
    .await;
    // The volume is where the kubelet put it, a FUSE mount at its real path.
    let uid = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("writer")
        .await
        .unwrap()
        .uid()
        .unwrap();
    let target = nodes
        .kubelet_dir(a)
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi")
        .join(&pv)
        .join("mount");
    assert_eq!(
        statfs_type(&target),
        Some(FUSE_SUPER_MAGIC),
        "{} is a FUSE mount",
        target.display()
    );
    assert!(
        kubelet_sees_mount_root(&nodes, a, &volume.name_any()),
        "the FUSE mount root of {} must be visible to node {a}'s kubelet, as in production",
        volume.name_any()
    );
    assert_eq!(attachments(&client, &pv).await, vec![a.clone()]);

    // Pod deleted: the kubelet unpublishes, the attach/detach controller detaches.
    let start = Instant::now();
    delete_pod(&client, &ns, "writer").await;
    eventually(
        DETACH_BOUND,
        "the storage VolumeAttachment gone after the Pod",
        || async { attachments(&client, &pv).await.is_empty().then_some(()) },
    )
    .await;
    let detach = start.elapsed();
    assert!(!target.exists(), "the kubelet removed {}", target.display());

    // On node B the same bytes.
    pod(
        &client,
        &ns,
        "reader",
        b,
        "data",
        "cd /data && sha256sum -c big.sha256",
    )
    .await;
    wait_phase(&client, &ns, "reader", "Succeeded").await;
    delete_pod(&client, &ns, "reader").await;
    delete_claim(&client, &ns, "data", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES rwo: Pod to Running {:.1} s; Pod deleted to detached {:.1} s (bound {} s); data checked on {b}",
        to_running.as_secs_f64(),
        detach.as_secs_f64(),
        DETACH_BOUND.as_secs()
    );
}

/// RWX on two nodes at once: what one node's Pod writes, the other's reads.
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn rwx_volume_serves_pods_on_two_nodes_at_once() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-rwx", "shared", "ReadWriteMany").await;
    let names = nodes.names();
    assert!(names.len() >= 2, "two nodes needed: {names:?}");
    let (a, b) = (&names[0], &names[1]);

    pod(
        &client,
        &ns,
        "on-a",
        a,
        "shared",
        "echo from-a > /data/.a && mv /data/.a /data/a && while [ ! -f /data/b ]; do sleep 0.2; done; \
         [ \"$(cat /data/b)\" = from-b ] && exec sleep 3600",
    )
    .await;
    pod(
        &client,
        &ns,
        "on-b",
        b,
        "shared",
        "echo from-b > /data/.b && mv /data/.b /data/b && while [ ! -f /data/a ]; do sleep 0.2; done; \
         [ \"$(cat /data/a)\" = from-a ] && exec sleep 3600",
    )
    .await;
    wait_phase(&client, &ns, "on-a", "Running").await;
    wait_phase(&client, &ns, "on-b", "Running").await;
    // Each saw the other's file (else its script would have ended, failing).
    eventually(WAIT, "both files in the backend", || async {
        (data.join("a").exists() && data.join("b").exists()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for p in ["on-a", "on-b"] {
        assert_eq!(
            pod_phase(&client, &ns, p).await.as_deref(),
            Some("Running"),
            "{p}"
        );
    }
    let mut attached = attachments(&client, &pv).await;
    attached.sort();
    assert_eq!(attached, vec![a.clone(), b.clone()]);

    let start = Instant::now();
    delete_pod(&client, &ns, "on-a").await;
    delete_pod(&client, &ns, "on-b").await;
    eventually(
        DETACH_BOUND,
        "both storage VolumeAttachments gone",
        || async { attachments(&client, &pv).await.is_empty().then_some(()) },
    )
    .await;
    let detach = start.elapsed();
    delete_claim(&client, &ns, "shared", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES rwx: both Pods ran on {a} and {b}; deleted to detached {:.1} s",
        detach.as_secs_f64()
    );
}

/// A kubelet restarted while a Pod uses a volume rebuilds what it knew from the node
/// (reconstruction): the Pod keeps its mount, and when it is deleted later the kubelet
/// unpublishes it and the volume detaches as usual.
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_kubelet_restart_keeps_the_mount_and_still_detaches() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-restart", "data", "ReadWriteOnce").await;
    let node = nodes.names()[0].clone();

    // Appends a line a second; exits (failing the Pod) on the first failed write.
    let script = "i=0; while echo $i >> /data/log; do i=$((i+1)); sleep 1; done; exit 1";
    pod(&client, &ns, "app", &node, "data", script).await;
    wait_phase(&client, &ns, "app", "Running").await;
    let uid = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("app")
        .await
        .unwrap()
        .uid()
        .unwrap();
    let target = nodes
        .kubelet_dir(&node)
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi")
        .join(&pv)
        .join("mount");
    eventually(WAIT, "the app's first lines", || async {
        data.join("log").exists().then_some(())
    })
    .await;

    let status = std::process::Command::new("bash")
        .arg(support::repo_root().join("tests/harness/nodes.sh"))
        .args(["restart-kubelet", &node])
        .status()
        .expect("running nodes.sh restart-kubelet");
    assert!(
        status.success(),
        "restarting the kubelet of {node}: {status}"
    );
    // Some seconds after the restart the Pod still runs, still writes, through the
    // same mount.
    let lines = |p: &Path| {
        std::fs::read_to_string(p)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    let before = lines(&data.join("log"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        pod_phase(&client, &ns, "app").await.as_deref(),
        Some("Running")
    );
    assert!(
        lines(&data.join("log")) > before,
        "the app kept writing across the kubelet restart"
    );
    assert_eq!(statfs_type(&target), Some(FUSE_SUPER_MAGIC));

    let start = Instant::now();
    delete_pod(&client, &ns, "app").await;
    eventually(
        DETACH_BOUND,
        "detached after the restarted kubelet's unpublish",
        || async { attachments(&client, &pv).await.is_empty().then_some(()) },
    )
    .await;
    let detach = start.elapsed();
    assert!(!target.exists(), "the kubelet removed {}", target.display());
    delete_claim(&client, &ns, "data", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES kubelet restart: the Pod kept writing; deleted to detached {:.1} s",
        detach.as_secs_f64()
    );
}
