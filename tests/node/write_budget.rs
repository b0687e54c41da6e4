//! One failing mount must not flood the API server (issue 13, item 6), on the real
//! control plane with the real controller and a real node agent: a ticket for a
//! volume whose backend directory is missing on its node keeps failing; after 30 s,
//! Tessera's writes for it (controller and agent together, as their API clients count them) must
//! stay at or below 1 a second over a 60 s window, with the Events aggregated. The
//! API server's own count of writes to Tessera's kinds and Events is printed beside
//! (it includes whatever else runs on the cluster meanwhile).

use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::json;

use tessera_api::MountPhase;

use crate::support;
use support::fixtures::{self, AgentProcess, ControllerProcess, eventually};

const WARM_UP: Duration = Duration::from_secs(30);
const WINDOW: Duration = Duration::from_secs(60);

fn metrics_at(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Writes (not reads) the API server counted for MountPods, Volumes,
/// VolumeAttachments and Events.
fn apiserver_writes() -> f64 {
    let text = support::kubectl_output(&["get", "--raw", "/metrics"]);
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            ["POST", "PUT", "PATCH", "DELETE", "APPLY"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
        })
        .filter(|l| {
            ["mountpods", "volumes", "volumeattachments", "events"]
                .iter()
                .any(|r| l.contains(&format!("resource=\"{r}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn event_count(client: &kube::Client, name_prefix: &str) -> i64 {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .and_then(|r| r.name.as_deref())
                .is_some_and(|n| n.starts_with(name_prefix))
        })
        .map(|e| 1 + e.series.as_ref().map_or(0, |s| i64::from(s.count)))
        .sum()
}

#[tokio::test]
async fn a_persistently_failing_mount_costs_at_most_one_write_a_second() {
    let env = support::env::Env::new("budget", 1, Duration::from_secs(30)).await;
    // The node's agent is registered, as node-driver-registrar does for a real one: the
    // controller picks the node that removes a deleted volume's data among those.
    // Without it, the cleanup depended on the controller seeing the deletion before the
    // MountPod was gone (its node was then the only one known), and CI lost that race.
    fixtures::create_csinodes(&env.client, &env.id, &env.nodes).await;
    let _nodes = fixtures::NodesGuard(env.nodes.clone());
    let ctrl = ControllerProcess::alone(&env.id, &[]);
    let agent = AgentProcess::start(&env.id, &env.nodes[0]);
    // Beneath an allowed root (the temporary directory), but missing on the node.
    let missing = std::env::temp_dir().join(format!("tessera-missing-{}", env.id));
    let name = env.volume_name("v");
    let vol = fixtures::volume_at(&name, &env.id, "ReadWriteOnce", &missing, false);
    env.create_volume(&vol).await;
    let begun = Instant::now();
    fixtures::put_ticket(&env.client, &name, "m1", "manual", &env.nodes[0], json!({})).await;
    eventually(Duration::from_secs(30), "the MountPod failed", || async {
        let mp = fixtures::mountpod_on(&env.client, &name, &env.nodes[0]).await?;
        (mp.status?.phase == Some(MountPhase::Failed)).then_some(())
    })
    .await;
    tokio::time::sleep(WARM_UP.saturating_sub(begun.elapsed())).await;

    let tessera = || {
        support::api_writes(&ctrl.metrics().unwrap_or_default())
            + support::api_writes(&metrics_at(agent.metrics_port))
    };
    let (t0, api0, ev0) = (
        tessera(),
        apiserver_writes(),
        event_count(&env.client, &name).await,
    );
    tokio::time::sleep(WINDOW).await;
    let (t1, api1, ev1) = (
        tessera(),
        apiserver_writes(),
        event_count(&env.client, &name).await,
    );
    let secs = WINDOW.as_secs_f64();
    let rate = (t1 - t0) / secs;
    println!(
        "failing mount, {}s window after {}s: Tessera wrote {} times ({rate:.2}/s: controller + agent API clients); \
         API server counted {} writes to Tessera kinds and Events ({:.2}/s, whole cluster); Events on the volume's objects: {ev0} -> {ev1} occurrences",
        WINDOW.as_secs(),
        WARM_UP.as_secs(),
        t1 - t0,
        api1 - api0,
        (api1 - api0) / secs,
    );
    let mp = fixtures::mountpod_on(&env.client, &name, &env.nodes[0])
        .await
        .unwrap();
    println!(
        "status: {:?}",
        mp.status.as_ref().and_then(|s| s.last_error.clone())
    );
    assert!(rate <= 1.0, "{rate:.2} writes/s");
    assert!(
        ev1 - ev0 <= 60,
        "{} Event occurrences in {secs}s",
        ev1 - ev0
    );
    // Still failing for the same reason (the test measured a failing mount).
    assert_eq!(mp.status.and_then(|s| s.phase), Some(MountPhase::Failed));
    fixtures::remove_ticket(&env.client, &name, "m1").await;
    // Gone before the Volume is deleted, so the cleanup cannot take its node from it.
    env.mountpod_gone(&name, &env.nodes[0]).await;
    env.cleanup_waiting(&[name]).await;
}
