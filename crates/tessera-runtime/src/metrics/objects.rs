//! Per-object series: one Volume's state, one MountPod's phase, restarts and OOM
//! kills, labelled by the object (volume, node) and the claim the volume was made for
//! (`pvc`, `pvc_namespace`, empty for a volume of no claim), as kube-state-metrics and
//! Longhorn label theirs. The controller computes them from its caches
//! (`controller::state_metrics`, pure) and [`super::Metrics::set_states`] sets them.
//!
//! ```text
//!  Volume annotations tessera.io/pvc-name, tessera.io/pvc-namespace ─▶ Claim
//!  Volumes, MountPods (controller caches) ─▶ ObjectSeries (pure, at most MAX_OBJECTS
//!  of each kind) ─▶ tessera_volume_state, tessera_mountpod_phase, …
//! ```
//!
//! Cardinality is bounded: a label value is an object's name, a node's name, a claim's
//! name and namespace or a value of a closed set (state, phase); each Volume has one
//! state series and each MountPod one phase series; and no more than [`MAX_OBJECTS`]
//! Volumes and MountPods are exported (the first by name; those left out are counted in
//! `tessera_objects_omitted`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::EncodeLabelSet;

use tessera_api::{ANNOTATION_PVC_NAME, ANNOTATION_PVC_NAMESPACE};

/// At most this many Volumes (and as many MountPods) get series of their own.
pub const MAX_OBJECTS: usize = 10_000;

/// The claim a volume was created for: empty strings for none.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    /// The PersistentVolumeClaim's name.
    pub pvc: String,
    /// Its namespace.
    pub pvc_namespace: String,
}

impl Claim {
    /// The claim the annotations of a Volume or MountPod name (both or neither).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Claim {
        match (
            annotations.get(ANNOTATION_PVC_NAME),
            annotations.get(ANNOTATION_PVC_NAMESPACE),
        ) {
            (Some(pvc), Some(ns)) if !pvc.is_empty() && !ns.is_empty() => Claim {
                pvc: pvc.clone(),
                pvc_namespace: ns.clone(),
            },
            _ => Claim::default(),
        }
    }
}

/// The claims of the volumes a node agent mounts, by volume (filled by its reconciles
/// from the MountPods' annotations, read by its FUSE counters on each scrape).
pub type Claims = Arc<RwLock<HashMap<String, Claim>>>;

/// The claim of `volume` in `claims`, or none.
pub fn claim_of(claims: &Claims, volume: &str) -> Claim {
    claims
        .read()
        .map(|c| c.get(volume).cloned().unwrap_or_default())
        .unwrap_or_default()
}

/// Labels of `tessera_volume_state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct VolumeStateLabels {
    /// The Volume.
    pub volume: String,
    /// Its claim's name, empty for none.
    pub pvc: String,
    /// Its claim's namespace, empty for none.
    pub pvc_namespace: String,
    /// Its `status.state`, `Unknown` before the first status.
    pub state: String,
}

/// Labels of one volume's mount on one node (MountPod series, FUSE counters, handoffs).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct MountLabels {
    /// The Volume.
    pub volume: String,
    /// The node.
    pub node: String,
    /// The volume's claim's name, empty for none.
    pub pvc: String,
    /// Its namespace, empty for none.
    pub pvc_namespace: String,
}

impl MountLabels {
    /// The labels of `volume` on `node`, of `claim`.
    pub fn new(volume: &str, node: &str, claim: Claim) -> Self {
        MountLabels {
            volume: volume.into(),
            node: node.into(),
            pvc: claim.pvc,
            pvc_namespace: claim.pvc_namespace,
        }
    }
}

/// Labels of `tessera_mountpod_phase`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct MountPhaseLabels {
    /// Volume, node and claim.
    #[prometheus(flatten)]
    pub mount: MountLabels,
    /// The MountPod's `status.phase`, `Unknown` before the agent reports one.
    pub phase: String,
}

/// Labels of `tessera_mount_handoffs_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandoffLabels {
    /// Volume, node and claim.
    #[prometheus(flatten)]
    pub mount: MountLabels,
    /// `takeover` (a dead daemon's successor took the kernel connection over) or
    /// `upgrade` (a new image's daemon took over from the old one).
    pub reason: String,
}

/// One Volume as the per-object series see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeView {
    /// Its name.
    pub name: String,
    /// Its claim.
    pub claim: Claim,
    /// Its state (`Unknown` before the first status).
    pub state: String,
}

/// One MountPod as the per-object series see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountPodView {
    /// Its name (the order in which MountPods are kept under [`MAX_OBJECTS`]).
    pub name: String,
    /// The volume it mounts.
    pub volume: String,
    /// Its node.
    pub node: String,
    /// The volume's claim.
    pub claim: Claim,
    /// Its phase (`Unknown` before the agent reports).
    pub phase: String,
    /// `status.restarts`.
    pub restarts: u64,
    /// `status.oomKills`.
    pub oom_kills: u64,
}

/// The per-object series and their values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectSeries {
    /// One series per Volume, value 1.
    pub volume_state: Vec<VolumeStateLabels>,
    /// MountPods by volume, node and phase (more than one while a mount is replaced).
    pub mountpod_phase: BTreeMap<MountPhaseLabels, i64>,
    /// Daemon restarts by volume and node (summed over its MountPods).
    pub mountpod_restarts: BTreeMap<MountLabels, u64>,
    /// Daemon OOM kills by volume and node.
    pub mountpod_oom_kills: BTreeMap<MountLabels, u64>,
    /// Objects left out over [`MAX_OBJECTS`].
    pub omitted: i64,
}

