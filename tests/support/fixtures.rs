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
        let log = std::fs::File::create(
            std::env::temp_dir().join(format!("tessera-controller-{test_id}-{metrics_port}.log")),
        )
        .unwrap();
        let child = tessera_command("controller", log)
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
        }
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
fn tessera_command(role: &str, log: std::fs::File) -> Command {
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
                .backoff(tessera::runtime::backoff::ShortBackoff::default())
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
                    if finalizers
                        .iter()
                        .any(|f| f == tessera::api::MOUNT_FINALIZER)
                    {
                        let rest: Vec<&String> = finalizers
                            .iter()
                            .filter(|f| *f != tessera::api::MOUNT_FINALIZER)
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
                    json!(tessera::api::AppliedSettings::of(&mp.spec))
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
/// state dir and kubelet dir in a temporary directory, scoped to one test by
/// `--watch-selector tessera.io/test=<id>`. Dropping it kills the agent, then every
/// `tessera mount` daemon serving under its mount root, then detaches every mount
/// under its mount root and kubelet dir, so nothing is left mounted when the
/// temporary directory is removed.
pub struct AgentProcess {
    /// The agent (None after [`AgentProcess::kill`]).
    pub child: Option<Child>,
    /// The node name it serves.
    pub node: String,
    /// The test id of its watch selector.
    pub test_id: String,
    /// Its metrics endpoint.
    pub metrics_port: u16,
    /// Its log (stderr, appended across restarts; kept after the test).
    pub log: std::path::PathBuf,
    /// `(root, dir)`: the agent runs in a mount namespace of its own where `dir` is
    /// bind-mounted over `root`, as a node whose `root` is a directory of its own disk.
    private_root: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// More arguments.
    extra: Vec<String>,
    dir: tempfile::TempDir,
}

impl AgentProcess {
    /// Start an agent for `node`.
    pub fn start(test_id: &str, node: &str) -> Self {
        Self::start_as(test_id, node, None, &[])
    }

    /// Start an agent for `node` with more arguments (more allowed roots, …).
    pub fn start_with(test_id: &str, node: &str, extra: &[String]) -> Self {
        Self::start_as(test_id, node, None, extra)
    }

    /// Start an agent for `node` that sees `dir` where everyone else sees `root`: in a
    /// mount namespace of its own (`unshare --mount`, private propagation), `dir` is
    /// bind-mounted over `root`, so the agent reads and writes `root` through its own
    /// mount, as a node on which `root` is a plain directory of its own disk.
    pub fn start_with_private_root(
        test_id: &str,
        node: &str,
        root: &std::path::Path,
        dir: &std::path::Path,
        extra: &[String],
    ) -> Self {
        let private = Some((root.to_path_buf(), dir.to_path_buf()));
        Self::start_as(test_id, node, private, extra)
    }

    fn start_as(
        test_id: &str,
        node: &str,
        private_root: Option<(std::path::PathBuf, std::path::PathBuf)>,
        extra: &[String],
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("tessera-node-{node}-"))
            .tempdir()
            .unwrap();
        for sub in ["mounts", "state", "kubelet"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let mut agent = AgentProcess {
            child: None,
            node: node.to_string(),
            test_id: test_id.to_string(),
            metrics_port: free_port(),
            log: std::env::temp_dir().join(format!("tessera-node-{node}.log")),
            private_root,
            extra: extra.to_vec(),
            dir,
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = tessera_command("node", log);
        if let Some((root, dir)) = &self.private_root {
            // The same command, run by a shell in a new mount namespace after the bind.
            let program = cmd.get_program().to_owned();
            let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
            let mut wrapped = Command::new("unshare");
            wrapped
                .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                .arg(r#"mount --bind "$1" "$2" && shift 2 && exec "$@""#)
                .arg("sh")
                .arg(dir)
                .arg(root)
                .arg(program)
                .args(args);
            for (k, v) in cmd.get_envs() {
                if let Some(v) = v {
                    wrapped.env(k, v);
                }
            }
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .unwrap();
            wrapped.stdout(Stdio::null()).stderr(log);
            cmd = wrapped;
        }
        let child = cmd
            .arg(format!("--node-name={}", self.node))
            .arg(format!("--mount-root={}", self.mount_root().display()))
            .arg(format!("--state-dir={}", self.state_dir().display()))
            .arg(format!("--kubelet-dir={}", self.kubelet_dir().display()))
            .arg(format!("--metrics-addr=127.0.0.1:{}", self.metrics_port))
            .arg(format!("--watch-selector={TEST_LABEL}={}", self.test_id))
            .arg(format!(
                "--csi-endpoint=unix://{}",
                self.csi_socket().display()
            ))
            .args(&self.extra)
            .spawn()
            .expect("starting tessera node");
        self.child = Some(child);
    }

    /// Kill -9 the agent (its FUSE daemons keep running).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The agent's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Start the agent again with the same directories (after [`AgentProcess::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The metrics text, if the endpoint answers.
    pub fn metrics(&self) -> Option<String> {
        scrape(self.metrics_port)
    }

    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.starts_with("HTTP/1.1 200")
    }

    /// Where FUSE mounts go.
    pub fn mount_root(&self) -> std::path::PathBuf {
        self.dir.path().join("mounts")
    }

    /// The agent's state dir.
    pub fn state_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("state")
    }

    /// The CSI socket of the agent's Identity + Node services.
    pub fn csi_socket(&self) -> std::path::PathBuf {
        self.dir.path().join("csi.sock")
    }

    /// The stand-in kubelet directory (reference targets must be under it).
    pub fn kubelet_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("kubelet")
    }

    /// The mount point of `volume` on this node.
    pub fn mountpoint(&self, volume: &str) -> std::path::PathBuf {
        self.mount_root().join(volume)
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // The holder first: a connection it holds for a dead daemon blocks whatever
        // touches the mount (the agent included) until it ends.
        kill_fd_holders_under(&self.state_dir());
        self.kill();
        kill_mount_daemons_under(&self.mount_root());
        detach_mounts_under(&[self.mount_root(), self.kubelet_dir()]);
        // The marker this node left as the anchor of a Shared test root.
        for root in test_backend_roots() {
            let _ = std::fs::remove_file(root.join(format!(".tessera-shared-{}", self.node)));
        }
    }
}

/// SIGKILL every `tessera mount` process whose `--mountpoint` is under `root`.
pub fn kill_mount_daemons_under(root: &std::path::Path) {
    for pid in mount_daemons_under(root) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// SIGKILL every `tessera fd-holder` process whose `--socket` is under `root` (an
/// agent's state dir): the held connections of dead daemons end with it.
pub fn kill_fd_holders_under(root: &std::path::Path) {
    for pid in processes_under("fd-holder", "--socket", root) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Pids of the `tessera mount` processes whose `--mountpoint` is under `root`.
pub fn mount_daemons_under(root: &std::path::Path) -> Vec<i32> {
    processes_under("mount", "--mountpoint", root)
}

/// Pids of the live `tessera <subcommand>` processes whose `flag` names a path under
/// `root`.
pub fn processes_under(subcommand: &str, flag: &str, root: &std::path::Path) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_mount = args.get(1).is_some_and(|a| a == subcommand);
        let under = args
            .windows(2)
            .any(|w| w[0] == flag && std::path::Path::new(&w[1]).starts_with(root));
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if is_mount && under && !zombie {
            out.push(pid);
        }
    }
    out
}

/// Detach (lazily) every mount at or under each of `roots`, deepest first.
pub fn detach_mounts_under(roots: &[std::path::PathBuf]) {
    for _ in 0..4 {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<std::path::PathBuf> = tessera::host::mounts::parse_mountinfo(&table)
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| roots.iter().any(|r| p.starts_with(r)))
            .collect();
        if points.is_empty() {
            return;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The mounts (from `/proc/self/mountinfo`) at `path`, bottom first.
pub fn mounts_at(path: &std::path::Path) -> Vec<tessera::host::mounts::MountInfo> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    tessera::host::mounts::parse_mountinfo(&table)
        .into_iter()
        .filter(|m| m.mount_point == path)
        .collect()
}

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
            "spec": {"drivers": [{"name": tessera::api::CSI_DRIVER_NAME, "nodeID": name}]},
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
    api.get_opt(&tessera::api::mountpod_name(volume, node))
        .await
        .unwrap()
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
