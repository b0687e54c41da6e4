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

use tessera_csi_proto::*;

use crate::support;
use support::csi::{node_publish, publish};
use support::env::CsiEnv;

/// CreateVolume of `name`, `bytes`, with the StorageClass `params`.
fn create(name: &str, bytes: i64, params: &[(&str, &str)]) -> CreateVolumeRequest {
    let mut req = support::csi::create(name, bytes, None);
    req.parameters = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<HashMap<_, _>>();
    req
}

fn expand(volume: &str, bytes: i64) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: volume.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

fn modify(volume: &str, key: &str, value: &str) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: volume.into(),
        mutable_parameters: [(key.to_string(), value.to_string())].into(),
        ..Default::default()
    }
}

fn stats(volume: &str, path: &std::path::Path) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: volume.into(),
        volume_path: path.display().to_string(),
        ..Default::default()
    }
}

/// The code of a reply (`Ok` for a success).
fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Result<Code, ()> {
    Ok(r.map(|_| Code::Ok).unwrap_or_else(|s| s.code()))
}

/// What a refused modify must leave as it was: the Volume's spec (the controller may
/// write its status meanwhile).
fn version(v: tessera_api::Volume) -> (Option<i64>, String) {
    let spec = serde_json::to_string(&v.spec).unwrap();
    (v.metadata.generation, spec)
}

/// A fact checked beside the codes: `Ok` when it holds.
fn holds(fact: bool) -> Result<Code, ()> {
    if fact { Ok(Code::Ok) } else { Err(()) }
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
    let under_kubelet = |path: &str| agent.kubelet_dir().join(path);
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
        let bad_id = |call: &str| format!("{call} volume id {shown:?}");
        let got = code(ctrl.controller_publish_volume(publish(bad, node)).await);
        check(&bad_id("ControllerPublish"), got, &not_found);
        let got = code(ctrl.controller_expand_volume(expand(bad, 1 << 30)).await);
        check(&bad_id("ControllerExpand"), got, &not_found);
        let req = stats(bad, &under_kubelet("x"));
        let got = code(nodes.node_get_volume_stats(req).await);
        check(&bad_id("NodeGetVolumeStats"), got, &not_found);
        let req = node_publish(bad, &under_kubelet("pods/t"));
        let got = code(nodes.node_publish_volume(req).await);
        check(&bad_id("NodePublish"), got, &not_found);
    }

    // Sizes above the API's maximum (1 EiB).
    let (out_of_range, invalid) = ([Code::OutOfRange], [Code::InvalidArgument]);
    let req = create(&format!("{id}-huge"), i64::MAX, &[]);
    let got = code(ctrl.create_volume(req).await);
    check("CreateVolume of 2^63-1 bytes", got, &out_of_range);
    let req = create(&format!("{id}-small"), 1 << 20, &[]);
    let made = ctrl.create_volume(req).await.expect("a 1 MiB volume");
    let made = made.into_inner().volume.unwrap();
    let req = expand(&made.volume_id, i64::MAX);
    let got = code(ctrl.controller_expand_volume(req).await);
    check("ControllerExpand to 2^63-1 bytes", got, &out_of_range);
    // A StorageClass naming a root the administrator did not allow.
    let req = create(&format!("{id}-etc"), 1 << 20, &[("backendRoot", "/etc")]);
    let got = code(ctrl.create_volume(req).await);
    check("CreateVolume with backendRoot /etc", got, &invalid);

    // A VolumeAttributesClass with a key Tessera does not know, or one that cannot
    // change on a live volume (issue 19, bad input): INVALID_ARGUMENT, nothing
    // created, nothing written.
    let volumes: kube::Api<tessera_api::Volume> = kube::Api::all(client.clone());
    let mut vac_create = create(&format!("{id}-vac"), 1 << 20, &[]);
    vac_create.mutable_parameters = [("colour".to_string(), "blue".to_string())].into();
    let got = code(ctrl.create_volume(vac_create).await);
    check(
        "CreateVolume with VolumeAttributesClass key colour",
        got,
        &invalid,
    );
    let listed = volumes.list(&Default::default()).await.unwrap().items;
    let vac_made = listed.iter().filter(|v| {
        let name = v.metadata.name.as_deref().unwrap_or("");
        name.contains(&format!("{id}-vac"))
    });
    let got = holds(vac_made.count() == 0);
    check("Volumes made by that CreateVolume", got, &[Code::Ok]);
    let before = version(volumes.get(&made.volume_id).await.unwrap());
    for (key, value) in [
        ("colour", "blue"),
        ("backendRoot", "/srv"),
        ("scope", "NodeLocal"),
    ] {
        let req = modify(&made.volume_id, key, value);
        let got = code(ctrl.controller_modify_volume(req).await);
        check(
            &format!("ControllerModifyVolume with {key}={value}"),
            got,
            &invalid,
        );
    }
    let after = version(volumes.get(&made.volume_id).await.unwrap());
    let what = "the Volume after the refused modifies (unchanged)";
    check(what, holds(before == after), &[Code::Ok]);

    // A 2,000-component target path: refused, nothing created.
    let deep = under_kubelet("deep").join(vec!["a"; 2_000].join("/"));
    let req = node_publish(&made.volume_id, &deep);
    let got = code(nodes.node_publish_volume(req).await);
    check("NodePublish of a 2,000-component target", got, &invalid);
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
