//! config/monitoring/'s alert rules and dashboard, checked without a cluster:
//! Prometheus's own `promtool check rules` and `promtool test rules`
//! (tests/monitoring/*.test.yaml; promtool is the harness build,
//! `tests/harness/prometheus/`), the PrometheusRule against the plain rules file, the
//! Helm chart's copies against config/monitoring/, and each runbook link against
//! docs/troubleshooting.md. That the metrics they name exist, and that the rule tests'
//! input series look like real ones, is checked against a real run in
//! tests/node/monitoring.rs.

use crate::support;
use crate::support::monitoring::{expressions, metric_names, promtool, rule_tests, rules_path};

#[test]
fn promtool_checks_the_rules() {
    let out = promtool(&["check", "rules", &rules_path().to_string_lossy()]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn promtool_tests_the_rules() {
    let files = rule_tests();
    assert!(!files.is_empty(), "tests/monitoring/*.test.yaml");
    let mut args = vec!["test".to_string(), "rules".to_string()];
    args.extend(files.iter().map(|f| f.to_string_lossy().into_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = promtool(&args);
    println!("{out}");
}

/// Every expression of the dashboard parses as PromQL: each, with Grafana's variables
/// replaced by what they stand for, becomes a recording rule that `promtool check
/// rules` parses (the variables' `label_values(…)` are Grafana's, not PromQL: their
/// metric selector is checked instead).
#[test]
fn promtool_parses_every_dashboard_expression() {
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut n = 0;
    for (at, expr) in expressions() {
        if !at.starts_with("dashboard") {
            continue;
        }
        let expr = match expr.strip_prefix("label_values(") {
            Some(rest) => rest.rsplit_once(',').map_or(rest, |(m, _)| m).to_string(),
            None => expr,
        };
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$namespace", ".*")
            .replace("$volume", ".*")
            .replace("$node", ".*");
        assert!(!expr.contains('$'), "{at}: a variable left in {expr}");
        n += 1;
        rules.push_str(&format!(
            "      - record: dashboard:expr{n}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    assert!(n > 20, "{n} expressions");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard.rules.yaml");
    std::fs::write(&file, rules).unwrap();
    let out = promtool(&["check", "rules", &file.to_string_lossy()]);
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
}

/// Every alert has a rule test that expects it to fire.
#[test]
fn every_alert_is_tested_firing() {
    let rules: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(rules_path()).unwrap()).unwrap();
    let mut fired = std::collections::BTreeSet::new();
    for path in rule_tests() {
        let doc: serde_norway::Value =
            serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for test in doc["tests"].as_sequence().unwrap() {
            for t in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                if t["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty()) {
                    fired.insert(t["alertname"].as_str().unwrap().to_string());
                }
            }
        }
    }
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            assert!(fired.contains(name), "{name} is never tested firing");
        }
    }
}

/// The PrometheusRule holds the plain rules file's groups, word for word.
#[test]
fn the_prometheusrule_is_the_rules_file() {
    let root = support::repo_root();
    let plain: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(rules_path()).unwrap()).unwrap();
    let rule: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(root.join("config/monitoring/prometheusrule.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    assert!(
        rule["spec"] == plain,
        "config/monitoring/prometheusrule.yaml differs from tessera.rules.yaml: run `make monitoring`"
    );
}

/// The chart ships config/monitoring/'s files, byte for byte.
#[test]
fn the_charts_copies_are_config_monitorings() {
    let root = support::repo_root();
    for f in ["tessera-dashboard.json", "tessera.rules.yaml"] {
        let want = std::fs::read(root.join("config/monitoring").join(f)).unwrap();
        let got = std::fs::read(root.join("charts/tessera/files").join(f)).unwrap();
        assert!(
            want == got,
            "charts/tessera/files/{f} differs from config/monitoring/{f}: run `make monitoring`"
        );
    }
}

/// Each runbook link names a heading of docs/troubleshooting.md (GitHub's anchors,
/// `doc_links::anchors`).
#[test]
fn every_runbook_is_a_section_of_troubleshooting() {
    let docs =
        std::fs::read_to_string(support::repo_root().join("docs/troubleshooting.md")).unwrap();
    let anchors = crate::doc_links::anchors(&docs);
    let rules: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(rules_path()).unwrap()).unwrap();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let url = rule["annotations"]["runbook_url"].as_str().unwrap();
            let anchor = url
                .strip_prefix("docs/troubleshooting.md#")
                .unwrap_or_else(|| panic!("{url}"));
            assert!(anchors.contains(anchor), "{url}: no such section");
        }
    }
}

/// The crude reading of expressions that tests/node/monitoring.rs relies on.
#[test]
fn metric_names_are_read_from_expressions() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le) (rate(tessera_ticket_satisfied_seconds_bucket[$__rate_interval]))) / process_open_fds and on (pod) tessera_build_info{version!="x"}"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "process_open_fds",
            "tessera_build_info",
            "tessera_ticket_satisfied_seconds_bucket"
        ]
    );
    let all = expressions();
    assert!(all.len() > 20, "{all:?}");
    assert!(all.iter().any(|(at, _)| at.starts_with("rule ")));
    assert!(
        all.iter()
            .any(|(at, _)| at.starts_with("dashboard variable"))
    );
}
