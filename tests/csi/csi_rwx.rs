//! One ReadWriteMany volume published to many nodes at once, at the CSI socket of the
//! running `tessera controller` (issue 15, item 3): as the external-attacher sends
//! them, K ControllerPublish calls of one volume to K nodes arrive together. Every one
//! succeeds (none is turned away with ABORTED because another node's publish of the
//! volume is in flight), and their K tickets reach the VolumeAttachment in fewer than
//! K writes (grouped per volume), and they wait on one shared watch of the
//! VolumeAttachment, not one each. The same for K ControllerUnpublish calls, which
//! also read the VolumeAttachment from the copy in hand, not one read each. The
//! stand-in agent reports the MountPods Ready; the writes are counted by the
//! controller's own request counter (`tessera_api_requests_total`).
//!
//! And a volume whose VolumeAttachment holds `MAX_TICKETS` tickets: a publish to one
//! node more answers RESOURCE_EXHAUSTED naming the cap and writes nothing, its
//! unpublish reads nothing, and it succeeds once a ticket is gone, as the
//! csi-attacher's retry would.

use std::time::Duration;

use futures::future::join_all;
use kube::Api;
use kube::api::{Patch, PatchParams};

use tessera_api::{MAX_TICKETS, VolumeAttachment};
use tessera_csi_proto::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use tessera_csi_proto::*;

use crate::support;
use support::csi::{publish, unpublish};
use support::env::CsiEnv;
use support::fixtures::{self, ControllerProcess};

/// Nodes publishing at once.
const K: usize = 12;

/// Requests of `verb` on VolumeAttachments (not their status) the controller process
/// sent: PATCHes are ticket writes; GETs are reads and watches (a watch counts as one
/// GET).
fn va_requests(ctrl: &ControllerProcess, verb: &str) -> f64 {
    support::api_requests(&ctrl.metrics().unwrap_or_default())
        .iter()
        .filter(|(l, _)| {
            l["verb"] == verb && l["resource"] == "volumeattachments" && l["subresource"].is_empty()
        })
        .map(|(_, v)| v)
        .sum()
}

/// PATCHes of VolumeAttachments (not their status) the controller process sent.
fn ticket_patches(ctrl: &ControllerProcess) -> f64 {
    va_requests(ctrl, "PATCH")
}

fn rwx() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::MultiNodeMultiWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// A running `tessera controller` and a client of its CSI socket, the stand-in agent,
/// `n` Nodes and one ReadWriteMany Volume whose VolumeAttachment has its first status.
struct Setup {
    env: CsiEnv,
    volume: String,
    vas: Api<VolumeAttachment>,
}

impl Setup {
    async fn start(prefix: &str, n: usize) -> Setup {
        let env = CsiEnv::builder(prefix, n, Duration::from_secs(60))
            .fake_agent()
            .start()
            .await;
        let volume = format!("{}-v", env.id);
        fixtures::create_volume(
            &env.client,
            &fixtures::volume(&volume, &env.id, "ReadWriteMany"),
            env.wait,
        )
        .await;
        let vas: Api<VolumeAttachment> = Api::all(env.client.clone());
        // The controller has written the empty VolumeAttachment's first status.
        fixtures::eventually(env.wait, "first status", || async {
            vas.get(&volume).await.ok()?.status.map(|_| ())
        })
        .await;
        Setup { env, volume, vas }
    }

    /// ControllerPublish of the volume to `node`, as the csi-attacher sends it.
    async fn publish(
        &self,
        node: &str,
    ) -> Result<tonic::Response<ControllerPublishVolumeResponse>, tonic::Status> {
        let mut req = publish(&self.volume, node);
        req.volume_capability = Some(rwx());
        self.env.csi().controller_publish_volume(req).await
    }

    /// ControllerUnpublish of the volume from `node`.
    async fn unpublish(
        &self,
        node: &str,
    ) -> Result<tonic::Response<ControllerUnpublishVolumeResponse>, tonic::Status> {
        let req = unpublish(&self.volume, node);
        self.env.csi().controller_unpublish_volume(req).await
    }

    async fn stop(self) {
        self.env.cleanup(std::slice::from_ref(&self.volume)).await;
    }
}

