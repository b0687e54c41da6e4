//! The controllers against the real control plane: tickets in, MountPods and ticket
//! statuses out. Each test runs its own `tessera controller` process, scoped to the
//! test's objects by a watch selector, and a stand-in node agent that reports MountPods
//! Ready through the API as the agent does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVA;
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use tessera_api::{MountPod, Volume, VolumeAttachment, VolumeState, VolumeStatus};

use crate::support;
use support::env::Env;
use support::fixtures::{self, ControllerProcess, FakeAgent, TEST_LABEL, eventually};

pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// The test's share of the cluster: `nodes` Node objects, waits bounded by [`WAIT`].
pub(crate) async fn env(prefix: &str, nodes: usize) -> Env {
    Env::new(prefix, nodes, WAIT).await
}

#[tokio::test]
async fn single_rwo_attach() {
    let e = env("rwo", 1).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;

    e.attach(&vol, "manual-a", "manual", &e.nodes[0]).await;
    assert_eq!(
        fixtures::mountpods_of(&e.client, &vol).await,
        BTreeMap::from([(e.nodes[0].clone(), false)])
    );
    let volumes: Api<Volume> = Api::all(e.client.clone());
    let status = eventually(WAIT, "volume Attached", || async {
        volumes
            .get(&vol)
            .await
            .unwrap()
            .status
            .filter(|s| s.state == Some(VolumeState::Attached))
    })
    .await;
    assert_eq!(status.attached_nodes, vec![e.nodes[0].clone()]);

    // Removing the ticket detaches.
    fixtures::remove_ticket(&e.client, &vol, "manual-a").await;
    eventually(
        WAIT,
        "MountPod gone after the ticket is removed",
        || async {
            fixtures::mountpods_of(&e.client, &vol)
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    eventually(WAIT, "volume Detached", || async {
        volumes
            .get(&vol)
            .await
            .unwrap()
            .status
            .filter(|s| s.state == Some(VolumeState::Detached))
            .map(|_| ())
    })
    .await;
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn rwo_second_node_waits_for_the_holder_then_moves() {
    let e = env("handover", 2).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;
    let (max_nodes, watch) = fixtures::watch_max_mountpods(e.client.clone(), &vol);

    e.attach(&vol, "csi-first", "csi-attacher", &e.nodes[0])
        .await;
    fixtures::put_ticket(
        &e.client,
        &vol,
        "csi-second",
        "csi-attacher",
        &e.nodes[1],
        json!({}),
    )
    .await;
    let message = e
        .blocked(&vol, "csi-second", "HeldByOtherNode")
        .await
        .message;
    assert!(
        message.contains("csi-first") && message.contains(&e.nodes[0]),
        "message must name the holder: {message}"
    );
    let waiting = Api::<VolumeAttachment>::all(e.client.clone())
        .get(&vol)
        .await
        .unwrap()
        .status
        .unwrap()
        .waiting;
    assert!(
        waiting.is_some_and(|w| w.contains("csi-second")),
        "status.waiting names the blocked ticket"
    );

    fixtures::remove_ticket(&e.client, &vol, "csi-first").await;
    fixtures::wait_satisfied(&e.client, &vol, "csi-second").await;
    assert_eq!(
        fixtures::mountpods_of(&e.client, &vol).await,
        BTreeMap::from([(e.nodes[1].clone(), false)])
    );
    assert_eq!(
        max_nodes.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the old MountPod must be gone before the new one exists"
    );
    watch.abort();
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn a_higher_priority_ticket_does_not_preempt_a_workload() {
    let e = env("nopreempt", 2).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;

    e.attach(&vol, "csi-app", "csi-attacher", &e.nodes[0]).await;
    fixtures::put_ticket(
        &e.client,
        &vol,
        "manual-ops",
        "manual",
        &e.nodes[1],
        json!({}),
    )
    .await;
    e.blocked(&vol, "manual-ops", "HeldByOtherNode").await;
    // Give the controller time to (wrongly) act, then check nothing moved.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let states = fixtures::ticket_states(&e.client, &vol).await;
    assert!(
        states["csi-app"].satisfied,
        "the workload ticket stays satisfied"
    );
    assert!(!states["manual-ops"].satisfied);
    assert_eq!(
        fixtures::mountpods_of(&e.client, &vol).await,
        BTreeMap::from([(e.nodes[0].clone(), false)])
    );
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn rwx_attaches_on_three_nodes() {
    let e = env("rwx", 3).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteMany").await;
    for (i, node) in e.nodes.iter().enumerate() {
        fixtures::put_ticket(
            &e.client,
            &vol,
            &format!("csi-{i}"),
            "csi-attacher",
            node,
            json!({}),
        )
        .await;
    }
    for i in 0..3 {
        fixtures::wait_satisfied(&e.client, &vol, &format!("csi-{i}")).await;
    }
    let mps = fixtures::mountpods_of(&e.client, &vol).await;
    assert_eq!(mps.len(), 3, "{mps:?}");
    let volumes: Api<Volume> = Api::all(e.client.clone());
    let status = eventually(WAIT, "three attached nodes", || async {
        volumes
            .get(&vol)
            .await
            .unwrap()
            .status
            .filter(|s| s.attached_nodes.len() == 3)
    })
    .await;
    assert_eq!(status.state, Some(VolumeState::Attached));
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn a_background_ticket_yields_to_a_workload_on_another_node() {
    let e = env("yield", 2).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;

    e.attach(&vol, "backup-nightly", "backup", &e.nodes[0])
        .await;
    let log = fixtures::ReasonLog::start(e.client.clone(), &vol, "backup-nightly");
    e.attach(&vol, "csi-app", "csi-attacher", &e.nodes[1]).await;
    // The backup was interrupted (naming the workload that took the volume), and now
    // waits behind it; it is not satisfied.
    let history = eventually(WAIT, "backup ticket seen Interrupted", || async {
        let h = log.history();
        h.iter().any(|(r, _)| r == "Interrupted").then_some(h)
    })
    .await;
    let (_, message) = history.iter().find(|(r, _)| r == "Interrupted").unwrap();
    assert!(message.contains("csi-app"), "names the workload: {message}");
    assert!(!fixtures::ticket_states(&e.client, &vol).await["backup-nightly"].satisfied);
    assert_eq!(
        fixtures::mountpods_of(&e.client, &vol).await,
        BTreeMap::from([(e.nodes[1].clone(), false)])
    );
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn the_reaper_removes_tickets_nothing_stands_behind() {
    let e = env("reaper", 3).await;
    let _ctrl = ControllerProcess::alone(&e.id, &["--reap-grace=2s"]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteMany").await;

    // A csi ticket backed by a storage.k8s.io VolumeAttachment of the same name.
    let sva_name = format!("csi-{}", e.id);
    let svas: Api<StorageVA> = Api::all(e.client.clone());
    let sva: StorageVA = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": sva_name},
        "spec": {"attacher": "csi.tessera.io", "nodeName": e.nodes[0], "source": {"persistentVolumeName": "pv-x"}}
    }))
    .unwrap();
    svas.create(&PostParams::default(), &sva).await.unwrap();
    put_ticket_as(
        &e.client,
        &vol,
        CSI_MANAGER,
        &sva_name,
        "csi-attacher",
        &e.nodes[0],
        json!({}),
    )
    .await;
    // Tickets Tessera wrote (the reaper removes only those;
    // tests/controller/controller_owners.rs has the ones another field manager owns): on
    // a node that will be deleted, and one that expires.
    put_ticket_as(
        &e.client,
        &vol,
        CONTROLLER_MANAGER,
        "manual-doomed-node",
        "manual",
        &e.nodes[1],
        json!({}),
    )
    .await;
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(4);
    put_ticket_as(
        &e.client,
        &vol,
        CONTROLLER_MANAGER,
        "manual-expiring",
        "manual",
        &e.nodes[2],
        json!({"expiresAt": expires.to_string()}),
    )
    .await;
    fixtures::wait_satisfied(&e.client, &vol, &sva_name).await;
    fixtures::wait_satisfied(&e.client, &vol, "manual-doomed-node").await;
    // Still backed, past the grace period: not reaped.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let va: Api<VolumeAttachment> = Api::all(e.client.clone());
    assert!(
        va.get(&vol)
            .await
            .unwrap()
            .spec
            .attachment_tickets
            .contains_key(&sva_name)
    );

    svas.delete(&sva_name, &DeleteParams::default())
        .await
        .unwrap();
    fixtures::delete_nodes(&e.client, &e.nodes[1..2]).await;
    for gone in [sva_name.as_str(), "manual-doomed-node", "manual-expiring"] {
        eventually(WAIT, &format!("ticket {gone} reaped"), || async {
            (!va.get(&vol)
                .await
                .unwrap()
                .spec
                .attachment_tickets
                .contains_key(gone))
            .then_some(())
        })
        .await;
    }
    // Each removal is an Event on the Volume naming the ticket and why.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(e.client.clone(), "default");
    let notes = eventually(WAIT, "TicketReaped events", || async {
        let list = events.list(&Default::default()).await.unwrap();
        let notes: Vec<String> = list
            .items
            .into_iter()
            .filter(|ev| {
                ev.reason.as_deref() == Some("TicketReaped")
                    && ev.regarding.as_ref().is_some_and(|r| {
                        r.name.as_deref() == Some(vol.as_str())
                            && r.kind.as_deref() == Some("Volume")
                    })
            })
            .filter_map(|ev| ev.note)
            .collect();
        (notes.len() >= 3).then_some(notes)
    })
    .await;
    let all = notes.join("\n");
    assert!(
        all.contains(&sva_name) && all.contains("VolumeAttachment"),
        "{all}"
    );
    assert!(
        all.contains("manual-doomed-node") && all.contains("does not exist"),
        "{all}"
    );
    assert!(
        all.contains("manual-expiring") && all.contains("expired"),
        "{all}"
    );
    eventually(WAIT, "MountPods of reaped tickets removed", || async {
        fixtures::mountpods_of(&e.client, &vol)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn gitops_tickets_merge_per_key_and_tessera_owns_none_of_them() {
    let e = env("gitops", 2).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteMany").await;
    let api: Api<VolumeAttachment> = Api::all(e.client.clone());
    let manifest = |tickets: serde_json::Value| {
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
               "metadata": {"name": vol}, "spec": {"volume": vol, "attachmentTickets": tickets}})
    };
    let argo = manifest(
        json!({"manual-argo": {"id": "manual-argo", "type": "manual", "nodeID": e.nodes[0]}}),
    );
    let flux = manifest(
        json!({"manual-flux": {"id": "manual-flux", "type": "manual", "nodeID": e.nodes[1]}}),
    );
    api.patch(&vol, &PatchParams::apply("argocd"), &Patch::Apply(&argo))
        .await
        .unwrap();
    api.patch(&vol, &PatchParams::apply("flux"), &Patch::Apply(&flux))
        .await
        .unwrap();
    fixtures::wait_satisfied(&e.client, &vol, "manual-argo").await;
    fixtures::wait_satisfied(&e.client, &vol, "manual-flux").await;

    // Tessera owns no ticket field: re-applying either manifest conflicts with nobody.
    let got = api.get(&vol).await.unwrap();
    for mf in got.metadata.managed_fields.iter().flatten() {
        if mf.manager.as_deref() == Some("tessera-controller") && mf.subresource.is_none() {
            let fields = serde_json::to_string(&mf.fields_v1).unwrap();
            assert!(
                !fields.contains("attachmentTickets"),
                "tessera-controller owns ticket fields: {fields}"
            );
        }
    }
    let strict = PatchParams {
        field_manager: Some("argocd".into()),
        force: false,
        ..Default::default()
    };
    api.patch(&vol, &strict, &Patch::Apply(&argo))
        .await
        .expect("no conflict for the GitOps owner");

    // Argo drops its ticket: only that one goes; Flux's stays and stays satisfied.
    api.patch(
        &vol,
        &PatchParams::apply("argocd"),
        &Patch::Apply(&manifest(json!({}))),
    )
    .await
    .unwrap();
    let tickets = api.get(&vol).await.unwrap().spec.attachment_tickets;
    assert!(
        !tickets.contains_key("manual-argo") && tickets.contains_key("manual-flux"),
        "{tickets:?}"
    );
    eventually(WAIT, "node 0 detached, node 1 kept", || async {
        let mps = fixtures::mountpods_of(&e.client, &vol).await;
        (mps == BTreeMap::from([(e.nodes[1].clone(), false)])).then_some(())
    })
    .await;
    assert!(fixtures::ticket_states(&e.client, &vol).await["manual-flux"].satisfied);
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn nothing_is_written_when_nothing_changed() {
    let e = env("idle", 1).await;
    let ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;
    e.attach(&vol, "manual-a", "manual", &e.nodes[0]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes_before = support::api_writes(&ctrl.metrics().unwrap_or_default());
    let reconciles_before = ctrl.metric_sum("tessera_reconcile_total");
    assert!(writes_before > 0.0, "the metrics endpoint counts writes");
    // Touch the objects without changing anything the controller decides on.
    let volumes: Api<Volume> = Api::all(e.client.clone());
    volumes
        .patch(
            &vol,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "1"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let writes_after = support::api_writes(&ctrl.metrics().unwrap_or_default());
    let reconciles_after = ctrl.metric_sum("tessera_reconcile_total");
    assert!(
        reconciles_after > reconciles_before,
        "the touch triggered reconciles"
    );
    assert_eq!(
        writes_after, writes_before,
        "reconciles with nothing to change wrote to the API server"
    );
    e.cleanup(&[vol]).await;
}

#[tokio::test]
async fn a_node_update_that_changes_nothing_read_reconciles_nothing() {
    // The kubelet and the attach-detach controller update a Node's status on their
    // own schedule (and on every attach): none of it is what the controller reads of a
    // Node (that it exists), so none of it may reconcile the node's volumes.
    let e = env("nodeupd", 1).await;
    let ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;
    e.attach(&vol, "manual-a", "manual", &e.nodes[0]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // What the controller reconciles anyway over the same time (background work of
    // both controllers), then the same time with ten Node updates.
    let idle_start = ctrl.metric_sum("tessera_reconcile_total");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = ctrl.metric_sum("tessera_reconcile_total") - idle_start;
    let before = ctrl.metric_sum("tessera_reconcile_total");
    let nodes: Api<Node> = Api::all(e.client.clone());
    for i in 0..10 {
        nodes
            .patch(
                &e.nodes[0],
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"touched": i.to_string()}}})),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let touched = ctrl.metric_sum("tessera_reconcile_total") - before;
    // The background varies (requeues, other tests' objects on a loaded machine: CI
    // once saw 2 idle, then 5 with the updates): idle once more, after, and take the
    // larger. A reconcile per update would be 10 more.
    let idle_start = ctrl.metric_sum("tessera_reconcile_total");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = idle.max(ctrl.metric_sum("tessera_reconcile_total") - idle_start);
    assert!(
        touched <= idle + 3.0,
        "10 Node updates that change nothing the controller reads: {touched} reconciles \
         (idle over the same time: at most {idle})"
    );
    e.cleanup(&[vol]).await;
}

const CSI_MANAGER: &str = "tessera-csi-controller";
const CONTROLLER_MANAGER: &str = "tessera-controller";

/// [`fixtures::put_ticket`] as field manager `manager` (the reaper removes only the
/// tickets Tessera's own managers wrote).
async fn put_ticket_as(
    client: &Client,
    volume: &str,
    manager: &str,
    id: &str,
    type_: &str,
    node: &str,
    extra: serde_json::Value,
) {
    let mut ticket = json!({"id": id, "type": type_, "nodeID": node});
    if let (Some(t), Some(e)) = (ticket.as_object_mut(), extra.as_object()) {
        t.extend(e.clone());
    }
    let params = PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    };
    Api::<VolumeAttachment>::all(client.clone())
        .patch(
            volume,
            &params,
            &Patch::Merge(json!({"spec": {"attachmentTickets": {id: ticket}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("adding ticket {id} to {volume} as {manager}: {e}"));
}

#[allow(dead_code)]
fn _labels(id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(TEST_LABEL.to_string(), id.to_string())])
}

/// The `Ready` condition of a Tessera object's status, as (status, reason, message).
fn ready_condition(status: &serde_json::Value) -> Option<(String, String, String)> {
    let c = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// Change the finalizers of MountPod `name` by `edit` (guarded by its resourceVersion).
async fn edit_finalizers(mps: &Api<MountPod>, name: &str, edit: impl FnOnce(&mut Vec<String>)) {
    let mp = mps.get(name).await.unwrap();
    let mut finalizers = mp.metadata.finalizers.clone().unwrap_or_default();
    edit(&mut finalizers);
    let patch = json!({"metadata": {"finalizers": finalizers,
                                    "resourceVersion": mp.metadata.resource_version}});
    mps.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The notes of the Events (namespace `default`) with `reason` about the `kind` named
/// `name`, each with its series count (1 for a single Event), sorted.
async fn event_notes_of(
    client: &Client,
    name: &str,
    kind: &str,
    reason: &str,
) -> Vec<(String, i32)> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let mut notes: Vec<(String, i32)> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|ev| {
            ev.reason.as_deref() == Some(reason)
                && ev.regarding.as_ref().is_some_and(|r| {
                    r.name.as_deref() == Some(name) && r.kind.as_deref() == Some(kind)
                })
        })
        .map(|ev| {
            let count = ev.series.map_or(1, |s| s.count);
            (ev.note.unwrap_or_default(), count)
        })
        .collect();
    notes.sort();
    notes
}

/// Record the statuses Volume `vol` is given after resourceVersion `from`, as its
/// watch shows them (consecutive repeats folded), until the task is aborted.
fn record_statuses(
    volumes: &Api<Volume>,
    vol: &str,
    from: String,
) -> (
    Arc<std::sync::Mutex<Vec<VolumeStatus>>>,
    tokio::task::JoinHandle<()>,
) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<VolumeStatus>::new()));
    let (volumes, vol, recorded) = (volumes.clone(), vol.to_string(), seen.clone());
    let task = tokio::spawn(async move {
        let params = WatchParams::default().fields(&format!("metadata.name={vol}"));
        let mut events = volumes.watch(&params, &from).await.unwrap().boxed();
        while let Some(Ok(WatchEvent::Modified(v))) = events.next().await {
            let mut seen = recorded.lock().unwrap();
            if let Some(status) = v.status
                && seen.last() != Some(&status)
            {
                seen.push(status);
            }
        }
    });
    (seen, task)
}

#[tokio::test]
async fn ready_conditions_and_one_event_series_per_node() {
    let e = env("ready", 2).await;
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let vas: Api<VolumeAttachment> = Api::all(e.client.clone());
    let volumes: Api<Volume> = Api::all(e.client.clone());
    let va_ready = |name: String| {
        let vas = vas.clone();
        async move {
            let va = vas.get(&name).await.unwrap();
            ready_condition(&serde_json::to_value(va.status?).unwrap())
        }
    };

    // A VolumeAttachment whose Volume does not exist says so.
    let ghost = e.volume_name("ghost");
    let body = serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
        "metadata": {"name": ghost, "labels": {TEST_LABEL: e.id}},
        "spec": {"volume": ghost, "attachmentTickets": {
            "manual-a": {"id": "manual-a", "type": "manual", "nodeID": e.nodes[0]}}},
    }));
    vas.create(&PostParams::default(), &body.unwrap())
        .await
        .unwrap();
    let (status, reason, message) = eventually(WAIT, "VolumeNotFound", || async {
        va_ready(ghost.clone()).await.filter(|r| r.0 == "False")
    })
    .await;
    assert_eq!(reason, "VolumeNotFound");
    assert_eq!(message, format!("Volume {ghost} does not exist"));
    assert_eq!(status, "False");
    vas.delete(&ghost, &DeleteParams::default()).await.unwrap();

    // No agent yet (and no CSINode lists the driver on the test's nodes): a ticket
    // waiting for its mount says the node has no agent.
    let vol = e.volume("v", "ReadWriteMany").await;
    let (n0, n1) = (e.nodes[0].clone(), e.nodes[1].clone());
    fixtures::put_ticket(&e.client, &vol, "manual-a", "manual", &n0, json!({})).await;
    let (_, _, message) = eventually(WAIT, "NoAgent", || async {
        va_ready(vol.clone()).await.filter(|r| r.1 == "NoAgent")
    })
    .await;
    assert!(
        message.contains(&format!("node {} has no Tessera agent", e.nodes[0])),
        "{message}"
    );

    // Attached on two nodes: Ready on both objects, one Event series per node.
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    fixtures::wait_satisfied(&e.client, &vol, "manual-a").await;
    e.attach(&vol, "manual-b", "manual", &e.nodes[1]).await;
    eventually(WAIT, "VolumeAttachment Ready", || async {
        va_ready(vol.clone()).await.filter(|r| r.0 == "True")
    })
    .await;
    let volume_ready = eventually(WAIT, "Volume Ready", || async {
        let v = volumes.get(&vol).await.unwrap();
        ready_condition(&serde_json::to_value(v.status?).unwrap()).filter(|r| r.0 == "True")
    })
    .await;
    assert_eq!(volume_ready.1, "Attached");
    let v = volumes.get(&vol).await.unwrap();
    let s = v.status.unwrap();
    assert_eq!(s.attached_node_list, e.nodes.join(","));

    let notes_of =
        |kind: &'static str, reason: &'static str| event_notes_of(&e.client, &vol, kind, reason);
    // Node Events go on the Volume, one series per node: Attached for both nodes;
    // Attaching for the attach that was slow (node 0 waited for an agent), and for
    // node 1 only if its attach took over a second here.
    let attached = eventually(WAIT, "Attached Events on the Volume", || async {
        let notes = notes_of("Volume", "Attached").await;
        (notes.len() >= 2).then_some(notes)
    })
    .await;
    assert_eq!(attached.len(), 2, "{attached:?}");
    for (note, node) in attached.iter().zip(&e.nodes) {
        assert!(
            note.0.starts_with(&format!("attached to node {node}")),
            "{attached:?}"
        );
        assert_eq!(note.1, 1, "not a repeat: {attached:?}");
    }
    let attaching = notes_of("Volume", "Attaching").await;
    assert!(
        attaching.first().is_some_and(|n| n
            .0
            .starts_with(&format!("attaching to node {}", e.nodes[0]))),
        "the slow attach says it waits: {attaching:?}"
    );
    assert!(attaching.len() <= 2, "{attaching:?}");
    for n in &attaching {
        assert_eq!(n.1, 1, "not a repeat: {attaching:?}");
    }
    for reason in ["Attaching", "Attached"] {
        let on_va = notes_of("VolumeAttachment", reason).await;
        assert!(
            on_va.is_empty(),
            "node Events only on the Volume: {on_va:?}"
        );
    }

    // Detached from both: one Detached Event per node. Each MountPod is held by a
    // finalizer, as the node agent holds it until its mount has ended: node 0's is let
    // go as soon as it is deleted (a fast detach), node 1's only after a while.
    const HOLD: &str = "test.tessera.io/slow-unmount";
    let mps: Api<MountPod> = Api::all(e.client.clone());
    let (mp0, mp1) = (
        tessera_api::mountpod_name(&vol, &n0),
        tessera_api::mountpod_name(&vol, &n1),
    );
    for mp in [&mp0, &mp1] {
        edit_finalizers(&mps, mp, |f| f.push(HOLD.into())).await;
    }
    // The statuses the Volume is given from here on, as its watch shows them.
    let from = volumes.get(&vol).await.unwrap().resource_version().unwrap();
    let (seen, watching) = record_statuses(&volumes, &vol, from);
    fixtures::remove_ticket(&e.client, &vol, "manual-a").await;
    eventually(WAIT, "node 0's MountPod deleted", || async {
        let mp = mps.get_opt(&mp0).await.unwrap()?;
        mp.metadata.deletion_timestamp.map(|_| ())
    })
    .await;
    edit_finalizers(&mps, &mp0, |f| f.retain(|x| x != HOLD)).await;
    e.mountpod_gone(&vol, &n0).await;
    // A fast detach writes the Volume status once, when it is done: no status in
    // between says node 0 is detaching, unless the detach was slow here (then it
    // has its Detaching Event).
    let seen = eventually(WAIT, "the Volume status without node 0", || async {
        let seen = seen.lock().unwrap().clone();
        seen.iter()
            .any(|s| !s.mounted_nodes.contains(&n0))
            .then_some(seen)
    })
    .await;
    watching.abort();
    let between: Vec<&VolumeStatus> = seen
        .iter()
        .filter(|s| s.mounted_nodes.contains(&n0) && !s.attached_nodes.contains(&n0))
        .collect();
    let slow = notes_of("Volume", "Detaching")
        .await
        .iter()
        .any(|n| n.0.starts_with(&format!("detaching from node {n0}")));
    println!(
        "Volume status writes during a detach: {} ({} saying it detaches; slow: {slow})",
        seen.len(),
        between.len()
    );
    assert!(
        between.is_empty() || slow,
        "a fast detach wrote the Volume status before it was done: {between:?}"
    );
    // The slow detach (node 1) has one Detaching Event, once.
    fixtures::remove_ticket(&e.client, &vol, "manual-b").await;
    let detaching = eventually(WAIT, "node 1's Detaching Event", || async {
        let notes = notes_of("Volume", "Detaching").await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    // The slow detach says so on the Volume too.
    let (_, reason, message) = eventually(WAIT, "the Volume says it detaches", || async {
        let v = volumes.get(&vol).await.unwrap();
        ready_condition(&serde_json::to_value(v.status?).unwrap()).filter(|r| r.1 == "Detaching")
    })
    .await;
    assert_eq!(
        (reason.as_str(), message.as_str()),
        ("Detaching", format!("detaching from {n1}").as_str())
    );
    // Another reconcile while the mount still has not ended: no repeat.
    let touch = json!({"metadata": {"labels": {"tessera-test-touch": "1"}}});
    vas.patch(&vol, &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    edit_finalizers(&mps, &mp1, |f| f.retain(|x| x != HOLD)).await;
    e.mountpod_gone(&vol, &n1).await;
    assert_eq!(detaching.len(), 1, "{detaching:?}");
    assert!(
        detaching[0]
            .0
            .starts_with(&format!("detaching from node {}", e.nodes[1])),
        "{detaching:?}"
    );
    let again = notes_of("Volume", "Detaching").await;
    assert_eq!(again, detaching, "reported once, only the slow detach");
    let notes = eventually(WAIT, "Detached Events", || async {
        let notes = notes_of("Volume", "Detached").await;
        (notes.len() >= 2).then_some(notes)
    })
    .await;
    assert_eq!(notes.len(), 2, "{notes:?}");
    for (note, node) in notes.iter().zip(&e.nodes) {
        assert!(
            note.0.starts_with(&format!("detached from node {node}")),
            "{notes:?}"
        );
    }
    e.cleanup(&[vol]).await;
}
