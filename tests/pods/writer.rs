//! The application of the "mounts outlive Tessera" cases (issue 14): a Pod that holds
//! one file open on a Tessera volume and writes a record every 50 ms through that
//! same descriptor, checking each write; and the checker of what it left behind. Each
//! case (agent rollout restart; later the daemon's `kill -9`, an image upgrade)
//! starts the app, disturbs Tessera, stops the app and checks.
//!
//! ```text
//!  app (busybox sh):  exec 3>>/data/records
//!    loop: read uptime → t0; /data/stop there? (written into the backend by the test)
//!          → end; echo "<seq> <t0>" >&3 || exit 3; sync -d /data/records || exit 3;
//!          read uptime → t1; echo "ok <seq> <t0> <t1>" (stdout, the container log);
//!          usleep 50000
//!    end: sha256sum of /data/records through the mount → /data/records.sha256;
//!          count → /data/records.count; exit 0
//!  checker: records in the backend = 0..n-1 in order, n = the app's count, the
//!           backend file's sha256 = the app's; the stall = the longest turn: t1 − t0,
//!           or t0 to the next t0 less the 50 ms sleep
//! ```
//!
//! Every access to the mount of one turn is between `t0` and `t1`, and each turn
//! needs the daemon: the write itself may not (with kernel passthrough it goes to the
//! backing file without the daemon), but the `sync` opens the file by its path, a
//! FUSE OPEN that waits while no daemon serves. A wait can also land between turns:
//! a child the shell forks (`usleep`) inherits descriptor 3, and its exit closes it,
//! which on a mount that sends FLUSH waits for the daemon too. So the stall of a turn
//! is `t1 − t0`, or from its `t0` to the next one less the 50 ms sleep, whichever is
//! longer: the longest is the stall an application that needs the daemon sees (before,
//! only `t1 − t0` of an unsynced write counted, and the figure stayed 0–20 ms).
//!
//! The Pod's restartPolicy is Never: any failed write ends it (phase Failed), and a
//! restart of its container could not hide one.

use sha2::{Digest, Sha256};

use super::*;

/// The record file, the stop marker and the app's closing files, on the volume.
pub const RECORDS: &str = "records";
/// Written into the backend by the test to end the app.
pub const STOP: &str = "stop";
/// The app's sleep between turns, seconds (`usleep 50000`).
const SLEEP: f64 = 0.05;

