//! The StorageClass parameters, with no I/O: [`PARAMETERS`] lists each one (its
//! meaning, default, values, and whether a VolumeAttributesClass may change it) and
//! is the one list that [`Parameters::parse`], the VolumeAttributesClass's
//! `modify::parse`, the unknown-parameter error and the table in docs/csi.md
//! ([`table`], compared by `tests/manifests`) are checked against.
//!
//! ```text
//!  StorageClass.parameters ─▶ Parameters::parse ─▶ CreateVolume ─▶ Volume.spec
//!  VolumeAttributesClass   ─▶ modify::parse (the `modifiable` ones) ─▶ Volume patch
//! ```

use std::collections::HashMap;
use std::time::Duration;

use tessera_api::{self as api, BackendScope};
use tessera_text::duration::Bounds;

use super::Error;
use crate::shown;

/// One StorageClass parameter, as users read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parameter {
    /// The key in `parameters:`.
    pub name: &'static str,
    /// What it decides.
    pub meaning: &'static str,
    /// What an unset parameter means.
    pub default: &'static str,
    /// The values taken.
    pub values: &'static str,
    /// Whether a VolumeAttributesClass may change it on an existing volume.
    pub modifiable: bool,
    /// A value it takes (for the tests that hold this list to the parsers).
    pub example: &'static str,
}

/// Every StorageClass parameter Tessera reads (besides the sidecars'
/// `csi.storage.k8s.io/*`, which are ignored). Any other key is refused.
pub const PARAMETERS: &[Parameter] = &[
    Parameter {
        name: "backendRoot",
        meaning: "the allowed backend root the volume's directory is made under",
        default: "the controller's `--default-backend-root` (`/var/lib/tessera/volumes`)",
        values: "a root the administrator allowed (`--allowed-backend-root`, the roots file)",
        modifiable: false,
        example: "/default",
    },
    Parameter {
        name: "scope",
        meaning: "whether every node sees the volume's data (`Shared`) or only the node that made it (`NodeLocal`, topology keeps its Pods there)",
        default: "the scope its root is declared with",
        values: "`Shared`, `NodeLocal` (never `Shared` on a `NodeLocal` root)",
        modifiable: false,
        example: "NodeLocal",
    },
    Parameter {
        name: "nodeFailover",
        meaning: "whether a single-writer volume moves off a node that stopped renewing its Lease (docs/failover.md)",
        default: "`Off`",
        values: "`Off`, `Fenced`",
        modifiable: false,
        example: "Fenced",
    },
    Parameter {
        name: "idleMountDelay",
        meaning: "how long a node keeps a volume mounted after its last Pod there left",
        default: "0 (unmounted at once)",
        values: "a duration of whole seconds up to 24h: `90`, `90s`, `5m`, `1h30m`, `1d`; `0` is off",
        modifiable: true,
        example: "5m",
    },
    Parameter {
        name: "attrCacheSeconds",
        meaning: "how long the kernel caches attributes and names (a longer cache: fewer requests, changes made behind the mount seen later)",
        default: "the daemon's own",
        values: "whole seconds from 0 to 3600 (`30`, or a duration such as `1m`)",
        modifiable: true,
        example: "30",
    },
    Parameter {
        name: "mountCPURequest",
        meaning: "the mount daemon's CPU request (its mount Pod)",
        default: "the node agent's `--mount-cpu-request` (10m)",
        values: "a CPU quantity from 1m to 64 (`100m`, `0.5`, `2`)",
        modifiable: true,
        example: "50m",
    },
    Parameter {
        name: "mountCPULimit",
        meaning: "the mount daemon's CPU limit",
        default: "the node agent's `--mount-cpu-limit` (none)",
        values: "a CPU quantity from 1m to 64, not below the request",
        modifiable: true,
        example: "1",
    },
    Parameter {
        name: "mountMemoryRequest",
        meaning: "the mount daemon's memory request",
        default: "the node agent's `--mount-memory-request` (32Mi)",
        values: "an amount of memory from 16Mi to 64Gi",
        modifiable: true,
        example: "64Mi",
    },
    Parameter {
        name: "mountMemoryLimit",
        meaning: "the mount daemon's memory limit (it sizes its caches to it)",
        default: "the node agent's `--mount-memory-limit` (none)",
        values: "an amount of memory from 16Mi to 64Gi, not below the request",
        modifiable: true,
        example: "256Mi",
    },
];

/// The names of [`PARAMETERS`], for the error that refuses any other.
pub fn known() -> String {
    names(|_| true)
}

/// The names of the [`PARAMETERS`] a VolumeAttributesClass may change.
pub fn known_modifiable() -> String {
    names(|p| p.modifiable)
}

