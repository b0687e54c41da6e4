//! The plugin's reads: from the API server into the plain structures of
//! `tessera_plugin` (status report, ticket rows, doctor inventory). No judgement here.

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment as StorageVA};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, Resource, ResourceExt};

use tessera_api::{
    self as api, CSI_DRIVER_NAME, LABEL_VOLUME, MOUNT_POD_COMPONENT, MOUNT_POD_CONTAINER, MountPod,
    Volume, VolumeAttachment, VolumeState,
};
use tessera_plugin::{doctor, status, tickets};

/// Why the plugin could not answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable kubeconfig or client.
    #[error("kubeconfig: {0}")]
    Config(String),
    /// A read failed.
    #[error("{what}")]
    Kube {
        /// What was read.
        what: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// The object asked for does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// A flag that does not apply to the command.
    #[error("{0}")]
    Usage(String),
    /// The target is not `pvc/NAME`, `pv/NAME`, `volume/NAME` or a name.
    #[error("{0:?}: expected pvc/NAME, pod/NAME, pv/NAME, volume/NAME or a Volume's name")]
    BadTarget(String),
}

/// Errors of reads, named by what was read.
pub trait Ctx<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> Ctx<T> for Result<T, kube::Error> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::Kube {
            what: what(),
            source,
        })
    }
}

/// What `status` was asked about.
pub enum Target {
    Pvc { namespace: String, name: String },
    Pod { namespace: String, name: String },
    Pv(String),
    Volume(String),
}

impl Target {
    /// `pvc/NAME` or `pod/NAME` (in `namespace`), `pv/NAME`, `volume/NAME` or a bare
    /// Volume name.
    pub fn parse(s: &str, namespace: &str) -> Result<Target, Error> {
        let (kind, name) = s.split_once('/').unwrap_or(("volume", s));
        if name.is_empty() || name.contains('/') {
            return Err(Error::BadTarget(s.into()));
        }
        Ok(match kind {
            "pvc" | "persistentvolumeclaim" => Target::Pvc {
                namespace: namespace.into(),
                name: name.into(),
            },
            "pod" | "pods" | "po" => Target::Pod {
                namespace: namespace.into(),
                name: name.into(),
            },
            "pv" | "persistentvolume" => Target::Pv(name.into()),
            "volume" | "volumes" | "tvol" => Target::Volume(name.into()),
            _ => return Err(Error::BadTarget(s.into())),
        })
    }
}

/// How much of the agents' logs to read and show.
pub struct LogLimits {
    pub search: i64,
    pub show: usize,
}

const AGENT_SELECTOR: &str = "app.kubernetes.io/name=tessera,app.kubernetes.io/component=node";
const CONTROLLER_SELECTOR: &str =
    "app.kubernetes.io/name=tessera,app.kubernetes.io/component=controller";
const FD_HOLDER_SELECTOR: &str =
    "app.kubernetes.io/name=tessera,app.kubernetes.io/component=fd-holder";

/// The ticket rows of Volume `name`.
pub async fn ticket_rows(client: &Client, name: &str) -> Result<Vec<tickets::TicketRow>, Error> {
    let va = Api::<VolumeAttachment>::all(client.clone())
        .get_opt(name)
        .await
        .ctx(|| format!("reading VolumeAttachment {name}"))?
        .ok_or_else(|| Error::NotFound(format!("VolumeAttachment {name} (tessera.io)")))?;
    Ok(tickets::rows(&va))
}

