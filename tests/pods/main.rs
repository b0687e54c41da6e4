//! Real Pods on the harness's real nodes (kubelet, containerd, runc), with Tessera
//! deployed from `config/` (`make cluster-up deploy`): the kubelet, not this test, is
//! the CSI node plugin's client.
//!
//! ```text
//!  PVC ─(external-provisioner)─▶ PV, Volume ─ Pod on node A ─(A/D controller,
//!  external-attacher)─▶ ticket ─▶ MountPod ─▶ FUSE mount ─(kubelet: NodePublish)─▶ Pod
//!  Pod deleted ─▶ kubelet unpublishes ─▶ storage VolumeAttachment gone ─▶ detached
//! ```
//!
//! The tests are `#[ignore]`d because they need those nodes; `tests/run.sh` starts
//! them, deploys Tessera and runs these with `--ignored` (its closing line says so).

mod support;

#[path = "pods/backend.rs"]
mod backend;
#[path = "pods/daemon_kill.rs"]
mod daemon_kill;
#[path = "pods/doctor.rs"]
mod doctor;
#[path = "pods/examples.rs"]
mod examples;
#[path = "pods/failover.rs"]
mod failover;
#[path = "pods/fence.rs"]
mod fence;
#[path = "pods/groups.rs"]
mod groups;
#[path = "pods/locks.rs"]
mod locks;
#[path = "pods/many.rs"]
mod many;
#[path = "pods/modify.rs"]
mod modify;
#[path = "pods/oom.rs"]
mod oom;
#[path = "pods/placement.rs"]
mod placement;
#[path = "pods/preflight.rs"]
mod preflight;
#[path = "pods/release.rs"]
mod release;
#[path = "pods/rollout.rs"]
mod rollout;
#[path = "pods/snapshots.rs"]
mod snapshots;
#[path = "pods/upgrade.rs"]
mod upgrade;
#[path = "pods/writer.rs"]
mod writer;

#[path = "pods/csisurface.rs"]
mod csisurface;
#[path = "pods/inline.rs"]
mod inline;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment as StorageVolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use tessera_api::Volume;

use support::fixtures::eventually;

/// Bound of the waits for Pods, provisioning and cleanup.
const WAIT: Duration = Duration::from_secs(120);
/// The issue's bound: a deleted Pod's volume is detached within this.
const DETACH_BOUND: Duration = Duration::from_secs(30);
/// FUSE's statfs magic.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// What `tests/harness/nodes.sh` wrote about the running nodes (`target/cluster/nodes.env`).
struct Nodes {
    vars: BTreeMap<String, String>,
}

impl Nodes {
    fn load() -> Nodes {
        let path = cluster_dir().join("nodes.env");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; these tests need real nodes (make cluster-up deploy)",
                path.display()
            )
        });
        let vars = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            .collect();
        Nodes { vars }
    }

    fn names(&self) -> Vec<String> {
        self.vars["TESSERA_NODES"]
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    fn var(&self, node: &str, suffix: &str) -> String {
        let key = format!(
            "TESSERA_NODE_{}{suffix}",
            node.trim_start_matches("tessera-node-").to_uppercase()
        );
        self.vars
            .get(&key)
            .unwrap_or_else(|| panic!("{key} not in nodes.env"))
            .clone()
    }

    /// The node's kubelet directory, as seen from the host.
    fn kubelet_dir(&self, node: &str) -> PathBuf {
        PathBuf::from(self.var(node, "_KUBELET_DIR"))
    }

    /// `/mnt/shared` of every node, as seen from the host.
    fn shared(&self) -> PathBuf {
        PathBuf::from(&self.vars["TESSERA_SHARED_DIR"])
    }

    /// The pid of the node's kubelet.
    fn kubelet_pid(&self, node: &str) -> u32 {
        let f = cluster_dir().join(format!("nodes/{node}/pids/kubelet.pid"));
        std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .trim()
            .parse()
            .expect("a pid")
    }
}

