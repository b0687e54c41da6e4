//! Kubernetes Events on Volumes: what an operator should see (attaching, detaching,
//! data removed, tickets reaped). Sent off the reconcile's path; a failure to publish
//! is logged and never fails a reconcile.

use kube::Resource;
use kube::runtime::events::{Event, EventType};
use tracing::debug;

use super::Context;
use crate::api::Volume;

/// Publish an Event about the Volume; failures are logged, never fatal.
pub(crate) async fn publish(
    ctx: &Context,
    volume: &Volume,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    publish_action(ctx, volume, type_, reason, reason, note).await
}

/// Publish an Event with an explicit action. Events with the same reason and action
/// on one object are folded into one series, so distinct happenings (one per ticket)
/// need distinct actions.
pub(crate) async fn publish_action(
    ctx: &Context,
    volume: &Volume,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.into()),
        action: action.chars().take(128).collect(),
        secondary: None,
    };
    ctx.metrics.write("Event", "create");
    // Off the reconcile's path: an Event is news, not state, and must not delay the
    // status writes that the CSI driver (and so the attach) waits for.
    let recorder = ctx.recorder.clone();
    let object = volume.object_ref(&());
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&ev, &object).await {
            debug!(error = %e, "publishing event");
        }
    });
}
