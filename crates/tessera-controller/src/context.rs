//! What every controller shares: the client, the caches of the shared watches, the
//! Volumes and VolumeAttachments written and not yet in those caches, metrics, the
//! Event recorder and the settings all of them read; and the two things every
//! reconcile does with them: time itself ([`measured`]) and patch with the
//! controller's field manager ([`merge_params`]).
//!
//! ```text
//!  wiring (the watches) ─▶ Caches ─┐
//!  client, metrics, recorder ──────┼─▶ Context ─▶ volume, reaper, state gauges
//!  labels, allowed roots ──────────┘      └────▶ attachment::Ctx (+ its own State)
//! ```
//!
//! A controller's own state (the attachment controller's echoes, pace, spacing, …)
//! lives with that controller, not here. [`Context::new`] builds one from any client
//! (a scripted one in tests) and [`Caches::filled`] caches filled once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;

use tessera_api::CONTROLLER_FIELD_MANAGER;
use tessera_api::{CSI_DRIVER_NAME, MountPod, Volume, VolumeAttachment};
use tessera_runtime::metrics::Metrics;

use super::index::Index;
use super::own_writes::OwnWrites;
use super::watch::CachesReady;
use super::{Error, Labels};

/// What every controller reads and writes through.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Metrics (reconciles, errors, durations, writes, ticket latency).
    pub metrics: Arc<Metrics>,
    /// Publishes Kubernetes Events.
    pub recorder: tessera_runtime::recorder::Recorders,
    /// The caches of the shared watches.
    pub caches: Caches,
    /// Labels copied onto created objects (the watch selector).
    pub labels: Labels,
    /// The backend roots a Volume may name; a Volume naming another is refused.
    pub allowed_roots: tessera_host::roots::AllowedRoots,
    /// Volumes as a controller last wrote them, until the caches catch up (the volume
    /// and attachment controllers both write Volumes and read each other's writes).
    pub written_volumes: OwnWrites<Volume>,
    /// VolumeAttachments as a controller last wrote them.
    pub written_attachments: OwnWrites<VolumeAttachment>,
    /// The anchor of each Shared backend root (see `anchor`).
    pub anchors: super::anchor::Anchors,
}

/// The caches of the shared watches, and whether each had its first full list.
pub struct Caches {
    /// Volumes (from the volume controller's watch).
    pub volumes: Store<Volume>,
    /// VolumeAttachments (from the attachment controller's watch).
    pub attachments: Store<VolumeAttachment>,
    /// MountPods.
    pub mountpods: Store<MountPod>,
    /// The MountPods' names by volume (`spec.volume`), from the same watch.
    pub mountpods_by_volume: Arc<RwLock<Index<MountPod>>>,
    /// Node names (metadata only): tickets for other nodes are not honoured.
    pub nodes: Store<PartialObjectMeta<Node>>,
    /// CSINodes: which nodes have a registered Tessera agent (for status messages
    /// only; no decision depends on it).
    pub csinodes: Store<CSINode>,
    /// Whether the CSINode cache has had its first full list.
    pub csinodes_ready: Arc<AtomicBool>,
    /// Whether each of the other caches has had its first full list.
    pub ready: CachesReady,
}

impl Caches {
    /// Caches holding these objects, every one marked as listed: for tests and tools
    /// that reconcile without watches. A node in `nodes` exists; one in `agents` also
    /// has a registered Tessera agent.
    pub fn filled(
        volumes: impl IntoIterator<Item = Volume>,
        attachments: impl IntoIterator<Item = VolumeAttachment>,
        mountpods: impl IntoIterator<Item = MountPod>,
        nodes: &[&str],
        agents: &[&str],
    ) -> Self {
        fn store<K>(objects: impl IntoIterator<Item = K>) -> Store<K>
        where
            K: kube::Resource + Clone + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone,
        {
            let (store, mut writer) = reflector::store();
            for o in objects {
                writer.apply_watcher_event(&watcher::Event::Apply(o));
            }
            store
        }
        let node = |name: &&str| {
            let mut n = PartialObjectMeta::<Node>::default();
            n.metadata.name = Some(name.to_string());
            n
        };
        let csinode = |name: &&str| {
            serde_json::from_value::<CSINode>(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"drivers": [{"name": CSI_DRIVER_NAME, "nodeID": name}]},
            }))
            .expect("a well-formed CSINode")
        };
        let ready = CachesReady::default();
        for flag in [
            &ready.volumes,
            &ready.attachments,
            &ready.mountpods,
            &ready.nodes,
        ] {
            flag.store(true, Ordering::Release);
        }
        let mountpods: Vec<MountPod> = mountpods.into_iter().collect();
        let mut by_volume = mountpods_by_volume();
        for mp in &mountpods {
            by_volume.apply(&watcher::Event::Apply(mp.clone()));
        }
        Caches {
            volumes: store(volumes),
            attachments: store(attachments),
            mountpods: store(mountpods),
            mountpods_by_volume: Arc::new(RwLock::new(by_volume)),
            nodes: store(nodes.iter().map(node)),
            csinodes: store(agents.iter().map(csinode)),
            csinodes_ready: Arc::new(AtomicBool::new(true)),
            ready,
        }
    }
}

