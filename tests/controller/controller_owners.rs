//! Issue 13, GitOps owners, against the real control plane: Tessera never removes a
//! ticket another field manager owns (it stops honouring it and says why), while the
//! tickets Tessera wrote itself are still reaped. Each test runs its own `tessera
//! controller` process scoped to its objects, and a stand-in node agent.

use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVA;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use tessera_api::VolumeAttachment;

use crate::support;
use support::fixtures::{self, ControllerProcess, FakeAgent, eventually};

const WAIT: Duration = Duration::from_secs(30);

/// Apply `tickets` server-side as field manager `manager` (what a GitOps tool does: the
/// manager's whole set, so a ticket it applied before and not now is removed).
async fn apply_tickets(
    client: &Client,
    volume: &str,
    manager: &str,
    tickets: &[serde_json::Value],
) {
    let map: serde_json::Map<String, serde_json::Value> = tickets
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_string(), t.clone()))
        .collect();
    let id = map.keys().cloned().collect::<Vec<_>>().join(",");
    let body = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
        "metadata": {"name": volume}, "spec": {"volume": volume, "attachmentTickets": map}});
    Api::<VolumeAttachment>::all(client.clone())
        .patch(volume, &PatchParams::apply(manager), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| panic!("applying ticket {id} as {manager}: {e}"));
}