/// Everything `status` shows for `target`.
pub async fn status(
    client: &Client,
    target: &Target,
    tns: &str,
    logs: &LogLimits,
) -> Result<status::Report, Error> {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let mut report = status::Report {
        tessera_namespace: tns.into(),
        ..Default::default()
    };
    let mut pv = None;
    match target {
        Target::Pvc { namespace, name } => {
            let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .ctx(|| format!("reading PVC {namespace}/{name}"))?
                .ok_or_else(|| Error::NotFound(format!("PVC {namespace}/{name}")))?;
            let bound = pvc
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .unwrap_or_default();
            if !bound.is_empty() {
                pv = pvs
                    .get_opt(&bound)
                    .await
                    .ctx(|| format!("reading PV {bound}"))?;
            }
            report.pvc = Some(claim(&pvc));
        }
        Target::Pv(name) => {
            let found = pvs
                .get_opt(name)
                .await
                .ctx(|| format!("reading PV {name}"))?
                .ok_or_else(|| Error::NotFound(format!("PV {name}")))?;
            if let Some(r) = found.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
                && let (Some(ns), Some(n)) = (&r.namespace, &r.name)
            {
                let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                    .get_opt(n)
                    .await
                    .ctx(|| format!("reading PVC {ns}/{n}"))?;
                report.pvc = pvc.as_ref().map(claim);
            }
            pv = Some(found);
        }
        Target::Pod { namespace, name } => {
            // A Pod has volumes, each its own status: `pod_status`.
            return Err(Error::BadTarget(format!("pod/{name} (in {namespace})")));
        }
        Target::Volume(name) => {
            report.volume_name = name.clone();
            let all = pvs
                .list(&ListParams::default())
                .await
                .ctx(|| "listing PVs".into())?;
            pv = all
                .items
                .into_iter()
                .find(|p| csi_handle(p).is_some_and(|(d, h)| d == CSI_DRIVER_NAME && h == *name));
        }
    }
    if let Some(p) = &pv {
        let (driver, handle) = csi_handle(p).unwrap_or_default();
        report.pv = Some(status::PersistentVolume {
            name: p.name_any(),
            phase: p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
            driver: driver.into(),
            volume_handle: handle.into(),
        });
        if report.volume_name.is_empty() && driver == CSI_DRIVER_NAME {
            report.volume_name = handle.into();
        }
    }
    let name = report.volume_name.clone();
    if name.is_empty() {
        return Ok(report);
    }
    let volume = Api::<Volume>::all(client.clone())
        .get_opt(&name)
        .await
        .ctx(|| format!("reading Volume {name}"))?;
    report.volume = volume.as_ref().map(volume_summary);
    let va = Api::<VolumeAttachment>::all(client.clone())
        .get_opt(&name)
        .await
        .ctx(|| format!("reading VolumeAttachment {name}"))?;
    report.tickets = va.as_ref().map(tickets::rows).unwrap_or_default();

    let ticket_ids: BTreeSet<&str> = report.tickets.iter().map(|t| t.id.as_str()).collect();
    let pv_name = pv.as_ref().map(|p| p.name_any());
    let svas = Api::<StorageVA>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ctx(|| "listing storage.k8s.io VolumeAttachments".into())?;
    for sva in svas.items {
        let for_pv = sva.spec.source.persistent_volume_name.is_some()
            && sva.spec.source.persistent_volume_name == pv_name;
        if !for_pv && !ticket_ids.contains(sva.name_any().as_str()) {
            continue;
        }
        let st = sva.status.as_ref();
        let err = st
            .and_then(|s| s.attach_error.as_ref().or(s.detach_error.as_ref()))
            .and_then(|e| e.message.clone())
            .unwrap_or_default();
        report.storage_attachments.push(status::StorageAttachment {
            name: sva.name_any(),
            node: sva.spec.node_name.clone(),
            attached: st.is_some_and(|s| s.attached),
            error: err,
        });
    }

    let mps = Api::<MountPod>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{LABEL_VOLUME}={name}")))
        .await
        .ctx(|| format!("listing the MountPods of {name}"))?;
    report.mounts = mps
        .items
        .iter()
        .filter(|m| m.spec.volume == name)
        .map(mount)
        .collect();

    let nodes: BTreeSet<String> = report
        .tickets
        .iter()
        .map(|t| t.node.clone())
        .chain(report.mounts.iter().map(|m| m.node.clone()))
        .collect();
    let agent_pods = Api::<Pod>::namespaced(client.clone(), tns)
        .list(&ListParams::default().labels(AGENT_SELECTOR))
        .await
        .ctx(|| format!("listing the tessera-node Pods in {tns}"))?;
    for node in nodes {
        let node_exists = Api::<Node>::all(client.clone())
            .get_opt(&node)
            .await
            .ctx(|| format!("reading Node {node}"))?
            .is_some();
        let csinode = Api::<CSINode>::all(client.clone())
            .get_opt(&node)
            .await
            .ctx(|| format!("reading CSINode {node}"))?;
        let pod = agent_pods
            .items
            .iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str()));
        if let Some(p) = pod {
            report
                .logs
                .push(agent_log(client, tns, p, &name, logs).await);
        }
        let lease = Api::<Lease>::namespaced(client.clone(), tns)
            .get_opt(&tessera_api::liveness_lease(&node))
            .await
            .ctx(|| format!("reading the liveness Lease of {node}"))?;
        report.agents.push(status::Agent {
            node: node.clone(),
            pod: pod.map(|p| format!("{tns}/{}", p.name_any())),
            ready: pod.is_some_and(pod_ready),
            version: pod.map(pod_version).unwrap_or_default(),
            csi_registered: csinode.as_ref().is_some_and(registered),
            node_exists,
            lease: lease.map(|l| node_lease(&l)).unwrap_or_default(),
        });
    }
    Ok(report)
}

