//! CSI error codes for hostile input (issue 13, "CSI error codes" and the StorageClass
//! part of security item 1), against the running `tessera controller` and `tessera node`
//! on the cluster under test: an invalid volume id is NotFound (never a retryable
//! code), a 2,000-component target path is refused and not created, sizes above
//! `api::MAX_VOLUME_BYTES` are refused on create and on expansion, a StorageClass
//! `backendRoot` outside the allowed roots is INVALID_ARGUMENT, and so is a
//! VolumeAttributesClass with an unknown or immutable key (issue 19), creating and
//! changing nothing.

use std::collections::HashMap;
use std::time::Duration;

use tonic::Code;

use tessera_csi_proto::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use tessera_csi_proto::*;

use crate::support;
use support::env::CsiEnv;

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn create(name: &str, bytes: i64, params: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
        ..Default::default()
    }
}

/// The code of a reply (`Ok` for a success).
fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Result<Code, ()> {
    Ok(r.map(|_| Code::Ok).unwrap_or_else(|s| s.code()))
}

#[tokio::test]
async fn hostile_csi_requests_get_the_right_codes() {
    let env = CsiEnv::builder("csierr", 1, Duration::from_secs(30))
        .agents(1)
        .default_backend_root()
        .start()
        .await;
    let (client, id, node, agent) = (&env.client, &env.id, &env.nodes[0], env.agent());
    let mut ctrl = env.csi();
    let mut nodes = env.node(0).await;
    let mut failures = vec![];
    let mut check = |what: &str, got: Result<Code, ()>, want: &[Code]| {
        let ok = matches!(got, Ok(c) if want.contains(&c));
        println!("{what}: {got:?} (want one of {want:?})");
        if !ok {
            failures.push(format!("{what}: {got:?}, want {want:?}"));
        }
    };

    // Invalid volume ids: never a retryable code.
    let not_found = [Code::NotFound, Code::InvalidArgument];
    for bad in [
        "UPPER/../x",
        "a\u{0}b",
        &"x".repeat(1 << 20),
        "-",
        "a..b%2f",
    ] {
        let shown = &bad[..bad.len().min(12)];
        check(
            &format!("ControllerPublish volume id {shown:?}"),
            code(
                ctrl.controller_publish_volume(ControllerPublishVolumeRequest {
                    volume_id: bad.into(),
                    node_id: node.clone(),
                    volume_capability: Some(cap()),
                    ..Default::default()
                })
                .await,
            ),
            &not_found,
        );
        check(
            &format!("ControllerExpand volume id {shown:?}"),
            code(
                ctrl.controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id: bad.into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: 1 << 30,
                        limit_bytes: 0,
                    }),
                    ..Default::default()
                })
                .await,
            ),
            &not_found,
        );
        check(
            &format!("NodeGetVolumeStats volume id {shown:?}"),
            code(
                nodes
                    .node_get_volume_stats(NodeGetVolumeStatsRequest {
                        volume_id: bad.into(),
                        volume_path: agent.kubelet_dir().join("x").display().to_string(),
                        ..Default::default()
                    })
                    .await,
            ),
            &not_found,
        );
        check(
            &format!("NodePublish volume id {shown:?}"),
            code(
                nodes
                    .node_publish_volume(NodePublishVolumeRequest {
                        volume_id: bad.into(),
                        target_path: agent.kubelet_dir().join("pods/t").display().to_string(),
                        volume_capability: Some(cap()),
                        ..Default::default()
                    })
                    .await,
            ),
            &not_found,
        );
    }

    // Sizes above the API's maximum (1 EiB).
    check(
        "CreateVolume of 2^63-1 bytes",
        code(
            ctrl.create_volume(create(&format!("{id}-huge"), i64::MAX, &[]))
                .await,
        ),
        &[Code::OutOfRange],
    );
    let made = ctrl
        .create_volume(create(&format!("{id}-small"), 1 << 20, &[]))
        .await
        .expect("a 1 MiB volume")
        .into_inner()
        .volume
        .unwrap();
    check(
        "ControllerExpand to 2^63-1 bytes",
        code(
            ctrl.controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: made.volume_id.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: i64::MAX,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await,
        ),
        &[Code::OutOfRange],
    );
    // A StorageClass naming a root the administrator did not allow.
    check(
        "CreateVolume with backendRoot /etc",
        code(
            ctrl.create_volume(create(
                &format!("{id}-etc"),
                1 << 20,
                &[("backendRoot", "/etc")],
            ))
            .await,
        ),
        &[Code::InvalidArgument],
    );

    // A VolumeAttributesClass with a key Tessera does not know, or one that cannot
    // change on a live volume (issue 19, bad input): INVALID_ARGUMENT, nothing
    // created, nothing written.
    let volumes: kube::Api<tessera_api::Volume> = kube::Api::all(client.clone());
    let mut vac_create = create(&format!("{id}-vac"), 1 << 20, &[]);
    vac_create.mutable_parameters = [("colour".to_string(), "blue".to_string())].into();
    check(
        "CreateVolume with VolumeAttributesClass key colour",
        code(ctrl.create_volume(vac_create).await),
        &[Code::InvalidArgument],
    );
    let none = volumes
        .list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|v| {
            v.metadata
                .name
                .as_deref()
                .unwrap_or("")
                .contains(&format!("{id}-vac"))
        })
        .count();
    check(
        "Volumes made by that CreateVolume",
        if none == 0 { Ok(Code::Ok) } else { Err(()) },
        &[Code::Ok],
    );
    // Its spec (the controller may write its status meanwhile).
    let version = |v: tessera_api::Volume| {
        (
            v.metadata.generation,
            serde_json::to_string(&v.spec).unwrap(),
        )
    };
    let before = version(volumes.get(&made.volume_id).await.unwrap());
    for (key, value) in [
        ("colour", "blue"),
        ("backendRoot", "/srv"),
        ("scope", "NodeLocal"),
    ] {
        check(
            &format!("ControllerModifyVolume with {key}={value}"),
            code(
                ctrl.controller_modify_volume(ControllerModifyVolumeRequest {
                    volume_id: made.volume_id.clone(),
                    mutable_parameters: [(key.to_string(), value.to_string())].into(),
                    ..Default::default()
                })
                .await,
            ),
            &[Code::InvalidArgument],
        );
    }
    let after = version(volumes.get(&made.volume_id).await.unwrap());
    check(
        "the Volume after the refused modifies (unchanged)",
        if before == after {
            Ok(Code::Ok)
        } else {
            Err(())
        },
        &[Code::Ok],
    );

    // A 2,000-component target path: refused, nothing created.
    let deep = format!(
        "{}/{}",
        agent.kubelet_dir().join("deep").display(),
        vec!["a"; 2_000].join("/")
    );
    check(
        "NodePublish of a 2,000-component target",
        code(
            nodes
                .node_publish_volume(NodePublishVolumeRequest {
                    volume_id: made.volume_id.clone(),
                    target_path: deep,
                    volume_capability: Some(cap()),
                    ..Default::default()
                })
                .await,
        ),
        &[Code::InvalidArgument],
    );
    assert!(
        !agent.kubelet_dir().join("deep").exists(),
        "the deep target path was created"
    );

    let _ = ctrl
        .delete_volume(DeleteVolumeRequest {
            volume_id: made.volume_id,
            ..Default::default()
        })
        .await;
    assert!(failures.is_empty(), "{failures:#?}");
}
