//! Equality label selectors given on the command line (`--watch-selector a=b,c=d`),
//! shared by the controller and the node agent: they restrict what a process watches
//! and are copied onto the objects it creates.

use std::collections::BTreeMap;

/// Labels given on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(pub BTreeMap<String, String>);

impl Labels {
    /// As a label selector string (`a=b,c=d`).
    pub fn selector(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A watch of the objects carrying these labels (every object: none given).
    pub fn watcher_config(&self) -> kube::runtime::watcher::Config {
        let wc = kube::runtime::watcher::Config::default();
        if self.0.is_empty() {
            wc
        } else {
            wc.labels(&self.selector())
        }
    }
}

/// Parse `key=value[,key=value]` (clap value parser).
pub fn parse_labels(s: &str) -> Result<Labels, String> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            format!("{pair:?} is not key=value (only equality selectors are supported)")
        })?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(Labels(out))
}
