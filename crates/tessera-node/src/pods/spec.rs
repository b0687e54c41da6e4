//! The mount Pod of one MountPod, built without I/O: what the agent creates in pod
//! mode (see [`super`]). Every setting a daemon gets from the agent is here.
//!
//! ```text
//!  Template (agent: namespace, node, image, paths) ─┐
//!  DaemonSpec (mount_service::start) ─────────────────────────┴─ mount_pod() ─▶ Pod
//!     name        pod_name(volume, node): the MountPod's name, DNS-valid, ≤ 253
//!     owner       the MountPod (controller), so deleting it deletes the Pod
//!     container   `tessera mount …` = daemon_args::mount_args, privileged, /dev/fuse,
//!                 hostPID (the daemon sees its callers' pids)
//!     hostPaths   mount root (Bidirectional), state dir, backend root (HostToContainer)
//!     metadata    the user's extras (labels, annotations, tolerations, priority
//!                 class: extras::Extras), Tessera's own labels and annotation over them
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, HostPathVolumeSource, LocalObjectReference, Pod, PodSpec,
    ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use tessera_api::{
    ANNOTATION_MOUNTPOD, MOUNT_POD_COMPONENT, MOUNT_POD_CONTAINER, MountResources, ResourceAmounts,
    cpu_millis, quantity_bytes,
};

use crate::daemon_spec::{self, DaemonSpec};
use crate::pods::extras::Extras;

/// What every mount Pod of this agent shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The agent's namespace.
    pub namespace: String,
    /// This node.
    pub node: String,
    /// The image (the agent's own unless `--mount-image` says otherwise).
    pub image: String,
    /// Its pull policy (the agent's own; `None`: the cluster's default).
    pub pull_policy: Option<String>,
    /// The Secrets the kubelet pulls the image with (the agent's own Pod's
    /// `imagePullSecrets`: a registry that wants credentials for the agent's image
    /// wants them for its mount Pods too).
    pub image_pull_secrets: Vec<String>,
    /// `<mount root>/<volume>` is where daemons mount.
    pub mount_root: PathBuf,
    /// The agent's state directory (capacity and counters files, and the takeover
    /// socket and state to come).
    pub state_dir: PathBuf,
    /// Seconds between SIGTERM and SIGKILL when a mount Pod is deleted without a grace
    /// of its own (owner GC): time for the daemon to unmount.
    pub termination_grace_seconds: i64,
    /// The mount container's requests and limits where the Volume sets none (the
    /// agent's `--mount-cpu-request`, …).
    pub resources: MountResources,
    /// The user's labels, annotations, tolerations and priority class (the agent's
    /// `--mount-pod-*`); [`Extras::default`]: every taint tolerated,
    /// system-node-critical.
    pub extras: Extras,
}

/// The mount container's requests and limits: each amount the Volume's, else the
/// agent's default; a default request above the Volume's limit is lowered to that
/// limit (the API server refuses a request above its limit).
pub fn container_resources(
    defaults: &MountResources,
    volume: Option<&MountResources>,
) -> ResourceRequirements {
    let pick = |v: Option<&Option<Quantity>>, d: &Option<Quantity>| {
        v.and_then(|q| q.clone()).or_else(|| d.clone())
    };
    let cpu = |q: &Quantity| cpu_millis(&q.0).ok();
    let mem = |q: &Quantity| quantity_bytes(&q.0).ok();
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    for (name, is_cpu) in [("cpu", true), ("memory", false)] {
        fn field(a: &ResourceAmounts, is_cpu: bool) -> &Option<Quantity> {
            if is_cpu { &a.cpu } else { &a.memory }
        }
        let request = pick(
            volume.map(|v| field(&v.requests, is_cpu)),
            field(&defaults.requests, is_cpu),
        );
        let limit = pick(
            volume.map(|v| field(&v.limits, is_cpu)),
            field(&defaults.limits, is_cpu),
        );
        let amount = |q: &Quantity| if is_cpu { cpu(q) } else { mem(q) };
        let request = match (&request, &limit) {
            (Some(r), Some(l)) if amount(r).zip(amount(l)).is_some_and(|(r, l)| r > l) => {
                Some(l.clone())
            }
            _ => request,
        };
        if let Some(r) = request {
            requests.insert(name.to_string(), r);
        }
        if let Some(l) = limit {
            limits.insert(name.to_string(), l);
        }
    }
    ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..ResourceRequirements::default()
    }
}

