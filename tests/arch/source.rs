//! Reading a crate's modules as far as the import check needs: a file's module path,
//! its tokens with comments, literals and `#[cfg(test)]` items left out, the items it
//! defines, its `use` trees expanded to paths, and the `crate::`/`super::`/`self::`
//! paths in its code. No parser crate: the check needs only tokens.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file of a crate.
pub struct Source {
    /// Path below the crate's `src/`.
    pub rel: PathBuf,
    /// Its module path (`controller::attachment` for `controller/attachment/mod.rs`).
    pub module: Vec<String>,
    tokens: Vec<Tok>,
}

/// A path this module names, absolute or relative (`super::…`), and where.
pub struct Import {
    /// The segments, `crate`/`super`/`self` first.
    pub path: Vec<String>,
    /// Line in the file.
    pub line: usize,
}

/// One token: an identifier, `::`, one punctuation character, or a string literal
/// (its text is `"` followed by the literal's source text, escapes as written).
#[derive(Clone, Debug, PartialEq)]
pub struct Tok {
    pub text: String,
    pub line: usize,
}

impl Tok {
    /// The content of a string literal token.
    pub fn literal(&self) -> Option<&str> {
        self.text.strip_prefix('"')
    }
}

/// Whether a file holds unit tests only (`tests.rs`, `*_tests.rs`).
pub fn is_test_file(rel: &Path) -> bool {
    let stem = rel.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    stem == "tests" || stem.ends_with("_tests")
}

impl Source {
    /// Read `path`, at `rel` below its crate's `src/`.
    pub fn read(path: &Path, rel: &Path) -> Source {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        Source::parse(&text, rel)
    }

    /// A file's text, at `rel` below its crate's `src/`.
    pub fn parse(text: &str, rel: &Path) -> Source {
        let mut module: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            module.pop();
        }
        Source {
            rel: rel.to_path_buf(),
            module,
            tokens: without_test_items(tokenize(text)),
        }
    }

    /// Its tokens, `#[cfg(test)]` items left out.
    pub fn tokens(&self) -> &[Tok] {
        &self.tokens
    }

    /// This file's module and the modules it declares inline (`mod x { … }`).
    pub fn modules(&self) -> Vec<Vec<String>> {
        let mut out = vec![self.module.clone()];
        for w in self.tokens.windows(3) {
            if w[0].text == "mod" && is_ident(&w[1].text) && w[2].text == "{" {
                let mut m = self.module.clone();
                m.push(w[1].text.clone());
                out.push(m);
            }
        }
        out
    }

    /// Names of the items this file defines at any depth (an approximation that
    /// suffices to follow glob re-exports).
    fn items(&self) -> BTreeSet<String> {
        const KINDS: &[&str] = &[
            "struct", "enum", "fn", "const", "static", "type", "trait", "mod", "union",
        ];
        self.tokens
            .windows(2)
            .filter(|w| KINDS.contains(&w[0].text.as_str()) && is_ident(&w[1].text))
            .map(|w| w[1].text.clone())
            .collect()
    }

    /// Every `use` of this file, expanded: (the name it brings in, the full path, line).
    fn uses(&self) -> Vec<(String, Vec<String>, usize)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.tokens.len() {
            if self.tokens[i].text == "use" {
                let line = self.tokens[i].line;
                let end = (i..self.tokens.len())
                    .find(|&j| self.tokens[j].text == ";")
                    .unwrap_or(self.tokens.len());
                let toks: Vec<&str> = self.tokens[i + 1..end]
                    .iter()
                    .map(|t| t.text.as_str())
                    .collect();
                for (name, path) in use_tree(&toks) {
                    out.push((name, path, line));
                }
                i = end;
            }
            i += 1;
        }
        out
    }

    /// The paths starting at `crate`, `super` or `self` this file names: in its `use`
    /// declarations and in its code.
    pub fn imports(&self) -> Vec<Import> {
        let mut out: Vec<Import> = self
            .uses()
            .into_iter()
            .filter(|(_, p, _)| is_anchor(&p[0]))
            .map(|(_, path, line)| Import { path, line })
            .collect();
        let t = &self.tokens;
        let mut i = 0;
        while i < t.len() {
            let after_use_or_path = i > 0 && (t[i - 1].text == "::" || t[i - 1].text == "use");
            if is_anchor(&t[i].text) && !after_use_or_path {
                let mut path = vec![t[i].text.clone()];
                let mut j = i + 1;
                while j + 1 < t.len() && t[j].text == "::" && is_ident(&t[j + 1].text) {
                    path.push(t[j + 1].text.clone());
                    j += 2;
                }
                if path.len() > 1 {
                    out.push(Import {
                        path,
                        line: t[i].line,
                    });
                }
                i = j;
            } else {
                i += 1;
            }
        }
        out
    }
}

