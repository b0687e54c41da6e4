//! The backend roots the node administrator allows, and the only ways Tessera touches
//! the directories beneath them.
//!
//! A Volume names a backend root; its data is `<root>/<volume>`. Whoever may write a
//! Volume, a StorageClass or a MountPod could otherwise have the agent (root) serve or
//! delete any host directory. So the controller and the agent are both given the
//! allowed roots ([`RootArgs`]: `--allowed-backend-root`, repeatable, and/or
//! `--allowed-backend-roots-file`, one root a line, e.g. a ConfigMap in `config/`).
//!
//! Each root says what it is ([`RootScope`]): `Shared`, one filesystem every node
//! reaches (NFS, CephFS, GlusterFS…), or `NodeLocal`, each node's own disk. A line is
//! `PATH Shared`, `PATH NodeLocal` or, as before scopes existed, `PATH` alone: read as
//! Shared, which is then verified (a node serves a Shared root only once it sees the
//! marker the root's anchor node left there), so an old file keeps its meaning and a
//! root that is not in fact shared is refused node by node, never served empty.
//! [`AllowedRoots::check_scope`]: a Shared Volume needs a Shared root (on a NodeLocal
//! one its data would stay behind when its Pod moves); a NodeLocal Volume, pinned to
//! one node, may use either.
//!
//! ```text
//!  Volume.backend.root / StorageClass backendRoot ──check_root──▶ an allowed root or beneath one
//!  MountPod.spec.source ──check_source──▶ Beneath { root (allowed), rel (…/<volume>) }
//!        ──create_beneath / remove_beneath──▶ openat2(root fd, rel, RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)
//! ```
//!
//! Data is created and removed through file descriptors, starting from an fd of the
//! allowed root: no component may be a symlink and nothing may resolve outside it,
//! whatever a racer swaps in meanwhile; removal descends by `openat(O_NOFOLLOW)` and
//! unlinks by `unlinkat` on the parent's fd, so a symlink inside is removed, never
//! followed.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

use super::paths::{self, PathError};

/// The backend root of volumes when the administrator names none: a directory on
/// each node's own disk, so [`RootScope::NodeLocal`].
pub const DEFAULT_ROOT: &str = "/var/lib/tessera/volumes";

/// What a backend root is, as the administrator declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RootScope {
    /// One filesystem every node reaches: volumes may move between nodes.
    Shared,
    /// Each node's own disk: a volume lives on one node.
    NodeLocal,
}

impl RootScope {
    /// The word of the roots file and of `backend.scope`.
    pub fn as_str(self) -> &'static str {
        match self {
            RootScope::Shared => "Shared",
            RootScope::NodeLocal => "NodeLocal",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "Shared" => Some(RootScope::Shared),
            "NodeLocal" => Some(RootScope::NodeLocal),
            _ => None,
        }
    }
}

impl std::fmt::Display for RootScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One allowed root and its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootEntry {
    /// The root (absolute, not `/`).
    pub path: PathBuf,
    /// Its scope.
    pub scope: RootScope,
    /// Whether the administrator said it (a path alone, the older format, is read as
    /// Shared: `false` here).
    pub declared: bool,
}

fn shown(s: &str) -> String {
    tessera_text::truncated(s, paths::SHOWN).into_owned()
}

/// How deep [`remove_beneath`] descends before it gives up (against hostile trees).
const MAX_DEPTH: usize = 512;

/// Command-line arguments shared by the controller and the agent.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RootArgs {
    /// A backend root volumes may use (repeatable): `PATH`, `PATH=Shared` or
    /// `PATH=NodeLocal` (a path alone is Shared, verified). Volumes, StorageClasses and
    /// MountPods naming any other directory are refused. Default, when neither this nor
    /// the file names one: /var/lib/tessera/volumes, NodeLocal.
    #[arg(long = "allowed-backend-root")]
    pub allowed_backend_root: Vec<PathBuf>,
    /// A file listing allowed backend roots, one a line: `PATH Shared`,
    /// `PATH NodeLocal` or `PATH` alone (Shared, verified); `#` comments.
    #[arg(long, env = "TESSERA_ALLOWED_BACKEND_ROOTS_FILE")]
    pub allowed_backend_roots_file: Option<PathBuf>,
}

