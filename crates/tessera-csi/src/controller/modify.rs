//! Live modify: a VolumeAttributesClass's parameters (CSI `mutable_parameters`, from
//! the external-resizer's ControllerModifyVolume, or from the external-provisioner's
//! CreateVolume) as changes of the Volume's spec, with no I/O.
//!
//! ```text
//!  VAC parameters ─ parse() ─▶ Changes ─ patch(volume) ─▶ merge patch of Volume.spec
//!    attrCacheSeconds      live: the MountPods' daemons take it on SIGHUP, no remount
//!                          (MountPod status.applied.attrCacheSeconds says when)
//!    idleMountDelay        from the next idle period
//!    mountCPURequest, …    at each mount's next start (the mount Pod's resources)
//!    backendRoot, scope    refused: immutable (INVALID_ARGUMENT, saying so)
//!    anything else         refused: unknown (INVALID_ARGUMENT, naming the known keys)
//! ```

use std::collections::HashMap;

use serde_json::{Value, json};

use tessera_api::{MountResources, Volume};

use super::Error;
use super::parameters::{PARAMETERS, attr_cache_seconds, idle_mount_delay};
use super::resources;
use crate::shown;

/// What a VolumeAttributesClass asks to change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// `attrCacheSeconds`.
    pub attr_cache_seconds: Option<i64>,
    /// `idleMountDelay` (0: off).
    pub idle_mount_delay: Option<i64>,
    /// The `mount*` amounts named (each overrides the Volume's one amount).
    pub resources: MountResources,
}

/// Read the mutable parameters: every key known and valid, or the first that is not.
pub fn parse(params: &HashMap<String, String>) -> Result<Changes, Error> {
    let mut out = Changes::default();
    // In key order: the same parameters give the same error.
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for k in keys {
        let v = &params[k];
        if resources::set(&mut out.resources, k, v)? {
            continue;
        }
        match k.as_str() {
            "attrCacheSeconds" => out.attr_cache_seconds = Some(attr_cache_seconds(v)?),
            "idleMountDelay" => out.idle_mount_delay = Some(idle_mount_delay(v)?),
            k if PARAMETERS.iter().any(|p| p.name == k && !p.modifiable) => {
                return Err(Error::ImmutableParameter(shown(k)));
            }
            other => return Err(Error::UnknownMutableParameter(shown(other))),
        }
    }
    Ok(out)
}

/// The Volume's resources with the amounts `changes` names put over them, checked (a
/// request never above its limit).
fn merged_resources(
    have: Option<&MountResources>,
    changes: &MountResources,
) -> Result<Option<MountResources>, Error> {
    let mut r = have.cloned().unwrap_or_default();
    for (slot, new) in [
        (&mut r.requests.cpu, &changes.requests.cpu),
        (&mut r.requests.memory, &changes.requests.memory),
        (&mut r.limits.cpu, &changes.limits.cpu),
        (&mut r.limits.memory, &changes.limits.memory),
    ] {
        if new.is_some() {
            *slot = new.clone();
        }
    }
    resources::finish(r)
}

/// The resources of a new Volume: the StorageClass's, with a VolumeAttributesClass's
/// amounts over them.
pub fn with_resources(
    class: Option<&MountResources>,
    vac: &MountResources,
) -> Result<Option<MountResources>, Error> {
    if vac.is_empty() {
        return Ok(class.cloned());
    }
    merged_resources(class, vac)
}

