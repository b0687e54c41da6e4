//! The checks on made-up crates in memory: each finds what is planted in one, and
//! counts nothing that only looks like an import (a comment, a string literal, a
//! `#[cfg(test)]` module).

use std::collections::BTreeSet;
use std::path::Path;

use crate::imports::{self, Imports};
use crate::tree::{self, Crate};
use crate::{tables, uses};

fn krate(files: &[(&str, &str)]) -> Crate {
    tree::read_crate(Path::new("src/lib.rs"), &tree::in_memory(files)).unwrap()
}

fn edges(files: &[(&str, &str)]) -> imports::Edges {
    Imports::of(&krate(files)).edges()
}

fn edge(parent: &[&str], from: &str, to: &str) -> (Vec<String>, String, String) {
    (
        parent.iter().map(|s| s.to_string()).collect(),
        from.into(),
        to.into(),
    )
}

#[test]
fn a_planted_circle_is_found_with_the_imports_that_close_it() {
    let edges = edges(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("src/a/mod.rs", "pub mod x;\npub use self::x::Thing;\n"),
        ("src/a/x.rs", "use crate::b::helper;\npub struct Thing;\n"),
        ("src/b.rs", "use super::c::Other;\npub fn helper() {}\n"),
        (
            "src/c.rs",
            "pub struct Other;\nfn f() {\n    let _ = crate::a::Thing;\n}\n",
        ),
    ]);
    let found = imports::circles(&edges);
    assert_eq!(found, [(vec![], vec!["a".into(), "b".into(), "c".into()])]);
    let why = imports::explain(&edges, &[], &found[0].1);
    // `crate::a::Thing` leads, through the re-export, to `a::x`: still `a`.
    assert!(why.contains("c → a: src/c.rs:3 crate::a::Thing"), "{why}");
    assert!(
        why.contains("a → b: src/a/x.rs:1 crate::b::helper"),
        "{why}"
    );
}

#[test]
fn a_parent_and_its_child_are_no_circle_and_reexports_lead_to_the_definition() {
    let edges = edges(&[
        ("src/lib.rs", "pub mod a;\n"),
        (
            "src/a/mod.rs",
            "pub mod x;\npub mod y;\npub use y::Y;\nuse self::x::X;\npub struct P;\n",
        ),
        (
            "src/a/x.rs",
            "use super::P;\npub struct X;\nfn f() -> super::Y { todo!() }\n",
        ),
        ("src/a/y.rs", "pub struct Y;\n"),
    ]);
    // `super::Y` is `a::y::Y`, re-exported by `a` without `self::`; `a` using `x`
    // and `x` using `a` are no edges.
    assert_eq!(edges.keys().collect::<Vec<_>>(), [&edge(&["a"], "x", "y")]);
}

#[test]
fn comments_strings_and_test_modules_import_nothing() {
    let edges = edges(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        (
            "src/b.rs",
            r#"// use crate::a::A; (a comment)
/* crate::a::A */
pub struct B;
/// Not `crate::a::A`.
fn f() -> &'static str { println!("{}", "crate::a::A"); "crate::a::A" }
#[cfg(test)]
mod t { use crate::a::A; }
mod tests { use crate::a::A; }
#[cfg(test)]
fn g() -> crate::a::A { todo!() }
impl B {
    #[cfg(test)]
    fn h() { let _ = crate::a::A; }
}
"#,
        ),
    ]);
    assert!(imports::circles(&edges).is_empty(), "{edges:?}");
    assert!(!edges.contains_key(&edge(&[], "b", "a")), "{edges:?}");
    // A path in a macro's tokens is one.
    let edges = self::edges(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\n"),
        ("src/a.rs", "pub struct A;\n"),
        (
            "src/b.rs",
            "fn f() { assert!(matches!(x, crate::a::A)); }\n",
        ),
    ]);
    assert!(edges.contains_key(&edge(&[], "b", "a")), "{edges:?}");
}

#[test]
fn inline_and_path_modules_are_modules_of_their_own() {
    let k = krate(&[
        (
            "src/lib.rs",
            "pub mod a;\n#[path = \"elsewhere/b.rs\"]\npub mod b;\n",
        ),
        (
            "src/a.rs",
            "pub mod inner {\n    use crate::b::B;\n}\npub mod deep;\n",
        ),
        ("src/a/deep.rs", "use super::inner;\n"),
        ("src/elsewhere/b.rs", "pub struct B;\n"),
    ]);
    let paths: BTreeSet<String> = k.modules.iter().map(|m| m.name()).collect();
    assert_eq!(
        paths,
        ["a", "a::deep", "a::inner", "b", "crate"]
            .map(String::from)
            .into()
    );
    let edges = Imports::of(&k).edges();
    assert!(edges.contains_key(&edge(&[], "a", "b")), "{edges:?}");
    assert!(
        edges.contains_key(&edge(&["a"], "deep", "inner")),
        "{edges:?}"
    );
}

