//! Pod mode: each MountPod of this node is served by a real mount Pod (image:
//! Tessera's own, `tessera mount …`), so that the daemons live outside the agent's
//! container: a restart or a rollout of the agent touches no mount.
//!
//! ```text
//!  mount_service::MountService ──Daemons──▶ PodDaemons
//!    start   create Pod <pod_name(volume, node)> (spec::mount_pod), a leftover of
//!            the same name (or a standby of this mount) deleted first; then find its
//!            daemon in /proc (hostPID; one scan shared by all waiting mounts, procscan):
//!            `tessera mount … --mountpoint M` in a cgroup of the Pod's uid ──▶ Daemon
//!            (a failed Pod: its container's last error, state::pod_state)
//!    liveness/signal   /proc, pid + start time + command line, as in process mode
//!    stop    delete the Pod with the grace asked (the kubelet sends SIGTERM: the
//!            daemon unmounts), wait until both the process and the Pod are gone
//!    replace (an upgrade) create a standby Pod <spec::standby_name> (or back to
//!            <pod_name> if the serving one has the other name), `--standby`: its
//!            daemon waits at the fd holder; once it runs, SIGUSR2 to the old daemon
//!            and delete the old Pod: its SIGTERM now exits leaving the mount to the
//!            holder, which hands it to the standby at once
//!    leave   SIGUSR2, then delete the Pod (process-mode-like order, kept for callers)
//! ```
//!
//! The Pods of a mount are found by name (the plain one, or the standby name of the
//! image the Pod runs), listed by label on this node: one of them serves, the
//! others are being deleted (or, between a standby's creation and the old Pod's
//! deletion, waiting); `start` deletes any other before creating the plain one.
//!
//! The agent adopts a running daemon from its record after a restart as in process
//! mode: the Pod is not touched. A daemon that died while the fd holder (the
//! `tessera-fd-holder` DaemonSet) keeps its connection is taken over by the kubelet's
//! restart of the container (`successor`: the Pod is left alone). Otherwise (no
//! holder, Pod deleted, no restart in time) it is a broken mount: the repair deletes
//! the Pod and creates it again, then re-binds. The agent
//! needs `hostPID` to see the daemons; the Pods are owned by their MountPod, so the
//! garbage collector removes one whose MountPod is gone.

pub mod extras;
pub mod procscan;
pub mod spec;
pub mod state;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::{info, warn};

use tessera_fuse::contract::control;

use super::daemon_spec::DaemonSpec;
use super::supervisor::{self, Daemon, Daemons, Liveness, proc_liveness};
use procscan::ProcScan;
use state::PodState;

pub use spec::Template;

/// How long one API call of the blocking side may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A mount waiting for its daemon reads its Pod 0.5 s after its first look, then
/// twice as long each time up to 2 s (how late a failed or deleted Pod may be
/// noticed): a hundred mounts starting at once must not GET their Pods 200 times a
/// second.
const START_LOOKS: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(2));
/// A mount Pod being deleted is read 0.1 s after the deletion, then twice as long each
/// time up to 1 s (a hundred detached at once used to GET their Pods every 0.1 s).
const REMOVE_LOOKS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// When to read a Pod next: gaps that double from a first one up to a longest one.
struct Looks {
    next: Instant,
    every: Duration,
    max: Duration,
}

impl Looks {
    /// The first look `first` after `now`; then `(gap, max)`.
    fn new(now: Instant, first: Duration, (gap, max): (Duration, Duration)) -> Self {
        Looks {
            next: now + first,
            every: gap,
            max,
        }
    }

    /// Whether to read the Pod now (and when next, if so).
    fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.every;
        self.every = (self.every * 2).min(self.max);
        true
    }
}

/// Daemons in mount Pods. Its methods block (the agent calls them on the blocking
/// pool) and reach the API server through `rt`.
pub struct PodDaemons {
    pods: Api<Pod>,
    rt: tokio::runtime::Handle,
    template: Template,
    start_timeout: Duration,
    procs: ProcScan,
}

fn pod_err(name: &str, message: impl Into<String>) -> supervisor::Error {
    supervisor::Error::MountPod {
        name: name.to_string(),
        message: message.into(),
    }
}

