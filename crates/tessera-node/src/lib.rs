//! `tessera node`: the node agent. One per node (a DaemonSet); it watches the
//! MountPods of its node and makes the node match them: a FUSE daemon per volume,
//! started, adopted after an agent restart, repaired when it dies, stopped when the
//! MountPod goes; a deleted volume's data removed when asked.
//!
//! ```text
//!              ┌──────────────────── agent (kube side) ─────────────────────┐
//!  MountPods ─▶│ Controller<MountPod>  ◀── health loop (broken mount found) │── status (SSA,
//!  (this node) │      │ spawn_blocking                                      │   tessera-node-<node>)
//!              └──────┼──────────────────────────────────────────────────────┘
//!                     ▼
//!              mount_service::MountService (node side, blocking, no Kubernetes)
//!                ├─ tessera_host::paths   every path from the CR validated (CVE-2020-8568)
//!                ├─ supervisor           `tessera mount` daemons (own session) + state dir records
//!                └─ tessera_host::mounts  mountinfo, bind, lazy unmount, probe (trait; fake in tests)
//! ```
//!
//! | module | owns |
//! |---|---|
//! | [`agent`] | the watch, finalizer `tessera.io/mount`, status, Events, the health loop |
//! | [`backoff`] | per-MountPod exponential backoff of failing mounts (no write storm) |
//! | [`daemon_spec`] | what a daemon serves, and its `tessera mount` command line (the flags are `tessera_fuse::contract`'s), one builder for both mount modes |
//! | [`holder_process`] | the `tessera fd-holder` process: started when none answers, asked over its socket |
//! | [`liveness`] | the node's liveness Lease, renewed; each renewal's instant told to the self-fencing daemons (the fence file) |
//! | [`mount_service`] | the work on this node for each MountPod (no Kubernetes): start, adopt, repair + re-bind, online resize, remount, teardown, data removal |
//! | [`mount_counters`] | the per-mount FUSE metrics, read from the daemons' counters files on each scrape |
//! | [`pods`] | pod mode: each daemon in a mount Pod on this node (spec, state, create/find/delete) |
//! | [`supervisor`] | daemon processes (spawn detached, liveness with pid-reuse check, signals, reaping) and the state directory |
//! | [`upgrade`] | rolling mount image upgrades, decided without I/O: which mount is replaced next, through the handoff |
//!
//! The mount table, the mount syscalls and path validation are [`tessera_host`]'s,
//! shared with the CSI Node service. This module knows nothing of CSI: the role
//! (`cli`) serves the CSI Node service next to the agent, over the same
//! [`mount_service::MountService::mounts`].
//!
//! Data flow of a volume on this node: the controller creates the MountPod
//! (`spec.source` = `<backend root>/<volume>`, owned by the Volume); the agent serves
//! only MountPods owned by their Volume whose source is the volume's directory beneath
//! an allowed backend root (`--allowed-backend-root`), and mounts it with FUSE at
//! `<mount root>/<volume>` and reports Ready; CSI NodePublish bind-mounts that mount
//! point into the pod's target path (under the kubelet directory) and records it in
//! `spec.references`, which the agent re-binds after a repair and which holds back
//! the unmount when the MountPod is deleted.
//!
//! The node never imports the controller nor the CSI driver: they only meet in the
//! API objects.

pub mod agent;
pub mod backoff;
pub mod daemon_spec;
pub mod holder_process;
pub mod liveness;
pub mod mount_counters;
pub mod mount_service;
pub mod pods;
pub mod supervisor;
pub mod upgrade;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use tracing::{info, warn};

use tessera_host::mounts::HostMounts;
use tessera_host::roots::{AllowedRoots, RootArgs, RootScope};
use tessera_host::{TESSERA_DIR, paths};
use tessera_runtime::KubeError;
use tessera_runtime::labels::Labels;
use tessera_runtime::labels::parse_labels;
use tessera_runtime::metrics::Metrics;
use tessera_text::duration::parse_duration;

pub use mount_service::MountService;

/// Finalizer on MountPods: the node has unmounted (or, for RemoveData, finished)
/// before the MountPod goes.
pub const FINALIZER: &str = tessera_api::MOUNT_FINALIZER;

