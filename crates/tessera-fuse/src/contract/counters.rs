//! The mount daemon's counters (operations by kind and the time they took, errors by
//! errno, bytes read and written, the quota), shared with the node agent through a
//! small fixed-layout file that both map.
//!
//! ```text
//!  tessera mount ── install(--counters-file) ── mmap(MAP_SHARED, rw) ──┐
//!    worker threads: let _t = op(Op::Read) … (dropped after the reply) │  <state>/mounts/
//!      = relaxed atomic adds on the mapped page, two clock reads       ├─ <volume>.counters
//!    error(errno), bytes(…): one relaxed atomic add                    │  (4 KiB)
//!    a thread, every second: set_quota(used, limit)                    │
//!  tessera node, on each scrape ── read(path) ── mmap(read-only) ──────┘
//!                                  atomic loads, unmap (this layout or v1)
//! ```
//!
//! **Why a mapped file.** The hot path costs a few relaxed atomic adds (and the two
//! clock reads below): no syscall, no lock, no thread to wake (a file rewritten every
//! second would cost a thread and lag by up to a second; a unix socket would need a
//! server thread in the daemon and a connection per scrape). The file lives in the
//! state directory, so an agent that restarts (and adopts the running daemons) reads
//! on where it left off, and a daemon in its own Pod that shares the node's state
//! directory (hostPath) works the same way. A restarted daemon keeps counting in the
//! existing file, so the counters of a mount only grow over its life; the agent
//! removes the file with the mount's other state files.
//!
//! **Durations.** [`op`] counts a request and returns a [`Timed`] guard that the
//! adapter holds until it has replied: dropping it adds the nanoseconds since [`op`]
//! (one `Instant` read at each end, the vDSO's monotonic clock, no syscall) to the
//! kind's total and, for the kinds in [`TIMED`], one to the histogram bucket
//! ([`BUCKETS_NS`]) it falls in. The time is the daemon's: from the request's dispatch
//! to its reply written, not the kernel's queueing; a blocking lock's wait runs on the
//! waiter thread after the request thread has returned and is not in it. So
//! total/count is the mean time of a kind, and the buckets give its quantiles. Cost:
//! about 0.1 µs a request on a loaded 2-core host (the `hot_path_cost` test prints it),
//! against a FUSE round trip of 10 µs or more.
//!
//! **Layout** (native endianness: writer and reader are on one host): a header slot
//! with [`MAGIC`] and the layout's shape ([`SHAPE`]: the counts of kinds, errno
//! classes, slots, timed kinds and buckets), then one 64-byte line per operation kind
//! (its count, then its nanoseconds: both touched by the same requests), in the order
//! of [`Op::ALL`]; one line per counter in the order of [`ErrnoClass::ALL`], then
//! [`Slot`]s; then per kind in [`TIMED`] its [`N_BUCKETS`] bucket counts (two lines;
//! not cumulative, the last above every bound). A line per kind or counter keeps
//! threads counting different things from contending. The file is [`FILE_LEN`] bytes.
//! A file of another size, magic or shape is not read; the daemon never shrinks a
//! file in place (it replaces one it cannot use by renaming a new one over it), so a
//! reader's mapping never loses its pages. Anything that changes the layout (a kind,
//! a class, a bucket bound) takes a new magic.
//!
//! **Versions.** Agents and daemons of two releases run side by side during an
//! upgrade. A new agent reads a file of the previous layout ([`v1`]: `TSRFUSE1`,
//! counts without durations) as well as this one, so an old daemon's mount keeps its
//! counters on the dashboard (without latency). A new daemon that finds a v1 file
//! replaces it (as any file it cannot use): that mount's counters start again at zero,
//! which Prometheus's `rate` takes as a counter reset. An old daemon that finds a file
//! of this layout does the same, and an old agent reads none of it until its daemons
//! are new too (it skips files it does not know, as it always did).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub mod v1;