/// The harness cluster with the nodes: `HARNESS_CLUSTER_DIR` as tests/harness takes it
/// (tests/run.sh and the demo use target/nodes-cluster), else target/cluster.
fn cluster_dir() -> PathBuf {
    std::env::var_os("HARNESS_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::repo_root().join("target/cluster"))
}

fn statfs_type(path: &Path) -> Option<i64> {
    nix::sys::statfs::statfs(path)
        .ok()
        .map(|s| s.filesystem_type().0)
}

/// A namespace of its own for one test, deleted at the end.
async fn namespace(client: &Client, prefix: &str) -> String {
    let name = support::unique_name(prefix);
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    // Real Pods need the namespace's default ServiceAccount (its token is mounted).
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    eventually(WAIT, "the default ServiceAccount", || async {
        sas.get_opt("default").await.ok().flatten()
    })
    .await;
    name
}

async fn pvc(client: &Client, ns: &str, name: &str, mode: &str) -> PersistentVolumeClaim {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "accessModes": [mode],
            "storageClassName": "tessera-shared",
            "resources": {"requests": {"storage": "64Mi"}},
        }
    }))
    .unwrap();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &pvc).await.unwrap();
    eventually(WAIT, "the claim bound", || async {
        api.get(name)
            .await
            .ok()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
    })
    .await
}

/// Run kubectl against the cluster under test; fail the test unless it succeeds.
/// Its stdout, trimmed.
fn kubectl(args: &[&str]) -> String {
    let out = support::kubectl().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// kubectl with `input` on stdin.
fn kubectl_stdin(args: &[&str], input: &str) {
    use std::io::Write;
    let mut child = support::kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The harness's busybox image.
const BUSYBOX: &str = "harness.tessera.io/busybox:1.35";

/// A busybox Pod on `node` running `script` with the claim at /data.
async fn pod(client: &Client, ns: &str, name: &str, node: &str, claim: &str, script: &str) {
    pod_of(client, ns, name, node, claim, BUSYBOX, script).await;
}

/// A Pod of `image` on `node` running `script` (sh -c) with the claim at /data.
async fn pod_of(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    claim: &str,
    image: &str,
    script: &str,
) {
    let volume = claim_volume(claim);
    app_pod(client, ns, name, Some(node), image, script, volume).await;
}

/// The Pod volume `data` of a claim.
fn claim_volume(claim: &str) -> serde_json::Value {
    json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}})
}

/// Create the Pod every test runs: `name`, one container `app` of `image` running
/// `script` (sh -c), never restarted, with `volume` (a Pod volume: its name and
/// source) at /data; on `node`, or where the scheduler places it. The Pod as created.
async fn app_pod(
    client: &Client,
    ns: &str,
    name: &str,
    node: Option<&str>,
    image: &str,
    script: &str,
    volume: serde_json::Value,
) -> Pod {
    let mut spec = json!({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "app",
            "image": image,
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", script],
            "volumeMounts": [{"name": volume["name"], "mountPath": "/data"}],
        }],
        "volumes": [volume],
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    let pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating Pod {name}: {e}"))
}

/// The node the Pod `name` was scheduled to.
async fn node_of(client: &Client, ns: &str, name: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.node_name)
        .expect("a scheduled Pod")
}

async fn pod_phase(client: &Client, ns: &str, name: &str) -> Option<String> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|p| p.status.and_then(|s| s.phase))
}

/// Wait until the Pod's phase is `want`; fail at once on Failed (unless wanted).
async fn wait_phase(client: &Client, ns: &str, name: &str, want: &str) -> Duration {
    let start = Instant::now();
    eventually(WAIT, &format!("Pod {name} {want}"), || async {
        let phase = pod_phase(client, ns, name).await;
        if phase.as_deref() == Some("Failed") && want != "Failed" {
            let pod = Api::<Pod>::namespaced(client.clone(), ns).get(name).await;
            panic!("Pod {name} failed: {pod:#?}");
        }
        (phase.as_deref() == Some(want)).then_some(())
    })
    .await;
    start.elapsed()
}

