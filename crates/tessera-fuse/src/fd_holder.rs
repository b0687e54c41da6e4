//! The fd holder: a unix socket server that keeps a duplicate of each mount's
//! `/dev/fuse` descriptor, so the kernel connection outlives the daemon serving it,
//! and gives it to a successor: `tessera fd-holder`. The node agent starts it
//! (`<state-dir>/holder.sock`; pod mode: a DaemonSet of its own); the FUSE tests run
//! it in the test process.
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
//!  node agent    ──connect── MOUNTED key + fd ─▶ held, fresh: the first CLAIM gets it
//!           answered `F` (its daemon answers INIT); no orphan grace (the agent bounds it)
//!  sweeper, every second: poll each fd; POLLERR (connection ended) ─▶ forgotten;
//!           no daemon connected for it for the orphan grace (60 s) ─▶ let go, so the
//!           connection ends and applications get ENOTCONN instead of waiting for ever
//! ```
//!
//! The wire format and the clients' calls are [`super::contract::holder_socket`]'s. Bounded:
//! [`MAX_ENTRIES`] descriptors, [`MAX_CONNECTIONS`] connections. The socket is mode
//! 0600 and only peers with uid 0 (`SO_PEERCRED`) are served.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use super::contract::args::HolderArgs;
use super::contract::holder_socket::{
    BUSY, DEFAULT_ORPHAN_GRACE, DONE, FD, FRESH, MAX_WAIT, NONE, OP_CLAIM, OP_DROP, OP_GET,
    OP_MOUNTED, OP_PUT, OP_WAIT, REFUSED, connection_ended, receive, reply,
};

/// Descriptors held at once.
pub const MAX_ENTRIES: usize = 1024;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 1100;
/// How long a claim keeps other successors off before its taker has handed the
/// descriptor back (PUT), e.g. because it died while taking over.
pub const CLAIM_TTL: Duration = Duration::from_secs(10);
/// How often a WAIT looks at its entry again (the pause of an upgrade includes it).
const WAIT_POLL: Duration = Duration::from_millis(5);

/// A descriptor held, and whether a daemon still serves it.
#[derive(Debug)]
struct Entry {
    fd: OwnedFd,
    /// The holder connection of the daemon that handed it over, while it lasts.
    owner: Option<u64>,
    /// Since when no daemon has held a connection to us for it.
    orphaned: Option<Instant>,
    /// When a successor claimed it, and on which of our connections (until it hands
    /// it over: a PUT replaces the entry; or until that connection ends: the
    /// claimer died before taking over, so the next successor may claim at once).
    claimed: Option<(Instant, u64)>,
    /// Mounted by the node agent and not yet handed back by a daemon: nobody has
    /// answered its INIT (until a daemon's PUT replaces the entry).
    fresh: bool,
}

/// What a claim of a held connection finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nothing held, or the connection has ended: mount anew.
    None,
    /// A daemon serves it, or another successor claimed it: do not touch it.
    Busy,
    /// Free: this caller takes it over (the descriptor, when answered by the holder).
    Free,
}

/// The claim decision for an entry (pure): `ended` whether its connection ended.
pub fn decide_claim(
    owner: Option<u64>,
    claimed: Option<Duration>,
    ended: bool,
    ttl: Duration,
) -> Claim {
    if ended {
        Claim::None
    } else if owner.is_some() || claimed.is_some_and(|age| age < ttl) {
        Claim::Busy
    } else {
        Claim::Free
    }
}

/// The descriptors held, by key.
type Entries = Arc<Mutex<HashMap<Vec<u8>, Entry>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running holder. Dropping it stops serving and closes every descriptor it held
/// (what an agent restart does).
#[derive(Debug)]
pub struct Holder {
    path: PathBuf,
    entries: Entries,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<UnixStream>>>,
}

impl Holder {
    /// Serve at `path` (a stale socket there is replaced).
    pub fn serve(path: &Path) -> io::Result<Holder> {
        Holder::serve_with_grace(path, DEFAULT_ORPHAN_GRACE)
    }

