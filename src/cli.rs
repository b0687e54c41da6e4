//! The roles of the `tessera` binary, wired in one place.
//!
//! | subcommand   | role |
//! |--------------|------|
//! | `crds`       | print the CRDs generated from [`crate::api`] (the content of `crds/`) |
//! | `controller` | Volume, VolumeAttachment and MountPod controllers + CSI controller service |
//! | `node`       | node agent: FUSE mounts for this node's MountPods + CSI node service |
//! | `mount`      | the FUSE filesystem of one volume on one node |

use std::io::Write;

use clap::{Parser, Subcommand};

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
}

/// The roles.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions generated from the Rust types.
    Crds,
    /// Run the controllers (and, later, the CSI controller service).
    Controller(crate::controller::ControllerArgs),
    /// Run the node agent (and, later, the CSI node service).
    Node(crate::node::NodeArgs),
    /// Serve one volume through FUSE.
    Mount(crate::fuse::MountArgs),
}

/// Run the role named on the command line.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Crds => {
            let yaml = crate::api::crds_yaml()?;
            std::io::stdout().lock().write_all(yaml.as_bytes())?;
            Ok(())
        }
        Command::Mount(args) => Ok(crate::fuse::run(args)?),
        Command::Controller(args) => {
            init_tracing();
            let rt = tokio::runtime::Runtime::new()?;
            Ok(rt.block_on(crate::controller::run(args))?)
        }
        Command::Node(args) => {
            init_tracing();
            let rt = tokio::runtime::Runtime::new()?;
            Ok(rt.block_on(crate::node::run(args))?)
        }
    }
}

/// Structured logs on stderr; `RUST_LOG` filters (default `info`), `TESSERA_LOG_FORMAT=json`
/// switches to JSON lines.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("TESSERA_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
