//! The MountPod status the agent writes, built without I/O: a reconcile pass says
//! what it found in a [`Report`] ([`serve_report`] for a serve pass), and
//! [`next_status`] folds it into the status it replaces (transition times kept while a
//! condition holds, `restarts` and `lastError` bookkeeping, `observedGeneration`).
//! The parent module compares the result with the API server's copy and writes it
//! only when it differs.
//!
//! Beside `Ready`, [`next_status`] adds kstatus's abnormal-true condition from the
//! report ([`progress`]): `Reconciling` while the mount starts, restarts, waits to
//! remount with new settings or is torn down; `Stalled` when it failed (the agent
//! retries with backoff, but what failed needs a person: `lastError` says what);
//! neither once Ready.
//!
//! The controller's `Fenced` condition (fenced failover: it writes it while the node
//! is fenced, when this agent may be unable to) is carried over as the agent finds it:
//! it is the controller's to set and to clear, and dropping it would only make the
//! controller write it again.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::controller::Action;

use tessera_api::{
    AppliedSettings, CONDITION_FENCED, CONDITION_READY, CONDITION_RECONCILING, CONDITION_STALLED,
    MountPhase, MountPod, MountPodStatus, condition_status,
};

use super::mount_service::{self, Served};

/// What a reconcile has to say in the status.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Report {
    pub(super) phase: MountPhase,
    pub(super) pid: Option<i64>,
    pub(super) mount_point: Option<String>,
    /// A failure to record in `lastError` (its time is updated when the message
    /// changes or the daemon was restarted).
    pub(super) error: Option<String>,
    /// The daemon was restarted after a failure (`restarts` + 1).
    pub(super) restarted: bool,
    pub(super) ready: Condition,
    pub(super) extra: Vec<Condition>,
    /// Set `observedGeneration` to the current generation.
    pub(super) observed: bool,
    /// The image of the daemon serving the mount (`None`: as before).
    pub(super) image: Option<String>,
}

impl Report {
    pub(super) fn failed(reason: &str, msg: String) -> Self {
        Report {
            phase: MountPhase::Failed,
            pid: None,
            mount_point: None,
            error: Some(msg.clone()),
            restarted: false,
            ready: cond(CONDITION_READY, false, reason, msg),
            extra: vec![],
            observed: true,
            image: None,
        }
    }

    /// A one-shot task done (its data removed, populated): Ready, and its condition
    /// `kind` true with `reason`.
    pub(super) fn task_done(kind: &str, reason: &str, msg: String) -> Self {
        Report {
            phase: MountPhase::Ready,
            pid: None,
            mount_point: None,
            error: None,
            restarted: false,
            ready: cond(CONDITION_READY, true, kind, msg.clone()),
            extra: vec![cond(kind, true, reason, msg)],
            observed: true,
            image: None,
        }
    }

    /// A one-shot task failed: Failed (`failure`), and its condition `kind` false with
    /// `reason`.
    pub(super) fn task_failed(failure: &str, kind: &str, reason: &str, msg: String) -> Self {
        let mut r = Report::failed(failure, msg.clone());
        r.extra.push(cond(kind, false, reason, msg));
        r
    }

    /// The agent has mounted (`--mounter=agent`) and the daemon does not answer yet:
    /// Ready (NodePublish may bind it), reason `AwaitingDaemon`; requests wait for it.
    pub(super) fn awaiting_daemon(mountpoint: &std::path::Path) -> Self {
        Report {
            phase: MountPhase::Ready,
            pid: None,
            mount_point: Some(mountpoint.display().to_string()),
            error: None,
            restarted: false,
            ready: cond(
                CONDITION_READY,
                true,
                AWAITING_DAEMON,
                format!(
                    "mounted at {}; waiting for its daemon to answer (requests wait for it)",
                    mountpoint.display()
                ),
            ),
            extra: vec![],
            observed: true,
            image: None,
        }
    }

