//! Blocking lock requests (`F_SETLKW`, `flock` without `LOCK_NB`) without blocking a
//! request thread.
//!
//! A blocking request is first tried at once on the request thread; only if the lock
//! is held elsewhere does it become a wait here. One waiter thread (started with the
//! first wait, gone with the last) retries each wait without blocking, on a backoff
//! from 1 ms doubling to [`MAX_BACKOFF`], and completes it when the lock is taken or
//! the attempt fails otherwise. At most `cap` waits at once; more fail with ENOLCK.
//!
//! An interrupt (FUSE_INTERRUPT: the waiting process got a signal, was killed, its Pod
//! deleted) ends its wait with EINTR. An interrupt may be served before the request it
//! names reaches [`Waiters::wait`] (different request threads): it is then remembered
//! (the last [`REMEMBERED_INTERRUPTS`]) and ends the wait as soon as it arrives.
//!
//! Retrying on the backend, instead of one blocked `F_OFD_SETLKW` thread per waiter,
//! keeps threads bounded, makes a wait cancellable at any moment, and works the same
//! for a holder on this node or another one (the backend wakes nobody across nodes
//! anyway: NFS clients poll too). The price is up to [`MAX_BACKOFF`] between a release
//! and a waiter noticing it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::fs::lock;

/// Longest pause between two attempts of one wait.
pub const MAX_BACKOFF: Duration = Duration::from_millis(50);
/// Interrupts kept for requests that have not reached [`Waiters::wait`] yet.
pub const REMEMBERED_INTERRUPTS: usize = 256;

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The lock is taken.
    Taken,
    /// The attempt failed with this errno (not contention).
    Failed(i32),
    /// Interrupted (EINTR).
    Interrupted,
    /// Too many waits already (ENOLCK).
    TooMany,
}

/// One attempt: `Ok(true)` taken, `Ok(false)` still held elsewhere, `Err(errno)`.
pub type Attempt = Box<dyn FnMut() -> Result<bool, i32> + Send>;
/// Completes the request with how the wait ended (called exactly once).
pub type Done = Box<dyn FnOnce(WaitEnd) + Send>;

/// The pause after `tries` failed attempts: 1 ms, 2 ms, 4 ms … up to [`MAX_BACKOFF`].
pub fn backoff(tries: u32) -> Duration {
    Duration::from_millis(1u64 << tries.min(16)).min(MAX_BACKOFF)
}

struct Wait {
    attempt: Attempt,
    done: Done,
    tries: u32,
    due: Instant,
}

#[derive(Default)]
struct State {
    /// Waits by the FUSE request they answer.
    waits: HashMap<u64, Wait>,
    /// Waits being attempted right now (out of `waits`).
    attempting: usize,
    /// Interrupts of requests not waiting (yet), oldest first.
    interrupted: VecDeque<u64>,
    /// Whether the waiter thread runs.
    running: bool,
}

/// The blocking lock requests of a mount.
pub struct Waiters {
    state: Mutex<State>,
    wake: Condvar,
    cap: usize,
}

impl std::fmt::Debug for Waiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("Waiters")
            .field("waiting", &st.waits.len())
            .field("cap", &self.cap)
            .finish()
    }
}

impl Waiters {
    pub fn new(cap: usize) -> Arc<Waiters> {
        Arc::new(Waiters {
            state: Mutex::default(),
            wake: Condvar::new(),
            cap,
        })
    }

    /// Waits in progress.
    pub fn len(&self) -> usize {
        let st = lock(&self.state);
        st.waits.len() + st.attempting
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the waiter thread runs.
    pub fn running(&self) -> bool {
        lock(&self.state).running
    }

    /// Wait for request `unique`: retry `attempt` until it takes the lock or fails,
    /// then `done`. `done` may run before this returns (interrupted already, too many).
    pub fn wait(self: &Arc<Self>, unique: u64, attempt: Attempt, done: Done) {
        let mut st = lock(&self.state);
        if let Some(i) = st.interrupted.iter().position(|&u| u == unique) {
            st.interrupted.remove(i);
            drop(st);
            return done(WaitEnd::Interrupted);
        }
        if st.waits.len() + st.attempting >= self.cap {
            drop(st);
            return done(WaitEnd::TooMany);
        }
        st.waits.insert(
            unique,
            Wait {
                attempt,
                done,
                tries: 0,
                due: Instant::now() + backoff(0),
            },
        );
        if !st.running {
            st.running = true;
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("lock-waits".into())
                .spawn(move || me.run());
            if let Err(e) = spawned {
                st.running = false;
                tracing::error!(error = %e, "cannot start the lock waiter thread");
                let w = st.waits.remove(&unique).expect("just inserted");
                drop(st);
                (w.done)(WaitEnd::TooMany);
            }
        } else {
            self.wake.notify_one();
        }
    }

    /// A lock was released through this mount: attempt every wait now rather than
    /// after its backoff (a release elsewhere is only seen by the next attempt).
    pub fn retry_now(&self) {
        let mut st = lock(&self.state);
        if st.waits.is_empty() {
            return;
        }
        let now = Instant::now();
        for w in st.waits.values_mut() {
            w.due = now;
        }
        drop(st);
        self.wake.notify_one();
    }

    /// The kernel interrupts request `unique`: end its wait with EINTR, or remember
    /// the interrupt for when the request arrives.
    pub fn interrupt(&self, unique: u64) {
        let mut st = lock(&self.state);
        if let Some(w) = st.waits.remove(&unique) {
            drop(st);
            return (w.done)(WaitEnd::Interrupted);
        }
        if st.interrupted.len() >= REMEMBERED_INTERRUPTS {
            st.interrupted.pop_front();
        }
        st.interrupted.push_back(unique);
    }

    /// The waiter thread: attempt every due wait, sleep until the next is due.
    fn run(self: Arc<Self>) {
        let mut st = lock(&self.state);
        loop {
            if st.waits.is_empty() {
                st.running = false;
                return;
            }
            let now = Instant::now();
            let due: Vec<u64> = st
                .waits
                .iter()
                .filter(|(_, w)| w.due <= now)
                .map(|(u, _)| *u)
                .collect();
            if due.is_empty() {
                let next = st.waits.values().map(|w| w.due).min().expect("not empty");
                st = self
                    .wake
                    .wait_timeout(st, next.saturating_duration_since(now))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            let mut batch: Vec<(u64, Wait)> = due
                .into_iter()
                .filter_map(|u| st.waits.remove(&u).map(|w| (u, w)))
                .collect();
            st.attempting = batch.len();
            drop(st);
            let mut ended = Vec::new();
            for (_, w) in batch.iter_mut() {
                let end = match (w.attempt)() {
                    Ok(true) => Some(WaitEnd::Taken),
                    Ok(false) => None,
                    Err(errno) => Some(WaitEnd::Failed(errno)),
                };
                w.tries += 1;
                w.due = Instant::now() + backoff(w.tries);
                ended.push(end);
            }
            st = lock(&self.state);
            st.attempting = 0;
            let mut finished = Vec::new();
            for ((unique, w), end) in batch.into_iter().zip(ended) {
                match end {
                    Some(end) => finished.push((w.done, end)),
                    None => {
                        if let Some(i) = st.interrupted.iter().position(|&u| u == unique) {
                            // Interrupted while it was being attempted.
                            st.interrupted.remove(i);
                            finished.push((w.done, WaitEnd::Interrupted));
                        } else {
                            st.waits.insert(unique, w);
                        }
                    }
                }
            }
            drop(st);
            for (done, end) in finished {
                done(end);
            }
            st = lock(&self.state);
        }
    }
}
