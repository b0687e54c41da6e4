//! The node side of snapshots, restores and clones (issue 19) against the real
//! control plane, with a real `tessera controller` and `tessera node` and real FUSE
//! mounts (root and /dev/fuse): a `volume-restore` ticket on a Volume with a
//! `dataSource` gets a MountPod of task Populate, and the agent copies the source's
//! directory, written through its live mount, into the volume: same bytes, symlinks
//! as links (never followed), within the volume's size; a populated volume is never
//! filled again. (The whole chain through the sidecars, on real nodes:
//! tests/pods/snapshots.rs.)

use std::time::Duration;

use kube::Api;
use serde_json::json;
use tonic::Code;

use tessera_api::{DataSource, MountPod, MountTask, Volume};
use tessera_csi_proto::*;

use crate::support;
use support::csi::{clone_of, create, delete_volumes, restore_of, snapshot};
use support::env::{AgentEnv as Env, CsiEnv};
use support::fixtures::{self, AgentProcess, eventually};
use support::tree::tree_sums;

const WAIT: Duration = Duration::from_secs(60);

/// A Volume `<id>-<suffix>` of `size` filled from `from`.
async fn filled_volume(e: &Env, suffix: &str, size: &str, from: &str) -> String {
    let name = e.volume_name(suffix);
    let mut v = fixtures::volume_at(&name, &e.id, "ReadWriteOnce", e.backend.path(), true);
    v.spec.size = k8s_openapi::apimachinery::pkg::api::resource::Quantity(size.into());
    v.spec.data_source = Some(DataSource {
        volume: from.into(),
        source: e.backend.path().join(from).display().to_string(),
    });
    e.create_volume(&v).await
}

#[tokio::test]
async fn a_restore_ticket_fills_a_volume_from_a_live_source() {
    let e = Env::new("npop", 1, WAIT).await;
    // The node's agent is registered, as node-driver-registrar does for a real one.
    // Without it the controller takes the node for one without an agent and reports
    // each new ticket's wait at once, so the small volume's ticket could show
    // Attaching before its copy failed (CI saw it; 1 run in 6 here).
    fixtures::create_csinodes(&e.client, &e.id, &e.nodes).await;
    let _nodes = fixtures::NodesGuard(e.nodes.clone());
    let node = e.nodes[0].clone();
    let agent = AgentProcess::start(&e.id, &node);
    let src = e.volume_name("src");
    let v = fixtures::volume_at(&src, &e.id, "ReadWriteOnce", e.backend.path(), true);
    e.create_volume(&v).await;
    e.attach(&src, "manual-a", "manual", &node).await;
    // Written through the live mount (a workload), not synced by the writer.
    let mnt = agent.mountpoint(&src);
    std::fs::create_dir_all(mnt.join("d/e")).unwrap();
    std::fs::write(mnt.join("d/e/f"), b"hello").unwrap();
    std::fs::write(mnt.join("big"), vec![9u8; 2 << 20]).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"not volume data").unwrap();
    std::os::unix::fs::symlink(outside.path(), e.backend.path().join(&src).join("out")).unwrap();
    let want = tree_sums(&e.backend.path().join(&src));

    // The fill: a volume-restore ticket on the new volume, on the node; the source
    // stays attached to its workload meanwhile.
    let dst = filled_volume(&e, "dst", "16Mi", &src).await;
    e.attach(&dst, "restore-src", "volume-restore", &node).await;
    let mp = fixtures::mountpod_on(&e.client, &dst, &node).await.unwrap();
    assert_eq!(mp.spec.task, MountTask::Populate);
    let dst_dir = e.backend.path().join(&dst);
    assert_eq!(tree_sums(&dst_dir), want);
    assert_eq!(
        std::fs::read_link(dst_dir.join("out")).unwrap(),
        outside.path(),
        "a link is copied as a link"
    );
    // Nothing of what the link points to was copied.
    assert!(!tree_sums(&dst_dir).keys().any(|k| k.contains("secret")));
    let events = support::kubectl_output(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        &format!(
            "involvedObject.name={},reason=Populated",
            mp.metadata.name.clone().unwrap()
        ),
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(
        events.contains("2 files") || events.contains("files"),
        "{events:?}"
    );
    e.detach(&dst, "restore-src", &node).await;

    // Populated: a later restore ticket must not replace its data.
    Api::<Volume>::all(e.client.clone())
        .patch(
            &dst,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {"tessera.io/populated": "true"}}}),
            ),
        )
        .await
        .unwrap();
    std::fs::write(dst_dir.join("mine"), b"written since").unwrap();
    fixtures::put_ticket(
        &e.client,
        &dst,
        "restore-again",
        "volume-restore",
        &node,
        json!({}),
    )
    .await;
    let mps: Api<MountPod> = Api::all(e.client.clone());
    let name = tessera_api::mountpod_name(&dst, &node);
    eventually(WAIT, "the second fill refused", || async {
        let mp = mps.get_opt(&name).await.ok()??;
        let st = mp.status?;
        st.conditions
            .iter()
            .any(|c| c.type_ == "DataPopulated" && c.reason == "NothingToPopulate")
            .then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read(dst_dir.join("mine")).unwrap(),
        b"written since"
    );
    fixtures::remove_ticket(&e.client, &dst, "restore-again").await;
    e.mountpod_gone(&dst, &node).await;

    // A volume smaller than the data: the copy stops, the ticket says why.
    let small = filled_volume(&e, "small", "1Mi", &src).await;
    fixtures::put_ticket(
        &e.client,
        &small,
        "restore-src",
        "volume-restore",
        &node,
        json!({}),
    )
    .await;
    let state = e.blocked(&small, "restore-src", "MountFailed").await;
    assert!(state.message.contains("does not fit"), "{}", state.message);
    fixtures::remove_ticket(&e.client, &small, "restore-src").await;
    e.mountpod_gone(&small, &node).await;

    e.detach(&src, "manual-a", &node).await;
    e.cleanup(&[src, dst, small]).await;
}

