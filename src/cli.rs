//! The roles of the `tessera` binary, wired in one place: here a role's parts meet
//! (the node agent and the CSI Node service share the host's mounts), so that no
//! component imports another.
//!
//! | subcommand   | role |
//! |--------------|------|
//! | `crds`       | print the CRDs generated from [`tessera_api`] (the content of `crds/`) |
//! | `controller` | Volume, VolumeAttachment and reaper controllers + CSI Identity and Controller |
//! | `node`       | node agent: FUSE mounts for this node's MountPods + CSI Identity and Node |
//! | `mount`      | the FUSE filesystem of one volume on one node |
//! | `fd-holder`  | keeps the mounts' /dev/fuse descriptors for successor daemons (process mode: the agent starts it; pod mode: its DaemonSet) |
//! | `preflight`  | one node's part of `kubectl tessera preflight`: read the host, leave and look for markers in the roots |
//!
//! The long-running roles start the same way ([`tessera_runtime`]): tracing, a client,
//! the metrics endpoint, SIGINT/SIGTERM, the CSI socket; then their own work until a
//! signal.

use std::io::Write;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tracing::info;

use tessera_runtime::{self as runtime, Shutdown};

/// Command line of the `tessera` binary.
#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "Kubernetes volumes through FUSE mounts, arbitrated by attachment tickets"
)]
pub struct Args {
    /// The role to run.
    #[command(subcommand)]
    pub command: Command,
    /// Logging, for every role.
    #[command(flatten)]
    pub log: runtime::LogArgs,
}

/// The roles.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions generated from the Rust types.
    Crds,
    /// Run the controllers and the CSI Identity and Controller services.
    Controller(tessera_controller::ControllerArgs),
    /// Run the node agent and the CSI Identity and Node services (boxed: the largest
    /// of the roles' arguments).
    Node(Box<tessera_node::NodeArgs>),
    /// Serve one volume through FUSE.
    #[command(name = tessera_fuse::contract::args::MOUNT)]
    Mount(tessera_fuse::contract::args::MountArgs),
    /// Hold the mounts' /dev/fuse descriptors for successor daemons.
    #[command(name = tessera_fuse::contract::args::FD_HOLDER)]
    FdHolder(tessera_fuse::contract::args::HolderArgs),
    /// One node's part of `kubectl tessera preflight` (run in a Pod the plugin starts).
    Preflight(tessera_host::preflight::PreflightArgs),
}

/// Run the role named on the command line.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Crds => {
            let yaml = tessera_api::crds_yaml()?;
            std::io::stdout().lock().write_all(yaml.as_bytes())?;
            Ok(())
        }
        Command::Mount(mount) => {
            runtime::init_tracing(&args.log);
            Ok(tessera_fuse::run(mount)?)
        }
        Command::FdHolder(holder) => {
            runtime::init_tracing(&args.log);
            Ok(tessera_fuse::fd_holder::run(holder)?)
        }
        Command::Preflight(p) => Ok(tessera_host::preflight::run(p)?),
        Command::Controller(args_) => {
            runtime::init_tracing(&args.log);
            let rt = tokio::runtime::Runtime::new()?;
            Ok(rt.block_on(controller(args_))?)
        }
        Command::Node(node_args) => {
            runtime::init_tracing(&args.log);
            let rt = tokio::runtime::Runtime::new()?;
            Ok(rt.block_on(node(*node_args))?)
        }
    }
}

/// `tessera controller`: the controllers, and the CSI Identity and Controller services
/// on the same client, until SIGINT or SIGTERM.
pub async fn controller(
    args: tessera_controller::ControllerArgs,
) -> Result<(), tessera_controller::Error> {
    use tessera_controller::Error;
    let metrics = tessera_runtime::metrics::Metrics::controller();
    let client = runtime::connect(&metrics.api_requests).await?;
    let metrics = runtime::start_metrics(args.metrics_addr, metrics).await?;
    let shutdown = Shutdown::listen()?;
    let allowed_roots =
        tessera_host::roots::AllowedRoots::from_args(&args.roots).map_err(Error::AllowedRoots)?;
    if let Some(endpoint) = &args.csi_endpoint {
        let service = tessera_csi::controller::ControllerService::new(
            client.clone(),
            tessera_csi::controller::Settings {
                default_backend_root: args.default_backend_root.clone(),
                publish_timeout: args.publish_timeout,
                unpublish_timeout: args.publish_timeout,
                capacity_bytes: args.capacity_bytes,
                lease_namespace: args.namespace.clone(),
                labels: args.watch_selector.clone().unwrap_or_default(),
                allowed_roots: allowed_roots.clone(),
            },
        );
        runtime::csi::spawn(
            endpoint,
            "identity and controller",
            tessera_csi::controller_services(service),
            shutdown.clone(),
        )
        .map_err(runtime::Error::from)?;
    }
    tessera_controller::run(&args, client, metrics, shutdown, allowed_roots).await
}

/// `tessera node`: the node agent, and the CSI Node service over the same host
/// mounts, until SIGINT or SIGTERM. The FUSE daemons keep running when it stops;
/// the next agent adopts them.
pub async fn node(args: tessera_node::NodeArgs) -> Result<(), tessera_node::Error> {
    let mut host = tessera_node::mount_service_for(&args)?;
    let metrics = tessera_runtime::metrics::Metrics::agent();
    let claims = metrics.claims.clone();
    let metrics =
        metrics.with_collector(Box::new(tessera_node::mount_counters::MountCounters::new(
            host.state.mounts_dir(),
            args.node_name.clone(),
            claims,
        )));
    let client = runtime::connect(&metrics.api_requests).await?;
    tessera_node::use_mount_pods(&args, &client, &mut host).await?;
    let host = Arc::new(host);
    let metrics = runtime::start_metrics(args.metrics_addr, metrics).await?;
    let shutdown = Shutdown::listen()?;
    if let Some(endpoint) = &args.csi_endpoint {
        let service = tessera_csi::node::NodeService::new(
            client.clone(),
            args.node_name.clone(),
            host.config.kubelet_dir.clone(),
            host.mounts.clone(),
            tessera_csi::node::ephemeral::Settings {
                max_bytes: args.inline_max_size,
                labels: args.watch_selector.clone().unwrap_or_default(),
                ..tessera_csi::node::ephemeral::Settings::new(host.config.allowed_roots.clone())
            },
        )
        .with_mount_wait(args.publish_mount_timeout);
        runtime::csi::spawn(
            endpoint,
            "identity and node",
            tessera_csi::node_services(service),
            shutdown.clone(),
        )
        .map_err(runtime::Error::from)?;
    }
    let agent = tessera_node::run_agent(&args, client, metrics, host);
    if let Err(signal) = shutdown.run_until(agent).await {
        info!(%signal, node = %args.node_name, "stopping; fuse daemons keep running");
    }
    Ok(())
}
