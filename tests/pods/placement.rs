//! Where the scheduler may put a volume's Pods, on the real nodes (issue 30, items 4
//! and 6). The harness declares one more Shared root, `/var/lib/tessera/first-node-only`,
//! that only the first node has (tests/harness/deploy.sh, nodes.sh), as a filesystem
//! mounted on some nodes only.
//!
//! ```text
//!  node plugin registers ─▶ NodeGetInfo: topology.tessera.io/root-…=served per Shared
//!     root the node has ─▶ the kubelet labels the Node
//!  Immediate claim on that root ─▶ PV requires the root's label ─▶ a Pod held to the
//!     other node stays Pending ("didn't match PersistentVolume's node affinity"); unheld: first node
//!  WaitForFirstConsumer ─▶ CSIStorageCapacity per node (the agents' reports): none on
//!     the node without the root, so the scheduler places the claim on the first node;
//!     a claim larger than any node's free space stays Pending ("enough free storage")
//! ```

use k8s_openapi::api::core::v1::{Event, PersistentVolume};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;

use tessera_api::{TOPOLOGY_ROOT_SERVED, root_topology_key};

use super::*;

/// The Shared root only the first node has (tests/harness/deploy.sh's PARTIAL_ROOT).
const PARTIAL_ROOT: &str = "/var/lib/tessera/first-node-only";
/// Tessera's namespace, where the external-provisioner publishes capacity.
const TESSERA_NS: &str = "tessera-system";

/// The first node (the one with the root) and another.
fn first_and_other() -> (String, String) {
    let names = Nodes::load().names();
    assert!(names.len() >= 2, "two nodes: {names:?}");
    (names[0].clone(), names[1].clone())
}

fn class(name: &str, binding: &str) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "provisioner": tessera_api::CSI_DRIVER_NAME,
        "parameters": {"backendRoot": PARTIAL_ROOT, "scope": "Shared"},
        "reclaimPolicy": "Delete",
        "volumeBindingMode": binding,
    }))
    .unwrap()
}

async fn claim(client: &Client, ns: &str, name: &str, class: &str, size: &str) {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": {"requests": {"storage": size}},
        }
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
}

