//! One test's share of the cluster, for the tests that drive Tessera through tickets
//! (controller, node agent, CSI chain): a client with the CRDs installed, the test's id
//! (every object of the test carries it in its `tessera.io/test` label, and the
//! processes started for the test watch only those), Node objects named `<id>-n<i>`,
//! and the steps these tests repeat: create a Volume, attach through a ticket and wait
//! until it is satisfied, wait until a ticket is blocked and check why, detach, wait
//! until a MountPod is ready or gone, clean up. Every wait is bounded by [`Env::wait`].
//! [`AgentEnv`] adds a backend root and the test's controller, for the tests that run
//! node agents; [`CsiEnv`] the CSI block (the controller serving its CSI socket, the
//! agents, the backend root, the sockets waited for), for the tests that call the CSI
//! services.

use std::path::PathBuf;
use std::time::Duration;

use kube::Client;
use kube::api::Api;
use serde_json::json;
use tonic::transport::Channel;

use tessera_api::{MountPhase, MountPod, Volume, VolumeAttachment};
use tessera_csi_proto::CreateVolumeRequest;
use tessera_csi_proto::controller_client::ControllerClient;
use tessera_csi_proto::node_client::NodeClient;

use super::fixtures::{
    self, AgentProcess, ControllerProcess, FakeAgent, NodesGuard, TicketState, eventually,
};

/// One test's client, id and nodes.
pub struct Env {
    pub client: Client,
    /// The test id: the `tessera.io/test` label of the test's objects, and the prefix
    /// of their names.
    pub id: String,
    /// The names of the test's Node objects.
    pub nodes: Vec<String>,
    /// The bound of every wait of the helpers below (tickets: [`fixtures::wait_satisfied`]'s).
    pub wait: Duration,
}

impl Env {
    /// A client (the CRDs installed), a fresh test id `<prefix>-…`, and `nodes` Node
    /// objects named `<id>-n<i>` (so `prefix` also sorts a test's nodes among others').
    pub async fn new(prefix: &str, nodes: usize, wait: Duration) -> Env {
        let client = super::client().await;
        super::ensure_crds(&client).await;
        let id = super::unique_name(prefix);
        let nodes: Vec<String> = (0..nodes).map(|i| format!("{id}-n{i}")).collect();
        fixtures::create_nodes(&client, &nodes).await;
        Env {
            client,
            id,
            nodes,
            wait,
        }
    }

