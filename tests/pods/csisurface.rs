//! The CSI surface on real Pods (issue 19): ReadWriteOncePod end to end, and the
//! idle-mount delay.
//!
//! ```text
//!  RWOP claim ─▶ CreateVolume(SINGLE_NODE_SINGLE_WRITER) ─▶ Volume ReadWriteOncePod
//!  Pod A (scheduler) Running; Pod B (scheduler) Pending: the scheduler's reason
//!  NodePublish of a second target on A's node plugin (kubelet bypassed) ─▶ FAILED_PRECONDITION
//!  A deleted ─▶ B scheduled and Running
//!
//!  idle claim (StorageClass idleMountDelay) ─▶ Pod on A, deleted ─▶ idle-mount ticket,
//!  the MountPod stays ─▶ Pod again on A: same MountPod, daemon, mount ─▶ deleted ─▶
//!  Pod on B: the idle mount on A yields at once ─▶ deleted ─▶ after the delay: gone
//! ```

use tonic::transport::Endpoint;

use tessera_api::{self as api, AccessMode, AttacherType, MountPod, VolumeAttachment as Tickets};
use tessera_csi_proto::node_client::NodeClient;
use tessera_csi_proto::volume_capability::{
    AccessMode as CsiAccessMode, AccessType, MountVolume, access_mode,
};
use tessera_csi_proto::{NodePublishVolumeRequest, VolumeCapability};

use super::*;

/// A busybox Pod that the scheduler places (no nodeName), running `script` with the
/// claim at /data.
async fn scheduled_pod(client: &Client, ns: &str, name: &str, claim: &str, script: &str) {
    app_pod(client, ns, name, None, BUSYBOX, script, claim_volume(claim)).await;
}

/// The PodScheduled condition of a Pod: (status, reason, message).
async fn pod_scheduled(client: &Client, ns: &str, name: &str) -> Option<(String, String, String)> {
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??;
    let c = pod
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")?;
    Some((
        c.status,
        c.reason.unwrap_or_default(),
        c.message.unwrap_or_default(),
    ))
}

/// The node plugin of `node`, through its socket in the node's kubelet directory.
async fn node_plugin(nodes: &Nodes, node: &str) -> NodeClient<tonic::transport::Channel> {
    let sock = nodes
        .kubelet_dir(node)
        .join("plugins")
        .join(api::CSI_DRIVER_NAME)
        .join("csi.sock");
    let channel = Endpoint::from_shared(format!("unix://{}", sock.display()))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", sock.display()));
    NodeClient::new(channel)
}

