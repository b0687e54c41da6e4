//! What every reconcile is handed: the client, the caches of the shared watches, the
//! controller's own writes not yet in those caches, metrics and the Event recorder;
//! and the two things every reconcile does with them: time itself ([`measured`]) and
//! patch with the controller's field manager ([`merge_params`]).

use crate::api::CONTROLLER_FIELD_MANAGER;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use super::own_writes::OwnWrites;
use super::watch::CachesReady;
use super::{Error, Labels};
use crate::api::{CSI_DRIVER_NAME, MountPod, Volume, VolumeAttachment};
use crate::metrics::Metrics;

/// What every reconcile needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Metrics (reconciles, errors, durations, writes, ticket latency).
    pub metrics: Arc<Metrics>,
    /// Publishes Kubernetes Events.
    pub recorder: crate::runtime::recorder::Recorders,
    /// Cache of Volumes (from the volume controller's watch).
    pub volumes: Store<Volume>,
    /// Cache of VolumeAttachments (from the attachment controller's watch).
    pub attachments: Store<VolumeAttachment>,
    /// Cache of MountPods.
    pub mountpods: Store<MountPod>,
    /// Cache of Node names (metadata only): tickets for other nodes are not honoured.
    pub nodes: Store<PartialObjectMeta<Node>>,
    /// Cache of CSINodes: which nodes have a registered Tessera agent (for status
    /// messages only; no decision depends on it).
    pub csinodes: Store<CSINode>,
    /// Whether the CSINode cache has had its first full list.
    pub csinodes_ready: Arc<AtomicBool>,
    /// Labels copied onto created objects (the watch selector).
    pub labels: Labels,
    /// The backend roots a Volume may name; a Volume naming another is refused.
    pub allowed_roots: crate::host::roots::AllowedRoots,
    /// Reaper settings.
    pub reap_grace: Duration,
    /// Whether each cache has had its first full list.
    pub caches_ready: CachesReady,
    /// Volumes as this controller last wrote them, until the caches catch up.
    pub written_volumes: OwnWrites<Volume>,
    /// VolumeAttachments as this controller last wrote them.
    pub written_attachments: OwnWrites<VolumeAttachment>,
    /// MountPods as this controller last wrote (or deleted) them.
    pub written_mountpods: OwnWrites<MountPod>,
    /// The versions the attachment controller wrote, not to be reconciled again.
    pub echoes: Arc<super::echoes::Echoes>,
    /// When each ticket not yet dated by its VolumeAttachment status was first seen.
    pub ticket_sightings: super::attachment::sightings::Sightings,
    /// How long recent attaches took: with the backlog of new attaches, how long a
    /// new attach may go unreported.
    pub pace: super::pace::Pace,
    /// When each large VolumeAttachment's status may be written again
    /// ([`crate::runtime::spacing`]).
    pub status_spacing: crate::runtime::spacing::Spacing,
    /// The slow detaches already reported by a Detaching Event.
    pub detaches_reported: super::attachment::detaching::Reported,
}

impl Context {
    /// Whether every cache has had its first full list, so no decision is taken on an
    /// empty cache. Callers requeue when not. (Flags set by the watches themselves —
    /// see [`super::watch::fan_out`] — because a store's readiness wakes only one
    /// waiter, and each controller already waits on its own store.)
    pub(crate) async fn caches_ready(&self) -> bool {
        self.caches_ready.all()
    }

    /// Whether Node `name` exists (as the cache shows it).
    pub(crate) fn node_exists(&self, name: &str) -> bool {
        self.nodes.get(&ObjectRef::new(name)).is_some()
    }

    /// Whether node `name` has a registered Tessera agent (its CSINode lists the driver),
    /// as the CSINode cache shows it; false while that cache is not filled.
    pub(crate) fn agent_registered(&self, name: &str) -> bool {
        self.csinodes_ready.load(Ordering::Acquire)
            && self
                .csinodes
                .get(&ObjectRef::new(name))
                .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == CSI_DRIVER_NAME))
    }

    /// The nodes of `va`'s tickets that exist but have no Tessera agent: no CSINode of
    /// theirs lists the driver. Empty until the CSINode cache is filled.
    pub(crate) fn nodes_without_agent(&self, va: &VolumeAttachment) -> BTreeSet<String> {
        if !self.csinodes_ready.load(Ordering::Acquire) {
            return BTreeSet::new();
        }
        va.spec
            .attachment_tickets
            .values()
            .map(|t| &t.node_id)
            .filter(|n| self.node_exists(n))
            .filter(|n| {
                !self
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
