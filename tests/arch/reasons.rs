//! Every reason Tessera can write, and docs/troubleshooting.md names each one.
//!
//! Ticket reasons come from the code itself: `TicketReason::ALL`, which a `match` in
//! tessera-api's unit tests keeps exhaustive. Condition reasons (MountPod, Volume,
//! VolumeAttachment) and Event reasons are string literals and constants at the call
//! sites, so they are read by **scanning the source** (the production modules of the
//! crates tessera-controller, tessera-node and tessera-csi, as syn reads them, their
//! tokens without comments and `#[cfg(test)]` items) for the calls that write them:
//!
//! - Events: `publish`, `publish_action`, `publish_tickets`, `publish_on` (the
//!   argument after the `EventType::…` one, or after a wrapper's `type_`) and `publish_node` (its third argument);
//! - conditions: `cond(type, ok, reason, …)`, `condition(old, type, ok, reason, …)`,
//!   `Report::failed(reason, …)`, `Report::task_done(kind, reason, …)` (the kind is
//!   also the `Ready` reason), `Report::task_failed(failure, kind, reason, …)`, the
//!   `(ok, reason, message)` tuples the Ready builders return and JSON `"reason": …`.
//!
//! An argument in a reason position is read as its CamelCase string literals and its
//! `SCREAMING_CASE` constants (resolved through their `const X: &str = "…"`). An
//! argument that is neither, nor a pass-through (a wrapper's `reason`, `kind` or
//! `failure` parameter, or a ticket reason), fails the test: a new call site the scan cannot
//! read is reported, not skipped. What the scan cannot see is a new function that
//! writes reasons under another name: add it to [`CALLS`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use quote::ToTokens;

use crate::tree;

/// One token: an identifier, `::`, one punctuation character, a delimiter, or a
/// string literal (its text is `"` followed by the literal's value).
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

/// The tokens of `items` as the scan reads them: doc attributes, lifetimes, numbers,
/// character and byte literals left out.
pub fn tokens(items: &[syn::Item]) -> Vec<Tok> {
    let mut out = Vec::new();
    for item in items {
        flatten(item.to_token_stream(), &mut out);
    }
    out
}

fn flatten(ts: TokenStream, out: &mut Vec<Tok>) {
    let push = |out: &mut Vec<Tok>, text: &str, span: proc_macro2::Span| {
        out.push(Tok {
            text: text.to_string(),
            line: span.start().line,
        })
    };
    let toks: Vec<TokenTree> = ts.into_iter().collect();
    let punct =
        |i: usize, c: char| matches!(toks.get(i), Some(TokenTree::Punct(p)) if p.as_char() == c);
    let is_doc = |i: usize| {
        matches!(toks.get(i), Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Bracket
            && matches!(g.stream().into_iter().next(), Some(TokenTree::Ident(d)) if d == "doc"))
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            // `#[doc = "…"]` was a comment; `'a` a lifetime.
            TokenTree::Punct(p) if p.as_char() == '#' && is_doc(i + 1) => i += 1,
            TokenTree::Punct(p) if p.as_char() == '\'' => i += 1,
            TokenTree::Punct(p)
                if p.as_char() == ':' && p.spacing() == Spacing::Joint && punct(i + 1, ':') =>
            {
                push(out, "::", p.span());
                i += 1;
            }
            TokenTree::Punct(p) => push(out, &p.as_char().to_string(), p.span()),
            TokenTree::Ident(id) => push(out, &id.to_string(), id.span()),
            TokenTree::Literal(l) => {
                if let syn::Lit::Str(s) = syn::Lit::new(l.clone()) {
                    push(out, &format!("\"{}", s.value()), l.span());
                }
            }
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::None => ("", ""),
                };
                if !open.is_empty() {
                    push(out, open, g.span_open());
                }
                flatten(g.stream(), out);
                if !close.is_empty() {
                    push(out, close, g.span_close());
                }
            }
        }
        i += 1;
    }
}

/// What writes a reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Ticket,
    Condition,
    Event,
}

