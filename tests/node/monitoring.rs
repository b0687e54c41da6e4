//! config/monitoring/ against a real run: a real controller (with its CSI socket) and
//! a real node agent with real FUSE mounts (root and /dev/fuse) — a claim's volume
//! created through CreateVolume as the external-provisioner creates it, and a volume of
//! no claim — with I/O, an error, a ticket waiting for another node and a daemon killed
//! and taken over. Their `/metrics` are scraped; then every metric name the dashboard's
//! and the alert rules' expressions use must be among what the controller or the agent
//! (with its mount daemons' counters) exposes, and every input series of the rule
//! tests (tests/monitoring/*.test.yaml, run by promtool in tests/manifests/monitoring.rs)
//! must have the name and the label names of a real sample. Then `promtool test rules`
//! runs the alert rules over the captured series themselves, held for 20 minutes:
//! exactly the alert of the ticket left waiting fires. The scrapes and that rule test
//! are left in `target/monitoring-scrape/` to read.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support;
use support::env::CsiEnv;
use support::fixtures::eventually;
use support::monitoring::{
    RunVolumes, Scrape, expected_alert, expressions, held_series_test, input_series, metric_names,
    promtool,
};

const WAIT: Duration = Duration::from_secs(60);

fn sample(text: &str, prefix: &str, contains: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(prefix) && contains.iter().all(|c| l.contains(c)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn the_dashboard_and_the_alert_rules_use_what_a_real_run_exposes() {
    let base = CsiEnv::builder("nmon", 2, WAIT)
        .csinodes()
        .agents(1)
        .default_backend_root()
        .start()
        .await;
    let (node, ctrl, agent) = (base.nodes[0].clone(), &base.ctrl, base.agent());
    // A claim's volume, with the parameters the provisioner adds
    // (--extra-create-metadata), and one of no claim, attached; a ticket for the other
    // node waits.
    let run = RunVolumes::start(&base, &[]).await;
    let (namespace, claimed, plain) = (&run.namespace, run.claimed.clone(), run.plain.clone());

    // I/O, and an error the daemon answers (a directory not empty).
    for v in [&claimed, &plain] {
        let mnt = agent.mountpoint(v);
        std::fs::create_dir(mnt.join("d")).unwrap();
        std::fs::write(mnt.join("d/f"), vec![5u8; 1 << 16]).unwrap();
        assert_eq!(std::fs::read(mnt.join("d/f")).unwrap().len(), 1 << 16);
        let busy = std::fs::remove_dir(mnt.join("d")).unwrap_err();
        assert_eq!(busy.raw_os_error(), Some(libc::ENOTEMPTY));
    }

    // The claimed volume's daemon killed once its descriptor is held: a takeover.
    let log = agent.state_dir().join(format!("logs/{claimed}.log"));
    base.take_over(&claimed, &node, &log).await;

    // Scrape once everything above shows (the state series every 5 s).
    let claim = format!("pvc=\"data\",pvc_namespace=\"{namespace}\"");
    let (of_claimed, of_plain) = (
        format!("volume=\"{claimed}\""),
        format!("volume=\"{plain}\""),
    );
    let (ctrl_text, agent_text) = eventually(WAIT, "the run in the metrics", || async {
        let c = ctrl.metrics().unwrap_or_default();
        let a = agent.metrics().unwrap_or_default();
        let handoffs = [of_claimed.as_str(), &claim, "reason=\"takeover\""];
        let attached = [of_claimed.as_str(), &claim, "state=\"Attached\""];
        let shown = sample(&a, "tessera_fuse_operations_total{", &[&of_claimed, &claim]).is_some()
            && sample(&a, "tessera_fuse_errors_total{", &[&of_plain, "pvc=\"\""]).is_some()
            && sample(&a, "tessera_mount_handoffs_total{", &handoffs) == Some(1.0)
            && sample(&c, "tessera_volume_state{", &attached) == Some(1.0)
            && sample(&c, "tessera_mountpod_restarts_total{", &[&of_claimed, &claim]) == Some(1.0)
            && sample(&c, "tessera_tickets_waiting{", &[]).is_some()
            // The agent counts its own queue, empty once its mounts are served.
            && sample(&a, "tessera_reconcile_queue_depth{", &["controller=\"mountpod\""])
                == Some(0.0);
        shown.then_some((c, a))
    })
    .await;
    let dir = support::repo_root().join("target/monitoring-scrape");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("controller.txt"), &ctrl_text).unwrap();
    std::fs::write(dir.join("agent.txt"), &agent_text).unwrap();

    let mut scrape = Scrape::default();
    scrape.add(&ctrl_text, "controller");
    scrape.add(&agent_text, "agent");
    // Every name the dashboard and the rules use is exposed by one of them.
    let mut missing = BTreeMap::new();
    for (at, expr) in expressions() {
        for name in metric_names(&expr) {
            if !scrape.names.contains(&name) {
                missing.insert(name, at.clone());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named in config/monitoring/ but not exposed by a real controller or node agent: {missing:#?}"
    );
    // Every rule test's input series is shaped like a real one.
    for (file, (name, labels)) in input_series() {
        assert!(
            scrape.has_label_names(&name, &labels),
            "{}: {name} with labels {:?} is not a real series; the real ones: {:?}",
            file.display(),
            labels.keys().collect::<Vec<_>>(),
            scrape.samples.get(&name).map(|all| all
                .iter()
                .map(|l| l.keys().cloned().collect::<Vec<_>>())
                .collect::<std::collections::BTreeSet<_>>())
        );
    }

    // The alert rules over the run's own series, held for 20 minutes: the ticket that
    // waits for the other node alerts (and nothing else does: the leader leads, no
    // volume is Faulted or full, no mount failed, the counters stand still).
    let waiting = scrape.samples["tessera_tickets_waiting"]
        .iter()
        .zip(&scrape.values["tessera_tickets_waiting"])
        .map(|(labels, (n, _))| (labels["reason"].clone(), *n))
        .collect::<Vec<_>>();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let (reason, n) = &waiting[0];
    let labels = [("severity", "warning"), ("reason", reason.as_str())];
    let alert = expected_alert("TesseraTicketsWaiting", *n, &labels);
    let expect = BTreeMap::from([("TesseraTicketsWaiting".to_string(), vec![alert])]);
    let test = dir.join("held.test.yaml");
    std::fs::write(&test, held_series_test(&scrape, 20, &expect)).unwrap();
    promtool(&["test", "rules", &test.to_string_lossy()]);

    run.stop(&base).await;
}
