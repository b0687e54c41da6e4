//! Mounts outlive the node agent (issue 14, first case): an application writes
//! through one open descriptor on a Tessera volume while the node agent's DaemonSet
//! is rolled out (`kubectl rollout restart`). In pod mode the FUSE daemon lives in its
//! mount Pod, not in the agent's container: the mount Pod is the same before and
//! after, the app's container never restarts, no write fails, and every record is in
//! the backend, in order.

use tessera_api::MountPod;
use tessera_node::pods::spec::pod_name;

use super::writer;
use super::*;

const NS: &str = "tessera-system";

/// The uid of the mount Pod serving `volume` on `node`, once it runs.
async fn mount_pod_uid(client: &Client, volume: &str, node: &str) -> String {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let name = pod_name(volume, node);
    eventually(WAIT, &format!("mount Pod {name} running"), || async {
        let p = api.get_opt(&name).await.ok().flatten()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then(|| p.uid())?
    })
    .await
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn an_agent_rollout_restart_breaks_no_write() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-rollout", "data", "ReadWriteOnce").await;
    let node = nodes.names()[0].clone();
    writer::start(&client, &ns, "app", &node, "data").await;
    writer::wait_records(&data, 20).await;
    let before = mount_pod_uid(&client, &volume.name_any(), &node).await;
    let mp_name = tessera_api::mountpod_name(&volume.name_any(), &node);
    let mps: Api<MountPod> = Api::all(client.clone());
    let restarts = |m: MountPod| m.status.map(|s| s.restarts).unwrap_or(0);
    let restarts_before = restarts(mps.get(&mp_name).await.unwrap());

    let start = Instant::now();
    kubectl_output(&["-n", NS, "rollout", "restart", "daemonset/tessera-node"]);
    kubectl_output(&[
        "-n",
        NS,
        "rollout",
        "status",
        "daemonset/tessera-node",
        "--timeout=180s",
    ]);
    let rollout = start.elapsed();
    // The new agent has adopted the mount: the app keeps writing for a while more.
    writer::wait_records(&data, 40).await;
    writer::assert_undisturbed(&client, &ns, "app").await;
    let after = mount_pod_uid(&client, &volume.name_any(), &node).await;
    assert_eq!(before, after, "the mount Pod was replaced by the rollout");
    let mp = mps.get(&mp_name).await.unwrap();
    assert!(
        mp.is_ready(),
        "MountPod {mp_name} not Ready: {:?}",
        mp.status
    );
    assert_eq!(restarts(mp), restarts_before, "the mount was repaired");

    let checked = writer::stop_and_check(&client, &ns, "app", &data).await;
    delete_pod(&client, &ns, "app").await;
    delete_claim(&client, &ns, "data", &pv, &volume.name_any(), &data).await;
    // The MountPod went with the volume, and its mount Pod with it (owner).
    let name = pod_name(&volume.name_any(), &node);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    eventually(WAIT, "the mount Pod gone with its MountPod", || async {
        pods.get_opt(&name)
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
    // The daemon unmounted on SIGTERM (or the agent after it): nothing left on the node.
    assert!(
        !kubelet_sees_mount_root(&nodes, &node, &volume.name_any()),
        "a FUSE mount of {} is left on {node}",
        volume.name_any()
    );
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES agent rollout restart: {} records through one descriptor, none failed; \
         rollout {:.1} s; longest write stall {:.0} ms (record {})",
        checked.records,
        rollout.as_secs_f64(),
        checked.longest_write * 1000.0,
        checked.longest_at
    );
}
