//! What the platform engineer adds to every mount Pod: labels, annotations,
//! tolerations and a priority class (`--mount-pod-label`, `--mount-pod-annotation`,
//! `--mount-pod-tolerations`, `--mount-pod-priority-class-name`; the chart's
//! `mountPods` values). Parsed and checked as the API server checks them, and
//! bounded, so that a typo stops the agent at start instead of failing every mount
//! Pod at its creation.
//!
//! Tessera's own labels and annotations of a mount Pod are not the user's:
//! [`super::spec::mount_pod`] sets them over these (its own win, and the agent warns
//! at start about every key it overrides), and keys under `tessera.io/` are refused
//! here. No nodeSelector or affinity: a mount Pod is bound to its node by `nodeName`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;

/// At most this many extra labels, and as many annotations.
pub const MAX_ENTRIES: usize = 32;
/// At most this many bytes of extra annotations, keys and values (the API server
/// allows 256 KiB for all of a Pod's).
pub const MAX_ANNOTATION_BYTES: usize = 64 * 1024;
/// At most this many tolerations.
pub const MAX_TOLERATIONS: usize = 32;
/// At most this many bytes of `--mount-pod-tolerations`.
pub const MAX_TOLERATIONS_JSON: usize = 16 * 1024;
/// The mount Pods' priority class unless told otherwise: like the node agent's.
pub const DEFAULT_PRIORITY_CLASS: &str = "system-node-critical";
/// Keys with this prefix are Tessera's (labels and annotations alike).
pub const RESERVED_PREFIX: &str = "tessera.io/";

/// The extras of every mount Pod, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Extras {
    /// Labels besides Tessera's.
    pub labels: BTreeMap<String, String>,
    /// Annotations besides Tessera's.
    pub annotations: BTreeMap<String, String>,
    /// The Pod's tolerations (empty: none).
    pub tolerations: Vec<Toleration>,
    /// The Pod's priority class (`None`: none).
    pub priority_class_name: Option<String>,
}

impl Default for Extras {
    /// What mount Pods get with no flag: every taint tolerated (a Pod on a tainted
    /// node still needs its volume) and [`DEFAULT_PRIORITY_CLASS`].
    fn default() -> Self {
        Extras {
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            tolerations: vec![Toleration {
                operator: Some("Exists".into()),
                ..Toleration::default()
            }],
            priority_class_name: Some(DEFAULT_PRIORITY_CLASS.into()),
        }
    }
}

/// Why an extra was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{0:?} is not KEY=VALUE")]
    NotPair(String),
    #[error("key {key:?}: {message}")]
    Key { key: String, message: String },
    #[error("keys under {RESERVED_PREFIX} are Tessera's own: {0:?}")]
    Reserved(String),
    #[error("label {key:?}: value {value:?}: {message}")]
    LabelValue {
        key: String,
        value: String,
        message: String,
    },
    #[error("{0:?} is given twice")]
    Duplicate(String),
    #[error("{got} {what}, at most {max}")]
    TooMany {
        what: &'static str,
        got: usize,
        max: usize,
    },
    #[error("{got} bytes of annotations, at most {MAX_ANNOTATION_BYTES}")]
    TooLarge { got: usize },
    #[error("tolerations: {0}")]
    Toleration(String),
    #[error("priority class {name:?}: {message}")]
    PriorityClass { name: String, message: String },
}

/// A DNS subdomain (RFC 1123), as the API server checks object names and key
/// prefixes: at most 253 characters, dot-separated labels of lowercase letters,
/// digits and `-`, each starting and ending with a letter or digit.
pub fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    let ok = s.split('.').all(|l| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    });
    ok.then_some(())
        .ok_or_else(|| "must be lowercase letters, digits, '-' and '.' (a DNS subdomain)".into())
}

