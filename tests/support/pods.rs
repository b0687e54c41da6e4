//! The helpers of the real-Pod tests (tests/pods/): the real nodes the harness
//! started (`nodes.env`), a namespace and a bound claim of their own, Pods on a node,
//! their phases, the storage VolumeAttachments of a PV, the Tessera Volume behind a
//! claim and its directory in the shared backend, StorageClasses of a parameter, and
//! the deletes that wait until everything is gone.

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

use super::fixtures::eventually;

/// Bound of the waits for Pods, provisioning and cleanup.
pub const WAIT: Duration = Duration::from_secs(120);
/// The bound: a deleted Pod's volume is detached within this.
pub const DETACH_BOUND: Duration = Duration::from_secs(30);
/// FUSE's statfs magic.
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// What `tests/harness/nodes.sh` wrote about the running nodes (`target/cluster/nodes.env`).
pub struct Nodes {
    vars: BTreeMap<String, String>,
}

impl Nodes {
    pub fn load() -> Nodes {
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

    pub fn names(&self) -> Vec<String> {
        self.vars["TESSERA_NODES"]
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    pub fn var(&self, node: &str, suffix: &str) -> String {
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
    pub fn kubelet_dir(&self, node: &str) -> PathBuf {
        PathBuf::from(self.var(node, "_KUBELET_DIR"))
    }

    /// `/mnt/shared` of every node, as seen from the host.
    pub fn shared(&self) -> PathBuf {
        PathBuf::from(&self.vars["TESSERA_SHARED_DIR"])
    }

    /// The pid of the node's kubelet.
    pub fn kubelet_pid(&self, node: &str) -> u32 {
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
pub fn cluster_dir() -> PathBuf {
    std::env::var_os("HARNESS_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::repo_root().join("target/cluster"))
}

pub fn statfs_type(path: &Path) -> Option<i64> {
    nix::sys::statfs::statfs(path)
        .ok()
        .map(|s| s.filesystem_type().0)
}

/// A namespace of its own for one test, deleted at the end.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = super::unique_name(prefix);
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

pub async fn pvc(client: &Client, ns: &str, name: &str, mode: &str) -> PersistentVolumeClaim {
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

/// The harness's busybox image.
pub const BUSYBOX: &str = "harness.tessera.io/busybox:1.35";

/// A busybox Pod on `node` running `script` with the claim at /data.
pub async fn pod(client: &Client, ns: &str, name: &str, node: &str, claim: &str, script: &str) {
    pod_of(client, ns, name, node, claim, BUSYBOX, script).await;
}

/// A Pod of `image` on `node` running `script` (sh -c) with the claim at /data.
pub async fn pod_of(
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
pub fn claim_volume(claim: &str) -> serde_json::Value {
    json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}})
}

/// Create the Pod every test runs: `name`, one container `app` of `image` running
/// `script` (sh -c), never restarted, with `volume` (a Pod volume: its name and
/// source) at /data; on `node`, or where the scheduler places it. The Pod as created.
pub async fn app_pod(
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
pub async fn node_of(client: &Client, ns: &str, name: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.node_name)
        .expect("a scheduled Pod")
}

pub async fn pod_phase(client: &Client, ns: &str, name: &str) -> Option<String> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|p| p.status.and_then(|s| s.phase))
}

/// Wait until the Pod's phase is `want`; fail at once on Failed (unless wanted).
pub async fn wait_phase(client: &Client, ns: &str, name: &str, want: &str) -> Duration {
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

pub async fn delete_pod(client: &Client, ns: &str, name: &str) {
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
pub async fn attachments(client: &Client, pv: &str) -> Vec<String> {
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
pub fn kubelet_sees_mount_root(nodes: &Nodes, node: &str, volume: &str) -> bool {
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
pub fn backend_dir(nodes: &Nodes, volume: &Volume) -> PathBuf {
    let root = volume.spec.backend.root.trim_start_matches("/mnt/shared/");
    nodes.shared().join(root).join(volume.name_any())
}

pub async fn tessera_volume(client: &Client, pv: &str) -> Volume {
    let pv: PersistentVolume = Api::all(client.clone()).get(pv).await.unwrap();
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    Api::<Volume>::all(client.clone())
        .get(&handle)
        .await
        .unwrap()
}

/// What every real-Pod test starts from: a namespace of its own with one bound claim,
/// its PV, the Tessera Volume behind it and that volume's directory in the backend.
pub struct Claimed {
    pub nodes: Nodes,
    pub ns: String,
    pub pv: String,
    pub volume: Volume,
    pub data: PathBuf,
}

pub async fn claimed(client: &Client, prefix: &str, claim: &str, mode: &str) -> Claimed {
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
pub struct ClassClaim {
    /// The StorageClass (a unique name from the prefix); the test deletes it.
    pub class: String,
    pub pv: String,
    pub volume: Volume,
}

/// Create a StorageClass named after `prefix` (Tessera on the shared backend, Shared
/// scope, with `parameters` added) and a 64Mi ReadWriteOnce claim `claim` of it in
/// `ns` (of the VolumeAttributesClass `vac` when given); wait until it is bound.
pub async fn class_claim(
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
pub async fn shared_class(client: &Client, prefix: &str, parameters: serde_json::Value) -> String {
    let name = super::unique_name(prefix);
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
pub async fn delete_class(client: &Client, class: &str) {
    let _ = Api::<StorageClass>::all(client.clone())
        .delete(class, &DeleteParams::default())
        .await;
}

/// Delete the claim and wait until the PV, the Volume and the data are gone.
pub async fn delete_claim(
    client: &Client,
    ns: &str,
    claim: &str,
    pv: &str,
    volume: &str,
    data: &Path,
) {
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
