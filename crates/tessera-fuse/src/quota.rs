//! The volume's quota: how many bytes the volume may hold, how many it holds now, and
//! who enforces the limit.
//!
//! **Two modes** ([`Mode`], chosen once at mount, see `tessera mount --quota`):
//!
//! - **daemon**: the daemon counts ([`Accounting`], below) and every operation that can
//!   grow the volume must reach it, so writable opens never use kernel passthrough;
//! - **backend**: the backing filesystem enforces an XFS project quota on the volume
//!   directory ([`super::projquota`]); the daemon only sets the limit and reads usage
//!   back, its reservations are no-ops, and writes may bypass it.
//!
//! [`Enforcement`] is the quota of a mounted volume: the daemon's [`Accounting`] or the
//! backend's [`ProjectQuota`], behind one set of calls; [`Usage`] (in `usage`, below
//! both) is capacity and usage at one instant, whichever mode measured it.
//!
//! The rest of this page is about the daemon's own count.
//!
//! **What is counted.** The apparent size (`st_size`) of every regular file of the
//! volume, each inode once however many hard links it has, plus files that are unlinked
//! but still open through the mount. Apparent size rather than allocated blocks because
//! it is exact and predictable before an operation runs: a write of `n` bytes at offset
//! `o` grows usage by exactly `max(0, o + n - size)`, whatever the backing filesystem
//! does with blocks (XFS speculative preallocation, btrfs compression, metadata blocks
//! would otherwise make usage jump). Sparse files are therefore charged at their
//! apparent size, which errs on the safe side. Directories, symlinks and xattrs are not
//! charged; the backing filesystem's inode limits bound those (statfs reports them).
//!
//! **How it stays right.** [`scan`] walks the volume once at start. After that every
//! operation that can change a size asks for the growth first
//! ([`Accounting::reserve_up_to`] or [`Accounting::reserve`]), performs the syscall, and
//! gives back what it did not use ([`Accounting::release`]); shrinking operations
//! release after they succeed. A write that only partly fits is cut at the quota
//! boundary (a short write, as on a full disk), the next one fails with `ENOSPC`, and
//! nothing already written is touched.
//!
//! **Capacity.** Set at start and replaced on SIGHUP (`tessera mount --capacity-file`),
//! so a volume can grow while mounted. Shrinking below usage makes every growth fail
//! until enough is deleted; nothing is truncated.
//!
//! The counters are two atomics; reservations are compare-and-swap loops, so worker
//! threads never wait for each other here.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use super::projquota::{BackendQuotaError, ProjectQuota};
use super::sys::{self, Errno};
use super::usage::Usage;

/// Which side holds the volume to its capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The daemon's own count of apparent sizes.
    Daemon,
    /// The backing filesystem's project quota.
    Backend,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Daemon => "daemon",
            Mode::Backend => "backend",
        }
    }
}

/// The quota of one volume in the mode chosen at mount: the daemon's [`Accounting`]
/// or the backend's project quota. The filesystem core asks it for growth before
/// every size-changing operation in both modes; in backend mode the answer is always
/// yes (the backing filesystem says no, with `ENOSPC`, by itself).
#[derive(Debug)]
pub enum Enforcement {
    Daemon(Accounting),
    Backend(ProjectQuota),
}

impl From<Accounting> for Enforcement {
    fn from(q: Accounting) -> Self {
        Enforcement::Daemon(q)
    }
}

impl Enforcement {
    pub fn mode(&self) -> Mode {
        match self {
            Enforcement::Daemon(_) => Mode::Daemon,
            Enforcement::Backend(_) => Mode::Backend,
        }
    }

    /// Capacity and usage: the daemon's count, or the project quota's limit and
    /// allocated blocks.
    pub fn usage(&self) -> Result<Usage, BackendQuotaError> {
        match self {
            Enforcement::Daemon(q) => Ok(q.usage()),
            Enforcement::Backend(p) => p.usage(),
        }
    }

    /// Replace the capacity; returns the previous one.
    pub fn set_capacity(&self, capacity: u64) -> Result<u64, BackendQuotaError> {
        match self {
            Enforcement::Daemon(q) => Ok(q.set_capacity(capacity)),
            Enforcement::Backend(p) => {
                let old = p.usage()?.capacity;
                p.set_capacity(capacity)?;
                Ok(old)
            }
        }
    }

    /// See [`Accounting::reserve_up_to`].
    pub fn reserve_up_to(&self, want: u64) -> u64 {
        match self {
            Enforcement::Daemon(q) => q.reserve_up_to(want),
            Enforcement::Backend(_) => want,
        }
    }

    /// See [`Accounting::reserve`].
    pub fn reserve(&self, want: u64) -> bool {
        match self {
            Enforcement::Daemon(q) => q.reserve(want),
            Enforcement::Backend(_) => true,
        }
    }

    /// See [`Accounting::release`].
    pub fn release(&self, bytes: u64) {
        if let Enforcement::Daemon(q) = self {
            q.release(bytes);
        }
    }

    /// See [`Accounting::charge`].
    pub fn charge(&self, bytes: u64) {
        if let Enforcement::Daemon(q) = self {
            q.charge(bytes);
        }
    }
}

/// The daemon's accounting of one volume (daemon mode): its capacity and the bytes in
/// use, reserved before an operation grows the volume and released after it shrinks.
#[derive(Debug)]
pub struct Accounting {
    capacity: AtomicU64,
    used: AtomicU64,
}

