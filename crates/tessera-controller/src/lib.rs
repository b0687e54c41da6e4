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
//!                                        behind (+ Event); never another manager's;
//!                                        deletes inline Volumes whose Pod is gone ([`inline`])
//! ```
//!
//! Everything is level-triggered: a reconcile reads the current objects, decides, and
//! writes only what differs, so killing the process at any point and starting it again
//! converges to the same state. One replica acts at a time (leader election on a
//! Lease). All writes use one field manager, [`tessera_api::CONTROLLER_FIELD_MANAGER`]; tickets are upserted
//! with merge patches (never server-side apply), so Tessera never takes ownership of,
//! or removes, a ticket that a GitOps tool applied.
//!
//! | module | owns |
//! |---|---|
//! | [`volume`] | the Volume controller: its VolumeAttachment; a deleted Volume's data removed through a ticket |
//! | [`attachment`] | the VolumeAttachment controller: gather → [`attachment::plan`] (pure) → execute |
//! | [`reaper`] | removes Tessera's own tickets nothing stands behind (+ Event) |
//! | [`inline`] | inline Volumes whose Pod is gone: their tickets removed, the Volume deleted |
//! | [`protection`] | keeps a VolumeAttachment in use from being deleted, and rebuilds one that was |
//! | [`failover`] | the pure decision of fenced failover (docs/failover.md): which nodes are fenced, which tickets may go |
//! | `wiring` | runs the controllers on the shared watches with one [`Context`] |
//! | `watch` | the shared watches: one per kind fills the caches and fans objects out to the controllers |
//! | [`index`] | MountPods by volume, kept from the same watch events |
//! | `context` | what every controller shares: [`Context`], the [`Caches`] |
//! | [`own_writes`] | the controller's writes, kept until the caches show them |
//! | `echoes` | the versions the attachment controller wrote, so their watch events do not reconcile it again |
//! | [`events`] | publishes Events, off the reconcile's path |
//! | [`pace`] | how long a new attach goes unreported, from the backlog of attaches and how long the last ones took |
//! | [`anchor`] | the anchor node of each backend root declared Shared |
//! | [`owner`] | the owner references on what the controller creates for a Volume |
//! | [`leader`] | leader election on a Lease: one replica acts |
//! | [`state_metrics`] | the state gauges and per-object series, counted from the caches |
//! | `error` | the controllers' [`Error`], and how a failed reconcile is logged |
//! | `args` | the command line, [`ControllerArgs`] |

pub mod anchor;
mod args;
pub mod attachment;
mod context;
mod echoes;
mod error;
pub mod events;
pub mod failover;
pub mod index;
pub mod inline;
pub mod leader;
pub mod own_writes;
pub mod owner;
pub mod pace;
pub mod protection;
pub mod reaper;
pub mod state_metrics;
pub mod volume;
mod watch;
mod wiring;

use tracing::{error, info, warn};

use tessera_runtime as runtime;
use tessera_runtime::labels::Labels;

pub use self::args::ControllerArgs;
pub use self::context::{Caches, Context};
pub use self::error::Error;
pub(crate) use self::error::KubeContext;
pub use self::watch::CachesReady;

/// Run the controllers until a signal: lead (or wait to), step down when the lease is
/// lost, and release the lease on a graceful stop. `cli::controller` starts what the
/// role shares with the CSI Controller service (client, metrics, signals) first.
pub async fn run(
    args: &ControllerArgs,
    client: kube::Client,
    metrics: std::sync::Arc<tessera_runtime::metrics::Metrics>,
    shutdown: runtime::Shutdown,
    allowed_roots: tessera_host::roots::AllowedRoots,
) -> Result<(), Error> {
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
                duration: args.lease_duration,
                renew: args.lease_renew_interval,
            },
        )
    });

    // What this process sees of the nodes' liveness Leases, from its start: a standby
    // watches them too, so that a new leader (the old one died, perhaps with a node)
    // counts each node's fence wait from the last renewal it saw, not from its
    // takeover. The set aborts the watch when `run` returns.
    let witness = std::sync::Arc::new(failover::Witness::new());
    let mut standby = tokio::task::JoinSet::new();
    if elector.is_some() {
        standby.spawn(failover::witness::watch(
            client.clone(),
            args.namespace.clone(),
            witness.clone(),
        ));
    }

    // Lead until the lease is lost (it could not be renewed in time, say while the API
    // server was away): then stop acting at once — every controller and watch is
    // dropped, so nothing is decided on a view that may be stale — and stand for
    // election again with fresh caches.
    loop {
        if let Some(elector) = &elector {
            info!(lease = %args.lease_name, %identity, "waiting for leadership");
            tokio::select! {
                () = elector.acquire() => {}
                signal = shutdown.clone().requested() => {
                    info!(%signal, "stopping");
                    return Ok(());
                }
            }
        }
        let run = wiring::run_controllers(
            client.clone(),
            metrics.clone(),
            args,
            identity.clone(),
            allowed_roots.clone(),
            witness.clone(),
        );
        tokio::select! {
            () = run => return Ok(()),
            err = async {
                match &elector {
                    Some(e) => e.hold().await,
                    None => std::future::pending().await,
                }
            } => {
                metrics.set_ready(false);
                error!(error = %err, "stepping down; standing for election again");
            }
            signal = shutdown.clone().requested() => {
                info!(%signal, "stopping");
                if let Some(elector) = &elector
                    && let Err(e) = elector.release().await
                {
                    warn!(error = %runtime::error_chain(&e), "releasing the lease failed; the next leader waits for it to expire");
                }
                return Ok(());
            }
        }
    }
}
