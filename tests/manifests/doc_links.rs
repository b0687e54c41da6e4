//! Every link between the repository's Markdown pages resolves: the file it names
//! exists, and the anchor it names is a heading of that page (GitHub's anchors). A
//! runbook that sends an operator to a section that was renamed is a dead end at the
//! worst moment; so is a README link to a moved page.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support;

/// GitHub's anchor of a heading: lower case, spaces to dashes, everything but
/// letters, digits, `-` and `_` dropped.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown page: each heading's slug, a repeated one with `-1`,
/// `-2`, … as GitHub numbers them (headings inside fenced code are not headings).
pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` of a page, outside fenced and
/// inline code, with their line numbers.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans are not links.
        let text: String = line
            .split('`')
            .enumerate()
            .filter(|(k, _)| k % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// The Markdown pages of the repository that users and contributors read.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    for dir in [
        "docs",
        "bench",
        "charts/tessera",
        "tests/harness",
        "examples",
    ] {
        walk(&root.join(dir), &mut out);
    }
    out.retain(|p| p.exists());
    out.sort();
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            // Others' pages, kept as they came.
            if !p.ends_with("third_party") {
                walk(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// What is wrong with each link of `page` (empty when every link resolves).
fn broken(root: &Path, page: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let shown = page
        .strip_prefix(root)
        .unwrap_or(page)
        .display()
        .to_string();
    let mut out = Vec::new();
    for (line, target) in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        let file = file.split_whitespace().next().unwrap_or_default();
        let path = if file.is_empty() {
            page.to_path_buf()
        } else {
            page.parent().unwrap().join(file)
        };
        if !path.exists() {
            out.push(format!("{shown}:{line}: {target}: no such file"));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if path.extension().is_none_or(|x| x != "md") {
            continue; // an anchor into source or a picture: not checked
        }
        let there = std::fs::read_to_string(&path).unwrap();
        if !anchors(&there).contains(anchor) {
            out.push(format!("{shown}:{line}: {target}: no such section"));
        }
    }
    out
}

#[test]
fn every_link_between_the_pages_resolves() {
    let root = support::repo_root();
    let pages = pages(&root);
    assert!(pages.len() > 15, "found only {pages:?}");
    let bad: Vec<String> = pages.iter().flat_map(|p| broken(&root, p)).collect();
    assert!(
        bad.is_empty(),
        "links that lead nowhere:\n{}",
        bad.join("\n")
    );
}

#[test]
fn anchors_are_githubs() {
    let md = "# Tessera\n## MountPod conditions (`kubectl get mountpods -o yaml`)\n\
              ```sh\n# not a heading\n```\n### Known issues\n### Known issues\n";
    let got = anchors(md);
    let want: BTreeSet<String> = [
        "tessera",
        "mountpod-conditions-kubectl-get-mountpods--o-yaml",
        "known-issues",
        "known-issues-1",
    ]
    .map(String::from)
    .into();
    assert_eq!(got, want);
}

#[test]
fn a_dead_link_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("a.md");
    std::fs::write(dir.path().join("b.md"), "# There\n").unwrap();
    std::fs::write(
        &page,
        "[ok](b.md#there) [gone](b.md#elsewhere) [no file](c.md) `[code](x.md)` [self](#here)\n# Here\n",
    )
    .unwrap();
    let bad = broken(dir.path(), &page);
    assert_eq!(
        bad,
        [
            "a.md:1: b.md#elsewhere: no such section",
            "a.md:1: c.md: no such file"
        ]
    );
}
