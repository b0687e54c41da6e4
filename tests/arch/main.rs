//! The architecture, checked on the source: no import circle between modules of any
//! crate of the workspace, and the top-level modules of `tessera` import only
//! downwards in the order `src/lib.rs` documents. (Which crate may depend on which is
//! Cargo's to enforce; what each crate may depend on from outside is
//! `tests/arch/deps.sh`'s.)
//!
//! A module's imports are the `crate::`, `super::` and `self::` paths in its
//! production code (comments, string literals and `#[cfg(test)]` modules left out),
//! resolved through `pub use` re-exports to the module that defines the item. An
//! import from module `a::x::…` of `a::y::…` is an edge `x → y` between the siblings
//! `x` and `y` under `a`; a child using its parent's items (or a parent its child's)
//! is no edge. The siblings under each module must form no circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod reasons;
mod source;
use source::{Import, Source};

/// Where one crate's sources are, from the repository root.
const CRATES: &[&str] = &[
    "src",
    "crates/tessera-api/src",
    "crates/tessera-text/src",
    "crates/tessera-host/src",
    "crates/tessera-csi-proto/src",
    "crates/tessera-fuse/src",
];

/// `src/lib.rs`'s module map, top to bottom: a module may import only those below it.
const LAYERS: &[&str] = &[
    "cli",
    "plugin",
    "controller",
    "csi",
    "node",
    "fuse",
    "runtime",
    "metrics",
    "labels",
    // The crates below `tessera`, under the names its modules use (see src/lib.rs).
    "tickets",
    "api",
    "host",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The sources of one crate (binaries under `src/bin` and `src/main.rs` are crates of
/// their own and are left out).
fn crate_sources(dir: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "bin" || n == "tests") {
                    continue;
                }
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(dir).unwrap().to_path_buf();
                if rel == Path::new("main.rs") || source::is_test_file(&rel) {
                    continue;
                }
                files.push(Source::read(&p, &rel));
            }
        }
    }
    files
}

/// Every edge between siblings, with the imports that make it.
type Edges = BTreeMap<(Vec<String>, String, String), Vec<String>>;

fn sibling_edges(sources: &[Source]) -> Edges {
    let modules: BTreeSet<Vec<String>> = sources.iter().flat_map(|s| s.modules()).collect();
    let reexports = source::reexports(sources, &modules);
    let mut edges = Edges::new();
    for s in sources {
        for Import { path, line } in s.imports() {
            let Some(target) = source::resolve(&s.module, &path, &modules, &reexports) else {
                continue;
            };
            let from = &s.module;
            let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == target.len() {
                continue;
            }
            let key = (
                from[..common].to_vec(),
                from[common].clone(),
                target[common].clone(),
            );
            edges.entry(key).or_default().push(format!(
                "{}:{line} {}",
                s.rel.display(),
                path.join("::")
            ));
        }
    }
    edges
}

/// The circles among the children of each module: strongly connected components of
/// more than one sibling.
fn circles(edges: &Edges) -> Vec<(Vec<String>, Vec<String>)> {
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
        for scc in source::components(&graph) {
            if scc.len() > 1 {
                out.push((parent.clone(), scc));
            }
        }
    }
    out
}

fn explain(edges: &Edges, parent: &[String], members: &[String]) -> String {
    let mut s = String::new();
    for ((p, from, to), via) in edges {
        if p == parent && members.contains(from) && members.contains(to) {
            s.push_str(&format!("    {from} → {to}: {}\n", via.join("; ")));
        }
    }
    s
}

#[test]
fn no_module_imports_its_way_back_to_itself() {
    let mut problems = String::new();
    let mut checked = 0;
    for dir in CRATES {
        let dir = root().join(dir);
        if !dir.exists() {
            continue;
        }
        let sources = crate_sources(&dir);
        checked += sources.len();
        let edges = sibling_edges(&sources);
        for (parent, members) in circles(&edges) {
            let at = if parent.is_empty() {
                format!("{} (crate root)", dir.display())
            } else {
                parent.join("::")
            };
            problems.push_str(&format!(
                "circle under {at}: {}\n{}",
                members.join(", "),
                explain(&edges, &parent, &members)
            ));
        }
    }
    assert!(
        checked > 100,
        "only {checked} files read: is the tree where it was?"
    );
    assert!(problems.is_empty(), "import circles:\n{problems}");
}

