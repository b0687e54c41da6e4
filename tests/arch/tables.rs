//! The maps the docs draw of the code: a module's table of its child modules (in its
//! `//!` doc, the Markdown table whose header starts with `module`), the order some
//! declare with it, and the README's source map of the workspace's crates.

use std::collections::BTreeSet;

use crate::tree::Module;

/// The phrase by which a module's doc declares its table's order a layering.
pub const LAYERED: &str = "(a module imports only those below it)";

/// The names of the rows of the module table in `doc`, top to bottom (rows of `this
/// one` and of paths with `::` left out; a first cell may name several, `` `a`, `b` ``),
/// or `None` without a table. A first cell that names no module is an `Err`.
pub fn module_table(doc: &str) -> Option<Vec<Result<String, String>>> {
    let mut lines = doc
        .lines()
        .map(str::trim)
        .skip_while(|l| first_cell(l) != Some("module"));
    lines.next()?;
    let rows = lines
        .take_while(|l| l.starts_with('|'))
        .filter(|l| !l.trim_start_matches('|').trim_start().starts_with("---"))
        .filter_map(first_cell)
        .filter(|cell| *cell != "this one" && !cell.contains("::"))
        .flat_map(
            |cell| match cell.split(',').map(module_name).collect::<Option<Vec<_>>>() {
                Some(names) => names.into_iter().map(Ok).collect(),
                None => vec![Err(cell.to_string())],
            },
        )
        .collect();
    Some(rows)
}

/// The module `` [`name`] `` or `` `name` `` names.
fn module_name(cell: &str) -> Option<String> {
    let cell = cell.trim();
    let name = cell
        .strip_prefix("[`")
        .and_then(|c| c.strip_suffix("`]"))
        .or_else(|| cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')))?;
    let ok = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
    ok.then(|| name.to_string())
}

/// The first cell of a table row.
fn first_cell(line: &str) -> Option<&str> {
    Some(line.strip_prefix('|')?.split('|').next()?.trim())
}

/// What is wrong with module `m`'s table: rows naming no child module, children
/// without a row, a missing table where `required`.
pub fn table_problems(m: &Module, required: bool) -> Vec<String> {
    let at = format!("{} (module {})", m.file.display(), m.name());
    let Some(rows) = module_table(&m.doc) else {
        return if required {
            vec![format!(
                "{at}: no module table (`//! | module | owns |`) for its {} child modules: {}",
                m.children.len(),
                m.children.join(", ")
            )]
        } else {
            Vec::new()
        };
    };
    let mut out = Vec::new();
    let mut named = BTreeSet::new();
    for row in rows {
        match row {
            Ok(name) => {
                if !named.insert(name.clone()) {
                    out.push(format!("{at}: the table names `{name}` twice"));
                }
            }
            Err(cell) => out.push(format!("{at}: a table row names no module: `{cell}`")),
        }
    }
    let children: BTreeSet<String> = m.children.iter().cloned().collect();
    for gone in named.difference(&children) {
        out.push(format!(
            "{at}: the table names `{gone}`, which is no child module"
        ));
    }
    for missing in children.difference(&named) {
        out.push(format!(
            "{at}: the table lacks the child module `{missing}`"
        ));
    }
    out
}

/// The order module `m` declares for its children (its table's rows, top to
/// bottom), if its doc says it is layered.
pub fn declared_order(m: &Module) -> Option<Vec<String>> {
    if !m.doc.contains(LAYERED) {
        return None;
    }
    let rows = module_table(&m.doc).unwrap_or_default();
    Some(rows.into_iter().flatten().collect())
}

/// What is wrong with the README's source map, given the crates under `crates/`:
/// one row per crate (`` `crates/NAME` ``), one for the root package (`` `tessera` ``),
/// and no row for a crate that is not there.
pub fn source_map_problems(readme: &str, crates: &[String]) -> Vec<String> {
    let Some(start) = readme.find("Source map:") else {
        return vec!["README.md has no section starting `Source map:`".into()];
    };
    let section = &readme[start..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let firsts: Vec<&str> = section
        .lines()
        .filter_map(|l| first_cell(l.trim()))
        .collect();
    let mut out = Vec::new();
    for c in crates {
        if !firsts.contains(&format!("`crates/{c}`").as_str()) {
            out.push(format!("README's source map has no row `crates/{c}`"));
        }
    }
    if !firsts.iter().any(|f| f.starts_with("`tessera`")) {
        out.push("README's source map has no row for the root package, `tessera`".into());
    }
    for named in section.split("`crates/").skip(1) {
        let name = named.split(['`', '/']).next().unwrap_or_default();
        if !name.is_empty() && !crates.iter().any(|c| c == name) {
            out.push(format!(
                "README's source map names crates/{name}, which does not exist"
            ));
        }
    }
    out
}
