//! The `fuser::Filesystem` of a volume: a thin translation between fuser's request
//! and reply types and the core ([`super::fs::VolumeFs`]).
//!
//! What lives here and not in the core is what only makes sense to FUSE: negotiating
//! the connection in `init` (max write, readdirplus, passthrough), the kernel's
//! passthrough backing ids (one per inode, shared by that inode's passthrough opens,
//! dropped with the last of them), the open flags that tell the kernel which I/O mode
//! a file uses, and the attribute/entry cache lifetimes. Locks: [`locks`]; backing ids:
//! [`backing`].
//!
//! Every failure from the core reaches the kernel through [`errno`], using
//! [`super::fs::FsError::errno`], the single errno mapping. Every request is counted
//! by kind on entry and timed until its handler returns, after the reply (the guard
//! `_timed`), every error in [`errno`], and the bytes read and written on success
//! ([`super::contract::counters`]: relaxed atomic adds, two clock reads a request).

use std::cell::RefCell;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, Notifier, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    RequestId, TimeOrNow, WriteFlags,
};

use self::backing::Backing;
use super::contract::counters::{self, Op, Slot};
use super::fs::{Attr, FsError, IoMode, LockSpec, SetAttr, VolumeFs, Waiters, WriteReq, Xattr};
use super::quota::Mode;
use convert::{caller, file_attr, file_type, set_time};

#[macro_use]
mod fenced;
mod backing;
mod coherence;
mod convert;
pub mod fault;
mod live_ttl;
mod locks;

/// The bit the kernel sets in the `unique` of a request it queues again after
/// `FUSE_NOTIFY_RESEND` (`FUSE_UNIQUE_RESEND`, Linux 6.9; fuser passes it on).
const FUSE_UNIQUE_RESEND: u64 = 1 << 63;

/// Largest write the kernel sends in one request.
pub const MAX_WRITE: u32 = 1 << 20;

/// statfs `f_type` of overlayfs and FUSE: backing directories on a stacked
/// filesystem need one more level of stacking for passthrough.
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

pub use self::backing::BackingAdopter;
pub use self::coherence::is_local_fs;
pub use self::live_ttl::LiveTtl;

/// How the adapter talks to the kernel.
#[derive(Debug, Clone)]
pub struct AdapterOptions {
    /// How long the kernel may cache attributes and names (changed live by the
    /// settings file, see `fuse::settings`).
    pub ttl: LiveTtl,
    /// How long the kernel may cache that a name does not exist (zero: not at all).
    pub negative_ttl: Duration,
    /// Try kernel passthrough (for read-only opens, or for all opens when the
    /// backing filesystem enforces the quota).
    pub passthrough: bool,
    /// Serve flock and POSIX locks on the backing files (the backend holds locks);
    /// otherwise each mount's kernel keeps its own.
    pub locks: bool,
    /// Drop a file's cached attributes on every open (a shared backend).
    pub close_to_open: bool,
    /// Self-fencing: what every mutation passes (`--fence-file`).
    pub fence: Option<Arc<crate::fence_gate::Gate>>,
}

/// The FUSE face of a volume.
#[derive(Debug)]
pub struct Adapter {
    fs: Arc<VolumeFs>,
    options: AdapterOptions,
    backing: Arc<Mutex<Backing>>,
    /// Flags of every regular-file open (see `init`).
    open_flags: FopenFlags,
    waiters: Arc<Waiters>,
    notifier: Arc<OnceLock<Notifier>>,
}

/// The errno replied for `e` (and counted: every error from the core passes here).
fn errno(e: &FsError) -> Errno {
    counters::table().error(e.errno());
    Errno::from_i32(e.errno())
}

