//! Table tests of the doctor's rules: a healthy install finds nothing; each change
//! to it finds exactly the problem it introduces.

use super::*;
use jiff::{SignedDuration, Timestamp};

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
