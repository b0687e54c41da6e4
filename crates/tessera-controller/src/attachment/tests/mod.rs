//! Table tests of the attachment controller's pure parts: input building, MountPod
//! specs, status building, the re-check rule and the Detaching rule. Fixtures here,
//! one file per part.

mod detaching;
mod health;
mod input;
mod mountpods;
mod plan;
mod ready;
mod reconcile;
mod scripted;
mod status;
mod writes;

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use tessera_api::tickets::{Decision, Input, MountState, MountView, NodeMount, TicketOutcome};
use tessera_api::{
    self as api, AccessMode, AttacherType, AttachmentTicket, AttachmentTicketStatus, BackendScope,
    CONDITION_SATISFIED, MountPhase, MountPod, MountPodSpec, MountPodStatus, MountTask,
    TicketReason, Volume, VolumeAttachment, VolumeAttachmentSpec, VolumeAttachmentStatus,
    VolumeBackend, VolumeSpec, VolumeState, VolumeStatus,
};
use tessera_runtime::labels::Labels;

use super::input::{gather, mount_view};
use super::mountpods::{apply_body, create_body, desired_spec, same_controlled_fields};
use super::plan::{needs_recheck, recheck_nodes};
use super::status::{attachment_status, newly_satisfied, satisfaction_latencies, volume_status};

fn t(s: i64) -> Time {
    Time(jiff::Timestamp::from_second(s).unwrap())
}

fn volume(mode: AccessMode) -> Volume {
    let mut v = Volume::new(
        "v",
        VolumeSpec {
            data_source: None,
            size: Quantity("1Gi".into()),
            access_mode: mode,
            backend: VolumeBackend {
                root: "/b/".into(),
                scope: BackendScope::Shared,
                node: None,
            },
            mount_options: vec!["allow_other".into()],
            idle_mount_delay_seconds: None,
            mount_resources: None,
            attr_cache_seconds: None,
            node_failover: None,
        },
    );
    v.metadata.uid = Some("uid-v".into());
    v.metadata.generation = Some(4);
    v
}

fn ticket(id: &str, type_: AttacherType, node: &str) -> AttachmentTicket {
    AttachmentTicket::new(id, type_, node)
}

fn va(tickets: &[AttachmentTicket]) -> VolumeAttachment {
    let mut va = VolumeAttachment::new(
        "v",
        VolumeAttachmentSpec {
            volume: "v".into(),
            attachment_tickets: tickets.iter().map(|t| (t.id.clone(), t.clone())).collect(),
        },
    );
    va.metadata.generation = Some(7);
    va
}

/// A MountPod of volume `v` on `node` in `phase` (`None`: no status yet), for its
/// current generation.
fn mountpod(node: &str, phase: Option<MountPhase>) -> MountPod {
    let mut mp = MountPod::new(
        &api::mountpod_name("v", node),
        MountPodSpec {
            populate_from: None,
            volume: "v".into(),
            node_name: node.into(),
            source: "/b/v".into(),
            task: MountTask::Serve,
            capacity_bytes: 1 << 30,
            read_only: false,
            shared_backend: false,
            shared_root_anchor: None,
            mount_options: vec![],
            references: vec![],
            retain_seconds: None,
            resources: None,
            attr_cache_seconds: None,
            self_fence: false,
        },
    );
    mp.metadata.generation = Some(2);
    mp.status = phase.map(|p| MountPodStatus {
        phase: Some(p),
        observed_generation: Some(2),
        ..Default::default()
    });
    mp
}

fn deleting<T: kube::Resource>(mut obj: T) -> T {
    obj.meta_mut().deletion_timestamp = Some(t(5));
    obj
}

fn outcome(satisfied: bool, reason: TicketReason, message: &str) -> TicketOutcome {
    TicketOutcome {
        satisfied,
        reason,
        message: message.into(),
        generation: 0,
    }
}