/// The series of `volumes` and `mountpods`: at most `max` of each kind, the first by
/// name.
pub fn series(
    mut volumes: Vec<VolumeView>,
    mut mountpods: Vec<MountPodView>,
    max: usize,
) -> ObjectSeries {
    let mut out = ObjectSeries::default();
    volumes.sort_by(|a, b| a.name.cmp(&b.name));
    mountpods.sort_by(|a, b| a.name.cmp(&b.name));
    let omitted = volumes.len().saturating_sub(max) + mountpods.len().saturating_sub(max);
    out.omitted = i64::try_from(omitted).unwrap_or(i64::MAX);
    for v in volumes.into_iter().take(max) {
        out.volume_state.push(VolumeStateLabels {
            volume: v.name,
            pvc: v.claim.pvc,
            pvc_namespace: v.claim.pvc_namespace,
            state: v.state,
        });
    }
    for mp in mountpods.into_iter().take(max) {
        let mount = MountLabels::new(&mp.volume, &mp.node, mp.claim);
        *out.mountpod_phase
            .entry(MountPhaseLabels {
                mount: mount.clone(),
                phase: mp.phase,
            })
            .or_default() += 1;
        *out.mountpod_restarts.entry(mount.clone()).or_default() += mp.restarts;
        *out.mountpod_oom_kills.entry(mount).or_default() += mp.oom_kills;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(pvc: &str, ns: &str) -> Claim {
        Claim {
            pvc: pvc.into(),
            pvc_namespace: ns.into(),
        }
    }

    #[test]
    fn a_claim_needs_both_annotations() {
        let a = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            Claim::from_annotations(&a(&[
                (ANNOTATION_PVC_NAME, "data"),
                (ANNOTATION_PVC_NAMESPACE, "db")
            ])),
            claim("data", "db")
        );
        assert_eq!(
            Claim::from_annotations(&a(&[(ANNOTATION_PVC_NAME, "data")])),
            Claim::default()
        );
        assert_eq!(
            Claim::from_annotations(&a(&[
                (ANNOTATION_PVC_NAME, ""),
                (ANNOTATION_PVC_NAMESPACE, "db")
            ])),
            Claim::default()
        );
        assert_eq!(Claim::from_annotations(&a(&[])), Claim::default());
    }

    fn mp(name: &str, volume: &str, node: &str, phase: &str, restarts: u64) -> MountPodView {
        MountPodView {
            name: name.into(),
            volume: volume.into(),
            node: node.into(),
            claim: if volume == "a" {
                claim("data", "db")
            } else {
                Claim::default()
            },
            phase: phase.into(),
            restarts,
            oom_kills: restarts / 2,
        }
    }

    #[test]
    fn one_state_series_per_volume_and_mounts_summed_per_volume_and_node() {
        let s = series(
            vec![
                VolumeView {
                    name: "b".into(),
                    claim: Claim::default(),
                    state: "Unknown".into(),
                },
                VolumeView {
                    name: "a".into(),
                    claim: claim("data", "db"),
                    state: "Attached".into(),
                },
            ],
            vec![
                mp("a-1", "a", "n1", "Ready", 2),
                // A replacement of the same mount (an upgrade's standby): one more in
                // its phase, restarts summed.
                mp("a-2", "a", "n1", "Mounting", 1),
                mp("b-1", "b", "n2", "Ready", 0),
            ],
            MAX_OBJECTS,
        );
        assert_eq!(
            s.volume_state,
            [
                VolumeStateLabels {
                    volume: "a".into(),
                    pvc: "data".into(),
                    pvc_namespace: "db".into(),
                    state: "Attached".into()
                },
                VolumeStateLabels {
                    volume: "b".into(),
                    pvc: "".into(),
                    pvc_namespace: "".into(),
                    state: "Unknown".into()
                },
            ]
        );
        let a1 = MountLabels::new("a", "n1", claim("data", "db"));
        assert_eq!(s.mountpod_phase.len(), 3);
        assert_eq!(
            s.mountpod_phase[&MountPhaseLabels {
                mount: a1.clone(),
                phase: "Ready".into()
            }],
            1
        );
        assert_eq!(s.mountpod_restarts[&a1], 3);
        assert_eq!(s.mountpod_oom_kills[&a1], 1);
        assert_eq!(
            s.mountpod_restarts[&MountLabels::new("b", "n2", Claim::default())],
            0
        );
        assert_eq!(s.omitted, 0);
    }

    #[test]
    fn objects_over_the_bound_are_left_out_and_counted() {
        let volumes = (0..5)
            .map(|i| VolumeView {
                name: format!("v{i}"),
                claim: Claim::default(),
                state: "Detached".into(),
            })
            .rev()
            .collect();
        let mountpods = (0..4).map(|i| mp(&format!("m{i}"), "b", "n", "Ready", 0));
        let s = series(volumes, mountpods.collect(), 3);
        let names: Vec<_> = s.volume_state.iter().map(|l| l.volume.as_str()).collect();
        assert_eq!(names, ["v0", "v1", "v2"], "the first by name");
        assert_eq!(s.omitted, 2 + 1);
        assert_eq!(series(vec![], vec![], 3), ObjectSeries::default());
    }

    #[test]
    fn claims_lookup_defaults_to_none() {
        let claims = Claims::default();
        claims
            .write()
            .unwrap()
            .insert("a".into(), claim("data", "db"));
        assert_eq!(claim_of(&claims, "a"), claim("data", "db"));
        assert_eq!(claim_of(&claims, "b"), Claim::default());
    }
}