fn is_anchor(s: &str) -> bool {
    matches!(s, "crate" | "super" | "self")
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The tokens of `text` (identifiers, `::`, single punctuation, string literals), with
/// comments, character literals and numbers left out; each with its line.
fn tokenize(text: &str) -> Vec<Tok> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let push = |out: &mut Vec<Tok>, s: String, line| out.push(Tok { text: s, line });
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' || ((ch == 'r' || ch == 'b') && starts_raw_or_byte_string(&c, i)) {
            let (start, at) = (i, line);
            i = skip_string(&c, i, &mut line);
            let lit: String = c[start..i].iter().collect();
            let body = lit
                .trim_start_matches(['b', 'r', '#'])
                .trim_end_matches('#');
            let body = body
                .strip_prefix('"')
                .and_then(|b| b.strip_suffix('"'))
                .unwrap_or(body);
            push(&mut out, format!("\"{body}"), at);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            push(&mut out, c[start..i].iter().collect(), line);
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                i += 1;
            }
        } else if ch == ':' && next == Some(':') {
            push(&mut out, "::".into(), line);
            i += 2;
        } else {
            push(&mut out, ch.to_string(), line);
            i += 1;
        }
    }
    out
}

/// Whether `c[i..]` starts `r"`, `r#"`, `b"`, `br"` or `br#"` (not an identifier).
fn starts_raw_or_byte_string(c: &[char], i: usize) -> bool {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return false;
    }
    let mut j = i;
    if c[j] == 'b' {
        j += 1;
    }
    if c.get(j) == Some(&'r') {
        j += 1;
        while c.get(j) == Some(&'#') {
            j += 1;
        }
    }
    j > i && c.get(j) == Some(&'"')
}

/// Past the string literal starting at `i` (plain, byte or raw).
fn skip_string(c: &[char], mut i: usize, line: &mut usize) -> usize {
    let mut raw = false;
    while c[i] != '"' {
        raw |= c[i] == 'r';
        i += 1;
    }
    let hashes = if raw {
        let mut h = 0;
        while c[i - 1 - h] == '#' {
            h += 1;
        }
        h
    } else {
        0
    };
    i += 1;
    while i < c.len() {
        match c[i] {
            '\\' if !raw => i += 2,
            '"' if (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) => return i + 1 + hashes,
            ch => {
                *line += usize::from(ch == '\n');
                i += 1;
            }
        }
    }
    i
}

