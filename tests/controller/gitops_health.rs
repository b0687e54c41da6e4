//! GitOps health of real objects (issue 32): the controller drives Volumes and their
//! VolumeAttachments into each state — attached, waiting (held by another node, a
//! mount still starting), Faulted, deleting — and the tools read them as they would in
//! a cluster: kstatus (Flux, cli-utils) by cli-utils' own `status.Compute` (the harness
//! binary `kstatus`), Argo CD by the shipped health script (config/argocd/health.lua)
//! in an embedded Lua. The objects are what `kubectl get -o json` prints; the test
//! leaves them in target/gitops-health/objects.json.

use std::time::Duration;

use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};

use tessera_api::{Volume, VolumeState};

use crate::support;
use support::env::Env;
use support::fixtures::{self, ControllerProcess, FakeAgent, TEST_LABEL, eventually};

const WAIT: Duration = Duration::from_secs(30);

/// Wait until the Volume `name` is in `state` (and, for Deleting, being deleted).
async fn volume_in(e: &Env, name: &str, state: VolumeState) {
    let volumes: Api<Volume> = Api::all(e.client.clone());
    eventually(WAIT, &format!("Volume {name} {state:?}"), || async {
        let v = volumes.get(name).await.ok()?;
        (v.status?.state == Some(state)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn kstatus_and_argocd_read_each_state_of_real_objects() {
    // n0 mounts, n1's mounts fail, n2's never answer (still starting).
    let e = Env::new("health", 3, WAIT).await;
    let _nodes = fixtures::NodesGuard(e.nodes.clone());
    fixtures::create_csinodes(&e.client, &e.id, &e.nodes).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let agent = FakeAgent::start(e.client.clone(), &e.id);
    agent.failing.lock().unwrap().push(e.nodes[1].clone());
    agent.silent.lock().unwrap().push(e.nodes[2].clone());
    let (n0, n1, n2) = (&e.nodes[0], &e.nodes[1], &e.nodes[2]);

    let attached = e.volume("attached", "ReadWriteOnce").await;
    e.attach(&attached, "manual-a", "manual", n0).await;
    volume_in(&e, &attached, VolumeState::Attached).await;

    // A second node's ticket waits for the holder.
    let held = e.volume("held", "ReadWriteOnce").await;
    e.attach(&held, "manual-a", "manual", n0).await;
    fixtures::put_ticket(&e.client, &held, "manual-b", "manual", n2, json!({})).await;
    e.blocked(&held, "manual-b", "HeldByOtherNode").await;

    let starting = e.volume("starting", "ReadWriteOnce").await;
    fixtures::put_ticket(&e.client, &starting, "manual-a", "manual", n2, json!({})).await;
    e.blocked(&starting, "manual-a", "Attaching").await;
    volume_in(&e, &starting, VolumeState::Attaching).await;

    let faulted = e.volume("faulted", "ReadWriteOnce").await;
    fixtures::put_ticket(&e.client, &faulted, "manual-a", "manual", n1, json!({})).await;
    e.blocked(&faulted, "manual-a", "MountFailed").await;
    volume_in(&e, &faulted, VolumeState::Faulted).await;

    // Deleted while its data is still being removed.
    let deleting = e.volume("deleting", "ReadWriteOnce").await;
    e.attach(&deleting, "manual-a", "manual", n0).await;
    e.detach(&deleting, "manual-a", n0).await;
    agent
        .hold_remove_data
        .store(true, std::sync::atomic::Ordering::SeqCst);
    Api::<Volume>::all(e.client.clone())
        .delete(&deleting, &DeleteParams::default())
        .await
        .unwrap();
    volume_in(&e, &deleting, VolumeState::Deleting).await;

    // What a person (or a GitOps tool) reads.
    let selector = format!("{TEST_LABEL}={}", e.id);
    let list: Value = serde_json::from_str(&support::kubectl_output(&[
        "get",
        "volumes.tessera.io,volumeattachments.tessera.io",
        "-l",
        &selector,
        "-o",
        "json",
    ]))
    .unwrap();
    let dir = support::repo_root().join("target/gitops-health");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("objects.json"),
        serde_json::to_string_pretty(&list).unwrap(),
    )
    .unwrap();
    let items = list["items"].as_array().expect("a List").clone();
    let kstatus = support::health::kstatus(&items);
    let script = support::health::argocd_script();

    // (volume, kind): kstatus, Argo CD.
    let want = [
        (&attached, "Volume", "Current", "Healthy"),
        (&attached, "VolumeAttachment", "Current", "Healthy"),
        (&held, "Volume", "Current", "Healthy"),
        (&held, "VolumeAttachment", "InProgress", "Progressing"),
        (&starting, "Volume", "InProgress", "Progressing"),
        (&starting, "VolumeAttachment", "InProgress", "Progressing"),
        (&faulted, "Volume", "Failed", "Degraded"),
        (&faulted, "VolumeAttachment", "Failed", "Degraded"),
        (&deleting, "Volume", "Terminating", "Progressing"),
        (&deleting, "VolumeAttachment", "InProgress", "Progressing"),
    ];
    let mut wrong = Vec::new();
    for (name, kind, want_kstatus, want_argocd) in want {
        let key = format!("{kind}/{name}");
        let obj = items
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{key} not listed"));
        let got_kstatus = kstatus.get(&key).map(String::as_str).unwrap_or("missing");
        let (got_argocd, message) = support::health::argocd_health(&script, obj);
        println!("{key}: kstatus {got_kstatus}, Argo CD {got_argocd} ({message})");
        if (got_kstatus, got_argocd.as_str()) != (want_kstatus, want_argocd) {
            wrong.push(format!(
                "{key}: kstatus {got_kstatus} (want {want_kstatus}), Argo CD {got_argocd} (want {want_argocd}); conditions {}",
                obj["status"]["conditions"]
            ));
        }
    }
    agent
        .hold_remove_data
        .store(false, std::sync::atomic::Ordering::SeqCst);
    e.cleanup(&[attached, held, starting, faulted]).await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
