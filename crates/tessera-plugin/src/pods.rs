//! A Pod's Tessera volumes. [`volumes`]: which of a Pod's volumes may be Tessera's,
//! and where `status pod/NAME` starts for each — a claim (`persistentVolumeClaim`, or
//! the claim a generic `ephemeral` volume gets: `<pod>-<volume>`), or the Volume of an
//! inline CSI volume of `csi.tessera.io` (named from the Pod's uid and the volume's
//! name, as the node plugin names it). Other volumes (configMap, emptyDir, other
//! drivers) are not Tessera's and are left out. [`serving`]: the lines `status
//! pod/NAME` prints first for each volume — the MountPod on the Pod's node, whether it
//! holds a reference for this Pod, and the tickets for that node. [`rows`] and
//! [`render`]: `kubectl tessera pods [-A]`, every Pod with a Tessera volume, a line
//! per volume, with the MountPod that serves it on the Pod's node.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use serde::Serialize;

use tessera_api::inline_volume_name;
use tessera_api::{CSI_DRIVER_NAME, MountPod, MountTask};

use super::status;
use super::text;

/// Where `status` starts for one of the Pod's volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Start {
    /// A claim in the Pod's namespace (its PV says whether it is Tessera's).
    Claim { namespace: String, name: String },
    /// An inline `csi.tessera.io` volume's Volume.
    Volume { name: String },
}

/// One volume of the Pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolume {
    /// The name in `spec.volumes`.
    pub volume: String,
    pub start: Start,
}

/// The Pod's volumes that may be Tessera's, in `spec.volumes` order.
pub fn volumes(pod: &Pod) -> Vec<PodVolume> {
    let namespace = pod.namespace().unwrap_or_default();
    let uid = pod.uid().unwrap_or_default();
    let claim = |name: String| Start::Claim {
        namespace: namespace.clone(),
        name,
    };
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            let start = if let Some(c) = &v.persistent_volume_claim {
                claim(c.claim_name.clone())
            } else if v.ephemeral.is_some() {
                claim(format!("{}-{}", pod.name_any(), v.name))
            } else if v.csi.as_ref().is_some_and(|c| c.driver == CSI_DRIVER_NAME) {
                Start::Volume {
                    name: inline_volume_name(&uid, &v.name),
                }
            } else {
                return None;
            };
            Some(PodVolume {
                volume: v.name.clone(),
                start,
            })
        })
        .collect()
}

/// The Pod's node (empty: not scheduled yet).
pub fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// Whether a MountPod reference (its target path, its owner) is for the Pod with
/// `uid`: kubelet's publish path of a Pod's volume is under `…/pods/<uid>/volumes/`.
fn for_pod(target_path: &str, owner: &str, uid: &str) -> bool {
    !uid.is_empty()
        && (target_path.contains(&format!("/pods/{uid}/")) || owner == format!("pod/{uid}"))
}

/// What `status pod/NAME` prints first for one volume of the Pod on `node` with `uid`:
/// the MountPod of the volume on that node (or that none is there), whether it holds
/// a reference for this Pod, and the tickets asking for that node.
pub fn serving(report: &status::Report, node: &str, uid: &str) -> Vec<String> {
    if node.is_empty() {
        return vec!["   Pod not scheduled yet: no node, no mount".into()];
    }
    let mut out = Vec::new();
    let here: Vec<&status::Mount> = report.mounts.iter().filter(|m| m.node == node).collect();
    if here.is_empty() {
        out.push(format!(
            "   on node {node}: no MountPod of {}",
            report.volume_name
        ));
    }
    for m in here {
        // References are rendered `PATH (OWNER[, ro])` by the binary.
        let mine = m.references.iter().any(|r| {
            let (path, owner) = r.split_once(" (").unwrap_or((r, ""));
            let owner = owner.trim_end_matches(')').split(',').next().unwrap_or("");
            for_pod(path, owner, uid)
        });
        out.push(format!(
            "   on node {node}: MountPod {}   {}   {}",
            m.name,
            if m.phase.is_empty() { "-" } else { &m.phase },
            if mine {
                "bound into this Pod"
            } else {
                "no reference for this Pod (not published to it yet)"
            }
        ));
    }
    let tickets: Vec<String> = report
        .tickets
        .iter()
        .filter(|t| t.node == node)
        .map(|t| {
            let state = if t.satisfied {
                "satisfied".to_string()
            } else if t.reason.is_empty() {
                "waiting".to_string()
            } else {
                format!("waiting: {}", t.reason)
            };
            format!("{} {} ({state})", t.type_, t.id)
        })
        .collect();
    out.push(format!(
        "   tickets for {node}: {}",
        if tickets.is_empty() {
            "none".to_string()
        } else {
            tickets.join(", ")
        }
    ));
    out
}

