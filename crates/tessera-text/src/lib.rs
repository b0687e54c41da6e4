//! Plain values that Tessera reads from people and shows back to them, shared by every
//! crate of the workspace and depending on none: Kubernetes quantities of bytes
//! ([`quantity`]), durations on the command line ([`duration`]) and the bounded echo
//! of what a caller sent ([`truncated`]).
//!
//! | module | owns |
//! |---|---|
//! | [`quantity`] | Kubernetes quantities of bytes, parsed and written back |
//! | [`duration`] | durations: one grammar for every flag, parameter and argument |
//! | this one | [`truncated`], the bounded echo |

pub mod duration;
pub mod quantity;

use std::borrow::Cow;

/// `s` cut to at most `max` characters (an ellipsis marks the cut), for error messages
/// that echo what a caller sent.
pub fn truncated(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some((end, _)) => Cow::Owned(format!("{}…", &s[..end])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_short_strings_and_cuts_at_a_character() {
        for (s, max, want) in [
            ("pvc-1", 128, "pvc-1"),
            ("abcdef", 6, "abcdef"),
            ("abcdef", 3, "abc…"),
            ("ééé", 2, "éé…"),
            ("", 0, ""),
        ] {
            assert_eq!(truncated(s, max), want, "{s:?} at {max}");
        }
    }
}
