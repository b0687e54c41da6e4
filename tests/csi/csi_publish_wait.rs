//! ControllerPublish returns once the ticket is granted, before the FUSE daemon has
//! started, and NodePublish waits for the mount (docs/csi.md, "The attach flow"), at
//! the CSI sockets of a running `tessera controller` and `tessera node`:
//! - with the stand-in agent keeping a node's mount Starting, ControllerPublish
//!   returns: the ticket granted and not satisfied, its MountPod there and not Ready.
//!   A ReadWriteOnce publish to a second node meanwhile is refused (HeldByOtherNode)
//!   and gets no MountPod: a grant holds the volume as a satisfaction does;
//! - a NodePublish sent before the volume is published waits, and returns once the
//!   publish has led to a Ready mount (real agent, real FUSE daemon);
//! - a NodePublish whose mount never comes fails UNAVAILABLE after the agent's
//!   `--publish-mount-timeout`, saying where the mount stands; one whose mount failed
//!   fails FAILED_PRECONDITION at once with the mount's error.

use std::time::{Duration, Instant};

use kube::Api;
use tonic::Code;

use tessera_api::{MountPod, VolumeAttachment, mountpod_name};
use tessera_csi::csi_ticket_id;
use tessera_csi_proto::*;

use crate::support;
use support::csi::{node_publish, publish, unpublish};
use support::env::CsiEnv;
use support::fixtures;

#[tokio::test]
async fn controller_publish_returns_once_granted_before_the_mount_is_ready() {
    let env = CsiEnv::builder("csigrant", 2, Duration::from_secs(30))
        .args(&["--publish-timeout=3s"])
        .fake_agent()
        .start()
        .await;
    let (client, id, nodes) = (&env.client, &env.id, &env.nodes);
    // The stand-in agent never reports the first node's mount: it stays Starting.
    env.fake().silent.lock().unwrap().push(nodes[0].clone());
    let volume = format!("{id}-v");
    fixtures::create_volume(
        client,
        &fixtures::volume(&volume, id, "ReadWriteOnce"),
        env.wait,
    )
    .await;
    let mut csi = env.csi();

    let started = Instant::now();
    let r = csi
        .controller_publish_volume(publish(&volume, &nodes[0]))
        .await;
    println!(
        "publish to n0 (mount never Ready): {r:?} after {:?}",
        started.elapsed()
    );
    assert!(r.is_ok(), "granted, its mount still starting: {r:?}");
    let va = Api::<VolumeAttachment>::all(client.clone())
        .get(&volume)
        .await
        .unwrap();
    let ticket = csi_ticket_id(&volume, &nodes[0]);
    assert!(va.spec.attachment_tickets.contains_key(&ticket));
    assert!(!va.ticket_satisfied(&ticket), "{:?}", va.status);
    let mps: Api<MountPod> = Api::all(client.clone());
    let mp = mps
        .get(&mountpod_name(&volume, &nodes[0]))
        .await
        .expect("the MountPod exists when the publish returns");
    assert!(!mp.is_serving(), "not Ready: {:?}", mp.status);

    // The single-writer rule holds on a grant: another node is refused, and gets no
    // MountPod, while n0 holds the volume.
    let r = csi
        .controller_publish_volume(publish(&volume, &nodes[1]))
        .await;
    println!("publish to n1 meanwhile: {r:?}");
    let status = r.expect_err("a second node while n0 holds the volume");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("HeldByOtherNode"),
        "says why: {status:?}"
    );
    assert!(
        mps.get_opt(&mountpod_name(&volume, &nodes[1]))
            .await
            .unwrap()
            .is_none(),
        "no MountPod on n1"
    );
    // n0's publish again: still granted, at once.
    let again = Instant::now();
    let r = csi
        .controller_publish_volume(publish(&volume, &nodes[0]))
        .await;
    assert!(r.is_ok(), "repeated publish: {r:?}");
    assert!(
        again.elapsed() < Duration::from_secs(2),
        "{:?}",
        again.elapsed()
    );
    fixtures::delete_volumes(client, std::slice::from_ref(&volume)).await;
}

