//! What a mount Pod's status says, in the MountPod's terms, without I/O: is it
//! starting, running or failed, and the container's last error, in words, for
//! `status.lastError`.
//!
//! ```text
//!  Pod.status ─▶ pod_state() ─▶ Starting(why) | Running | Failed(why)
//!             ─▶ last_error() ─▶ "tessera-mount terminated: Error, exit code 1: …"
//! ```

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};

use tessera_api::MOUNT_POD_CONTAINER;

/// Waiting reasons after which the container does not start without a change.
const FAILED_WAITING: [&str; 7] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
];

/// Where a mount Pod is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Not running yet (scheduled, pulling, creating); why, in words.
    Starting(String),
    /// Its container runs.
    Running,
    /// It will not run without a change (image missing, crash loop, Pod failed).
    Failed(String),
}

fn container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == MOUNT_POD_CONTAINER)
}

fn terminated(t: &ContainerStateTerminated) -> String {
    let mut s = format!(
        "{MOUNT_POD_CONTAINER} terminated: {}, exit code {}",
        t.reason.as_deref().unwrap_or("unknown reason"),
        t.exit_code
    );
    if let Some(sig) = t.signal.filter(|s| *s != 0) {
        s.push_str(&format!(", signal {sig}"));
    }
    if let Some(m) = t
        .message
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
    {
        s.push_str(": ");
        s.push_str(&tessera_text::truncated(m, 512));
    }
    s
}

/// The container's last error: how it last terminated (now or before its last
/// restart), or why it waits when that is a failure.
pub fn last_error(pod: &Pod) -> Option<String> {
    let c = container(pod)?;
    let now = c.state.as_ref();
    if let Some(t) = now.and_then(|s| s.terminated.as_ref()) {
        return Some(terminated(t));
    }
    let before = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(terminated);
    let waiting = now
        .and_then(|s| s.waiting.as_ref())
        .filter(|w| FAILED_WAITING.contains(&w.reason.as_deref().unwrap_or("")))
        .map(|w| {
            let mut s = format!(
                "{MOUNT_POD_CONTAINER} waiting: {}",
                w.reason.as_deref().unwrap_or("")
            );
            if let Some(m) = w.message.as_deref().filter(|m| !m.is_empty()) {
                s.push_str(": ");
                s.push_str(&tessera_text::truncated(m, 512));
            }
            s
        });
    match (waiting, before) {
        (Some(w), Some(b)) => Some(format!("{w}; last {b}")),
        (w, b) => w.or(b),
    }
}

/// How many times the kubelet restarted the container.
pub fn restarts(pod: &Pod) -> i32 {
    container(pod).map(|c| c.restart_count).unwrap_or(0)
}

/// Whether the container waits for the kubelet's restart (`CrashLoopBackOff`): a
/// failure for a start, but the way to a successor after a crash.
pub fn backing_off(pod: &Pod) -> bool {
    container(pod).and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
        == Some("CrashLoopBackOff")
}

/// The kubelet's delay before it restarts a container that has been restarted
/// `restarts` times (its crash-loop backoff: none at the first crash, then 10 s
/// doubling up to 300 s; reset after 10 min of running, which this over-estimates).
pub fn restart_delay(restarts: i32) -> Duration {
    match restarts {
        ..=0 => Duration::ZERO,
        n => Duration::from_secs(10 << (n - 1).min(5)).min(Duration::from_secs(300)),
    }
}

/// How long a new mount Pod may stay Starting (the kubelet still creating its sandbox
/// and container: nothing has failed) before its start counts as failed: four start
/// timeouts. A busy kubelet (100 Pods with a claim each created at once on a node,
/// and their mount Pods) takes more than one; failing the MountPod then costs a new
/// mount Pod, and the Pod waiting in NodePublish the kubelet's backoff.
pub fn kubelet_start_bound(start_timeout: Duration) -> Duration {
    start_timeout.saturating_mul(4)
}

