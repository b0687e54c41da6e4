//! Fenced failover, the controller's decision (docs/failover.md): which nodes are
//! alive, suspect or fenced by what the controller itself saw of their liveness
//! Leases, and which tickets of a fenced node may be released. Pure: the controller's
//! monotonic clock comes in as a [`Duration`] since an origin of its own, and no wall
//! clock appears anywhere.
//!
//! ```text
//!  Lease watch ─▶ Observer::observe(node, resourceVersion, now)  (a change restarts the wait)
//!  Observer + out-of-service taint + Timing + now ─▶ liveness ─▶ Alive │ Suspect │ Fenced(since) │ NoLease
//!  nodes' liveness + tickets held (volume single-writer? StorageClass nodeFailover?) ─▶ releases
//!  a fenced node Kubernetes gave up on + the volumes released there ─▶ in_use::plan
//!  nodes past the wait but Ready (`--fence-taint`) ─▶ taint::plan (within a share)
//! ```
//!
//! A node is `Fenced` when the controller has seen no change of its Lease for
//! `fence_after + margin` of its own clock, counted from the moment *it* saw the last
//! change (a controller process knows nothing older than its start; a standby replica
//! watches too, [`witness`], so a new leader knows what it saw before it led), and its
//! kubelet no longer reports the Node Ready (a node whose agent alone is gone keeps
//! its Pods and its volumes: `AgentGone`), or at once
//! when it has the `node.kubernetes.io/out-of-service` taint. A node that never had a
//! Lease runs no self-fencing agent: only the taint fences it.

use std::collections::BTreeMap;
use std::time::Duration;

use tessera_api::NodeFailover;
use tessera_api::VolumeAttachment;

pub mod conditions;
pub mod in_use;
mod report;
mod run;
pub mod taint;
mod tainting;
#[cfg(test)]
mod tests;
mod unlist;
pub mod witness;

pub use run::run;
pub use witness::Witness;

/// The taint by which an administrator says a node is shut down.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// How long the daemons wait before fencing themselves, and what the controller adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The daemons' `fenceAfter`.
    pub fence_after: Duration,
    /// What covers clock-rate drift and a request between its check and the backend.
    pub margin: Duration,
}

impl Timing {
    /// How long after the last change seen a node is fenced.
    pub fn wait(&self) -> Duration {
        self.fence_after.saturating_add(self.margin)
    }
}

/// What the controller saw of one node's Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    version: String,
    at: Duration,
    /// A version other than the first one seen came: the node renewed while watched.
    renewed: bool,
}

/// The last change of each node's Lease, on the controller's own clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observer {
    started: Duration,
    seen: BTreeMap<String, Seen>,
}

impl Observer {
    /// An observer that starts at `now`: every Lease it sees first counts as changed now.
    pub fn new(now: Duration) -> Observer {
        Observer {
            started: now,
            seen: BTreeMap::new(),
        }
    }

    /// The node's Lease has `version` at `now`; a version other than the last one seen
    /// (or the first one seen) restarts the node's wait.
    pub fn observe(&mut self, node: &str, version: &str, now: Duration) {
        match self.seen.get_mut(node) {
            Some(s) if s.version == version => {}
            Some(s) => {
                s.version = version.to_owned();
                s.at = now.max(s.at);
                s.renewed = true;
            }
            None => {
                self.seen.insert(
                    node.to_owned(),
                    Seen {
                        version: version.to_owned(),
                        at: now.max(self.started),
                        renewed: false,
                    },
                );
            }
        }
    }

    /// The node's Lease is gone: it runs no self-fencing agent any more.
    pub fn forget(&mut self, node: &str) {
        self.seen.remove(node);
    }

    /// Whether the controller saw the node's Lease change since it first saw it: the
    /// node is known to be alive by what it did, not only by the controller's not
    /// having waited long enough (a controller that just started).
    pub fn renewed(&self, node: &str) -> bool {
        self.seen.get(node).is_some_and(|s| s.renewed)
    }

    /// When the controller saw the node's Lease change last, if it has one.
    pub fn last_change(&self, node: &str) -> Option<Duration> {
        self.seen.get(node).map(|s| s.at)
    }
}

/// A node's liveness as the controller judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Its Lease changed less than `fence_after` ago.
    Alive,
    /// Its Lease has not changed for `fence_after`; fenced at `fenced_at`.
    Suspect { fenced_at: Duration },
    /// Its daemons cannot be writing since `since` (or the taint says it is shut down).
    Fenced { since: Duration, why: Why },
    /// No Lease: no self-fencing agent runs there, only the taint can fence it.
    NoLease,
    /// Its Lease is past `fence_after + margin` (its daemons fenced since `fenced_at`)
    /// but its kubelet still reports the Node Ready: only the node agent is gone, its
    /// Pods stay where they are (Kubernetes would not move them), nothing is released;
    /// its writes wait until the agent renews again.
    AgentGone { fenced_at: Duration },
}

/// Why a node is fenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No change of its Lease seen for `fence_after + margin`.
    LeaseExpired,
    /// The `node.kubernetes.io/out-of-service` taint.
    OutOfService,
}

/// What the controller knows of one node at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeView {
    /// When it saw the node's Lease change last (none: no Lease).
    pub last_change: Option<Duration>,
    /// The Lease carries the controller's fenced mark (written only once the node was
    /// fenced; the agent clears it only by taking the Lease under a new epoch).
    pub marked: bool,
    /// The node has the `node.kubernetes.io/out-of-service` taint.
    pub out_of_service: bool,
    /// The Node's Ready condition is True (its kubelet reports to the API server).
    pub kube_ready: bool,
    /// The node carries the controller's fence taint ([`taint`], `--fence-taint`): the
    /// scheduler puts nothing there, so its Lease fences it though it is Ready.
    pub fence_tainted: bool,
}

