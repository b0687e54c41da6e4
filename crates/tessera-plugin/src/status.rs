//! `kubectl tessera status <pvc|pv|volume>`: the chain from a claim to its mounts on
//! one screen — PVC → PV → storage.k8s.io VolumeAttachments → tickets → MountPods per
//! node → the agent on each node → the tail of what the agent logged about the volume.
//! The binary fills a [`Report`] (also printed as JSON with `-o json`); [`render`]
//! turns it into text, and [`hints`] says what looks wrong.

use serde::Serialize;

use super::text;
use super::tickets::TicketRow;

/// Everything `status` found, in the order of the chain.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The claim, when asked for by claim (or found through the PV's claimRef).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvc: Option<Claim>,
    /// The PersistentVolume, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pv: Option<PersistentVolume>,
    /// Namespace Tessera is installed in (its agent Pods).
    pub tessera_namespace: String,
    /// The Tessera Volume's name (known even when the object is missing).
    pub volume_name: String,
    /// The Tessera Volume, if it exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeSummary>,
    /// storage.k8s.io VolumeAttachments of the PV (one per node).
    pub storage_attachments: Vec<StorageAttachment>,
    /// The tickets of the Tessera VolumeAttachment.
    pub tickets: Vec<TicketRow>,
    /// The MountPods of the volume, one per node.
    pub mounts: Vec<Mount>,
    /// The node agent of every node a ticket or a MountPod names.
    pub agents: Vec<Agent>,
    /// What the agents logged about the volume.
    pub logs: Vec<LogTail>,
}

/// A PersistentVolumeClaim.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    /// `spec.volumeName` (empty: not bound yet).
    pub volume_name: String,
    pub storage_class: String,
}

/// A PersistentVolume.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolume {
    pub name: String,
    pub phase: String,
    /// The CSI driver (`csi.tessera.io` for a Tessera volume).
    pub driver: String,
    /// The CSI volume handle: the Tessera Volume's name.
    pub volume_handle: String,
}

/// The Tessera Volume.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSummary {
    pub size: String,
    pub access_mode: String,
    pub state: String,
    pub attached_nodes: Vec<String>,
    /// Set when the Volume is being deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleting_since: Option<jiff::Timestamp>,
    /// Conditions that are not True, and fenced failover's `NodeFailover` (True while
    /// it holds), as `Type=Status Reason: message`.
    pub conditions: Vec<String>,
}

/// One storage.k8s.io VolumeAttachment.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageAttachment {
    pub name: String,
    pub node: String,
    pub attached: bool,
    /// `status.attachError.message` / `status.detachError.message`.
    pub error: String,
}

/// One MountPod.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub name: String,
    pub node: String,
    pub task: String,
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<i64>,
    pub restarts: i32,
    pub last_error: String,
    /// Reason and message of the `Ready` condition.
    pub ready: String,
    /// Target paths bound, with their owners.
    pub references: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleting_since: Option<jiff::Timestamp>,
}

/// The Tessera agent of one node.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    pub node: String,
    /// The tessera-node Pod on the node (`namespace/name`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Whether that Pod is Ready.
    pub ready: bool,
    /// Its version (image tag or `app.kubernetes.io/version`).
    pub version: String,
    /// Whether the node's CSINode lists `csi.tessera.io`.
    pub csi_registered: bool,
    /// Whether a Node object of that name exists.
    pub node_exists: bool,
    /// The node's liveness Lease (docs/failover.md).
    pub lease: NodeLease,
}

/// What the node's liveness Lease (`tessera-node-<node>`) says.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum NodeLease {
    /// No Lease: an agent that renews none (an older release, `--renew-interval=0s`).
    #[default]
    None,
    /// Renewed `age_seconds` ago by the agent's clock (`renewTime`: informational);
    /// its daemons fence themselves after `fence_after_seconds` without a renewal.
    Renewed {
        age_seconds: i64,
        fence_after_seconds: i64,
    },
    /// Marked `tessera.io/fenced` by the controller: its single-writer tickets of
    /// opted-in volumes were released.
    Fenced,
}

