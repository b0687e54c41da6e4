//! `kubectl tessera doctor`: the rules that check an install. The binary reads an
//! [`Inventory`] (CRDs, the controller's Lease, nodes, agent, controller, fd-holder and
//! mount Pods, CSINodes, admission policies, Tessera objects being deleted, Faulted
//! Volumes, waiting tickets); [`diagnose`] turns it into [`Finding`]s, each problem
//! with one line of what to do.
//!
//! ```text
//!  Inventory ─▶ diagnose ─┬─ crds, leader, agents, versions, finalizers, tickets,
//!                         │  volumes (this file)
//!                         ├─ pods: fd holders, mount Pods, sidecars
//!                         └─ admission: the ValidatingAdmissionPolicies and bindings
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::text;

mod admission;
mod pods;

pub use admission::{POLICIES, service_accounts};

/// What `doctor` read from the cluster.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// Namespace Tessera is installed in (its Lease and Pods).
    pub namespace: String,
    /// Each Tessera CRD: name → served versions (`None`: not installed).
    pub crds: BTreeMap<String, Option<Vec<String>>>,
    /// Name of the controller's Lease.
    pub lease_name: String,
    /// The Lease, if it exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseInfo>,
    /// Node names.
    pub nodes: Vec<String>,
    /// tessera-node Pods.
    pub agents: Vec<PodInfo>,
    /// Controller Pods.
    pub controllers: Vec<PodInfo>,
    /// Nodes whose CSINode lists `csi.tessera.io`.
    pub csi_registered: BTreeSet<String>,
    /// Tessera objects with a deletionTimestamp.
    pub deleting: Vec<Deleting>,
    /// Volumes whose state is Deleting.
    pub volumes_deleting: Vec<String>,
    /// Tickets that are not satisfied.
    pub unsatisfied: Vec<WaitingTicket>,
    /// tessera-fd-holder Pods.
    pub fd_holders: Vec<PodInfo>,
    /// Mount Pods (the Pods the agents run for MountPods), in Tessera's namespace.
    pub mount_pods: Vec<MountPodInfo>,
    /// Volumes whose state is Faulted.
    pub faulted: Vec<FaultedVolume>,
    /// Mounts the agent made whose daemon does not answer yet (MountPods Ready with
    /// reason `AwaitingDaemon`).
    pub awaiting_daemon: Vec<AwaitingDaemon>,
    /// Tessera's ValidatingAdmissionPolicies (`None`: the API server does not serve
    /// admissionregistration.k8s.io/v1 policies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<PolicyInfo>>,
}

/// A mount Pod.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MountPodInfo {
    pub name: String,
    pub node: String,
    pub ready: bool,
    /// Image of its mount container.
    pub image: String,
    /// Restarts of its mount container.
    pub restarts: i32,
    /// Why its mount container last terminated (`OOMKilled`, `Error`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_terminated: Option<String>,
    /// Why its mount container waits (`ImagePullBackOff`, `CrashLoopBackOff`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

/// A Volume in state Faulted.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultedVolume {
    pub name: String,
    /// Reason and message of its `Faulted` condition.
    pub reason: String,
    pub message: String,
}

/// One of Tessera's ValidatingAdmissionPolicies.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyInfo {
    pub name: String,
    /// Names of the bindings whose policyName is this policy.
    pub bindings: Vec<String>,
    /// The `system:serviceaccount:NAMESPACE:NAME` users its expressions name.
    pub service_accounts: Vec<String>,
}

/// The controller's Lease.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseInfo {
    pub holder: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed: Option<jiff::Timestamp>,
    pub duration_secs: i64,
}

/// A Pod of Tessera's (agent or controller).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInfo {
    pub name: String,
    pub node: String,
    pub ready: bool,
    /// Image tag of its `tessera` container, or `app.kubernetes.io/version`.
    pub version: String,
    /// Image of its `tessera` container.
    pub image: String,
    /// The agent's `--mount-image`, if set (its mount Pods' image).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mount_image: Option<String>,
    /// Its containers that are not ready, each `name (reason)`.
    pub unready_containers: Vec<String>,
}

/// An object being deleted.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Deleting {
    /// `Volume`, `VolumeAttachment`, `MountPod`.
    pub kind: String,
    pub name: String,
    pub since: jiff::Timestamp,
    pub finalizers: Vec<String>,
}

/// A ticket that is not satisfied.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingTicket {
    pub volume: String,
    pub id: String,
    pub node: String,
    pub reason: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<jiff::Timestamp>,
}

