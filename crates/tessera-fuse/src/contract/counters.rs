//! The mount daemon's counters (operations by kind, errors by errno, bytes read and
//! written, the quota), shared with the node agent through a small fixed-layout file
//! that both map.
//!
//! ```text
//!  tessera mount ── install(--counters-file) ── mmap(MAP_SHARED, rw) ──┐
//!    worker threads: op(Op::Read), error(errno), read_bytes(n) …       │  <state>/mounts/
//!      = one relaxed atomic add on the mapped page                     ├─ <volume>.counters
//!    a thread, every second: set_quota(used, limit)                    │  (4 KiB)
//!  tessera node, on each scrape ── read(path) ── mmap(read-only) ──────┘
//!                                  atomic loads, unmap
//! ```
//!
//! **Why a mapped file.** The hot path costs a relaxed atomic add and nothing else: no
//! syscall, no lock, no thread to wake (a file rewritten every second would cost a
//! thread and lag by up to a second; a unix socket would need a server thread in the
//! daemon and a connection per scrape). The file lives in the state directory, so an
//! agent that restarts (and adopts the running daemons) reads on where it left off,
//! and a daemon in its own Pod that shares the node's state directory (hostPath) works
//! the same way. A restarted daemon keeps counting in the existing file, so the
//! counters of a mount only grow over its life; the agent removes the file with the
//! mount's other state files.
//!
//! **Layout** (native endianness: writer and reader are on one host): a header slot
//! with [`MAGIC`] and the slot count, then one 64-byte slot per counter (a slot a
//! cache line, so threads counting different operations do not contend), in the order
//! of [`Op::ALL`], [`ErrnoClass::ALL`], then [`Slot`]s. The file is [`FILE_LEN`]
//! bytes. A file of another size, magic or slot count is not read; the daemon never
//! shrinks a file in place (it replaces one it cannot use by renaming a new one over
//! it), so a reader's mapping never loses its pages.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// "TSRFUSE1": the layout version. A new layout gets a new magic.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSRFUSE1");
/// The size of a counters file.
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
/// Every counter slot.
pub const SLOTS: usize = N_OPS + N_ERRNOS + 4;

/// One counter on a cache line of its own.
#[repr(C, align(64))]
struct Cell(AtomicU64);

/// The file's layout.
#[repr(C)]
pub struct Table {
    /// [`MAGIC`] in the first word, the slot count in the second.
    header: [AtomicU64; 8],
    cells: [Cell; SLOTS],
}

const _: () = assert!(size_of::<Table>() <= FILE_LEN);

impl Table {
    const fn new() -> Table {
        Table {
            header: [const { AtomicU64::new(0) }; 8],
            cells: [const { Cell(AtomicU64::new(0)) }; SLOTS],
        }
    }

    fn add(&self, slot: usize, n: u64) {
        self.cells[slot].0.fetch_add(n, Ordering::Relaxed);
    }

    /// Count one operation of kind `op`.
    pub fn op(&self, op: Op) {
        self.add(op as usize, 1);
    }

    /// Count one error replied with `errno`.
    pub fn error(&self, errno: i32) {
        self.add(N_OPS + ErrnoClass::of(errno) as usize, 1);
    }

    /// Count bytes read or written.
    pub fn bytes(&self, slot: Slot, n: u64) {
        self.add(N_OPS + N_ERRNOS + slot as usize, n);
    }

    /// Set the quota gauges.
    pub fn set_quota(&self, used: u64, limit: u64) {
        let base = N_OPS + N_ERRNOS;
        self.cells[base + Slot::QuotaUsed as usize]
            .0
            .store(used, Ordering::Relaxed);
        self.cells[base + Slot::QuotaLimit as usize]
            .0
            .store(limit, Ordering::Relaxed);
    }

    fn valid(&self) -> bool {
        self.header[0].load(Ordering::Acquire) == MAGIC
            && self.header[1].load(Ordering::Relaxed) == SLOTS as u64
    }

    /// The values now.
    pub fn snapshot(&self) -> Snapshot {
        let v = |i: usize| self.cells[i].0.load(Ordering::Relaxed);
        let base = N_OPS + N_ERRNOS;
        Snapshot {
            ops: std::array::from_fn(v),
            errors: std::array::from_fn(|i| v(N_OPS + i)),
            read_bytes: v(base + Slot::ReadBytes as usize),
            written_bytes: v(base + Slot::WrittenBytes as usize),
            quota_used: v(base + Slot::QuotaUsed as usize),
            quota_limit: v(base + Slot::QuotaLimit as usize),
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
}

/// The mapped table once [`install`]ed; before (and without) that, counting goes to
/// [`UNMAPPED`], so the hot path never branches on whether there is a file.
static INSTALLED: OnceLock<&'static Table> = OnceLock::new();
static UNMAPPED: Table = Table::new();

/// This process's counters (of its one mount).
pub fn table() -> &'static Table {
    INSTALLED.get().copied().unwrap_or(&UNMAPPED)
}

/// Count one operation of kind `op` (the adapter calls this once per request).
pub fn op(op: Op) {
    table().op(op);
}

/// A shared mapping of a counters file.
struct Mapping {
    addr: *mut libc::c_void,
}

// SAFETY: the mapping is only ever accessed through `Table`, whose fields are atomics.
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
    /// new one renamed over it.
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
            map.table().header[1].store(SLOTS as u64, Ordering::Relaxed);
            map.table().header[0].store(MAGIC, Ordering::Release);
            std::fs::rename(&tmp, path)?;
            map
        }
    };
    Ok(map)
}