impl PodDaemons {
    /// Mount Pods from `template`, created through `client` on the runtime `rt`.
    pub fn new(
        client: Client,
        rt: tokio::runtime::Handle,
        template: Template,
        start_timeout: Duration,
    ) -> Self {
        PodDaemons {
            pods: Api::namespaced(client, &template.namespace),
            rt,
            template,
            start_timeout,
            procs: ProcScan::default(),
        }
    }

    fn call<T>(
        &self,
        name: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, supervisor::Error> {
        self.rt
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, fut).await })
            .map_err(|_| pod_err(name, "the API server did not answer in time"))?
            .map_err(|e| pod_err(name, tessera_runtime::error_chain(&e)))
    }

    fn get(&self, name: &str) -> Result<Option<Pod>, supervisor::Error> {
        self.call(name, self.pods.get_opt(name))
    }

    /// Delete `name` (if there) with `grace`; `Some(uid)` of the Pod being deleted.
    fn delete(&self, name: &str, grace: Duration) -> Result<(), supervisor::Error> {
        let dp = DeleteParams {
            grace_period_seconds: Some(grace.as_secs() as u32),
            ..DeleteParams::default()
        };
        match self.rt.block_on(async {
            tokio::time::timeout(CALL_TIMEOUT, self.pods.delete(name, &dp)).await
        }) {
            Err(_) => Err(pod_err(name, "the API server did not answer in time")),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(()),
            Ok(Err(e)) => Err(pod_err(name, tessera_runtime::error_chain(&e))),
        }
    }

    /// Delete `name` and wait until it is gone from the API server (the kubelet has
    /// stopped its container), and `daemon` with it. Past `grace` + 5 s a daemon still
    /// running is killed, and a Pod whose process is gone is removed at once (a
    /// kubelet that does not answer).
    fn remove(
        &self,
        name: &str,
        daemon: Option<(Daemon, &Path)>,
        grace: Duration,
    ) -> Result<(), supervisor::Error> {
        self.delete(name, grace)?;
        let begun = Instant::now();
        let firm = grace + Duration::from_secs(5);
        let mut forced = false;
        let mut told = None;
        let mut looks = Looks::new(begun, REMOVE_LOOKS.0, REMOVE_LOOKS);
        let mut there = true;
        let mut was_running = true;
        loop {
            let running = daemon.is_some_and(|(d, m)| proc_liveness(d, m) == Liveness::Running);
            // The Pod is read on its schedule, and at once when its daemon has just
            // ended (or there is none): the kubelet removes the Pod soon after.
            if looks.due(Instant::now()) || (was_running && !running) {
                let pod = self.get(name)?;
                // How the container ended, once the kubelet says (with its log's last
                // lines: FallbackToLogsOnError): the Pod and its log are about to go.
                if let Some(e) = pod.as_ref().and_then(state::last_error)
                    && told.as_ref() != Some(&e)
                {
                    info!(pod = name, ended = %e, "mount Pod's container ended");
                    told = Some(e);
                }
                there = pod.is_some();
            }
            was_running = running;
            if !running && !there {
                return Ok(());
            }
            if begun.elapsed() >= firm && !forced {
                forced = true;
                if let Some((d, _)) = daemon.filter(|_| running) {
                    warn!(
                        pod = name,
                        pid = d.pid,
                        "mount Pod did not stop in time; SIGKILL"
                    );
                    let _ = kill(Pid::from_raw(d.pid), Signal::SIGKILL);
                }
                if there {
                    warn!(
                        pod = name,
                        "mount Pod still there; deleting it without grace"
                    );
                    self.delete(name, Duration::ZERO)?;
                }
            }
            if begun.elapsed() >= firm + Duration::from_secs(25) {
                return Err(match daemon.filter(|_| running) {
                    Some((d, _)) => supervisor::Error::Unkillable { pid: d.pid },
                    None => pod_err(name, "still not deleted"),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The mount Pods of `volume` on this node: the one named [`spec::pod_name`] and
    /// standbys ([`spec::standby_name`]), including those being deleted.
    fn pods_of(&self, volume: &str) -> Result<Vec<Pod>, supervisor::Error> {
        let lp = ListParams::default()
            .labels(&spec::selector())
            .fields(&format!("spec.nodeName={}", self.template.node));
        let name = spec::pod_name(volume, &self.template.node);
        let list = self.call(&name, self.pods.list(&lp))?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| {
                spec::is_mount_pod_of(
                    &p.name_any(),
                    spec::image_of(p),
                    volume,
                    &self.template.node,
                )
            })
            .collect())
    }

    /// The mount Pod serving `volume`: the one not being deleted (there is one but
    /// during a replacement; then the one `daemon` runs in, else the newest).
    fn serving_pod(
        &self,
        volume: &str,
        daemon: Option<(Daemon, &Path)>,
    ) -> Result<Option<Pod>, supervisor::Error> {
        let mut live: Vec<Pod> = self
            .pods_of(volume)?
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if let Some((d, m)) = daemon
            && let Some(i) = live
                .iter()
                .position(|p| self.procs.find(&p.uid().unwrap_or_default(), m) == Some(d))
        {
            return Ok(Some(live.swap_remove(i)));
        }
        live.sort_by(|a, b| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
        });
        Ok(live.pop())
    }

    /// Delete every mount Pod of `volume` but `keep`, waiting until they are gone.
    fn remove_others(
        &self,
        volume: &str,
        keep: Option<&str>,
        daemon: Option<(Daemon, &Path)>,
        grace: Duration,
    ) -> Result<(), supervisor::Error> {
        let mut removed = false;
        for p in self.pods_of(volume)? {
            let name = p.name_any();
            if Some(name.as_str()) != keep {
                self.remove(&name, daemon, grace)?;
                removed = true;
            }
        }
        // No Pod left, but a daemon may still be exiting: wait for it as well.
        if !removed && daemon.is_some() {
            let name = spec::pod_name(volume, &self.template.node);
            if Some(name.as_str()) != keep {
                self.remove(&name, daemon, grace)?;
            }
        }
        Ok(())
    }

    /// Wait until the daemon of the Pod `uid` (named `name`) for `mountpoint` is
    /// visible in /proc, or [`state::start_gives_up`] says it will not be.
    fn await_daemon(
        &self,
        name: &str,
        uid: &str,
        mountpoint: &Path,
    ) -> Result<Daemon, supervisor::Error> {
        let started = Instant::now();
        let mut running_since: Option<Instant> = None;
        let mut looks = Looks::new(started, Duration::ZERO, START_LOOKS);
        loop {
            if let Some(d) = self.procs.find(uid, mountpoint) {
                return Ok(d);
            }
            let now = Instant::now();
            if looks.due(now) {
                let p = self.get(name)?;
                match p {
                    None => return Err(pod_err(name, "deleted while starting")),
                    Some(p) if p.uid().as_deref() != Some(uid) => {
                        return Err(pod_err(name, "replaced while starting"));
                    }
                    Some(p) => {
                        let state = state::pod_state(&p);
                        if matches!(state, PodState::Running) {
                            running_since.get_or_insert(now);
                        }
                        let running_for = running_since.map_or(Duration::ZERO, |r| now - r);
                        let waited = now - started;
                        if let Some(why) =
                            state::start_gives_up(&state, waited, running_for, self.start_timeout)
                        {
                            return Err(pod_err(name, why));
                        }
                    }
                }
            }
            std::thread::sleep(procscan::FRESH);
        }
    }

    /// The Pod's uid once created: a Pod of the same name left over (its daemon no
    /// longer recorded, or a repair racing the kubelet) is deleted first.
    fn create(
        &self,
        name: &str,
        pod: &Pod,
        deadline: Instant,
    ) -> Result<String, supervisor::Error> {
        loop {
            let created = self.rt.block_on(async {
                tokio::time::timeout(CALL_TIMEOUT, self.pods.create(&PostParams::default(), pod))
                    .await
            });
            match created {
                Err(_) => return Err(pod_err(name, "the API server did not answer in time")),
                Ok(Ok(p)) => return Ok(p.uid().unwrap_or_default()),
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                    info!(
                        pod = name,
                        "a mount Pod of this name is left over; replacing it"
                    );
                    self.remove(name, None, Duration::from_secs(2))?;
                }
                Ok(Err(e)) => return Err(pod_err(name, tessera_runtime::error_chain(&e))),
            }
            if Instant::now() >= deadline {
                return Err(pod_err(name, "a Pod of this name is still being deleted"));
            }
        }
    }
}

