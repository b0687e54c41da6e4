//! `kubectl tessera preflight` on the real nodes: each node's own `/var/lib/tessera`
//! (the harness binds a directory per node) is node-local and `/mnt/shared/tessera`
//! (one directory bound into every node) is shared, and the plugin says so from the
//! markers its Pods leave and look for; then one thing at a time is wrong — a root said
//! shared that is not, a root missing on one node, a kubelet directory that is not
//! there, a namespace whose Pod Security refuses hostPath Pods — and it names exactly
//! that. No marker stays behind.

use super::*;

/// `kubectl tessera preflight ARGS` against the cluster under test: (exit code, stdout).
fn preflight(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .arg("--kubeconfig")
        .arg(support::kubeconfig_path())
        .args(["--width=0", "preflight", "--timeout=90s"])
        .args(args)
        .output()
        .expect("running kubectl-tessera");
    let code = out.status.code().unwrap_or(-1);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        code < 2,
        "preflight failed: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, text)
}

fn problems(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with('✗')).collect()
}

/// Asserts exit 1 and exactly one problem line, containing `want`.
fn one_problem(args: &[&str], want: &str) {
    let (code, text) = preflight(args);
    let found = problems(&text);
    assert!(
        code == 1 && found.len() == 1 && found[0].contains(want),
        "{args:?}: want one problem {want:?}, got exit {code}:\n{text}"
    );
}

/// No preflight marker in `dir`.
fn no_marker(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tessera-preflight-"))
        .collect();
    assert!(
        left.is_empty(),
        "markers left in {}: {left:?}",
        dir.display()
    );
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn preflight_tells_shared_from_node_local_and_names_each_fault() {
    let client = support::client().await;
    let nodes = Nodes::load();
    let names = nodes.names();
    assert!(names.len() >= 2, "two nodes at least: {names:?}");
    let local_of = |n: &str| nodes.kubelet_dir(n).parent().unwrap().join("tessera");

    let healthy = [
        "--root=/mnt/shared/tessera=shared",
        "--root=/var/lib/tessera=node-local",
    ];
    let (code, text) = preflight(&healthy);
    assert_eq!(code, 0, "{text}");
    for want in [
        format!(
            "✓ [sharing] /mnt/shared/tessera is shared: each of {} nodes sees every other's writes",
            names.len()
        ),
        "✓ [sharing] /var/lib/tessera is node-local: each node has its own, as said".into(),
        format!(
            "✓ [roots] /mnt/shared/tessera exists on all {} nodes",
            names.len()
        ),
    ] {
        assert!(text.contains(&want), "{want:?} in:\n{text}");
    }
    for n in &names {
        assert!(
            text.contains(&format!("✓ [host-paths] node {n}: /dev/fuse")),
            "{text}"
        );
        assert!(
            text.contains(&format!("[kernel] node {n}: Linux")),
            "{text}"
        );
    }
    no_marker(&nodes.shared().join("tessera"));
    for n in &names {
        no_marker(&local_of(n));
    }

    // 1. A node-local root said to be shared.
    one_problem(
        &["--root=/var/lib/tessera=shared"],
        "/var/lib/tessera is said to be shared, but each node has its own",
    );

    // 2. A root on the first node only.
    let only = local_of(&names[0]).join("preflight-only-here");
    std::fs::create_dir_all(&only).unwrap();
    let missing_on: Vec<String> = names[1..]
        .iter()
        .map(|n| format!("{n} (missing)"))
        .collect();
    one_problem(
        &["--root=/var/lib/tessera/preflight-only-here"],
        &format!(
            "backend root /var/lib/tessera/preflight-only-here is not a directory on {}",
            missing_on.join(", ")
        ),
    );
    std::fs::remove_dir(&only).unwrap();

    // 3. The kubelet somewhere else than said: the DaemonSet's hostPaths are not there
    // (one problem per node).
    let (code, text) = preflight(&[
        "--root=/mnt/shared/tessera",
        "--kubelet-dir=/var/lib/no-kubelet",
    ]);
    assert_eq!(code, 1, "{text}");
    let found = problems(&text);
    assert_eq!(found.len(), names.len(), "{text}");
    for n in &names {
        assert!(
            found.iter().any(|l| l.contains(&format!(
                "node {n}: the node DaemonSet's hostPaths are not there: /var/lib/no-kubelet (missing), /var/lib/no-kubelet/plugins_registry (missing)"
            ))),
            "{text}"
        );
    }

    // 4. A namespace whose Pod Security refuses hostPath Pods.
    let ns = namespace(&client, "preflight-baseline").await;
    kubectl_output(&[
        "label",
        "namespace",
        &ns,
        "pod-security.kubernetes.io/enforce=baseline",
        "--overwrite",
    ]);
    let (code, text) = preflight(&[
        &format!("--tessera-namespace={ns}"),
        "--root=/mnt/shared/tessera",
    ]);
    assert_eq!(code, 1, "{text}");
    let found = problems(&text);
    assert_eq!(found.len(), names.len(), "{text}");
    assert!(
        found.iter().all(
            |l| l.contains("the check Pod: the API server refused the Pod")
                && l.contains("PodSecurity")
        ),
        "{text}"
    );
    kubectl_output(&["delete", "namespace", &ns, "--wait=false"]);
}
