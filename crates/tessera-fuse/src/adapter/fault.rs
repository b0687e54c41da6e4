//! A test-only fault point: `TESSERA_FAULT_EXIT_AFTER_WRITE=<n>` in the daemon's
//! environment makes it exit at once (`_exit(9)`, like a `kill -9`) after applying
//! its n-th WRITE and before answering it: the one case a successor must not apply
//! again (tests/fuse/handoff.rs). Read once, at the first write; unset (always, in
//! production) it costs one relaxed load per write. Never set it on a real mount.
//!
//! `TESSERA_FAULT_HOLD_START=<path>`: the daemon waits while that file exists before
//! it looks for its connection, as a mount Pod that is slow to start, or never
//! comes, would (the agent's mount exists meanwhile: tests/node/agent_mount.rs).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable; test only.
pub const EXIT_AFTER_WRITE: &str = "TESSERA_FAULT_EXIT_AFTER_WRITE";

static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
static WRITES: AtomicU64 = AtomicU64::new(0);

/// The environment variable of a held start; test only.
pub const HOLD_START: &str = "TESSERA_FAULT_HOLD_START";

/// Wait while the file [`HOLD_START`] names exists, if it is set.
pub fn late_start() {
    if let Some(path) = std::env::var_os(HOLD_START) {
        let path = std::path::PathBuf::from(path);
        tracing::warn!(env = HOLD_START, path = %path.display(), "test-only fault point: starting once that file is gone");
        while path.exists() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

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
