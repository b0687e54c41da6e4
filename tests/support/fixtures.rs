//! Fixtures for running Tessera's own processes against the cluster under test: the
//! controller (as a child process, scoped to one test by a watch selector), Node
//! objects, and a stand-in for the node agent that drives MountPod status through
//! the API exactly as the agent reports it (used until a test runs the real agent).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tessera::api::{MountPod, MountTask, Volume, VolumeAttachment};

/// The label every object of one test carries.
pub const TEST_LABEL: &str = "tessera.io/test";

/// A `tessera controller` child process; killed on drop.
pub struct ControllerProcess {
    /// The child.
    pub child: Child,
    /// Its metrics endpoint.
    pub metrics_port: u16,
}

impl ControllerProcess {
    /// Start a controller that only handles objects labelled `tessera.io/test=<test_id>`.
    pub fn start(test_id: &str, extra: &[&str]) -> Self {
        let metrics_port = free_port();
        let log = std::fs::File::create(std::env::temp_dir().join(format!("tessera-controller-{test_id}-{metrics_port}.log")))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("controller")
            .arg(format!("--watch-selector={TEST_LABEL}={test_id}"))
            .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
            .args(["--reap-interval-seconds=1", "--reap-grace-seconds=2"])
            .args(extra)
            .env("KUBECONFIG", super::kubeconfig_path())
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting tessera controller");
        ControllerProcess { child, metrics_port }
    }

    /// The metrics text, if the endpoint answers.
    pub fn metrics(&self) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// Sum of a metric's samples whose line starts with `prefix`.
    pub fn metric_sum(&self, prefix: &str) -> f64 {
        self.metrics()
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Kill -9.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Create Node objects named `names` (with the attach-detach annotation, as a kubelet
/// would set it).
pub async fn create_nodes(client: &Client, names: &[String]) {
    let api: Api<Node> = Api::all(client.clone());
    for name in names {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
                          "labels": {"kubernetes.io/hostname": name}},
        }))
        .unwrap();
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating node {name}: {e}"),
        }
    }
}

/// Delete Node objects.
pub async fn delete_nodes(client: &Client, names: &[String]) {
    let api: Api<Node> = Api::all(client.clone());
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// A Volume labelled for test `test_id`.
pub fn volume(name: &str, test_id: &str, mode: &str) -> Volume {
    serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
        "metadata": {"name": name, "labels": {TEST_LABEL: test_id}},
        "spec": {"size": "1Gi", "accessMode": mode, "backend": {"root": "/var/lib/tessera/test"}}
    }))
    .unwrap()
}

/// Add or replace a ticket with a merge patch (as the CSI driver does).
pub async fn put_ticket(client: &Client, volume: &str, id: &str, type_: &str, node: &str, extra: serde_json::Value) {
    let mut ticket = json!({"id": id, "type": type_, "nodeID": node});
    if let (Some(t), Some(e)) = (ticket.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            t.insert(k.clone(), v.clone());
        }
    }
    let patch = json!({"spec": {"attachmentTickets": {id: ticket}}});
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    api.patch(volume, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("adding ticket {id} to {volume}: {e}"));
}

/// Remove a ticket with a merge patch.
pub async fn remove_ticket(client: &Client, volume: &str, id: &str) {
    let patch = json!({"spec": {"attachmentTickets": {id: null}}});
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    api.patch(volume, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// Poll `f` every 100 ms until it returns `Some`, or panic after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ticket statuses of a volume: id → (satisfied, reason, message).
pub async fn ticket_states(client: &Client, volume: &str) -> BTreeMap<String, (bool, String, String)> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let Some(va) = api.get_opt(volume).await.unwrap() else { return BTreeMap::new() };
    va.status
        .map(|s| s.attachment_ticket_statuses)
        .unwrap_or_default()
        .into_iter()
        .map(|(id, s)| {
            let c = s.conditions.first().cloned();
            (id, (s.satisfied, c.as_ref().map(|c| c.reason.clone()).unwrap_or_default(), c.map(|c| c.message).unwrap_or_default()))
        })
        .collect()
}

/// Wait until ticket `id` of `volume` reports `satisfied`.
pub async fn wait_satisfied(client: &Client, volume: &str, id: &str) {
    eventually(Duration::from_secs(30), &format!("ticket {id} of {volume} satisfied"), || async {
        ticket_states(client, volume).await.get(id).filter(|s| s.0).map(|_| ())
    })
    .await
}

/// MountPods of a volume: node → deleting?
pub async fn mountpods_of(client: &Client, volume: &str) -> BTreeMap<String, bool> {
    let api: Api<MountPod> = Api::all(client.clone());
    api.list(&kube::api::ListParams::default().labels(&format!("tessera.io/volume={volume}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|mp| (mp.spec.node_name.clone(), mp.metadata.deletion_timestamp.is_some()))
        .collect()
}

/// A stand-in for the node agent, for controller tests: every MountPod of the test is
/// reported Ready for its current generation (a RemoveData task as done), as the agent
/// reports it. Stops when dropped.
pub struct FakeAgent {
    task: tokio::task::JoinHandle<()>,
    /// Node names whose mounts are reported Failed instead.
    pub failing: Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakeAgent {
    /// Start it for objects of test `test_id`.
    pub fn start(client: Client, test_id: &str) -> Self {
        let failing: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let f = failing.clone();
        let api: Api<MountPod> = Api::all(client);
        let wc = watcher::Config::default().labels(&format!("{TEST_LABEL}={test_id}"));
        let task = tokio::spawn(async move {
            let mut stream = watcher(api.clone(), wc).default_backoff().applied_objects().boxed();
            while let Some(Ok(mp)) = stream.next().await {
                if mp.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let fail = f.lock().unwrap().contains(&mp.spec.node_name);
                let phase = if fail { "Failed" } else { "Ready" };
                let status = mp.status.clone().unwrap_or_default();
                let current = status.observed_generation == mp.metadata.generation
                    && status.phase.map(|p| format!("{p:?}")) == Some(phase.to_string());
                if current {
                    continue;
                }
                let mount_point = match mp.spec.task {
                    MountTask::Serve => json!(format!("/var/lib/tessera/mounts/{}", mp.spec.volume)),
                    MountTask::RemoveData => serde_json::Value::Null,
                };
                let patch = json!({"status": {
                    "phase": phase, "observedGeneration": mp.metadata.generation,
                    "mountPoint": mount_point, "pid": 4242,
                    "lastError": if fail { json!("fuse daemon exited: injected failure") } else { serde_json::Value::Null },
                }});
                let _ = api.patch_status(&mp.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await;
            }
        });
        FakeAgent { task, failing }
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Delete every Volume of a test (finalizers are served by the controller if running).
pub async fn delete_volumes(client: &Client, names: &[String]) {
    let api: Api<Volume> = Api::all(client.clone());
    for n in names {
        let _ = api.delete(n, &DeleteParams::default()).await;
    }
}
