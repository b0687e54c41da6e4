//! The krew plugin manifest `make dist` writes (plugins/dist.sh from
//! plugins/tessera.yaml.in) and the archives it names: the manifest passes krew's
//! checks, written here from krew's Plugin type and its validation
//! (`krew.googlecontainertools.github.com/v1alpha2`: `internal/index/validation` and
//! the developer guide's "Writing Krew plugin manifests"); each platform's sha256 is
//! its archive's, and the archive holds the binary `bin` names (which runs) and the
//! LICENSE. The dist script runs on the test build of the plugin (no release build).

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::support;

const API_VERSION: &str = "krew.googlecontainertools.github.com/v1alpha2";

/// The fields krew's `index.Plugin` knows, by JSON pointer pattern (`*` any list item).
/// krew itself ignores unknown fields when it decodes; a typo here would be silently
/// dropped, so this check refuses them.
const KNOWN_FIELDS: &[(&str, &[&str])] = &[
    ("", &["apiVersion", "kind", "metadata", "spec"]),
    // krew keeps the whole ObjectMeta; name is the only one it reads.
    ("/metadata", &["name", "labels", "annotations"]),
    (
        "/spec",
        &[
            "version",
            "homepage",
            "shortDescription",
            "description",
            "caveats",
            "platforms",
        ],
    ),
    (
        "/spec/platforms/*",
        &["selector", "uri", "sha256", "files", "bin"],
    ),
    (
        "/spec/platforms/*/selector",
        &["matchLabels", "matchExpressions"],
    ),
    ("/spec/platforms/*/files/*", &["from", "to"]),
];

/// What krew would refuse in manifest `m` found in the file `<stem>.yaml` (empty: none).
pub fn krew_problems(m: &Value, stem: &str) -> Vec<String> {
    let mut out = Vec::new();
    unknown_fields(m, "", "", &mut out);
    let s = |p: &str| m.pointer(p).and_then(Value::as_str).unwrap_or("");
    if s("/apiVersion") != API_VERSION {
        out.push(format!(
            "apiVersion {:?}, not {API_VERSION}",
            s("/apiVersion")
        ));
    }
    if s("/kind") != "Plugin" {
        out.push(format!("kind {:?}, not Plugin", s("/kind")));
    }
    let name = s("/metadata/name");
    let safe = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !safe {
        out.push(format!("name {name:?} must match ^[\\w-]+$"));
    }
    if name != stem {
        out.push(format!("the file {stem}.yaml holds plugin {name:?}"));
    }
    let short = s("/spec/shortDescription");
    if short.is_empty() {
        out.push("no shortDescription".into());
    }
    if short.contains(['\r', '\n']) {
        out.push("shortDescription has a line break".into());
    }
    if let Err(e) = krew_semver(s("/spec/version")) {
        out.push(format!("version {:?}: {e}", s("/spec/version")));
    }
    let platforms = m
        .pointer("/spec/platforms")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if platforms.is_empty() {
        out.push("no platforms".into());
    }
    for (i, p) in platforms.iter().enumerate() {
        out.extend(
            platform_problems(p)
                .into_iter()
                .map(|e| format!("platform {i}: {e}")),
        );
    }
    out
}

fn unknown_fields(v: &Value, path: &str, pattern: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            let known = KNOWN_FIELDS.iter().find(|(p, _)| *p == pattern);
            for (k, child) in map {
                if let Some((_, fields)) = known {
                    if !fields.contains(&k.as_str()) {
                        out.push(format!("unknown field {path}/{k}"));
                        continue;
                    }
                } else {
                    // Free-form below here (labels, matchLabels, matchExpressions).
                    continue;
                }
                unknown_fields(
                    child,
                    &format!("{path}/{k}"),
                    &format!("{pattern}/{k}"),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                unknown_fields(item, &format!("{path}/{i}"), &format!("{pattern}/*"), out);
            }
        }
        _ => {}
    }
}

