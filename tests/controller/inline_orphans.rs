//! Inline volumes whose NodeUnpublish never comes (issue 19): a real `tessera
//! controller` (its reaper) against the test control plane deletes an inline Volume
//! whose Pod is gone, or is another Pod now (same name, new uid), after removing its
//! `csi-ephemeral` ticket, with an `InlineVolumeOrphaned` Event; the inline Volume of
//! a Pod that exists is left alone. And the other way round: the recreated
//! VolumeAttachment of an inline Volume whose Pod still uses it gets its ticket back.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use tessera_api::{
    ANNOTATION_INLINE_POD, ANNOTATION_INLINE_POD_UID, AttacherType, AttachmentTicket, LABEL_INLINE,
    Volume, VolumeAttachment,
};

use crate::support;
use support::fixtures::{self, ControllerProcess, TEST_LABEL, eventually};

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

/// Create the Pod `default/<name>` of `spec`; its uid.
async fn create_pod(client: &Client, name: &str, spec: serde_json::Value) -> (Api<Pod>, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .uid()
        .unwrap();
    (pods, uid)
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
    let _ctrl = ControllerProcess::alone(&id, &["--reap-grace=1s"]);
    // A Pod that exists (it stays Pending: no node runs it).
    let (pods, uid) = create_pod(
        &client,
        &id,
        json!({"containers": [{"name": "c", "image": "busybox"}],
               "nodeSelector": {"tessera.io/none": "x"}}),
    )
    .await;
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
            field_manager: Some(tessera_api::CSI_NODE_FIELD_MANAGER.into()),
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

    abandon_and_delete(&client, &[alive, gone, replaced]).await;
}

/// No agent runs on the test's node: give the data of `names` up so the Volumes can
/// go, and delete them.
async fn abandon_and_delete(client: &Client, names: &[String]) {
    let volumes: Api<Volume> = Api::all(client.clone());
    for name in names {
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
    fixtures::delete_volumes(client, names).await;
}

/// A VolumeAttachment of an inline volume deleted while its Pod still uses it (its
/// finalizer does not hold a ticket the controller has not satisfied, or an
/// administrator removed the finalizer) is recreated with its `csi-ephemeral` ticket
/// back at once, as NodePublish wrote it (same id, node, `readOnly` from the Pod), the
/// node plugin writing it only at NodePublish; one whose Pod is gone comes back empty.
#[tokio::test]
async fn a_recreated_attachment_of_an_inline_volume_gets_its_ticket_back() {
    use tessera_api::{inline_ticket, inline_ticket_id, inline_volume_name};
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let id = support::unique_name("inline-recreated");
    let node = format!("{id}-n");
    fixtures::create_nodes(&client, std::slice::from_ref(&node)).await;
    // The reaper left out: the Pod-less volume is what this test keeps.
    let _ctrl = ControllerProcess::alone(&id, &["--reap-grace=1h"]);
    // The Pod, placed on the node (no kubelet runs it: the ticket stays unsatisfied,
    // so nothing holds the deletion), declaring a read-only inline volume.
    let (pods, uid) = create_pod(
        &client,
        &id,
        json!({"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
               "volumes": [{"name": "scratch",
                            "csi": {"driver": tessera_api::CSI_DRIVER_NAME, "readOnly": true}}]}),
    )
    .await;
    let (used, gone) = (
        inline_volume_name(&uid, "scratch"),
        format!("inline-{id}-gone"),
    );
    let volumes: Api<Volume> = Api::all(client.clone());
    for v in [
        inline_volume(&used, &id, &id, &uid, &node),
        inline_volume(&gone, &id, &format!("{id}-nopod"), "0000-1111", &node),
    ] {
        volumes.create(&PostParams::default(), &v).await.unwrap();
    }
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pp = PatchParams {
        field_manager: Some(tessera_api::CSI_NODE_FIELD_MANAGER.into()),
        ..Default::default()
    };
    for name in [&used, &gone] {
        eventually(
            WAIT,
            "the VolumeAttachment and the Volume's status",
            || async {
                let va = vas.get_opt(name).await.ok().flatten()?;
                volumes.get(name).await.ok()?.status?;
                Some(va)
            },
        )
        .await;
        let t = inline_ticket(name, &node, true);
        vas.patch(name, &pp, &Patch::Merge(t.upsert_patch()))
            .await
            .unwrap();
    }
    let ticket = inline_ticket_id(&used, &node);
    for name in [&used, &gone] {
        let before = vas.get(name).await.unwrap().metadata.uid;
        vas.delete(name, &DeleteParams::default()).await.unwrap();
        let started = std::time::Instant::now();
        let va = eventually(Duration::from_secs(10), "recreated", || async {
            let va = vas.get_opt(name).await.ok().flatten()?;
            (va.metadata.uid != before).then_some(va)
        })
        .await;
        let va = if name == &used {
            eventually(Duration::from_secs(5), "its ticket back", || async {
                let va = vas.get(name).await.ok()?;
                va.spec
                    .attachment_tickets
                    .contains_key(&ticket)
                    .then_some(va)
            })
            .await
        } else {
            // Given the time a rebuild takes, then nothing may come.
            tokio::time::sleep(Duration::from_secs(2)).await;
            vas.get(name).await.unwrap_or(va)
        };
        println!(
            "{name}: recreated in {:?} with tickets {:?}",
            started.elapsed(),
            va.spec.attachment_tickets.keys().collect::<Vec<_>>()
        );
        if name == &used {
            let t = &va.spec.attachment_tickets[&ticket];
            assert_eq!(
                *t,
                inline_ticket(&used, &node, true),
                "as NodePublish wrote it"
            );
            let notes = eventually(WAIT, "the VolumeAttachmentRecreated Event", || async {
                Some(support::event_notes(&client, name, "VolumeAttachmentRecreated", None).await)
                    .filter(|n| !n.is_empty())
            })
            .await;
            assert!(notes[0].contains(&ticket), "{notes:?}");
        } else {
            assert!(va.spec.attachment_tickets.is_empty(), "{va:?}");
        }
    }

    pods.delete(&id, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    for name in [&used, &gone] {
        let _ = vas
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"attachmentTickets": null}})),
            )
            .await;
    }
    abandon_and_delete(&client, &[used, gone]).await;
    fixtures::delete_nodes(&client, &[node]).await;
}