fn names(which: impl Fn(&Parameter) -> bool) -> String {
    PARAMETERS
        .iter()
        .filter(|p| which(p))
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`PARAMETERS`] as the Markdown table docs/csi.md carries.
pub fn table() -> String {
    let mut out = String::from(
        "| parameter | what it decides | unset | values | VolumeAttributesClass |\n|---|---|---|---|---|\n",
    );
    for p in PARAMETERS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            p.name,
            p.meaning,
            p.default,
            p.values,
            if p.modifiable {
                "changes it live"
            } else {
                "refused: immutable"
            }
        ));
    }
    out
}

/// The StorageClass parameters of a CreateVolume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parameters {
    /// `backendRoot`: where the volume's directory goes (default: the service's).
    pub backend_root: String,
    /// `scope`: `Shared` or `NodeLocal`; unset: the scope the administrator declared
    /// for the root (the default root is NodeLocal).
    pub scope: Option<BackendScope>,
    /// `idleMountDelay`: how long a node keeps an idle mount, in seconds (default: none).
    pub idle_mount_delay: Option<i64>,
    /// `mountCPURequest`, `mountCPULimit`, `mountMemoryRequest`, `mountMemoryLimit`:
    /// the mount daemon's resources (default: the node agent's).
    pub mount_resources: Option<api::MountResources>,
    /// `nodeFailover`: `Off` or `Fenced` (docs/failover.md); unset: off.
    pub node_failover: Option<api::NodeFailover>,
    /// `attrCacheSeconds`: how long the kernel may cache attributes and names, in
    /// seconds (unset: the daemon's default).
    pub attr_cache_seconds: Option<i64>,
}

/// The longest idle-mount delay: a day.
pub const MAX_IDLE_MOUNT_DELAY: i64 = 86_400;

/// An `idleMountDelay` parameter: a duration in the one grammar of
/// [`tessera_text::duration`] (`90`, `90s`, `5m`, `1h30m`, `1d`), whole seconds, from
/// 0 to a day.
pub fn idle_mount_delay(v: &str) -> Result<i64, Error> {
    whole_seconds(v, MAX_IDLE_MOUNT_DELAY, "from 0 to 1 day, in whole seconds")
        .ok_or_else(|| Error::IdleMountDelay(shown(v)))
}

/// The longest attribute cache: an hour.
pub const MAX_ATTR_CACHE_SECONDS: i64 = 3600;

/// An `attrCacheSeconds` value: a duration in the same grammar (a bare number is
/// seconds, as the name says), whole seconds from 0 to an hour.
pub fn attr_cache_seconds(v: &str) -> Result<i64, Error> {
    whole_seconds(v, MAX_ATTR_CACHE_SECONDS, "from 0 to 3600 seconds, whole")
        .ok_or_else(|| Error::AttrCacheSeconds(shown(v)))
}

/// `v` as whole seconds from 0 to `max` (each parameter's error says why not).
fn whole_seconds(v: &str, max: i64, said: &'static str) -> Option<i64> {
    let bounds = Bounds {
        zero: true,
        max: Duration::from_secs(max.unsigned_abs()),
        whole_seconds: true,
        said,
    };
    bounds.parse(v).ok().map(|d| d.as_secs() as i64)
}

/// The scope of a volume created under `params.backend_root`: the `scope` parameter,
/// else the one the administrator declared for the root; refused when a Shared volume
/// would lie on a NodeLocal root (its data would stay behind when its Pod moves).
pub fn scope_for(
    params: &Parameters,
    allowed: &tessera_host::roots::AllowedRoots,
) -> Result<BackendScope, Error> {
    use tessera_host::roots::RootScope;
    let declared = allowed
        .scope_of(&params.backend_root)
        .map_err(Error::BackendRoot)?;
    let scope = params.scope.unwrap_or(match declared {
        RootScope::Shared => BackendScope::Shared,
        RootScope::NodeLocal => BackendScope::NodeLocal,
    });
    let wanted = match scope {
        BackendScope::Shared => RootScope::Shared,
        BackendScope::NodeLocal => RootScope::NodeLocal,
    };
    allowed
        .check_scope(&params.backend_root, wanted)
        .map_err(Error::ScopeMismatch)?;
    Ok(scope)
}