    /// The name of the test's volume `suffix`: `<id>-<suffix>`.
    pub fn volume_name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.id)
    }

    /// Create `volume` and wait until the controller has given it its
    /// VolumeAttachment; its name.
    pub async fn create_volume(&self, volume: &Volume) -> String {
        fixtures::create_volume(&self.client, volume, self.wait).await
    }

    /// Create the Volume `<id>-<suffix>` of access mode `mode` (backend root
    /// `/var/lib/tessera/test`, for a stand-in agent that mounts nothing).
    pub async fn volume(&self, suffix: &str, mode: &str) -> String {
        let name = self.volume_name(suffix);
        let vol = fixtures::volume(&name, &self.id, mode);
        self.create_volume(&vol).await
    }

    /// Add ticket `id` of type `type_` for `node` to `volume` and wait until it is
    /// satisfied.
    pub async fn attach(&self, volume: &str, id: &str, type_: &str, node: &str) {
        fixtures::put_ticket(&self.client, volume, id, type_, node, json!({})).await;
        fixtures::wait_satisfied(&self.client, volume, id).await;
    }

    /// Remove ticket `id` of `volume` and wait until its MountPod on `node` is gone.
    pub async fn detach(&self, volume: &str, id: &str, node: &str) {
        fixtures::remove_ticket(&self.client, volume, id).await;
        self.mountpod_gone(volume, node).await;
    }

    /// Wait until ticket `id` of `volume` reports `reason` (a ticket may pass through
    /// another reason first, such as Attaching before MountFailed); its state. On a
    /// timeout the reasons seen on the way are named.
    pub async fn blocked(&self, volume: &str, id: &str, reason: &str) -> TicketState {
        let seen = std::sync::Mutex::new(Vec::<String>::new());
        let found = tokio::time::timeout(self.wait, async {
            loop {
                if let Some(s) = fixtures::ticket_states(&self.client, volume)
                    .await
                    .get(id)
                    .cloned()
                {
                    if s.reason == reason {
                        return s;
                    }
                    let mut seen = seen.lock().unwrap();
                    let said = format!("{}: {}", s.reason, s.message);
                    if seen.last() != Some(&said) {
                        seen.push(said);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "ticket {id} of {volume} not blocked with {reason} within {:?}; seen: {:?}",
                self.wait,
                seen.lock().unwrap()
            )
        })
    }

    /// SIGKILL the mount daemon of `volume` on `node` once it has handed its FUSE
    /// descriptor to the holder (its log `daemon_log` says so), and wait until a
    /// successor serves the same MountPod: a takeover.
    pub async fn take_over(&self, volume: &str, node: &str, daemon_log: &std::path::Path) {
        eventually(self.wait, "descriptor held", || async {
            std::fs::read_to_string(daemon_log)
                .unwrap_or_default()
                .contains("FUSE descriptor handed to the holder")
                .then_some(())
        })
        .await;
        let mp = self.ready_mountpod(volume, node, "Ready", |_| true).await;
        let old_pid = mp.status.as_ref().and_then(|s| s.pid).unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(old_pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        self.ready_mountpod(volume, node, "taken over", |mp: &MountPod| {
            let st = mp.status.clone().unwrap_or_default();
            st.pid.is_some_and(|p| p != old_pid) && st.phase == Some(MountPhase::Ready)
        })
        .await;
    }

    /// Wait until the MountPod of `volume` on `node` is ready for its current
    /// generation, served by its daemon (not only mounted by the agent: Ready reason
    /// `AwaitingDaemon`), and satisfies `f`.
    pub async fn ready_mountpod(
        &self,
        volume: &str,
        node: &str,
        what: &str,
        f: impl Fn(&MountPod) -> bool,
    ) -> MountPod {
        self.mounted_mountpod(volume, node, what, |mp| {
            !fixtures::awaits_daemon(mp) && f(mp)
        })
        .await
    }

    /// As [`Self::ready_mountpod`], but Ready is enough: the agent's mount may still
    /// wait for its daemon.
    pub async fn mounted_mountpod(
        &self,
        volume: &str,
        node: &str,
        what: &str,
        f: impl Fn(&MountPod) -> bool,
    ) -> MountPod {
        eventually(
            self.wait,
            &format!("MountPod of {volume} on {node}: {what}"),
            || async {
                fixtures::mountpod_on(&self.client, volume, node)
                    .await
                    .filter(|mp| mp.is_ready() && f(mp))
            },
        )
        .await
    }

    /// Wait until there is no MountPod of `volume` on `node`.
    pub async fn mountpod_gone(&self, volume: &str, node: &str) {
        eventually(
            self.wait,
            &format!("MountPod of {volume} on {node} gone"),
            || async {
                fixtures::mountpod_on(&self.client, volume, node)
                    .await
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }

    /// Delete the volumes (their finalizers are served by the controller if it runs),
    /// then the nodes.
    pub async fn cleanup(&self, volumes: &[String]) {
        fixtures::delete_volumes(&self.client, volumes).await;
        fixtures::delete_nodes(&self.client, &self.nodes).await;
    }

    /// Delete the volumes and wait until they are gone, then the nodes.
    pub async fn cleanup_waiting(&self, volumes: &[String]) {
        fixtures::delete_volumes(&self.client, volumes).await;
        let api: Api<Volume> = Api::all(self.client.clone());
        for v in volumes {
            eventually(self.wait, &format!("Volume {v} gone"), || async {
                api.get_opt(v).await.unwrap().is_none().then_some(())
            })
            .await;
        }
        fixtures::delete_nodes(&self.client, &self.nodes).await;
    }
}

/// [`Env`] with a backend root for the test's volumes (a temporary directory) and the
/// test's own controller: the set-up of the tests that run node agents against it
/// (tests/node/node_agent.rs, tests/node/handoff_agent.rs).
pub struct AgentEnv {
    pub base: Env,
    pub backend: tempfile::TempDir,
    _ctrl: fixtures::ControllerProcess,
}

impl std::ops::Deref for AgentEnv {
    type Target = Env;

    fn deref(&self) -> &Env {
        &self.base
    }
}

impl AgentEnv {
    /// [`Env::new`], a backend root `tessera-backend-…`, and a controller without
    /// leader election.
    pub async fn new(prefix: &str, nodes: usize, wait: Duration) -> AgentEnv {
        let base = Env::new(prefix, nodes, wait).await;
        let backend = super::temp_dir("tessera-backend-");
        let ctrl = ControllerProcess::alone(&base.id, &[]);
        AgentEnv {
            base,
            backend,
            _ctrl: ctrl,
        }
    }
}

/// [`Env`] with the CSI block of the tests that call Tessera's CSI services over their
/// sockets: a `tessera controller` of the test's own ([`ControllerProcess::alone`])
/// serving its CSI socket, real node agents (`tessera node`, each serving its own
/// socket) and/or the stand-in agent, a backend root, and a client of the controller's
/// socket. The
/// socket and the backend root are in a temporary directory of the test's. Made by
/// [`CsiEnv::builder`] or [`CsiEnv::on`], started by [`CsiEnvBuilder::start`], which
/// returns once every socket is there. Dropping it stops the agents (their daemons
/// killed, their mounts detached) and the controller, deletes the test's Nodes and
/// CSINodes (also when the test panicked), then the temporary directory.
pub struct CsiEnv {
    pub base: Env,
    csi: ControllerClient<Channel>,
    /// The stand-in agent, if asked for ([`CsiEnvBuilder::fake_agent`]).
    pub fake: Option<FakeAgent>,
    /// The real agents, in the order asked for.
    pub agents: Vec<AgentProcess>,
    pub ctrl: ControllerProcess,
    /// The controller's CSI socket.
    pub sock: PathBuf,
    /// The backend root for the test's volumes (an allowed root of every process the
    /// tests start); the controller's default root if asked for
    /// ([`CsiEnvBuilder::default_backend_root`]).
    pub backend: PathBuf,
    _nodes: Option<NodesGuard>,
    _work: tempfile::TempDir,
}

impl std::ops::Deref for CsiEnv {
    type Target = Env;

    fn deref(&self) -> &Env {
        &self.base
    }
}

/// What a [`CsiEnv`] starts.
pub struct CsiEnvBuilder {
    base: Result<Env, (String, usize, Duration)>,
    csinodes: bool,
    agents: usize,
    agents_on: Vec<String>,
    agent_args: Vec<String>,
    fake_agent: bool,
    default_root: bool,
    args: Vec<String>,
}

impl CsiEnv {
    /// A CSI block on a new [`Env`] (`Env::new(prefix, nodes, wait)`).
    pub fn builder(prefix: &str, nodes: usize, wait: Duration) -> CsiEnvBuilder {
        CsiEnvBuilder::new(Err((prefix.to_string(), nodes, wait)))
    }

    /// A CSI block on `base`, for a test that makes objects (or the controller's
    /// arguments) from its id before the processes start.
    pub fn on(base: Env) -> CsiEnvBuilder {
        CsiEnvBuilder::new(Ok(base))
    }

    /// A client of the controller's CSI socket (the calls take it `&mut`).
    pub fn csi(&self) -> ControllerClient<Channel> {
        self.csi.clone()
    }

    /// The agent, when the test runs one.
    pub fn agent(&self) -> &AgentProcess {
        self.agents.first().expect("a CsiEnv with an agent")
    }

    /// The stand-in agent.
    pub fn fake(&self) -> &FakeAgent {
        self.fake
            .as_ref()
            .expect("a CsiEnv with the stand-in agent")
    }

    /// CreateVolume `req` at the controller's socket, which must succeed, and wait until
    /// the Volume has its VolumeAttachment: the volume id.
    pub async fn made(&self, req: CreateVolumeRequest) -> String {
        let volume = super::csi::made(&mut self.csi(), req).await.volume_id;
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let what = format!("the VolumeAttachment of {volume}");
        eventually(self.wait, &what, || async {
            vas.get_opt(&volume).await.ok().flatten()
        })
        .await;
        volume
    }

    /// A client of the CSI socket (Identity + Node) of agent `i`.
    pub async fn node(&self, i: usize) -> NodeClient<Channel> {
        super::csi::node(&self.agents[i].csi_socket(), self.wait).await
    }
}

impl CsiEnvBuilder {
    fn new(base: Result<Env, (String, usize, Duration)>) -> CsiEnvBuilder {
        CsiEnvBuilder {
            base,
            csinodes: false,
            agents: 0,
            agents_on: Vec::new(),
            agent_args: Vec::new(),
            fake_agent: false,
            default_root: false,
            args: Vec::new(),
        }
    }

    /// A CSINode listing the driver for each Node of the test, as node-driver-registrar
    /// makes it where an agent runs.
    pub fn csinodes(mut self) -> Self {
        self.csinodes = true;
        self
    }

    /// A real agent on each of the first `n` Nodes of the test.
    pub fn agents(mut self, n: usize) -> Self {
        self.agents = n;
        self
    }

    /// A real agent for each node `<id>-<suffix>` (no Node object made: for a test that
    /// makes its own).
    pub fn agents_on(mut self, suffixes: &[&str]) -> Self {
        self.agents_on = suffixes.iter().map(|s| s.to_string()).collect();
        self
    }

    /// More arguments for every agent.
    pub fn agent_args(mut self, args: &[String]) -> Self {
        self.agent_args = args.to_vec();
        self
    }

    /// The stand-in agent ([`FakeAgent`]), started after the controller.
    pub fn fake_agent(mut self) -> Self {
        self.fake_agent = true;
        self
    }

    /// The backend root as the controller's `--default-backend-root`.
    pub fn default_backend_root(mut self) -> Self {
        self.default_root = true;
        self
    }

    /// More arguments for the controller.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Start the agents, then the controller ([`ControllerProcess::alone`], with
    /// `--csi-endpoint`), then the stand-in agent; return once the controller's socket
    /// answers and every agent's socket is there (within the Env's wait).
    pub async fn start(self) -> CsiEnv {
        let base = match self.base {
            Ok(base) => base,
            Err((prefix, nodes, wait)) => Env::new(&prefix, nodes, wait).await,
        };
        if self.csinodes {
            fixtures::create_csinodes(&base.client, &base.id, &base.nodes).await;
        }
        let nodes = (!base.nodes.is_empty()).then(|| NodesGuard(base.nodes.clone()));
        let work = super::temp_dir(&format!("tessera-{}-", base.id));
        let backend = work.path().join("backend");
        std::fs::create_dir_all(&backend).unwrap();
        let sock = work.path().join("controller.sock");
        let agent_nodes = base.nodes[..self.agents].iter().cloned().chain(
            self.agents_on
                .iter()
                .map(|suffix| format!("{}-{suffix}", base.id)),
        );
        let agents: Vec<AgentProcess> = agent_nodes
            .map(|node| AgentProcess::start_with(&base.id, &node, &self.agent_args))
            .collect();
        let mut args = vec![format!("--csi-endpoint=unix://{}", sock.display())];
        if self.default_root {
            args.push(format!("--default-backend-root={}", backend.display()));
        }
        args.extend(self.args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let ctrl = ControllerProcess::alone(&base.id, &args);
        let fake = self
            .fake_agent
            .then(|| FakeAgent::start(base.client.clone(), &base.id));
        let csi = super::csi::controller(&sock, base.wait).await;
        for agent in &agents {
            let what = format!("the CSI socket of the agent of {}", agent.node);
            eventually(base.wait, &what, || async {
                agent.csi_socket().exists().then_some(())
            })
            .await;
        }
        CsiEnv {
            base,
            csi,
            fake,
            agents,
            ctrl,
            sock,
            backend,
            _nodes: nodes,
            _work: work,
        }
    }
}
