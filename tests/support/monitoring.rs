//! What `config/monitoring/` asks of the metrics, read crudely from the files: the
//! metric names the dashboard's and the alert rules' PromQL expressions name, and the
//! input series of the rule tests (`tests/monitoring/*.test.yaml`); and what a real
//! `/metrics` text offers (names, and each sample's label names). Used by
//! tests/manifests/monitoring.rs (promtool) and tests/node/monitoring.rs (a real run,
//! whose volumes, shared with tests/node/dashboard_run.rs, are [`RunVolumes`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::csi::create;
use super::env::CsiEnv;
use super::fixtures;
use super::repo_root;

/// The volumes of a real run whose metrics are read (tests/node/monitoring.rs, and the
/// run behind docs/figures/dashboard.svg): a claim's volume made through CreateVolume
/// with the parameters the external-provisioner adds (--extra-create-metadata), one of
/// no claim, both attached on the first node (ticket `manual-a`), and a ticket
/// (`manual-b`) for the second node left waiting on the one of no claim (ReadWriteOnce,
/// held).
pub struct RunVolumes {
    /// The claim's namespace.
    pub namespace: String,
    pub claimed: String,
    pub plain: String,
    /// The volumes `<id>-<suffix>` asked for besides, made and not attached.
    pub more: Vec<String>,
}

