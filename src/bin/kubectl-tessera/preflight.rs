//! `kubectl tessera preflight`: one Pod per node, in rounds, each running `tessera
//! preflight …` and printing one JSON line (`tessera_host::preflight`); the judgement
//! is `tessera_plugin::preflight`'s. Rounds: `check` (read the host through a
//! read-only mount of its `/`), then, for roots on at least two nodes, `mark`, `look`
//! and `unmark` with each root mounted writable (hostPath type Directory). Every Pod
//! is deleted when its round ends; a Pod that does not run is a finding.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use tessera_host::preflight::{NodeFacts, Sightings};
use tessera_plugin::doctor::Finding;
use tessera_plugin::preflight::Scope;

use crate::read::{Ctx, Error, list_params};

/// The roots `config/backend-roots.yaml` ships, where no ConfigMap says otherwise.
const SHIPPED_ROOTS: [(&str, Scope); 2] = [
    ("/var/lib/tessera/volumes", Scope::NodeLocal),
    ("/mnt/shared/tessera", Scope::Shared),
];

/// What `preflight` was asked.
pub struct Options {
    pub namespace: String,
    pub image: Option<String>,
    pub roots: Vec<(String, Scope)>,
    pub kubelet_dir: String,
    pub node_selector: Option<String>,
    pub timeout: Duration,
}

/// What the rounds gathered.
pub struct Gathered {
    pub facts: Vec<NodeFacts>,
    pub sightings: Vec<Sightings>,
    pub roots: BTreeMap<String, Scope>,
    /// Pods that did not run or said nothing readable.
    pub failures: Vec<Finding>,
}