impl Daemons for PodDaemons {
    fn start(&self, spec: &DaemonSpec, _log: &Path) -> Result<Daemon, supervisor::Error> {
        let pod = spec::mount_pod(&self.template, spec);
        let name = pod.name_any();
        // A standby left over (its daemon no longer recorded): one Pod serves a mount.
        self.remove_others(&spec.volume, Some(&name), None, Duration::from_secs(2))?;
        let deadline = Instant::now() + self.start_timeout;
        let uid = self.create(&name, &pod, deadline)?;
        info!(pod = %name, uid = %uid, "mount Pod created");
        self.await_daemon(&name, &uid, &spec.mountpoint)
    }

    /// The kubelet restarts the mount container of a dead daemon (restartPolicy
    /// Always, same args: `--holder …`), and that daemon takes the held connection
    /// over: wait for it in the same Pod (never delete the Pod here: its deletion
    /// would SIGTERM the successor, which then drops the connection and unmounts). A
    /// Pod that is gone or being deleted is created again, with the same args.
    fn successor(
        &self,
        spec: &DaemonSpec,
        log: &Path,
        dead: Daemon,
    ) -> Result<Daemon, supervisor::Error> {
        let pod = match self.serving_pod(&spec.volume, None)? {
            Some(p) => p,
            None => return self.start(spec, log),
        };
        let name = pod.name_any();
        let uid = pod.uid().unwrap_or_default();
        // The kubelet restarts a container that crashed again and again only after
        // its crash-loop backoff: wait that long (up to the holder's orphan grace),
        // or repeated crashes would fall back to a remount.
        let wait = state::successor_wait(
            state::restarts(&pod),
            self.start_timeout,
            tessera_fuse::contract::holder_socket::DEFAULT_ORPHAN_GRACE,
        );
        info!(pod = %name, uid = %uid, wait_s = wait.as_secs(), "mount daemon died; waiting for the kubelet's restart of its container to take the connection over");
        let deadline = Instant::now() + wait;
        let mut looks = Looks::new(Instant::now(), START_LOOKS.0, START_LOOKS);
        loop {
            if let Some(d) = self
                .procs
                .find(&uid, &spec.mountpoint)
                .filter(|d| *d != dead)
            {
                return Ok(d);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(pod_err(
                    &name,
                    format!("no restarted daemon within {wait:?} to take the connection over"),
                ));
            }
            if looks.due(now) {
                match self.get(&name)? {
                    Some(p) if p.uid().as_deref() == Some(uid.as_str()) => {
                        // CrashLoopBackOff is the wait for the restart, not a failure.
                        if let PodState::Failed(why) = state::pod_state(&p)
                            && !state::backing_off(&p)
                        {
                            return Err(pod_err(&name, why));
                        }
                    }
                    _ => return Err(pod_err(&name, "deleted while its daemon restarted")),
                }
            }
            std::thread::sleep(procscan::FRESH);
        }
    }