    /// Everything as it is, in a new phase.
    pub(super) fn keep(status: &MountPodStatus, phase: MountPhase) -> Self {
        Report {
            phase,
            pid: status.pid,
            mount_point: status.mount_point.clone(),
            error: None,
            restarted: false,
            ready: cond(CONDITION_READY, false, "Terminating", String::new()),
            extra: vec![],
            observed: true,
            image: None,
        }
    }
}

/// The `Ready` reason of a mount the agent made whose daemon does not answer yet.
pub(super) const AWAITING_DAEMON: &str = "AwaitingDaemon";

/// The condition of a mount whose settings wait for a remount.
const SPEC_APPLIED: &str = "SpecApplied";

pub(super) fn cond(type_: &str, ok: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok {
            condition_status::TRUE
        } else {
            condition_status::FALSE
        }
        .into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// kstatus's abnormal-true condition for a report, with the `Ready` condition's reason
/// and message: Stalled when the mount or its task failed, Reconciling while it is
/// pending, starting, terminating or Ready for an older spec (a remount that waits for
/// its references to go), none when Ready for its spec.
pub(super) fn progress(report: &Report) -> Option<Condition> {
    let ready = &report.ready;
    let (type_, reason, message) = match report.phase {
        MountPhase::Failed => (CONDITION_STALLED, &ready.reason, &ready.message),
        MountPhase::Ready if report.observed => return None,
        // Ready for an older spec: the remount waits (its SpecApplied condition says
        // for what).
        MountPhase::Ready => report
            .extra
            .iter()
            .find(|c| c.type_ == SPEC_APPLIED)
            .map_or(
                (CONDITION_RECONCILING, &ready.reason, &ready.message),
                |c| (CONDITION_RECONCILING, &c.reason, &c.message),
            ),
        MountPhase::Pending | MountPhase::Mounting | MountPhase::Terminating => {
            (CONDITION_RECONCILING, &ready.reason, &ready.message)
        }
    };
    Some(cond(type_, true, reason, message.clone()))
}

/// The status a report leads to, given the status it replaces. Pure.
pub(super) fn next_status(
    prev: &MountPodStatus,
    mp: &MountPod,
    report: Report,
    now: jiff::Timestamp,
) -> MountPodStatus {
    let now = Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now));
    let generation = mp.metadata.generation;
    let mut conditions = Vec::new();
    let abnormal = progress(&report);
    for mut c in std::iter::once(report.ready)
        .chain(report.extra)
        .chain(abnormal)
    {
        c.observed_generation = generation;
        c.last_transition_time = match prev.conditions.iter().find(|p| p.type_ == c.type_) {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => now.clone(),
        };
        conditions.push(c);
    }
    conditions.extend(
        prev.conditions
            .iter()
            .filter(|c| c.type_ == CONDITION_FENCED)
            .cloned(),
    );
    let (last_error, last_error_time) = match report.error {
        Some(e) if report.restarted || prev.last_error.as_ref() != Some(&e) => {
            (Some(e), Some(now.clone()))
        }
        _ => (prev.last_error.clone(), prev.last_error_time.clone()),
    };
    MountPodStatus {
        phase: Some(report.phase),
        pid: report.pid,
        mount_point: report.mount_point,
        restarts: prev.restarts + i32::from(report.restarted),
        last_error,
        last_error_time,
        reference_count: i32::try_from(mp.spec.references.len()).unwrap_or(i32::MAX),
        conditions,
        oom_kills: prev.oom_kills,
        last_oom_kill_time: prev.last_oom_kill_time.clone(),
        observed_generation: if report.observed {
            generation
        } else {
            prev.observed_generation
        },
        // What the running mount has: the spec's settings once observed Ready; the
        // previous ones while a remount waits; none while it is not Ready.
        applied: match (report.phase, report.observed) {
            (MountPhase::Ready, true) => Some(AppliedSettings::of(&mp.spec)),
            (MountPhase::Ready, false) => prev.applied.clone(),
            _ => None,
        },
        image: report.image.or_else(|| prev.image.clone()),
    }
}

