//! `kubectl tessera` against the real control plane: the built `kubectl-tessera` binary
//! run on objects the test creates, with a `tessera controller` scoped to the test and
//! a stand-in agent reporting MountPods Ready. Checks that `tickets` and `status` name
//! the tickets, their reasons and their owners (field managers), that `status` follows
//! a PVC through its PV and a Pod through its volumes (and the MountPod and tickets on
//! its node), that `-n` defaults to the kubeconfig context's namespace, that `pods`
//! lists the Pods with Tessera volumes (`-A`: in every namespace), that `mounts`
//! lists MountPods by node, and that `doctor` finds a node without an agent or a CSINode
//! registration and a waiting ticket, and stops reporting what was fixed.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVA;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use tessera_api::VolumeAttachment;

use crate::support;
use support::env::Env;
use support::fixtures::{self, ControllerProcess, FakeAgent, TEST_LABEL};

const WAIT: Duration = Duration::from_secs(30);

/// Run `kubectl-tessera` with `args` against the cluster under test.
fn plugin(args: &[&str]) -> Output {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .arg("--kubeconfig")
        .arg(support::kubeconfig_path())
        .arg("--width=0")
        .args(args)
        .output()
        .expect("running kubectl-tessera");
    assert!(
        out.status.code().is_some_and(|c| c < 2),
        "kubectl-tessera {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

/// [`plugin`]'s `-o json` output, parsed.
fn plugin_json(args: &[&str]) -> Value {
    serde_json::from_slice(&plugin(args).stdout).expect("JSON output")
}

/// Run `kubectl-tessera --kubeconfig KUBECONFIG ARGS` as a user types it, whatever it
/// answers.
fn plugin_as(kubeconfig: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("running kubectl-tessera")
}

/// A copy of the kubeconfig under test, in `dir`, whose contexts say `namespace`.
fn kubeconfig_in(dir: &Path, namespace: &str) -> PathBuf {
    let text = std::fs::read_to_string(support::kubeconfig_path()).unwrap();
    let mut kc: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    for c in kc["contexts"].as_sequence_mut().unwrap() {
        c["context"]["namespace"] = namespace.into();
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_norway::to_string(&kc).unwrap()).unwrap();
    path
}

/// What a claim of `vol` is made of besides the Volume: a PV (`<id>-pv`), a PVC bound
/// to it (`default/<id>`) and a storage.k8s.io VolumeAttachment of it to `node`
/// (`<id>-sva`), as the external-provisioner and the attach/detach controller make them.
struct Claim {
    pv: String,
    pvc: String,
    sva: String,
}

impl Claim {
    async fn create(e: &Env, vol: &str, node: &str) -> Claim {
        let (pv, pvc, sva) = (
            format!("{}-pv", e.id),
            e.id.clone(),
            format!("{}-sva", e.id),
        );
        let body = json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv, "labels": {TEST_LABEL: e.id}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "csi": {"driver": "csi.tessera.io", "volumeHandle": vol}},
        });
        let body: PersistentVolume = serde_json::from_value(body).unwrap();
        let pvs = Api::<PersistentVolume>::all(e.client.clone());
        pvs.create(&PostParams::default(), &body).await.unwrap();
        let body = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": pvc, "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                     "resources": {"requests": {"storage": "1Gi"}}},
        });
        let body: PersistentVolumeClaim = serde_json::from_value(body).unwrap();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.client.clone(), "default");
        pvcs.create(&PostParams::default(), &body).await.unwrap();
        let body = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": sva},
            "spec": {"attacher": "csi.tessera.io", "nodeName": node, "source": {"persistentVolumeName": pv}},
        });
        let body: StorageVA = serde_json::from_value(body).unwrap();
        let svas: Api<StorageVA> = Api::all(e.client.clone());
        svas.create(&PostParams::default(), &body).await.unwrap();
        Claim { pv, pvc, sva }
    }

    async fn delete(self, e: &Env) {
        let dp = DeleteParams::default();
        let _ = Api::<StorageVA>::all(e.client.clone())
            .delete(&self.sva, &dp)
            .await;
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.client.clone(), "default");
        let _ = pvcs.delete(&self.pvc, &dp).await;
        let _ = Api::<PersistentVolume>::all(e.client.clone())
            .delete(&self.pv, &dp)
            .await;
    }
}

