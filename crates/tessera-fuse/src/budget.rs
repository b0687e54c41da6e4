//! The daemon's memory budget: its cgroup's memory limit, read at start, and what the
//! daemon sizes to it.
//!
//! ```text
//!  /proc/self/cgroup ─▶ own cgroup path ─┬─ v1: memory/<path>/memory.stat hierarchical_memory_limit
//!                                        │      (and memory/memory.stat: a container's own view)
//!                                        └─ v2: <path>/memory.max (and /memory.max)
//!        the smallest limit found ─▶ Budget::for_limit ─▶ worker threads, hot descriptors
//! ```
//!
//! What is sized: the worker threads (each touches a receive buffer of up to one
//! `max_write` and has its stack) and the cache of descriptors of hot inodes (each
//! keeps a kernel file and its dentry and inode, charged to the daemon's cgroup).
//! What follows the kernel and cannot be bounded without failing requests: one entry
//! per inode the kernel holds (until it forgets it), one per open file or directory
//! (a directory stream buffers up to 32 KiB), and the handoff state's copy of both.
//! A workload that holds more of those than the limit allows gets the daemon
//! OOM-killed, which the node agent reports (see `docs/operations.md`).

use std::path::Path;

/// Memory the daemon needs whatever it serves (code, runtime, fixed tables).
const BASE: u64 = 12 << 20;
/// What one worker thread may touch: a receive buffer of one `max_write` (1 MiB as
/// the kernel negotiates it) and its stack.
const PER_THREAD: u64 = 2 << 20;
/// What one cached descriptor keeps in the kernel (file, dentry, inode), roughly.
const PER_HOT_FD: u64 = 2 << 10;
/// The fewest cached descriptors.
const MIN_HOT_FDS: usize = 16;
/// Values at or above this mean "no limit" (cgroup v1 writes 2^63 rounded to pages).
const UNLIMITED: u64 = 1 << 62;

/// What the daemon sizes to its memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The memory limit found, if any.
    pub limit: Option<u64>,
    /// Worker threads (at least 2, at most as many as asked).
    pub threads: u16,
    /// Cached descriptors of hot inodes (at most as many as asked).
    pub hot_fds: usize,
}

impl Budget {
    /// Under `limit`: a quarter of what is left after [`BASE`] for the threads, a
    /// quarter for the hot descriptors, half for what follows the kernel. Without a
    /// limit, what was asked.
    pub fn for_limit(limit: Option<u64>, threads: u16, hot_fds: usize) -> Budget {
        let Some(l) = limit else {
            return Budget {
                limit,
                threads,
                hot_fds,
            };
        };
        let quarter = l.saturating_sub(BASE) / 4;
        let t = (quarter / PER_THREAD).clamp(2, u64::from(threads.max(2))) as u16;
        let h = ((quarter / PER_HOT_FD) as usize).clamp(MIN_HOT_FDS, hot_fds.max(MIN_HOT_FDS));
        Budget {
            limit,
            threads: t,
            hot_fds: h,
        }
    }
}

/// The memory limit of the cgroup the process runs in, if any.
pub fn memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_from(&own, |p| std::fs::read_to_string(p).ok())
}

/// The smallest memory limit among the cgroup files that `read` finds for the
/// process whose `/proc/self/cgroup` is `own`.
pub fn limit_from(own: &str, read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    let mut candidates: Vec<(String, bool)> = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        // Nothing beneath the cgroup mount may be named by a path with `..`.
        if path.split('/').any(|c| c == "..") {
            continue;
        }
        let path = path.trim_end_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            candidates.push((format!("/sys/fs/cgroup/memory{path}/memory.stat"), true));
            candidates.push(("/sys/fs/cgroup/memory/memory.stat".into(), true));
        } else if controllers.is_empty() {
            candidates.push((format!("/sys/fs/cgroup{path}/memory.max"), false));
            candidates.push(("/sys/fs/cgroup/memory.max".into(), false));
        }
    }
    candidates
        .into_iter()
        .filter_map(|(file, v1)| {
            let text = read(Path::new(&file))?;
            if v1 {
                text.lines()
                    .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            } else {
                text.trim().parse::<u64>().ok()
            }
        })
        .filter(|l| *l < UNLIMITED)
        .min()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn files(kv: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let m: HashMap<String, String> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |p| m.get(p.to_str().unwrap()).cloned()
    }

    #[test]
    fn limits_from_cgroup_files() {
        let v1_host = "4:memory:/kubepods/podu/c1\n1:cpu:/\n0::/\n";
        type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, Option<u64>);
        let table: Vec<Case> = vec![
            (
                "v1, seen from the host",
                v1_host,
                vec![
                    (
                        "/sys/fs/cgroup/memory/kubepods/podu/c1/memory.stat",
                        "cache 0\nhierarchical_memory_limit 33554432\n",
                    ),
                    (
                        "/sys/fs/cgroup/memory/memory.stat",
                        "hierarchical_memory_limit 9223372036854771712\n",
                    ),
                ],
                Some(32 << 20),
            ),
            (
                "v1, a container's own view of its cgroup",
                v1_host,
                vec![(
                    "/sys/fs/cgroup/memory/memory.stat",
                    "hierarchical_memory_limit 25165824\n",
                )],
                Some(24 << 20),
            ),
            (
                "v1, no limit",
                v1_host,
                vec![(
                    "/sys/fs/cgroup/memory/memory.stat",
                    "hierarchical_memory_limit 9223372036854771712\n",
                )],
                None,
            ),
            (
                "v2",
                "0::/kubepods/podu/c1\n",
                vec![
                    ("/sys/fs/cgroup/kubepods/podu/c1/memory.max", "67108864\n"),
                    ("/sys/fs/cgroup/memory.max", "max\n"),
                ],
                Some(64 << 20),
            ),
            (
                "v2 namespaced: the root is the container's",
                "0::/\n",
                vec![("/sys/fs/cgroup/memory.max", "16777216\n")],
                Some(16 << 20),
            ),
            (
                "a path with .. is not followed",
                "4:memory:/../../etc\n",
                vec![(
                    "/sys/fs/cgroup/memory/../../etc/memory.stat",
                    "hierarchical_memory_limit 1\n",
                )],
                None,
            ),
            ("nothing readable", v1_host, vec![], None),
        ];
        for (what, own, fs, want) in table {
            assert_eq!(limit_from(own, files(&fs)), want, "{what}");
        }
    }

    #[test]
    fn budgets_follow_the_limit() {
        assert_eq!(
            Budget::for_limit(None, 4, 8192),
            Budget {
                limit: None,
                threads: 4,
                hot_fds: 8192
            }
        );
        let small = Budget::for_limit(Some(32 << 20), 4, 8192);
        assert_eq!((small.threads, small.hot_fds), (2, 2560));
        let tiny = Budget::for_limit(Some(16 << 20), 4, 8192);
        assert_eq!((tiny.threads, tiny.hot_fds), (2, 512));
        let below_base = Budget::for_limit(Some(4 << 20), 4, 8192);
        assert_eq!((below_base.threads, below_base.hot_fds), (2, MIN_HOT_FDS));
        let big = Budget::for_limit(Some(1 << 30), 4, 8192);
        assert_eq!(
            (big.threads, big.hot_fds),
            (4, 8192),
            "capped by what was asked"
        );
        let mid = Budget::for_limit(Some(128 << 20), 16, 8192);
        assert_eq!((mid.threads, mid.hot_fds), (14, 8192));
    }
}
