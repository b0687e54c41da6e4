//! The SQLite workload of the lock tests, one definition for both places it runs: two
//! host-level views of one directory (`tests/fuse/locks.rs`, bind mounts as the
//! comparator, then two `tessera mount`s) and two Pods on two real nodes
//! (`tests/pods/locks.rs`). Each writer runs [`script`] with `sh -c` (the host's sh or
//! the Pod's busybox sh): the sqlite3 CLI, `n` transactions of one `INSERT` each
//! against one database file, waiting for the other writer's locks (`.timeout`,
//! `BEGIN IMMEDIATE` so the wait is SQLite's busy handler and never a refused upgrade).
//! Afterwards [`check`] reads the file from the host and must print [`expected`].

#![allow(dead_code)] // each test binary uses a different part

use std::path::Path;
use std::process::Command;

/// Transactions per writer.
pub const TRANSACTIONS: u32 = 1_000;

/// The shell script one writer (`who`: a lowercase word) runs against `db`. Exits
/// non-zero on the first failed statement (`-bail`), a lock wait over 60 s included.
pub fn script(db: &str, who: &str, n: u32) -> String {
    format!(
        "{{ echo '.timeout 60000'; \
           echo 'CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, who TEXT NOT NULL, i INTEGER NOT NULL);'; \
           i=0; while [ $i -lt {n} ]; do \
             echo \"BEGIN IMMEDIATE; INSERT INTO t(who, i) VALUES ('{who}', $i); COMMIT;\"; \
             i=$((i+1)); \
           done; }} | sqlite3 -bail '{db}'"
    )
}

/// What [`check`] prints when every writer of `whos` committed its `n` rows and the
/// file is sound.
pub fn expected(whos: &[&str], n: u32) -> String {
    let mut out = String::from("ok\n");
    for who in whos {
        out.push_str(&format!("{who}|{n}|{n}\n"));
    }
    out
}

/// `PRAGMA integrity_check`, then per writer its row count and distinct `i`s, read
/// with the host's sqlite3 from `db` (the backend's file, once the writers are done).
pub fn check(db: &Path) -> String {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg(
            "PRAGMA integrity_check; \
             SELECT who, count(*), count(DISTINCT i) FROM t GROUP BY who ORDER BY who;",
        )
        .output()
        .expect("running sqlite3 (Debian's sqlite3 package: .ci/install-deps.sh)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
