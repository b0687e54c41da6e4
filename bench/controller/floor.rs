//! The API floor of the controller benchmark: the writes an attach needs, issued
//! directly for other volumes (no controller, no watches), copied from what the
//! controller wrote for a warm-up volume ([`Template`]), [`FLOOR_PIPELINES`] volumes at
//! once, in one of two [`Mix`]es.

use super::*;

/// How many volumes the floor works on at once.
pub(super) const FLOOR_PIPELINES: usize = 64;

/// Which requests the floor issues per volume.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Mix {
    /// The least an attach needs: the ticket, the MountPod (POST), the agent's
    /// MountPod status, and the VolumeAttachment and Volume statuses written once,
    /// satisfied.
    Minimal,
    /// The controller's requests for an attach done within a second: also the
    /// Attached Event on the Volume.
    Controller,
}

/// The bodies the controller wrote for one volume, with its name as a placeholder.
pub(super) struct Template {
    name: String,
    mountpod: serde_json::Value,
    /// The finalizers the controller's MountPod was created with (the node agent's).
    mountpod_finalizers: Vec<String>,
    va_status: serde_json::Value,
    volume_status: serde_json::Value,
    /// With `BENCH_FLOOR_SHAPE=controller`: what the controller's objects carry before
    /// their ticket, for the floors to write before their clock starts.
    pub(super) first: Option<FirstShape>,
}

/// What the controller writes on a new volume's objects before any ticket: their
/// finalizers and first statuses (and the node agent's finalizer, which it gives each
/// MountPod it creates). An experiment (`BENCH_FLOOR_SHAPE=controller`): do the API
/// server's writes cost more on objects of that shape?
pub(super) struct FirstShape {
    va_finalizers: Vec<String>,
    volume_finalizers: Vec<String>,
    va_status: serde_json::Value,
    volume_status: serde_json::Value,
}