impl Parameters {
    /// Read `params`; `csi.storage.k8s.io/*` (the sidecars' own) are ignored, any
    /// other unknown key is refused.
    pub fn parse(params: &HashMap<String, String>, default_root: &str) -> Result<Self, Error> {
        let mut out = Parameters {
            backend_root: default_root.to_string(),
            scope: None,
            idle_mount_delay: None,
            mount_resources: None,
            node_failover: None,
            attr_cache_seconds: None,
        };
        let mut resources = api::MountResources::default();
        for (k, v) in params {
            if super::resources::set(&mut resources, k, v)? {
                continue;
            }
            match k.as_str() {
                "backendRoot" => out.backend_root = v.clone(),
                "scope" => {
                    out.scope = Some(match v.as_str() {
                        "Shared" => BackendScope::Shared,
                        "NodeLocal" => BackendScope::NodeLocal,
                        other => return Err(Error::Scope(shown(other))),
                    })
                }
                "idleMountDelay" => {
                    out.idle_mount_delay = Some(idle_mount_delay(v)?).filter(|s| *s > 0)
                }
                "nodeFailover" => {
                    out.node_failover = Some(match v.as_str() {
                        "Off" => api::NodeFailover::Off,
                        "Fenced" => api::NodeFailover::Fenced,
                        other => return Err(Error::NodeFailover(shown(other))),
                    })
                }
                "attrCacheSeconds" => out.attr_cache_seconds = Some(attr_cache_seconds(v)?),
                k if k.starts_with("csi.storage.k8s.io/") => {}
                other => return Err(Error::UnknownParameter(shown(other))),
            }
        }
        out.mount_resources = super::resources::finish(resources)?;
        Ok(out)
    }
}

/// The external-provisioner's parameter naming the claim a volume is created for
/// (with `--extra-create-metadata`), and the one naming its namespace.
pub const PARAM_PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
/// See [`PARAM_PVC_NAME`].
pub const PARAM_PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";

