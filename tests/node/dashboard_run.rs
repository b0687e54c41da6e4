//! The run behind docs/figures/dashboard.svg (`make dashboard-picture`, #[ignore]d
//! here): the set-up of `monitoring` — a real controller and a real node agent with
//! real FUSE mounts, a claim's volume and one of no claim, a ticket left waiting for
//! another node — kept running for `TESSERA_DASHBOARD_SECS` (default 240) seconds with
//! steady, varied I/O (writes, reads, listings, files removed, errors the daemon
//! answers), a third volume attached and detached every 30 s, and the claimed volume's
//! daemon killed and taken over halfway, while a real Prometheus server
//! (target/harness/bin/prometheus, or `TESSERA_PROMETHEUS`) scrapes both `/metrics`
//! every 2 s into target/dashboard/data. The run's window and names go to
//! target/dashboard/run.json for bench/dashboard.py, which queries that data.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support;
use support::env::CsiEnv;
use support::fixtures::free_port;
use support::monitoring::RunVolumes;

const WAIT: Duration = Duration::from_secs(60);

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A Prometheus server scraping the controller and the agent; killed when dropped.
struct Prometheus(Child);

impl Prometheus {
    fn start(dir: &std::path::Path, port: u16, ctrl: u16, agent: u16, node: &str) -> Self {
        // `pod` as the Kubernetes service discovery would label them: the dashboard
        // joins on it (`and on (pod) tessera_build_info`) and names series by it.
        let config = format!(
            "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n\
             scrape_configs:\n\
             - job_name: tessera-controller\n  static_configs:\n  \
             - targets: ['127.0.0.1:{ctrl}']\n    labels: {{pod: tessera-controller-0}}\n\
             - job_name: tessera-node\n  static_configs:\n  \
             - targets: ['127.0.0.1:{agent}']\n    labels: {{pod: tessera-node-{node}}}\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let bin = std::env::var_os("TESSERA_PROMETHEUS")
            .map(Into::into)
            .unwrap_or_else(|| support::repo_root().join("target/harness/bin/prometheus"));
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting prometheus (make dashboard-picture builds it)");
        Prometheus(child)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SIGTERM: it writes its head out and leaves the data dir to be reopened.
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

/// One round of I/O on a mount: `step` varies the sizes, how much is read and which
/// errors are provoked (ENOTEMPTY, ENOENT, EEXIST); the number of reads and writes
/// that failed (a takeover in progress may fail some) is returned.
fn io_round(mnt: &std::path::Path, step: u64) -> u64 {
    let mut failed = 0;
    let dir = mnt.join(format!("d{}", step % 4));
    let _ = std::fs::create_dir(&dir);
    // A load that swells and ebbs: 16 KiB .. 1 MiB per write.
    let size = (16usize << 10) << (step / 7 % 7);
    let file = dir.join(format!("f{}", step % 16));
    if std::fs::write(&file, vec![(step % 251) as u8; size]).is_err() {
        failed += 1;
    }
    for _ in 0..(1 + step % 3) {
        if std::fs::read(&file).is_err() {
            failed += 1;
        }
    }
    let _ = std::fs::read_dir(&dir).map(|d| d.count());
    if step.is_multiple_of(5) {
        let _ = std::fs::remove_dir(&dir); // ENOTEMPTY
    }
    if step.is_multiple_of(3) {
        let _ = std::fs::metadata(mnt.join("missing")); // ENOENT
    }
    if step.is_multiple_of(8) {
        let _ = std::fs::create_dir(mnt.join("d0")); // EEXIST
    }
    // Quota use climbs, then the files go: every 48 rounds the directory is emptied.
    if step % 48 == 47 {
        for i in 0..16 {
            let _ = std::fs::remove_file(dir.join(format!("f{i}")));
        }
    }
    failed
}

#[tokio::test]
#[ignore = "the run behind docs/figures/dashboard.svg: make dashboard-picture"]
async fn a_run_for_the_dashboard_picture() {
    let secs: u64 = std::env::var("TESSERA_DASHBOARD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(240);
    let out = support::repo_root().join("target/dashboard");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();

    let base = CsiEnv::builder("ndash", 2, WAIT)
        .csinodes()
        .agents(1)
        .default_backend_root()
        .start()
        .await;
    let (node, ctrl, agent) = (base.nodes[0].clone(), &base.ctrl, base.agent());
    let prom_port = free_port();
    let prom = Prometheus::start(
        &out,
        prom_port,
        ctrl.metrics_port,
        agent.metrics_port,
        &node,
    );
    let start = now();

    let volumes = RunVolumes::start(&base, &["cycled"]).await;
    let (claimed, plain) = (volumes.claimed.clone(), volumes.plain.clone());
    let (namespace, cycled) = (volumes.namespace.clone(), volumes.more[0].clone());

    // Steady I/O on both mounts until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let io = {
        let stop = stop.clone();
        let mounts = [agent.mountpoint(&claimed), agent.mountpoint(&plain)];
        std::thread::spawn(move || {
            let (mut step, mut failed) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                for (i, mnt) in mounts.iter().enumerate() {
                    // The second volume works at a third of the pace.
                    if i == 0 || step.is_multiple_of(3) {
                        failed += io_round(mnt, step);
                    }
                }
                step += 1;
                std::thread::sleep(Duration::from_millis(150));
            }
            (step, failed)
        })
    };

    let log = agent.state_dir().join(format!("logs/{claimed}.log"));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let takeover_at = Instant::now() + Duration::from_secs(secs / 2);
    let mut taken_over = false;
    let mut cycles = 0;
    while Instant::now() < deadline {
        base.attach(&cycled, "cycle", "manual", &node).await;
        tokio::time::sleep(Duration::from_secs(15)).await;
        base.detach(&cycled, "cycle", &node).await;
        cycles += 1;
        if !taken_over && Instant::now() >= takeover_at {
            base.take_over(&claimed, &node, &log).await;
            taken_over = true;
        }
        tokio::time::sleep(Duration::from_secs(15)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (rounds, failed) = io.join().unwrap();
    // Two more scrapes of the quiet end, then the window closes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let end = now();
    let up = http_get(prom_port, "/api/v1/query?query=up");
    drop(prom);
    assert!(taken_over, "the run was too short for the takeover");
    assert!(
        up.contains("\"value\"") && up.matches("\"1\"]").count() == 2,
        "both targets up in Prometheus: {up}"
    );
    let run = serde_json::json!({
        "start": start, "end": end, "namespace": namespace, "node": node,
        "volumes": {"claimed": claimed, "plain": plain, "cycled": cycled},
        "io_rounds": rounds, "io_reads_writes_failed": failed, "attach_cycles": cycles,
        "prometheus_data": out.join("data"),
    });
    std::fs::write(
        out.join("run.json"),
        serde_json::to_string_pretty(&run).unwrap(),
    )
    .unwrap();
    eprintln!("dashboard run: {run}");

    volumes.stop(&base).await;
}

/// `GET path` on a loopback port: the body.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let _ = s.write_all(req.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}