/// The `Locks` condition of a mount on a shared backend: whether other nodes see the
/// flock and fcntl locks taken through it. None on a node-local backend.
pub(super) fn locks_condition(locks: &Option<Result<(), String>>) -> Option<Condition> {
    Some(match locks.as_ref()? {
        Ok(()) => cond(
            "Locks",
            true,
            "HeldByBackend",
            "flock and fcntl locks are taken on the backend: other nodes see them".into(),
        ),
        Err(e) => cond(
            "Locks",
            false,
            "NodeOnly",
            format!(
                "the backend refused a lock ({e}): flock and fcntl locks are seen on this node only"
            ),
        ),
    })
}

/// The status report of a serve pass, and when to look again.
pub(super) fn serve_report(
    want: &mount_service::Want,
    served: &Served,
    refused: &[String],
    mp: &MountPod,
    prev: &MountPodStatus,
) -> (Report, Action) {
    let mount_point = Some(want.mountpoint.display().to_string());
    let pid = served.daemon.map(|d| i64::from(d.pid));
    let mut extra = Vec::new();
    let mut errors: Vec<String> = refused.to_vec();
    errors.extend(served.rebind_errors.iter().cloned());
    if !errors.is_empty() {
        extra.push(cond("References", false, "Refused", errors.join("; ")));
    }
    extra.extend(locks_condition(&served.locks));
    if served.remount_blocked {
        let targets: Vec<String> = mp
            .spec
            .references
            .iter()
            .map(|r| r.target_path.clone())
            .collect();
        extra.push(cond(
            SPEC_APPLIED,
            false,
            "RemountBlocked",
            format!(
                "readOnly/mountOptions changed; the mount keeps its settings until no reference remains ({} left: {})",
                targets.len(),
                targets.join(", ")
            ),
        ));
    }
    let cause = served
        .failure
        .clone()
        .or_else(|| served.repaired.clone())
        .or_else(|| errors.first().cloned());
    if let Some(failure) = &served.failure {
        let backoff = Duration::from_secs(1u64 << prev.restarts.clamp(0, 8) as u32)
            .min(Duration::from_secs(300));
        let report = Report {
            phase: MountPhase::Failed,
            pid: None,
            mount_point,
            error: cause,
            restarted: served.repaired.is_some(),
            ready: cond(CONDITION_READY, false, "DaemonFailed", failure.clone()),
            extra,
            observed: true,
            image: None,
        };
        return (report, Action::requeue(backoff));
    }
    if !served.answers && served.agent_mounted {
        // The kernel mount is there (bound into Pods, or ready to be): Ready, while
        // the Pods' requests wait for the daemon (the start timeout bounds it).
        let report = Report {
            pid,
            error: cause,
            restarted: served.repaired.is_some(),
            extra,
            ..Report::awaiting_daemon(&want.mountpoint)
        };
        return (report, Action::requeue(Duration::from_secs(1)));
    }
    if !served.answers {
        let report = Report {
            phase: MountPhase::Mounting,
            pid,
            mount_point: mount_point.clone(),
            error: cause,
            restarted: served.repaired.is_some(),
            ready: cond(
                "Ready",
                false,
                "Starting",
                format!(
                    "waiting for the mount at {} to answer",
                    want.mountpoint.display()
                ),
            ),
            extra,
            observed: true,
            image: None,
        };
        return (report, Action::requeue(Duration::from_secs(1)));
    }
    let report = Report {
        phase: MountPhase::Ready,
        pid,
        mount_point,
        error: cause,
        restarted: served.repaired.is_some(),
        ready: cond(
            "Ready",
            true,
            "Mounted",
            format!(
                "fuse daemon {} serves {}",
                pid.unwrap_or_default(),
                want.mountpoint.display()
            ),
        ),
        extra,
        observed: !served.remount_blocked,
        image: served.image.clone(),
    };
    (report, Action::requeue(Duration::from_secs(300)))
}

