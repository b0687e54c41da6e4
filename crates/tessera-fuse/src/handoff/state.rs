//! The handoff state file (`--handoff-state`): what the kernel refers to on a FUSE
//! connection, kept in a shared mapping so a successor can read it after the daemon
//! died, even of `kill -9`.
//!
//! ```text
//!  header  (64 words)   magic, layout, init (abi, flags, read-ahead), capacities, overflow
//!  inodes  (INODE_SLOTS × 24 words)  id, dev, ino, kind, handle type/len, lookups, handle bytes
//!  handles (HANDLE_SLOTS × 8 words)  fh, node id, open flags, I/O mode, backing id, kind
//!  journal (JOURNAL_SLOTS × 8 words) unique, fh, offset, len, size before, append, state, count
//! ```
//!
//! Every field is an `AtomicU64` in the mapping: updating the state costs plain
//! memory stores, no syscall and no fsync (the page cache holds the pages when the
//! process dies; a machine crash ends the FUSE connection anyway). A slot is filled
//! with its key (`id`, `fh`) stored last and emptied with its key cleared first, so a
//! daemon killed mid-update leaves each slot either whole or empty. Slots are given
//! out from an in-process free list; the successor scans every slot.
//!
//! The **write journal** (layout 2) holds the WRITE requests in flight: a slot is
//! filled (unique last) before the data is written, marked applied with the count
//! after, and emptied once the reply is sent, so a successor answering a request the
//! kernel resends knows whether its predecessor had already applied it (see
//! `crate::fs::journal`). A layout-1 file (no journal) is still read.
//!
//! The file is sparse: only slots ever used take space. A table that fills up sets
//! `overflow`, and a successor then refuses the takeover (the agent repairs instead).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fs::{FileHandle, HandleKind, HandleSlot, InodeSlot, JournalSlot, Recorder, Records};

const MAGIC: u64 = 0x7465_7373_686f_6666; // "tesshoff"
const LAYOUT: u64 = 2;
/// The layout before the write journal: read, without a journal.
const LAYOUT_V1: u64 = 1;
const HEADER_WORDS: usize = 64;
const INODE_WORDS: usize = 24;
const HANDLE_WORDS: usize = 8;
const JOURNAL_WORDS: usize = 8;
/// Inodes the kernel may hold at once for a takeover to stay possible.
pub const INODE_SLOTS: usize = 1 << 18;
/// Open files and directories at once.
pub const HANDLE_SLOTS: usize = 1 << 16;
/// WRITE requests in flight at once (a worker serves one at a time; at most 64
/// workers), with room for entries carried over from a predecessor.
pub const JOURNAL_SLOTS: usize = 256;
const JOURNAL_AT: usize = HEADER_WORDS + INODE_SLOTS * INODE_WORDS + HANDLE_SLOTS * HANDLE_WORDS;
const WORDS_V1: usize = JOURNAL_AT;
const WORDS: usize = JOURNAL_AT + JOURNAL_SLOTS * JOURNAL_WORDS;
const FILE_LEN: usize = WORDS * 8;
const FILE_LEN_V1: usize = WORDS_V1 * 8;

// Header words.
const H_MAGIC: usize = 0;
const H_LAYOUT: usize = 1;
const H_ABI: usize = 2;
const H_FLAGS: usize = 3;
const H_READAHEAD: usize = 4;
const H_INIT: usize = 5;
const H_OVERFLOW: usize = 6;
/// The fence epoch the daemon serves under, plus one (0: none; files written before
/// it have 0 there).
const H_FENCE_EPOCH: usize = 7;

/// The init a connection settled, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitRecord {
    pub abi_major: u32,
    pub abi_minor: u32,
    pub flags: u64,
    pub max_readahead: u32,
}

/// Everything a successor needs, read from a state file.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub init: Option<InitRecord>,
    pub overflow: bool,
    /// The fence epoch the predecessor served under, if it self-fenced and had heard
    /// its node's news: its successor serves under the same (`fence_gate`).
    pub fence_epoch: Option<u64>,
    /// The core's tables and journal, for [`VolumeFs::restore`](crate::fs::VolumeFs::restore).
    pub records: Records,
}

/// Slots handed out, and those free again.
#[derive(Debug, Default)]
struct Free {
    next: usize,
    free: Vec<usize>,
}

