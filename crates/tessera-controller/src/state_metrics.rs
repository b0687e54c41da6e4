//! The state gauges (`tessera_volumes`, `tessera_tickets_waiting`,
//! `tessera_mountpods`) and the per-object series (`tessera_volume_state`,
//! `tessera_mountpod_phase`, restarts and OOM kills, `metrics::objects`): counted from
//! the controller's caches every few seconds, by a pure function, and set on the
//! metrics.
//!
//! ```text
//!  caches (Volumes, VolumeAttachments, MountPods) ─▶ counts (pure) ─▶ Metrics::set_states
//! ```

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use tessera_api::{MountPod, Volume, VolumeAttachment};
use tessera_runtime::metrics::StateCounts;
use tessera_runtime::metrics::objects::{self, Claim, MountPodView, VolumeView};

use super::Context;

/// Volumes by state, unsatisfied tickets by reason, MountPods by phase and node.
pub fn counts(
    volumes: &[Arc<Volume>],
    attachments: &[Arc<VolumeAttachment>],
    mountpods: &[Arc<MountPod>],
) -> StateCounts {
    let mut c = StateCounts::default();
    let mut volume_views = Vec::with_capacity(volumes.len());
    for v in volumes {
        let state = v
            .status
            .as_ref()
            .and_then(|s| s.state)
            .map_or_else(|| "Unknown".to_string(), |s| format!("{s:?}"));
        *c.volumes.entry(state.clone()).or_default() += 1;
        volume_views.push(VolumeView {
            name: v.name_any(),
            claim: Claim::from_annotations(v.annotations()),
            state,
        });
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
    let mut mountpod_views = Vec::with_capacity(mountpods.len());
    for mp in mountpods {
        let phase = mp
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map_or_else(|| "Unknown".to_string(), |p| format!("{p:?}"));
        *c.mountpods
            .entry((phase.clone(), mp.spec.node_name.clone()))
            .or_default() += 1;
        let count = |n: Option<i32>| u64::try_from(n.unwrap_or(0)).unwrap_or(0);
        mountpod_views.push(MountPodView {
            name: mp.name_any(),
            volume: mp.spec.volume.clone(),
            node: mp.spec.node_name.clone(),
            claim: Claim::from_annotations(mp.annotations()),
            phase,
            restarts: count(mp.status.as_ref().map(|s| s.restarts)),
            oom_kills: count(mp.status.as_ref().map(|s| s.oom_kills)),
        });
    }
    c.objects = objects::series(volume_views, mountpod_views, objects::MAX_OBJECTS);
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
        // Queued objects deleted before their reconcile are not waiting any more.
        let volumes = &ctx.caches.volumes;
        ctx.metrics
            .reconcile_queue_retain("volume", |n| volumes.get(&ObjectRef::new(n)).is_some());
        let attachments = &ctx.caches.attachments;
        ctx.metrics.reconcile_queue_retain("attachment", |n| {
            attachments.get(&ObjectRef::new(n)).is_some()
        });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn volume(name: &str, state: Option<&str>) -> Arc<Volume> {
        let mut v = json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
            "metadata": {"name": name, "annotations": {
                "tessera.io/pvc-name": format!("claim-{name}"), "tessera.io/pvc-namespace": "ns"}},
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
            mp["status"] = json!({"phase": p, "restarts": 3, "oomKills": 1});
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
        // One state series per Volume, with its claim from its annotations.
        let states: Vec<_> = c
            .objects
            .volume_state
            .iter()
            .map(|l| (l.volume.as_str(), l.pvc.as_str(), l.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                ("a", "claim-a", "Attached"),
                ("b", "claim-b", "Attached"),
                ("c", "claim-c", "Detaching"),
                ("d", "claim-d", "Unknown")
            ]
        );
        // Restarts and OOM kills from the MountPods' status, none before one.
        let restarts: Vec<_> = c
            .objects
            .mountpod_restarts
            .iter()
            .map(|(l, n)| (l.node.as_str(), *n))
            .collect();
        assert_eq!(restarts, [("n1", 3), ("n2", 3), ("n3", 0)]);
        assert_eq!(c.objects.mountpod_oom_kills.values().sum::<u64>(), 2);
        assert_eq!(counts(&[], &[], &[]), StateCounts::default());
    }
}