#[cfg(test)]
pub(super) mod tests {
    use tessera_api::{MountPodSpec, MountReference, MountTask};

    use super::*;

    pub(in crate::agent) fn mountpod(generation: i64, refs: usize) -> MountPod {
        let mut mp = MountPod::new(
            "v-1",
            MountPodSpec {
                populate_from: None,
                volume: "v".into(),
                node_name: "n".into(),
                source: "/b/v".into(),
                task: MountTask::Serve,
                capacity_bytes: 1,
                read_only: false,
                shared_backend: false,
                shared_root_anchor: None,
                mount_options: vec![],
                references: (0..refs)
                    .map(|i| MountReference {
                        target_path: format!("/k/{i}"),
                        owner: "pod/x".into(),
                        read_only: false,
                        pod: None,
                    })
                    .collect(),
                retain_seconds: None,
                resources: None,
                attr_cache_seconds: None,
                self_fence: false,
            },
        );
        mp.metadata.generation = Some(generation);
        mp
    }

    fn ready(pid: i64) -> Report {
        Report {
            phase: MountPhase::Ready,
            pid: Some(pid),
            mount_point: Some("/m/v".into()),
            error: None,
            restarted: false,
            ready: cond(CONDITION_READY, true, "Mounted", "ok".into()),
            extra: vec![],
            observed: true,
            image: None,
        }
    }