/// What a liveness Lease says (its renewTime against this machine's clock: shown,
/// never decided on).
fn node_lease(l: &Lease) -> status::NodeLease {
    if l.annotations().contains_key(tessera_api::ANNOTATION_FENCED) {
        return status::NodeLease::Fenced;
    }
    let spec = l.spec.clone().unwrap_or_default();
    let renewed = spec.renew_time.map(|t| t.0);
    let age_seconds = renewed
        .map(|t| jiff::Timestamp::now().duration_since(t).as_secs().max(0))
        .unwrap_or(i64::MAX);
    let fence_after_seconds = spec.lease_duration_seconds.map(i64::from).unwrap_or(0);
    status::NodeLease::Renewed {
        age_seconds,
        fence_after_seconds,
    }
}

/// Every MountPod.
pub async fn mountpods(client: &Client) -> Result<Vec<MountPod>, Error> {
    Ok(Api::<MountPod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ctx(|| "listing MountPods".into())?
        .items)
}

/// The last lines of the agent Pod's log that mention `volume`.
async fn agent_log(
    client: &Client,
    tns: &str,
    pod: &Pod,
    volume: &str,
    limits: &LogLimits,
) -> status::LogTail {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let name = pod.name_any();
    let lp = LogParams {
        container: Some("tessera".into()),
        tail_lines: Some(limits.search),
        ..Default::default()
    };
    let source = format!(
        "agent Pod {tns}/{name}, container tessera: its lines naming the volume among the last {}",
        limits.search
    );
    match Api::<Pod>::namespaced(client.clone(), tns)
        .logs(&name, &lp)
        .await
    {
        Ok(text) => {
            let lines: Vec<String> = text
                .lines()
                .filter(|l| l.contains(volume))
                .map(String::from)
                .collect();
            let skip = lines.len().saturating_sub(limits.show);
            status::LogTail {
                node,
                source,
                lines: lines.into_iter().skip(skip).collect(),
            }
        }
        Err(e) => status::LogTail {
            node,
            source: format!(
                "agent Pod {tns}/{name}: log not readable: {}",
                tessera_runtime::error_chain(&e)
            ),
            lines: vec![],
        },
    }
}

/// Label selectors of `doctor`.
pub struct Selectors<'a> {
    /// For Volumes, VolumeAttachments and MountPods.
    pub objects: Option<&'a str>,
    /// For Nodes.
    pub nodes: Option<&'a str>,
}

/// List parameters with a label selector, if one is given.
pub fn list_params(selector: Option<&str>) -> ListParams {
    match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    }
}

