//! The controller's Node writes under its own identity (issue 46, item 2): the RBAC
//! of `config/rbac-controller.yaml` (`patch` on `nodes/status`, nothing on `nodes`)
//! and the policy of `config/node-status-policy.yaml` applied to the cluster under
//! test, then requests made as the controller's ServiceAccount (impersonation): the
//! very patch `failover::in_use::plan` builds, removing a csi.tessera.io entry from
//! `status.volumesInUse`, is admitted; removing another driver's entry, adding an
//! entry, a label, an annotation, a changed condition, and a taint are refused (a
//! taint sent to `nodes/status` is dropped by the API server: `spec` is not status).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use tessera_controller::failover::in_use::{entry, plan};

use crate::rbac::{CONTROLLER_SA, apply_config, can_i, impersonating};
use crate::support;
use support::fixtures::{self, eventually};

const POLICY: &str = "tessera-controller-node-writes";

/// A request of the controller's to a Node.
enum Write {
    Status(Patch<Value>),
    Node(Patch<Value>),
}

/// The HTTP status of `w` to `node` (200 for a success) and the refusal's message.
async fn attempt(nodes: &Api<Node>, node: &str, w: &Write, dry_run: bool) -> (u16, String) {
    let pp = PatchParams {
        dry_run,
        field_manager: Some(tessera_api::CONTROLLER_FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let res = match w {
        Write::Status(p) => nodes.patch_status(node, &pp, p).await,
        Write::Node(p) => nodes.patch(node, &pp, p).await,
    };
    match res {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("{e}"),
    }
}

fn json_patch(ops: Value) -> Patch<Value> {
    Patch::Json(serde_json::from_value(ops).unwrap())
}

#[tokio::test]
async fn the_controller_only_takes_tesseras_entries_out_of_a_nodes_volumes_in_use() {
    let client = support::client().await;
    apply_config(&[
        "namespace.yaml",
        "rbac-controller.yaml",
        "node-status-policy.yaml",
    ]);
    let id = support::unique_name("nodepolicy");
    let node = format!("{id}-n");
    fixtures::create_nodes(&client, std::slice::from_ref(&node)).await;
    let admin: Api<Node> = Api::all(client.clone());
    let (a, c) = (entry(&format!("{id}-a")), entry(&format!("{id}-c")));
    let other = format!("kubernetes.io/csi/other.example.com^{id}-a");
    let listed = vec![a.clone(), other.clone(), c.clone()];
    let status = json!({"status": {
        "volumesInUse": listed,
        "conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }});
    admin
        .patch_status(&node, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    let controller: Api<Node> = Api::all(impersonating(CONTROLLER_SA, None).await);

    let remove_other = Write::Status(json_patch(json!([
        {"op": "test", "path": "/status/volumesInUse/1", "value": other},
        {"op": "remove", "path": "/status/volumesInUse/1"},
    ])));
    // The policy takes a moment to be in force: wait until it refuses, by its name.
    eventually(
        Duration::from_secs(30),
        "the admission policy in force",
        || async {
            let (_, message) = attempt(&controller, &node, &remove_other, true).await;
            message.contains(POLICY).then_some(())
        },
    )
    .await;

    let taint = json!({"spec": {"taints": [{"key": "tessera.io/x", "effect": "NoSchedule"}]}});
    let refused: Vec<(&str, Write)> = vec![
        ("remove another driver's entry", remove_other),
        (
            "add a csi.tessera.io entry",
            Write::Status(json_patch(json!([
                {"op": "add", "path": "/status/volumesInUse/-", "value": entry("z")},
            ]))),
        ),
        (
            "replace a csi.tessera.io entry by another",
            Write::Status(json_patch(json!([
                {"op": "replace", "path": "/status/volumesInUse/0", "value": entry("z")},
            ]))),
        ),
        (
            "add a label",
            Write::Status(Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}))),
        ),
        (
            "add an annotation",
            Write::Status(Patch::Merge(
                json!({"metadata": {"annotations": {"x": "y"}}}),
            )),
        ),
        (
            "change a condition",
            Write::Status(json_patch(json!([
                {"op": "replace", "path": "/status/conditions/0/status", "value": "True"},
            ]))),
        ),
        (
            "remove its entry and add a label",
            Write::Status(json_patch(json!([
                {"op": "remove", "path": "/status/volumesInUse/0"},
                {"op": "add", "path": "/metadata/labels/x", "value": "y"},
            ]))),
        ),
        ("add a taint", Write::Node(Patch::Merge(taint.clone()))),
    ];
    let mut wrong = vec![];
    for (what, w) in &refused {
        let (code, message) = attempt(&controller, &node, w, false).await;
        println!("controller: {what}: HTTP {code} {message}");
        if (200..300).contains(&code) {
            wrong.push(format!("{what}: admitted"));
        }
    }
    // A taint sent to nodes/status: the API server keeps the Node's spec as it was.
    let (code, _) = attempt(
        &controller,
        &node,
        &Write::Status(Patch::Merge(taint)),
        false,
    )
    .await;
    let taints = admin.get(&node).await.unwrap().spec.unwrap().taints;
    let ours = taints
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == "tessera.io/x");
    println!("controller: a taint through nodes/status: HTTP {code}, on the Node: {ours}");
    if ours {
        wrong.push("a taint through nodes/status is on the Node".into());
    }

    // The controller's own patch: admitted, and it removes exactly its entry.
    let released: BTreeSet<String> = [format!("{id}-a")].into();
    let u = plan(&listed, &released).unwrap();
    let (code, message) = attempt(
        &controller,
        &node,
        &Write::Status(json_patch(u.patch)),
        false,
    )
    .await;
    println!("controller: remove a csi.tessera.io entry: HTTP {code} {message}");
    if code != 200 {
        wrong.push(format!("its own patch: HTTP {code} {message}"));
    }
    let n = admin.get(&node).await.unwrap();
    let status = n.status.unwrap_or_default();
    assert_eq!(status.volumes_in_use, Some(vec![other.clone(), c.clone()]));
    assert_eq!(status.conditions.unwrap()[0].status, "Unknown");
    assert_eq!(n.metadata.labels.unwrap_or_default().get("x"), None);

    // RBAC: the status subresource only, and only patch.
    for (verb, resource, allowed) in [
        ("patch", "nodes/status", true),
        ("update", "nodes/status", false),
        ("patch", "nodes", false),
        ("update", "nodes", false),
    ] {
        let got = can_i(CONTROLLER_SA, verb, resource);
        println!("controller: {verb} {resource}: {got}");
        if got != allowed {
            wrong.push(format!("controller {verb} {resource}: {got}"));
        }
    }
    fixtures::delete_nodes(&client, std::slice::from_ref(&node)).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}
