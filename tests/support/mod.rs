//! Shared fixture for the tests that talk to Kubernetes.
//!
//! A test asks [`client`] for a `kube::Client`. When `KUBECONFIG` is set, that cluster is
//! used as it is (the same tests run unchanged against any cluster). Otherwise the local
//! control plane from `tests/harness` is started once (`tests/harness/cluster.sh up`,
//! which is idempotent and safe to call from parallel test processes) and its
//! kubeconfig, `target/cluster/kubeconfig`, is used. [`ensure_crds`] installs `crds/`
//! once per test process and waits until the CRDs are Established. Every test makes its
//! own object names with [`unique_name`], so tests run in parallel and leave nothing
//! behind that another test could trip over. [`env::Env`] is that set-up for one test,
//! with the steps the ticket-driven tests repeat; [`fixtures`] starts Tessera's
//! processes and stand-ins for them (the node agent's in [`agent_process`]).

#![allow(dead_code)] // each test binary uses a different part of the fixture

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Client, Config};
use tokio::sync::OnceCell;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Path of the kubeconfig of the cluster under test.
pub fn kubeconfig_path() -> PathBuf {
    match std::env::var_os("KUBECONFIG") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            start_local_cluster();
            repo_root().join("target/cluster/kubeconfig")
        }
    }
}

fn start_local_cluster() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let status = Command::new("bash")
            .arg(repo_root().join("tests/harness/cluster.sh"))
            .arg("up")
            .current_dir(repo_root())
            .status()
            .expect("running tests/harness/cluster.sh up");
        assert!(
            status.success(),
            "tests/harness/cluster.sh up failed: {status}"
        );
    });
}

/// A client for the cluster under test.
pub async fn client() -> Client {
    Client::try_from(config().await).expect("client")
}

/// The client configuration of the cluster under test.
pub async fn config() -> Config {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("reading kubeconfig {}: {e}", path.display()));
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig usable")
}

/// The kubectl to run: the harness build if present, else `kubectl` from PATH.
pub fn kubectl() -> Command {
    let built = repo_root().join("target/harness/bin/kubectl");
    let mut cmd = if built.exists() {
        Command::new(built)
    } else {
        Command::new("kubectl")
    };
    cmd.arg("--kubeconfig").arg(kubeconfig_path());
    cmd
}

/// Run kubectl with `args` and check that it succeeds (failing the test with what it
/// printed otherwise); its stdout, trimmed.
pub fn kubectl_output(args: &[&str]) -> String {
    let out = kubectl().args(args).output().expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("kubectl prints UTF-8")
        .trim()
        .to_string()
}

/// Run kubectl with `args` and `input` on its stdin, check that it succeeds, and give
/// what it printed.
pub fn kubectl_stdin(args: &[&str], input: &str) -> String {
    use std::io::Write;
    let mut child = kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A temporary directory `<prefix>…` (in the temporary directory, an allowed backend
/// root of every process the tests start), removed when dropped.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("a temporary directory {prefix}…: {e}"))
}

/// A name no other test (or earlier run) uses: `<prefix>-<pid>-<n>-<nanos>`.
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{n}-{:x}", std::process::id(), nanos & 0xffff)
}

/// Install (server-side apply) the CRDs from `crds/` and wait until they are Established.
pub async fn ensure_crds(client: &Client) {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_init(|| async {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let text = std::fs::read_to_string(repo_root().join("crds/tessera.io.yaml")).unwrap();
        for crd in parse_documents::<CustomResourceDefinition>(&text) {
            let name = crd.metadata.name.clone().unwrap();
            api.patch(
                &name,
                &PatchParams::apply("tessera-tests").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
            wait_established(&api, &name).await;
        }
    })
    .await;
}

/// Install the VolumeSnapshot CRDs (the snapshot add-on's, copied by
/// tests/harness/build.sh from external-snapshotter's client module), as a cluster
/// that takes snapshots has them.
pub async fn ensure_snapshot_crds(client: &Client) {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_init(|| async {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let dir = repo_root().join("target/harness/snapshot-crds");
        let files = yaml_files(&dir);
        assert_eq!(
            files.len(),
            3,
            "{}: run tests/harness/build.sh",
            dir.display()
        );
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for crd in parse_documents::<CustomResourceDefinition>(&text) {
                let name = crd.metadata.name.clone().unwrap();
                api.patch(
                    &name,
                    &PatchParams::apply("tessera-tests").force(),
                    &Patch::Apply(&crd),
                )
                .await
                .unwrap_or_else(|e| panic!("applying CRD {name}: {e}"));
                wait_established(&api, &name).await;
            }
        }
    })
    .await;
}

