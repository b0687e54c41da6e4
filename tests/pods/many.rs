//! Many Pods of one volume on one node, deleted at once: the kubelet unpublishes them
//! all at the same moment, and the volume detaches within the bound.
//!
//! ```text
//!  20 Pods on node A, one RWX claim ─▶ deleted together ─▶ 20 NodeUnpublish at once
//!    ─▶ each waits its turn on the volume (not ABORTED) ─▶ volume detached from A
//! ```
//!
//! Found by bench/startup: NodeUnpublish answered ABORTED to every call on a volume
//! while one ran, the kubelet retried each on a backoff growing to two minutes, and 25
//! Pods of one volume took minutes to let it go.

use super::*;

/// Pods of the volume on the node.
const PODS: usize = 20;

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn many_pods_of_one_volume_deleted_at_once_let_it_detach() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-many", "shared", "ReadWriteMany").await;
    let a = nodes.names()[0].clone();
    for i in 0..PODS {
        pod(&client, &ns, &format!("p{i}"), &a, "shared", "sleep 3600").await;
    }
    for i in 0..PODS {
        wait_phase(&client, &ns, &format!("p{i}"), "Running").await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let deleted = Instant::now();
    pods.delete_collection(&now, &ListParams::default())
        .await
        .unwrap();
    eventually(DETACH_BOUND, "the volume detached from A", || async {
        attachments(&client, &pv).await.is_empty().then_some(())
    })
    .await;
    let took = deleted.elapsed();
    delete_claim(&client, &ns, "shared", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES {PODS} Pods of one volume on {a} deleted at once: detached {:.1} s after the delete",
        took.as_secs_f64()
    );
}
