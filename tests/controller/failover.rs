//! Fenced failover, the controller's part (docs/failover.md), against the real API
//! server: a node's death is faked by no longer renewing its liveness Lease. A
//! single-writer volume with `nodeFailover: Fenced` gets self-fencing MountPods; its
//! ticket on a node whose Lease renews late but within fenceAfter stays; once the
//! controller has seen no renewal for fenceAfter + margin it marks the Lease fenced and
//! releases the ticket (Event `FailedOver`), and the volume attaches on the other
//! node; a volume without the opt-in keeps its ticket on the dead node.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use tessera_api::{MountPod, VolumeAttachment};

use crate::support;
use support::env::Env;
use support::fixtures::{self, ControllerProcess, FakeAgent, eventually};

pub(super) const WAIT: Duration = Duration::from_secs(30);
/// The agents' fenceAfter (the Leases' duration) and the controller's margin.
const FENCE_AFTER_S: i32 = 2;
pub(super) const MARGIN: &str = "1s";

/// The node takes its Lease back as its agent does when it comes back: the fenced
/// mark cleared, a new transition, renewed.
pub(super) async fn take_back(leases: &Api<Lease>, node: &str) {
    let name = tessera_api::liveness_lease(node);
    let mut l = leases.get(&name).await.unwrap();
    l.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .remove(tessera_api::ANNOTATION_FENCED);
    let spec = l.spec.as_mut().unwrap();
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    leases
        .replace(&name, &PostParams::default(), &l)
        .await
        .unwrap();
    renew(leases, node).await;
}

/// Renew (or create) `node`'s liveness Lease as its agent does.
pub(super) async fn renew(leases: &Api<Lease>, node: &str) {
    let name = tessera_api::liveness_lease(node);
    let now = jiff::Timestamp::now().to_string();
    match leases.get_opt(&name).await.unwrap() {
        None => {
            let l: Lease = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": FENCE_AFTER_S,
                         "leaseTransitions": 0, "renewTime": now},
            }))
            .unwrap();
            leases.create(&PostParams::default(), &l).await.unwrap();
        }
        Some(mut l) => {
            l.spec.as_mut().unwrap().renew_time = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now()),
            );
            leases
                .replace(&name, &PostParams::default(), &l)
                .await
                .unwrap();
        }
    }
}

/// Two nodes, the test's controller (margin [`MARGIN`]), a stand-in agent, and the
/// Leases' API in the controller's namespace.
pub(super) async fn setup(prefix: &str) -> (Env, ControllerProcess, FakeAgent, Api<Lease>) {
    let e = Env::new(prefix, 2, WAIT).await;
    let ctrl = ControllerProcess::alone(&e.id, &[&format!("--fence-margin={MARGIN}")]);
    let agent = FakeAgent::start(e.client.clone(), &e.id);
    // CSINodes list the driver: the controller gives each MountPod the agent's
    // finalizer, which only a live agent lets go of.
    fixtures::create_csinodes(&e.client, &e.id, &e.nodes).await;
    let leases: Api<Lease> = Api::namespaced(e.client.clone(), "default");
    (e, ctrl, agent, leases)
}