/// Add one ticket with a merge patch as field manager `manager` (what Tessera's own
/// components do).
async fn merge_ticket(client: &Client, volume: &str, manager: &str, ticket: serde_json::Value) {
    let id = ticket["id"].as_str().unwrap().to_string();
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    };
    Api::<VolumeAttachment>::all(client.clone())
        .patch(
            volume,
            &params,
            &Patch::Merge(json!({"spec": {"attachmentTickets": {&id: ticket}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("adding ticket {id} as {manager}: {e}"));
}

async fn has_ticket(client: &Client, volume: &str, id: &str) -> bool {
    Api::<VolumeAttachment>::all(client.clone())
        .get(volume)
        .await
        .unwrap()
        .spec
        .attachment_tickets
        .contains_key(id)
}

#[tokio::test]
async fn tickets_another_manager_owns_are_never_reaped_and_say_why() {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let id = support::unique_name("owners");
    let nodes: Vec<String> = (0..2).map(|i| format!("{id}-n{i}")).collect();
    fixtures::create_nodes(&client, &nodes).await;
    let _ctrl = ControllerProcess::alone(&id, &["--reap-grace=2s"]);
    let _agent = FakeAgent::start(client.clone(), &id);
    let vol = fixtures::create_volume(
        &client,
        &fixtures::volume(&format!("{id}-v"), &id, "ReadWriteMany"),
        WAIT,
    )
    .await;

    let never = format!("{id}-never");
    let past = (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60)).to_string();
    // GitOps: a node that never existed, an expiry in the past, and a node that goes.
    apply_tickets(
        &client,
        &vol,
        "argocd",
        &[
            json!({"id": "manual-nowhere", "type": "manual", "nodeID": never}),
            json!({"id": "manual-expired", "type": "manual", "nodeID": nodes[0], "expiresAt": past}),
        ],
    )
    .await;
    apply_tickets(
        &client,
        &vol,
        "flux",
        &[json!({"id": "manual-doomed", "type": "manual", "nodeID": nodes[1]})],
    )
    .await;
    // Tessera's own: a CSI ticket whose storage.k8s.io VolumeAttachment does not exist.
    merge_ticket(
        &client,
        &vol,
        "tessera-csi-controller",
        json!({"id": "csi-orphan", "type": "csi-attacher", "nodeID": nodes[0]}),
    )
    .await;
    fixtures::wait_satisfied(&client, &vol, "manual-doomed").await;
    fixtures::delete_nodes(&client, &nodes[1..2]).await;

    // Tessera's own orphan goes (after the grace period) ...
    eventually(WAIT, "csi-orphan reaped", || async {
        (!has_ticket(&client, &vol, "csi-orphan").await).then_some(())
    })
    .await;
    // ... the others are not honoured, say why, and stay (several reaper passes).
    let states = eventually(
        WAIT,
        "GitOps tickets say why they are not honoured",
        || async {
            let s = fixtures::ticket_states(&client, &vol).await;
            let reason = |id: &str| s.get(id).map(|x| x.reason.clone()).unwrap_or_default();
            (reason("manual-nowhere") == "NodeNotFound"
                && reason("manual-expired") == "Expired"
                && reason("manual-doomed") == "NodeNotFound")
                .then_some(s)
        },
    )
    .await;
    let msg = |id: &str| states[id].message.clone();
    assert!(
        msg("manual-nowhere").contains(&format!("node {never} does not exist"))
            && !msg("manual-nowhere").contains("no longer"),
        "{}",
        msg("manual-nowhere")
    );
    assert!(
        msg("manual-expired").contains("expired"),
        "{}",
        msg("manual-expired")
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    for kept in ["manual-nowhere", "manual-expired", "manual-doomed"] {
        assert!(has_ticket(&client, &vol, kept).await, "{kept} was removed");
        assert!(!fixtures::ticket_states(&client, &vol).await[kept].satisfied);
    }
    eventually(WAIT, "no MountPod for tickets not honoured", || async {
        fixtures::mountpods_of(&client, &vol)
            .await
            .is_empty()
            .then_some(())
    })
    .await;

    // The node comes back: the ticket is honoured again.
    fixtures::create_nodes(&client, &nodes[1..2]).await;
    fixtures::wait_satisfied(&client, &vol, "manual-doomed").await;

    fixtures::delete_volumes(&client, std::slice::from_ref(&vol)).await;
    fixtures::delete_nodes(&client, &nodes).await;
}

/// The Warning Events on Volume `volume` with `reason`: their notes.
async fn warnings(client: &Client, volume: &str, reason: &str) -> Vec<String> {
    support::event_notes(client, volume, reason, Some("Warning")).await
}

/// A PV of the Tessera driver for `volume` and the storage.k8s.io VolumeAttachment the
/// attach-detach controller would create for it on `node`; the latter's name (the CSI
/// ticket id).
async fn storage_attachment(client: &Client, volume: &str, node: &str) -> String {
    let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": format!("pv-{volume}")},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "csi.tessera.io", "volumeHandle": volume}},
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone())
        .create(&Default::default(), &pv)
        .await
        .unwrap();
    let name = tessera_csi::csi_ticket_id(volume, node);
    let sva: StorageVA = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": name},
        "spec": {"attacher": "csi.tessera.io", "nodeName": node,
                 "source": {"persistentVolumeName": format!("pv-{volume}")}},
    }))
    .unwrap();
    Api::<StorageVA>::all(client.clone())
        .create(&Default::default(), &sva)
        .await
        .unwrap();
    name
}

async fn delete_storage_attachment(client: &Client, volume: &str, name: &str) {
    let _ = Api::<StorageVA>::all(client.clone())
        .delete(name, &Default::default())
        .await;
    let _ = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone())
        .delete(&format!("pv-{volume}"), &Default::default())
        .await;
}

