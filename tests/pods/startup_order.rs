//! The mount off the Pod's critical path (issue 44): the node agent mounts the volume
//! itself and NodePublish binds it at once, so the kubelet has the Pod's volume set up
//! (and goes on to its image) before the volume's mount Pod even exists. To make the
//! order certain the agents are told (test-only fault point
//! `TESSERA_FAULT_DAEMON_DELAY_MS`, set on the DaemonSet for this test and removed
//! after it) to create each mount Pod 8 s after their own mount; with the daemon
//! mounting, the kubelet could not set the volume up before the mount Pod ran.
//!
//! What still waits for the daemon: creating the application's container. runc
//! `stat`s each bind mount's source, and the kernel sends that GETATTR only once a
//! daemon has answered the connection's INIT; so the container starts right after
//! the daemon does (printed), and its first write is served then.

use tessera_node::pods::spec::pod_name;

use super::*;

const NS: &str = "tessera-system";
const DELAY_MS: u64 = 8000;

/// The fault point set on the agents while it lives (removed again when dropped, a
/// failed test included: the tests after this one must not start daemons late).
struct LateDaemons;

impl LateDaemons {
    fn set() -> Self {
        agents_delay(Some(DELAY_MS));
        LateDaemons
    }
}

impl Drop for LateDaemons {
    fn drop(&mut self) {
        agents_delay(None);
    }
}

/// Set (`Some`) or remove the fault point on the agents, and wait for the rollout.
fn agents_delay(ms: Option<u64>) {
    let env = match ms {
        Some(ms) => format!("TESSERA_FAULT_DAEMON_DELAY_MS={ms}"),
        None => "TESSERA_FAULT_DAEMON_DELAY_MS-".to_string(),
    };
    kubectl_output(&["-n", NS, "set", "env", "daemonset/tessera-node", &env]);
    kubectl_output(&[
        "-n",
        NS,
        "rollout",
        "status",
        "daemonset/tessera-node",
        "--timeout=180s",
    ]);
}

/// When the kubelet last recorded `reason` about the Pod `name`.
async fn event_time(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
) -> Option<jiff::Timestamp> {
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .ok()?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.first_timestamp.map(|t| t.0).or(e.event_time.map(|t| t.0)))
        .min()
}

/// When the container `name` of `pod` started running.
fn started_at(pod: &Pod, name: &str) -> Option<jiff::Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()
        .map(|t| t.0)
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_pods_volume_is_set_up_before_its_mount_pod_exists() {
    let client = support::client().await;
    let late = LateDaemons::set();
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-order", "data", "ReadWriteOnce").await;
    let node = nodes.names()[0].clone();
    // The first write's issue time, the write, the time it returned.
    pod(
        &client,
        &ns,
        "app",
        &node,
        "data",
        "date -u +%s > /tmp/issued; echo first > /data/first; date -u +%s > /tmp/done; \
         echo \"issued $(cat /tmp/issued) done $(cat /tmp/done)\"; sleep 3600",
    )
    .await;
    wait_phase(&client, &ns, "app", "Running").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mount_pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mount_pod = pod_name(&volume.name_any(), &node);
    let (issued, done) = eventually(WAIT, "the app's first write returned", || async {
        let log = kubectl_output(&["-n", &ns, "logs", "app"]);
        let mut f = log.split_whitespace();
        match (f.next(), f.next(), f.next(), f.next()) {
            (Some("issued"), Some(i), Some("done"), Some(d)) => {
                Some((i.parse::<i64>().ok()?, d.parse::<i64>().ok()?))
            }
            _ => None,
        }
    })
    .await;
    let app_started = started_at(&pods.get("app").await.unwrap(), "app").expect("app running");
    let mount_pod_obj = mount_pods.get(&mount_pod).await.unwrap();
    let mount_pod_created = mount_pod_obj.metadata.creation_timestamp.clone().unwrap().0;
    let daemon_started = eventually(WAIT, "the mount Pod's container running", || async {
        started_at(
            &mount_pods.get_opt(&mount_pod).await.ok()??,
            tessera_api::MOUNT_POD_CONTAINER,
        )
    })
    .await;
    // The kubelet looks at the image only once the Pod's volumes are set up.
    let volume_ready = event_time(&client, &ns, "app", "Pulled")
        .await
        .expect("the kubelet's Pulled Event");
    let secs = |t: jiff::Timestamp| t.as_second();
    eprintln!(
        "REAL NODES start order (seconds): app volume set up (Pulled) {}, mount Pod created \
         {}, its container running {}; app container running {}, its first write issued \
         {issued} and returned {done}",
        secs(volume_ready),
        secs(mount_pod_created),
        secs(daemon_started),
        secs(app_started),
    );
    assert!(
        volume_ready < mount_pod_created,
        "the kubelet set the volume up ({volume_ready}) only after the mount Pod was created ({mount_pod_created})"
    );
    assert!(
        app_started >= daemon_started && issued >= secs(daemon_started) && done >= issued,
        "the app ran ({app_started}) before its daemon ({daemon_started}): runc's stat did not wait?"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("first")).unwrap(),
        "first\n",
        "the backend directory has what the app wrote"
    );
    drop(late);
    delete_pod(&client, &ns, "app").await;
    delete_claim(&client, &ns, "data", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}