impl Accounting {
    /// `capacity` bytes of which `used` are taken (from [`scan`]).
    pub fn new(capacity: u64, used: u64) -> Self {
        Self {
            capacity: AtomicU64::new(capacity),
            used: AtomicU64::new(used),
        }
    }

    pub fn usage(&self) -> Usage {
        Usage {
            capacity: self.capacity.load(Ordering::Acquire),
            used: self.used.load(Ordering::Acquire),
        }
    }

    /// Replace the capacity; returns the previous one.
    pub fn set_capacity(&self, capacity: u64) -> u64 {
        self.capacity.swap(capacity, Ordering::AcqRel)
    }

    /// Reserve as much of `want` as fits; returns the bytes granted (possibly 0).
    pub fn reserve_up_to(&self, want: u64) -> u64 {
        if want == 0 {
            return 0;
        }
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let capacity = self.capacity.load(Ordering::Acquire);
            let grant = want.min(capacity.saturating_sub(used));
            if grant == 0 {
                return 0;
            }
            match self.used.compare_exchange_weak(
                used,
                used + grant,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return grant,
                Err(now) => used = now,
            }
        }
    }

    /// Reserve all of `want` or nothing.
    pub fn reserve(&self, want: u64) -> bool {
        if want == 0 {
            return true;
        }
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let capacity = self.capacity.load(Ordering::Acquire);
            if used.checked_add(want).is_none_or(|total| total > capacity) {
                return false;
            }
            match self.used.compare_exchange_weak(
                used,
                used + want,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    /// Give back `bytes` (unused reservation, or space freed by a shrink or unlink).
    pub fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        // Saturating: a file changed behind the daemon's back (on the backing
        // directory directly) can make a release larger than what was counted.
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// Count `bytes` unconditionally: growth that already happened and cannot be
    /// refused (e.g. a file grew behind the daemon's back between two operations).
    pub fn charge(&self, bytes: u64) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }
}

/// What [`scan`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// Sum of the apparent sizes of the regular files, hard links counted once.
    pub bytes: u64,
    /// Regular files seen (inodes, not links).
    pub files: u64,
    /// Directories walked, the root included.
    pub dirs: u64,
}

/// Walk the tree under `root` (without following symlinks) and add up what the quota
/// counts. Runs once before the volume is mounted.
pub fn scan(root: BorrowedFd<'_>) -> Result<Scan, Errno> {
    let mut result = Scan::default();
    let mut linked: HashSet<(u64, u64)> = HashSet::new();
    let mut stack: Vec<OwnedFd> = vec![sys::openat(
        root,
        c".",
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )?];
    let mut buf = vec![0u8; 64 * 1024];
    while let Some(dir) = stack.pop() {
        result.dirs += 1;
        sys::for_each_entry(
            dir.as_fd(),
            &mut buf,
            |e| e,
            |name| {
                let st = match sys::fstatat(dir.as_fd(), name) {
                    Ok(st) => st,
                    // Removed while we walk: nothing to count.
                    Err(Errno::ENOENT) => return Ok(()),
                    Err(e) => return Err(e),
                };
                match st.st_mode & libc::S_IFMT {
                    libc::S_IFREG => {
                        if st.st_nlink > 1 && !linked.insert((st.st_dev, st.st_ino)) {
                            return Ok(());
                        }
                        result.files += 1;
                        result.bytes += st.st_size as u64;
                    }
                    libc::S_IFDIR => {
                        match sys::openat(
                            dir.as_fd(),
                            name,
                            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                            0,
                        ) {
                            Ok(fd) => stack.push(fd),
                            Err(Errno::ENOENT) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    _ => {}
                }
                Ok(())
            },
        )?;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_up_to_cuts_at_capacity() {
        let q = Accounting::new(100, 90);
        assert_eq!(q.reserve_up_to(30), 10);
        assert_eq!(q.usage().used, 100);
        assert_eq!(q.reserve_up_to(1), 0);
        q.release(25);
        assert_eq!(
            q.usage(),
            Usage {
                capacity: 100,
                used: 75
            }
        );
    }

    #[test]
    fn reserve_is_all_or_nothing() {
        let q = Accounting::new(100, 90);
        assert!(!q.reserve(11));
        assert!(q.reserve(10));
        assert_eq!(q.usage().free(), 0);
    }

    #[test]
    fn shrinking_capacity_blocks_growth_until_freed() {
        let q = Accounting::new(100, 80);
        q.set_capacity(50);
        assert_eq!(q.usage().free(), 0);
        assert_eq!(q.reserve_up_to(1), 0);
        q.release(40);
        assert_eq!(q.reserve_up_to(100), 10);
    }

    #[test]
    fn release_saturates() {
        let q = Accounting::new(100, 5);
        q.release(10);
        assert_eq!(q.usage().used, 0);
    }

    #[test]
    fn scan_counts_apparent_sizes_once_per_inode() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a"), vec![1u8; 1000]).unwrap();
        std::fs::create_dir_all(root.join("d/e")).unwrap();
        std::fs::write(root.join("d/e/b"), vec![1u8; 24]).unwrap();
        std::fs::hard_link(root.join("a"), root.join("d/a-link")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("d/etc")).unwrap();
        let sparse = std::fs::File::create(root.join("sparse")).unwrap();
        sparse.set_len(1 << 20).unwrap();
        let fd = std::fs::File::open(root).unwrap();
        let s = scan(fd.as_fd()).unwrap();
        assert_eq!(s.bytes, 1000 + 24 + (1 << 20));
        assert_eq!(s.files, 3);
        assert_eq!(s.dirs, 3);
    }
}
