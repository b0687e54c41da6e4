//! One `use` block per file, in one order: a file's private `use` items (its own, and
//! each inline module's) stand together, nothing else between them, grouped std, then
//! external crates, then the workspace's crates, then the crate's own modules.

use std::collections::BTreeSet;
use std::path::Path;

use syn::spanned::Spanned;
use syn::{Item, UseTree, Visibility};

/// The group of a `use`, in the order they come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    Std,
    External,
    Workspace,
    Local,
}

/// The names of the external crates: every package of Cargo.lock (`-` as `_`).
pub fn externals(lock: &str) -> BTreeSet<String> {
    lock.lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .map(|n| n.replace('-', "_"))
        .collect()
}

/// The group of a `use` whose path starts with `first`, in a module whose children
/// are `children`.
pub fn group(first: &str, children: &BTreeSet<String>, externals: &BTreeSet<String>) -> Group {
    if children.contains(first) {
        Group::Local
    } else if matches!(first, "std" | "core" | "alloc" | "proc_macro" | "test") {
        Group::Std
    } else if first.starts_with("tessera_") || first == "tessera" {
        Group::Workspace
    } else if externals.contains(first) {
        Group::External
    } else {
        Group::Local
    }
}

fn first_segment(tree: &UseTree) -> String {
    match tree {
        UseTree::Path(p) => p.ident.to_string(),
        UseTree::Name(n) => n.ident.to_string(),
        UseTree::Rename(r) => r.ident.to_string(),
        UseTree::Glob(_) => "*".into(),
        UseTree::Group(g) => g.items.first().map(first_segment).unwrap_or_default(),
    }
}

/// What an item other than a `use` is, for messages.
fn what(item: &Item) -> String {
    match item {
        Item::Mod(m) => format!("`mod {}`", m.ident),
        Item::Fn(f) => format!("`fn {}`", f.sig.ident),
        Item::Const(c) => format!("`const {}`", c.ident),
        Item::Static(s) => format!("`static {}`", s.ident),
        Item::Struct(s) => format!("`struct {}`", s.ident),
        Item::Enum(e) => format!("`enum {}`", e.ident),
        Item::Type(t) => format!("`type {}`", t.ident),
        Item::Trait(t) => format!("`trait {}`", t.ident),
        Item::Impl(_) => "an `impl`".into(),
        Item::Macro(_) => "a macro".into(),
        Item::ExternCrate(_) => "an `extern crate`".into(),
        _ => "an item".into(),
    }
}

/// The problems of the `use` items in `file` (at `rel`), and in its inline modules.
pub fn problems(rel: &Path, file: &syn::File, externals: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    check(rel, &file.items, externals, &mut out);
    out
}

fn check(rel: &Path, items: &[Item], externals: &BTreeSet<String>, out: &mut Vec<String>) {
    let at = |item: &Item| format!("{}:{}", rel.display(), item.span().start().line);
    let children: BTreeSet<String> = items
        .iter()
        .filter_map(|i| match i {
            Item::Mod(m) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect();
    let private: Vec<usize> = (0..items.len())
        .filter(|&i| matches!(&items[i], Item::Use(u) if matches!(u.vis, Visibility::Inherited)))
        .collect();
    if let (Some(&first), Some(&last)) = (private.first(), private.last()) {
        let line = |i: usize| items[i].span().start().line;
        // Each run of `use` items after something else is reported once.
        let mut stray = None;
        for i in first..=last {
            match &items[i] {
                Item::Use(u) if matches!(u.vis, Visibility::Inherited) => {
                    if let Some(s) = stray.take() {
                        out.push(format!(
                            "{}: `use` items apart from the block at line {}: {} (line {}) \
                             comes between",
                            at(&items[i]),
                            line(first),
                            what(&items[s]),
                            line(s)
                        ));
                    }
                }
                Item::Use(_) => {}
                _ => stray = stray.or(Some(i)),
            }
        }
        let mut before: Option<(Group, String, usize)> = None;
        for &i in &private {
            let Item::Use(u) = &items[i] else { continue };
            let name = if u.leading_colon.is_some() {
                "::".to_string() + &first_segment(&u.tree)
            } else {
                first_segment(&u.tree)
            };
            let g = group(name.trim_start_matches(':'), &children, externals);
            let g = if u.leading_colon.is_some() {
                g.min(Group::External)
            } else {
                g
            };
            if let Some((bg, bname, bline)) = &before
                && g < *bg
            {
                out.push(format!(
                    "{}: `use {name}::…` ({g:?}) after `use {bname}::…` ({bg:?}) of line {bline}: \
                     the order is Std, External, Workspace, Local",
                    at(&items[i])
                ));
            }
            if before.as_ref().is_none_or(|(bg, ..)| g >= *bg) {
                before = Some((g, name, line(i)));
            }
        }
    }
    for item in items {
        if let Item::Mod(m) = item
            && let Some((_, inner)) = &m.content
        {
            check(rel, inner, externals, out);
        }
    }
}