/// The name part of a qualified name, and a non-empty label value: at most 63
/// characters, letters, digits, `-`, `_` and `.`, starting and ending with a letter
/// or digit.
fn check_name(s: &str) -> Result<(), String> {
    let alnum = |c: Option<u8>| c.is_some_and(|b| b.is_ascii_alphanumeric());
    if s.is_empty() || s.len() > 63 {
        return Err("must be 1 to 63 characters".into());
    }
    let ok = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && alnum(s.bytes().next())
        && alnum(s.bytes().last());
    ok.then_some(()).ok_or_else(|| {
        "must be letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
            .into()
    })
}

/// A label or annotation key: `[prefix/]name`, the prefix a DNS subdomain.
pub fn check_qualified_name(key: &str) -> Result<(), String> {
    match key.split_once('/') {
        Some((prefix, name)) => {
            check_dns_subdomain(prefix).map_err(|m| format!("prefix {prefix:?} {m}"))?;
            check_name(name)
        }
        None => check_name(key),
    }
}

/// A label value: empty, or as the name part of a key.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        Ok(())
    } else {
        check_name(value)
    }
}

fn key_of(s: &str) -> Result<(&str, &str), Error> {
    let (key, value) = s.split_once('=').ok_or_else(|| Error::NotPair(s.into()))?;
    check_qualified_name(key).map_err(|message| Error::Key {
        key: key.into(),
        message,
    })?;
    if key.starts_with(RESERVED_PREFIX) {
        return Err(Error::Reserved(key.into()));
    }
    Ok((key, value))
}

/// `--mount-pod-label KEY=VALUE`.
pub fn parse_label(s: &str) -> Result<(String, String), Error> {
    let (key, value) = key_of(s)?;
    check_label_value(value).map_err(|message| Error::LabelValue {
        key: key.into(),
        value: value.into(),
        message,
    })?;
    Ok((key.into(), value.into()))
}

/// `--mount-pod-annotation KEY=VALUE` (any value; the size is bounded in [`ExtrasArgs::extras`]).
pub fn parse_annotation(s: &str) -> Result<(String, String), Error> {
    let (key, value) = key_of(s)?;
    Ok((key.into(), value.into()))
}

/// The tolerations of `--mount-pod-tolerations`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Tolerations(pub Vec<Toleration>);

/// `--mount-pod-tolerations JSON`: a JSON list of Kubernetes tolerations (`key`,
/// `operator`, `value`, `effect`, `tolerationSeconds`), checked as the API server
/// checks a Pod's; a field it does not know is refused rather than dropped.
pub fn parse_tolerations(s: &str) -> Result<Tolerations, Error> {
    let bad = |m: String| Error::Toleration(m);
    if s.len() > MAX_TOLERATIONS_JSON {
        return Err(bad(format!(
            "{} bytes, at most {MAX_TOLERATIONS_JSON}",
            s.len()
        )));
    }
    let raw: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_str(s).map_err(|e| bad(format!("not a JSON list of objects: {e}")))?;
    if raw.len() > MAX_TOLERATIONS {
        return Err(Error::TooMany {
            what: "tolerations",
            got: raw.len(),
            max: MAX_TOLERATIONS,
        });
    }
    let mut out = Vec::with_capacity(raw.len());
    for (i, fields) in raw.into_iter().enumerate() {
        const KNOWN: [&str; 5] = ["key", "operator", "value", "effect", "tolerationSeconds"];
        if let Some(k) = fields.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(bad(format!("[{i}]: unknown field {k:?}")));
        }
        let t: Toleration = serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|e| bad(format!("[{i}]: {e}")))?;
        check_toleration(&t).map_err(|m| bad(format!("[{i}]: {m}")))?;
        out.push(t);
    }
    Ok(Tolerations(out))
}