/// The merge patch of `volume`'s spec that `changes` make; `None` when nothing changes.
pub fn patch(volume: &Volume, changes: &Changes) -> Result<Option<Value>, Error> {
    let spec = &volume.spec;
    let mut p = serde_json::Map::new();
    if let Some(a) = changes.attr_cache_seconds
        && spec.attr_cache_seconds != Some(a)
    {
        p.insert("attrCacheSeconds".into(), json!(a));
    }
    if let Some(d) = changes.idle_mount_delay {
        let want = Some(d).filter(|d| *d > 0);
        if spec.idle_mount_delay_seconds.filter(|d| *d > 0) != want {
            // null removes the field (merge patch): 0 is off.
            p.insert("idleMountDelaySeconds".into(), json!(want));
        }
    }
    if !changes.resources.is_empty() {
        let merged = merged_resources(spec.mount_resources.as_ref(), &changes.resources)?;
        if merged != spec.mount_resources {
            // The whole object: a merge patch would keep amounts the merge dropped.
            p.insert("mountResources".into(), json!(merged));
        }
    }
    Ok((!p.is_empty()).then(|| json!({"spec": p})))
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn volume(extra: Value) -> Volume {
        let mut spec = json!({"size": "1Gi", "accessMode": "ReadWriteOnce",
                              "backend": {"root": "/r"}});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
            "metadata": {"name": "v"}, "spec": spec,
        }))
        .unwrap()
    }

    fn code(e: Error) -> Code {
        tonic::Status::from(e).code()
    }

    #[test]
    fn mutable_parameters_become_changes() {
        let c = parse(&params(&[
            ("attrCacheSeconds", "30"),
            ("idleMountDelay", "5m"),
            ("mountMemoryLimit", "256Mi"),
        ]))
        .unwrap();
        assert_eq!(c.attr_cache_seconds, Some(30));
        assert_eq!(c.idle_mount_delay, Some(300));
        assert_eq!(c.resources.limits.memory.as_ref().unwrap().0, "256Mi");
        assert_eq!(parse(&params(&[])).unwrap(), Changes::default());
    }

    #[test]
    fn immutable_unknown_and_bad_parameters_are_refused_as_invalid_arguments() {
        for (kv, what) in [
            (vec![("backendRoot", "/elsewhere")], "immutable"),
            (vec![("scope", "NodeLocal")], "immutable"),
            (
                vec![("attrCacheSeconds", "5"), ("colour", "blue")],
                "unknown",
            ),
            (vec![("attrCacheSeconds", "3601")], "attrCacheSeconds"),
            (vec![("attrCacheSeconds", "-1")], "attrCacheSeconds"),
            (vec![("attrCacheSeconds", "1.5")], "attrCacheSeconds"),
            (vec![("idleMountDelay", "2d")], "idleMountDelay"),
            (vec![("mountMemoryLimit", "1Mi")], "mountMemoryLimit"),
        ] {
            let e = parse(&params(&kv)).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(what), "{kv:?}: {msg}");
            assert_eq!(code(e), Code::InvalidArgument, "{kv:?}");
        }
        let msg = parse(&params(&[("backendRoot", "/x")]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("new volume"), "says what to do instead: {msg}");
    }

    #[test]
    fn patches_change_only_what_differs() {
        let v = volume(json!({"attrCacheSeconds": 30, "idleMountDelaySeconds": 60,
            "mountResources": {"requests": {"memory": "32Mi"}, "limits": {"memory": "1Gi"}}}));
        let same = parse(&params(&[
            ("attrCacheSeconds", "30"),
            ("idleMountDelay", "1m"),
            ("mountMemoryLimit", "1Gi"),
        ]))
        .unwrap();
        assert_eq!(patch(&v, &same).unwrap(), None, "nothing to write");
        let c = parse(&params(&[
            ("attrCacheSeconds", "0"),
            ("idleMountDelay", "0"),
            ("mountMemoryLimit", "64Mi"),
        ]))
        .unwrap();
        assert_eq!(
            patch(&v, &c).unwrap().unwrap(),
            json!({"spec": {
                "attrCacheSeconds": 0,
                "idleMountDelaySeconds": null,
                "mountResources": {"requests": {"memory": "32Mi"}, "limits": {"memory": "64Mi"}},
            }})
        );
        let below = parse(&params(&[("mountMemoryLimit", "16Mi")])).unwrap();
        assert!(
            matches!(patch(&v, &below), Err(Error::MountResource { .. })),
            "the Volume's request 32Mi would exceed the new limit"
        );
    }
}
