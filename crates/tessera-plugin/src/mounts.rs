//! `kubectl tessera mounts`: every MountPod (one shared FUSE mount of a volume on a
//! node) as a line — node, volume, the claim it serves, task, phase, references,
//! restarts, OOM kills, age and what is wrong — grouped by node. The binary lists the
//! MountPods; [`rows`] picks the fields and [`render`] prints them.

use kube::ResourceExt;
use serde::Serialize;

use tessera_api::{ANNOTATION_PVC_NAME, ANNOTATION_PVC_NAMESPACE, MountPod};

use super::text;

/// One MountPod.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MountRow {
    pub node: String,
    pub name: String,
    pub volume: String,
    /// `namespace/name` of the claim the volume was provisioned for (empty: none known).
    pub claim: String,
    pub task: String,
    pub phase: String,
    pub references: usize,
    pub restarts: i32,
    pub oom_kills: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<jiff::Timestamp>,
    /// Being deleted (since when).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleting_since: Option<jiff::Timestamp>,
    /// The `Ready` condition's reason and message when it is not True, else the last
    /// error; empty when all is well.
    pub problem: String,
}

/// The rows of `mps` on `node` (every node when `None`), by node then volume.
pub fn rows(mps: &[MountPod], node: Option<&str>) -> Vec<MountRow> {
    let mut out: Vec<MountRow> = mps
        .iter()
        .filter(|m| node.is_none_or(|n| m.spec.node_name == n))
        .map(row)
        .collect();
    out.sort_by(|a, b| (&a.node, &a.volume, &a.name).cmp(&(&b.node, &b.volume, &b.name)));
    out
}

fn row(m: &MountPod) -> MountRow {
    let st = m.status.clone().unwrap_or_default();
    let annotations = m.annotations();
    let claim = match (
        annotations.get(ANNOTATION_PVC_NAMESPACE),
        annotations.get(ANNOTATION_PVC_NAME),
    ) {
        (Some(ns), Some(n)) if !n.is_empty() => format!("{ns}/{n}"),
        _ => String::new(),
    };
    let not_ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status != "True")
        .map(|c| {
            if c.message.is_empty() {
                c.reason.clone()
            } else {
                format!("{}: {}", c.reason, c.message)
            }
        });
    MountRow {
        node: m.spec.node_name.clone(),
        name: m.name_any(),
        volume: m.spec.volume.clone(),
        claim,
        task: format!("{:?}", m.spec.task),
        phase: st.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
        references: m.spec.references.len(),
        restarts: st.restarts,
        oom_kills: st.oom_kills,
        created: m.metadata.creation_timestamp.as_ref().map(|t| t.0),
        deleting_since: m.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        problem: not_ready
            .or(st.last_error)
            .map(|p| text::one_line(&p))
            .unwrap_or_default(),
    }
}

/// The table; the problem column last, cut to `width`.
pub fn render(rows: &[MountRow], now: jiff::Timestamp, width: Option<usize>) -> String {
    if rows.is_empty() {
        return "no MountPods\n".to_string();
    }
    let dash = |s: &str| {
        if s.is_empty() {
            "-".into()
        } else {
            s.to_string()
        }
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let phase = match r.deleting_since {
                Some(_) => format!("{} (deleting)", dash(&r.phase)),
                None => dash(&r.phase),
            };
            vec![
                r.node.clone(),
                r.volume.clone(),
                dash(&r.claim),
                r.task.clone(),
                phase,
                r.references.to_string(),
                r.restarts.to_string(),
                r.oom_kills.to_string(),
                r.created
                    .map(|t| text::age(now.duration_since(t).as_secs()))
                    .unwrap_or_else(|| "-".into()),
                dash(&r.problem),
            ]
        })
        .collect();
    text::table(
        &[
            "NODE", "VOLUME", "CLAIM", "TASK", "PHASE", "REFS", "RESTARTS", "OOM", "AGE", "PROBLEM",
        ],
        &cells,
        width,
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mp(name: &str, node: &str, volume: &str, extra: serde_json::Value) -> MountPod {
        let mut v = json!({
            "apiVersion": "tessera.io/v1alpha1",
            "kind": "MountPod",
            "metadata": {"name": name, "creationTimestamp": "2026-12-05T10:00:00Z"},
            "spec": {"volume": volume, "nodeName": node, "source": "/mnt/shared/tessera/x",
                     "task": "Serve", "capacityBytes": 1, "references": []},
        });
        json_merge(&mut v, extra);
        serde_json::from_value(v).expect("a MountPod")
    }

    fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn now() -> jiff::Timestamp {
        "2026-12-05T10:05:30Z".parse().unwrap()
    }

    #[test]
    fn rows_by_node_then_volume_with_claim_and_problem() {
        let all = [
            mp("v2-b", "node-b", "v2", json!({})),
            mp(
                "v1-b",
                "node-b",
                "v1",
                json!({
                    "metadata": {"annotations": {
                        "tessera.io/pvc-name": "data", "tessera.io/pvc-namespace": "shop"}},
                    "spec": {"references": [
                        {"targetPath": "/var/lib/kubelet/pods/u/volumes/x/mount", "owner": "csi"}]},
                    "status": {"phase": "Failed", "restarts": 3, "oomKills": 1,
                               "lastError": "daemon exited\nwith 1",
                               "conditions": [{"type": "Ready", "status": "False",
                                   "reason": "MountFailed", "message": "exit 1",
                                   "lastTransitionTime": "2026-12-05T10:01:00Z"}]},
                }),
            ),
            mp(
                "v1-a",
                "node-a",
                "v1",
                json!({"status": {"phase": "Ready", "lastError": "old\nerror",
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Mounted",
                        "message": "", "lastTransitionTime": "2026-12-05T10:01:00Z"}]}}),
            ),
        ];
        let got = rows(&all, None);
        let keys: Vec<_> = got
            .iter()
            .map(|r| (r.node.as_str(), r.name.as_str()))
            .collect();
        assert_eq!(
            keys,
            [("node-a", "v1-a"), ("node-b", "v1-b"), ("node-b", "v2-b")]
        );
        assert_eq!(got[1].claim, "shop/data");
        assert_eq!(got[1].references, 1);
        assert_eq!(got[1].problem, "MountFailed: exit 1", "the condition first");
        assert_eq!(
            got[0].problem, "old ⏎ error",
            "else the last error, one line"
        );
        assert_eq!(got[2].claim, "");
        assert_eq!(rows(&all, Some("node-b")).len(), 2);
        assert!(rows(&all, Some("node-c")).is_empty());

        let text = render(&got, now(), None);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NODE "), "{text}");
        assert!(
            lines[2].contains("shop/data") && lines[2].contains("Failed"),
            "{text}"
        );
        assert!(lines[2].contains("5m30s"), "{text}");
        assert!(lines[3].contains("   -   "), "no claim is a dash: {text}");
    }

    #[test]
    fn deleting_is_said_and_nothing_is_a_line() {
        let deleting = mp(
            "v1-a",
            "node-a",
            "v1",
            json!({"metadata": {"deletionTimestamp": "2026-12-05T10:05:00Z",
                                "finalizers": ["tessera.io/mount"]},
                   "status": {"phase": "Terminating"}}),
        );
        let text = render(&rows(&[deleting], None), now(), None);
        assert!(text.contains("Terminating (deleting)"), "{text}");
        assert_eq!(render(&[], now(), None), "no MountPods\n");
    }
}