/// One toleration, as the API server's `validateTolerations`.
fn check_toleration(t: &Toleration) -> Result<(), String> {
    let key = t.key.as_deref().unwrap_or("");
    let operator = t.operator.as_deref().unwrap_or("");
    let value = t.value.as_deref().unwrap_or("");
    let effect = t.effect.as_deref().unwrap_or("");
    if !key.is_empty() {
        check_qualified_name(key).map_err(|m| format!("key {key:?}: {m}"))?;
    } else if operator != "Exists" {
        return Err("an empty key needs operator Exists".into());
    }
    if t.toleration_seconds.is_some() && effect != "NoExecute" {
        return Err("tolerationSeconds needs effect NoExecute".into());
    }
    match operator {
        "" | "Equal" => check_label_value(value).map_err(|m| format!("value {value:?}: {m}"))?,
        "Exists" if !value.is_empty() => {
            return Err("operator Exists takes no value".into());
        }
        "Exists" => {}
        other => return Err(format!("operator {other:?}: Equal or Exists")),
    }
    match effect {
        "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute" => Ok(()),
        other => Err(format!(
            "effect {other:?}: NoSchedule, PreferNoSchedule or NoExecute"
        )),
    }
}

/// `--mount-pod-priority-class-name NAME` (`""`: none).
pub fn parse_priority_class(s: &str) -> Result<String, Error> {
    if !s.is_empty() {
        check_dns_subdomain(s).map_err(|message| Error::PriorityClass {
            name: s.into(),
            message,
        })?;
    }
    Ok(s.into())
}

/// The flags of `tessera node` that make [`Extras`] (pod mode).
#[derive(clap::Args, Debug, Clone)]
pub struct ExtrasArgs {
    /// Pod mode: a label of every mount Pod, `KEY=VALUE` (again for more, at most 32).
    /// Tessera's own labels win over one of the same key; keys under `tessera.io/`
    /// are refused.
    #[arg(long = "mount-pod-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Pod mode: an annotation of every mount Pod, `KEY=VALUE` (again for more, at
    /// most 32 and 64 KiB). Tessera's own annotations win; keys under `tessera.io/`
    /// are refused.
    #[arg(long = "mount-pod-annotation", value_name = "KEY=VALUE", value_parser = parse_annotation)]
    pub annotations: Vec<(String, String)>,
    /// Pod mode: the mount Pods' tolerations, a JSON list of Kubernetes tolerations
    /// (at most 32). Default: `[{"operator":"Exists"}]`, every taint (a Pod on a
    /// tainted node still needs its volume); `[]`: none.
    #[arg(long = "mount-pod-tolerations", value_name = "JSON", value_parser = parse_tolerations)]
    pub tolerations: Option<Tolerations>,
    /// Pod mode: the mount Pods' priority class (`""`: none).
    #[arg(long = "mount-pod-priority-class-name", value_name = "NAME", default_value = DEFAULT_PRIORITY_CLASS, value_parser = parse_priority_class)]
    pub priority_class_name: String,
}