/// The app's script (busybox sh). Times are `/proc/uptime` (10 ms resolution), read
/// with the shell's own `read`.
pub fn script() -> String {
    format!(
        "exec 3>>/data/{RECORDS} || exit 2
i=0
while :; do
  read t0 idle < /proc/uptime
  [ -f /data/{STOP} ] && break
  echo \"$i $t0\" >&3 || {{ echo \"write $i failed\"; exit 3; }}
  sync -d /data/{RECORDS} || {{ echo \"sync $i failed\"; exit 3; }}
  read t1 idle < /proc/uptime
  echo \"ok $i $t0 $t1\"
  i=$((i+1))
  usleep 50000
done
sha256sum /data/{RECORDS} > /data/{RECORDS}.sha256 || exit 4
echo $i > /data/{RECORDS}.count || exit 5
echo \"done $i\""
    )
}

/// Start the app as Pod `name` on `node` with `claim` at /data.
pub async fn start(client: &Client, ns: &str, name: &str, node: &str, claim: &str) {
    pod(client, ns, name, node, claim, &script()).await;
    wait_phase(client, ns, name, "Running").await;
}

/// How many records the backend holds so far.
pub fn records_so_far(data: &Path) -> usize {
    std::fs::read_to_string(data.join(RECORDS))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Wait until the app wrote `n` more records than now (it is writing).
pub async fn wait_records(data: &Path, more: usize) -> usize {
    let from = records_so_far(data);
    eventually(WAIT, &format!("{more} more records"), || async {
        let now = records_so_far(data);
        (now >= from + more).then_some(now)
    })
    .await
}

/// Fail the test at once if the app failed (a write was refused: the mount was
/// lost), with the last lines of its log; `when` says during what.
pub async fn fail_if_failed(client: &Client, ns: &str, name: &str, when: &str) {
    if pod_phase(client, ns, name).await.as_deref() == Some("Failed") {
        let logs = Api::<Pod>::namespaced(client.clone(), ns)
            .logs(name, &Default::default())
            .await
            .unwrap_or_default();
        let tail: Vec<&str> = logs.lines().rev().take(3).collect();
        panic!("the app failed {when}: {tail:?}");
    }
}

/// The app's container: still running, never restarted, never terminated.
pub async fn assert_undisturbed(client: &Client, ns: &str, name: &str) {
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let status = pod.status.unwrap_or_default();
    let c = &status.container_statuses.unwrap_or_default()[0];
    assert_eq!(c.restart_count, 0, "the app's container restarted: {c:#?}");
    assert!(
        c.state.as_ref().is_some_and(|s| s.running.is_some()),
        "the app's container is not running: {c:#?}"
    );
}

/// What the checker found.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// Records written (and found, in order).
    pub records: usize,
    /// The longest stall of one turn (a write, its sync, and anything else until the
    /// next turn beyond the 50 ms sleep), seconds (10 ms resolution).
    pub longest_write: f64,
    /// The record it was.
    pub longest_at: usize,
}

/// Stop the app, wait for it to succeed, and check the backend's records against its
/// log and its closing files.
pub async fn stop_and_check(client: &Client, ns: &str, name: &str, data: &Path) -> Checked {
    std::fs::write(data.join(STOP), b"").unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(WAIT, "the app done", || async {
        let phase = pod_phase(client, ns, name).await;
        if phase.as_deref() == Some("Failed") {
            let logs = api
                .logs(name, &Default::default())
                .await
                .unwrap_or_default();
            let tail: Vec<&str> = logs.lines().rev().take(5).collect();
            panic!("the app failed: {tail:?}");
        }
        (phase.as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    let logs = api.logs(name, &Default::default()).await.unwrap();
    let records = std::fs::read(data.join(RECORDS)).unwrap();
    let count = std::fs::read_to_string(data.join(format!("{RECORDS}.count"))).unwrap();
    let sha = std::fs::read_to_string(data.join(format!("{RECORDS}.sha256"))).unwrap();
    check(&records, &count, &sha, &logs).unwrap_or_else(|e| panic!("records: {e}"))
}

/// The checker, pure: `records` (the backend file) holds `0 t`, `1 t`, … in order,
/// as many as `count` says; `sha` (the app's `sha256sum` through the mount) is the
/// backend file's; `logs` (the app's stdout) has an `ok` line per record.
pub fn check(records: &[u8], count: &str, sha: &str, logs: &str) -> Result<Checked, String> {
    let n: usize = count
        .trim()
        .parse()
        .map_err(|_| format!("count {count:?}"))?;
    let text = std::str::from_utf8(records).map_err(|e| e.to_string())?;
    let mut seen = 0;
    for (i, line) in text.lines().enumerate() {
        let mut f = line.split(' ');
        let seq = f.next().and_then(|s| s.parse::<usize>().ok());
        let t = f.next().and_then(|s| s.parse::<f64>().ok());
        if seq != Some(i) || t.is_none() || f.next().is_some() {
            return Err(format!("record {i} is {line:?}"));
        }
        seen += 1;
    }
    if seen != n || !text.ends_with('\n') && n > 0 {
        return Err(format!("{seen} records in the backend, the app wrote {n}"));
    }
    let want = format!("{:x}", Sha256::digest(records));
    let got = sha.split_whitespace().next().unwrap_or("");
    if got != want {
        return Err(format!(
            "sha256 through the mount {got}, in the backend {want}"
        ));
    }
    let mut longest = (0.0f64, 0usize);
    let mut turn = |stall: f64, seq: usize| {
        if stall > longest.0 {
            longest = (stall, seq);
        }
    };
    let mut previous: Option<(usize, f64)> = None;
    let mut oks = 0;
    for line in logs.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() == 4 && f[0] == "ok" {
            let (Ok(seq), Ok(t0), Ok(t1)) = (
                f[1].parse::<usize>(),
                f[2].parse::<f64>(),
                f[3].parse::<f64>(),
            ) else {
                return Err(format!("log line {line:?}"));
            };
            oks += 1;
            turn(t1 - t0, seq);
            if let Some((before, t)) = previous {
                turn(t0 - t - SLEEP, before);
            }
            previous = Some((seq, t0));
        }
    }
    if oks != n {
        return Err(format!("{oks} writes logged, {n} records"));
    }
    Ok(Checked {
        records: n,
        longest_write: longest.0,
        longest_at: longest.1,
    })
}

/// The checker finds what it must (it runs without nodes).
#[test]
fn the_checker_finds_gaps_reorders_and_torn_records() {
    let good = b"0 1.00\n1 1.06\n2 1.20\n";
    let sha = |b: &[u8]| format!("{:x}  /data/records\n", Sha256::digest(b));
    let logs = "ok 0 1.00 1.01\nok 1 1.06 1.16\nok 2 1.20 1.20\ndone 3\n";
    let c = check(good, "3\n", &sha(good), logs).unwrap();
    assert_eq!(c.records, 3);
    assert_eq!(c.longest_at, 1);
    assert!((c.longest_write - 0.10).abs() < 1e-9);
    // A wait between two turns (a forked child's close waiting for the daemon).
    let between = "ok 0 1.00 1.01\nok 1 2.50 2.50\nok 2 2.56 2.56\n";
    let c = check(good, "3\n", &sha(good), between).unwrap();
    assert_eq!(c.longest_at, 0);
    assert!((c.longest_write - 1.45).abs() < 1e-9, "{c:?}");
    let bad: [(&[u8], &str); 5] = [
        (b"0 1.00\n2 1.20\n", "3\n"),                // a record lost
        (b"1 1.06\n0 1.00\n2 1.20\n", "3\n"),        // out of order
        (b"0 1.00\n1 1.0", "2\n"),                   // torn
        (b"0 1.00\n1 1.06\n", "3\n"),                // fewer than written
        (b"0 1.00\n1 1.06\n2 1.20\n3 1.3\n", "3\n"), // more than written
    ];
    for (records, count) in bad {
        assert!(
            check(records, count, &sha(records), logs).is_err(),
            "{:?}",
            String::from_utf8_lossy(records)
        );
    }
    assert!(check(good, "3", &sha(b"other"), logs).is_err(), "checksum");
    assert!(
        check(good, "3", &sha(good), "ok 0 1 1\n").is_err(),
        "writes logged"
    );
}
