//! A null FUSE filesystem: the round-trip floor `bench/fuse/run.sh` measures
//! `tessera mount` against (`cargo build --release --example nullfs`).
//!
//! It speaks to the kernel exactly as `tessera mount` does on a node-local backing
//! filesystem in daemon quota mode: the same fuser version, 4 worker threads each with
//! its own `/dev/fuse` descriptor (`clone_fd`), the same mount options
//! (`default_permissions`, `allow_other`), the same `init` negotiation (1 MiB max
//! write, readdirplus, parallel dirops, auto inval data, cache symlinks,
//! handle_killpriv_v2; no writeback cache), 60 s entry, attribute and negative-entry
//! lifetimes, `FOPEN_NOFLUSH` on every open and `FOPEN_DIRECT_IO` on write-only ones
//! (see `crates/tessera-fuse/src/lib.rs` `run` and `crates/tessera-fuse/src/adapter/mod.rs` `init`). Behind that it does
//! nothing: names, attributes and sizes live in one in-memory table, and data is not
//! kept (writes only move the size; reads are not supported). So a request costs the
//! kernel's round trip plus a hash lookup, and `tessera ÷ nullfs` per operation is
//! what the real filesystem adds to the round trip.
//!
//! The table's lock is never held while a reply is written: the reply wakes the
//! caller, whose next request another worker thread would otherwise find locked. A
//! first version that replied under the lock made 8.5 futex calls per metabench file
//! (strace -f -c), tessera 2.2; this one makes none.
//!
//! Enough for `bench/fuse/metabench.c` and the script around it: lookup, getattr,
//! setattr (size, mode, times), mkdir, rmdir, create, open, write, flush, release,
//! unlink, forget, opendir, readdir(plus), releasedir. Anything else answers ENOSYS.
//!
//! Usage: `nullfs MOUNTPOINT` (as root). Serves until unmounted (`umount MOUNTPOINT`),
//! then prints the requests it answered, by kind, on stderr.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request,
    SessionACL, TimeOrNow, WriteFlags,
};

/// `tessera mount`'s lifetimes on a node-local backing filesystem
/// (`CachePolicy::LOCAL_TTL`), for entries, attributes and non-existence alike.
const TTL: Duration = Duration::from_secs(60);
/// `tessera mount --threads` default.
const THREADS: usize = 4;
/// `adapter::MAX_WRITE`.
const MAX_WRITE: u32 = 1 << 20;

/// One file or directory.
struct Node {
    attr: FileAttr,
    /// Names in a directory; `None` for a file.
    children: Option<BTreeMap<OsString, u64>>,
    parent: u64,
    /// References the kernel holds (entries replied minus forgotten).
    lookups: u64,
}

/// A directory entry as readdir(plus) lists it.
struct Listed {
    name: OsString,
    attr: FileAttr,
}

/// Every name and attribute of the filesystem.
struct Tree {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

impl Tree {
    fn new() -> Self {
        let now = SystemTime::now();
        let root = Node {
            attr: attr(INodeNo::ROOT.0, FileType::Directory, 0o755, 0, 0, now),
            children: Some(BTreeMap::new()),
            parent: INodeNo::ROOT.0,
            lookups: 1,
        };
        Tree {
            nodes: HashMap::from([(INodeNo::ROOT.0, root)]),
            next_ino: INodeNo::ROOT.0 + 1,
        }
    }

    fn dir(&mut self, ino: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        let node = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        node.children.as_mut().ok_or(Errno::ENOTDIR)
    }