    #[test]
    fn a_ready_report_makes_the_mountpod_ready() {
        let mut mp = mountpod(3, 2);
        let t0 = jiff::Timestamp::from_second(1_000).unwrap();
        let s = next_status(&MountPodStatus::default(), &mp, ready(42), t0);
        assert_eq!(s.phase, Some(MountPhase::Ready));
        assert_eq!(s.reference_count, 2);
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.conditions[0].last_transition_time, Time(t0));
        mp.status = Some(s.clone());
        assert!(mp.is_ready());
        // The same report later changes nothing (no write).
        let again = next_status(&s, &mp, ready(42), t0 + jiff::SignedDuration::from_secs(60));
        assert_eq!(again, s);
    }

    #[test]
    fn the_controllers_fenced_condition_is_carried_over() {
        let mp = mountpod(1, 0);
        let t0 = jiff::Timestamp::from_second(1_000).unwrap();
        let mut prev = next_status(&MountPodStatus::default(), &mp, ready(42), t0);
        let fenced = Condition {
            type_: CONDITION_FENCED.into(),
            status: "True".into(),
            reason: "OutOfService".into(),
            message: "node n is fenced".into(),
            last_transition_time: Time(t0),
            observed_generation: Some(1),
        };
        prev.conditions.push(fenced.clone());
        let later = t0 + jiff::SignedDuration::from_secs(60);
        // The same report: the same status, the controller's condition in it.
        assert_eq!(next_status(&prev, &mp, ready(42), later), prev);
        // A new report keeps it as it was.
        let mut failed = ready(42);
        failed.phase = MountPhase::Failed;
        failed.ready = cond(CONDITION_READY, false, "DaemonFailed", "gone".into());
        let s = next_status(&prev, &mp, failed, later);
        assert_eq!(s.conditions.iter().filter(|c| **c == fenced).count(), 1);
    }

    #[test]
    fn a_repair_counts_a_restart_and_records_the_cause() {
        let mp = mountpod(1, 0);
        let t0 = jiff::Timestamp::from_second(1_000).unwrap();
        let s0 = next_status(&MountPodStatus::default(), &mp, ready(42), t0);
        let mut r = ready(43);
        r.restarted = true;
        r.error = Some("fuse daemon exited: signal 9".into());
        let t1 = t0 + jiff::SignedDuration::from_secs(5);
        let s1 = next_status(&s0, &mp, r.clone(), t1);
        assert_eq!(s1.restarts, 1);
        assert_eq!(
            s1.last_error.as_deref(),
            Some("fuse daemon exited: signal 9")
        );
        assert_eq!(s1.last_error_time, Some(Time(t1)));
        assert_eq!(s1.pid, Some(43));
        // Ready did not flip: its transition time stays.
        assert_eq!(s1.conditions[0].last_transition_time, Time(t0));
        // A second crash with the same cause is a new error.
        let t2 = t1 + jiff::SignedDuration::from_secs(5);
        let s2 = next_status(&s1, &mp, r, t2);
        assert_eq!(s2.restarts, 2);
        assert_eq!(s2.last_error_time, Some(Time(t2)));
        // A lasting error that is no restart keeps its time.
        let mut lasting = ready(43);
        lasting.error = Some("fuse daemon exited: signal 9".into());
        let s3 = next_status(&s2, &mp, lasting, t2 + jiff::SignedDuration::from_secs(5));
        assert_eq!(s3.last_error_time, Some(Time(t2)));
    }

    #[test]
    fn the_locks_condition_says_whether_other_nodes_see_locks() {
        type Row = (
            Option<Result<(), String>>,
            Option<(&'static str, &'static str)>,
        );
        let table: [Row; 3] = [
            (None, None),
            (Some(Ok(())), Some(("True", "HeldByBackend"))),
            (
                Some(Err("F_OFD_SETLK failed: ENOLCK".into())),
                Some(("False", "NodeOnly")),
            ),
        ];
        for (locks, want) in table {
            let c = locks_condition(&locks);
            assert_eq!(
                c.as_ref().map(|c| (c.status.as_str(), c.reason.as_str())),
                want,
                "{locks:?}"
            );
            if let Some(c) = c {
                assert_eq!(c.type_, "Locks");
                if let Some(Err(e)) = &locks {
                    assert!(c.message.contains(e.as_str()), "{}", c.message);
                }
            }
        }
    }

    #[test]
    fn a_blocked_remount_leaves_observed_generation_behind() {
        let mut mp = mountpod(1, 1);
        let s = next_status(
            &MountPodStatus::default(),
            &mp,
            ready(42),
            jiff::Timestamp::now(),
        );
        // readOnly changed while references remain: the remount waits.
        mp.metadata.generation = Some(2);
        mp.spec.read_only = true;
        let mut r = ready(42);
        r.observed = false;
        let s2 = next_status(&s, &mp, r, jiff::Timestamp::now());
        assert_eq!(s2.observed_generation, Some(1));
        assert_eq!(s2.applied.as_ref().map(|a| a.read_only), Some(false));
        mp.status = Some(s2);
        assert!(!mp.is_ready());
    }

    /// A spec change the agent has not seen yet: the mount stays ready only when it
    /// already has the spec's readOnly and mountOptions (a new reference), whatever the
    /// generation says.
    #[test]
    fn a_ready_mount_stays_ready_through_changes_that_keep_its_settings() {
        type Change = fn(&mut MountPod);
        let table: [(&str, Change, bool); 4] = [
            (
                "a new reference",
                |mp| {
                    mp.spec.references.push(MountReference {
                        target_path: "/k/new".into(),
                        owner: "pod/y".into(),
                        read_only: false,
                        pod: None,
                    })
                },
                true,
            ),
            ("a larger capacity", |mp| mp.spec.capacity_bytes = 2, true),
            ("readOnly", |mp| mp.spec.read_only = true, false),
            (
                "mountOptions",
                |mp| mp.spec.mount_options = vec!["noatime".into()],
                false,
            ),
        ];
        for (what, change, want) in table {
            let mut mp = mountpod(1, 1);
            mp.status = Some(next_status(
                &MountPodStatus::default(),
                &mp,
                ready(42),
                jiff::Timestamp::now(),
            ));
            assert!(mp.is_ready(), "{what}: ready before the change");
            change(&mut mp);
            mp.metadata.generation = Some(2);
            assert_eq!(mp.is_ready(), want, "{what}");
        }
    }

    /// kstatus's abnormal-true conditions: Reconciling while the mount is on its way,
    /// Stalled when it failed, neither once Ready; each stable while it holds.
    #[test]
    fn a_mount_reconciles_while_it_starts_and_stalls_when_it_failed() {
        let starting = Report {
            phase: MountPhase::Mounting,
            ready: cond(CONDITION_READY, false, "Starting", "starting".into()),
            ..ready(42)
        };
        let mut remount = ready(42);
        remount.observed = false;
        remount.extra.push(cond(
            SPEC_APPLIED,
            false,
            "RemountBlocked",
            "readOnly changed".into(),
        ));
        type Row = (&'static str, Report, Option<(&'static str, &'static str)>);
        let table: Vec<Row> = vec![
            ("ready", ready(42), None),
            ("starting", starting, Some(("Reconciling", "Starting"))),
            (
                "remount waits",
                remount,
                Some(("Reconciling", "RemountBlocked")),
            ),
            (
                "terminating",
                Report::keep(&MountPodStatus::default(), MountPhase::Terminating),
                Some(("Reconciling", "Terminating")),
            ),
            (
                "failed",
                Report::failed("MountFailed", "daemon exited".into()),
                Some(("Stalled", "MountFailed")),
            ),
            (
                "a task failed",
                Report::task_failed("PopulateFailed", "DataPopulated", "CopyFailed", "x".into()),
                Some(("Stalled", "PopulateFailed")),
            ),
            (
                "a task done",
                Report::task_done("DataPopulated", "Copied", "done".into()),
                None,
            ),
            // The agent mounted; the daemon is awaited: Ready, nothing abnormal.
            (
                "awaiting its daemon",
                Report::awaiting_daemon(std::path::Path::new("/m/v")),
                None,
            ),
        ];
        let t0 = jiff::Timestamp::from_second(1_000).unwrap();
        for (what, report, want) in table {
            let mut mp = mountpod(3, 1);
            let s = next_status(&MountPodStatus::default(), &mp, report.clone(), t0);
            let abnormal: Vec<&Condition> = s
                .conditions
                .iter()
                .filter(|c| c.type_ == CONDITION_RECONCILING || c.type_ == CONDITION_STALLED)
                .collect();
            assert_eq!(
                abnormal
                    .iter()
                    .map(|c| (c.type_.as_str(), c.reason.as_str()))
                    .collect::<Vec<_>>(),
                want.into_iter().collect::<Vec<_>>(),
                "{what}"
            );
            for c in abnormal {
                assert_eq!(
                    (c.status.as_str(), c.observed_generation),
                    ("True", Some(3)),
                    "{what}"
                );
            }
            mp.status = Some(s.clone());
            let later = t0 + jiff::SignedDuration::from_secs(60);
            assert_eq!(next_status(&s, &mp, report, later), s, "{what}: stable");
        }
    }

    #[test]
    fn a_mount_the_agent_made_is_ready_before_its_daemon_answers() {
        let t0 = jiff::Timestamp::from_second(1_000).unwrap();
        let mut mp = mountpod(3, 1);
        let s = next_status(
            &MountPodStatus::default(),
            &mp,
            Report::awaiting_daemon(std::path::Path::new("/m/v")),
            t0,
        );
        assert_eq!(s.phase, Some(MountPhase::Ready));
        assert_eq!(s.mount_point.as_deref(), Some("/m/v"));
        mp.status = Some(s.clone());
        assert!(
            mp.is_serving() && mp.is_ready(),
            "NodePublish may bind it: {s:?}"
        );
        let ready = s
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "AwaitingDaemon")
        );
    }

    #[test]
    fn a_mount_that_is_not_ready_has_no_applied_settings() {
        let mp = mountpod(1, 0);
        let s = next_status(
            &MountPodStatus::default(),
            &mp,
            ready(42),
            jiff::Timestamp::now(),
        );
        assert!(s.applied.is_some());
        let failed = Report::failed("MountFailed", "daemon exited".into());
        let s2 = next_status(&s, &mp, failed, jiff::Timestamp::now());
        assert_eq!(s2.applied, None);
    }
}
