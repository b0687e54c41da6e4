//! ControllerPublish answers from the Controller service's caches (Volumes, Node
//! metadata, VolumeAttachments) instead of reading before its ticket write; these tests
//! hold it to what a quorum read gave, at the CSI socket of the running
//! `tessera controller` (the stand-in agent reports the MountPods Ready):
//! - a Volume and a Node created a moment before the publish (not in the caches yet)
//!   are found: a miss is a read, never NOT_FOUND;
//! - a volume or node the API server does not know is NOT_FOUND;
//! - publish, unpublish, publish again at once: the second publish writes its ticket
//!   again (the unpublish's write is this process's last one, so no copy older than it
//!   answers "satisfied"), and the ticket is in the API server's object;
//! - a ticket another process wrote a moment ago (a leader before a failover) is
//!   removed by an unpublish sent at once, whether or not the caches show it yet;
//! - the publishes read neither Volumes nor Nodes once the caches hold them;
//! - unpublishes wait for their MountPods on the service's one MountPod watch (no GET
//!   or watch of their own), and return only once the MountPod is gone.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tonic::Code;

use tessera_api::{
    AttacherType, AttachmentTicket, MountPod, Volume, VolumeAttachment, mountpod_name,
};
use tessera_csi::csi_ticket_id;

use crate::support;
use support::csi::{publish, unpublish};
use support::env::{CsiEnv, Env};
use support::fixtures::{self, ControllerProcess};

/// GETs of `resource` (not a subresource) the controller process sent (a watch counts
/// as one GET).
fn gets(ctrl: &ControllerProcess, resource: &str) -> f64 {
    support::api_requests(&ctrl.metrics().unwrap_or_default())
        .iter()
        .filter(|(l, _)| {
            l["verb"] == "GET" && l["resource"] == resource && l["subresource"].is_empty()
        })
        .map(|(_, v)| v)
        .sum()
}

/// The code of a reply (`Ok` for a success).
fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
    r.map(|_| Code::Ok).unwrap_or_else(|s| s.code())
}

/// Create the ReadWriteOnce Volume `name` of test `id` (and return once the API
/// server has it, not waiting for the controller).
async fn new_volume(volumes: &Api<Volume>, name: &str, id: &str) {
    let volume = fixtures::volume(name, id, "ReadWriteOnce");
    volumes
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
}

