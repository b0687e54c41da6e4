//! Whether a backend root declared Shared is in fact one filesystem for this node and
//! the node that holds the root's data (its *anchor*), checked by a marker file.
//!
//! ```text
//!  controller: anchor of root R = the node whose view of R holds the data served from
//!              it (named in every MountPod of a Shared volume: spec.sharedRootAnchor)
//!  agent on the anchor:   leave  R/.tessera-shared-<anchor>  (O_CREAT|O_EXCL|O_NOFOLLOW)
//!  agent on another node: look for it, through its own mount of R
//!        seen ─▶ Shared: serve            missing ─▶ NotShared: refuse, create nothing
//! ```
//!
//! A plain directory on each node, declared Shared by mistake, shows no other node's
//! marker: the volume is refused there instead of served from an empty directory
//! while its data stays on the anchor. The check is one `openat2` beneath the root
//! (no symlink, nothing outside it); [`Verified`] remembers what passed, per root and
//! anchor, until a failure asks for it again.

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

/// The marker's name starts with this, then the anchor node's name.
pub const MARKER_PREFIX: &str = ".tessera-shared-";

/// The most a marker's content may be (a node name and a newline).
const MAX_CONTENT: u64 = 512;

/// Whether `s` is a node name (an RFC 1123 subdomain): safe in a file name.
pub fn valid_node(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with(['-', '.'])
}

/// The marker file name of `anchor`; `None` if it is no node name.
pub fn marker_name(anchor: &str) -> Option<String> {
    valid_node(anchor).then(|| format!("{MARKER_PREFIX}{anchor}"))
}

/// What this node does about a Shared root before serving from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Passed before (same root, same anchor): nothing to do.
    Known,
    /// This node is the anchor: leave the marker (or find it there).
    Leave(String),
    /// Another node is the anchor: its marker must be visible here.
    Look(String),
    /// The anchor is no node name: refuse.
    BadAnchor,
}

/// The step for `node` serving from a root whose anchor is `anchor`, `known` if that
/// root and anchor passed here before.
pub fn step(node: &str, anchor: &str, known: bool) -> Step {
    match marker_name(anchor) {
        None => Step::BadAnchor,
        Some(_) if known => Step::Known,
        Some(name) if anchor == node => Step::Leave(name),
        Some(name) => Step::Look(name),
    }
}

/// Why a Shared root cannot be served here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotShared {
    /// The anchor's marker is not under the root as this node sees it.
    #[error(
        "node {node} does not see the marker {marker} that node {anchor} left under the backend root {root}, which is declared Shared: this node's {root} is not the filesystem that holds the data (a directory of its own disk, or the shared filesystem is not mounted there); nothing is created here. Mount the shared filesystem at {root} on {node}, or declare the root NodeLocal"
    )]
    Missing {
        /// This node.
        node: String,
        /// The anchor.
        anchor: String,
        /// The root.
        root: String,
        /// The marker's name.
        marker: String,
    },
    /// The root itself is not there.
    #[error(
        "the backend root {root}, declared Shared, does not exist on node {node}: the node does not serve it (mount the shared filesystem there)"
    )]
    NoRoot {
        /// This node.
        node: String,
        /// The root.
        root: String,
    },
    /// The marker or the root could not be read or written.
    #[error("checking that {root} is shared with node {anchor}: {what}: {errno}")]
    Io {
        /// The anchor.
        anchor: String,
        /// The root.
        root: String,
        /// What was being done.
        what: &'static str,
        /// The cause.
        errno: Errno,
    },
    /// The anchor named by the controller is not a node name.
    #[error("the anchor {0:?} of a Shared root is not a node name")]
    BadAnchor(String),
}

