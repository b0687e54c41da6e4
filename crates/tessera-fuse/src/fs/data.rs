//! File data: open, read, write, copy_file_range, fallocate, truncation, lseek, flush,
//! fsync and release.
//!
//! **Writes in flight.** With a handoff state, every WRITE is journaled: recorded
//! before its data is written, marked applied after, forgotten once answered; a
//! request the kernel resends after a takeover is decided from the predecessor's
//! record ([`super::journal`]), so it is never applied twice.
//!
//! **Quota.** Every operation that can grow a file asks the quota for the growth first
//! (`Enforcement::reserve_up_to` or `reserve`), under the inode's size lock so the size
//! it computes from stays put, makes the syscall, and gives back what it did not use;
//! shrinking releases after it succeeded (see [`crate::quota`]). In backend mode
//! these quota calls grant everything; a write the daemon does itself (direct or
//! cached opens) is held to the limit by the backing filesystem like any other.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::AtomicU8;

use super::handles::Handle;
use super::inodes::Inode;
use super::journal::{Journaled, Replay, replay};
use super::perms;
use super::record::JournalSlot;
use super::{Caller, FileKind, FsError, NodeId, Opened, Result, VolumeFs, WriteReq, lock};
use crate::quota::Mode;
use crate::sys::{self, Errno, Op, SysError};

impl VolumeFs {
    /// Flags for the backing open of a file the kernel opens with `flags`.
    pub(super) fn backing_flags(flags: i32) -> i32 {
        // O_DIRECT: our buffers are not aligned, and the kernel already bypassed its
        // cache for the caller. O_TRUNC: the kernel truncates through setattr (we do
        // not negotiate atomic O_TRUNC), where the quota sees it. O_APPEND stays, so
        // appends land at the backing file's end even if it changed behind us.
        flags
            & !(libc::O_CREAT
                | libc::O_EXCL
                | libc::O_NOCTTY
                | libc::O_NOFOLLOW
                | libc::O_DIRECT
                | libc::O_TRUNC
                | libc::O_CLOEXEC)
    }

