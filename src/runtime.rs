//! What every long-running role shares: how errors are printed in logs.
//!
//! The role runtime (CSI serving, metrics, signals, tracing) grows here, so that
//! `controller` and `node` each only wire their own parts.

/// An error and its sources, `outer: inner: innermost`, for one log line: printed
/// once, where the error is handled.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        // Some errors (kube's API errors) already print their source in their own
        // message: say it once.
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {0}")]
    struct Outer(&'static str, #[source] std::io::Error);

    #[test]
    fn chain_names_every_cause_once() {
        let e = Outer("x", std::io::Error::other("denied"));
        assert_eq!(error_chain(&e), "reading x: denied");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("request failed: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn a_source_already_in_the_message_is_not_repeated() {
        let e = Outer(
            "x",
            std::io::Error::other(Repeats(std::io::Error::other("denied"))),
        );
        assert_eq!(error_chain(&e), "reading x: request failed: denied");
    }
}
