//! What the benchmarks that go through the real external-attacher share
//! (bench/attach, bench/rwx): the `csi-attacher` sidecar and its settings, the no-op
//! baseline driver, the CSINode a registrar would create, the name Kubernetes gives a
//! storage.k8s.io VolumeAttachment, and one watch recording when each was attached and
//! deleted.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment as StorageVa};
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::support::{self, fixtures, fixtures::TEST_LABEL};

/// `key`'s value from the environment, or `default`.
pub fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The name Kubernetes gives the VolumeAttachment of (handle, driver, node).
pub fn va_name(handle: &str, driver: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{handle}{driver}{node}").as_bytes());
    format!("csi-{}", hex::encode(digest))
}

/// When each VolumeAttachment of the benchmark was seen attached, and seen gone, by
/// one watch.
#[derive(Default)]
pub struct Seen {
    /// When each was first seen attached.
    pub attached: Mutex<HashMap<String, Instant>>,
    /// When each was seen deleted.
    pub gone: Mutex<HashMap<String, Instant>>,
    /// When each not attached was first seen with an attach error saying its volume
    /// holds as many tickets as one VolumeAttachment can ([`AT_THE_CAP`]).
    pub refused: Mutex<HashMap<String, Instant>>,
    changed: Notify,
}

impl Seen {
    /// Wait until `done` holds (true), or `timeout` passed (`done`'s last answer).
    pub async fn wait(&self, timeout: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(self) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return done(self);
            }
        }
    }
}

/// What Tessera's ControllerPublish says of a volume whose VolumeAttachment holds as
/// many tickets as it can (`tessera_api::MAX_TICKETS`; RESOURCE_EXHAUSTED).
pub const AT_THE_CAP: &str = "attachment tickets, the most one VolumeAttachment can hold";

/// Watch the storage.k8s.io VolumeAttachments labelled with test `id`; the receiver
/// fires once the watch has listed them.
pub fn watch_attachments(
    client: Client,
    id: &str,
) -> (Arc<Seen>, tokio::sync::oneshot::Receiver<()>) {
    let seen = Arc::new(Seen::default());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let api: Api<StorageVa> = Api::all(client);
    let wc = watcher::Config::default().labels(&format!("{TEST_LABEL}={id}"));
    let s = seen.clone();
    tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut stream = watcher::watcher(api, wc).boxed();
        while let Some(ev) = stream.next().await {
            let now = Instant::now();
            let record = |va: &StorageVa| {
                let Some(st) = va.status.as_ref() else { return };
                if st.attached {
                    s.attached
                        .lock()
                        .unwrap()
                        .entry(va.name_any())
                        .or_insert(now);
                } else if st
                    .attach_error
                    .as_ref()
                    .and_then(|e| e.message.as_deref())
                    .is_some_and(|m| m.contains(AT_THE_CAP))
                {
                    s.refused
                        .lock()
                        .unwrap()
                        .entry(va.name_any())
                        .or_insert(now);
                }
            };
            match ev {
                Ok(Event::Apply(va)) | Ok(Event::InitApply(va)) => record(&va),
                Ok(Event::Delete(va)) => {
                    s.gone.lock().unwrap().entry(va.name_any()).or_insert(now);
                }
                Ok(Event::InitDone) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(Event::Init) => {}
                Err(e) => {
                    eprintln!("  (watch error, resuming: {e})");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            s.changed.notify_waiters();
        }
    });
    (seen, ready_rx)
}

/// The no-op baseline driver's name (bench/attach/refdriver).
pub const NOOP_DRIVER: &str = "bench.noop.csi.k8s.io";

/// Start the no-op baseline driver (`target/harness/bin/csi-noop-driver`, built by
/// bench/attach/build-refdriver.sh) serving at `socket`, logging to `log`.
pub fn start_noop_driver(socket: &Path, log: &Path) -> Proc {
    let bin = support::repo_root().join("target/harness/bin/csi-noop-driver");
    let child = Command::new(&bin)
        .arg(format!("--endpoint=unix://{}", socket.display()))
        .arg(format!("--drivername={NOOP_DRIVER}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "starting {} (build it with bench/attach/build-refdriver.sh): {e}",
                bin.display()
            )
        });
    Proc(child)
}

/// A child process killed (and reaped) on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The external-attacher's settings, the same for both drivers.
pub struct Sidecar {
    pub workers: u32,
    pub qps: u32,
    pub burst: u32,
    pub timeout: String,
}

impl Sidecar {
    /// The settings from `BENCH_ATTACHER_WORKERS` (default 100), `_QPS` (200),
    /// `_BURST` (400), `_TIMEOUT` (15s).
    pub fn from_env() -> Self {
        Sidecar {
            workers: env_or("BENCH_ATTACHER_WORKERS", 100),
            qps: env_or("BENCH_ATTACHER_QPS", 200),
            burst: env_or("BENCH_ATTACHER_BURST", 400),
            timeout: std::env::var("BENCH_ATTACHER_TIMEOUT").unwrap_or_else(|_| "15s".into()),
        }
    }

    /// The settings, as arguments.
    pub fn describe(&self) -> String {
        format!(
            "--worker-threads={} --kube-api-qps={} --kube-api-burst={} --timeout={} --leader-election=false",
            self.workers, self.qps, self.burst, self.timeout
        )
    }

    /// Start a `csi-attacher` serving the driver at `socket`, logging to `log`.
    pub fn start(&self, socket: &Path, log: &Path) -> Proc {
        let bin = support::repo_root().join("target/harness/bin/csi-attacher");
        let child = Command::new(&bin)
            .arg(format!("--csi-address={}", socket.display()))
            .arg(format!(
                "--kubeconfig={}",
                support::kubeconfig_path().display()
            ))
            .arg("--leader-election=false")
            .arg(format!("--worker-threads={}", self.workers))
            .arg(format!("--kube-api-qps={}", self.qps))
            .arg(format!("--kube-api-burst={}", self.burst))
            .arg(format!("--timeout={}", self.timeout))
            .arg(format!("--v={}", env_or("BENCH_ATTACHER_V", 2u32)))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        Proc(child)
    }
}

/// The CSINode a node-driver-registrar would create for `node`, naming `drivers`.
pub async fn create_csinode(client: &Client, node: &str, drivers: &[&str]) {
    let api: Api<CSINode> = Api::all(client.clone());
    let drivers: Vec<_> = drivers
        .iter()
        .map(|d| json!({"name": d, "nodeID": node}))
        .collect();
    let csinode: CSINode = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": node},
        "spec": {"drivers": drivers},
    }))
    .unwrap();
    api.create(&PostParams::default(), &csinode)
        .await
        .expect("creating CSINode");
}

/// Wait until a unix socket exists at `path`.
pub async fn wait_socket(path: &Path, what: &str) {
    fixtures::eventually(Duration::from_secs(60), what, || async {
        path.exists().then_some(())
    })
    .await;
}
