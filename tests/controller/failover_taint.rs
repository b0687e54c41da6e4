//! The opt-in fence taint (`--fence-taint`, docs/failover.md, issue 46 item 3)
//! against the real API server: two nodes holding opted-in volumes stop renewing their
//! liveness Leases while their kubelets still report them Ready. With a share that
//! lets one node carry the taint, the first (by name) gets
//! `tessera.io/fenced:NoSchedule` at its fence time and its volume is released and
//! taken out of its `volumesInUse` though the Node is Ready; the second is held, its
//! ticket stays. When the first node's agent takes its Lease back, its taint goes, and
//! the second gets it and is released in turn.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use tessera_controller::failover::in_use::entry;
use tessera_controller::failover::taint::FENCE_TAINT;

use crate::failover::{MARGIN, WAIT, renew, renewing, take_back, tickets};
use crate::failover_in_use::{in_use, report};
use crate::support;
use support::env::Env;
use support::fixtures::{self, ControllerProcess, FakeAgent, eventually};

/// Whether `node` carries the fence taint (and only as NoSchedule).
async fn tainted(nodes: &Api<Node>, node: &str) -> bool {
    let n = nodes.get(node).await.unwrap();
    let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    let ours: Vec<_> = taints.iter().filter(|t| t.key == FENCE_TAINT).collect();
    assert!(ours.iter().all(|t| t.effect == "NoSchedule"), "{ours:?}");
    !ours.is_empty()
}

/// The node's kubelet keeps reporting Ready (heartbeats only, never volumesInUse).
fn heartbeats(nodes: &Api<Node>, node: &str) -> tokio::task::JoinHandle<()> {
    let (nodes, node) = (nodes.clone(), node.to_owned());
    tokio::spawn(async move {
        loop {
            let now = jiff::Timestamp::now().round(jiff::Unit::Second).unwrap();
            let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                "reason": "KubeletReady", "lastHeartbeatTime": now.to_string(),
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
            let _ = nodes
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(status))
                .await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    })
}

#[tokio::test]
async fn the_fence_taint_releases_a_ready_node_at_its_fence_time_within_its_share() {
    let e = Env::new("failover-taint", 3, WAIT).await;
    // A share of 0 %: at least one node of two or more, so one at a time.
    let _ctrl = ControllerProcess::alone(
        &e.id,
        &[
            &format!("--fence-margin={MARGIN}"),
            "--fence-taint",
            "--fence-taint-max-percent=0",
        ],
    );
    let agent = FakeAgent::start(e.client.clone(), &e.id);
    fixtures::create_csinodes(&e.client, &e.id, &e.nodes).await;
    let leases: Api<Lease> = Api::namespaced(e.client.clone(), "default");
    let nodes: Api<Node> = Api::all(e.client.clone());
    let (a, b, c) = (e.nodes[0].clone(), e.nodes[1].clone(), e.nodes[2].clone());
    let mut renews = vec![];
    for n in [&a, &b, &c] {
        renew(&leases, n).await;
        renews.push(renewing(&leases, n));
    }
    let mut vols = vec![];
    for n in [&a, &b] {
        let name = e.volume_name(&format!("v{}", vols.len()));
        let mut v = fixtures::volume(&name, &e.id, "ReadWriteOnce");
        v.spec.node_failover = Some(tessera_api::NodeFailover::Fenced);
        e.create_volume(&v).await;
        fixtures::put_ticket(&e.client, &name, "manual", "manual", n, json!({})).await;
        fixtures::wait_satisfied(&e.client, &name, "manual").await;
        report(&nodes, n, &[entry(&name)], "True").await;
        vols.push(name);
    }
    let beats = [heartbeats(&nodes, &a), heartbeats(&nodes, &b)];
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!tainted(&nodes, &a).await && !tainted(&nodes, &b).await);

    // A and B stop renewing; their kubelets still report them Ready.
    renews[0].abort();
    renews[1].abort();
    agent.dead.lock().unwrap().extend([a.clone(), b.clone()]);
    let died = Instant::now();
    eventually(WAIT, "A's ticket released while A is Ready", || async {
        tickets(&e.client, &vols[0]).await.is_empty().then_some(())
    })
    .await;
    eprintln!(
        "fence taint: A released {:?} after its last renewal, Ready",
        died.elapsed()
    );
    assert!(tainted(&nodes, &a).await, "A carries the fence taint");
    eventually(WAIT, "A's volume out of its volumesInUse", || async {
        in_use(&nodes, &a).await.is_empty().then_some(())
    })
    .await;
    // The share holds B: untainted, its ticket and its entry where they were.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!tainted(&nodes, &b).await, "B held by the share");
    assert_eq!(
        tickets(&e.client, &vols[1]).await,
        vec!["manual".to_string()]
    );
    assert_eq!(in_use(&nodes, &b).await, vec![entry(&vols[1])]);
    assert!(!tainted(&nodes, &c).await, "C is alive");

    // A's agent comes back: its taint goes, which makes room for B.
    take_back(&leases, &a).await;
    renews[0] = renewing(&leases, &a);
    eventually(WAIT, "A's fence taint removed", || async {
        (!tainted(&nodes, &a).await).then_some(())
    })
    .await;
    eventually(WAIT, "B's ticket released once A made room", || async {
        tickets(&e.client, &vols[1]).await.is_empty().then_some(())
    })
    .await;
    assert!(tainted(&nodes, &b).await, "B carries the fence taint now");

    for h in renews.iter().chain(beats.iter()) {
        h.abort();
    }
    for n in [&a, &b, &c] {
        let _ = leases
            .delete(&tessera_api::liveness_lease(n), &DeleteParams::default())
            .await;
    }
    e.cleanup(&vols).await;
}