impl RunVolumes {
    /// Make them (and `more`, suffixes) through `env`'s CSI controller, wait until each
    /// has its VolumeAttachment, attach and put the waiting ticket.
    pub async fn start(env: &CsiEnv, more: &[&str]) -> RunVolumes {
        let id = &env.id;
        let namespace = format!("ns-{id}");
        let mut req = create(&format!("{id}-claimed"), 64 << 20, None);
        req.parameters = [
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", namespace.as_str()),
            ("csi.storage.k8s.io/pv/name", "pv-data"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut names = Vec::new();
        let others = ["plain"].iter().chain(more);
        let reqs = others.map(|suffix| create(&format!("{id}-{suffix}"), 64 << 20, None));
        for req in std::iter::once(req).chain(reqs) {
            names.push(env.made(req).await);
        }
        let more = names.split_off(2);
        let (claimed, plain) = (names[0].clone(), names[1].clone());
        let (node, other) = (&env.nodes[0], &env.nodes[1]);
        for v in [&claimed, &plain] {
            env.attach(v, "manual-a", "manual", node).await;
        }
        // A ticket for the other node waits (the volume is ReadWriteOnce, held here).
        let none = serde_json::json!({});
        fixtures::put_ticket(&env.client, &plain, "manual-b", "manual", other, none).await;
        RunVolumes {
            namespace,
            claimed,
            plain,
            more,
        }
    }

    /// The tickets removed (the mounts gone), the volumes deleted, then the Nodes.
    pub async fn stop(self, env: &CsiEnv) {
        fixtures::remove_ticket(&env.client, &self.plain, "manual-b").await;
        for v in [&self.claimed, &self.plain] {
            env.detach(v, "manual-a", &env.nodes[0]).await;
        }
        let mut all = vec![self.claimed, self.plain];
        all.extend(self.more);
        env.cleanup(&all).await;
    }
}

/// `target/harness/bin/promtool ARGS` in tests/monitoring; its output, after checking
/// it succeeded.
pub fn promtool(args: &[&str]) -> String {
    let bin = repo_root().join("target/harness/bin/promtool");
    assert!(
        bin.exists(),
        "{} is missing: build the harness (`make harness`)",
        bin.display()
    );
    let out = Command::new(&bin)
        .args(args)
        .current_dir(repo_root().join("tests/monitoring"))
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The alert `alert` of the rules file as a rule test expects it to fire: with
/// `labels` (severity included), its annotations rendered with `value` and `labels`.
pub fn expected_alert(alert: &str, value: f64, labels: &[(&str, &str)]) -> serde_json::Value {
    let text = std::fs::read_to_string(rules_path()).unwrap();
    let rules: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let rule = rules["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == alert)
        .unwrap_or_else(|| panic!("no alert {alert} in {}", rules_path().display()));
    let render = |key: &str| {
        let mut text = rule["annotations"][key]
            .as_str()
            .unwrap()
            .replace("{{ $value }}", &value.to_string());
        for (name, v) in labels {
            text = text.replace(&format!("{{{{ $labels.{name} }}}}"), v);
        }
        text
    };
    let exp_labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    serde_json::json!({
        "exp_labels": exp_labels,
        "exp_annotations": {"summary": render("summary"),
            "description": render("description"), "runbook_url": render("runbook_url")},
    })
}

/// The dashboard (config/monitoring/tessera-dashboard.json).
pub fn dashboard_path() -> PathBuf {
    repo_root().join("config/monitoring/tessera-dashboard.json")
}

/// The plain rules file (config/monitoring/tessera.rules.yaml).
pub fn rules_path() -> PathBuf {
    repo_root().join("config/monitoring/tessera.rules.yaml")
}

/// The rule test files (tests/monitoring/*.test.yaml).
pub fn rule_tests() -> Vec<PathBuf> {
    let dir = repo_root().join("tests/monitoring");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    out.sort();
    out
}

/// Every PromQL expression of the dashboard (panel targets, template variables) and of
/// the rules, with where it is.
pub fn expressions() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard_path()).unwrap()).unwrap();
    fn walk(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                let title = m.get("title").and_then(Value::as_str).unwrap_or("");
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", Value::String(e)) => {
                            out.push((format!("dashboard {at}"), e.clone()))
                        }
                        ("definition", Value::String(e)) => {
                            out.push((format!("dashboard variable {at}"), e.clone()))
                        }
                        _ => walk(v, if title.is_empty() { at } else { title }, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, at, out)),
            _ => {}
        }
    }
    walk(&dash, "", &mut out);
    let rules: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(rules_path()).unwrap()).unwrap();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            out.push((
                format!("rule {name}"),
                rule["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// The metric names an expression names: identifiers `tessera_…` or `process_…`
/// (crudely: any such word, label names and strings included, which never start so).
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while i < bytes.len() {
        if word(bytes[i]) && (i == 0 || !word(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && word(bytes[i]) {
                i += 1;
            }
            let w = &expr[start..i];
            if w.starts_with("tessera_") || w.starts_with("process_") {
                out.insert(w.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// One series: its name and its labels (empty values left out: to Prometheus an empty
/// label is no label).
pub type Series = (String, BTreeMap<String, String>);

/// Parse `name{a="x",b="y"}` (as a rule test's `series:` or a sample line's start).
pub fn parse_series(text: &str) -> Option<Series> {
    let text = text.trim();
    let (name, rest) = match text.find('{') {
        Some(i) => (&text[..i], Some(&text[i + 1..])),
        None => (text.split_whitespace().next()?, None),
    };
    let mut labels = BTreeMap::new();
    if let Some(mut rest) = rest {
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            if rest.starts_with('}') || rest.is_empty() {
                break;
            }
            let (key, after) = rest.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => value.push(chars.next()?.1),
                    (_, c) => value.push(c),
                }
            };
            if !value.is_empty() {
                labels.insert(key.trim().to_string(), value);
            }
            rest = &after[end + 1..];
        }
    }
    Some((name.to_string(), labels))
}

/// The input series of every rule test file, with the file they are in.
pub fn input_series() -> Vec<(PathBuf, Series)> {
    let mut out = Vec::new();
    for path in rule_tests() {
        let doc: serde_norway::Value =
            serde_norway::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for test in doc["tests"].as_sequence().unwrap() {
            for s in test["input_series"].as_sequence().unwrap() {
                let text = s["series"].as_str().unwrap();
                let series = parse_series(text).unwrap_or_else(|| panic!("series {text}"));
                out.push((path.clone(), series));
            }
        }
    }
    out
}

/// What a `/metrics` text (OpenMetrics) shows: the family names of its `# TYPE` lines
/// (a family with no sample yet counts: its name is served) and every sample.
#[derive(Debug, Default)]
pub struct Scrape {
    /// Names a query can use: each sample's, and each family's with the suffixes its
    /// type gives it (`_total` for a counter; `_bucket`, `_sum`, `_count` for a
    /// histogram).
    pub names: BTreeSet<String>,
    /// The samples' labels, by name.
    pub samples: BTreeMap<String, Vec<BTreeMap<String, String>>>,
    /// Their values and the target (`instance`) they came from, in the same order.
    pub values: BTreeMap<String, Vec<(f64, String)>>,
}

impl Scrape {
    /// Add the metrics text of the target `instance` (a name for it).
    pub fn add(&mut self, text: &str, instance: &str) {
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let mut it = t.split_whitespace();
                let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                    continue;
                };
                let suffixes: &[&str] = match kind {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    "info" => &["_info"],
                    _ => &[""],
                };
                for s in suffixes {
                    self.names.insert(format!("{name}{s}"));
                }
            } else if !line.starts_with('#')
                && !line.trim().is_empty()
                && let Some((name, labels)) = parse_series(line)
            {
                let value = line
                    .rsplit_once(' ')
                    .and_then(|(_, v)| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN);
                self.names.insert(name.clone());
                self.values
                    .entry(name.clone())
                    .or_default()
                    .push((value, instance.to_string()));
                self.samples.entry(name).or_default().push(labels);
            }
        }
    }

    /// Whether a sample named `name` has exactly the label names of `labels`.
    pub fn has_label_names(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let want: BTreeSet<&String> = labels.keys().collect();
        self.samples.get(name).is_some_and(|all| {
            all.iter()
                .any(|l| l.keys().collect::<BTreeSet<_>>() == want)
        })
    }
}

/// A rule test (`promtool test rules`) whose input is the real series of `scrape`: each
/// sample of a metric the rules name, labelled with its target as `instance`, held at
/// its value for `minutes` (counters held still: nothing increases), with `expect` the
/// alerts expected at `minutes` - 1 by name (every rule not in `expect` is expected
/// silent).
pub fn held_series_test(
    scrape: &Scrape,
    minutes: u32,
    expect: &BTreeMap<String, Vec<Value>>,
) -> String {
    let rules: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(rules_path()).unwrap()).unwrap();
    let mut used = BTreeSet::new();
    for (at, expr) in expressions() {
        if at.starts_with("rule ") {
            used.extend(metric_names(&expr));
        }
    }
    let mut input = Vec::new();
    for (name, samples) in &scrape.samples {
        if !used.contains(name) {
            continue;
        }
        for (labels, (value, instance)) in samples.iter().zip(&scrape.values[name]) {
            // The target label a scrape adds: the controller's and the agent's series
            // of one family stay apart.
            let inner: Vec<String> = labels
                .iter()
                .chain([(&"instance".to_string(), instance)])
                .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap()))
                .collect();
            input.push(serde_json::json!({
                "series": format!("{name}{{{}}}", inner.join(",")),
                "values": format!("{value}x{minutes}"),
            }));
        }
    }
    let mut cases = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            cases.push(serde_json::json!({
                "eval_time": format!("{}m", minutes - 1),
                "alertname": name,
                "exp_alerts": expect.get(name).cloned().unwrap_or_default(),
            }));
        }
    }
    let test = serde_json::json!({
        "rule_files": [rules_path()],
        "evaluation_interval": "1m",
        "tests": [{"name": "a real run's series, held", "interval": "1m",
                   "input_series": input, "alert_rule_test": cases}],
    });
    serde_norway::to_string(&test).unwrap()
}
