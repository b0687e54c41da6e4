//! What the core records of the kernel's references, so that a successor daemon can
//! serve them again (see `crate::handoff`): the record types, and the
//! [`Recorder`] the inode, handle and journal tables write every change through. A
//! successor restores a predecessor's [`Records`] (`restore`).
//!
//! ```text
//!  inodes / handles / journal ──Recorder (add, set, remove)──▶ handoff::state::StateFile
//!  successor: handoff::state::read ──Records──▶ VolumeFs::restore ──▶ the same tables
//! ```
//!
//! The core owns these types and knows nothing of where they are kept; the handoff
//! implements [`Recorder`] over its state file and hands [`Records`] back, so the
//! handoff depends on the core and not the other way round.

use super::fhandle::FileHandle;

/// One inode the kernel holds, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeSlot {
    pub id: u64,
    pub key: (u64, u64),
    pub kind: u8,
    pub handle: Option<FileHandle>,
    pub lookups: u64,
}

/// What an open handle was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleKind {
    File,
    Dir,
}

/// One open file or directory, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleSlot {
    pub fh: u64,
    pub ino: u64,
    pub flags: i32,
    /// `IoMode as u8`.
    pub mode: u8,
    pub backing_id: Option<u32>,
    pub kind: HandleKind,
}

/// One WRITE request in flight, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalSlot {
    /// The request's `unique`, without the kernel's resend bit (never 0).
    pub unique: u64,
    pub fh: u64,
    pub offset: u64,
    pub len: u64,
    /// The backing file's size before the write (where an append lands).
    pub size_before: u64,
    pub append: bool,
    /// `Some(n)`: the data was written, `n` bytes; `None`: in progress.
    pub applied: Option<u64>,
}

/// Every record of a predecessor, as a successor restores them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    pub inodes: Vec<InodeSlot>,
    pub handles: Vec<HandleSlot>,
    pub journal: Vec<JournalSlot>,
}

/// Where the tables record their changes as they happen (the handoff's state file).
/// A record added gets a slot number, by which it is later changed or removed;
/// `None` when there is no room (for inodes and handles, the recorder then says a
/// takeover is impossible; an unrecorded journal entry only loses its replay check).
/// Calls are plain memory stores in the one implementation: they are made with the
/// tables' locks held.
pub trait Recorder: std::fmt::Debug + Send + Sync {
    /// Record a new inode.
    fn add_inode(&self, rec: &InodeSlot) -> Option<u32>;
    /// The kernel's lookup count of the inode in `slot`.
    fn set_lookups(&self, slot: u32, lookups: u64);
    /// The inode in `slot` is forgotten.
    fn remove_inode(&self, slot: u32);
    /// Record a new open handle.
    fn add_handle(&self, rec: &HandleSlot) -> Option<u32>;
    /// The I/O mode (`IoMode as u8`) of the handle in `slot`.
    fn set_handle_mode(&self, slot: u32, mode: u8);
    /// The kernel passthrough backing id of the handle in `slot`.
    fn set_backing_id(&self, slot: u32, id: u32);
    /// The handle in `slot` is released.
    fn remove_handle(&self, slot: u32);
    /// Record a WRITE in flight, before its data is written.
    fn journal_begin(&self, rec: &JournalSlot) -> Option<u32>;
    /// The WRITE of `slot` is done: `n` bytes.
    fn journal_applied(&self, slot: u32, n: u64);
    /// The WRITE of `slot` is answered: forget it.
    fn journal_clear(&self, slot: u32);
}