const LAYERED_LIB: &str = "//! | module | owns |
//! |---|---|
//! | [`top`] | imports below |
//! | [`super::elsewhere`] | not a child: left out |
//! | `bottom` | imports nothing |
//! | this one | wiring |
//!
//! (a module imports only those below it)
pub mod top;
pub mod bottom;
";

#[test]
fn a_planted_upward_import_is_found() {
    let files = |bottom: &'static str| {
        krate(&[
            ("src/lib.rs", LAYERED_LIB),
            ("src/top.rs", "use crate::bottom::f;\npub fn g() {}\n"),
            ("src/bottom.rs", bottom),
        ])
    };
    let downwards = files("pub fn f() {}\n");
    assert_eq!(crate::against_orders(&downwards), Vec::<String>::new());
    let upwards = files("pub fn f() {}\nfn h() { crate::top::g() }\n");
    let found = crate::against_orders(&upwards);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("bottom → top: src/bottom.rs:2 crate::top::g"),
        "{found:?}"
    );
    // And no circle check misses it either.
    assert!(crate::circles(&upwards).contains("bottom, top"));
}

#[test]
fn a_module_table_that_lags_its_folder_is_found() {
    let lib = LAYERED_LIB.replace("pub mod bottom;", "pub mod new;");
    let k = krate(&[("src/lib.rs", &lib), ("src/top.rs", ""), ("src/new.rs", "")]);
    let problems = tables::table_problems(&k.modules[0], true);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(
        tables::module_table("| module | owns |\n|---|---|\n| `a`, [`b`] | both |\n| a c | ? |\n"),
        Some(vec![Ok("a".into()), Ok("b".into()), Err("a c".into())])
    );
    assert!(
        problems[0].contains("names `bottom`, which is no child"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("lacks the child module `new`"),
        "{problems:?}"
    );
    // No table: required of a crate root with two children, else not.
    let bare = krate(&[
        ("src/lib.rs", "mod a;\nmod b;\n#[cfg(test)]\nmod c;\n"),
        ("src/a.rs", ""),
        ("src/b.rs", ""),
    ]);
    assert_eq!(bare.modules[0].children, ["a", "b"]);
    assert!(tables::table_problems(&bare.modules[0], false).is_empty());
    let problems = tables::table_problems(&bare.modules[0], true);
    assert!(problems[0].contains("no module table"), "{problems:?}");
}

#[test]
fn the_source_map_must_have_a_row_per_crate() {
    let readme = "Source map: the crates, this table matching `crates/`.\n\n| crate | owns |\n|---|---|\n\
                  | `crates/tessera-a` | a |\n| `tessera` (`src/`) | the binary |\n\
                  | `crates/tessera-gone` | gone |\n\n## Next\n`crates/tessera-b` after the map\n";
    let problems = tables::source_map_problems(readme, &["tessera-a".into(), "tessera-b".into()]);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("no row `crates/tessera-b`"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("crates/tessera-gone, which does not exist"),
        "{problems:?}"
    );
}

#[test]
fn uses_out_of_order_or_apart_are_found() {
    let externals = uses::externals("name = \"serde\"\nname = \"tokio-stream\"\n");
    let check = |text: &str| {
        uses::problems(
            Path::new("f.rs"),
            &syn::parse_file(text).unwrap(),
            &externals,
        )
    };
    let good = "mod child;\nuse std::fmt;\nuse serde::Serialize;\nuse tokio_stream::Stream;\n\
                pub use crate::x::Y;\nuse tessera_api::Volume;\nuse child::Z;\nuse crate::w;\nfn f() {}\n";
    assert_eq!(check(good), Vec::<String>::new());
    let found = check("use crate::w;\nuse std::fmt;\nmod m;\nuse serde::S;\nuse tessera_api::V;\n");
    assert_eq!(found.len(), 4, "{found:?}");
    assert_eq!(
        found[0],
        "f.rs:4: `use` items apart from the block at line 1: `mod m` (line 3) comes between"
    );
    assert!(
        found[1].starts_with("f.rs:2: `use std::…` (Std) after `use crate::…` (Local)"),
        "{found:?}"
    );
    assert!(
        found[2].starts_with("f.rs:4: `use serde::…` (External)"),
        "{found:?}"
    );
    assert!(
        found[3].starts_with("f.rs:5: `use tessera_api::…` (Workspace)"),
        "{found:?}"
    );
    // Inside an inline module too.
    let found = check("mod t {\n    use super::*;\n    use std::fmt;\n}\n");
    assert_eq!(found.len(), 1, "{found:?}");
}
