//! Pod metadata and scheduling of every workload (issue 31): the chart's `podLabels`,
//! `podAnnotations`, `priorityClassName`, `nodeSelector`, `tolerations` and `affinity`
//! of the controller, the node agent and the fd holder reach their Pod templates and
//! leave the selectors alone; a label the chart sets is refused; `mountPods` becomes
//! the node agent's `--mount-pod-*` flags, which the agent parses into the mount Pods
//! it builds (accepted by the API server); and the kustomize overlay that
//! docs/operations.md describes (`pod-metadata-overlay/`) renders the same Pods.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::{Value, json};

use crate::chart::{
    chart_dir, first_difference, harness_bin, helm_template, kustomize, normalized, objects,
    output, refused,
};
use crate::support;

const OVERLAY: &str = "tests/manifests/pod-metadata-overlay";

/// `helm template` with the overlay's values.yaml and `set`.
fn template_with_values(set: &[&str]) -> BTreeMap<(String, String, String), Value> {
    let mut cmd = Command::new(harness_bin("helm"));
    cmd.args(["template", "tessera", &chart_dir(), "-n", "tessera-system"])
        .arg("-f")
        .arg(support::repo_root().join(OVERLAY).join("values.yaml"));
    for s in set {
        cmd.args(["--set", s]);
    }
    objects(&output(cmd))
}

/// The three workloads, as (kind, name, component).
const WORKLOADS: [(&str, &str, &str); 3] = [
    ("Deployment", "tessera-controller", "controller"),
    ("DaemonSet", "tessera-node", "node"),
    ("DaemonSet", "tessera-fd-holder", "fd-holder"),
];

fn workload(objs: &BTreeMap<(String, String, String), Value>, kind: &str, name: &str) -> Value {
    objs.get(&(kind.into(), "tessera-system".into(), name.into()))
        .unwrap_or_else(|| panic!("no {kind} {name}"))
        .clone()
}

fn node_args(objs: &BTreeMap<(String, String, String), Value>) -> Vec<String> {
    let ds = workload(objs, "DaemonSet", "tessera-node");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["name"], "tessera", "the agent is the first container");
    serde_json::from_value(c["args"].clone()).unwrap()
}

#[test]
fn pod_metadata_and_scheduling_reach_every_workload() {
    let objs = template_with_values(&[]);
    let defaults = objects(&helm_template("tessera-system", &[]));
    let node_affinity = |key: &str, operator: &str, values: Option<&[&str]>| {
        let mut expr = json!({"key": key, "operator": operator});
        if let Some(v) = values {
            expr["values"] = json!(v);
        }
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}}})
    };
    let storage_nodes = (
        json!("tessera-node"),
        json!({"example.com/storage": "true"}),
        json!([{"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule"}]),
        node_affinity("example.com/no-storage", "DoesNotExist", None),
    );
    for (kind, name, component) in WORKLOADS {
        let obj = workload(&objs, kind, name);
        let meta = &obj["spec"]["template"]["metadata"];
        let spec = &obj["spec"]["template"]["spec"];
        assert_eq!(meta["labels"]["team"], "storage", "{name}: {meta}");
        assert_eq!(meta["labels"]["app.kubernetes.io/name"], "tessera");
        assert_eq!(meta["labels"]["app.kubernetes.io/component"], component);
        assert_eq!(meta["labels"]["app.kubernetes.io/instance"], "tessera");
        assert_eq!(
            meta["annotations"],
            json!({"example.com/owner": "storage-team"}),
            "{name}"
        );
        // The selector is the chart's, whatever the values: selectors are immutable.
        assert_eq!(
            obj["spec"]["selector"],
            json!({"matchLabels": {"app.kubernetes.io/name": "tessera", "app.kubernetes.io/component": component}}),
            "{name}"
        );
        assert_eq!(
            obj["spec"]["selector"],
            workload(&defaults, kind, name)["spec"]["selector"]
        );
        let want = match component {
            "controller" => (
                json!("tessera-control"),
                json!({"node-role.kubernetes.io/control-plane": ""}),
                json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]),
                node_affinity("kubernetes.io/os", "In", Some(&["linux"])),
            ),
            // The fd holder: null scheduling values, so the node agent's.
            _ => storage_nodes.clone(),
        };
        let got = (
            spec["priorityClassName"].clone(),
            spec["nodeSelector"].clone(),
            spec["tolerations"].clone(),
            spec["affinity"].clone(),
        );
        assert_eq!(got, want, "{name}");
    }
    assert_eq!(
        workload(&objs, "Deployment", "tessera-controller")["spec"]["template"]["metadata"]["labels"]
            ["example.com/tier"],
        "system"
    );
    // mountPods: flags of the agent, in the order the chart renders them.
    let args = node_args(&objs);
    let flags: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| a.starts_with("--mount-pod-"))
        .collect();
    assert_eq!(
        flags,
        [
            "--mount-pod-label=team=storage",
            "--mount-pod-annotation=example.com/note=a=b, c",
            "--mount-pod-annotation=example.com/owner=storage-team",
            r#"--mount-pod-tolerations=[{"effect":"NoSchedule","key":"dedicated","operator":"Equal","value":"storage"}]"#,
            "--mount-pod-priority-class-name=tessera-mounts",
        ]
    );
    assert!(
        !node_args(&defaults)
            .iter()
            .any(|a| a.starts_with("--mount-pod-")),
        "the defaults are the agent's: no flag"
    );
    // "" and []: none, said explicitly to the agent.
    let none =
        template_with_values(&["mountPods.priorityClassName=", "mountPods.tolerations=null"]);
    let args = node_args(&none);
    assert!(args.contains(&"--mount-pod-priority-class-name=".to_string()));
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--mount-pod-tolerations"))
    );
}