/// The tokens without the items marked `#[cfg(test)]` (a test module, a test-only
/// `use` or function).
fn without_test_items(t: Vec<Tok>) -> Vec<Tok> {
    let is_cfg_test = |i: usize| {
        let want = ["#", "[", "cfg", "(", "test", ")", "]"];
        t.len() >= i + want.len() && want.iter().enumerate().all(|(k, w)| t[i + k].text == *w)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if !is_cfg_test(i) {
            out.push(t[i].clone());
            i += 1;
            continue;
        }
        // The item ends at its first `;` outside braces, or at the brace that closes
        // its first block.
        let mut j = i + 7;
        let mut depth = 0;
        while j < t.len() {
            match t[j].text.as_str() {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ";" if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        i = j + 1;
    }
    out
}

/// A `use` tree's tokens expanded into (name brought in, full path); a glob ends in `*`.
fn use_tree(toks: &[&str]) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    expand(toks, &mut Vec::new(), &mut out);
    out
}

fn expand(toks: &[&str], prefix: &mut Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    let mut i = 0;
    let base = prefix.len();
    while i < toks.len() {
        match toks[i] {
            "{" => {
                // Split the group at top-level commas.
                let mut depth = 0;
                let mut start = i + 1;
                let mut j = i + 1;
                while j < toks.len() {
                    match toks[j] {
                        "{" => depth += 1,
                        "}" if depth == 0 => break,
                        "}" => depth -= 1,
                        "," if depth == 0 => {
                            expand(&toks[start..j], prefix, out);
                            start = j + 1;
                        }
                        _ => {}
                    }
                    j += 1;
                }
                expand(&toks[start..j.min(toks.len())], prefix, out);
                prefix.truncate(base);
                return;
            }
            "::" | "pub" | "(" | ")" => {}
            "as" => {
                if let Some(alias) = toks.get(i + 1) {
                    out.push((alias.to_string(), prefix.clone()));
                }
                prefix.truncate(base);
                return;
            }
            "*" => {
                let mut p = prefix.clone();
                p.push("*".into());
                out.push(("*".into(), p));
                prefix.truncate(base);
                return;
            }
            "self" if !prefix.is_empty() => {}
            s => prefix.push(s.to_string()),
        }
        i += 1;
    }
    if let Some(last) = prefix.last().cloned() {
        out.push((last, prefix.clone()));
    }
    prefix.truncate(base);
}

/// `path` made absolute (crate-relative) from module `from`, or `None` for a path
/// that does not start at `crate`, `super` or `self`.
fn absolute(from: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut at: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => from.to_vec(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        at.pop();
    }
    while rest.first().is_some_and(|s| s == "super") {
        at.pop();
        rest = &rest[1..];
    }
    at.extend(rest.iter().cloned());
    Some(at)
}

/// What each name a module brings in with `use` (its own items' names aside) stands
/// for: (module, name) → absolute path, globs expanded over the items of their module.
pub type Uses = BTreeMap<(Vec<String>, String), Vec<String>>;

/// The `use` declarations of every module, as [`Uses`].
pub fn reexports(sources: &[Source], modules: &BTreeSet<Vec<String>>) -> Uses {
    let items: BTreeMap<&Vec<String>, BTreeSet<String>> =
        sources.iter().map(|s| (&s.module, s.items())).collect();
    let mut out = Uses::new();
    for s in sources {
        for (name, path, _) in s.uses() {
            let Some(abs) = absolute(&s.module, &path) else {
                continue;
            };
            if name == "*" {
                let target = abs[..abs.len() - 1].to_vec();
                if !modules.contains(&target) {
                    continue;
                }
                for item in items.get(&target).into_iter().flatten() {
                    let mut p = target.clone();
                    p.push(item.clone());
                    out.entry((s.module.clone(), item.clone())).or_insert(p);
                }
            } else {
                out.insert((s.module.clone(), name), abs);
            }
        }
    }
    out
}

/// The module `path` (named from module `from`) leads to, following `use`
/// declarations; `None` when it does not start at `crate`, `super` or `self`.
pub fn resolve(
    from: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
    uses: &Uses,
) -> Option<Vec<String>> {
    let mut abs = absolute(from, path)?;
    for _ in 0..16 {
        let known = (0..=abs.len())
            .rev()
            .find(|&n| modules.contains(&abs[..n]))
            .unwrap_or(0);
        let module = abs[..known].to_vec();
        let Some(next) = abs.get(known) else {
            return Some(module);
        };
        match uses.get(&(module.clone(), next.clone())) {
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

/// The strongly connected components of a directed graph, each sorted.
pub fn components(graph: &BTreeMap<&str, BTreeSet<&str>>) -> Vec<Vec<String>> {
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
    let nodes: BTreeSet<&str> = graph
        .iter()
        .flat_map(|(k, v)| std::iter::once(*k).chain(v.iter().copied()))
        .collect();
    let reaches: BTreeMap<&str, BTreeSet<&str>> = nodes.iter().map(|&n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for &n in &nodes {
        if done.contains(n) {
            continue;
        }
        let scc: Vec<String> = nodes
            .iter()
            .filter(|&&m| m == n || (reaches[n].contains(m) && reaches[m].contains(n)))
            .map(|m| m.to_string())
            .collect();
        for m in &scc {
            done.insert(m.clone());
        }
        out.push(scc);
    }
    out.into_iter()
        .map(|mut v| {
            v.sort();
            v
        })
        .collect()
}

#[test]
fn tokens_leave_out_comments_and_test_items_and_keep_literals_whole() {
    let s = Source::parse(
        "use crate::a::{self, b::{C, d as e}, f::*};\n\
         // crate::x::y\n/* crate::z::w */ let s = \"crate::q::r\"; let c = '{';\n\
         let r = r#\"crate::raw\"#; fn g<'a>() { super::h::i(); }\n\
         #[cfg(test)]\nmod tests { use crate::t::u; }\n",
        Path::new("m/n.rs"),
    );
    let imports: Vec<(String, usize)> = s
        .imports()
        .into_iter()
        .map(|i| (i.path.join("::"), i.line))
        .collect();
    assert_eq!(
        imports,
        [
            ("crate::a".to_string(), 1),
            ("crate::a::b::C".into(), 1),
            ("crate::a::b::d".into(), 1),
            ("crate::a::f::*".into(), 1),
            ("super::h::i".into(), 4),
        ]
    );
    assert_eq!(s.module, ["m", "n"]);
    // A string literal is one token, never a path; the test module's are gone.
    let literals: Vec<&str> = s.tokens().iter().filter_map(Tok::literal).collect();
    assert_eq!(literals, ["crate::q::r", "crate::raw"]);
}
