//! The reads of `status pod/NAME` and `pods`: a Pod's volumes through their claims
//! and PVs to their Tessera Volumes and MountPods, into `tessera_plugin::pods` and
//! `status` structures. No judgement here.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use tessera_api::CSI_DRIVER_NAME;
use tessera_plugin::{pods, status};

use crate::read::{Ctx, Error, LogLimits, Target, mountpods, status};

/// One volume of a Pod and its status (`None`: its PV is another driver's).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolumeReport {
    pub volume: String,
    /// The Pod's node (empty: not scheduled).
    pub node: String,
    pub start: pods::Start,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<status::Report>,
}

/// The status of each volume of Pod `namespace/name` that may be Tessera's, and the
/// Pod's uid.
pub async fn pod_status(
    client: &Client,
    namespace: &str,
    name: &str,
    tns: &str,
    logs: &LogLimits,
) -> Result<(Vec<PodVolumeReport>, String), Error> {
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .ctx(|| format!("reading Pod {namespace}/{name}"))?
        .ok_or_else(|| Error::NotFound(format!("Pod {namespace}/{name}")))?;
    let mut out = Vec::new();
    for v in pods::volumes(&pod) {
        let target = match &v.start {
            pods::Start::Claim { namespace, name } => Target::Pvc {
                namespace: namespace.clone(),
                name: name.clone(),
            },
            pods::Start::Volume { name } => Target::Volume(name.clone()),
        };
        let report = match status(client, &target, tns, logs).await {
            // A claim the Pod names may not exist (yet): the report says so.
            Err(Error::NotFound(what)) => status::Report {
                tessera_namespace: tns.into(),
                volume_name: format!("<{what} not found>"),
                ..Default::default()
            },
            other => other?,
        };
        let theirs = report
            .pv
            .as_ref()
            .is_some_and(|pv| pv.driver != CSI_DRIVER_NAME);
        out.push(PodVolumeReport {
            volume: v.volume,
            node: pods::node_of(&pod),
            start: v.start,
            report: (!theirs).then_some(report),
        });
    }
    Ok((out, pod.uid().unwrap_or_default()))
}

/// `pods`: the Pods of `namespace` (every namespace: `None`) with a Tessera volume, a
/// row per volume, with the MountPod serving it on the Pod's node.
pub async fn pod_rows(
    client: &Client,
    namespace: Option<&str>,
    node: Option<&str>,
) -> Result<Vec<pods::PodRow>, Error> {
    let (pod_api, claim_api): (Api<Pod>, Api<PersistentVolumeClaim>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let lp = match node {
        Some(n) => ListParams::default().fields(&format!("spec.nodeName={n}")),
        None => ListParams::default(),
    };
    let where_ = namespace.map_or("every namespace".to_string(), |n| format!("namespace {n}"));
    let all_pods = pod_api
        .list(&lp)
        .await
        .ctx(|| format!("listing Pods in {where_}"))?
        .items;
    let claims = claim_api
        .list(&ListParams::default())
        .await
        .ctx(|| format!("listing PersistentVolumeClaims in {where_}"))?
        .items;
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ctx(|| "listing PersistentVolumes".into())?
        .items;
    let classes: BTreeSet<String> = Api::<StorageClass>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ctx(|| "listing StorageClasses".into())?
        .items
        .into_iter()
        .filter(|c| c.provisioner == CSI_DRIVER_NAME)
        .map(|c| c.name_any())
        .collect();
    let mountpods = mountpods(client).await?;
    let lookup = pods::Lookup {
        claims: &claims,
        pvs: &pvs,
        classes: &classes,
        mountpods: &mountpods,
    };
    Ok(pods::rows(&all_pods, &lookup))
}
