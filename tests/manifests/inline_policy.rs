//! CSI ephemeral inline volumes (issue 19) under the node agent's identity: the RBAC
//! of `rbac-node.yaml` narrowed by `inline-policy.yaml` (see `rbac` for the
//! impersonation), against the API server of the harness.

use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use tessera_api::{ATTACHMENT_FINALIZER, AttacherType, AttachmentTicket, Volume, VolumeAttachment};

use super::rbac::{CONTROLLER_SA, NODE_SA, apply_config, can_i, code, impersonating};
use crate::support;
use support::fixtures::{self, TEST_LABEL, eventually};

/// An inline Volume `name` of test `id` (labelled so when `label`) of `scope` on `node`.
fn inline(id: &str, name: &str, node: &str, label: bool, scope: &str) -> Volume {
    let mut labels = json!({TEST_LABEL: id});
    if label {
        labels["tessera.io/inline"] = json!("true");
    }
    serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
        "metadata": {"name": name, "labels": labels},
        "spec": {"size": "1Mi", "accessMode": "ReadWriteOnce",
                 "backend": {"root": "/var/lib/tessera/test", "scope": scope,
                             "node": (scope == "NodeLocal").then_some(node)}},
    }))
    .unwrap()
}

/// A csi-ephemeral ticket of `node`, as its agent writes it.
fn ephemeral(node: &str) -> AttachmentTicket {
    AttachmentTicket::new(format!("inline-{node}"), AttacherType::CsiEphemeral, node)
}

/// The HTTP code of a create of `v` as `c` (a dry run when `dry_run`).
async fn create(c: &Client, v: Volume, dry_run: bool) -> u16 {
    let pp = PostParams {
        dry_run,
        ..Default::default()
    };
    code(
        Api::<Volume>::all(c.clone())
            .create(&pp, &v)
            .await
            .map(drop),
    )
}

/// The HTTP code of a merge patch `p` of VolumeAttachment `name` as `c` (a dry run when
/// `dry_run`).
async fn patch_va(c: &Client, name: &str, p: serde_json::Value, dry_run: bool) -> u16 {
    let pp = PatchParams {
        dry_run,
        ..Default::default()
    };
    let api: Api<VolumeAttachment> = Api::all(c.clone());
    code(api.patch(name, &pp, &Patch::Merge(p)).await.map(drop))
}

/// The HTTP code of a delete of Volume `name` as `c`.
async fn delete(c: &Client, name: &str) -> u16 {
    let api: Api<Volume> = Api::all(c.clone());
    code(api.delete(name, &Default::default()).await.map(drop))
}