pub async fn gather(client: &Client, o: &Options) -> Result<Gathered, Error> {
    let nodes: Vec<String> = Api::<Node>::all(client.clone())
        .list(&list_params(o.node_selector.as_deref()))
        .await
        .ctx(|| "listing Nodes".into())?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    let roots = roots(client, o).await?;
    let (image, pull_policy) = image(client, o).await?;
    let token = format!(
        "{:x}{:x}",
        jiff::Timestamp::now().as_nanosecond() as u64 & 0xffff_ffff,
        std::process::id()
    );
    let round = Round {
        client,
        namespace: &o.namespace,
        image: &image,
        pull_policy: pull_policy.as_deref(),
        token: &token,
        timeout: o.timeout,
    };
    let mut failures = Vec::new();
    let root_args: Vec<String> = roots
        .keys()
        .flat_map(|r| ["--root".to_string(), r.clone()])
        .collect();
    let checks = round
        .run("check", &nodes, |node| {
            let mut args = vec![
                "preflight".into(),
                "check".into(),
                "--node".into(),
                node.into(),
            ];
            args.extend([
                "--host".into(),
                "/host".into(),
                "--kubelet-dir".into(),
                o.kubelet_dir.clone(),
            ]);
            args.extend(root_args.iter().cloned());
            (
                args,
                vec![HostMount {
                    host: "/".into(),
                    at: "/host".into(),
                    read_only: true,
                    directory: false,
                }],
            )
        })
        .await?;
    let facts: Vec<NodeFacts> = parsed(checks, "check", &mut failures);

    // The roots each node has: where markers go.
    let have = |node: &str| -> Vec<String> {
        facts
            .iter()
            .find(|f| f.node == node)
            .map(|f| {
                f.roots
                    .iter()
                    .filter(|(_, r)| r.exists)
                    .map(|(p, _)| p.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    let marking: Vec<String> = facts
        .iter()
        .filter(|f| f.roots.values().any(|r| r.exists))
        .map(|f| f.node.clone())
        .collect();
    let mut sightings = Vec::new();
    if marking.len() >= 2 {
        let marker = |action: &'static str| {
            let have = &have;
            let token = &token;
            move |node: &str| {
                let mut args = vec![
                    "preflight".into(),
                    action.into(),
                    "--node".into(),
                    node.into(),
                    "--token".into(),
                    token.clone(),
                ];
                let mut mounts = Vec::new();
                for (i, root) in have(node).iter().enumerate() {
                    let at = format!("/roots/{i}");
                    args.extend(["--dir".into(), format!("{root}={at}")]);
                    mounts.push(HostMount {
                        host: root.clone(),
                        at,
                        read_only: false,
                        directory: true,
                    });
                }
                (args, mounts)
            }
        };
        let marked = round.run("mark", &marking, marker("mark")).await?;
        let _: Vec<serde_json::Value> = parsed(marked, "mark", &mut failures);
        let looked = round.run("look", &marking, marker("look")).await;
        // Markers are removed whatever the look found.
        let unmarked = round.run("unmark", &marking, marker("unmark")).await?;
        sightings = parsed(looked?, "look", &mut failures);
        let _: Vec<serde_json::Value> = parsed(unmarked, "unmark", &mut failures);
    }
    Ok(Gathered {
        facts,
        sightings,
        roots,
        failures,
    })
}

/// The roots to check: the flags, else the ConfigMap's, else the shipped ones.
async fn roots(client: &Client, o: &Options) -> Result<BTreeMap<String, Scope>, Error> {
    if !o.roots.is_empty() {
        return Ok(o.roots.iter().cloned().collect());
    }
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &o.namespace)
        .get_opt("tessera-backend-roots")
        .await
        .ctx(|| format!("reading ConfigMap {}/tessera-backend-roots", o.namespace))?;
    Ok(cm
        .and_then(|c| c.data)
        .and_then(|d| d.get("backend-roots").cloned())
        .map(|t| tessera_plugin::preflight::roots_of_file(&t))
        .unwrap_or_else(|| {
            SHIPPED_ROOTS
                .iter()
                .map(|(r, s)| (r.to_string(), *s))
                .collect()
        }))
}

/// The image: the flag, else the node DaemonSet's, else this release's.
async fn image(client: &Client, o: &Options) -> Result<(String, Option<String>), Error> {
    if let Some(i) = &o.image {
        return Ok((i.clone(), None));
    }
    let ds = Api::<DaemonSet>::namespaced(client.clone(), &o.namespace)
        .get_opt("tessera-node")
        .await
        .ctx(|| format!("reading DaemonSet {}/tessera-node", o.namespace))?;
    let c = ds
        .and_then(|d| d.spec)
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().find(|c| c.name == "tessera"));
    Ok(match c {
        Some(c) => (c.image.unwrap_or_default(), c.image_pull_policy),
        None => (format!("tessera:{}", env!("CARGO_PKG_VERSION")), None),
    })
}

/// A hostPath a preflight Pod mounts.
struct HostMount {
    host: String,
    at: String,
    read_only: bool,
    /// `type: Directory` (the Pod does not start where it is missing).
    directory: bool,
}

struct Round<'a> {
    client: &'a Client,
    namespace: &'a str,
    image: &'a str,
    pull_policy: Option<&'a str>,
    token: &'a str,
    timeout: Duration,
}

/// How a node's Pod of a round ended: its last log line, or why there is none.
type Outcome = (String, Result<String, String>);