/// A Pod `name` in `default` on `node` (no kubelet runs it) with three volumes: a
/// configMap (`cfg`), the claim `claim` (`data`) and an inline CSI volume (`scratch`).
async fn pod_of_claim(e: &Env, name: &str, node: &str, claim: &str) -> Api<Pod> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {TEST_LABEL: e.id}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}],
                 "volumes": [
                     {"name": "cfg", "configMap": {"name": "x"}},
                     {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                     {"name": "scratch", "csi": {"driver": "csi.tessera.io"}}]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(e.client.clone(), "default");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods
}

/// Add ticket `id` with a server-side apply by field manager `manager` (as a GitOps tool).
async fn apply_ticket(e: &Env, volume: &str, id: &str, node: &str, manager: &str) {
    let body = json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
        "metadata": {"name": volume},
        "spec": {"volume": volume, "attachmentTickets": {id: {"id": id, "type": "manual", "nodeID": node}}},
    });
    Api::<VolumeAttachment>::all(e.client.clone())
        .patch(volume, &PatchParams::apply(manager), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|err| panic!("applying ticket {id}: {err}"));
}

/// Delete the test's Volume, keeping its data (no agent here could remove it), wait
/// until it is gone (the controller still runs), then delete the nodes.
async fn cleanup(e: &Env, vol: String) {
    let retain = json!({"metadata": {"annotations": {tessera_api::ANNOTATION_RECLAIM: "Retain"}}});
    Api::<tessera_api::Volume>::all(e.client.clone())
        .patch(&vol, &PatchParams::default(), &Patch::Merge(&retain))
        .await
        .unwrap();
    e.cleanup_waiting(&[vol]).await;
}

/// A line of `text` that contains every one of `words`.
fn line_with<'a>(text: &'a str, words: &[&str]) -> &'a str {
    text.lines()
        .find(|l| words.iter().all(|w| l.contains(w)))
        .unwrap_or_else(|| panic!("no line with {words:?} in:\n{text}"))
}

