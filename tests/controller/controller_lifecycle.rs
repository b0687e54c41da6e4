//! The controller's life cycle against the real control plane: killed mid-reconcile
//! and restarted, two replicas electing one leader, a deleted Volume's data removed
//! through its cleanup ticket, and a NodeLocal Volume whose node is gone. (Split from
//! `controller`, whose `env` and waits these share.)

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use tessera_api::{MountPod, Volume, VolumeAttachment, VolumeState};

use super::controller::{WAIT, env};
use crate::support;
use support::fixtures::{self, ControllerProcess, FakeAgent, eventually};

#[tokio::test]
async fn killed_mid_reconcile_and_restarted_the_controller_converges() {
    let e = env("crash", 2).await;
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let mut ctrl = ControllerProcess::alone(&e.id, &[]);
    let mut vols = vec![];
    for i in 0..6 {
        vols.push(e.volume(&format!("v{i}"), "ReadWriteOnce").await);
    }
    for (i, vol) in vols.iter().enumerate() {
        fixtures::put_ticket(
            &e.client,
            vol,
            "csi-a",
            "csi-attacher",
            &e.nodes[i % 2],
            json!({}),
        )
        .await;
    }
    // Kill -9 while it is working through the burst of tickets, then start a new one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ctrl.kill();
    for vol in &vols {
        fixtures::put_ticket(
            &e.client,
            vol,
            "csi-b",
            "csi-attacher",
            &e.nodes[1],
            json!({}),
        )
        .await;
    }
    let _ctrl2 = ControllerProcess::alone(&e.id, &[]);
    // Converged: csi-a holds each volume on its node with exactly one MountPod; csi-b
    // shares node 1 where csi-a is there and waits elsewhere; nothing is stranded.
    for (i, vol) in vols.iter().enumerate() {
        let holder = e.nodes[i % 2].clone();
        let want_b = i % 2 == 1;
        eventually(WAIT, &format!("{vol} converged"), || async {
            let states = fixtures::ticket_states(&e.client, vol).await;
            let mps = fixtures::mountpods_of(&e.client, vol).await;
            let ok = states.get("csi-a").is_some_and(|a| a.satisfied)
                && states
                    .get("csi-b")
                    .is_some_and(|b| b.satisfied == want_b && !b.reason.is_empty())
                && mps == BTreeMap::from([(holder.clone(), false)]);
            ok.then_some(())
        })
        .await;
    }
    e.cleanup(&vols).await;
}

