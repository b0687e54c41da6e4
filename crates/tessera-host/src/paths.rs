//! Validation of every path Tessera takes from outside: from a custom resource (the
//! node agent) or from a CSI request (the Node service).
//!
//! Whoever may write MountPods or call the CSI socket could otherwise make a
//! privileged process mount onto, or delete, any path of the node (CVE-2020-8568: a
//! target path taken from a custom resource). Paths are therefore checked as strings
//! before anything touches them: absolute, no `.` or `..` component, not `/`, no NUL
//! byte, and targets strictly under the kubelet directory ([`under`]). Then on disk,
//! right before use: a CSI path may not be or pass through a symlink below the
//! kubelet directory ([`under_without_symlinks`]), and a bind target's parent, with
//! symlinks resolved, must still be under it ([`resolves_under`]).
//!
//! Errors show at most [`SHOWN`] characters of a path: it came from a request or an
//! object that someone else wrote.

use std::path::{Path, PathBuf};

use tessera_text::truncated;

/// How much of a refused path an error shows.
pub const SHOWN: usize = 128;

/// A path that is refused, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Relative path.
    #[error("{0:?} is not an absolute path")]
    NotAbsolute(String),
    /// `.` or `..` component.
    #[error("{0:?} has a '.' or '..' component")]
    DotComponent(String),
    /// The root directory itself.
    #[error("{0:?} is the root directory")]
    Root(String),
    /// NUL byte.
    #[error("{0:?} contains a NUL byte")]
    Nul(String),
    /// More components or bytes than any path Tessera uses.
    #[error("{0:?} is too long (at most {MAX_COMPONENTS} components and {MAX_BYTES} bytes)")]
    TooLong(String),
    /// Not under the directory it must be under.
    #[error("{path:?} is not under {dir}")]
    Outside {
        /// The path.
        path: String,
        /// Where it must be.
        dir: String,
    },
    /// Not a single, plain path component (a volume name used as a directory name).
    #[error("{0:?} cannot be used as a directory name")]
    BadName(String),
    /// A symlink, at the path or at one of its parents below the directory it must be
    /// under.
    #[error("{0:?} is or passes through a symlink")]
    Symlink(String),
}

fn shown(s: &str) -> String {
    truncated(s, SHOWN).into_owned()
}

/// The most components a path may have (a kubelet target has about ten).
pub const MAX_COMPONENTS: usize = 64;
/// The most bytes a path may have (below `PATH_MAX`).
pub const MAX_BYTES: usize = 1024;

/// `s` as an absolute path with no `.`/`..` component that is not `/`, at most
/// [`MAX_COMPONENTS`] components and [`MAX_BYTES`] bytes.
pub fn absolute(s: &str) -> Result<PathBuf, PathError> {
    if s.len() > MAX_BYTES
        || s.split('/')
            .filter(|c| !c.is_empty())
            .nth(MAX_COMPONENTS)
            .is_some()
    {
        return Err(PathError::TooLong(shown(s)));
    }
    if s.contains('\0') {
        return Err(PathError::Nul(shown(s)));
    }
    if !s.starts_with('/') {
        return Err(PathError::NotAbsolute(shown(s)));
    }
    if s.split('/').any(|c| c == "." || c == "..") {
        return Err(PathError::DotComponent(shown(s)));
    }
    if s.split('/').all(str::is_empty) {
        return Err(PathError::Root(shown(s)));
    }
    // Normalise repeated and trailing slashes.
    let clean: Vec<&str> = s.split('/').filter(|c| !c.is_empty()).collect();
    Ok(PathBuf::from(format!("/{}", clean.join("/"))))
}

/// `s` as [`absolute`] and strictly below `dir`.
pub fn under(s: &str, dir: &Path) -> Result<PathBuf, PathError> {
    let p = absolute(s)?;
    if p.starts_with(dir) && p != dir {
        Ok(p)
    } else {
        Err(PathError::Outside {
            path: shown(s),
            dir: dir.display().to_string(),
        })
    }
}

/// `s` as [`under`], and neither `s` nor any of its parents below `dir` is a symlink
/// (on disk, now): the check CSI paths get, since kubelet creates them and nothing
/// there should be a link.
pub fn under_without_symlinks(s: &str, dir: &Path) -> Result<PathBuf, PathError> {
    let p = under(s, dir)?;
    let mut cur = dir.to_path_buf();
    for c in p
        .strip_prefix(dir)
        .expect("under() checked it")
        .components()
    {
        cur.push(c);
        if std::fs::symlink_metadata(&cur).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(PathError::Symlink(shown(s)));
        }
    }
    Ok(p)
}

/// `s` as one plain path component (no `/`, not `.` or `..`, not empty).
pub fn component(s: &str) -> Result<&str, PathError> {
    if s.is_empty() || s == "." || s == ".." || s.contains('/') || s.contains('\0') {
        return Err(PathError::BadName(shown(s)));
    }
    Ok(s)
}