/// The labels Tessera sets on every mount Pod: the agent finds its mount Pods by
/// them ([`selector`]), so they win over an extra label of the same key.
pub fn own_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "tessera".to_string()),
        (
            "app.kubernetes.io/component".into(),
            MOUNT_POD_COMPONENT.into(),
        ),
    ])
}

/// The annotation keys Tessera sets on every mount Pod (they win too).
pub const OWN_ANNOTATIONS: [&str; 1] = [ANNOTATION_MOUNTPOD];

/// The keys of `extras` that a mount Pod does not carry because Tessera sets its
/// own there (`label <key>` or `annotation <key>`), for the agent to warn about.
pub fn overridden(extras: &Extras) -> Vec<String> {
    let own = own_labels();
    let labels = extras.labels.keys().filter(|k| own.contains_key(*k));
    let annotations = extras
        .annotations
        .keys()
        .filter(|k| OWN_ANNOTATIONS.contains(&k.as_str()));
    labels
        .map(|k| format!("label {k}"))
        .chain(annotations.map(|k| format!("annotation {k}")))
        .collect()
}

/// The label selector of this agent's mount Pods (with `spec.nodeName` as field selector).
pub fn selector() -> String {
    format!("app.kubernetes.io/name=tessera,app.kubernetes.io/component={MOUNT_POD_COMPONENT}")
}

/// The mount Pod's name: the MountPod's (`api::mountpod_name(volume, node)`), with
/// anything a Pod name cannot hold replaced, so every volume name makes a valid one.
pub fn pod_name(volume: &str, node: &str) -> String {
    let clean: String = volume
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    let clean = clean.trim_start_matches(['-', '.']);
    let clean = if clean.is_empty() { "v" } else { clean };
    tessera_api::mountpod_name(clean, node)
}

/// The name of a mount Pod started as a standby beside the one named [`pod_name`]
/// (an upgrade): that name (cut to fit) and a hash of `image`. Deterministic, so the
/// agent recognises either after a restart.
pub fn standby_name(volume: &str, node: &str, image: &str) -> String {
    // FNV-1a, 32 bit: stable across releases and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in image.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    let base = pod_name(volume, node);
    let prefix: String = base.chars().take(253 - 9).collect();
    format!("{}-{h:08x}", prefix.trim_end_matches(['-', '.']))
}

/// Whether the Pod named `name`, running `image`, is a mount Pod of `volume` on `node`.
pub fn is_mount_pod_of(name: &str, image: Option<&str>, volume: &str, node: &str) -> bool {
    name == pod_name(volume, node) || image.is_some_and(|i| name == standby_name(volume, node, i))
}

/// The image of a mount Pod's container.
pub fn image_of(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == MOUNT_POD_CONTAINER)?
        .image
        .as_deref()
}

/// A mount Pod for `spec` named `name` whose daemon waits for the one serving the
/// mount to leave, then takes it over (`--standby`).
pub fn standby_pod(t: &Template, spec: &DaemonSpec, name: &str) -> Pod {
    let mut pod = mount_pod(t, spec);
    pod.metadata.name = Some(name.to_string());
    if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        let mut args = spec.daemon_args();
        args.standby = true;
        c.args = Some(daemon_spec::strings(args.to_args()));
    }
    pod
}

/// The volume a mount point `<mount root>/<volume>` serves.
pub fn volume_of(mountpoint: &Path) -> String {
    mountpoint
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn host_path(name: &str, path: &Path, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.display().to_string(),
            type_: Some(type_.into()),
        }),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &Path, propagation: Option<&str>) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.display().to_string(),
        mount_propagation: propagation.map(Into::into),
        ..VolumeMount::default()
    }
}