/// CSI ephemeral inline volumes (issue 19): the node agent creates and deletes only
/// inline Volumes of its own node, and on their VolumeAttachments adds and removes
/// only `csi-ephemeral` tickets of its own node, under its own identity (RBAC of
/// `rbac-node.yaml` narrowed by `inline-policy.yaml`), and changes none of their
/// metadata (labels, annotations, finalizers, ownerReferences). The controller reads
/// Pods by name (the orphan check) and nothing more of them.
#[tokio::test]
async fn the_node_agent_makes_only_its_own_nodes_inline_volumes() {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    apply_config(&[
        "namespace.yaml",
        "rbac-node.yaml",
        "rbac-controller.yaml",
        "inline-policy.yaml",
    ]);
    let id = support::unique_name("rbac-inline");
    let (a, b) = (format!("{id}-a"), format!("{id}-b"));
    let inline =
        |name: &str, node: &str, label: bool, scope: &str| inline(&id, name, node, label, scope);
    let admin_vols: Api<Volume> = Api::all(client.clone());
    let admin_vas: Api<VolumeAttachment> = Api::all(client.clone());
    let (own, others, plain) = (
        format!("inline-{id}-own"),
        format!("inline-{id}-b"),
        format!("{id}-v"),
    );
    // Node B's inline Volume and a plain one, made by the administrator; each with
    // a VolumeAttachment holding a manual ticket on node B.
    for v in [
        inline(&others, &b, true, "NodeLocal"),
        fixtures::volume(&plain, &id, "ReadWriteOnce"),
    ] {
        admin_vols.create(&PostParams::default(), &v).await.unwrap();
    }
    let manual = AttachmentTicket::new("manual-b", AttacherType::Manual, &b);
    for name in [&others, &plain] {
        let va: VolumeAttachment = serde_json::from_value(json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
            "metadata": {"name": name, "labels": {TEST_LABEL: id},
                         "finalizers": [ATTACHMENT_FINALIZER]},
            "spec": {"volume": name, "attachmentTickets": {"manual-b": manual}},
        }))
        .unwrap();
        admin_vas.create(&PostParams::default(), &va).await.unwrap();
    }
    let agent_a = impersonating(NODE_SA, Some(&a)).await;
    let no_node = impersonating(NODE_SA, None).await;
    // Each policy is loaded by the API server on its own: wait until both refuse
    // (a dry-run create of node B's inline Volume, a dry-run ticket of node B, a
    // dry-run label: the policy of this version, not one applied before).
    eventually(
        Duration::from_secs(30),
        "the admission policies in force",
        || async {
            let v = inline(&format!("inline-{id}-x"), &b, true, "NodeLocal");
            let volume_refused = create(&agent_a, v, true).await >= 400;
            let ticket = ephemeral(&b).upsert_patch();
            let ticket_refused = patch_va(&agent_a, &others, ticket, true).await >= 400;
            let label = json!({"metadata": {"labels": {"x": "y"}}});
            let label_refused = patch_va(&agent_a, &others, label, true).await >= 400;
            (volume_refused && ticket_refused && label_refused).then_some(())
        },
    )
    .await;

    let add = |t: &AttachmentTicket| t.upsert_patch();
    let remove = |id: &str| tessera_api::tickets_removal_patch([id]);
    let patch_va = |name: &str, p: serde_json::Value| {
        let (agent_a, name) = (&agent_a, name.to_string());
        async move { patch_va(agent_a, &name, p, false).await }
    };
    let mut wrong = vec![];
    let mut check = |what: &str, got: u16, allowed: bool| {
        let ok = (200..300).contains(&got);
        println!(
            "agent of node A: {what}: HTTP {got} ({})",
            if ok { "allowed" } else { "refused" }
        );
        if ok != allowed {
            wrong.push(format!("{what}: HTTP {got}"));
        }
    };
    let cases = [
        (
            "create an inline Volume of node B",
            inline(&format!("inline-{id}-x"), &b, true, "NodeLocal"),
        ),
        (
            "create an unlabelled Volume",
            inline(&format!("inline-{id}-x"), &a, false, "NodeLocal"),
        ),
        (
            "create a Volume not named inline-",
            inline(&format!("{id}-x"), &a, true, "NodeLocal"),
        ),
        (
            "create a shared inline Volume",
            inline(&format!("inline-{id}-x"), &a, true, "Shared"),
        ),
    ];
    for (what, v) in cases {
        check(what, create(&agent_a, v, true).await, false);
    }
    let got = create(&no_node, inline(&own, &a, true, "NodeLocal"), true).await;
    check(
        "create its inline Volume with no node in its token",
        got,
        false,
    );
    let got = create(&agent_a, inline(&own, &a, true, "NodeLocal"), false).await;
    check("create its own node's inline Volume", got, true);
    let got = delete(&agent_a, &plain).await;
    check("delete a plain Volume", got, false);
    let got = delete(&agent_a, &others).await;
    check("delete node B's inline Volume", got, false);
    let got = patch_va(&others, add(&ephemeral(&a))).await;
    check(
        "add a csi-ephemeral ticket of its node to an inline volume",
        got,
        true,
    );
    let got = patch_va(&others, add(&ephemeral(&b))).await;
    check("add a csi-ephemeral ticket of node B", got, false);
    let manual_a = AttachmentTicket::new("manual-a", AttacherType::Manual, &a);
    let got = patch_va(&others, add(&manual_a)).await;
    check("add a manual ticket of its node", got, false);
    let got = patch_va(&others, remove("manual-b")).await;
    check("remove node B's manual ticket", got, false);
    let got = patch_va(&plain, add(&ephemeral(&a))).await;
    check("add a csi-ephemeral ticket to a plain volume", got, false);
    // The metadata of an inline volume's VolumeAttachment: the controller's (labels:
    // its watch selector; finalizers: the workload protection), never the agent's.
    let owner = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "x",
                        "uid": "00000000-0000-0000-0000-000000000001"}]);
    let mut with_label = add(&ephemeral(&a));
    with_label["metadata"] = json!({"labels": {"x": "y"}});
    for (what, p) in [
        (
            "remove the workload-protection finalizer",
            json!({"metadata": {"finalizers": null}}),
        ),
        (
            "add a finalizer",
            json!({"metadata": {"finalizers": [ATTACHMENT_FINALIZER, "example.com/hold"]}}),
        ),
        (
            "remove the controller's watch label",
            json!({"metadata": {"labels": {TEST_LABEL: null}}}),
        ),
        ("add a label", json!({"metadata": {"labels": {"x": "y"}}})),
        (
            "add an annotation",
            json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "add an ownerReference",
            json!({"metadata": {"ownerReferences": owner}}),
        ),
        ("add its csi-ephemeral ticket and a label", with_label),
    ] {
        check(what, patch_va(&others, p).await, false);
    }
    let got = patch_va(&others, remove(&format!("inline-{a}"))).await;
    check("remove its csi-ephemeral ticket", got, true);
    let got = delete(&agent_a, &own).await;
    check("delete its own node's inline Volume", got, true);
    let va = admin_vas.get(&others).await.unwrap();
    assert_eq!(
        va.spec.attachment_tickets.keys().collect::<Vec<_>>(),
        ["manual-b"],
        "only what the agent may do was done"
    );
    assert_eq!(
        (
            va.metadata.labels.clone().unwrap_or_default(),
            va.metadata.finalizers.clone().unwrap_or_default(),
            va.metadata.annotations.clone().unwrap_or_default(),
            va.metadata.owner_references.clone().unwrap_or_default(),
        ),
        (
            [(TEST_LABEL.to_string(), id.clone())].into(),
            vec![ATTACHMENT_FINALIZER.to_string()],
            Default::default(),
            vec![],
        ),
        "the metadata is as the administrator made it"
    );

    for (who, verb, resource, allowed) in [
        (NODE_SA, "update", "volumes.tessera.io", false),
        (NODE_SA, "patch", "volumes.tessera.io", false),
        (NODE_SA, "create", "volumeattachments.tessera.io", false),
        (NODE_SA, "delete", "volumeattachments.tessera.io", false),
        (NODE_SA, "get", "pods", false),
        // The orphan check reads a Pod by name. (`list` is not asserted: the CSI
        // sidecars in the controller's Pod share its ServiceAccount, and the
        // external-resizer's rule in rbac-sidecars.yaml lists Pods; whether that
        // binding exists here depends on which test of this binary applied it first.)
        (CONTROLLER_SA, "get", "pods", true),
        // Fenced failover deletes a down node's Pods by name (docs/failover.md).
        (CONTROLLER_SA, "delete", "pods", true),
        (CONTROLLER_SA, "create", "pods", false),
    ] {
        let got = can_i(who, verb, resource);
        println!(
            "{who}: {verb} {resource}: {}",
            if got { "yes" } else { "no" }
        );
        if got != allowed {
            wrong.push(format!("{who} {verb} {resource}: {got}"));
        }
    }

    // No controller runs here to let go of the finalizer.
    let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for name in [&others, &plain] {
        let _ = admin_vas
            .patch(name, &PatchParams::default(), &release)
            .await;
        let _ = admin_vas.delete(name, &Default::default()).await;
    }
    fixtures::delete_volumes(&client, &[others, plain, own]).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}