#[tokio::test]
async fn node_publish_waits_for_the_mount_and_gives_up_saying_why() {
    let bound = Duration::from_secs(10);
    let env = CsiEnv::builder("csimwait", 1, Duration::from_secs(30))
        .agents(1)
        .agent_args(&[format!("--publish-mount-timeout={}s", bound.as_secs())])
        .start()
        .await;
    let (client, id, node, agent) = (&env.client, &env.id, &env.nodes[0], env.agent());
    // A backend the real agent can mount (the temporary directory is an allowed root).
    let backend = &env.backend;
    let rwo = |name: &str, root: &std::path::Path| {
        fixtures::volume_at(name, id, "ReadWriteOnce", root, false)
    };
    let volume = format!("{id}-v");
    let wait = env.wait;
    fixtures::create_volume(client, &rwo(&volume, backend), wait).await;
    let mut csi = env.csi();
    let mut nodes = env.node(0).await;

    // Sent before the volume is published: it waits for the mount.
    let target = agent
        .kubelet_dir()
        .join("pods/p1/volumes/kubernetes.io~csi/v/mount");
    let waiting = tokio::spawn({
        let mut nodes = nodes.clone();
        let req = node_publish(&volume, &target);
        async move {
            let r = nodes.node_publish_volume(req).await;
            (r, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !waiting.is_finished(),
        "NodePublish answered before any mount"
    );
    let r = csi.controller_publish_volume(publish(&volume, node)).await;
    let published = Instant::now();
    assert!(r.is_ok(), "publish: {r:?}");
    let (r, done) = waiting.await.unwrap();
    println!(
        "NodePublish returned {:?} after the ControllerPublish",
        done.saturating_duration_since(published)
    );
    assert!(r.is_ok(), "NodePublish once the mount is Ready: {r:?}");
    assert!(
        !fixtures::mounts_at(&target).is_empty(),
        "the target is bound"
    );
    let mp = Api::<MountPod>::all(client.clone())
        .get(&mountpod_name(&volume, node))
        .await
        .unwrap();
    assert!(mp.is_serving(), "{:?}", mp.status);
    let r = nodes
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.clone(),
            target_path: target.display().to_string(),
        })
        .await;
    assert!(r.is_ok(), "unpublish: {r:?}");

    // A volume published nowhere: its mount never comes; NodePublish gives up after
    // the bound, saying so, and binds nothing.
    let other = format!("{id}-w");
    fixtures::create_volume(client, &rwo(&other, backend), wait).await;
    let target = agent
        .kubelet_dir()
        .join("pods/p2/volumes/kubernetes.io~csi/w/mount");
    let started = Instant::now();
    let r = nodes
        .node_publish_volume(node_publish(&other, &target))
        .await;
    let took = started.elapsed();
    println!("NodePublish of a mount that never comes: {r:?} after {took:?}");
    let status = r.expect_err("no mount in time");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains(&format!("not ready within {} s", bound.as_secs()))
            && status.message().contains("no MountPod"),
        "says why: {status:?}"
    );
    assert!(
        took >= bound && took < bound + Duration::from_secs(10),
        "bounded: {took:?}"
    );
    assert!(fixtures::mounts_at(&target).is_empty(), "nothing bound");

    // A mount that fails (its backend directory is missing on the node): granted, so
    // ControllerPublish returns; NodePublish says why at once (FAILED_PRECONDITION,
    // the mount's error), without waiting for the bound.
    let broken = format!("{id}-x");
    fixtures::create_volume(client, &rwo(&broken, &backend.join("missing")), wait).await;
    let r = csi.controller_publish_volume(publish(&broken, node)).await;
    assert!(r.is_ok(), "publish of the failing mount: {r:?}");
    let target = agent
        .kubelet_dir()
        .join("pods/p3/volumes/kubernetes.io~csi/x/mount");
    let started = Instant::now();
    let r = nodes
        .node_publish_volume(node_publish(&broken, &target))
        .await;
    let took = started.elapsed();
    println!("NodePublish of a failing mount: {r:?} after {took:?}");
    let status = r.expect_err("a failed mount");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("Failed"), "says why: {status:?}");
    assert!(took < bound, "not waited out: {took:?}");

    for v in [&volume, &broken] {
        let r = csi.controller_unpublish_volume(unpublish(v, node)).await;
        assert!(r.is_ok(), "controller unpublish of {v}: {r:?}");
    }
    fixtures::delete_volumes(client, &[volume, other, broken]).await;
}
