//! Live modify through a VolumeAttributesClass (issue 19, item 2): a bound claim moved
//! from a class with `attrCacheSeconds: "0"` to one with `"60"` changes what the
//! running mount does, with no remount: before, a change made behind the mount (in
//! the backend directory) is seen through it at once; after, the kernel keeps serving
//! the attributes it cached. A class that changes `backendRoot` is refused
//! (INVALID_ARGUMENT: the claim's modify status says Infeasible, and the Event says
//! why), and the Volume keeps its root.
//!
//! The checks read through the node's mount from the test process (reached through
//! the kubelet's mount namespace, `/proc/<kubelet>/root`), the same FUSE mount the
//! application Pod has bound.

use std::os::unix::fs::MetadataExt;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use kube::api::{Patch, PatchParams};

use tessera_api::{self as api, MountPod};

use super::*;

/// Create the VolumeAttributesClass `name` with `params` (kubectl: the test's
/// k8s-openapi may predate the GA type).
fn vac(name: &str, params: serde_json::Value) {
    let doc = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttributesClass",
        "metadata": {"name": name},
        "driverName": api::CSI_DRIVER_NAME,
        "parameters": params,
    });
    kubectl_stdin(&["apply", "-f", "-"], &doc.to_string());
}

/// The claim's status, as JSON.
async fn claim_status(claims: &Api<PersistentVolumeClaim>, name: &str) -> serde_json::Value {
    let c = claims.get(name).await.unwrap();
    serde_json::to_value(c).unwrap()["status"].clone()
}

/// The size the mount reports for `path` (a stat through it).
fn size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().size()
}

/// Append `n` bytes to `path` behind the mount (in the backend directory).
fn grow_behind(path: &Path, n: usize) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(&vec![b'x'; n]).unwrap();
    f.sync_all().unwrap();
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_volume_attributes_class_change_reaches_the_running_mount() {
    let client = support::client().await;
    let nodes = Nodes::load();
    let node = nodes.names()[0].clone();
    let ns = namespace(&client, "pods-modify").await;
    let id = support::unique_name("vac");
    let (fresh, cached, moved) = (
        format!("{id}-fresh"),
        format!("{id}-cached"),
        format!("{id}-moved"),
    );
    vac(&fresh, json!({"attrCacheSeconds": "0"}));
    vac(&cached, json!({"attrCacheSeconds": "60"}));
    vac(&moved, json!({"backendRoot": "/mnt/shared/elsewhere"}));
    let ClassClaim { class, pv, volume } = class_claim(
        &client,
        &ns,
        "tessera-modify",
        json!({}),
        "data",
        Some(fresh.as_str()),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let vol = volume.name_any();
    assert_eq!(
        volume.spec.attr_cache_seconds,
        Some(0),
        "the class at creation"
    );
    let data = backend_dir(&nodes, &volume);
    pod(
        &client,
        &ns,
        "app",
        &node,
        "data",
        "echo > /data/f; sleep 3600",
    )
    .await;
    wait_phase(&client, &ns, "app", "Running").await;
    let mp_name = api::mountpod_name(&vol, &node);
    let mps: Api<MountPod> = Api::all(client.clone());
    let mp = eventually(WAIT, "the MountPod ready", || async {
        let mp = mps.get(&mp_name).await.ok()?;
        mp.is_ready().then_some(mp)
    })
    .await;
    let status = mp.status.clone().unwrap();
    let pid = status.pid;
    let mountpoint = status.mount_point.clone().unwrap();
    let through = PathBuf::from(format!("/proc/{}/root", nodes.kubelet_pid(&node)))
        .join(mountpoint.trim_start_matches('/'))
        .join("f");
    let behind = data.join("f");
    eventually(WAIT, "the app's file", || async {
        behind.exists().then_some(())
    })
    .await;

    // attrCacheSeconds 0: a change behind the mount is seen through it at once.
    let s0 = size(&through);
    grow_behind(&behind, 10);
    let s1 = size(&through);
    assert_eq!(
        s1,
        s0 + 10,
        "with no attribute cache the mount sees the change"
    );

    // The claim moves to the class with a 60 s cache: applied live.
    let patch = json!({"spec": {"volumeAttributesClassName": cached}});
    claims
        .patch("data", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(WAIT, "the claim's current class", || async {
        let st = claim_status(&claims, "data").await;
        (st["currentVolumeAttributesClassName"] == json!(cached)).then_some(())
    })
    .await;
    let mp = eventually(WAIT, "the mount applying 60 s", || async {
        let mp = mps.get(&mp_name).await.ok()?;
        let applied = mp.status.as_ref()?.applied.as_ref()?.attr_cache_seconds;
        (applied == Some(60) && mp.is_ready()).then_some(mp)
    })
    .await;
    assert_eq!(
        mp.status.as_ref().unwrap().pid,
        pid,
        "the same daemon: no remount"
    );
    let s2 = size(&through); // cached from here on, for 60 s
    grow_behind(&behind, 10);
    let s3 = size(&through);
    assert_eq!(
        s3, s2,
        "with a 60 s attribute cache the mount keeps the size it cached"
    );
    assert_eq!(std::fs::metadata(&behind).unwrap().size(), s2 + 10);

    // A class that would move the data is refused, readably; nothing changes.
    let patch = json!({"spec": {"volumeAttributesClassName": moved}});
    claims
        .patch("data", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(WAIT, "the modify refused as Infeasible", || async {
        let st = claim_status(&claims, "data").await;
        (st["modifyVolumeStatus"]["status"] == json!("Infeasible")).then_some(())
    })
    .await;
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), &ns);
    let said = eventually(WAIT, "an Event saying why", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .filter_map(|e| e.message)
            .find(|m| m.contains("backendRoot") && m.contains("immutable"))
    })
    .await;
    let volume = tessera_volume(&client, &pv).await;
    assert_eq!(volume.spec.backend.root, "/mnt/shared/tessera");
    assert_eq!(volume.spec.attr_cache_seconds, Some(60));

    delete_pod(&client, &ns, "app").await;
    delete_claim(&client, &ns, "data", &pv, &vol, &data).await;
    delete_class(&client, &class).await;
    // Not waited for: the harness's kube-controller-manager leaves the
    // kubernetes.io/vac-protection finalizer on a class no claim uses any more.
    for v in [&fresh, &cached, &moved] {
        let _ = support::kubectl()
            .args(["delete", "volumeattributesclass", v, "--wait=false"])
            .output();
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES live modify: attrCacheSeconds 0 → 60 on a running mount (pid {pid:?} kept): \
         sizes through the mount {s0}→{s1} (seen at once), then {s2}→{s3} (cached); refused: {said}"
    );
}
