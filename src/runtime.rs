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
        s.push_str(": ");
        s.push_str(&c.to_string());
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
}