    fn node(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    /// The attributes of `name` in `parent`, referenced once more by the kernel, or
    /// None if there is no such name.
    fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<Option<FileAttr>, Errno> {
        let Some(ino) = self.dir(parent)?.get(name).copied() else {
            return Ok(None);
        };
        let node = self.node(ino)?;
        node.lookups += 1;
        Ok(Some(node.attr))
    }

    fn forget(&mut self, ino: u64, nlookup: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(nlookup);
            if node.lookups == 0 && node.attr.nlink == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    /// A new node named `name` in `parent`, referenced once by the kernel.
    fn add(
        &mut self,
        parent: u64,
        name: &OsStr,
        attr: FileAttr,
        dir: bool,
    ) -> Result<FileAttr, Errno> {
        let ino = self.next_ino;
        let entries = self.dir(parent)?;
        if entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        entries.insert(name.to_owned(), ino);
        self.next_ino += 1;
        let attr = FileAttr {
            ino: INodeNo(ino),
            ..attr
        };
        let node = Node {
            attr,
            children: dir.then(BTreeMap::new),
            parent,
            lookups: 1,
        };
        self.nodes.insert(ino, node);
        Ok(attr)
    }

    /// Drop `name` from `parent`; the node goes when the kernel forgets it.
    fn remove(&mut self, parent: u64, name: &OsStr, want_dir: bool) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.get(name).ok_or(Errno::ENOENT)?;
        let node = self.node(ino)?;
        match (&node.children, want_dir) {
            (Some(_), false) => return Err(Errno::EISDIR),
            (None, true) => return Err(Errno::ENOTDIR),
            (Some(c), true) if !c.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        node.attr.nlink = 0;
        node.attr.ctime = SystemTime::now();
        let gone = node.lookups == 0;
        self.dir(parent)?.remove(name);
        if gone {
            self.nodes.remove(&ino);
        }
        Ok(())
    }

    fn setattr(
        &mut self,
        ino: u64,
        mode: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
    ) -> Result<FileAttr, Errno> {
        let a = &mut self.node(ino)?.attr;
        let now = SystemTime::now();
        let time = |t: TimeOrNow| match t {
            TimeOrNow::Now => now,
            TimeOrNow::SpecificTime(t) => t,
        };
        if let Some(mode) = mode {
            a.perm = (mode & 0o7777) as u16;
        }
        if let Some(size) = size {
            a.size = size;
            a.mtime = now;
        }
        if let Some(t) = atime {
            a.atime = time(t);
        }
        if let Some(t) = mtime {
            a.mtime = time(t);
        }
        a.ctime = now;
        Ok(*a)
    }

    /// A write of `len` bytes at `offset`: only the size and times move.
    fn write(&mut self, ino: u64, offset: u64, len: usize) -> Result<(), Errno> {
        let a = &mut self.node(ino)?.attr;
        a.size = a.size.max(offset + len as u64);
        a.blocks = a.size.div_ceil(512);
        a.mtime = SystemTime::now();
        a.ctime = a.mtime;
        Ok(())
    }

    /// Whether `ino` is a directory.
    fn is_dir(&mut self, ino: u64) -> Result<bool, Errno> {
        Ok(self.node(ino)?.children.is_some())
    }

    /// The entries of directory `ino` from `offset` on (`.` and `..` first).
    fn list(&self, ino: u64, offset: u64) -> Result<Vec<Listed>, Errno> {
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let children = node.children.as_ref().ok_or(Errno::ENOTDIR)?;
        let parent = self.nodes.get(&node.parent).map_or(node.attr, |p| p.attr);
        let dots = [(".", node.attr), ("..", parent)].map(|(name, attr)| Listed {
            name: name.into(),
            attr,
        });
        let named = children.iter().map(|(name, i)| Listed {
            name: name.clone(),
            attr: self.nodes[i].attr,
        });
        Ok(dots
            .into_iter()
            .chain(named)
            .skip(offset as usize)
            .collect())
    }
}

fn attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32, now: SystemTime) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The kinds of request answered, in the order of [`Counters`].
#[derive(Clone, Copy)]
enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Mkdir,
    Unlink,
    Rmdir,
    Open,
    Create,
    Write,
    Flush,
    Release,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
}

const OP_NAMES: [&str; 16] = [
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "mkdir",
    "unlink",
    "rmdir",
    "open",
    "create",
    "write",
    "flush",
    "release",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
];

/// The requests answered, by kind (printed at exit).
struct Counters([AtomicU64; OP_NAMES.len()]);

impl Counters {
    fn summary(&self) -> String {
        let counts = OP_NAMES.iter().zip(&self.0);
        counts
            .map(|(op, n)| (op, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .map(|(op, n)| format!("{op}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

struct NullFs {
    tree: Mutex<Tree>,
    counters: Arc<Counters>,
}

impl NullFs {
    fn count(&self, op: Op) {
        self.counters.0[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The tree, for a request of kind `op` (counted). Callers drop the guard before
    /// they reply.
    fn tree(&self, op: Op) -> MutexGuard<'_, Tree> {
        self.count(op);
        self.tree.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `tessera mount`'s open flags in daemon quota mode on a local filesystem.
    fn open_flags(flags: i32) -> FopenFlags {
        if flags & libc::O_ACCMODE == libc::O_WRONLY {
            FopenFlags::FOPEN_NOFLUSH | FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::FOPEN_NOFLUSH
        }
    }

    fn entry(reply: ReplyEntry, r: Result<FileAttr, Errno>) {
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // As `tessera mount`'s adapter negotiates (crates/tessera-fuse/src/adapter/mod.rs, `init`).
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let caps = config.capabilities();
        for flag in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ] {
            if caps.contains(flag) {
                let _ = config.add_capabilities(flag);
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.tree(Op::Lookup).lookup(parent.0, name);
        // No such name: a negative entry (node id 0), cached as `tessera mount` caches
        // them.
        let negative = || attr(0, FileType::RegularFile, 0, 0, 0, SystemTime::UNIX_EPOCH);
        Self::entry(reply, found.map(|a| a.unwrap_or_else(negative)));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.tree(Op::Forget).forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let found = self.tree(Op::Getattr).node(ino.0).map(|n| n.attr);
        match found {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = self
            .tree(Op::Setattr)
            .setattr(ino.0, mode, size, atime, mtime);
        match set {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        let a = attr(
            0,
            FileType::Directory,
            perm,
            req.uid(),
            req.gid(),
            SystemTime::now(),
        );
        let made = self.tree(Op::Mkdir).add(parent.0, name, a, true);
        Self::entry(reply, made);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.tree(Op::Unlink).remove(parent.0, name, false);
        Self::empty(reply, removed);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let removed = self.tree(Op::Rmdir).remove(parent.0, name, true);
        Self::empty(reply, removed);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let dir = self.tree(Op::Open).is_dir(ino.0);
        match dir {
            Ok(false) => reply.opened(FileHandle(ino.0), Self::open_flags(flags.0)),
            Ok(true) => reply.error(Errno::EISDIR),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        let a = attr(
            0,
            FileType::RegularFile,
            perm,
            req.uid(),
            req.gid(),
            SystemTime::now(),
        );
        let made = self.tree(Op::Create).add(parent.0, name, a, false);
        match made {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(a.ino.0),
                Self::open_flags(flags),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let written = self.tree(Op::Write).write(ino.0, offset, data.len());
        match written {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.count(Op::Flush);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.count(Op::Release);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let dir = self.tree(Op::Opendir).is_dir(ino.0);
        match dir {
            Ok(true) => reply.opened(FileHandle(ino.0), FopenFlags::empty()),
            Ok(false) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self.tree(Op::Readdir).list(ino.0, offset);
        match listed {
            Ok(entries) => {
                for (k, l) in entries.iter().enumerate() {
                    let next = offset + k as u64 + 1;
                    if reply.add(l.attr.ino, next, l.attr.kind, &l.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let listed = self.tree(Op::Readdirplus).list(ino.0, offset);
        let entries = match listed {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        let mut sent = Vec::new();
        for (k, l) in entries.iter().enumerate() {
            let next = offset + k as u64 + 1;
            if reply.add(l.attr.ino, next, &l.name, &TTL, &l.attr, Generation(0)) {
                break;
            }
            if l.name != "." && l.name != ".." {
                sent.push(l.attr.ino.0);
            }
        }
        // Each entry sent, but . and .., is a lookup for the kernel.
        {
            let mut t = self.tree.lock().unwrap_or_else(|p| p.into_inner());
            for ino in sent {
                if let Ok(n) = t.node(ino) {
                    n.lookups += 1;
                }
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.count(Op::Releasedir);
        reply.ok();
    }
}

fn main() {
    let mut args = std::env::args_os().skip(1);
    let (Some(mountpoint), None) = (args.next(), args.next()) else {
        eprintln!("usage: nullfs MOUNTPOINT");
        std::process::exit(2);
    };
    let mut config = Config::default();
    // `tessera mount`'s options (crates/tessera-fuse/src/lib.rs `mount_options`, `run`): no `ro`,
    // `--options` empty.
    config.mount_options = vec![
        MountOption::FSName("nullfs".into()),
        MountOption::Subtype("nullfs".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    config.acl = SessionACL::All;
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    let counters = Arc::new(Counters(std::array::from_fn(|_| AtomicU64::new(0))));
    let fs = NullFs {
        tree: Mutex::new(Tree::new()),
        counters: counters.clone(),
    };
    let session = match fuser::Session::new(fs, &mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nullfs: mounting {}: {e}", mountpoint.to_string_lossy());
            std::process::exit(1);
        }
    };
    let served = session.run();
    eprintln!(
        "nullfs: unmounted; requests answered: {}",
        counters.summary()
    );
    if let Err(e) = served {
        eprintln!("nullfs: serving ended: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Step {
        Create(&'static str),
        Lookup(&'static str),
        Unlink(&'static str),
        Forget(&'static str, u64),
    }

    #[test]
    fn a_node_goes_once_unlinked_and_forgotten() {
        use Step::*;
        // (case, steps, nodes left besides the root)
        let cases: &[(&str, &[Step], usize)] = &[
            ("created: the kernel holds it", &[Create("f")], 1),
            ("unlinked, not forgotten", &[Create("f"), Unlink("f")], 1),
            (
                "unlinked, then forgotten",
                &[Create("f"), Unlink("f"), Forget("f", 1)],
                0,
            ),
            (
                "forgotten, then unlinked",
                &[Create("f"), Forget("f", 1), Unlink("f")],
                0,
            ),
            (
                "looked up again, forgotten once",
                &[Create("f"), Lookup("f"), Unlink("f"), Forget("f", 1)],
                1,
            ),
            (
                "looked up again, forgotten for both",
                &[Create("f"), Lookup("f"), Unlink("f"), Forget("f", 2)],
                0,
            ),
        ];
        for (case, steps, left) in cases {
            let mut t = Tree::new();
            let mut inos = HashMap::new();
            let now = SystemTime::now();
            for step in *steps {
                match step {
                    Create(n) => {
                        let a = attr(0, FileType::RegularFile, 0o644, 0, 0, now);
                        let a = t.add(INodeNo::ROOT.0, OsStr::new(n), a, false).unwrap();
                        inos.insert(*n, a.ino.0);
                    }
                    Lookup(n) => {
                        t.lookup(INodeNo::ROOT.0, OsStr::new(n)).unwrap().unwrap();
                    }
                    Unlink(n) => t.remove(INodeNo::ROOT.0, OsStr::new(n), false).unwrap(),
                    Forget(n, k) => t.forget(inos[n], *k),
                }
            }
            assert_eq!(t.nodes.len() - 1, *left, "{case}");
        }
    }

    #[test]
    fn names_sizes_and_errors() {
        let mut t = Tree::new();
        let root = INodeNo::ROOT.0;
        let now = SystemTime::now();
        let file = attr(0, FileType::RegularFile, 0o644, 0, 0, now);
        let dir = attr(0, FileType::Directory, 0o755, 0, 0, now);
        let f = t.add(root, OsStr::new("f"), file, false).unwrap().ino.0;
        let d = t.add(root, OsStr::new("d"), dir, true).unwrap().ino.0;
        let err = |r: Result<(), Errno>| r.unwrap_err().code();
        assert_eq!(
            t.add(root, OsStr::new("f"), file, false)
                .unwrap_err()
                .code(),
            libc::EEXIST
        );
        assert!(t.lookup(root, OsStr::new("none")).unwrap().is_none());
        t.write(f, 0, 100).unwrap();
        t.write(f, 10, 20).unwrap();
        assert_eq!(t.node(f).unwrap().attr.size, 100);
        let names: Vec<OsString> = t
            .list(root, 0)
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(names, [".", "..", "d", "f"]);
        assert_eq!(t.list(root, 3).unwrap().len(), 1);
        t.add(d, OsStr::new("g"), file, false).unwrap();
        assert_eq!(err(t.remove(root, OsStr::new("d"), true)), libc::ENOTEMPTY);
        assert_eq!(err(t.remove(root, OsStr::new("d"), false)), libc::EISDIR);
        assert_eq!(err(t.remove(root, OsStr::new("f"), true)), libc::ENOTDIR);
        assert_eq!(err(t.remove(root, OsStr::new("none"), false)), libc::ENOENT);
    }
}
