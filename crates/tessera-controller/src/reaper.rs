//! The reaper: removes the tickets Tessera wrote that nothing stands behind any more,
//! each removal recorded as an Event on the Volume that names the ticket and why.
//!
//! - a `csi-attacher` ticket whose storage.k8s.io VolumeAttachment (same name) is gone;
//! - a ticket whose Node does not exist (not a cleanup ticket: the volume controller
//!   moves it to another node, or the operator gives the data up);
//! - a ticket past its `expiresAt`;
//! - an `idle-mount` ticket that is no longer satisfied: its mount yielded to a
//!   workload on another node, or the volume is being deleted (an idle mount is kept,
//!   never brought back).
//!
//! Every few passes it also deletes the inline Volumes whose Pod is gone
//! ([`super::inline`]).
//!
//! Only tickets whose fields only Tessera's field managers own ([`written_by_tessera`],
//! from `managedFields`) are removed. A ticket another manager owns (a GitOps tool, a
//! person) is never removed: a re-apply would bring it back, forever. Arbitration stops
//! honouring it instead (Expired, NodeNotFound) and its status says why.
//!
//! Missing-owner removals wait `reap_grace` after the ticket was first seen, so watch
//! lag or a CSI call racing its own VolumeAttachment cannot remove a live ticket. A
//! removal is a JSON patch that first tests the ticket's node, so a ticket replaced in
//! the meantime is left alone.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info, warn};

use tessera_api::{
    AttacherType, AttachmentTicket, CONTROLLER_FIELD_MANAGER, CSI_CONTROLLER_FIELD_MANAGER,
    VolumeAttachment,
};
use tessera_runtime::error_chain;

use super::context::{measured, merge_params};
use super::events::publish_tickets;
use super::{Context, Error, KubeContext};

/// The field managers of Tessera's own ticket writes: the controller (cleanup tickets)
/// and the CSI controller service (csi-attacher tickets).
pub const TESSERA_MANAGERS: [&str; 2] = [CONTROLLER_FIELD_MANAGER, CSI_CONTROLLER_FIELD_MANAGER];

/// Run the reaper every `interval`, forever; a ticket whose owner is missing is
/// removed `grace` after it was first seen (inline Volumes likewise).
pub async fn run(ctx: Arc<Context>, interval: Duration, grace: Duration) {
    let mut pass: u64 = 0;
    loop {
        tokio::time::sleep(interval).await;
        if !ctx.caches_ready().await {
            continue;
        }
        let res = measured(&ctx.metrics, "reaper", reap_once(&ctx, grace)).await;
        match res {
            Err(e) if tessera_runtime::is_not_found(&e) => {
                debug!(error = %error_chain(&e), "reaper pass: an object was already gone");
            }
            Err(e) => warn!(error = %error_chain(&e), "reaper pass failed"),
            Ok(_) => {}
        }
        pass += 1;
        if pass.is_multiple_of(super::inline::ORPHAN_EVERY) {
            let res = measured(
                &ctx.metrics,
                "reaper",
                super::inline::reap_orphans(&ctx, grace),
            )
            .await;
            match res {
                Err(e) if tessera_runtime::is_not_found(&e) => {
                    debug!(error = %error_chain(&e), "inline orphan pass: an object was already gone");
                }
                Err(e) => warn!(error = %error_chain(&e), "inline orphan pass failed"),
                Ok(_) => {}
            }
        }
    }
}

/// The field managers that own ticket `id` of a VolumeAttachment: those whose
/// `managedFields` entry (not a subresource's) holds `f:spec.f:attachmentTickets.f:<id>`.
pub fn ticket_managers<'a>(managed: &'a [ManagedFieldsEntry], id: &str) -> BTreeSet<&'a str> {
    let key = format!("f:{id}");
    managed
        .iter()
        .filter(|e| e.subresource.as_deref().unwrap_or_default().is_empty())
        .filter(|e| {
            e.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:spec")?.get("f:attachmentTickets")?.get(&key))
                .is_some()
        })
        .map(|e| e.manager.as_deref().unwrap_or_default())
        .collect()
}

