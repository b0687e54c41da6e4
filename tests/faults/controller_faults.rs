//! The controller under faults, on the real control plane (issue 13): a graceful stop
//! hands the leader Lease over at once, a `kill -9` after the (configurable) Lease
//! duration, and an API server restart is followed by convergence within seconds,
//! the controller still running. Each test prints its figures.
//!
//! The tests hold [`crate::SERIAL`], as the chaos tests do: the API server restart would
//! disturb any other test.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};

use crate::{SERIAL, support};
use support::env::Env;
use support::fixtures::{self, ControllerProcess, FakeAgent};

const WAIT: Duration = Duration::from_secs(60);

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

/// Poll (every 20 ms) until `name` is held by `who`; how long that took.
async fn until_held_by(leases: &Api<Lease>, name: &str, who: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if holder(leases, name).await.as_deref() == Some(who) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{who} did not take {name} over within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sigterm(ctrl: &ControllerProcess) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ctrl.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

#[tokio::test]
async fn a_graceful_stop_hands_the_lease_over_at_once_a_kill_after_the_lease_duration() {
    let _serial = SERIAL.lock().await;
    let e = Env::new("lease", 1, WAIT).await;
    let lease = format!("tessera-{}", e.id);
    let args = |id: &str| {
        vec![
            format!("--lease-name={lease}"),
            format!("--identity={id}"),
            "--lease-duration=4s".to_string(),
            "--lease-renew-interval=1s".to_string(),
        ]
    };
    let start = |id: &str| {
        let a = args(id);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        ControllerProcess::start(&e.id, &a)
    };
    let mut a = start("replica-a");
    let leases: Api<Lease> = Api::namespaced(e.client.clone(), "default");
    until_held_by(&leases, &lease, "replica-a", WAIT).await;
    let mut b = start("replica-b");
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    let vol = e.volume("v", "ReadWriteOnce").await;
    e.attach(&vol, "manual-a", "manual", &e.nodes[0]).await;

    // SIGTERM: the leader releases the Lease and the standby takes over at once.
    sigterm(&a);
    let graceful = until_held_by(&leases, &lease, "replica-b", Duration::from_secs(10)).await;
    println!(
        "takeover after SIGTERM of the leader: {:.2} s",
        graceful.as_secs_f64()
    );
    let status = tokio::task::spawn_blocking(move || {
        let s = a.child.wait().unwrap();
        (a, s)
    })
    .await
    .unwrap();
    assert!(
        status.1.success(),
        "the old leader exits cleanly: {:?}",
        status.1
    );
    assert!(
        graceful < Duration::from_secs(2),
        "takeover took {graceful:?}"
    );
    fixtures::remove_ticket(&e.client, &vol, "manual-a").await;
    e.attach(&vol, "manual-b", "manual", &e.nodes[0]).await;

    // kill -9: the standby waits for the Lease to expire (4 s here), no longer.
    let _c = start("replica-c");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    b.kill();
    until_held_by(&leases, &lease, "replica-c", Duration::from_secs(20)).await;
    let after_kill = killed.elapsed();
    println!(
        "takeover after kill -9 of the leader (lease 4 s): {:.2} s",
        after_kill.as_secs_f64()
    );
    assert!(
        after_kill >= Duration::from_secs(2) && after_kill < Duration::from_secs(7),
        "takeover after kill -9 took {after_kill:?} with a 4 s lease"
    );
    fixtures::remove_ticket(&e.client, &vol, "manual-b").await;
    e.attach(&vol, "manual-c", "manual", &e.nodes[0]).await;
    let _ = leases.delete(&lease, &DeleteParams::default()).await;
    e.cleanup(&[vol]).await;
}

/// Restart the local harness's API server, away for `down`; returns once it is ready.
fn restart_apiserver(down: Duration) {
    let status = std::process::Command::new("bash")
        .arg(support::repo_root().join("tests/harness/cluster.sh"))
        .arg("restart-apiserver")
        .env("HARNESS_APISERVER_DOWN_SECONDS", down.as_secs().to_string())
        .current_dir(support::repo_root())
        .status()
        .unwrap();
    assert!(status.success(), "cluster.sh restart-apiserver: {status}");
}

#[tokio::test]
async fn after_an_api_server_restart_the_controller_converges_within_five_seconds() {
    if std::env::var_os("KUBECONFIG").is_some_and(|k| !k.is_empty()) {
        eprintln!("skipped: restarts only the local harness's API server (KUBECONFIG is set)");
        return;
    }
    let _serial = SERIAL.lock().await;
    let e = Env::new("apirestart", 3, WAIT).await;
    let lease = format!("tessera-{}", e.id);
    // A Lease shorter than the outage: the leader must step down without exiting,
    // and lead again once the API server is back.
    let mut ctrl = ControllerProcess::start(
        &e.id,
        &[
            &format!("--lease-name={lease}"),
            "--lease-duration=4s",
            "--lease-renew-interval=1s",
        ],
    );
    let mut vols = Vec::new();
    for i in 0..30 {
        vols.push(e.volume(&format!("v{i}"), "ReadWriteOnce").await);
    }

    let down = Duration::from_secs(6);
    tokio::task::spawn_blocking(move || restart_apiserver(down))
        .await
        .unwrap();
    let ready = Instant::now();
    // The stand-in agent starts now: what is measured is the controller's recovery,
    // not the stand-in's (the real node agent has its own test).
    let _agent = FakeAgent::start(e.client.clone(), &e.id);
    assert!(
        ctrl.child.try_wait().unwrap().is_none(),
        "the controller runs on while the API server is away"
    );
    for (i, vol) in vols.iter().enumerate() {
        let node = &e.nodes[i % e.nodes.len()];
        fixtures::put_ticket(
            &e.client,
            vol,
            "manual-a",
            "manual",
            node,
            serde_json::json!({}),
        )
        .await;
    }
    let mut pending: Vec<&String> = vols.iter().collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for vol in pending {
            let satisfied = fixtures::ticket_states(&e.client, vol)
                .await
                .get("manual-a")
                .is_some_and(|s| s.satisfied);
            if !satisfied {
                still.push(vol);
            }
        }
        pending = still;
        assert!(
            ready.elapsed() < Duration::from_secs(30),
            "{} of 30 tickets unsatisfied 30 s after the API server's return: {pending:?}",
            pending.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let converged = ready.elapsed();
    println!(
        "API server restarted (away at least {} s): 30 tickets satisfied {:.2} s after it was ready again",
        down.as_secs(),
        converged.as_secs_f64()
    );
    assert!(
        converged < Duration::from_secs(5),
        "converged after {converged:?}"
    );
    assert!(
        ctrl.child.try_wait().unwrap().is_none(),
        "the controller is still running"
    );
    let leases: Api<Lease> = Api::namespaced(e.client.clone(), "default");
    let _ = leases.delete(&lease, &DeleteParams::default()).await;
    ctrl.kill();
    e.cleanup(&vols).await;
}