    pub(super) fn new_file_handle(
        &self,
        inode: Arc<Inode>,
        file: OwnedFd,
        flags: i32,
    ) -> Result<Opened> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let mode = self.choose_mode(&inode, file.as_fd(), flags)?;
        let fh = self.handles.add(
            Handle {
                inode,
                file,
                mode: AtomicU8::new(mode as u8),
                writable,
                append: flags & libc::O_APPEND != 0,
                dir: None,
            },
            flags,
        );
        Ok(Opened { fh, mode })
    }

    pub fn open(&self, id: NodeId, flags: i32) -> Result<Opened> {
        let inode = self.inode(id)?;
        if inode.kind != FileKind::Regular {
            return Err(FsError::WrongType("open"));
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.writable()?;
        }
        let file = sys::reopen(
            self.proc_fd.as_fd(),
            self.fd(&inode)?.as_fd(),
            Self::backing_flags(flags),
        )
        .op("open")?;
        self.new_file_handle(inode, file, flags)
    }

    pub fn read(&self, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let h = self.handle(fh)?;
        // FUSE wants the full count except at end of file.
        let mut done = 0;
        while done < buf.len() {
            let n =
                sys::pread(h.file.as_fd(), &mut buf[done..], offset + done as u64).op("read")?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    /// Write `data` at `offset`, within the quota: the part that would grow the volume
    /// past its capacity is cut off (a short write), and a write of which nothing fits
    /// fails with ENOSPC. Nothing already written is touched.
    ///
    /// `kill_suidgid`: the writer, when it lacks `CAP_FSETID`, so set-user/group-ID
    /// bits go (the kernel leaves that to the daemon, see `FUSE_HANDLE_KILLPRIV_V2`).
    pub fn write(
        &self,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: Option<Caller>,
    ) -> Result<usize> {
        let req = WriteReq {
            unique: 0,
            resent: false,
        };
        Ok(self.write_request(req, fh, offset, data, kill_suidgid)?.0)
    }

    /// [`Self::write`] for the kernel's request `req`, journaled (with a handoff
    /// state): the guard returned is dropped once the reply is sent. A request the
    /// kernel resent after a takeover is answered from the predecessor's journal
    /// instead of being applied twice (see [`super::journal`]).
    pub fn write_request(
        &self,
        req: WriteReq,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: Option<Caller>,
    ) -> Result<(usize, Option<Journaled>)> {
        self.writable()?;
        let h = self.handle(fh)?;
        let _size = lock(&h.inode.size_lock);
        let mut skip = 0;
        let mut carried = None;
        let mut size_before = None;
        if req.resent
            && let Some((rec, guard)) = self.journal.take_carried(req.unique)
        {
            let (landed, size) = if rec.append && rec.applied.is_none() {
                let size = sys::fstat(h.file.as_fd()).op("fstat")?.st_size as u64;
                (self.landed(&h, rec.size_before, data), size)
            } else {
                (0, 0)
            };
            let decision = replay(Some(&rec), fh, data.len(), landed, size);
            tracing::info!(
                unique = req.unique,
                ?decision,
                "a WRITE the predecessor had begun, resent"
            );
            match decision {
                Replay::Answer(n) => return Ok((n, guard)),
                Replay::Rest { skip: s } => {
                    skip = s;
                    size_before = Some(rec.size_before);
                }
                Replay::Write => {}
            }
            carried = guard;
        }
        let st = sys::fstat(h.file.as_fd()).op("fstat")?;
        if let Some(caller) = kill_suidgid
            && st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0
        {
            self.kill_suidgid(&h.inode, caller, Some(&st))?;
        }
        let size = st.st_size as u64;
        let offset = if h.append { size } else { offset };
        let journaled = (req.unique != 0)
            .then(|| {
                self.journal.begin(&JournalSlot {
                    unique: req.unique,
                    fh,
                    offset,
                    len: data.len() as u64,
                    size_before: size_before.unwrap_or(size),
                    append: h.append,
                    applied: None,
                })
            })
            .flatten();
        // Recorded anew: the predecessor's slot can go.
        drop(carried);
        let done = skip + self.write_at(&h, size, offset, &data[skip..])?;
        if let Some(j) = &journaled {
            j.applied(done);
        }
        Ok((done, journaled))
    }

    /// How many leading bytes of `data` the backing file holds at `at` (where an
    /// append the predecessor was writing would have landed).
    fn landed(&self, h: &Handle, at: u64, data: &[u8]) -> usize {
        let file = self.fd(&h.inode).and_then(|fd| {
            Ok(sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), libc::O_RDONLY).op("open")?)
        });
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "a resent append cannot be checked: written again");
                return 0;
            }
        };
        let mut buf = vec![0u8; data.len()];
        let mut got = 0;
        while got < buf.len() {
            match sys::pread(file.as_fd(), &mut buf[got..], at + got as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        buf[..got]
            .iter()
            .zip(data)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Write `data` at `offset` of `h`'s file of size `size`, within the quota.
    fn write_at(&self, h: &Handle, size: u64, offset: u64, data: &[u8]) -> Result<usize> {
        let end = offset.checked_add(data.len() as u64).ok_or(SysError {
            op: "write",
            errno: Errno::EFBIG,
        })?;
        let growth = end.saturating_sub(size);
        let granted = self.quota.reserve_up_to(growth);
        let allowed = (data.len() as u64).saturating_sub(growth - granted) as usize;
        if allowed == 0 && !data.is_empty() {
            self.quota.release(granted);
            return Err(FsError::QuotaExceeded);
        }
        let mut done = 0;
        while done < allowed {
            match sys::pwrite(h.file.as_fd(), &data[done..allowed], offset + done as u64)
                .op("write")
            {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if done == 0 => {
                    self.quota.release(granted);
                    return Err(e.into());
                }
                Err(_) => break,
            }
        }
        let grown = (offset + done as u64).saturating_sub(size);
        self.quota.release(granted.saturating_sub(grown));
        Ok(done)
    }

    /// `copy_file_range` between two open files, within the quota like [`Self::write`].
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<usize> {
        self.writable()?;
        let hin = self.handle(fh_in)?;
        let hout = self.handle(fh_out)?;
        let _size = lock(&hout.inode.size_lock);
        let size = sys::fstat(hout.file.as_fd()).op("fstat")?.st_size as u64;
        let in_size = sys::fstat(hin.file.as_fd()).op("fstat")?.st_size as u64;
        // Bytes past the source's end are not copied; do not reserve for them.
        let len = len.min(in_size.saturating_sub(off_in));
        if len == 0 {
            return Ok(0);
        }
        let end = off_out.saturating_add(len);
        let growth = end.saturating_sub(size);
        let granted = self.quota.reserve_up_to(growth);
        let allowed = len.saturating_sub(growth - granted);
        if allowed == 0 {
            self.quota.release(granted);
            return Err(FsError::QuotaExceeded);
        }
        let n = match sys::copy_file_range(
            hin.file.as_fd(),
            off_in,
            hout.file.as_fd(),
            off_out,
            allowed,
        )
        .op("copy_file_range")
        {
            Ok(n) => n,
            Err(e) => {
                self.quota.release(granted);
                return Err(e.into());
            }
        };
        let grown = (off_out + n as u64).saturating_sub(size);
        self.quota.release(granted.saturating_sub(grown));
        Ok(n)
    }

    /// `fallocate`. With the daemon's quota, preallocation past the end of file
    /// (`FALLOC_FL_KEEP_SIZE` without punching a hole) is refused: it takes disk space
    /// without changing the size the daemon counts. A project quota counts blocks, so
    /// there it is allowed.
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.writable()?;
        let h = self.handle(fh)?;
        let _size = lock(&h.inode.size_lock);
        let size = sys::fstat(h.file.as_fd()).op("fstat")?.st_size as u64;
        let end = offset.saturating_add(len);
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let predicted = if mode & libc::FALLOC_FL_INSERT_RANGE != 0 {
            len
        } else if mode & libc::FALLOC_FL_COLLAPSE_RANGE != 0 || keep_size {
            if keep_size && !punch && end > size && self.quota.mode() == Mode::Daemon {
                return Err(FsError::Unsupported("preallocation past the end of file"));
            }
            0
        } else {
            end.saturating_sub(size)
        };
        if !self.quota.reserve(predicted) {
            return Err(FsError::QuotaExceeded);
        }
        if let Err(e) = sys::fallocate(h.file.as_fd(), mode, offset, len).op("fallocate") {
            self.quota.release(predicted);
            return Err(e.into());
        }
        let new = sys::fstat(h.file.as_fd()).op("fstat")?.st_size as u64;
        if new >= size {
            let grown = new - size;
            if grown > predicted {
                self.quota.charge(grown - predicted);
            } else {
                self.quota.release(predicted - grown);
            }
        } else {
            self.quota.release(predicted + (size - new));
        }
        Ok(())
    }

    pub(super) fn truncate(
        &self,
        inode: &Arc<Inode>,
        handle: Option<&Handle>,
        size: u64,
    ) -> Result<()> {
        match inode.kind {
            FileKind::Regular => {}
            FileKind::Directory => {
                return Err(FsError::Sys(SysError {
                    op: "truncate",
                    errno: Errno::EISDIR,
                }));
            }
            _ => return Err(FsError::WrongType("truncate")),
        }
        let _size = lock(&inode.size_lock);
        let reopened;
        let fd = match handle.filter(|h| h.writable) {
            Some(h) => h.file.as_fd(),
            None => {
                reopened = sys::reopen(
                    self.proc_fd.as_fd(),
                    self.fd(inode)?.as_fd(),
                    libc::O_WRONLY,
                )
                .op("open for truncate")?;
                reopened.as_fd()
            }
        };
        let old = sys::fstat(fd).op("fstat")?.st_size as u64;
        if size > old {
            if !self.quota.reserve(size - old) {
                return Err(FsError::QuotaExceeded);
            }
            if let Err(e) = sys::ftruncate(fd, size).op("ftruncate") {
                self.quota.release(size - old);
                return Err(e.into());
            }
        } else {
            sys::ftruncate(fd, size).op("ftruncate")?;
            self.quota.release(old - size);
        }
        Ok(())
    }

    /// Drop set-user-ID, and set-group-ID as the kernel would (see
    /// `perms::kept_after_write`), as a write or truncation by `caller`, who lacks
    /// `CAP_FSETID`, must. `st` is the current stat when the caller has it at hand.
    pub(super) fn kill_suidgid(
        &self,
        inode: &Arc<Inode>,
        caller: Caller,
        st: Option<&libc::stat>,
    ) -> Result<()> {
        let (group, mode) = match st {
            Some(st) => (st.st_gid, st.st_mode),
            None => {
                let st = sys::fstat(self.fd(inode)?.as_fd()).op("stat")?;
                (st.st_gid, st.st_mode)
            }
        };
        let keep = perms::kept_after_write(caller, (group, mode), || perms::of_process(caller));
        if keep != mode & 0o7777 {
            let fd = self.fd(inode)?;
            sys::chmod_fd(self.proc_fd.as_fd(), fd.as_fd(), keep).op("chmod")?;
        }
        Ok(())
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        let h = self.handle(fh)?;
        Ok(sys::lseek(h.file.as_fd(), offset, whence).op("lseek")?)
    }

    pub fn flush(&self, fh: u64) -> Result<()> {
        let h = self.handle(fh)?;
        Ok(sys::flush(h.file.as_fd()).op("flush")?)
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        let h = self.handle(fh)?;
        Ok(sys::fsync(h.file.as_fd(), datasync).op("fsync")?)
    }

    pub fn release(&self, fh: u64) -> Result<()> {
        let h = self.handles.take(fh)?;
        self.forget_lock_owners(h.ino());
        if Self::count_release(&h) {
            match sys::fstat(h.file.as_fd()) {
                Ok(st) if st.st_nlink == 0 => self.quota.release(st.st_size as u64),
                // Linked again meanwhile (linkat of an open file): still counted.
                _ => {}
            }
        }
        Ok(())
    }
}
