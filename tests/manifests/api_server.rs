//! The API as the API server sees it: the CRDs install, examples/ is valid, every
//! manifest in tests/invalid/ is rejected with its message, immutable fields stay put,
//! `kubectl get` shows the printer columns, and status writes leave spec alone.
//!
//! Runs against the local control plane from tests/harness, or the cluster in KUBECONFIG.

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use tessera_api::{MountPod, Volume, VolumeAttachment};

use crate::support;

async fn setup() -> Client {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    client
}

fn volume_manifest(name: &str, size: &str, mode: &str) -> Volume {
    serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
        "metadata": {"name": name},
        "spec": {"size": size, "accessMode": mode, "backend": {"root": "/var/lib/tessera/volumes"}}
    }))
    .unwrap()
}

#[tokio::test]
async fn examples_pass_server_side_dry_run() {
    let client = setup().await;
    // examples/snapshot.yaml: VolumeSnapshots need the snapshot add-on's CRDs.
    support::ensure_snapshot_crds(&client).await;
    let files = support::yaml_files(&support::repo_root().join("examples"));
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for obj in support::parse_documents::<DynamicObject>(&text) {
            let (api, _, _) = support::dynamic_api(&client, &obj).await;
            let name = obj.metadata.name.clone().unwrap();
            let params = PatchParams::apply("tessera-tests").dry_run();
            api.patch(&name, &params, &Patch::Apply(&obj))
                .await
                .unwrap_or_else(|e| panic!("{}: {name} rejected: {e}", file.display()));
        }
    }
}

#[tokio::test]
async fn invalid_manifests_are_rejected_with_their_message() {
    let client = setup().await;
    let files = support::yaml_files(&support::repo_root().join("tests/invalid"));
    assert!(
        files.len() >= 10,
        "expected the invalid manifests in tests/invalid"
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expected: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .collect();
        assert!(
            !expected.is_empty(),
            "{}: no `# expect:` line",
            file.display()
        );
        let obj: DynamicObject = support::parse_documents(&text).remove(0);
        let (api, _, _) = support::dynamic_api(&client, &obj).await;
        let err = api
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &obj,
            )
            .await
            .err()
            .unwrap_or_else(|| panic!("{}: accepted, but must be rejected", file.display()));
        let message = match &err {
            kube::Error::Api(status) => status.message.clone(),
            other => panic!("{}: unexpected error {other}", file.display()),
        };
        for want in expected {
            assert!(
                message.contains(want),
                "{}: message {message:?} lacks {want:?}",
                file.display()
            );
        }
    }
}

/// Apply `patch` (a JSON merge patch) and return the API server's message.
async fn rejected<K>(api: &Api<K>, name: &str, patch: serde_json::Value) -> String
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => panic!("patch {patch} on {name} was accepted, but must be rejected"),
        Err(kube::Error::Api(status)) => status.message,
        Err(other) => panic!("unexpected error {other}"),
    }
}

