//! Fenced failover in status, the I/O: every decision writes the conditions
//! [`super::conditions`] builds onto the Volumes and MountPods whose conditions they
//! change, and nothing else.
//!
//! ```text
//!  Volumes with NodeFailover, or released / stranded now ─▶ volume_note ─▶ volume_conditions
//!  MountPods with Fenced, or on a fenced node ─▶ mountpod_conditions
//!      └─ differs from the object? merge patch of status.conditions, under the
//!         resourceVersion it was built on (409: changed meanwhile, built again next time)
//! ```
//!
//! `status.conditions` is one list: the attachment controller applies the Volume's
//! (server-side apply, its field manager) and carries `NodeFailover` over as it finds
//! it; the node agent applies the MountPod's (its own manager) and carries `Fenced`
//! over the same way (`node::agent::status`): each condition is set and cleared here
//! only. Writing the whole list under a resourceVersion precondition never overwrites
//! what the other writer wrote meanwhile; a version this loop wrote goes to the
//! controller's own writes (the attachment controller reads it before its cache shows
//! it) and to the echoes (its watch event reconciles nothing: the conditions written
//! here are no input of the attachment decision).
//!
//! With no node fenced and no object found carrying a condition at the last look,
//! the caches are not scanned at all (the first look after a start always is).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use tessera_api::{CONDITION_FENCED, CONDITION_NODE_FAILOVER, MountPod, Volume};

use super::conditions::{mountpod_conditions, named_node, volume_conditions, volume_note};
use super::{Holding, Liveness};
use crate::Context;
use crate::context::merge_params;
use crate::echoes::Echoes;

/// What a report goes by.
pub(super) struct View<'a> {
    /// Each node's liveness.
    pub nodes: &'a BTreeMap<String, Liveness>,
    /// Nodes not fenced, but not seen renewing either since the controller started:
    /// what is said of them stays.
    pub unsure: &'a BTreeSet<String>,
    /// The wall clock, for new transitions.
    pub now: Time,
}

/// [`volumes`] and [`mountpods`]: whether any object still carries a failover
/// condition (or one was due and not written).
pub(super) async fn all(
    ctx: &Context,
    echoes: &Echoes,
    view: &View<'_>,
    released: &mut BTreeMap<String, String>,
    stranded: &[&Holding],
) -> bool {
    let v = volumes(ctx, echoes, view, released, stranded).await;
    let m = mountpods(ctx, echoes, view).await;
    v || m
}

/// Write each Volume's `NodeFailover` condition where it changes. `released` holds
/// the node whose ticket of a volume was released and whose failover may still be
/// under way (this loop's memory: entries whose failover is over are dropped);
/// `stranded` the tickets left on down nodes. Whether any Volume carries the
/// condition now.
async fn volumes(
    ctx: &Context,
    echoes: &Echoes,
    view: &View<'_>,
    released: &mut BTreeMap<String, String>,
    stranded: &[&Holding],
) -> bool {
    let View { nodes, unsure, now } = view;
    let mut carrying = false;
    let mut stays: BTreeMap<&str, &str> = BTreeMap::new();
    for h in stranded {
        stays.entry(h.volume.as_str()).or_insert(h.node.as_str());
    }
    let cached_volumes = ctx.caches.volumes.state();
    // A deleted Volume's failover is nobody's business any more.
    released.retain(|v, _| cached_volumes.iter().any(|c| c.name_any() == *v));
    for cached in cached_volumes {
        let name = cached.name_any();
        let said = cached.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == CONDITION_NODE_FAILOVER)
        });
        if !said && !released.contains_key(&name) && !stays.contains_key(name.as_str()) {
            continue;
        }
        let volume = ctx
            .written_volumes
            .view(&name, Some(cached.clone()))
            .unwrap_or(cached);
        let status = volume.status.clone().unwrap_or_default();
        if named_node(&status.conditions).is_some_and(|n| unsure.contains(n)) {
            carrying = true;
            continue;
        }
        let note = volume_note(
            nodes,
            released.get(&name).map(String::as_str),
            stays.get(name.as_str()).copied(),
            &status.conditions,
            &status.attached_nodes,
        );
        match &note {
            Some(super::conditions::VolumeNote::FailedOver { node, .. }) => {
                released.insert(name.clone(), node.clone());
            }
            _ => {
                released.remove(&name);
            }
        }
        let conditions = volume_conditions(
            &status.conditions,
            note.as_ref(),
            volume.metadata.generation,
            now,
        );
        // Carrying it now, or still until a failed write is done again.
        carrying |= note.is_some() || said;
        if conditions == status.conditions {
            continue;
        }
        let api = Api::<Volume>::all(ctx.client.clone());
        match write(&api, &*volume, &conditions).await {
            Ok(Some(written)) => {
                info!(volume = %name, note = ?note, "fenced failover: NodeFailover condition written");
                echoes.wrote("Volume", &name, written.resource_version());
                ctx.written_volumes.record(
                    &name,
                    &name,
                    volume.resource_version(),
                    Some(Arc::new(written)),
                );
            }
            Ok(None) => {}
            Err(e) => {
                warn!(volume = %name, error = %e, "writing the NodeFailover condition failed")
            }
        }
    }
    carrying
}

/// Write each MountPod's `Fenced` condition where it changes: True on a fenced node,
/// gone elsewhere (but on a node in `unsure`). Whether any MountPod carries it now.
async fn mountpods(ctx: &Context, echoes: &Echoes, view: &View<'_>) -> bool {
    let View { nodes, unsure, now } = view;
    let mut carrying = false;
    let api = Api::<MountPod>::all(ctx.client.clone());
    for mp in ctx.caches.mountpods.state() {
        let has = |mp: &MountPod| {
            mp.status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == CONDITION_FENCED))
        };
        if unsure.contains(&mp.spec.node_name) {
            carrying |= has(&mp);
            continue;
        }
        let fenced = match nodes.get(&mp.spec.node_name) {
            Some(Liveness::Fenced { why, .. }) => Some(*why),
            _ => None,
        };
        let old: &[Condition] = mp.status.as_ref().map_or(&[], |s| &s.conditions);
        if fenced.is_none() && !has(&mp) {
            continue;
        }
        carrying = true;
        let conditions = mountpod_conditions(
            old,
            &mp.spec.node_name,
            fenced,
            mp.spec.self_fence,
            mp.metadata.generation,
            now,
        );
        if conditions == old {
            continue;
        }
        match write(&api, &*mp, &conditions).await {
            Ok(Some(written)) => {
                info!(mountpod = %mp.name_any(), node = %mp.spec.node_name, fenced = ?fenced, "fenced failover: Fenced condition written");
                echoes.wrote("MountPod", &mp.name_any(), written.resource_version());
            }
            Ok(None) => {}
            Err(e) => {
                warn!(mountpod = %mp.name_any(), error = %e, "writing the Fenced condition failed")
            }
        }
    }
    carrying
}

/// Replace `o`'s status conditions with `conditions`, only if `o` is still at the
/// resourceVersion it was read at: the object written, or none when it changed or went
/// meanwhile (the next decision builds the conditions again on what it is now).
async fn write<K>(api: &Api<K>, o: &K, conditions: &[Condition]) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = o.meta().name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"resourceVersion": o.meta().resource_version},
        "status": {"conditions": conditions},
    });
    match api
        .patch_status(&name, &merge_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
            debug!(object = %name, code = s.code, "changed or gone meanwhile: not written");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
