//! Fenced failover speaks for Tessera's own volumes to the attach-detach controller
//! (docs/failover.md, issue 46 item 1), against the real API server: once node A is
//! fenced and not Ready, and its opted-in volume's ticket released, the controller
//! removes exactly that volume's `kubernetes.io/csi/csi.tessera.io^<handle>` entry from
//! A's `status.volumesInUse`: not another driver's entry, not the entry of a volume
//! that stays, not a live node's; once, and nothing after; and a kubelet that comes
//! back and reports the volume again is not fought.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use tessera_controller::failover::in_use::entry;

use crate::failover::{WAIT, renew, renewing, setup, tickets};
use crate::support;
use support::fixtures::{self, eventually};

/// What the test's log line of a removal says.
const REMOVED: &str = "removed from its volumesInUse";

/// Set `node`'s `volumesInUse` and its Ready condition as its kubelet would.
pub(super) async fn report(nodes: &Api<Node>, node: &str, in_use: &[String], ready: &str) {
    let now = jiff::Timestamp::now().round(jiff::Unit::Second).unwrap();
    let status = json!({"status": {
        "volumesInUse": in_use,
        "conditions": [{"type": "Ready", "status": ready, "reason": "Test",
                        "lastHeartbeatTime": now.to_string(), "lastTransitionTime": now.to_string()}],
    }});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

pub(super) async fn in_use(nodes: &Api<Node>, node: &str) -> Vec<String> {
    let n = nodes.get(node).await.unwrap();
    n.status.and_then(|s| s.volumes_in_use).unwrap_or_default()
}

#[tokio::test]
async fn a_fenced_not_ready_nodes_released_volumes_leave_its_volumes_in_use() {
    let (e, ctrl, agent, leases) = setup("failover-iu").await;
    let (a, b) = (e.nodes[0].clone(), e.nodes[1].clone());
    let nodes: Api<Node> = Api::all(e.client.clone());
    renew(&leases, &a).await;
    renew(&leases, &b).await;
    let renews_a = renewing(&leases, &a);
    let renews_b = renewing(&leases, &b);

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
    // A's kubelet listed both volumes in use, beside another driver's volume of the
    // same handle and a Tessera handle of no Volume of this controller's; B lists the
    // opted-in volume too.
    let foreign = format!("kubernetes.io/csi/other.example.com^{fenced}");
    let unknown = entry(&format!("{}-none", e.id));
    let listed_a = vec![
        foreign.clone(),
        entry(&fenced),
        entry(&off),
        unknown.clone(),
    ];
    report(&nodes, &a, &listed_a, "True").await;
    report(&nodes, &b, &[entry(&fenced)], "True").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(in_use(&nodes, &a).await, listed_a, "a live node: untouched");

    // A dies: its Lease is renewed no more, its kubelet stopped reporting (not Ready).
    renews_a.abort();
    agent.dead.lock().unwrap().push(a.clone());
    report(&nodes, &a, &listed_a, "Unknown").await;
    let before = nodes.get(&a).await.unwrap();
    eventually(WAIT, "the dead node's ticket released", || async {
        tickets(&e.client, &fenced).await.is_empty().then_some(())
    })
    .await;
    let released = Instant::now();
    let want = vec![foreign.clone(), entry(&off), unknown.clone()];
    eventually(
        WAIT,
        "the released volume out of A's volumesInUse",
        || async { (in_use(&nodes, &a).await == want).then_some(()) },
    )
    .await;
    eprintln!(
        "volumesInUse entry removed {:?} after the ticket was seen released",
        released.elapsed()
    );
    let after = nodes.get(&a).await.unwrap();
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert_eq!(after.metadata.annotations, before.metadata.annotations);
    let status = |n: &Node| n.status.clone().unwrap_or_default();
    assert_eq!(status(&after).conditions, status(&before).conditions);
    assert_eq!(
        status(&after).volumes_attached,
        status(&before).volumes_attached
    );
    assert_eq!(in_use(&nodes, &b).await, vec![entry(&fenced)], "B is alive");
    assert_eq!(
        tickets(&e.client, &off).await,
        vec!["manual-a".to_string()],
        "without the opt-in the volume stays with the dead node, and in its list"
    );

    // Calm: written once, nothing after.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(in_use(&nodes, &a).await, want);
    let log = std::fs::read_to_string(&ctrl.log).unwrap();
    assert_eq!(log.matches(REMOVED).count(), 1, "one write:\n{log}");

    // The kubelet comes back (Ready) and reports the volume in use again (say its
    // Pod's mount was still there): its truth stands, nothing fights it.
    report(&nodes, &a, &listed_a, "True").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(in_use(&nodes, &a).await, listed_a, "the kubelet's truth");
    let log = std::fs::read_to_string(&ctrl.log).unwrap();
    assert_eq!(log.matches(REMOVED).count(), 1, "no write after:\n{log}");

    renews_b.abort();
    for n in [&a, &b] {
        let _ = leases
            .delete(&tessera_api::liveness_lease(n), &DeleteParams::default())
            .await;
    }
    let _ = Api::<tessera_api::VolumeAttachment>::all(e.client.clone())
        .patch(
            &off,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"attachmentTickets": {"manual-a": null}}})),
        )
        .await;
    e.cleanup(&[fenced, off]).await;
}

/// Under the `node.kubernetes.io/out-of-service` taint every ticket of the node goes
/// at once, Ready or not, Lease fresh or not: so does every Tessera entry of its
/// `volumesInUse`, and only those.
#[tokio::test]
async fn the_out_of_service_taint_takes_tesseras_entries_out_at_once() {
    let (e, _ctrl, _agent, leases) = setup("failover-iu-oos").await;
    let a = e.nodes[0].clone();
    let nodes: Api<Node> = Api::all(e.client.clone());
    let renews_a = renewing(&leases, &a);
    let off = e.volume("off", "ReadWriteOnce").await;
    e.attach(&off, "manual-a", "manual", &a).await;
    let foreign = format!("kubernetes.io/csi/other.example.com^{off}");
    report(&nodes, &a, &[entry(&off), foreign.clone()], "True").await;
    nodes
        .patch(
            &a,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
                "value": "nodeshutdown", "effect": "NoExecute"}]}}),
            ),
        )
        .await
        .unwrap();
    let tainted = Instant::now();
    eventually(WAIT, "the taint's entry out of volumesInUse", || async {
        (in_use(&nodes, &a).await == vec![foreign.clone()]).then_some(())
    })
    .await;
    eprintln!(
        "out-of-service: entry removed {:?} after the taint",
        tainted.elapsed()
    );
    assert!(tickets(&e.client, &off).await.is_empty());
    renews_a.abort();
    let _ = leases
        .delete(&tessera_api::liveness_lease(&a), &DeleteParams::default())
        .await;
    e.cleanup(&[off]).await;
}