/// What `pods` looks the Pods' volumes up in (the binary lists them).
pub struct Lookup<'a> {
    pub claims: &'a [PersistentVolumeClaim],
    pub pvs: &'a [PersistentVolume],
    /// StorageClasses whose provisioner is `csi.tessera.io` (an unbound claim of one
    /// of them is Tessera's; of another class, not).
    pub classes: &'a BTreeSet<String>,
    pub mountpods: &'a [MountPod],
}

/// One Tessera volume of one Pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRow {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    /// The name in the Pod's `spec.volumes`.
    pub volume: String,
    /// The claim (`name`, in the Pod's namespace); empty for an inline volume.
    pub claim: String,
    /// The Tessera Volume (empty: the claim is not bound yet).
    pub tessera_volume: String,
    /// The MountPod serving the volume on the Pod's node (empty: none).
    pub mount_pod: String,
    pub mount_phase: String,
    /// The MountPod holds a reference (a bind mount) for this Pod.
    pub bound: bool,
    /// What is wrong, in words (empty: nothing seen).
    pub problem: String,
}

/// The rows of `pods`: each Tessera volume of each Pod, by namespace, Pod, volume.
pub fn rows(pods: &[Pod], l: &Lookup) -> Vec<PodRow> {
    let claims: BTreeMap<(String, String), &PersistentVolumeClaim> = l
        .claims
        .iter()
        .map(|c| ((c.namespace().unwrap_or_default(), c.name_any()), c))
        .collect();
    let pvs: BTreeMap<String, &PersistentVolume> =
        l.pvs.iter().map(|pv| (pv.name_any(), pv)).collect();
    let mut out = Vec::new();
    for pod in pods {
        let node = node_of(pod);
        let uid = pod.uid().unwrap_or_default();
        for v in volumes(pod) {
            let mut row = PodRow {
                namespace: pod.namespace().unwrap_or_default(),
                pod: pod.name_any(),
                node: node.clone(),
                volume: v.volume.clone(),
                ..Default::default()
            };
            match &v.start {
                Start::Volume { name } => row.tessera_volume = name.clone(),
                Start::Claim { namespace, name } => {
                    row.claim = name.clone();
                    let Some(c) = claims.get(&(namespace.clone(), name.clone())) else {
                        row.problem = "claim not found".into();
                        out.push(row);
                        continue;
                    };
                    let spec = c.spec.clone().unwrap_or_default();
                    let bound_to = spec.volume_name.unwrap_or_default();
                    match pvs
                        .get(&bound_to)
                        .and_then(|pv| pv.spec.as_ref()?.csi.as_ref())
                    {
                        Some(csi) if csi.driver == CSI_DRIVER_NAME => {
                            row.tessera_volume = csi.volume_handle.clone();
                        }
                        // Another driver's volume, or not CSI: not Tessera's.
                        Some(_) => continue,
                        None if !bound_to.is_empty() && pvs.contains_key(&bound_to) => continue,
                        None => {
                            let class = spec.storage_class_name.unwrap_or_default();
                            if !l.classes.contains(&class) {
                                continue;
                            }
                            let phase = c
                                .status
                                .as_ref()
                                .and_then(|s| s.phase.clone())
                                .unwrap_or_default();
                            row.problem = if bound_to.is_empty() {
                                format!("claim {phase}, not bound yet")
                            } else {
                                format!("its PV {bound_to} not found")
                            };
                        }
                    }
                }
            }
            if !row.tessera_volume.is_empty() && !node.is_empty() {
                serving_mount(&mut row, l.mountpods, &uid);
            }
            out.push(row);
        }
    }
    out.sort_by(|a, b| (&a.namespace, &a.pod, &a.volume).cmp(&(&b.namespace, &b.pod, &b.volume)));
    out
}