/// What `doctor` checks.
pub async fn inventory(
    client: &Client,
    tns: &str,
    lease_name: &str,
    sel: Selectors<'_>,
) -> Result<doctor::Inventory, Error> {
    let lp = || list_params(sel.objects);
    let mut inv = doctor::Inventory {
        namespace: tns.into(),
        lease_name: lease_name.into(),
        ..Default::default()
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in api::crds() {
        let name = crd.name_any();
        let served = crds
            .get_opt(&name)
            .await
            .ctx(|| format!("reading CRD {name}"))?
            .map(|c| {
                c.spec
                    .versions
                    .iter()
                    .filter(|v| v.served)
                    .map(|v| v.name.clone())
                    .collect::<Vec<_>>()
            });
        inv.crds.insert(name, served);
    }
    let lease = Api::<Lease>::namespaced(client.clone(), tns)
        .get_opt(lease_name)
        .await
        .ctx(|| format!("reading Lease {tns}/{lease_name}"))?;
    inv.lease = lease.and_then(|l| l.spec).map(|s| doctor::LeaseInfo {
        holder: s.holder_identity.unwrap_or_default(),
        renewed: s.renew_time.map(|t| t.0),
        duration_secs: i64::from(s.lease_duration_seconds.unwrap_or(0)),
    });
    inv.nodes = Api::<Node>::all(client.clone())
        .list(&list_params(sel.nodes))
        .await
        .ctx(|| "listing Nodes".into())?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), tns);
    for (selector, out) in [
        (AGENT_SELECTOR, &mut inv.agents),
        (CONTROLLER_SELECTOR, &mut inv.controllers),
        (FD_HOLDER_SELECTOR, &mut inv.fd_holders),
    ] {
        let list = pods
            .list(&ListParams::default().labels(selector))
            .await
            .ctx(|| format!("listing Pods {selector} in {tns}"))?;
        *out = list.items.iter().map(pod_info).collect();
    }
    let selector =
        format!("app.kubernetes.io/name=tessera,app.kubernetes.io/component={MOUNT_POD_COMPONENT}");
    inv.mount_pods = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .ctx(|| format!("listing mount Pods in {tns}"))?
        .items
        .iter()
        .map(mount_pod_info)
        .collect();
    inv.policies = policies(client).await?;
    let csinodes = Api::<CSINode>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ctx(|| "listing CSINodes".into())?;
    inv.csi_registered = csinodes
        .items
        .iter()
        .filter(|c| registered(c))
        .map(|c| c.name_any())
        .collect();

    // The Tessera kinds are absent when the CRDs are: nothing to list then.
    if inv.crds.values().any(Option::is_none) {
        return Ok(inv);
    }
    let volumes = Api::<Volume>::all(client.clone())
        .list(&lp())
        .await
        .ctx(|| "listing Volumes".into())?;
    let vas = Api::<VolumeAttachment>::all(client.clone())
        .list(&lp())
        .await
        .ctx(|| "listing VolumeAttachments".into())?;
    let mps = Api::<MountPod>::all(client.clone())
        .list(&lp())
        .await
        .ctx(|| "listing MountPods".into())?;
    for v in &volumes.items {
        let status = v.status.as_ref();
        match status.and_then(|s| s.state) {
            Some(VolumeState::Deleting) => inv.volumes_deleting.push(v.name_any()),
            Some(VolumeState::Faulted) => {
                let c = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Faulted"));
                inv.faulted.push(doctor::FaultedVolume {
                    name: v.name_any(),
                    reason: c.map(|c| c.reason.clone()).unwrap_or_default(),
                    message: c.map(|c| c.message.clone()).unwrap_or_default(),
                });
            }
            _ => {}
        }
    }
    inv.deleting
        .extend(volumes.items.iter().filter_map(deleting));
    inv.deleting.extend(vas.items.iter().filter_map(deleting));
    inv.deleting.extend(mps.items.iter().filter_map(deleting));
    inv.awaiting_daemon
        .extend(mps.items.iter().filter_map(|mp| {
            let ready = mp.status.as_ref()?.conditions.iter().find(|c| {
                c.type_ == tessera_api::CONDITION_READY && c.reason == "AwaitingDaemon"
            })?;
            Some(doctor::AwaitingDaemon {
                mountpod: mp.name_any(),
                volume: mp.spec.volume.clone(),
                node: mp.spec.node_name.clone(),
                since: Some(ready.last_transition_time.0),
            })
        }));
    for va in &vas.items {
        for t in tickets::rows(va).into_iter().filter(|t| !t.satisfied) {
            inv.unsatisfied.push(doctor::WaitingTicket {
                volume: va.name_any(),
                id: t.id,
                node: t.node,
                reason: t.reason,
                message: t.message,
                requested_at: t.requested_at,
            });
        }
    }
    Ok(inv)
}

fn deleting<K: Resource<DynamicType = ()>>(obj: &K) -> Option<doctor::Deleting> {
    let m = obj.meta();
    Some(doctor::Deleting {
        kind: K::kind(&()).into_owned(),
        name: m.name.clone().unwrap_or_default(),
        since: m.deletion_timestamp.as_ref()?.0,
        finalizers: m.finalizers.clone().unwrap_or_default(),
    })
}

fn claim(pvc: &PersistentVolumeClaim) -> status::Claim {
    status::Claim {
        namespace: pvc.namespace().unwrap_or_default(),
        name: pvc.name_any(),
        phase: pvc
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
        volume_name: pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default(),
        storage_class: pvc
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default(),
    }
}

fn csi_handle(pv: &PersistentVolume) -> Option<(&str, &str)> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    Some((csi.driver.as_str(), csi.volume_handle.as_str()))
}

fn volume_summary(v: &Volume) -> status::VolumeSummary {
    let st = v.status.clone().unwrap_or_default();
    status::VolumeSummary {
        size: v.spec.size.0.clone(),
        access_mode: v.spec.access_mode.to_string(),
        state: st.state.map(|s| format!("{s:?}")).unwrap_or_default(),
        attached_nodes: st.attached_nodes,
        deleting_since: v.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        conditions: st
            .conditions
            .iter()
            .filter(|c| {
                c.status != api::condition_status::TRUE || c.type_ == api::CONDITION_NODE_FAILOVER
            })
            .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect(),
    }
}

