//! The doctor's checks of the Pods around the agents: an fd holder beside every agent
//! (without it a mount daemon's crash or upgrade reaches applications), the mount Pods
//! (Ready, OOM-killed, their image against their agent's), and the sidecars of the
//! agent and controller Pods (the CSI sidecars).
//!
//! ```text
//!  agents, fd_holders ─▶ fd_holders  ─▶ a Ready holder on each agent's node
//!  agents, mount_pods ─▶ mount_pods  ─▶ not Ready / OOMKilled / image ≠ the agent's
//!  agents, controllers ─▶ sidecars   ─▶ each unready sidecar, by name
//! ```

use std::collections::BTreeMap;

use super::{Finding, Inventory, PodInfo};

/// Each node with an agent has a Ready fd holder.
pub(super) fn fd_holders(inv: &Inventory, out: &mut Vec<Finding>) {
    let mut agent_nodes: Vec<&str> = inv.agents.iter().map(|p| p.node.as_str()).collect();
    agent_nodes.sort_unstable();
    agent_nodes.dedup();
    let mut fine = 0;
    for node in &agent_nodes {
        let holders: Vec<&PodInfo> = inv.fd_holders.iter().filter(|p| p.node == *node).collect();
        if holders.is_empty() {
            out.push(Finding::problem(
                "fd-holder",
                format!("node {node} has no fd holder (no tessera-fd-holder Pod): a mount daemon's crash or upgrade there is seen by applications"),
                format!(
                    "`kubectl -n {} get ds tessera-fd-holder`: does the DaemonSet exist, tolerate the node's taints and match its labels?",
                    inv.namespace
                ),
            ));
        } else if !holders.iter().any(|p| p.ready) {
            out.push(Finding::problem(
                "fd-holder",
                format!(
                    "the fd holder on node {node} ({}) is not Ready: new mounts there start without a held connection",
                    holders[0].name
                ),
                format!(
                    "`kubectl -n {} describe pod {}` and its log",
                    inv.namespace, holders[0].name
                ),
            ));
        } else {
            fine += 1;
        }
    }
    if fine > 0 {
        out.push(Finding::ok(
            "fd-holder",
            format!(
                "{fine} of {} nodes with an agent have a Ready fd holder",
                agent_nodes.len()
            ),
        ));
    }
}

/// The image mount Pods on each node should run: its agent's `--mount-image`, else
/// the agent's own.
fn expected_images(inv: &Inventory) -> BTreeMap<&str, &str> {
    inv.agents
        .iter()
        .filter(|a| !a.image.is_empty() || a.mount_image.is_some())
        .map(|a| {
            (
                a.node.as_str(),
                a.mount_image.as_deref().unwrap_or(a.image.as_str()),
            )
        })
        .collect()
}

/// Mount Pods: Ready, not killed for memory, on their agent's image.
pub(super) fn mount_pods(inv: &Inventory, out: &mut Vec<Finding>) {
    let ns = &inv.namespace;
    let images = expected_images(inv);
    let mut old_image: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut ready = 0;
    for p in &inv.mount_pods {
        if p.last_terminated.as_deref() == Some("OOMKilled") {
            out.push(Finding::problem(
                "mount-pods",
                format!(
                    "mount Pod {} on node {} was OOMKilled (restarts: {})",
                    p.name, p.node, p.restarts
                ),
                "raise its Volume's spec.mountResources memory limit (the StorageClass's mountMemoryLimit); `kubectl get events --field-selector reason=MountOOMKilled -A`".into(),
            ));
        }
        if p.ready {
            ready += 1;
        } else {
            out.push(Finding::problem(
                "mount-pods",
                format!(
                    "mount Pod {} on node {} is not Ready{}",
                    p.name,
                    p.node,
                    p.waiting
                        .as_deref()
                        .map(|w| format!(" ({w})"))
                        .unwrap_or_default()
                ),
                format!(
                    "`kubectl -n {ns} describe pod {}` and `kubectl -n {ns} logs {} -c {}`",
                    p.name,
                    p.name,
                    tessera_api::MOUNT_POD_CONTAINER
                ),
            ));
        }
        if let Some(want) = images.get(p.node.as_str())
            && !p.image.is_empty()
            && p.image != *want
        {
            old_image.entry(want).or_default().push(&p.name);
        }
    }
    for (want, pods) in old_image {
        out.push(Finding::info(
            "mount-pods",
            format!(
                "{} mount Pod(s) run another image than their node's agent mounts with ({want}): {}",
                pods.len(),
                pods.join(", ")
            ),
            "a running mount keeps its image until its mount Pod is replaced (docs/operations.md, upgrades); `kubectl get events -A --field-selector reason=UpgradeBlocked`".into(),
        ));
    }
    if ready > 0 {
        out.push(Finding::ok(
            "mount-pods",
            format!("{ready} of {} mount Pods are Ready", inv.mount_pods.len()),
        ));
    }
}

