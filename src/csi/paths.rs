//! Validation of paths that come from CSI requests (staging and target paths): they
//! must be absolute, free of `.` and `..` components, under the kubelet directory, and
//! must not be symlinks — so no request can make the driver mount over, or remove,
//! anything outside kubelet's own directories (CVE-2020-8568 style).

use std::path::{Component, Path, PathBuf};

/// A path rejected, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty.
    #[error("{field} is required")]
    Missing {
        /// The request field.
        field: &'static str,
    },
    /// Not absolute, or has `.`/`..` components.
    #[error("{field} {path:?} must be an absolute path without '.' or '..' components")]
    NotClean {
        /// The request field.
        field: &'static str,
        /// The path.
        path: String,
    },
    /// Outside the kubelet directory.
    #[error("{field} {path:?} is not under the kubelet directory {root}")]
    OutsideRoot {
        /// The request field.
        field: &'static str,
        /// The path.
        path: String,
        /// The kubelet directory.
        root: String,
    },
    /// A symlink (at the path or one of its parents under the root).
    #[error("{field} {path:?} is or passes through a symlink")]
    Symlink {
        /// The request field.
        field: &'static str,
        /// The path.
        path: String,
    },
}

/// Check `path` (the request field `field`) against the kubelet directory `root`.
pub fn validate(field: &'static str, path: &str, root: &Path) -> Result<PathBuf, PathError> {
    if path.is_empty() {
        return Err(PathError::Missing { field });
    }
    let p = Path::new(path);
    let clean = p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && !path.split('/').any(|s| s == "." || s == "..");
    if !clean {
        return Err(PathError::NotClean {
            field,
            path: path.into(),
        });
    }
    if !p.starts_with(root) || p == root {
        return Err(PathError::OutsideRoot {
            field,
            path: path.into(),
            root: root.display().to_string(),
        });
    }
    // No component between the root and the path may be a symlink.
    let mut cur = root.to_path_buf();
    for c in p.strip_prefix(root).expect("checked above").components() {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(PathError::Symlink {
                    field,
                    path: path.into(),
                });
            }
            _ => {}
        }
    }
    Ok(p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_requests() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let ok = root.join("pods/x/volumes/v/mount");
        assert_eq!(
            validate("target_path", ok.to_str().unwrap(), root),
            Ok(ok.clone())
        );
        assert!(matches!(
            validate("target_path", "", root),
            Err(PathError::Missing { .. })
        ));
        assert!(matches!(
            validate("target_path", "relative/p", root),
            Err(PathError::NotClean { .. })
        ));
        let dotdot = format!("{}/pods/../../etc", root.display());
        assert!(matches!(
            validate("target_path", &dotdot, root),
            Err(PathError::NotClean { .. })
        ));
        assert!(matches!(
            validate("target_path", "/etc/passwd", root),
            Err(PathError::OutsideRoot { .. })
        ));
        assert!(matches!(
            validate("target_path", root.to_str().unwrap(), root),
            Err(PathError::OutsideRoot { .. })
        ));
        std::fs::create_dir_all(root.join("pods")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("pods/evil")).unwrap();
        let via_link = format!("{}/pods/evil/target", root.display());
        assert!(matches!(
            validate("target_path", &via_link, root),
            Err(PathError::Symlink { .. })
        ));
    }
}