/// Command line of `tessera node`.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// This node's name (the MountPods labelled `tessera.io/node=<name>` are served).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Where FUSE mounts go: `<mount-root>/<volume>`.
    #[arg(long, default_value = "/var/lib/tessera/mounts")]
    pub mount_root: PathBuf,
    /// Where the agent keeps a record of each mount (for adoption after a restart),
    /// capacity files and daemon logs.
    #[arg(long, default_value = "/var/lib/tessera/node")]
    pub state_dir: PathBuf,
    /// Every reference's target path must be under this directory; others are refused.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// Address of the metrics and health endpoint.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub metrics_addr: SocketAddr,
    /// Only handle MountPods that also carry these labels (`key=value[,key=value]`),
    /// for sharding or for tests sharing a cluster.
    #[arg(long, value_parser = parse_labels)]
    pub watch_selector: Option<Labels>,
    /// How often every mount is checked (daemon alive, mount point answering): `500ms`,
    /// `2s`.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub health_interval: Duration,
    /// `--health-interval` in milliseconds: the flag's older spelling, still taken.
    #[arg(long, hide = true, conflicts_with = "health_interval")]
    pub health_interval_ms: Option<u64>,
    /// How long a mount point may take to answer a probe before it counts as silent.
    /// A mount that answered before is repaired only once silent for two start
    /// timeouts (a repair unmounts the connection its Pods hold).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub probe_timeout: Duration,
    /// `--probe-timeout` in milliseconds: the flag's older spelling, still taken.
    #[arg(long, hide = true, conflicts_with = "probe_timeout")]
    pub probe_timeout_ms: Option<u64>,
    /// Serve the CSI Identity and Node services on this unix socket
    /// (kubelet finds it through node-driver-registrar).
    #[arg(long, env = "CSI_ENDPOINT")]
    pub csi_endpoint: Option<String>,
    /// How long NodePublishVolume waits for the volume's mount on this node to be
    /// Ready (ControllerPublish returns once the ticket is granted, before the FUSE
    /// daemon has started): `60s`. Past it the call fails UNAVAILABLE, saying why, and
    /// the kubelet retries.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub publish_mount_timeout: Duration,
    /// How long a new daemon may take before its mount answers (`30s`; the older
    /// `--start-timeout-seconds` still works). In pod mode a mount Pod the kubelet is
    /// still creating (nothing failed: a busy node) gets four times as long.
    #[arg(long, default_value = "30s", value_parser = parse_duration, alias = "start-timeout-seconds")]
    pub start_timeout: Duration,
    /// Where the FUSE daemons run: `process`, as `setsid` children of the agent (bare
    /// hosts, and tests without nodes); `pod`, each in a mount Pod on this node, so
    /// that a restart or rollout of the agent's container touches no mount (the
    /// DaemonSet in `config/`, which then needs `hostPID`).
    #[arg(long, value_enum, default_value_t = MountMode::Process)]
    pub mount_mode: MountMode,
    /// Who mounts a volume: `agent` (the agent opens /dev/fuse, calls mount(2) and
    /// gives the connection to the fd holder; the daemon, started beside, answers
    /// the kernel's INIT and serves it, so NodePublish waits for the kernel mount and
    /// not for the daemon) or `daemon` (the daemon mounts, as before 0.2). Without an
    /// fd holder answering, the daemon mounts.
    #[arg(long, env = "TESSERA_MOUNTER", value_enum, default_value_t = Mounter::Agent)]
    pub mounter: Mounter,
    /// Image of the mount Pods. Default: the image of the agent's own container
    /// (read from its Pod, `POD_NAME`), so `kustomize edit set image` and the Helm
    /// chart's image move both together.
    #[arg(long, env = "MOUNT_IMAGE")]
    pub mount_image: Option<String>,
    /// Namespace of the mount Pods: the agent's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "tessera-system")]
    pub mount_namespace: String,
    /// Pod mode: the CPU request of a mount Pod whose Volume sets none.
    #[arg(long, default_value = "10m", value_parser = cpu_amount)]
    pub mount_cpu_request: Option<String>,
    /// Pod mode: the memory request of a mount Pod whose Volume sets none.
    #[arg(long, default_value = "32Mi", value_parser = memory_amount)]
    pub mount_memory_request: Option<String>,
    /// Pod mode: the CPU limit of a mount Pod whose Volume sets none (default: none;
    /// a throttled daemon slows every application of the volume).
    #[arg(long, value_parser = cpu_amount)]
    pub mount_cpu_limit: Option<String>,
    /// Pod mode: the memory limit of a mount Pod whose Volume sets none (default:
    /// none). The daemon sizes its caches to its limit; past it the kernel OOM-kills
    /// the daemon, which the agent reports on the application Pods.
    #[arg(long, value_parser = memory_amount)]
    pub mount_memory_limit: Option<String>,
    /// Pod mode: the mount Pods' extra labels and annotations, tolerations and
    /// priority class (`--mount-pod-*`).
    #[command(flatten)]
    pub mount_pod_extras: pods::extras::ExtrasArgs,
    /// The agent's own Pod (its image is the mount Pods' by default).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The largest CSI ephemeral inline volume a Pod may ask for (`size` in its
    /// `volumeAttributes`), as a quantity.
    #[arg(long, default_value = "10Gi", value_parser = parse_size)]
    pub inline_max_size: u64,
    /// How often the agent renews its node's liveness Lease (`tessera-node-<node>` in
    /// `--mount-namespace`; docs/failover.md); `0s`: none, and no MountPod asking for
    /// self-fencing can then be served.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub renew_interval: Duration,
    /// How long after the last successful renewal the node's self-fencing daemons
    /// stop completing writes (at least twice `--renew-interval`).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub fence_after: Duration,
    /// The backend roots MountPods may name (the node administrator's).
    #[command(flatten)]
    pub roots: RootArgs,
}

