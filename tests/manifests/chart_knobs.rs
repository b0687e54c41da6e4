//! The chart's knobs that users of other storage charts set (issue: a release a
//! platform team can take): the node DaemonSet's updateStrategy, the mount image, the
//! fd holder's resources, a ServiceMonitor with its scrape settings and relabelings,
//! and objects of the user's own. Each reaches its object, is off (renders nothing
//! new) by default, is refused by the schema when misspelt, and passes a server-side
//! dry run with the rest of the chart (the ServiceMonitor aside: no Prometheus
//! Operator CRDs in the harness).

use serde_json::Value;

use crate::chart::{helm_template, helm_template_with, objects};

/// What the knobs' tests set, besides the monitoring objects (a values file: the
/// extra object's namespace is a template, which `--set` cannot carry).
const KNOBS: &str = r#"
node:
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 50%}}
  mountImage: mirror.example/tessera:1.2.3
fdHolder:
  resources: {requests: {cpu: 7m}, limits: {memory: 32Mi}}
extraObjects:
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: extra, namespace: "{{ .Release.Namespace }}"}
    data: {k: v}
"#;

/// [`KNOBS`] as a values file (in a directory removed when the first is dropped).
fn knobs_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("knobs.yaml");
    std::fs::write(&values, KNOBS).unwrap();
    (dir, values)
}

/// `helm template` with the [`KNOBS`] values file and `set`.
fn with_knobs(namespace: &str, set: &[&str]) -> String {
    let (_dir, values) = knobs_file();
    helm_template_with(namespace, &[&values], set)
}

fn get(
    objs: &std::collections::BTreeMap<(String, String, String), Value>,
    kind: &str,
    ns: &str,
    name: &str,
) -> Value {
    objs.get(&(kind.into(), ns.into(), name.into()))
        .unwrap_or_else(|| panic!("no {kind} {ns}/{name}: {:?}", objs.keys()))
        .clone()
}

#[test]
fn the_knobs_reach_their_objects() {
    let set = [
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.serviceMonitor.interval=15s",
        "monitoring.serviceMonitor.scrapeTimeout=10s",
        "monitoring.serviceMonitor.labels.release=kps",
        "monitoring.serviceMonitor.relabelings[0].action=keep",
        "monitoring.serviceMonitor.relabelings[0].sourceLabels[0]=__meta_kubernetes_pod_node_name",
        "monitoring.serviceMonitor.metricRelabelings[0].action=drop",
        "monitoring.serviceMonitor.metricRelabelings[0].regex=go_.*",
        "monitoring.podMonitor.enabled=true",
        "monitoring.podMonitor.scrapeTimeout=5s",
    ];
    let objs = objects(&with_knobs("knobs", &set));
    let node = get(&objs, "DaemonSet", "knobs", "tessera-node");
    assert_eq!(
        node.pointer("/spec/updateStrategy/rollingUpdate/maxUnavailable"),
        Some(&Value::from("50%"))
    );
    let args = node
        .pointer("/spec/template/spec/containers/0/args")
        .unwrap();
    assert!(
        args.as_array()
            .unwrap()
            .contains(&Value::from("--mount-image=mirror.example/tessera:1.2.3")),
        "{args}"
    );
    let holder = get(&objs, "DaemonSet", "knobs", "tessera-fd-holder");
    let res = holder
        .pointer("/spec/template/spec/containers/0/resources")
        .unwrap();
    assert_eq!(res["requests"]["cpu"], "7m");
    assert_eq!(res["limits"]["memory"], "32Mi");
    let extra = get(&objs, "ConfigMap", "knobs", "extra");
    assert_eq!(extra["data"]["k"], "v", "templated namespace: {extra}");

    let sm = get(&objs, "ServiceMonitor", "knobs", "tessera");
    assert_eq!(sm["metadata"]["labels"]["release"], "kps");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["interval"], "15s");
    assert_eq!(ep["scrapeTimeout"], "10s");
    assert_eq!(ep["relabelings"][0]["action"], "keep");
    assert_eq!(ep["metricRelabelings"][0]["regex"], "go_.*");
    // It selects the metrics Service, which it brings along.
    let svc = get(&objs, "Service", "knobs", "tessera-controller-metrics");
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&svc["metadata"]["labels"][k], v, "the Service carries {k}");
    }
    let pm = get(&objs, "PodMonitor", "knobs", "tessera");
    for ep in pm["spec"]["podMetricsEndpoints"].as_array().unwrap() {
        assert_eq!(ep["scrapeTimeout"], "5s");
        assert!(ep.get("relabelings").is_none(), "unset: not rendered");
    }
}

/// With the defaults, none of the knobs adds or changes anything: the fd holder keeps
/// its requests, the DaemonSet Kubernetes' strategy, the agent its own image.
#[test]
fn the_knobs_change_nothing_by_default() {
    let objs = objects(&helm_template("knobs", &[]));
    let node = get(&objs, "DaemonSet", "knobs", "tessera-node");
    assert!(node.pointer("/spec/updateStrategy").is_none());
    let args = node
        .pointer("/spec/template/spec/containers/0/args")
        .unwrap();
    assert!(!args.to_string().contains("--mount-image"), "{args}");
    let holder = get(&objs, "DaemonSet", "knobs", "tessera-fd-holder");
    assert_eq!(
        holder.pointer("/spec/template/spec/containers/0/resources"),
        Some(&serde_json::json!({"requests": {"cpu": "5m", "memory": "16Mi"}}))
    );
    assert!(!objs.keys().any(|(kind, _, _)| kind == "ServiceMonitor"));
    assert!(!objs.keys().any(|(_, _, name)| name == "extra"));
}

#[test]
fn the_schema_refuses_misspelt_knobs() {
    for (set, says) in [
        (
            "node.updateStrategy.type=Rolling",
            "/node/updateStrategy/type",
        ),
        (
            "node.updateStrategy.maxUnavailable=1",
            "additional properties 'maxUnavailable' not allowed",
        ),
        (
            "monitoring.serviceMonitor.enable=true",
            "additional properties 'enable' not allowed",
        ),
        ("extraObjects[0].metadata.name=x", "/extraObjects/0"),
    ] {
        let stderr = crate::chart::refused(&[set]);
        assert!(stderr.contains(says), "{set}: {stderr}");
    }
}

/// The knobs pass the API server's validation with the rest of the chart.
#[test]
fn the_knobs_pass_a_server_side_dry_run() {
    let namespace = "tessera-knobs";
    let ns = crate::support::kubectl_output(&[
        "create",
        "namespace",
        namespace,
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    crate::chart::apply(&ns, &[]);
    let rendered = with_knobs(namespace, &[]);
    let applied = crate::chart::apply(&rendered, &["--dry-run=server"]);
    let lines = applied
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    assert_eq!(
        lines,
        objects(&rendered).len(),
        "every object through the dry run:\n{applied}"
    );
    assert!(applied.contains("configmap/extra"), "{applied}");
}

/// `helm lint --strict` with every knob set.
#[test]
fn helm_lint_passes_with_the_knobs() {
    let (_dir, values) = knobs_file();
    let mut cmd = std::process::Command::new(crate::chart::harness_bin("helm"));
    cmd.args(["lint", "--strict", &crate::chart::chart_dir(), "-f"])
        .arg(&values)
        .args(["--set", "monitoring.serviceMonitor.enabled=true"]);
    let out = crate::chart::output(cmd);
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
}
