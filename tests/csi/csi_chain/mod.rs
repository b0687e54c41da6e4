//! The full chain, on the real control plane with the real external-provisioner and
//! external-attacher, and the test playing kubelet:
//!
//! ```text
//!  StorageClass ─▶ PVC ─▶ csi-provisioner ─▶ CreateVolume ─▶ Volume ─▶ PV bound
//!  Pod (nodeName A) ─▶ attach-detach controller ─▶ storage.k8s.io VolumeAttachment
//!      ─▶ csi-attacher ─▶ ControllerPublish ─▶ ticket ─▶ MountPod ─▶ FUSE on A
//!  "kubelet" (this test) ─▶ NodeStage/NodePublish on A's CSI socket ─▶ write + sha256
//!  NodeUnpublish/NodeUnstage, Pod deleted ─▶ detached from A (MountPod gone)
//!  Pod on B ─▶ attached on B ─▶ NodeStage/NodePublish on B ─▶ same sha256
//!  RWX PVC: Pods on A and B at once ─▶ written via A, read via B
//!  PVCs deleted ─▶ PV, Volume and the data directory gone
//! ```
//!
//! Two `tessera node` agents with distinct node names run on this machine; the Node and
//! CSINode objects a kubelet and node-driver-registrar would create are created here.
//!
//! The sidecars watch every PVC and storage.k8s.io VolumeAttachment of driver
//! `csi.tessera.io` in the cluster, and there is no way to scope them to one test. Other
//! tests do not need them: the other modules of this binary, which run beside this
//! test, talk to the sockets directly and make no PVC, Pod or storage VolumeAttachment
//! (csi_sanity included); the demo runs its own control plane; and the only storage
//! VolumeAttachment another test creates (the reaper test, in the `controller` binary)
//! names a PV that does not exist, which the attacher cannot act on. Two
//! runs of this test against one cluster would fight over each other's PVCs, so a run
//! holds a Lease (`default/tessera-csi-chain`) while its sidecars run.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment as StorageVolumeAttachment,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use tessera_api::{CSI_DRIVER_NAME, Volume};
use tessera_csi::csi_ticket_id;

use self::kubelet::{Kubelet, check_data, write_data};
use self::processes::{ChainLock, Sidecar, tail};
use crate::support;
use support::env::CsiEnv;
use support::fixtures::{self, TEST_LABEL, eventually};

mod kubelet;
mod processes;

/// Bound of every wait for the control plane or the sidecars.
const WAIT: Duration = Duration::from_secs(90);
/// Size of the pseudo-random file whose checksum follows the volume around.
const BIG: usize = 6 << 20;
/// The Lease that keeps two runs of this test from sharing the sidecars' view.
const LOCK_LEASE: &str = "tessera-csi-chain";

// ---------------------------------------------------------------------------------
// The cluster side.

struct Chain {
    client: Client,
    id: String,
    ns: String,
    sc: String,
    nodes: [String; 2],
    backend: PathBuf,
    started: Instant,
    /// The Volumes of the claims made so far, for the diagnostics of a failure.
    handles: Mutex<Vec<String>>,
}

impl Chain {
    /// The test's objects: its namespace and StorageClass named after its id, on the
    /// nodes of its two agents and the backend root of `env`.
    fn new(env: &CsiEnv) -> Chain {
        Chain {
            client: env.client.clone(),
            id: env.id.clone(),
            ns: env.id.clone(),
            sc: env.id.clone(),
            nodes: [env.agents[0].node.clone(), env.agents[1].node.clone()],
            backend: env.backend.clone(),
            started: Instant::now(),
            handles: Mutex::default(),
        }
    }

    fn step(&self, what: &str) {
        println!("[{:>6.1}s] {what}", self.started.elapsed().as_secs_f64());
    }

