//! The state gauges (`tessera_volumes`, `tessera_tickets_waiting`,
//! `tessera_mountpods`): counted from the controller's caches every few seconds, by a
//! pure function, and set on the metrics.
//!
//! ```text
//!  caches (Volumes, VolumeAttachments, MountPods) ─▶ counts (pure) ─▶ Metrics::set_states
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::api::{MountPod, Volume, VolumeAttachment};
use crate::metrics::StateCounts;

use super::Context;

/// Volumes by state, unsatisfied tickets by reason, MountPods by phase and node.
pub fn counts(
    volumes: &[Arc<Volume>],
    attachments: &[Arc<VolumeAttachment>],
    mountpods: &[Arc<MountPod>],
) -> StateCounts {
    let mut c = StateCounts::default();
    for v in volumes {
        let state = v
            .status
            .as_ref()
            .and_then(|s| s.state)
            .map_or_else(|| "Unknown".to_string(), |s| format!("{s:?}"));
        *c.volumes.entry(state).or_default() += 1;
    }
    for va in attachments {
        for ticket in va.spec.attachment_tickets.values() {
            let status = va.ticket_status(&ticket.id);
            if status.is_some_and(|s| s.satisfies(ticket)) {
                continue;
            }
            let reason = status
                .and_then(|s| s.conditions.first())
                .map_or_else(|| "Unknown".to_string(), |c| c.reason.clone());
            *c.tickets_waiting.entry(reason).or_default() += 1;
        }
    }
    for mp in mountpods {
        let phase = mp
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map_or_else(|| "Unknown".to_string(), |p| format!("{p:?}"));
        *c.mountpods
            .entry((phase, mp.spec.node_name.clone()))
            .or_default() += 1;
    }
    c
}

/// Set the state gauges from the caches every `interval`, forever.
pub(super) async fn run(ctx: Arc<Context>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        if !ctx.caches_ready().await {
            continue;
        }
        let counts = counts(
            &ctx.caches.volumes.state(),
            &ctx.caches.attachments.state(),
            &ctx.caches.mountpods.state(),
        );
        ctx.metrics.set_states(&counts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn volume(name: &str, state: Option<&str>) -> Arc<Volume> {
        let mut v = json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume", "metadata": {"name": name},
            "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce", "backend": {"root": "/r"}},
        });
        if let Some(s) = state {
            v["status"] = json!({"state": s});
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn mountpod(node: &str, phase: Option<&str>) -> Arc<MountPod> {
        let mut mp = json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
            "metadata": {"name": format!("v-{node}")},
            "spec": {"volume": "v", "nodeName": node, "source": "/r/v", "capacityBytes": 1},
        });
        if let Some(p) = phase {
            mp["status"] = json!({"phase": p});
        }
        Arc::new(serde_json::from_value(mp).unwrap())
    }

    fn attachment(tickets: &[(&str, Option<(bool, &str)>)]) -> Arc<VolumeAttachment> {
        let spec: serde_json::Map<String, serde_json::Value> = tickets
            .iter()
            .map(|(id, _)| {
                (
                    id.to_string(),
                    json!({"id": id, "type": "manual", "nodeID": "n1"}),
                )
            })
            .collect();
        let statuses: serde_json::Map<String, serde_json::Value> = tickets
            .iter()
            .filter_map(|(id, s)| s.map(|s| (id, s)))
            .map(|(id, (satisfied, reason))| {
                let cond = json!({"type": "Satisfied", "status": if satisfied {"True"} else {"False"},
                    "reason": reason, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
                (id.to_string(), json!({"id": id, "satisfied": satisfied, "conditions": [cond]}))
            })
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
                "metadata": {"name": "v"},
                "spec": {"volume": "v", "attachmentTickets": spec},
                "status": {"attachmentTicketStatuses": statuses},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn counts_by_state_reason_phase_and_node() {
        let c = counts(
            &[
                volume("a", Some("Attached")),
                volume("b", Some("Attached")),
                volume("c", Some("Detaching")),
                volume("d", None),
            ],
            &[attachment(&[
                ("t1", Some((true, "Attached"))),
                ("t2", Some((false, "HeldByOtherNode"))),
                ("t3", Some((false, "HeldByOtherNode"))),
                ("t4", None),
            ])],
            &[
                mountpod("n1", Some("Ready")),
                mountpod("n2", Some("Ready")),
                mountpod("n3", None),
            ],
        );
        let pairs = |m: &std::collections::BTreeMap<String, i64>| {
            m.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>()
        };
        assert_eq!(
            pairs(&c.volumes),
            [
                ("Attached".into(), 2),
                ("Detaching".into(), 1),
                ("Unknown".into(), 1)
            ]
        );
        assert_eq!(
            pairs(&c.tickets_waiting),
            [("HeldByOtherNode".into(), 2), ("Unknown".into(), 1)],
            "a satisfied ticket does not wait; one without a status yet is Unknown"
        );
        assert_eq!(c.mountpods.len(), 3);
        assert_eq!(c.mountpods[&("Ready".into(), "n1".into())], 1);
        assert_eq!(c.mountpods[&("Unknown".into(), "n3".into())], 1);
        assert_eq!(counts(&[], &[], &[]), StateCounts::default());
    }
}
