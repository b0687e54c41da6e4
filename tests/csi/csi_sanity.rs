//! csi-sanity (kubernetes-csi/csi-test v5, built in tests/harness) against the whole
//! driver: `tessera controller` serving Identity + Controller, `tessera node` serving
//! Identity + Node, real tickets, real FUSE mounts, on the cluster under test. Every
//! test that applies to the advertised capabilities runs (snapshots and clones
//! included); csi-sanity skips only those of capabilities Tessera does not advertise
//! (listing snapshots, modify).

use std::process::Command;
use std::time::Duration;

use crate::support;
use support::env::CsiEnv;
use support::fixtures;

#[tokio::test]
async fn csi_sanity_passes() {
    let env = CsiEnv::builder("sanity", 1, Duration::from_secs(30))
        .csinodes()
        .agents(1)
        .default_backend_root()
        .start()
        .await;
    let (client, id, agent) = (&env.client, &env.id, env.agent());
    // csi-sanity creates mountdir/stagingdir itself: their parent must exist, under the
    // kubelet directory the node service accepts.
    let sanity_dir = agent.kubelet_dir().join("csi-sanity");
    std::fs::create_dir_all(&sanity_dir).unwrap();

    let bin = support::repo_root().join("target/harness/bin/csi-sanity");
    let out = tokio::task::spawn_blocking({
        let (node_sock, sanity_dir) = (agent.csi_socket(), sanity_dir.clone());
        let controller_sock = env.sock.clone();
        move || {
            Command::new(bin)
                .arg(format!("--csi.endpoint={}", node_sock.display()))
                .arg(format!(
                    "--csi.controllerendpoint={}",
                    controller_sock.display()
                ))
                .arg(format!(
                    "--csi.mountdir={}",
                    sanity_dir.join("mount").display()
                ))
                .arg(format!(
                    "--csi.stagingdir={}",
                    sanity_dir.join("staging").display()
                ))
                .arg("--csi.testvolumesize=1073741824")
                .arg("--csi.testvolumeexpandsize=2147483648")
                .arg("--ginkgo.timeout=20m")
                .arg("--ginkgo.v")
                .output()
                .expect("running csi-sanity")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            l.starts_with("Ran ")
                || l.contains("Passed")
                || l.contains("SUCCESS")
                || l.contains("FAIL")
        })
        .collect();
    println!("csi-sanity: {}", summary.join(" | "));
    let log = std::env::temp_dir().join(format!("csi-sanity-{id}.log"));
    std::fs::write(&log, stdout.as_bytes()).unwrap();
    // csi-sanity reuses volume names ("sanity", "sanity0", ...) from run to run: let the
    // deleted volumes finish going (data removed, finalizers released) while the
    // controller and the agent still run, or the next run on this cluster fails with
    // "volume sanity is still being deleted".
    let left = leftovers(client, id, Duration::from_secs(60)).await;
    assert!(
        out.status.success(),
        "csi-sanity failed (full output in {}):\n{}\n{}",
        log.display(),
        stdout
            .lines()
            .filter(|l| l.contains("[FAIL]") || l.contains("Expected") || l.contains("rpc error"))
            .take(60)
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        left.is_empty(),
        "still there 60 s after csi-sanity ended: {left:?}"
    );
}

/// The Volumes and MountPods of test `id` still there once they are all gone or
/// `timeout` has passed.
async fn leftovers(client: &kube::Client, id: &str, timeout: Duration) -> Vec<String> {
    use kube::ResourceExt;
    use kube::api::{Api, ListParams};
    let lp = ListParams::default().labels(&format!("{}={id}", fixtures::TEST_LABEL));
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut left: Vec<String> = Vec::new();
        if let Ok(l) = Api::<tessera_api::Volume>::all(client.clone())
            .list(&lp)
            .await
        {
            left.extend(l.iter().map(|v| format!("Volume {}", v.name_any())));
        }
        if let Ok(l) = Api::<tessera_api::MountPod>::all(client.clone())
            .list(&lp)
            .await
        {
            left.extend(l.iter().map(|m| format!("MountPod {}", m.name_any())));
        }
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