/// An empty index of MountPods by their volume.
pub fn mountpods_by_volume() -> Index<MountPod> {
    Index::new(|mp: &MountPod| mp.spec.volume.clone())
}

impl Caches {
    /// The cached MountPods of volume `name` (through the index: no scan of them all).
    pub fn mountpods_of(&self, name: &str) -> Vec<Arc<MountPod>> {
        let names = self
            .mountpods_by_volume
            .read()
            .expect("index poisoned")
            .get(name);
        names
            .iter()
            .filter_map(|n| self.mountpods.get(&ObjectRef::new(n)))
            // The store may be a moment ahead of the index.
            .filter(|mp| mp.spec.volume == name)
            .collect()
    }
}

impl Context {
    /// A context on `client` and `caches`: Events are published as the controller
    /// (instance `identity`), nothing is yet written.
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        identity: Option<String>,
        caches: Caches,
        labels: Labels,
        allowed_roots: tessera_host::roots::AllowedRoots,
    ) -> Self {
        let reporter = Reporter {
            controller: CONTROLLER_FIELD_MANAGER.into(),
            instance: identity,
        };
        Context {
            recorder: tessera_runtime::recorder::Recorders::new(client.clone(), reporter),
            client,
            metrics,
            caches,
            labels,
            allowed_roots,
            written_volumes: Default::default(),
            written_attachments: Default::default(),
            anchors: Default::default(),
        }
    }

    /// Whether every cache has had its first full list, so no decision is taken on an
    /// empty cache. Callers requeue when not. (Flags set by the watches themselves —
    /// see [`super::watch::fan_out`] — because a store's readiness wakes only one
    /// waiter, and each controller already waits on its own store.)
    pub(crate) async fn caches_ready(&self) -> bool {
        self.caches.ready.all()
    }

    /// Whether Node `name` exists (as the cache shows it).
    pub(crate) fn node_exists(&self, name: &str) -> bool {
        self.caches.nodes.get(&ObjectRef::new(name)).is_some()
    }

    /// Whether node `name` has a registered Tessera agent (its CSINode lists the driver),
    /// as the CSINode cache shows it; false while that cache is not filled.
    pub(crate) fn agent_registered(&self, name: &str) -> bool {
        self.caches.csinodes_ready.load(Ordering::Acquire)
            && self
                .caches
                .csinodes
                .get(&ObjectRef::new(name))
                .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == CSI_DRIVER_NAME))
    }

    /// The nodes of `va`'s tickets that exist but have no Tessera agent: no CSINode of
    /// theirs lists the driver. Empty until the CSINode cache is filled.
    pub(crate) fn nodes_without_agent(&self, va: &VolumeAttachment) -> BTreeSet<String> {
        if !self.caches.csinodes_ready.load(Ordering::Acquire) {
            return BTreeSet::new();
        }
        va.spec
            .attachment_tickets
            .values()
            .map(|t| &t.node_id)
            .filter(|n| self.node_exists(n))
            .filter(|n| {
                !self
                    .caches
                    .csinodes
                    .get(&ObjectRef::new(n))
                    .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == CSI_DRIVER_NAME))
            })
            .cloned()
            .collect()
    }
}

/// Time a reconcile and count it.
pub(crate) async fn measured<F, T>(metrics: &Metrics, controller: &str, fut: F) -> Result<T, Error>
where
    F: std::future::Future<Output = Result<T, Error>>,
{
    let start = Instant::now();
    let res = fut.await;
    metrics.reconciled(controller, start.elapsed(), res.is_err());
    res
}

/// Parameters of a merge or JSON patch by the controller (field manager set, so
/// `managedFields` tells who wrote what).
pub(crate) fn merge_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(CONTROLLER_FIELD_MANAGER.into()),
        ..Default::default()
    }
}