/// Where the reason is among a call's arguments.
#[derive(Clone, Copy)]
enum At {
    /// These argument positions.
    Args(&'static [usize]),
    /// The argument after the Event's type (`EventType::…`, or a wrapper's `type_`).
    AfterEventType,
}

/// The functions that write reasons: name, number of arguments (`None`: any), and
/// where the reason is. A call of that name with another number of arguments is
/// another function (`cond(x)`, a watch's predicate), not read.
const CALLS: &[(&str, Option<usize>, Kind, At)] = &[
    ("publish", None, Kind::Event, At::AfterEventType),
    ("publish_action", None, Kind::Event, At::AfterEventType),
    ("publish_tickets", None, Kind::Event, At::AfterEventType),
    ("publish_on", None, Kind::Event, At::AfterEventType),
    ("publish_node", Some(5), Kind::Event, At::Args(&[2])),
    ("cond", Some(4), Kind::Condition, At::Args(&[2])),
    ("condition", Some(7), Kind::Condition, At::Args(&[3])),
    ("failed", Some(2), Kind::Condition, At::Args(&[0])),
    ("task_done", Some(3), Kind::Condition, At::Args(&[0, 1])),
    ("task_failed", Some(4), Kind::Condition, At::Args(&[0, 2])),
];

/// The crates (their roots, below the repository root) whose production code is scanned.
pub const SCANNED: &[&str] = &[
    "crates/tessera-controller/src/lib.rs",
    "crates/tessera-node/src/lib.rs",
    "crates/tessera-csi/src/lib.rs",
];

/// Reasons found, each with where it is written (`file:line`).
pub type Found = BTreeMap<(Kind, String), Vec<String>>;

/// Scan `sources` (each with its path for messages): the reasons found, and the call
/// sites whose reason could not be read.
pub fn scan(sources: &[(PathBuf, Vec<Tok>)]) -> (Found, Vec<String>) {
    let mut c = Collector {
        consts: string_consts(sources),
        found: Found::new(),
        unreadable: Vec::new(),
    };
    for (path, src) in sources {
        let t = src;
        for i in 0..t.len() {
            let at = format!("{}:{}", path.display(), t[i].line);
            // A call `name(…)`: not its definition, not a method of something else.
            if let Some(&(_, arity, kind, pos)) = CALLS.iter().find(|c| c.0 == t[i].text)
                && t.get(i + 1).is_some_and(|n| n.text == "(")
                && !(i > 0 && matches!(t[i - 1].text.as_str(), "fn" | "."))
                && arity.is_none_or(|n| arguments(&t[i + 1..]).len() == n)
            {
                let args = arguments(&t[i + 1..]);
                let positions: Vec<usize> = match pos {
                    At::Args(p) => p.to_vec(),
                    At::AfterEventType => args
                        .iter()
                        .position(|a| {
                            a.first()
                                .is_some_and(|f| f.text == "EventType" || f.text == "type_")
                        })
                        .map(|p| vec![p + 1])
                        .unwrap_or_default(),
                };
                if positions.is_empty() {
                    c.unreadable.push(format!(
                        "{at}: `{}(…)` without an EventType argument",
                        t[i].text
                    ));
                }
                for p in positions {
                    match args.get(p) {
                        Some(arg) => c.note(kind, arg, &at, true),
                        None => c
                            .unreadable
                            .push(format!("{at}: `{}(…)` has no argument {p}", t[i].text)),
                    }
                }
            }
            // `(true|false, REASON, message)`: what the Ready builders return.
            if t[i].text == "("
                && t.get(i + 1)
                    .is_some_and(|b| b.text == "true" || b.text == "false")
                && t.get(i + 2).is_some_and(|c| c.text == ",")
            {
                let args = arguments(&t[i..]);
                if args.len() == 3 {
                    c.note(Kind::Condition, &args[1], &at, false);
                }
            }
            // JSON: `"reason": X`.
            if t[i].literal() == Some("reason") && t.get(i + 1).is_some_and(|c| c.text == ":") {
                let end = (i + 2..t.len())
                    .find(|&j| t[j].text == "," || t[j].text == "}")
                    .unwrap_or(t.len());
                c.note(Kind::Condition, &t[i + 2..end], &at, true);
            }
        }
    }
    (c.found, c.unreadable)
}

struct Collector {
    consts: BTreeMap<String, String>,
    found: Found,
    unreadable: Vec<String>,
}

impl Collector {
    /// Record the reasons of `arg`, written at `at`; one that cannot be read is reported
    /// when `strict` (a call that surely writes a reason) and ignored otherwise.
    fn note(&mut self, kind: Kind, arg: &[Tok], at: &str, strict: bool) {
        match read_reason(arg, &self.consts) {
            Reading::Reasons(rs) => {
                for r in rs {
                    let sites = self.found.entry((kind, r)).or_default();
                    if sites.last().is_none_or(|s| s != at) {
                        sites.push(at.to_string());
                    }
                }
            }
            Reading::PassThrough => {}
            Reading::Unknown if strict => self.unreadable.push(format!(
                "{at}: cannot read the reason from `{}`",
                arg.iter()
                    .map(|t| t.text.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
            Reading::Unknown => {}
        }
    }
}

enum Reading {
    Reasons(Vec<String>),
    PassThrough,
    Unknown,
}

fn is_reason(s: &str) -> bool {
    s.len() > 1
        && s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
        && s.chars().any(|c| c.is_ascii_lowercase())
}

fn is_const_name(s: &str) -> bool {
    s.len() > 1
        && s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

fn read_reason(arg: &[Tok], consts: &BTreeMap<String, String>) -> Reading {
    let mut out = Vec::new();
    for t in arg {
        if let Some(lit) = t.literal() {
            if is_reason(lit) {
                out.push(lit.to_string());
            }
        } else if is_const_name(&t.text) {
            match consts.get(&t.text) {
                Some(v) if is_reason(v) => out.push(v.clone()),
                _ => return Reading::Unknown,
            }
        }
    }
    if !out.is_empty() {
        return Reading::Reasons(out);
    }
    let texts: Vec<&str> = arg.iter().map(|t| t.text.as_str()).collect();
    // A wrapper handing on its parameter, or a ticket's reason (checked on its own).
    if matches!(
        texts.as_slice(),
        ["reason"] | ["kind"] | ["failure"] | ["&", "reason"]
    ) || texts.contains(&"TicketReason")
        || texts.windows(2).any(|w| w == [".", "reason"])
    {
        return Reading::PassThrough;
    }
    Reading::Unknown
}

/// The arguments of the call whose `(` is `t[0]`, split on top-level commas.
fn arguments(t: &[Tok]) -> Vec<Vec<Tok>> {
    let mut args = vec![Vec::new()];
    let mut depth = 0;
    for tok in t {
        match tok.text.as_str() {
            "(" | "[" | "{" => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            "," if depth == 1 => {
                args.push(Vec::new());
                continue;
            }
            _ => {}
        }
        args.last_mut().unwrap().push(tok.clone());
    }
    if args.last().is_some_and(Vec::is_empty) {
        args.pop();
    }
    args
}

/// `const NAME: &str = "value";` anywhere in the sources.
fn string_consts(sources: &[(PathBuf, Vec<Tok>)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (_, s) in sources {
        for w in s.windows(7) {
            let texts: Vec<&str> = w.iter().map(|t| t.text.as_str()).collect();
            if texts[0] == "const"
                && texts[2..6] == [":", "&", "str", "="]
                && let Some(v) = w[6].literal()
            {
                out.insert(texts[1].to_string(), v.to_string());
            }
        }
    }
    out
}

/// The production sources of the crates whose roots are `roots`, each file with its
/// path from the repository root.
pub fn read_sources(root: &Path, roots: &[&str]) -> Vec<(PathBuf, Vec<Tok>)> {
    let read = tree::on_disk(root);
    let mut out = Vec::new();
    for r in roots {
        let krate = tree::read_crate(Path::new(r), &read).unwrap_or_else(|e| panic!("{e}"));
        for m in krate.modules.into_iter().filter(|m| !m.inline) {
            out.push((m.file, tokens(&m.items)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Every reason: the ticket reasons from `TicketReason::ALL`, the rest scanned.
pub fn all_reasons(root: &Path) -> (Found, Vec<String>) {
    let (mut found, unreadable) = scan(&read_sources(root, SCANNED));
    for r in tessera_api::TicketReason::ALL {
        found
            .entry((Kind::Ticket, r.as_str().to_string()))
            .or_default()
            .push("crates/tessera-api/src/attachment.rs (TicketReason)".into());
    }
    (found, unreadable)
}

/// The reasons `doc` does not name (as `` `Reason` ``), with where each is written.
pub fn undocumented(found: &Found, doc: &str) -> Vec<String> {
    let mut missing = BTreeSet::new();
    for ((kind, reason), at) in found {
        if !doc.contains(&format!("`{reason}`")) {
            missing.insert(format!(
                "{kind:?} reason `{reason}` (written at {})",
                at.join(", ")
            ));
        }
    }
    missing.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(rel: &str, text: &str) -> (PathBuf, Vec<Tok>) {
        (
            PathBuf::from(rel),
            tokens(&tree::parse(text).unwrap().items),
        )
    }

    /// The scan on made-up sources: each way of writing a reason is found, a wrapper's
    /// pass-through is not a reason, and a reason it cannot read is reported.
    #[test]
    fn the_scan_reads_each_way_of_writing_a_reason() {
        let sources = vec![src(
            "a.rs",
            r#"
const GONE: &str = "AlreadyGone";
fn publish(ctx: &C, v: &V, type_: EventType, reason: &str, note: &str) {
    publish_on(ctx, v, type_, reason, note);
}
async fn f() {
    publish(ctx, v, EventType::Warning, "Planted", &format!("x {y}")).await;
    publish(
        ctx,
        v,
        EventType::Normal,
        GONE,
        "note",
    ).await;
    publish_node(ctx, v, "OnNode", node, "note");
    let r = Report::failed("FailedThing", msg);
    let d = Report::task_done("KindDone", "DoneReason", msg);
    let c = cond("Attached", ok, if ok { "Up" } else { "Down" }, format!("Mixed {x}"));
    let j = json!({"type": "Faulted", "reason": GONE, "message": m});
    let t = (false, "FromTuple", m);
    let not_a_reason = (true, vec![1, 2], m);
    x.publish(&ev, &object); // a method of something else
    if cond(Some(&o)) {} // another function of the same name
    publish(ctx, v, EventType::Normal, make_reason(), "n");
}
#[cfg(test)]
mod tests { fn t() { publish(ctx, v, EventType::Normal, "OnlyInTests", "n"); } }
"#,
        )];
        let (found, unreadable) = scan(&sources);
        let names: BTreeSet<(Kind, &str)> = found.keys().map(|(k, r)| (*k, r.as_str())).collect();
        let want: BTreeSet<(Kind, &str)> = [
            (Kind::Event, "Planted"),
            (Kind::Event, "AlreadyGone"),
            (Kind::Event, "OnNode"),
            (Kind::Condition, "FailedThing"),
            (Kind::Condition, "KindDone"),
            (Kind::Condition, "DoneReason"),
            (Kind::Condition, "Up"),
            (Kind::Condition, "Down"),
            (Kind::Condition, "AlreadyGone"),
            (Kind::Condition, "FromTuple"),
        ]
        .into_iter()
        .collect();
        assert_eq!(names, want);
        assert_eq!(found[&(Kind::Event, "Planted".into())], ["a.rs:7"]);
        assert_eq!(unreadable.len(), 1, "{unreadable:?}");
        assert!(unreadable[0].contains("make_reason"), "{unreadable:?}");

        let doc = "| `Planted` | … |\n`AlreadyGone`, OnNode (not in backticks)";
        let missing = undocumented(&found, doc);
        assert!(
            missing
                .iter()
                .any(|m| m.starts_with("Event reason `OnNode`")),
            "{missing:?}"
        );
        assert!(
            !missing.iter().any(|m| m.contains("`Planted`")),
            "{missing:?}"
        );
    }
}