/// Whether Tessera wrote ticket `id` and nobody else owns any of it: only then may the
/// reaper remove it. A ticket no entry claims (managed fields stripped) is not ours.
pub fn written_by_tessera(managed: &[ManagedFieldsEntry], id: &str) -> bool {
    let managers = ticket_managers(managed, id);
    !managers.is_empty() && managers.iter().all(|m| TESSERA_MANAGERS.contains(m))
}

/// What the reaper knows of one ticket.
pub struct Seen {
    /// Tessera wrote it ([`written_by_tessera`]).
    pub ours: bool,
    /// How long ago the controller first saw it (`None`: not yet).
    pub age: Option<Duration>,
    /// Its node exists.
    pub node_exists: bool,
    /// The storage.k8s.io VolumeAttachment of its id exists.
    pub storage_attachment_exists: bool,
    /// Whether its status says satisfied (`None`: no status yet).
    pub satisfied: Option<bool>,
}

/// Why a ticket should go, if it should.
pub fn reap_reason(
    ticket: &AttachmentTicket,
    seen: &Seen,
    grace: Duration,
    now: jiff::Timestamp,
) -> Option<String> {
    if !seen.ours {
        return None;
    }
    if let Some(expires) = &ticket.expires_at
        && expires.0 <= now
    {
        return Some(format!("it expired at {}", expires.0));
    }
    if ticket.type_ == AttacherType::IdleMount && seen.satisfied == Some(false) {
        return Some("its idle mount is gone (it yielded to a workload on another node, or the volume is being deleted)".into());
    }
    let old_enough = seen.age.is_some_and(|a| a >= grace);
    if !old_enough {
        return None;
    }
    if ticket.type_ == AttacherType::CsiAttacher && !seen.storage_attachment_exists {
        return Some(format!(
            "its storage.k8s.io VolumeAttachment {} does not exist",
            ticket.id
        ));
    }
    // A cleanup ticket is the volume controller's to replace or give up (see
    // `volume`): reaped, it would only come back.
    if !seen.node_exists && ticket.type_ != AttacherType::Cleanup {
        return Some(format!("node {} does not exist", ticket.node_id));
    }
    None
}