/// ReadWriteOncePod end to end: the provisioner hands the mode over as
/// SINGLE_NODE_SINGLE_WRITER (the Volume says ReadWriteOncePod, not ReadWriteOnce);
/// the scheduler keeps a second Pod Pending and says why; the node plugin refuses a
/// second target even when the kubelet is bypassed; the second Pod runs once the first
/// is gone.
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_readwriteoncepod_claim_serves_one_pod_at_a_time() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-rwop", "solo", "ReadWriteOncePod").await;
    assert_eq!(
        volume.spec.access_mode,
        AccessMode::ReadWriteOncePod,
        "the provisioner asked for SINGLE_NODE_SINGLE_WRITER (the driver offers SINGLE_NODE_MULTI_WRITER)"
    );

    scheduled_pod(
        &client,
        &ns,
        "first",
        "solo",
        "echo first > /data/who && exec sleep 3600",
    )
    .await;
    wait_phase(&client, &ns, "first", "Running").await;
    let node = node_of(&client, &ns, "first").await;

    scheduled_pod(
        &client,
        &ns,
        "second",
        "solo",
        "echo second > /data/who && exec sleep 3600",
    )
    .await;
    let (reason, message) = eventually(WAIT, "the second Pod unschedulable", || async {
        match pod_scheduled(&client, &ns, "second").await {
            Some((s, reason, message)) if s == "False" => Some((reason, message)),
            _ => None,
        }
    })
    .await;
    assert_eq!(reason, "Unschedulable", "{message}");
    assert!(message.contains("ReadWriteOncePod"), "{message}");
    assert_eq!(
        pod_phase(&client, &ns, "second").await.as_deref(),
        Some("Pending")
    );

    // The kubelet bypassed: the node plugin itself refuses a second target, for the
    // mode Kubernetes sends for RWOP and for the one an older CO would send.
    let mut plugin = node_plugin(&nodes, &node).await;
    let handle = volume.name_any();
    let ghost = "00000000-0000-0000-0000-00000000b0b0";
    let target = format!("/var/lib/kubelet/pods/{ghost}/volumes/kubernetes.io~csi/{pv}/mount");
    for mode in [
        access_mode::Mode::SingleNodeSingleWriter,
        access_mode::Mode::SingleNodeWriter,
    ] {
        let err = plugin
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: handle.clone(),
                target_path: target.clone(),
                volume_capability: Some(VolumeCapability {
                    access_mode: Some(CsiAccessMode { mode: mode as i32 }),
                    access_type: Some(AccessType::Mount(MountVolume::default())),
                }),
                ..Default::default()
            })
            .await
            .expect_err("a second target of a ReadWriteOncePod volume must be refused");
        assert_eq!(
            err.code(),
            tonic::Code::FailedPrecondition,
            "{mode:?}: {err}"
        );
        assert!(err.message().contains("ReadWriteOncePod"), "{err}");
    }
    assert!(
        !nodes.kubelet_dir(&node).join("pods").join(ghost).exists(),
        "nothing was created for the refused target"
    );
    let mp: MountPod = Api::all(client.clone())
        .get(&api::mountpod_name(&handle, &node))
        .await
        .unwrap();
    assert_eq!(mp.spec.references.len(), 1, "{:?}", mp.spec.references);

    // The first Pod goes: the second is scheduled and runs.
    delete_pod(&client, &ns, "first").await;
    wait_phase(&client, &ns, "second", "Running").await;
    eventually(WAIT, "the second Pod's write", || async {
        std::fs::read_to_string(data.join("who"))
            .ok()
            .filter(|s| s.trim() == "second")
    })
    .await;
    delete_pod(&client, &ns, "second").await;
    delete_claim(&client, &ns, "solo", &pv, &handle, &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES rwop: second Pod {reason}: {message}; a second NodePublish refused FAILED_PRECONDITION"
    );
}

/// The idle-mount delay of the test's StorageClass.
const IDLE_DELAY: Duration = Duration::from_secs(40);

/// The tickets of a volume: (type, node, satisfied).
async fn tickets(client: &Client, volume: &str) -> Vec<(AttacherType, String, bool)> {
    let Some(va) = Api::<Tickets>::all(client.clone())
        .get_opt(volume)
        .await
        .unwrap()
    else {
        return vec![];
    };
    va.spec
        .attachment_tickets
        .values()
        .map(|t| (t.type_, t.node_id.clone(), va.ticket_satisfied(&t.id)))
        .collect()
}

/// What says "the same mount": the MountPod's uid, the daemon's pid, and the mount's
/// id in the node's mount table (a new mount gets a new id).
#[derive(Debug, PartialEq, Eq)]
struct MountIdentity {
    uid: String,
    pid: i64,
    mount_id: String,
}

async fn mount_identity(
    client: &Client,
    nodes: &Nodes,
    volume: &str,
    node: &str,
) -> Option<MountIdentity> {
    let mp: MountPod = Api::all(client.clone())
        .get_opt(&api::mountpod_name(volume, node))
        .await
        .unwrap()?;
    let status = mp.status.clone()?;
    let mount_point = status.mount_point?;
    let mountinfo =
        std::fs::read_to_string(format!("/proc/{}/mountinfo", nodes.kubelet_pid(node))).ok()?;
    let mount_id = mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(mount_point.as_str()))
        .filter_map(|l| l.split(' ').next().map(str::to_string))
        .next_back()?;
    Some(MountIdentity {
        uid: mp.uid()?,
        pid: status.pid?,
        mount_id,
    })
}