#[tokio::test]
async fn concurrent_publishes_of_one_rwx_volume_all_succeed_in_fewer_writes() {
    let setup = Setup::start("csirwx", K).await;
    let Setup { env, volume, vas } = &setup;
    let (client, ctrl, nodes) = (&env.client, &env.ctrl, &env.nodes);

    let before = ticket_patches(ctrl);
    let gets_before = va_requests(ctrl, "GET");
    let published = join_all(nodes.iter().map(|node| setup.publish(node))).await;
    let writes = ticket_patches(ctrl) - before;
    let gets = va_requests(ctrl, "GET") - gets_before;
    let failed: Vec<String> = published
        .iter()
        .zip(nodes)
        .filter_map(|(r, n)| r.as_ref().err().map(|e| format!("{n}: {e:?}")))
        .collect();
    println!(
        "{K} concurrent publishes: {} failed, {writes} ticket writes, {gets} reads and watches",
        failed.len()
    );
    assert!(failed.is_empty(), "publishes failed: {failed:#?}");
    let va = vas.get(volume).await.unwrap();
    for node in nodes {
        // Granted is what a publish returns on (its mount may still be starting).
        assert!(
            fixtures::publish_granted(client, &va, node).await,
            "ticket of {node} not granted"
        );
    }
    assert!(
        writes >= 1.0 && writes < K as f64,
        "{writes} ticket writes for {K} publishes: not grouped"
    );
    // Each publish reads the VolumeAttachment once; they wait on one shared watch, not
    // one watch each (that would be 2K).
    assert!(
        gets < (2 * K) as f64,
        "{gets} reads and watches of the VolumeAttachment for {K} publishes: a watch each"
    );

    // And back: K unpublishes at once, all succeed, fewer than K writes, no ticket left,
    // and the VolumeAttachment is not read by each (its tickets are in the copy in hand:
    // K reads of an object that grows with K would be O(K²) for the API server).
    let before = ticket_patches(ctrl);
    let gets_before = va_requests(ctrl, "GET");
    let unpublished = join_all(nodes.iter().map(|node| setup.unpublish(node))).await;
    let writes = ticket_patches(ctrl) - before;
    let gets = va_requests(ctrl, "GET") - gets_before;
    let failed: Vec<String> = unpublished
        .iter()
        .zip(nodes)
        .filter_map(|(r, n)| r.as_ref().err().map(|e| format!("{n}: {e:?}")))
        .collect();
    println!(
        "{K} concurrent unpublishes: {} failed, {writes} ticket writes, {gets} reads and watches",
        failed.len()
    );
    assert!(failed.is_empty(), "unpublishes failed: {failed:#?}");
    let va = vas.get(volume).await.unwrap();
    assert!(
        va.spec.attachment_tickets.is_empty(),
        "tickets left: {:?}",
        va.spec.attachment_tickets.keys()
    );
    assert!(
        writes >= 1.0 && writes < K as f64,
        "{writes} ticket writes for {K} unpublishes: not grouped"
    );
    // The waits for the MountPods' removal share one watch of the VolumeAttachment
    // (it may start again once a wait ends); no unpublish reads it.
    assert!(
        gets < (K / 2) as f64,
        "{gets} reads and watches of the VolumeAttachment for {K} unpublishes: a read each"
    );

    setup.stop().await;
}

#[tokio::test]
async fn a_publish_past_the_most_tickets_is_refused_until_one_lets_go() {
    let setup = Setup::start("csicap", 2).await;
    let Setup { env, volume, vas } = &setup;
    let (client, ctrl, nodes) = (&env.client, &env.ctrl, &env.nodes);
    // As many tickets as one VolumeAttachment holds, all wanting the first node (as
    // a GitOps tool's would).
    let tickets: serde_json::Map<String, serde_json::Value> = (0..MAX_TICKETS)
        .map(|i| {
            let t = format!("manual-{i:04}");
            let body = serde_json::json!({"id": t, "type": "manual", "nodeID": nodes[0]});
            (t, body)
        })
        .collect();
    vas.patch(
        volume,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"attachmentTickets": tickets}})),
    )
    .await
    .expect("MAX_TICKETS tickets fit");
    let publish = || setup.publish(&nodes[1]);
    let refused = publish().await.expect_err("a ticket past the cap");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused
            .message()
            .contains(&format!("holds {MAX_TICKETS} attachment tickets")),
        "the message does not name the cap: {}",
        refused.message()
    );
    let va = vas.get(volume).await.unwrap();
    let ticket = tessera_csi::csi_ticket_id(volume, &nodes[1]);
    assert!(!va.spec.attachment_tickets.contains_key(&ticket));
    assert_eq!(va.spec.attachment_tickets.len(), MAX_TICKETS);

    // Its unpublish (the Pod gone) does not read the VolumeAttachment: the ticket
    // refused is not there (each such read is of an object of MAX_TICKETS tickets,
    // for every node refused).
    let reads_before = va_requests(ctrl, "GET");
    setup
        .unpublish(&nodes[1])
        .await
        .expect("unpublishing a node refused at the cap");
    // At most the shared feed's watch, which waits in case a ticket comes to want the
    // node meanwhile (the client's counter counts a watch as a GET); no read.
    let reads = va_requests(ctrl, "GET") - reads_before;
    assert!(
        reads <= 1.0,
        "the unpublish of a refused node read the VolumeAttachment: {reads} GETs and watches"
    );
    let refused = publish().await.expect_err("still at the cap");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );

    // One ticket lets go: the publish, retried, is granted.
    vas.patch(
        volume,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"attachmentTickets": {"manual-0000": null}}})),
    )
    .await
    .unwrap();
    fixtures::eventually(Duration::from_secs(60), "the publish granted", || async {
        match publish().await {
            Ok(_) => Some(()),
            Err(e) if e.code() == tonic::Code::ResourceExhausted => None,
            Err(e) => panic!("publish after a ticket let go: {e:?}"),
        }
    })
    .await;
    let va = vas.get(volume).await.unwrap();
    assert!(fixtures::publish_granted(client, &va, &nodes[1]).await);

    setup.stop().await;
}