#[tokio::test]
async fn two_replicas_elect_one_leader() {
    let e = env("leader", 1).await;
    let lease = format!("tessera-{}", e.id);
    let lease_arg = format!("--lease-name={lease}");
    let mut a = ControllerProcess::start(&e.id, &[&lease_arg, "--identity=replica-a"]);
    let b = ControllerProcess::start(&e.id, &[&lease_arg, "--identity=replica-b"]);
    let leases: Api<Lease> = Api::namespaced(e.client.clone(), "default");
    let holder = eventually(WAIT, "lease held", || async {
        leases
            .get_opt(&lease)
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
    })
    .await;
    let vol = e.volume("v", "ReadWriteOnce").await;
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    e.attach(&vol, "manual-a", "manual", &e.nodes[0]).await;
    let (leader, follower) = if holder == "replica-a" {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(
        leader.metric_sum("tessera_reconcile_total") > 0.0,
        "the leader reconciles"
    );
    assert_eq!(
        follower.metric_sum("tessera_reconcile_total"),
        0.0,
        "the follower must not act"
    );

    // The leader dies: the other replica takes over and serves a new ticket.
    let follower_id = if holder == "replica-a" {
        "replica-b"
    } else {
        "replica-a"
    };
    if holder == "replica-a" {
        a.kill()
    } else {
        drop(b)
    };
    eventually(
        Duration::from_secs(40),
        "the follower takes over the lease",
        || async {
            leases
                .get_opt(&lease)
                .await
                .unwrap()
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| h == follower_id)
        },
    )
    .await;
    fixtures::remove_ticket(&e.client, &vol, "manual-a").await;
    e.attach(&vol, "manual-b", "manual", &e.nodes[0]).await;
    let _ = leases.delete(&lease, &DeleteParams::default()).await;
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn deleting_a_volume_removes_its_data_through_a_cleanup_ticket() {
    let e = env("delete", 1).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;
    e.attach(&vol, "manual-a", "manual", &e.nodes[0]).await;
    fixtures::remove_ticket(&e.client, &vol, "manual-a").await;

    // The agent "takes its time" removing the data: the Volume must wait for it.
    agent
        .hold_remove_data
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let volumes: Api<Volume> = Api::all(e.client.clone());
    volumes
        .delete(&vol, &DeleteParams::default())
        .await
        .unwrap();
    let va: Api<VolumeAttachment> = Api::all(e.client.clone());
    let ticket = eventually(WAIT, "cleanup ticket added", || async {
        va.get_opt(&vol)
            .await
            .unwrap()?
            .spec
            .attachment_tickets
            .get("cleanup-data")
            .cloned()
    })
    .await;
    assert_eq!(
        ticket.node_id, e.nodes[0],
        "the cleanup runs where the volume was last mounted"
    );
    let mps: Api<MountPod> = Api::all(e.client.clone());
    eventually(WAIT, "a RemoveData MountPod on that node", || async {
        let list = mps
            .list(&kube::api::ListParams::default().labels(&format!("tessera.io/volume={vol}")))
            .await
            .unwrap();
        list.items
            .iter()
            .any(|mp| mp.spec.task == tessera_api::MountTask::RemoveData)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = volumes
        .get_opt(&vol)
        .await
        .unwrap()
        .expect("the Volume must stay until its data is removed");
    assert_eq!(
        still.status.and_then(|s| s.state),
        Some(VolumeState::Deleting)
    );

    // The agent reports the data removed: then, and only then, the Volume goes.
    agent
        .hold_remove_data
        .store(false, std::sync::atomic::Ordering::SeqCst);
    eventually(
        WAIT,
        "Volume deleted after its data was removed",
        || async { volumes.get_opt(&vol).await.unwrap().is_none().then_some(()) },
    )
    .await;
    fixtures::delete_nodes(&e.client, &e.nodes).await;
}

/// Issue 13, item 12: a node-local Volume whose node is gone cannot have its data
/// removed. It waits, its status says so and names the annotation; its cleanup ticket
/// is not reaped and re-added over and over; the annotation lets it go.
#[tokio::test]
async fn a_node_local_volume_whose_node_is_gone_waits_for_the_abandon_annotation() {
    let e = env("abandon", 1).await;
    let _ctrl = ControllerProcess::alone(&e.id, &["--reap-grace=1s"]);
    let gone = format!("{}-gone", e.id);
    let name = e.volume_name("v");
    let mut v = fixtures::volume(&name, &e.id, "ReadWriteOnce");
    v.spec.backend.scope = tessera_api::BackendScope::NodeLocal;
    v.spec.backend.node = Some(gone.clone());
    let vol = e.create_volume(&v).await;
    let volumes: Api<Volume> = Api::all(e.client.clone());
    volumes
        .delete(&vol, &DeleteParams::default())
        .await
        .unwrap();

    let condition = || async {
        volumes
            .get_opt(&vol)
            .await
            .unwrap()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "DataRemoved")
    };
    let c = eventually(WAIT, "the Volume says why it waits", condition).await;
    assert_eq!(c.reason, "NodeNotFound", "{}", c.message);
    assert!(c.message.contains(&gone), "{}", c.message);
    assert!(
        c.message.contains("tessera.io/abandon-data=true"),
        "{}",
        c.message
    );
    // Longer than the reaper's grace and interval: the ticket stays, nobody churns it.
    let va: Api<VolumeAttachment> = Api::all(e.client.clone());
    let first = va.get(&vol).await.unwrap().spec.attachment_tickets["cleanup-data"].clone();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = va.get(&vol).await.unwrap();
    assert_eq!(
        after.spec.attachment_tickets.get("cleanup-data"),
        Some(&first)
    );
    let reaped = support::kubectl_output(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        &format!("involvedObject.name={vol},reason=TicketReaped"),
        "-o",
        "name",
    ]);
    assert_eq!(reaped.trim(), "", "the cleanup ticket is not reaped");
    assert!(volumes.get_opt(&vol).await.unwrap().is_some());

    volumes
        .patch(
            &vol,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"tessera.io/abandon-data": "true"}}}),
            ),
        )
        .await
        .unwrap();
    eventually(WAIT, "Volume gone once its data is abandoned", || async {
        volumes.get_opt(&vol).await.unwrap().is_none().then_some(())
    })
    .await;
    fixtures::delete_nodes(&e.client, &e.nodes).await;
}
