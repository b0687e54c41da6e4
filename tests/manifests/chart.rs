//! The Helm chart, `charts/tessera`, against `config/`: the two installs must not drift.
//!
//! `helm template` and `kubectl kustomize` render the objects; after taking away what
//! only says who rendered them (`helm.sh/chart`, `app.kubernetes.io/managed-by`, the
//! CRDs' `helm.sh/resource-policy`), the chart with its defaults must give exactly
//! `config/` but its Namespace (Helm installs into the release namespace), and with
//! the optional parts on, `config/` + `config/storageclass/` + `config/monitoring/`:
//! same kinds, names, namespaces and contents. Then the six labels, the values that
//! reach the objects, the values schema, `helm lint`, and a server-side dry run of the
//! rendered chart against the cluster under test. helm is the harness build
//! (`target/harness/bin/helm`, `tests/harness/helm/`); the install on real nodes is
//! `tests/harness/helm.sh`, run by `tests/run.sh`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::support;

/// The six labels every object and Pod template carries.
const LABELS: [&str; 6] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
];

/// Chart values that turn on what `config/` keeps in optional kustomizations.
pub(crate) const OPTIONAL_ON: &[&str] = &[
    "storageClass.enabled=true",
    "monitoring.service.enabled=true",
    "monitoring.podMonitor.enabled=true",
    "monitoring.dashboard.enabled=true",
    "monitoring.prometheusRule.enabled=true",
];

/// A binary of the harness build; the tests need it (`make harness` builds it).
pub(crate) fn harness_bin(name: &str) -> PathBuf {
    let path = support::repo_root().join("target/harness/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: build the harness (`make harness`)",
        path.display()
    );
    path
}

