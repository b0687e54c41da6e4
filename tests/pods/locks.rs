//! Locks across two real nodes: two Pods of one ReadWriteMany volume, on node A and
//! node B, each served by its node's own `tessera mount` of the shared backend (the
//! harness's nodes each mount one GlusterFS volume with a client of their own; the
//! MountPods say `sharedBackend` and the daemons run with `--shared-backend`).
//!
//! ```text
//!  A: flock -x lock ──held──────────────▶ released      B: flock -n lock ─▶ refused (75)
//!                                                         flock -x lock ─▶ granted only after
//!  A: flock -x lock2 (a holder) ──held──▶ kill -9         B: flock -x lock2 ─▶ granted only after
//!  A: BEGIN EXCLUSIVE (fcntl locks) ──held──▶ COMMIT      B: BEGIN IMMEDIATE ─▶ database is locked
//!                                                         .timeout + BEGIN IMMEDIATE ─▶ sees A's row
//!  A and B: 1,000 SQLite transactions each into one file ─▶ integrity ok, 2,000 rows
//! ```
//!
//! The Pods run the tools image (busybox, sqlite3, util-linux's flock: busybox has no
//! flock applet) and step together through marker files on the volume; B writes what
//! it saw to `b.out`. There is no command-line tool for a bare `fcntl` lock in the
//! image, so the fcntl part goes through SQLite, whose locks are fcntl locks; the
//! blocking `F_SETLKW` itself is checked through two mounts in `tests/fuse/locks.rs`.
//! The SQLite workload and its check are `support::sqlite`'s, which
//! `tests/fuse/locks.rs` runs through two bind mounts of one directory as the
//! comparator.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use tessera_api::{self as api, MountPod};

use super::*;
use crate::support::sqlite;

/// busybox + sqlite3 + flock (tests/harness/images.sh build).
const TOOLS: &str = "harness.tessera.io/tools:1";

/// Waits for a marker file on the volume.
const WAIT_FOR: &str = "w() { until [ -f \"/data/$1\" ]; do sleep 0.05; done; }";

/// Node A's side: holds a flock, then an exclusive SQLite transaction, each until B
/// has tried it.
fn script_a() -> String {
    format!(
        "set -e; {WAIT_FOR}; w go
flock -x /data/lock -c 'touch /data/a-holds-flock; \
  until [ -f /data/b-waits-flock ]; do sleep 0.05; done; sleep 1; touch /data/a-releases-flock'
flock -o -x /data/lock2 sh -c 'touch /data/a-holds-lock2; exec sleep 3600' & h=$!
w b-waits-kill; sleep 1; touch /data/a-kills-holder; kill -9 $h
{{ echo 'CREATE TABLE IF NOT EXISTS k(x); BEGIN EXCLUSIVE; INSERT INTO k VALUES (1);'
  echo '.shell touch /data/a-holds-db'
  w b-tried-db; sleep 1
  echo 'COMMIT;'; }} | sqlite3 -bail /data/locks.db
touch /data/a-ready-sql; w b-ready-sql
{}",
        sqlite::script("/data/sql.db", "a", sqlite::TRANSACTIONS)
    )
}