/// Whether a start that has waited `waited` for its new mount Pod's daemon (not seen
/// in /proc yet) gives up, and why: the Pod `Failed`, at once; still `Starting` after
/// [`kubelet_start_bound`]; `Running` (since `running_for`, first seen so) for a
/// whole start timeout without its daemon visible (counted from the container's
/// start, not the Pod's creation: a busy kubelet starts it late).
pub fn start_gives_up(
    state: &PodState,
    waited: Duration,
    running_for: Duration,
    start_timeout: Duration,
) -> Option<String> {
    match state {
        PodState::Failed(why) => Some(why.clone()),
        PodState::Starting(why) => {
            let bound = kubelet_start_bound(start_timeout);
            (waited >= bound).then(|| format!("did not start within {bound:?}: {why}"))
        }
        PodState::Running => (running_for >= start_timeout).then(|| {
            format!(
                "its container runs, but no `tessera mount` of it is visible in /proc after {start_timeout:?} (does the agent run with hostPID?)"
            )
        }),
    }
}

/// How long to wait for the kubelet's restart of a dead daemon's container to take
/// the held connection over: its crash-loop delay and a start, at least
/// `start_timeout`, at most `grace` (the fd holder's orphan grace: after it the
/// holder has let the connection go, and only a remount can serve the volume).
pub fn successor_wait(restarts: i32, start_timeout: Duration, grace: Duration) -> Duration {
    (restart_delay(restarts) + start_timeout)
        .min(grace)
        .max(start_timeout)
}