impl Free {
    fn take(&mut self, cap: usize) -> Option<usize> {
        self.free.pop().or_else(|| {
            (self.next < cap).then(|| {
                self.next += 1;
                self.next - 1
            })
        })
    }
}

/// A state file mapped for writing, owned by one daemon.
#[derive(Debug)]
pub struct StateFile {
    words: &'static [AtomicU64],
    /// Where it is built, and the name it takes once complete ([`StateFile::publish`]).
    tmp: PathBuf,
    path: PathBuf,
    inodes: Mutex<Free>,
    handles: Mutex<Free>,
    journal: Mutex<Free>,
}

fn map(file: &File, len: usize, writable: bool) -> io::Result<&'static [AtomicU64]> {
    let addr = crate::sys::mmap_shared(file.as_fd(), len, writable)?;
    // SAFETY: page-aligned, `len` bytes = len / 8 u64s, valid for any bit pattern;
    // the writer's mapping is never unmapped (the daemon writes it until it exits);
    // the reader unmaps its own once it has parsed it and no longer uses the slice.
    Ok(unsafe { std::slice::from_raw_parts(addr as *const AtomicU64, len / 8) })
}

impl StateFile {
    /// A new, empty state file for `path`, built beside it: a predecessor's state
    /// there stays readable until [`StateFile::publish`] renames this one over it.
    pub fn create(path: &Path) -> io::Result<StateFile> {
        let tmp = path.with_extension("handoff.tmp");
        let _ = std::fs::remove_file(&tmp);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.set_len(FILE_LEN as u64)?;
        let words = map(&file, FILE_LEN, true)?;
        words[H_LAYOUT].store(LAYOUT, Ordering::Relaxed);
        words[H_MAGIC].store(MAGIC, Ordering::Release);
        Ok(StateFile {
            words,
            tmp,
            path: path.to_owned(),
            inodes: Mutex::default(),
            handles: Mutex::default(),
            journal: Mutex::default(),
        })
    }

    /// Give the file its name: from now on it is what a successor reads.
    pub fn publish(&self) -> io::Result<()> {
        std::fs::rename(&self.tmp, &self.path)
    }

    /// The fence epoch this daemon serves under (see [`Snapshot::fence_epoch`]).
    pub fn set_fence_epoch(&self, epoch: u64) {
        self.words[H_FENCE_EPOCH].store(epoch.saturating_add(1), Ordering::Release);
    }

    pub fn set_init(&self, init: InitRecord) {
        let w = self.words;
        w[H_ABI].store(
            u64::from(init.abi_major) << 32 | u64::from(init.abi_minor),
            Ordering::Relaxed,
        );
        w[H_FLAGS].store(init.flags, Ordering::Relaxed);
        w[H_READAHEAD].store(u64::from(init.max_readahead), Ordering::Relaxed);
        w[H_INIT].store(1, Ordering::Release);
    }

    fn inode_words(&self, slot: usize) -> &[AtomicU64] {
        let at = HEADER_WORDS + slot * INODE_WORDS;
        &self.words[at..at + INODE_WORDS]
    }

    fn handle_words(&self, slot: usize) -> &[AtomicU64] {
        let at = HEADER_WORDS + INODE_SLOTS * INODE_WORDS + slot * HANDLE_WORDS;
        &self.words[at..at + HANDLE_WORDS]
    }

    fn overflow(&self) {
        self.words[H_OVERFLOW].store(1, Ordering::Release);
    }

    fn journal_words(&self, slot: usize) -> &[AtomicU64] {
        let at = JOURNAL_AT + slot * JOURNAL_WORDS;
        &self.words[at..at + JOURNAL_WORDS]
    }
}

/// The core's tables are recorded here, as they change (see [`Recorder`]).
impl Recorder for StateFile {
    /// Record a new inode; returns its slot (`None`: the table is full, and the state
    /// says a takeover is impossible).
    fn add_inode(&self, rec: &InodeSlot) -> Option<u32> {
        let slot = super::lock(&self.inodes).take(INODE_SLOTS);
        let Some(slot) = slot else {
            self.overflow();
            return None;
        };
        let w = self.inode_words(slot);
        w[1].store(rec.key.0, Ordering::Relaxed);
        w[2].store(rec.key.1, Ordering::Relaxed);
        w[3].store(u64::from(rec.kind), Ordering::Relaxed);
        match &rec.handle {
            Some(h) => {
                w[4].store(u64::from(h.handle_type() as u32), Ordering::Relaxed);
                w[5].store(h.bytes().len() as u64, Ordering::Relaxed);
                let mut chunk = [0u8; 8];
                for (i, c) in h.bytes().chunks(8).enumerate() {
                    chunk.fill(0);
                    chunk[..c.len()].copy_from_slice(c);
                    w[7 + i].store(u64::from_le_bytes(chunk), Ordering::Relaxed);
                }
            }
            None => w[5].store(0, Ordering::Relaxed),
        }
        w[6].store(rec.lookups, Ordering::Relaxed);
        w[0].store(rec.id, Ordering::Release);
        Some(slot as u32)
    }

