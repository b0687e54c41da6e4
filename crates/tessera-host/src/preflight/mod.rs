//! `tessera preflight`: what one node offers Tessera, read before install by a Pod the
//! kubectl plugin starts on each node (`kubectl tessera preflight`). It reads the host
//! through a read-only mount of its `/` ([`check`]: the kernel, `/dev/fuse`, the
//! hostPaths the DaemonSet needs, each backend root) and, in the roots mounted
//! writable, leaves, reads and removes marker files ([`mark`], [`look`], [`unmark`])
//! so the plugin learns which nodes share a root. Each action prints one JSON line.
//!
//! ```text
//!  plugin ─ Pod per node ─▶ check  ─▶ NodeFacts (kernel, fuse, paths, roots) ─┐
//!         ─ Pod per node ─▶ mark   (.tessera-preflight-<token>-<node> in each root)
//!         ─ Pod per node ─▶ look   ─▶ Sightings (root → nodes whose marker is seen) ─┤
//!         ─ Pod per node ─▶ unmark                                                    │
//!                             plugin::preflight::diagnose ◀──────────────────────────┘
//! ```
//!
//! Nothing here writes outside the marker files; [`check`] writes nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

#[cfg(test)]
mod tests;

/// The paths the node DaemonSet mounts with a hostPath type that must already exist
/// (`type: Directory` or `CharDevice` in config/node.yaml and the chart; a unit test
/// compares): (path under the kubelet directory or absolute, kind).
/// (`/mnt/shared`, where a shared filesystem is mounted, is not among them: the agent
/// starts without it and does not serve the Shared roots beneath it there.)
pub const DAEMONSET_HOST_PATHS: [(&str, PathKind); 3] = [
    ("{kubelet}", PathKind::Directory),
    ("{kubelet}/plugins_registry", PathKind::Directory),
    ("/dev/fuse", PathKind::CharDevice),
];

/// What a path must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathKind {
    Directory,
    CharDevice,
}

/// What one node offers, as [`check`] read it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFacts {
    pub node: String,
    /// `uname -r`.
    pub kernel: String,
    /// Each path the DaemonSet needs: path → what is there (`None`: as it must be).
    pub host_paths: BTreeMap<String, Option<String>>,
    /// Each backend root: path → what is there.
    pub roots: BTreeMap<String, RootFacts>,
}

/// One backend root on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootFacts {
    /// A directory is there.
    pub exists: bool,
    /// What is there instead, or why it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The filesystem it is on (`ext4`, `nfs`, `ceph`, `fuse`, or the magic number).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub filesystem: String,
}

/// Which nodes' markers one node saw, root by root.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sightings {
    pub node: String,
    /// Root → the nodes whose marker of this run is there.
    pub seen: BTreeMap<String, Vec<String>>,
}

/// `tessera preflight`.
#[derive(Args, Debug)]
pub struct PreflightArgs {
    #[command(subcommand)]
    pub action: Action,
}

/// What one preflight Pod does.
#[derive(Subcommand, Debug)]
pub enum Action {
    /// Read the host (mounted read-only at --host) and print NodeFacts.
    Check {
        /// This node's name.
        #[arg(long, env = "NODE_NAME")]
        node: String,
        /// Where the host's `/` is mounted (read-only).
        #[arg(long, default_value = "/host")]
        host: PathBuf,
        /// The kubelet's root directory on the host.
        #[arg(long, default_value = "/var/lib/kubelet")]
        kubelet_dir: String,
        /// A backend root (absolute, on the host); repeated.
        #[arg(long = "root")]
        roots: Vec<String>,
    },
    /// Leave this run's marker of this node in each --dir.
    Mark(MarkerArgs),
    /// Print which nodes' markers of this run are in each --dir.
    Look(MarkerArgs),
    /// Remove this node's marker of this run from each --dir.
    Unmark(MarkerArgs),
}

/// The marker actions' arguments.
#[derive(Args, Debug)]
pub struct MarkerArgs {
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    pub node: String,
    /// This run's token (letters and digits).
    #[arg(long)]
    pub token: String,
    /// `ROOT=DIR`: the backend root ROOT is mounted writable at DIR; repeated.
    #[arg(long = "dir", value_parser = parse_dir)]
    pub dirs: Vec<(String, PathBuf)>,
}

fn parse_dir(s: &str) -> Result<(String, PathBuf), String> {
    let (root, dir) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected ROOT=DIR"))?;
    Ok((root.to_string(), PathBuf::from(dir)))
}

/// Why a preflight action failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the token {0:?} must be 1 to 64 letters and digits")]
    Token(String),
    #[error("the node name {0:?} is not a Kubernetes node name")]
    Node(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("printing the result: {0}")]
    Json(#[from] serde_json::Error),
}

/// Run one action; print its one JSON line.
pub fn run(args: PreflightArgs) -> Result<(), Error> {
    let line = match args.action {
        Action::Check {
            node,
            host,
            kubelet_dir,
            roots,
        } => serde_json::to_string(&check(&node, &host, &kubelet_dir, &roots))?,
        Action::Mark(m) => {
            mark(&m)?;
            serde_json::to_string(&serde_json::json!({"node": m.node, "marked": m.dirs.len()}))?
        }
        Action::Look(m) => serde_json::to_string(&look(&m)?)?,
        Action::Unmark(m) => {
            unmark(&m)?;
            serde_json::to_string(&serde_json::json!({"node": m.node, "unmarked": m.dirs.len()}))?
        }
    };
    println!("{line}");
    Ok(())
}

