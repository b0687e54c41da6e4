//! Table tests of the preflight rules: two healthy nodes find nothing; each change
//! finds exactly the problem it introduces.

use tessera_host::preflight::RootFacts;

use super::*;
use crate::doctor::Severity;

fn node(name: &str, kernel: &str) -> NodeFacts {
    NodeFacts {
        node: name.into(),
        kernel: kernel.into(),
        host_paths: [
            "/var/lib/kubelet",
            "/var/lib/kubelet/plugins_registry",
            "/mnt/shared",
            "/dev/fuse",
        ]
        .map(|p| (p.to_string(), None))
        .into(),
        roots: ["/mnt/shared/tessera", "/var/lib/tessera/volumes"]
            .map(|r| {
                (
                    r.to_string(),
                    RootFacts {
                        exists: true,
                        problem: None,
                        filesystem: "ext4".into(),
                    },
                )
            })
            .into(),
    }
}

fn sight(name: &str, shared: &[&str], local: &[&str]) -> Sightings {
    Sightings {
        node: name.into(),
        seen: [
            (
                "/mnt/shared/tessera".to_string(),
                shared.iter().map(|s| s.to_string()).collect(),
            ),
            (
                "/var/lib/tessera/volumes".to_string(),
                local.iter().map(|s| s.to_string()).collect(),
            ),
        ]
        .into(),
    }
}

struct World {
    facts: Vec<NodeFacts>,
    sightings: Vec<Sightings>,
    roots: BTreeMap<String, Scope>,
}

fn healthy() -> World {
    World {
        facts: vec![node("a", "6.18.0-1-amd64"), node("b", "6.12.9")],
        sightings: vec![
            sight("a", &["a", "b"], &["a"]),
            sight("b", &["a", "b"], &["b"]),
        ],
        roots: [
            ("/mnt/shared/tessera".to_string(), Scope::Shared),
            ("/var/lib/tessera/volumes".to_string(), Scope::NodeLocal),
        ]
        .into(),
    }
}

fn problems(w: &World) -> Vec<(&'static str, String)> {
    diagnose(&w.facts, &w.sightings, &w.roots)
        .into_iter()
        .filter(|f| f.severity == Severity::Problem)
        .map(|f| {
            assert!(!f.fix.is_empty(), "a problem says what to do: {f:?}");
            (f.check, f.what)
        })
        .collect()
}

#[test]
fn healthy_nodes_have_no_problem() {
    let w = healthy();
    assert_eq!(problems(&w), vec![]);
    let all = diagnose(&w.facts, &w.sightings, &w.roots);
    assert!(all.iter().all(|f| f.severity == Severity::Ok), "{all:?}");
    let text = crate::doctor::render(&all, None);
    assert!(
        text.contains(
            "✓ [sharing] /mnt/shared/tessera is shared: each of 2 nodes sees every other's writes"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "✓ [sharing] /var/lib/tessera/volumes is node-local: each node has its own, as said"
        ),
        "{text}"
    );
}

#[test]
fn each_fault_is_found() {
    type Case = (
        &'static str,
        Box<dyn Fn(&mut World)>,
        Vec<(&'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        (
            "no /dev/fuse",
            Box::new(|w| {
                w.facts[1]
                    .host_paths
                    .insert("/dev/fuse".into(), Some("missing".into()));
            }),
            vec![(
                "host-paths",
                "node b: the node DaemonSet's hostPaths are not there: /dev/fuse (missing)",
            )],
        ),
        (
            "no registration dir",
            Box::new(|w| {
                w.facts[0].host_paths.insert(
                    "/var/lib/kubelet/plugins_registry".into(),
                    Some("missing".into()),
                );
            }),
            vec![(
                "host-paths",
                "node a: the node DaemonSet's hostPaths are not there: /var/lib/kubelet/plugins_registry (missing)",
            )],
        ),
        (
            "root missing on one node",
            Box::new(|w| {
                let r = w.facts[1].roots.get_mut("/mnt/shared/tessera").unwrap();
                r.exists = false;
                r.problem = Some("missing".into());
                // b cannot mark or look there.
                w.sightings[0]
                    .seen
                    .insert("/mnt/shared/tessera".into(), vec!["a".into()]);
                w.sightings[1].seen.remove("/mnt/shared/tessera");
            }),
            vec![(
                "roots",
                "backend root /mnt/shared/tessera is not a directory on b (missing)",
            )],
        ),
        (
            "the default NodeLocal root not made yet: the agent makes it, no problem",
            Box::new(|w| {
                for f in &mut w.facts {
                    let r = f.roots.get_mut("/var/lib/tessera/volumes").unwrap();
                    r.exists = false;
                    r.problem = Some("missing".into());
                }
                for s in &mut w.sightings {
                    s.seen.remove("/var/lib/tessera/volumes");
                }
            }),
            vec![],
        ),
        (
            "shared root that is not",
            Box::new(|w| {
                w.sightings[0]
                    .seen
                    .insert("/mnt/shared/tessera".into(), vec!["a".into()]);
                w.sightings[1]
                    .seen
                    .insert("/mnt/shared/tessera".into(), vec!["b".into()]);
            }),
            vec![(
                "sharing",
                "/mnt/shared/tessera is said to be shared, but each node has its own",
            )],
        ),
        (
            "node-local root that is shared",
            Box::new(|w| {
                for s in &mut w.sightings {
                    s.seen.insert(
                        "/var/lib/tessera/volumes".into(),
                        vec!["a".into(), "b".into()],
                    );
                }
            }),
            vec![(
                "sharing",
                "/var/lib/tessera/volumes is one filesystem shared by 2 nodes, said to be node-local",
            )],
        ),
        (
            "split root",
            Box::new(|w| {
                w.facts.push(node("c", "6.18"));
                w.sightings[0]
                    .seen
                    .insert("/mnt/shared/tessera".into(), vec!["a".into(), "b".into()]);
                w.sightings[1]
                    .seen
                    .insert("/mnt/shared/tessera".into(), vec!["a".into(), "b".into()]);
                w.sightings.push(sight("c", &["c"], &["c"]));
            }),
            vec![(
                "sharing",
                "/mnt/shared/tessera is split: the nodes see different sets of each other's writes (a+b | c)",
            )],
        ),
        (
            "a node that did not report",
            Box::new(|w| {
                w.sightings.pop();
            }),
            vec![
                ("sharing", "/mnt/shared/tessera: 1 of 2 nodes reported"),
                ("sharing", "/var/lib/tessera/volumes: 1 of 2 nodes reported"),
            ],
        ),
        (
            "unreadable kernel",
            Box::new(|w| w.facts[0].kernel = "weird".into()),
            vec![("kernel", "node a: kernel release \"weird\" unreadable")],
        ),
    ];
    for (name, change, want) in cases {
        let mut w = healthy();
        change(&mut w);
        let got = problems(&w);
        assert_eq!(got.len(), want.len(), "{name}: {got:?}");
        for ((check, what), (wc, ww)) in got.iter().zip(&want) {
            assert_eq!(check, wc, "{name}");
            assert!(what.contains(ww), "{name}: {what:?} lacks {ww:?}");
        }
    }
}