/// A Job run twice within the idle delay finds the same mount; a workload on another
/// node does not wait for the delay; after the delay the mount and the ticket are gone.
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn an_idle_mount_is_kept_for_the_delay_and_reused() {
    let client = support::client().await;
    let nodes = Nodes::load();
    let names = nodes.names();
    assert!(names.len() >= 2, "two nodes needed: {names:?}");
    let (a, b) = (&names[0], &names[1]);
    let ns = namespace(&client, "pods-idle").await;
    let ClassClaim { class, pv, volume } = class_claim(
        &client,
        &ns,
        "tessera-idle",
        json!({"idleMountDelay": format!("{}s", IDLE_DELAY.as_secs())}),
        "warm",
        None,
    )
    .await;
    let name = volume.name_any();
    assert_eq!(
        volume.spec.idle_mount_delay_seconds,
        Some(IDLE_DELAY.as_secs() as i64)
    );
    let data = backend_dir(&nodes, &volume);

    // Run 1 on A; the Pod goes, the mount stays under an idle-mount ticket.
    let job = "echo run >> /data/runs";
    pod(&client, &ns, "run-1", a, "warm", job).await;
    wait_phase(&client, &ns, "run-1", "Succeeded").await;
    let first = mount_identity(&client, &nodes, &name, a)
        .await
        .expect("the mount of run 1");
    delete_pod(&client, &ns, "run-1").await;
    let idle_since = Instant::now();
    eventually(
        DETACH_BOUND,
        "the storage VolumeAttachment gone",
        || async { attachments(&client, &pv).await.is_empty().then_some(()) },
    )
    .await;
    eventually(WAIT, "the idle-mount ticket on A, satisfied", || async {
        (tickets(&client, &name).await == [(AttacherType::IdleMount, a.clone(), true)])
            .then_some(())
    })
    .await;
    let mp: MountPod = Api::all(client.clone())
        .get(&api::mountpod_name(&name, a))
        .await
        .unwrap();
    assert!(mp.spec.references.is_empty(), "{:?}", mp.spec.references);
    assert_eq!(
        mount_identity(&client, &nodes, &name, a).await.as_ref(),
        Some(&first),
        "the idle mount stays"
    );

    // Run 2 on A within the delay: the same MountPod, daemon and mount.
    pod(&client, &ns, "run-2", a, "warm", job).await;
    wait_phase(&client, &ns, "run-2", "Succeeded").await;
    let reuse = idle_since.elapsed();
    assert!(reuse < IDLE_DELAY, "run 2 came after the delay: {reuse:?}");
    assert_eq!(
        mount_identity(&client, &nodes, &name, a).await.as_ref(),
        Some(&first),
        "run 2 found the same mount"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("runs")).unwrap(),
        "run\nrun\n"
    );
    delete_pod(&client, &ns, "run-2").await;
    eventually(WAIT, "the idle-mount ticket on A again", || async {
        (tickets(&client, &name).await == [(AttacherType::IdleMount, a.clone(), true)])
            .then_some(())
    })
    .await;

    // A workload on B: the idle mount on A yields at once (no waiting for the delay).
    let moved = Instant::now();
    pod(&client, &ns, "run-b", b, "warm", job).await;
    wait_phase(&client, &ns, "run-b", "Succeeded").await;
    let move_time = moved.elapsed();
    assert!(
        move_time < IDLE_DELAY,
        "the Pod on B waited for A's idle delay: {move_time:?}"
    );
    assert!(
        mount_identity(&client, &nodes, &name, a).await.is_none(),
        "A's idle mount is gone"
    );
    delete_pod(&client, &ns, "run-b").await;
    eventually(WAIT, "only B's idle-mount ticket left", || async {
        (tickets(&client, &name).await == [(AttacherType::IdleMount, b.clone(), true)])
            .then_some(())
    })
    .await;
    let b_idle = Instant::now();

    // After the delay: the mount and the ticket go.
    eventually(
        IDLE_DELAY + WAIT,
        "the idle mount on B and its ticket gone",
        || async {
            let mp = Api::<MountPod>::all(client.clone())
                .get_opt(&api::mountpod_name(&name, b))
                .await
                .unwrap();
            (mp.is_none() && tickets(&client, &name).await.is_empty()).then_some(())
        },
    )
    .await;
    let kept = b_idle.elapsed();
    assert!(
        kept + Duration::from_secs(5) >= IDLE_DELAY,
        "the idle mount went after {kept:?}, before the delay"
    );

    delete_claim(&client, &ns, "warm", &pv, &name, &data).await;
    delete_class(&client, &class).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES idle mount: run 2 reused the mount (pid {}, mount id {}) {:.1} s into the idle period; a Pod on B ran {:.1} s after it was created; the idle mount went {:.1} s after the last Pod (delay {} s)",
        first.pid,
        first.mount_id,
        reuse.as_secs_f64(),
        move_time.as_secs_f64(),
        kept.as_secs_f64(),
        IDLE_DELAY.as_secs()
    );
}
