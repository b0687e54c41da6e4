//! Settings a running daemon takes without a remount: the settings file
//! (`--settings-file`), written by the node agent from the MountPod's spec
//! ([`settings_text`]) and read by the daemon at start and again on SIGHUP
//! ([`Settings::read`]).
//!
//! ```text
//!  Volume.spec.attrCacheSeconds ─▶ MountPod.spec ─▶ agent: <state>/mounts/<vol>.settings
//!     {"attrCacheSeconds": 30}   ─(SIGHUP)─▶ Settings::parse ─▶ adapter::LiveTtl::set
//!                                              └─ every entry and attr reply from then on
//! ```
//!
//! Only what the kernel takes per reply can change live: the attribute and name cache
//! lifetime comes with each reply, so the next lookup or getattr uses the new one
//! (what the kernel cached before keeps its old lifetime). A setting absent from the
//! file keeps the daemon's own default (`--attr-timeout`, else the backend's).

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// The longest attribute cache lifetime a setting may ask for.
pub const MAX_ATTR_CACHE_SECONDS: u64 = 3600;
/// The largest settings file read.
const MAX_FILE: u64 = 4096;

/// The content of a settings file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Settings {
    /// How long the kernel may cache attributes and names, in seconds.
    #[serde(default)]
    pub attr_cache_seconds: Option<u64>,
}

/// A settings file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("reading the settings file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the settings file {path} is larger than {MAX_FILE} bytes")]
    TooLarge { path: String },
    #[error("the settings file {path} does not parse")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("attrCacheSeconds {0} is more than {MAX_ATTR_CACHE_SECONDS}")]
    AttrCache(u64),
}

/// The text of a settings file: `{"attrCacheSeconds":N}`, or `{}` when the MountPod
/// sets no lifetime (the daemon's default then holds).
pub fn settings_text(attr_cache_seconds: Option<i64>) -> String {
    let body = match attr_cache_seconds {
        Some(s) => serde_json::json!({"attrCacheSeconds": s}),
        None => serde_json::json!({}),
    };
    format!("{body}\n")
}

impl Settings {
    /// Parse and bound the bytes of a settings file.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Settings, SettingsError> {
        let s: Settings = serde_json::from_slice(bytes).map_err(|source| SettingsError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        if let Some(a) = s.attr_cache_seconds.filter(|a| *a > MAX_ATTR_CACHE_SECONDS) {
            return Err(SettingsError::AttrCache(a));
        }
        Ok(s)
    }

    /// Read `path`; a missing file is no settings.
    pub fn read(path: &Path) -> Result<Settings, SettingsError> {
        let shown = || path.display().to_string();
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Settings::default()),
            Err(source) => {
                return Err(SettingsError::Read {
                    path: shown(),
                    source,
                });
            }
        };
        let mut bytes = Vec::new();
        use std::io::Read;
        file.take(MAX_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| SettingsError::Read {
                path: shown(),
                source,
            })?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(SettingsError::TooLarge { path: shown() });
        }
        Settings::parse(path, &bytes)
    }

    /// The attribute cache lifetime these settings ask for, else `default`.
    pub fn ttl(&self, default: Duration) -> Duration {
        self.attr_cache_seconds
            .map(Duration::from_secs)
            .unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the agent writes, the daemon reads back.
    #[test]
    fn the_agents_text_reads_back() {
        let p = Path::new("v.settings");
        let set = Settings::parse(p, settings_text(Some(30)).as_bytes()).unwrap();
        assert_eq!(set.attr_cache_seconds, Some(30));
        assert_eq!(settings_text(Some(30)), "{\"attrCacheSeconds\":30}\n");
        let unset = Settings::parse(p, settings_text(None).as_bytes()).unwrap();
        assert_eq!(unset, Settings::default());
    }

    #[test]
    fn settings_files() {
        let p = Path::new("/s");
        let d = Duration::from_secs(1);
        let ok = |t: &str| Settings::parse(p, t.as_bytes()).unwrap();
        assert_eq!(ok("{}").ttl(d), d);
        assert_eq!(ok(r#"{"attrCacheSeconds": 0}"#).ttl(d), Duration::ZERO);
        assert_eq!(
            ok(r#"{"attrCacheSeconds": 3600}"#).ttl(d),
            Duration::from_secs(3600)
        );
        for bad in [
            r#"{"attrCacheSeconds": 3601}"#,
            r#"{"attrCacheSeconds": -1}"#,
            r#"{"attrCacheSeconds": "5"}"#,
            r#"{"backendRoot": "/x"}"#,
            "not json",
        ] {
            assert!(Settings::parse(p, bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_missing_file_is_no_settings_and_a_big_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.settings");
        assert_eq!(Settings::read(&path).unwrap(), Settings::default());
        std::fs::write(&path, r#"{"attrCacheSeconds": 7}"#).unwrap();
        assert_eq!(Settings::read(&path).unwrap().attr_cache_seconds, Some(7));
        std::fs::write(&path, " ".repeat(5000)).unwrap();
        assert!(matches!(
            Settings::read(&path),
            Err(SettingsError::TooLarge { .. })
        ));
    }
}
