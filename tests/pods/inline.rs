//! CSI ephemeral inline volumes on real Pods (issue 19): a Pod that declares a
//! Tessera volume inline gets a node-local Volume of its own through the same ticket
//! and MountPod path, and nothing of it stays once the Pod is gone; bad attributes
//! are refused on the Pod's events, with nothing created.
//!
//! ```text
//!  Pod (inline csi volume, size 64Mi) on A ─(kubelet: NodePublish, ephemeral)─▶
//!    Volume inline-<hash(uid, name)> NodeLocal on A ─▶ csi-ephemeral ticket ─▶ MountPod
//!    ─▶ bind ─▶ the Pod writes
//!  Pod deleted ─(NodeUnpublish)─▶ ticket and Volume removed ─▶ cleanup ─▶ data gone
//!  Pod with an unknown key / too large a size / a root not allowed ─▶ FailedMount
//!    events carrying the INVALID_ARGUMENT message; no Volume
//! ```

use k8s_openapi::api::core::v1::Event;

use tessera_api::LABEL_INLINE;
use tessera_api::inline_volume_name;
use tessera_api::{self as api, AttacherType, MountPod, VolumeAttachment as Tickets};

use super::*;

/// A busybox Pod on `node` running `script` with an inline Tessera volume `scratch`
/// of `attributes` at /data; its uid.
async fn inline_pod(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    attributes: serde_json::Value,
    script: &str,
) -> String {
    let volume = json!({"name": "scratch", "csi": {
        "driver": api::CSI_DRIVER_NAME,
        "volumeAttributes": attributes,
    }});
    app_pod(client, ns, name, Some(node), BUSYBOX, script, volume)
        .await
        .uid()
        .expect("a uid")
}