/// Check on disk that `target`'s parent, with every symlink resolved, is still inside
/// `dir` (also resolved), so a symlink planted in the kubelet directory cannot
/// redirect a bind mount elsewhere.
pub fn resolves_under(target: &Path, dir: &Path) -> Result<(), PathError> {
    let outside = || PathError::Outside {
        path: shown(&target.display().to_string()),
        dir: dir.display().to_string(),
    };
    let parent = target.parent().ok_or_else(outside)?;
    let real_parent = std::fs::canonicalize(parent).map_err(|_| outside())?;
    let real_dir = std::fs::canonicalize(dir).map_err(|_| outside())?;
    if real_parent.starts_with(&real_dir) {
        Ok(())
    } else {
        Err(outside())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths() {
        assert_eq!(absolute("/a/b"), Ok(PathBuf::from("/a/b")));
        assert_eq!(absolute("/a//b/"), Ok(PathBuf::from("/a/b")));
        assert!(matches!(absolute("a/b"), Err(PathError::NotAbsolute(_))));
        assert!(matches!(absolute(""), Err(PathError::NotAbsolute(_))));
        assert!(matches!(
            absolute("/a/../b"),
            Err(PathError::DotComponent(_))
        ));
        assert!(matches!(
            absolute("/a/./b"),
            Err(PathError::DotComponent(_))
        ));
        assert!(matches!(absolute("/.."), Err(PathError::DotComponent(_))));
        assert!(matches!(absolute("/"), Err(PathError::Root(_))));
        assert!(matches!(absolute("//"), Err(PathError::Root(_))));
        assert!(matches!(absolute("/a\0b"), Err(PathError::Nul(_))));
        let deep = format!("/{}", vec!["a"; 2_000].join("/"));
        assert!(matches!(absolute(&deep), Err(PathError::TooLong(_))));
        let ok = format!("/{}", vec!["a"; MAX_COMPONENTS].join("/"));
        assert!(absolute(&ok).is_ok());
        let one_more = format!("/{}", vec!["a"; MAX_COMPONENTS + 1].join("/"));
        assert!(absolute(&one_more).is_err());
        assert!(absolute(&format!("/{}", "a".repeat(MAX_BYTES))).is_err());
        // Names that merely contain dots are fine.
        assert_eq!(absolute("/a/..b/c."), Ok(PathBuf::from("/a/..b/c.")));
    }

    #[test]
    fn paths_under_a_directory() {
        let k = Path::new("/var/lib/kubelet");
        assert!(under("/var/lib/kubelet/pods/x/volumes/v/mount", k).is_ok());
        assert!(matches!(
            under("/var/lib/kubelet", k),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            under("/var/lib/kubeletx/pods", k),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(under("/etc", k), Err(PathError::Outside { .. })));
        assert!(matches!(
            under("/var/lib/kubelet/../../etc", k),
            Err(PathError::DotComponent(_))
        ));
    }

    #[test]
    fn components() {
        assert_eq!(component("pvc-1"), Ok("pvc-1"));
        for bad in ["", ".", "..", "a/b", "/a"] {
            assert!(component(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_from_csi_requests() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let ok = root.join("pods/x/volumes/v/mount");
        let check = |s: &str| under_without_symlinks(s, root);
        assert_eq!(check(ok.to_str().unwrap()), Ok(ok.clone()));
        assert!(matches!(check(""), Err(PathError::NotAbsolute(_))));
        assert!(matches!(
            check("relative/p"),
            Err(PathError::NotAbsolute(_))
        ));
        let dotdot = format!("{}/pods/../../etc", root.display());
        assert!(matches!(check(&dotdot), Err(PathError::DotComponent(_))));
        assert!(matches!(
            check("/etc/passwd"),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            check(root.to_str().unwrap()),
            Err(PathError::Outside { .. })
        ));
        std::fs::create_dir_all(root.join("pods")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("pods/evil")).unwrap();
        let via_link = format!("{}/pods/evil/target", root.display());
        assert!(matches!(check(&via_link), Err(PathError::Symlink(_))));
        let at_link = format!("{}/pods/evil", root.display());
        assert!(matches!(check(&at_link), Err(PathError::Symlink(_))));
    }

    #[test]
    fn errors_show_a_bounded_path() {
        let long = format!("/{}", "a".repeat(1_000));
        let e = under(&long, Path::new("/var/lib/kubelet")).unwrap_err();
        let text = e.to_string();
        assert!(text.len() < SHOWN + 64, "{} bytes: {text}", text.len());
        assert!(text.contains("is not under /var/lib/kubelet"), "{text}");
        let huge = format!("/{}", "a".repeat(1 << 20));
        let text = under(&huge, Path::new("/var/lib/kubelet"))
            .unwrap_err()
            .to_string();
        assert!(text.len() < SHOWN + 64, "{} bytes: {text}", text.len());
        assert!(text.contains("too long"), "{text}");
    }

    #[test]
    fn symlinks_out_of_the_kubelet_dir_are_refused() {
        let kubelet = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::create_dir(kubelet.path().join("pods")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), kubelet.path().join("evil")).unwrap();
        assert!(resolves_under(&kubelet.path().join("pods/target"), kubelet.path()).is_ok());
        assert!(resolves_under(&kubelet.path().join("evil/target"), kubelet.path()).is_err());
        assert!(resolves_under(&kubelet.path().join("missing/target"), kubelet.path()).is_err());
    }
}