/// "TSRFUSE2": the layout version (durations added to [`v1`]). A new layout gets a new
/// magic.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSRFUSE2");
/// The size of a counters file (of this layout and of [`v1`]).
pub const FILE_LEN: usize = 4096;

/// Kinds of FUSE operations, a bounded set (several requests share one kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    /// create, mknod, mkdir, symlink, link.
    Create,
    /// unlink, rmdir.
    Remove,
    Rename,
    /// open, opendir.
    Open,
    Read,
    Write,
    Flush,
    /// release, releasedir.
    Release,
    /// fsync, fsyncdir.
    Fsync,
    /// readdir, readdirplus.
    Readdir,
    Statfs,
    /// setxattr, getxattr, listxattr, removexattr.
    Xattr,
    Access,
    Fallocate,
    Lseek,
    CopyFileRange,
    /// getlk, setlk (fcntl and flock locks).
    Lock,
}

impl Op {
    /// Every kind, in slot order.
    pub const ALL: [Op; 22] = [
        Op::Lookup,
        Op::Forget,
        Op::Getattr,
        Op::Setattr,
        Op::Readlink,
        Op::Create,
        Op::Remove,
        Op::Rename,
        Op::Open,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Release,
        Op::Fsync,
        Op::Readdir,
        Op::Statfs,
        Op::Xattr,
        Op::Access,
        Op::Fallocate,
        Op::Lseek,
        Op::CopyFileRange,
        Op::Lock,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Forget => "forget",
            Op::Getattr => "getattr",
            Op::Setattr => "setattr",
            Op::Readlink => "readlink",
            Op::Create => "create",
            Op::Remove => "remove",
            Op::Rename => "rename",
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Release => "release",
            Op::Fsync => "fsync",
            Op::Readdir => "readdir",
            Op::Statfs => "statfs",
            Op::Xattr => "xattr",
            Op::Access => "access",
            Op::Fallocate => "fallocate",
            Op::Lseek => "lseek",
            Op::CopyFileRange => "copy_file_range",
            Op::Lock => "lock",
        }
    }
}

/// Errors replied to the kernel, by class of errno (a bounded set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrnoClass {
    Enoent,
    Eexist,
    /// EACCES and EPERM.
    Eacces,
    Enotempty,
    /// ENOSPC and EDQUOT: the quota or the backend is full.
    Enospc,
    Erofs,
    Eio,
    Einval,
    /// Any other errno.
    Other,
}

impl ErrnoClass {
    /// Every class, in slot order.
    pub const ALL: [ErrnoClass; 9] = [
        ErrnoClass::Enoent,
        ErrnoClass::Eexist,
        ErrnoClass::Eacces,
        ErrnoClass::Enotempty,
        ErrnoClass::Enospc,
        ErrnoClass::Erofs,
        ErrnoClass::Eio,
        ErrnoClass::Einval,
        ErrnoClass::Other,
    ];

    /// The class of `errno`.
    pub fn of(errno: i32) -> ErrnoClass {
        match errno {
            libc::ENOENT => ErrnoClass::Enoent,
            libc::EEXIST => ErrnoClass::Eexist,
            libc::EACCES | libc::EPERM => ErrnoClass::Eacces,
            libc::ENOTEMPTY => ErrnoClass::Enotempty,
            libc::ENOSPC | libc::EDQUOT => ErrnoClass::Enospc,
            libc::EROFS => ErrnoClass::Erofs,
            libc::EIO => ErrnoClass::Eio,
            libc::EINVAL => ErrnoClass::Einval,
            _ => ErrnoClass::Other,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrnoClass::Enoent => "ENOENT",
            ErrnoClass::Eexist => "EEXIST",
            ErrnoClass::Eacces => "EACCES",
            ErrnoClass::Enotempty => "ENOTEMPTY",
            ErrnoClass::Enospc => "ENOSPC",
            ErrnoClass::Erofs => "EROFS",
            ErrnoClass::Eio => "EIO",
            ErrnoClass::Einval => "EINVAL",
            ErrnoClass::Other => "other",
        }
    }
}

