//! The agent's side of rolling mount image upgrades: the decision is
//! [`crate::upgrade`]'s (pure); here the health loop's view of each mount
//! becomes a [`Candidate`], the claimed mount is recorded in the one upgrade slot of
//! the [`Context`], and the serve pass of that MountPod replaces its daemon.
//!
//! ```text
//!  health loop ─▶ candidate(record) per mount ─▶ plan: claim the slot, reconcile it
//!                                                     (or Event UpgradeBlocked, once)
//!  serve (slot names this MountPod) ─▶ replace: MountService::replace_daemon, Event Upgraded
//!                                        failed ─▶ Retries: not planned again before its backoff
//! ```

use std::time::{Duration, Instant};

use futures::channel::mpsc;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::{info, warn};

use tessera_api::MountPod;
use tessera_runtime::error_chain;

use super::{Context, blocking, publish};
use crate::mount_service::{Health, MountService, Want};
use crate::supervisor::Record;
use crate::upgrade::{self as rolling, Candidate};

/// How long an upgrade claimed by the health loop may wait for its reconcile (a
/// MountPod deleted meanwhile never gets one).
const UPGRADE_CLAIM: Duration = Duration::from_secs(120);

impl Context {
    /// The mount being upgraded (its MountPod, and since when), locked.
    pub(super) fn upgrade_slot(&self) -> std::sync::MutexGuard<'_, Option<(String, Instant)>> {
        self.upgrading.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How the health loop sees `record` for an upgrade to `desired` (`health` is its
/// probe's outcome).
pub(super) fn candidate(
    host: &MountService,
    record: &Record,
    health: &Health,
    desired: Option<&str>,
) -> Candidate {
    let serving = desired.and_then(|_| host.image_of(record));
    let due = rolling::differs(serving.as_deref(), desired);
    Candidate {
        healthy: *health == Health::Healthy,
        held: due && host.holds(&record.mountpoint),
        serving,
        waiting: false,
    }
}

/// Claim the next mount to upgrade (`node::upgrade::next`) and reconcile its
/// MountPod, whose serve pass replaces the daemon; say once per mount and image when
/// one cannot be upgraded without a remount (its connection is not held).
pub(super) async fn plan(
    ctx: &Context,
    store: &Store<MountPod>,
    trigger: &mpsc::UnboundedSender<ObjectRef<MountPod>>,
    checked: &[(Record, Health, Candidate)],
    blocked_told: &mut std::collections::HashSet<(String, String)>,
) {
    let Some(desired) = ctx.host.daemons.image() else {
        return;
    };
    let busy = {
        let mut slot = ctx.upgrade_slot();
        if slot
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() > UPGRADE_CLAIM)
        {
            *slot = None;
        }
        slot.is_some()
    };
    let now = Instant::now();
    let candidates: Vec<Candidate> = checked
        .iter()
        .map(|(record, _, c)| Candidate {
            waiting: ctx.upgrade_retries.waiting(&record.mountpod, &desired, now),
            ..c.clone()
        })
        .collect();
    let next = rolling::next(&candidates, Some(&desired), busy);
    for i in next.blocked {
        let (record, _, c) = &checked[i];
        let key = (record.mountpod.clone(), desired.clone());
        if blocked_told.contains(&key) {
            continue;
        }
        let Some(mp) = store.get(&ObjectRef::new(&record.mountpod)) else {
            continue;
        };
        let note = format!(
            "not upgraded from {} to {desired}: the fd holder does not hold this mount's connection, and an upgrade never remounts (open files would break); it keeps its image until it is next started",
            c.serving.as_deref().unwrap_or("?")
        );
        warn!(mountpod = %record.mountpod, %note, "upgrade blocked");
        publish(ctx, &mp, EventType::Warning, "UpgradeBlocked", &note).await;
        blocked_told.insert(key);
    }
    if let Some(i) = next.upgrade {
        let (record, _, c) = &checked[i];
        info!(mountpod = %record.mountpod, from = c.serving.as_deref().unwrap_or("?"), to = %desired, "upgrading the mount's daemon");
        *ctx.upgrade_slot() = Some((record.mountpod.clone(), Instant::now()));
        let _ = trigger.unbounded_send(ObjectRef::new(&record.mountpod));
    }
}

/// Replace the daemon of `want` by one of the desired image through the handoff
/// (claimed by the health loop: one at a time, only a healthy mount whose connection
/// is held). The serve pass that follows adopts the successor and writes the status.
pub(super) async fn replace(mp: &MountPod, ctx: &Context, want: &Want) {
    let host = ctx.host.clone();
    let w = want.clone();
    let res = blocking(move || {
        let from = host
            .state
            .load(&w.volume)
            .ok()
            .flatten()
            .and_then(|r| host.image_of(&r));
        (from, host.replace_daemon(&w))
    })
    .await;
    let to = ctx.host.daemons.image().unwrap_or_default();
    let (from, res) = match res {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "upgrade task");
            return;
        }
    };
    let from = from.unwrap_or_else(|| "an unknown image".into());
    let name = mp.name_any();
    let worked = matches!(&res, Ok(Some(served)) if served.answers);
    if worked {
        ctx.upgrade_retries.succeeded(&name, &to);
    } else {
        let delay = ctx.upgrade_retries.failed(&name, &to, Instant::now());
        info!(%to, retry_in_s = delay.as_secs(), "upgrade not done; tried again after a backoff");
    }
    match res {
        Ok(Some(served)) if served.answers => {
            let took = served.repair_time.unwrap_or_default();
            info!(%from, %to, took_ms = took.as_millis() as u64, "mount upgraded through the handoff");
            let note = format!(
                "{from} → {to}: the new daemon took the held connection over in {} ms (no remount)",
                took.as_millis()
            );
            ctx.metrics.handoff(super::mount_labels(ctx, mp), "upgrade");
            publish(ctx, mp, EventType::Normal, "Upgraded", &note).await;
        }
        Ok(Some(served)) => {
            let why = served
                .failure
                .unwrap_or_else(|| "the new daemon's mount did not answer in time".into());
            warn!(%from, %to, error = %why, "upgrade: the new daemon did not serve");
            let note = format!("{from} → {to}: the new daemon did not serve: {why}");
            publish(ctx, mp, EventType::Warning, "UpgradeFailed", &note).await;
        }
        Ok(None) => {
            info!(%from, %to, "upgrade not done: no daemon runs or its connection is not held");
        }
        Err(e) => {
            let msg = error_chain(&e);
            warn!(%from, %to, error = %msg, "upgrade failed");
            let note = format!("{from} → {to}: {msg}");
            publish(ctx, mp, EventType::Warning, "UpgradeFailed", &note).await;
        }
    }
}
