//! `kubectl tessera tickets <volume>`: one row per ticket of a VolumeAttachment — its
//! type, node, whether it is satisfied and why not, who owns it (the field managers
//! whose `managedFields` hold `f:spec.f:attachmentTickets.f:<id>`) and since when it
//! waits (from `requestedAt` in its status).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde::Serialize;

use tessera_api::{CONDITION_SATISFIED, VolumeAttachment};

use super::text;

/// One ticket as the plugin shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TicketRow {
    /// Ticket id (a CSI ticket's id is its storage.k8s.io VolumeAttachment's name).
    pub id: String,
    /// `csi-attacher`, `manual`, `cleanup`, …
    #[serde(rename = "type")]
    pub type_: String,
    /// The node the ticket asks for.
    pub node: String,
    /// Satisfied at the ticket's current generation.
    pub satisfied: bool,
    /// Reason of the `Satisfied` condition (empty: the controller has not written one).
    pub reason: String,
    /// Message of the `Satisfied` condition.
    pub message: String,
    /// Field managers owning the ticket (empty: managed fields stripped or unknown).
    pub owners: Vec<String>,
    /// When the controller first saw the ticket (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<jiff::Timestamp>,
}

impl TicketRow {
    /// How long the ticket has been waiting at `now`: `None` when it is satisfied or
    /// the controller has not seen it yet.
    pub fn waiting_secs(&self, now: jiff::Timestamp) -> Option<i64> {
        if self.satisfied {
            return None;
        }
        Some(now.duration_since(self.requested_at?).as_secs())
    }
}

/// The field managers that own ticket `id`: those whose `managedFields` entry for the
/// main resource (not `status`) holds `f:spec.f:attachmentTickets.f:<id>`.
pub fn ticket_owners(managed: &[ManagedFieldsEntry], id: &str) -> Vec<String> {
    let key = format!("f:{id}");
    let owners: BTreeSet<String> = managed
        .iter()
        .filter(|e| e.subresource.as_deref().unwrap_or_default().is_empty())
        .filter(|e| {
            e.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:spec")?.get("f:attachmentTickets")?.get(&key))
                .is_some()
        })
        .map(|e| e.manager.clone().unwrap_or_default())
        .collect();
    owners.into_iter().collect()
}

/// The rows of every ticket of `va`, in id order.
pub fn rows(va: &VolumeAttachment) -> Vec<TicketRow> {
    let managed = va.metadata.managed_fields.as_deref().unwrap_or_default();
    va.spec
        .attachment_tickets
        .values()
        .map(|t| {
            let status = va.ticket_status(&t.id);
            let cond =
                status.and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_SATISFIED));
            TicketRow {
                id: t.id.clone(),
                type_: t.type_.to_string(),
                node: t.node_id.clone(),
                satisfied: status.is_some_and(|s| s.satisfies(t)),
                reason: status
                    .and_then(|s| s.reason())
                    .unwrap_or_default()
                    .to_string(),
                message: cond.map(|c| text::one_line(&c.message)).unwrap_or_default(),
                owners: ticket_owners(managed, &t.id),
                requested_at: status.and_then(|s| s.requested_at.as_ref()).map(|t| t.0),
            }
        })
        .collect()
}

