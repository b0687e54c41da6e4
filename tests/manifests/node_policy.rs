//! The controller's Node writes under its own identity (issue 46, item 2): the RBAC
//! of `config/rbac-controller.yaml` (`patch` on `nodes/status`, nothing on `nodes`)
//! and the policy of `config/node-status-policy.yaml` applied to the cluster under
//! test, then requests made as the controller's ServiceAccount (impersonation): the
//! very patch `failover::in_use::plan` builds, removing a csi.tessera.io entry from
//! `status.volumesInUse`, is admitted; removing another driver's entry, adding an
//! entry, a label, an annotation, a changed condition, and a taint are refused (a
//! taint sent to `nodes/status` is dropped by the API server: `spec` is not status).
//! With the opt-in fence taint (`controller.fenceTaint.enabled`, RBAC `patch` on
//! `nodes`), the controller's own `tessera.io/fenced:NoSchedule` is admitted on and
//! off, and nothing else of a Node: another taint, the taint as NoExecute, a label.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
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
    // With the fence taint on, RBAC lets it patch Nodes (as the chart's ClusterRole
    // does with controller.fenceTaint.enabled): the policy admits its own taint only.
    let extra = grant_patch_nodes(&client, &id).await;
    let fence = tessera_controller::failover::taint::fence_taint();
    let fresh = || async {
        let n = admin.get(&node).await.unwrap();
        let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
        (n.metadata.resource_version.unwrap(), taints)
    };
    let (rv, taints) = fresh().await;
    let add = tessera_controller::failover::taint::add_patch(&rv, &taints);
    eventually(
        Duration::from_secs(30),
        "patch on nodes granted",
        || async {
            let (code, _) = attempt(
                &controller,
                &node,
                &Write::Node(json_patch(add.clone())),
                true,
            )
            .await;
            (code == 200).then_some(())
        },
    )
    .await;
    let foreign = json!({"key": "example.com/x", "effect": "NoSchedule"});
    let no_execute = json!({"key": fence.key, "effect": "NoExecute", "value": "true"});
    let refused: Vec<(&str, Write)> = vec![
        (
            "add another taint",
            Write::Node(json_patch(
                json!([{"op": "add", "path": "/spec/taints/-", "value": foreign}]),
            )),
        ),
        (
            "add its taint as NoExecute",
            Write::Node(json_patch(
                json!([{"op": "add", "path": "/spec/taints/-", "value": no_execute}]),
            )),
        ),
        (
            "add its taint and a label",
            Write::Node(json_patch(json!([
                {"op": "add", "path": "/spec/taints/-", "value": fence},
                {"op": "add", "path": "/metadata/labels/x", "value": "y"},
            ]))),
        ),
        (
            "cordon the node",
            Write::Node(Patch::Merge(json!({"spec": {"unschedulable": true}}))),
        ),
    ];
    for (what, w) in &refused {
        let (code, message) = attempt(&controller, &node, w, false).await;
        println!("controller, fence taint on: {what}: HTTP {code} {message}");
        if (200..300).contains(&code) {
            wrong.push(format!("fence taint on: {what}: admitted"));
        }
    }
    for adding in [true, false] {
        let (rv, taints) = fresh().await;
        let p = if adding {
            tessera_controller::failover::taint::add_patch(&rv, &taints)
        } else {
            tessera_controller::failover::taint::remove_patch(&rv, &taints).unwrap()
        };
        let (code, message) = attempt(&controller, &node, &Write::Node(json_patch(p)), false).await;
        println!("controller, fence taint on: adding {adding}: HTTP {code} {message}");
        let (_, after) = fresh().await;
        let has = after.iter().any(|t| t.key == fence.key);
        if code != 200 || has != adding {
            wrong.push(format!(
                "its own taint, adding {adding}: HTTP {code}, on the Node: {has}"
            ));
        }
    }
    extra.remove(&client).await;
    fixtures::delete_nodes(&client, std::slice::from_ref(&node)).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A ClusterRole and binding giving the controller's ServiceAccount `patch` on Nodes,
/// as the chart's ClusterRole does with the fence taint on; removed by [`Extra::remove`].
struct Extra(String);

impl Extra {
    async fn remove(self, client: &kube::Client) {
        let dp = kube::api::DeleteParams::default();
        let _ = Api::<ClusterRoleBinding>::all(client.clone())
            .delete(&self.0, &dp)
            .await;
        let _ = Api::<ClusterRole>::all(client.clone())
            .delete(&self.0, &dp)
            .await;
    }
}

async fn grant_patch_nodes(client: &kube::Client, id: &str) -> Extra {
    let name = format!("{id}-patch-nodes");
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}],
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "tessera-controller", "namespace": "tessera-system"}],
    }))
    .unwrap();
    let pp = kube::api::PostParams::default();
    Api::<ClusterRole>::all(client.clone())
        .create(&pp, &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&pp, &binding)
        .await
        .unwrap();
    Extra(name)
}

/// The chart's value: the flags on the controller, `patch` on Nodes in its role; off
/// by default (config/, which the chart's defaults equal, has neither); the schema
/// takes a share in percent only.
#[test]
fn the_fence_taint_value_reaches_the_controller_and_its_role() {
    use crate::chart::{helm_template, objects};
    let on = objects(&helm_template(
        "storage",
        &[
            "controller.fenceTaint.enabled=true",
            "controller.fenceTaint.maxNodesPercent=50",
        ],
    ));
    let off = objects(&helm_template("storage", &[]));
    let args = |objs: &std::collections::BTreeMap<(String, String, String), Value>| {
        let d = &objs[&(
            "Deployment".into(),
            "storage".into(),
            "tessera-controller".into(),
        )];
        d["spec"]["template"]["spec"]["containers"][0]["args"].to_string()
    };
    let patches_nodes =
        |objs: &std::collections::BTreeMap<(String, String, String), Value>| {
            let role = &objs[&(
                "ClusterRole".into(),
                String::new(),
                "tessera-controller".into(),
            )];
            role["rules"].as_array().unwrap().iter().any(|r| {
                r["resources"] == json!(["nodes"]) && r["verbs"].to_string().contains("patch")
            })
        };
    assert!(args(&on).contains("\"--fence-taint\""), "{}", args(&on));
    assert!(
        args(&on).contains("--fence-taint-max-percent=50"),
        "{}",
        args(&on)
    );
    assert!(patches_nodes(&on));
    assert!(!args(&off).contains("--fence-taint"), "{}", args(&off));
    assert!(!patches_nodes(&off));
    let bad = std::process::Command::new(crate::chart::harness_bin("helm"))
        .args(["template", "t"])
        .arg(support::repo_root().join("charts/tessera"))
        .args(["--set", "controller.fenceTaint.maxNodesPercent=101"])
        .output()
        .unwrap();
    assert!(!bad.status.success(), "a share above 100 % rendered");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("/controller/fenceTaint/maxNodesPercent"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
