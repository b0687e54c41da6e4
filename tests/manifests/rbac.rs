//! Each component under its own identity (issue 13, security item 5): the RBAC and the
//! admission policy of `config/` applied to the cluster under test, then requests made
//! as the node agent's ServiceAccount of node A (impersonation, with the node name as
//! the `authentication.kubernetes.io/node-name` extra a Pod's bound token carries):
//! it reads Volumes (NodePublish does), writes its own MountPod's status, references
//! and finalizers, and nothing of node B's MountPods nor any `spec.source`. The
//! controller's role is checked for what it does with `kubectl auth can-i`.

use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use tessera_api::{MountPod, Volume};

use crate::support;
use support::fixtures::{self, TEST_LABEL, eventually};

pub(super) const NODE_SA: &str = "system:serviceaccount:tessera-system:tessera-node";
pub(super) const CONTROLLER_SA: &str = "system:serviceaccount:tessera-system:tessera-controller";

pub(super) fn apply_config(files: &[&str]) {
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
pub(super) async fn impersonating(user: &str, node: Option<&str>) -> Client {
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
        Err(kube::Error::Api(s)) => {
            println!("  {}", s.message);
            s.code
        }
        Err(e) => panic!("{e}"),
    }
}

/// Whether `user` may `verb` `resource` (`kind.group`, or `kind.group/subresource`:
/// given to kubectl as `--subresource`, which would read `kind/x` as the object `x`).
pub(super) fn can_i(user: &str, verb: &str, resource: &str) -> bool {
    let (resource, sub) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(format!("--subresource={s}"))),
        None => (resource, None),
    };
    let out = support::kubectl()
        .args(["auth", "can-i", verb, resource, "--as", user])
        .args(sub)
        .args(["--as-group", "system:serviceaccounts"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[tokio::test]
async fn the_node_agent_acts_only_on_its_own_nodes_mountpods() {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    // The sidecars' snapshot rules are checked by resource name below: `kubectl auth
    // can-i` resolves those names only when the API serves them.
    support::ensure_snapshot_crds(&client).await;
    apply_config(&[
        "namespace.yaml",
        "rbac-node.yaml",
        "rbac-controller.yaml",
        "rbac-sidecars.yaml",
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
        // Fenced failover: the Fenced condition of a fenced node's MountPods.
        ("patch", "mountpods.tessera.io/status", true),
        ("update", "mountpods.tessera.io/status", false),
        ("create", "mountpods.tessera.io", true),
        ("delete", "mountpods.tessera.io", true),
        // The CSI Controller service's one MountPod list-watch (unpublish waits).
        ("list", "mountpods.tessera.io", true),
        ("watch", "mountpods.tessera.io", true),
        ("patch", "volumeattachments.tessera.io", true),
        ("list", "nodes", true),
        ("list", "volumeattachments.storage.k8s.io", true),
        ("create", "events.events.k8s.io", true),
        ("get", "secrets", false),
        ("create", "pods", false),
        ("update", "pods", false),
        // Fenced failover: a down node's Pods and storage attachments, by name.
        ("delete", "pods", true),
        ("delete", "volumeattachments.storage.k8s.io", true),
        ("create", "volumeattachments.storage.k8s.io", false),
        ("delete", "nodes", false),
        // csi-snapshotter (same ServiceAccount): the contents and their status; the
        // provisioner reads snapshots to restore; neither deletes them.
        (
            "watch",
            "volumesnapshotcontents.snapshot.storage.k8s.io",
            true,
        ),
        (
            "patch",
            "volumesnapshotcontents.snapshot.storage.k8s.io/status",
            true,
        ),
        ("get", "volumesnapshots.snapshot.storage.k8s.io", true),
        ("delete", "volumesnapshots.snapshot.storage.k8s.io", false),
        (
            "delete",
            "volumesnapshotcontents.snapshot.storage.k8s.io",
            false,
        ),
        (
            "create",
            "volumesnapshotcontents.snapshot.storage.k8s.io",
            false,
        ),
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

/// Pod mode (issue 14): the agent creates, reads, watches and deletes the mount Pods
/// of its MountPods in its own namespace, under its own identity: the very Pod
/// `tessera_node::pods` builds is accepted; nothing else of Pods is allowed, and
/// nothing in any other namespace.
#[tokio::test]
async fn the_node_agent_manages_mount_pods_in_its_namespace_only() {
    use k8s_openapi::api::core::v1::Pod;
    use tessera_node::daemon_spec::DaemonSpec;
    use tessera_node::pods::spec::{Template, mount_pod};

    let client = support::client().await;
    support::ensure_crds(&client).await;
    apply_config(&["namespace.yaml", "rbac-node.yaml"]);
    let id = support::unique_name("rbacpod");
    let agent = impersonating(NODE_SA, Some(&format!("{id}-a"))).await;
    let template = |namespace: &str| Template {
        namespace: namespace.into(),
        node: format!("{id}-a"),
        image: "tessera:0.1.0".into(),
        pull_policy: Some("Never".into()),
        image_pull_secrets: vec![],
        mount_root: "/var/lib/tessera/mounts".into(),
        state_dir: "/var/lib/tessera/node".into(),
        termination_grace_seconds: 30,
        resources: Default::default(),
        extras: Default::default(),
    };
    let spec = DaemonSpec {
        volume: format!("{id}-v"),
        mountpod: format!("{id}-v-a"),
        // No owner: a made-up uid would have the garbage collector race the test.
        mountpod_uid: String::new(),
        source: format!("/var/lib/tessera/test/{id}-v").into(),
        mountpoint: format!("/var/lib/tessera/mounts/{id}-v").into(),
        capacity_bytes: 1 << 20,
        capacity_file: format!("/var/lib/tessera/node/mounts/{id}-v.capacity").into(),
        counters_file: format!("/var/lib/tessera/node/mounts/{id}-v.counters").into(),
        read_only: false,
        shared_backend: false,
        options: vec![],
        resources: None,
        settings_file: None,
        fence_file: None,
        handoff: None,
        mounted: false,
    };
    let own = mount_pod(&template("tessera-system"), &spec);
    let name = own.metadata.name.clone().unwrap();
    let mine: Api<Pod> = Api::namespaced(agent.clone(), "tessera-system");
    let elsewhere: Api<Pod> = Api::namespaced(agent.clone(), "default");
    let code = |r: Result<(), kube::Error>| match r {
        Ok(()) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    };
    let pp = PatchParams::default();
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    let mut wrong = Vec::new();
    // RBAC may take a moment to be in force after the apply.
    eventually(
        Duration::from_secs(20),
        "the agent creates its mount Pod",
        || async {
            match mine.create(&PostParams::default(), &own).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(s)) if s.code == 403 => None,
                Err(e) => panic!("creating the mount Pod as the agent: {e}"),
            }
        },
    )
    .await;
    let tries: Vec<(&str, u16, Result<(), kube::Error>)> = vec![
        ("get its mount Pod", 200, mine.get(&name).await.map(drop)),
        (
            "list mount Pods",
            200,
            mine.list(&Default::default()).await.map(drop),
        ),
        (
            "patch its mount Pod",
            403,
            mine.patch(&name, &pp, &Patch::Merge(&label))
                .await
                .map(drop),
        ),
        (
            "patch a mount Pod's status",
            403,
            mine.patch_status(&name, &pp, &Patch::Merge(&label))
                .await
                .map(drop),
        ),
        (
            "create a Pod in another namespace",
            403,
            elsewhere
                .create(
                    &PostParams::default(),
                    &mount_pod(&template("default"), &spec),
                )
                .await
                .map(drop),
        ),
        (
            "list Pods in another namespace",
            403,
            elsewhere.list(&Default::default()).await.map(drop),
        ),
        (
            "delete its mount Pod",
            200,
            mine.delete(&name, &Default::default()).await.map(drop),
        ),
    ];
    for (what, want, res) in tries {
        let got = code(res);
        println!("agent: {what}: HTTP {got}");
        if got != want {
            wrong.push(format!("{what}: HTTP {got}, want {want}"));
        }
    }
    // (`pods/exec` would be the Pod named exec to `kubectl auth can-i`: --subresource.)
    for (verb, subresource, allowed) in [
        ("watch", "", true),
        ("update", "", false),
        ("create", "exec", false),
        ("create", "eviction", false),
        ("patch", "status", false),
    ] {
        let out = support::kubectl()
            .args(["auth", "can-i", verb, "pods", "-n", "tessera-system"])
            .arg(format!("--subresource={subresource}"))
            .args(["--as", NODE_SA, "--as-group", "system:serviceaccounts"])
            .output()
            .unwrap();
        let got = String::from_utf8_lossy(&out.stdout).trim() == "yes";
        println!(
            "agent: {verb} pods {subresource}: {}",
            if got { "yes" } else { "no" }
        );
        if got != allowed {
            wrong.push(format!("agent {verb} pods {subresource}: {got}"));
        }
    }
    // No kubelet confirms the deletion here (its node does not exist): remove it now.
    let _ = Api::<Pod>::namespaced(client.clone(), "tessera-system")
        .delete(&name, &kube::api::DeleteParams::default().grace_period(0))
        .await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The fd holder of pod mode (config/fd-holder.yaml) talks to nothing but its socket:
/// its ServiceAccount mounts no token, and may do nothing on the API server.
#[tokio::test]
async fn the_fd_holder_may_do_nothing() {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    apply_config(&["namespace.yaml", "rbac-node.yaml", "rbac-controller.yaml"]);
    let holder = "system:serviceaccount:tessera-system:tessera-fd-holder";
    let mut allowed = vec![];
    for (verb, resource) in [
        ("get", "pods"),
        ("list", "pods"),
        ("create", "pods"),
        ("get", "secrets"),
        ("list", "mountpods.tessera.io"),
        ("get", "volumes.tessera.io"),
        ("list", "nodes"),
        ("create", "events"),
    ] {
        if can_i(holder, verb, resource) {
            allowed.push(format!("{verb} {resource}"));
        }
    }
    assert!(allowed.is_empty(), "the fd holder may: {allowed:?}");
    let yaml = std::fs::read_to_string(support::repo_root().join("config/fd-holder.yaml")).unwrap();
    assert_eq!(
        yaml.matches("automountServiceAccountToken: false").count(),
        2,
        "neither the ServiceAccount nor the Pods mount a token"
    );
    assert!(
        !yaml.contains("privileged"),
        "the fd holder needs no privileges"
    );
}

/// The HTTP status of a request's outcome (200 for a success).
pub(super) fn code(res: Result<(), kube::Error>) -> u16 {
    match res {
        Ok(()) => 200,
        Err(kube::Error::Api(s)) => {
            println!("  {}", s.message);
            s.code
        }
        Err(e) => panic!("{e}"),
    }
}

/// The liveness Lease (docs/failover.md): the agent of node A creates, reads and
/// renews `tessera-node-A` in its namespace, and nothing else of Leases: not node B's,
/// not the fenced mark, no delete, list or watch, nothing in another namespace.
#[tokio::test]
async fn the_node_agent_renews_only_its_own_nodes_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    let client = support::client().await;
    apply_config(&["namespace.yaml", "rbac-node.yaml", "mountpod-policy.yaml"]);
    let id = support::unique_name("rbac-lease");
    let (a, b) = (format!("{id}-a"), format!("{id}-b"));
    let agent_a = impersonating(NODE_SA, Some(&a)).await;
    let no_node = impersonating(NODE_SA, None).await;
    let lease = |node: &str| -> Lease {
        serde_json::from_value(json!({
            "metadata": {"name": tessera_api::liveness_lease(node)},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 20, "leaseTransitions": 0},
        }))
        .unwrap()
    };
    let code = |r: Result<Lease, kube::Error>| match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => {
            println!("  {}", s.message);
            s.code
        }
        Err(e) => panic!("{e}"),
    };
    let mine: Api<Lease> = Api::namespaced(agent_a.clone(), "tessera-system");
    let pp = PostParams::default();
    // The policy takes a moment to be in force: wait until a dry-run create of node
    // B's Lease is refused by it (by the policy's name: an "already exists" or any
    // other refusal does not say it is in force, and CI once took one for it).
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(
        Duration::from_secs(30),
        "the admission policy in force",
        || async {
            match mine.create(&dry, &lease(&b)).await {
                Err(kube::Error::Api(s)) if s.message.contains("tessera-node-own-lease") => {
                    Some(())
                }
                _ => None,
            }
        },
    )
    .await;
    let mut wrong = vec![];
    let mut check = |what: &str, got: u16, allowed: bool| {
        let ok = (200..300).contains(&got);
        println!("agent of node A: {what}: HTTP {got}");
        if ok != allowed {
            wrong.push(format!("{what}: HTTP {got}"));
        }
    };
    check(
        "create its own Lease",
        code(mine.create(&pp, &lease(&a)).await),
        true,
    );
    let name_a = tessera_api::liveness_lease(&a);
    let mut got = mine.get(&name_a).await.unwrap();
    got.spec.as_mut().unwrap().lease_duration_seconds = Some(21);
    let renewed = mine.replace(&name_a, &pp, &got).await;
    let mut marked = renewed.as_ref().cloned().unwrap_or(got);
    check("renew its own Lease", code(renewed), true);
    marked.metadata.annotations = Some(tessera_node::liveness::fenced_mark());
    check(
        "mark its own Lease fenced",
        code(mine.replace(&name_a, &pp, &marked).await),
        false,
    );
    check(
        "create node B's Lease",
        code(mine.create(&pp, &lease(&b)).await),
        false,
    );
    let other_ns: Api<Lease> = Api::namespaced(agent_a.clone(), "default");
    check(
        "create its Lease in another namespace",
        code(other_ns.create(&pp, &lease(&a)).await),
        false,
    );
    let unnamed: Api<Lease> = Api::namespaced(no_node, "tessera-system");
    let mut again = mine.get(&name_a).await.unwrap();
    again.spec.as_mut().unwrap().lease_duration_seconds = Some(22);
    check(
        "renew with no node in its token",
        code(unnamed.replace(&name_a, &pp, &again).await),
        false,
    );
    let deleted = mine
        .delete(&name_a, &Default::default())
        .await
        .map(|_| lease(&a));
    check("delete its own Lease", code(deleted), false);
    for verb in ["list", "watch", "delete"] {
        if can_i(NODE_SA, verb, "leases.coordination.k8s.io") {
            wrong.push(format!("{verb} leases: yes"));
        }
    }
    let _ = Api::<Lease>::namespaced(client, "tessera-system")
        .delete(&name_a, &Default::default())
        .await;
    assert!(wrong.is_empty(), "{wrong:#?}");
}
