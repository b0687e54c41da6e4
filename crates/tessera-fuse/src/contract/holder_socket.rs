//! The fd holder's socket protocol, and the calls its clients make: the daemon
//! (claim a held connection, hand its own over, let one go) and the node agent (is
//! one held, let it go). The holder itself, which serves it, is `crate::fd_holder`.
//!
//! ```text
//!  tessera mount ──connect── PUT key + fd (SCM_RIGHTS) ──▶ holder: key → fd
//!     (keeps the connection; on EOF reconnects with backoff and PUTs again, which is
//!      how a restarted holder recovers the descriptors of the running daemons)
//!  successor     ──connect── GET key ──▶ fd of a live connection, or none
//!  daemon start  ──connect── CLAIM key ─▶ fd, only if no daemon serves it and no
//!           other successor claimed it (`Y`), `B` busy, `N` none: one taker at a time
//!  standby       ──connect── WAIT key ──▶ as CLAIM, but answered once the serving
//!           daemon has left (its holder connection ended): a successor started
//!           beside its predecessor (an upgrade) takes over the moment it leaves
//!  daemon stop   ──connect── DROP key ─▶ forgotten (the agent may also drop in process)
//!  node agent    ──connect── MOUNTED key + fd ─▶ a connection the agent mounted, not yet
//!           initialised: the first CLAIM gets it as `F` + descriptor (answer INIT),
//!           never let go for want of a daemon (the agent bounds the wait and DROPs it)
//! ```
//!
//! Wire format, one message per `sendmsg`: `op: u8`, `key length: u16 LE`, key bytes
//! (the mount point), with one descriptor attached to a PUT; the answer is one byte
//! (`K` done, `Y` + descriptor, `N` none, `B` busy, `E` refused). Keys are at most
//! [`MAX_KEY`] bytes. Holders and clients of different releases meet during an
//! upgrade: the format never changes (a new request gets a new op byte, and a client
//! falls back when an older holder refuses it).

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr, recvmsg, sendmsg};

/// Longest key (a mount point path).
pub const MAX_KEY: usize = 4096;
/// How long a descriptor is held after its daemon went away with no successor taking
/// it. While it is held, requests on the mount wait (uninterruptibly, for those the
/// dead daemon had read) for a successor; after it the connection ends and they fail
/// with ENOTCONN, as without a holder, and the agent's repair remounts.
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(60);
/// The longest a WAIT is kept waiting by the holder.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// Requests: hand a descriptor over (attached) for the key.
pub(crate) const OP_PUT: u8 = b'P';
/// Requests: a duplicate of the key's live descriptor.
pub(crate) const OP_GET: u8 = b'G';
/// Requests: forget the key's descriptor.
pub(crate) const OP_DROP: u8 = b'D';
/// Requests: claim the key's descriptor to take it over, if nobody serves it.
pub(crate) const OP_CLAIM: u8 = b'C';
/// Requests: as a claim, answered once the daemon serving the key has left.
pub(crate) const OP_WAIT: u8 = b'W';
/// Requests: hold a connection the node agent mounted (attached), not yet initialised.
pub(crate) const OP_MOUNTED: u8 = b'M';

/// Answers: done.
pub(crate) const DONE: u8 = b'K';
/// Answers: the descriptor, attached.
pub(crate) const FD: u8 = b'Y';
/// Answers: the descriptor of a connection nobody has initialised yet, attached.
pub(crate) const FRESH: u8 = b'F';
/// Answers: nothing held (or its connection ended).
pub(crate) const NONE: u8 = b'N';
/// Answers: served by a daemon, or claimed by another successor.
pub(crate) const BUSY: u8 = b'B';
/// Answers: refused (not root, a bad message, too many descriptors).
pub(crate) const REFUSED: u8 = b'E';

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the FUSE connection behind `fd` has ended (POLLERR).
pub fn connection_ended(fd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r == 1 && p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
}

/// A message: op, key, and the descriptor sent with it.
pub(crate) struct Message {
    pub(crate) op: u8,
    pub(crate) key: Vec<u8>,
    pub(crate) fd: Option<OwnedFd>,
}