/// The path `p` (absolute on the host) under the host's `/` mounted at `host`.
fn on_host(host: &Path, p: &str) -> PathBuf {
    host.join(p.trim_start_matches('/'))
}

/// Read what the node offers, writing nothing.
pub fn check(node: &str, host: &Path, kubelet_dir: &str, roots: &[String]) -> NodeFacts {
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let host_paths = DAEMONSET_HOST_PATHS
        .iter()
        .map(|(p, kind)| {
            let p = p.replace("{kubelet}", kubelet_dir.trim_end_matches('/'));
            let found = what_is(&on_host(host, &p));
            let problem = match (kind, found) {
                (PathKind::Directory, Found::Directory) => None,
                (PathKind::CharDevice, Found::CharDevice) => None,
                (_, other) => Some(other.to_string()),
            };
            (p, problem)
        })
        .collect();
    let roots = roots
        .iter()
        .map(|r| {
            let path = on_host(host, r);
            let found = what_is(&path);
            let exists = found == Found::Directory;
            let facts = RootFacts {
                exists,
                problem: (!exists).then(|| found.to_string()),
                filesystem: if exists {
                    filesystem(&path)
                } else {
                    String::new()
                },
            };
            (r.clone(), facts)
        })
        .collect();
    NodeFacts {
        node: node.into(),
        kernel,
        host_paths,
        roots,
    }
}

/// What is at a path (symlinks not followed: a hostPath is resolved on the host, and a
/// link in the read-only view points into this container).
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Directory,
    CharDevice,
    Missing,
    Other(&'static str),
    Unreadable(String),
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Found::Directory => f.write_str("a directory"),
            Found::CharDevice => f.write_str("a character device"),
            Found::Missing => f.write_str("missing"),
            Found::Other(k) => write!(f, "{k}, not a directory or device"),
            Found::Unreadable(e) => write!(f, "unreadable: {e}"),
        }
    }
}

fn what_is(p: &Path) -> Found {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => Found::Directory,
        Ok(m) if m.file_type().is_char_device() => Found::CharDevice,
        Ok(m) if m.file_type().is_symlink() => Found::Other("a symbolic link"),
        Ok(_) => Found::Other("a file"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::Missing,
        Err(e) => Found::Unreadable(e.to_string()),
    }
}

/// The name of the filesystem `p` is on.
fn filesystem(p: &Path) -> String {
    match nix::sys::statfs::statfs(p) {
        Ok(s) => filesystem_name(s.filesystem_type().0),
        Err(e) => format!("unknown ({e})"),
    }
}

/// A statfs magic number's filesystem.
pub fn filesystem_name(magic: i64) -> String {
    let name = match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlay",
        0x6969 => "nfs",
        0x00C3_6400 => "ceph",
        0x6573_5546 => "fuse",
        0xFE53_4D42 => "smb2",
        0xFF53_4D42 => "cifs",
        0x0BD0_0BD0 => "lustre",
        0x0116_1970 => "gfs2",
        0x2FC1_2FC1 => "zfs",
        _ => return format!("{magic:#x}"),
    };
    name.into()
}

/// Whether `s` is a token: 1 to 64 ASCII letters and digits.
fn valid_token(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Whether `s` is a node name (an RFC 1123 subdomain): safe in a file name.
fn valid_node(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with(['-', '.'])
}

/// The marker file name of `node` in run `token`.
pub fn marker_name(token: &str, node: &str) -> String {
    format!(".tessera-preflight-{token}-{node}")
}

fn validated(m: &MarkerArgs) -> Result<(), Error> {
    if !valid_token(&m.token) {
        return Err(Error::Token(m.token.clone()));
    }
    if !valid_node(&m.node) {
        return Err(Error::Node(m.node.clone()));
    }
    Ok(())
}

/// Leave this node's marker in each dir (created new, never through a link).
pub fn mark(m: &MarkerArgs) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    validated(m)?;
    for (_, dir) in &m.dirs {
        let path = dir.join(marker_name(&m.token, &m.node));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&path)
            .map_err(|source| Error::Io {
                what: "creating the marker",
                path,
                source,
            })?;
    }
    Ok(())
}

/// Which nodes' markers of this run each dir holds.
pub fn look(m: &MarkerArgs) -> Result<Sightings, Error> {
    validated(m)?;
    let prefix = format!(".tessera-preflight-{}-", m.token);
    let mut seen = BTreeMap::new();
    for (root, dir) in &m.dirs {
        let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
            what: "listing",
            path: dir.clone(),
            source,
        })?;
        let mut nodes: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(&prefix))
                    .map(String::from)
            })
            .collect();
        nodes.sort();
        seen.insert(root.clone(), nodes);
    }
    Ok(Sightings {
        node: m.node.clone(),
        seen,
    })
}

/// Remove this node's marker from each dir (gone already is fine).
pub fn unmark(m: &MarkerArgs) -> Result<(), Error> {
    validated(m)?;
    for (_, dir) in &m.dirs {
        let path = dir.join(marker_name(&m.token, &m.node));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Io {
                    what: "removing the marker",
                    path,
                    source,
                });
            }
        }
    }
    Ok(())
}