/// Renew `node`'s Lease every 500 ms until aborted.
pub(super) fn renewing(leases: &Api<Lease>, node: &str) -> tokio::task::JoinHandle<()> {
    let (leases, node) = (leases.clone(), node.to_owned());
    tokio::spawn(async move {
        loop {
            renew(&leases, &node).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

pub(super) async fn tickets(client: &kube::Client, volume: &str) -> Vec<String> {
    let va = Api::<VolumeAttachment>::all(client.clone())
        .get(volume)
        .await
        .unwrap();
    va.spec.attachment_tickets.keys().cloned().collect()
}

#[tokio::test]
async fn a_dead_nodes_single_writer_ticket_is_released_after_fence_after_and_margin() {
    let (e, _ctrl, agent, leases) = setup("failover").await;
    let (a, b) = (e.nodes[0].clone(), e.nodes[1].clone());
    renew(&leases, &a).await;
    renew(&leases, &b).await;

    let fenced = e.volume_name("fenced");
    let mut v = fixtures::volume(&fenced, &e.id, "ReadWriteOnce");
    v.spec.node_failover = Some(tessera_api::NodeFailover::Fenced);
    e.create_volume(&v).await;
    let off = e.volume("off", "ReadWriteOnce").await;
    for vol in [&fenced, &off] {
        fixtures::put_ticket(&e.client, vol, "manual-a", "manual", &a, json!({})).await;
    }
    for vol in [&fenced, &off] {
        fixtures::wait_satisfied(&e.client, vol, "manual-a").await;
    }
    let mp = |vol: &str| {
        let c = e.client.clone();
        let (vol, a) = (vol.to_owned(), a.clone());
        async move { fixtures::mountpod_on(&c, &vol, &a).await.unwrap() }
    };
    let self_fence = |m: MountPod| m.spec.self_fence;
    assert!(
        self_fence(mp(&fenced).await),
        "an opted-in RWO volume's daemon fences itself"
    );
    assert!(
        !self_fence(mp(&off).await),
        "a volume without the opt-in: no fencing"
    );

    // Flapping: renewals 1.5 s apart, late but within fenceAfter (2 s): nothing moves.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        renew(&leases, &a).await;
        renew(&leases, &b).await;
    }
    assert_eq!(
        tickets(&e.client, &fenced).await,
        vec!["manual-a".to_string()]
    );

    // Node A dies: its Lease is renewed no more (B's still is), its agent does
    // nothing (its MountPods keep their finalizer unless the controller drops it).
    agent.dead.lock().unwrap().push(a.clone());
    let died = Instant::now();
    let b_renews = renewing(&leases, &b);
    eventually(WAIT, "the dead node's ticket released", || async {
        tickets(&e.client, &fenced).await.is_empty().then_some(())
    })
    .await;
    let released = died.elapsed();
    eprintln!(
        "ticket released {released:?} after the last renewal (fenceAfter {FENCE_AFTER_S}s + margin {MARGIN})"
    );
    assert!(
        released >= Duration::from_secs(3),
        "released before fenceAfter + margin: {released:?}"
    );
    let lease = leases.get(&tessera_api::liveness_lease(&a)).await.unwrap();
    assert!(
        lease
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(tessera_api::ANNOTATION_FENCED),
        "the Lease is marked before anything is released"
    );
    assert_eq!(
        tickets(&e.client, &off).await,
        vec!["manual-a".to_string()],
        "without the opt-in the volume stays with the dead node"
    );
    // The volume attaches on B through the ordinary ticket path: the dead node's
    // MountPod, deleted, loses the finalizer its agent will never drop.
    fixtures::put_ticket(&e.client, &fenced, "manual-b", "manual", &b, json!({})).await;
    fixtures::wait_satisfied(&e.client, &fenced, "manual-b").await;
    // B, alive, keeps it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        tickets(&e.client, &fenced).await,
        vec!["manual-b".to_string()]
    );

    b_renews.abort();
    for n in [&a, &b] {
        let _ = leases
            .delete(&tessera_api::liveness_lease(n), &DeleteParams::default())
            .await;
    }
    let _ = Api::<VolumeAttachment>::all(e.client.clone())
        .patch(
            &off,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"attachmentTickets": {"manual-a": null}}})),
        )
        .await;
    e.cleanup(&[fenced, off]).await;
}