/// Wait until the CRD `name` has condition Established=True.
pub async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let crd = api.get(name).await.unwrap();
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "CRD {name} not Established within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Parse a multi-document YAML stream, skipping empty documents.
pub fn parse_documents<T: serde::de::DeserializeOwned>(text: &str) -> Vec<T> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text)
        .filter_map(|doc| {
            let value = serde_norway::Value::deserialize(doc).expect("valid YAML");
            if value.is_null() {
                None
            } else {
                Some(serde_norway::from_value(value).expect("document of the expected type"))
            }
        })
        .collect()
}

/// An `Api<DynamicObject>` for whatever kind `obj` is, resolved by discovery.
pub async fn dynamic_api(
    client: &Client,
    obj: &DynamicObject,
) -> (Api<DynamicObject>, ApiResource, ApiCapabilities) {
    let tm = obj
        .types
        .as_ref()
        .expect("manifest has apiVersion and kind");
    let gvk = GroupVersionKind::try_from(tm).expect("apiVersion parses");
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discovering {gvk:?}: {e}"));
    let api = match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &ar),
        Scope::Namespaced => {
            let ns = obj
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            Api::namespaced_with(client.clone(), &ns, &ar)
        }
    };
    (api, ar, caps)
}

/// All YAML files in a directory, sorted by name.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
}
pub mod agent_process;
pub mod csi;
pub mod env;
pub mod fixtures;
pub mod health;
pub mod invariants;
pub mod monitoring;
pub mod pods;
pub mod sqlite;
pub mod tree;

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, ...), in KiB; 0 if the
/// process or the field is gone.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The samples of `tessera_api_requests_total` in a metrics text: each one's labels
/// (`verb`, `group`, `resource`, `subresource`, `code`) and value.
pub fn api_requests(text: &str) -> Vec<(std::collections::BTreeMap<String, String>, f64)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("tessera_api_requests_total{"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once("} ")?;
            let mut map = std::collections::BTreeMap::new();
            let mut rest = labels;
            while let Some((key, after)) = rest.split_once("=\"") {
                let (value, tail) = after.split_once('"')?;
                map.insert(key.trim_start_matches(',').to_string(), value.to_string());
                rest = tail;
            }
            Some((map, value.trim().parse().ok()?))
        })
        .collect()
}

/// Writes among the API requests of a metrics text: every verb but GET (leader Lease
/// renewals left out: they are the controller's, not any object's).
pub fn api_writes(text: &str) -> f64 {
    api_requests(text)
        .iter()
        .filter(|(l, _)| l["verb"] != "GET" && l["resource"] != "leases")
        .map(|(_, v)| v)
        .sum()
}

/// The notes of the Events (events.k8s.io, namespace `default`, where Tessera's
/// controller records them) with `reason` about the object named `regarding`, of
/// `type_` (`Normal`, `Warning`) when given.
pub async fn event_notes(
    client: &Client,
    regarding: &str,
    reason: &str,
    type_: Option<&str>,
) -> Vec<String> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|ev| {
            ev.reason.as_deref() == Some(reason)
                && type_.is_none_or(|t| ev.type_.as_deref() == Some(t))
                && ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding)
        })
        .filter_map(|ev| ev.note)
        .collect()
}