async fn delete_pod(client: &Client, ns: &str, name: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let _ = api.delete(name, &DeleteParams::default()).await;
    eventually(WAIT, &format!("Pod {name} gone"), || async {
        api.get_opt(name)
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
}

/// The storage.k8s.io VolumeAttachments of a PV.
async fn attachments(client: &Client, pv: &str) -> Vec<String> {
    Api::<StorageVolumeAttachment>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
        .map(|va| va.spec.node_name)
        .collect()
}

/// The kubelet's view of the mount table holds Tessera's FUSE mount of `volume`
/// (its mount root, outside the kubelet directory), as it does in production: the
/// reference check that stranded volumes must see it and still let them go.
fn kubelet_sees_mount_root(nodes: &Nodes, node: &str, volume: &str) -> bool {
    let pid = nodes.kubelet_pid(node);
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    mountinfo.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-");
        let fstype = sep.and_then(|i| f.get(i + 1)).copied().unwrap_or("");
        f.get(4).is_some_and(|mp| {
            mp.starts_with("/var/lib/tessera/") && mp.ends_with(&format!("/{volume}"))
        }) && fstype.starts_with("fuse")
    })
}

/// The directory of a Tessera volume in the shared backend, as seen from the host.
fn backend_dir(nodes: &Nodes, volume: &Volume) -> PathBuf {
    let root = volume.spec.backend.root.trim_start_matches("/mnt/shared/");
    nodes.shared().join(root).join(volume.name_any())
}

async fn tessera_volume(client: &Client, pv: &str) -> Volume {
    let pv: PersistentVolume = Api::all(client.clone()).get(pv).await.unwrap();
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    Api::<Volume>::all(client.clone())
        .get(&handle)
        .await
        .unwrap()
}

/// What every real-Pod test starts from: a namespace of its own with one bound claim,
/// its PV, the Tessera Volume behind it and that volume's directory in the backend.
struct Claimed {
    nodes: Nodes,
    ns: String,
    pv: String,
    volume: Volume,
    data: PathBuf,
}

async fn claimed(client: &Client, prefix: &str, claim: &str, mode: &str) -> Claimed {
    let nodes = Nodes::load();
    let ns = namespace(client, prefix).await;
    let pvc = pvc(client, &ns, claim, mode).await;
    let pv = pvc.spec.unwrap().volume_name.unwrap();
    let volume = tessera_volume(client, &pv).await;
    let data = backend_dir(&nodes, &volume);
    Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    }
}

/// A claim of a StorageClass of its own: what the tests of a class parameter start
/// from once their namespace exists.
struct ClassClaim {
    /// The StorageClass (a unique name from the prefix); the test deletes it.
    class: String,
    pv: String,
    volume: Volume,
}

/// Create a StorageClass named after `prefix` (Tessera on the shared backend, Shared
/// scope, with `parameters` added) and a 64Mi ReadWriteOnce claim `claim` of it in
/// `ns` (of the VolumeAttributesClass `vac` when given); wait until it is bound.
async fn class_claim(
    client: &Client,
    ns: &str,
    prefix: &str,
    parameters: serde_json::Value,
    claim: &str,
    vac: Option<&str>,
) -> ClassClaim {
    let class = shared_class(client, prefix, parameters).await;
    let mut pvc = json!({
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": {"requests": {"storage": "64Mi"}},
        }
    });
    if let Some(vac) = vac {
        pvc["spec"]["volumeAttributesClassName"] = json!(vac);
    }
    let pvc: PersistentVolumeClaim = serde_json::from_value(pvc).unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    claims.create(&PostParams::default(), &pvc).await.unwrap();
    let pv = eventually(WAIT, "the claim bound", || async {
        claims
            .get(claim)
            .await
            .ok()
            .and_then(|c| c.spec?.volume_name)
    })
    .await;
    let volume = tessera_volume(client, &pv).await;
    ClassClaim { class, pv, volume }
}

/// Create a StorageClass named after `prefix`: Tessera on the shared backend, Shared
/// scope, with `parameters` added. Its name.
async fn shared_class(client: &Client, prefix: &str, parameters: serde_json::Value) -> String {
    let name = support::unique_name(prefix);
    let mut params = json!({"backendRoot": "/mnt/shared/tessera", "scope": "Shared"});
    params.as_object_mut().unwrap().extend(
        parameters
            .as_object()
            .expect("parameters: an object")
            .clone(),
    );
    let sc: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": name},
        "provisioner": tessera_api::CSI_DRIVER_NAME,
        "parameters": params,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }))
    .unwrap();
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &sc)
        .await
        .unwrap();
    name
}