/// krew's version rule: `v` then a semantic version (semver.org, 2.0.0).
fn krew_semver(v: &str) -> Result<(), String> {
    let rest = v.strip_prefix('v').ok_or("must start with v")?;
    let (rest, build) = match rest.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (rest, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let numeric = |n: &str| {
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'))
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3 || !parts.iter().all(|p| numeric(p)) {
        return Err("not MAJOR.MINOR.PATCH".into());
    }
    let ident =
        |i: &str| !i.is_empty() && i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if let Some(p) = pre {
        for i in p.split('.') {
            if !ident(i) || (i.bytes().all(|b| b.is_ascii_digit()) && !numeric(i)) {
                return Err(format!("pre-release identifier {i:?}"));
            }
        }
    }
    if let Some(b) = build
        && !b.split('.').all(ident)
    {
        return Err(format!("build metadata {b:?}"));
    }
    Ok(())
}

fn platform_problems(p: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("");
    if s("uri").is_empty() {
        out.push("no uri".into());
    }
    let sha = s("sha256");
    if sha.len() != 64 || !sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        out.push(format!("sha256 {sha:?} is not 64 lowercase hex digits"));
    }
    if s("bin").is_empty() {
        out.push("no bin".into());
    }
    if let Some(files) = p.get("files") {
        match files.as_array() {
            Some(f) if f.is_empty() => out.push("files is empty (leave it out instead)".into()),
            Some(f) => {
                for op in f {
                    for k in ["from", "to"] {
                        if op.get(k).and_then(Value::as_str).unwrap_or("").is_empty() {
                            out.push(format!("a files entry without {k}"));
                        }
                    }
                }
            }
            None => out.push("files is not a list".into()),
        }
    }
    let Some(sel) = p.get("selector").filter(|v| !v.is_null()) else {
        out.push("no selector".into());
        return out;
    };
    let labels = sel.get("matchLabels").and_then(Value::as_object);
    let exprs = sel.get("matchExpressions").and_then(Value::as_array);
    if labels.is_none_or(|l| l.is_empty()) && exprs.is_none_or(|e| e.is_empty()) {
        out.push("empty selector".into());
    }
    let keys =
        labels
            .into_iter()
            .flat_map(|l| l.keys().cloned())
            .chain(exprs.into_iter().flatten().map(|e| {
                e.get("key")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            }));
    for k in keys {
        if k != "os" && k != "arch" {
            out.push(format!("selector key {k:?} (krew knows os and arch)"));
        }
    }
    out
}

/// A manifest krew accepts, for the table test to break one field at a time.
fn good() -> Value {
    serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": "Plugin",
        "metadata": {"name": "tessera"},
        "spec": {
            "version": "v0.1.0",
            "homepage": "https://tessera.io",
            "shortDescription": "Status of Tessera volumes",
            "description": "Long.\n",
            "platforms": [{
                "selector": {"matchLabels": {"os": "linux", "arch": "amd64"}},
                "uri": "https://example.com/a.tar.gz",
                "sha256": "9167b8295c12d2b28f8e459aa4db7d3a09b591e83a260789b232116591e3291c",
                "bin": "kubectl-tessera",
                "files": [{"from": "kubectl-tessera", "to": "."}]
            }]
        }
    })
}