/// One VolumeAttachment holds at most `MAX_TICKETS` tickets (the CRD's
/// `maxProperties`), and the API server's refusal of one more is the one the CSI
/// driver tells apart (RESOURCE_EXHAUSTED, saying so, not INVALID_ARGUMENT).
#[tokio::test]
async fn a_volume_attachment_holds_at_most_max_tickets_and_the_csi_driver_knows_the_refusal() {
    use tessera_api::MAX_TICKETS;
    use tessera_runtime::KubeContext;
    let client = setup().await;
    let name = support::unique_name("most");
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let ticket = |i: usize| {
        let id = format!("manual-{i:04}");
        (
            id.clone(),
            json!({"id": id, "type": "manual", "nodeID": format!("worker-{i:04}")}),
        )
    };
    let tickets: serde_json::Map<_, _> = (0..MAX_TICKETS).map(ticket).collect();
    let va: VolumeAttachment = serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
        "metadata": {"name": name},
        "spec": {"volume": name, "attachmentTickets": tickets}
    }))
    .unwrap();
    let made = attachments
        .create(&PostParams::default(), &va)
        .await
        .expect("MAX_TICKETS tickets fit");
    assert!(!made.has_room_for("manual-new", None));
    let (id, one_more) = ticket(MAX_TICKETS);
    let refusal = attachments
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"attachmentTickets": {id: one_more}}})),
        )
        .await
        .context(|| "adding one ticket more".into())
        .expect_err("one ticket more than MAX_TICKETS must be refused");
    assert!(
        tessera_csi::controller::error::too_many_tickets(&refusal),
        "the CSI driver does not know this refusal: {:?}",
        refusal.source
    );
    // Any other refusal of a ticket is not taken for it.
    let bad = attachments
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"attachmentTickets": {"manual-0000": {"nodeID": "Not A Node"}}}}),
            ),
        )
        .await
        .context(|| "a bad node name".into())
        .expect_err("an invalid node name must be refused");
    assert!(!tessera_csi::controller::error::too_many_tickets(&bad));
    attachments
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn immutable_fields_cannot_change() {
    let client = setup().await;
    let name = support::unique_name("immutable");
    let volumes: Api<Volume> = Api::all(client.clone());
    volumes
        .create(
            &PostParams::default(),
            &volume_manifest(&name, "1Gi", "ReadWriteOnce"),
        )
        .await
        .unwrap();

    let msg = rejected(
        &volumes,
        &name,
        json!({"spec": {"accessMode": "ReadWriteMany"}}),
    )
    .await;
    assert!(msg.contains("accessMode is immutable"), "{msg}");
    let msg = rejected(&volumes, &name, json!({"spec": {"size": "512Mi"}})).await;
    assert!(msg.contains("size may grow but never shrink"), "{msg}");
    let msg = rejected(
        &volumes,
        &name,
        json!({"spec": {"backend": {"root": "/elsewhere"}}}),
    )
    .await;
    assert!(msg.contains("backend.root is immutable"), "{msg}");
    // Growing is allowed.
    volumes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": "2Gi"}})),
        )
        .await
        .unwrap();

    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
        "metadata": {"name": name}, "spec": {"volume": name}
    }))
    .unwrap();
    attachments
        .create(&PostParams::default(), &va)
        .await
        .unwrap();
    let msg = rejected(&attachments, &name, json!({"spec": {"volume": "other"}})).await;
    assert!(msg.contains("spec.volume is immutable"), "{msg}");

    let mountpods: Api<MountPod> = Api::all(client.clone());
    let mp: MountPod = serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
        "metadata": {"name": name},
        "spec": {"volume": name, "nodeName": "worker-1", "source": "/var/lib/tessera/volumes/x", "capacityBytes": 1024}
    }))
    .unwrap();
    mountpods.create(&PostParams::default(), &mp).await.unwrap();
    let msg = rejected(&mountpods, &name, json!({"spec": {"nodeName": "worker-2"}})).await;
    assert!(msg.contains("spec.nodeName is immutable"), "{msg}");
    let msg = rejected(&mountpods, &name, json!({"spec": {"volume": "other"}})).await;
    assert!(msg.contains("spec.volume is immutable"), "{msg}");

    let dp = DeleteParams::default();
    mountpods.delete(&name, &dp).await.unwrap();
    attachments.delete(&name, &dp).await.unwrap();
    volumes.delete(&name, &dp).await.unwrap();
}

#[tokio::test]
async fn status_writes_do_not_touch_spec_and_kubectl_shows_the_columns() {
    let client = setup().await;
    let name = support::unique_name("columns");
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let va: VolumeAttachment = serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
        "metadata": {"name": name},
        "spec": {"volume": name, "attachmentTickets": {
            "manual-a": {"id": "manual-a", "type": "manual", "nodeID": "worker-1"}}}
    }))
    .unwrap();
    attachments
        .create(&PostParams::default(), &va)
        .await
        .unwrap();

    // A status patch that also tries to change spec: only status may change.
    let patch = json!({
        "spec": {"attachmentTickets": {"manual-a": {"nodeID": "worker-9"}}},
        "status": {
            "attachmentTicketStatuses": {"manual-a": {"id": "manual-a", "satisfied": true, "generation": 0}},
            "ticketCount": 1, "satisfiedCount": 1, "nodes": ["worker-1", "worker-2"],
            "nodeList": "worker-1,worker-2",
            "conditions": [{"type": "Ready", "status": "True", "reason": "TicketsSatisfied",
                "message": "all 1 tickets satisfied", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }
    });
    attachments
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let got = attachments.get(&name).await.unwrap();
    assert_eq!(
        got.spec.attachment_tickets["manual-a"].node_id, "worker-1",
        "status write changed spec"
    );
    let status = got.status.expect("status written");
    assert!(status.attachment_ticket_statuses["manual-a"].satisfied);
    assert_eq!(status.satisfied_count, 1);

    let text = support::kubectl_output(&["get", "volumeattachments.tessera.io", &name]);
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "TICKETS",
            "SATISFIED",
            "READY",
            "NODES",
            "WAITING",
            "AGE"
        ],
        "{text}"
    );
    // No column repeats the name; the nodes are a plain list, not JSON.
    let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..5],
        [name.as_str(), "1", "1", "True", "worker-1,worker-2"],
        "{text}"
    );

    // The other two kinds, each with one object so kubectl prints a table.
    let volumes: Api<Volume> = Api::all(client.clone());
    volumes
        .create(
            &PostParams::default(),
            &volume_manifest(&name, "1Gi", "ReadWriteMany"),
        )
        .await
        .unwrap();
    let mountpods: Api<MountPod> = Api::all(client.clone());
    let mp: MountPod = serde_json::from_value(json!({
        "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
        "metadata": {"name": name},
        "spec": {"volume": name, "nodeName": "worker-1", "source": "/var/lib/tessera/volumes/x", "capacityBytes": 1024}
    }))
    .unwrap();
    mountpods.create(&PostParams::default(), &mp).await.unwrap();
    for (kind, want) in [
        (
            "volumes.tessera.io",
            &["NAME", "SIZE", "ACCESS", "STATE", "READY", "NODES", "AGE"][..],
        ),
        (
            "mountpods.tessera.io",
            &["NAME", "VOLUME", "NODE", "PHASE", "REFS", "RESTARTS", "AGE"][..],
        ),
    ] {
        let text = support::kubectl_output(&["get", kind, &name]);
        let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header, want, "{kind}: {text}");
        assert!(
            text.lines()
                .nth(1)
                .is_some_and(|row| row.starts_with(&name)),
            "{kind}: {text}"
        );
    }
    // `kubectl get tessera` lists every kind of the category.
    let out = support::kubectl()
        .args(["get", "tessera", "-o", "name"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for kind in [
        "volume.tessera.io",
        "volumeattachment.tessera.io",
        "mountpod.tessera.io",
    ] {
        assert!(
            text.contains(&format!("{kind}/{name}")),
            "kubectl get tessera lacks {kind}/{name}: {text}"
        );
    }

    mountpods
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    volumes
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    attachments
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn config_renders_with_kustomize_and_passes_server_side_dry_run() {
    let client = setup().await;
    // config/ and its optional example StorageClass (config/storageclass/).
    let objects: Vec<DynamicObject> = ["config", "config/storageclass"]
        .iter()
        .flat_map(|dir| {
            let out = support::kubectl_output(&[
                "kustomize",
                support::repo_root().join(dir).to_str().unwrap(),
            ]);
            support::parse_documents::<DynamicObject>(&out)
        })
        .collect();
    let kinds: Vec<String> = objects
        .iter()
        .filter_map(|o| o.types.as_ref().map(|t| t.kind.clone()))
        .collect();
    for want in [
        "CustomResourceDefinition",
        "Deployment",
        "DaemonSet",
        "CSIDriver",
        "StorageClass",
        "PodDisruptionBudget",
        "ClusterRole",
        "ServiceAccount",
    ] {
        assert!(
            kinds.iter().any(|k| k == want),
            "config/ lacks a {want}: {kinds:?}"
        );
    }
    // Namespaced objects need their namespace to exist for a dry run: create it for real.
    for obj in objects
        .iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "Namespace"))
    {
        let (api, _, _) = support::dynamic_api(&client, obj).await;
        let name = obj.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("tessera-tests"),
            &Patch::Apply(obj),
        )
        .await
        .unwrap();
    }
    for obj in &objects {
        let (api, _, _) = support::dynamic_api(&client, obj).await;
        let name = obj.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("tessera-tests").dry_run().force(),
            &Patch::Apply(obj),
        )
        .await
        .unwrap_or_else(|e| panic!("config/: {name} rejected: {e}"));
    }
}