    /// Serve at `path`, letting go of a descriptor whose daemon has been gone for
    /// `grace` with no successor (see [`DEFAULT_ORPHAN_GRACE`]).
    pub fn serve_with_grace(path: &Path, grace: Duration) -> io::Result<Holder> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let holder = Holder {
            path: path.to_owned(),
            entries: Entries::default(),
            stop: Arc::new(AtomicBool::new(false)),
            conns: Arc::default(),
        };
        let (entries, stop, conns) = (
            holder.entries.clone(),
            holder.stop.clone(),
            holder.conns.clone(),
        );
        let active = Arc::new(AtomicUsize::new(0));
        let mut next_id = 0u64;
        std::thread::Builder::new()
            .name("fd-holder".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
                        tracing::warn!("fd holder: too many connections, refusing one");
                        continue;
                    }
                    if let Ok(c) = stream.try_clone() {
                        lock(&conns).push(c);
                    }
                    let (entries, active) = (entries.clone(), active.clone());
                    active.fetch_add(1, Ordering::AcqRel);
                    next_id += 1;
                    let id = next_id;
                    let _ = std::thread::Builder::new()
                        .name("fd-holder-conn".into())
                        .spawn(move || {
                            if let Err(e) = serve_conn(&stream, &entries, id) {
                                tracing::debug!(error = %e, "fd holder: connection ended");
                            }
                            orphan(&entries, id);
                            active.fetch_sub(1, Ordering::AcqRel);
                        });
                }
            })?;
        let (entries, stop) = (holder.entries.clone(), holder.stop.clone());
        std::thread::Builder::new()
            .name("fd-holder-sweep".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_secs(1));
                    lock(&entries).retain(|key, e| {
                        let key = String::from_utf8_lossy(key);
                        if connection_ended(e.fd.as_fd()) {
                            tracing::info!(%key, "fd holder: connection ended, descriptor dropped");
                            return false;
                        }
                        if e.orphaned.is_some_and(|t| t.elapsed() >= grace) {
                            tracing::warn!(%key, grace_seconds = grace.as_secs_f64(), "fd holder: no daemon took the connection over within the grace; letting it go (requests on the mount now fail with ENOTCONN)");
                            return false;
                        }
                        true
                    });
                }
            })?;
        Ok(holder)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A duplicate of the descriptor held for `key`, if its connection is alive.
    pub fn get(&self, key: &Path) -> Option<OwnedFd> {
        let entries = lock(&self.entries);
        let e = entries.get(key.as_os_str().as_encoded_bytes())?;
        (!connection_ended(e.fd.as_fd()))
            .then(|| e.fd.try_clone().ok())
            .flatten()
    }

    /// Whether a live descriptor is held for `key`.
    pub fn holds(&self, key: &Path) -> bool {
        self.get(key).is_some()
    }

    /// Forget `key`'s descriptor (the volume is being unmounted on purpose); returns
    /// it, so the caller may abort the connection or let it go.
    pub fn remove(&self, key: &Path) -> Option<OwnedFd> {
        lock(&self.entries)
            .remove(key.as_os_str().as_encoded_bytes())
            .map(|e| e.fd)
    }

    /// How many descriptors are held.
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for c in lock(&self.conns).drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // Wake the acceptor so it sees `stop`.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        lock(&self.entries).clear();
    }
}

/// The daemon behind connection `id` is gone: its descriptors start their grace, and
/// what it claimed without handing over is free again.
fn orphan(entries: &Entries, id: u64) {
    for e in lock(entries).values_mut() {
        if e.owner == Some(id) {
            e.owner = None;
            e.orphaned = Some(Instant::now());
        }
        if e.claimed.is_some_and(|(_, by)| by == id) {
            e.claimed = None;
        }
    }
}