/// Delete a StorageClass of [`class_claim`] (not waited for).
async fn delete_class(client: &Client, class: &str) {
    let _ = Api::<StorageClass>::all(client.clone())
        .delete(class, &DeleteParams::default())
        .await;
}

/// Delete the claim and wait until the PV, the Volume and the data are gone.
async fn delete_claim(client: &Client, ns: &str, claim: &str, pv: &str, volume: &str, data: &Path) {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .delete(claim, &DeleteParams::default())
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let volumes: Api<Volume> = Api::all(client.clone());
    eventually(WAIT, "PV, Volume and data gone", || async {
        let pv_gone = pvs.get_opt(pv).await.ok().flatten().is_none();
        let vol_gone = volumes.get_opt(volume).await.ok().flatten().is_none();
        (pv_gone && vol_gone && !data.exists()).then_some(())
    })
    .await;
}

/// The RWO chain on real Pods: written on A, detached when its Pod goes (the kubelet
/// unpublishing, with the FUSE mount root visible to it), read back on B, deleted.
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn rwo_volume_follows_its_pod_from_node_a_to_node_b() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-rwo", "data", "ReadWriteOnce").await;
    let names = nodes.names();
    assert!(names.len() >= 2, "two nodes needed: {names:?}");
    let (a, b) = (&names[0], &names[1]);

    let write = "dd if=/dev/urandom of=/data/big bs=1M count=8 2>/dev/null && \
                 cd /data && sha256sum big > big.sha256 && sync && touch /data/done && \
                 exec sleep 3600";
    pod(&client, &ns, "writer", a, "data", write).await;
    let to_running = wait_phase(&client, &ns, "writer", "Running").await;
    eventually(WAIT, "the writer's data in the backend", || async {
        data.join("done").exists().then_some(())
    })
    .await;
    // The volume is where the kubelet put it, a FUSE mount at its real path.
    let uid = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("writer")
        .await
        .unwrap()
        .uid()
        .unwrap();
    let target = nodes
        .kubelet_dir(a)
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi")
        .join(&pv)
        .join("mount");
    assert_eq!(
        statfs_type(&target),
        Some(FUSE_SUPER_MAGIC),
        "{} is a FUSE mount",
        target.display()
    );
    assert!(
        kubelet_sees_mount_root(&nodes, a, &volume.name_any()),
        "the FUSE mount root of {} must be visible to node {a}'s kubelet, as in production",
        volume.name_any()
    );
    assert_eq!(attachments(&client, &pv).await, vec![a.clone()]);

    // Pod deleted: the kubelet unpublishes, the attach/detach controller detaches.
    let start = Instant::now();
    delete_pod(&client, &ns, "writer").await;
    eventually(
        DETACH_BOUND,
        "the storage VolumeAttachment gone after the Pod",
        || async { attachments(&client, &pv).await.is_empty().then_some(()) },
    )
    .await;
    let detach = start.elapsed();
    assert!(!target.exists(), "the kubelet removed {}", target.display());

    // On node B the same bytes.
    pod(
        &client,
        &ns,
        "reader",
        b,
        "data",
        "cd /data && sha256sum -c big.sha256",
    )
    .await;
    wait_phase(&client, &ns, "reader", "Succeeded").await;
    delete_pod(&client, &ns, "reader").await;
    delete_claim(&client, &ns, "data", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES rwo: Pod to Running {:.1} s; Pod deleted to detached {:.1} s (bound {} s); data checked on {b}",
        to_running.as_secs_f64(),
        detach.as_secs_f64(),
        DETACH_BOUND.as_secs()
    );
}

