//! The architecture, checked on the sources as syn reads them, where the crate
//! manifests cannot: which crate may depend on which is Cargo's to enforce, what each
//! may depend on from outside `tests/arch/deps.sh`'s. Here, for every crate of the
//! workspace:
//!
//! - no import circle between the modules under any module ([`imports`]);
//! - where a module's doc says its table is an order (`(a module imports only those
//!   below it)`), its children import only downwards;
//! - each module table (`//! | module | owns |`) names exactly the module's children,
//!   and every crate root with two or more has one ([`tables`]);
//! - the README's source map has a row for each crate;
//! - each file has one block of `use` items, in one order ([`uses`]);
//!
//! and beside the code: docs/troubleshooting.md names every reason ([`reasons`]), the
//! state diagrams draw every state. The checks run on made-up crates too
//! ([`planted`]), so a check that finds nothing has not gone blind.

mod imports;
mod planted;
mod reasons;
mod tables;
mod tree;
mod uses;

use std::path::{Path, PathBuf};

use imports::Imports;
use tree::Crate;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace's crates under `crates/` (those with a Cargo.toml), by name.
fn crate_dirs() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// The root file of every crate of the workspace (each library and binary), from the
/// repository root.
fn crate_roots() -> Vec<PathBuf> {
    let mut srcs: Vec<PathBuf> = crate_dirs()
        .iter()
        .map(|c| Path::new("crates").join(c).join("src"))
        .collect();
    srcs.push("src".into());
    let mut out = Vec::new();
    for src in srcs {
        for f in ["lib.rs", "main.rs"] {
            if root().join(&src).join(f).exists() {
                out.push(src.join(f));
            }
        }
        for bin in std::fs::read_dir(root().join(&src).join("bin"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let main = bin.path().join("main.rs");
            if main.exists() {
                out.push(main.strip_prefix(root()).unwrap().to_path_buf());
            }
        }
    }
    out
}

/// Every crate of the workspace, read.
fn crates() -> Vec<Crate> {
    let read = tree::on_disk(&root());
    crate_roots()
        .iter()
        .map(|r| tree::read_crate(r, &read).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// The circles of one crate, each with the imports that close it.
fn circles(krate: &Crate) -> String {
    let edges = Imports::of(krate).edges();
    let mut out = String::new();
    for (parent, members) in imports::circles(&edges) {
        let under = if parent.is_empty() {
            "the crate root".into()
        } else {
            parent.join("::")
        };
        out.push_str(&format!(
            "{}: a circle under {under}: {}\n{}",
            krate.root.display(),
            members.join(", "),
            imports::explain(&edges, &parent, &members)
        ));
    }
    out
}

/// The imports against the order documented by a module of `krate`.
fn against_orders(krate: &Crate) -> Vec<String> {
    let edges = Imports::of(krate).edges();
    let mut out = Vec::new();
    for m in &krate.modules {
        let Some(order) = tables::declared_order(m) else {
            continue;
        };
        for e in imports::against_order(&edges, &m.path, &order) {
            out.push(format!(
                "{} (module {}, top to bottom: {}): {e}",
                m.file.display(),
                m.name(),
                order.join(", ")
            ));
        }
    }
    out
}

#[test]
fn no_module_imports_its_way_back_to_itself() {
    let crates = crates();
    let modules: usize = crates.iter().map(|c| c.modules.len()).sum();
    assert!(
        modules > 150,
        "only {modules} modules read: is the tree where it was?"
    );
    let problems: String = crates.iter().map(circles).collect();
    assert!(problems.is_empty(), "import circles:\n{problems}");
}

#[test]
fn modules_import_only_downwards_where_their_order_is_documented() {
    let problems: Vec<String> = crates().iter().flat_map(against_orders).collect();
    assert!(
        problems.is_empty(),
        "imports against the order of a module table {}:\n{}",
        tables::LAYERED,
        problems.join("\n")
    );
}

#[test]
fn module_tables_match_their_folders() {
    let mut problems = Vec::new();
    for krate in crates() {
        for m in &krate.modules {
            let is_lib = m.path.is_empty() && krate.root.ends_with("lib.rs");
            problems.extend(tables::table_problems(m, is_lib && m.children.len() >= 2));
        }
    }
    assert!(
        problems.is_empty(),
        "module tables:\n{}",
        problems.join("\n")
    );
}

/// The README's source map names every crate of the workspace, and nothing that is
/// not there.
#[test]
fn the_readme_source_map_matches_the_tree() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let problems = tables::source_map_problems(&readme, &crate_dirs());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The .rs files of the repository's own code (vendored and built code left out).
fn rust_files() -> Vec<PathBuf> {
    let mut stack: Vec<PathBuf> = ["crates", "src", "tests", "bench"]
        .iter()
        .map(|d| root().join(d))
        .collect();
    let mut out = Vec::new();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name();
            if p.is_dir()
                && !["vendor", "target", "third_party"]
                    .iter()
                    .any(|s| name == *s)
            {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(root()).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn each_file_has_one_use_block_in_one_order() {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    let externals = uses::externals(&lock);
    let files = rust_files();
    assert!(files.len() > 200, "only {} files found", files.len());
    let mut problems = Vec::new();
    for rel in files {
        let text = std::fs::read_to_string(root().join(&rel)).unwrap();
        match syn::parse_file(&text) {
            Ok(file) => problems.extend(uses::problems(&rel, &file, &externals)),
            Err(e) => problems.push(format!("{}:{}: {e}", rel.display(), e.span().start().line)),
        }
    }
    assert!(
        problems.is_empty(),
        "`use` items out of place ({}):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// docs/troubleshooting.md names every reason the code can write: ticket reasons,
/// MountPod, Volume and VolumeAttachment condition reasons, Event reasons (how they
/// are collected, and what the scan cannot see: `reasons.rs`).
#[test]
fn troubleshooting_names_every_reason() {
    use reasons::Kind::{Condition, Event, Ticket};
    let (found, unreadable) = reasons::all_reasons(&root());
    assert!(
        unreadable.is_empty(),
        "reasons the scan cannot read (write them as literals or constants, or teach \
         tests/arch/reasons.rs the call):\n{}",
        unreadable.join("\n")
    );
    // The scan still sees each kind of call site (a renamed function would otherwise
    // make the check pass on nothing).
    for (kind, reason) in [
        (Ticket, "HeldByOtherNode"),
        (Event, "TakenOver"),
        (Event, "Attached"),
        (Event, "DeletionBlocked"),
        (Condition, "DaemonFailed"),
        (Condition, "MountsReady"),
        (Condition, "TicketsSatisfied"),
        (Condition, "BackendRootNotAllowed"),
        (Condition, "Removed"),
    ] {
        assert!(
            found.contains_key(&(kind, reason.to_string())),
            "the scan no longer finds the {kind:?} reason {reason}: {:?}",
            found.keys().collect::<Vec<_>>()
        );
    }
    let doc = std::fs::read_to_string(root().join("docs/troubleshooting.md")).unwrap();
    let missing = reasons::undocumented(&found, &doc);
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md does not name (as `Reason`) {} reason(s):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

/// Whether `text` has `word` with no letter, digit or `_` on either side.
fn has_word(text: &str, word: &str) -> bool {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(is_word)
            && !text[i + word.len()..].chars().next().is_some_and(is_word)
    })
}

/// The state diagrams (docs/diagrams/, rendered by `make diagrams`) draw every state
/// the code has: each `VolumeState` in volume-states.dot, each `TicketReason` in
/// tickets.dot (both enums' `ALL` are kept exhaustive by a `match` in tessera-api).
#[test]
fn the_state_diagrams_draw_every_state() {
    // Graphviz's line breaks in labels (`\n`, `\l`, `\r`) separate words.
    let read = |f: &str| {
        std::fs::read_to_string(root().join("docs/diagrams").join(f))
            .unwrap()
            .replace("\\n", " ")
            .replace("\\l", " ")
            .replace("\\r", " ")
    };
    let (volume, tickets) = (read("volume-states.dot"), read("tickets.dot"));
    let mut missing = Vec::new();
    for s in tessera_api::VolumeState::ALL {
        let name = format!("{s:?}");
        if !has_word(&volume, &name) {
            missing.push(format!("VolumeState {name} in volume-states.dot"));
        }
    }
    for r in tessera_api::TicketReason::ALL {
        if !has_word(&tickets, r.as_str()) {
            missing.push(format!("TicketReason {r} in tickets.dot"));
        }
    }
    assert!(
        missing.is_empty(),
        "the diagrams lack:\n{}",
        missing.join("\n")
    );
    assert!(has_word("a Faulted b", "Faulted") && !has_word("Faulted_v", "Faulted"));
}