    fn set_lookups(&self, slot: u32, lookups: u64) {
        self.inode_words(slot as usize)[6].store(lookups, Ordering::Release);
    }

    fn remove_inode(&self, slot: u32) {
        self.inode_words(slot as usize)[0].store(0, Ordering::Release);
        super::lock(&self.inodes).free.push(slot as usize);
    }

    /// Record a new open handle; returns its slot.
    fn add_handle(&self, rec: &HandleSlot) -> Option<u32> {
        let slot = super::lock(&self.handles).take(HANDLE_SLOTS);
        let Some(slot) = slot else {
            self.overflow();
            return None;
        };
        let w = self.handle_words(slot);
        w[1].store(rec.ino, Ordering::Relaxed);
        w[2].store(u64::from(rec.flags as u32), Ordering::Relaxed);
        w[3].store(u64::from(rec.mode), Ordering::Relaxed);
        w[4].store(
            rec.backing_id.map_or(0, |id| u64::from(id) + 1),
            Ordering::Relaxed,
        );
        w[5].store(
            match rec.kind {
                HandleKind::File => 1,
                HandleKind::Dir => 2,
            },
            Ordering::Relaxed,
        );
        w[0].store(rec.fh, Ordering::Release);
        Some(slot as u32)
    }

    fn set_handle_mode(&self, slot: u32, mode: u8) {
        self.handle_words(slot as usize)[3].store(u64::from(mode), Ordering::Release);
    }

    fn set_backing_id(&self, slot: u32, id: u32) {
        self.handle_words(slot as usize)[4].store(u64::from(id) + 1, Ordering::Release);
    }

    fn remove_handle(&self, slot: u32) {
        self.handle_words(slot as usize)[0].store(0, Ordering::Release);
        super::lock(&self.handles).free.push(slot as usize);
    }

    /// Record a WRITE in flight; its slot (`None`: all slots are taken, and this
    /// write is not journaled; the takeover stays possible).
    fn journal_begin(&self, rec: &JournalSlot) -> Option<u32> {
        let slot = super::lock(&self.journal).take(JOURNAL_SLOTS)?;
        let w = self.journal_words(slot);
        w[1].store(rec.fh, Ordering::Relaxed);
        w[2].store(rec.offset, Ordering::Relaxed);
        w[3].store(rec.len, Ordering::Relaxed);
        w[4].store(rec.size_before, Ordering::Relaxed);
        w[5].store(u64::from(rec.append), Ordering::Relaxed);
        match rec.applied {
            Some(n) => {
                w[7].store(n, Ordering::Relaxed);
                w[6].store(2, Ordering::Relaxed);
            }
            None => w[6].store(1, Ordering::Relaxed),
        }
        w[0].store(rec.unique, Ordering::Release);
        Some(slot as u32)
    }

    /// The write of `slot` is done: `n` bytes.
    fn journal_applied(&self, slot: u32, n: u64) {
        let w = self.journal_words(slot as usize);
        w[7].store(n, Ordering::Relaxed);
        w[6].store(2, Ordering::Release);
    }

    /// The write of `slot` is answered: forget it.
    fn journal_clear(&self, slot: u32) {
        self.journal_words(slot as usize)[0].store(0, Ordering::Release);
        super::lock(&self.journal).free.push(slot as usize);
    }
}

/// Read the state file at `path` (`Ok(None)`: there is none, or not of this layout).
pub fn read(path: &Path) -> io::Result<Option<Snapshot>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    let len = match meta.len() {
        l if l == FILE_LEN as u64 => FILE_LEN,
        l if l == FILE_LEN_V1 as u64 => FILE_LEN_V1,
        _ => return Ok(None),
    };
    if !meta.is_file() {
        return Ok(None);
    }
    let w = map(&file, len, false)?;
    let snapshot = parse(w);
    // SAFETY: unmapping what `map` mapped; `w` is not used after this.
    unsafe { libc::munmap(w.as_ptr() as *mut libc::c_void, len) };
    Ok(snapshot)
}