fn mount(m: &MountPod) -> status::Mount {
    let st = m.status.clone().unwrap_or_default();
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| {
            if c.message.is_empty() {
                c.reason.clone()
            } else {
                format!("{}: {}", c.reason, c.message)
            }
        })
        .unwrap_or_default();
    status::Mount {
        name: m.name_any(),
        node: m.spec.node_name.clone(),
        task: format!("{:?}", m.spec.task),
        phase: st.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
        pid: st.pid,
        restarts: st.restarts,
        last_error: st.last_error.unwrap_or_default(),
        ready,
        references: m
            .spec
            .references
            .iter()
            .map(|r| {
                format!(
                    "{} ({}{})",
                    r.target_path,
                    r.owner,
                    if r.read_only { ", ro" } else { "" }
                )
            })
            .collect(),
        deleting_since: m.metadata.deletion_timestamp.as_ref().map(|t| t.0),
    }
}

/// Tessera's ValidatingAdmissionPolicies with their bindings; `None` when the API
/// server does not serve them (404 on the list).
async fn policies(client: &Client) -> Result<Option<Vec<doctor::PolicyInfo>>, Error> {
    let lp = ListParams::default().labels("app.kubernetes.io/name=tessera");
    let found = match Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .list(&lp)
        .await
    {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(None),
        Err(e) => return Err(e).ctx(|| "listing ValidatingAdmissionPolicies".into()),
    };
    // Bindings are listed without the label: one written by hand binds as well.
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ctx(|| "listing ValidatingAdmissionPolicyBindings".into())?
        .items;
    Ok(Some(
        found
            .iter()
            .map(|p| {
                let name = p.name_any();
                let spec = p.spec.as_ref();
                let expressions = spec.into_iter().flat_map(|s| {
                    let conditions = s
                        .match_conditions
                        .iter()
                        .flatten()
                        .map(|c| c.expression.as_str());
                    let validations = s
                        .validations
                        .iter()
                        .flatten()
                        .map(|v| v.expression.as_str());
                    let variables = s.variables.iter().flatten().map(|v| v.expression.as_str());
                    conditions.chain(validations).chain(variables)
                });
                doctor::PolicyInfo {
                    bindings: bindings
                        .iter()
                        .filter(|b| b.spec.policy_name == name)
                        .map(|b| b.name_any())
                        .collect(),
                    service_accounts: doctor::service_accounts(expressions),
                    name,
                }
            })
            .collect(),
    ))
}

fn pod_info(p: &Pod) -> doctor::PodInfo {
    let spec = p.spec.as_ref();
    let tessera = spec.and_then(|s| s.containers.iter().find(|c| c.name == "tessera"));
    doctor::PodInfo {
        name: p.name_any(),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        ready: pod_ready(p),
        version: pod_version(p),
        image: tessera.and_then(|c| c.image.clone()).unwrap_or_default(),
        mount_image: tessera
            .and_then(|c| flag_value(c.args.as_deref().unwrap_or_default(), "--mount-image")),
        unready_containers: p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| !c.ready)
            .map(|c| {
                match c
                    .state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                {
                    Some(reason) => format!("{} ({reason})", c.name),
                    None => c.name.clone(),
                }
            })
            .collect(),
    }
}

/// The value of `--flag=VALUE` or `--flag VALUE` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            return Some(v.to_string());
        }
    }
    None
}

fn mount_pod_info(p: &Pod) -> doctor::MountPodInfo {
    let status = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == MOUNT_POD_CONTAINER));
    let spec = p.spec.as_ref();
    doctor::MountPodInfo {
        name: p.name_any(),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        ready: pod_ready(p),
        image: spec
            .and_then(|s| s.containers.iter().find(|c| c.name == MOUNT_POD_CONTAINER))
            .and_then(|c| c.image.clone())
            .unwrap_or_default(),
        restarts: status.map(|c| c.restart_count).unwrap_or(0),
        last_terminated: status
            .and_then(|c| c.last_state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.reason.clone()),
        waiting: status
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone()),
    }
}

fn registered(c: &CSINode) -> bool {
    c.spec.drivers.iter().any(|d| d.name == CSI_DRIVER_NAME)
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The tag of the Pod's `tessera` container image, else its `app.kubernetes.io/version`.
fn pod_version(p: &Pod) -> String {
    let image = p
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == "tessera"))
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    match doctor::image_tag(&image) {
        Some(tag) => tag.into(),
        None => p
            .labels()
            .get("app.kubernetes.io/version")
            .cloned()
            .unwrap_or_default(),
    }
}
