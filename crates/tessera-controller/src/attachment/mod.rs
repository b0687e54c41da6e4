//! The VolumeAttachment controller: runs ticket arbitration for one volume and makes
//! the world match the decision. The reconcile reads, [`plan`]s (pure: what to write,
//! in which order, which Events, when to come back) and [`execute`](mod@execute)s, phase by phase;
//! [`Ctx`] is what it is handed: the shared [`Context`] and this controller's own
//! [`State`].
//!
//! ```text
//!  VolumeAttachment (tickets) + Volume + MountPods (cache + own writes)
//!        │ input::gather (+ sightings: first sighting of undated tickets)
//!        │   ─▶ tickets::decide ─▶ Decision { nodes, outcome per ticket }
//!        ▼
//!  mountpods::sync_mountpods: delete on dropped nodes, create (POST) on chosen ones
//!        │ (decided again if it only attached)
//!        ▼
//!  detaching: a MountPod still there 2 s after its deletion timestamp ─▶ one
//!             Detaching Event; back when the next one is due; until then, the
//!             Volume status is not written for it (only the VolumeAttachment's)
//!        ▼
//!  a new attach, under its quiet time (1 s; more while many wait together: pace),
//!  nothing else changed? ─▶ no write; back when it may be slow
//!        ▼
//!  a large VolumeAttachment (≥ 100 tickets) written less than 2 s ago
//!  (runtime::spacing)? ─▶ no write yet; back when the period is over
//!        ▼
//!  recheck: a single-node ticket about to be satisfied ─▶ MountPods on the other
//!           candidate nodes re-read, decided again
//!        ▼
//!  status::attachment_status_holding ─▶ VolumeAttachment status (SSA, status subresource)
//!  status::volume_status ─────▶ Volume status             (SSA, status subresource)
//!                               + one Event per node that started (if slow), finished
//!                                 attaching or detaching
//! ```
//!
//! Nothing is written when nothing changed, and an attach that completes within
//! its quiet time ([`status::ATTACH_QUIET`], longer while many attaches wait together,
//! see `controller::pace`) writes each status once, when it is done; so does a detach
//! on the Volume (within [`detaching::DETACH_QUIET`]; the VolumeAttachment drops the
//! ticket's status at once). Ticket changes
//! that arrive while a volume's reconcile runs or is queued are decided together by
//! the next one (kube-runtime runs one reconcile per object at a time and folds the
//! triggers queued meanwhile), so a VolumeAttachment's status is written at most once
//! per reconcile, whatever the number of tickets that changed.
//!
//! A ticket of a single-node volume is never declared satisfied from the cache alone:
//! the status write carries the resourceVersion of the VolumeAttachment the decision
//! read (the API server refuses it if any ticket changed since), and the MountPods of
//! the other nodes the volume could be on are read from the API server and the
//! decision is recomputed, so a stale cache cannot make two nodes look like owners.

pub mod detaching;
pub mod execute;
pub mod input;
pub mod mountpods;
pub mod plan;
pub mod sightings;
pub mod status;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, instrument};

use tessera_api::{MountPod, VolumeAttachment};
use tessera_runtime::error_chain;

use self::execute::execute;
use self::plan::{AfterSync, Facts, Hold, Next, Start};
use super::context::measured;
use super::echoes::Echoes;
use super::own_writes::OwnWrites;
use super::owner::of_previous_volume;
use super::{Context, Error};

pub use self::input::{gather, mount_view};
pub use self::mountpods::desired_spec;

/// What the attachment reconcile is handed: the context every controller shares, and
/// this controller's own state.
pub struct Ctx {
    /// Client, caches, the Volumes and VolumeAttachments written, metrics, Events.
    pub shared: Arc<Context>,
    /// What this controller keeps across reconciles.
    pub state: State,
}

impl Ctx {
    /// The attachment controller on `shared`; `echoes` is shared with the watches,
    /// which drop the versions this controller wrote.
    pub fn new(shared: Arc<Context>, echoes: Arc<Echoes>) -> Self {
        Ctx {
            shared,
            state: State {
                echoes,
                ..Default::default()
            },
        }
    }
}