thread_local! {
    /// Each worker thread's read buffer: reads up to 1 MiB would otherwise cost an
    /// mmap/munmap pair per request.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Adapter {
    pub fn new(fs: Arc<VolumeFs>, options: AdapterOptions) -> Self {
        Adapter {
            fs,
            options,
            backing: Arc::default(),
            open_flags: FopenFlags::empty(),
            waiters: Waiters::new(locks::MAX_WAITS),
            notifier: Arc::default(),
        }
    }

    fn entry(&self, reply: ReplyEntry, r: Result<Attr, FsError>) {
        match r {
            Ok(a) => reply.entry(&self.options.ttl.get(), &file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fopen_flags(&self, mode: IoMode) -> FopenFlags {
        match mode {
            IoMode::Direct => self.open_flags | FopenFlags::FOPEN_DIRECT_IO,
            IoMode::Passthrough | IoMode::Cached => self.open_flags,
        }
    }

    fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let caps = config.capabilities();
        // Wanted when the kernel has them; none is required.
        let wanted = [
            // readdir with attributes: `ls -l` without a lookup per entry.
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            // Lookups and readdirs of one directory in parallel: the core holds no
            // per-directory state that needs the kernel's serialization.
            InitFlags::FUSE_PARALLEL_DIROPS,
            // Drop cached pages when a file's mtime or size changed behind the kernel
            // (another node writing to a shared backend).
            InitFlags::FUSE_AUTO_INVAL_DATA,
            // Symlink targets never change in place.
            InitFlags::FUSE_CACHE_SYMLINKS,
            // The daemon clears set-user/group-ID on writes and truncations (it is
            // told when in each request). Without this the kernel asks for the
            // security.capability xattr before every single write: a second round
            // trip per write.
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ];
        for flag in wanted {
            if caps.contains(flag) {
                let _ = config.add_capabilities(flag);
            }
        }
        // Not negotiated, on purpose: FUSE_WRITEBACK_CACHE (the kernel would
        // acknowledge writes before the daemon sees them, so a write past the quota
        // would succeed and its data be dropped later; it would also make the kernel
        // trust its own size and mtime over the backing file's, wrong on a shared
        // backend. Without it every write invalidates the file's cached size and
        // times, so the first stat after a write is a GETATTR round trip) and
        // FUSE_ATOMIC_O_TRUNC (truncation arrives as setattr, where the quota sees it).
        let locks = self.negotiate_locks(config);
        let fs_type = self.fs.backing_fs_type().ok();
        // FLUSH (on every close) exists so a network filesystem can push data to its
        // server at close, which later opens on other nodes rely on; it is a wasted
        // round trip on a local one, unless it carries a lock owner's unlock.
        if fs_type.is_some_and(is_local_fs) && !locks {
            self.open_flags = FopenFlags::FOPEN_NOFLUSH;
        }
        let mut passthrough = false;
        if self.options.passthrough && caps.contains(InitFlags::FUSE_PASSTHROUGH) {
            let depth = match fs_type {
                Some(OVERLAYFS_SUPER_MAGIC | FUSE_SUPER_MAGIC) => 2,
                _ => 1,
            };
            if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(depth).is_ok()
            {
                passthrough = true;
            }
        }
        self.fs.set_passthrough(passthrough);
        tracing::info!(
            kernel_abi = %format!("{:?}", config.kernel_abi()),
            passthrough,
            passthrough_opens = match (passthrough, self.fs.quota_mode()) {
                (false, _) => "none",
                (true, Mode::Daemon) => "read-only",
                (true, Mode::Backend) => "all",
            },
            max_write = MAX_WRITE,
            locks,
            noflush = !self.open_flags.is_empty(),
            "FUSE connection initialised"
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _timed = counters::op(Op::Lookup);
        match self.fs.lookup(parent.0, name) {
            // A negative entry: node id 0, cached for `negative_ttl`.
            Err(e) if e.errno() == libc::ENOENT && !self.options.negative_ttl.is_zero() => {
                let attr = FileAttr {
                    ino: INodeNo(0),
                    ..file_attr(&Attr::NEGATIVE)
                };
                reply.entry(&self.options.negative_ttl, &attr, Generation(0))
            }
            r => self.entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _timed = counters::op(Op::Forget);
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _timed = counters::op(Op::Getattr);
        match self.fs.getattr(ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&self.options.ttl.get(), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _timed = counters::op(Op::Setattr);
        fenced!(self, reply);
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            fh: fh.map(|f| f.0),
            // The kernel asks for this (FATTR_KILL_SUIDGID) when the caller lacks
            // CAP_FSETID, but fuser does not pass the flag on; a non-root caller is
            // the closest reading of it.
            kill_suidgid: (size.is_some() && req.uid() != 0).then(|| caller(req)),
        };
        match self.fs.setattr(ino.0, set) {
            Ok(a) => reply.attr(&self.options.ttl.get(), &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _timed = counters::op(Op::Readlink);
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _timed = counters::op(Op::Create);
        fenced!(self, reply);
        self.entry(
            reply,
            self.fs.mknod(caller(req), parent.0, name, mode, rdev),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _timed = counters::op(Op::Create);
        fenced!(self, reply);
        self.entry(reply, self.fs.mkdir(caller(req), parent.0, name, mode));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = counters::op(Op::Remove);
        fenced!(self, reply);
        Self::empty(reply, self.fs.unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = counters::op(Op::Remove);
        fenced!(self, reply);
        Self::empty(reply, self.fs.rmdir(parent.0, name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _timed = counters::op(Op::Create);
        fenced!(self, reply);
        self.entry(
            reply,
            self.fs.symlink(caller(req), parent.0, link_name, target),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Rename);
        fenced!(self, reply);
        Self::empty(
            reply,
            self.fs
                .rename(parent.0, name, newparent.0, newname, flags.bits()),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timed = counters::op(Op::Create);
        fenced!(self, reply);
        self.entry(reply, self.fs.link(ino.0, newparent.0, newname));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _timed = counters::op(Op::Open);
        if self.stale(ino) {
            return reply.error(Errno::from_i32(libc::ESTALE));
        }
        let opened = match self.fs.open(ino.0, flags.0) {
            Ok(o) => o,
            Err(e) => return reply.error(errno(&e)),
        };
        self.revalidate(ino);
        if opened.mode == IoMode::Passthrough {
            let registered = self.backing_id(opened, |fs| {
                let h = fs.handle(opened.fh).map_err(std::io::Error::other)?;
                reply.open_backing(h.fd())
            });
            match registered {
                Ok(id) => {
                    return reply.opened_passthrough(FileHandle(opened.fh), self.open_flags, &id);
                }
                Err(err) => self.passthrough_failed(opened.fh, &err),
            }
        }
        reply.opened(FileHandle(opened.fh), self.fopen_flags(opened.mode));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _timed = counters::op(Op::Create);
        fenced!(self, reply);
        let (attr, opened) = match self.fs.create(caller(req), parent.0, name, mode, flags) {
            Ok(r) => r,
            Err(e) => return reply.error(errno(&e)),
        };
        let ttl = self.options.ttl.get();
        let fattr = file_attr(&attr);
        if opened.mode == IoMode::Passthrough {
            let registered = self.backing_id(opened, |fs| {
                let h = fs.handle(opened.fh).map_err(std::io::Error::other)?;
                reply.open_backing(h.fd())
            });
            match registered {
                Ok(id) => {
                    return reply.created_passthrough(
                        &ttl,
                        &fattr,
                        Generation(0),
                        FileHandle(opened.fh),
                        self.open_flags,
                        &id,
                    );
                }
                Err(err) => self.passthrough_failed(opened.fh, &err),
            }
        }
        reply.created(
            &ttl,
            &fattr,
            Generation(0),
            FileHandle(opened.fh),
            self.fopen_flags(opened.mode),
        );
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _timed = counters::op(Op::Read);
        READ_BUF.with_borrow_mut(|buf| {
            if buf.len() < size as usize {
                buf.resize(size as usize, 0);
            }
            match self.fs.read(fh.0, offset, &mut buf[..size as usize]) {
                Ok(n) => {
                    counters::table().bytes(Slot::ReadBytes, n as u64);
                    reply.data(&buf[..n])
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _timed = counters::op(Op::Write);
        fenced!(self, reply);
        let kill = write_flags
            .contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            .then(|| caller(req));
        let unique = req.unique().0;
        let w = WriteReq {
            unique: unique & !FUSE_UNIQUE_RESEND,
            resent: unique & FUSE_UNIQUE_RESEND != 0,
        };
        match self.fs.write_request(w, fh.0, offset, data, kill) {
            Ok((n, journaled)) => {
                counters::table().bytes(Slot::WrittenBytes, n as u64);
                fault::after_write();
                reply.written(n as u32);
                // Answered: the kernel will not resend it.
                drop(journaled);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Flush);
        self.unlock_owner(fh.0, lock_owner.0);
        Self::empty(reply, self.fs.flush(fh.0));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Release);
        self.release_flock(fh.0, lock_owner.is_some());
        self.release_backing(fh.0);
        Self::empty(reply, self.fs.release(fh.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Fsync);
        fenced!(self, reply);
        Self::empty(reply, self.fs.fsync(fh.0, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _timed = counters::op(Op::Open);
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _timed = counters::op(Op::Readdir);
        let r = self.fs.readdir(fh.0, offset as i64, |e| {
            reply.add(INodeNo(e.ino), e.offset as u64, file_type(e.kind), e.name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _timed = counters::op(Op::Readdir);
        let ttl = self.options.ttl.get();
        let r = self.fs.readdirplus(fh.0, offset as i64, |e, attr| {
            reply.add(
                INodeNo(e.ino),
                e.offset as u64,
                e.name,
                &ttl,
                &file_attr(attr),
                Generation(0),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Release);
        Self::empty(reply, self.fs.releasedir(fh.0));
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Fsync);
        fenced!(self, reply);
        Self::empty(reply, self.fs.fsyncdir(fh.0, datasync));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _timed = counters::op(Op::Statfs);
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Xattr);
        fenced!(self, reply);
        Self::empty(reply, self.fs.setxattr(ino.0, name, value, flags));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _timed = counters::op(Op::Xattr);
        match self.fs.getxattr(ino.0, name, size) {
            Ok(Xattr::Size(n)) => reply.size(n),
            Ok(Xattr::Data(v)) => reply.data(&v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _timed = counters::op(Op::Xattr);
        match self.fs.listxattr(ino.0, size) {
            Ok(Xattr::Size(n)) => reply.size(n),
            Ok(Xattr::Data(v)) => reply.data(&v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = counters::op(Op::Xattr);
        fenced!(self, reply);
        Self::empty(reply, self.fs.removexattr(ino.0, name));
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _timed = counters::op(Op::Access);
        Self::empty(reply, self.fs.access(caller(req), ino.0, mask.bits()));
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Fallocate);
        fenced!(self, reply);
        Self::empty(reply, self.fs.fallocate(fh.0, offset, length, mode));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _timed = counters::op(Op::Lseek);
        match self.fs.lseek(fh.0, offset, whence) {
            Ok(off) => reply.offset(off),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let _timed = counters::op(Op::Lock);
        self.serve_getlk(fh.0, lock_owner.0, LockSpec { typ, start, end }, reply);
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        lk_flags: u32,
        reply: ReplyEmpty,
    ) {
        let _timed = counters::op(Op::Lock);
        let spec = LockSpec { typ, start, end };
        let flock = lk_flags & fuser::consts::FUSE_LK_FLOCK != 0;
        let (fh, owner) = (fh.0, lock_owner.0);
        self.serve_setlk(
            req.unique().0,
            ino,
            fh,
            owner,
            spec,
            pid,
            sleep,
            flock,
            reply,
        );
    }

    fn interrupt(&self, _req: &Request, unique: RequestId) -> Result<(), Errno> {
        self.waiters.interrupt(unique.0);
        Ok(())
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _timed = counters::op(Op::CopyFileRange);
        fenced!(self, reply);
        match self
            .fs
            // The reply carries a 32-bit count.
            .copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len.min(1 << 30))
        {
            Ok(n) => {
                counters::table().bytes(Slot::WrittenBytes, n as u64);
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }
}
