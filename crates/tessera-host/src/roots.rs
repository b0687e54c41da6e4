//! The backend roots the node administrator allows, and the only ways Tessera touches
//! the directories beneath them.
//!
//! A Volume names a backend root; its data is `<root>/<volume>`. Whoever may write a
//! Volume, a StorageClass or a MountPod could otherwise have the agent (root) serve or
//! delete any host directory. So the controller and the agent are both given the
//! allowed roots ([`RootArgs`]: `--allowed-backend-root`, repeatable, and/or
//! `--allowed-backend-roots-file`, one path a line, e.g. a ConfigMap in `config/`):
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

/// The backend root of volumes when the administrator names none.
pub const DEFAULT_ROOT: &str = "/var/lib/tessera/volumes";

fn shown(s: &str) -> String {
    tessera_text::truncated(s, paths::SHOWN).into_owned()
}

/// How deep [`remove_beneath`] descends before it gives up (against hostile trees).
const MAX_DEPTH: usize = 512;

/// Command-line arguments shared by the controller and the agent.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RootArgs {
    /// A backend root volumes may use (repeatable). Volumes, StorageClasses and
    /// MountPods naming any other directory are refused. Default, when neither this nor
    /// the file names one: /var/lib/tessera/volumes.
    #[arg(long = "allowed-backend-root")]
    pub allowed_backend_root: Vec<PathBuf>,
    /// A file listing allowed backend roots, one absolute path a line (`#` comments).
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

/// The allowed backend roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedRoots(Vec<PathBuf>);

impl Default for AllowedRoots {
    fn default() -> Self {
        AllowedRoots(vec![PathBuf::from(DEFAULT_ROOT)])
    }
}

impl AllowedRoots {
    /// These roots (each an absolute path; none is `/`).
    pub fn new<S: AsRef<str>>(roots: impl IntoIterator<Item = S>) -> Result<Self, RootError> {
        let mut out = Vec::new();
        for r in roots {
            let p = paths::absolute(r.as_ref())?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        Ok(AllowedRoots(out))
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
        &self.0
    }

    fn listed(&self) -> String {
        let v: Vec<String> = self.0.iter().map(|p| p.display().to_string()).collect();
        v.join(", ")
    }

    fn containing(&self, p: &Path) -> Option<&PathBuf> {
        self.0.iter().find(|r| p.starts_with(r))
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
        std::fs::write(&file, "# roots\n/data/a\n\n  /data/b  # fast disk\n").unwrap();
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
        assert!(AllowedRoots::new(["/"]).is_err());
        assert!(AllowedRoots::new(["data"]).is_err());
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