/// The attachment controller's own state, kept across reconciles.
#[derive(Default)]
pub struct State {
    /// The versions this controller wrote, not to be reconciled again.
    pub echoes: Arc<Echoes>,
    /// MountPods as this controller last wrote (or deleted) them, until the cache
    /// shows it.
    pub written_mountpods: OwnWrites<MountPod>,
    /// When each ticket not yet dated by its VolumeAttachment status was first seen.
    pub sightings: sightings::Sightings,
    /// How long recent attaches took: with the backlog of new attaches, how long a
    /// new attach may go unreported.
    pub pace: super::pace::Pace,
    /// When each large VolumeAttachment's status may be written again
    /// ([`tessera_runtime::spacing`]).
    pub spacing: tessera_runtime::spacing::Spacing,
    /// The slow detaches already reported by a Detaching Event.
    pub detaches_reported: detaching::Reported,
}

/// Reconcile one VolumeAttachment.
#[instrument(skip_all, fields(volume = %va.name_any()))]
pub async fn reconcile(va: Arc<VolumeAttachment>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let metrics = ctx.shared.metrics.clone();
    metrics.reconcile_started("attachment", &va.name_any());
    measured(&metrics, "attachment", reconcile_inner(va, ctx)).await
}

/// Back off on errors.
pub fn error_policy(_va: Arc<VolumeAttachment>, err: &Error, _ctx: Arc<Ctx>) -> Action {
    debug!(error = %error_chain(err), "attachment reconcile failed");
    Action::requeue(plan::AFTER_ERROR)
}

/// Read, plan, execute, phase by phase (see [`plan`]).
async fn reconcile_inner(va: Arc<VolumeAttachment>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    debug!("attachment reconcile");
    let shared = &ctx.shared;
    if !shared.caches_ready().await {
        return execute(&ctx, &va, plan::not_ready()).await;
    }
    let name = va.name_any();
    // The caches, corrected by what the controllers wrote and they do not show yet.
    let va = shared
        .written_attachments
        .view(&name, Some(va.clone()))
        .unwrap_or(va);
    let volume = shared
        .written_volumes
        .view(&name, shared.caches.volumes.get(&ObjectRef::new(&name)));
    // A previous Volume's VolumeAttachment (that Volume deleted, one of the same name
    // made since) is not the new Volume's: acted on as one without its Volume until
    // the volume controller has replaced it.
    let Some(volume) = volume.filter(|v| !of_previous_volume(va.as_ref(), v)) else {
        let now = Time(jiff::Timestamp::now());
        return execute(&ctx, &va, plan::without_volume(&va, &now)).await;
    };
    let mountpods = mountpods_of(&ctx, &name);
    let now = Time(jiff::Timestamp::now());
    let facts = Facts {
        first_seen: ctx.state.sightings.first_seen(&va, &now),
        nodes: va
            .spec
            .attachment_tickets
            .values()
            .map(|t| &t.node_id)
            .filter(|n| shared.node_exists(n))
            .cloned()
            .collect::<BTreeSet<_>>(),
        va: va.clone(),
        volume,
        now,
    };

    let decided = match plan::start(&facts, mountpods) {
        Start::Done(plan) => return execute(&ctx, &va, plan).await,
        Start::Sync(decided) => decided,
    };
    let synced =
        mountpods::sync_mountpods(&ctx, &facts.volume, &decided.mountpods, &decided.decision)
            .await?;
    let read = AfterSync {
        mountpods: (synced.created || synced.deleted).then(|| mountpods_of(&ctx, &name)),
        synced,
        without_agent: shared.nodes_without_agent(&va),
        quiet_time: ctx.state.pace.attach_quiet(ctx.state.sightings.pending()),
        spacing_left: ctx.state.spacing.left(&name, Instant::now()),
    };
    let settled = plan::after_sync(&facts, decided, read);
    if let Some(stop) = execute::run_steps(&ctx, &va, settled.steps).await? {
        return Ok(stop);
    }
    let (recheck, pending) = match settled.next {
        Next::Requeue(action, hold) => {
            match hold {
                Hold::Quiet(left) => {
                    debug!(volume = %name, left_ms = left.as_millis() as u64, "attaching; statuses wait");
                }
                Hold::Spaced(left) => {
                    debug!(volume = %name, left_ms = left.as_millis() as u64, "status write spaced");
                }
            }
            return Ok(action);
        }
        Next::Write { recheck, pending } => (recheck, pending),
    };
    let rechecked = match recheck {
        Some(r) => Some(execute::recheck(&ctx, &va, r).await?),
        None => None,
    };
    execute(&ctx, &va, plan::writes(&facts, *pending, rechecked)).await
}

/// The MountPods of volume `name`: the cache, corrected by what this controller wrote
/// and it does not show yet.
fn mountpods_of(ctx: &Ctx, name: &str) -> Vec<Arc<MountPod>> {
    ctx.state
        .written_mountpods
        .view_scope(name, ctx.shared.caches.mountpods_of(name))
}
