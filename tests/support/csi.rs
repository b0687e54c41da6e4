//! CSI requests as the sidecars send them, for the tests that call Tessera's CSI
//! services over their sockets (tests/csi/, and tests/node/ where a test runs the CSI
//! controller; the sockets and processes come from [`super::env::CsiEnv`]): one
//! definition of the mount capability and of a CreateVolume, with or without a content
//! source (snapshot or volume), and the clients of the controller's and of a node's
//! socket.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use tessera_csi_proto::controller_client::ControllerClient;
use tessera_csi_proto::node_client::NodeClient;
use tessera_csi_proto::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use tessera_csi_proto::volume_content_source::{SnapshotSource, Type, VolumeSource};
use tessera_csi_proto::{
    CapacityRange, ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest,
    CreateSnapshotRequest, CreateVolumeRequest, DeleteVolumeRequest, NodePublishVolumeRequest,
    Volume, VolumeCapability, VolumeContentSource,
};

use super::fixtures::eventually;

/// A single-node-writer mount, what the provisioner asks for a ReadWriteOnce claim.
pub fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// CreateVolume of `name`, `bytes` required, filled from `source` when given.
pub fn create(name: &str, bytes: i64, source: Option<Type>) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
        ..Default::default()
    }
}

/// ControllerPublish of `volume` to `node`, a single-node-writer mount ([`cap`]).
pub fn publish(volume: &str, node: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(cap()),
        ..Default::default()
    }
}

/// ControllerUnpublish of `volume` from `node`.
pub fn unpublish(volume: &str, node: &str) -> ControllerUnpublishVolumeRequest {
    ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

/// NodePublish of `volume` at `target`, a single-node-writer mount ([`cap`]).
pub fn node_publish(volume: &str, target: &Path) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume.into(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap()),
        ..Default::default()
    }
}

/// The content source of a clone of `volume_id`.
pub fn clone_of(volume_id: &str) -> Option<Type> {
    Some(Type::Volume(VolumeSource {
        volume_id: volume_id.into(),
    }))
}

/// The content source of a restore of `snapshot_id`.
pub fn restore_of(snapshot_id: &str) -> Option<Type> {
    Some(Type::Snapshot(SnapshotSource {
        snapshot_id: snapshot_id.into(),
    }))
}

/// CreateSnapshot `name` of `source`.
pub fn snapshot(source: &str, name: &str) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// Send `req`, which must succeed: the volume it made.
pub async fn made(ctrl: &mut ControllerClient<Channel>, req: CreateVolumeRequest) -> Volume {
    let name = req.name.clone();
    ctrl.create_volume(req)
        .await
        .unwrap_or_else(|e| panic!("CreateVolume {name}: {e:?}"))
        .into_inner()
        .volume
        .unwrap()
}

/// DeleteVolume of each of `volumes`, whatever it answers (the end of a test).
pub async fn delete_volumes(ctrl: &mut ControllerClient<Channel>, volumes: &[String]) {
    for volume_id in volumes {
        let req = DeleteVolumeRequest {
            volume_id: volume_id.clone(),
            ..Default::default()
        };
        let _ = ctrl.delete_volume(req).await;
    }
}

/// A client of the CSI controller serving `sock`, once the socket is there (within
/// `wait`).
pub async fn controller(sock: &Path, wait: Duration) -> ControllerClient<Channel> {
    ControllerClient::new(channel(sock, wait, "the CSI socket").await)
}

/// A client of the CSI Node service serving `sock` (a `tessera node`'s), once the
/// socket is there (within `wait`).
pub async fn node(sock: &Path, wait: Duration) -> NodeClient<Channel> {
    NodeClient::new(channel(sock, wait, "the node's CSI socket").await)
}

/// A channel to the gRPC server on the unix socket `sock`, once it answers.
async fn channel(sock: &Path, wait: Duration, what: &str) -> Channel {
    // The socket file exists from the server's bind, a moment before it listens:
    // connect until it answers.
    let endpoint = Endpoint::from_shared(format!("unix://{}", sock.display())).unwrap();
    eventually(wait, what, || {
        let endpoint = endpoint.clone();
        async move { endpoint.connect().await.ok() }
    })
    .await
}
