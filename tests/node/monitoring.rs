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

use kube::Api;

use tessera_api::VolumeAttachment;

use crate::support;
use support::csi::create;
use support::env::CsiEnv;
use support::fixtures::{self, eventually};
use support::monitoring::{Scrape, expressions, held_series_test, input_series, metric_names};

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
    let (node, other) = (base.nodes[0].clone(), base.nodes[1].clone());
    let (ctrl, agent, mut csi) = (&base.ctrl, base.agent(), base.csi());

    // A claim's volume, with the parameters the provisioner adds
    // (--extra-create-metadata), and one of no claim.
    let namespace = format!("ns-{}", base.id);
    let mut req = create(&format!("{}-claimed", base.id), 64 << 20, None);
    req.parameters = [
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", namespace.as_str()),
        ("csi.storage.k8s.io/pv/name", "pv-data"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let claimed = csi
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let plain = csi
        .create_volume(create(&format!("{}-plain", base.id), 64 << 20, None))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let vas: Api<VolumeAttachment> = Api::all(base.client.clone());
    for v in [&claimed, &plain] {
        eventually(WAIT, "the VolumeAttachment", || async {
            vas.get_opt(v).await.ok().flatten()
        })
        .await;
        base.attach(v, "manual-a", "manual", &node).await;
    }
    // A ticket for the other node waits (the volume is ReadWriteOnce, held here).
    fixtures::put_ticket(
        &base.client,
        &plain,
        "manual-b",
        "manual",
        &other,
        serde_json::json!({}),
    )
    .await;

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
    let vol = |v: &str| format!("volume=\"{v}\"");
    let (ctrl_text, agent_text) = eventually(WAIT, "the run in the metrics", || async {
        let c = ctrl.metrics().unwrap_or_default();
        let a = agent.metrics().unwrap_or_default();
        let shown = sample(
            &a,
            "tessera_fuse_operations_total{",
            &[&vol(&claimed), &claim],
        )
        .is_some()
            && sample(
                &a,
                "tessera_fuse_errors_total{",
                &[&vol(&plain), "pvc=\"\""],
            )
            .is_some()
            && sample(
                &a,
                "tessera_mount_handoffs_total{",
                &[&vol(&claimed), &claim, "reason=\"takeover\""],
            ) == Some(1.0)
            && sample(
                &c,
                "tessera_volume_state{",
                &[&vol(&claimed), &claim, "state=\"Attached\""],
            ) == Some(1.0)
            && sample(
                &c,
                "tessera_mountpod_restarts_total{",
                &[&vol(&claimed), &claim],
            ) == Some(1.0)
            && sample(&c, "tessera_tickets_waiting{", &[]).is_some()
            // The agent counts its own queue, empty once its mounts are served.
            && sample(
                &a,
                "tessera_reconcile_queue_depth{",
                &["controller=\"mountpod\""],
            ) == Some(0.0);
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
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(support::monitoring::rules_path()).unwrap())
            .unwrap();
    let rule = rules["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == "TesseraTicketsWaiting")
        .unwrap();
    let render = |key: &str| {
        rule["annotations"][key]
            .as_str()
            .unwrap()
            .replace("{{ $value }}", &n.to_string())
            .replace("{{ $labels.reason }}", reason)
    };
    let expect = BTreeMap::from([(
        "TesseraTicketsWaiting".to_string(),
        vec![serde_json::json!({
            "exp_labels": {"severity": "warning", "reason": reason},
            "exp_annotations": {"summary": render("summary"),
                "description": render("description"), "runbook_url": render("runbook_url")},
        })],
    )]);
    let test = dir.join("held.test.yaml");
    std::fs::write(&test, held_series_test(&scrape, 20, &expect)).unwrap();
    let out = std::process::Command::new(support::repo_root().join("target/harness/bin/promtool"))
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .expect("running promtool (make harness builds it)");
    assert!(
        out.status.success(),
        "promtool test rules {}:\n{}{}",
        test.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    fixtures::remove_ticket(&base.client, &plain, "manual-b").await;
    for v in [&claimed, &plain] {
        base.detach(v, "manual-a", &node).await;
    }
    base.cleanup(&[claimed, plain]).await;
}
