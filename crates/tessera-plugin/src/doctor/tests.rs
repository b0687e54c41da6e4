//! Table tests of the doctor's rules: a healthy install finds nothing; each change
//! to it finds exactly the problem it introduces.

use jiff::{SignedDuration, Timestamp};

use super::*;

const TH: Thresholds = Thresholds {
    waiting_secs: 300,
    stuck_secs: 600,
};

fn ago(now: Timestamp, secs: i64) -> Timestamp {
    now - SignedDuration::from_secs(secs)
}

fn pod(name: &str, node: &str, version: &str) -> PodInfo {
    PodInfo {
        name: name.into(),
        node: node.into(),
        ready: true,
        version: version.into(),
        image: format!("reg/tessera:{version}"),
        ..PodInfo::default()
    }
}

fn mount_pod(name: &str, node: &str) -> MountPodInfo {
    MountPodInfo {
        name: name.into(),
        node: node.into(),
        ready: true,
        image: "reg/tessera:0.1.0".into(),
        ..MountPodInfo::default()
    }
}

fn policy(name: &str, namespace: &str) -> PolicyInfo {
    PolicyInfo {
        name: name.into(),
        bindings: vec![name.into()],
        service_accounts: vec![format!("system:serviceaccount:{namespace}:tessera-node")],
    }
}

fn healthy(now: Timestamp) -> Inventory {
    Inventory {
        namespace: "tessera-system".into(),
        crds: ["volumes", "volumeattachments", "mountpods"]
            .map(|k| {
                (
                    format!("{k}.tessera.io"),
                    Some(vec!["v1alpha1".to_string()]),
                )
            })
            .into(),
        lease_name: "tessera-controller".into(),
        lease: Some(LeaseInfo {
            holder: "ctrl-0".into(),
            renewed: Some(ago(now, 3)),
            duration_secs: 15,
        }),
        nodes: vec!["a".into(), "b".into()],
        agents: vec![pod("node-a", "a", "0.1.0"), pod("node-b", "b", "0.1.0")],
        controllers: vec![pod("ctrl-0", "a", "0.1.0")],
        csi_registered: ["a".to_string(), "b".to_string()].into(),
        deleting: vec![Deleting {
            kind: "Volume".into(),
            name: "fresh".into(),
            since: ago(now, 10),
            finalizers: vec!["tessera.io/volume-data".into()],
        }],
        volumes_deleting: vec![],
        unsatisfied: vec![WaitingTicket {
            volume: "v".into(),
            id: "csi-new".into(),
            node: "a".into(),
            reason: "HeldByOtherNode".into(),
            message: "held by csi-old on b".into(),
            requested_at: Some(ago(now, 60)),
        }],
        fd_holders: vec![pod("holder-a", "a", "0.1.0"), pod("holder-b", "b", "0.1.0")],
        mount_pods: vec![mount_pod("v-1a2b", "a"), mount_pod("w-3c4d", "b")],
        faulted: vec![],
        awaiting_daemon: vec![],
        policies: Some(POLICIES.map(|p| policy(p, "tessera-system")).to_vec()),
    }
}

fn problems(inv: &Inventory, now: Timestamp) -> Vec<(&'static str, String)> {
    diagnose(inv, now, TH)
        .into_iter()
        .filter(|f| f.severity == Severity::Problem)
        .map(|f| {
            assert!(!f.fix.is_empty(), "a problem says what to do: {f:?}");
            (f.check, f.what)
        })
        .collect()
}

#[test]
fn a_healthy_install_has_no_problem() {
    let now = Timestamp::now();
    let inv = healthy(now);
    assert_eq!(problems(&inv, now), vec![]);
    let out = render(&diagnose(&inv, now, TH), None);
    assert!(
        out.contains("✓ [leader] Lease tessera-system/tessera-controller held by ctrl-0"),
        "{out}"
    );
    assert!(out.contains("2 of 2 nodes have a Ready agent"), "{out}");
    assert!(out.ends_with("no problem found\n"), "{out}");
}