/// The liveness at `now` of the node `n`.
pub fn liveness(n: NodeView, timing: Timing, now: Duration) -> Liveness {
    if n.out_of_service {
        return Liveness::Fenced {
            since: now,
            why: Why::OutOfService,
        };
    }
    let Some(last) = n.last_change else {
        return Liveness::NoLease;
    };
    if n.marked {
        return Liveness::Fenced {
            since: now,
            why: Why::LeaseExpired,
        };
    }
    let fenced_at = last.saturating_add(timing.wait());
    if now >= fenced_at && n.kube_ready && !n.fence_tainted {
        Liveness::AgentGone { fenced_at }
    } else if now >= fenced_at {
        Liveness::Fenced {
            since: fenced_at,
            why: Why::LeaseExpired,
        }
    } else if now >= last.saturating_add(timing.fence_after) {
        Liveness::Suspect { fenced_at }
    } else {
        Liveness::Alive
    }
}

/// A ticket that holds a volume on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub volume: String,
    pub ticket: String,
    pub node: String,
    /// The volume is ReadWriteOnce or ReadWriteOncePod.
    pub single_writer: bool,
    pub failover: NodeFailover,
}

/// A ticket the controller may release, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub volume: String,
    pub ticket: String,
    pub node: String,
    pub why: Why,
    /// Since when the node is fenced.
    pub since: Duration,
}

/// The tickets of fenced nodes that may be released: every ticket of a node with the
/// out-of-service taint; of a node fenced by its Lease, the tickets of single-writer
/// volumes whose StorageClass opted in. `nodes` holds each node's liveness.
pub fn releases(nodes: &BTreeMap<String, Liveness>, holdings: &[Holding]) -> Vec<Release> {
    let mut out: Vec<Release> = holdings
        .iter()
        .filter_map(|h| {
            let Some(Liveness::Fenced { since, why }) = nodes.get(&h.node) else {
                return None;
            };
            let may = match why {
                Why::OutOfService => true,
                Why::LeaseExpired => h.single_writer && h.failover == NodeFailover::Fenced,
            };
            may.then(|| Release {
                volume: h.volume.clone(),
                ticket: h.ticket.clone(),
                node: h.node.clone(),
                why: *why,
                since: *since,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.volume, &a.ticket).cmp(&(&b.volume, &b.ticket)));
    out
}

/// The tickets that stay on a node fenced by its Lease because their volume did not
/// opt in (single-writer, nodeFailover Off, or a daemon that does not fence itself):
/// the volume waits for the node, and the controller says so once.
pub fn stranded<'a>(
    nodes: &BTreeMap<String, Liveness>,
    holdings: &'a [Holding],
) -> Vec<&'a Holding> {
    holdings
        .iter()
        .filter(|h| {
            matches!(
                nodes.get(&h.node),
                Some(Liveness::Fenced {
                    why: Why::LeaseExpired,
                    ..
                })
            ) && h.single_writer
                && h.failover != NodeFailover::Fenced
        })
        .collect()
}

/// One step of handing a released ticket's volume on, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Delete at once (its kubelet is gone: nothing else would) a Pod on the fenced
    /// node bound to the volume (from its MountPod's references), with a uid
    /// precondition: its controller makes a new one, scheduled elsewhere.
    DeletePod {
        namespace: String,
        name: String,
        uid: String,
    },
    /// Delete the storage.k8s.io VolumeAttachment of a `csi-attacher` ticket (the
    /// same name): Kubernetes' attach-detach controller then sees the volume detached
    /// from the dead node instead of waiting six minutes to force it.
    DeleteCsiAttachment { name: String },
    /// Remove the ticket (only if unchanged).
    RemoveTicket,
}

/// The steps of releasing `r`: on a node fenced by its Lease (and not Ready), the
/// Pods bound to the volume there (`pods`: namespace, name, uid) and the ticket's
/// storage.k8s.io VolumeAttachment when it is a `csi-attacher` one go first, as
/// Longhorn's "pod deletion policy when the node is down" does; under the
/// out-of-service taint Kubernetes does both itself.
pub fn steps(r: &Release, csi_attacher: bool, pods: &[(String, String, String)]) -> Vec<Step> {
    let mut out = vec![];
    if r.why == Why::LeaseExpired {
        out.extend(pods.iter().map(|(namespace, name, uid)| Step::DeletePod {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.clone(),
        }));
        if csi_attacher {
            out.push(Step::DeleteCsiAttachment {
                name: r.ticket.clone(),
            });
        }
    }
    out.push(Step::RemoveTicket);
    out
}

/// Whether `r` was released although removing its ticket failed (the ticket was no
/// longer as read): deleting the ticket's storage.k8s.io VolumeAttachment
/// (`deleted_csi_attachment`) makes the external-attacher call ControllerUnpublish,
/// which removes the ticket itself and may do so first. `now`: the volume's
/// VolumeAttachment read after the failure. Anything else (the ticket still there, the
/// volume gone, no storage attachment deleted) is not this release.
pub fn released_by_unpublish(
    r: &Release,
    deleted_csi_attachment: bool,
    now: Option<&VolumeAttachment>,
) -> bool {
    deleted_csi_attachment
        && now.is_some_and(|va| !va.spec.attachment_tickets.contains_key(&r.ticket))
}