/// Read one message (`None` at end of stream).
pub(crate) fn receive(stream: &UnixStream) -> io::Result<Option<Message>> {
    let mut head = [0u8; 3];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let mut fd = None;
    let n = {
        let mut iov = [IoSliceMut::new(&mut head)];
        let msg = recvmsg::<UnixAddr>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just gave us this descriptor; we own it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
        msg.bytes
    };
    if n == 0 {
        return Ok(None);
    }
    let mut s = stream;
    if n < head.len() {
        s.read_exact(&mut head[n..])?;
    }
    let len = usize::from(u16::from_le_bytes([head[1], head[2]]));
    if len == 0 || len > MAX_KEY {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad key length"));
    }
    let mut key = vec![0; len];
    s.read_exact(&mut key)?;
    Ok(Some(Message {
        op: head[0],
        key,
        fd,
    }))
}

pub(crate) fn send(
    stream: &UnixStream,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let raw = fd.map(|f| [f.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage<'_>> = raw
        .as_ref()
        .map(|r| vec![ControlMessage::ScmRights(r)])
        .unwrap_or_default();
    let n = sendmsg::<UnixAddr>(
        stream.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    if n != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

pub(crate) fn encode(op: u8, key: &[u8]) -> io::Result<Vec<u8>> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "key length"));
    }
    let mut v = Vec::with_capacity(3 + key.len());
    v.push(op);
    v.extend_from_slice(&(key.len() as u16).to_le_bytes());
    v.extend_from_slice(key);
    Ok(v)
}

/// Send the one-byte answer `byte` (and a descriptor).
pub(crate) fn reply(stream: &UnixStream, byte: u8, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    send(stream, &[byte], fd)
}

/// Read the one-byte answer (and a descriptor).
pub(crate) fn answer(stream: &UnixStream) -> io::Result<(u8, Option<OwnedFd>)> {
    let mut b = [0u8; 1];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut b)];
    let msg = recvmsg::<UnixAddr>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fd = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel just gave us this descriptor; we own it.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    if msg.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "holder closed",
        ));
    }
    Ok((b[0], fd))
}

/// Ask the holder at `socket` for the descriptor held for `key`.
pub fn take(socket: &Path, key: &Path) -> io::Result<Option<OwnedFd>> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    send(
        &stream,
        &encode(OP_GET, key.as_os_str().as_encoded_bytes())?,
        None,
    )?;
    match answer(&stream)? {
        (FD, Some(fd)) => Ok(Some(fd)),
        (NONE, _) => Ok(None),
        _ => Err(io::Error::other("the holder refused")),
    }
}

/// The connection of this process's claim, until its descriptor is handed over.
static CLAIM: Mutex<Option<UnixStream>> = Mutex::new(None);

/// What a claim of `key` got: the descriptor to take over, or why not.
#[derive(Debug)]
pub enum Claimed {
    Fd(OwnedFd),
    /// A connection the agent mounted and nobody has initialised: answer its INIT.
    Fresh(OwnedFd),
    None,
    Busy,
}

fn claim_op(socket: &Path, key: &Path, op: u8, timeout: Duration) -> io::Result<Claimed> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(timeout))?;
    send(
        &stream,
        &encode(op, key.as_os_str().as_encoded_bytes())?,
        None,
    )?;
    match answer(&stream)? {
        (FRESH, Some(fd)) => {
            *lock(&CLAIM) = Some(stream);
            Ok(Claimed::Fresh(fd))
        }
        (FD, Some(fd)) => {
            // The claim lasts as long as this connection: kept open until this
            // daemon has handed the descriptor over ([`hand_over`]), so that if it
            // dies before, the holder frees the claim at once, not after CLAIM_TTL.
            *lock(&CLAIM) = Some(stream);
            Ok(Claimed::Fd(fd))
        }
        (NONE, _) => Ok(Claimed::None),
        (BUSY, _) => Ok(Claimed::Busy),
        _ => Err(io::Error::other("the holder refused")),
    }
}

/// Claim the connection held for `key` to take it over: only one successor gets it,
/// and none while a daemon serves it.
pub fn claim(socket: &Path, key: &Path) -> io::Result<Claimed> {
    claim_op(socket, key, OP_CLAIM, Duration::from_secs(5))
}

/// As [`claim`], but answered once the daemon serving `key` has left (at most
/// `timeout`, and [`MAX_WAIT`]).
pub fn claim_when_free(socket: &Path, key: &Path, timeout: Duration) -> io::Result<Claimed> {
    claim_op(socket, key, OP_WAIT, timeout)
}