/// Why a backend root or source is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootError {
    /// Not a usable absolute path.
    #[error(transparent)]
    Path(#[from] PathError),
    /// Not one of the allowed roots nor beneath one.
    #[error("{path:?} is not an allowed backend root nor beneath one (allowed: {allowed})")]
    NotAllowed {
        /// The refused path (bounded).
        path: String,
        /// The allowed roots.
        allowed: String,
    },
    /// A source that is not `<root>/<volume>` strictly beneath an allowed root.
    #[error("{path:?} is not the directory of volume {volume:?} beneath an allowed backend root")]
    NotVolumeDir {
        /// The refused path (bounded).
        path: String,
        /// The volume.
        volume: String,
    },
    /// A Volume's scope its root's declared scope does not allow.
    #[error(
        "backend.scope {volume} is not allowed under {root}, which the administrator declared {declared} (the backend-roots file): {why}"
    )]
    ScopeMismatch {
        /// The Volume's scope.
        volume: RootScope,
        /// The allowed root it lies under.
        root: String,
        /// That root's scope.
        declared: RootScope,
        /// What would go wrong.
        why: &'static str,
    },
    /// A line of the allow-list that is not `PATH [Shared|NodeLocal]`.
    #[error("backend root {line:?}: expected PATH, PATH Shared or PATH NodeLocal")]
    BadEntry {
        /// The line (bounded).
        line: String,
    },
    /// The allow-list file could not be read.
    #[error("reading {file}: {message}")]
    File {
        /// The file.
        file: String,
        /// Why.
        message: String,
    },
}

/// A path strictly beneath an allowed root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beneath {
    /// The allowed root.
    pub root: PathBuf,
    /// The path relative to it (no `.`/`..`, not empty).
    pub rel: PathBuf,
}

impl Beneath {
    /// The whole path.
    pub fn full(&self) -> PathBuf {
        self.root.join(&self.rel)
    }
}

/// The allowed backend roots, each with its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedRoots {
    paths: Vec<PathBuf>,
    entries: Vec<RootEntry>,
}

impl Default for AllowedRoots {
    fn default() -> Self {
        AllowedRoots::declared([(DEFAULT_ROOT, RootScope::NodeLocal)]).expect("a valid root")
    }
}

impl AllowedRoots {
    /// These roots (each an absolute path; none is `/`), each `PATH`,
    /// `PATH Shared`, `PATH NodeLocal` (or `=` instead of the space); a path alone is
    /// Shared (undeclared). The first entry of a path wins.
    pub fn new<S: AsRef<str>>(roots: impl IntoIterator<Item = S>) -> Result<Self, RootError> {
        let mut out = AllowedRoots {
            paths: vec![],
            entries: vec![],
        };
        for r in roots {
            out.push(parse_entry(r.as_ref())?);
        }
        Ok(out)
    }

    /// These roots with these scopes.
    pub fn declared<S: AsRef<str>>(
        roots: impl IntoIterator<Item = (S, RootScope)>,
    ) -> Result<Self, RootError> {
        let mut out = AllowedRoots {
            paths: vec![],
            entries: vec![],
        };
        for (r, scope) in roots {
            out.push(RootEntry {
                path: paths::absolute(r.as_ref())?,
                scope,
                declared: true,
            });
        }
        Ok(out)
    }

    fn push(&mut self, e: RootEntry) {
        if !self.paths.contains(&e.path) {
            self.paths.push(e.path.clone());
            self.entries.push(e);
        }
    }

    /// The roots the command line names (flags and file); the default when none.
    pub fn from_args(args: &RootArgs) -> Result<Self, RootError> {
        let mut names: Vec<String> = args
            .allowed_backend_root
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if let Some(file) = &args.allowed_backend_roots_file {
            let text = std::fs::read_to_string(file).map_err(|e| RootError::File {
                file: file.display().to_string(),
                message: e.to_string(),
            })?;
            names.extend(parse_list(&text));
        }
        if names.is_empty() {
            return Ok(AllowedRoots::default());
        }
        AllowedRoots::new(names)
    }