#[tokio::test]
async fn deleting_a_volume_attachment_in_use_waits_and_a_recreated_one_gets_its_csi_tickets_back() {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let id = support::unique_name("vadelete");
    let nodes: Vec<String> = (0..2).map(|i| format!("{id}-n{i}")).collect();
    fixtures::create_nodes(&client, &nodes).await;
    let _ctrl = ControllerProcess::alone(&id, &[]);
    let agent = FakeAgent::start(client.clone(), &id);
    agent.failing.lock().unwrap().push(nodes[1].clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let in_use = fixtures::create_volume(
        &client,
        &fixtures::volume(&format!("{id}-a"), &id, "ReadWriteOnce"),
        WAIT,
    )
    .await;
    let waiting = fixtures::create_volume(
        &client,
        &fixtures::volume(&format!("{id}-b"), &id, "ReadWriteOnce"),
        WAIT,
    )
    .await;
    let sva_a = storage_attachment(&client, &in_use, &nodes[0]).await;
    let sva_b = storage_attachment(&client, &waiting, &nodes[1]).await;
    let csi = json!({"type": "csi-attacher", "parameters": {"readOnly": "false"}});
    let ticket = |id: &str, node: &str| {
        let mut t = csi.clone();
        t["id"] = json!(id);
        t["nodeID"] = json!(node);
        t
    };
    merge_ticket(
        &client,
        &in_use,
        "tessera-csi-controller",
        ticket(&sva_a, &nodes[0]),
    )
    .await;
    merge_ticket(
        &client,
        &waiting,
        "tessera-csi-controller",
        ticket(&sva_b, &nodes[1]),
    )
    .await;
    fixtures::wait_satisfied(&client, &in_use, &sva_a).await;

    // A (satisfied workload ticket): the deletion waits, nothing is unmounted, and a
    // Warning says to remove tickets instead.
    let uid_a = vas.get(&in_use).await.unwrap().metadata.uid;
    let _ = vas.delete(&in_use, &Default::default()).await;
    let notes = eventually(WAIT, "a Warning on the Volume in use", || async {
        let n = warnings(&client, &in_use, "DeletionBlocked").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert!(
        notes[0].contains(&sva_a) && notes[0].contains("remove"),
        "{notes:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let va = vas
        .get(&in_use)
        .await
        .expect("the VolumeAttachment in use stays");
    assert_eq!(va.metadata.uid, uid_a);
    assert!(va.ticket_satisfied(&sva_a), "its ticket stays satisfied");
    assert_eq!(
        fixtures::mountpods_of(&client, &in_use).await.len(),
        1,
        "still mounted"
    );

    // B (its ticket is not satisfied): the deletion goes through, the VolumeAttachment is
    // recreated with its CSI ticket rebuilt at once from the storage.k8s.io one.
    let uid_b = vas.get(&waiting).await.unwrap().metadata.uid;
    let _ = vas.delete(&waiting, &Default::default()).await;
    let started = std::time::Instant::now();
    eventually(
        Duration::from_secs(5),
        "recreated with its CSI ticket",
        || async {
            let va = vas.get_opt(&waiting).await.unwrap()?;
            (va.metadata.uid != uid_b && va.spec.attachment_tickets.contains_key(&sva_b))
                .then_some(())
        },
    )
    .await;
    eprintln!("recreated with its CSI ticket in {:?}", started.elapsed());
    let t = vas.get(&waiting).await.unwrap().spec.attachment_tickets[&sva_b].clone();
    assert_eq!(
        (t.node_id.as_str(), t.type_),
        (nodes[1].as_str(), tessera_api::AttacherType::CsiAttacher)
    );
    eventually(WAIT, "a Warning on the recreated one", || async {
        (!warnings(&client, &waiting, "VolumeAttachmentRecreated")
            .await
            .is_empty())
        .then_some(())
    })
    .await;

    // A's workload goes: now its VolumeAttachment may go, and comes back empty.
    delete_storage_attachment(&client, &in_use, &sva_a).await;
    fixtures::remove_ticket(&client, &in_use, &sva_a).await;
    eventually(WAIT, "A deleted and recreated, empty", || async {
        let va = vas.get_opt(&in_use).await.unwrap()?;
        (va.metadata.uid != uid_a && va.spec.attachment_tickets.is_empty()).then_some(())
    })
    .await;

    delete_storage_attachment(&client, &waiting, &sva_b).await;
    fixtures::delete_volumes(&client, &[in_use, waiting]).await;
    fixtures::delete_nodes(&client, &nodes).await;
}