/// Where the mount Pod is.
pub fn pod_state(pod: &Pod) -> PodState {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Failed") | Some("Succeeded")) {
        let why = last_error(pod).unwrap_or_else(|| {
            let s = pod.status.as_ref();
            format!(
                "mount Pod {}: {}",
                phase.unwrap_or_default(),
                s.and_then(|s| s.message.clone().or(s.reason.clone()))
                    .unwrap_or_default()
            )
        });
        return PodState::Failed(why);
    }
    let Some(c) = container(pod) else {
        return PodState::Starting(format!(
            "mount Pod {}",
            phase.unwrap_or("not scheduled yet")
        ));
    };
    let state = c.state.as_ref();
    if state.and_then(|s| s.running.as_ref()).is_some() {
        return PodState::Running;
    }
    if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = w.reason.as_deref().unwrap_or("");
        if FAILED_WAITING.contains(&reason) {
            return PodState::Failed(last_error(pod).unwrap_or_else(|| reason.into()));
        }
        return PodState::Starting(format!("{MOUNT_POD_CONTAINER} waiting: {reason}"));
    }
    match last_error(pod) {
        Some(e) => PodState::Starting(e),
        None => PodState::Starting(format!("{MOUNT_POD_CONTAINER} not running yet")),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateWaiting, PodStatus,
    };

    use super::*;

    #[test]
    fn the_successor_wait_follows_the_crash_loop_up_to_the_orphan_grace() {
        let s = Duration::from_secs;
        let (start, grace) = (s(30), s(60));
        // restarts so far → kubelet's delay, our wait
        let table = [
            (-1, s(0), s(30)),
            (0, s(0), s(30)),
            (1, s(10), s(40)),
            (2, s(20), s(50)),
            (3, s(40), s(60)),
            (4, s(80), s(60)),
            (6, s(300), s(60)),
            (40, s(300), s(60)),
        ];
        for (restarts, delay, wait) in table {
            assert_eq!(restart_delay(restarts), delay, "{restarts}");
            assert_eq!(successor_wait(restarts, start, grace), wait, "{restarts}");
        }
        // A start timeout longer than the grace still bounds a start.
        assert_eq!(successor_wait(3, s(90), grace), s(90));
    }

    #[test]
    fn a_crash_loop_is_a_wait_for_the_restart() {
        let backoff = pod(
            "Running",
            Some(waiting("CrashLoopBackOff", "back-off")),
            None,
        );
        assert!(backing_off(&backoff));
        assert!(matches!(pod_state(&backoff), PodState::Failed(_)));
        for other in [
            pod("Running", Some(waiting("ErrImagePull", "x")), None),
            pod("Running", None, None),
        ] {
            assert!(!backing_off(&other));
        }
    }

    fn pod(phase: &str, state: Option<ContainerState>, last: Option<ContainerState>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: state.map(|s| {
                    vec![ContainerStatus {
                        name: MOUNT_POD_CONTAINER.into(),
                        state: Some(s),
                        last_state: last,
                        restart_count: 2,
                        ..ContainerStatus::default()
                    }]
                }),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn waiting(reason: &str, message: &str) -> ContainerState {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..ContainerState::default()
        }
    }

    fn exited(code: i32, reason: &str, message: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                reason: Some(reason.into()),
                message: Some(message.into()),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    }

    fn running() -> ContainerState {
        ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        }
    }

    #[test]
    fn states_and_errors() {
        use PodState::*;
        let crash = "tessera-mount terminated: Error, exit code 1: mount failed";
        let table: Vec<(Pod, PodState, Option<&str>)> = vec![
            (
                pod("Pending", None, None),
                Starting("mount Pod Pending".into()),
                None,
            ),
            (
                Pod::default(),
                Starting("mount Pod not scheduled yet".into()),
                None,
            ),
            (
                pod("Pending", Some(waiting("ContainerCreating", "")), None),
                Starting("tessera-mount waiting: ContainerCreating".into()),
                None,
            ),
            (pod("Running", Some(running()), None), Running, None),
            // Running again after a crash: running, and the crash is the last error.
            (
                pod(
                    "Running",
                    Some(running()),
                    Some(exited(1, "Error", "mount failed")),
                ),
                Running,
                Some(crash),
            ),
            (
                pod("Pending", Some(waiting("ErrImagePull", "not found")), None),
                Failed("tessera-mount waiting: ErrImagePull: not found".into()),
                Some("tessera-mount waiting: ErrImagePull: not found"),
            ),
            (
                pod(
                    "Running",
                    Some(waiting("CrashLoopBackOff", "back-off 10s")),
                    Some(exited(1, "Error", "mount failed")),
                ),
                Failed(format!(
                    "tessera-mount waiting: CrashLoopBackOff: back-off 10s; last {crash}"
                )),
                None,
            ),
            (
                pod("Running", Some(exited(137, "Error", "")), None),
                Starting("tessera-mount terminated: Error, exit code 137".into()),
                Some("tessera-mount terminated: Error, exit code 137"),
            ),
            (
                pod("Failed", Some(exited(2, "Error", "bad flag")), None),
                Failed("tessera-mount terminated: Error, exit code 2: bad flag".into()),
                None,
            ),
        ];
        for (p, state, error) in table {
            assert_eq!(pod_state(&p), state, "{:?}", p.status);
            if let Some(e) = error {
                assert_eq!(last_error(&p).as_deref(), Some(e));
            }
        }
        assert_eq!(restarts(&pod("Running", Some(running()), None)), 2);
        assert_eq!(restarts(&Pod::default()), 0);
        assert_eq!(last_error(&Pod::default()), None);
    }

    #[test]
    fn a_start_gives_up_on_failure_at_once_and_on_a_slow_kubelet_late() {
        let t = Duration::from_secs(30);
        let s = |n: u64| Duration::from_secs(n);
        let starting = PodState::Starting("tessera-mount waiting: ContainerCreating".into());
        // (what, state, waited, running for, gives up)
        let cases = [
            (
                "failed",
                PodState::Failed("ErrImagePull".into()),
                s(1),
                s(0),
                true,
            ),
            (
                "creating, one start timeout",
                starting.clone(),
                s(30),
                s(0),
                false,
            ),
            (
                "creating, almost four",
                starting.clone(),
                s(119),
                s(0),
                false,
            ),
            (
                "creating, four start timeouts",
                starting,
                s(120),
                s(0),
                true,
            ),
            (
                "running late, just started",
                PodState::Running,
                s(45),
                s(1),
                false,
            ),
            (
                "running a start timeout, no daemon",
                PodState::Running,
                s(60),
                s(30),
                true,
            ),
        ];
        for (what, state, waited, running_for, gives_up) in cases {
            let got = start_gives_up(&state, waited, running_for, t);
            assert_eq!(got.is_some(), gives_up, "{what}: {got:?}");
        }
        assert!(
            start_gives_up(&PodState::Starting("x".into()), s(120), s(0), t)
                .unwrap()
                .contains("within 120s: x")
        );
    }
}