fn serve_conn(stream: &UnixStream, entries: &Entries, id: u64) -> io::Result<()> {
    let cred = getsockopt(stream, PeerCredentials)?;
    if cred.uid() != 0 {
        tracing::warn!(
            uid = cred.uid(),
            pid = cred.pid(),
            "fd holder: refused a non-root peer"
        );
        let _ = reply(stream, REFUSED, None);
        return Ok(());
    }
    while let Some(m) = receive(stream)? {
        match (m.op, m.fd) {
            (OP_PUT, Some(fd)) => {
                let mut e = lock(entries);
                if e.len() >= MAX_ENTRIES && !e.contains_key(&m.key) {
                    drop(e);
                    reply(stream, REFUSED, None)?;
                    continue;
                }
                tracing::info!(key = %String::from_utf8_lossy(&m.key), "fd holder: holding a FUSE connection");
                e.insert(
                    m.key,
                    Entry {
                        fd,
                        owner: Some(id),
                        orphaned: None,
                        claimed: None,
                        fresh: false,
                    },
                );
                drop(e);
                reply(stream, DONE, None)?;
            }
            (OP_MOUNTED, Some(fd)) => {
                let mut e = lock(entries);
                if e.len() >= MAX_ENTRIES && !e.contains_key(&m.key) {
                    drop(e);
                    reply(stream, REFUSED, None)?;
                    continue;
                }
                tracing::info!(key = %String::from_utf8_lossy(&m.key), "fd holder: holding a connection the agent mounted");
                e.insert(
                    m.key,
                    Entry {
                        fd,
                        owner: None,
                        orphaned: None,
                        claimed: None,
                        fresh: true,
                    },
                );
                drop(e);
                reply(stream, DONE, None)?;
            }
            (OP_GET, None) => {
                let fd = lock(entries).get(&m.key).and_then(|e| {
                    (!connection_ended(e.fd.as_fd()))
                        .then(|| e.fd.try_clone().ok())
                        .flatten()
                });
                match fd {
                    Some(fd) => reply(stream, FD, Some(fd.as_fd()))?,
                    None => reply(stream, NONE, None)?,
                }
            }
            (OP_CLAIM, None) => answer_claim(stream, entries, &m.key, id)?,
            (OP_WAIT, None) => {
                let begun = Instant::now();
                loop {
                    let (c, fd) = try_claim(entries, &m.key, id);
                    // No entry yet (a restarted holder the predecessor has not handed
                    // its descriptor to again) or busy: keep waiting.
                    let absent = c == Claim::None && !lock(entries).contains_key(&m.key);
                    if (c == Claim::Busy || absent) && begun.elapsed() < MAX_WAIT {
                        std::thread::sleep(WAIT_POLL);
                        continue;
                    }
                    send_claim(stream, c, fd)?;
                    break;
                }
            }
            (OP_DROP, None) => {
                lock(entries).remove(&m.key);
                reply(stream, DONE, None)?;
            }
            _ => {
                reply(stream, REFUSED, None)?;
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Claim `key` for the caller (see [`decide_claim`]), with the descriptor if free.
fn try_claim(entries: &Entries, key: &[u8], by: u64) -> (Claim, Option<(OwnedFd, bool)>) {
    let mut map = lock(entries);
    let Some(e) = map.get_mut(key) else {
        return (Claim::None, None);
    };
    let ended = connection_ended(e.fd.as_fd());
    match decide_claim(
        e.owner,
        e.claimed.map(|(t, _)| t.elapsed()),
        ended,
        CLAIM_TTL,
    ) {
        Claim::Free => match e.fd.try_clone() {
            Ok(fd) => {
                e.claimed = Some((Instant::now(), by));
                (Claim::Free, Some((fd, e.fresh)))
            }
            Err(_) => (Claim::Busy, None),
        },
        c => (c, None),
    }
}

fn send_claim(stream: &UnixStream, c: Claim, fd: Option<(OwnedFd, bool)>) -> io::Result<()> {
    match (c, fd) {
        (Claim::Free, Some((fd, true))) => reply(stream, FRESH, Some(fd.as_fd())),
        (Claim::Free, Some((fd, false))) => reply(stream, FD, Some(fd.as_fd())),
        (Claim::None, _) => reply(stream, NONE, None),
        _ => reply(stream, BUSY, None),
    }
}

fn answer_claim(stream: &UnixStream, entries: &Entries, key: &[u8], by: u64) -> io::Result<()> {
    let (c, fd) = try_claim(entries, key, by);
    send_claim(stream, c, fd)
}

/// `tessera fd-holder`: serve the holder until SIGTERM or SIGINT. The node agent
/// starts it as a process of its own session, so the descriptors it holds outlive
/// the agent (a restart, a crash) as the daemons do.
pub fn run(args: HolderArgs) -> io::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block().map_err(io::Error::from)?;
    let holder = Holder::serve(&args.socket)?;
    tracing::info!(socket = %args.socket.display(), "fd holder serving");
    let signal = signals.wait().map_err(io::Error::from)?;
    tracing::info!(%signal, held = holder.len(), "fd holder stopping");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::holder_socket::{
        Claimed, answer, claim, claim_when_free, deposit_mounted, encode, send,
    };

    #[test]
    fn one_taker_and_none_while_served() {
        let ttl = Duration::from_secs(10);
        let s = Duration::from_secs(1);
        let table = [
            // (owner, claimed age, ended) → claim
            (None, None, false, Claim::Free),
            (Some(1), None, false, Claim::Busy),
            (None, Some(s), false, Claim::Busy),
            (None, Some(ttl), false, Claim::Free),
            (Some(1), Some(ttl), false, Claim::Busy),
            (None, None, true, Claim::None),
            (Some(1), None, true, Claim::None),
        ];
        for (owner, claimed, ended, want) in table {
            assert_eq!(
                decide_claim(owner, claimed, ended, ttl),
                want,
                "{owner:?} {claimed:?} {ended}"
            );
        }
    }

    /// A "daemon" serving `key`: a PUT of a pipe's read end (it never reports POLLERR
    /// while the returned write end is open) on a connection it keeps open.
    fn serving(sock: &Path, key: &[u8]) -> (UnixStream, OwnedFd) {
        let (r, w) = nix::unistd::pipe().unwrap();
        let daemon = UnixStream::connect(sock).unwrap();
        send(&daemon, &encode(OP_PUT, key).unwrap(), Some(r.as_fd())).unwrap();
        assert_eq!(answer(&daemon).unwrap().0, DONE);
        (daemon, w)
    }

    #[test]
    fn a_standby_gets_the_connection_once_its_server_left() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("h.sock");
        let holder = Holder::serve(&sock).unwrap();
        let key = Path::new("/mnt/v");
        let (daemon, _w) = serving(&sock, b"/mnt/v");
        assert!(matches!(claim(&sock, key).unwrap(), Claimed::Busy));
        let standby = {
            let sock = sock.clone();
            std::thread::spawn(move || claim_when_free(&sock, key, Duration::from_secs(20)))
        };
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !standby.is_finished(),
            "answered while the daemon still serves"
        );
        drop(daemon);
        assert!(matches!(standby.join().unwrap().unwrap(), Claimed::Fd(_)));
        // Claimed: nobody else gets it until the taker hands it over.
        assert!(matches!(claim(&sock, key).unwrap(), Claimed::Busy));
        assert!(holder.holds(key));
        assert!(matches!(
            claim(&sock, Path::new("/mnt/other")).unwrap(),
            Claimed::None
        ));
    }

    /// A connection the agent mounted: the first claim gets it as fresh (its
    /// daemon answers INIT), others are busy meanwhile; no orphan grace lets it go
    /// (the agent bounds the wait); once the taker hands it back it is an ordinary
    /// served connection, and a later successor gets it as one to resume.
    #[test]
    fn a_connection_the_agent_mounted_goes_fresh_to_one_taker() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("h.sock");
        let holder = Holder::serve_with_grace(&sock, Duration::from_millis(100)).unwrap();
        let (r, _w) = nix::unistd::pipe().unwrap();
        assert!(deposit_mounted(&sock, Path::new("/mnt/v"), r.as_fd()).unwrap());
        drop(r);
        // Longer than the grace, and the sweeper runs every second.
        std::thread::sleep(Duration::from_millis(1300));
        assert!(
            holder.holds(Path::new("/mnt/v")),
            "a fresh connection was let go"
        );
        let claim_on = || {
            let c = UnixStream::connect(&sock).unwrap();
            send(&c, &encode(OP_CLAIM, b"/mnt/v").unwrap(), None).unwrap();
            let (got, fd) = answer(&c).unwrap();
            (c, got, fd)
        };
        let (taker, got, fd) = claim_on();
        assert_eq!(got, FRESH);
        assert_eq!(claim_on().1, BUSY, "a second taker while the first lives");
        // The taker hands it back: served, then gone: a successor resumes it.
        let fd = fd.unwrap();
        send(
            &taker,
            &encode(OP_PUT, b"/mnt/v").unwrap(),
            Some(fd.as_fd()),
        )
        .unwrap();
        assert_eq!(answer(&taker).unwrap().0, DONE);
        assert_eq!(claim_on().1, BUSY, "claimed while its daemon serves");
        drop(taker);
        let resumed = (0..100).find_map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            let (c, got, _) = claim_on();
            (got != BUSY).then_some((c, got))
        });
        assert_eq!(resumed.map(|(_, got)| got), Some(FD));
    }

    /// A taker that dies after its claim and before it hands the descriptor over (a
    /// successor killed at once, or crashing on a resent request) frees the claim with
    /// its connection: the next successor does not wait out CLAIM_TTL. (Seen in CI:
    /// the third daemon of `a_resent_write_survives_a_second_takeover` was refused.)
    #[test]
    fn a_claim_ends_with_its_takers_connection() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("h.sock");
        let _holder = Holder::serve(&sock).unwrap();
        let (daemon, _w) = serving(&sock, b"/mnt/v");
        drop(daemon);
        // The protocol by hand (not `claim`, whose process-wide slot other tests use):
        // a CLAIM on a connection of its own, answered Y with the descriptor or B.
        let claim_on = || {
            let c = UnixStream::connect(&sock).unwrap();
            send(&c, &encode(OP_CLAIM, b"/mnt/v").unwrap(), None).unwrap();
            let got = answer(&c).unwrap().0;
            (c, got)
        };
        // The connection of the first claim answered Y, within a second (the holder
        // learns of a closed connection on its own thread, not at once).
        let claim_when_free = || {
            (0..100).find_map(|_| {
                std::thread::sleep(Duration::from_millis(10));
                let (c, got) = claim_on();
                (got == FD).then_some(c)
            })
        };
        let orphaned = claim_when_free();
        assert!(orphaned.is_some(), "the orphaned connection was never free");
        // That claim's connection is dropped at once: free again once the holder has
        // seen it close. Now a taker that lives: others are busy.
        drop(orphaned);
        let taker = claim_when_free().expect("the dropped claim was never free");
        assert_eq!(claim_on().1, BUSY, "a second claim while the first lives");
        // The taker dies before handing over: its claim ends with its connection.
        drop(taker);
        assert!(
            claim_when_free().is_some(),
            "the claim outlived its taker's connection"
        );
    }
}