#[tokio::test]
async fn publishes_from_the_caches_answer_as_reads_would() {
    let base = Env::new("csipubc", 1, Duration::from_secs(30)).await;
    let (client, id) = (base.client.clone(), base.id.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let volumes: Api<Volume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    // A Node and a Volume that exist before the controller starts, published as soon
    // as its socket answers: while its caches are still being listed.
    let first = (format!("{id}-first"), base.nodes[0].clone());
    new_volume(&volumes, &first.0, &id).await;
    let env = CsiEnv::on(base).fake_agent().start().await;
    let (ctrl, mut csi) = (&env.ctrl, env.csi());
    let r = csi
        .controller_publish_volume(publish(&first.0, &first.1))
        .await;
    assert!(r.is_ok(), "publish as the controller starts: {r:?}");

    // Unknown to the API server: NOT_FOUND (the caches hold neither, the reads say so).
    let req = publish(&format!("{id}-nosuchvolume"), &first.1);
    let r = csi.controller_publish_volume(req).await;
    assert_eq!(code(r), Code::NotFound, "unknown volume");

    // Created a moment before the publish: a new Node and a new Volume each time, the
    // publish sent as soon as the create calls return (before the caches' watches can
    // have delivered them): every publish succeeds.
    for i in 0..3 {
        let node = format!("{id}-new{i}");
        let volume = format!("{id}-v{i}");
        let body = serde_json::json!({"metadata": {"name": node}});
        let body: Node = serde_json::from_value(body).unwrap();
        nodes.create(&PostParams::default(), &body).await.unwrap();
        new_volume(&volumes, &volume, &id).await;
        let r = csi.controller_publish_volume(publish(&volume, &node)).await;
        assert!(r.is_ok(), "publish right after the creates: {r:?}");
        let req = publish(&volume, &format!("{id}-nosuchnode"));
        let r = csi.controller_publish_volume(req).await;
        assert_eq!(code(r), Code::NotFound, "unknown node");
    }

    // Publish, unpublish, publish again at once: the ticket is written again.
    let volume = format!("{id}-v0");
    let node = format!("{id}-new0");
    let ticket = csi_ticket_id(&volume, &node);
    csi.controller_unpublish_volume(unpublish(&volume, &node))
        .await
        .expect("unpublish");
    let r = csi.controller_publish_volume(publish(&volume, &node)).await;
    assert!(r.is_ok(), "publish after the unpublish: {r:?}");
    let va = vas.get(&volume).await.unwrap();
    // Granted is what a publish returns on (its mount may still be starting).
    assert!(
        va.spec.attachment_tickets.contains_key(&ticket)
            && fixtures::publish_granted(&client, &va, &node).await,
        "the ticket is back and granted in the API server's object"
    );

    // A ticket written a moment ago by another process (the CSI leader before a
    // failover), unpublished at once: the copy in hand may not show it yet, so its
    // absence is asked of the API server, and the ticket goes.
    for i in 0..6 {
        let (volume, node) = (format!("{id}-v{}", i % 3), format!("{id}-other{i}"));
        fixtures::create_nodes(&client, std::slice::from_ref(&node)).await;
        let ticket = AttachmentTicket::new(
            csi_ticket_id(&volume, &node),
            AttacherType::CsiAttacher,
            &node,
        );
        let patch = Patch::Merge(ticket.upsert_patch());
        vas.patch(&volume, &PatchParams::default(), &patch)
            .await
            .unwrap();
        csi.controller_unpublish_volume(unpublish(&volume, &node))
            .await
            .expect("unpublish of another process's ticket");
        let va = vas.get(&volume).await.unwrap();
        assert!(
            !va.spec.attachment_tickets.contains_key(&ticket.id),
            "the other process's ticket {} is left after its unpublish",
            ticket.id
        );
    }

    // Once the caches hold them, publishes read neither the Volume nor the Node.
    let (volume_gets, node_gets) = (gets(ctrl, "volumes"), gets(ctrl, "nodes"));
    for i in 0..3 {
        let req = publish(&format!("{id}-v{i}"), &format!("{id}-new{i}"));
        let r = csi.controller_publish_volume(req).await;
        assert!(r.is_ok(), "a repeated publish: {r:?}");
    }
    let read = (
        gets(ctrl, "volumes") - volume_gets,
        gets(ctrl, "nodes") - node_gets,
    );
    assert_eq!(
        read,
        (0.0, 0.0),
        "Volume and Node GETs of publishes the caches could answer"
    );

    // Unpublishes wait for their MountPods on the service's one MountPod watch: no
    // GET or watch of a MountPod of their own (before, each sent both), and each
    // returns only once its MountPod is gone in the API server.
    let mps: Api<MountPod> = Api::all(client.clone());
    let mp_gets = gets(ctrl, "mountpods");
    for i in 0..3 {
        let (volume, node) = (format!("{id}-v{i}"), format!("{id}-new{i}"));
        let name = mountpod_name(&volume, &node);
        assert!(
            mps.get_opt(&name).await.unwrap().is_some(),
            "the MountPod {name} of a published volume"
        );
        csi.controller_unpublish_volume(unpublish(&volume, &node))
            .await
            .expect("unpublish");
        assert!(
            mps.get_opt(&name).await.unwrap().is_none(),
            "the MountPod {name} is still there after its unpublish returned"
        );
    }
    assert_eq!(
        gets(ctrl, "mountpods") - mp_gets,
        0.0,
        "MountPod GETs and watches of unpublishes the shared watch could answer"
    );
}
