//! Kubernetes Events on Volumes and VolumeAttachments: what an operator should see
//! (attaching, attached, detaching, detached, data removed, tickets reaped). Sent off
//! the reconcile's path; a failure to publish is logged and never fails a reconcile.
//!
//! kube-runtime's Recorder folds Events into a series keyed on the object, reason,
//! action and related object, not the note: so each distinct happening needs its own
//! action. Node Events carry the node in their action (`Attaching:node-a`) and name the
//! Node as the related object, so an attach to node B is never counted as a repeat of
//! the attach to node A. Node Events go on the Volume only (one Event a happening: each
//! is a write the API server pays for); ticket Events on the Volume and on its
//! VolumeAttachment alike (`kubectl describe` of either shows them).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType};
use tracing::debug;

use tessera_api::{Volume, VolumeAttachment};

use super::Context;

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

/// Publish an Event with an explicit action on the Volume. Events with the same reason
/// and action on one object are folded into one series, so distinct happenings (one
/// per ticket) need distinct actions.
pub(crate) async fn publish_action(
    ctx: &Context,
    volume: &Volume,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    publish_on(
        ctx,
        vec![volume.object_ref(&())],
        None,
        type_,
        reason,
        action,
        note,
    );
}

/// Publish an Event about the tickets of a volume: on the Volume and on its
/// VolumeAttachment (when there is one).
pub(crate) fn publish_tickets(
    ctx: &Context,
    volume: &Volume,
    va: Option<&VolumeAttachment>,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    publish_on(ctx, targets(volume, va), None, type_, reason, action, note);
}

/// Publish an Event on other objects (a Pod the controller deleted).
pub(crate) fn publish_objects(
    ctx: &Context,
    targets: Vec<ObjectReference>,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    publish_on(ctx, targets, None, type_, reason, reason, note);
}

/// Publish an Event about what happened to a volume on `node` (Attaching, Attached,
/// Detaching, Detached, …): on the Volume only, its own series per node (the action is `reason:node`, the
/// related object the Node).
pub(crate) fn publish_node(ctx: &Context, volume: &Volume, reason: &str, node: &str, note: &str) {
    let node_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        ..Default::default()
    };
    publish_on(
        ctx,
        vec![volume.object_ref(&())],
        Some(node_ref),
        EventType::Normal,
        reason,
        &node_action(reason, node),
        note,
    );
}

/// The action of a node Event: the reason and the node, so each node has its series.
pub(crate) fn node_action(reason: &str, node: &str) -> String {
    format!("{reason}:{node}")
}

fn targets(volume: &Volume, va: Option<&VolumeAttachment>) -> Vec<ObjectReference> {
    let mut targets = vec![volume.object_ref(&())];
    targets.extend(va.map(|va| va.object_ref(&())));
    targets
}

fn publish_on(
    ctx: &Context,
    targets: Vec<ObjectReference>,
    related: Option<ObjectReference>,
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
        secondary: related,
    };
    // Off the reconcile's path: an Event is news, not state, and must not delay the
    // status writes that the CSI driver (and so the attach) waits for.
    let recorder = ctx.recorder.clone();
    tokio::spawn(async move {
        for object in targets {
            if let Err(e) = recorder.publish(&ev, &object).await {
                debug!(error = %e, "publishing event");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_events_have_one_action_per_node_and_reason() {
        let actions = [
            node_action("Attaching", "node-a"),
            node_action("Attaching", "node-b"),
            node_action("Attached", "node-a"),
            node_action("Detached", "node-a"),
        ];
        for (i, a) in actions.iter().enumerate() {
            assert!(a.len() <= 128);
            for b in &actions[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(actions[1], "Attaching:node-b");
    }
}