/// The ticket table: ID, TYPE, NODE, SATISFIED, REASON, OWNER, WAITING, MESSAGE (the
/// message cut to `width`).
pub fn render(rows: &[TicketRow], now: jiff::Timestamp, width: Option<usize>) -> String {
    if rows.is_empty() {
        return "no tickets\n".to_string();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.type_.clone(),
                r.node.clone(),
                r.satisfied.to_string(),
                or_dash(&r.reason),
                if r.owners.is_empty() {
                    "<unknown>".into()
                } else {
                    r.owners.join(",")
                },
                match (r.satisfied, r.waiting_secs(now)) {
                    (true, _) => "-".into(),
                    (false, Some(s)) => text::age(s),
                    (false, None) => "unseen".into(),
                },
                or_dash(&r.message),
            ]
        })
        .collect();
    text::table(
        &[
            "ID",
            "TYPE",
            "NODE",
            "SATISFIED",
            "REASON",
            "OWNER",
            "WAITING",
            "MESSAGE",
        ],
        &cells,
        width,
    )
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
    use serde_json::json;

    use super::*;

    fn entry(manager: &str, subresource: Option<&str>, ids: &[&str]) -> ManagedFieldsEntry {
        let tickets: serde_json::Map<String, serde_json::Value> = ids
            .iter()
            .map(|id| (format!("f:{id}"), json!({"f:nodeID": {}})))
            .collect();
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            subresource: subresource.map(Into::into),
            fields_v1: Some(FieldsV1(
                json!({"f:spec": {"f:attachmentTickets": tickets}}),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn owners_come_from_the_managed_fields_of_the_ticket() {
        let managed = vec![
            entry("tessera-csi-controller", None, &["csi-1", "shared"]),
            entry("argocd", None, &["manual-a", "shared"]),
            entry("tessera-controller", None, &["cleanup-data"]),
            // A status entry naming the same key is not ownership of the ticket.
            entry("tessera-controller", Some("status"), &["csi-1"]),
        ];
        for (id, want) in [
            ("csi-1", vec!["tessera-csi-controller"]),
            ("manual-a", vec!["argocd"]),
            ("shared", vec!["argocd", "tessera-csi-controller"]),
            ("cleanup-data", vec!["tessera-controller"]),
            ("nobody", vec![]),
            // A prefix of an id is another id.
            ("csi", vec![]),
        ] {
            assert_eq!(ticket_owners(&managed, id), want, "{id}");
        }
        assert!(ticket_owners(&[], "csi-1").is_empty());
    }

    fn va(now: jiff::Timestamp) -> VolumeAttachment {
        let requested = Time(now - jiff::SignedDuration::from_secs(312));
        let mut va: VolumeAttachment = serde_json::from_value(json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
            "metadata": {"name": "v"},
            "spec": {"volume": "v", "attachmentTickets": {
                "csi-1": {"id": "csi-1", "type": "csi-attacher", "nodeID": "node-a"},
                "manual-b": {"id": "manual-b", "type": "manual", "nodeID": "node-b", "generation": 2},
                "new": {"id": "new", "type": "manual", "nodeID": "node-c"},
            }},
            "status": {"attachmentTicketStatuses": {
                // Satisfied, as the controller writes it: no condition (reason Attached).
                "csi-1": {"id": "csi-1", "satisfied": true, "generation": 0, "requestedAt": requested},
                // Satisfied for an older generation: not satisfied now.
                "manual-b": {"id": "manual-b", "satisfied": true, "generation": 1, "requestedAt": requested,
                    "conditions": [{"type": "Satisfied", "status": "False", "reason": "HeldByOtherNode",
                        "message": "volume is ReadWriteOnce and attached to node-a for ticket csi-1\n(csi-attacher)",
                        "lastTransitionTime": requested}]},
            }},
        }))
        .unwrap();
        va.metadata.managed_fields = Some(vec![
            entry("tessera-csi-controller", None, &["csi-1"]),
            entry("argocd", None, &["manual-b"]),
        ]);
        va
    }

    #[test]
    fn rows_read_statuses_generations_and_owners() {
        let now = jiff::Timestamp::now();
        let rows = rows(&va(now));
        let summary: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.id.as_str(),
                    r.satisfied,
                    r.reason.as_str(),
                    r.owners.join(","),
                    r.waiting_secs(now),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    "csi-1",
                    true,
                    "Attached",
                    "tessera-csi-controller".into(),
                    None
                ),
                (
                    "manual-b",
                    false,
                    "HeldByOtherNode",
                    "argocd".into(),
                    Some(312)
                ),
                ("new", false, "", String::new(), None),
            ]
        );
        assert_eq!(
            rows[1].message,
            "volume is ReadWriteOnce and attached to node-a for ticket csi-1 ⏎ (csi-attacher)"
        );
    }

    #[test]
    fn the_table_names_owners_and_waits_and_fits_the_width() {
        let now = jiff::Timestamp::now();
        let out = render(&rows(&va(now)), now, Some(120));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert!(
            lines[0].starts_with("ID") && lines[0].ends_with("MESSAGE"),
            "{out}"
        );
        let cols = |l: &str| {
            l.split_whitespace()
                .take(7)
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            cols(lines[1]),
            [
                "csi-1",
                "csi-attacher",
                "node-a",
                "true",
                "Attached",
                "tessera-csi-controller",
                "-"
            ]
        );
        assert_eq!(
            cols(lines[2]),
            [
                "manual-b",
                "manual",
                "node-b",
                "false",
                "HeldByOtherNode",
                "argocd",
                "5m12s"
            ]
        );
        assert_eq!(
            cols(lines[3]),
            [
                "new",
                "manual",
                "node-c",
                "false",
                "-",
                "<unknown>",
                "unseen"
            ]
        );
        assert!(lines.iter().all(|l| l.chars().count() <= 120), "{out}");
        assert!(lines[2].ends_with('…'), "the long message is cut: {out}");
        assert!(render(&rows(&va(now)), now, None).contains("(csi-attacher)"));
        assert_eq!(render(&[], now, None), "no tickets\n");
    }
}
