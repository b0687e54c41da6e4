//! The reaper: removes tickets that nothing stands behind any more, each removal
//! recorded as an Event on the Volume that names the ticket and why.
//!
//! - a `csi-attacher` ticket whose storage.k8s.io VolumeAttachment (same name) is gone;
//! - any ticket whose Node is gone;
//! - a ticket past its `expiresAt`.
//!
//! Missing-owner removals wait `reap_grace` after the ticket was first seen, so watch
//! lag or a CSI call racing its own VolumeAttachment cannot remove a live ticket. A
//! removal is a JSON patch that first tests the ticket's node, so a ticket replaced in
//! the meantime is left alone.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVolumeAttachment;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::context::{measured, merge_params};
use super::events::publish_action;
use super::{Context, Error, KubeContext};
use crate::api::{AttacherType, AttachmentTicket, VolumeAttachment};
use crate::runtime::error_chain;

/// Run the reaper every `interval`, forever.
pub async fn run(ctx: Arc<Context>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        if !ctx.caches_ready().await {
            continue;
        }
        let res = measured(&ctx.metrics, "reaper", reap_once(&ctx)).await;
        if let Err(e) = res {
            warn!(error = %error_chain(&e), "reaper pass failed");
        }
    }
}

/// Why a ticket should go, if it should.
pub fn reap_reason(
    ticket: &AttachmentTicket,
    age: Option<Duration>,
    grace: Duration,
    nodes: &BTreeSet<String>,
    storage_attachments: &BTreeSet<String>,
    now: jiff::Timestamp,
) -> Option<String> {
    if let Some(expires) = &ticket.expires_at
        && expires.0 <= now
    {
        return Some(format!("it expired at {}", expires.0));
    }
    let old_enough = age.is_some_and(|a| a >= grace);
    if !old_enough {
        return None;
    }
    if ticket.type_ == AttacherType::CsiAttacher && !storage_attachments.contains(&ticket.id) {
        return Some(format!(
            "its storage.k8s.io VolumeAttachment {} no longer exists",
            ticket.id
        ));
    }
    if !nodes.contains(&ticket.node_id) {
        return Some(format!("node {} no longer exists", ticket.node_id));
    }
    None
}

async fn reap_once(ctx: &Context) -> Result<(), Error> {
    ctx.metrics.read("Node", "list");
    ctx.metrics.read("VolumeAttachment.storage.k8s.io", "list");
    let nodes: BTreeSet<String> = Api::<Node>::all(ctx.client.clone())
        .list_metadata(&ListParams::default())
        .await
        .context(|| "listing Nodes".to_string())?
        .items
        .into_iter()
        .map(|n| n.name_any())
        .collect();
    let storage: BTreeSet<String> = Api::<StorageVolumeAttachment>::all(ctx.client.clone())
        .list_metadata(&ListParams::default())
        .await
        .context(|| "listing storage.k8s.io VolumeAttachments".to_string())?
        .items
        .into_iter()
        .map(|n| n.name_any())
        .collect();
    let now = jiff::Timestamp::now();
    for va in ctx.attachments.state() {
        for ticket in va.spec.attachment_tickets.values() {
            let seen = va
                .status
                .as_ref()
                .and_then(|s| s.attachment_ticket_statuses.get(&ticket.id))
                .and_then(|s| s.requested_at.as_ref());
            let age = seen
                .map(|t| Duration::from_secs_f64(now.duration_since(t.0).as_secs_f64().max(0.0)));
            if let Some(why) = reap_reason(ticket, age, ctx.reap_grace, &nodes, &storage, now) {
                remove_ticket(ctx, &va, ticket, &why).await?;
            }
        }
    }
    Ok(())
}

async fn remove_ticket(
    ctx: &Context,
    va: &VolumeAttachment,
    ticket: &AttachmentTicket,
    why: &str,
) -> Result<(), Error> {
    let name = va.name_any();
    let patch = ticket.remove_if_unchanged_patch();
    let res = Api::<VolumeAttachment>::all(ctx.client.clone())
        .patch(&name, &merge_params(), &Patch::<()>::Json(patch))
        .await;
    match res {
        Ok(_) => {}
        // 422: the test failed (the ticket changed or is gone already): leave it.
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 404 => return Ok(()),
        Err(e) => Err(e).context(|| format!("removing ticket {} from {name}", ticket.id))?,
    }
    ctx.metrics.write("VolumeAttachment", "patch");
    ctx.metrics.tickets_reaped.inc();
    let note = format!(
        "removed ticket {} ({}, node {}): {why}",
        ticket.id, ticket.type_, ticket.node_id
    );
    info!(volume = %name, ticket = %ticket.id, reason = %why, "reaped ticket");
    if let Some(volume) = ctx.volumes.get(&ObjectRef::new(&name)) {
        let action = format!("RemoveTicket {}", ticket.id);
        publish_action(
            ctx,
            &volume,
            EventType::Warning,
            "TicketReaped",
            &action,
            &note,
        )
        .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ticket(id: &str, t: AttacherType, node: &str) -> AttachmentTicket {
        AttachmentTicket {
            id: id.into(),
            type_: t,
            node_id: node.into(),
            parameters: Default::default(),
            generation: 0,
            expires_at: None,
        }
    }

    #[test]
    fn reap_reasons() {
        let now = jiff::Timestamp::now();
        let grace = Duration::from_secs(30);
        let nodes: BTreeSet<String> = ["n1".to_string()].into();
        let sva: BTreeSet<String> = ["csi-live".to_string()].into();
        let old = Some(Duration::from_secs(60));
        let young = Some(Duration::from_secs(1));
        let csi_live = ticket("csi-live", AttacherType::CsiAttacher, "n1");
        let csi_dead = ticket("csi-dead", AttacherType::CsiAttacher, "n1");
        let manual_gone_node = ticket("manual-a", AttacherType::Manual, "n2");
        let mut expired = ticket("manual-b", AttacherType::Manual, "n1");
        expired.expires_at = Some(Time(now - jiff::SignedDuration::from_secs(1)));
        let mut not_expired = expired.clone();
        not_expired.expires_at = Some(Time(now + jiff::SignedDuration::from_secs(60)));

        assert_eq!(reap_reason(&csi_live, old, grace, &nodes, &sva, now), None);
        assert!(
            reap_reason(&csi_dead, old, grace, &nodes, &sva, now)
                .unwrap()
                .contains("no longer exists")
        );
        assert_eq!(
            reap_reason(&csi_dead, young, grace, &nodes, &sva, now),
            None,
            "grace period"
        );
        assert_eq!(
            reap_reason(&csi_dead, None, grace, &nodes, &sva, now),
            None,
            "never seen"
        );
        assert!(
            reap_reason(&manual_gone_node, old, grace, &nodes, &sva, now)
                .unwrap()
                .contains("node n2")
        );
        assert!(
            reap_reason(&expired, young, grace, &nodes, &sva, now)
                .unwrap()
                .contains("expired")
        );
        assert_eq!(
            reap_reason(&not_expired, old, grace, &nodes, &sva, now),
            None
        );
    }
}
