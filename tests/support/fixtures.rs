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

use tessera_api::{MountPod, MountTask, Volume, VolumeAttachment};

#[allow(unused_imports)] // binaries that start no agent
pub use super::agent_process::*;

/// The label every object of one test carries.
pub const TEST_LABEL: &str = "tessera.io/test";

/// A `tessera controller` child process; killed on drop.
pub struct ControllerProcess {
    /// The child.
    pub child: Child,
    /// Its metrics endpoint.
    pub metrics_port: u16,
    /// Its log (stderr; kept after the test).
    pub log: std::path::PathBuf,
}

impl ControllerProcess {
    /// Start a controller that only handles objects labelled `tessera.io/test=<test_id>`.
    pub fn start(test_id: &str, extra: &[&str]) -> Self {
        let metrics_port = free_port();
        let log =
            std::env::temp_dir().join(format!("tessera-controller-{test_id}-{metrics_port}.log"));
        let child = tessera_command("controller", std::fs::File::create(&log).unwrap())
            .arg(format!("--watch-selector={TEST_LABEL}={test_id}"))
            .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
            .arg("--reap-interval=1s")
            // Tests add csi-attacher tickets without storage.k8s.io VolumeAttachments;
            // only tests of the reaper ask for a short grace period.
            .args(
                (!extra.iter().any(|a| a.starts_with("--reap-grace"))).then_some("--reap-grace=1h"),
            )
            .args(extra)
            .spawn()
            .expect("starting tessera controller");
        ControllerProcess {
            child,
            metrics_port,
            log,
        }
    }

    /// Start the test's only controller: [`ControllerProcess::start`] without leader
    /// election (`--no-leader-election`), with `extra`.
    pub fn alone(test_id: &str, extra: &[&str]) -> Self {
        let args: Vec<&str> = std::iter::once("--no-leader-election")
            .chain(extra.iter().copied())
            .collect();
        Self::start(test_id, &args)
    }

    /// The metrics text, if the endpoint answers.
    pub fn metrics(&self) -> Option<String> {
        scrape(self.metrics_port)
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

/// The backend roots the tests' controllers and agents allow: the stand-in agent's
/// `/var/lib/tessera/test` and the temporary directory (each test's backend is a
/// temporary directory).
pub fn test_backend_roots() -> Vec<std::path::PathBuf> {
    vec![
        "/var/lib/tessera/test".into(),
        "/var/lib/tessera/volumes".into(),
        std::env::temp_dir(),
    ]
}

/// `tessera <role>` against the cluster under test, logging to `log` (at `RUST_LOG`,
/// `info,kube=warn` if unset), allowing [`test_backend_roots`].
pub(crate) fn tessera_command(role: &str, log: std::fs::File) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.arg(role)
        .args(
            test_backend_roots()
                .iter()
                .map(|r| format!("--allowed-backend-root={}", r.display())),
        )
        .env("KUBECONFIG", super::kubeconfig_path())
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(log);
    cmd
}

/// `GET /metrics` on a loopback port: the whole response (headers too), if the
/// endpoint answers.
pub fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
        create_if_absent(&api, &node, &format!("node {name}")).await;
    }
}

/// Create `obj`; an object of its name that exists already is left as it is.
async fn create_if_absent<K>(api: &Api<K>, obj: &K, what: &str)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating {what}: {e}"),
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

/// Create `volume` and wait (up to `timeout`) until the controller has given it its
/// VolumeAttachment; its name.
pub async fn create_volume(client: &Client, volume: &Volume, timeout: Duration) -> String {
    let name = volume.name_any();
    Api::<Volume>::all(client.clone())
        .create(&PostParams::default(), volume)
        .await
        .unwrap_or_else(|e| panic!("creating Volume {name}: {e}"));
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    eventually(
        timeout,
        &format!("VolumeAttachment {name} created"),
        || async { api.get_opt(&name).await.unwrap().map(|_| ()) },
    )
    .await;
    name
}

/// Add or replace a ticket with a merge patch (as the CSI driver does).
pub async fn put_ticket(
    client: &Client,
    volume: &str,
    id: &str,
    type_: &str,
    node: &str,
    extra: serde_json::Value,
) {
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
    api.patch(volume, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
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
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a ticket's status says: whether it is satisfied, and the reason and message
/// of its first condition (empty while it has none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TicketState {
    pub satisfied: bool,
    pub reason: String,
    pub message: String,
}

/// The ticket statuses of a volume, by ticket id.
pub async fn ticket_states(client: &Client, volume: &str) -> BTreeMap<String, TicketState> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let Some(va) = api.get_opt(volume).await.unwrap() else {
        return BTreeMap::new();
    };
    va.status
        .map(|s| s.attachment_ticket_statuses)
        .unwrap_or_default()
        .into_iter()
        .map(|(id, s)| {
            // A satisfied ticket carries no condition: its reason is Attached.
            let reason = s.reason().unwrap_or_default().to_string();
            let message = s.conditions.first().map(|c| c.message.clone());
            (
                id,
                TicketState {
                    satisfied: s.satisfied,
                    reason,
                    message: message.unwrap_or_default(),
                },
            )
        })
        .collect()
}

