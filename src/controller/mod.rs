//! `tessera controller`: the Volume, VolumeAttachment and reaper controllers.
//!
//! ```text
//!  Volume ──▶ volume::reconcile ──▶ creates the VolumeAttachment (owned, same name);
//!                                   on delete: adds a cleanup ticket, waits, lets go
//!  VolumeAttachment ─┐
//!  Volume ───────────┤
//!  MountPod ─────────┼─▶ attachment::reconcile ──▶ tickets::decide (pure)
//!  Node (names) ─────┘        │ MountPods created/deleted per the decision
//!                             │ ticket statuses + Volume status written (SSA, status only)
//!  Node, storage VA, clock ─▶ reaper ──▶ removes Tessera's own tickets nothing stands
//!                                        behind (+ Event); never another manager's
//! ```
//!
//! Everything is level-triggered: a reconcile reads the current objects, decides, and
//! writes only what differs, so killing the process at any point and starting it again
//! converges to the same state. One replica acts at a time (leader election on a
//! Lease). All writes use one field manager, [`FIELD_MANAGER`]; tickets are upserted
//! with merge patches (never server-side apply), so Tessera never takes ownership of,
//! or removes, a ticket that a GitOps tool applied.
//!
//! The controllers are [`volume`], [`attachment`] and [`reaper`]; `wiring` runs them on
//! the shared watches of `watch` with one [`Context`]; [`own_writes`] keeps the
//! controller's writes until the caches show them; [`events`] publishes Events;
//! [`protection`] keeps a VolumeAttachment in use from being deleted and rebuilds one
//! that was.

mod args;
pub mod attachment;
mod context;
mod error;
pub mod events;
pub mod leader;
pub mod own_writes;
pub mod protection;
pub mod reaper;
pub mod volume;
mod watch;
mod wiring;

use std::time::Duration;

use tracing::{error, info};

pub use self::args::ControllerArgs;
pub use self::context::Context;
pub use self::error::Error;
pub(crate) use self::error::KubeContext;
pub use self::watch::CachesReady;
pub use crate::labels::Labels;
use crate::runtime;

/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "tessera-controller";
/// Finalizer on Volumes: the data is removed (through a cleanup ticket) before the
/// Volume goes.
pub const VOLUME_FINALIZER: &str = "tessera.io/volume-data";
/// Annotation on a Volume: `Retain` keeps the data when the Volume is deleted.
pub const ANNOTATION_RECLAIM: &str = "tessera.io/reclaim-policy";

/// Run the controller role until a signal or a lost election.
pub async fn run(args: ControllerArgs) -> Result<(), Error> {
    let client = runtime::connect().await?;
    let metrics = runtime::start_metrics(args.metrics_addr).await?;
    let shutdown = runtime::Shutdown::listen()?;
    let allowed_roots =
        crate::host::roots::AllowedRoots::from_args(&args.roots).map_err(Error::AllowedRoots)?;
    if let Some(endpoint) = &args.csi_endpoint {
        let service = crate::csi::controller::ControllerService::new(
            client.clone(),
            crate::csi::controller::Settings {
                default_backend_root: args.default_backend_root.clone(),
                publish_timeout: Duration::from_secs(args.publish_timeout_seconds),
                unpublish_timeout: Duration::from_secs(args.publish_timeout_seconds),
                capacity_bytes: args.capacity_bytes,
                labels: args.watch_selector.clone().unwrap_or_default(),
                allowed_roots: allowed_roots.clone(),
            },
        );
        runtime::csi::spawn(
            endpoint,
            "identity and controller",
            crate::csi::controller_services(service),
            shutdown.clone(),
        )
        .map_err(runtime::Error::from)?;
    }

    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let elector = (!args.no_leader_election).then(|| {
        leader::Elector::new(
            client.clone(),
            leader::LeaseConfig {
                namespace: args.namespace.clone(),
                name: args.lease_name.clone(),
                identity: identity.clone(),
                duration: Duration::from_secs(15),
                renew: Duration::from_secs(2),
            },
        )
    });
    if let Some(elector) = &elector {
        info!(lease = %args.lease_name, %identity, "waiting for leadership");
        elector.acquire().await?;
    }

    let run = wiring::run_controllers(client, metrics.clone(), &args, identity, allowed_roots);
    tokio::select! {
        () = run => Ok(()),
        err = async {
            match &elector {
                Some(e) => e.hold().await,
                None => std::future::pending().await,
            }
        } => {
            error!(error = %err, "stepping down");
            Err(err.into())
        }
        signal = shutdown.clone().requested() => { info!(%signal, "stopping"); Ok(()) }
    }
}
