//! Copying one volume's data into another (snapshots, restores, clones), through file
//! descriptors only.
//!
//! ```text
//!  from: Beneath (an allowed root + <volume>)    to: Beneath (an allowed root + <volume>)
//!     openat2(RESOLVE_BENEATH|NO_SYMLINKS)           removed, then created afresh
//!        │ per entry: fstatat(AT_SYMLINK_NOFOLLOW)
//!        ├─ directory ─▶ mkdirat + openat2 of both, recurse (depth ≤ MAX_DEPTH)
//!        ├─ file ──────▶ openat2(O_NOFOLLOW) ─▶ FICLONE (reflink) ─╳▶ copy_file_range ─╳▶ read/write
//!        ├─ symlink ───▶ readlinkat + symlinkat (copied as a link, never followed)
//!        └─ other ─────▶ skipped (devices, sockets, fifos are not volume data)
//! ```
//!
//! Every open is relative to an fd already beneath the allowed root, with no symlink
//! allowed anywhere, so a racer swapping a directory for a symlink gets ELOOP, not a
//! file outside the volume. File bytes are charged against a budget (the destination
//! volume's size): a tree larger than the budget stops with [`CopyError::Budget`]
//! before the destination holds more than it may. Owners, modes and modification
//! times are kept; hard links become separate files.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid};

use super::roots::{self, Beneath};

/// How deep the copy descends before it gives up (against hostile trees).
const MAX_DEPTH: usize = 512;
/// `ioctl(dst, FICLONE, src)`: share the source's extents (Btrfs, XFS with reflink,
/// bcachefs, OCFS2, NFS 4.2 servers that support CLONE).
const FICLONE: libc::c_ulong = 0x4004_9409;
/// Chunk of one copy_file_range / read-write round.
const CHUNK: usize = 1 << 20;

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Regular files copied.
    pub files: u64,
    /// Of them, files copied by reflink (FICLONE).
    pub reflinked: u64,
    /// Directories created (the top one not counted).
    pub dirs: u64,
    /// Symlinks recreated (as links).
    pub symlinks: u64,
    /// Entries skipped (devices, sockets, fifos).
    pub skipped: u64,
    /// Bytes of regular files copied (reflinked bytes included).
    pub bytes: u64,
}

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A system call on an entry failed.
    #[error("{action} {path}: {errno}")]
    Io {
        /// What was done.
        action: &'static str,
        /// The entry, relative to the volume (or the volume directory itself).
        path: String,
        /// The error.
        errno: Errno,
    },
    /// The data does not fit into the destination volume.
    #[error("the data does not fit into the destination: more than {budget} bytes (at {path})")]
    Budget {
        /// The destination's size.
        budget: u64,
        /// The file that went past it.
        path: String,
    },
}

fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(Errno) -> CopyError + 'p {
    move |errno| CopyError::Io {
        action,
        path: tessera_text::truncated(&path.display().to_string(), 256).into_owned(),
        errno,
    }
}

/// Whether the FICLONE attempt says "not here": fall back to copying bytes.
fn clone_unsupported(e: Errno) -> bool {
    matches!(
        e,
        Errno::EOPNOTSUPP | Errno::ENOTTY | Errno::EXDEV | Errno::EINVAL | Errno::ENOSYS
    )
}

/// The state of one copy.
struct Copier<'a> {
    stats: CopyStats,
    budget: u64,
    reflink: bool,
    progress: &'a mut dyn FnMut(&CopyStats),
}

