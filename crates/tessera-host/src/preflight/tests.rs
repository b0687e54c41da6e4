//! The node side of preflight on a made-up host tree: what `check` reports, the
//! marker round trip, and the DaemonSet's hostPaths against config/ and the chart.

use super::*;

fn host() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let h = d.path().to_path_buf();
    for p in [
        "var/lib/kubelet/plugins_registry",
        "mnt/shared/tessera",
        "dev",
    ] {
        std::fs::create_dir_all(h.join(p)).unwrap();
    }
    (d, h)
}

#[test]
fn check_reports_each_path_and_root() {
    let (_d, h) = host();
    std::fs::write(h.join("mnt/not-a-dir"), b"").unwrap();
    let roots = [
        "/mnt/shared/tessera".to_string(),
        "/var/lib/tessera/volumes".into(),
        "/mnt/not-a-dir".into(),
    ];
    let f = check("node-a", &h, "/var/lib/kubelet", &roots);
    assert_eq!(f.node, "node-a");
    assert!(!f.kernel.is_empty());
    // No /dev/fuse in the made-up host (a char device needs mknod).
    assert_eq!(
        f.host_paths,
        BTreeMap::from([
            ("/var/lib/kubelet".into(), None),
            ("/var/lib/kubelet/plugins_registry".into(), None),
            ("/dev/fuse".into(), Some("missing".into())),
        ])
    );
    let r = &f.roots["/mnt/shared/tessera"];
    assert!(
        r.exists && r.problem.is_none() && !r.filesystem.is_empty(),
        "{r:?}"
    );
    assert_eq!(
        f.roots["/var/lib/tessera/volumes"],
        RootFacts {
            exists: false,
            problem: Some("missing".into()),
            filesystem: String::new()
        }
    );
    assert_eq!(
        f.roots["/mnt/not-a-dir"].problem.as_deref(),
        Some("a file, not a directory or device")
    );
    // The real /dev/fuse where this host has one.
    if Path::new("/dev/fuse").exists() {
        let f = check("n", Path::new("/"), "/var/lib/kubelet", &[]);
        assert_eq!(f.host_paths["/dev/fuse"], None);
    }
}

#[test]
fn markers_round_trip_and_stay_in_their_dirs() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let args = |node: &str| MarkerArgs {
        node: node.into(),
        token: "t0k3n".into(),
        dirs: vec![
            ("/shared".into(), a.path().to_path_buf()),
            ("/local".into(), b.path().to_path_buf()),
        ],
    };
    mark(&args("node-a")).unwrap();
    mark(&MarkerArgs {
        dirs: vec![("/shared".into(), a.path().to_path_buf())],
        ..args("node-b")
    })
    .unwrap();
    // A marker of another run is not this run's.
    std::fs::write(a.path().join(marker_name("other", "node-c")), b"").unwrap();
    let seen = look(&args("node-a")).unwrap();
    assert_eq!(
        seen.seen,
        BTreeMap::from([
            (
                "/shared".into(),
                vec!["node-a".to_string(), "node-b".into()]
            ),
            ("/local".into(), vec!["node-a".to_string()]),
        ])
    );
    // Marking twice fails: the marker is created new.
    assert!(mark(&args("node-a")).is_err());
    unmark(&args("node-a")).unwrap();
    unmark(&args("node-a")).unwrap();
    assert_eq!(look(&args("node-a")).unwrap().seen["/shared"], ["node-b"]);
    assert!(b.path().read_dir().unwrap().next().is_none());
}

#[test]
fn tokens_and_node_names_are_checked_before_any_file_is_touched() {
    let a = tempfile::tempdir().unwrap();
    for (node, token) in [
        ("node-a", "../x"),
        ("node-a", ""),
        ("../../etc", "t"),
        ("node/a", "t"),
        ("-a", "t"),
    ] {
        let m = MarkerArgs {
            node: node.into(),
            token: token.into(),
            dirs: vec![("/r".into(), a.path().to_path_buf())],
        };
        assert!(mark(&m).is_err(), "{node} {token}");
    }
    assert!(a.path().read_dir().unwrap().next().is_none());
}

#[test]
fn filesystem_names() {
    assert_eq!(filesystem_name(0xEF53), "ext4");
    assert_eq!(filesystem_name(0x6969), "nfs");
    assert_eq!(filesystem_name(0x1234), "0x1234");
}

/// The hostPaths of the node DaemonSet that must exist, from a manifest's text:
/// `{path: P, type: Directory|CharDevice}`.
fn required(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("hostPath: {path: ")?;
            let (path, rest) = rest.split_once(", type: ")?;
            let kind = rest.split('}').next()?;
            matches!(kind, "Directory" | "CharDevice").then(|| path.to_string())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_paths_checked_are_those_the_daemonset_needs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut want: Vec<String> = DAEMONSET_HOST_PATHS
        .iter()
        .map(|(p, _)| p.replace("{kubelet}", "/var/lib/kubelet"))
        .collect();
    want.sort();
    let config = std::fs::read_to_string(root.join("config/node.yaml")).unwrap();
    assert_eq!(required(&config), want, "config/node.yaml");
    // The chart's backend hostPaths come from its values (`node.backendMounts`): the
    // fixed ones must be checked.
    let chart = std::fs::read_to_string(root.join("charts/tessera/templates/node.yaml"))
        .unwrap()
        .replace("{{ $kubelet }}", "/var/lib/kubelet");
    let fixed = required(&chart);
    assert!(fixed.len() >= 3, "{fixed:?}");
    for p in &fixed {
        assert!(want.contains(p), "the chart's {p} is not checked");
    }
}
