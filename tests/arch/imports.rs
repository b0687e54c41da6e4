//! What each module of a crate imports of the others: its `use` trees and the
//! `crate::`/`super::`/`self::` paths of its code (macro bodies included, string
//! literals and comments never), resolved through `use` re-exports to the module that
//! defines the item; and the edges between siblings they make, their circles, and
//! imports against a documented order.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{Item, UseTree};

use crate::tree::{Crate, Module};

/// A path a module names, and the line it is on.
pub struct Import {
    pub path: Vec<String>,
    pub line: usize,
}

/// A `use` of a module, expanded: the name it brings in (`*` for a glob, whose path
/// ends in `*`), the path, its line.
struct Use {
    name: String,
    path: Vec<String>,
    line: usize,
}

/// The uses and the anchored paths of one module's items (its child modules' aside).
#[derive(Default)]
struct Collect {
    uses: Vec<Use>,
    paths: Vec<Import>,
}

impl<'a> Visit<'a> for Collect {
    fn visit_item_mod(&mut self, _: &'a syn::ItemMod) {}

    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let line = u.use_token.span.start().line;
        let mut prefix = Vec::new();
        if u.leading_colon.is_some() {
            prefix.push("::".to_string());
        }
        let mut out = Vec::new();
        expand(&u.tree, &mut prefix, &mut out);
        self.uses
            .extend(out.into_iter().map(|(name, path)| Use { name, path, line }));
    }

    fn visit_path(&mut self, p: &'a syn::Path) {
        let path: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if p.leading_colon.is_none() && path.len() > 1 && is_anchor(&path[0]) {
            let line = p.segments[0].ident.span().start().line;
            self.paths.push(Import { path, line });
        }
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'a syn::Macro) {
        self.visit_path(&m.path);
        macro_paths(m.tokens.clone(), &mut self.paths);
    }
}

/// The anchored paths (`crate::a::b`) in a macro's tokens.
fn macro_paths(tokens: TokenStream, out: &mut Vec<Import>) {
    let toks: Vec<TokenTree> = tokens.into_iter().collect();
    let is_sep = |i: usize| {
        matches!((toks.get(i), toks.get(i + 1)),
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':')
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            TokenTree::Group(g) => macro_paths(g.stream(), out),
            TokenTree::Ident(id) if is_anchor(&id.to_string()) && !(i >= 2 && is_sep(i - 2)) => {
                let line = id.span().start().line;
                let mut path = vec![id.to_string()];
                while is_sep(i + 1) {
                    let Some(TokenTree::Ident(next)) = toks.get(i + 3) else {
                        break;
                    };
                    path.push(next.to_string());
                    i += 3;
                }
                if path.len() > 1 {
                    out.push(Import { path, line });
                }
            }
            _ => {}
        }
        i += 1;
    }
}

fn is_anchor(s: &str) -> bool {
    matches!(s, "crate" | "super" | "self")
}

/// A use tree as (name brought in, full path) pairs.
fn expand(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    let with = |prefix: &[String], last: &str| {
        let mut p = prefix.to_vec();
        if last != "self" || p.is_empty() {
            p.push(last.to_string());
        }
        p
    };
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            expand(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let path = with(prefix, &n.ident.to_string());
            out.push((path.last().unwrap().clone(), path));
        }
        UseTree::Rename(r) => out.push((r.rename.to_string(), with(prefix, &r.ident.to_string()))),
        UseTree::Glob(_) => out.push(("*".into(), with(prefix, "*"))),
        UseTree::Group(g) => g.items.iter().for_each(|t| expand(t, prefix, out)),
    }
}

/// The imports of one crate: every module's uses and paths, and what it defines.
pub struct Imports {
    modules: BTreeSet<Vec<String>>,
    /// (module, name it brings in with `use`) → the absolute path it stands for.
    uses: BTreeMap<(Vec<String>, String), Vec<String>>,
    /// Per module: its file, and the paths it names.
    named: Vec<(Vec<String>, String, Vec<Import>)>,
}

impl Imports {
    pub fn of(krate: &Crate) -> Imports {
        let modules: BTreeSet<Vec<String>> = krate.modules.iter().map(|m| m.path.clone()).collect();
        let collected: Vec<(&Module, Collect)> = krate
            .modules
            .iter()
            .map(|m| {
                let mut c = Collect::default();
                m.items.iter().for_each(|i| c.visit_item(i));
                (m, c)
            })
            .collect();
        let defined: BTreeMap<&Vec<String>, BTreeSet<String>> = collected
            .iter()
            .map(|(m, c)| {
                let mut names: BTreeSet<String> = m.items.iter().filter_map(item_name).collect();
                names.extend(c.uses.iter().map(|u| u.name.clone()));
                names.remove("*");
                (&m.path, names)
            })
            .collect();
        let mut uses = BTreeMap::new();
        for (m, c) in &collected {
            for u in &c.uses {
                let Some(abs) = absolute(&m.path, &u.path, &modules) else {
                    continue;
                };
                if u.name != "*" {
                    uses.insert((m.path.clone(), u.name.clone()), abs);
                    continue;
                }
                let target = abs[..abs.len() - 1].to_vec();
                for item in defined.get(&target).into_iter().flatten() {
                    let mut p = target.clone();
                    p.push(item.clone());
                    uses.entry((m.path.clone(), item.clone())).or_insert(p);
                }
            }
        }
        let named = collected
            .into_iter()
            .map(|(m, c)| {
                let mut paths = c.paths;
                paths.extend(c.uses.into_iter().map(|u| Import {
                    path: u.path,
                    line: u.line,
                }));
                (m.path.clone(), m.file.display().to_string(), paths)
            })
            .collect();
        Imports {
            modules,
            uses,
            named,
        }
    }