#[test]
fn krew_rules_refuse_what_krew_refuses() {
    assert_eq!(krew_problems(&good(), "tessera"), Vec::<String>::new());
    for v in ["v1.2.3-rc.1+build.5", "v10.0.0", "v0.0.1-alpha"] {
        assert_eq!(krew_semver(v), Ok(()), "{v}");
    }
    type Break = fn(&mut Value);
    let cases: &[(&str, Break, &str)] = &[
        (
            "apiVersion",
            |m| m["apiVersion"] = "krew.googlecontainertools.github.com/v1alpha1".into(),
            "apiVersion",
        ),
        ("kind", |m| m["kind"] = "Plug".into(), "kind"),
        (
            "name",
            |m| m["metadata"]["name"] = "other".into(),
            "holds plugin",
        ),
        (
            "unsafe name",
            |m| m["metadata"]["name"] = "a.b".into(),
            "must match",
        ),
        (
            "no short",
            |m| m["spec"]["shortDescription"] = "".into(),
            "no shortDescription",
        ),
        (
            "short lines",
            |m| m["spec"]["shortDescription"] = "a\nb".into(),
            "line break",
        ),
        (
            "no v",
            |m| m["spec"]["version"] = "0.1.0".into(),
            "start with v",
        ),
        (
            "two parts",
            |m| m["spec"]["version"] = "v0.1".into(),
            "MAJOR",
        ),
        (
            "leading zero",
            |m| m["spec"]["version"] = "v01.1.0".into(),
            "MAJOR",
        ),
        (
            "no platforms",
            |m| m["spec"]["platforms"] = serde_json::json!([]),
            "no platforms",
        ),
        (
            "sha",
            |m| m["spec"]["platforms"][0]["sha256"] = "ABC".into(),
            "sha256",
        ),
        (
            "upper sha",
            |m| {
                m["spec"]["platforms"][0]["sha256"] =
                    "9167B8295C12D2B28F8E459AA4DB7D3A09B591E83A260789B232116591E3291C".into()
            },
            "sha256",
        ),
        (
            "no uri",
            |m| m["spec"]["platforms"][0]["uri"] = "".into(),
            "no uri",
        ),
        (
            "no bin",
            |m| {
                m["spec"]["platforms"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("bin");
            },
            "no bin",
        ),
        (
            "no selector",
            |m| {
                m["spec"]["platforms"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("selector");
            },
            "no selector",
        ),
        (
            "empty selector",
            |m| m["spec"]["platforms"][0]["selector"] = serde_json::json!({"matchLabels": {}}),
            "empty selector",
        ),
        (
            "selector key",
            |m| m["spec"]["platforms"][0]["selector"]["matchLabels"]["libc"] = "musl".into(),
            "selector key",
        ),
        (
            "files empty",
            |m| m["spec"]["platforms"][0]["files"] = serde_json::json!([]),
            "files is empty",
        ),
        (
            "files to",
            |m| m["spec"]["platforms"][0]["files"] = serde_json::json!([{"from": "x"}]),
            "without to",
        ),
        (
            "typo",
            |m| m["spec"]["shortDesc"] = "x".into(),
            "unknown field /spec/shortDesc",
        ),
        (
            "platform typo",
            |m| m["spec"]["platforms"][0]["sha"] = "x".into(),
            "unknown field /spec/platforms/0/sha",
        ),
    ];
    for (what, break_it, want) in cases {
        let mut m = good();
        break_it(&mut m);
        let problems = krew_problems(&m, "tessera");
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{what}: want a problem with {want:?}, got {problems:?}"
        );
    }
}

/// `make dist`'s script on the test build: the manifest passes, names this version,
/// and each platform's archive is there with its sha256, the binary and the LICENSE.
#[test]
fn dist_writes_archives_and_a_manifest_krew_accepts() {
    let root = support::repo_root();
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_kubectl-tessera");
    let out = Command::new("bash")
        .arg(root.join("plugins/dist.sh"))
        .env("DIST_DIR", dir.path())
        .env("TESSERA_PLUGIN_BIN", bin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "plugins/dist.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("tessera.yaml")).unwrap();
    assert!(!text.contains('@'), "a placeholder left:\n{text}");
    let m: Value = serde_norway::from_str(&text).unwrap();
    assert_eq!(krew_problems(&m, "tessera"), Vec::<String>::new(), "{text}");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(m["spec"]["version"], format!("v{version}"));

    let platforms = m["spec"]["platforms"].as_array().unwrap();
    assert_eq!(platforms.len(), 1, "this machine's target only: {text}");
    for p in platforms {
        let uri = p["uri"].as_str().unwrap();
        assert!(uri.contains(&format!("/v{version}/")), "{uri}");
        let file = uri.rsplit('/').next().unwrap();
        let archive = std::fs::read(dir.path().join(file)).unwrap();
        assert_eq!(p["sha256"], hex::encode(Sha256::digest(&archive)), "{file}");
        let sidecar = std::fs::read_to_string(dir.path().join(format!("{file}.sha256"))).unwrap();
        assert_eq!(
            sidecar,
            format!("{}  {file}\n", p["sha256"].as_str().unwrap())
        );
        check_archive(&dir.path().join(file), p, &root);
    }
}

/// What krew does with the archive: unpack, apply `files`, run `bin`.
fn check_archive(archive: &Path, p: &Value, root: &Path) {
    let unpacked = tempfile::tempdir().unwrap();
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(status.success());
    let mut names: Vec<String> = std::fs::read_dir(unpacked.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["LICENSE", "kubectl-tessera"]);
    for op in p["files"].as_array().unwrap() {
        let from = op["from"].as_str().unwrap();
        assert!(unpacked.path().join(from).exists(), "files.from {from}");
    }
    assert_eq!(
        std::fs::read(unpacked.path().join("LICENSE")).unwrap(),
        std::fs::read(root.join("LICENSE")).unwrap()
    );
    let bin = unpacked.path().join(p["bin"].as_str().unwrap());
    let out = Command::new(&bin).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("kubectl tessera {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn the_license_is_apache_2_as_cargo_toml_says() {
    let root = support::repo_root();
    let license = std::fs::read_to_string(root.join("LICENSE")).unwrap();
    assert!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
    );
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(cargo.contains("license = \"Apache-2.0\""));
}