/// A Pod the scheduler places (held to `node` by a nodeSelector, if given) writing
/// its node's name into the claim.
async fn scheduled_pod(client: &Client, ns: &str, name: &str, claim: &str, node: Option<&str>) {
    let mut spec = json!({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "app",
            "image": BUSYBOX,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", "echo here > /data/hello"],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }],
        "volumes": [claim_volume(claim)],
    });
    if let Some(node) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// The scheduler's message on the Pod once it contains `what`.
async fn unschedulable(client: &Client, ns: &str, pod: &str, what: &str) -> String {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let why = eventually(
        WAIT,
        &format!("FailedScheduling ({what}) on {pod}"),
        || async {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
                .await
                .ok()?;
            list.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
                .filter_map(|e| e.message)
                .find(|m| m.contains(what))
        },
    )
    .await;
    assert_eq!(
        pod_phase(client, ns, pod).await.as_deref(),
        Some("Pending"),
        "{pod}: {why}"
    );
    why
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_shared_root_only_one_node_has_keeps_its_volumes_pods_on_that_node() {
    let client = support::client().await;
    let (first, other) = first_and_other();
    let key = root_topology_key(PARTIAL_ROOT);
    let everywhere = root_topology_key("/mnt/shared/tessera");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for (node, has) in [(&first, true), (&other, false)] {
        let labels = nodes
            .get(node)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap_or_default();
        assert_eq!(
            labels.get(&key).map(String::as_str),
            has.then_some(TOPOLOGY_ROOT_SERVED),
            "{node}'s label {key}: {labels:?}"
        );
        assert_eq!(
            labels.get(&everywhere).map(String::as_str),
            Some(TOPOLOGY_ROOT_SERVED),
            "{node} has the shared backend: {labels:?}"
        );
    }

    let ns = namespace(&client, "placement").await;
    let sc = support::unique_name("partial");
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class(&sc, "Immediate"))
        .await
        .unwrap();
    claim(&client, &ns, "data", &sc, "64Mi").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pv = eventually(WAIT, "the claim bound", || async {
        claims.get("data").await.ok()?.spec?.volume_name
    })
    .await;
    let pv_obj: PersistentVolume = Api::all(client.clone()).get(&pv).await.unwrap();
    let affinity = serde_json::to_string(&pv_obj.spec.unwrap().node_affinity).unwrap();
    assert!(
        affinity.contains(&key),
        "the PV requires the root: {affinity}"
    );

    // Held to the node without the root: the scheduler says why, nothing runs there.
    scheduled_pod(&client, &ns, "held", "data", Some(&other)).await;
    let why = unschedulable(
        &client,
        &ns,
        "held",
        "didn't match PersistentVolume's node affinity",
    )
    .await;
    delete_pod(&client, &ns, "held").await;

    // Unheld: the first node, where the data is.
    scheduled_pod(&client, &ns, "free", "data", None).await;
    wait_phase(&client, &ns, "free", "Succeeded").await;
    assert_eq!(node_of(&client, &ns, "free").await, first);
    let written = cluster_dir().join(format!("nodes/{first}/tessera/first-node-only/{pv}/hello"));
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "here\n");
    let elsewhere = cluster_dir().join(format!("nodes/{other}/tessera/first-node-only"));
    assert!(!elsewhere.exists(), "nothing made on {other}");
    delete_pod(&client, &ns, "free").await;

    kubectl_output(&["delete", "-n", &ns, "pvc", "data", "--wait=true"]);
    eventually(WAIT, "the PV gone", || async {
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        pvs.get_opt(&pv).await.ok()?.is_none().then_some(())
    })
    .await;
    delete_class(&client, &sc).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES placement: {first} labelled {key}, {other} not; the PV requires it; a Pod held to {other}: {why}; unheld it ran on {first}"
    );
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn capacity_places_wait_for_first_consumer_claims_where_they_fit() {
    let client = support::client().await;
    let (first, other) = first_and_other();
    let ns = namespace(&client, "capacity").await;
    let sc = support::unique_name("partial-wffc");
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class(&sc, "WaitForFirstConsumer"))
        .await
        .unwrap();

    // One CSIStorageCapacity per node for the class: the first node's free space
    // there, none on the other.
    let capacities: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), TESSERA_NS);
    let per_node = eventually(WAIT, "a CSIStorageCapacity per node", || async {
        let list = capacities.list(&ListParams::default()).await.ok()?;
        let mut per_node = BTreeMap::new();
        for c in list
            .items
            .into_iter()
            .filter(|c| c.storage_class_name == sc)
        {
            let labels = c
                .node_topology
                .and_then(|t| t.match_labels)
                .unwrap_or_default();
            let node = labels.get(tessera_api::TOPOLOGY_NODE_KEY)?.clone();
            let bytes = c
                .capacity
                .and_then(|q| tessera_api::quantity_bytes(&q.0).ok())
                .unwrap_or(0);
            per_node.insert(node, bytes);
        }
        (per_node.contains_key(&first) && per_node.contains_key(&other)).then_some(per_node)
    })
    .await;
    let host =
        nix::sys::statvfs::statvfs(&cluster_dir().join(format!("nodes/{first}/tessera"))).unwrap();
    let host_free = host.blocks_available() * host.fragment_size();
    let reported = per_node[&first];
    assert!(
        reported > 0 && reported.abs_diff(host_free) * 20 < host_free,
        "the first node's capacity {reported} is its free space ({host_free})"
    );
    assert_eq!(per_node[&other], 0, "no root, no capacity: {per_node:?}");

    // A claim that fits: placed by the scheduler where the capacity is.
    claim(&client, &ns, "fits", &sc, "64Mi").await;
    scheduled_pod(&client, &ns, "fits", "fits", None).await;
    wait_phase(&client, &ns, "fits", "Succeeded").await;
    assert_eq!(node_of(&client, &ns, "fits").await, first);

    // Larger than any node has: Pending, and the scheduler says why.
    claim(&client, &ns, "huge", &sc, "1Pi").await;
    scheduled_pod(&client, &ns, "huge", "huge", None).await;
    let why = unschedulable(&client, &ns, "huge", "enough free storage").await;

    for pod in ["fits", "huge"] {
        delete_pod(&client, &ns, pod).await;
    }
    kubectl_output(&["delete", "-n", &ns, "pvc", "--all", "--wait=true"]);
    delete_class(&client, &sc).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES capacity: {first} {reported} bytes free (statvfs {host_free}), {other} 0; the 64Mi claim placed on {first}; 1Pi: {why}"
    );
}