#[tokio::test]
async fn tickets_and_status_name_reasons_and_owners() {
    let e = Env::new("kplug", 2, WAIT).await;
    let (n0, n1) = (e.nodes[0].clone(), e.nodes[1].clone());
    let _ctrl = ControllerProcess::alone(&e.id, &[]);
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;

    apply_ticket(&e, &vol, "gitops-a", &n0, "argocd-test").await;
    fixtures::wait_satisfied(&e.client, &vol, "gitops-a").await;
    apply_ticket(&e, &vol, "person-b", &n1, "kubectl-person").await;
    e.blocked(&vol, "person-b", "HeldByOtherNode").await;

    // tickets: one row each, with owner, reason and wait.
    let out = stdout(&plugin(&["tickets", &vol]));
    let a = line_with(
        &out,
        &["gitops-a", "manual", &n0, "true", "Attached", "argocd-test"],
    );
    let b = line_with(
        &out,
        &[
            "person-b",
            "manual",
            &n1,
            "false",
            "HeldByOtherNode",
            "kubectl-person",
        ],
    );
    assert!(
        !a.contains("kubectl-person") && !b.contains("argocd-test"),
        "{out}"
    );
    assert!(b.contains("gitops-a"), "the message names the holder: {b}");
    let waiting = b.split_whitespace().nth(6).unwrap();
    assert!(
        waiting.ends_with('s') || waiting.ends_with('m'),
        "WAITING is an age: {b}"
    );

    let rows = plugin_json(&["tickets", &format!("volume/{vol}"), "-o", "json"]);
    let owners: Vec<(String, Value, Value)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["owners"].clone(),
                r["reason"].clone(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        vec![
            ("gitops-a".into(), json!(["argocd-test"]), json!("Attached")),
            (
                "person-b".into(),
                json!(["kubectl-person"]),
                json!("HeldByOtherNode")
            ),
        ]
    );

    // A PV and a bound PVC for the Volume, and a storage.k8s.io VolumeAttachment of it.
    let claim = Claim::create(&e, &vol, &n0).await;
    let (pv_name, sva_name) = (claim.pv.clone(), claim.sva.clone());

    // status from the claim: the whole chain on one screen.
    let out = stdout(&plugin(&[
        "status",
        &format!("pvc/{}", e.id),
        "-n",
        "default",
    ]));
    println!("{out}"); // the screen, with --nocapture
    line_with(&out, &["PVC", &format!("default/{}", e.id), &pv_name]);
    line_with(&out, &["PV", &pv_name, "csi.tessera.io", &vol]);
    line_with(&out, &["Volume", &vol, "ReadWriteOnce"]);
    line_with(&out, &[&sva_name, &format!("node {n0}")]);
    line_with(&out, &["gitops-a", "Attached", "argocd-test"]);
    line_with(&out, &["person-b", "HeldByOtherNode", "kubectl-person"]);
    line_with(
        &out,
        &[
            &tessera_api::mountpod_name(&vol, &n0),
            &format!("node {n0}"),
            "Ready",
            "pid 4242",
        ],
    );
    // No agent Pod and no CSINode in this cluster: said for both nodes, with hints.
    line_with(
        &out,
        &[&n0, "no tessera-node Pod", "CSINode not registered"],
    );
    line_with(
        &out,
        &[&n1, "no tessera-node Pod", "CSINode not registered"],
    );
    line_with(&out, &["ticket person-b on", &n1, "waits: HeldByOtherNode"]);
    line_with(
        &out,
        &[
            "Daemon logs: each mount's Pod, `kubectl -n",
            &tessera_api::mountpod_name(&vol, &n0),
            &format!("process mode: on the node, <state-dir>/logs/{vol}.log"),
        ],
    );

    // The same through the PV and as JSON.
    let out = stdout(&plugin(&["status", &format!("pv/{pv_name}")]));
    line_with(&out, &["PVC", &format!("default/{}", e.id)]);
    let report = plugin_json(&["status", &vol, "-o", "json"]);
    assert_eq!(report["volumeName"], json!(vol));
    assert_eq!(report["pv"]["name"], json!(pv_name));
    assert_eq!(report["mounts"][0]["pid"], json!(4242));
    assert_eq!(report["mounts"][0]["node"], json!(n0));
    let agents: Vec<(Value, Value)> = report["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["node"].clone(), a["csiRegistered"].clone()))
        .collect();
    assert_eq!(
        agents,
        vec![(json!(n0), json!(false)), (json!(n1), json!(false))]
    );

    // A Volume that does not exist: said, not an error.
    let out = stdout(&plugin(&["status", &format!("volume/{}-missing", e.id)]));
    line_with(&out, &["does not exist"]);
    let kubeconfig = support::kubeconfig_path();
    let bad = plugin_as(&kubeconfig, &["tickets", &format!("{}-missing", e.id)]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not found"),
        "{bad:?}"
    );
    // --context picks a context of the kubeconfig: an unknown one is refused.
    let bad = plugin_as(&kubeconfig, &["--context=no-such-context", "tickets", &vol]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("no-such-context"),
        "{bad:?}"
    );

    // Without -n, the context's namespace, as kubectl: a kubeconfig whose context says
    // kube-system looks for the claim there.
    let dir = tempfile::tempdir().unwrap();
    let in_kube_system = kubeconfig_in(dir.path(), "kube-system");
    let elsewhere = plugin_as(&in_kube_system, &["status", &format!("pvc/{}", e.id)]);
    assert_eq!(elsewhere.status.code(), Some(2), "{elsewhere:?}");
    assert!(
        String::from_utf8_lossy(&elsewhere.stderr)
            .contains(&format!("PVC kube-system/{} not found", e.id)),
        "{elsewhere:?}"
    );
    let claim_in_default = ["-n", "default", "status", &format!("pvc/{}", e.id)];
    let here = plugin_as(&in_kube_system, &claim_in_default);
    assert_eq!(here.status.code(), Some(0), "{here:?}");

    // status pod/NAME: each of the Pod's volumes that may be Tessera's, under a line
    // naming it (the claim's chain; an inline volume's Volume, missing here); a
    // configMap is not one.
    let pod_name = format!("{}-pod", e.id);
    let pods = pod_of_claim(&e, &pod_name, &n0, &claim.pvc).await;
    let out = stdout(&plugin(&["status", &format!("pod/{pod_name}")]));
    println!("{out}");
    line_with(&out, &[&format!("Pod default/{pod_name}, volume data")]);
    line_with(&out, &["PVC", &format!("default/{}", e.id), &pv_name]);
    line_with(&out, &[&format!("Pod default/{pod_name}, volume scratch")]);
    assert!(!out.contains("volume cfg"), "{out}");
    // What serves the claim on the Pod's node: the MountPod there (the stand-in agent
    // binds nothing), and the tickets for that node only.
    let mp0 = tessera_api::mountpod_name(&vol, &n0);
    line_with(
        &out,
        &[
            &format!("on node {n0}: MountPod {mp0}"),
            "Ready",
            "no reference for this Pod",
        ],
    );
    let tickets_line = line_with(&out, &[&format!("tickets for {n0}:")]);
    assert!(tickets_line.contains("gitops-a"), "{tickets_line}");
    assert!(
        !tickets_line.contains("person-b"),
        "{n1}'s ticket: {tickets_line}"
    );
    let found = plugin_json(&["status", &format!("pod/{pod_name}"), "-o", "json"]);
    assert_eq!(found[0]["volume"], json!("data"));
    assert_eq!(found[0]["report"]["volumeName"], json!(vol));
    assert_eq!(found[1]["start"]["kind"], json!("volume"));
    assert_eq!(found[0]["node"], json!(n0));

    // pods: the context's namespace (default here), a line per Tessera volume.
    let out = stdout(&plugin(&["pods"]));
    println!("{out}");
    assert!(
        out.starts_with("POD "),
        "no namespace column without -A: {out}"
    );
    line_with(
        &out,
        &[&pod_name, &n0, "data", &e.id, &vol, &mp0, "Ready", "no"],
    );
    line_with(&out, &[&pod_name, &n0, "scratch", "no MountPod on"]);
    assert!(!out.contains(" cfg "), "{out}");
    let out = stdout(&plugin(&["pods", "-A"]));
    assert!(out.starts_with("NAMESPACE "), "{out}");
    line_with(&out, &["default", &pod_name, "data", &vol]);
    let out = stdout(&plugin(&["pods", "--node", &n1]));
    assert!(!out.contains(&pod_name), "only node {n1}'s Pods: {out}");
    let rows = plugin_json(&["pods", "-o", "json"]);
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .any(|r| r["pod"] == json!(pod_name)
                && r["tesseraVolume"] == json!(vol)
                && r["mountPod"] == json!(mp0)),
        "{rows}"
    );
    // In kube-system (the other kubeconfig's context): not there; with -A it is.
    let there = |args: &[&str]| {
        let out = plugin_as(&in_kube_system, args);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(!there(&["pods"]).contains(&pod_name));
    assert!(there(&["pods", "-A"]).contains(&pod_name));
    // -A where one object is named: refused.
    let bad = plugin_as(&kubeconfig, &["-A", "status", &format!("pod/{pod_name}")]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    // No kubelet runs the Pod: gone at once, not left Terminating for the next run.
    let _ = pods
        .delete(&pod_name, &DeleteParams::default().grace_period(0))
        .await;

    // mounts: a line per MountPod, by node.
    let out = stdout(&plugin(&["mounts"]));
    println!("{out}");
    line_with(&out, &[&n0, &vol, "Serve", "Ready"]);
    let out = stdout(&plugin(&["mounts", "--node", &n1]));
    assert!(!out.contains(&vol), "only node {n1}'s: {out}");
    let rows = plugin_json(&["mounts", "-o", "json"]);
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .any(|r| r["volume"] == json!(vol) && r["node"] == json!(n0)),
        "{rows}"
    );

    claim.delete(&e).await;
    cleanup(&e, vol).await;
}

#[tokio::test]
async fn doctor_finds_missing_agents_and_waiting_tickets() {
    let e = Env::new("kdoc", 2, WAIT).await;
    let (n0, n1) = (e.nodes[0].clone(), e.nodes[1].clone());
    let nodes: Api<Node> = Api::all(e.client.clone());
    for n in &e.nodes {
        let patch = json!({"metadata": {"labels": {TEST_LABEL: e.id}}});
        nodes
            .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let lease = format!("{}-lease", e.id);
    let _ctrl = ControllerProcess::start(
        &e.id,
        &[&format!("--lease-name={lease}"), "--namespace=default"],
    );
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;
    e.attach(&vol, "manual-a", "manual", &n0).await;
    fixtures::put_ticket(&e.client, &vol, "manual-b", "manual", &n1, json!({})).await;
    e.blocked(&vol, "manual-b", "HeldByOtherNode").await;

    let selector = format!("{TEST_LABEL}={}", e.id);
    let doctor = |threshold: &str, extra: &[&str]| {
        let mut args = vec![
            "doctor".to_string(),
            "--tessera-namespace=default".into(),
            format!("--lease={lease}"),
            format!("--selector={selector}"),
            format!("--node-selector={selector}"),
            format!("--waiting-threshold={threshold}"),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        plugin(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let out = doctor("0s", &[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "problems: exit 1\n{text}");
    line_with(&text, &["✓ [leader]", &lease, "held by"]);
    line_with(
        &text,
        &["✓ [crds] CRD volumeattachments.tessera.io serves v1alpha1"],
    );
    for n in [&n0, &n1] {
        line_with(
            &text,
            &["✗ [agents]", &format!("node {n} has no Tessera agent")],
        );
        line_with(
            &text,
            &[
                "✗ [agents]",
                &format!("node {n}: its CSINode does not list csi.tessera.io"),
            ],
        );
    }
    line_with(
        &text,
        &[
            "✗ [tickets]",
            &format!("ticket manual-b of {vol} (node {n1}) waits for"),
            "HeldByOtherNode",
        ],
    );
    assert!(
        !text.contains(&format!("ticket manual-a of {vol}")),
        "a satisfied ticket does not wait:\n{text}"
    );
    assert!(text.contains("→ "), "each problem says what to do:\n{text}");

    // Below the threshold the ticket is no problem.
    let text = stdout(&doctor("1h", &[]));
    assert!(!text.contains("[tickets]"), "{text}");

    // Node 0 gets its registration and a Ready agent Pod: only node 1 is left.
    fixtures::create_csinodes(&e.client, &e.id, std::slice::from_ref(&n0)).await;
    let pods: Api<Pod> = Api::namespaced(e.client.clone(), "default");
    let pod_name = format!("{}-agent", e.id);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "labels": {"app.kubernetes.io/name": "tessera", "app.kubernetes.io/component": "node"}},
        "spec": {"nodeName": n0, "containers": [{"name": "tessera", "image": "tessera:0.1.0"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .unwrap();
    let out = doctor("1h", &[]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "node 1 still lacks an agent\n{text}"
    );
    assert!(
        !text.contains(&format!("node {n0} has no Tessera agent"))
            && !text.contains(&format!("node {n0}: its CSINode")),
        "{text}"
    );
    line_with(&text, &[&format!("node {n1} has no Tessera agent")]);
    // An agent without an fd holder beside it: a daemon's crash there would show.
    line_with(
        &text,
        &["✗ [fd-holder]", &format!("node {n0} has no fd holder")],
    );
    line_with(&text, &["1 of 2 nodes have a Ready agent"]);
    line_with(&text, &["every Tessera Pod runs 0.1.0"]);

    let json_out: Value = serde_json::from_slice(&doctor("1h", &["-o", "json"]).stdout).unwrap();
    assert!(
        json_out["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["severity"] == "Problem" && f["check"] == "agents")
    );

    let _ = pods
        .delete(
            &pod_name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
    fixtures::delete_csinodes(&e.client, std::slice::from_ref(&n0)).await;
    cleanup(&e, vol).await;
}
