//! The chain test's stand-in for the kubelet of a node (Node CSI calls over the
//! agent's socket, with kubelet's paths and `Node.status.volumesInUse`), and the data
//! it writes through a volume and checks on another node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment as StorageVolumeAttachment;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};
use tonic::transport::{Channel, Endpoint};

use tessera_api::CSI_DRIVER_NAME;
use tessera_csi::csi_ticket_id;
use tessera_csi_proto::node_client::NodeClient;
use tessera_csi_proto::node_service_capability;
use tessera_csi_proto::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use tessera_csi_proto::{
    NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};

use super::BIG;
use crate::support;
use support::fixtures::{self, AgentProcess, eventually};

// ---------------------------------------------------------------------------------
// The test's kubelet.

/// What kubelet knows of one published volume of one pod.
#[derive(Clone)]
pub(super) struct Mounted {
    volume_id: String,
    staging: PathBuf,
    pub(super) target: PathBuf,
    /// Whether NodeStage was called (the driver offers STAGE_UNSTAGE_VOLUME).
    staged: bool,
}

/// Plays kubelet for one node: Node CSI calls over the agent's socket, with kubelet's
/// paths, contexts and capabilities, and `Node.status.volumesInUse` kept as kubelet
/// keeps it.
pub(super) struct Kubelet<'a> {
    client: Client,
    agent: &'a AgentProcess,
    in_use: Mutex<BTreeSet<String>>,
    /// What is staged (and maybe published), for the teardown after a failure.
    mounted: Mutex<Vec<Mounted>>,
}

impl<'a> Kubelet<'a> {
    pub(super) fn new(client: Client, agent: &'a AgentProcess) -> Self {
        Kubelet {
            client,
            agent,
            in_use: Mutex::default(),
            mounted: Mutex::default(),
        }
    }

    pub(super) fn node(&self) -> &str {
        &self.agent.node
    }

    pub(super) async fn connect(&self) -> NodeClient<Channel> {
        // The socket file exists from the agent's bind, a moment before it listens:
        // connect until it answers.
        let sock = self.agent.csi_socket();
        let endpoint = Endpoint::from_shared(format!("unix://{}", sock.display())).unwrap();
        let channel = eventually(Duration::from_secs(10), "the agent's CSI socket", || {
            let endpoint = endpoint.clone();
            async move { endpoint.connect().await.ok() }
        })
        .await;
        NodeClient::new(channel)
    }

    /// The node id the agent answers NodeGetInfo with.
    pub(super) async fn node_id(&self) -> String {
        let mut node = self.connect().await;
        let info = node.node_get_info(NodeGetInfoRequest {}).await.unwrap();
        info.into_inner().node_id
    }