/// Wait until ticket `id` of `volume` reports `satisfied`.
pub async fn wait_satisfied(client: &Client, volume: &str, id: &str) {
    eventually(
        Duration::from_secs(30),
        &format!("ticket {id} of {volume} satisfied"),
        || async {
            ticket_states(client, volume)
                .await
                .get(id)
                .filter(|s| s.satisfied)
                .map(|_| ())
        },
    )
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
        .map(|mp| {
            (
                mp.spec.node_name.clone(),
                mp.metadata.deletion_timestamp.is_some(),
            )
        })
        .collect()
}

/// Record, from a watch, the largest number of MountPods of `volume` that existed at
/// once; the watch runs until the handle is aborted.
pub fn watch_max_mountpods(
    client: Client,
    volume: &str,
) -> (
    Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let max = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let m = max.clone();
    let api: Api<MountPod> = Api::all(client);
    let wc = watcher::Config::default().labels(&format!("tessera.io/volume={volume}"));
    let task = tokio::spawn(async move {
        let mut live = std::collections::BTreeSet::new();
        let mut stream = watcher(api, wc).default_backoff().boxed();
        while let Some(Ok(ev)) = stream.next().await {
            match ev {
                watcher::Event::Apply(mp) | watcher::Event::InitApply(mp) => {
                    live.insert(mp.name_any());
                }
                watcher::Event::Delete(mp) => {
                    live.remove(&mp.name_any());
                }
                _ => {}
            }
            m.fetch_max(live.len(), std::sync::atomic::Ordering::SeqCst);
        }
    });
    (max, task)
}

/// A stand-in for the node agent, for controller tests: every MountPod of the test is
/// reported Ready for its current generation (a RemoveData task as done), as the agent
/// reports it, and a deleted one loses the agent's finalizer. Stops when dropped.
pub struct FakeAgent {
    task: tokio::task::JoinHandle<()>,
    /// Node names whose mounts are reported Failed instead.
    pub failing: Arc<std::sync::Mutex<Vec<String>>>,
    /// Node names whose mounts are left unreported (a mount that is still starting).
    pub silent: Arc<std::sync::Mutex<Vec<String>>>,
    /// While set, RemoveData MountPods are left unreported (the data is "still being removed").
    pub hold_remove_data: Arc<std::sync::atomic::AtomicBool>,
    /// Node names whose agent is dead: nothing reported, no finalizer let go.
    pub dead: Arc<std::sync::Mutex<Vec<String>>>,
}