/// The MountPod of the row's volume on its node, and whether it is bound for the Pod.
fn serving_mount(row: &mut PodRow, mps: &[MountPod], uid: &str) {
    let mp = mps.iter().find(|m| {
        m.spec.volume == row.tessera_volume
            && m.spec.node_name == row.node
            && m.spec.task == MountTask::Serve
    });
    let Some(mp) = mp else {
        row.problem = format!("no MountPod on {}", row.node);
        return;
    };
    row.mount_pod = mp.name_any();
    let st = mp.status.clone().unwrap_or_default();
    row.mount_phase = st.phase.map(|p| format!("{p:?}")).unwrap_or_default();
    row.bound = mp
        .spec
        .references
        .iter()
        .any(|r| for_pod(&r.target_path, &r.owner, uid));
    if let Some(c) = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status != "True")
    {
        row.problem = if c.message.is_empty() {
            c.reason.clone()
        } else {
            text::one_line(&format!("{}: {}", c.reason, c.message))
        };
    } else if !row.bound {
        row.problem = "not bound into the Pod yet".into();
    }
}

/// The table of `pods` (the namespace column only with `all_namespaces`).
pub fn render(rows: &[PodRow], all_namespaces: bool, width: Option<usize>) -> String {
    if rows.is_empty() {
        return "no Pods with Tessera volumes\n".to_string();
    }
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let mut headers = vec![
        "POD",
        "NODE",
        "VOLUME",
        "CLAIM",
        "TESSERA VOLUME",
        "MOUNTPOD",
        "PHASE",
        "BOUND",
        "PROBLEM",
    ];
    if all_namespaces {
        headers.insert(0, "NAMESPACE");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.pod.clone(),
                dash(&r.node),
                r.volume.clone(),
                dash(&r.claim),
                dash(&r.tessera_volume),
                dash(&r.mount_pod),
                dash(&r.mount_phase),
                if r.bound { "yes" } else { "no" }.to_string(),
                dash(&r.problem),
            ];
            if all_namespaces {
                c.insert(0, r.namespace.clone());
            }
            c
        })
        .collect();
    text::table(&headers, &cells, width)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn claims_ephemeral_claims_and_inline_volumes_in_order() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "1234-abcd"},
            "spec": {
                "containers": [{"name": "c", "image": "i"}],
                "volumes": [
                    {"name": "config", "configMap": {"name": "c"}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-pvc"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                        "spec": {"accessModes": ["ReadWriteOnce"],
                                 "resources": {"requests": {"storage": "1Gi"}}}}}},
                    {"name": "inline", "csi": {"driver": "csi.tessera.io"}},
                    {"name": "other", "csi": {"driver": "other.example.com"}},
                    {"name": "tmp", "emptyDir": {}},
                ]
            }
        }))
        .unwrap();
        let claim = |name: &str| Start::Claim {
            namespace: "shop".into(),
            name: name.into(),
        };
        let got = volumes(&pod);
        let want = vec![
            PodVolume {
                volume: "data".into(),
                start: claim("data-pvc"),
            },
            PodVolume {
                volume: "scratch".into(),
                start: claim("web-scratch"),
            },
            PodVolume {
                volume: "inline".into(),
                start: Start::Volume {
                    name: inline_volume_name("1234-abcd", "inline"),
                },
            },
        ];
        assert_eq!(got, want);
        assert!(matches!(&got[2].start, Start::Volume { name } if name.starts_with("inline-")));
    }

    #[test]
    fn a_pod_without_volumes_has_none() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        assert!(volumes(&pod).is_empty());
    }

    fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("a valid object")
    }

    fn pod(ns: &str, name: &str, uid: &str, node: Option<&str>, volumes: serde_json::Value) -> Pod {
        obj(json!({
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}], "volumes": volumes}
        }))
    }

    fn claim(
        ns: &str,
        name: &str,
        class: &str,
        bound_to: Option<&str>,
        phase: &str,
    ) -> PersistentVolumeClaim {
        obj(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"storageClassName": class, "volumeName": bound_to},
            "status": {"phase": phase}
        }))
    }

    fn pv(name: &str, driver: &str, handle: &str) -> PersistentVolume {
        obj(json!({
            "metadata": {"name": name},
            "spec": {"csi": {"driver": driver, "volumeHandle": handle}}
        }))
    }

    fn mountpod(
        name: &str,
        node: &str,
        volume: &str,
        refs: serde_json::Value,
        ready: &str,
    ) -> MountPod {
        obj(json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "MountPod",
            "metadata": {"name": name},
            "spec": {"volume": volume, "nodeName": node, "source": "/s", "task": "Serve",
                     "capacityBytes": 1, "references": refs},
            "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": ready,
                       "reason": if ready == "True" { "Mounted" } else { "DaemonFailed" },
                       "message": "", "lastTransitionTime": "2026-12-05T10:00:00Z"}]}
        }))
    }

    fn target(uid: &str, vol: &str) -> String {
        format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/{vol}/mount")
    }

    #[test]
    fn pods_rows_follow_claim_pv_and_mountpod_on_the_pods_node() {
        let pods = vec![
            pod(
                "shop",
                "web",
                "u-web",
                Some("a"),
                json!([
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}},
                    {"name": "inline", "csi": {"driver": "csi.tessera.io"}},
                ]),
            ),
            // Another driver's claim, bound, and an unbound claim of another class: none.
            pod(
                "shop",
                "db",
                "u-db",
                Some("b"),
                json!([
                    {"name": "d", "persistentVolumeClaim": {"claimName": "ebs"}},
                    {"name": "e", "persistentVolumeClaim": {"claimName": "pending-other"}},
                ]),
            ),
            // Not scheduled, its claim pending on a Tessera class; a missing claim.
            pod(
                "ops",
                "job",
                "u-job",
                None,
                json!([
                    {"name": "w", "persistentVolumeClaim": {"claimName": "work"}},
                    {"name": "m", "persistentVolumeClaim": {"claimName": "missing"}},
                    {"name": "l", "persistentVolumeClaim": {"claimName": "lost"}},
                ]),
            ),
        ];
        let claims = vec![
            claim("shop", "data", "tessera", Some("pv-data"), "Bound"),
            claim("shop", "logs", "tessera", Some("pv-logs"), "Bound"),
            claim("shop", "ebs", "gp3", Some("pv-ebs"), "Bound"),
            claim("shop", "pending-other", "gp3", None, "Pending"),
            claim("ops", "work", "tessera", None, "Pending"),
            claim("ops", "lost", "tessera", Some("pv-gone"), "Lost"),
        ];
        let pvs = vec![
            pv("pv-data", "csi.tessera.io", "vol-data"),
            pv("pv-logs", "csi.tessera.io", "vol-logs"),
            pv("pv-ebs", "ebs.csi.aws.com", "vol-0123"),
        ];
        let classes: BTreeSet<String> = ["tessera".to_string()].into();
        let inline = inline_volume_name("u-web", "inline");
        let mps = vec![
            // data: served on a (bound into web) and on b (not this Pod's node).
            mountpod(
                "mp-data-a",
                "a",
                "vol-data",
                json!([{"targetPath": target("u-web", "pv-data"), "owner": "csi/vol-data"}]),
                "True",
            ),
            mountpod("mp-data-b", "b", "vol-data", json!([]), "True"),
            // logs: on a, not ready, no reference for web yet.
            mountpod("mp-logs-a", "a", "vol-logs", json!([]), "False"),
            // inline: bound through the pod owner.
            mountpod(
                "mp-inline-a",
                "a",
                &inline,
                json!([{"targetPath": "/x", "owner": "pod/u-web"}]),
                "True",
            ),
        ];
        let l = Lookup {
            claims: &claims,
            pvs: &pvs,
            classes: &classes,
            mountpods: &mps,
        };
        let got = rows(&pods, &l);
        let row = |ns: &str,
                   pod: &str,
                   node: &str,
                   vol: &str,
                   claim: &str,
                   tv: &str,
                   mp: &str,
                   bound: bool,
                   problem: &str| PodRow {
            namespace: ns.into(),
            pod: pod.into(),
            node: node.into(),
            volume: vol.into(),
            claim: claim.into(),
            tessera_volume: tv.into(),
            mount_pod: mp.into(),
            mount_phase: if mp.is_empty() {
                String::new()
            } else {
                "Ready".into()
            },
            bound,
            problem: problem.into(),
        };
        let want = vec![
            row(
                "ops",
                "job",
                "",
                "l",
                "lost",
                "",
                "",
                false,
                "its PV pv-gone not found",
            ),
            row(
                "ops",
                "job",
                "",
                "m",
                "missing",
                "",
                "",
                false,
                "claim not found",
            ),
            row(
                "ops",
                "job",
                "",
                "w",
                "work",
                "",
                "",
                false,
                "claim Pending, not bound yet",
            ),
            row(
                "shop",
                "web",
                "a",
                "data",
                "data",
                "vol-data",
                "mp-data-a",
                true,
                "",
            ),
            row(
                "shop",
                "web",
                "a",
                "inline",
                "",
                &inline,
                "mp-inline-a",
                true,
                "",
            ),
            row(
                "shop",
                "web",
                "a",
                "logs",
                "logs",
                "vol-logs",
                "mp-logs-a",
                false,
                "DaemonFailed",
            ),
        ];
        assert_eq!(got, want);

        // No MountPod on the node at all.
        let l = Lookup {
            claims: &claims,
            pvs: &pvs,
            classes: &classes,
            mountpods: &[],
        };
        let got = rows(&pods[..1], &l);
        assert_eq!(got[0].problem, "no MountPod on a");
        assert_eq!(got[0].mount_pod, "");
    }

    #[test]
    fn pods_table_has_a_namespace_column_with_all_namespaces() {
        let r = PodRow {
            namespace: "shop".into(),
            pod: "web".into(),
            node: "a".into(),
            volume: "data".into(),
            claim: "data".into(),
            tessera_volume: "vol-data".into(),
            mount_pod: "mp".into(),
            mount_phase: "Running".into(),
            bound: true,
            problem: String::new(),
        };
        let one = render(std::slice::from_ref(&r), false, None);
        assert_eq!(
            one.lines().next().unwrap().split_whitespace().next(),
            Some("POD")
        );
        assert!(one.lines().nth(1).unwrap().starts_with("web "), "{one}");
        assert!(one.lines().nth(1).unwrap().contains(" yes "), "{one}");
        let all = render(&[r], true, None);
        assert!(all.starts_with("NAMESPACE "), "{all}");
        assert!(all.lines().nth(1).unwrap().starts_with("shop "), "{all}");
        assert_eq!(render(&[], true, None), "no Pods with Tessera volumes\n");
    }

    #[test]
    fn serving_names_the_mountpod_on_the_pods_node_and_its_tickets() {
        use crate::tickets::TicketRow;
        let ticket = |id: &str, node: &str, satisfied: bool, reason: &str| TicketRow {
            id: id.into(),
            type_: "csi-attacher".into(),
            node: node.into(),
            satisfied,
            reason: reason.into(),
            message: String::new(),
            owners: vec![],
            requested_at: None,
        };
        let mount = |name: &str, node: &str, refs: Vec<String>| status::Mount {
            name: name.into(),
            node: node.into(),
            phase: "Running".into(),
            references: refs,
            ..Default::default()
        };
        let report = status::Report {
            volume_name: "vol-data".into(),
            tickets: vec![
                ticket("csi-1", "a", true, "Granted"),
                ticket("csi-2", "b", false, "WaitingForDetach"),
            ],
            mounts: vec![
                mount(
                    "mp-a",
                    "a",
                    vec![format!("{} (csi/vol-data)", target("u-web", "pv"))],
                ),
                mount("mp-b", "b", vec![]),
            ],
            ..Default::default()
        };
        assert_eq!(
            serving(&report, "a", "u-web"),
            vec![
                "   on node a: MountPod mp-a   Running   bound into this Pod".to_string(),
                "   tickets for a: csi-attacher csi-1 (satisfied)".to_string(),
            ]
        );
        // Another Pod on node a: the mount is there, not bound for it.
        assert!(
            serving(&report, "a", "u-other")[0]
                .ends_with("no reference for this Pod (not published to it yet)")
        );
        assert_eq!(
            serving(&report, "b", "u-web")[1],
            "   tickets for b: csi-attacher csi-2 (waiting: WaitingForDetach)"
        );
        assert_eq!(
            serving(&report, "c", "u-web"),
            vec![
                "   on node c: no MountPod of vol-data".to_string(),
                "   tickets for c: none".to_string(),
            ]
        );
        assert_eq!(
            serving(&report, "", "u-web"),
            vec!["   Pod not scheduled yet: no node, no mount".to_string()]
        );
    }
}