/// The CSI calls the sidecars make, against the controller's socket with a real
/// agent: CreateSnapshot of an attached volume answers not ready until the copy is
/// done, then ready; the snapshot, a restore of it and a clone hold the same tree; the
/// tickets are gone afterwards (only the workload's is left).
#[tokio::test]
async fn snapshot_restore_and_clone_through_the_csi_controller_with_a_real_agent() {
    let base = CsiEnv::builder("ncsisnap", 1, WAIT)
        .csinodes()
        .agents(1)
        .default_backend_root()
        .start()
        .await;
    let (node, backend) = (base.nodes[0].clone(), &base.backend);
    let (agent, mut ctrl) = (base.agent(), base.csi());

    let src = base
        .made(create(&format!("{}-src", base.id), 64 << 20, None))
        .await;
    base.attach(&src, "manual-a", "manual", &node).await;
    let mnt = agent.mountpoint(&src);
    std::fs::create_dir_all(mnt.join("x/y")).unwrap();
    std::fs::write(mnt.join("x/y/z"), b"snap me").unwrap();
    std::fs::write(mnt.join("data"), vec![3u8; 3 << 20]).unwrap();
    let want = tree_sums(&backend.join(&src));

    let req = snapshot(&src, &format!("{}-snap", base.id));
    let mut calls = 0;
    let snap = eventually(WAIT, "snapshot ready", || {
        calls += 1;
        let (mut ctrl, req) = (ctrl.clone(), req.clone());
        async move {
            let s = ctrl.create_snapshot(req).await.unwrap();
            let s = s.into_inner().snapshot?;
            s.ready_to_use.then_some(s)
        }
    })
    .await;
    println!("snapshot ready after {calls} CreateSnapshot call(s)");
    assert_eq!(
        tree_sums(&backend.join(&snap.snapshot_id)),
        want,
        "snapshot"
    );
    // The snapshot's Volume status is written after its ticket is satisfied, and
    // maybe never for a fill whose ticket is gone at once: a restore must not take a
    // snapshot whose status does not say where it was filled for one without data
    // (CI restored one empty). Its status is cleared, as when that write lags.
    let volumes: Api<Volume> = Api::all(base.client.clone());
    volumes
        .patch_status(
            &snap.snapshot_id,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"lastAttachedNode": null}})),
        )
        .await
        .unwrap();

    let sources = [
        ("restored", restore_of(&snap.snapshot_id)),
        ("cloned", clone_of(&src)),
    ];
    for (name, source) in sources {
        let req = create(&format!("{}-{name}", base.id), 64 << 20, source);
        let v = eventually(WAIT, &format!("{name} created"), || {
            let (mut ctrl, req) = (ctrl.clone(), req.clone());
            async move {
                match ctrl.create_volume(req).await {
                    Ok(r) => r.into_inner().volume,
                    Err(s) if s.code() == Code::Unavailable => None,
                    Err(s) => panic!("{name}: {s:?}"),
                }
            }
        })
        .await;
        let dir = backend.join(&v.volume_id);
        assert!(dir.is_dir(), "{name}: nothing copied to {}", dir.display());
        assert_eq!(tree_sums(&dir), want, "{name}");
    }
    let left: Vec<String> = fixtures::ticket_states(&base.client, &src)
        .await
        .into_keys()
        .collect();
    assert_eq!(left, ["manual-a"]);

    ctrl.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    eventually(WAIT, "the snapshot's Volume and data gone", || async {
        let gone = volumes.get_opt(&snap.snapshot_id).await.unwrap().is_none();
        (gone && !backend.join(&snap.snapshot_id).exists()).then_some(())
    })
    .await;
    base.detach(&src, "manual-a", &node).await;
    let made = ["src", "restored", "cloned"].map(|v| format!("{}-{v}", base.id));
    delete_volumes(&mut ctrl, &made).await;
    base.cleanup_waiting(&[]).await;
}