/// The agent: the counters in the file at `path`, or `None` if it is not a counters
/// file of this layout (another size, magic or slot count; not a regular file).
pub fn read(path: &Path) -> io::Result<Option<Snapshot>> {
    let Some(file) = open_checked(path, false)? else {
        return Ok(None);
    };
    let map = Mapping::new(&file, false)?;
    let table = map.table();
    Ok(table.valid().then(|| table.snapshot()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_fall_into_their_classes() {
        for (errno, class) in [
            (libc::ENOENT, "ENOENT"),
            (libc::EEXIST, "EEXIST"),
            (libc::EACCES, "EACCES"),
            (libc::EPERM, "EACCES"),
            (libc::ENOTEMPTY, "ENOTEMPTY"),
            (libc::ENOSPC, "ENOSPC"),
            (libc::EDQUOT, "ENOSPC"),
            (libc::EROFS, "EROFS"),
            (libc::EIO, "EIO"),
            (libc::EINVAL, "EINVAL"),
            (libc::EXDEV, "other"),
            (libc::ENAMETOOLONG, "other"),
        ] {
            assert_eq!(ErrnoClass::of(errno).as_str(), class, "errno {errno}");
        }
    }

    #[test]
    fn slot_order_is_the_order_of_the_lists() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op:?}");
        }
        for (i, class) in ErrnoClass::ALL.iter().enumerate() {
            assert_eq!(*class as usize, i, "{class:?}");
        }
    }

    #[test]
    fn a_table_counts_into_its_slots() {
        let t = Table::new();
        t.op(Op::Read);
        t.op(Op::Read);
        t.op(Op::Lookup);
        t.error(libc::ENOSPC);
        t.error(libc::EDQUOT);
        t.bytes(Slot::ReadBytes, 10);
        t.bytes(Slot::WrittenBytes, 7);
        t.set_quota(100, 1000);
        let s = t.snapshot();
        assert_eq!(s.ops[Op::Read as usize], 2);
        assert_eq!(s.ops[Op::Lookup as usize], 1);
        assert_eq!(s.ops.iter().sum::<u64>(), 3);
        assert_eq!(s.errors[ErrnoClass::Enospc as usize], 2);
        assert_eq!(s.errors.iter().sum::<u64>(), 2);
        assert_eq!(
            (s.read_bytes, s.written_bytes, s.quota_used, s.quota_limit),
            (10, 7, 100, 1000)
        );
    }

    #[test]
    fn files_of_another_size_or_magic_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short.counters");
        std::fs::write(&short, [0u8; 64]).unwrap();
        assert_eq!(read(&short).unwrap(), None);
        let zeros = dir.path().join("zeros.counters");
        std::fs::write(&zeros, vec![0u8; FILE_LEN]).unwrap();
        assert_eq!(read(&zeros).unwrap(), None);
        let link = dir.path().join("link.counters");
        std::os::unix::fs::symlink(&zeros, &link).unwrap();
        assert!(read(&link).is_err(), "a symlink is not followed");
        assert!(read(&dir.path().join("missing.counters")).is_err());
    }

    #[test]
    fn a_reader_sees_what_the_writer_counts_and_a_restart_counts_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.counters");
        // An unusable file in the way (a reader may have it mapped) is replaced.
        std::fs::write(&path, vec![1u8; FILE_LEN]).unwrap();
        let held = File::open(&path).unwrap();
        let writer = map_for_counting(&path).unwrap();
        writer.table().op(Op::Write);
        writer.table().bytes(Slot::WrittenBytes, 4096);
        let seen = read(&path).unwrap().expect("a counters file");
        assert_eq!(seen.ops[Op::Write as usize], 1);
        assert_eq!(seen.written_bytes, 4096);
        assert_eq!(
            held.metadata().unwrap().len(),
            FILE_LEN as u64,
            "not truncated"
        );
        drop(writer);
        // A restarted daemon keeps the counts.
        let again = map_for_counting(&path).unwrap();
        again.table().op(Op::Write);
        assert_eq!(read(&path).unwrap().unwrap().ops[Op::Write as usize], 2);
    }
}