impl Round<'_> {
    /// One Pod per node running `tessera` with the args `spec` gives; each node's
    /// last log line (or why there is none), the Pods deleted.
    async fn run(
        &self,
        phase: &str,
        nodes: &[String],
        spec: impl Fn(&str) -> (Vec<String>, Vec<HostMount>),
    ) -> Result<Vec<Outcome>, Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.namespace);
        let mut names = Vec::new();
        let mut out = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let name = format!("tessera-preflight-{}-{phase}-{i}", self.token);
            let (args, mounts) = spec(node);
            let pod = self.pod(&name, node, args, mounts)?;
            match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => names.push((node.clone(), name)),
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                    out.push((
                        node.clone(),
                        Err(format!("the API server refused the Pod: {}", s.message)),
                    ));
                }
                Err(e) => return Err(e).ctx(|| format!("creating Pod {}/{name}", self.namespace)),
            }
        }
        let deadline = Instant::now() + self.timeout;
        for (node, name) in names {
            let result = self.wait(&pods, &name, deadline).await;
            let _ = pods
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await;
            out.push((node, result));
        }
        Ok(out)
    }

    fn pod(
        &self,
        name: &str,
        node: &str,
        args: Vec<String>,
        mounts: Vec<HostMount>,
    ) -> Result<Pod, Error> {
        let volumes: Vec<_> = mounts
            .iter()
            .enumerate()
            .map(|(i, m)| json!({"name": format!("h{i}"), "hostPath": {"path": m.host, "type": if m.directory { "Directory" } else { "" }}}))
            .collect();
        let volume_mounts: Vec<_> = mounts
            .iter()
            .enumerate()
            .map(|(i, m)| json!({"name": format!("h{i}"), "mountPath": m.at, "readOnly": m.read_only}))
            .collect();
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/name": "tessera", "app.kubernetes.io/component": "preflight"}},
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "activeDeadlineSeconds": self.timeout.as_secs().max(1),
                "automountServiceAccountToken": false,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{
                    "name": "preflight", "image": self.image, "imagePullPolicy": self.pull_policy,
                    "args": args,
                    "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": false,
                                        "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}},
                    "volumeMounts": volume_mounts,
                }],
                "volumes": volumes,
            }
        });
        serde_json::from_value(pod).map_err(|e| Error::Config(format!("building Pod {name}: {e}")))
    }

    /// Until the Pod ends (its last log line) or the deadline (why it did not run).
    async fn wait(&self, pods: &Api<Pod>, name: &str, deadline: Instant) -> Result<String, String> {
        loop {
            let p = pods
                .get_opt(name)
                .await
                .map_err(|e| format!("reading the Pod: {e}"))?;
            let Some(p) = p else {
                return Err("the Pod vanished".into());
            };
            let status = p.status.unwrap_or_default();
            match status.phase.as_deref() {
                Some("Succeeded") | Some("Failed") => {
                    let log = pods
                        .logs(
                            name,
                            &LogParams {
                                container: Some("preflight".into()),
                                ..LogParams::default()
                            },
                        )
                        .await
                        .map_err(|e| format!("reading its log: {e}"))?;
                    let last = log
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or_default()
                        .to_string();
                    return if status.phase.as_deref() == Some("Succeeded") {
                        Ok(last)
                    } else {
                        Err(format!(
                            "it failed: {}",
                            if last.is_empty() { "no output" } else { &last }
                        ))
                    };
                }
                _ if Instant::now() >= deadline => {
                    let why = status
                        .container_statuses
                        .iter()
                        .flatten()
                        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
                        .map(|w| {
                            format!(
                                "{} {}",
                                w.reason.clone().unwrap_or_default(),
                                w.message.clone().unwrap_or_default()
                            )
                        })
                        .chain(
                            status
                                .conditions
                                .iter()
                                .flatten()
                                .filter(|c| c.status != "True")
                                .filter_map(|c| c.message.clone()),
                        )
                        .next()
                        .unwrap_or_else(|| {
                            "no reason given (`kubectl describe pod` its events)".into()
                        });
                    return Err(format!(
                        "it did not finish within {:?}: {}",
                        self.timeout,
                        why.trim()
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

/// The JSON lines parsed; a node whose Pod failed or printed something else is a
/// finding.
fn parsed<T: serde::de::DeserializeOwned>(
    outcomes: Vec<Outcome>,
    phase: &str,
    failures: &mut Vec<Finding>,
) -> Vec<T> {
    let mut out = Vec::new();
    for (node, result) in outcomes {
        match result.and_then(|line| serde_json::from_str(&line).map_err(|e| format!("its output {line:?} is not the expected JSON: {e}"))) {
            Ok(v) => out.push(v),
            Err(why) => failures.push(Finding::problem_of(
                "preflight",
                format!("node {node}: the {phase} Pod: {why}"),
                "a hostPath it needs is missing, the image is not pullable there (--image), or the namespace's Pod Security forbids hostPath Pods (label it pod-security.kubernetes.io/enforce=privileged, as the install needs)".into(),
            )),
        }
    }
    out
}