/// `helm lint --strict` with the overlay's values.
#[test]
fn helm_lint_passes_with_pod_metadata() {
    let mut cmd = Command::new(harness_bin("helm"));
    cmd.args(["lint", "--strict", &chart_dir(), "-f"])
        .arg(support::repo_root().join(OVERLAY).join("values.yaml"));
    let out = output(cmd);
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
}

/// fdHolder's scheduling values, where set, are its own; the rest stay the agent's.
#[test]
fn the_fd_holder_follows_the_node_agent_unless_told_otherwise() {
    let objs = template_with_values(&[
        "fdHolder.priorityClassName=",
        "fdHolder.nodeSelector.example\\.com/holder=yes",
        "fdHolder.tolerations[0].operator=Exists",
    ]);
    let spec = &workload(&objs, "DaemonSet", "tessera-fd-holder")["spec"]["template"]["spec"];
    assert!(
        spec.get("priorityClassName").is_none(),
        "\"\": none: {spec}"
    );
    assert_eq!(spec["nodeSelector"], json!({"example.com/holder": "yes"}));
    assert_eq!(spec["tolerations"], json!([{"operator": "Exists"}]));
    let agent = &workload(&objs, "DaemonSet", "tessera-node")["spec"]["template"]["spec"];
    assert_eq!(spec["affinity"], agent["affinity"], "not set: the agent's");
    assert_eq!(agent["priorityClassName"], "tessera-node");
}

/// The overlay docs/operations.md describes gives the chart's Pods, field for field.
#[test]
fn the_kustomize_overlay_renders_the_same_pods() {
    let chart = template_with_values(&[]);
    let kustomized = objects(&kustomize(&[OVERLAY]));
    for (kind, name, _) in WORKLOADS {
        let a = normalized(workload(&chart, kind, name));
        let b = normalized(workload(&kustomized, kind, name));
        if let Some(diff) = first_difference("", &a, &b) {
            panic!("{kind} {name}: chart != overlay at {diff}");
        }
    }
}

/// A label the chart sets itself is refused, with the reason, rather than rendered
/// twice or over the selector's; so are mount Pod keys that are Tessera's.
#[test]
fn labels_the_chart_sets_are_refused() {
    for (set, says) in [
        (
            "controller.podLabels.app\\.kubernetes\\.io/name=mine",
            "controller.podLabels: \"app.kubernetes.io/name\" is a label the chart sets on the controller Pods itself",
        ),
        (
            "node.podLabels.app\\.kubernetes\\.io/component=agent",
            "node.podLabels: \"app.kubernetes.io/component\" is a label the chart sets on the node Pods",
        ),
        (
            "fdHolder.podLabels.app\\.kubernetes\\.io/instance=x",
            "fdHolder.podLabels: \"app.kubernetes.io/instance\"",
        ),
        (
            "mountPods.labels.app\\.kubernetes\\.io/component=x",
            "mountPods.labels: \"app.kubernetes.io/component\" is Tessera's own label of mount Pods",
        ),
        (
            "mountPods.labels.tessera\\.io/volume=x",
            "mountPods.labels: \"tessera.io/volume\"",
        ),
        (
            "mountPods.annotations.tessera\\.io/mountpod=x",
            "annotations under tessera.io/ are Tessera's own",
        ),
    ] {
        let stderr = refused(&[set]);
        assert!(stderr.contains(says), "{set}: {stderr}");
    }
    // Other keys of those prefixes are the user's.
    let objs = objects(&helm_template(
        "tessera-system",
        &["node.podLabels.app\\.kubernetes\\.io/owner=team-a"],
    ));
    let ds = workload(&objs, "DaemonSet", "tessera-node");
    assert_eq!(
        ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/owner"],
        "team-a"
    );
}

