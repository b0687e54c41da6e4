//! `examples/` applied as a new user applies them, on the real nodes (issue 30): the
//! files themselves, through `kubectl apply`, with one change — their `busybox:1.36`
//! image becomes the harness's busybox, since the nodes have no registry to pull
//! from (images are loaded into them: tests/harness/images.sh).
//!
//! ```text
//!  pvc-pod.yaml: StorageClass without parameters ─▶ NodeLocal volume on the Pod's node
//!     Pod writes "hello from N" ─▶ Pod deleted ─▶ the same file applied again
//!     ─▶ the new Pod is placed on N by the PV's topology and reads both lines
//!     a Pod pinned to the other node (nodeName) stays Pending, its Events say why
//!  pod-inline-volume.yaml: Pod with a CSI inline volume ─▶ Running, its greeting written
//! ```
//!
//! The first is what stop 35's user tried and lost data with: a claim whose Pod moves
//! must find its data, not an empty directory on another node.

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};

use tessera_api as api;

use super::*;

/// The harness's stand-in for the examples' image.
fn with_harness_image(text: &str) -> String {
    assert!(
        text.contains("image: busybox:1.36"),
        "the example's image changed"
    );
    text.replace("image: busybox:1.36", &format!("image: {BUSYBOX}"))
}

fn example(name: &str) -> String {
    let path = support::repo_root().join("examples").join(name);
    with_harness_image(&std::fs::read_to_string(&path).unwrap())
}

async fn pod_logs(client: &Client, ns: &str, name: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .logs(name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("logs of {name}: {e}"))
}

/// A node of the cluster other than `node`.
fn nodes_other_than(node: &str) -> String {
    Nodes::load()
        .names()
        .into_iter()
        .find(|n| n != node)
        .expect("two nodes")
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn the_pvc_pod_example_keeps_its_claim_with_its_data() {
    let client = support::client().await;
    let ns = namespace(&client, "pods-example").await;
    let text = example("pvc-pod.yaml");
    kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], &text);
    wait_phase(&client, &ns, "tessera-hello", "Succeeded").await;
    let first = node_of(&client, &ns, "tessera-hello").await;
    assert_eq!(
        pod_logs(&client, &ns, "tessera-hello").await,
        format!("hello from {first}\n")
    );

    // A NodeLocal volume: its PV is pinned to the node that has its data.
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .get("tessera-hello")
        .await
        .unwrap();
    let pv_name = claim.spec.and_then(|s| s.volume_name).expect("bound");
    let pv: PersistentVolume = Api::all(client.clone()).get(&pv_name).await.unwrap();
    let affinity = serde_json::to_string(&pv.spec.as_ref().unwrap().node_affinity).unwrap();
    assert!(
        affinity.contains(&first),
        "the PV's node affinity names {first}: {affinity}"
    );
    let volume = tessera_volume(&client, &pv_name).await;
    assert_eq!(volume.spec.backend.scope, api::BackendScope::NodeLocal);

    // The Pod again, placed by the scheduler alone: on the node with the data.
    delete_pod(&client, &ns, "tessera-hello").await;
    kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], &text);
    wait_phase(&client, &ns, "tessera-hello", "Succeeded").await;
    let second = node_of(&client, &ns, "tessera-hello").await;
    assert_eq!(second, first, "the second Pod's node");
    assert_eq!(
        pod_logs(&client, &ns, "tessera-hello").await,
        format!("hello from {first}\nhello from {first}\n"),
        "the second Pod read the first one's line"
    );

    // A Pod pinned to the other node (nodeName: no scheduler) never runs on an empty
    // directory there: it stays Pending, and its Events say why. (Once the claim is
    // detached from the first node: else the reason is the ReadWriteOnce claim's.)
    delete_pod(&client, &ns, "tessera-hello").await;
    eventually(DETACH_BOUND, "the claim detached", || async {
        attachments(&client, &pv_name)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let other = nodes_other_than(&first);
    app_pod(
        &client,
        &ns,
        "pinned",
        Some(&other),
        BUSYBOX,
        "cat /data/hello",
        claim_volume("tessera-hello"),
    )
    .await;
    let why = eventually(WAIT, "a Warning Event on the pinned Pod", || async {
        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().fields("involvedObject.name=pinned"))
            .await
            .ok()?;
        events
            .items
            .into_iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && matches!(
                        e.reason.as_deref(),
                        Some("FailedAttachVolume" | "FailedMount")
                    )
            })
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                )
            })
    })
    .await;
    assert_eq!(
        pod_phase(&client, &ns, "pinned").await.as_deref(),
        Some("Pending"),
        "the Pod pinned to {other}: {why}"
    );
    assert!(
        !why.contains("Multi-Attach"),
        "the reason is the volume's node, not another attachment: {why}"
    );
    delete_pod(&client, &ns, "pinned").await;

    kubectl_output(&["delete", "-n", &ns, "pvc", "tessera-hello", "--wait=true"]);
    eventually(
        WAIT,
        "the claim's PV gone (reclaimPolicy Delete)",
        || async {
            let pvs: Api<PersistentVolume> = Api::all(client.clone());
            pvs.get_opt(&pv_name)
                .await
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        },
    )
    .await;
    kubectl_output(&[
        "delete",
        "storageclass",
        "tessera-local",
        "--ignore-not-found",
    ]);
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES examples/pvc-pod.yaml: NodeLocal volume on {first}; the Pod applied again ran on {first} and read the first Pod's line; a Pod pinned to {other} stayed Pending: {why}"
    );
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn the_inline_volume_example_runs() {
    let client = support::client().await;
    let ns = namespace(&client, "pods-example-inline").await;
    kubectl_stdin(
        &["apply", "-n", &ns, "-f", "-"],
        &example("pod-inline-volume.yaml"),
    );
    wait_phase(&client, &ns, "scratch-demo", "Running").await;
    let logs = eventually(WAIT, "the example's df of /scratch", || async {
        let logs = pod_logs(&client, &ns, "scratch-demo").await;
        logs.contains("/scratch").then_some(logs)
    })
    .await;
    // The mount's source is the inline Volume's directory under the example's root,
    // and its size the one the example asks for.
    // (busybox's df puts a long source on a line of its own)
    let df = logs.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        df.contains("/var/lib/tessera/volumes/inline-")
            && df.contains(" 256.0M ")
            && df.ends_with(" /scratch"),
        "df shows the 256Mi inline Tessera volume at /scratch: {logs}"
    );
    delete_pod(&client, &ns, "scratch-demo").await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!("REAL NODES examples/pod-inline-volume.yaml: Running; df: {df}");
}
