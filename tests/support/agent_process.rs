//! `tessera node` as a child process of the test ([`AgentProcess`]), and the helpers
//! that find and end what it leaves on the host: mount daemons, fd holders and mounts
//! under a root. Re-exported by `fixtures`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use tessera_api::MountPod;

use super::fixtures::{TEST_LABEL, free_port, scrape, tessera_command, test_backend_roots};

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
    /// More environment (the agent's daemons inherit it: test-only fault points).
    env: Vec<(String, String)>,
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

    /// Start an agent for `node` with more arguments and environment (which its
    /// daemons inherit: a test-only fault point).
    pub fn start_with_env(
        test_id: &str,
        node: &str,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        let mut agent = Self::new_stopped(test_id, node, None, extra);
        agent.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        agent.spawn();
        agent
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
        let mut agent = Self::new_stopped(test_id, node, private_root, extra);
        agent.spawn();
        agent
    }

    fn new_stopped(
        test_id: &str,
        node: &str,
        private_root: Option<(std::path::PathBuf, std::path::PathBuf)>,
        extra: &[String],
    ) -> Self {
        let dir = super::temp_dir(&format!("tessera-node-{node}-"));
        for sub in ["mounts", "state", "kubelet"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        AgentProcess {
            child: None,
            node: node.to_string(),
            test_id: test_id.to_string(),
            metrics_port: free_port(),
            log: std::env::temp_dir().join(format!("tessera-node-{node}.log")),
            private_root,
            extra: extra.to_vec(),
            env: Vec::new(),
            dir,
        }
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
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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
        let mut points: Vec<std::path::PathBuf> = tessera_host::mounts::parse_mountinfo(&table)
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
pub fn mounts_at(path: &std::path::Path) -> Vec<tessera_host::mounts::MountInfo> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    tessera_host::mounts::parse_mountinfo(&table)
        .into_iter()
        .filter(|m| m.mount_point == path)
        .collect()
}

/// Bind the mount point into one target per `(pod, read_only)` under the kubelet dir
/// and record the references as the CSI node service does (merge patch, field
/// manager tessera-csi-node).
pub async fn add_references(
    client: &Client,
    agent: &AgentProcess,
    volume: &str,
    pods: &[(&str, bool)],
) -> Vec<PathBuf> {
    let mut targets = Vec::new();
    let mut refs = Vec::new();
    for (pod, read_only) in pods {
        let target = agent.kubelet_dir().join(format!(
            "pods/{pod}/volumes/kubernetes.io~csi/{volume}/mount"
        ));
        std::fs::create_dir_all(&target).unwrap();
        nix::mount::mount(
            Some(&agent.mountpoint(volume)),
            &target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        if *read_only {
            nix::mount::mount(
                None::<&str>,
                &target,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND
                    | nix::mount::MsFlags::MS_REMOUNT
                    | nix::mount::MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .unwrap();
        }
        refs.push(
            json!({"targetPath": target, "owner": format!("pod/{pod}"), "readOnly": read_only}),
        );
        targets.push(target);
    }
    set_references(client, volume, &agent.node, json!(refs)).await;
    targets
}

/// Set the MountPod's references of `volume` on `node` (merge patch, field manager
/// tessera-csi-node, as the CSI node service writes them; `null`: none).
pub async fn set_references(
    client: &Client,
    volume: &str,
    node: &str,
    references: serde_json::Value,
) {
    let api: Api<MountPod> = Api::all(client.clone());
    let params = PatchParams {
        field_manager: Some("tessera-csi-node".into()),
        ..Default::default()
    };
    api.patch(
        &tessera_api::mountpod_name(volume, node),
        &params,
        &Patch::Merge(json!({"spec": {"references": references}})),
    )
    .await
    .unwrap();
}