#[test]
fn notes_old_kernels_unknown_scopes_and_one_node() {
    let mut w = healthy();
    w.facts[1].kernel = "6.1.0-18-amd64".into();
    w.roots
        .insert("/var/lib/tessera/volumes".into(), Scope::Unknown);
    assert_eq!(problems(&w), vec![]);
    let infos: Vec<String> = diagnose(&w.facts, &w.sightings, &w.roots)
        .into_iter()
        .filter(|f| f.severity == Severity::Info)
        .map(|f| f.what)
        .collect();
    assert_eq!(infos.len(), 2, "{infos:?}");
    assert!(infos[0].contains("node b: Linux 6.1.0-18-amd64 is older than 6.9"));
    assert!(infos[1].contains("/var/lib/tessera/volumes is node-local: each node has its own"));
    let one = World {
        facts: vec![node("a", "6.18")],
        sightings: vec![],
        roots: w.roots.clone(),
    };
    assert_eq!(problems(&one), vec![]);
}

#[test]
fn roots_and_kernels_parse() {
    assert_eq!(parse_root("/mnt/x/"), Ok(("/mnt/x".into(), Scope::Unknown)));
    assert_eq!(
        parse_root("/mnt/x=shared"),
        Ok(("/mnt/x".into(), Scope::Shared))
    );
    assert_eq!(
        parse_root("/d=node-local"),
        Ok(("/d".into(), Scope::NodeLocal))
    );
    for bad in ["mnt/x", "/a/../etc", "/x=both"] {
        assert!(parse_root(bad).is_err(), "{bad}");
    }
    assert_eq!(kernel_version("6.12.3-amd64"), Some((6, 12)));
    assert_eq!(kernel_version("5.15"), Some((5, 15)));
    assert_eq!(kernel_version("x"), None);
    assert!(kernel_version("6.9.0").unwrap() >= FULL_FEATURE_KERNEL);
    assert!(kernel_version("6.8.12").unwrap() < FULL_FEATURE_KERNEL);
}

#[test]
fn roots_of_the_roots_file_with_their_scopes() {
    let text = "# roots\n/var/lib/tessera/volumes NodeLocal\n/mnt/shared/tessera Shared\n/old/\n/bad shared\n";
    let want: BTreeMap<String, Scope> = [
        ("/var/lib/tessera/volumes".to_string(), Scope::NodeLocal),
        ("/mnt/shared/tessera".to_string(), Scope::Shared),
        ("/old".to_string(), Scope::Unknown),
    ]
    .into();
    assert_eq!(roots_of_file(text), want);
    // The file config/ ships.
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/backend-roots.yaml"),
    )
    .unwrap();
    let block: String = shipped
        .split("backend-roots: |")
        .nth(1)
        .unwrap()
        .lines()
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    assert_eq!(
        roots_of_file(&block),
        BTreeMap::from([
            ("/var/lib/tessera/volumes".to_string(), Scope::NodeLocal),
            ("/mnt/shared/tessera".to_string(), Scope::Shared),
        ])
    );
}
