//! The agent's state directory: the [`Record`] of each mount (what a restarted agent
//! needs to adopt its daemon), the quota and settings files a daemon re-reads on
//! SIGHUP, its counters and its log. Files are written whole (temporary file and a
//! rename), so a reader never sees half a record.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tessera_fuse::contract::{control, settings};

use super::{Daemon, Error};

/// What the agent remembers about one mount on disk, so a restarted agent can adopt
/// the daemon instead of remounting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The MountPod it serves.
    pub mountpod: String,
    /// The volume.
    pub volume: String,
    /// The daemon.
    pub daemon: Daemon,
    /// When the daemon was started (RFC 3339).
    pub started_at: String,
    /// The volume's directory.
    pub source: PathBuf,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// The quota last given to the daemon.
    pub capacity_bytes: u64,
    /// Mounted read-only.
    pub read_only: bool,
    /// Mount options.
    pub mount_options: Vec<String>,
    /// The attribute cache lifetime last written to the settings file.
    #[serde(default)]
    pub attr_cache_seconds: Option<i64>,
    /// Started with `--shared-backend`. Records written before the flag existed lack
    /// it: their daemons were started without it.
    #[serde(default)]
    pub shared_backend: bool,
    /// The mount has answered at least once. Only such mounts are watched by the
    /// health loop; one that never came up is retried by reconcile, with backoff.
    #[serde(default)]
    pub answered: bool,
    /// The image the daemon runs (pod mode; `None`: process mode, or a record written
    /// before the field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The agent mounted and its daemon was started with `--mounted` (a successor or
    /// a replacement is started the same way). Records written before: the daemon
    /// mounted.
    #[serde(default)]
    pub agent_mounted: bool,
}

impl Record {
    /// How long ago the daemon was started (zero if unknown).
    pub fn age(&self) -> Duration {
        self.started_at
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|t| Duration::try_from(jiff::Timestamp::now().duration_since(t)).ok())
            .unwrap_or_default()
    }
}

