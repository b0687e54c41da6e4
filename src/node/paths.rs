//! Validation of every path the node agent takes from a custom resource.
//!
//! A MountPod is written through the API server, so whoever may write MountPods could
//! otherwise make a privileged agent mount onto, or delete, any path of the node
//! (CVE-2020-8568: a target path taken from a custom resource). Paths are therefore
//! checked as strings before anything touches them: absolute, no `.` or `..`
//! component, not `/`, no NUL byte, and targets strictly under the kubelet directory.
//! Bind targets are checked once more on disk (their parent directory, with symlinks
//! resolved, must still be under the kubelet directory) right before the bind.

use std::path::{Path, PathBuf};

/// A path from a custom resource that the agent refuses.
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
}

/// `s` as an absolute path with no `.`/`..` component that is not `/`.
pub fn absolute(s: &str) -> Result<PathBuf, PathError> {
    if s.contains('\0') {
        return Err(PathError::Nul(s.into()));
    }
    if !s.starts_with('/') {
        return Err(PathError::NotAbsolute(s.into()));
    }
    if s.split('/').any(|c| c == "." || c == "..") {
        return Err(PathError::DotComponent(s.into()));
    }
    if s.split('/').all(str::is_empty) {
        return Err(PathError::Root(s.into()));
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
            path: s.into(),
            dir: dir.display().to_string(),
        })
    }
}

/// `s` as one plain path component (no `/`, not `.` or `..`, not empty).
pub fn component(s: &str) -> Result<&str, PathError> {
    if s.is_empty() || s == "." || s == ".." || s.contains('/') || s.contains('\0') {
        return Err(PathError::BadName(s.into()));
    }
    Ok(s)
}

/// Check on disk that `target`'s parent, with every symlink resolved, is still inside
/// `dir` (also resolved), so a symlink planted in the kubelet directory cannot
/// redirect a bind mount elsewhere.
pub fn resolves_under(target: &Path, dir: &Path) -> Result<(), PathError> {
    let outside = || PathError::Outside {
        path: target.display().to_string(),
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