/// The annotations recording the claim `params` name (both parameters or none: a
/// volume created without the provisioner's metadata has no claim annotations).
pub fn claim_annotations(
    params: &HashMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    match (params.get(PARAM_PVC_NAME), params.get(PARAM_PVC_NAMESPACE)) {
        (Some(name), Some(ns)) if !name.is_empty() && !ns.is_empty() => [
            (api::ANNOTATION_PVC_NAME.to_string(), name.clone()),
            (api::ANNOTATION_PVC_NAMESPACE.to_string(), ns.clone()),
        ]
        .into(),
        _ => Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn code(e: Error) -> Code {
        tonic::Status::from(e).code()
    }

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_scope_is_the_parameter_or_the_roots_and_never_shared_on_a_local_root() {
        use tessera_host::roots::AllowedRoots;
        let allowed = AllowedRoots::new([
            "/var/lib/tessera/volumes NodeLocal",
            "/mnt/shared/tessera Shared",
            "/old",
        ])
        .unwrap();
        let params = |root: &str, scope: Option<BackendScope>| Parameters {
            backend_root: root.into(),
            scope,
            idle_mount_delay: None,
            mount_resources: None,
            node_failover: None,
            attr_cache_seconds: None,
        };
        use BackendScope::*;
        // (root, scope parameter, Ok(scope) or the error's code)
        type Case<'a> = (&'a str, Option<BackendScope>, Result<BackendScope, Code>);
        let table: &[Case] = &[
            // A StorageClass with no parameters: the default root, NodeLocal.
            ("/var/lib/tessera/volumes", None, Ok(NodeLocal)),
            ("/var/lib/tessera/volumes/fast", None, Ok(NodeLocal)),
            ("/var/lib/tessera/volumes", Some(NodeLocal), Ok(NodeLocal)),
            (
                "/var/lib/tessera/volumes",
                Some(Shared),
                Err(Code::InvalidArgument),
            ),
            ("/mnt/shared/tessera", None, Ok(Shared)),
            ("/mnt/shared/tessera", Some(Shared), Ok(Shared)),
            ("/mnt/shared/tessera", Some(NodeLocal), Ok(NodeLocal)),
            // A root listed without a scope (the older file) is Shared, verified.
            ("/old", None, Ok(Shared)),
            ("/etc", None, Err(Code::InvalidArgument)),
        ];
        for (root, scope, want) in table {
            let got = scope_for(&params(root, *scope), &allowed).map_err(code);
            assert_eq!(got, *want, "{root} {scope:?}");
        }
        let e = scope_for(&params("/var/lib/tessera/volumes", Some(Shared)), &allowed)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("parameter scope") && e.contains("NodeLocal"),
            "{e}"
        );
    }

    #[test]
    fn idle_mount_delays() {
        for (v, want) in [
            ("0", Some(0)),
            ("90", Some(90)),
            ("90s", Some(90)),
            ("5m", Some(300)),
            ("1h", Some(3600)),
            ("24h", Some(86_400)),
            ("86400", Some(86_400)),
            ("86401", None),
            ("25h", None),
            ("", None),
            ("s", None),
            ("-5", None),
            ("1.5m", Some(90)),
            ("1.5s", None),
            ("1h30m", Some(5400)),
            ("1d", Some(86_400)),
            ("2d", None),
            ("99999999999999999999", None),
        ] {
            assert_eq!(idle_mount_delay(v).ok(), want, "{v:?}");
        }
    }

    #[test]
    fn the_claim_is_recorded_only_when_both_parameters_name_it() {
        let m = |kv: &[(&str, &str)]| -> HashMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let got = claim_annotations(&m(&[
            (PARAM_PVC_NAME, "data"),
            (PARAM_PVC_NAMESPACE, "db"),
            ("csi.storage.k8s.io/pv/name", "pvc-1"),
        ]));
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            [
                ("tessera.io/pvc-name".to_string(), "data".to_string()),
                ("tessera.io/pvc-namespace".to_string(), "db".to_string())
            ]
        );
        assert!(claim_annotations(&m(&[(PARAM_PVC_NAME, "data")])).is_empty());
        assert!(
            claim_annotations(&m(&[(PARAM_PVC_NAME, ""), (PARAM_PVC_NAMESPACE, "db")])).is_empty()
        );
        assert!(claim_annotations(&m(&[])).is_empty());
    }

    #[test]
    fn storage_class_parameters() {
        let p = |kv: &[(&str, &str)]| {
            let m: HashMap<String, String> = kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Parameters::parse(&m, "/default")
        };
        assert_eq!(
            p(&[]).unwrap(),
            Parameters {
                backend_root: "/default".into(),
                scope: None,
                idle_mount_delay: None,
                mount_resources: None,
                node_failover: None,
                attr_cache_seconds: None,
            }
        );
        assert_eq!(
            p(&[("nodeFailover", "Fenced")]).unwrap().node_failover,
            Some(api::NodeFailover::Fenced)
        );
        assert!(matches!(
            p(&[("nodeFailover", "Always")]),
            Err(Error::NodeFailover(_))
        ));
        assert_eq!(
            p(&[("idleMountDelay", "2m")]).unwrap().idle_mount_delay,
            Some(120)
        );
        assert_eq!(
            p(&[("idleMountDelay", "0")]).unwrap().idle_mount_delay,
            None,
            "0 is off"
        );
        assert!(matches!(
            p(&[("idleMountDelay", "soon")]),
            Err(Error::IdleMountDelay(_))
        ));
        let local = p(&[("backendRoot", "/data"), ("scope", "NodeLocal")]).unwrap();
        assert_eq!(local.backend_root, "/data");
        assert_eq!(local.scope, Some(BackendScope::NodeLocal));
        assert!(p(&[("csi.storage.k8s.io/pvc/name", "x")]).is_ok());
        assert!(matches!(
            p(&[("scope", "Everywhere")]),
            Err(Error::Scope(_))
        ));
        let long = "k".repeat(1000);
        match p(&[(long.as_str(), "v")]) {
            Err(Error::UnknownParameter(k)) => assert!(k.chars().count() <= 129, "{k}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_list_is_what_the_parsers_take() {
        for p in PARAMETERS {
            let one = map(&[(p.name, p.example)]);
            assert!(
                Parameters::parse(&one, "/default").is_ok(),
                "a StorageClass takes {}: {}",
                p.name,
                p.example
            );
            let modify = super::super::modify::parse(&one);
            if p.modifiable {
                assert!(modify.is_ok(), "a VolumeAttributesClass changes {}", p.name);
            } else {
                assert!(
                    matches!(modify, Err(Error::ImmutableParameter(_))),
                    "{}: {modify:?}",
                    p.name
                );
            }
        }
        let unknown = Parameters::parse(&map(&[("backendroot", "/x")]), "/d").unwrap_err();
        assert!(unknown.to_string().contains(&known()), "{unknown}");
        for p in PARAMETERS {
            assert!(known().contains(p.name));
        }
    }

    #[test]
    fn attr_cache_seconds_at_create() {
        let p = Parameters::parse(&map(&[("attrCacheSeconds", "1m")]), "/d").unwrap();
        assert_eq!(p.attr_cache_seconds, Some(60));
        for bad in ["3601", "1.5s", "-1", "soon"] {
            assert!(
                matches!(
                    Parameters::parse(&map(&[("attrCacheSeconds", bad)]), "/d"),
                    Err(Error::AttrCacheSeconds(_))
                ),
                "{bad}"
            );
        }
    }
}