/// `tessera_api_requests_total` as a role's client counts it (the client of
/// `tessera_runtime::connect`, built here on the test's kubeconfig): HTTP verb,
/// group, resource, subresource and response code, never the object's name.
#[tokio::test]
async fn the_api_client_counts_requests_by_verb_resource_and_code() {
    use kube::api::{ListParams, WatchParams};
    use tessera_runtime::metrics::{ApiRequestLabels, ApiRequests};

    setup().await;
    let requests = ApiRequests::default();
    let client = tessera_runtime::counted_client(support::config().await, &requests).unwrap();
    let name = support::unique_name("counted");
    let volumes: Api<Volume> = Api::all(client.clone());
    let manifest = volume_manifest(&name, "1Gi", "ReadWriteOnce");
    volumes
        .create(&PostParams::default(), &manifest)
        .await
        .unwrap();
    volumes.get(&name).await.unwrap();
    assert!(
        volumes
            .get_opt(&format!("{name}-none"))
            .await
            .unwrap()
            .is_none()
    );
    let again = volumes.create(&PostParams::default(), &manifest).await;
    assert!(
        matches!(again, Err(kube::Error::Api(ref s)) if s.code == 409),
        "{again:?}"
    );
    volumes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"state": "Detached"}})),
        )
        .await
        .unwrap();
    volumes.list(&ListParams::default().limit(1)).await.unwrap();
    // A watch: one GET, counted when its response starts.
    let stream = volumes.watch(&WatchParams::default().timeout(1), "0").await;
    drop(stream);
    volumes
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();

    let count = |verb: &str, subresource: &str, code: &str| {
        requests
            .get_or_create(&ApiRequestLabels {
                verb: verb.into(),
                group: "tessera.io".into(),
                resource: "volumes".into(),
                subresource: subresource.into(),
                code: code.into(),
            })
            .get()
    };
    assert_eq!(count("POST", "", "201"), 1);
    assert_eq!(count("POST", "", "409"), 1);
    assert_eq!(count("GET", "", "404"), 1);
    // get, list and the watch.
    assert_eq!(count("GET", "", "200"), 3);
    assert_eq!(count("PATCH", "status", "200"), 1);
    assert_eq!(count("DELETE", "", "200"), 1);
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("requests", "", requests.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        !text.contains(&name),
        "an object name became a label: {text}"
    );
}