/// The inline Volumes that exist (by label).
async fn inline_volumes(client: &Client) -> Vec<String> {
    Api::<Volume>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{LABEL_INLINE}=true")))
        .await
        .unwrap()
        .items
        .iter()
        .map(|v| v.name_any())
        .collect()
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn an_inline_volume_lives_and_goes_with_its_pod() {
    let client = support::client().await;
    let nodes = Nodes::load();
    let a = nodes.names()[0].clone();
    let ns = namespace(&client, "pods-inline").await;
    let started = Instant::now();
    let uid = inline_pod(
        &client,
        &ns,
        "scratchy",
        &a,
        json!({"size": "64Mi", "backendRoot": "/mnt/shared/tessera"}),
        "echo hello > /data/greeting && df -kP /data | tail -1 > /data/df && sleep 3600",
    )
    .await;
    wait_phase(&client, &ns, "scratchy", "Running").await;
    let running = started.elapsed();
    let name = inline_volume_name(&uid, "scratch");
    let volume = Api::<Volume>::all(client.clone()).get(&name).await.unwrap();
    assert_eq!(volume.spec.size.0, "64Mi");
    assert_eq!(volume.spec.backend.node.as_deref(), Some(a.as_str()));
    assert_eq!(volume.spec.backend.root, "/mnt/shared/tessera");
    let data = backend_dir(&nodes, &volume);
    let written = eventually(WAIT, "the Pod's writes in the backend", || async {
        let greeting = std::fs::read_to_string(data.join("greeting")).ok()?;
        let df = std::fs::read_to_string(data.join("df")).ok()?;
        Some((greeting, df))
    })
    .await;
    assert_eq!(written.0, "hello\n");
    // df -kP: …, 1K-blocks, used, available, use%, mount point: the quota of 64Mi
    // is what the Pod sees.
    let fields: Vec<&str> = written.1.split_whitespace().collect();
    let blocks: u64 = fields[fields.len().saturating_sub(5)].parse().unwrap();
    assert_eq!(blocks, 64 * 1024, "df in the Pod: {}", written.1);
    let va: Tickets = Api::all(client.clone()).get(&name).await.unwrap();
    let tickets: Vec<(AttacherType, String, bool)> = va
        .spec
        .attachment_tickets
        .values()
        .map(|t| (t.type_, t.node_id.clone(), va.ticket_satisfied(&t.id)))
        .collect();
    assert_eq!(tickets, [(AttacherType::CsiEphemeral, a.clone(), true)]);
    let mp: MountPod = Api::all(client.clone())
        .get(&api::mountpod_name(&name, &a))
        .await
        .unwrap();
    assert_eq!(mp.spec.references.len(), 1, "{:?}", mp.spec.references);
    assert_eq!(mp.spec.references[0].owner, format!("pod/{uid}"));

    let deleted = Instant::now();
    delete_pod(&client, &ns, "scratchy").await;
    eventually(WAIT, "Volume, tickets, MountPod and data gone", || async {
        let vol = Api::<Volume>::all(client.clone())
            .get_opt(&name)
            .await
            .ok()?;
        let va = Api::<Tickets>::all(client.clone())
            .get_opt(&name)
            .await
            .ok()?;
        let mp = Api::<MountPod>::all(client.clone())
            .get_opt(&api::mountpod_name(&name, &a))
            .await
            .ok()?;
        (vol.is_none() && va.is_none() && mp.is_none() && !data.exists()).then_some(())
    })
    .await;
    let gone = deleted.elapsed();
    assert!(!inline_volumes(&client).await.contains(&name));
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES inline volume: Pod Running {:.1} s after it was created; its Volume, ticket, MountPod and data gone {:.1} s after the Pod was deleted",
        running.as_secs_f64(),
        gone.as_secs_f64()
    );
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn bad_inline_attributes_are_refused_on_the_pods_events() {
    let client = support::client().await;
    let nodes = Nodes::load();
    let a = nodes.names()[0].clone();
    let ns = namespace(&client, "pods-inline-bad").await;
    let cases = [
        (
            "unknown",
            json!({"colour": "blue"}),
            "key \"colour\" is not known",
        ),
        (
            "huge",
            json!({"size": "100Gi"}),
            "above the largest inline volume",
        ),
        ("outside", json!({"backendRoot": "/etc"}), "backendRoot"),
    ];
    let mut uids = vec![];
    for (name, attributes, _) in &cases {
        uids.push(inline_pod(&client, &ns, name, &a, attributes.clone(), "true").await);
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    for (name, _, want) in &cases {
        let message = eventually(WAIT, &format!("a FailedMount event on {name}"), || async {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                .await
                .ok()?;
            list.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("FailedMount"))
                .filter_map(|e| e.message)
                .find(|m| m.contains("InvalidArgument"))
        })
        .await;
        println!("{name}: {message}");
        assert!(message.contains(want), "{name}: {message}");
        assert_eq!(
            pod_phase(&client, &ns, name).await.as_deref(),
            Some("Pending")
        );
    }
    let names: Vec<String> = uids
        .iter()
        .map(|uid| inline_volume_name(uid, "scratch"))
        .collect();
    let existing = inline_volumes(&client).await;
    assert!(
        names.iter().all(|n| !existing.contains(n)),
        "nothing created: {existing:?}"
    );
    for (name, _, _) in &cases {
        delete_pod(&client, &ns, name).await;
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}

/// A generic ephemeral volume (`ephemeral.volumeClaimTemplate`): the ephemeral-volume
/// controller makes the Pod's claim `<pod>-<volume>`, owned by the Pod; the claim
/// goes through the normal provisioning and ticket path, and goes with the Pod (the
/// garbage collector), its PV and data with it (reclaimPolicy Delete).
#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn a_generic_ephemeral_volume_lives_and_goes_with_its_pod() {
    let client = support::client().await;
    let nodes = Nodes::load();
    let a = nodes.names()[0].clone();
    let ns = namespace(&client, "pods-ephemeral").await;
    let started = Instant::now();
    let volume = json!({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "tessera-shared",
        "resources": {"requests": {"storage": "64Mi"}},
    }}}});
    app_pod(
        &client,
        &ns,
        "eph",
        Some(&a),
        BUSYBOX,
        "echo hello > /data/greeting && sleep 3600",
        volume,
    )
    .await;
    wait_phase(&client, &ns, "eph", "Running").await;
    let running = started.elapsed();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim = claims.get("eph-scratch").await.expect("the Pod's claim");
    let owner = claim.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owner.iter().any(|o| o.kind == "Pod" && o.name == "eph"),
        "the claim is owned by its Pod: {owner:?}"
    );
    let pv = claim.spec.and_then(|s| s.volume_name).expect("bound");
    let volume = tessera_volume(&client, &pv).await;
    let data = backend_dir(&nodes, &volume);
    eventually(WAIT, "the Pod's write in the backend", || async {
        (std::fs::read_to_string(data.join("greeting")).ok()? == "hello\n").then_some(())
    })
    .await;

    let deleted = Instant::now();
    delete_pod(&client, &ns, "eph").await;
    eventually(WAIT, "claim, PV, Volume and data gone", || async {
        let claim = claims.get_opt("eph-scratch").await.ok()?;
        let pv = Api::<PersistentVolume>::all(client.clone())
            .get_opt(&pv)
            .await
            .ok()?;
        let vol = Api::<Volume>::all(client.clone())
            .get_opt(&volume.name_any())
            .await
            .ok()?;
        (claim.is_none() && pv.is_none() && vol.is_none() && !data.exists()).then_some(())
    })
    .await;
    let gone = deleted.elapsed();
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES generic ephemeral volume: Pod Running {:.1} s after it was created; claim, PV, Volume and data gone {:.1} s after the Pod was deleted",
        running.as_secs_f64(),
        gone.as_secs_f64()
    );
}
