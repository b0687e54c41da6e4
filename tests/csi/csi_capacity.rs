//! GetCapacity as the external-provisioner asks it for each node's topology segment
//! (issue 30, capacity tracking): the real controller answers from the free space the
//! nodes' agents report on their liveness Leases, per root; a node without the root,
//! or whose Lease is not renewed, has none; no segment: the most any node has. The
//! Leases here are written as an agent writes them (`next_lease`), in a namespace of
//! the test's own, which the controller is told is Tessera's.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use tonic::Code;
use tonic::transport::Channel;

use tessera_api::TOPOLOGY_NODE_KEY;
use tessera_csi_proto::controller_client::ControllerClient;
use tessera_csi_proto::{GetCapacityRequest, Topology};
use tessera_node::liveness::next_lease;

use crate::support;
use support::env::{CsiEnv, Env};

const WAIT: Duration = Duration::from_secs(30);

fn on(node: &str) -> Option<Topology> {
    Some(Topology {
        segments: [(TOPOLOGY_NODE_KEY.to_string(), node.to_string())].into(),
    })
}

async fn ask(
    ctrl: &mut ControllerClient<Channel>,
    root: Option<&str>,
    segment: Option<Topology>,
) -> Result<i64, tonic::Status> {
    let parameters = root
        .map(|r| [("backendRoot".to_string(), r.to_string())].into())
        .unwrap_or_default();
    ctrl.get_capacity(GetCapacityRequest {
        parameters,
        accessible_topology: segment,
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().available_capacity)
}

#[tokio::test]
async fn get_capacity_is_the_free_space_each_node_reports_for_the_classs_root() {
    let base = Env::new("csicap", 0, WAIT).await;
    let (client, id) = (base.client.clone(), base.id.clone());
    let ns = Api::<Namespace>::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(id.clone());
    ns.create(&PostParams::default(), &namespace).await.unwrap();
    let local = format!("/var/lib/tessera/local-{id}");
    let shared = format!("/mnt/shared-{id}");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &id);
    let report = |node: &str, free: &[(&str, u64)]| {
        let free: BTreeMap<String, u64> = free.iter().map(|(r, b)| (r.to_string(), *b)).collect();
        next_lease(
            None,
            node,
            Duration::from_secs(20),
            jiff::Timestamp::now(),
            &free,
        )
        .1
    };
    let (a, b) = (format!("{id}-a"), format!("{id}-b"));
    for lease in [
        report(&a, &[(&local, 10 << 30), (&shared, 500 << 30)]),
        report(&b, &[(&local, 30 << 30)]),
    ] {
        leases.create(&PostParams::default(), &lease).await.unwrap();
    }

    let env = CsiEnv::on(base)
        .args(&[
            &format!("--namespace={id}"),
            &format!("--default-backend-root={local}"),
            &format!("--allowed-backend-root={local}=NodeLocal"),
            &format!("--allowed-backend-root={shared}=Shared"),
        ])
        .start()
        .await;
    let mut ctrl = env.csi();
    let table = [
        (None, on(&a), 10 << 30),
        (None, on(&b), 30 << 30),
        (Some(shared.as_str()), on(&a), 500 << 30),
        (Some(shared.as_str()), on(&b), 0), // b does not have the shared root
        (None, on(&format!("{id}-nowhere")), 0),
        (None, None, 30 << 30), // no segment: the most a node has
        (Some(shared.as_str()), None, 500 << 30),
    ];
    for (root, segment, want) in table {
        let got = ask(&mut ctrl, root, segment.clone())
            .await
            .expect("answered");
        println!("root {root:?} on {segment:?}: {got}");
        assert_eq!(got, want, "root {root:?} on {segment:?}");
    }
    // A root not allowed is an error, not a capacity.
    let err = ask(&mut ctrl, Some("/etc"), on(&a)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());

    // A node whose agent reports more free space: the next answer says so.
    let mut renewed = leases.get(&format!("tessera-node-{a}")).await.unwrap();
    let fresh = report(&a, &[(&local, 12 << 30)]);
    renewed.metadata.annotations = fresh.metadata.annotations;
    leases
        .replace(
            &renewed.metadata.name.clone().unwrap(),
            &PostParams::default(),
            &renewed,
        )
        .await
        .unwrap();
    support::fixtures::eventually(WAIT, "the renewed report answered", || {
        let (mut c, segment) = (ctrl.clone(), on(&a));
        async move { (ask(&mut c, None, segment).await.ok()? == 12 << 30).then_some(()) }
    })
    .await;

    ns.delete(&id, &DeleteParams::default()).await.unwrap();
}