/// A mount the agent made, waiting for its daemon (the MountPod's `Ready` condition,
/// reason `AwaitingDaemon`).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AwaitingDaemon {
    pub mountpod: String,
    pub volume: String,
    pub node: String,
    /// Since when (the condition's transition time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<jiff::Timestamp>,
}

/// Thresholds of the rules.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    /// A ticket waiting longer is a problem.
    pub waiting_secs: i64,
    /// An object deleted longer ago whose finalizers are still there is stuck.
    pub stuck_secs: i64,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Severity {
    /// Checked and fine.
    Ok,
    /// Worth knowing, not a problem (yet).
    Info,
    /// Needs an operator.
    Problem,
}

/// One result of a check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub severity: Severity,
    /// The check (`crds`, `leader`, `agents`, `versions`, `finalizers`, `tickets`,
    /// `volumes`, `fd-holder`, `mount-pods`, `sidecars`, `admission`).
    pub check: &'static str,
    pub what: String,
    /// What to do (empty for Ok).
    pub fix: String,
}

impl Finding {
    pub(super) fn ok(check: &'static str, what: String) -> Self {
        Finding {
            severity: Severity::Ok,
            check,
            what,
            fix: String::new(),
        }
    }
    pub(super) fn info(check: &'static str, what: String, fix: String) -> Self {
        Finding {
            severity: Severity::Info,
            check,
            what,
            fix,
        }
    }
    /// A problem found outside the rules (a read that failed, a Pod that did not run).
    pub fn problem_of(check: &'static str, what: String, fix: String) -> Self {
        Self::problem(check, what, fix)
    }
    pub(super) fn problem(check: &'static str, what: String, fix: String) -> Self {
        Finding {
            severity: Severity::Problem,
            check,
            what,
            fix,
        }
    }
}

/// Every check over `inv` at `now`.
pub fn diagnose(inv: &Inventory, now: jiff::Timestamp, th: Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    crds(inv, &mut out);
    leader(inv, now, &mut out);
    agents(inv, &mut out);
    versions(inv, &mut out);
    finalizers(inv, now, th, &mut out);
    tickets(inv, now, th, &mut out);
    volumes(inv, &mut out);
    pods::awaiting_daemon(inv, now, &mut out);
    pods::fd_holders(inv, &mut out);
    pods::mount_pods(inv, &mut out);
    pods::sidecars(inv, &mut out);
    admission::policies(inv, &mut out);
    out
}

fn crds(inv: &Inventory, out: &mut Vec<Finding>) {
    for (name, served) in &inv.crds {
        match served {
            None => out.push(Finding::problem(
                "crds",
                format!("CRD {name} is not installed"),
                "install the CRDs: `kubectl apply -f crds/` (or `kubectl apply -k config/`)".into(),
            )),
            Some(v) if !v.iter().any(|v| v == tessera_api::VERSION) => out.push(Finding::problem(
                "crds",
                format!(
                    "CRD {name} does not serve {} (serves: {})",
                    tessera_api::VERSION,
                    v.join(", ")
                ),
                "apply the CRDs of this release: `kubectl apply -f crds/`".into(),
            )),
            Some(v) => out.push(Finding::ok(
                "crds",
                format!("CRD {name} serves {}", v.join(", ")),
            )),
        }
    }
}

fn leader(inv: &Inventory, now: jiff::Timestamp, out: &mut Vec<Finding>) {
    let lease = format!("Lease {}/{}", inv.namespace, inv.lease_name);
    let logs = format!(
        "`kubectl -n {} logs deploy/tessera-controller -c tessera`",
        inv.namespace
    );
    let Some(l) = &inv.lease else {
        out.push(Finding::problem(
            "leader",
            format!("no controller has ever led: {lease} does not exist"),
            format!("is the controller running? `kubectl -n {} get deploy tessera-controller`, then {logs}", inv.namespace),
        ));
        return;
    };
    let age = l.renewed.map(|t| now.duration_since(t).as_secs());
    match age {
        Some(a) if !l.holder.is_empty() && a <= l.duration_secs => out.push(Finding::ok(
            "leader",
            format!(
                "{lease} held by {} (renewed {} ago)",
                l.holder,
                text::age(a)
            ),
        )),
        _ => out.push(Finding::problem(
            "leader",
            format!(
                "{lease} is stale: holder {:?}, last renewed {} (lease {}s): no controller acts",
                l.holder,
                age.map(|a| format!("{} ago", text::age(a)))
                    .unwrap_or_else(|| "never".into()),
                l.duration_secs
            ),
            format!("check the controller Pods and their log: {logs}"),
        )),
    }
}

