//! Fenced failover in status (docs/failover.md), against the real API server: a node
//! whose Lease is renewed no more (and whose Node is not Ready) is fenced; the
//! opted-in volume whose ticket the controller releases says `NodeFailover`
//! `FailedOver` until it is attached on another node, the volume without the opt-in
//! says `NodeFailover` `StaysOnDownNode` and its MountPod on the dead node `Fenced`
//! until the node takes its Lease back; nothing is written while nothing changes, and
//! the volumes' `Ready` stays as it was.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use tessera_api::{CONDITION_FENCED, CONDITION_NODE_FAILOVER, MountPod, Volume, VolumeAttachment};

use crate::failover::{MARGIN, WAIT, renewing, setup, take_back, tickets};
use crate::support;
use support::fixtures::{self, TEST_LABEL, eventually};
use support::health;

/// The condition of `type_` of Volume `name`, and the Volume.
async fn volume_condition(
    client: &kube::Client,
    name: &str,
    type_: &str,
) -> (Option<Condition>, Volume) {
    let v = Api::<Volume>::all(client.clone()).get(name).await.unwrap();
    let c = v
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_).cloned());
    (c, v)
}

/// The `Fenced` condition of the MountPod of `volume` on `node`, and the MountPod.
async fn fenced_condition(
    client: &kube::Client,
    volume: &str,
    node: &str,
) -> (Option<Condition>, MountPod) {
    let mp = fixtures::mountpod_on(client, volume, node).await.unwrap();
    let c = mp.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_FENCED)
            .cloned()
    });
    (c, mp)
}

/// The reason of a True condition (`None`: absent; a False one fails the test: these
/// conditions are True or absent).
fn reason(c: &Option<Condition>) -> Option<String> {
    c.as_ref().map(|c| {
        assert_eq!(c.status, "True", "{c:?}");
        c.reason.clone()
    })
}

/// kstatus and the Argo CD script read the test's Volumes and MountPods as they read
/// them without `NodeFailover` and `Fenced` (which some of them carry); `off` is Current.
fn same_health_without_the_failover_conditions(id: &str, off: &str) {
    let selector = format!("{TEST_LABEL}={id}");
    let list: Value = serde_json::from_str(&support::kubectl_output(&[
        "get",
        "volumes.tessera.io,mountpods.tessera.io",
        "-l",
        &selector,
        "-o",
        "json",
    ]))
    .unwrap();
    let items = list["items"].as_array().expect("a List").clone();
    let without: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut o = o.clone();
            if let Some(cs) = o["status"]["conditions"].as_array_mut() {
                cs.retain(|c| {
                    c["type"] != CONDITION_NODE_FAILOVER && c["type"] != CONDITION_FENCED
                });
            }
            o
        })
        .collect();
    assert_ne!(items, without, "some objects carry the conditions");
    let kstatus = health::kstatus(&items);
    println!("kstatus: {kstatus:?}");
    assert_eq!(kstatus, health::kstatus(&without));
    assert_eq!(
        kstatus.get(&format!("Volume/{off}")).map(String::as_str),
        Some("Current")
    );
    let script = health::argocd_script();
    for (o, w) in items.iter().zip(&without) {
        assert_eq!(
            health::argocd_health(&script, o),
            health::argocd_health(&script, w),
            "{}",
            o["metadata"]["name"]
        );
    }
}