fn decision(nodes: &[&str], tickets: &[(&str, TicketOutcome)]) -> Decision {
    Decision {
        nodes: nodes
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    NodeMount {
                        read_only: false,
                        removes_data: false,
                        populates: false,
                    },
                )
            })
            .collect(),
        tickets: tickets
            .iter()
            .map(|(id, o)| (id.to_string(), o.clone()))
            .collect(),
    }
}

fn satisfied_condition(s: &AttachmentTicketStatus) -> &Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == CONDITION_SATISFIED)
        .expect("a Satisfied condition")
}

/// The re-check rule.
#[test]
fn only_a_newly_satisfied_single_node_ticket_is_rechecked() {
    let satisfied = decision(
        &["n1"],
        &[("a", outcome(true, TicketReason::Attached, "on n1"))],
    );
    let waiting = decision(
        &["n1"],
        &[("a", outcome(false, TicketReason::Attaching, "mounting"))],
    );
    let mut was_satisfied = va(&[]);
    was_satisfied.status = Some(attachment_status(
        &was_satisfied,
        &satisfied,
        &Input {
            access_mode: AccessMode::ReadWriteOnce,
            deleting: false,
            pinned_node: None,
            tickets: vec![],
            mounts: Default::default(),
            now: t(0),
            missing_nodes: Default::default(),
        },
        &Default::default(),
        &t(1),
    ));
    let cases = [
        (
            "RWO, newly satisfied",
            AccessMode::ReadWriteOnce,
            va(&[]),
            &satisfied,
            true,
        ),
        (
            "RWOP, newly satisfied",
            AccessMode::ReadWriteOncePod,
            va(&[]),
            &satisfied,
            true,
        ),
        (
            "RWX, newly satisfied",
            AccessMode::ReadWriteMany,
            va(&[]),
            &satisfied,
            false,
        ),
        (
            "ROX, newly satisfied",
            AccessMode::ReadOnlyMany,
            va(&[]),
            &satisfied,
            false,
        ),
        (
            "RWO, already satisfied",
            AccessMode::ReadWriteOnce,
            was_satisfied,
            &satisfied,
            false,
        ),
        (
            "RWO, not satisfied",
            AccessMode::ReadWriteOnce,
            va(&[]),
            &waiting,
            false,
        ),
    ];
    for (what, mode, va, d, recheck) in cases {
        assert_eq!(needs_recheck(&volume(mode), &va, d), recheck, "{what}");
    }
}

/// Which MountPods a re-check reads: those of every other node the volume could be on.
#[test]
fn a_recheck_reads_the_mountpods_of_the_other_candidate_nodes_only() {
    use std::collections::BTreeSet;
    let tickets = |nodes: &[&str]| -> Vec<AttachmentTicket> {
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| ticket(&format!("t{i}"), AttacherType::CsiAttacher, n))
            .collect()
    };
    // (what, ticket nodes, cached MountPod nodes, nodes being satisfied, nodes read)
    let cases = vec![
        (
            "one ticket, its own node: nothing to read",
            vec!["n1"],
            vec!["n1"],
            vec!["n1"],
            vec![],
        ),
        (
            "a second ticket elsewhere",
            vec!["n1", "n2"],
            vec!["n1"],
            vec!["n1"],
            vec!["n2"],
        ),
        (
            "a cached MountPod elsewhere",
            vec!["n1"],
            vec!["n1", "n3"],
            vec!["n1"],
            vec!["n3"],
        ),
        (
            "nothing being satisfied: every candidate",
            vec!["n1", "n2"],
            vec![],
            vec![],
            vec!["n1", "n2"],
        ),
    ];
    for (what, ticket_nodes, cached, satisfying, want) in cases {
        let va = va(&tickets(&ticket_nodes));
        let mps: Vec<Arc<MountPod>> = cached
            .iter()
            .map(|n| Arc::new(mountpod(n, Some(MountPhase::Ready))))
            .collect();
        let satisfying: BTreeSet<&str> = satisfying.into_iter().collect();
        let got = recheck_nodes(&va, &mps, &satisfying);
        let want: BTreeSet<String> = want.into_iter().map(String::from).collect();
        assert_eq!(got, want, "{what}");
    }
}