/// values.schema.json refuses what the API server (or the agent) would.
#[test]
fn the_schema_refuses_malformed_pod_metadata() {
    for (set, says) in [
        ("controller.podLabels.team=1", "/controller/podLabels/team"),
        ("node.podLabels.team=two words", "/node/podLabels/team"),
        ("node.podAnnotations.a b=c", "invalid propertyName 'a b'"),
        (
            "node.tolerations[0].operator=Lt",
            "/node/tolerations/0/operator",
        ),
        ("node.affinity.nodeAfinity.x=y", "'nodeAfinity' not allowed"),
        (
            "controller.priorityClassName=Critical",
            "/controller/priorityClassName",
        ),
        ("fdHolder.nodeSelector.a=1", "/fdHolder/nodeSelector"),
        ("fdHolder.nodeName=n1", "'nodeName' not allowed"),
        ("mountPods.nodeSelector.a=b", "'nodeSelector' not allowed"),
        (
            "mountPods.priorityClassName=Bad_Name",
            "/mountPods/priorityClassName",
        ),
        (
            "mountPods.tolerations[0].effect=NoRun",
            "/mountPods/tolerations",
        ),
        ("mountPods.labels.team=-x", "/mountPods/labels/team"),
    ] {
        let stderr = refused(&[set]);
        assert!(stderr.contains(says), "{set}: {stderr}");
    }
}

/// The agent's flags as the chart renders them, parsed by the agent's own command
/// line, make the mount Pods carry the values, and the API server accepts such a Pod
/// (a server-side dry run; the PriorityClass it names is created first).
#[tokio::test]
async fn mount_pods_carry_the_values_and_the_api_server_takes_them() {
    use clap::Parser;
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    use kube::api::{Api, ObjectMeta, PostParams};
    use tessera_node::NodeArgs;
    use tessera_node::daemon_spec::DaemonSpec;
    use tessera_node::pods::extras::Extras;
    use tessera_node::pods::spec::{Template, mount_pod};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeArgs,
    }
    let extras_of = |args: Vec<String>| {
        let mut argv = vec!["tessera".to_string(), "--node-name=n1".into()];
        argv.extend(args.into_iter().skip(1)); // `node`, the subcommand
        Cli::try_parse_from(argv)
            .expect("the agent takes the rendered flags")
            .node
            .mount_pod_extras
            .extras()
            .expect("and their values")
    };
    assert_eq!(
        extras_of(node_args(&objects(&helm_template("tessera-system", &[])))),
        Extras::default()
    );
    let extras = extras_of(node_args(&template_with_values(&[])));
    let id = support::unique_name("podmeta");
    let template = Template {
        namespace: "tessera-system".into(),
        node: format!("{id}-n"),
        image: "tessera:0.1.0".into(),
        pull_policy: Some("Never".into()),
        image_pull_secrets: vec![],
        mount_root: "/var/lib/tessera/mounts".into(),
        state_dir: "/var/lib/tessera/node".into(),
        termination_grace_seconds: 30,
        resources: Default::default(),
        extras,
    };
    let spec = DaemonSpec {
        volume: format!("{id}-v"),
        mountpod: format!("{id}-v-n"),
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
    let pod = mount_pod(&template, &spec);
    let value = serde_json::to_value(&pod).unwrap();
    assert_eq!(value["metadata"]["labels"]["team"], "storage");
    assert_eq!(
        value["metadata"]["labels"]["app.kubernetes.io/component"],
        "mount"
    );
    let annotations = &value["metadata"]["annotations"];
    assert_eq!(annotations["example.com/note"], "a=b, c");
    assert_eq!(annotations["example.com/owner"], "storage-team");
    assert_eq!(annotations["tessera.io/mountpod"], format!("{id}-v-n"));
    assert_eq!(
        value["spec"]["tolerations"],
        json!([{"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule"}])
    );
    assert_eq!(value["spec"]["priorityClassName"], "tessera-mounts");

    let client = support::client().await;
    fn ok_if_exists<T>(r: Result<T, kube::Error>) {
        match r {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("{e}"),
        }
    }
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    };
    let pp = PostParams::default();
    ok_if_exists(
        Api::<Namespace>::all(client.clone())
            .create(
                &pp,
                &Namespace {
                    metadata: meta("tessera-system"),
                    ..Default::default()
                },
            )
            .await,
    );
    ok_if_exists(
        Api::<PriorityClass>::all(client.clone())
            .create(
                &pp,
                &PriorityClass {
                    metadata: meta("tessera-mounts"),
                    value: Some(1000),
                    ..Default::default()
                },
            )
            .await,
    );
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let pods: Api<Pod> = Api::namespaced(client, "tessera-system");
    let created = pods
        .create(&dry, &pod)
        .await
        .expect("the API server takes the mount Pod with the values");
    assert_eq!(
        created.spec.unwrap().priority,
        Some(1000),
        "the PriorityClass applied"
    );
}
