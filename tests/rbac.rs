//! Each component under its own identity (issue 13, security item 5): the RBAC and the
//! admission policy of `config/` applied to the cluster under test, then requests made
//! as the node agent's ServiceAccount of node A (impersonation, with the node name as
//! the `authentication.kubernetes.io/node-name` extra a Pod's bound token carries):
//! it reads Volumes (NodePublish does), writes its own MountPod's status, references
//! and finalizers, and nothing of node B's MountPods nor any `spec.source`. The
//! controller's role is checked for what it does with `kubectl auth can-i`.

mod support;

use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::fixtures::{self, TEST_LABEL, eventually};
use tessera::api::{MountPod, Volume};

const NODE_SA: &str = "system:serviceaccount:tessera-system:tessera-node";
const CONTROLLER_SA: &str = "system:serviceaccount:tessera-system:tessera-controller";

fn apply_config(files: &[&str]) {
    for f in files {
        let path = support::repo_root().join("config").join(f);
        let out = support::kubectl()
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl apply {f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A client acting as `user` with the ServiceAccount groups and, if given, the
/// node-name extra (kube's impersonation headers, `Impersonate-Extra-…`).
async fn impersonating(user: &str, node: Option<&str>) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(support::kubeconfig_path()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        "system:serviceaccounts:tessera-system".into(),
        "system:authenticated".into(),
    ]);
    config.auth_info.impersonate_user_extra = node.map(|n| {
        [(
            "authentication.kubernetes.io/node-name".to_string(),
            vec![n.to_string()],
        )]
        .into()
    });
    Client::try_from(config).unwrap()
}

/// What a node agent may try.
#[derive(Clone)]
enum Try {
    GetVolume(String),
    ListMountPods,
    PatchVolume(String, serde_json::Value),
    Patch(String, serde_json::Value),
    PatchStatus(String, serde_json::Value),
    Delete(String),
}

/// The HTTP status of `t` done with `client` (200 for a success).
async fn attempt(client: &Client, t: Try) -> u16 {
    let mps: Api<MountPod> = Api::all(client.clone());
    let vols: Api<Volume> = Api::all(client.clone());
    let pp = PatchParams::default();
    let res: Result<(), kube::Error> = match t {
        Try::GetVolume(n) => vols.get(&n).await.map(drop),
        Try::ListMountPods => mps.list(&Default::default()).await.map(drop),
        Try::PatchVolume(n, b) => vols.patch(&n, &pp, &Patch::Merge(b)).await.map(drop),
        Try::Patch(n, b) => mps.patch(&n, &pp, &Patch::Merge(b)).await.map(drop),
        Try::PatchStatus(n, b) => mps.patch_status(&n, &pp, &Patch::Merge(b)).await.map(drop),
        Try::Delete(n) => mps.delete(&n, &Default::default()).await.map(drop),
    };
    match res {
        Ok(()) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    }
}

fn can_i(user: &str, verb: &str, resource: &str) -> bool {
    let out = support::kubectl()
        .args(["auth", "can-i", verb, resource, "--as", user])
        .args(["--as-group", "system:serviceaccounts"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[tokio::test]
async fn the_node_agent_acts_only_on_its_own_nodes_mountpods() {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    apply_config(&[
        "namespace.yaml",
        "rbac-node.yaml",
        "rbac-controller.yaml",
        "mountpod-policy.yaml",
    ]);
    let id = support::unique_name("rbac");
    let (a, b) = (format!("{id}-a"), format!("{id}-b"));
    let vol = fixtures::volume(&format!("{id}-v"), &id, "ReadWriteMany");
    let vol = Api::<Volume>::all(client.clone())
        .create(&PostParams::default(), &vol)
        .await
        .unwrap();
    let mps: Api<MountPod> = Api::all(client.clone());
    for node in [&a, &b] {
        let mp: MountPod = serde_json::from_value(json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
            "metadata": {"name": format!("{id}-v-{node}"), "labels": {TEST_LABEL: id}},
            "spec": {"volume": vol.metadata.name, "nodeName": node,
                     "source": format!("/var/lib/tessera/test/{id}-v"), "capacityBytes": 1048576},
        }))
        .unwrap();
        mps.create(&PostParams::default(), &mp).await.unwrap();
    }
    let mp = |node: &str| format!("{id}-v-{node}");
    let status = json!({"status": {"phase": "Ready"}});
    let refs = |t: &str| json!({"spec": {"references": [{"targetPath": format!("/var/lib/kubelet/pods/{t}/mount"), "owner": "pod/x", "readOnly": false}]}});
    let source = json!({"spec": {"source": "/etc"}});
    let agent_a = impersonating(NODE_SA, Some(&a)).await;
    let no_node = impersonating(NODE_SA, None).await;

    // The policy takes a moment to be in force: wait until node B's MountPod is refused.
    eventually(
        Duration::from_secs(30),
        "the admission policy in force",
        || async {
            let code = attempt(&agent_a, Try::PatchStatus(mp(&b), status.clone())).await;
            (code >= 400).then_some(())
        },
    )
    .await;

    let v = format!("{id}-v");
    let cases: Vec<(&str, &Client, Try, bool)> = vec![
        ("read its Volume", &agent_a, Try::GetVolume(v.clone()), true),
        ("list MountPods", &agent_a, Try::ListMountPods, true),
        (
            "write its own MountPod's status",
            &agent_a,
            Try::PatchStatus(mp(&a), status.clone()),
            true,
        ),
        (
            "add a reference to its own MountPod",
            &agent_a,
            Try::Patch(mp(&a), refs("p1")),
            true,
        ),
        (
            "add a finalizer to its own MountPod",
            &agent_a,
            Try::Patch(
                mp(&a),
                json!({"metadata": {"finalizers": ["tessera.io/mount"]}}),
            ),
            true,
        ),
        (
            "change spec.source of its own MountPod",
            &agent_a,
            Try::Patch(mp(&a), source.clone()),
            false,
        ),
        (
            "change spec.capacityBytes of its own MountPod",
            &agent_a,
            Try::Patch(mp(&a), json!({"spec": {"capacityBytes": 1}})),
            false,
        ),
        (
            "write node B's MountPod status",
            &agent_a,
            Try::PatchStatus(mp(&b), status.clone()),
            false,
        ),
        (
            "add a reference to node B's MountPod",
            &agent_a,
            Try::Patch(mp(&b), refs("p2")),
            false,
        ),
        (
            "change spec.source of node B's MountPod",
            &agent_a,
            Try::Patch(mp(&b), source.clone()),
            false,
        ),
        (
            "write its own MountPod with no node in its token",
            &no_node,
            Try::Patch(mp(&a), refs("p3")),
            false,
        ),
        (
            "delete node B's MountPod",
            &agent_a,
            Try::Delete(mp(&b)),
            false,
        ),
        (
            "change a Volume",
            &agent_a,
            Try::PatchVolume(v.clone(), json!({"spec": {"size": "2Gi"}})),
            false,
        ),
    ];
    let mut wrong = vec![];
    for (what, client, t, allowed) in cases {
        let code = attempt(client, t).await;
        let ok = (200..300).contains(&code);
        println!(
            "agent of node A: {what}: HTTP {code} ({})",
            if ok { "allowed" } else { "refused" }
        );
        if ok != allowed {
            wrong.push(format!(
                "{what}: HTTP {code}, expected {}",
                if allowed { "allowed" } else { "refused" }
            ));
        }
    }
    let after = mps.get(&format!("{id}-v-{b}")).await.unwrap();
    assert_eq!(after.spec.source, format!("/var/lib/tessera/test/{id}-v"));
    assert!(after.spec.references.is_empty());

    // The controller: what it does, and not more.
    for (verb, resource, allowed) in [
        ("get", "volumes.tessera.io", true),
        ("patch", "volumes.tessera.io/status", true),
        ("create", "mountpods.tessera.io", true),
        ("delete", "mountpods.tessera.io", true),
        ("patch", "volumeattachments.tessera.io", true),
        ("list", "nodes", true),
        ("list", "volumeattachments.storage.k8s.io", true),
        ("create", "events.events.k8s.io", true),
        ("get", "secrets", false),
        ("create", "pods", false),
        ("delete", "nodes", false),
    ] {
        let got = can_i(CONTROLLER_SA, verb, resource);
        println!(
            "controller: {verb} {resource}: {}",
            if got { "yes" } else { "no" }
        );
        if got != allowed {
            wrong.push(format!("controller {verb} {resource}: {got}"));
        }
    }

    for node in [&a, &b] {
        let _ = mps
            .patch(
                &format!("{id}-v-{node}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let _ = mps
            .delete(&format!("{id}-v-{node}"), &Default::default())
            .await;
    }
    fixtures::delete_volumes(&client, &[format!("{id}-v")]).await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}
