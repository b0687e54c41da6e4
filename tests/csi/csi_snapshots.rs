//! Snapshots, restores and clones at the CSI socket of the running `tessera
//! controller` (issue 19): the cases the sidecars cannot produce. A snapshot of a
//! volume that does not exist is NOT_FOUND; a restore or clone into less than its
//! source is OUT_OF_RANGE; a restore from a snapshot that does not exist is NOT_FOUND;
//! in each case nothing is created. A volume never attached has no data: its
//! snapshot is ready at once, and so is a clone of it. (The copies themselves, on real
//! nodes through the real sidecars: tests/pods/snapshots.rs.)

use std::time::Duration;

use kube::Api;
use tonic::Code;

use tessera_api::Volume;
use tessera_csi_proto::*;

use crate::support;
use support::csi::{clone_of, create, delete_volumes, made, restore_of, snapshot};
use support::env::CsiEnv;

#[tokio::test]
async fn snapshot_and_clone_requests_get_the_right_codes_and_create_nothing_on_error() {
    let env = CsiEnv::builder("csisnap", 0, Duration::from_secs(30))
        .default_backend_root()
        .start()
        .await;
    let (client, id, mut ctrl) = (&env.client, &env.id, env.csi());
    let volumes: Api<Volume> = Api::all(client.clone());
    let exists = |name: String| {
        let volumes = volumes.clone();
        async move { volumes.get_opt(&name).await.unwrap().is_some() }
    };
    const M: i64 = 1 << 20;

    // A snapshot of a volume that does not exist: NOT_FOUND, no snapshot Volume.
    let snap_name = format!("{id}-snap-missing");
    let req = snapshot(&format!("{id}-nope"), &snap_name);
    let err = ctrl.create_snapshot(req).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("not found"), "{}", err.message());
    assert!(!exists(snap_name).await);

    // A source volume, never attached (no data).
    let src = made(&mut ctrl, create(&format!("{id}-src"), 64 * M, None)).await;

    // A clone into less than the source: OUT_OF_RANGE, saying both sizes; nothing made.
    let small = format!("{id}-small");
    let req = create(&small, 32 * M, clone_of(&src.volume_id));
    let err = ctrl.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    let msg = err.message();
    assert!(
        msg.contains(&(32 * M).to_string()) && msg.contains(&(64 * M).to_string()),
        "{msg}"
    );
    assert!(!exists(small).await);

    // A restore from a snapshot that does not exist: NOT_FOUND, nothing made.
    let orphan = format!("{id}-orphan");
    let req = create(
        &orphan,
        64 * M,
        restore_of(&format!("{id}-no-such-snapshot")),
    );
    let err = ctrl.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(!exists(orphan).await);
    // A volume id is no snapshot id.
    let req = create(&format!("{id}-notsnap"), 64 * M, restore_of(&src.volume_id));
    let err = ctrl.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // A volume never attached: its snapshot is ready at once (nothing to copy), and
    // the same request again answers the same; another source under the name is
    // ALREADY_EXISTS.
    let snap_req = snapshot(&src.volume_id, &format!("{id}-snap"));
    let snapshot_made = |r: Result<tonic::Response<CreateSnapshotResponse>, tonic::Status>| {
        r.unwrap().into_inner().snapshot.unwrap()
    };
    let snap = snapshot_made(ctrl.create_snapshot(snap_req.clone()).await);
    assert!(snap.ready_to_use, "{snap:?}");
    assert_eq!(snap.size_bytes, 64 * M);
    let again = snapshot_made(ctrl.create_snapshot(snap_req.clone()).await);
    assert_eq!(again.snapshot_id, snap.snapshot_id);
    let other = made(&mut ctrl, create(&format!("{id}-other"), 64 * M, None)).await;
    let req = snapshot(&other.volume_id, &snap_req.name);
    let err = ctrl.create_snapshot(req).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    // The snapshot is not listed as a volume.
    let listed = ctrl.list_volumes(ListVolumesRequest::default()).await;
    let listed = listed.unwrap().into_inner().entries;
    assert!(
        listed
            .iter()
            .all(|e| e.volume.as_ref().unwrap().volume_id != snap.snapshot_id)
    );

    // A restore of it, larger than the snapshot: created, echoing its source.
    let req = create(
        &format!("{id}-restored"),
        128 * M,
        restore_of(&snap.snapshot_id),
    );
    let restored = made(&mut ctrl, req).await;
    assert_eq!(restored.capacity_bytes, 128 * M);
    assert!(restored.content_source.is_some());
    let v = volumes.get(&restored.volume_id).await.unwrap();
    assert_eq!(
        v.spec.data_source.as_ref().map(|d| d.volume.as_str()),
        Some(snap.snapshot_id.as_str())
    );
    assert!(v.populated());

    // DeleteSnapshot: the snapshot's Volume is deleted (its data then goes through the
    // usual cleanup ticket, on a node with an agent: tests/pods/snapshots.rs); again is
    // fine.
    let delete_snapshot = |snapshot_id: &str| DeleteSnapshotRequest {
        snapshot_id: snapshot_id.into(),
        ..Default::default()
    };
    for _ in 0..2 {
        let req = delete_snapshot(&snap.snapshot_id);
        ctrl.delete_snapshot(req).await.unwrap();
    }
    let deleting = volumes
        .get_opt(&snap.snapshot_id)
        .await
        .unwrap()
        .is_none_or(|v| v.metadata.deletion_timestamp.is_some());
    assert!(deleting, "the snapshot's Volume is not being deleted");
    // DeleteSnapshot never deletes a volume that is no snapshot.
    let req = delete_snapshot(&src.volume_id);
    ctrl.delete_snapshot(req).await.unwrap();
    assert!(exists(src.volume_id.clone()).await);

    let left = [src.volume_id, other.volume_id, restored.volume_id];
    delete_volumes(&mut ctrl, &left).await;
}