/// The mount Pod serving `spec` on `t.node`.
pub fn mount_pod(t: &Template, spec: &DaemonSpec) -> Pod {
    let backend_root = spec.source.parent().unwrap_or(Path::new("/"));
    // The user's extras first, Tessera's own over them: they win.
    let mut labels = t.extras.labels.clone();
    labels.extend(own_labels());
    let mut annotations = t.extras.annotations.clone();
    annotations.insert(ANNOTATION_MOUNTPOD.to_string(), spec.mountpod.clone());
    let owner = (!spec.mountpod_uid.is_empty()).then(|| {
        vec![OwnerReference {
            api_version: "tessera.io/v1alpha1".into(),
            kind: "MountPod".into(),
            name: spec.mountpod.clone(),
            uid: spec.mountpod_uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&spec.volume, &t.node)),
            namespace: Some(t.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: owner,
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(t.node.clone()),
            restart_policy: Some("Always".into()),
            // The host's pid namespace, as process mode's daemons (children of the
            // agent, which has hostPID) have: the kernel then gives the daemon its
            // callers' pids, from which it learns their supplementary groups where it
            // checks permissions itself (a Pod's fsGroup; tessera_fuse::fs::perms).
            // In a namespace of its own every caller's pid would be 0.
            host_pid: Some(true),
            // By default system-node-critical and every taint, like the agent's: a
            // volume is served wherever a Pod needs it. No nodeSelector nor
            // affinity: nodeName binds the Pod to this node.
            priority_class_name: t.extras.priority_class_name.clone(),
            tolerations: (!t.extras.tolerations.is_empty()).then(|| t.extras.tolerations.clone()),
            // The daemon talks to no API server.
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(t.termination_grace_seconds),
            image_pull_secrets: (!t.image_pull_secrets.is_empty()).then(|| {
                t.image_pull_secrets
                    .iter()
                    .map(|name| LocalObjectReference { name: name.clone() })
                    .collect()
            }),
            containers: vec![Container {
                name: MOUNT_POD_CONTAINER.into(),
                image: Some(t.image.clone()),
                image_pull_policy: t.pull_policy.clone(),
                // The image's entrypoint is `tessera`.
                args: Some(daemon_spec::strings(spec.daemon_args().to_args())),
                // A failed daemon's last log lines become its terminated message, and
                // so the MountPod's lastError.
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                env: Some(vec![EnvVar {
                    name: "NO_COLOR".into(),
                    value: Some("1".into()),
                    ..EnvVar::default()
                }]),
                // FUSE mounts need CAP_SYS_ADMIN and /dev/fuse, and Bidirectional
                // propagation is allowed to privileged containers only.
                security_context: Some(SecurityContext {
                    privileged: Some(true),
                    ..SecurityContext::default()
                }),
                // The Volume's requests and limits over the agent's defaults. Past its
                // memory limit the daemon is OOM-killed: the agent tells the
                // application Pods, and the kubelet's restart takes the connection over.
                resources: Some(container_resources(&t.resources, spec.resources.as_ref())),
                volume_mounts: Some(vec![
                    mount("mounts", &t.mount_root, Some("Bidirectional")),
                    mount("state", &t.state_dir, None),
                    mount("backend", backend_root, Some("HostToContainer")),
                    mount("fuse", Path::new("/dev/fuse"), None),
                ]),
                ..Container::default()
            }],
            volumes: Some(vec![
                host_path("mounts", &t.mount_root, "DirectoryOrCreate"),
                host_path("state", &t.state_dir, "DirectoryOrCreate"),
                host_path("backend", backend_root, "Directory"),
                host_path("fuse", Path::new("/dev/fuse"), "CharDevice"),
            ]),
            ..PodSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon_spec::tests::spec;

    fn template() -> Template {
        Template {
            namespace: "tessera-system".into(),
            node: "n1".into(),
            image: "reg/tessera:1".into(),
            pull_policy: Some("Never".into()),
            image_pull_secrets: vec![],
            mount_root: "/var/lib/tessera/mounts".into(),
            state_dir: "/var/lib/tessera/node".into(),
            termination_grace_seconds: 30,
            resources: MountResources {
                requests: ResourceAmounts {
                    cpu: Some(Quantity("10m".into())),
                    memory: Some(Quantity("32Mi".into())),
                },
                limits: ResourceAmounts::default(),
            },
            extras: Extras::default(),
        }
    }

    fn valid_pod_name(n: &str) -> bool {
        n.len() <= 253
            && n.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    }

    #[test]
    fn names_are_the_mountpods_and_always_valid() {
        let long = "x".repeat(300);
        let table = [
            (
                "pvc-1",
                "n1",
                Some(tessera_api::mountpod_name("pvc-1", "n1")),
            ),
            ("pvc-1", "n2", None),
            ("Vol_ume", "n1", None),
            ("-.x", "n1", None),
            ("___", "n1", None),
            (long.as_str(), "n1", None),
        ];
        for (volume, node, exact) in table {
            let n = pod_name(volume, node);
            assert!(valid_pod_name(&n), "{volume:?} → {n:?}");
            if let Some(e) = exact {
                assert_eq!(n, e);
            }
        }
        assert_ne!(pod_name("v", "n1"), pod_name("v", "n2"), "one per node");
        for (volume, node) in [("v", "n1"), (&*"x".repeat(300), "n"), ("A_b.", "n")] {
            let s = standby_name(volume, node, "tessera:2");
            assert!(valid_pod_name(&s), "{s:?}");
            assert_ne!(s, pod_name(volume, node));
            assert_eq!(s, standby_name(volume, node, "tessera:2"), "deterministic");
            assert_ne!(s, standby_name(volume, node, "tessera:3"));
            assert!(is_mount_pod_of(&s, Some("tessera:2"), volume, node));
            assert!(is_mount_pod_of(&pod_name(volume, node), None, volume, node));
            assert!(!is_mount_pod_of(&s, Some("tessera:3"), volume, node));
            assert!(!is_mount_pod_of(&s, Some("tessera:2"), "w", node));
        }
        assert_eq!(volume_of(Path::new("/m/pvc-1")), "pvc-1");
    }

    #[test]
    fn the_pod_is_pulled_with_the_agents_pull_secrets() {
        let mut t = template();
        let pod = mount_pod(&t, &spec());
        assert_eq!(
            pod.spec.unwrap().image_pull_secrets,
            None,
            "none given: none"
        );
        t.image_pull_secrets = vec!["registry".into(), "mirror".into()];
        let names: Vec<String> = mount_pod(&t, &spec())
            .spec
            .unwrap()
            .image_pull_secrets
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["registry", "mirror"]);
    }

    #[test]
    fn the_pod_runs_the_daemon_as_process_mode_would() {
        let t = template();
        let mut s = spec();
        s.read_only = true;
        let pod = mount_pod(&t, &s);
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some(pod_name("v", "n1").as_str()));
        assert_eq!(meta.namespace.as_deref(), Some("tessera-system"));
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("MountPod", "v-1", "uid-1")
        );
        assert_eq!(owner.controller, Some(true));
        let ps = pod.spec.as_ref().unwrap();
        assert_eq!(ps.node_name.as_deref(), Some("n1"));
        assert_eq!(ps.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            ps.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        assert_eq!(ps.automount_service_account_token, Some(false));
        assert_eq!(
            ps.tolerations.as_ref().unwrap()[0].operator.as_deref(),
            Some("Exists")
        );
        let c = &ps.containers[0];
        assert_eq!(c.image.as_deref(), Some("reg/tessera:1"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Never"));
        assert_eq!(
            c.args.as_ref().unwrap(),
            &daemon_spec::strings(s.daemon_args().to_args())
        );
        assert_eq!(c.command, None, "the image's entrypoint, tessera");
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        assert_eq!(c.security_context.as_ref().unwrap().privileged, Some(true));
        assert_eq!(ps.host_pid, Some(true), "the daemon sees its callers' pids");
        let r = c.resources.as_ref().unwrap();
        assert!(r.limits.is_none(), "the template sets no limit");
        assert_eq!(r.requests.as_ref().unwrap()["memory"].0, "32Mi");
        // Every path the arguments name is inside a hostPath, at the same path.
        let mounts: Vec<(String, Option<String>)> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.mount_path.clone(), m.mount_propagation.clone()))
            .collect();
        let want = |p: &str, prop: Option<&str>| (p.to_string(), prop.map(String::from));
        assert_eq!(
            mounts,
            vec![
                want("/var/lib/tessera/mounts", Some("Bidirectional")),
                want("/var/lib/tessera/node", None),
                want("/b", Some("HostToContainer")),
                want("/dev/fuse", None),
            ]
        );
        let volumes = ps.volumes.as_ref().unwrap();
        for (m, v) in c.volume_mounts.as_ref().unwrap().iter().zip(volumes) {
            assert_eq!(m.name, v.name);
            assert_eq!(v.host_path.as_ref().unwrap().path, m.mount_path);
        }
    }

    #[test]
    fn every_path_of_the_arguments_is_mounted() {
        let t = template();
        let mut s = spec();
        s.source = "/mnt/shared/tessera/pvc-1".into();
        s.mountpoint = "/var/lib/tessera/mounts/pvc-1".into();
        s.capacity_file = "/var/lib/tessera/node/mounts/pvc-1.capacity".into();
        s.counters_file = "/var/lib/tessera/node/mounts/pvc-1.counters".into();
        let pod = mount_pod(&t, &s);
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let mounted: Vec<PathBuf> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| PathBuf::from(&m.mount_path))
            .collect();
        for path in [&s.source, &s.mountpoint, &s.capacity_file, &s.counters_file] {
            assert!(
                mounted.iter().any(|m| path.starts_with(m) && path != m),
                "{} not beneath a hostPath of the mount Pod",
                path.display()
            );
        }
    }

    #[test]
    fn the_volumes_resources_override_the_defaults() {
        let q = |s: &str| Some(Quantity(s.into()));
        let defaults = template().resources;
        let vol = |req_mem: Option<Quantity>, lim_mem: Option<Quantity>, lim_cpu| MountResources {
            requests: ResourceAmounts {
                cpu: None,
                memory: req_mem,
            },
            limits: ResourceAmounts {
                cpu: lim_cpu,
                memory: lim_mem,
            },
        };
        let get = |r: &ResourceRequirements, which: &str, name: &str| {
            let m = if which == "req" {
                &r.requests
            } else {
                &r.limits
            };
            m.as_ref().and_then(|m| m.get(name)).map(|q| q.0.clone())
        };
        let s = |v: &str| Some(v.to_string());
        for (what, volume, want) in [
            ("defaults only", None, [s("10m"), s("32Mi"), None, None]),
            (
                "a memory limit above the default request",
                Some(vol(None, q("64Mi"), None)),
                [s("10m"), s("32Mi"), None, s("64Mi")],
            ),
            (
                "a memory limit below the default request lowers it",
                Some(vol(None, q("16Mi"), None)),
                [s("10m"), s("16Mi"), None, s("16Mi")],
            ),
            (
                "the volume's request and a CPU limit below the default request",
                Some(vol(q("48Mi"), q("1Gi"), q("5m"))),
                [s("5m"), s("48Mi"), s("5m"), s("1Gi")],
            ),
        ] {
            let r = container_resources(&defaults, volume.as_ref());
            let got = [
                get(&r, "req", "cpu"),
                get(&r, "req", "memory"),
                get(&r, "lim", "cpu"),
                get(&r, "lim", "memory"),
            ];
            assert_eq!(got, want, "{what}");
        }
        let mut s = spec();
        s.resources = Some(vol(None, q("24Mi"), None));
        let pod = mount_pod(&template(), &s);
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["memory"].0, "24Mi");
    }

    #[test]
    fn the_users_extras_are_on_the_pod_and_tesseras_own_keys_win() {
        use k8s_openapi::api::core::v1::Toleration;
        let mut t = template();
        let strings = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let toleration = Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("storage".into()),
            effect: Some("NoSchedule".into()),
            toleration_seconds: None,
        };
        t.extras = Extras {
            labels: strings(&[
                ("team", "storage"),
                ("app.kubernetes.io/name", "other"),
                ("app.kubernetes.io/component", "other"),
            ]),
            annotations: strings(&[
                ("example.com/owner", "storage"),
                (ANNOTATION_MOUNTPOD, "someone-else"),
            ]),
            tolerations: vec![toleration.clone()],
            priority_class_name: Some("tessera-mounts".into()),
        };
        let s = spec();
        for pod in [mount_pod(&t, &s), standby_pod(&t, &s, "standby")] {
            let meta = &pod.metadata;
            assert_eq!(
                meta.labels.as_ref().unwrap(),
                &strings(&[
                    ("team", "storage"),
                    ("app.kubernetes.io/name", "tessera"),
                    ("app.kubernetes.io/component", MOUNT_POD_COMPONENT),
                ]),
                "Tessera's labels win: the agent finds its Pods by them"
            );
            assert_eq!(
                meta.annotations.as_ref().unwrap(),
                &strings(&[
                    ("example.com/owner", "storage"),
                    (ANNOTATION_MOUNTPOD, "v-1")
                ]),
            );
            let ps = pod.spec.as_ref().unwrap();
            assert_eq!(ps.tolerations.as_deref(), Some(&[toleration.clone()][..]));
            assert_eq!(ps.priority_class_name.as_deref(), Some("tessera-mounts"));
            assert_eq!(ps.node_name.as_deref(), Some("n1"), "bound to its node");
            assert!(ps.node_selector.is_none() && ps.affinity.is_none());
        }
        assert_eq!(
            overridden(&t.extras),
            [
                "label app.kubernetes.io/component",
                "label app.kubernetes.io/name",
                "annotation tessera.io/mountpod",
            ]
        );
        // No toleration and no priority class asked for: the Pod has none.
        t.extras = Extras {
            tolerations: vec![],
            priority_class_name: None,
            ..Extras::default()
        };
        let ps = mount_pod(&t, &s).spec.unwrap();
        assert_eq!((ps.tolerations, ps.priority_class_name), (None, None));
        assert!(overridden(&t.extras).is_empty());
        assert!(overridden(&Extras::default()).is_empty());
    }

    #[test]
    fn no_owner_without_a_uid() {
        let mut s = spec();
        s.mountpod_uid.clear();
        assert!(
            mount_pod(&template(), &s)
                .metadata
                .owner_references
                .is_none()
        );
    }
}
