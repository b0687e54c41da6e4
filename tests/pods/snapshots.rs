//! Snapshots, restores and clones on real Pods (issue 19), through the real
//! snapshot controller and csi-snapshotter (a cluster add-on in the harness) and the
//! external-provisioner.
//!
//! ```text
//!  Pod writes a known tree (files, a directory, a symlink out of the volume) ─▶ exits
//!  VolumeSnapshot ─(snapshot-controller, csi-snapshotter)─▶ CreateSnapshot
//!     ─▶ snapshot Volume + snapshot ticket on the source + volume-restore ticket
//!     ─▶ MountPod task Populate copies ─▶ readyToUse
//!  PVC dataSource VolumeSnapshot ─▶ CreateVolume from the snapshot ─▶ same checksums
//!  PVC dataSource PersistentVolumeClaim ─▶ CreateVolume from the volume ─▶ same checksums
//!  VolumeSnapshot deleted ─▶ DeleteSnapshot ─▶ snapshot Volume and its data gone
//!
//!  writer appending numbered records ─▶ VolumeSnapshot taken meanwhile ─▶ the
//!  snapshot's records are a gap-free prefix of what the writer wrote
//! ```

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

use super::*;
use crate::support::tree::tree_sums;

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

/// A VolumeSnapshotClass of Tessera (cluster-scoped), deleting its contents.
async fn snapshot_class(client: &Client, name: &str) {
    let ar = resource("VolumeSnapshotClass", "volumesnapshotclasses");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": name}, "driver": "csi.tessera.io", "deletionPolicy": "Delete",
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

fn snapshots(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("VolumeSnapshot", "volumesnapshots"),
    )
}

/// Take a VolumeSnapshot of `claim`; wait until it is ready. Returns the snapshot
/// handle (the snapshot's Tessera Volume).
async fn take_snapshot(client: &Client, ns: &str, name: &str, class: &str, claim: &str) -> String {
    let api = snapshots(client, ns);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {"volumeSnapshotClassName": class, "source": {"persistentVolumeClaimName": claim}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    let content = eventually(WAIT, &format!("VolumeSnapshot {name} ready"), || async {
        let s = api.get(name).await.ok()?;
        let status = s.data.get("status")?;
        (status.get("readyToUse")? == true)
            .then(|| {
                status
                    .get("boundVolumeSnapshotContentName")?
                    .as_str()
                    .map(String::from)
            })
            .flatten()
    })
    .await;
    let contents: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    let c = contents.get(&content).await.unwrap();
    c.data["status"]["snapshotHandle"]
        .as_str()
        .expect("a ready content has a snapshot handle")
        .to_string()
}

/// A claim filled from `source` (`kind` VolumeSnapshot or PersistentVolumeClaim),
/// bound; returns its Tessera Volume.
async fn filled_claim(client: &Client, ns: &str, name: &str, kind: &str, source: &str) -> Volume {
    let group = (kind == "VolumeSnapshot").then_some("snapshot.storage.k8s.io");
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "tessera-shared",
            "resources": {"requests": {"storage": "64Mi"}},
            "dataSource": {"apiGroup": group, "kind": kind, "name": source},
        }
    }))
    .unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &pvc).await.unwrap();
    let pvc = eventually(WAIT, &format!("claim {name} bound"), || async {
        api.get(name)
            .await
            .ok()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
    })
    .await;
    tessera_volume(client, &pvc.spec.unwrap().volume_name.unwrap()).await
}