/// The counters that are neither an operation nor an errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Bytes the daemon read for the kernel (passthrough reads do not reach it).
    ReadBytes,
    /// Bytes the daemon wrote (passthrough writes do not reach it).
    WrittenBytes,
    /// Bytes in use, as the quota counts them (a gauge).
    QuotaUsed,
    /// The capacity (a gauge).
    QuotaLimit,
}

const N_OPS: usize = Op::ALL.len();
const N_ERRNOS: usize = ErrnoClass::ALL.len();
const N_SLOTS: usize = 4;
/// Every counter line after the operations' (errno classes, then [`Slot`]s).
pub const SLOTS: usize = N_ERRNOS + N_SLOTS;

/// The kinds whose durations also go into a histogram: those an application waits on
/// for data and names (the rest have a total time only).
pub const TIMED: [Op; 6] = [
    Op::Lookup,
    Op::Getattr,
    Op::Open,
    Op::Read,
    Op::Write,
    Op::Fsync,
];
const N_TIMED: usize = TIMED.len();

/// The histogram buckets' upper bounds (inclusive), nanoseconds: 5 µs to 1 s. A
/// request above the last falls in a bucket of its own (`+Inf`).
pub const BUCKETS_NS: [u64; 15] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
    250_000_000,
    1_000_000_000,
];
/// Buckets per timed kind: one per bound and one above them all.
pub const N_BUCKETS: usize = BUCKETS_NS.len() + 1;

/// The layout's shape, in the header's second word: a file of another shape is not
/// read (and is replaced by a daemon).
pub const SHAPE: u64 = N_OPS as u64
    | (N_ERRNOS as u64) << 8
    | (N_SLOTS as u64) << 16
    | (N_TIMED as u64) << 24
    | (N_BUCKETS as u64) << 32;

/// For each kind in [`Op::ALL`] order, its index in [`TIMED`] (or `u8::MAX`).
const HISTOGRAM_OF: [u8; N_OPS] = {
    let mut out = [u8::MAX; N_OPS];
    let mut i = 0;
    while i < N_TIMED {
        out[TIMED[i] as usize] = i as u8;
        i += 1;
    }
    out
};

/// The bucket of a request that took `ns` nanoseconds.
pub fn bucket(ns: u64) -> usize {
    BUCKETS_NS.partition_point(|&bound| bound < ns)
}

/// One counter on a cache line of its own.
#[repr(C, align(64))]
struct Cell(AtomicU64);

/// One kind's count and nanoseconds, on a cache line of their own.
#[repr(C, align(64))]
struct OpCell {
    count: AtomicU64,
    nanos: AtomicU64,
}

/// One timed kind's buckets (two cache lines).
#[repr(C, align(64))]
struct Histogram([AtomicU64; N_BUCKETS]);

/// The file's layout.
#[repr(C)]
pub struct Table {
    /// [`MAGIC`] in the first word, [`SHAPE`] in the second.
    header: [AtomicU64; 8],
    ops: [OpCell; N_OPS],
    cells: [Cell; SLOTS],
    histograms: [Histogram; N_TIMED],
}

const _: () = assert!(size_of::<Table>() <= FILE_LEN);

impl Table {
    const fn new() -> Table {
        Table {
            header: [const { AtomicU64::new(0) }; 8],
            ops: [const {
                OpCell {
                    count: AtomicU64::new(0),
                    nanos: AtomicU64::new(0),
                }
            }; N_OPS],
            cells: [const { Cell(AtomicU64::new(0)) }; SLOTS],
            histograms: [const { Histogram([const { AtomicU64::new(0) }; N_BUCKETS]) }; N_TIMED],
        }
    }

    fn add(&self, slot: usize, n: u64) {
        self.cells[slot].0.fetch_add(n, Ordering::Relaxed);
    }

    /// Count one operation of kind `op` (without timing it: [`Table::timed`] does
    /// both).
    pub fn op(&self, op: Op) {
        self.ops[op as usize].count.fetch_add(1, Ordering::Relaxed);
    }