    fn liveness(&self, daemon: Daemon, mountpoint: &Path) -> Liveness {
        match proc_liveness(daemon, mountpoint) {
            Liveness::Running => Liveness::Running,
            Liveness::Exited(why) => {
                let volume = spec::volume_of(mountpoint);
                let detail = match self.serving_pod(&volume, None) {
                    Ok(Some(p)) => state::last_error(&p),
                    Ok(None) => Some(format!("the mount Pod of {volume} is gone")),
                    Err(_) => None,
                };
                Liveness::Exited(match detail {
                    Some(d) => format!("{why}; {d}"),
                    None => why,
                })
            }
        }
    }

    fn signal(
        &self,
        daemon: Daemon,
        mountpoint: &Path,
        signal: Signal,
    ) -> Result<(), supervisor::Error> {
        if proc_liveness(daemon, mountpoint) != Liveness::Running {
            return Ok(());
        }
        kill(Pid::from_raw(daemon.pid), signal).map_err(|errno| supervisor::Error::Signal {
            pid: daemon.pid,
            signal,
            errno,
        })
    }

    /// Delete the mount Pod (a dead daemon's too: the kubelet would restart it).
    fn stop(
        &self,
        daemon: Daemon,
        mountpoint: &Path,
        grace: Duration,
    ) -> Result<(), supervisor::Error> {
        let volume = spec::volume_of(mountpoint);
        self.remove_others(&volume, None, Some((daemon, mountpoint)), grace)
    }

