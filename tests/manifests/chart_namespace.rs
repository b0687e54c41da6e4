//! The chart in a namespace of the user's choosing: every namespaced object, every
//! ServiceAccount subject and the admission policies' agent identity follow the release
//! namespace, and nothing else changes; and the Pod Security check
//! (`templates/pod-security.yaml`) refuses, with the fix, a namespace that does not
//! enforce `privileged`, against the API server under test (`helm template
//! --dry-run=server`, which looks the namespace up). The install on real nodes into a
//! non-default namespace is `tests/harness/helm.sh test`.

use std::process::{Command, Output};

use serde_json::Value;

use crate::chart::{OPTIONAL_ON, chart_dir, harness_bin, helm_template, objects};
use crate::support;

/// The kinds the chart renders that have no namespace.
const CLUSTER_SCOPED: [&str; 7] = [
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "StorageClass",
    "CSIDriver",
];

/// Every value that adds objects, so that every template is rendered.
fn everything_on() -> Vec<&'static str> {
    let mut set = OPTIONAL_ON.to_vec();
    set.extend(["argocd.healthChecks=true", "imagePullSecrets[0].name=pull"]);
    set
}

/// The `system:serviceaccount:NS:` namespaces named in a text.
fn service_account_namespaces(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .match_indices("system:serviceaccount:")
        .map(|(at, p)| {
            let rest = &text[at + p.len()..];
            rest[..rest.find(':').unwrap_or(rest.len())].to_string()
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn another_namespace_changes_every_namespaced_object_and_the_policies() {
    let set = everything_on();
    let default = helm_template("tessera-system", &set);
    let alt = helm_template("tessera-alt", &set);
    assert!(
        !alt.contains("tessera-system"),
        "rendered into tessera-alt, the chart still says tessera-system:\n{}",
        alt.lines()
            .filter(|l| l.contains("tessera-system"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let objs = objects(&alt);
    assert!(objs.len() > 25, "{} objects", objs.len());
    let mut namespaced = 0;
    for ((kind, ns, name), obj) in &objs {
        if CLUSTER_SCOPED.contains(&kind.as_str()) {
            assert_eq!(ns, "", "{kind} {name} is cluster-scoped");
        } else {
            assert_eq!(ns, "tessera-alt", "{kind} {name}");
            namespaced += 1;
        }
        // Every ServiceAccount a binding names is the release's.
        for subject in obj["subjects"].as_array().into_iter().flatten() {
            if subject["kind"] == "ServiceAccount" {
                assert_eq!(subject["namespace"], "tessera-alt", "{kind} {name}");
            }
        }
    }
    assert!(namespaced >= 10, "{namespaced} namespaced objects");
    // The policies name the agent (the controller's, its own) of the release
    // namespace, and no other.
    let policies: Vec<&Value> = objs
        .iter()
        .filter(|((kind, _, _), _)| kind == "ValidatingAdmissionPolicy")
        .map(|(_, obj)| obj)
        .collect();
    assert_eq!(policies.len(), 5, "the five policies");
    for policy in policies {
        let conditions = policy["spec"]["matchConditions"].to_string();
        let component = match policy["metadata"]["name"].as_str() {
            Some("tessera-controller-node-writes") => "tessera-controller",
            _ => "tessera-node",
        };
        assert!(
            conditions.contains(&format!("'system:serviceaccount:tessera-alt:{component}'")),
            "{}: {conditions}",
            policy["metadata"]["name"]
        );
        assert_eq!(
            service_account_namespaces(&policy.to_string()),
            ["tessera-alt"],
            "{}",
            policy["metadata"]["name"]
        );
    }
    // The namespace is all that changes.
    let back = objects(&alt.replace("tessera-alt", "tessera-system"));
    let default = objects(&default);
    assert_eq!(
        back.keys().collect::<Vec<_>>(),
        default.keys().collect::<Vec<_>>()
    );
    for (key, obj) in default {
        assert!(back[&key] == obj, "{key:?} differs beyond its namespace");
    }
}

/// `helm template --dry-run=server -n NAMESPACE SET...` against the cluster under
/// test, Helm's own files kept under target/.
fn template_on_server(namespace: &str, set: &[&str]) -> Output {
    let home = support::repo_root().join("target/tmp/helm-manifests");
    let mut cmd = Command::new(harness_bin("helm"));
    for (var, dir) in [
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ] {
        cmd.env(var, home.join(dir));
    }
    cmd.arg("--kubeconfig")
        .arg(support::kubeconfig_path())
        .args(["template", "tessera", &chart_dir(), "--dry-run=server"])
        // (other tests apply the same cluster-wide objects; a dry run adopts nothing)
        .arg("--take-ownership")
        .args(["--namespace", namespace]);
    for s in set {
        cmd.args(["--set", s]);
    }
    cmd.output().expect("running helm")
}

/// The render fails with `want` in its message and exactly this fix.
fn refused(namespace: &str, want: &str, fix: &str) {
    let out = template_on_server(namespace, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{namespace}: rendered ({want})");
    assert!(err.contains(want), "{namespace}: {err}");
    assert!(err.contains(&format!("Fix: `{fix}`")), "{namespace}: {err}");
    assert!(
        err.contains("podSecurity.requirePrivilegedNamespace=false"),
        "{err}"
    );
}

fn renders(namespace: &str, set: &[&str]) {
    let out = template_on_server(namespace, set);
    assert!(
        out.status.success(),
        "{namespace} {set:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objs = objects(&String::from_utf8(out.stdout).unwrap());
    assert!(objs.len() > 20, "{namespace}: {} objects", objs.len());
}

#[test]
fn install_needs_a_namespace_enforcing_privileged() {
    let ns = support::unique_name("psa");
    let label = "pod-security.kubernetes.io/enforce";
    let label_fix = format!("kubectl label namespace {ns} {label}=privileged");
    // No namespace yet (`helm install --create-namespace` would make it unlabelled).
    refused(
        &ns,
        &format!("namespace {ns} does not exist"),
        &format!("kubectl create namespace {ns} && {label_fix}"),
    );
    renders(&ns, &["podSecurity.requirePrivilegedNamespace=false"]);
    support::kubectl_output(&["create", "namespace", &ns]);
    refused(
        &ns,
        &format!("namespace {ns} has no {label} label"),
        &label_fix,
    );
    support::kubectl_output(&["label", "namespace", &ns, &format!("{label}=baseline")]);
    refused(
        &ns,
        &format!("namespace {ns} enforces Pod Security level \"baseline\""),
        &format!("{label_fix} --overwrite"),
    );
    // What the check stands for: this API server refuses a privileged Pod there.
    let pod = support::kubectl()
        .args(["-n", &ns, "run", "probe", "--image=probe", "--privileged"])
        .args(["--dry-run=server"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&pod.stderr);
    assert!(
        !pod.status.success() && err.contains("violates PodSecurity"),
        "a privileged Pod in a baseline namespace: {err}"
    );
    support::kubectl_output(&[
        "label",
        "namespace",
        &ns,
        &format!("{label}=privileged"),
        "--overwrite",
    ]);
    renders(&ns, &[]);
    support::kubectl_output(&["delete", "namespace", &ns, "--wait=false"]);
}