#[test]
fn tesseras_modules_import_only_downwards() {
    let sources = crate_sources(&root().join("src"));
    let edges = sibling_edges(&sources);
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut problems = String::new();
    for ((parent, from, to), via) in &edges {
        if !parent.is_empty() {
            continue;
        }
        match (rank(from), rank(to)) {
            (Some(f), Some(t)) if f < t => {}
            _ => problems.push_str(&format!("{from} → {to}: {}\n", via.join("; "))),
        }
    }
    assert!(
        problems.is_empty(),
        "imports against the module map of src/lib.rs (top to bottom: {}):\n{problems}",
        LAYERS.join(", ")
    );
}

/// The check itself: a circle planted in a made-up crate is found, with the import
/// that closes it, and a child using its parent's items is not one.
#[test]
fn a_planted_circle_is_found() {
    let src = |rel: &str, text: &str| Source::parse(text, Path::new(rel));
    let sources = vec![
        src("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        src("a/mod.rs", "pub mod x;\npub use self::x::Thing;\n"),
        src("a/x.rs", "use crate::b::helper;\npub struct Thing;\n"),
        src(
            "b.rs",
            "// use crate::c::nothing; (a comment)\nuse super::c::Other;\npub fn helper() {}\n",
        ),
        src(
            "c.rs",
            "pub struct Other;\nfn f() { let _ = crate::a::Thing; let _ = \"crate::b::helper\"; }\n",
        ),
    ];
    let edges = sibling_edges(&sources);
    let found = circles(&edges);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1, ["a", "b", "c"]);
    let why = explain(&edges, &found[0].0, &found[0].1);
    assert!(why.contains("c → a: c.rs:2 crate::a::Thing"), "{why}");

    // Parent and child are no circle; and the re-export leads to `a::x`.
    let sources = vec![
        src("lib.rs", "pub mod a;\n"),
        src(
            "a/mod.rs",
            "pub mod x;\npub mod y;\npub use self::y::Y;\npub struct P;\nuse self::x::X;\n",
        ),
        src("a/x.rs", "use super::P;\npub struct X;\n"),
        src("a/y.rs", "use super::x::X;\npub struct Y;\n"),
    ];
    let edges = sibling_edges(&sources);
    assert!(circles(&edges).is_empty(), "{edges:?}");
    assert!(edges.contains_key(&(vec!["a".into()], "y".into(), "x".into())));
}

/// The README's source map names every crate of the workspace and every top-level
/// module of `tessera`, and nothing that is not there.
#[test]
fn the_readme_source_map_matches_the_tree() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find("Source map:")
        .expect("a source map in README.md");
    let map = &readme[start
        ..start
            + readme[start..]
                .find("\n## ")
                .unwrap_or(readme.len() - start)];
    let mut crates: Vec<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    crates.sort();
    for c in &crates {
        assert!(
            map.contains(&format!("`crates/{c}`")),
            "README's source map lacks crates/{c}"
        );
    }
    for named in map.split("`crates/").skip(1) {
        let name = named.split('`').next().unwrap_or_default();
        assert!(
            crates.iter().any(|c| c == name),
            "README names crates/{name}, which does not exist"
        );
    }
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    for line in lib.lines() {
        if let Some(m) = line
            .strip_prefix("pub mod ")
            .and_then(|m| m.strip_suffix(';'))
        {
            let shown = if m == "cli" {
                "`cli.rs`".to_string()
            } else {
                format!("`{m}`")
            };
            assert!(
                map.contains(&shown),
                "README's source map lacks the module {m}"
            );
        }
    }
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