#[tokio::test]
async fn a_fenced_node_shows_on_its_volumes_and_mountpods_until_it_is_over() {
    let (e, _ctrl, agent, leases) = setup("failover-cond").await;
    let (a, b) = (e.nodes[0].clone(), e.nodes[1].clone());
    let a_renews = renewing(&leases, &a);
    let b_renews = renewing(&leases, &b);

    let fenced = e.volume_name("fenced");
    let mut v = fixtures::volume(&fenced, &e.id, "ReadWriteOnce");
    v.spec.node_failover = Some(tessera_api::NodeFailover::Fenced);
    e.create_volume(&v).await;
    let off = e.volume("off", "ReadWriteOnce").await;
    for vol in [&fenced, &off] {
        fixtures::put_ticket(&e.client, vol, "manual-a", "manual", &a, json!({})).await;
    }
    for vol in [&fenced, &off] {
        fixtures::wait_satisfied(&e.client, vol, "manual-a").await;
    }
    // Alive: nothing said (a healthy volume's conditions are what they always were).
    tokio::time::sleep(Duration::from_secs(4)).await;
    for vol in [&fenced, &off] {
        let (c, _) = volume_condition(&e.client, vol, CONDITION_NODE_FAILOVER).await;
        assert_eq!(
            reason(&c),
            None,
            "{vol}: no NodeFailover while the node lives"
        );
        let (c, _) = fenced_condition(&e.client, vol, &a).await;
        assert_eq!(reason(&c), None, "{vol}: no Fenced while the node lives");
    }

    // Node A dies: no renewal, its agent silent.
    agent.dead.lock().unwrap().push(a.clone());
    a_renews.abort();
    eventually(WAIT, "FailedOver on the opted-in volume", || async {
        let (c, _) = volume_condition(&e.client, &fenced, CONDITION_NODE_FAILOVER).await;
        (reason(&c).as_deref() == Some("FailedOver")).then_some(c)
    })
    .await;
    let (stays, _) = eventually(WAIT, "StaysOnDownNode on the other volume", || async {
        let (c, v) = volume_condition(&e.client, &off, CONDITION_NODE_FAILOVER).await;
        (reason(&c).as_deref() == Some("StaysOnDownNode")).then_some((c, v))
    })
    .await;
    let stays = stays.unwrap();
    assert!(
        stays.message.starts_with(&format!("node {a} ")),
        "{}",
        stays.message
    );
    let (fenced_mp, _) = eventually(WAIT, "Fenced on the MountPod on the dead node", || async {
        let (c, mp) = fenced_condition(&e.client, &off, &a).await;
        (reason(&c).as_deref() == Some("LeaseExpired")).then_some((c, mp))
    })
    .await;
    let fenced_mp = fenced_mp.unwrap();
    assert!(
        fenced_mp.message.contains(&format!("node {a}")),
        "{}",
        fenced_mp.message
    );
    eprintln!(
        "Volume {off}: {} {}: {}\nMountPod on {a}: {} {} since {}: {}",
        stays.type_,
        stays.reason,
        stays.message,
        fenced_mp.type_,
        fenced_mp.reason,
        fenced_mp.last_transition_time.0,
        fenced_mp.message
    );
    // The volume left on the dead node looks as it did: Ready, not Stalled; and GitOps
    // tools read every object as they would without these conditions.
    let (ready, _) = volume_condition(&e.client, &off, "Ready").await;
    assert_eq!(ready.map(|c| c.status).as_deref(), Some("True"));
    let (stalled, _) = volume_condition(&e.client, &off, "Stalled").await;
    assert_eq!(stalled, None);
    same_health_without_the_failover_conditions(&e.id, &off);
    // `kubectl tessera status` shows it under the Volume.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .arg("--kubeconfig")
        .arg(support::kubeconfig_path())
        .args(["--width=0", "status", &format!("volume/{off}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("NodeFailover=True StaysOnDownNode: node {a} ")),
        "{text}"
    );

    // Nothing changes: nothing is written (the other writers carry the conditions
    // over, the failover loop writes only a difference).
    let (_, before_v) = volume_condition(&e.client, &off, CONDITION_NODE_FAILOVER).await;
    let (_, before_mp) = fenced_condition(&e.client, &off, &a).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, after_v) = volume_condition(&e.client, &off, CONDITION_NODE_FAILOVER).await;
    let (_, after_mp) = fenced_condition(&e.client, &off, &a).await;
    assert_eq!(
        after_v.resource_version(),
        before_v.resource_version(),
        "Volume rewritten"
    );
    assert_eq!(
        after_mp.resource_version(),
        before_mp.resource_version(),
        "MountPod rewritten"
    );

    // The opted-in volume attaches on B: its failover is over.
    assert!(tickets(&e.client, &fenced).await.is_empty());
    fixtures::put_ticket(&e.client, &fenced, "manual-b", "manual", &b, json!({})).await;
    fixtures::wait_satisfied(&e.client, &fenced, "manual-b").await;
    eventually(WAIT, "FailedOver cleared once attached on B", || async {
        let (c, v) = volume_condition(&e.client, &fenced, CONDITION_NODE_FAILOVER).await;
        let attached = v.status.map(|s| s.attached_nodes).unwrap_or_default();
        (c.is_none() && attached == vec![b.clone()]).then_some(())
    })
    .await;
    let (c, _) = volume_condition(&e.client, &off, CONDITION_NODE_FAILOVER).await;
    assert_eq!(
        reason(&c).as_deref(),
        Some("StaysOnDownNode"),
        "A is still down"
    );

    // Node A comes back (its agent still silent: the controller clears what it wrote).
    take_back(&leases, &a).await;
    let a_renews = renewing(&leases, &a);
    eventually(
        WAIT,
        "StaysOnDownNode and Fenced cleared once A is back",
        || async {
            let (v, _) = volume_condition(&e.client, &off, CONDITION_NODE_FAILOVER).await;
            let (mp, _) = fenced_condition(&e.client, &off, &a).await;
            (v.is_none() && mp.is_none()).then_some(())
        },
    )
    .await;
    assert_eq!(
        tickets(&e.client, &off).await,
        vec!["manual-a".to_string()],
        "the volume without the opt-in stayed with A"
    );

    a_renews.abort();
    b_renews.abort();
    for n in [&a, &b] {
        let _ = leases
            .delete(&tessera_api::liveness_lease(n), &DeleteParams::default())
            .await;
    }
    agent.dead.lock().unwrap().clear();
    let _ = Api::<VolumeAttachment>::all(e.client.clone())
        .patch(
            &off,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"attachmentTickets": {"manual-a": null}}})),
        )
        .await;
    e.cleanup(&[fenced, off]).await;
}

