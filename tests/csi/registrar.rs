//! The node DaemonSet's registrar as config/node.yaml runs it: the real
//! csi-node-driver-registrar on a real `tessera node` CSI socket with
//! `--http-endpoint`, whose `/healthz` is its liveness probe. It answers 200 once the
//! registrar has read the driver's name from Tessera's Identity service and serves its
//! registration socket, and fails when that socket is gone (what makes the kubelet
//! restart it). It serves no `/metrics` (why the PodMonitor does not scrape it).

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support;
use support::fixtures::{self, AgentProcess, eventually};

/// `GET path` on a loopback port: the status code and the body, if it answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn registrar_healthz_answers_on_tesseras_socket() {
    let client = support::client().await;
    support::ensure_crds(&client).await;
    let id = support::unique_name("csireg");
    let node = format!("{id}-n0");
    fixtures::create_nodes(&client, std::slice::from_ref(&node)).await;
    let agent = AgentProcess::start(&id, &node);
    eventually(
        Duration::from_secs(30),
        "the agent's CSI socket",
        || async { agent.csi_socket().exists().then_some(()) },
    )
    .await;
    let registration = support::temp_dir("tessera-registration-");
    let port = fixtures::free_port();
    let log = std::env::temp_dir().join(format!("tessera-registrar-{id}.log"));
    let child =
        Command::new(support::repo_root().join("target/harness/bin/csi-node-driver-registrar"))
            .arg(format!("--csi-address={}", agent.csi_socket().display()))
            .arg("--kubelet-registration-path=/var/lib/kubelet/plugins/csi.tessera.io/csi.sock")
            .arg(format!(
                "--plugin-registration-path={}",
                registration.path().display()
            ))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting csi-node-driver-registrar (make harness)");
    let _registrar = Killed(child);

    let reg_socket = registration.path().join("csi.tessera.io-reg.sock");
    eventually(Duration::from_secs(30), "/healthz 200", || async {
        match get(port, "/healthz") {
            Some((200, body)) if body.trim() == "ok" => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(
        reg_socket.exists(),
        "registration socket named after Tessera's driver"
    );
    // No metrics there: a PodMonitor endpoint on this port would always be down.
    assert!(
        matches!(get(port, "/metrics"), Some((404, _))),
        "{:?}",
        get(port, "/metrics")
    );
    // The registration socket gone: the probe fails, and the kubelet restarts the
    // registrar, which registers again.
    std::fs::remove_file(&reg_socket).unwrap();
    let after = get(port, "/healthz");
    assert!(
        matches!(after, Some((code, _)) if code != 200),
        "{after:?}; log: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    fixtures::delete_nodes(&client, std::slice::from_ref(&node)).await;
}