    /// Count one operation of kind `op` and time it until the guard is dropped.
    pub fn timed(&'static self, op: Op) -> Timed {
        self.op(op);
        Timed {
            table: self,
            op,
            start: Instant::now(),
        }
    }

    /// Add one finished operation of kind `op` that took `ns` nanoseconds.
    pub fn took(&self, op: Op, ns: u64) {
        self.ops[op as usize].nanos.fetch_add(ns, Ordering::Relaxed);
        if let Some(h) = self.histograms.get(HISTOGRAM_OF[op as usize] as usize) {
            h.0[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Count one error replied with `errno`.
    pub fn error(&self, errno: i32) {
        self.add(ErrnoClass::of(errno) as usize, 1);
    }

    /// Count bytes read or written.
    pub fn bytes(&self, slot: Slot, n: u64) {
        self.add(N_ERRNOS + slot as usize, n);
    }

    /// Set the quota gauges.
    pub fn set_quota(&self, used: u64, limit: u64) {
        self.cells[N_ERRNOS + Slot::QuotaUsed as usize]
            .0
            .store(used, Ordering::Relaxed);
        self.cells[N_ERRNOS + Slot::QuotaLimit as usize]
            .0
            .store(limit, Ordering::Relaxed);
    }

    fn valid(&self) -> bool {
        self.header[0].load(Ordering::Acquire) == MAGIC
            && self.header[1].load(Ordering::Relaxed) == SHAPE
    }

    /// The values now.
    pub fn snapshot(&self) -> Snapshot {
        let v = |i: usize| self.cells[i].0.load(Ordering::Relaxed);
        Snapshot {
            ops: std::array::from_fn(|i| self.ops[i].count.load(Ordering::Relaxed)),
            errors: std::array::from_fn(v),
            read_bytes: v(N_ERRNOS + Slot::ReadBytes as usize),
            written_bytes: v(N_ERRNOS + Slot::WrittenBytes as usize),
            quota_used: v(N_ERRNOS + Slot::QuotaUsed as usize),
            quota_limit: v(N_ERRNOS + Slot::QuotaLimit as usize),
            durations: Some(Durations {
                nanos: std::array::from_fn(|i| self.ops[i].nanos.load(Ordering::Relaxed)),
                buckets: std::array::from_fn(|h| {
                    std::array::from_fn(|b| self.histograms[h].0[b].load(Ordering::Relaxed))
                }),
            }),
        }
    }
}

/// The counters of one mount at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// By [`Op::ALL`].
    pub ops: [u64; N_OPS],
    /// By [`ErrnoClass::ALL`].
    pub errors: [u64; N_ERRNOS],
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub quota_used: u64,
    pub quota_limit: u64,
    /// The time the operations took; `None` from a [`v1`] file (an older daemon's).
    pub durations: Option<Durations>,
}

/// The time one mount's operations took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durations {
    /// Nanoseconds of the finished operations, by [`Op::ALL`] (the count of an
    /// operation under way is in [`Snapshot::ops`] already, its time not yet).
    pub nanos: [u64; N_OPS],
    /// By [`TIMED`]: the finished operations by bucket ([`BUCKETS_NS`], then the one
    /// above them), not cumulative; their sum is how many finished.
    pub buckets: [[u64; N_BUCKETS]; N_TIMED],
}

/// The mapped table once [`install`]ed; before (and without) that, counting goes to
/// [`UNMAPPED`], so the hot path never branches on whether there is a file.
static INSTALLED: OnceLock<&'static Table> = OnceLock::new();
static UNMAPPED: Table = Table::new();

/// This process's counters (of its one mount).
pub fn table() -> &'static Table {
    INSTALLED.get().copied().unwrap_or(&UNMAPPED)
}

/// A request being served: counted when made ([`op`]), its time added when dropped.
#[must_use = "the request is timed until the guard is dropped: bind it (`let _timed`)"]
pub struct Timed {
    table: &'static Table,
    op: Op,
    start: Instant,
}

