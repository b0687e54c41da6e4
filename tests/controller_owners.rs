//! Issue 13, GitOps owners, against the real control plane: Tessera never removes a
//! ticket another field manager owns (it stops honouring it and says why), while the
//! tickets Tessera wrote itself are still reaped. Each test runs its own `tessera
//! controller` process scoped to its objects, and a stand-in node agent.

mod support;

use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use support::fixtures::{self, ControllerProcess, FakeAgent, eventually};
use tessera::api::VolumeAttachment;

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
    let _ctrl = ControllerProcess::start(&id, &["--no-leader-election", "--reap-grace-seconds=2"]);
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
            let reason = |id: &str| s.get(id).map(|x| x.1.clone()).unwrap_or_default();
            (reason("manual-nowhere") == "NodeNotFound"
                && reason("manual-expired") == "Expired"
                && reason("manual-doomed") == "NodeNotFound")
                .then_some(s)
        },
    )
    .await;
    let msg = |id: &str| states[id].2.clone();
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
        assert!(!fixtures::ticket_states(&client, &vol).await[kept].0);
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