async fn reap_once(ctx: &Context, grace: Duration) -> Result<(), Error> {
    let storage: BTreeSet<String> = Api::<StorageVolumeAttachment>::all(ctx.client.clone())
        .list_metadata(&ListParams::default())
        .await
        .context(|| "listing storage.k8s.io VolumeAttachments".to_string())?
        .items
        .into_iter()
        .map(|n| n.name_any())
        .collect();
    let now = jiff::Timestamp::now();
    for va in ctx.caches.attachments.state() {
        let managed = va.metadata.managed_fields.as_deref().unwrap_or_default();
        for ticket in va.spec.attachment_tickets.values() {
            let status = va.ticket_status(&ticket.id);
            let first_seen = status.and_then(|s| s.requested_at.as_ref());
            let seen = Seen {
                ours: written_by_tessera(managed, &ticket.id),
                age: first_seen.map(|t| {
                    Duration::from_secs_f64(now.duration_since(t.0).as_secs_f64().max(0.0))
                }),
                node_exists: ctx.node_exists(&ticket.node_id),
                storage_attachment_exists: storage.contains(&ticket.id),
                satisfied: status.map(|s| s.satisfies(ticket)),
            };
            if let Some(why) = reap_reason(ticket, &seen, grace, now) {
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
    ctx.metrics.tickets_reaped.inc();
    let note = format!(
        "removed ticket {} ({}, node {}): {why}",
        ticket.id, ticket.type_, ticket.node_id
    );
    info!(volume = %name, ticket = %ticket.id, reason = %why, "reaped ticket");
    if let Some(volume) = ctx.caches.volumes.get(&ObjectRef::new(&name)) {
        let action = format!("RemoveTicket {}", ticket.id);
        publish_tickets(
            ctx,
            &volume,
            Some(va),
            EventType::Warning,
            "TicketReaped",
            &action,
            &note,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
    use serde_json::json;

    use super::*;

    fn ticket(id: &str, t: AttacherType, node: &str) -> AttachmentTicket {
        AttachmentTicket::new(id, t, node)
    }

    fn entry(
        manager: &str,
        subresource: Option<&str>,
        fields: serde_json::Value,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            subresource: subresource.map(Into::into),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    fn owns(ids: &[&str]) -> serde_json::Value {
        let tickets: serde_json::Map<String, serde_json::Value> = ids
            .iter()
            .map(|id| {
                (
                    format!("f:{id}"),
                    json!({".": {}, "f:id": {}, "f:nodeID": {}}),
                )
            })
            .collect();
        json!({"f:spec": {"f:attachmentTickets": tickets}})
    }

    #[test]
    fn ownership_comes_from_the_managers_of_the_ticket_fields() {
        let csi = CSI_CONTROLLER_FIELD_MANAGER;
        let managed = vec![
            // The controller's apply of the object: no ticket.
            entry(
                CONTROLLER_FIELD_MANAGER,
                None,
                json!({"f:metadata": {"f:ownerReferences": {}}, "f:spec": {"f:volume": {}}}),
            ),
            // Its status writes name ticket ids too, under f:status: not ownership.
            entry(
                CONTROLLER_FIELD_MANAGER,
                Some("status"),
                json!({"f:status": {"f:attachmentTicketStatuses": {"f:manual-argo": {}}}}),
            ),
            entry(csi, None, owns(&["csi-1"])),
            entry(CONTROLLER_FIELD_MANAGER, None, owns(&["cleanup-data"])),
            entry("argocd", None, owns(&["manual-argo", "shared"])),
            entry(csi, None, owns(&["shared"])),
        ];
        let cases = [
            ("csi-1", vec![csi], true),
            ("cleanup-data", vec![CONTROLLER_FIELD_MANAGER], true),
            ("manual-argo", vec!["argocd"], false),
            ("shared", vec!["argocd", csi], false),
            ("unclaimed", vec![], false),
        ];
        for (id, managers, ours) in cases {
            let mut want: Vec<&str> = managers.clone();
            want.sort();
            assert_eq!(
                ticket_managers(&managed, id)
                    .into_iter()
                    .collect::<Vec<_>>(),
                want,
                "{id}"
            );
            assert_eq!(written_by_tessera(&managed, id), ours, "{id}");
        }
        assert!(
            !written_by_tessera(&[], "csi-1"),
            "no managed fields: not ours"
        );
        let anonymous = vec![ManagedFieldsEntry {
            fields_v1: Some(FieldsV1(owns(&["x"]))),
            ..Default::default()
        }];
        assert!(!written_by_tessera(&anonymous, "x"));
    }

    #[test]
    fn reap_reasons() {
        let now = jiff::Timestamp::now();
        let grace = Duration::from_secs(30);
        let old = Some(Duration::from_secs(60));
        let young = Some(Duration::from_secs(1));
        let seen = |ours, age, node_exists, storage_attachment_exists| Seen {
            ours,
            age,
            node_exists,
            storage_attachment_exists,
            satisfied: None,
        };
        let idle_seen = |ours, satisfied| Seen {
            satisfied,
            ..seen(ours, young, true, false)
        };
        let mut idle = ticket("idle-x", AttacherType::IdleMount, "n1");
        idle.expires_at = Some(Time(now + jiff::SignedDuration::from_secs(60)));
        let csi = ticket("csi-x", AttacherType::CsiAttacher, "n1");
        let manual = ticket("manual-a", AttacherType::Manual, "n2");
        let cleanup = ticket("cleanup-data", AttacherType::Cleanup, "n2");
        let mut expired = ticket("manual-b", AttacherType::Manual, "n1");
        expired.expires_at = Some(Time(now - jiff::SignedDuration::from_secs(1)));
        let mut not_expired = expired.clone();
        not_expired.expires_at = Some(Time(now + jiff::SignedDuration::from_secs(60)));

        let cases: Vec<(&str, &AttachmentTicket, Seen, Option<&str>)> = vec![
            ("ours, backed", &csi, seen(true, old, true, true), None),
            (
                "ours, storage VA gone",
                &csi,
                seen(true, old, true, false),
                Some("storage.k8s.io VolumeAttachment csi-x does not exist"),
            ),
            (
                "ours, storage VA gone, grace",
                &csi,
                seen(true, young, true, false),
                None,
            ),
            (
                "ours, storage VA gone, never seen",
                &csi,
                seen(true, None, true, false),
                None,
            ),
            (
                "ours, node gone",
                &manual,
                seen(true, old, false, true),
                Some("node n2 does not exist"),
            ),
            (
                "ours, cleanup, node gone: the volume controller's to move or give up",
                &cleanup,
                seen(true, old, false, true),
                None,
            ),
            (
                "ours, expired: at once",
                &expired,
                seen(true, young, true, true),
                Some("expired"),
            ),
            (
                "ours, not expired",
                &not_expired,
                seen(true, old, true, true),
                None,
            ),
            (
                "theirs, storage VA gone",
                &csi,
                seen(false, old, true, false),
                None,
            ),
            (
                "theirs, node gone",
                &manual,
                seen(false, old, false, true),
                None,
            ),
            (
                "theirs, expired",
                &expired,
                seen(false, old, true, true),
                None,
            ),
            (
                "ours, idle mount kept, no storage VA (it has none)",
                &idle,
                idle_seen(true, Some(true)),
                None,
            ),
            (
                "ours, idle, no status yet",
                &idle,
                idle_seen(true, None),
                None,
            ),
            (
                "ours, idle mount gone: at once",
                &idle,
                idle_seen(true, Some(false)),
                Some("idle mount is gone"),
            ),
            (
                "theirs, idle mount gone",
                &idle,
                idle_seen(false, Some(false)),
                None,
            ),
        ];
        for (what, t, s, want) in cases {
            let got = reap_reason(t, &s, grace, now);
            match want {
                None => assert_eq!(got, None, "{what}"),
                Some(needle) => {
                    let got = got.unwrap_or_else(|| panic!("{what}: not reaped"));
                    assert!(got.contains(needle), "{what}: {got}");
                    assert!(!got.contains("no longer"), "{what}: {got}");
                }
            }
        }
    }

    /// The watch keeps only the managedFields of the spec (`watch::spec_managers_only`):
    /// enough for the reaper to tell who wrote each ticket.
    #[test]
    fn a_lean_attachment_still_says_who_wrote_each_ticket() {
        use crate::watch::{no_managed_fields, spec_managers_only};
        let va = |managers: serde_json::Value| -> tessera_api::VolumeAttachment {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
                "metadata": {"name": "v", "managedFields": managers},
                "spec": {"volume": "v", "attachmentTickets": {
                    "csi-1": {"id": "csi-1", "type": "csi-attacher", "nodeID": "a"},
                    "manual-a": {"id": "manual-a", "type": "manual", "nodeID": "b"}}},
            }))
            .unwrap()
        };
        let entry = |manager: &str, sub: Option<&str>, id: &str| {
            serde_json::json!({"manager": manager, "operation": "Update", "subresource": sub,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:attachmentTickets": {format!("f:{id}"): {}}}}})
        };
        let mut lean = va(serde_json::json!([
            entry("tessera-csi-controller", None, "csi-1"),
            entry("argocd", None, "manual-a"),
            entry("tessera-controller", Some("status"), "csi-1"),
        ]));
        spec_managers_only(&mut lean);
        let managers: Vec<_> = lean
            .managed_fields()
            .iter()
            .map(|e| e.manager.as_deref().unwrap_or_default())
            .collect();
        assert_eq!(managers, ["tessera-csi-controller", "argocd"]);
        for (id, owner) in [("csi-1", "tessera-csi-controller"), ("manual-a", "argocd")] {
            let owners = ticket_managers(lean.managed_fields(), id);
            assert_eq!(owners.into_iter().collect::<Vec<_>>(), [owner], "{id}");
        }
        no_managed_fields(&mut lean);
        assert!(lean.managed_fields().is_empty());
    }
}