#[test]
fn each_fault_is_found_with_what_to_do() {
    type Change = Box<dyn Fn(&mut Inventory, Timestamp)>;
    type Case = (&'static str, Change, Vec<(&'static str, &'static str)>);
    let cases: Vec<Case> = vec![
        (
            "crd missing",
            Box::new(|i, _| {
                i.crds.insert("mountpods.tessera.io".into(), None);
            }),
            vec![("crds", "CRD mountpods.tessera.io is not installed")],
        ),
        (
            "crd version",
            Box::new(|i, _| {
                i.crds
                    .insert("volumes.tessera.io".into(), Some(vec!["v1beta1".into()]));
            }),
            vec![("crds", "does not serve v1alpha1 (serves: v1beta1)")],
        ),
        (
            "no lease",
            Box::new(|i, _| i.lease = None),
            vec![("leader", "no controller has ever led")],
        ),
        (
            "stale lease",
            Box::new(|i, now| i.lease.as_mut().unwrap().renewed = Some(ago(now, 120))),
            vec![("leader", "is stale: holder \"ctrl-0\", last renewed 2m ago")],
        ),
        (
            "released lease",
            Box::new(|i, _| i.lease.as_mut().unwrap().holder.clear()),
            vec![("leader", "is stale")],
        ),
        (
            "no agent",
            Box::new(|i, _| i.agents.retain(|p| p.node != "b")),
            vec![("agents", "node b has no Tessera agent")],
        ),
        (
            "agent not ready",
            Box::new(|i, _| i.agents[0].ready = false),
            vec![("agents", "the agent on node a (node-a) is not Ready")],
        ),
        (
            "not registered",
            Box::new(|i, _| {
                i.csi_registered.remove("a");
            }),
            vec![("agents", "node a: its CSINode does not list csi.tessera.io")],
        ),
        (
            "bare node",
            Box::new(|i, _| i.nodes.push("c".into())),
            vec![
                ("agents", "node c has no Tessera agent"),
                ("agents", "node c: its CSINode"),
            ],
        ),
        (
            "skew",
            Box::new(|i, _| i.agents[1].version = "0.2.0".into()),
            vec![(
                "versions",
                "version skew: controller 0.1.0, agents 0.1.0, 0.2.0",
            )],
        ),
        (
            "stuck finalizer",
            Box::new(|i, now| i.deleting[0].since = ago(now, 601)),
            vec![(
                "finalizers",
                "Volume fresh deleted 10m1s ago is held by finalizers tessera.io/volume-data",
            )],
        ),
        (
            "waiting ticket",
            Box::new(|i, now| i.unsatisfied[0].requested_at = Some(ago(now, 301))),
            vec![(
                "tickets",
                "ticket csi-new of v (node a) waits for 5m1s: HeldByOtherNode (held by csi-old on b)",
            )],
        ),
        (
            "no fd holder",
            Box::new(|i, _| i.fd_holders.retain(|p| p.node != "b")),
            vec![("fd-holder", "node b has no fd holder")],
        ),
        (
            "fd holder not ready",
            Box::new(|i, _| i.fd_holders[0].ready = false),
            vec![(
                "fd-holder",
                "the fd holder on node a (holder-a) is not Ready",
            )],
        ),
        (
            "mount pod not ready",
            Box::new(|i, _| {
                i.mount_pods[1].ready = false;
                i.mount_pods[1].waiting = Some("CrashLoopBackOff".into());
            }),
            vec![(
                "mount-pods",
                "mount Pod w-3c4d on node b is not Ready (CrashLoopBackOff)",
            )],
        ),
        (
            "mount pod oom",
            Box::new(|i, _| {
                i.mount_pods[0].last_terminated = Some("OOMKilled".into());
                i.mount_pods[0].restarts = 2;
            }),
            vec![(
                "mount-pods",
                "mount Pod v-1a2b on node a was OOMKilled (restarts: 2)",
            )],
        ),
        (
            "faulted volume",
            Box::new(|i, _| {
                i.faulted.push(FaultedVolume {
                    name: "bad".into(),
                    reason: "BackendRootNotAllowed".into(),
                    message: "backend.root refused: /etc".into(),
                })
            }),
            vec![(
                "volumes",
                "Volume bad is Faulted: BackendRootNotAllowed (backend.root refused: /etc)",
            )],
        ),
        (
            "sidecar not ready",
            Box::new(|i, _| {
                // The tessera container's readiness is the agents check's.
                i.controllers[0].unready_containers =
                    vec!["tessera".into(), "csi-attacher (CrashLoopBackOff)".into()]
            }),
            vec![(
                "sidecars",
                "container csi-attacher (CrashLoopBackOff) of Pod ctrl-0 (node a) is not ready",
            )],
        ),
        (
            "policy missing",
            Box::new(|i, _| {
                i.policies.as_mut().unwrap().remove(1);
            }),
            vec![(
                "admission",
                "ValidatingAdmissionPolicy tessera-node-inline-volumes does not exist",
            )],
        ),
        (
            "policy unbound",
            Box::new(|i, _| i.policies.as_mut().unwrap()[0].bindings.clear()),
            vec![(
                "admission",
                "ValidatingAdmissionPolicy tessera-node-own-mountpods has no binding",
            )],
        ),
        (
            "policy in another namespace",
            Box::new(|i, _| i.namespace = "storage".into()),
            vec![
                (
                    "admission",
                    "tessera-node-own-mountpods names system:serviceaccount:tessera-system:tessera-node but the agent runs as system:serviceaccount:storage:tessera-node",
                ),
                ("admission", "tessera-node-inline-volumes names"),
                ("admission", "tessera-node-inline-tickets names"),
                ("admission", "tessera-node-own-lease names"),
            ],
        ),
    ];
    for (name, change, want) in cases {
        let now = Timestamp::now();
        let mut inv = healthy(now);
        change(&mut inv, now);
        let got = problems(&inv, now);
        assert_eq!(got.len(), want.len(), "{name}: {got:?}");
        for ((check, what), (want_check, want_what)) in got.iter().zip(&want) {
            assert_eq!(check, want_check, "{name}");
            assert!(
                what.contains(want_what),
                "{name}: {what:?} lacks {want_what:?}"
            );
        }
        let out = render(&diagnose(&inv, now, TH), Some(200));
        assert!(out.starts_with('✗'), "{name}: problems come first:\n{out}");
    }
}

#[test]
fn thresholds_and_notes() {
    let now = Timestamp::now();
    let mut inv = healthy(now);
    // No finalizer left: nothing holds it, it is not stuck.
    inv.deleting[0].since = ago(now, 10_000);
    inv.deleting[0].finalizers.clear();
    // Not seen by the controller yet: no wait to measure.
    inv.unsatisfied[0].requested_at = None;
    inv.volumes_deleting.push("old".into());
    inv.controllers.clear();
    assert_eq!(problems(&inv, now), vec![]);
    let infos: Vec<_> = diagnose(&inv, now, TH)
        .into_iter()
        .filter(|f| f.severity == Severity::Info)
        .map(|f| f.check)
        .collect();
    assert_eq!(infos, ["versions", "volumes"]);
    for reason in [
        "Attaching",
        "HeldByOtherNode",
        "NodeNotFound",
        "Expired",
        "",
        "Whatever",
    ] {
        assert!(!what_to_do(reason).is_empty());
    }
    assert_ne!(what_to_do("Expired"), what_to_do("Whatever"));
    let one = vec![Finding::problem("x", "y".into(), "z".into())];
    assert!(render(&one, None).ends_with("1 problem found\n"));
}

#[test]
fn mount_pods_on_another_image_than_their_agent_are_a_note() {
    let now = Timestamp::now();
    let mut inv = healthy(now);
    inv.mount_pods[0].image = "reg/tessera:0.0.9".into();
    // An agent's --mount-image is what its mount Pods should run.
    inv.agents[1].mount_image = Some("reg/mount:1".into());
    assert_eq!(problems(&inv, now), vec![]);
    let notes: Vec<String> = diagnose(&inv, now, TH)
        .into_iter()
        .filter(|f| f.severity == Severity::Info)
        .map(|f| f.what)
        .collect();
    assert_eq!(
        notes,
        [
            "1 mount Pod(s) run another image than their node's agent mounts with (reg/mount:1): w-3c4d",
            "1 mount Pod(s) run another image than their node's agent mounts with (reg/tessera:0.1.0): v-1a2b",
        ]
    );
}

#[test]
fn a_mount_waiting_long_for_its_daemon_is_a_problem() {
    let now = Timestamp::now();
    let mut inv = healthy(now);
    let waiting = |secs| AwaitingDaemon {
        mountpod: "v-1a2b".into(),
        volume: "v".into(),
        node: "n1".into(),
        since: Some(ago(now, secs)),
    };
    // A daemon a few seconds late is normal: its mount Pod starts.
    inv.awaiting_daemon = vec![waiting(5)];
    assert_eq!(problems(&inv, now), vec![]);
    inv.awaiting_daemon = vec![waiting(90)];
    let found = problems(&inv, now);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "mounts");
    assert!(
        found[0]
            .1
            .starts_with("the mount of volume v on node n1 has waited 1m30s for its daemon"),
        "{found:?}"
    );
}