/// Run `cmd`, check that it succeeds, return its stdout.
pub(crate) fn output(mut cmd: Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

pub(crate) fn chart_dir() -> String {
    support::repo_root()
        .join("charts/tessera")
        .to_string_lossy()
        .into_owned()
}

/// `helm template tessera charts/tessera -n NAMESPACE --set ...`.
pub(crate) fn helm_template(namespace: &str, set: &[&str]) -> String {
    helm_template_with(namespace, &[], set)
}

/// [`helm_template`] with values files as well.
pub(crate) fn helm_template_with(
    namespace: &str,
    files: &[&std::path::Path],
    set: &[&str],
) -> String {
    let mut cmd = Command::new(harness_bin("helm"));
    cmd.args([
        "template",
        "tessera",
        &chart_dir(),
        "--namespace",
        namespace,
    ]);
    for f in files {
        cmd.arg("-f").arg(f);
    }
    for s in set {
        cmd.args(["--set", s]);
    }
    output(cmd)
}

/// `kubectl kustomize DIR` for each directory below the repository root.
pub(crate) fn kustomize(dirs: &[&str]) -> String {
    dirs.iter()
        .map(|dir| {
            let mut cmd = Command::new(harness_bin("kubectl"));
            cmd.arg("kustomize").arg(support::repo_root().join(dir));
            output(cmd)
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// `helm template` with `set`, which the chart must refuse: what helm says.
pub(crate) fn refused(set: &[&str]) -> String {
    let mut cmd = Command::new(harness_bin("helm"));
    cmd.args(["template", "tessera", &chart_dir()]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{set:?} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The objects of a YAML stream, by (kind, namespace, name).
pub(crate) fn objects(yaml: &str) -> BTreeMap<(String, String, String), Value> {
    let mut out = BTreeMap::new();
    for obj in support::parse_documents::<Value>(yaml) {
        let field = |p: &str| {
            obj.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let key = (
            field("/kind"),
            field("/metadata/namespace"),
            field("/metadata/name"),
        );
        assert!(
            out.insert(key.clone(), obj).is_none(),
            "{key:?} rendered twice"
        );
    }
    out
}

/// What is left of an object once what says who rendered it is taken away, in a form
/// where equal means equal: numbers as f64 (`0.0` and `0`), lists of named items
/// (containers, volumes, env, mounts, ports) sorted by name.
pub(crate) fn normalized(mut value: Value) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for key in ["labels", "annotations"] {
                    if let Some(Value::Object(m)) = map.get_mut(key) {
                        m.remove("helm.sh/chart");
                        m.remove("app.kubernetes.io/managed-by");
                        m.remove("helm.sh/resource-policy");
                        if m.is_empty() {
                            map.remove(key);
                        }
                    }
                }
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => {
                items.iter_mut().for_each(strip);
                if items
                    .iter()
                    .all(|i| i.get("name").is_some_and(Value::is_string))
                {
                    items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
                }
            }
            Value::Number(n) => *value = serde_json::json!(n.as_f64().expect("a number")),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

/// The first place two values differ, as a JSON pointer with both sides.
pub(crate) fn first_difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                first_difference(
                    &format!("{path}/{k}"),
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(&format!("{path}/{i}"), p, q)),
        _ if a == b => None,
        _ => Some(format!("{path}: {a} != {b}")),
    }
}

/// The chart, with its defaults and with the optional parts on, gives the objects of
/// the corresponding kustomizations, field for field.
#[test]
fn chart_renders_the_objects_of_config() {
    let cases: [(&str, &[&str], &[&str]); 2] = [
        ("defaults", &[], &["config"]),
        (
            "optional parts on",
            OPTIONAL_ON,
            &["config", "config/storageclass", "config/monitoring"],
        ),
    ];
    for (case, set, dirs) in cases {
        let chart = objects(&helm_template("tessera-system", set));
        let mut config = objects(&kustomize(dirs));
        // The one object only config/ has: the chart installs into the release
        // namespace, which `helm install --create-namespace` (or the operator) makes.
        let namespace = ("Namespace".into(), String::new(), "tessera-system".into());
        assert!(
            config.remove(&namespace).is_some(),
            "config/ makes its namespace"
        );
        let chart_keys: Vec<_> = chart.keys().collect();
        let config_keys: Vec<_> = config.keys().collect();
        assert_eq!(
            chart_keys, config_keys,
            "{case}: the chart and {dirs:?} render different objects"
        );
        for (key, from_config) in config {
            let a = normalized(chart[&key].clone());
            let b = normalized(from_config);
            if let Some(diff) = first_difference("", &a, &b) {
                panic!("{case}: {key:?} differs (chart != {dirs:?}) at {diff}");
            }
        }
    }
}

/// Every object and every Pod template carries the six app.kubernetes.io labels, in
/// both renderings, and says which tool manages it.
#[test]
fn every_object_carries_the_six_labels() {
    let renderings = [
        ("Helm", helm_template("tessera-system", OPTIONAL_ON)),
        (
            "kustomize",
            kustomize(&["config", "config/storageclass", "config/monitoring"]),
        ),
    ];
    for (manager, yaml) in renderings {
        let objects = objects(&yaml);
        assert!(objects.len() > 20, "{manager}: {} objects", objects.len());
        for (key, obj) in objects {
            for pointer in ["/metadata/labels", "/spec/template/metadata/labels"] {
                let Some(labels) = obj.pointer(pointer) else {
                    assert!(
                        pointer.contains("template"),
                        "{manager}: {key:?} has no labels"
                    );
                    continue;
                };
                for label in LABELS {
                    assert!(
                        labels.get(label).is_some_and(Value::is_string),
                        "{manager}: {key:?} {pointer} lacks {label}: {labels}"
                    );
                }
                assert_eq!(
                    labels["app.kubernetes.io/managed-by"], manager,
                    "{key:?} {pointer}"
                );
                assert_eq!(
                    labels["app.kubernetes.io/version"],
                    env!("CARGO_PKG_VERSION"),
                    "{key:?}"
                );
            }
        }
    }
}

/// The values an operator sets reach the objects: images, namespace, log flags,
/// extra environment, the kubelet directory, backend roots, the CRDs' switches.
#[test]
fn chart_values_reach_the_objects() {
    let objs = objects(&helm_template(
        "storage",
        &[
            "image.repository=registry.example/tessera",
            "image.tag=9.9.9",
            "image.pullPolicy=Always",
            "sidecars.attacher.image.repository=registry.example/csi-attacher",
            "sidecars.snapshotter.image.repository=registry.example/csi-snapshotter",
            "logLevel=debug",
            "logFormat=json",
            "extraEnv[0].name=KUBERNETES_SERVICE_HOST",
            "extraEnv[0].value=10.0.0.1",
            "node.kubeletDir=/var/lib/k0s/kubelet",
            "backendRoots={/srv/a,/srv/b}",
            "crds.keep=false",
            "controller.podDisruptionBudget.enabled=false",
            "controller.maxConcurrentReconciles=32",
        ],
    ));
    let get = |kind: &str, ns: &str, name: &str| {
        objs.get(&(kind.into(), ns.into(), name.into()))
            .unwrap_or_else(|| panic!("no {kind} {ns}/{name}: {:?}", objs.keys()))
            .clone()
    };
    let deployment = get("Deployment", "storage", "tessera-controller");
    let daemonset = get("DaemonSet", "storage", "tessera-node");
    let container = |obj: &Value, name: &str| {
        obj["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name}"))
            .clone()
    };
    for obj in [&deployment, &daemonset] {
        let tessera = container(obj, "tessera");
        assert_eq!(tessera["image"], "registry.example/tessera:9.9.9");
        assert_eq!(tessera["imagePullPolicy"], "Always");
        let args = tessera["args"].as_array().unwrap();
        assert!(args.contains(&"--log-level=debug".into()), "{args:?}");
        assert!(args.contains(&"--log-format=json".into()), "{args:?}");
        let env = tessera["env"].as_array().unwrap();
        assert!(
            env.iter()
                .any(|e| e["name"] == "KUBERNETES_SERVICE_HOST" && e["value"] == "10.0.0.1"),
            "{env:?}"
        );
    }
    // The controller's flag, on the controller only.
    let flag = Value::from("--max-concurrent-reconciles=32");
    let has_flag = |obj: &Value| {
        container(obj, "tessera")["args"]
            .as_array()
            .is_some_and(|args| args.contains(&flag))
    };
    assert!(has_flag(&deployment), "{deployment}");
    assert!(!has_flag(&daemonset), "{daemonset}");
    let attacher = container(&deployment, "csi-attacher");
    assert_eq!(attacher["image"], "registry.example/csi-attacher:v4.12.0");
    assert!(attacher.get("imagePullPolicy").is_none(), "{attacher}");
    assert!(
        attacher["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "KUBERNETES_SERVICE_HOST"),
        "the sidecars talk to the API server too"
    );
    let snapshotter = container(&deployment, "csi-snapshotter");
    assert_eq!(
        snapshotter["image"],
        "registry.example/csi-snapshotter:v8.7.0"
    );
    assert!(
        snapshotter["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "KUBERNETES_SERVICE_HOST"),
        "{snapshotter}"
    );
    let registrar = container(&daemonset, "node-driver-registrar");
    assert!(registrar.get("env").is_none(), "{registrar}");
    assert!(
        registrar["args"].as_array().unwrap().contains(
            &"--kubelet-registration-path=/var/lib/k0s/kubelet/plugins/csi.tessera.io/csi.sock"
                .into()
        ),
        "{registrar}"
    );
    let volumes = daemonset["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(
        volumes.contains("/var/lib/k0s/kubelet/plugins_registry"),
        "{volumes}"
    );
    assert!(!volumes.contains("/var/lib/kubelet"), "{volumes}");
    assert_eq!(
        get("ConfigMap", "storage", "tessera-backend-roots")["data"]["backend-roots"],
        "/srv/a\n/srv/b\n"
    );
    let policy = get(
        "ValidatingAdmissionPolicy",
        "",
        "tessera-node-own-mountpods",
    );
    assert!(
        policy
            .to_string()
            .contains("system:serviceaccount:storage:tessera-node"),
        "the policy names the node agent in the release namespace"
    );
    for name in ["tessera-node-inline-volumes", "tessera-node-inline-tickets"] {
        assert!(
            get("ValidatingAdmissionPolicy", "", name)
                .to_string()
                .contains("system:serviceaccount:storage:tessera-node"),
            "{name} names the node agent in the release namespace"
        );
    }
    let binding = get("ClusterRoleBinding", "", "tessera-node");
    assert_eq!(binding["subjects"][0]["namespace"], "storage");
    let crd = get("CustomResourceDefinition", "", "volumes.tessera.io");
    assert!(
        crd["metadata"].get("annotations").is_none(),
        "{}",
        crd["metadata"]
    );
    assert!(
        !objs
            .keys()
            .any(|(kind, _, _)| kind == "PodDisruptionBudget")
    );

    let without_crds = objects(&helm_template("storage", &["crds.install=false"]));
    assert!(
        !without_crds
            .keys()
            .any(|(kind, _, _)| kind == "CustomResourceDefinition"),
        "crds.install=false still renders CRDs"
    );
    let kept = objects(&helm_template("storage", &[]));
    let crd = &kept[&(
        "CustomResourceDefinition".into(),
        String::new(),
        "volumes.tessera.io".into(),
    )];
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
}

/// values.schema.json refuses what would otherwise be silently ignored or render a
/// broken object: a misspelt key, a log format the binary does not know, a relative
/// backend root.
/// The monitoring objects' labels come from their values; the dashboard's ConfigMap
/// holds the dashboard and the PrometheusRule the rules file's groups (the Helm
/// templates read them as files, so `{{ $labels }}` in the rules reaches Prometheus).
#[test]
fn monitoring_values_reach_the_objects() {
    let objs = objects(&helm_template(
        "mon",
        &[
            "monitoring.dashboard.enabled=true",
            "monitoring.dashboard.labels.grafana_dashboard=tessera",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.prometheusRule.labels.release=kps",
        ],
    ));
    let get = |kind: &str, name: &str| {
        objs.get(&(kind.into(), "mon".into(), name.into()))
            .unwrap_or_else(|| panic!("no {kind} {name}: {:?}", objs.keys()))
            .clone()
    };
    let cm = get("ConfigMap", "tessera-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "tessera");
    let dashboard: Value =
        serde_json::from_str(cm["data"]["tessera-dashboard.json"].as_str().unwrap()).unwrap();
    assert_eq!(dashboard["uid"], "tessera");
    let rule = get("PrometheusRule", "tessera");
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    let summary = rule
        .pointer("/spec/groups/0/rules/0/annotations/summary")
        .unwrap();
    assert!(
        summary.as_str().unwrap().contains("{{ $labels.volume }}"),
        "{summary}"
    );
}

#[test]
fn values_schema_refuses_bad_values() {
    for (set, says) in [
        (
            "storageClass.enable=true",
            "additional properties 'enable' not allowed",
        ),
        ("logFormat=xml", "/logFormat"),
        ("backendRoots={srv/data}", "/backendRoots/0"),
        (
            "controller.maxConcurrentReconciles=0",
            "/controller/maxConcurrentReconciles",
        ),
        (
            "monitoring.dashboard.enable=true",
            "additional properties 'enable' not allowed",
        ),
        (
            "monitoring.prometheusRule.labels.release=null",
            "/monitoring/prometheusRule/labels/release",
        ),
    ] {
        let stderr = refused(&[set]);
        assert!(stderr.contains(says), "{set}: {stderr}");
    }
}

/// `argocd.healthChecks=true` renders the Argo CD health checks of the three kinds,
/// each the script of config/argocd/health.lua (the chart's copy must not drift).
#[test]
fn chart_renders_the_argocd_health_checks() {
    let script = support::health::argocd_script();
    let objs = objects(&helm_template("storage", &["argocd.healthChecks=true"]));
    let cm = &objs[&(
        "ConfigMap".to_string(),
        "storage".to_string(),
        "tessera-argocd-health".to_string(),
    )];
    let data = cm["data"].as_object().expect("data");
    let keys: Vec<&str> = data.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "resource.customizations.health.tessera.io_MountPod",
            "resource.customizations.health.tessera.io_Volume",
            "resource.customizations.health.tessera.io_VolumeAttachment",
        ]
    );
    for (key, value) in data {
        assert!(
            value.as_str() == Some(script.as_str()),
            "{key} differs from config/argocd/health.lua"
        );
    }
    let off = objects(&helm_template("storage", &[]));
    assert!(
        !off.keys()
            .any(|(_, _, name)| name == "tessera-argocd-health"),
        "off by default"
    );
}

/// `helm lint --strict`, with the defaults and with every optional part on.
#[test]
fn helm_lint_passes() {
    for set in [&[][..], OPTIONAL_ON] {
        let mut cmd = Command::new(harness_bin("helm"));
        cmd.args(["lint", "--strict", &chart_dir()]);
        for s in set {
            cmd.args(["--set", s]);
        }
        let out = output(cmd);
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{out}"
        );
    }
}

/// The rendered chart passes the API server's validation and admission as a
/// server-side dry run (kubectl apply --dry-run=server), with the StorageClass and the
/// metrics Service and the dashboard's ConfigMap on. The PodMonitor and the
/// PrometheusRule are left out: the harness has no Prometheus Operator CRDs. (`config/` gets the same check in tests/manifests/api_server.rs.)
#[test]
fn chart_passes_server_side_dry_run() {
    let namespace = "tessera-system";
    // Namespaced objects need their namespace for a dry run: create it for real.
    let ns = support::kubectl_output(&[
        "create",
        "namespace",
        namespace,
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    apply(&ns, &[]);
    let rendered = helm_template(
        namespace,
        &[
            "storageClass.enabled=true",
            "monitoring.service.enabled=true",
            "monitoring.dashboard.enabled=true",
        ],
    );
    let applied = apply(&rendered, &["--dry-run=server"]);
    let kinds = objects(&rendered).len();
    let lines = applied
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    assert_eq!(lines, kinds, "every object through the dry run:\n{applied}");
}

/// `kubectl apply -f - ARGS` with `yaml` on stdin (server-side apply, forced: other
/// tests apply the same objects): what kubectl prints.
pub(crate) fn apply(yaml: &str, args: &[&str]) -> String {
    let mut all = vec![
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=tessera-tests",
        "-f",
        "-",
    ];
    all.extend_from_slice(args);
    support::kubectl_stdin(&all, yaml)
}

/// Every CSI sidecar of the controller serves its metrics (`--http-endpoint`, operation
/// latencies) on a port named after it, checks its leader election there, and the
/// PodMonitor scrapes that port. (The chart renders the same: see
/// `chart_renders_the_objects_of_config`.)
#[test]
fn every_csi_sidecar_is_scraped() {
    let objects = objects(&kustomize(&["config", "config/monitoring"]));
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|((k, _, n), _)| k == kind && n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{kind} {name} in config/"))
    };
    let deployment = find("Deployment", "tessera-controller");
    let monitor = find("PodMonitor", "tessera");
    let scraped: Vec<&str> = monitor["spec"]["podMetricsEndpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["port"].as_str())
        .collect();
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let sidecars: Vec<_> = containers
        .iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with("csi-"))
        .collect();
    assert_eq!(
        sidecars.len(),
        4,
        "provisioner, attacher, resizer, snapshotter"
    );
    for c in sidecars {
        let name = c["name"].as_str().unwrap();
        let endpoint = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str()?.strip_prefix("--http-endpoint=:"))
            .next()
            .unwrap_or_else(|| panic!("{name} has no --http-endpoint"));
        let port: i64 = endpoint.parse().unwrap();
        assert!(
            c["ports"].as_array().is_some_and(|ps| ps
                .iter()
                .any(|p| p["name"] == name && p["containerPort"] == port)),
            "{name}: a port named {name} for :{port}"
        );
        assert_eq!(
            c["livenessProbe"]["httpGet"]["port"], name,
            "{name}: liveness on its endpoint"
        );
        assert!(
            scraped.contains(&name),
            "the PodMonitor scrapes {name}: {scraped:?}"
        );
    }
}

/// The node DaemonSet's registrar serves its /healthz (`--http-endpoint`) as its
/// liveness probe, on a port of its own; no two containers of any Pod of config/ or of
/// the chart (which renders config/) use one port, nor do two hostNetwork Pods. The
/// registrar has no /metrics: the PodMonitor must not scrape it (a target always down).
#[test]
fn registrar_healthz_and_no_port_collides() {
    let objects = objects(&kustomize(&["config", "config/monitoring"]));
    let ds = objects
        .iter()
        .find(|((k, _, n), _)| k == "DaemonSet" && n == "tessera-node")
        .map(|(_, v)| v.clone())
        .expect("the node DaemonSet");
    let reg = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "node-driver-registrar")
        .expect("the registrar")
        .clone();
    let endpoint = reg["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--http-endpoint=:"))
        .expect("the registrar has --http-endpoint");
    let port: i64 = endpoint.parse().unwrap();
    let named = reg["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["containerPort"] == port)
        .expect("a port for the endpoint");
    assert_eq!(reg["livenessProbe"]["httpGet"]["port"], named["name"]);
    assert_eq!(reg["livenessProbe"]["httpGet"]["path"], "/healthz");
    let monitor = objects
        .iter()
        .find(|((k, _, _), _)| k == "PodMonitor")
        .map(|(_, v)| v.clone())
        .unwrap();
    assert!(
        !monitor["spec"]["podMetricsEndpoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["port"] == named["name"]),
        "the registrar serves no /metrics"
    );

    let chart = helm_template("tessera-system", &[]);
    let config = objects;
    for (source, yaml) in [("config/", config), ("the chart", self::objects(&chart))] {
        let mut host_ports: BTreeMap<i64, String> = BTreeMap::new();
        for ((kind, _, name), obj) in &yaml {
            let Some(spec) = obj.pointer("/spec/template/spec") else {
                continue;
            };
            let host = spec["hostNetwork"].as_bool().unwrap_or(false);
            let mut seen: BTreeMap<i64, String> = BTreeMap::new();
            let mut names: BTreeMap<String, String> = BTreeMap::new();
            for c in spec["containers"].as_array().into_iter().flatten() {
                let cname = c["name"].as_str().unwrap().to_string();
                for p in c["ports"].as_array().into_iter().flatten() {
                    let n = p["containerPort"].as_i64().unwrap();
                    if let Some(other) = seen.insert(n, cname.clone()) {
                        panic!("{source}: {kind} {name}: {cname} and {other} both use port {n}");
                    }
                    if let Some(pn) = p["name"].as_str()
                        && let Some(other) = names.insert(pn.to_string(), cname.clone())
                    {
                        panic!(
                            "{source}: {kind} {name}: {cname} and {other} both name a port {pn}"
                        );
                    }
                    if host && let Some(other) = host_ports.insert(n, format!("{kind} {name}")) {
                        panic!("{source}: hostNetwork {kind} {name} and {other} both use port {n}");
                    }
                }
            }
        }
    }
}

/// A pull Secret named once reaches every workload: the chart's `imagePullSecrets` and
/// config/'s component `image-pull-secret` put it on the controller, the node agent and
/// the fd holder (the mount Pods take the agent's: crates/tessera-node/src/lib.rs), nothing else, and
/// render the same objects.
#[test]
fn pull_secrets_reach_every_workload() {
    let chart = objects(&helm_template(
        "tessera-system",
        &["imagePullSecrets[0].name=tessera-registry"],
    ));
    let kustomized = objects(&kustomize(&["tests/manifests/pull-secret-overlay"]));
    let secret = serde_json::json!([{"name": "tessera-registry"}]);
    let want = [
        ("DaemonSet", "tessera-fd-holder"),
        ("DaemonSet", "tessera-node"),
        ("Deployment", "tessera-controller"),
    ];
    for (what, objs) in [("chart", &chart), ("config/ + component", &kustomized)] {
        let with: Vec<(&str, &str)> = objs
            .iter()
            .filter_map(|((kind, _, name), obj)| {
                let secrets = obj.pointer("/spec/template/spec/imagePullSecrets")?;
                assert_eq!(secrets, &secret, "{what}: {kind} {name}");
                Some((kind.as_str(), name.as_str()))
            })
            .collect();
        assert_eq!(with, want, "{what}");
    }
    for (kind, name) in want {
        let key = |objs: &BTreeMap<_, Value>| {
            objs.iter()
                .find(|((k, _, n), _)| k == kind && n == name)
                .map(|(_, o)| normalized(o.clone()))
        };
        let (a, b) = (key(&chart).unwrap(), key(&kustomized).unwrap());
        assert!(
            a == b,
            "{kind} {name}: {}",
            first_difference("", &a, &b).unwrap_or_default()
        );
    }
}