impl FirstShape {
    /// Read from the objects of volume `name`, once both have a status.
    pub(super) async fn capture(client: &kube::Client, name: &str) -> FirstShape {
        let vas = Api::<VolumeAttachment>::all(client.clone());
        let volumes = Api::<Volume>::all(client.clone());
        let t = Instant::now();
        loop {
            let (va, volume) = tokio::join!(vas.get(name), volumes.get(name));
            if let (Ok(va), Ok(volume)) = (va, volume)
                && va.status.is_some()
                && volume.status.is_some()
            {
                return FirstShape {
                    va_finalizers: va.finalizers().to_vec(),
                    volume_finalizers: volume.finalizers().to_vec(),
                    va_status: serde_json::to_value(&va.status).unwrap(),
                    volume_status: serde_json::to_value(&volume.status).unwrap(),
                };
            }
            assert!(t.elapsed() < Duration::from_secs(30), "no first statuses");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Template {
    pub(super) async fn capture(client: &kube::Client, name: &str) -> Template {
        let va = Api::<VolumeAttachment>::all(client.clone())
            .get(name)
            .await
            .expect("reading a VolumeAttachment");
        let volume = Api::<Volume>::all(client.clone())
            .get(name)
            .await
            .expect("reading a Volume");
        let mps = Api::<MountPod>::all(client.clone())
            .list(&ListParams::default().labels(&format!("{LABEL_VOLUME}={name}")))
            .await
            .expect("listing MountPods");
        let mp = mps.items.first().expect("the volume's MountPod");
        Template {
            name: name.to_string(),
            mountpod: json!({
                "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
                "metadata": {"labels": mp.metadata.labels},
                "spec": mp.spec,
            }),
            mountpod_finalizers: mp.finalizers().to_vec(),
            va_status: serde_json::to_value(&va.status).unwrap(),
            volume_status: serde_json::to_value(&volume.status).unwrap(),
            first: None,
        }
    }

    /// The MountPod of volume `name` on `node` for floor `id`, owned by `owner`.
    pub(super) fn mountpod(
        &self,
        name: &str,
        node: &str,
        owner: &serde_json::Value,
        id: &str,
    ) -> MountPod {
        let mut mp = self.renamed(&self.mountpod, name);
        mp["metadata"]["name"] = json!(tessera_api::mountpod_name(name, node));
        mp["metadata"]["ownerReferences"] = json!([owner]);
        // The floor's own label: the controller and the stand-in agent ignore it.
        mp["metadata"]["labels"][TEST_LABEL] = json!(id);
        if self.first.is_some() {
            mp["metadata"]["finalizers"] = json!(self.mountpod_finalizers);
        }
        serde_json::from_value(mp).unwrap()
    }

    /// Write the satisfied statuses of volume `name`, both at once, as the controller
    /// does.
    pub(super) async fn write_statuses(
        &self,
        vas: &Api<VolumeAttachment>,
        volumes: &Api<Volume>,
        apply: &PatchParams,
        name: &str,
    ) -> Result<(), kube::Error> {
        let statuses = (&self.va_status, &self.volume_status);
        self.apply_statuses(vas, volumes, apply, name, statuses)
            .await
    }

    /// Apply `statuses` (of the VolumeAttachment, of the Volume; with the template
    /// volume's name) to volume `name`'s objects, both at once.
    async fn apply_statuses(
        &self,
        vas: &Api<VolumeAttachment>,
        volumes: &Api<Volume>,
        apply: &PatchParams,
        name: &str,
        (va_status, volume_status): (&serde_json::Value, &serde_json::Value),
    ) -> Result<(), kube::Error> {
        let va_status = self.renamed(va_status, name);
        let volume_status = self.renamed(volume_status, name);
        let (va_status, volume_status) = (
            Patch::Apply(status_body("VolumeAttachment", va_status)),
            Patch::Apply(status_body("Volume", volume_status)),
        );
        let (a, b) = futures::join!(
            vas.patch_status(name, apply, &va_status),
            volumes.patch_status(name, apply, &volume_status),
        );
        a?;
        b.map(|_| ())
    }

    /// `value` with the template volume's name replaced by `name`.
    pub(super) fn renamed(&self, value: &serde_json::Value, name: &str) -> serde_json::Value {
        serde_json::from_str(&value.to_string().replace(&self.name, name)).unwrap()
    }
}

/// Wait until the objects of test `id` are gone (garbage collection included), so the
/// floor does not share the API server with the cleanup.
pub(super) async fn wait_gone(client: &kube::Client, id: &str) {
    let selector = ListParams::default().labels(&format!("{TEST_LABEL}={id}"));
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(300) {
        let vas = Api::<VolumeAttachment>::all(client.clone())
            .list_metadata(&selector)
            .await
            .map_or(1, |l| l.items.len());
        let mps = Api::<MountPod>::all(client.clone())
            .list_metadata(&selector)
            .await
            .map_or(1, |l| l.items.len());
        if vas + mps == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Attach `n` new volumes by writing what the controller and the agent would, in
/// their order (the two statuses at once, as the controller writes them); returns
/// the time from the first ticket to the last write. Volumes and their
/// VolumeAttachments are created first, untimed, as in the controller run.
pub(super) async fn floor(
    client: &kube::Client,
    template: &Template,
    node: &str,
    n: usize,
    mix: Mix,
    meter: &CpuMeter,
) -> (Duration, SegmentCpu) {
    let id = support::unique_name("floor");
    let volumes: Api<Volume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let mps: Api<MountPod> = Api::all(client.clone());
    let names: Vec<String> = (0..n).map(|i| format!("{id}-v{i}")).collect();
    let apply = PatchParams::apply("tessera-bench-floor").force();
    let owners = create_volumes(client, template, &id, &names).await;
    let recorder = recorder(client);

    let cpu = meter.read();
    let t0 = Instant::now();
    stream::iter(names.iter().zip(owners).map(|(name, (owner, object))| {
        let (vas, volumes, mps, apply, recorder) = (
            vas.clone(),
            volumes.clone(),
            mps.clone(),
            apply.clone(),
            recorder.clone(),
        );
        let id = &id;
        async move {
            fixtures::put_ticket(client, name, "csi-a", "csi-attacher", node, json!({})).await;
            let mp_name = tessera_api::mountpod_name(name, node);
            mps.create(
                &PostParams::default(),
                &template.mountpod(name, node, &owner, id),
            )
            .await?;
            // The agent reports the mount Ready.
            mps.patch_status(&mp_name, &PatchParams::default(), &ready(name))
                .await?;
            template
                .write_statuses(&vas, &volumes, &apply, name)
                .await?;
            if mix == Mix::Controller {
                recorder.publish(&attached(node), &object).await?;
            }
            Ok::<_, kube::Error>(())
        }
    }))
    .buffer_unordered(FLOOR_PIPELINES)
    .try_collect::<Vec<()>>()
    .await
    .expect("floor writes");
    let took = t0.elapsed();
    let cpu = meter.read().since(cpu);

    delete_volumes(client, &id, &names, node).await;
    (took, cpu)
}

/// The Event recorder of the floors.
pub(super) fn recorder(client: &kube::Client) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: "tessera-bench-floor".into(),
            instance: None,
        },
    )
}

/// The agent's status of a Ready mount of volume `name`.
pub(super) fn ready(name: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"status": {"phase": "Ready", "observedGeneration": 1,
        "mountPoint": format!("/var/lib/tessera/mounts/{name}"), "pid": 4242}}))
}