fn parse_size(s: &str) -> Result<u64, String> {
    tessera_api::quantity_bytes(s)
        .map_err(|e| e.to_string())
        .and_then(|b| match b {
            0 => Err("must be positive".into()),
            b => Ok(b),
        })
}

/// Where the FUSE daemons run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountMode {
    /// `setsid` children of the agent.
    Process,
    /// One mount Pod per MountPod.
    Pod,
}

/// Who makes a volume's FUSE mount (`--mounter`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mounter {
    /// The agent: mount(2) at once, the connection to the fd holder.
    Agent,
    /// The daemon, once it runs.
    Daemon,
}

/// Errors of the node agent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
    /// Node-side work failed.
    #[error(transparent)]
    MountService(#[from] mount_service::Error),
    /// The state directory could not be opened.
    #[error(transparent)]
    Supervisor(#[from] supervisor::Error),
    /// A blocking task panicked or was cancelled.
    #[error("node-side task")]
    Join(#[source] tokio::task::JoinError),
    /// A command-line argument is unusable.
    #[error("--{arg}: {message}")]
    InvalidArg {
        /// The argument.
        arg: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The role's shared parts (client, metrics, signals, CSI socket) could not start.
    #[error(transparent)]
    Runtime(#[from] tessera_runtime::Error),
}

/// The node-side work as the command line configures it: arguments checked, the
/// mount root created, the state directory opened. The FUSE daemons are this
/// binary (`/proc/self/exe mount …`).
pub fn mount_service_for(args: &NodeArgs) -> Result<MountService, Error> {
    paths::component(&args.node_name).map_err(|e| Error::InvalidArg {
        arg: "node-name",
        message: e.to_string(),
    })?;
    if !args.renew_interval.is_zero() && args.fence_after < args.renew_interval * 2 {
        return Err(Error::InvalidArg {
            arg: "fence-after",
            message: format!(
                "{:?} is less than twice --renew-interval ({:?})",
                args.fence_after, args.renew_interval
            ),
        });
    }
    let checked = |arg: &'static str, p: &PathBuf| {
        paths::absolute(&p.to_string_lossy()).map_err(|e| Error::InvalidArg {
            arg,
            message: e.to_string(),
        })
    };
    let mount_root = checked("mount-root", &args.mount_root)?;
    let state_dir = checked("state-dir", &args.state_dir)?;
    let kubelet_dir = checked("kubelet-dir", &args.kubelet_dir)?;
    std::fs::create_dir_all(&mount_root).map_err(|e| Error::InvalidArg {
        arg: "mount-root",
        message: e.to_string(),
    })?;
    if !kubelet_dir.is_dir() {
        warn!(kubelet_dir = %kubelet_dir.display(), "kubelet directory does not exist; every reference will be refused");
    }
    let allowed_roots = AllowedRoots::from_args(&args.roots).map_err(|e| Error::InvalidArg {
        arg: "allowed-backend-root",
        message: e.to_string(),
    })?;
    report_roots(&allowed_roots);
    let state = supervisor::StateDir::open(&state_dir)?;
    // The fd holder: daemons hand it their /dev/fuse descriptors, so one that dies is
    // taken over by a successor instead of remounted. Every daemon is told its socket
    // even while it does not answer, and hands its descriptor over once it does.
    // Process mode: the agent starts it (its own session). Pod mode: it runs in a
    // DaemonSet of its own (config/fd-holder.yaml) on the same socket, and the
    // successor of a dead daemon is the kubelet's restart of its mount container.
    let holder = match args.mount_mode {
        MountMode::Process => holder_process::HolderProcess::new(
            PathBuf::from("/proc/self/exe"),
            state.holder_socket(),
            state.log_file("_fd-holder"),
        ),
        MountMode::Pod => holder_process::HolderProcess::connect_only(state.holder_socket()),
    };
    // Asked again (process mode: started again) on every health tick.
    holder.check();
    let holder = Some(Arc::new(holder));
    Ok(MountService {
        config: mount_service::Config {
            mount_root,
            kubelet_dir,
            allowed_roots,
            probe_timeout: args
                .probe_timeout_ms
                .map_or(args.probe_timeout, Duration::from_millis)
                .max(Duration::from_millis(1)),
            start_timeout: args.start_timeout.max(Duration::from_secs(1)),
            stop_grace: Duration::from_secs(5),
            fencing: !args.renew_interval.is_zero(),
            agent_mounts: args.mounter == Mounter::Agent,
        },
        mounts: Arc::new(HostMounts::new()),
        // The agent's own binary, even if the file was replaced since it started.
        daemons: Arc::new(supervisor::HostDaemons::new(PathBuf::from(
            "/proc/self/exe",
        ))),
        state,
        holder,
        shared: Default::default(),
        hung: Default::default(),
    })
}

/// The NodeLocal roots beneath `own` (Tessera's directory): the ones the agent may
/// create. Shared roots never (a directory of the node's own disk would pass for
/// the share), nor roots elsewhere (a disk not mounted yet).
pub fn own_roots<'a>(roots: &'a AllowedRoots, own: &Path) -> Vec<&'a Path> {
    roots
        .entries()
        .iter()
        .filter(|e| e.scope == RootScope::NodeLocal && e.path.starts_with(own) && e.path != own)
        .map(|e| e.path.as_path())
        .collect()
}

/// Say at start which roots this node serves: each with its scope, whether it exists
/// here, and the roots given without a scope (read as Shared, verified). A NodeLocal
/// root beneath Tessera's own directory is created first if missing (through file
/// descriptors from that directory, no symlink followed).
fn report_roots(roots: &AllowedRoots) {
    let own = Path::new(TESSERA_DIR);
    for root in own_roots(roots, own) {
        if root.is_dir() || !own.is_dir() {
            continue;
        }
        let b = tessera_host::roots::Beneath {
            root: own.to_path_buf(),
            rel: root.strip_prefix(own).expect("beneath").to_path_buf(),
        };
        match tessera_host::roots::create_beneath(&b) {
            Ok(_) => info!(root = %root.display(), "created the NodeLocal backend root"),
            Err(errno) => {
                warn!(root = %root.display(), %errno, "could not create the NodeLocal backend root")
            }
        }
    }
    for e in roots.entries() {
        let exists = e.path.is_dir();
        info!(root = %e.path.display(), scope = %e.scope, declared = e.declared, exists, "backend root");
        if !exists {
            warn!(root = %e.path.display(), scope = %e.scope, "backend root absent on this node: volumes there are not served here");
        }
    }
    let undeclared = roots.undeclared();
    if !undeclared.is_empty() {
        warn!(roots = ?undeclared, "backend roots without a scope are read as Shared and verified before a node serves them; declare each `PATH Shared` or `PATH NodeLocal`");
    }
}

fn cpu_amount(s: &str) -> Result<String, String> {
    tessera_api::cpu_millis(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

fn memory_amount(s: &str) -> Result<String, String> {
    tessera_api::memory_bytes(s)
        .map(|_| s.to_string())
        .ok_or_else(|| format!("{s:?} is not an amount of memory from 16Mi to 64Gi"))
}

/// The mount Pods' requests and limits where a Volume sets none.
fn default_mount_resources(args: &NodeArgs) -> tessera_api::MountResources {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let q = |s: &Option<String>| s.clone().map(Quantity);
    tessera_api::MountResources {
        requests: tessera_api::ResourceAmounts {
            cpu: q(&args.mount_cpu_request),
            memory: q(&args.mount_memory_request),
        },
        limits: tessera_api::ResourceAmounts {
            cpu: q(&args.mount_cpu_limit),
            memory: q(&args.mount_memory_limit),
        },
    }
}

/// The image mount Pods run and how the kubelet pulls it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountImage {
    pub image: String,
    /// `None`: the cluster's default.
    pub pull_policy: Option<String>,
    /// The names of the Secrets in the agent's namespace.
    pub pull_secrets: Vec<String>,
}

/// What mount Pods take from the agent's own Pod: the image (`--mount-image`, else
/// that of its container that runs `node`), that container's pull policy, and the Pod's
/// `imagePullSecrets` (whatever pulls the agent's image pulls theirs). Pure: `own` is
/// the agent's Pod as read, `None` where it could not be.
pub fn mount_image_from(
    own: Option<&Pod>,
    own_name: &str,
    mount_image: Option<&str>,
) -> Result<MountImage, String> {
    let pull_secrets = own
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.image_pull_secrets.as_ref())
        .map(|refs| {
            refs.iter()
                .map(|r| r.name.clone())
                .filter(|n| !n.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if let Some(image) = mount_image {
        return Ok(MountImage {
            image: image.to_string(),
            pull_policy: None,
            pull_secrets,
        });
    }
    let pod = own.ok_or_else(|| format!("the agent's Pod {own_name} could not be read"))?;
    let c = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.args.iter().flatten().next().map(String::as_str) == Some("node"))
        .ok_or_else(|| format!("no container of Pod {own_name} runs `node`"))?;
    let image = c
        .image
        .clone()
        .ok_or_else(|| format!("the agent's container in {own_name} names no image"))?;
    Ok(MountImage {
        image,
        pull_policy: c.image_pull_policy.clone(),
        pull_secrets,
    })
}

/// In pod mode, replace `host`'s daemons by mount Pods: the image is `--mount-image`
/// or the agent's own (its Pod's container that runs `node`, with its pull policy),
/// pulled with the agent's Pod's `imagePullSecrets` ([`mount_image_from`]).
pub async fn use_mount_pods(
    args: &NodeArgs,
    client: &Client,
    host: &mut MountService,
) -> Result<(), Error> {
    if args.mount_mode != MountMode::Pod {
        return Ok(());
    }
    let invalid = |message: String| Error::InvalidArg {
        arg: "mount-image",
        message,
    };
    let own_name = args.pod_name.clone().unwrap_or_default();
    let own = match &args.pod_name {
        None if args.mount_image.is_none() => {
            return Err(invalid(
                "not given, and POD_NAME does not name the agent's Pod to take it from".into(),
            ));
        }
        None => None,
        Some(own) => match Api::<Pod>::namespaced(client.clone(), &args.mount_namespace)
            .get(own)
            .await
        {
            Ok(pod) => Some(pod),
            Err(e) if args.mount_image.is_none() => {
                return Err(invalid(format!("reading the agent's Pod {own}: {e}")));
            }
            Err(e) => {
                warn!(pod = %own, error = %e, "cannot read the agent's Pod: mount Pods get no imagePullSecrets");
                None
            }
        },
    };
    let MountImage {
        image,
        pull_policy,
        pull_secrets: image_pull_secrets,
    } = mount_image_from(own.as_ref(), &own_name, args.mount_image.as_deref()).map_err(invalid)?;
    info!(%image, namespace = %args.mount_namespace, pull_secrets = ?image_pull_secrets, "pod mode: each mount in a mount Pod");
    let extras = args
        .mount_pod_extras
        .extras()
        .map_err(|e| Error::InvalidArg {
            arg: "mount-pod-*",
            message: e.to_string(),
        })?;
    for key in pods::spec::overridden(&extras) {
        warn!(%key, "--mount-pod-*: Tessera sets this on every mount Pod itself; its own value wins");
    }
    let template = pods::Template {
        namespace: args.mount_namespace.clone(),
        node: args.node_name.clone(),
        image,
        pull_policy,
        image_pull_secrets,
        mount_root: host.config.mount_root.clone(),
        state_dir: host.state.root().to_path_buf(),
        termination_grace_seconds: 30,
        resources: default_mount_resources(args),
        extras,
    };
    host.daemons = Arc::new(pods::PodDaemons::new(
        client.clone(),
        tokio::runtime::Handle::current(),
        template,
        host.config.start_timeout,
    ));
    Ok(())
}

/// Run the agent of `args.node_name` over `host` until the future is dropped. The
/// FUSE daemons keep running when the agent stops; the next agent adopts them.
pub async fn run_agent(
    args: &NodeArgs,
    client: Client,
    metrics: Arc<Metrics>,
    host: Arc<MountService>,
) {
    let mount_pods = (args.mount_mode == MountMode::Pod).then(|| args.mount_namespace.clone());
    let renewal = liveness::Renewal {
        namespace: args.mount_namespace.clone(),
        node: args.node_name.clone(),
        interval: args.renew_interval,
        fence_after: args.fence_after,
        roots: host.config.allowed_roots.roots().to_vec(),
    };
    let state = host.state.clone();
    let lease = async {
        if renewal.interval.is_zero() {
            std::future::pending::<()>().await;
        }
        liveness::run(client.clone(), state, renewal).await
    };
    let agent = agent::run(
        client.clone(),
        metrics,
        host,
        args.node_name.clone(),
        args.watch_selector.clone().unwrap_or_default(),
        args.health_interval_ms
            .map_or(args.health_interval, Duration::from_millis)
            .max(Duration::from_millis(10)),
        mount_pods,
    );
    futures::future::join(agent, lease).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nodelocal_roots_in_tesseras_own_directory_are_created() {
        let roots = AllowedRoots::new([
            "/var/lib/tessera/volumes NodeLocal",
            "/var/lib/tessera/shared Shared",
            "/var/lib/tessera/old",
            "/var/lib/tessera NodeLocal",
            "/mnt/ssd/tessera NodeLocal",
            "/var/lib/tesserax NodeLocal",
            "/mnt/shared/tessera Shared",
        ])
        .unwrap();
        assert_eq!(
            own_roots(&roots, Path::new(TESSERA_DIR)),
            vec![Path::new("/var/lib/tessera/volumes")]
        );
        assert_eq!(
            own_roots(&AllowedRoots::default(), Path::new(TESSERA_DIR)),
            vec![Path::new(tessera_host::roots::DEFAULT_ROOT)]
        );
    }

    #[test]
    fn parses_selectors() {
        let l = parse_labels("tessera.io/test=a,x=y").unwrap();
        assert_eq!(l.selector(), "tessera.io/test=a,x=y");
        assert!(parse_labels("nokey").is_err());
    }

    #[test]
    fn arguments_have_the_documented_defaults() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            node: NodeArgs,
        }
        let cli = Cli::try_parse_from(["t", "--node-name", "n1"]).unwrap();
        assert_eq!(
            cli.node.mount_root,
            PathBuf::from("/var/lib/tessera/mounts")
        );
        assert_eq!(cli.node.state_dir, PathBuf::from("/var/lib/tessera/node"));
        assert_eq!(cli.node.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(cli.node.metrics_addr.port(), 8081);
        assert_eq!(cli.node.health_interval, Duration::from_millis(500));
        assert_eq!(cli.node.probe_timeout, Duration::from_secs(2));
        assert_eq!(cli.node.start_timeout, Duration::from_secs(30));
        let old = [
            "t",
            "--node-name=n",
            "--health-interval-ms=250",
            "--probe-timeout-ms=900",
        ];
        let cli = Cli::try_parse_from(old).unwrap();
        assert_eq!(cli.node.health_interval_ms, Some(250));
        assert_eq!(cli.node.probe_timeout_ms, Some(900));
        let both = [
            "t",
            "--node-name=n",
            "--health-interval-ms=250",
            "--health-interval=1s",
        ];
        assert!(Cli::try_parse_from(both).is_err());
        let cli = Cli::try_parse_from(["t", "--node-name=n", "--start-timeout-seconds=5"]).unwrap();
        assert_eq!(cli.node.start_timeout, Duration::from_secs(5));
        assert_eq!(cli.node.mount_mode, MountMode::Process);
        let cli = Cli::try_parse_from(["t", "--node-name", "n1", "--mount-mode=pod"]).unwrap();
        assert_eq!(cli.node.mount_mode, MountMode::Pod);
    }

    /// The agent's Pod as the DaemonSet makes it: a registrar, the agent, and the
    /// pull secrets given.
    fn agent_pod(secrets: &[&str]) -> Pod {
        use k8s_openapi::api::core::v1::{Container, LocalObjectReference, PodSpec};
        let container = |name: &str, image: &str, arg: &str| Container {
            name: name.into(),
            image: Some(image.into()),
            image_pull_policy: Some("IfNotPresent".into()),
            args: Some(vec![arg.into()]),
            ..Container::default()
        };
        Pod {
            spec: Some(PodSpec {
                containers: vec![
                    container("registrar", "reg/registrar:1", "--csi-address=x"),
                    container("tessera", "reg/tessera:1", "node"),
                ],
                image_pull_secrets: (!secrets.is_empty()).then(|| {
                    secrets
                        .iter()
                        .map(|n| LocalObjectReference {
                            name: n.to_string(),
                        })
                        .collect()
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn mount_pods_take_the_agents_image_and_pull_secrets() {
        let with = agent_pod(&["pull", "other"]);
        let without = agent_pod(&[]);
        let ok = |image: &str, policy: Option<&str>, secrets: &[&str]| {
            Ok(MountImage {
                image: image.to_string(),
                pull_policy: policy.map(String::from),
                pull_secrets: secrets.iter().map(|s| s.to_string()).collect(),
            })
        };
        type Case<'a> = (
            &'a str,
            Option<&'a Pod>,
            Option<&'a str>,
            Result<MountImage, String>,
        );
        let cases: [Case; 5] = [
            (
                "own image, policy and secrets",
                Some(&with),
                None,
                ok("reg/tessera:1", Some("IfNotPresent"), &["pull", "other"]),
            ),
            (
                "no secrets on the agent: none on mount Pods",
                Some(&without),
                None,
                ok("reg/tessera:1", Some("IfNotPresent"), &[]),
            ),
            (
                "--mount-image: that image, the cluster's policy, the agent's secrets",
                Some(&with),
                Some("mine/tessera:2"),
                ok("mine/tessera:2", None, &["pull", "other"]),
            ),
            (
                "--mount-image, agent's Pod unreadable: no secrets",
                None,
                Some("mine/tessera:2"),
                ok("mine/tessera:2", None, &[]),
            ),
            (
                "no --mount-image and no Pod: an error",
                None,
                None,
                Err("the agent's Pod a could not be read".to_string()),
            ),
        ];
        for (what, own, flag, want) in cases {
            assert_eq!(mount_image_from(own, "a", flag), want, "{what}");
        }
    }
}