/// RWX on two nodes at once: what one node's Pod writes, the other's reads.
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn rwx_volume_serves_pods_on_two_nodes_at_once() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-rwx", "shared", "ReadWriteMany").await;
    let names = nodes.names();
    assert!(names.len() >= 2, "two nodes needed: {names:?}");
    let (a, b) = (&names[0], &names[1]);

    pod(
        &client,
        &ns,
        "on-a",
        a,
        "shared",
        "echo from-a > /data/.a && mv /data/.a /data/a && while [ ! -f /data/b ]; do sleep 0.2; done; \
         [ \"$(cat /data/b)\" = from-b ] && exec sleep 3600",
    )
    .await;
    pod(
        &client,
        &ns,
        "on-b",
        b,
        "shared",
        "echo from-b > /data/.b && mv /data/.b /data/b && while [ ! -f /data/a ]; do sleep 0.2; done; \
         [ \"$(cat /data/a)\" = from-a ] && exec sleep 3600",
    )
    .await;
    wait_phase(&client, &ns, "on-a", "Running").await;
    wait_phase(&client, &ns, "on-b", "Running").await;
    // Each saw the other's file (else its script would have ended, failing).
    eventually(WAIT, "both files in the backend", || async {
        (data.join("a").exists() && data.join("b").exists()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for p in ["on-a", "on-b"] {
        assert_eq!(
            pod_phase(&client, &ns, p).await.as_deref(),
            Some("Running"),
            "{p}"
        );
    }
    let mut attached = attachments(&client, &pv).await;
    attached.sort();
    assert_eq!(attached, vec![a.clone(), b.clone()]);

    let start = Instant::now();
    delete_pod(&client, &ns, "on-a").await;
    delete_pod(&client, &ns, "on-b").await;
    eventually(
        DETACH_BOUND,
        "both storage VolumeAttachments gone",
        || async { attachments(&client, &pv).await.is_empty().then_some(()) },
    )
    .await;
    let detach = start.elapsed();
    delete_claim(&client, &ns, "shared", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES rwx: both Pods ran on {a} and {b}; deleted to detached {:.1} s",
        detach.as_secs_f64()
    );
}

/// A kubelet restarted while a Pod uses a volume rebuilds what it knew from the node
/// (reconstruction): the Pod keeps its mount, and when it is deleted later the kubelet
/// unpublishes it and the volume detaches as usual.
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_kubelet_restart_keeps_the_mount_and_still_detaches() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-restart", "data", "ReadWriteOnce").await;
    let node = nodes.names()[0].clone();

    // Appends a line a second; exits (failing the Pod) on the first failed write.
    let script = "i=0; while echo $i >> /data/log; do i=$((i+1)); sleep 1; done; exit 1";
    pod(&client, &ns, "app", &node, "data", script).await;
    wait_phase(&client, &ns, "app", "Running").await;
    let uid = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("app")
        .await
        .unwrap()
        .uid()
        .unwrap();
    let target = nodes
        .kubelet_dir(&node)
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi")
        .join(&pv)
        .join("mount");
    eventually(WAIT, "the app's first lines", || async {
        data.join("log").exists().then_some(())
    })
    .await;

    let status = std::process::Command::new("bash")
        .arg(support::repo_root().join("tests/harness/nodes.sh"))
        .args(["restart-kubelet", &node])
        .status()
        .expect("running nodes.sh restart-kubelet");
    assert!(
        status.success(),
        "restarting the kubelet of {node}: {status}"
    );
    // Some seconds after the restart the Pod still runs, still writes, through the
    // same mount.
    let lines = |p: &Path| {
        std::fs::read_to_string(p)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    let before = lines(&data.join("log"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        pod_phase(&client, &ns, "app").await.as_deref(),
        Some("Running")
    );
    assert!(
        lines(&data.join("log")) > before,
        "the app kept writing across the kubelet restart"
    );
    assert_eq!(statfs_type(&target), Some(FUSE_SUPER_MAGIC));

    let start = Instant::now();
    delete_pod(&client, &ns, "app").await;
    eventually(
        DETACH_BOUND,
        "detached after the restarted kubelet's unpublish",
        || async { attachments(&client, &pv).await.is_empty().then_some(()) },
    )
    .await;
    let detach = start.elapsed();
    assert!(!target.exists(), "the kubelet removed {}", target.display());
    delete_claim(&client, &ns, "data", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES kubelet restart: the Pod kept writing; deleted to detached {:.1} s",
        detach.as_secs_f64()
    );
}
