//! A Pod's `fsGroup` across two nodes (issue 30, item 5): the daemon checks a create
//! itself (a name another node may have made meanwhile), and must count the caller's
//! supplementary groups as the backend would. Comparator: the same uids and groups on
//! the nodes' own mounts of the shared filesystem (`nodes.sh enter`, `setpriv`).
//!
//! ```text
//!  node A, uid 1001 + fsGroup 4000 ─▶ mkdir team, chmod 2770 (group 4000, setgid)
//!  node B, uid 1002 + fsGroup 4000 ─▶ creates team/from-b: allowed (group 4000 is a
//!      supplementary group, not its primary one), the file in group 4000
//!  node B, uid 1003, no fsGroup    ─▶ team/from-c: Permission denied
//!  the backend's own clients on B: the same two answers
//!  a file 2664 / 2666 made on A, appended on B by a member / an outsider: the
//!      set-group-ID bit kept / dropped (a member: as the backend's clients; an
//!      outsider: as the kernel on a local filesystem, where GlusterFS keeps it)
//! ```

use super::*;

const GROUP: u32 = 4000;

/// A Pod on `node` with the claim `team`, running `script` as `user`: a uid (its primary group the same
/// number) and the Pod's fsGroup, if any.
async fn as_user(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    user: (u32, Option<u32>),
    script: &str,
) {
    let (uid, fs_group) = user;
    let mut security = json!({"runAsUser": uid, "runAsGroup": uid});
    if let Some(g) = fs_group {
        security["fsGroup"] = json!(g);
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": security,
            "containers": [{
                "name": "app",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [claim_volume("team")],
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating Pod {name}: {e}"));
}

async fn logs(client: &Client, ns: &str, name: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .logs(name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("logs of {name}: {e}"))
}

/// `script` as `uid` with `groups` on `node`'s own mount of the shared filesystem:
/// its output, and whether it succeeded.
fn on_backend(node: &str, uid: u32, groups: &[u32], script: &str) -> (bool, String) {
    let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
    let mut args = vec![
        "enter".to_string(),
        node.to_string(),
        "setpriv".into(),
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
    ];
    if groups.is_empty() {
        args.push("--clear-groups".into());
    } else {
        args.push(format!("--groups={}", groups.join(",")));
    }
    args.extend(["sh".into(), "-c".into(), script.into()]);
    let out = std::process::Command::new("bash")
        .arg(support::repo_root().join("tests/harness/nodes.sh"))
        .args(&args)
        .env("HARNESS_CLUSTER_DIR", cluster_dir())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text.trim().to_string())
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn an_fs_group_lets_a_pod_on_another_node_create_where_the_backend_lets_it() {
    let client = support::client().await;
    let nodes = Nodes::load();
    let names = nodes.names();
    let (a, b) = (names[0].clone(), names[1].clone());
    let ns = namespace(&client, "fsgroup").await;
    let claim = pvc(&client, &ns, "team", "ReadWriteMany").await;
    let pv = claim.spec.and_then(|s| s.volume_name).expect("bound");
    let volume = tessera_volume(&client, &pv).await;

    as_user(
        &client,
        &ns,
        "maker",
        &a,
        (1001, Some(GROUP)),
        "mkdir /data/team && chmod 2770 /data/team && stat -c '%g %a' /data/team",
    )
    .await;
    wait_phase(&client, &ns, "maker", "Succeeded").await;
    assert_eq!(logs(&client, &ns, "maker").await.trim(), "4000 2770");

    let write = |name: &str| {
        format!("echo {name} > /data/team/{name} && stat -c '%g' /data/team/{name} || echo denied")
    };
    as_user(
        &client,
        &ns,
        "member",
        &b,
        (1002, Some(GROUP)),
        &write("from-b"),
    )
    .await;
    wait_phase(&client, &ns, "member", "Succeeded").await;
    let member = logs(&client, &ns, "member").await;
    as_user(&client, &ns, "stranger", &b, (1003, None), &write("from-c")).await;
    wait_phase(&client, &ns, "stranger", "Succeeded").await;
    let stranger = logs(&client, &ns, "stranger").await;
    assert_eq!(
        member.trim(),
        "4000",
        "a member of group 4000 on {b}: {member}"
    );
    assert!(
        stranger.contains("Permission denied") && stranger.contains("denied"),
        "uid 1003 without the group on {b}: {stranger}"
    );

    // The backend itself, on B's own client of the shared filesystem.
    let dir = format!("/mnt/shared/tessera/{}/team", volume.name_any());
    let (ok, out) = on_backend(
        &b,
        1002,
        &[GROUP],
        &format!("echo x > {dir}/backend-b && stat -c %g {dir}/backend-b"),
    );
    assert!(
        ok && out == "4000",
        "the backend, uid 1002 with group 4000: {out}"
    );
    let (ok, out) = on_backend(&b, 1003, &[], &format!("echo x > {dir}/backend-c"));
    assert!(
        !ok && out.contains("Permission denied"),
        "the backend, uid 1003: {out}"
    );

    // The set-group-ID bit of a file without group execute (in the volume's root,
    // which every uid may enter: `team` is 2770), after another node's append: kept for a member of the file's group (through its fsGroup), dropped
    // for a writer outside it; the backend's own clients are the measure.
    let mark = "echo a > kept && echo a > dropped && chmod 2664 kept && chmod 2666 dropped && stat -c %a kept dropped";
    let append = |file: &str, who: &str| format!("echo {who} >> {file} && stat -c %a {file}");
    let mut tessera = vec![];
    for (name, node, user, script) in [
        (
            "marker",
            &a,
            (1001, Some(GROUP)),
            format!("cd /data && {mark}"),
        ),
        (
            "appender",
            &b,
            (1002, Some(GROUP)),
            append("/data/kept", "b"),
        ),
        ("outsider", &b, (1003, None), append("/data/dropped", "c")),
    ] {
        as_user(&client, &ns, name, node, user, &script).await;
        wait_phase(&client, &ns, name, "Succeeded").await;
        tessera.push(logs(&client, &ns, name).await.trim().to_string());
    }
    let root = format!("/mnt/shared/tessera/{}", volume.name_any());
    let mut backend = vec![];
    for (node, uid, groups, script) in [
        (
            &a,
            1001,
            &[GROUP][..],
            format!(
                "cd {root} && {}",
                mark.replace("kept", "b-kept")
                    .replace("dropped", "b-dropped")
            ),
        ),
        (
            &b,
            1002,
            &[GROUP][..],
            append(&format!("{root}/b-kept"), "b"),
        ),
        (&b, 1003, &[][..], append(&format!("{root}/b-dropped"), "c")),
    ] {
        let (ok, out) = on_backend(node, uid, groups, &script);
        assert!(ok, "the backend on {node}, uid {uid}: {out}");
        backend.push(out);
    }
    // Made on A and a member's append on B: as the backend's clients.
    assert_eq!(
        tessera[..2],
        backend[..2],
        "modes through Tessera (marked on {a}; appended on {b} by a member) vs the backend's own clients"
    );
    // An outsider's append: Tessera drops the bit as the kernel does on a local
    // filesystem (tests/fuse/groups.rs, a bind mount as the comparator); GlusterFS's
    // own client keeps it (docs/locks.md, the one known difference).
    assert_eq!(
        tessera[2], "666",
        "an outsider's append through Tessera (the backend's client: {})",
        backend[2]
    );

    for pod in [
        "maker", "member", "stranger", "marker", "appender", "outsider",
    ] {
        delete_pod(&client, &ns, pod).await;
    }
    kubectl_output(&["delete", "-n", &ns, "pvc", "team", "--wait=true"]);
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES fsGroup: {a} made team (group 4000, 2770); on {b} uid 1002 with fsGroup 4000 created a file (group {}), uid 1003 without: {}; the backend's own client on {b} the same; set-group-ID modes (marked, member's append, outsider's append) {tessera:?}, the backend {backend:?}",
        member.trim(),
        stranger.trim()
    );
}
