//! A crate's modules as syn reads them: from the crate root (`lib.rs`, `main.rs`),
//! every `mod` declaration followed to its file (`#[path]` honoured) or read inline,
//! with `#[cfg(test)]` items and `mod tests` left out of everything.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use syn::visit_mut::{self, VisitMut};
use syn::{Attribute, ImplItem, Item, Stmt, TraitItem};

/// One module of a crate.
pub struct Module {
    /// Its path in the crate (empty for the root).
    pub path: Vec<String>,
    /// The file it is in, from the repository root.
    pub file: PathBuf,
    /// Whether it is a `mod x { … }` in its parent's file.
    pub inline: bool,
    /// Its doc comment, a line per `//!` (or `///`) line.
    pub doc: String,
    /// Its items, test items left out (an inline child's items are inside its `mod`).
    pub items: Vec<Item>,
    /// Its child modules, `#[cfg(test)]` ones and `tests` left out.
    pub children: Vec<String>,
}

impl Module {
    /// `path` of the module, for messages (`crate` for the root).
    pub fn name(&self) -> String {
        if self.path.is_empty() {
            "crate".into()
        } else {
            self.path.join("::")
        }
    }
}

/// The modules of one crate, the root first.
pub struct Crate {
    /// The root file, from the repository root.
    pub root: PathBuf,
    pub modules: Vec<Module>,
}

/// Reads a file by its path from the repository root.
pub type Read<'a> = &'a dyn Fn(&Path) -> Option<String>;

/// Parse a file's text, `#[cfg(test)]` items and `mod tests` left out.
pub fn parse(text: &str) -> syn::Result<syn::File> {
    let mut file = syn::parse_file(text)?;
    StripTests.visit_file_mut(&mut file);
    Ok(file)
}

/// The crate whose root is `root` (from the repository root).
pub fn read_crate(root: &Path, read: Read) -> Result<Crate, String> {
    let file = load(root, read)?;
    let mut modules = Vec::new();
    add(
        &mut modules,
        Found {
            path: Vec::new(),
            file: root.to_path_buf(),
            inline: false,
            doc: doc(&file.attrs),
            items: file.items,
            dir: root.parent().unwrap_or(Path::new("")).to_path_buf(),
        },
        read,
    )?;
    Ok(Crate {
        root: root.to_path_buf(),
        modules,
    })
}

fn load(path: &Path, read: Read) -> Result<syn::File, String> {
    let text = read(path).ok_or_else(|| format!("{}: cannot read", path.display()))?;
    parse(&text).map_err(|e| {
        let at = e.span().start();
        format!("{}:{}:{}: {e}", path.display(), at.line, at.column + 1)
    })
}

/// A module found, and the directory of its children's files.
struct Found {
    path: Vec<String>,
    file: PathBuf,
    inline: bool,
    doc: String,
    items: Vec<Item>,
    dir: PathBuf,
}

/// Add module `m` and its descendants.
fn add(modules: &mut Vec<Module>, m: Found, read: Read) -> Result<(), String> {
    let mut found = Vec::new();
    for item in &m.items {
        let Item::Mod(decl) = item else { continue };
        let name = decl.ident.to_string();
        let mut path = m.path.clone();
        path.push(name.clone());
        let attr_path = path_attr(&decl.attrs);
        found.push(match &decl.content {
            Some((_, items)) => Found {
                path,
                file: m.file.clone(),
                inline: true,
                doc: doc(&decl.attrs),
                items: items.clone(),
                dir: m.dir.join(attr_path.as_deref().unwrap_or(&name)),
            },
            None => {
                let (file, dir) = match attr_path {
                    Some(p) => {
                        let f = normalize(&m.dir.join(p));
                        let d = f.parent().unwrap_or(Path::new("")).to_path_buf();
                        (f, d)
                    }
                    None => {
                        let flat = m.dir.join(format!("{name}.rs"));
                        if read(&flat).is_some() {
                            (flat, m.dir.join(&name))
                        } else {
                            (m.dir.join(&name).join("mod.rs"), m.dir.join(&name))
                        }
                    }
                };
                let f = load(&file, read)?;
                Found {
                    path,
                    file,
                    inline: false,
                    doc: doc(&f.attrs),
                    items: f.items,
                    dir,
                }
            }
        });
    }
    modules.push(Module {
        children: found
            .iter()
            .map(|f| f.path.last().unwrap().clone())
            .collect(),
        path: m.path,
        file: m.file,
        inline: m.inline,
        doc: m.doc,
        items: m.items,
    });
    for f in found {
        add(modules, f, read)?;
    }
    Ok(())
}