/// Copy the volume directory `from` into `to` (which is removed first if it exists,
/// then created), charging file bytes against `budget`. A `from` that does not exist
/// (a volume never written) gives an empty `to`. `progress` is called after every
/// directory.
pub fn copy_volume(
    from: &Beneath,
    to: &Beneath,
    budget: u64,
    progress: &mut dyn FnMut(&CopyStats),
) -> Result<CopyStats, CopyError> {
    let from_root = open_root(&from.root)?;
    let src = match roots::open_dir_beneath(&from_root, &from.rel) {
        Ok(fd) => Some(fd),
        Err(Errno::ENOENT) => None,
        Err(e) => return Err(io("opening", &from.full())(e)),
    };
    roots::remove_beneath(to).map_err(io("clearing", &to.full()))?;
    let dst = roots::create_beneath(to).map_err(io("creating", &to.full()))?;
    let mut c = Copier {
        stats: CopyStats::default(),
        budget,
        reflink: true,
        progress,
    };
    if let Some(src) = src {
        let st = nix::sys::stat::fstat(&src).map_err(io("stat", &from.full()))?;
        c.copy_dir(&src, &dst, Path::new(""), 0)?;
        keep_attrs(&dst, &st).map_err(io("setting attributes of", &to.full()))?;
    }
    nix::unistd::fsync(&dst).map_err(io("syncing", &to.full()))?;
    Ok(c.stats)
}

/// Flush a filesystem (a mount of the source volume, or a backend root) to stable
/// storage: `syncfs(2)` on an fd of `dir`.
pub fn sync_filesystem(dir: &Path) -> Result<(), Errno> {
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    nix::unistd::syncfs(&fd)
}

fn open_root(root: &Path) -> Result<OwnedFd, CopyError> {
    nix::fcntl::open(
        root,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
    .map_err(io("opening backend root", root))
}

fn beneath(dir: &OwnedFd, name: &OsStr, flags: OFlag) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    nix::fcntl::openat2(dir, Path::new(name), how)
}

fn names(dir: &OwnedFd) -> Result<Vec<Vec<u8>>, Errno> {
    let mut listing = nix::dir::Dir::from_fd(nix::unistd::dup(dir)?)?;
    let mut out = vec![];
    for e in listing.iter() {
        let n = e?.file_name().to_bytes().to_vec();
        if n != b"." && n != b".." {
            out.push(n);
        }
    }
    out.sort();
    Ok(out)
}

fn keep_attrs(fd: &OwnedFd, st: &FileStat) -> Result<(), Errno> {
    nix::unistd::fchown(
        fd,
        Some(Uid::from_raw(st.st_uid)),
        Some(Gid::from_raw(st.st_gid)),
    )?;
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(st.st_mode & 0o7777))?;
    let atime = TimeSpec::new(st.st_atime, st.st_atime_nsec);
    let mtime = TimeSpec::new(st.st_mtime, st.st_mtime_nsec);
    nix::sys::stat::futimens(fd, &atime, &mtime)
}

