//! A StorageClass with no parameters, as a default install serves it (issue 30): the
//! real controller, whose default root is declared NodeLocal, answers CreateVolume
//! with a NodeLocal Volume on the node the provisioner names (WaitForFirstConsumer's
//! selected node, sent as the preferred topology) and returns that node as the
//! volume's accessible topology, so the PersistentVolume's node affinity keeps every
//! Pod of the claim there. A `scope: Shared` on that root is refused, naming the
//! parameter.

use std::time::Duration;

use kube::api::Api;
use tonic::Code;

use tessera_api::{BackendScope, TOPOLOGY_NODE_KEY, Volume};
use tessera_csi_proto::{DeleteVolumeRequest, Topology, TopologyRequirement};

use crate::support;
use support::env::{CsiEnv, Env};
use support::fixtures;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_storageclass_without_parameters_gives_a_node_local_volume_with_its_topology() {
    let base = Env::new("csiscope", 1, WAIT).await;
    let (client, id, node) = (base.client.clone(), base.id.clone(), base.nodes[0].clone());
    // A root outside the fixtures' own (whose first match would decide the scope).
    let root = format!("/var/lib/tessera/local-{id}");
    let env = CsiEnv::on(base)
        .args(&[
            &format!("--default-backend-root={root}"),
            &format!("--allowed-backend-root={root}=NodeLocal"),
        ])
        .start()
        .await;
    let mut ctrl = env.csi();
    let on_node = Topology {
        segments: [(TOPOLOGY_NODE_KEY.to_string(), node.clone())].into(),
    };

    // No parameters; the provisioner's topology (WaitForFirstConsumer: the selected
    // node preferred, every node requisite).
    let mut req = support::csi::create(&format!("{id}-plain"), 1 << 20, None);
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![on_node.clone()],
        preferred: vec![on_node.clone()],
    });
    let made = ctrl
        .create_volume(req)
        .await
        .expect("created")
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(made.accessible_topology, vec![on_node.clone()]);
    let v = Api::<Volume>::all(client.clone())
        .get(&made.volume_id)
        .await
        .unwrap();
    assert_eq!(v.spec.backend.root, root);
    assert_eq!(v.spec.backend.scope, BackendScope::NodeLocal);
    assert_eq!(v.spec.backend.node.as_deref(), Some(node.as_str()));

    // `scope: Shared` on that root: its data would stay behind. Refused, naming it.
    let mut shared = support::csi::create(&format!("{id}-shared"), 1 << 20, None);
    shared.parameters = [("scope".to_string(), "Shared".to_string())].into();
    let err = ctrl.create_volume(shared).await.unwrap_err();
    println!("scope Shared: {}", err.message());
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("parameter scope") && err.message().contains("NodeLocal"),
        "{}",
        err.message()
    );
    assert!(
        Api::<Volume>::all(client.clone())
            .get_opt(&format!("{id}-shared"))
            .await
            .unwrap()
            .is_none()
    );

    ctrl.delete_volume(DeleteVolumeRequest {
        volume_id: made.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // Never attached: no data to remove; the Volume goes once its cleanup is done or
    // abandoned. Abandon it so nothing waits for an agent.
    let _ = Api::<Volume>::all(client.clone())
        .patch(
            &made.volume_id,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {"tessera.io/abandon-data": "true"}}})),
        )
        .await;
    fixtures::eventually(WAIT, "the Volume gone", || async {
        Api::<Volume>::all(client.clone())
            .get_opt(&made.volume_id)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}
