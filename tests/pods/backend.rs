//! Locks across nodes through Tessera, against the comparator: the same probes run
//! through the two nodes' own clients of the shared backend (GlusterFS, each node a
//! client of its own at `/mnt/shared`) and through the two nodes' Tessera mounts of
//! one ReadWriteMany volume (`tests/harness/sharedfs-check.sh`, which holds each lock
//! kind on A and tries both kinds on B while A holds it).
//!
//! ```text
//!  backend:  A /mnt/shared ── flock/fcntl held ──▶ B /mnt/shared tries ──▶ outcome X
//!  Tessera:  A mount of the volume ── same ──────▶ B mount of the volume ──▶ outcome X
//! ```
//!
//! What B sees while A holds must be what the backend's own clients see, including
//! the backend's quirks (GlusterFS turns a flock into a POSIX lock, so a flock and an
//! fcntl lock conflict there, which they never do on one Linux kernel).

use tessera_api::{self as api, MountPod};

use super::*;

/// The sharedfs-check lines that describe what B saw while A held a lock, one per
/// kind, without the timings ("fcntl: held on A, B's try: conflict=1; B's flock try:
/// conflict=1").
fn lock_outcomes(report: &str) -> Vec<String> {
    report
        .lines()
        .filter(|l| l.starts_with("fcntl:") || l.starts_with("flock:"))
        .map(|l| l.split("; B's wait").next().unwrap_or(l).to_string())
        .collect()
}

/// Run the check on directory `dir` of both nodes; its report (it must pass).
fn sharedfs_check(dir: &str) -> String {
    let script = support::repo_root().join("tests/harness/sharedfs-check.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .env("HARNESS_CLUSTER_DIR", cluster_dir())
        .env("DIR", dir)
        .env("LOCK_ROUNDS", "3")
        .env("ROUNDS", "10")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "sharedfs-check on {dir}: {report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn locks_cross_nodes_through_tessera_as_through_the_backends_own_clients() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-sharedfs", "shared", "ReadWriteMany").await;
    let names = nodes.names();
    let (a, b) = (&names[0], &names[1]);
    // A Pod on each node keeps the volume mounted there.
    pod(&client, &ns, "on-a", a, "shared", "sleep 3600").await;
    pod(&client, &ns, "on-b", b, "shared", "sleep 3600").await;
    wait_phase(&client, &ns, "on-a", "Running").await;
    wait_phase(&client, &ns, "on-b", "Running").await;
    let mountpods: Api<MountPod> = Api::all(client.clone());
    let mut points = Vec::new();
    for node in [a, b] {
        let mp = mountpods
            .get(&api::mountpod_name(&volume.name_any(), node))
            .await
            .unwrap();
        points.push(mp.status.and_then(|s| s.mount_point).expect("mounted"));
    }
    assert_eq!(points[0], points[1], "one mount point on both nodes");

    let backend = sharedfs_check("/mnt/shared");
    let through = sharedfs_check(&points[0]);
    // What each check ran on (its first line: both nodes' filesystem and source).
    let first = |r: &str| r.lines().next().unwrap_or_default().to_string();
    assert!(
        first(&backend).matches("fuse.glusterfs").count() == 2,
        "the backend's own clients on both nodes: {backend}"
    );
    let on = first(&through);
    assert!(
        !on.contains("glusterfs") && on.matches(&format!("/{}", volume.name_any())).count() >= 3,
        "Tessera's mounts of the volume on both nodes: {on}"
    );
    let (want, got) = (lock_outcomes(&backend), lock_outcomes(&through));
    assert_eq!(want.len(), 2, "both lock kinds probed: {backend}");
    assert_eq!(
        got, want,
        "B's view of A's locks through Tessera vs through the backend's own clients"
    );

    delete_pod(&client, &ns, "on-a").await;
    delete_pod(&client, &ns, "on-b").await;
    delete_claim(&client, &ns, "shared", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES locks vs the backend: {}; backend: {}; Tessera: {}",
        got.join(" | "),
        report_tail(&backend),
        report_tail(&through)
    );
}

/// The timing lines of a report (waits after release, write-to-read delay).
fn report_tail(report: &str) -> String {
    report
        .lines()
        .filter_map(|l| {
            l.split_once("; B's wait after A's release (ms): ")
                .map(|(_, t)| t)
        })
        .chain(report.lines().filter(|l| l.starts_with("A write")))
        .collect::<Vec<_>>()
        .join(" / ")
}
