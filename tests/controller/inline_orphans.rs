//! Inline volumes whose NodeUnpublish never comes (issue 19): a real `tessera
//! controller` (its reaper) against the test control plane deletes an inline Volume
//! whose Pod is gone, or is another Pod now (same name, new uid), after removing its
//! `csi-ephemeral` ticket, with an `InlineVolumeOrphaned` Event; the inline Volume of
//! a Pod that exists is left alone.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use support::fixtures::{self, ControllerProcess, TEST_LABEL, eventually};
use tessera::api::{ANNOTATION_INLINE_POD, ANNOTATION_INLINE_POD_UID, LABEL_INLINE};
use tessera::api::{AttacherType, AttachmentTicket, Volume, VolumeAttachment};

const WAIT: Duration = Duration::from_secs(60);

/// An inline Volume of Pod `default/<pod>` with `uid`, node-local on `node`.
fn inline_volume(name: &str, id: &str, pod: &str, uid: &str, node: &str) -> Volume {
    serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
        "metadata": {
            "name": name,
            "labels": {TEST_LABEL: id, LABEL_INLINE: "true"},
            "annotations": {ANNOTATION_INLINE_POD: format!("default/{pod}"), ANNOTATION_INLINE_POD_UID: uid},
        },
        "spec": {"size": "1Mi", "accessMode": "ReadWriteOnce",
                 "backend": {"root": "/var/lib/tessera/test", "scope": "NodeLocal", "node": node}},
    }))
    .unwrap()
}

async fn ephemeral_tickets(client: &Client, volume: &str) -> usize {
    Api::<VolumeAttachment>::all(client.clone())
        .get_opt(volume)
        .await
        .unwrap()
        .map(|va| {
            va.spec
                .attachment_tickets
                .values()
                .filter(|t| t.type_ == AttacherType::CsiEphemeral)
                .count()
        })
        .unwrap_or(0)
}

async fn orphan_events(client: &Client, volume: &str) -> Vec<String> {
    support::event_notes(client, volume, "InlineVolumeOrphaned", None).await
}

#[tokio::test]
async fn an_inline_volume_whose_pod_is_gone_is_deleted() {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let id = support::unique_name("inline-orphans");
    let node = format!("{id}-n");
    let _ctrl = ControllerProcess::start(&id, &["--no-leader-election", "--reap-grace=1s"]);
    // A Pod that exists (it stays Pending: no node runs it).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": id},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "nodeSelector": {"tessera.io/none": "x"}},
    }))
    .unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let (alive, gone, replaced) = (
        format!("inline-{id}-alive"),
        format!("inline-{id}-gone"),
        format!("inline-{id}-replaced"),
    );
    let volumes: Api<Volume> = Api::all(client.clone());
    for v in [
        inline_volume(&alive, &id, &id, &uid, &node),
        inline_volume(&gone, &id, &format!("{id}-nopod"), "0000-1111", &node),
        inline_volume(&replaced, &id, &id, "0000-2222", &node),
    ] {
        volumes.create(&PostParams::default(), &v).await.unwrap();
    }
    // Each with its csi-ephemeral ticket, as the node plugin writes it.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    for name in [&alive, &gone, &replaced] {
        eventually(WAIT, "the VolumeAttachment", || async {
            vas.get_opt(name).await.ok().flatten()
        })
        .await;
        let t = AttachmentTicket::new(format!("inline-{node}"), AttacherType::CsiEphemeral, &node);
        let pp = PatchParams {
            field_manager: Some(tessera::api::CSI_NODE_FIELD_MANAGER.into()),
            ..Default::default()
        };
        vas.patch(name, &pp, &Patch::Merge(t.upsert_patch()))
            .await
            .unwrap();
    }

    for name in [&gone, &replaced] {
        eventually(
            WAIT,
            &format!("{name} deleted, its ticket removed"),
            || async {
                let v = volumes.get_opt(name).await.ok()?;
                let deleting = v.is_none_or(|v| v.metadata.deletion_timestamp.is_some());
                (deleting && ephemeral_tickets(&client, name).await == 0).then_some(())
            },
        )
        .await;
        let notes = eventually(WAIT, "the InlineVolumeOrphaned Event", || async {
            Some(orphan_events(&client, name).await).filter(|n| !n.is_empty())
        })
        .await;
        println!("{name}: {notes:?}");
        assert!(notes[0].contains(&format!("default/{id}")), "{notes:?}");
    }
    // The live Pod's volume: left alone over several orphan checks (every 6 s here).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let v = volumes.get(&alive).await.unwrap();
    assert!(
        v.metadata.deletion_timestamp.is_none(),
        "the live Pod's volume stays"
    );
    assert_eq!(ephemeral_tickets(&client, &alive).await, 1);
    assert!(orphan_events(&client, &alive).await.is_empty());

    // Its Pod deleted: the volume goes too.
    pods.delete(&id, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(WAIT, "the volume of the deleted Pod deleted", || async {
        let v = volumes.get_opt(&alive).await.ok()?;
        v.is_none_or(|v| v.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;

    // The node never existed: give the data up so the Volumes can go.
    for name in [&alive, &gone, &replaced] {
        let _ = volumes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"tessera.io/abandon-data": "true"}}}),
                ),
            )
            .await;
    }
    fixtures::delete_volumes(&client, &[alive, gone, replaced]).await;
}