/// The leader dies with a node (its replica ran there): the standby, which watched the
/// liveness Leases all along, counts the node's wait from the last renewal it saw, not
/// from its takeover. Found on real nodes: the leader on the powered-off node, the new
/// leader released 41 s after the kill instead of 25 s (fenceAfter + margin).
#[tokio::test]
async fn a_new_leader_counts_the_fence_wait_from_what_it_saw_as_a_standby() {
    let e = Env::new("standby", 2, WAIT).await;
    let (a, b) = (e.nodes[0].clone(), e.nodes[1].clone());
    let lease = format!("tessera-{}", e.id);
    // fenceAfter 2 s + margin 6 s: a wait longer than the takeover (the leadership
    // Lease lasts 4 s), so counting from the takeover shows.
    let margin = Duration::from_secs(6);
    let args = |id: &str| {
        [
            format!("--lease-name={lease}"),
            format!("--identity={id}"),
            "--lease-duration=4s".into(),
            "--lease-renew-interval=1s".into(),
            format!("--fence-margin={}s", margin.as_secs()),
        ]
    };
    let start = |id: &str| {
        let a = args(id);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        ControllerProcess::start(&e.id, &a)
    };
    let (mut one, mut two) = (start("one"), start("two"));
    let agent = FakeAgent::start(e.client.clone(), &e.id);
    fixtures::create_csinodes(&e.client, &e.id, &e.nodes).await;
    let leases: Api<Lease> = Api::namespaced(e.client.clone(), "default");
    let holder = || async {
        leases
            .get_opt(&lease)
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
    };
    let leader = eventually(WAIT, "a leader", || async { holder().await }).await;
    let renews = [renewing(&leases, &a), renewing(&leases, &b)];

    let fenced = e.volume_name("fenced");
    let mut v = fixtures::volume(&fenced, &e.id, "ReadWriteOnce");
    v.spec.node_failover = Some(tessera_api::NodeFailover::Fenced);
    e.create_volume(&v).await;
    fixtures::put_ticket(&e.client, &fenced, "manual-a", "manual", &a, json!({})).await;
    fixtures::wait_satisfied(&e.client, &fenced, "manual-a").await;
    // The standby has watched A renew for longer than the whole wait.
    tokio::time::sleep(Duration::from_secs(3) + margin).await;

    // Node A and the leader die together. The clock starts before A's last renewal,
    // so the wait counted from that renewal cannot end before `died + wait` (the
    // renewer's loop, stopped between renewals, may have renewed up to half a second
    // before any instant taken after it).
    renews[0].abort();
    let died = Instant::now();
    renew(&leases, &a).await;
    agent.dead.lock().unwrap().push(a.clone());
    if leader == "one" {
        one.kill()
    } else {
        two.kill()
    };
    let other = if leader == "one" { "two" } else { "one" };
    eventually(WAIT, "the standby leads", || async {
        holder().await.filter(|h| h == other)
    })
    .await;
    let took_over = died.elapsed();
    eventually(WAIT, "the dead node's ticket released", || async {
        tickets(&e.client, &fenced).await.is_empty().then_some(())
    })
    .await;
    let released = died.elapsed();
    let wait = Duration::from_secs(FENCE_AFTER_S as u64) + margin;
    eprintln!(
        "leader and node died together: the standby led {took_over:?} later, released {released:?} after the last renewal (fenceAfter + margin {wait:?})"
    );
    assert!(released >= wait, "released before the wait: {released:?}");
    // Counted from the takeover, the release would come a wait after it (less the
    // time the test took to see the takeover: a second at most).
    assert!(
        released + Duration::from_secs(1) < took_over + wait,
        "the new leader counted from its takeover ({took_over:?} after the death), not from the last renewal it saw: released {released:?} after the death"
    );

    renews[1].abort();
    for n in [&a, &b] {
        let _ = leases
            .delete(&tessera_api::liveness_lease(n), &DeleteParams::default())
            .await;
    }
    let _ = leases.delete(&lease, &DeleteParams::default()).await;
    e.cleanup(&[fenced]).await;
}

/// The `node.kubernetes.io/out-of-service` taint: the administrator says the node is
/// shut down, so its tickets go at once, whatever the volume's nodeFailover and
/// however fresh its Lease; the Volume says `NodeFailover` `FailedOver` until it is
/// attached on another node.
#[tokio::test]
async fn the_out_of_service_taint_releases_at_once_in_any_mode() {
    let (e, _ctrl, _agent, leases) = setup("failover-oos").await;
    let (a, b) = (e.nodes[0].clone(), e.nodes[1].clone());
    let a_renews = renewing(&leases, &a);
    let off = e.volume("off", "ReadWriteOnce").await;
    e.attach(&off, "manual-a", "manual", &a).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        tickets(&e.client, &off).await,
        vec!["manual-a".to_string()],
        "a live node keeps it"
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(e.client.clone());
    let tainted = Instant::now();
    nodes
        .patch(
            &a,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
                "value": "nodeshutdown", "effect": "NoExecute"}]}}),
            ),
        )
        .await
        .unwrap();
    eventually(WAIT, "the tainted node's ticket released", || async {
        tickets(&e.client, &off).await.is_empty().then_some(())
    })
    .await;
    let released = tainted.elapsed();
    eprintln!("out-of-service taint: ticket released {released:?} after the taint");
    assert!(
        released < Duration::from_secs(3),
        "the taint is honoured at once, not after fenceAfter + margin: {released:?}"
    );
    // The Volume says so (docs/failover.md, "What it says in status") until it is
    // attached elsewhere.
    let failover = || async {
        let v = Api::<tessera_api::Volume>::all(e.client.clone())
            .get(&off)
            .await
            .unwrap();
        v.status.and_then(|s| {
            s.conditions
                .into_iter()
                .find(|c| c.type_ == tessera_api::CONDITION_NODE_FAILOVER)
        })
    };
    let c = eventually(WAIT, "NodeFailover on the Volume", || async {
        failover().await
    })
    .await;
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "FailedOver")
    );
    assert!(c.message.contains("out-of-service"), "{}", c.message);
    e.attach(&off, "manual-b", "manual", &b).await;
    eventually(WAIT, "NodeFailover cleared once attached on B", || async {
        failover().await.is_none().then_some(())
    })
    .await;

    a_renews.abort();
    let _ = leases
        .delete(&tessera_api::liveness_lease(&a), &DeleteParams::default())
        .await;
    e.cleanup(&[off]).await;
}