/// Give the holder at `socket` the connection `fd` the node agent has just mounted at
/// `key` (not initialised: its daemon answers INIT once it claims it). `Ok(false)`
/// when the holder does not know the request (an earlier release): the caller then
/// lets the daemon mount.
pub fn deposit_mounted(socket: &Path, key: &Path, fd: BorrowedFd<'_>) -> io::Result<bool> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    send(
        &stream,
        &encode(OP_MOUNTED, key.as_os_str().as_encoded_bytes())?,
        Some(fd),
    )?;
    match answer(&stream) {
        Ok((DONE, _)) => Ok(true),
        Ok((REFUSED, _)) | Err(_) => Ok(false),
        Ok(_) => Err(io::Error::other("unexpected answer from the holder")),
    }
}

/// Tell the holder at `socket` to forget `key` (an unmount on purpose).
pub fn forget(socket: &Path, key: &Path) -> io::Result<()> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    send(
        &stream,
        &encode(OP_DROP, key.as_os_str().as_encoded_bytes())?,
        None,
    )?;
    match answer(&stream)? {
        (DONE, _) => Ok(()),
        _ => Err(io::Error::other("the holder refused")),
    }
}

/// Whether a holder holds this daemon's descriptor now: set when the holder took it,
/// cleared when that holder's connection ends (it restarted), until the hand-over
/// thread has given it to the next one.
static HELD: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

fn set_held(held: bool) {
    *lock(&HELD.0) = held;
    HELD.1.notify_all();
}

/// Wait up to `timeout` until a holder holds this daemon's descriptor; whether one
/// does. A daemon leaving its connection to a successor must not go while none does
/// (a holder restarting beside an upgrade): nothing would keep the connection, and
/// the application's next request would fail with ENOTCONN.
pub fn wait_held(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut held = lock(&HELD.0);
    while !*held {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        held = HELD
            .1
            .wait_timeout(held, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
}

/// Hand `fd` to the holder at `socket` under `key`, and keep doing so: a thread keeps
/// the connection open and, whenever it ends (the holder restarted), connects again
/// with backoff (50 ms doubling to 2 s) and hands the descriptor over again.
/// [`wait_held`] says whether it is held at a given moment.
pub fn hand_over(socket: PathBuf, key: PathBuf, fd: OwnedFd) -> io::Result<()> {
    let msg = encode(OP_PUT, key.as_os_str().as_encoded_bytes())?;
    std::thread::Builder::new()
        .name("fd-handover".into())
        .spawn(move || {
            let mut backoff = Duration::from_millis(50);
            loop {
                let r = UnixStream::connect(&socket).and_then(|stream| {
                    send(&stream, &msg, Some(fd.as_fd()))?;
                    match answer(&stream)? {
                        (DONE, _) => {}
                        _ => return Err(io::Error::other("the holder refused the descriptor")),
                    }
                    tracing::info!(socket = %socket.display(), "FUSE descriptor handed to the holder");
                    // Handed over: a claim made for it has served its purpose.
                    lock(&CLAIM).take();
                    set_held(true);
                    // Held: wait for the holder to go away.
                    let mut b = [0u8; 1];
                    let _ = (&stream).read(&mut b);
                    set_held(false);
                    Ok(())
                });
                match r {
                    Ok(()) => {
                        backoff = Duration::from_millis(50);
                        tracing::warn!("the fd holder went away: handing the descriptor over again");
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "fd holder not reachable");
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
                std::thread::sleep(backoff);
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one side sends the other receives: op, key and descriptor, then the answer.
    #[test]
    fn a_message_sent_is_received_whole_with_its_descriptor() {
        let (daemon, holder) = UnixStream::pair().unwrap();
        let (r, _w) = nix::unistd::pipe().unwrap();
        send(
            &daemon,
            &encode(OP_PUT, b"/mnt/v").unwrap(),
            Some(r.as_fd()),
        )
        .unwrap();
        let m = receive(&holder).unwrap().expect("a message");
        assert_eq!((m.op, m.key.as_slice()), (OP_PUT, &b"/mnt/v"[..]));
        assert!(m.fd.is_some(), "the descriptor came along");
        reply(&holder, DONE, None).unwrap();
        assert_eq!(answer(&daemon).unwrap().0, DONE);
        assert!(encode(OP_GET, b"").is_err());
        assert!(encode(OP_GET, &vec![b'k'; MAX_KEY + 1]).is_err());
        drop(daemon);
        assert!(receive(&holder).unwrap().is_none(), "end of stream");
    }
}