/// A controller that starts while a node is down has not waited fenceAfter + margin
/// yet: it does not clear what its predecessor said of that node (a node it has not
/// seen renewing is not known to be back), finds the node fenced again after the
/// wait and writes nothing then either, and clears both once the node renews.
#[tokio::test]
async fn a_restarted_controller_keeps_what_was_said_of_a_down_node() {
    let (e, mut ctrl, agent, leases) = setup("failover-restart").await;
    let a = e.nodes[0].clone();
    let a_renews = renewing(&leases, &a);
    let off = e.volume("off", "ReadWriteOnce").await;
    e.attach(&off, "manual-a", "manual", &a).await;
    agent.dead.lock().unwrap().push(a.clone());
    a_renews.abort();
    let said = || async {
        let (v, vol) = volume_condition(&e.client, &off, CONDITION_NODE_FAILOVER).await;
        let (m, mp) = fenced_condition(&e.client, &off, &a).await;
        (v.zip(m), vol, mp)
    };
    let (before, v0, mp0) = eventually(WAIT, "StaysOnDownNode and Fenced", || async {
        let (both, v, mp) = said().await;
        both.map(|b| (b, v, mp))
    })
    .await;
    // No release happened on A: its Lease is not marked, so the new controller counts
    // fenceAfter + margin (3 s) from its own start before A is fenced again.
    ctrl.kill();
    let _ctrl = fixtures::ControllerProcess::alone(&e.id, &[&format!("--fence-margin={MARGIN}")]);
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < until {
        let (both, v, mp) = said().await;
        assert_eq!(
            both.as_ref(),
            Some(&before),
            "cleared or rewritten by the new controller"
        );
        assert_eq!(
            v.resource_version(),
            v0.resource_version(),
            "Volume rewritten"
        );
        assert_eq!(
            mp.resource_version(),
            mp0.resource_version(),
            "MountPod rewritten"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A renews: it is back, the new controller clears both.
    let a_renews = renewing(&leases, &a);
    eventually(WAIT, "cleared once A renews", || async {
        let (v, _) = volume_condition(&e.client, &off, CONDITION_NODE_FAILOVER).await;
        let (m, _) = fenced_condition(&e.client, &off, &a).await;
        (v.is_none() && m.is_none()).then_some(())
    })
    .await;

    a_renews.abort();
    let _ = leases
        .delete(&tessera_api::liveness_lease(&a), &DeleteParams::default())
        .await;
    agent.dead.lock().unwrap().clear();
    e.detach(&off, "manual-a", &a).await;
    e.cleanup(&[off]).await;
}
