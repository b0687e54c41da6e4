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
use tessera_csi_proto::volume_content_source::Type;
use tessera_csi_proto::{
    CapacityRange, CreateVolumeRequest, VolumeCapability, VolumeContentSource,
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