impl Copier<'_> {
    fn copy_dir(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        rel: &Path,
        depth: usize,
    ) -> Result<(), CopyError> {
        if depth > MAX_DEPTH {
            return Err(io("descending into", rel)(Errno::ELOOP));
        }
        for n in names(src).map_err(io("listing", rel))? {
            let name = OsStr::from_bytes(&n);
            let path = rel.join(name);
            let st = match nix::sys::stat::fstatat(src, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Removed since the listing: a live volume may change while copied.
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(io("stat", &path)(e)),
            };
            match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFDIR => {
                    nix::sys::stat::mkdirat(dst, name, Mode::from_bits_truncate(0o700))
                        .map_err(io("creating", &path))?;
                    let s = match beneath(src, name, OFlag::O_DIRECTORY | OFlag::O_RDONLY) {
                        Ok(fd) => fd,
                        Err(Errno::ENOENT) => continue,
                        Err(e) => return Err(io("opening", &path)(e)),
                    };
                    let d = beneath(dst, name, OFlag::O_DIRECTORY | OFlag::O_RDONLY)
                        .map_err(io("opening copy of", &path))?;
                    self.stats.dirs += 1;
                    self.copy_dir(&s, &d, &path, depth + 1)?;
                    let st = nix::sys::stat::fstat(&s).map_err(io("stat", &path))?;
                    keep_attrs(&d, &st).map_err(io("setting attributes of", &path))?;
                    (self.progress)(&self.stats);
                }
                SFlag::S_IFREG => self.copy_file(src, dst, name, &path)?,
                SFlag::S_IFLNK => {
                    let target = match nix::fcntl::readlinkat(src, name) {
                        Ok(t) => t,
                        Err(Errno::ENOENT) => continue,
                        Err(e) => return Err(io("reading link", &path)(e)),
                    };
                    nix::unistd::symlinkat(target.as_os_str(), dst, name)
                        .map_err(io("creating link", &path))?;
                    let _ = nix::unistd::fchownat(
                        dst,
                        name,
                        Some(Uid::from_raw(st.st_uid)),
                        Some(Gid::from_raw(st.st_gid)),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    );
                    self.stats.symlinks += 1;
                }
                _ => self.stats.skipped += 1,
            }
        }
        Ok(())
    }

    fn copy_file(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        name: &OsStr,
        path: &Path,
    ) -> Result<(), CopyError> {
        let s = match beneath(src, name, OFlag::O_RDONLY) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(io("opening", path)(e)),
        };
        let st = nix::sys::stat::fstat(&s).map_err(io("stat", path))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            // Swapped for something else since the listing: not copied.
            self.stats.skipped += 1;
            return Ok(());
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if self.stats.bytes.saturating_add(size) > self.budget {
            return Err(CopyError::Budget {
                budget: self.budget,
                path: path.display().to_string(),
            });
        }
        let d = nix::fcntl::openat(
            dst,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(io("creating", path))?;
        let copied = self.copy_bytes(&s, &d, size).map_err(io("copying", path))?;
        keep_attrs(&d, &st).map_err(io("setting attributes of", path))?;
        self.stats.files += 1;
        self.stats.bytes += copied;
        Ok(())
    }

    /// The file's bytes: a reflink where the filesystem allows it, else
    /// copy_file_range, else read and write. Returns the bytes copied.
    fn copy_bytes(&mut self, s: &OwnedFd, d: &OwnedFd, size: u64) -> Result<u64, Errno> {
        if self.reflink {
            // SAFETY: both fds are open for the duration of the call; FICLONE takes the
            // source fd as its argument and writes nothing to user memory.
            let r = unsafe { libc::ioctl(d.as_raw_fd(), FICLONE as _, s.as_raw_fd()) };
            if r == 0 {
                self.stats.reflinked += 1;
                return Ok(size);
            }
            match Errno::last() {
                e if clone_unsupported(e) => self.reflink = false,
                e => return Err(e),
            }
        }
        let mut total = 0u64;
        let mut range = true;
        loop {
            let n = if range {
                match copy_range(s, d) {
                    Ok(n) => n,
                    Err(Errno::EXDEV | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::EINVAL) => {
                        range = false;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                read_write(s, d)?
            };
            if n == 0 {
                break;
            }
            total += n as u64;
            if total > self.budget.saturating_sub(self.stats.bytes) {
                // The file grew while copied, past what the destination may hold.
                return Err(Errno::EFBIG);
            }
        }
        Ok(total)
    }
}

fn copy_range(s: &OwnedFd, d: &OwnedFd) -> Result<usize, Errno> {
    // SAFETY: both fds are open; null offsets use (and advance) the file positions.
    let n = unsafe {
        libc::copy_file_range(
            s.as_raw_fd(),
            std::ptr::null_mut(),
            d.as_raw_fd(),
            std::ptr::null_mut(),
            CHUNK,
            0,
        )
    };
    usize::try_from(n).map_err(|_| Errno::last())
}

fn read_write(s: &OwnedFd, d: &OwnedFd) -> Result<usize, Errno> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = nix::unistd::read(s, &mut buf)?;
    let mut off = 0;
    while off < n {
        off += nix::unistd::write(d, &buf[off..n])?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests;
