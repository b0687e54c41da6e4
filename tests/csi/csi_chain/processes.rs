//! The chain test's processes: the CSI sidecars (csi-provisioner, csi-attacher) as
//! child processes killed on drop, and the Lease that keeps two runs of the test from
//! sharing the sidecars' view of the cluster.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::LOCK_LEASE;
use crate::support;
use support::fixtures;

// ---------------------------------------------------------------------------------
// Processes and the lock.

/// A CSI sidecar child process; killed on drop, its log kept.
pub(super) struct Sidecar {
    pub(super) name: &'static str,
    child: Child,
    pub(super) log: PathBuf,
    metrics_port: u16,
}

impl Sidecar {
    pub(super) fn start(name: &'static str, test_id: &str, socket: &Path, extra: &[&str]) -> Self {
        let log = std::env::temp_dir().join(format!("tessera-{name}-{test_id}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(support::repo_root().join("target/harness/bin").join(name));
        // A sidecar outliving a killed test would go on provisioning and attaching for
        // the next run: it dies with the thread that started it (the test's).
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Its metrics, as config/ serves them for the PodMonitor (`--http-endpoint`).
        let metrics_port = fixtures::free_port();
        let child = cmd
            .arg(format!(
                "--kubeconfig={}",
                support::kubeconfig_path().display()
            ))
            .arg(format!("--http-endpoint=127.0.0.1:{metrics_port}"))
            .arg(format!("--csi-address={}", socket.display()))
            .arg("--leader-election=false")
            .arg("--v=4")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Sidecar {
            name,
            child,
            log,
            metrics_port,
        }
    }

    /// The count of `method`'s calls to Tessera that the sidecar's own metrics
    /// (`csi_sidecar_operations_seconds`, what operators of a CSI driver read) timed
    /// with status OK.
    pub(super) fn timed_ok(&self, method: &str) -> f64 {
        fixtures::scrape(self.metrics_port)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.starts_with("csi_sidecar_operations_seconds_count{")
                    && l.contains("driver_name=\"csi.tessera.io\"")
                    && l.contains("grpc_status_code=\"OK\"")
                    && l.contains(&format!("method_name=\"{method}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub(super) fn tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn tail(path: &Path, lines: usize) -> String {
    let raw = std::fs::read_to_string(path).unwrap_or_default();
    // Without the colour escapes of the tracing logs.
    let mut text = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            text.push(c);
        }
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// How long the Lease lasts without renewal (a run killed outright blocks the next one
/// at most this long).
const LOCK_SECONDS: i64 = 45;

/// The Lease `default/tessera-csi-chain`, held (and renewed in the background) while
/// this run's sidecars run.
pub(super) struct ChainLock {
    api: Api<Lease>,
    holder: String,
    renew: tokio::task::JoinHandle<()>,
}

impl ChainLock {
    /// Take the Lease (taking it over when its holder let it expire), waiting while
    /// another run holds it.
    pub(super) async fn acquire(client: &Client, holder: &str) -> Self {
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let lease = |now: jiff::Timestamp| -> Lease {
            serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": LOCK_LEASE},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": LOCK_SECONDS,
                         "acquireTime": micro(now), "renewTime": micro(now)},
            }))
            .unwrap()
        };
        let started = Instant::now();
        let mut told = false;
        loop {
            match api
                .create(&PostParams::default(), &lease(jiff::Timestamp::now()))
                .await
            {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!("creating Lease {LOCK_LEASE}: {e}"),
            }
            if let Some(held) = api.get_opt(LOCK_LEASE).await.unwrap() {
                let v = serde_json::to_value(&held).unwrap();
                let renewed = v["spec"]["renewTime"]
                    .as_str()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok());
                let secs = v["spec"]["leaseDurationSeconds"]
                    .as_i64()
                    .unwrap_or(LOCK_SECONDS);
                let expired = renewed.is_none_or(|t| {
                    t + jiff::SignedDuration::from_secs(secs) < jiff::Timestamp::now()
                });
                if expired {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            resource_version: held.resource_version(),
                            uid: None,
                        }),
                        ..Default::default()
                    };
                    let _ = api.delete(LOCK_LEASE, &dp).await;
                    continue;
                }
                if !told {
                    println!(
                        "waiting for another run of csi_chain ({}) to release Lease default/{LOCK_LEASE}",
                        v["spec"]["holderIdentity"]
                    );
                    told = true;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(900),
                    "another run of csi_chain ({}) held Lease default/{LOCK_LEASE} for 15 minutes",
                    v["spec"]["holderIdentity"]
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let renew = tokio::spawn({
            let api = api.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    let patch = json!({"spec": {"renewTime": micro(jiff::Timestamp::now())}});
                    let _ = api
                        .patch(LOCK_LEASE, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
            }
        });
        ChainLock {
            api,
            holder: holder.to_string(),
            renew,
        }
    }

    pub(super) async fn release(self) {
        self.renew.abort();
        if let Ok(Some(l)) = self.api.get_opt(LOCK_LEASE).await
            && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(&self.holder)
        {
            let _ = self.api.delete(LOCK_LEASE, &DeleteParams::default()).await;
        }
    }
}

fn micro(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}