    /// Report (or stop reporting) the volume in `Node.status.volumesInUse`.
    pub(super) async fn set_in_use(&self, handle: &str, used: bool) {
        let name = format!("kubernetes.io/csi/{CSI_DRIVER_NAME}^{handle}");
        let list: Vec<String> = {
            let mut set = self.in_use.lock().unwrap();
            if used {
                set.insert(name);
            } else {
                set.remove(&name);
            }
            set.iter().cloned().collect()
        };
        Api::<Node>::all(self.client.clone())
            .patch_status(
                self.node(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"volumesInUse": list}})),
            )
            .await
            .unwrap_or_else(|e| panic!("updating volumesInUse of {}: {e}", self.node()));
    }

    /// MountDevice + SetUp of `pv` for `pod`, as kubelet's csi plugin does them.
    pub(super) async fn mount(&self, pv: &PersistentVolume, pod: &Pod) -> Mounted {
        let spec = pv.spec.as_ref().unwrap();
        let csi = spec.csi.as_ref().expect("a CSI PV");
        let handle = csi.volume_handle.clone();
        let mode = match spec.access_modes.as_deref().unwrap_or_default() {
            m if m.iter().any(|m| m == "ReadWriteMany") => access_mode::Mode::MultiNodeMultiWriter,
            m if m.iter().any(|m| m == "ReadOnlyMany") => access_mode::Mode::MultiNodeReaderOnly,
            m if m.iter().any(|m| m == "ReadWriteOncePod") => {
                access_mode::Mode::SingleNodeSingleWriter
            }
            _ => access_mode::Mode::SingleNodeWriter,
        };
        let capability = VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: csi.fs_type.clone().unwrap_or_default(),
                mount_flags: spec.mount_options.clone().unwrap_or_default(),
                volume_mount_group: String::new(),
            })),
        };
        let volume_attributes: std::collections::HashMap<String, String> = csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        // publish_context: the storage VolumeAttachment's attachment metadata.
        let va_name = csi_ticket_id(&handle, self.node());
        let va = Api::<StorageVolumeAttachment>::all(self.client.clone())
            .get(&va_name)
            .await
            .unwrap_or_else(|e| panic!("reading VolumeAttachment {va_name}: {e}"));
        let publish_context: std::collections::HashMap<String, String> = va
            .status
            .and_then(|s| s.attachment_metadata)
            .unwrap_or_default()
            .into_iter()
            .collect();
        assert!(
            publish_context.contains_key("tessera.io/mountpod"),
            "ControllerPublish's publish_context reaches the VolumeAttachment: {publish_context:?}"
        );

        let kubelet = self.agent.kubelet_dir();
        let staging = kubelet
            .join("plugins/kubernetes.io/csi")
            .join(CSI_DRIVER_NAME)
            .join(hex::encode(Sha256::digest(handle.as_bytes())))
            .join("globalmount");
        let uid = pod.uid().unwrap();
        let target = kubelet
            .join("pods")
            .join(&uid)
            .join("volumes/kubernetes.io~csi")
            .join(pv.name_any())
            .join("mount");
        // kubelet creates the parents of both paths (and the vol_data.json beside them).
        std::fs::create_dir_all(staging.parent().unwrap()).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();

        self.set_in_use(&handle, true).await;
        let mut node = self.connect().await;
        // As kubelet does: stage only a driver that offers STAGE_UNSTAGE_VOLUME, and
        // then pass the staging path to publish; otherwise an empty one.
        let stages = stages(&mut node).await;
        if stages {
            let stage = NodeStageVolumeRequest {
                volume_id: handle.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(capability.clone()),
                secrets: Default::default(),
                volume_context: volume_attributes.clone(),
            };
            node.node_stage_volume(stage)
                .await
                .unwrap_or_else(|e| panic!("NodeStageVolume of {handle} on {}: {e}", self.node()));
        }
        let mounted = Mounted {
            volume_id: handle.clone(),
            staging: staging.clone(),
            target: target.clone(),
            staged: stages,
        };
        self.mounted.lock().unwrap().push(mounted.clone());

        let mut pod_volume_context = volume_attributes;
        let meta = &pod.metadata;
        for (k, v) in [
            ("csi.storage.k8s.io/pod.name", meta.name.clone()),
            ("csi.storage.k8s.io/pod.namespace", meta.namespace.clone()),
            ("csi.storage.k8s.io/pod.uid", meta.uid.clone()),
            (
                "csi.storage.k8s.io/serviceAccount.name",
                Some("default".to_string()),
            ),
            ("csi.storage.k8s.io/ephemeral", Some("false".to_string())),
        ] {
            pod_volume_context.insert(k.to_string(), v.unwrap_or_default());
        }
        let publish = NodePublishVolumeRequest {
            volume_id: handle.clone(),
            publish_context,
            staging_target_path: if stages {
                staging.display().to_string()
            } else {
                String::new()
            },
            target_path: target.display().to_string(),
            volume_capability: Some(capability),
            readonly: false,
            secrets: Default::default(),
            volume_context: pod_volume_context,
        };
        node.node_publish_volume(publish)
            .await
            .unwrap_or_else(|e| panic!("NodePublishVolume of {handle} on {}: {e}", self.node()));
        mounted
    }

    /// TearDown + UnmountDevice.
    pub(super) async fn unmount(&self, m: &Mounted) {
        if let Err(e) = self.try_unmount(m).await {
            panic!("{e}");
        }
        assert!(!m.target.exists(), "NodeUnpublish removes the target path");
        assert!(
            fixtures::mounts_at(&m.staging).is_empty(),
            "nothing mounted at {} after NodeUnstage",
            m.staging.display()
        );
    }

    pub(super) async fn try_unmount(&self, m: &Mounted) -> Result<(), String> {
        let failed = |call: &str, e: tonic::Status| {
            format!("{call} of {} on {}: {e}", m.volume_id, self.node())
        };
        let mut node = self.connect().await;
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: m.volume_id.clone(),
            target_path: m.target.display().to_string(),
        })
        .await
        .map_err(|e| failed("NodeUnpublishVolume", e))?;
        if m.staged {
            node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: m.volume_id.clone(),
                staging_target_path: m.staging.display().to_string(),
            })
            .await
            .map_err(|e| failed("NodeUnstageVolume", e))?;
        }
        self.mounted
            .lock()
            .unwrap()
            .retain(|x| x.target != m.target);
        self.set_in_use(&m.volume_id, false).await;
        Ok(())
    }

    /// After a failure: tear down whatever is still staged, best effort, so the
    /// volumes can detach and be deleted.
    pub(super) async fn release_all(&self) {
        let left = self.mounted.lock().unwrap().clone();
        for m in left {
            if let Err(e) = self.try_unmount(&m).await {
                eprintln!("teardown: {e}");
            }
        }
    }
}

/// Whether the node plugin offers STAGE_UNSTAGE_VOLUME (kubelet asks the same).
async fn stages(node: &mut NodeClient<Channel>) -> bool {
    let caps = node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .expect("NodeGetCapabilities")
        .into_inner();
    caps.capabilities.iter().any(|c| {
        matches!(
            &c.r#type,
            Some(node_service_capability::Type::Rpc(r))
                if r.r#type == node_service_capability::rpc::Type::StageUnstageVolume as i32
        )
    })
}

// ---------------------------------------------------------------------------------
// Data.

/// `len` pseudo-random bytes (xorshift64*, seeded).
fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn sha256_file(path: &Path) -> String {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    hex::encode(Sha256::digest(&data))
}

/// Write a big pseudo-random file and a few small ones under `root`; their checksums
/// by relative path.
pub(super) fn write_data(root: &Path, seed: u64) -> BTreeMap<String, String> {
    let mut sums = BTreeMap::new();
    let big = pseudo_random(seed, BIG);
    std::fs::write(root.join("big.bin"), &big).unwrap();
    sums.insert("big.bin".to_string(), hex::encode(Sha256::digest(&big)));
    std::fs::create_dir_all(root.join("dir/sub")).unwrap();
    for i in 0..5u64 {
        let rel = if i % 2 == 0 {
            format!("dir/file-{i}.txt")
        } else {
            format!("dir/sub/file-{i}.bin")
        };
        let data = pseudo_random(seed ^ ((i + 1) * 7919), 1000 + 3000 * i as usize);
        std::fs::write(root.join(&rel), &data).unwrap();
        sums.insert(rel, hex::encode(Sha256::digest(&data)));
    }
    sums
}

pub(super) fn check_data(root: &Path, sums: &BTreeMap<String, String>, via: &str) {
    for (rel, sum) in sums {
        assert_eq!(
            &sha256_file(&root.join(rel)),
            sum,
            "sha256 of {rel} read via {via} ({})",
            root.display()
        );
    }
}