    /// The roots.
    pub fn roots(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The roots with their scopes.
    pub fn entries(&self) -> &[RootEntry] {
        &self.entries
    }

    /// The roots given without a scope (read as Shared): worth a warning at start.
    pub fn undeclared(&self) -> Vec<&Path> {
        self.entries
            .iter()
            .filter(|e| !e.declared)
            .map(|e| e.path.as_path())
            .collect()
    }

    fn listed(&self) -> String {
        let v: Vec<String> = self.paths.iter().map(|p| p.display().to_string()).collect();
        v.join(", ")
    }

    fn containing(&self, p: &Path) -> Option<&PathBuf> {
        self.paths.iter().find(|r| p.starts_with(r))
    }

    /// The allowed root `p` (a checked path) lies under, with its scope.
    pub fn entry_of(&self, p: &Path) -> Option<&RootEntry> {
        self.entries.iter().find(|e| p.starts_with(&e.path))
    }

    /// The scope declared for the root `s` (a Volume's `backend.root`) lies under.
    pub fn scope_of(&self, s: &str) -> Result<RootScope, RootError> {
        let p = self.check_root(s)?;
        Ok(self.entry_of(&p).expect("checked").scope)
    }

    /// `s` as the backend root of a Volume of scope `volume`: allowed (as
    /// [`AllowedRoots::check_root`]) and of a scope that can hold it. A Shared Volume
    /// needs a root declared Shared: on a node-local one its data would stay on the
    /// first node while its Pod moves on to an empty directory. A NodeLocal Volume is
    /// pinned to its node, so either scope holds it.
    pub fn check_scope(&self, s: &str, volume: RootScope) -> Result<PathBuf, RootError> {
        let p = self.check_root(s)?;
        let e = self.entry_of(&p).expect("checked");
        match (volume, e.scope) {
            (RootScope::Shared, RootScope::NodeLocal) => Err(RootError::ScopeMismatch {
                volume,
                root: e.path.display().to_string(),
                declared: e.scope,
                why: "its data would stay on the first node's disk while a Pod on another node gets an empty directory; use scope NodeLocal (pinned to one node) or a root declared Shared",
            }),
            _ => Ok(p),
        }
    }

    /// `s` as a backend root a Volume or StorageClass may name: an allowed root or a
    /// directory beneath one.
    pub fn check_root(&self, s: &str) -> Result<PathBuf, RootError> {
        let p = paths::absolute(s)?;
        match self.containing(&p) {
            Some(_) => Ok(p),
            None => Err(RootError::NotAllowed {
                path: shown(s),
                allowed: self.listed(),
            }),
        }
    }

    /// `s` as the data directory of `volume`: strictly beneath an allowed root, its
    /// last component the volume's name.
    pub fn check_source(&self, s: &str, volume: &str) -> Result<Beneath, RootError> {
        let p = paths::absolute(s)?;
        let root = self.containing(&p).ok_or_else(|| RootError::NotAllowed {
            path: shown(s),
            allowed: self.listed(),
        })?;
        if p == *root || p.file_name() != Some(OsStr::new(volume)) {
            return Err(RootError::NotVolumeDir {
                path: shown(s),
                volume: shown(volume),
            });
        }
        let rel = p.strip_prefix(root).expect("checked").to_path_buf();
        Ok(Beneath {
            root: root.clone(),
            rel,
        })
    }
}

/// One root of the allow-list: `PATH`, `PATH Shared`, `PATH NodeLocal`, or the same
/// with `=` for the space (the flag's form). Anything else after the path is refused,
/// so a misspelt scope never passes as part of a path.
pub fn parse_entry(s: &str) -> Result<RootEntry, RootError> {
    let s = s.trim();
    // `PATH=SCOPE`: after the last `=`, no `/` (else the `=` is the path's own).
    let by_eq = s.rsplit_once('=').filter(|(_, w)| !w.contains('/'));
    let (path, scope) = match by_eq {
        Some((p, w)) => match RootScope::parse(w) {
            Some(scope) => (p, Some(scope)),
            None => return Err(RootError::BadEntry { line: shown(s) }),
        },
        None => match s.rsplit_once(char::is_whitespace) {
            Some((p, w)) => match RootScope::parse(w) {
                Some(scope) => (p.trim_end(), Some(scope)),
                None => return Err(RootError::BadEntry { line: shown(s) }),
            },
            None => (s, None),
        },
    };
    Ok(RootEntry {
        path: paths::absolute(path)?,
        scope: scope.unwrap_or(RootScope::Shared),
        declared: scope.is_some(),
    })
}

/// The roots of an allow-list file: one a line, blank lines and `#` comments skipped.
pub fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn beneath_how(flags: OFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
}

fn open_root(root: &Path) -> Result<OwnedFd, Errno> {
    nix::fcntl::open(
        root,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
}

/// Open `rel` (a directory) beneath `dir` with no symlink anywhere and nothing
/// outside `dir`.
pub fn open_dir_beneath<Fd: AsFd>(dir: Fd, rel: &Path) -> Result<OwnedFd, Errno> {
    nix::fcntl::openat2(
        dir,
        rel,
        beneath_how(OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY),
    )
}

/// Create `b.rel` (and its missing parents) beneath `b.root`, one component at a
/// time through file descriptors; the root itself must exist. Returns the opened
/// directory.
pub fn create_beneath(b: &Beneath) -> Result<OwnedFd, Errno> {
    let mut fd = open_root(&b.root)?;
    for c in b.rel.components() {
        let name = c.as_os_str();
        match nix::sys::stat::mkdirat(&fd, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e),
        }
        fd = open_dir_beneath(&fd, Path::new(name))?;
    }
    Ok(fd)
}

/// Remove `b.rel` beneath `b.root` and everything in it, through file descriptors:
/// no symlink is followed (one inside is removed as a link), nothing outside the root
/// is reached. `Ok(false)` when it did not exist.
pub fn remove_beneath(b: &Beneath) -> Result<bool, Errno> {
    let root = open_root(&b.root)?;
    let name = b.rel.file_name().ok_or(Errno::EINVAL)?;
    let parent = match b.rel.parent() {
        Some(p) if !p.as_os_str().is_empty() => match open_dir_beneath(&root, p) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(e),
        },
        _ => root,
    };
    remove_entry(&parent, name, 0)
}