/// How long a mount may wait for its daemon before it is a problem: a mount Pod
/// normally runs within seconds; the agent gives up at its start timeout (30 s, four
/// times that while the kubelet still creates the Pod).
pub const AWAITING_DAEMON_SECS: i64 = 15;

/// Mounts the agent made whose daemon has not answered for long: the Pods bound to
/// them wait on every request, and fail (ENOTCONN) once the agent gives up.
pub(super) fn awaiting_daemon(inv: &Inventory, now: jiff::Timestamp, out: &mut Vec<Finding>) {
    let ns = &inv.namespace;
    for a in &inv.awaiting_daemon {
        let age = a.since.map_or(0, |s| now.duration_since(s).as_secs());
        if age < AWAITING_DAEMON_SECS {
            continue;
        }
        out.push(Finding::problem(
            "mounts",
            format!(
                "the mount of volume {} on node {} has waited {} for its daemon (MountPod {}, AwaitingDaemon): the Pods using it wait on every request, and fail with ENOTCONN once the agent gives up",
                a.volume,
                a.node,
                crate::text::age(age),
                a.mountpod
            ),
            format!(
                "why its mount Pod does not run: `kubectl -n {ns} get pods -l {}={} -o wide` (image pull, quota, node pressure), then `kubectl get events -A --field-selector reason=DaemonMissing`",
                tessera_api::LABEL_VOLUME,
                a.volume
            ),
        ));
    }
}

/// Whether `c` (`name` or `name (reason)`) is a sidecar: not the `tessera` container,
/// whose readiness the agents check reports (and a standby controller's is not meant
/// to be ready).
fn sidecar(c: &str) -> bool {
    c.split(' ').next() != Some("tessera")
}

/// Every sidecar of the agent and controller Pods is ready (provisioner, attacher,
/// resizer, snapshotter, node-driver-registrar, liveness probes).
pub(super) fn sidecars(inv: &Inventory, out: &mut Vec<Finding>) {
    let mut checked = 0;
    for p in inv.agents.iter().chain(&inv.controllers) {
        checked += 1;
        for c in p.unready_containers.iter().filter(|c| sidecar(c)) {
            out.push(Finding::problem(
                "sidecars",
                format!(
                    "container {c} of Pod {} (node {}) is not ready",
                    p.name, p.node
                ),
                format!(
                    "`kubectl -n {ns} logs {} -c {}` (and `describe pod` for its restarts)",
                    p.name,
                    c.split(' ').next().unwrap_or(c),
                    ns = inv.namespace
                ),
            ));
        }
    }
    if checked > 0
        && inv
            .agents
            .iter()
            .chain(&inv.controllers)
            .all(|p| !p.unready_containers.iter().any(|c| sidecar(c)))
    {
        out.push(Finding::ok(
            "sidecars",
            format!("every container of {checked} agent and controller Pods is ready"),
        ));
    }
}