    /// The kubelet's runtime reaps the daemons.
    fn reap(&self) {}

    fn image(&self) -> Option<String> {
        Some(self.template.image.clone())
    }

    /// The image of the mount Pod's container (`None`: no such Pod, or no answer).
    fn serving_image(&self, mountpoint: &Path) -> Option<String> {
        let pod = self
            .serving_pod(&spec::volume_of(mountpoint), None)
            .ok()??;
        spec::image_of(&pod).map(String::from)
    }

    /// An upgrade: a standby Pod (the other name, the template's image, `--standby`)
    /// is created and its daemon seen waiting; then `old` leaves as in [`Self::leave`]
    /// and the standby takes the connection over at once. If the standby does not
    /// start, it is deleted and `old` keeps serving.
    fn replace(
        &self,
        old: Daemon,
        spec: &DaemonSpec,
        _log: &Path,
        grace: Duration,
    ) -> Result<Daemon, supervisor::Error> {
        let m = spec.mountpoint.as_path();
        let current = self
            .serving_pod(&spec.volume, Some((old, m)))?
            .map(|p| p.name_any());
        let base = spec::pod_name(&spec.volume, &self.template.node);
        let name = if current.as_deref() == Some(base.as_str()) {
            spec::standby_name(&spec.volume, &self.template.node, &self.template.image)
        } else {
            base
        };
        let pod = spec::standby_pod(&self.template, spec, &name);
        let uid = self.create(&name, &pod, Instant::now() + self.start_timeout)?;
        info!(pod = %name, uid = %uid, serving = ?current, "standby mount Pod created");
        let standby = match self.await_daemon(&name, &uid, m) {
            Ok(d) => d,
            Err(e) => {
                warn!(pod = %name, error = %e, "standby did not start; the serving daemon stays");
                let _ = self.remove(&name, None, Duration::from_secs(2));
                return Err(e);
            }
        };
        self.signal(old, m, control::LEAVE_ON_STOP)?;
        info!(
            pid = old.pid,
            standby = standby.pid,
            "mount daemon told to leave its mount to the standby; deleting its Pod"
        );
        // Its Pod (and any other of this mount but the standby's) goes: the kubelet
        // must not restart the old daemon.
        self.remove_others(&spec.volume, Some(&name), Some((old, m)), grace)?;
        Ok(standby)
    }

    /// An upgrade: SIGUSR2 (the next stop signal leaves the mount to a successor),
    /// then delete the Pod (its SIGTERM makes the daemon exit without unmounting; the
    /// Pod's deletion keeps the kubelet from restarting it, with the old image), and
    /// wait until both are gone, so the Pod of the same name can be created anew.
    fn leave(
        &self,
        daemon: Daemon,
        mountpoint: &Path,
        grace: Duration,
    ) -> Result<(), supervisor::Error> {
        let volume = spec::volume_of(mountpoint);
        self.signal(daemon, mountpoint, control::LEAVE_ON_STOP)?;
        info!(volume = %volume, pid = daemon.pid, "mount daemon told to leave its mount to a successor; deleting its Pod");
        self.remove_others(&volume, None, Some((daemon, mountpoint)), grace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_come_at_doubling_gaps_up_to_the_longest() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let at = |mut l: Looks| -> Vec<u64> {
            (0..=6000)
                .step_by(50)
                .filter(|&t| l.due(t0 + ms(t)))
                .collect()
        };
        assert_eq!(
            at(Looks::new(t0, Duration::ZERO, START_LOOKS)),
            [0, 500, 1500, 3500, 5500]
        );
        assert_eq!(
            at(Looks::new(t0, REMOVE_LOOKS.0, REMOVE_LOOKS)),
            [100, 200, 400, 800, 1600, 2600, 3600, 4600, 5600]
        );
    }
}