    /// The module `path` (named in module `from`) leads to, following `use`
    /// declarations; `None` for a path outside the crate.
    fn resolve(&self, from: &[String], path: &[String]) -> Option<Vec<String>> {
        let mut abs = absolute(from, path, &self.modules)?;
        for _ in 0..16 {
            let known = (0..=abs.len())
                .rev()
                .find(|&n| self.modules.contains(&abs[..n]))
                .unwrap_or(0);
            let module = abs[..known].to_vec();
            let Some(next) = abs.get(known) else {
                return Some(module);
            };
            match self.uses.get(&(module.clone(), next.clone())) {
                Some(target) if *target != abs[..=known] => {
                    let mut redirected = target.clone();
                    redirected.extend(abs[known + 1..].iter().cloned());
                    abs = redirected;
                }
                _ => return Some(module),
            }
        }
        None
    }

    /// Every edge between siblings, with the imports that make it.
    pub fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (from, file, paths) in &self.named {
            for Import { path, line } in paths {
                let Some(target) = self.resolve(from, path) else {
                    continue;
                };
                let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if common == from.len() || common == target.len() {
                    continue;
                }
                let key = (
                    from[..common].to_vec(),
                    from[common].clone(),
                    target[common].clone(),
                );
                edges
                    .entry(key)
                    .or_default()
                    .push(format!("{file}:{line} {}", path.join("::")));
            }
        }
        edges
    }
}

/// (parent, from child, to child) → the imports that make the edge (`file:line path`).
pub type Edges = BTreeMap<(Vec<String>, String, String), Vec<String>>;

/// The name an item defines.
fn item_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Struct(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Const(i) => &i.ident,
        Item::Static(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::Mod(i) => &i.ident,
        Item::Union(i) => &i.ident,
        Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// `path` made absolute (from the crate root) as named in module `from`; `None` for a
/// path that starts neither at `crate`, `super`, `self` nor a child module of `from`.
fn absolute(
    from: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut at: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => from.to_vec(),
        _ => {
            let mut child = from.to_vec();
            child.push(first.clone());
            if !modules.contains(&child) {
                return None;
            }
            child.pop();
            child.extend(path.iter().cloned());
            return Some(child);
        }
    };
    let mut rest = &path[1..];
    if first == "super" {
        at.pop();
    }
    while rest.first().is_some_and(|s| s == "super") {
        at.pop();
        rest = &rest[1..];
    }
    at.extend(rest.iter().cloned());
    Some(at)
}

/// The circles among the children of each module: (parent, the siblings of one
/// strongly connected component of more than one).
pub fn circles(edges: &Edges) -> Vec<(Vec<String>, Vec<String>)> {
    let mut by_parent: BTreeMap<&Vec<String>, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for (parent, from, to) in edges.keys() {
        by_parent
            .entry(parent)
            .or_default()
            .entry(from.as_str())
            .or_default()
            .insert(to.as_str());
    }
    let mut out = Vec::new();
    for (parent, graph) in by_parent {
        let reach = |start: &str| {
            let mut seen = BTreeSet::new();
            let mut stack = vec![start];
            while let Some(n) = stack.pop() {
                for &m in graph.get(n).into_iter().flatten() {
                    if seen.insert(m) {
                        stack.push(m);
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&str, BTreeSet<&str>> =
            graph.keys().map(|&n| (n, reach(n))).collect();
        let mut done = BTreeSet::new();
        for (&n, from_n) in &reaches {
            if done.contains(n) || !from_n.contains(n) {
                continue;
            }
            let scc: Vec<String> = reaches
                .iter()
                .filter(|(m, r)| from_n.contains(*m) && r.contains(n))
                .map(|(m, _)| m.to_string())
                .collect();
            done.extend(scc.iter().cloned());
            out.push((parent.clone(), scc));
        }
    }
    out
}

/// The edges of one circle, each with the imports that make it.
pub fn explain(edges: &Edges, parent: &[String], members: &[String]) -> String {
    let mut s = String::new();
    for ((p, from, to), via) in edges {
        if p == parent && members.contains(from) && members.contains(to) {
            s.push_str(&format!("    {from} → {to}: {}\n", via.join("; ")));
        }
    }
    s
}

/// The edges under `parent` against `order` (its children, top to bottom: a module
/// imports only those below it).
pub fn against_order(edges: &Edges, parent: &[String], order: &[String]) -> Vec<String> {
    let rank = |m: &str| order.iter().position(|o| o == m);
    let mut out = Vec::new();
    for ((p, from, to), via) in edges {
        if p != parent {
            continue;
        }
        match (rank(from), rank(to)) {
            (Some(f), Some(t)) if f < t => {}
            _ => out.push(format!("{from} → {to}: {}", via.join("; "))),
        }
    }
    out
}