fn open_root(root: &Path) -> Result<OwnedFd, Errno> {
    nix::fcntl::open(
        root,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
}

fn open_marker(root: &OwnedFd, name: &str, create: bool) -> Result<OwnedFd, Errno> {
    let mut flags = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    flags |= if create {
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY
    } else {
        OFlag::O_RDONLY | OFlag::O_NONBLOCK
    };
    let mut how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    if create {
        how = how.mode(Mode::from_bits_truncate(0o644));
    }
    nix::fcntl::openat2(root, name, how)
}

/// Whether the open marker is a regular file naming `anchor`.
fn names_anchor(fd: OwnedFd, anchor: &str) -> Result<bool, Errno> {
    let st = nix::sys::stat::fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(false);
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(MAX_CONTENT)
        .read_to_string(&mut text)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    Ok(text.trim() == anchor)
}

/// Verify, on `node`, that `root` (an allowed root declared Shared) is the filesystem
/// of its anchor `anchor`: on the anchor, leave the marker (kept if there); elsewhere,
/// find it. Writes nothing but the anchor's own marker.
pub fn verify(root: &Path, node: &str, anchor: &str) -> Result<(), NotShared> {
    let shown = root.display().to_string();
    let io = |what, errno| NotShared::Io {
        anchor: anchor.to_string(),
        root: shown.clone(),
        what,
        errno,
    };
    let name = marker_name(anchor).ok_or_else(|| NotShared::BadAnchor(anchor.into()))?;
    let dir = match open_root(root) {
        Ok(d) => d,
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => {
            return Err(NotShared::NoRoot {
                node: node.into(),
                root: shown,
            });
        }
        Err(e) => return Err(io("opening the root", e)),
    };
    let missing = || NotShared::Missing {
        node: node.into(),
        anchor: anchor.into(),
        root: shown.clone(),
        marker: name.clone(),
    };
    if node == anchor {
        match open_marker(&dir, &name, true) {
            Ok(fd) => {
                let mut f = std::fs::File::from(fd);
                std::io::Write::write_all(&mut f, format!("{anchor}\n").as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(|e| {
                        io(
                            "writing the marker",
                            Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                        )
                    })?;
                return Ok(());
            }
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(io("creating the marker", e)),
        }
    }
    match open_marker(&dir, &name, false) {
        Ok(fd) => match names_anchor(fd, anchor) {
            Ok(true) => Ok(()),
            Ok(false) => Err(missing()),
            Err(e) => Err(io("reading the marker", e)),
        },
        Err(Errno::ENOENT | Errno::ELOOP) => Err(missing()),
        Err(e) => Err(io("opening the marker", e)),
    }
}

/// The roots verified on this node, per anchor: each is checked once, and again after
/// [`Verified::forget`] (a failure of a mount served from it).
#[derive(Debug, Default)]
pub struct Verified(Mutex<HashSet<(PathBuf, String)>>);

impl Verified {
    /// Verify `root` for `anchor` on `node` unless it passed before; remember a pass.
    pub fn check(&self, root: &Path, node: &str, anchor: &str) -> Result<(), NotShared> {
        let key = (root.to_path_buf(), anchor.to_string());
        let known = self.0.lock().expect("not poisoned").contains(&key);
        match step(node, anchor, known) {
            Step::Known => Ok(()),
            Step::BadAnchor => Err(NotShared::BadAnchor(anchor.into())),
            Step::Leave(_) | Step::Look(_) => {
                verify(root, node, anchor)?;
                self.0.lock().expect("not poisoned").insert(key);
                Ok(())
            }
        }
    }

    /// Check `root` again next time.
    pub fn forget(&self, root: &Path) {
        self.0
            .lock()
            .expect("not poisoned")
            .retain(|(r, _)| r != root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        let table: &[(&str, &str, bool, Step)] = &[
            ("a", "a", false, Step::Leave(".tessera-shared-a".into())),
            ("b", "a", false, Step::Look(".tessera-shared-a".into())),
            ("b", "a", true, Step::Known),
            ("a", "a", true, Step::Known),
            ("b", "../a", false, Step::BadAnchor),
            ("b", "", false, Step::BadAnchor),
            ("b", "A", true, Step::BadAnchor),
            ("b", "a/b", false, Step::BadAnchor),
            ("b", ".a", false, Step::BadAnchor),
        ];
        for (node, anchor, known, want) in table {
            assert_eq!(step(node, anchor, *known), *want, "{node} {anchor} {known}");
        }
    }

    #[test]
    fn a_shared_root_shows_the_anchors_marker_and_a_plain_one_does_not() {
        let shared = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        // The anchor leaves its marker; a node on the same filesystem sees it.
        verify(shared.path(), "a", "a").unwrap();
        verify(shared.path(), "a", "a").unwrap();
        verify(shared.path(), "b", "a").unwrap();
        // A node whose root is a directory of its own: refused, and nothing written.
        let e = verify(other.path(), "b", "a").unwrap_err();
        assert!(matches!(e, NotShared::Missing { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("node b") && msg.contains("node a"), "{msg}");
        assert!(msg.contains(&other.path().display().to_string()), "{msg}");
        assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
        // A marker that is a symlink, a directory or names another node is no proof.
        std::os::unix::fs::symlink(
            shared.path().join(".tessera-shared-a"),
            other.path().join(".tessera-shared-a"),
        )
        .unwrap();
        assert!(verify(other.path(), "b", "a").is_err());
        std::fs::create_dir(other.path().join(".tessera-shared-c")).unwrap();
        assert!(verify(other.path(), "b", "c").is_err());
        std::fs::write(other.path().join(".tessera-shared-d"), "x\n").unwrap();
        assert!(verify(other.path(), "b", "d").is_err());
        // A missing root is said as such.
        let gone = other.path().join("absent");
        assert!(matches!(
            verify(&gone, "b", "a"),
            Err(NotShared::NoRoot { .. })
        ));
        assert!(matches!(
            verify(shared.path(), "b", "../x"),
            Err(NotShared::BadAnchor(_))
        ));
    }

    #[test]
    fn a_pass_is_remembered_until_forgotten() {
        let root = tempfile::tempdir().unwrap();
        let v = Verified::default();
        verify(root.path(), "a", "a").unwrap();
        v.check(root.path(), "b", "a").unwrap();
        // Gone meanwhile: still known, so no I/O on every mount…
        std::fs::remove_file(root.path().join(".tessera-shared-a")).unwrap();
        v.check(root.path(), "b", "a").unwrap();
        // …until a failure makes it forget: then checked again.
        v.forget(root.path());
        assert!(v.check(root.path(), "b", "a").is_err());
        assert!(
            v.check(root.path(), "b", "a").is_err(),
            "a failure is not kept"
        );
    }
}
