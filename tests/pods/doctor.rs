//! `kubectl tessera doctor` on the real nodes with Tessera deployed: the install is
//! healthy, then one thing at a time is broken — a policy binding deleted, the fd
//! holder taken off every node, a Volume on a root the nodes do not allow, a CSI
//! sidecar crash-looping — and the doctor names exactly that (exit 1), then nothing
//! once it is restored (exit 0).

use super::*;

const NS: &str = "tessera-system";

/// `kubectl tessera doctor` against the cluster under test: (exit code, stdout).
fn doctor() -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .arg("--kubeconfig")
        .arg(support::kubeconfig_path())
        .args(["--width=0", "doctor", "--waiting-threshold=1h"])
        .output()
        .expect("running kubectl-tessera");
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code < 2,
        "doctor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The doctor's problem lines (`✗ …`).
fn problems(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with('✗')).collect()
}

/// Waits until the doctor finds exactly problems each containing one of `want` (in
/// any order), and returns its report.
async fn finds(want: &[&str]) -> String {
    eventually(WAIT, &format!("doctor finds {want:?}"), || async {
        let (code, text) = doctor();
        let found = problems(&text);
        let all_wanted =
            found.len() == want.len() && want.iter().all(|w| found.iter().any(|l| l.contains(w)));
        (code == 1 && all_wanted).then_some(text.clone())
    })
    .await
}

/// Waits until the doctor finds no problem.
async fn healthy(after: &str) {
    eventually(WAIT, &format!("no problem after {after}"), || async {
        let (code, text) = doctor();
        (code == 0 && problems(&text).is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn doctor_names_each_thing_broken_and_nothing_once_restored() {
    let client = support::client().await;
    let nodes = Nodes::load().names();
    healthy("the deploy").await;
    let (_, text) = doctor();
    for ok in [
        "✓ [fd-holder]",
        "✓ [admission] 4 of 4 admission policies are bound and name system:serviceaccount:tessera-system:tessera-node",
        "✓ [sidecars]",
    ] {
        assert!(text.contains(ok), "{ok:?} in:\n{text}");
    }

    // 1. A policy binding deleted: the policy is not enforced.
    let binding = "tessera-node-own-mountpods";
    let mut saved: serde_json::Value = serde_json::from_str(&kubectl_output(&[
        "get",
        "validatingadmissionpolicybinding",
        binding,
        "-o",
        "json",
    ]))
    .unwrap();
    let meta = saved["metadata"].as_object_mut().unwrap();
    for k in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        meta.remove(k);
    }
    kubectl_output(&["delete", "validatingadmissionpolicybinding", binding]);
    finds(&["[admission] ValidatingAdmissionPolicy tessera-node-own-mountpods has no binding"])
        .await;
    kubectl_stdin(&["create", "-f", "-"], &saved.to_string());
    healthy("the binding restored").await;

    // 2. The fd holder taken off every node.
    kubectl_output(&[
        "-n",
        NS,
        "patch",
        "daemonset/tessera-fd-holder",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"nodeSelector":{"tessera.io/doctor-test":"nowhere"}}}}}"#,
    ]);
    let wanted: Vec<String> = nodes
        .iter()
        .map(|n| format!("[fd-holder] node {n} has no fd holder"))
        .collect();
    finds(&wanted.iter().map(String::as_str).collect::<Vec<_>>()).await;
    kubectl_output(&[
        "-n",
        NS,
        "patch",
        "daemonset/tessera-fd-holder",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/template/spec/nodeSelector/tessera.io~1doctor-test"}]"#,
    ]);
    kubectl_output(&[
        "-n",
        NS,
        "rollout",
        "status",
        "daemonset/tessera-fd-holder",
        "--timeout=120s",
    ]);
    healthy("the fd holder back").await;

    // 3. A Volume on a root no node allows: Faulted.
    let volumes: Api<Volume> = Api::all(client.clone());
    let v: Volume = serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
        "metadata": {"name": "doctor-faulted"},
        "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce",
                 "backend": {"root": "/var/lib/tessera-doctor-not-allowed"}},
    }))
    .unwrap();
    volumes.create(&PostParams::default(), &v).await.unwrap();
    finds(&["[volumes] Volume doctor-faulted is Faulted: BackendRootNotAllowed"]).await;
    volumes
        .delete("doctor-faulted", &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, "the Faulted Volume gone", || async {
        volumes
            .get_opt("doctor-faulted")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    healthy("the Faulted Volume deleted").await;

    // 4. A sidecar crash-looping: the new controller Pod's attacher refuses its flags
    // (the old Pods stay: the rollout waits for the new one to be Ready).
    kubectl_output(&[
        "-n",
        NS,
        "patch",
        "deployment/tessera-controller",
        "--type=json",
        "-p",
        &json!([{"op": "add",
                 "path": "/spec/template/spec/containers/2/args/-",
                 "value": "--no-such-flag"}])
        .to_string(),
    ]);
    let attacher: String = kubectl_output(&[
        "-n",
        NS,
        "get",
        "deployment/tessera-controller",
        "-o",
        "jsonpath={.spec.template.spec.containers[2].name}",
    ]);
    assert_eq!(attacher, "csi-attacher", "the patch broke the attacher");
    let text = finds(&["[sidecars] container csi-attacher"]).await;
    assert!(problems(&text)[0].contains("is not ready"), "{text}");
    kubectl_output(&["-n", NS, "rollout", "undo", "deployment/tessera-controller"]);
    kubectl_output(&[
        "-n",
        NS,
        "rollout",
        "status",
        "deployment/tessera-controller",
        "--timeout=180s",
    ]);
    healthy("the controller rolled back").await;
}