/// Remove the entry `name` of the directory `parent` (recursively if a directory).
fn remove_entry(parent: &OwnedFd, name: &OsStr, depth: usize) -> Result<bool, Errno> {
    if depth > MAX_DEPTH {
        return Err(Errno::ELOOP);
    }
    match open_dir_beneath(parent, Path::new(name)) {
        Ok(dir) => {
            empty_dir(dir, depth)?;
            unlink(parent, name, UnlinkatFlags::RemoveDir)?;
            Ok(true)
        }
        Err(Errno::ENOENT) => Ok(false),
        // A symlink (ELOOP with RESOLVE_NO_SYMLINKS) or any other file: unlink it.
        Err(Errno::ENOTDIR | Errno::ELOOP) => {
            unlink(parent, name, UnlinkatFlags::NoRemoveDir)?;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

fn unlink(parent: &OwnedFd, name: &OsStr, flag: UnlinkatFlags) -> Result<(), Errno> {
    match nix::unistd::unlinkat(parent, name, flag) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

fn empty_dir(dir: OwnedFd, depth: usize) -> Result<(), Errno> {
    let reading = nix::unistd::dup(&dir)?;
    let mut listing = nix::dir::Dir::from_fd(reading)?;
    let names: Vec<Vec<u8>> = listing
        .iter()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_bytes().to_vec())
        .filter(|n| n != b"." && n != b"..")
        .collect();
    drop(listing);
    for n in names {
        remove_entry(&dir, OsStr::from_bytes(&n), depth + 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> AllowedRoots {
        AllowedRoots::new(["/srv/tessera", "/mnt/shared/tessera/"]).unwrap()
    }

    #[test]
    fn backend_roots_must_be_allowed() {
        let a = allowed();
        let table: &[(&str, bool)] = &[
            ("/srv/tessera", true),
            ("/srv/tessera/", true),
            ("/srv/tessera/fast", true),
            ("/mnt/shared/tessera", true),
            ("/etc", false),
            ("/srv", false),
            ("/srv/tesserax", false),
            ("/srv/tessera/../../etc", false),
            ("relative", false),
            ("/", false),
        ];
        for (root, ok) in table {
            assert_eq!(a.check_root(root).is_ok(), *ok, "{root}");
        }
        let e = a.check_root("/etc").unwrap_err().to_string();
        assert!(e.contains("/srv/tessera, /mnt/shared/tessera"), "{e}");
    }

    #[test]
    fn sources_are_a_volume_directory_beneath_an_allowed_root() {
        let a = allowed();
        type Case<'a> = (&'a str, &'a str, Option<(&'a str, &'a str)>);
        let table: &[Case] = &[
            ("/srv/tessera/v1", "v1", Some(("/srv/tessera", "v1"))),
            (
                "/srv/tessera/fast/v1",
                "v1",
                Some(("/srv/tessera", "fast/v1")),
            ),
            ("/srv/tessera", "tessera", None),
            ("/srv/tessera/other", "v1", None),
            ("/etc/v1", "v1", None),
            ("/srv/tessera/../v1", "v1", None),
            ("/srv/tesserax/v1", "v1", None),
        ];
        for (source, volume, want) in table {
            let got = a.check_source(source, volume).ok();
            let want = want.map(|(r, rel)| Beneath {
                root: r.into(),
                rel: rel.into(),
            });
            assert_eq!(got, want, "{source} {volume}");
        }
    }

    #[test]
    fn allow_lists_from_flags_and_files() {
        assert_eq!(
            AllowedRoots::from_args(&RootArgs::default()).unwrap(),
            AllowedRoots::default()
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("roots");
        std::fs::write(
            &file,
            "# roots\n/data/a\n\n  /data/b NodeLocal # fast disk\n/data/a NodeLocal\n",
        )
        .unwrap();
        let args = RootArgs {
            allowed_backend_root: vec!["/srv/x".into()],
            allowed_backend_roots_file: Some(file),
        };
        let a = AllowedRoots::from_args(&args).unwrap();
        assert_eq!(
            a.roots(),
            &[
                PathBuf::from("/srv/x"),
                PathBuf::from("/data/a"),
                PathBuf::from("/data/b")
            ]
        );
        // The first entry of a path wins; a path alone is Shared, undeclared.
        assert_eq!(a.scope_of("/data/a"), Ok(RootScope::Shared));
        assert_eq!(a.scope_of("/data/b/x"), Ok(RootScope::NodeLocal));
        assert_eq!(
            a.undeclared(),
            vec![Path::new("/srv/x"), Path::new("/data/a")]
        );
        std::fs::write(dir.path().join("bad"), "/data/a shared\n").unwrap();
        let bad = RootArgs {
            allowed_backend_root: vec![],
            allowed_backend_roots_file: Some(dir.path().join("bad")),
        };
        assert!(matches!(
            AllowedRoots::from_args(&bad),
            Err(RootError::BadEntry { .. })
        ));
        assert!(AllowedRoots::new(["/"]).is_err());
        assert!(AllowedRoots::new(["data"]).is_err());
    }

    #[test]
    fn roots_declare_their_scope() {
        use RootScope::*;
        // (entry, Some((path, scope, declared))) or None: refused.
        type Case<'a> = (&'a str, Option<(&'a str, RootScope, bool)>);
        let table: &[Case] = &[
            ("/srv/a", Some(("/srv/a", Shared, false))),
            ("/srv/a Shared", Some(("/srv/a", Shared, true))),
            ("/srv/a NodeLocal", Some(("/srv/a", NodeLocal, true))),
            ("/srv/a\tNodeLocal", Some(("/srv/a", NodeLocal, true))),
            ("  /srv/a/   NodeLocal ", Some(("/srv/a", NodeLocal, true))),
            ("/srv/a=NodeLocal", Some(("/srv/a", NodeLocal, true))),
            ("/srv/a=Shared", Some(("/srv/a", Shared, true))),
            // A misspelt or lower-case scope is never read as part of a path.
            ("/srv/a nodelocal", None),
            ("/srv/a Local", None),
            ("/srv/a NodeLocal extra", None),
            ("/srv/a=local", None),
            ("/srv/a=b/c", Some(("/srv/a=b/c", Shared, false))),
            ("/srv/my disk", None),
            ("NodeLocal", None),
            ("relative Shared", None),
            ("/ Shared", None),
            ("/srv/../etc NodeLocal", None),
        ];
        for (line, want) in table {
            let got = parse_entry(line)
                .ok()
                .map(|e| (e.path, e.scope, e.declared));
            let want = want.map(|(p, s, d)| (PathBuf::from(p), s, d));
            assert_eq!(got, want, "{line:?}");
        }
        let e = parse_entry("/srv/a Nodelocal").unwrap_err().to_string();
        assert!(e.contains("PATH NodeLocal"), "{e}");
        // The default root is each node's own disk.
        let d = AllowedRoots::default();
        assert_eq!(d.scope_of(DEFAULT_ROOT), Ok(NodeLocal));
        assert!(d.undeclared().is_empty());
    }

    #[test]
    fn a_shared_volume_needs_a_shared_root() {
        use RootScope::*;
        let a = AllowedRoots::new(["/local NodeLocal", "/shared Shared", "/old"]).unwrap();
        assert_eq!(a.undeclared(), vec![Path::new("/old")]);
        // (root, volume scope, allowed)
        let table: &[(&str, RootScope, bool)] = &[
            ("/local", NodeLocal, true),
            ("/local/fast", NodeLocal, true),
            ("/local", Shared, false),
            ("/local/fast", Shared, false),
            ("/shared", Shared, true),
            ("/shared", NodeLocal, true),
            ("/old", Shared, true),
            ("/old", NodeLocal, true),
            ("/elsewhere", NodeLocal, false),
            ("/elsewhere", Shared, false),
        ];
        for (root, scope, ok) in table {
            assert_eq!(a.check_scope(root, *scope).is_ok(), *ok, "{root} {scope}");
        }
        let e = a.check_scope("/local/x", Shared).unwrap_err();
        assert!(matches!(e, RootError::ScopeMismatch { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("/local") && msg.contains("NodeLocal") && msg.contains("Shared"),
            "{msg}"
        );
        assert!(matches!(
            a.check_scope("/elsewhere", Shared),
            Err(RootError::NotAllowed { .. })
        ));
    }

    #[test]
    fn removal_stays_beneath_the_root_and_never_follows_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        let vol = root.path().join("v1");
        std::fs::create_dir_all(vol.join("a/b")).unwrap();
        std::fs::write(vol.join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), vol.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), vol.join("a/link")).unwrap();
        let b = Beneath {
            root: root.path().into(),
            rel: "v1".into(),
        };
        assert_eq!(remove_beneath(&b), Ok(true));
        assert!(!vol.exists());
        assert!(outside.path().join("keep").exists());
        assert_eq!(remove_beneath(&b), Ok(false));
        // The volume directory itself a symlink out: the link goes, not its target.
        std::os::unix::fs::symlink(outside.path(), &vol).unwrap();
        assert_eq!(remove_beneath(&b), Ok(true));
        assert!(std::fs::symlink_metadata(&vol).is_err());
        assert!(outside.path().join("keep").exists());
        // A parent below the root that is a symlink: refused, nothing removed.
        std::os::unix::fs::symlink(outside.path(), root.path().join("sub")).unwrap();
        std::fs::create_dir(outside.path().join("v2")).unwrap();
        let through = Beneath {
            root: root.path().into(),
            rel: "sub/v2".into(),
        };
        assert!(remove_beneath(&through).is_err());
        assert!(outside.path().join("v2").exists());
        assert!(create_beneath(&through).is_err());
        assert!(!outside.path().join("sub").exists());
    }

    #[test]
    fn creation_stays_beneath_the_root() {
        let root = tempfile::tempdir().unwrap();
        let b = Beneath {
            root: root.path().into(),
            rel: "fast/v1".into(),
        };
        create_beneath(&b).unwrap();
        assert!(root.path().join("fast/v1").is_dir());
        create_beneath(&b).unwrap();
    }
}