/// The known tree: nested directories, a 1 MiB file of random bytes, a small one, an
/// empty one, and a symlink that points out of the volume (copied as a link).
const TREE: &str = "mkdir -p /data/a/b/c && echo hello > /data/a/b/c/f.txt && \
    dd if=/dev/urandom of=/data/a/big bs=1024 count=1024 2>/dev/null && : > /data/empty && \
    ln -s /etc/passwd /data/a/out && sync";

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_snapshot_restores_and_a_clone_copies_a_known_tree() {
    let client = support::client().await;
    let c = claimed(&client, "snap", "src", "ReadWriteOnce").await;
    let node = c.nodes.names()[0].clone();
    pod(&client, &c.ns, "writer", &node, "src", TREE).await;
    wait_phase(&client, &c.ns, "writer", "Succeeded").await;
    let want = tree_sums(&c.data);
    for k in [
        "a",
        "a/b",
        "a/b/c",
        "a/b/c/f.txt",
        "a/big",
        "a/out",
        "empty",
    ] {
        assert!(want.contains_key(k), "{k} missing: {want:#?}");
    }
    assert_eq!(want["a/out"], "-> /etc/passwd");

    let class = support::unique_name("tessera-snap");
    snapshot_class(&client, &class).await;
    let handle = take_snapshot(&client, &c.ns, "snap-1", &class, "src").await;
    let snap: Volume = Api::all(client.clone()).get(&handle).await.unwrap();
    let snap_dir = backend_dir(&c.nodes, &snap);
    assert_eq!(tree_sums(&snap_dir), want, "the snapshot's data");
    // The tickets are gone once the copy is done.
    let tva: Api<tessera_api::VolumeAttachment> = Api::all(client.clone());
    let left = tva
        .get(&c.volume.name_any())
        .await
        .unwrap()
        .spec
        .attachment_tickets;
    assert!(left.keys().all(|k| !k.starts_with("snapshot-")), "{left:?}");

    let restored = filled_claim(&client, &c.ns, "restored", "VolumeSnapshot", "snap-1").await;
    assert_eq!(
        tree_sums(&backend_dir(&c.nodes, &restored)),
        want,
        "restored"
    );
    // Read through the restored claim's mount by a Pod on another node.
    let other = c.nodes.names().last().unwrap().clone();
    pod(
        &client,
        &c.ns,
        "reader",
        &other,
        "restored",
        "test \"$(cat /data/a/b/c/f.txt)\" = hello && test -L /data/a/out",
    )
    .await;
    wait_phase(&client, &c.ns, "reader", "Succeeded").await;

    let cloned = filled_claim(&client, &c.ns, "cloned", "PersistentVolumeClaim", "src").await;
    assert_eq!(tree_sums(&backend_dir(&c.nodes, &cloned)), want, "cloned");
    let left = tva
        .get(&c.volume.name_any())
        .await
        .unwrap()
        .spec
        .attachment_tickets;
    assert!(left.keys().all(|k| !k.starts_with("clone-")), "{left:?}");

    // Deleting the snapshot removes its data.
    snapshots(&client, &c.ns)
        .delete("snap-1", &DeleteParams::default())
        .await
        .unwrap();
    let volumes: Api<Volume> = Api::all(client.clone());
    eventually(WAIT, "the snapshot's Volume and data gone", || async {
        let gone = volumes.get_opt(&handle).await.ok().flatten().is_none();
        (gone && !snap_dir.exists()).then_some(())
    })
    .await;

    delete_pod(&client, &c.ns, "writer").await;
    delete_pod(&client, &c.ns, "reader").await;
    for (claim, v) in [("restored", &restored), ("cloned", &cloned)] {
        let pv = v.name_any();
        let data = backend_dir(&c.nodes, v);
        let pvc: PersistentVolumeClaim = Api::namespaced(client.clone(), &c.ns)
            .get(claim)
            .await
            .unwrap();
        let pv_name = pvc.spec.unwrap().volume_name.unwrap();
        delete_claim(&client, &c.ns, claim, &pv_name, &pv, &data).await;
    }
    delete_claim(&client, &c.ns, "src", &c.pv, &c.volume.name_any(), &c.data).await;
    let ar = resource("VolumeSnapshotClass", "volumesnapshotclasses");
    let _ = Api::<DynamicObject>::all_with(client.clone(), &ar)
        .delete(&class, &DeleteParams::default())
        .await;
}

/// Records `"<i> <t>"`, one a line: all complete lines numbered 0, 1, … in order.
fn gap_free(text: &str) -> usize {
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    for (i, line) in complete.lines().enumerate() {
        let n: usize = line
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("record {i} is not numbered: {line:?}"));
        assert_eq!(n, i, "record {i} is numbered {n}: a gap or a reorder");
    }
    complete.lines().count()
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_snapshot_of_a_volume_being_written_holds_a_gap_free_prefix() {
    let client = support::client().await;
    let c = claimed(&client, "snapw", "live", "ReadWriteOnce").await;
    let node = c.nodes.names()[0].clone();
    super::writer::start(&client, &c.ns, "app", &node, "live").await;
    let before = super::writer::wait_records(&c.data, 20).await;

    let class = support::unique_name("tessera-snap");
    snapshot_class(&client, &class).await;
    let handle = take_snapshot(&client, &c.ns, "during", &class, "live").await;
    // The writer went on during the copy and was never disturbed.
    super::writer::wait_records(&c.data, 5).await;
    super::writer::assert_undisturbed(&client, &c.ns, "app").await;

    let snap: Volume = Api::all(client.clone()).get(&handle).await.unwrap();
    let text =
        std::fs::read_to_string(backend_dir(&c.nodes, &snap).join(super::writer::RECORDS)).unwrap();
    let n = gap_free(&text);
    assert!(
        n >= before,
        "the snapshot holds {n} records, fewer than the {before} written before it"
    );
    let now = std::fs::read_to_string(c.data.join(super::writer::RECORDS)).unwrap();
    assert!(
        now.starts_with(&text[..text.rfind('\n').map_or(0, |i| i + 1)]),
        "the snapshot is a prefix of the live records"
    );
    println!("snapshot under a writer: {before} records before it, {n} in it");

    std::fs::write(c.data.join(super::writer::STOP), b"").unwrap();
    wait_phase(&client, &c.ns, "app", "Succeeded").await;
    snapshots(&client, &c.ns)
        .delete("during", &DeleteParams::default())
        .await
        .unwrap();
    let volumes: Api<Volume> = Api::all(client.clone());
    eventually(WAIT, "the snapshot's Volume gone", || async {
        volumes
            .get_opt(&handle)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
    delete_pod(&client, &c.ns, "app").await;
    delete_claim(&client, &c.ns, "live", &c.pv, &c.volume.name_any(), &c.data).await;
    let ar = resource("VolumeSnapshotClass", "volumesnapshotclasses");
    let _ = Api::<DynamicObject>::all_with(client.clone(), &ar)
        .delete(&class, &DeleteParams::default())
        .await;
}