/// Node B's side: tries each of A's locks while A holds it, then waits for it.
fn script_b() -> String {
    format!(
        "set -e; {WAIT_FOR}
say() {{ echo \"$*\" >> /data/b.out; }}
w a-holds-flock
rc=0; flock -n -E 75 /data/lock true || rc=$?
[ $rc = 75 ] || {{ say \"flock -n while A holds: exit $rc, not 75 (conflict)\"; exit 1; }}
say 'flock -n refused while A holds'
touch /data/b-waits-flock
flock -x -w 60 /data/lock -c '[ -f /data/a-releases-flock ]' ||
  {{ say 'flock -x granted before A released, or not within 60 s'; exit 1; }}
say \"flock -x waited for A's release\"
w a-holds-lock2
rc=0; flock -n -E 75 /data/lock2 true || rc=$?
[ $rc = 75 ] || {{ say \"flock -n while A's holder lives: exit $rc, not 75\"; exit 1; }}
touch /data/b-waits-kill
flock -x -w 60 /data/lock2 -c '[ -f /data/a-kills-holder ]' ||
  {{ say 'flock -x granted before A killed its holder, or not within 60 s'; exit 1; }}
say \"flock -x granted once A's holder was killed\"
w a-holds-db
rc=0; out=$(sqlite3 /data/locks.db 'BEGIN IMMEDIATE;' 2>&1) || rc=$?
case \"$rc $out\" in
  0*) say 'sqlite BEGIN IMMEDIATE granted while A holds'; exit 1 ;;
  *'database is locked'*) say 'sqlite refused while A holds: database is locked' ;;
  *) say \"sqlite: $out\"; exit 1 ;;
esac
touch /data/b-tried-db
n=$(printf '.timeout 60000\\nBEGIN IMMEDIATE;\\nSELECT count(*) FROM k;\\nCOMMIT;\\n' | sqlite3 -bail /data/locks.db)
say \"sqlite waited for A's commit: rows $n\"
touch /data/b-ready-sql; w a-ready-sql
{}",
        sqlite::script("/data/sql.db", "b", sqlite::TRANSACTIONS)
    )
}

/// What B saw when every lock crossed the nodes.
const B_SAW: &str = "flock -n refused while A holds
flock -x waited for A's release
flock -x granted once A's holder was killed
sqlite refused while A holds: database is locked
sqlite waited for A's commit: rows 1
";

/// A non-blocking exclusive flock of `path` through the host's client of the backend,
/// released at once: whether the backend holds a lock on it.
fn third_client_flock(path: &Path) -> String {
    use std::os::fd::AsRawFd;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("cannot open {}: {e}", path.display()),
    };
    // SAFETY: flock on a descriptor we own; closing the file releases it.
    match unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } {
        0 => "it grants the flock: A's lock is not on the backend".into(),
        _ => format!(
            "it refuses the flock ({}): A's lock is on the backend, B's grant was B's side",
            std::io::Error::last_os_error()
        ),
    }
}

fn locks_condition(mp: &MountPod) -> Option<&Condition> {
    mp.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Locks")
}

/// How long the two Pods may take from `go` to both done: 74-85 s in CI runs (2 x
/// 1,000 SQLite transactions over GlusterFS make most of it). Not a timed test: the
/// bound is for a Pod stuck for good, so it leaves room for a slow machine (the
/// 120 s of WAIT did not, in CI).
const LOCKS_BOUND: Duration = Duration::from_secs(420);

/// Wait until both Pods have ended, or one has failed (the other may then wait for
/// it forever); their phases. Past [`LOCKS_BOUND`], the phases and how far each side
/// got (the marker files on the volume, B's report).
async fn ended(client: &Client, ns: &str, data: &Path) -> (String, String) {
    let deadline = Instant::now() + LOCKS_BOUND;
    loop {
        let a = pod_phase(client, ns, "on-a").await.unwrap_or_default();
        let b = pod_phase(client, ns, "on-b").await.unwrap_or_default();
        let done = |p: &str| p == "Succeeded" || p == "Failed";
        if (done(&a) && done(&b)) || a == "Failed" || b == "Failed" {
            return (a, b);
        }
        if Instant::now() >= deadline {
            let mut markers: Vec<String> = std::fs::read_dir(data)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            markers.sort();
            panic!(
                "Pods on-a {a:?} and on-b {b:?} not done within {LOCKS_BOUND:?}; on the volume: {markers:?}; B saw:\n{}",
                std::fs::read_to_string(data.join("b.out")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
#[ignore = "needs real nodes with Tessera deployed (tests/run.sh: make cluster-up deploy, then --ignored)"]
async fn flock_fcntl_and_sqlite_cross_nodes_on_an_rwx_volume() {
    let client = support::client().await;
    let Claimed {
        nodes,
        ns,
        pv,
        volume,
        data,
    } = claimed(&client, "pods-locks", "shared", "ReadWriteMany").await;
    let names = nodes.names();
    assert!(names.len() >= 2, "two nodes needed: {names:?}");
    let (a, b) = (&names[0], &names[1]);

    pod_of(&client, &ns, "on-a", a, "shared", TOOLS, &script_a()).await;
    pod_of(&client, &ns, "on-b", b, "shared", TOOLS, &script_b()).await;
    wait_phase(&client, &ns, "on-a", "Running").await;
    wait_phase(&client, &ns, "on-b", "Running").await;

    // Both mounts treat the backend as shared and hold the locks on it.
    let mountpods: Api<MountPod> = Api::all(client.clone());
    for node in [a, b] {
        let name = api::mountpod_name(&volume.name_any(), node);
        let mp = eventually(WAIT, &format!("MountPod {name}: Locks True"), || async {
            mountpods
                .get(&name)
                .await
                .ok()
                .filter(|mp| locks_condition(mp).is_some_and(|c| c.status == "True"))
        })
        .await;
        assert!(mp.spec.shared_backend, "MountPod {name}: sharedBackend");
        assert_eq!(
            locks_condition(&mp).map(|c| c.reason.as_str()),
            Some("HeldByBackend")
        );
    }

    let start = Instant::now();
    std::fs::write(data.join("go"), b"").unwrap();
    let phases = ended(&client, &ns, &data).await;
    let took = start.elapsed();
    let b_saw = std::fs::read_to_string(data.join("b.out")).unwrap_or_default();
    // B got A's flock (seen once in CI over GlusterFS, not reproduced since): A still
    // holds it as far as A knows, so whether a third client of the backend (the
    // host's) can take it now says which side went wrong.
    let b_saw = if b_saw.contains("flock -n while A holds: exit 0") {
        format!(
            "{b_saw}(the backend, asked by the host's own client now: {})\n",
            third_client_flock(&data.join("lock"))
        )
    } else {
        b_saw
    };
    assert_eq!(
        phases,
        ("Succeeded".to_string(), "Succeeded".to_string()),
        "Pods on {a} and {b}; B saw:\n{b_saw}"
    );
    assert_eq!(b_saw, B_SAW);
    assert_eq!(
        sqlite::check(&data.join("sql.db")),
        sqlite::expected(&["a", "b"], sqlite::TRANSACTIONS)
    );

    delete_pod(&client, &ns, "on-a").await;
    delete_pod(&client, &ns, "on-b").await;
    eventually(
        DETACH_BOUND,
        "both storage VolumeAttachments gone",
        || async { attachments(&client, &pv).await.is_empty().then_some(()) },
    )
    .await;
    delete_claim(&client, &ns, "shared", &pv, &volume.name_any(), &data).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "REAL NODES locks: flock and fcntl (SQLite) locks crossed {a} and {b}, a killed holder's lock went with it; \
         2 x {} SQLite transactions, integrity ok, every row; {:.1} s from go to both done",
        sqlite::TRANSACTIONS,
        took.as_secs_f64()
    );
}
