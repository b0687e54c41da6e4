//! GitOps health of MountPods and Volumes served by a real node agent (root and
//! /dev/fuse): a mount that answers, one that failed (its backend directory missing on
//! the node) and a Volume whose backend root the administrator did not allow, read by
//! kstatus (cli-utils' `status.Compute`, the harness binary `kstatus`) and by the
//! shipped Argo CD health script, as `kubectl get -o json` prints them. The
//! controller's side in every state: tests/controller/gitops_health.rs.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support;
use support::env::AgentEnv;
use support::fixtures::{self, AgentProcess, TEST_LABEL, eventually};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn kstatus_and_argocd_read_real_mounts() {
    let e = AgentEnv::new("nhealth", 1, WAIT).await;
    let _nodes = fixtures::NodesGuard(e.nodes.clone());
    let agent = AgentProcess::start(&e.id, &e.nodes[0]);
    let node = agent.node.clone();

    let ok = e.volume_name("ok");
    let v = fixtures::volume_at(&ok, &e.id, "ReadWriteOnce", e.backend.path(), false);
    e.create_volume(&v).await;
    e.attach(&ok, "manual-a", "manual", &node).await;
    e.ready_mountpod(&ok, &node, "Ready", |_| true).await;

    // The backend directory does not exist on the node: the mount fails.
    let broken = e.volume_name("broken");
    let missing = e.backend.path().join("missing");
    let v = fixtures::volume_at(&broken, &e.id, "ReadWriteOnce", &missing, false);
    e.create_volume(&v).await;
    fixtures::put_ticket(&e.client, &broken, "manual-a", "manual", &node, json!({})).await;
    e.blocked(&broken, "manual-a", "MountFailed").await;

    // A root outside the allow-list: refused by the controller.
    let refused = e.volume_name("etc");
    let v = fixtures::volume_at(&refused, &e.id, "ReadWriteOnce", Path::new("/etc"), false);
    kube::Api::<tessera_api::Volume>::all(e.client.clone())
        .create(&Default::default(), &v)
        .await
        .unwrap();

    let selector = format!("{TEST_LABEL}={}", e.id);
    let want = [
        ("Volume", ok.clone(), "Current", "Healthy"),
        (
            "MountPod",
            tessera_api::mountpod_name(&ok, &node),
            "Current",
            "Healthy",
        ),
        ("Volume", broken.clone(), "Failed", "Degraded"),
        (
            "MountPod",
            tessera_api::mountpod_name(&broken, &node),
            "Failed",
            "Degraded",
        ),
        ("Volume", refused.clone(), "Failed", "Degraded"),
    ];
    let script = support::health::argocd_script();
    // The refusal and the failed mount's Volume status are written a moment later:
    // read until every object is listed in a settled state, then judge.
    let items = eventually(WAIT, "every object listed with a status", || async {
        let list: Value = serde_json::from_str(&support::kubectl_output(&[
            "get",
            "volumes.tessera.io,mountpods.tessera.io",
            "-l",
            &selector,
            "-o",
            "json",
        ]))
        .unwrap();
        let items = list["items"].as_array()?.clone();
        want.iter()
            .all(|(kind, name, _, _)| {
                items.iter().any(|o| {
                    o["kind"] == *kind
                        && o["metadata"]["name"] == name.as_str()
                        && o["status"]["state"] != "Attaching"
                        && o["status"]["observedGeneration"].is_i64()
                })
            })
            .then_some(items)
    })
    .await;
    let dir = support::repo_root().join("target/gitops-health");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("mounts.json"),
        serde_json::to_string_pretty(&items).unwrap(),
    )
    .unwrap();
    let kstatus = support::health::kstatus(&items);
    let mut wrong = Vec::new();
    for (kind, name, want_kstatus, want_argocd) in &want {
        let key = format!("{kind}/{name}");
        let obj = items
            .iter()
            .find(|o| o["kind"] == *kind && o["metadata"]["name"] == name.as_str())
            .unwrap();
        let got_kstatus = kstatus.get(&key).map(String::as_str).unwrap_or("missing");
        let (got_argocd, message) = support::health::argocd_health(&script, obj);
        println!("{key}: kstatus {got_kstatus}, Argo CD {got_argocd} ({message})");
        if (got_kstatus, got_argocd.as_str()) != (*want_kstatus, *want_argocd) {
            wrong.push(format!(
                "{key}: kstatus {got_kstatus} (want {want_kstatus}), Argo CD {got_argocd} (want {want_argocd}); status {}",
                obj["status"]
            ));
        }
    }
    // Deleted while their tickets still name the node: that is where their data is
    // removed (a Volume never attached has no node of its own to clean up on).
    fixtures::delete_volumes(&e.client, &[ok.clone(), broken.clone(), refused.clone()]).await;
    for name in [&ok, &broken] {
        fixtures::remove_ticket(&e.client, name, "manual-a").await;
    }
    e.cleanup_waiting(&[ok, broken, refused]).await;
    drop(agent);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
