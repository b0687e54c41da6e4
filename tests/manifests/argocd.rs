//! The Argo CD health script Tessera ships (config/argocd/health.lua), run as Argo CD
//! runs it (embedded Lua 5.1, the object as `obj`) on hand-made objects of each state,
//! and the places it is shipped: config/argocd/argocd-cm.yaml and the chart's copy.
//! The same script on real objects: tests/controller/gitops_health.rs.

use serde_json::{Value, json};

use crate::support;
use support::health::{argocd_health, argocd_script};

fn cond(type_: &str, status: &str, reason: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": format!("{reason} says so"),
           "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2})
}

fn object(kind: &str, deleting: bool, status: Option<Value>) -> Value {
    let mut o = json!({"apiVersion": "tessera.io/v1alpha1", "kind": kind,
                       "metadata": {"name": "v", "generation": 2}});
    if deleting {
        o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    if let Some(s) = status {
        o["status"] = s;
    }
    o
}

fn status(generation: i64, conditions: Vec<Value>) -> Option<Value> {
    Some(json!({"observedGeneration": generation, "conditions": conditions}))
}

#[test]
fn the_health_script_reads_each_state_as_argocd_defines_it() {
    let ready = || cond("Ready", "True", "Attached");
    let not_ready = |r: &str| cond("Ready", "False", r);
    let table: Vec<(&str, Value, &str, &str)> = vec![
        (
            "attached",
            object("Volume", false, status(2, vec![ready()])),
            "Healthy",
            "Attached",
        ),
        (
            "attaching",
            object(
                "Volume",
                false,
                status(
                    2,
                    vec![
                        not_ready("Attaching"),
                        cond("Reconciling", "True", "Attaching"),
                    ],
                ),
            ),
            "Progressing",
            "Attaching: Attaching says so",
        ),
        (
            "faulted",
            object(
                "Volume",
                false,
                status(
                    2,
                    vec![
                        cond("Faulted", "True", "MountFailed"),
                        not_ready("MountFailed"),
                        cond("Stalled", "True", "MountFailed"),
                    ],
                ),
            ),
            "Degraded",
            "MountFailed: MountFailed says so",
        ),
        (
            "a ticket waits",
            object(
                "VolumeAttachment",
                false,
                status(
                    2,
                    vec![
                        not_ready("HeldByOtherNode"),
                        cond("Reconciling", "True", "HeldByOtherNode"),
                    ],
                ),
            ),
            "Progressing",
            "HeldByOtherNode",
        ),
        (
            "a mount failed",
            object(
                "MountPod",
                false,
                status(
                    2,
                    vec![
                        not_ready("DaemonFailed"),
                        cond("Stalled", "True", "DaemonFailed"),
                    ],
                ),
            ),
            "Degraded",
            "DaemonFailed",
        ),
        (
            "being deleted",
            object("Volume", true, status(2, vec![ready()])),
            "Progressing",
            "being deleted",
        ),
        (
            "an older generation's status",
            object("Volume", false, status(1, vec![ready()])),
            "Progressing",
            "generation 2",
        ),
        (
            "no status yet",
            object("MountPod", false, None),
            "Progressing",
            "waiting",
        ),
        (
            "not ready, no abnormal condition",
            object("MountPod", false, status(2, vec![not_ready("Starting")])),
            "Progressing",
            "Starting",
        ),
        (
            "abnormal conditions that are False are no news",
            object(
                "Volume",
                false,
                status(
                    2,
                    vec![
                        ready(),
                        cond("Stalled", "False", "Fine"),
                        cond("Reconciling", "False", "Fine"),
                    ],
                ),
            ),
            "Healthy",
            "Attached",
        ),
    ];
    let script = argocd_script();
    for (what, obj, want, says) in table {
        let (got, message) = argocd_health(&script, &obj);
        assert_eq!(got, want, "{what}: {message}");
        assert!(message.contains(says), "{what}: {message:?} lacks {says:?}");
    }
}

/// config/argocd/argocd-cm.yaml carries the script for each kind, and the chart's copy
/// is the same script.
#[test]
fn the_health_script_is_shipped_alike_for_the_three_kinds() {
    let script = argocd_script();
    let root = support::repo_root();
    let cm: Value = serde_norway::from_str(
        &std::fs::read_to_string(root.join("config/argocd/argocd-cm.yaml")).unwrap(),
    )
    .unwrap();
    let data = cm["data"].as_object().expect("data");
    for kind in ["Volume", "VolumeAttachment", "MountPod"] {
        let key = format!("resource.customizations.health.tessera.io_{kind}");
        assert!(
            data[&key].as_str() == Some(script.as_str()),
            "{key} differs from config/argocd/health.lua"
        );
    }
    assert_eq!(data.len(), 3);
    assert!(
        std::fs::read_to_string(root.join("charts/tessera/files/argocd-health.lua")).unwrap()
            == script,
        "charts/tessera/files/argocd-health.lua differs from config/argocd/health.lua"
    );
}
