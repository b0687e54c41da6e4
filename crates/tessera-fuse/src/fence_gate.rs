//! Self-fencing in the daemon (`--fence-file`, docs/failover.md): the gate every
//! request that changes or commits the volume passes, over the pure machine of
//! [`crate::contract::fence`], and the thread that reads the node's fence file.
//!
//! ```text
//!  fence thread: every POLL read <fence-file> ─▶ Fence::hear ─▶ notify the waiters
//!  adapter (write, fsync, setattr, create, …): Gate::admit
//!      Writable ─▶ go on │ Fenced ─▶ wait (unapplied, unanswered) │ Revoked ─▶ EIO
//! ```
//!
//! The verdict is taken on `CLOCK_BOOTTIME` at each admission, so a daemon fences at
//! its deadline even when the thread is late; the thread only brings news.
//!
//! The epoch a daemon serves under outlives it: a handoff successor's gate starts
//! bound to its predecessor's (kept in the handoff state, [`Gate::on_bound`]), so a
//! successor of a revoked daemon is revoked too, not bound to the node's new epoch.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::contract::fence::{Fence, MAX_FILE, News, Verdict, boottime_ns};

/// How often the fence file is read.
const POLL: Duration = Duration::from_millis(100);
/// How long a waiting request sleeps before it looks at the clock again.
const RECHECK: Duration = Duration::from_millis(100);

/// The fence a mount's mutations pass.
pub struct Gate {
    fence: Mutex<Fence>,
    news: Condvar,
    path: PathBuf,
    /// Told the epoch whenever the fence file is read once it is bound.
    bound_hook: OnceLock<Box<dyn Fn(u64) + Send + Sync>>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("fence", &*self.lock())
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A mutation refused for good: the node's tenure this daemon served under ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revoked;

impl Gate {
    /// A gate over `path`, read once now and then by a thread of its own; bound to
    /// `epoch` from the start if given (a handoff successor: its predecessor's).
    pub fn start(path: &Path, epoch: Option<u64>) -> std::io::Result<Arc<Gate>> {
        let gate = Arc::new(Gate {
            fence: Mutex::new(epoch.map_or_else(Fence::new, Fence::bound)),
            news: Condvar::new(),
            path: path.to_owned(),
            bound_hook: OnceLock::new(),
        });
        gate.read();
        let g = gate.clone();
        std::thread::Builder::new()
            .name("fence".into())
            .spawn(move || {
                // The daemon's signals are the signal thread's: one taken here would
                // run its default action (SIGTERM, SIGUSR1/2, SIGHUP end the process
                // instead of unmounting or leaving for a successor). This thread starts
                // before the daemon blocks them, so it blocks them itself.
                let _ = nix::sys::signal::SigSet::all().thread_block();
                g.watch()
            })?;
        Ok(gate)
    }

    /// Tell `hook` the epoch this gate serves under, now if it is bound and after each
    /// reading of the fence file (the daemon keeps it in its handoff state).
    pub fn on_bound(&self, hook: impl Fn(u64) + Send + Sync + 'static) {
        let _ = self.bound_hook.set(Box::new(hook));
        self.tell_bound();
    }

    fn tell_bound(&self) {
        let epoch = self.lock().epoch();
        if let (Some(e), Some(hook)) = (epoch, self.bound_hook.get()) {
            hook(e);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Fence> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until a mutation may complete; `Err` when it never may.
    pub fn admit(&self) -> Result<(), Revoked> {
        let mut f = self.lock();
        loop {
            match f.verdict(boottime_ns()) {
                Verdict::Writable => return Ok(()),
                Verdict::Revoked => return Err(Revoked),
                Verdict::Fenced => {
                    f = self
                        .news
                        .wait_timeout(f, RECHECK)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// Read the fence file and take its news in (a missing or unreadable file is no
    /// news: the deadline heard last stands).
    fn read(&self) -> Option<Verdict> {
        let news = read_news(&self.path)?;
        let mut f = self.lock();
        f.hear(&news);
        let v = f.verdict(boottime_ns());
        drop(f);
        self.news.notify_all();
        self.tell_bound();
        Some(v)
    }

    fn watch(&self) {
        let mut last = self.lock().verdict(boottime_ns());
        tracing::info!(fence_file = %self.path.display(), verdict = ?last, "self-fencing on");
        loop {
            std::thread::sleep(POLL);
            let v = self
                .read()
                .unwrap_or_else(|| self.lock().verdict(boottime_ns()));
            if v != last {
                match v {
                    Verdict::Fenced => tracing::warn!(
                        "fenced: no news of the node's liveness Lease for fenceAfter; \
                         writes wait"
                    ),
                    Verdict::Writable => {
                        tracing::info!("the node's Lease was renewed: writes go on")
                    }
                    Verdict::Revoked => tracing::error!(
                        "revoked: the node lost its Lease; every write fails (EIO) from now on"
                    ),
                }
                last = v;
            }
        }
    }
}

/// The news in the fence file at `path`, if it holds any.
fn read_news(path: &Path) -> Option<News> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(MAX_FILE);
    std::fs::File::open(path)
        .ok()?
        .take(MAX_FILE as u64)
        .read_to_end(&mut buf)
        .ok()?;
    News::parse(std::str::from_utf8(&buf).ok()?)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::contract::fence::news_text;

    fn write(path: &Path, epoch: u64, renewed_ns: u64, fence_after: Duration) {
        let n = News {
            epoch,
            renewed_ns,
            fence_after,
        };
        std::fs::write(path, news_text(&n)).unwrap();
    }

    #[test]
    fn a_gate_waits_for_news_and_fails_when_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.fence");
        write(&path, 1, boottime_ns(), Duration::from_secs(60));
        let gate = Gate::start(&path, None).unwrap();
        assert_eq!(gate.admit(), Ok(()));

        // Old news: fenced; a waiting admission goes on once fresh news comes.
        write(&path, 1, 1, Duration::from_millis(1));
        let waiter = {
            let g = gate.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                (g.admit(), t.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(500));
        write(&path, 1, boottime_ns(), Duration::from_secs(60));
        let (r, waited) = waiter.join().unwrap();
        assert_eq!(r, Ok(()));
        // The stale file did not move the deadline back: it never fenced.
        assert!(waited < Duration::from_millis(400), "{waited:?}");

        // A new epoch revokes.
        write(&path, 2, boottime_ns(), Duration::from_secs(60));
        std::thread::sleep(POLL * 3);
        assert_eq!(gate.admit(), Err(Revoked));
    }

    #[test]
    fn a_gate_without_news_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.fence");
        let gate = Gate::start(&path, None).unwrap();
        let g = gate.clone();
        let waiter = std::thread::spawn(move || g.admit());
        std::thread::sleep(Duration::from_millis(400));
        assert!(!waiter.is_finished(), "no news: a write must wait");
        write(&path, 5, boottime_ns(), Duration::from_secs(60));
        assert_eq!(waiter.join().unwrap(), Ok(()));
    }
}
