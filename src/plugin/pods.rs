//! `kubectl tessera status pod/NAME`: which of a Pod's volumes may be Tessera's, and
//! where `status` starts for each — a claim (`persistentVolumeClaim`, or the claim a
//! generic `ephemeral` volume gets: `<pod>-<volume>`), or the Volume of an inline CSI
//! volume of `csi.tessera.io` (named from the Pod's uid and the volume's name, as the
//! node plugin names it). Other volumes (configMap, emptyDir, other drivers) are not
//! Tessera's and are left out.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Serialize;

use crate::api::CSI_DRIVER_NAME;
use crate::csi::node::ephemeral::inline_volume_name;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