/// The text of the doc attributes (`//!`, `///`), a line each.
pub fn doc(attrs: &[Attribute]) -> String {
    attrs
        .iter()
        .filter_map(|a| string(a, "doc"))
        .map(|l| l + "\n")
        .collect()
}

fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| string(a, "path"))
}

/// The string of an attribute `#[name = "…"]`.
fn string(a: &Attribute, name: &str) -> Option<String> {
    let syn::Meta::NameValue(nv) = &a.meta else {
        return None;
    };
    let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Str(s),
        ..
    }) = &nv.value
    else {
        return None;
    };
    nv.path.is_ident(name).then(|| s.value())
}

/// `a/b/../c` as `a/c`.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// Whether an item is marked `#[cfg(test)]`.
pub fn is_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

fn keep(item: &Item) -> bool {
    let attrs = match item {
        Item::Mod(m) if m.ident == "tests" => return false,
        Item::Mod(m) => &m.attrs,
        Item::Use(u) => &u.attrs,
        Item::Fn(f) => &f.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Const(c) => &c.attrs,
        Item::Static(s) => &s.attrs,
        Item::Struct(s) => &s.attrs,
        Item::Enum(e) => &e.attrs,
        Item::Trait(t) => &t.attrs,
        Item::Type(t) => &t.attrs,
        Item::Macro(m) => &m.attrs,
        _ => return true,
    };
    !is_test(attrs)
}

/// Removes the `#[cfg(test)]` items and `mod tests` at any depth.
struct StripTests;

impl VisitMut for StripTests {
    fn visit_file_mut(&mut self, f: &mut syn::File) {
        f.items.retain(keep);
        visit_mut::visit_file_mut(self, f);
    }

    fn visit_item_mod_mut(&mut self, m: &mut syn::ItemMod) {
        if let Some((_, items)) = &mut m.content {
            items.retain(keep);
        }
        visit_mut::visit_item_mod_mut(self, m);
    }

    fn visit_item_impl_mut(&mut self, i: &mut syn::ItemImpl) {
        i.items.retain(|it| match it {
            ImplItem::Fn(f) => !is_test(&f.attrs),
            ImplItem::Const(c) => !is_test(&c.attrs),
            _ => true,
        });
        visit_mut::visit_item_impl_mut(self, i);
    }

    fn visit_item_trait_mut(&mut self, t: &mut syn::ItemTrait) {
        t.items.retain(|it| match it {
            TraitItem::Fn(f) => !is_test(&f.attrs),
            _ => true,
        });
        visit_mut::visit_item_trait_mut(self, t);
    }

    fn visit_block_mut(&mut self, b: &mut syn::Block) {
        b.stmts.retain(|s| !matches!(s, Stmt::Item(i) if !keep(i)));
        visit_mut::visit_block_mut(self, b);
    }
}

/// Files in memory, by path: a [`Read`] for made-up crates.
pub fn in_memory(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> + use<> {
    let map: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(p, t)| (PathBuf::from(p), t.to_string()))
        .collect();
    move |p: &Path| map.get(p).cloned()
}

/// Reads from the disk, below `repo`.
pub fn on_disk(repo: &Path) -> impl Fn(&Path) -> Option<String> + use<> {
    let repo = repo.to_path_buf();
    move |p: &Path| std::fs::read_to_string(repo.join(p)).ok()
}