fn agents(inv: &Inventory, out: &mut Vec<Finding>) {
    let mut fine = 0;
    for node in &inv.nodes {
        let pods: Vec<&PodInfo> = inv.agents.iter().filter(|p| &p.node == node).collect();
        let registered = inv.csi_registered.contains(node);
        let mut ok = true;
        if pods.is_empty() {
            ok = false;
            out.push(Finding::problem(
                "agents",
                format!("node {node} has no Tessera agent (no tessera-node Pod)"),
                format!(
                    "`kubectl -n {} get ds tessera-node`: does the DaemonSet tolerate the node's taints and match its labels?",
                    inv.namespace
                ),
            ));
        } else if !pods.iter().any(|p| p.ready) {
            ok = false;
            out.push(Finding::problem(
                "agents",
                format!("the agent on node {node} ({}) is not Ready", pods[0].name),
                format!(
                    "`kubectl -n {} describe pod {}` and its log (-c tessera)",
                    inv.namespace, pods[0].name
                ),
            ));
        }
        if !registered {
            ok = false;
            out.push(Finding::problem(
                "agents",
                format!("node {node}: its CSINode does not list {}", tessera_api::CSI_DRIVER_NAME),
                "the kubelet cannot mount Tessera volumes there: the node-driver-registrar sidecar's log in the agent Pod on that node".into(),
            ));
        }
        fine += usize::from(ok);
    }
    if fine > 0 {
        out.push(Finding::ok(
            "agents",
            format!(
                "{fine} of {} nodes have a Ready agent and a CSINode registration",
                inv.nodes.len()
            ),
        ));
    }
}

fn versions(inv: &Inventory, out: &mut Vec<Finding>) {
    let versions = |pods: &[PodInfo]| -> BTreeSet<String> {
        pods.iter()
            .map(|p| p.version.clone())
            .filter(|v| !v.is_empty())
            .collect()
    };
    let (ctrl, agent) = (versions(&inv.controllers), versions(&inv.agents));
    let all: BTreeSet<&String> = ctrl.iter().chain(&agent).collect();
    if inv.controllers.is_empty() {
        out.push(Finding::info(
            "versions",
            format!(
                "no controller Pod in namespace {} (app.kubernetes.io/component=controller)",
                inv.namespace
            ),
            "fine if the controller runs outside the cluster; otherwise `kubectl apply -k config/`"
                .into(),
        ));
    }
    if all.len() > 1 {
        let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
        out.push(Finding::problem(
            "versions",
            format!("version skew: controller {}, agents {}", list(&ctrl), list(&agent)),
            "finish the rollout so that every component runs one release: `kubectl -n <namespace> rollout status ds/tessera-node deploy/tessera-controller`".into(),
        ));
    } else if let Some(v) = all.into_iter().next() {
        out.push(Finding::ok(
            "versions",
            format!("every Tessera Pod runs {v}"),
        ));
    }
}

fn finalizers(inv: &Inventory, now: jiff::Timestamp, th: Thresholds, out: &mut Vec<Finding>) {
    for d in &inv.deleting {
        let age = now.duration_since(d.since).as_secs();
        if age < th.stuck_secs || d.finalizers.is_empty() {
            continue;
        }
        let fix = match d.kind.as_str() {
            "Volume" => format!("its data is removed through a cleanup-data ticket: `kubectl tessera tickets {}`; is the controller leading and an agent running?", d.name),
            "MountPod" => "the agent of its node removes the finalizer once the mount is gone: `kubectl tessera status` of its volume, the agent's log".into(),
            _ => "the controller removes it once the Volume is gone: is the controller leading?".into(),
        };
        out.push(Finding::problem(
            "finalizers",
            format!(
                "{} {} deleted {} ago is held by finalizers {}",
                d.kind,
                d.name,
                text::age(age),
                d.finalizers.join(", ")
            ),
            fix,
        ));
    }
}

fn tickets(inv: &Inventory, now: jiff::Timestamp, th: Thresholds, out: &mut Vec<Finding>) {
    for t in &inv.unsatisfied {
        let Some(since) = t.requested_at else {
            continue;
        };
        let age = now.duration_since(since).as_secs();
        if age < th.waiting_secs {
            continue;
        }
        out.push(Finding::problem(
            "tickets",
            format!(
                "ticket {} of {} (node {}) waits for {}: {}{}",
                t.id,
                t.volume,
                t.node,
                text::age(age),
                if t.reason.is_empty() {
                    "no reason"
                } else {
                    &t.reason
                },
                if t.message.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", text::one_line(&t.message))
                }
            ),
            format!(
                "{} — `kubectl tessera status volume/{}`",
                what_to_do(&t.reason),
                t.volume
            ),
        ));
    }
}