/// The agent's state directory:
///
/// ```text
///  <state>/mounts/<volume>.json       Record
///  <state>/mounts/<volume>.capacity   quota in bytes, re-read by the daemon on SIGHUP
///  <state>/mounts/<volume>.counters   the daemon's counters (fuse::counters), mapped
///  <state>/logs/<volume>.log          the daemon's stdout and stderr
///  <state>/node.fence                 the last renewal of the node's liveness Lease (`fuse::contract::fence`)
/// ```
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// Use (and create) `root`.
    pub fn open(root: &Path) -> Result<Self, Error> {
        for sub in ["mounts", "logs"] {
            let p = root.join(sub);
            std::fs::create_dir_all(&p).map_err(|source| Error::State {
                action: "creating",
                path: p,
                source,
            })?;
        }
        Ok(StateDir {
            root: root.to_path_buf(),
        })
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn record_path(&self, volume: &str) -> PathBuf {
        self.root.join("mounts").join(format!("{volume}.json"))
    }

    /// The counters file of `volume`'s daemon.
    pub fn counters_file(&self, volume: &str) -> PathBuf {
        self.root.join("mounts").join(format!("{volume}.counters"))
    }

    /// The file `volume`'s daemon keeps its handoff state in (`--handoff-state`).
    pub fn handoff_file(&self, volume: &str) -> PathBuf {
        self.root.join("mounts").join(format!("{volume}.handoff"))
    }

    /// The fd holder's socket.
    pub fn holder_socket(&self) -> PathBuf {
        self.root.join("holder.sock")
    }

    /// The directory of the records and the capacity and counters files.
    pub fn mounts_dir(&self) -> PathBuf {
        self.root.join("mounts")
    }

    /// The capacity file of `volume`.
    pub fn capacity_file(&self, volume: &str) -> PathBuf {
        self.root.join("mounts").join(format!("{volume}.capacity"))
    }

    /// The file `volume`'s daemon re-reads its live settings from on SIGHUP.
    pub fn settings_file(&self, volume: &str) -> PathBuf {
        self.root.join("mounts").join(format!("{volume}.settings"))
    }

    /// Write `volume`'s live settings (see `fuse::contract::settings`).
    pub fn write_settings(
        &self,
        volume: &str,
        attr_cache_seconds: Option<i64>,
    ) -> Result<(), Error> {
        let text = settings::settings_text(attr_cache_seconds);
        write_atomic(&self.settings_file(volume), text.as_bytes())
    }

    /// The node's fence file, read by every self-fencing daemon (`--fence-file`).
    pub fn fence_file(&self) -> PathBuf {
        self.root.join("node.fence")
    }

    /// Tell the self-fencing daemons of a renewal (see `fuse::contract::fence`).
    pub fn write_fence(&self, news: &tessera_fuse::contract::fence::News) -> Result<(), Error> {
        let text = tessera_fuse::contract::fence::news_text(news);
        write_atomic(&self.fence_file(), text.as_bytes())
    }

    /// The log of `volume`'s daemon.
    pub fn log_file(&self, volume: &str) -> PathBuf {
        self.root.join("logs").join(format!("{volume}.log"))
    }

    /// The record of `volume`, if any. A record that does not parse counts as none
    /// (the mount is then started afresh after cleaning up its mount point).
    pub fn load(&self, volume: &str) -> Result<Option<Record>, Error> {
        let path = self.record_path(volume);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::State {
                action: "reading",
                path,
                source,
            }),
        }
    }

    /// Every record.
    pub fn list(&self) -> Result<Vec<Record>, Error> {
        let dir = self.root.join("mounts");
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::State {
            action: "listing",
            path: dir.clone(),
            source,
        })?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let p = entry.path();
            if p.extension().is_some_and(|e| e == "json")
                && let Ok(bytes) = std::fs::read(&p)
                && let Ok(rec) = serde_json::from_slice::<Record>(&bytes)
            {
                out.push(rec);
            }
        }
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        Ok(out)
    }

    /// Write `record` atomically (temporary file, rename), without fsync: a record
    /// describes a running process, which does not outlive the power loss or kernel
    /// crash an fsync would guard against, and an agent that dies (even mid-write) leaves
    /// the old record or the new one, never a torn one. On the attach path twice, where
    /// two fsyncs each cost 10–25 ms on a busy disk.
    pub fn save(&self, record: &Record) -> Result<(), Error> {
        let bytes = serde_json::to_vec_pretty(record).expect("a record serializes");
        write_atomic(&self.record_path(&record.volume), &bytes)
    }

    /// Write the quota for the daemon to read at start and re-read on SIGHUP (no
    /// fsync: see `write_atomic`).
    pub fn write_capacity(&self, volume: &str, bytes: u64) -> Result<(), Error> {
        write_atomic(
            &self.capacity_file(volume),
            control::capacity_text(bytes).as_bytes(),
        )
    }

    /// Remove the record, capacity file, counters and log of `volume`.
    pub fn remove(&self, volume: &str) -> Result<(), Error> {
        for path in [
            self.record_path(volume),
            self.capacity_file(volume),
            self.settings_file(volume),
            self.counters_file(volume),
            self.handoff_file(volume),
            self.log_file(volume),
        ] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(Error::State {
                        action: "removing",
                        path,
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// The last lines of `volume`'s log (at most `max` bytes), for an error message.
    pub fn log_tail(&self, volume: &str, max: u64) -> String {
        let Ok(mut f) = File::open(self.log_file(volume)) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        let text = strip_ansi(&String::from_utf8_lossy(&buf));
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("==="))
            .collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
    }
}

/// Write through a temporary file and a rename, without fsync: what the agent keeps
/// here (records of running daemons, the quota a daemon re-reads) describes processes
/// that do not outlive the power loss or kernel crash an fsync would guard against,
/// and the agent writes the quota again before it starts a daemon.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let err = |action, source| Error::State {
        action,
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = File::create(&tmp).map_err(|e| err("creating", e))?;
    f.write_all(bytes).map_err(|e| err("writing", e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| err("renaming onto", e))?;
    Ok(())
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        assert_eq!(state.load("v").unwrap(), None);
        let rec = Record {
            mountpod: "v-1".into(),
            volume: "v".into(),
            daemon: Daemon {
                pid: 42,
                start_ticks: 7,
            },
            started_at: jiff::Timestamp::now().to_string(),
            source: "/b/v".into(),
            mountpoint: "/m/v".into(),
            capacity_bytes: 1 << 30,
            read_only: false,
            mount_options: vec!["allow_other".into()],
            attr_cache_seconds: Some(5),
            shared_backend: true,
            answered: false,
            image: Some("reg/tessera:1".into()),
            agent_mounted: true,
        };
        state.save(&rec).unwrap();
        assert_eq!(state.load("v").unwrap(), Some(rec.clone()));
        assert_eq!(state.list().unwrap(), vec![rec.clone()]);
        assert!(rec.age() < Duration::from_secs(5));
        state.write_capacity("v", 5).unwrap();
        assert_eq!(
            std::fs::read_to_string(state.capacity_file("v")).unwrap(),
            "5\n"
        );
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("mounts"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        state.remove("v").unwrap();
        assert_eq!(state.load("v").unwrap(), None);
        state.remove("v").unwrap();
    }

    /// A record written before `sharedBackend` existed stands for a daemon started
    /// without `--shared-backend`.
    #[test]
    fn records_without_shared_backend_load_as_not_shared() {
        let json = r#"{"mountpod":"v-1","volume":"v","daemon":{"pid":42,"startTicks":7},
            "startedAt":"2026-12-01T00:00:00Z","source":"/b/v","mountpoint":"/m/v",
            "capacityBytes":1,"readOnly":false,"mountOptions":[],"answered":true}"#;
        let rec: Record = serde_json::from_str(json).unwrap();
        assert!(!rec.shared_backend);
        assert!(rec.answered);
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        std::fs::write(
            state.log_file("v"),
            "=== start\none\n\u{1b}[31mtwo\u{1b}[0m\nthree\nfour\n",
        )
        .unwrap();
        assert_eq!(state.log_tail("v", 4096), "two | three | four");
        assert_eq!(state.log_tail("missing", 4096), "");
    }
}