/// The last lines an agent logged about the volume, and where they come from.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogTail {
    pub node: String,
    /// Where the lines come from, in words.
    pub source: String,
    pub lines: Vec<String>,
}

/// What looks wrong in `r`, each with what to do (empty: nothing).
pub fn hints(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = &r.pvc
        && c.volume_name.is_empty()
    {
        out.push(format!(
            "PVC {}/{} is not bound ({}): `kubectl -n {} describe pvc {}` (provisioning Events), and is the controller with its csi-provisioner running?",
            c.namespace, c.name, c.phase, c.namespace, c.name
        ));
    }
    if let Some(pv) = &r.pv
        && pv.driver != tessera_api::CSI_DRIVER_NAME
    {
        out.push(format!(
            "PV {} is not a Tessera volume (driver {:?})",
            pv.name, pv.driver
        ));
    }
    if r.volume.is_none() && !r.volume_name.is_empty() {
        out.push(format!(
            "Volume {} does not exist: `kubectl get volumes.tessera.io`; a PV whose Volume is gone cannot attach",
            r.volume_name
        ));
    }
    for a in &r.storage_attachments {
        if !a.attached && a.error.is_empty() && !r.tickets.iter().any(|t| t.id == a.name) {
            out.push(format!(
                "storage VolumeAttachment {} has no ticket yet: ControllerPublish was not called; is the csi-attacher sidecar of the controller running?",
                a.name
            ));
        }
    }
    for t in r.tickets.iter().filter(|t| !t.satisfied) {
        let what = if t.reason.is_empty() {
            "has no status yet: is the controller running and leading? (`kubectl tessera doctor`)"
                .to_string()
        } else {
            format!(
                "waits: {} (docs/troubleshooting.md, ticket reasons)",
                t.reason
            )
        };
        out.push(format!("ticket {} on {} {what}", t.id, t.node));
    }
    for a in &r.agents {
        if !a.node_exists {
            out.push(format!(
                "node {} does not exist: fix or remove the tickets naming it",
                a.node
            ));
        } else if a.pod.is_none() {
            out.push(format!(
                "node {} has no tessera-node Pod: `kubectl -n {} get ds tessera-node` (taints, nodeSelector)",
                a.node, r.tessera_namespace
            ));
        } else if !a.ready {
            out.push(format!(
                "the agent Pod on {} is not Ready: its log (below) and `kubectl describe pod`",
                a.node
            ));
        }
        match a.lease {
            NodeLease::Fenced => out.push(format!(
                "node {} is fenced (its liveness Lease is marked tessera.io/fenced): its opted-in single-writer volumes were given to other nodes; its agent takes the Lease back, revoking its old mounts, once it reaches the API server (docs/failover.md)",
                a.node
            )),
            NodeLease::Renewed {
                age_seconds,
                fence_after_seconds,
            } if age_seconds >= fence_after_seconds => out.push(format!(
                "node {}'s agent has not renewed its liveness Lease for {}: past fenceAfter ({}), its self-fencing mounts hold their writes until it renews; the agent's log, and whether the node reaches the API server",
                a.node,
                text::age(age_seconds),
                text::age(fence_after_seconds)
            )),
            _ => {}
        }
        if a.node_exists && !a.csi_registered {
            out.push(format!(
                "CSINode {} does not list {}: the node-driver-registrar sidecar of the agent on that node",
                a.node,
                tessera_api::CSI_DRIVER_NAME
            ));
        }
    }
    for m in &r.mounts {
        if !m.last_error.is_empty() && m.phase != "Ready" {
            out.push(format!(
                "MountPod {} on {} is {}: lastError above; the daemon's own log is its mount Pod's: `kubectl -n {} logs {} --previous` (process mode: <state-dir>/logs/{}.log on the node)",
                m.name, m.node, m.phase, r.tessera_namespace, m.name, r.volume_name
            ));
        }
    }
    out
}

