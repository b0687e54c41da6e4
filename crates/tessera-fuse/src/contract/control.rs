//! How the node agent steers a running daemon: the signals it sends and what each
//! means to `tessera mount`, and the capacity file it writes for a SIGHUP to pick up.
//!
//! ```text
//!  agent: write <volume>.capacity (capacity_text) ─▶ RELOAD ─▶ daemon: parse_capacity,
//!                                                              settings file re-read
//!  agent: LEAVE ─▶ daemon exits, the mount stays (the fd holder keeps the connection)
//!  agent: LEAVE_ON_STOP ─▶ the next SIGTERM leaves the mount too (a mount Pod deleted
//!                          for an upgrade: the kubelet's SIGTERM must not unmount)
//!  agent: SIGTERM ─▶ unmount (lazily if busy), serve the grace, exit
//! ```

use nix::sys::signal::Signal;

/// Re-read the capacity file and the settings file.
pub const RELOAD: Signal = Signal::SIGHUP;
/// Exit without unmounting: a successor takes the held connection over.
pub const LEAVE: Signal = Signal::SIGUSR1;
/// Make the next stop signal leave the mount as [`LEAVE`] does.
pub const LEAVE_ON_STOP: Signal = Signal::SIGUSR2;

/// The text of a capacity file: the byte count in decimal, and a newline.
pub fn capacity_text(bytes: u64) -> String {
    format!("{bytes}\n")
}

/// The byte count a capacity file holds (surrounding whitespace ignored), if any.
pub fn parse_capacity(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capacity_written_reads_back() {
        for bytes in [0, 1, 10 << 30, u64::MAX] {
            assert_eq!(parse_capacity(&capacity_text(bytes)), Some(bytes));
        }
        assert_eq!(parse_capacity(" 42 \n"), Some(42));
        assert_eq!(parse_capacity("10Gi"), None, "bytes only, no quantity");
        assert_eq!(parse_capacity(""), None);
    }
}