impl ExtrasArgs {
    /// The extras the flags say, each flag checked on its own by its parser and the
    /// whole here: no key twice, the counts and the annotations' size bounded.
    pub fn extras(&self) -> Result<Extras, Error> {
        let map = |pairs: &[(String, String)], what| {
            if pairs.len() > MAX_ENTRIES {
                return Err(Error::TooMany {
                    what,
                    got: pairs.len(),
                    max: MAX_ENTRIES,
                });
            }
            let mut out = BTreeMap::new();
            for (k, v) in pairs {
                if out.insert(k.clone(), v.clone()).is_some() {
                    return Err(Error::Duplicate(k.clone()));
                }
            }
            Ok(out)
        };
        let labels = map(&self.labels, "labels")?;
        let annotations = map(&self.annotations, "annotations")?;
        let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > MAX_ANNOTATION_BYTES {
            return Err(Error::TooLarge { got: size });
        }
        Ok(Extras {
            labels,
            annotations,
            tolerations: match &self.tolerations {
                Some(t) => t.0.clone(),
                None => Extras::default().tolerations,
            },
            priority_class_name: (!self.priority_class_name.is_empty())
                .then(|| self.priority_class_name.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        extras: ExtrasArgs,
    }

    fn parse(args: &[&str]) -> Result<Extras, String> {
        let mut argv = vec!["t"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        cli.extras.extras().map_err(|e| e.to_string())
    }

    #[test]
    fn no_flag_gives_tesseras_defaults() {
        let e = parse(&[]).unwrap();
        assert_eq!(e, Extras::default());
        assert_eq!(
            e.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        assert_eq!(e.tolerations[0].operator.as_deref(), Some("Exists"));
        assert!(e.labels.is_empty() && e.annotations.is_empty());
    }

    #[test]
    fn flags_give_the_extras() {
        let e = parse(&[
            "--mount-pod-label=team=storage",
            "--mount-pod-label",
            "example.com/tier=",
            "--mount-pod-annotation=example.com/owner=a=b, with spaces\nand lines",
            "--mount-pod-tolerations=[{\"key\":\"dedicated\",\"operator\":\"Equal\",\"value\":\"storage\",\"effect\":\"NoExecute\",\"tolerationSeconds\":30}]",
            "--mount-pod-priority-class-name=tessera-mounts",
        ])
        .unwrap();
        assert_eq!(
            e.labels,
            BTreeMap::from([
                ("team".into(), "storage".into()),
                ("example.com/tier".into(), String::new()),
            ])
        );
        assert_eq!(
            e.annotations["example.com/owner"],
            "a=b, with spaces\nand lines"
        );
        let t = &e.tolerations[0];
        assert_eq!(
            (t.key.as_deref(), t.value.as_deref(), t.toleration_seconds),
            (Some("dedicated"), Some("storage"), Some(30))
        );
        assert_eq!(e.priority_class_name.as_deref(), Some("tessera-mounts"));
        let none = parse(&[
            "--mount-pod-tolerations=[]",
            "--mount-pod-priority-class-name=",
        ])
        .unwrap();
        assert!(none.tolerations.is_empty());
        assert_eq!(none.priority_class_name, None);
    }

    #[test]
    fn keys_and_values_are_checked_as_the_api_server_does() {
        let long = "a".repeat(64);
        let long_prefix = format!("{}.com/x", "a".repeat(250));
        let cases: &[(&str, &str)] = &[
            ("--mount-pod-label=team", "is not KEY=VALUE"),
            ("--mount-pod-label==x", "must be 1 to 63"),
            ("--mount-pod-label=-team=x", "starting and ending"),
            (
                "--mount-pod-label=Example.com/x=y",
                "prefix \"Example.com\"",
            ),
            ("--mount-pod-label=a/b/c=y", "must be letters"),
            ("--mount-pod-label=team=two words", "value \"two words\""),
            (&format!("--mount-pod-label=team={long}"), "1 to 63"),
            (&format!("--mount-pod-label={long}=x"), "1 to 63"),
            (&format!("--mount-pod-label={long_prefix}=x"), "1 to 253"),
            ("--mount-pod-label=tessera.io/x=y", "Tessera's own"),
            (
                "--mount-pod-annotation=tessera.io/mountpod=y",
                "Tessera's own",
            ),
            ("--mount-pod-annotation=no key", "is not KEY=VALUE"),
            ("--mount-pod-annotation=a b=c", "must be letters"),
            ("--mount-pod-priority-class-name=Tessera", "DNS subdomain"),
        ];
        for (arg, says) in cases {
            let err = parse(&[arg]).unwrap_err();
            assert!(err.contains(says), "{arg}: {err}");
        }
        for ok in [
            "--mount-pod-label=a.b-c_d=A.b-C_9",
            "--mount-pod-label=x.example.com/Name=v",
            "--mount-pod-label=k=",
            "--mount-pod-annotation=k=",
        ] {
            assert!(parse(&[ok]).is_ok(), "{ok}");
        }
    }

    #[test]
    fn tolerations_are_checked_as_the_api_server_does() {
        let cases: &[(&str, &str)] = &[
            ("{}", "not a JSON list"),
            ("[1]", "not a JSON list"),
            (
                "[{\"operator\":\"Exists\",\"efect\":\"NoSchedule\"}]",
                "unknown field \"efect\"",
            ),
            (
                "[{\"operator\":\"Equal\"}]",
                "an empty key needs operator Exists",
            ),
            ("[{}]", "an empty key needs operator Exists"),
            (
                "[{\"key\":\"k\",\"operator\":\"Exists\",\"value\":\"v\"}]",
                "takes no value",
            ),
            (
                "[{\"key\":\"k\",\"operator\":\"Lt\",\"value\":\"1\"}]",
                "operator \"Lt\"",
            ),
            (
                "[{\"key\":\"k\",\"value\":\"two words\"}]",
                "value \"two words\"",
            ),
            ("[{\"key\":\"k k\",\"operator\":\"Exists\"}]", "key \"k k\""),
            (
                "[{\"operator\":\"Exists\",\"effect\":\"NoRun\"}]",
                "effect \"NoRun\"",
            ),
            (
                "[{\"operator\":\"Exists\",\"effect\":\"NoSchedule\",\"tolerationSeconds\":5}]",
                "needs effect NoExecute",
            ),
            ("[{\"key\":1}]", "[0]"),
        ];
        for (json, says) in cases {
            let err = parse(&[&format!("--mount-pod-tolerations={json}")]).unwrap_err();
            assert!(err.contains(says), "{json}: {err}");
        }
        let ok = "[{\"operator\":\"Exists\"},{\"key\":\"k\",\"value\":\"v\",\"effect\":\"NoSchedule\"},{\"key\":\"x/y\",\"operator\":\"Exists\",\"effect\":\"NoExecute\",\"tolerationSeconds\":0}]";
        let e = parse(&[&format!("--mount-pod-tolerations={ok}")]).unwrap();
        assert_eq!(e.tolerations.len(), 3);
    }

    #[test]
    fn counts_and_sizes_are_bounded() {
        let many = |flag: &str, n: usize| -> Vec<String> {
            (0..n)
                .map(|i| format!("--mount-pod-{flag}=k{i}=v"))
                .collect()
        };
        let run = |args: Vec<String>| {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            parse(&refs)
        };
        assert!(run(many("label", MAX_ENTRIES)).is_ok());
        let err = run(many("label", MAX_ENTRIES + 1)).unwrap_err();
        assert!(err.contains("33 labels, at most 32"), "{err}");
        let err = run(many("annotation", MAX_ENTRIES + 1)).unwrap_err();
        assert!(err.contains("33 annotations, at most 32"), "{err}");
        let big = "v".repeat(MAX_ANNOTATION_BYTES / 2);
        assert!(run(vec![format!("--mount-pod-annotation=a={big}")]).is_ok());
        let err = run(vec![
            format!("--mount-pod-annotation=a={big}"),
            format!("--mount-pod-annotation=b={big}"),
        ])
        .unwrap_err();
        assert!(err.contains("bytes of annotations, at most 65536"), "{err}");
        let err = run(vec![
            "--mount-pod-label=k=a".into(),
            "--mount-pod-label=k=b".into(),
        ])
        .unwrap_err();
        assert!(err.contains("\"k\" is given twice"), "{err}");
        let tolerations = format!(
            "[{}]",
            vec!["{\"operator\":\"Exists\"}"; MAX_TOLERATIONS + 1].join(",")
        );
        let err = run(vec![format!("--mount-pod-tolerations={tolerations}")]).unwrap_err();
        assert!(err.contains("33 tolerations, at most 32"), "{err}");
        let huge = format!("[{}]", " ".repeat(MAX_TOLERATIONS_JSON));
        let err = run(vec![format!("--mount-pod-tolerations={huge}")]).unwrap_err();
        assert!(err.contains("bytes, at most 16384"), "{err}");
    }
}