/// The one-screen text view of `r` at `now`, lines cut to `width`.
pub fn render(r: &Report, now: jiff::Timestamp, width: Option<usize>) -> String {
    let cut = |s: String| match width {
        Some(w) => text::truncate(&s, w),
        None => s,
    };
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&cut(s));
        out.push('\n');
    };
    if let Some(c) = &r.pvc {
        line(format!(
            "PVC      {}/{}   {}   class {}   → PV {}",
            c.namespace,
            c.name,
            c.phase,
            or_dash(&c.storage_class),
            or_dash(&c.volume_name)
        ));
    }
    if let Some(pv) = &r.pv {
        line(format!(
            "PV       {}   {}   driver {}   handle {}",
            pv.name, pv.phase, pv.driver, pv.volume_handle
        ));
    }
    match &r.volume {
        Some(v) => {
            let deleting = v
                .deleting_since
                .map(|t| {
                    format!(
                        "   deleting for {}",
                        text::age(now.duration_since(t).as_secs())
                    )
                })
                .unwrap_or_default();
            line(format!(
                "Volume   {}   {}   {}   {}   nodes: {}{deleting}",
                r.volume_name,
                v.size,
                v.access_mode,
                or_dash(&v.state),
                list_or_none(&v.attached_nodes)
            ));
            for c in &v.conditions {
                line(format!("         {c}"));
            }
        }
        None => line(format!(
            "Volume   {}   (not found)",
            or_dash(&r.volume_name)
        )),
    }
    line(String::new());
    line("storage.k8s.io VolumeAttachments:".into());
    if r.storage_attachments.is_empty() {
        line("  none".into());
    }
    for a in &r.storage_attachments {
        let err = if a.error.is_empty() {
            String::new()
        } else {
            format!("   error: {}", text::one_line(&a.error))
        };
        line(format!(
            "  {}   node {}   attached {}{err}",
            a.name, a.node, a.attached
        ));
    }
    line(String::new());
    line("Tickets:".into());
    let table = super::tickets::render(&r.tickets, now, width.map(|w| w.saturating_sub(2)));
    for l in table.lines() {
        line(format!("  {l}"));
    }
    line(String::new());
    line("MountPods:".into());
    if r.mounts.is_empty() {
        line("  none".into());
    }
    for m in &r.mounts {
        let pid = m.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        let deleting = m
            .deleting_since
            .map(|t| {
                format!(
                    "   deleting for {}",
                    text::age(now.duration_since(t).as_secs())
                )
            })
            .unwrap_or_default();
        line(format!(
            "  {}   node {}   {}   {}   pid {pid}   restarts {}   refs {}{deleting}",
            m.name,
            m.node,
            m.task,
            or_dash(&m.phase),
            m.restarts,
            m.references.len()
        ));
        if !m.ready.is_empty() {
            line(format!("    Ready: {}", text::one_line(&m.ready)));
        }
        if !m.last_error.is_empty() {
            line(format!("    lastError: {}", text::one_line(&m.last_error)));
        }
        for reference in &m.references {
            line(format!("    ref {reference}"));
        }
    }
    line(String::new());
    line("Agents:".into());
    if r.agents.is_empty() {
        line("  no node named by a ticket or a MountPod".into());
    }
    for a in &r.agents {
        let pod = match &a.pod {
            Some(p) => format!("pod {p} ({})", if a.ready { "Ready" } else { "not Ready" }),
            None => "no tessera-node Pod".into(),
        };
        let node = if a.node_exists { "" } else { " (no such Node)" };
        let lease = match &a.lease {
            NodeLease::None => "no liveness Lease".to_string(),
            NodeLease::Fenced => "FENCED".to_string(),
            NodeLease::Renewed {
                age_seconds,
                fence_after_seconds,
            } => format!(
                "Lease renewed {} ago (fenceAfter {})",
                text::age(*age_seconds),
                text::age(*fence_after_seconds)
            ),
        };
        line(format!(
            "  {}{node}   {pod}   version {}   CSINode {}   {lease}",
            a.node,
            or_dash(&a.version),
            if a.csi_registered {
                "registered"
            } else {
                "not registered"
            }
        ));
    }
    line(String::new());
    // Pod mode (the default): each daemon logs to its mount Pod, named like its
    // MountPod, in Tessera's namespace. Process mode: a file on the node.
    line(format!(
        "Daemon logs: each mount's Pod, `kubectl -n {} logs <mountpod name>` ({}; `--previous` after a crash); process mode: on the node, <state-dir>/logs/{}.log (default state dir /var/lib/tessera/node)",
        r.tessera_namespace,
        list_or_none(&r.mounts.iter().map(|m| m.name.clone()).collect::<Vec<_>>()),
        or_dash(&r.volume_name)
    ));
    for l in &r.logs {
        line(String::new());
        line(format!("Log of node {} ({}):", l.node, l.source));
        if l.lines.is_empty() {
            line("  (no line mentions the volume)".into());
        }
        for s in &l.lines {
            line(format!("  {s}"));
        }
    }
    let hints = hints(r);
    if !hints.is_empty() {
        line(String::new());
        line("What to look at:".into());
        for h in hints {
            line(format!("  - {h}"));
        }
    }
    out
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            pvc: Some(Claim {
                namespace: "apps".into(),
                name: "data".into(),
                phase: "Bound".into(),
                volume_name: "pvc-1".into(),
                storage_class: "tessera".into(),
            }),
            pv: Some(PersistentVolume {
                name: "pvc-1".into(),
                phase: "Bound".into(),
                driver: "csi.tessera.io".into(),
                volume_handle: "pvc-1".into(),
            }),
            tessera_namespace: "tessera-system".into(),
            volume_name: "pvc-1".into(),
            volume: Some(VolumeSummary {
                size: "1Gi".into(),
                access_mode: "ReadWriteOnce".into(),
                state: "Attached".into(),
                attached_nodes: vec!["node-a".into()],
                ..Default::default()
            }),
            storage_attachments: vec![StorageAttachment {
                name: "csi-1".into(),
                node: "node-a".into(),
                attached: true,
                error: String::new(),
            }],
            tickets: vec![TicketRow {
                id: "csi-1".into(),
                type_: "csi-attacher".into(),
                node: "node-a".into(),
                satisfied: true,
                reason: "Attached".into(),
                message: "mounted".into(),
                owners: vec!["tessera-csi-controller".into()],
                requested_at: None,
            }],
            mounts: vec![Mount {
                name: "pvc-1-abc".into(),
                node: "node-a".into(),
                task: "Serve".into(),
                phase: "Ready".into(),
                pid: Some(42),
                restarts: 1,
                ready: "Mounted".into(),
                references: vec!["/var/lib/kubelet/pods/x (pod/uid)".into()],
                ..Default::default()
            }],
            agents: vec![Agent {
                node: "node-a".into(),
                pod: Some("tessera-system/tessera-node-x".into()),
                ready: true,
                version: "0.1.0".into(),
                csi_registered: true,
                node_exists: true,
                lease: NodeLease::Renewed {
                    age_seconds: 1,
                    fence_after_seconds: 20,
                },
            }],
            logs: vec![LogTail {
                node: "node-a".into(),
                source: "agent Pod tessera-system/tessera-node-x".into(),
                lines: vec!["mounted volume=pvc-1".into()],
            }],
        }
    }

    #[test]
    fn a_healthy_chain_reads_top_to_bottom_without_hints() {
        let r = report();
        assert!(hints(&r).is_empty(), "{:?}", hints(&r));
        let out = render(&r, jiff::Timestamp::now(), None);
        let order = [
            "PVC      apps/data",
            "PV       pvc-1",
            "Volume   pvc-1",
            "csi-1   node node-a",
            "tessera-csi-controller",
            "pvc-1-abc   node node-a   Serve   Ready   pid 42   restarts 1   refs 1",
            "tessera-node-x (Ready)   version 0.1.0   CSINode registered",
            "Daemon logs: each mount's Pod, `kubectl -n tessera-system logs <mountpod name>` (pvc-1-abc; `--previous` after a crash)",
            "mounted volume=pvc-1",
        ];
        let mut at = 0;
        for want in order {
            let i = out[at..]
                .find(want)
                .unwrap_or_else(|| panic!("{want:?} after byte {at} in\n{out}"));
            at += i + want.len();
        }
        assert!(!out.contains("What to look at"), "{out}");
    }

    #[test]
    fn hints_name_what_is_wrong() {
        type Case = (&'static str, Box<dyn Fn(&mut Report)>, &'static str);
        let cases: Vec<Case> = vec![
            (
                "unbound claim",
                Box::new(|r| r.pvc.as_mut().unwrap().volume_name.clear()),
                "is not bound",
            ),
            (
                "foreign driver",
                Box::new(|r| r.pv.as_mut().unwrap().driver = "ebs.csi.aws.com".into()),
                "not a Tessera volume",
            ),
            (
                "missing volume",
                Box::new(|r| r.volume = None),
                "Volume pvc-1 does not exist",
            ),
            (
                "blocked ticket",
                Box::new(|r| {
                    r.tickets[0].satisfied = false;
                    r.tickets[0].reason = "HeldByOtherNode".into();
                }),
                "ticket csi-1 on node-a waits: HeldByOtherNode",
            ),
            (
                "no status",
                Box::new(|r| {
                    r.tickets[0].satisfied = false;
                    r.tickets[0].reason.clear();
                }),
                "has no status yet",
            ),
            (
                "no agent",
                Box::new(|r| r.agents[0].pod = None),
                "node node-a has no tessera-node Pod: `kubectl -n tessera-system get ds",
            ),
            (
                "agent not ready",
                Box::new(|r| r.agents[0].ready = false),
                "is not Ready",
            ),
            (
                "not registered",
                Box::new(|r| r.agents[0].csi_registered = false),
                "CSINode node-a does not list csi.tessera.io",
            ),
            (
                "no node",
                Box::new(|r| {
                    r.agents[0].node_exists = false;
                    r.agents[0].csi_registered = false;
                }),
                "node node-a does not exist",
            ),
            (
                "fenced node",
                Box::new(|r| r.agents[0].lease = NodeLease::Fenced),
                "node node-a is fenced",
            ),
            (
                "agent silent past fenceAfter",
                Box::new(|r| {
                    r.agents[0].lease = NodeLease::Renewed {
                        age_seconds: 45,
                        fence_after_seconds: 20,
                    }
                }),
                "has not renewed its liveness Lease for 45s",
            ),
            (
                "unpublished",
                Box::new(|r| {
                    r.storage_attachments[0].name = "csi-2".into();
                    r.storage_attachments[0].attached = false;
                }),
                "csi-2 has no ticket yet",
            ),
            (
                "failed mount",
                Box::new(|r| {
                    r.mounts[0].phase = "Failed".into();
                    r.mounts[0].last_error = "boom".into();
                }),
                "MountPod pvc-1-abc on node-a is Failed: lastError above; the daemon's own log is its mount Pod's: `kubectl -n tessera-system logs pvc-1-abc --previous`",
            ),
        ];
        for (name, change, want) in cases {
            let mut r = report();
            change(&mut r);
            let h = hints(&r);
            assert_eq!(h.len(), 1, "{name}: {h:?}");
            assert!(h[0].contains(want), "{name}: {h:?}");
            assert!(
                render(&r, jiff::Timestamp::now(), None).contains("What to look at"),
                "{name}"
            );
        }
    }

    #[test]
    fn lines_fit_the_width() {
        let mut r = report();
        r.mounts[0].last_error = "x".repeat(500);
        let out = render(&r, jiff::Timestamp::now(), Some(80));
        assert!(out.lines().all(|l| l.chars().count() <= 80), "{out}");
        assert!(render(&r, jiff::Timestamp::now(), None).contains(&"x".repeat(500)));
    }
}
