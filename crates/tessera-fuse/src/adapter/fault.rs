//! A test-only fault point: `TESSERA_FAULT_EXIT_AFTER_WRITE=<n>` in the daemon's
//! environment makes it exit at once (`_exit(9)`, like a `kill -9`) after applying
//! its n-th WRITE and before answering it: the one case a successor must not apply
//! again (tests/fuse/handoff.rs). Read once, at the first write; unset (always, in
//! production) it costs one relaxed load per write. Never set it on a real mount.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable; test only.
pub const EXIT_AFTER_WRITE: &str = "TESSERA_FAULT_EXIT_AFTER_WRITE";

static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
static WRITES: AtomicU64 = AtomicU64::new(0);

/// Say so in the log when a fault point is armed (at the daemon's start).
pub fn warn_if_armed() {
    if let Ok(v) = std::env::var(EXIT_AFTER_WRITE) {
        tracing::warn!(
            env = EXIT_AFTER_WRITE,
            value = %v,
            "test-only fault point armed: the daemon exits after that many writes"
        );
    }
}

/// A WRITE was applied and is about to be answered.
pub fn after_write() {
    let limit = LIMIT.get_or_init(|| {
        std::env::var(EXIT_AFTER_WRITE)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&n| n > 0)
    });
    if let Some(n) = limit
        && WRITES.fetch_add(1, Ordering::Relaxed) + 1 == *n
    {
        // SAFETY: _exit ends the process at once; nothing of ours runs after it.
        unsafe { libc::_exit(9) };
    }
}