fn parse(w: &[AtomicU64]) -> Option<Snapshot> {
    let get = |i: usize| w[i].load(Ordering::Acquire);
    let journaled = match (get(H_LAYOUT), w.len()) {
        (LAYOUT, WORDS) => true,
        (LAYOUT_V1, WORDS_V1) => false,
        _ => return None,
    };
    if get(H_MAGIC) != MAGIC {
        return None;
    }
    let init = (get(H_INIT) == 1).then(|| InitRecord {
        abi_major: (get(H_ABI) >> 32) as u32,
        abi_minor: get(H_ABI) as u32,
        flags: get(H_FLAGS),
        max_readahead: get(H_READAHEAD) as u32,
    });
    let mut snap = Snapshot {
        init,
        overflow: get(H_OVERFLOW) != 0,
        fence_epoch: get(H_FENCE_EPOCH).checked_sub(1),
        ..Snapshot::default()
    };
    let records = &mut snap.records;
    for slot in 0..INODE_SLOTS {
        let at = HEADER_WORDS + slot * INODE_WORDS;
        let id = get(at);
        if id == 0 {
            continue;
        }
        let len = get(at + 5) as usize;
        let handle = (len > 0 && len <= 128).then(|| {
            let mut bytes = Vec::with_capacity(128);
            for i in 0..16 {
                bytes.extend_from_slice(&get(at + 7 + i).to_le_bytes());
            }
            bytes.truncate(len);
            FileHandle::from_parts(get(at + 4) as u32 as i32, &bytes)
        });
        records.inodes.push(InodeSlot {
            id,
            key: (get(at + 1), get(at + 2)),
            kind: get(at + 3) as u8,
            handle: handle.flatten(),
            lookups: get(at + 6),
        });
    }
    for slot in 0..HANDLE_SLOTS {
        let at = HEADER_WORDS + INODE_SLOTS * INODE_WORDS + slot * HANDLE_WORDS;
        let fh = get(at);
        if fh == 0 {
            continue;
        }
        let kind = match get(at + 5) {
            1 => HandleKind::File,
            2 => HandleKind::Dir,
            _ => continue,
        };
        let backing = get(at + 4);
        records.handles.push(HandleSlot {
            fh,
            ino: get(at + 1),
            flags: get(at + 2) as u32 as i32,
            mode: get(at + 3) as u8,
            backing_id: backing.checked_sub(1).map(|b| b as u32),
            kind,
        });
    }
    for slot in 0..if journaled { JOURNAL_SLOTS } else { 0 } {
        let at = JOURNAL_AT + slot * JOURNAL_WORDS;
        let unique = get(at);
        if unique == 0 {
            continue;
        }
        let applied = match get(at + 6) {
            1 => None,
            2 => Some(get(at + 7)),
            _ => continue,
        };
        records.journal.push(JournalSlot {
            unique,
            fh: get(at + 1),
            offset: get(at + 2),
            len: get(at + 3),
            size_before: get(at + 4),
            append: get(at + 5) != 0,
            applied,
        });
    }
    Some(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_written_are_read_back_and_removed_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.handoff");
        let s = StateFile::create(&path).unwrap();
        s.set_init(InitRecord {
            abi_major: 7,
            abi_minor: 41,
            flags: 0xdead_beef_0000_0001,
            max_readahead: 131072,
        });
        let h = FileHandle::from_parts(1, &(0..20).collect::<Vec<u8>>()).unwrap();
        let a = s
            .add_inode(&InodeSlot {
                id: 42,
                key: (7, 42),
                kind: 1,
                handle: Some(h.clone()),
                lookups: 1,
            })
            .unwrap();
        let b = s
            .add_inode(&InodeSlot {
                id: 43,
                key: (7, 43),
                kind: 2,
                handle: None,
                lookups: 2,
            })
            .unwrap();
        s.set_lookups(a, 5);
        s.remove_inode(b);
        let f = s
            .add_handle(&HandleSlot {
                fh: 9,
                ino: 42,
                flags: libc::O_WRONLY | libc::O_APPEND,
                mode: 2,
                backing_id: None,
                kind: HandleKind::File,
            })
            .unwrap();
        s.set_backing_id(f, 0);
        assert!(read(&path).unwrap().is_none(), "not published yet");
        s.publish().unwrap();
        let snap = read(&path).unwrap().unwrap();
        assert_eq!(snap.init.unwrap().abi_minor, 41);
        assert_eq!(snap.init.unwrap().flags, 0xdead_beef_0000_0001);
        assert!(!snap.overflow);
        assert_eq!(
            snap.records.inodes,
            vec![InodeSlot {
                id: 42,
                key: (7, 42),
                kind: 1,
                handle: Some(h),
                lookups: 5
            }]
        );
        assert_eq!(snap.records.handles.len(), 1);
        assert_eq!(snap.records.handles[0].backing_id, Some(0));
        assert_eq!(
            snap.records.handles[0].flags,
            libc::O_WRONLY | libc::O_APPEND
        );
        // A freed slot is reused.
        let c = s
            .add_inode(&InodeSlot {
                id: 44,
                key: (7, 44),
                kind: 1,
                handle: None,
                lookups: 1,
            })
            .unwrap();
        assert_eq!(c, b);
        // Not a state file: nothing to take over.
        std::fs::write(dir.path().join("junk"), b"junk").unwrap();
        assert!(read(&dir.path().join("junk")).unwrap().is_none());
        assert!(read(&dir.path().join("absent")).unwrap().is_none());
    }

    #[test]
    fn the_write_journal_keeps_writes_in_flight_and_layout_1_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.handoff");
        let s = StateFile::create(&path).unwrap();
        let rec = JournalSlot {
            unique: 24,
            fh: 3,
            offset: 64,
            len: 16,
            size_before: 64,
            append: true,
            applied: None,
        };
        let a = s.journal_begin(&rec).unwrap();
        let b = s.journal_begin(&JournalSlot { unique: 26, ..rec }).unwrap();
        let c = s.journal_begin(&JournalSlot { unique: 28, ..rec }).unwrap();
        s.journal_applied(b, 16);
        s.journal_clear(c);
        s.publish().unwrap();
        let mut j = read(&path).unwrap().unwrap().records.journal;
        j.sort_by_key(|s| s.unique);
        assert_eq!(
            j,
            vec![
                rec,
                JournalSlot {
                    unique: 26,
                    applied: Some(16),
                    ..rec
                }
            ]
        );
        s.journal_clear(a);
        assert_eq!(read(&path).unwrap().unwrap().records.journal.len(), 1);
        // A predecessor of layout 1 (no journal): its tables are read, no journal.
        let old = dir.path().join("v1.handoff");
        std::fs::copy(&path, &old).unwrap();
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&old)
            .unwrap();
        f.set_len(FILE_LEN_V1 as u64).unwrap();
        let w = map(&f, FILE_LEN_V1, true);
        drop(f);
        let w = w.unwrap();
        w[H_LAYOUT].store(LAYOUT_V1, Ordering::Release);
        let snap = read(&old).unwrap().expect("layout 1 read");
        assert!(snap.records.journal.is_empty());
        assert!(snap.init.is_none());
        // A layout-2 header on a layout-1 length is not a state file.
        w[H_LAYOUT].store(LAYOUT, Ordering::Release);
        assert!(read(&old).unwrap().is_none());
    }

    #[test]
    fn the_fence_epoch_is_kept_and_absent_until_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.handoff");
        let s = StateFile::create(&path).unwrap();
        s.publish().unwrap();
        assert_eq!(read(&path).unwrap().unwrap().fence_epoch, None);
        s.set_fence_epoch(0);
        assert_eq!(read(&path).unwrap().unwrap().fence_epoch, Some(0));
        s.set_fence_epoch(7);
        assert_eq!(read(&path).unwrap().unwrap().fence_epoch, Some(7));
    }

    #[test]
    fn the_journal_holds_journal_slots_writes_and_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateFile::create(&dir.path().join("m.handoff")).unwrap();
        let rec = |unique| JournalSlot {
            unique,
            fh: 1,
            offset: 0,
            len: 1,
            size_before: 0,
            append: false,
            applied: None,
        };
        let slots: Vec<u32> = (1..=JOURNAL_SLOTS as u64)
            .map(|u| s.journal_begin(&rec(u)).expect("a free slot"))
            .collect();
        assert!(s.journal_begin(&rec(10_000)).is_none(), "full");
        s.journal_clear(slots[3]);
        assert_eq!(
            s.journal_begin(&rec(10_001)),
            Some(slots[3]),
            "freed, reused"
        );
    }
}
