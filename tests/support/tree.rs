//! A directory tree as data, for the tests that compare a copy with its source
//! (populate, snapshots, restores, clones): [`tree_sums`] walks `dir` without following
//! symlinks and maps each relative path to what it holds.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

/// Every entry under `dir`: files by their sha256, symlinks by their target,
/// directories as such (relative paths).
pub fn tree_sums(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let ft = e.file_type().unwrap();
            let v = if ft.is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if ft.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else {
                hex::encode(Sha256::digest(std::fs::read(&p).unwrap()))
            };
            out.insert(rel, v);
        }
    }
    out
}