impl FakeAgent {
    /// Start it for objects of test `test_id`.
    pub fn start(client: Client, test_id: &str) -> Self {
        let failing: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let f = failing.clone();
        let silent: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let quiet = silent.clone();
        let hold_remove_data: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let hold = hold_remove_data.clone();
        let dead: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let gone = dead.clone();
        let api: Api<MountPod> = Api::all(client);
        let wc = watcher::Config::default().labels(&format!("{TEST_LABEL}={test_id}"));
        let task = tokio::spawn(async move {
            // The controller's own short backoff, and errors skipped: it keeps serving
            // across an API server restart.
            let mut stream = watcher(api.clone(), wc)
                .backoff(tessera_runtime::backoff::ShortBackoff::default())
                .applied_objects()
                .boxed();
            while let Some(res) = stream.next().await {
                let Ok(mp) = res else { continue };
                if gone.lock().unwrap().contains(&mp.spec.node_name) {
                    continue;
                }
                if mp.metadata.deletion_timestamp.is_some() {
                    // Unmounted: let it go, as the agent does (the controller sets the
                    // agent's finalizer where a CSINode lists the driver).
                    let finalizers = mp.finalizers();
                    if finalizers.iter().any(|f| f == tessera_api::MOUNT_FINALIZER) {
                        let rest: Vec<&String> = finalizers
                            .iter()
                            .filter(|f| *f != tessera_api::MOUNT_FINALIZER)
                            .collect();
                        let patch = json!({"metadata": {"finalizers": rest}});
                        let (api, name) = (api.clone(), mp.name_any());
                        tokio::spawn(async move {
                            let _ = api
                                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                                .await;
                        });
                    }
                    continue;
                }
                if quiet.lock().unwrap().contains(&mp.spec.node_name) {
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
                    MountTask::Serve => {
                        json!(format!("/var/lib/tessera/mounts/{}", mp.spec.volume))
                    }
                    MountTask::RemoveData | MountTask::Populate => serde_json::Value::Null,
                };
                // A Ready mount says what it was mounted with (`applied`), as the agent's
                // does: it stays current when a deletion bumps the generation.
                let applied = if fail {
                    serde_json::Value::Null
                } else {
                    json!(tessera_api::AppliedSettings::of(&mp.spec))
                };
                let patch = json!({"status": {
                    "phase": phase, "observedGeneration": mp.metadata.generation,
                    "applied": applied, "mountPoint": mount_point, "pid": 4242,
                    "lastError": if fail { json!("fuse daemon exited: injected failure") } else { serde_json::Value::Null },
                }});
                let (api, hold, name) = (api.clone(), hold.clone(), mp.name_any());
                let held = mp.spec.task == MountTask::RemoveData;
                tokio::spawn(async move {
                    while held && hold.load(std::sync::atomic::Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                });
            }
        });
        FakeAgent {
            task,
            failing,
            silent,
            hold_remove_data,
            dead,
        }
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

/// Every (reason, message) a ticket's status went through, recorded from a watch.
pub struct ReasonLog {
    task: tokio::task::JoinHandle<()>,
    /// The history, oldest first (consecutive duplicates folded).
    pub seen: Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

impl ReasonLog {
    /// Start recording ticket `id` of `volume`.
    pub fn start(client: Client, volume: &str, id: &str) -> Self {
        let seen: Arc<std::sync::Mutex<Vec<(String, String)>>> = Arc::default();
        let s = seen.clone();
        let api: Api<VolumeAttachment> = Api::all(client);
        let wc = watcher::Config::default().fields(&format!("metadata.name={volume}"));
        let id = id.to_string();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, wc).default_backoff().applied_objects().boxed();
            while let Some(Ok(va)) = stream.next().await {
                let Some(st) = va
                    .status
                    .and_then(|s| s.attachment_ticket_statuses.get(&id).cloned())
                else {
                    continue;
                };
                let Some(c) = st.conditions.first() else {
                    continue;
                };
                let entry = (c.reason.clone(), c.message.clone());
                let mut log = s.lock().unwrap();
                if log.last() != Some(&entry) {
                    log.push(entry);
                }
            }
        });
        ReasonLog { task, seen }
    }

    /// The history so far.
    pub fn history(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for ReasonLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------
// The real node agent (`tessera node`), for tests/node/ and the CSI and fault tests.

/// A `tessera node` child process for one (test) node, with its own mount root,
/// A Volume of test `test_id` whose backend root is `root` (a temporary directory).
pub fn volume_at(
    name: &str,
    test_id: &str,
    mode: &str,
    root: &std::path::Path,
    retain: bool,
) -> Volume {
    let annotations = if retain {
        json!({"tessera.io/reclaim-policy": "Retain"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
        "metadata": {"name": name, "labels": {TEST_LABEL: test_id}, "annotations": annotations},
        "spec": {"size": "1Gi", "accessMode": mode, "backend": {"root": root.display().to_string()}}
    }))
    .unwrap()
}

/// Whether `mp` is Ready only because the agent mounted it: its daemon has not
/// answered yet (`--mounter=agent`; Ready reason `AwaitingDaemon`).
pub fn awaits_daemon(mp: &tessera_api::MountPod) -> bool {
    mp.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "AwaitingDaemon")
    })
}

/// Create a CSINode listing the Tessera driver for each of `names` (as
/// node-driver-registrar would), so the controller knows where an agent runs. They
/// carry the test's label, so a controller scoped to the test picks its own nodes for
/// data cleanup, not another test's (whose agent would never serve it).
pub async fn create_csinodes(client: &Client, test_id: &str, names: &[String]) {
    let api: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(client.clone());
    for name in names {
        let csinode = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": name, "labels": {TEST_LABEL: test_id}},
            "spec": {"drivers": [{"name": tessera_api::CSI_DRIVER_NAME, "nodeID": name}]},
        }))
        .unwrap();
        create_if_absent(&api, &csinode, &format!("CSINode {name}")).await;
    }
}

/// Delete CSINodes.
pub async fn delete_csinodes(client: &Client, names: &[String]) {
    let api: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(client.clone());
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// The MountPod of `volume` on `node`, if any.
pub async fn mountpod_on(client: &Client, volume: &str, node: &str) -> Option<MountPod> {
    let api: Api<MountPod> = Api::all(client.clone());
    api.get_opt(&tessera_api::mountpod_name(volume, node))
        .await
        .unwrap()
}

/// Whether `volume`'s csi-attacher ticket for `node` is granted as ControllerPublish
/// returns on it: in `va`'s spec, and satisfied or with its node's MountPod there and
/// not being deleted (its mount may still be starting: NodePublish waits for it).
pub async fn publish_granted(client: &Client, va: &VolumeAttachment, node: &str) -> bool {
    let volume = va.spec.volume.as_str();
    let ticket = tessera_csi::csi_ticket_id(volume, node);
    if !va.spec.attachment_tickets.contains_key(&ticket) {
        return false;
    }
    va.ticket_satisfied(&ticket)
        || mountpod_on(client, volume, node)
            .await
            .is_some_and(|mp| mp.metadata.deletion_timestamp.is_none())
}

/// Deletes CSINodes and Nodes when dropped, even when the test panics: a leftover
/// CSINode could be picked for another test's data cleanup.
pub struct NodesGuard(pub Vec<String>);

impl Drop for NodesGuard {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.0);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let client = super::client().await;
                delete_csinodes(&client, &names).await;
                delete_nodes(&client, &names).await;
            });
        })
        .join();
    }
}