fn volumes(inv: &Inventory, out: &mut Vec<Finding>) {
    for v in &inv.faulted {
        out.push(Finding::problem(
            "volumes",
            format!(
                "Volume {} is Faulted: {}{}",
                v.name,
                if v.reason.is_empty() {
                    "no reason"
                } else {
                    &v.reason
                },
                if v.message.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", text::one_line(&v.message))
                }
            ),
            format!(
                "{} — `kubectl tessera status volume/{}`",
                what_to_do(&v.reason),
                v.name
            ),
        ));
    }
    for v in &inv.volumes_deleting {
        // A Volume deleted long ago is reported by the finalizer check already.
        out.push(Finding::info(
            "volumes",
            format!("Volume {v} is Deleting"),
            format!("its data is being removed: `kubectl tessera tickets {v}` shows the cleanup-data ticket"),
        ));
    }
}

/// The tag of an image reference (`registry:5000/tessera:0.1.0@sha256:…` → `0.1.0`):
/// what the doctor compares between controller and agents. `None` without a tag.
pub fn image_tag(image: &str) -> Option<&str> {
    let without_digest = image.split('@').next()?;
    let last = without_digest.rsplit('/').next()?;
    last.split_once(':')
        .map(|(_, tag)| tag)
        .filter(|t| !t.is_empty())
}

/// The troubleshooting table's advice for a ticket reason, in one line.
pub fn what_to_do(reason: &str) -> &'static str {
    match reason {
        "Attaching" => {
            "the MountPod on its node is not Ready: its lastError, and is the agent running there?"
        }
        "HeldByOtherNode" => {
            "a workload elsewhere holds the volume: delete that Pod, or remove the other manual ticket"
        }
        "WaitingForDetach" => {
            "the other node's MountPod does not go: references left (ReferencesRemain)?"
        }
        "LowerPriority" => "a ticket of higher priority was chosen; the message names it",
        "Interrupted" => {
            "a background ticket yields to a workload: it resumes when the workload goes"
        }
        "NodeLocalElsewhere" => "schedule the Pod on the Volume's spec.backend.node",
        "GenerationPending" => {
            "the mount does not reflect the ticket yet: the MountPod's SpecApplied condition"
        }
        "MountFailed" => "the MountPod's lastError and the agent's log on that node",
        "VolumeDeleting" => {
            "the Volume is being deleted: remove the ticket, or stop deleting the Volume"
        }
        "InvalidParameters" => "fix the ticket's parameters; the message says which",
        "Expired" => "remove the ticket or move its expiresAt into the future",
        "NodeNotFound" => "fix the ticket's nodeID (`kubectl get nodes`) or remove the ticket",
        "BackendNotShared" => {
            "the node does not see the root's marker: mount the shared filesystem at the root on that node, or declare the root NodeLocal"
        }
        "BackendScopeMismatch" => {
            "a Shared Volume on a root declared NodeLocal: use scope NodeLocal or a root declared Shared"
        }
        "BackendRootNotAllowed" => {
            "spec.backend.root is not a root the nodes allow (the tessera-backend-roots ConfigMap): fix the Volume's root, or allow it there"
        }
        "" => "the controller has not judged the ticket: is it running and leading?",
        _ => "see docs/troubleshooting.md",
    }
}

/// The doctor's report: problems first, then notes, then what is fine.
pub fn render(findings: &[Finding], width: Option<usize>) -> String {
    let mut sorted: Vec<&Finding> = findings.iter().collect();
    sorted.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let cut = |s: String| match width {
        Some(w) => text::truncate(&s, w),
        None => s,
    };
    let mut out = String::new();
    for f in sorted {
        let mark = match f.severity {
            Severity::Problem => "✗",
            Severity::Info => "i",
            Severity::Ok => "✓",
        };
        out.push_str(&cut(format!("{mark} [{}] {}", f.check, f.what)));
        out.push('\n');
        if !f.fix.is_empty() {
            out.push_str(&cut(format!("    → {}", f.fix)));
            out.push('\n');
        }
    }
    let problems = findings
        .iter()
        .filter(|f| f.severity == Severity::Problem)
        .count();
    out.push_str(&match problems {
        0 => "no problem found\n".to_string(),
        1 => "1 problem found\n".to_string(),
        n => format!("{n} problems found\n"),
    });
    out
}

#[cfg(test)]
mod tests;