/// The controller's Event for an attach done on `node`.
pub(super) fn attached(node: &str) -> Event {
    Event {
        type_: EventType::Normal,
        reason: "Attached".into(),
        note: Some(format!("attached to node {node}: the mount is ready")),
        action: format!("Attached:{node}"),
        secondary: None,
    }
}

fn status_body(kind: &str, status: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "tessera.io/v1alpha1", "kind": kind, "status": status})
}

/// Create the Volumes `names` of floor `id` and their VolumeAttachments (without a
/// ticket), 32 at once; returns each Volume's owner reference and object reference.
pub(super) async fn create_volumes(
    client: &kube::Client,
    template: &Template,
    id: &str,
    names: &[String],
) -> Vec<(serde_json::Value, ObjectReference)> {
    let volumes: Api<Volume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let apply = PatchParams::apply("tessera-bench-floor").force();
    stream::iter(names.iter().map(|name| {
        let (volumes, vas, apply) = (volumes.clone(), vas.clone(), apply.clone());
        let body = fixtures::volume(name, id, "ReadWriteOnce");
        async move {
            let v = volumes.create(&PostParams::default(), &body).await?;
            let owner = serde_json::to_value(v.controller_owner_ref(&())).unwrap();
            let mut va = json!({
                "apiVersion": "tessera.io/v1alpha1", "kind": "VolumeAttachment",
                "metadata": {"name": name, "labels": {TEST_LABEL: id},
                             "ownerReferences": [owner]},
                "spec": {"volume": name, "attachmentTickets": {}},
            });
            if let Some(first) = &template.first {
                va["metadata"]["finalizers"] = json!(first.va_finalizers);
            }
            vas.patch(name, &apply, &Patch::Apply(&va)).await?;
            if let Some(first) = &template.first {
                // As the controller does: the Volume's finalizer in a patch of its own
                // (its own managedFields entry), then both first statuses.
                let update = PatchParams {
                    field_manager: Some("tessera-bench-floor".into()),
                    ..Default::default()
                };
                let finalizers = json!({"metadata": {"finalizers": first.volume_finalizers}});
                volumes
                    .patch(name, &update, &Patch::Merge(&finalizers))
                    .await?;
                let statuses = (&first.va_status, &first.volume_status);
                template
                    .apply_statuses(&vas, &volumes, &apply, name, statuses)
                    .await?;
            }
            Ok::<_, kube::Error>((owner, v.object_ref(&())))
        }
    }))
    .buffered(32)
    .try_collect()
    .await
    .expect("creating the floor's volumes")
}

/// Delete object `name`; one left pending has finalizers (`BENCH_FLOOR_SHAPE=controller`)
/// that no controller or agent will remove here, so they are removed too.
async fn delete_releasing<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let pending = api
        .delete(name, &Default::default())
        .await
        .is_ok_and(|d| d.is_left());
    if pending {
        let none = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let _ = api.patch(name, &PatchParams::default(), &none).await;
    }
}

/// Delete the objects of floor `id` and wait until they are gone.
pub(super) async fn delete_volumes(client: &kube::Client, id: &str, names: &[String], node: &str) {
    let volumes: Api<Volume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let mps: Api<MountPod> = Api::all(client.clone());
    // No controller serves these objects (their finalizers, if any, are released
    // here). Everything is deleted directly: left to the garbage collector, the
    // dependents would take minutes to go.
    stream::iter(names.iter().map(|name| {
        let (volumes, vas, mps) = (volumes.clone(), vas.clone(), mps.clone());
        let mp_name = tessera_api::mountpod_name(name, node);
        async move {
            delete_releasing(&mps, &mp_name).await;
            delete_releasing(&vas, name).await;
            delete_releasing(&volumes, name).await;
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;
    wait_gone(client, id).await;
}