#[test]
fn policies_absent_from_the_api_server_are_a_note() {
    let now = Timestamp::now();
    let mut inv = healthy(now);
    inv.policies = None;
    assert_eq!(problems(&inv, now), vec![]);
    assert!(
        diagnose(&inv, now, TH)
            .iter()
            .any(|f| f.check == "admission" && f.severity == Severity::Info)
    );
}

#[test]
fn the_policies_checked_are_those_shipped() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for dir in ["config", "charts/tessera/templates"] {
        let mut shipped = Vec::new();
        for file in ["mountpod-policy.yaml", "inline-policy.yaml"] {
            let text = std::fs::read_to_string(root.join(dir).join(file)).unwrap();
            let mut lines = text.lines();
            while let Some(l) = lines.next() {
                if l.trim() == "kind: ValidatingAdmissionPolicy" {
                    let name = lines.find_map(|l| l.trim().strip_prefix("name: ")).unwrap();
                    shipped.push(name.to_string());
                }
            }
        }
        shipped.sort();
        let mut checked = POLICIES.to_vec();
        checked.sort();
        assert_eq!(shipped, checked, "{dir}");
    }
}

#[test]
fn service_accounts_named_in_expressions() {
    assert_eq!(
        service_accounts([
            "request.userInfo.username == 'system:serviceaccount:tessera-system:tessera-node'",
            "x == \"system:serviceaccount:a:b\" || y == 'system:serviceaccount:tessera-system:tessera-node'",
            "no account here",
        ]),
        [
            "system:serviceaccount:a:b",
            "system:serviceaccount:tessera-system:tessera-node",
        ]
    );
}

#[test]
fn image_tags() {
    for (image, want) in [
        ("tessera:0.1.0", Some("0.1.0")),
        ("registry.example:5000/team/tessera:0.2.0", Some("0.2.0")),
        ("ghcr.io/x/tessera:0.1.0@sha256:abcd", Some("0.1.0")),
        ("registry.example:5000/tessera", None),
        ("tessera@sha256:abcd", None),
        ("tessera:", None),
        ("", None),
    ] {
        assert_eq!(image_tag(image), want, "{image}");
    }
}