    async fn create_cluster_objects(&self) {
        let c = &self.client;
        for node in &self.nodes {
            let n: Node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node,
                    "labels": {"kubernetes.io/hostname": node, "topology.tessera.io/node": node, TEST_LABEL: self.id},
                    "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            }))
            .unwrap();
            Api::<Node>::all(c.clone())
                .create(&PostParams::default(), &n)
                .await
                .unwrap_or_else(|e| panic!("creating Node {node}: {e}"));
            let cn: CSINode = serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": node, "labels": {TEST_LABEL: self.id}},
                "spec": {"drivers": [{"name": CSI_DRIVER_NAME, "nodeID": node,
                                      "topologyKeys": ["topology.tessera.io/node"]}]},
            }))
            .unwrap();
            Api::<CSINode>::all(c.clone())
                .create(&PostParams::default(), &cn)
                .await
                .unwrap_or_else(|e| panic!("creating CSINode {node}: {e}"));
        }
        // The CSIDriver is cluster-wide and the same for every user: applied, never deleted.
        let text =
            std::fs::read_to_string(support::repo_root().join("config/csidriver.yaml")).unwrap();
        let driver: k8s_openapi::api::storage::v1::CSIDriver =
            support::parse_documents(&text).remove(0);
        Api::<k8s_openapi::api::storage::v1::CSIDriver>::all(c.clone())
            .patch(
                CSI_DRIVER_NAME,
                &PatchParams::apply("tessera-tests").force(),
                &Patch::Apply(&driver),
            )
            .await
            .expect("applying config/csidriver.yaml");
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": self.ns, "labels": {TEST_LABEL: self.id}},
        }))
        .unwrap();
        Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the namespace");
        let sc: StorageClass = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": self.sc, "labels": {TEST_LABEL: self.id}},
            "provisioner": CSI_DRIVER_NAME,
            "parameters": {"backendRoot": self.backend.display().to_string(), "scope": "Shared"},
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": true,
        }))
        .unwrap();
        Api::<StorageClass>::all(c.clone())
            .create(&PostParams::default(), &sc)
            .await
            .expect("creating the StorageClass");
    }

    fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Create a PVC and wait until it is bound; its PV.
    async fn claim(&self, name: &str, mode: &str) -> PersistentVolume {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {"accessModes": [mode], "storageClassName": self.sc,
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap();
        self.pvcs()
            .create(&PostParams::default(), &pvc)
            .await
            .unwrap_or_else(|e| panic!("creating PVC {name}: {e}"));
        let pv_name = eventually(WAIT, &format!("PVC {name} Bound"), || async {
            let pvc = self.pvcs().get(name).await.ok()?;
            let bound = pvc.status.as_ref()?.phase.as_deref() == Some("Bound");
            bound.then(|| pvc.spec?.volume_name).flatten()
        })
        .await;
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get(&pv_name)
            .await
            .unwrap();
        let handle = handle_of(&pv);
        self.handles.lock().unwrap().push(handle.clone());
        let volume = Api::<Volume>::all(self.client.clone())
            .get(&handle)
            .await
            .unwrap_or_else(|e| panic!("the tessera Volume {handle} of PV {pv_name}: {e}"));
        assert_eq!(
            volume.labels().get(TEST_LABEL),
            Some(&self.id),
            "the Volume created through the provisioner carries the controller's --watch-selector labels"
        );
        assert_eq!(volume.spec.backend.root, self.backend.display().to_string());
        // The real provisioner (--extra-create-metadata) names the claim: the
        // per-volume metrics' pvc and pvc_namespace labels (docs/metrics.md).
        let annotations = volume.annotations();
        assert_eq!(
            (
                annotations.get("tessera.io/pvc-name").map(String::as_str),
                annotations.get("tessera.io/pvc-namespace")
            ),
            (Some(name), Some(&self.ns)),
            "{annotations:?}"
        );
        pv
    }

    async fn run_pod(&self, name: &str, claim: &str, node: &str) -> Pod {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"nodeName": node,
                "containers": [{"name": "app", "image": "busybox", "command": ["sleep", "infinity"],
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating Pod {name} on {node}: {e}"))
    }

    /// Give every Pod of the test on `node` an update, as a kubelet's status update
    /// would: the A/D controller looks at its volumes again.
    async fn nudge_pods_on(&self, node: &str, n: u32) {
        let Ok(pods) = self.pods().list(&ListParams::default()).await else {
            return;
        };
        for pod in pods {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) {
                continue;
            }
            let patch =
                json!({"metadata": {"annotations": {"tessera.io/test-nudge": n.to_string()}}});
            let _ = self
                .pods()
                .patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await;
            eprintln!(
                "[csi_chain] no storage VolumeAttachment yet: nudged Pod {} on {node} ({n})",
                pod.name_any()
            );
        }
    }

    /// Delete a pod the way kubectl --force --grace-period=0 does (there is no kubelet to
    /// confirm a graceful deletion) and wait until it is gone.
    async fn delete_pod(&self, name: &str) {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let _ = self.pods().delete(name, &dp).await;
        eventually(WAIT, &format!("Pod {name} gone"), || async {
            self.pods()
                .get_opt(name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    }

    /// Whether the storage VolumeAttachment of `handle` on `node` says attached
    /// (`None`: there is none).
    async fn attached(&self, handle: &str, node: &str) -> Option<bool> {
        Api::<StorageVolumeAttachment>::all(self.client.clone())
            .get_opt(&csi_ticket_id(handle, node))
            .await
            .unwrap()
            .map(|va| va.status.is_some_and(|s| s.attached))
    }

    async fn wait_attached(&self, handle: &str, node: &str) {
        // The A/D controller reads a Pod's volumes on the Pod's own events. If, when the
        // Pod came, its informers had not yet seen the node (or the bound PV) — after an
        // API server restart a reflector can be in a backoff of up to 30 s — it skips the
        // Pod until its next full re-list, 3 minutes later. A kubelet's status updates
        // would give it new Pod events; this test plays the kubelet, so it gives one
        // (an annotation) every 5 s until the storage VolumeAttachment exists.
        let start = Instant::now();
        let mut nudges = 0u32;
        eventually(
            WAIT,
            &format!("storage VolumeAttachment of {handle} on {node} attached"),
            || {
                let due = start.elapsed() > Duration::from_secs(5 * u64::from(nudges + 1));
                if due {
                    nudges += 1;
                }
                async move {
                    let attached = self.attached(handle, node).await;
                    if due && attached.is_none() {
                        self.nudge_pods_on(node, nudges).await;
                    }
                    (attached == Some(true)).then_some(())
                }
            },
        )
        .await;
        // Attached means granted: the MountPod exists (NodePublish waits for it to be
        // Ready; the mount may still be starting here).
        let mp = fixtures::mountpod_on(&self.client, handle, node)
            .await
            .unwrap_or_else(|| panic!("attached on {node}, but no MountPod of {handle} there"));
        assert!(
            mp.metadata.deletion_timestamp.is_none(),
            "the MountPod of {handle} on {node} is not being deleted once attached"
        );
    }

    async fn wait_detached(&self, handle: &str, node: &str) {
        eventually(
            WAIT,
            &format!("{handle} detached from {node} (storage VolumeAttachment and MountPod gone)"),
            || async {
                let va_gone = self.attached(handle, node).await.is_none();
                let mp_gone = fixtures::mountpod_on(&self.client, handle, node)
                    .await
                    .is_none();
                (va_gone && mp_gone).then_some(())
            },
        )
        .await;
    }

    /// Delete the claims `names`.
    async fn delete_claims(&self, names: &[&str]) {
        for name in names {
            let deleted = self.pvcs().delete(name, &DeleteParams::default()).await;
            deleted.unwrap_or_else(|e| panic!("deleting PVC {name}: {e}"));
        }
    }

    /// Wait until the PV, its Volume and the Volume's data directory are gone.
    async fn claim_gone(&self, pv: &PersistentVolume) {
        let (pv_name, handle) = (pv.name_any(), handle_of(pv));
        let data = self.backend.join(&handle);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let volumes: Api<Volume> = Api::all(self.client.clone());
        eventually(
            Duration::from_secs(120),
            &format!("PV {pv_name}, Volume {handle} and {} gone", data.display()),
            || async {
                let pv_gone = pvs.get_opt(&pv_name).await.ok()?.is_none();
                let vol_gone = volumes.get_opt(&handle).await.ok()?.is_none();
                (pv_gone && vol_gone && !data.exists()).then_some(())
            },
        )
        .await;
    }

    /// Wait until no MountPod of the test's volumes is left.
    async fn no_mountpods_left(&self) {
        let lp = ListParams::default().labels(&format!("{TEST_LABEL}={}", self.id));
        let mps: Api<tessera_api::MountPod> = Api::all(self.client.clone());
        eventually(WAIT, "no MountPod of the test's volumes left", || async {
            let left = mps.list(&lp).await.ok()?;
            left.items.is_empty().then_some(())
        })
        .await;
    }

    async fn diagnostics(&self, sidecars: &[&Sidecar], others: &[(&str, PathBuf)]) {
        eprintln!("==== csi_chain failed: state ====");
        let handles = self.handles.lock().unwrap().clone();
        for h in &handles {
            eprintln!(
                "tickets of {h}: {:#?}",
                fixtures::ticket_states(&self.client, h).await
            );
            for node in &self.nodes {
                eprintln!(
                    "  storage VA on {node}: {:?}; MountPod: {:?}",
                    self.attached(h, node).await,
                    fixtures::mountpod_on(&self.client, h, node)
                        .await
                        .map(|mp| (mp.spec.task, mp.status))
                );
            }
        }
        if let Ok(list) = self.pvcs().list(&ListParams::default()).await {
            for pvc in list {
                eprintln!(
                    "PVC {}: {:?} -> {:?}",
                    pvc.name_any(),
                    pvc.status.and_then(|s| s.phase),
                    pvc.spec.and_then(|s| s.volume_name)
                );
            }
        }
        for s in sidecars {
            eprintln!("---- {} ({}) ----\n{}", s.name, s.log.display(), s.tail(40));
        }
        for (name, log) in others {
            eprintln!("---- {name} ({}) ----\n{}", log.display(), tail(log, 30));
        }
        eprintln!("==== end of state ====");
    }

    /// Best effort: leave nothing of this test in the cluster. Runs while the controller
    /// and sidecars still run (so PVs and Volumes go through their finalizers), then
    /// strips the finalizers of whatever is left.
    async fn teardown(&self, in_flight: bool) {
        let c = &self.client;
        if in_flight {
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            let _ = self
                .pods()
                .delete_collection(&dp, &ListParams::default())
                .await;
            let _ = self
                .pvcs()
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await;
            let pvs: Api<PersistentVolume> = Api::all(c.clone());
            let sc = self.sc.clone();
            let _ = tokio::time::timeout(Duration::from_secs(45), async {
                loop {
                    let left = pvs.list(&ListParams::default()).await.map(|l| {
                        l.items.iter().any(|pv| {
                            pv.spec.as_ref().and_then(|s| s.storage_class_name.as_ref())
                                == Some(&sc)
                        })
                    });
                    if !matches!(left, Ok(true)) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
            .await;
        }
        let _ = Api::<Namespace>::all(c.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
        let _ = Api::<StorageClass>::all(c.clone())
            .delete(&self.sc, &DeleteParams::default())
            .await;
        for node in &self.nodes {
            let _ = Api::<CSINode>::all(c.clone())
                .delete(node, &DeleteParams::default())
                .await;
        }
        fixtures::delete_nodes(c, &self.nodes).await;
    }

    /// After the processes are gone: delete leftover PVs, Volumes and MountPods of this
    /// test and drop their finalizers, so they do not linger in the shared cluster.
    async fn strip_leftovers(&self) {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mine: Vec<String> = match pvs.list(&ListParams::default()).await {
            Ok(list) => list
                .items
                .iter()
                .filter(|pv| {
                    pv.spec.as_ref().and_then(|s| s.storage_class_name.as_ref()) == Some(&self.sc)
                })
                .map(|pv| pv.name_any())
                .collect(),
            Err(_) => vec![],
        };
        delete_unfinalized(&pvs, mine).await;
        // storage.k8s.io VolumeAttachments to this test's nodes keep the attacher's
        // finalizer once it is gone.
        let svas: Api<StorageVolumeAttachment> = Api::all(self.client.clone());
        if let Ok(list) = svas.list(&ListParams::default()).await {
            let mine = list
                .iter()
                .filter(|va| self.nodes.contains(&va.spec.node_name))
                .map(|va| va.name_any())
                .collect();
            delete_unfinalized(&svas, mine).await;
        }
        let lp = ListParams::default().labels(&format!("{TEST_LABEL}={}", self.id));
        let vols: Api<Volume> = Api::all(self.client.clone());
        if let Ok(list) = vols.list(&lp).await {
            delete_unfinalized(&vols, list.iter().map(|v| v.name_any()).collect()).await;
        }
        let mps: Api<tessera_api::MountPod> = Api::all(self.client.clone());
        if let Ok(list) = mps.list(&lp).await {
            delete_unfinalized(&mps, list.iter().map(|v| v.name_any()).collect()).await;
        }
    }
}

/// Delete objects and remove their finalizers (nobody is left to serve them).
async fn delete_unfinalized<K>(api: &Api<K>, names: Vec<String>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let unfinalize = json!({"metadata": {"finalizers": null}});
    for name in names {
        let _ = api.delete(&name, &DeleteParams::default()).await;
        let _ = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&unfinalize))
            .await;
    }
}

fn handle_of(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone()
}

// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pvc_to_pod_on_two_nodes_and_back_to_nothing() {
    // The controller and the two agents are the test's own (its id scopes them); the
    // sidecars, cluster-wide, start once this run holds the Lease.
    let env = CsiEnv::builder("chain", 0, WAIT)
        .agents_on(&["a", "b"])
        .default_backend_root()
        .start()
        .await;
    let (client, id) = (env.client.clone(), env.id.clone());
    let (agent_a, agent_b) = (&env.agents[0], &env.agents[1]);
    let lock = ChainLock::acquire(&client, &id).await;
    let chain = Chain::new(&env);
    // The sidecars wait for the controller's socket themselves.
    let provisioner = Sidecar::start(
        "csi-provisioner",
        &id,
        &env.sock,
        &["--extra-create-metadata", "--timeout=30s"],
    );
    let attacher = Sidecar::start("csi-attacher", &id, &env.sock, &["--timeout=15s"]);

    let kubelet_a = Kubelet::new(client.clone(), agent_a);
    let kubelet_b = Kubelet::new(client.clone(), agent_b);
    let flow = async {
        chain.create_cluster_objects().await;
        chain.step("Nodes, CSINodes, StorageClass, controller, two agents and the sidecars up");
        // The agents answer as the nodes they are.
        for k in [&kubelet_a, &kubelet_b] {
            assert_eq!(k.node_id().await, k.node());
        }

        // ---- RWO: provision, attach on A, write.
        let pv = chain.claim("data", "ReadWriteOnce").await;
        let handle = handle_of(&pv);
        chain.step(&format!(
            "PVC data bound to {} (Volume {handle})",
            pv.name_any()
        ));
        let (max_mountpods, watch) = fixtures::watch_max_mountpods(client.clone(), &handle);

        let pod = chain.run_pod("app", "data", kubelet_a.node()).await;
        chain.wait_attached(&handle, kubelet_a.node()).await;
        chain.step("attached on A (A/D controller → csi-attacher → ticket → MountPod)");
        // Both sidecars timed their calls, as the PodMonitor would scrape them.
        let provisioned = provisioner.timed_ok("/csi.v1.Controller/CreateVolume");
        let published = attacher.timed_ok("/csi.v1.Controller/ControllerPublishVolume");
        assert!(
            provisioned >= 1.0 && published >= 1.0,
            "the sidecars' metrics: CreateVolume {provisioned}, ControllerPublishVolume {published}"
        );
        let on_a = kubelet_a.mount(&pv, &pod).await;
        let sums = write_data(&on_a.target, 0x5eed_0001);
        check_data(&on_a.target, &sums, "A's target path");
        // Through FUSE into the backend.
        check_data(&chain.backend.join(&handle), &sums, "the backend");
        chain.step(&format!(
            "staged and published on A; {} files ({} MiB) written and checked",
            sums.len(),
            BIG >> 20
        ));

        // ---- The pod moves to B: kubelet tears down on A, the pod goes, then B.
        kubelet_a.unmount(&on_a).await;
        chain.delete_pod("app").await;
        chain.wait_detached(&handle, kubelet_a.node()).await;
        chain.step("unpublished/unstaged on A, pod deleted, detached from A");
        assert!(
            fixtures::mountpod_on(&client, &handle, kubelet_b.node())
                .await
                .is_none(),
            "nothing on B before the pod is there"
        );
        let pod = chain.run_pod("app", "data", kubelet_b.node()).await;
        chain.wait_attached(&handle, kubelet_b.node()).await;
        let on_b = kubelet_b.mount(&pv, &pod).await;
        check_data(&on_b.target, &sums, "B's target path after the move");
        chain.step("attached, staged and published on B; data intact by checksum");
        assert_eq!(
            max_mountpods.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the RWO volume never had MountPods on two nodes at once"
        );
        watch.abort();

        // ---- RWX: pods on A and B at the same time.
        let pv2 = chain.claim("shared", "ReadWriteMany").await;
        let handle2 = handle_of(&pv2);
        chain.step(&format!("PVC shared (RWX) bound to {}", pv2.name_any()));
        let pod_a = chain.run_pod("shared-a", "shared", kubelet_a.node()).await;
        let pod_b = chain.run_pod("shared-b", "shared", kubelet_b.node()).await;
        chain.wait_attached(&handle2, kubelet_a.node()).await;
        chain.wait_attached(&handle2, kubelet_b.node()).await;
        let rwx_a = kubelet_a.mount(&pv2, &pod_a).await;
        let rwx_b = kubelet_b.mount(&pv2, &pod_b).await;
        chain.step("RWX attached, staged and published on A and B at once");
        let shared_sums = write_data(&rwx_a.target, 0x5eed_0002);
        // B's FUSE mount may have cached the (empty) directory: bounded retry.
        eventually(
            Duration::from_secs(10),
            "A's files visible via B",
            || async { rwx_b.target.join("big.bin").exists().then_some(()) },
        )
        .await;
        check_data(&rwx_b.target, &shared_sums, "B (written via A)");
        std::fs::write(rwx_b.target.join("from-b.txt"), b"written via B\n").unwrap();
        let from_b = eventually(
            Duration::from_secs(10),
            "B's file visible via A",
            || async { std::fs::read(rwx_a.target.join("from-b.txt")).ok() },
        )
        .await;
        assert_eq!(from_b, b"written via B\n");
        // The RWO volume on B is unaffected by the second volume there.
        check_data(
            &on_b.target,
            &sums,
            "B's RWO target with the RWX volume beside it",
        );
        chain.step("written via A, read via B (and back), checksums equal");

        // ---- Everything goes.
        kubelet_a.unmount(&rwx_a).await;
        kubelet_b.unmount(&rwx_b).await;
        kubelet_b.unmount(&on_b).await;
        for p in ["app", "shared-a", "shared-b"] {
            chain.delete_pod(p).await;
        }
        chain.wait_detached(&handle, kubelet_b.node()).await;
        chain.wait_detached(&handle2, kubelet_a.node()).await;
        chain.wait_detached(&handle2, kubelet_b.node()).await;
        chain.step("all unpublished/unstaged, pods deleted, all detached");
        chain.delete_claims(&["data", "shared"]).await;
        chain.claim_gone(&pv).await;
        chain.claim_gone(&pv2).await;
        // The MountPods (the RemoveData ones last) go with their Volume by garbage
        // collection; their finalizer is the agents', so wait before the agents stop.
        chain.no_mountpods_left().await;
        chain.step("PVCs deleted: PVs, Volumes, MountPods and data directories gone");
    };
    let outcome = std::panic::AssertUnwindSafe(flow).catch_unwind().await;
    if outcome.is_err() {
        let logs = [
            ("controller", env.ctrl.log.clone()),
            ("agent A", agent_a.log.clone()),
            ("agent B", agent_b.log.clone()),
        ];
        chain.diagnostics(&[&provisioner, &attacher], &logs).await;
        kubelet_a.release_all().await;
        kubelet_b.release_all().await;
    }
    chain.teardown(outcome.is_err()).await;
    drop(provisioner);
    drop(attacher);
    drop(kubelet_a);
    drop(kubelet_b);
    drop(env);
    if outcome.is_err() {
        chain.strip_leftovers().await;
    }
    lock.release().await;
    let elapsed = chain.started.elapsed();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    println!(
        "csi_chain: the full chain passed in {:.1}s",
        elapsed.as_secs_f64()
    );
}