impl Drop for Timed {
    fn drop(&mut self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.table.took(self.op, ns);
    }
}

/// Count one operation of kind `op` and time it until the guard is dropped (the
/// adapter calls this once per request, on entry, and holds the guard past its reply).
pub fn op(op: Op) -> Timed {
    table().timed(op)
}

/// A shared mapping of a counters file.
struct Mapping {
    addr: *mut libc::c_void,
}

// SAFETY: the mapping is only ever accessed through `Table` or `v1::Table`, whose
// fields are atomics.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, writable: bool) -> io::Result<Mapping> {
        let addr = crate::sys::mmap_shared(file.as_fd(), FILE_LEN, writable)?;
        Ok(Mapping { addr })
    }

    fn table(&self) -> &Table {
        // SAFETY: the mapping is FILE_LEN >= size_of::<Table>() bytes, page-aligned
        // (so aligned for Table), and all of Table is atomics, valid for any bytes.
        unsafe { &*(self.addr as *const Table) }
    }

    fn v1(&self) -> &v1::Table {
        // SAFETY: as for `table`: v1::Table fits in FILE_LEN (asserted there) and is
        // all atomics.
        unsafe { &*(self.addr as *const v1::Table) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped; no reference outlives `self`.
        unsafe { libc::munmap(self.addr, FILE_LEN) };
    }
}

fn open_checked(path: &Path, writable: bool) -> io::Result<Option<File>> {
    let file = OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    Ok((meta.file_type().is_file() && meta.size() == FILE_LEN as u64).then_some(file))
}

/// The daemon: count into the file at `path` from now on (its counts kept if it is a
/// counters file of this layout, else a new one put in its place). Once per process;
/// a second call fails.
pub fn install(path: &Path) -> io::Result<()> {
    let file = CountersFile::open(path)?;
    // The daemon counts into it until it exits: the mapping is never unmapped.
    let file: &'static CountersFile = Box::leak(Box::new(file));
    INSTALLED
        .set(file.table())
        .map_err(|_| io::Error::other("counters installed twice"))
}

/// A counters file mapped for counting.
pub struct CountersFile(Mapping);

impl CountersFile {
    /// Map the file at `path`: reused if it is a counters file of this layout, else a
    /// new one renamed over it (a [`v1`] file too: its counts start again).
    pub fn open(path: &Path) -> io::Result<CountersFile> {
        map_for_counting(path).map(CountersFile)
    }

    /// Its counters.
    pub fn table(&self) -> &Table {
        self.0.table()
    }
}

fn map_for_counting(path: &Path) -> io::Result<Mapping> {
    let reuse = match open_checked(path, true) {
        Ok(Some(file)) => {
            let map = Mapping::new(&file, true)?;
            map.table().valid().then_some(map)
        }
        Ok(None) => None,
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let map = match reuse {
        Some(map) => map,
        None => {
            // A new file, complete before it takes the name (never truncate in place:
            // a reader may have the old one mapped).
            let tmp = path.with_extension("counters.tmp");
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            file.set_len(FILE_LEN as u64)?;
            let map = Mapping::new(&file, true)?;
            map.table().header[1].store(SHAPE, Ordering::Relaxed);
            map.table().header[0].store(MAGIC, Ordering::Release);
            std::fs::rename(&tmp, path)?;
            map
        }
    };
    Ok(map)
}

/// The agent: the counters in the file at `path`, of this layout or of [`v1`]
/// (without durations), or `None` if it is neither (another size, magic or shape; not
/// a regular file).
pub fn read(path: &Path) -> io::Result<Option<Snapshot>> {
    let Some(file) = open_checked(path, false)? else {
        return Ok(None);
    };
    let map = Mapping::new(&file, false)?;
    let table = map.table();
    if table.valid() {
        return Ok(Some(table.snapshot()));
    }
    Ok(map.v1().snapshot())
}

#[cfg(test)]
mod tests;
