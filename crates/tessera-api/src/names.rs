//! Every name Tessera writes into objects it does not own the schema of, or that two
//! components must spell alike: the API group and driver name, labels, annotations,
//! finalizers, field managers and reserved ticket ids. Defined here once, so a
//! component reads another's marks by the same constant (and `kubectl` users can find
//! them all in one place: docs/troubleshooting.md lists what each means).

use sha2::{Digest, Sha256};

/// API group of every Tessera resource.
pub const GROUP: &str = "tessera.io";
/// API version of every Tessera resource.
pub const VERSION: &str = "v1alpha1";
/// The CSI driver name (`CSIDriver` object, `storage.k8s.io` VolumeAttachment attacher).
pub const CSI_DRIVER_NAME: &str = "csi.tessera.io";
/// Topology key of node-local volumes.
pub const TOPOLOGY_NODE_KEY: &str = "topology.tessera.io/node";
/// Value of a [`root_topology_key`] on a node that serves the root.
pub const TOPOLOGY_ROOT_SERVED: &str = "served";

/// The topology key of a Shared backend root: a node that serves `root` (has it when
/// its CSI plugin registers) carries it as a label with [`TOPOLOGY_ROOT_SERVED`], and a
/// volume on `root` requires it, so the scheduler keeps that volume's Pods off nodes
/// that lack the root. `topology.tessera.io/root-<slug>-<hash>`: the slug keeps it
/// readable (`kubectl get nodes -L`), the hash of the whole path keeps it unique;
/// the name part stays within a label's 63 characters.
pub fn root_topology_key(root: &str) -> String {
    let mut slug = String::new();
    for c in root.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('.') {
            slug.push('.');
        }
        if slug.len() >= 40 {
            break;
        }
    }
    let slug = slug.trim_end_matches('.');
    // FNV-1a, folded to 32 bits: stable across builds and machines.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in root.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let h = (h >> 32) ^ (h & 0xffff_ffff);
    if slug.is_empty() {
        format!("topology.tessera.io/root-{h:08x}")
    } else {
        format!("topology.tessera.io/root-{slug}-{h:08x}")
    }
}

// Field managers: one per component, so server-side apply keeps each one's fields
// apart and `kubectl tessera tickets` can say who wrote a ticket.

/// Field manager of every write the controller makes.
pub const CONTROLLER_FIELD_MANAGER: &str = "tessera-controller";
/// Field manager of the CSI controller's writes (the tickets of `csi-attacher`).
pub const CSI_CONTROLLER_FIELD_MANAGER: &str = "tessera-csi-controller";
/// Field manager of the references the CSI Node service writes.
pub const CSI_NODE_FIELD_MANAGER: &str = "tessera-csi-node";
/// Prefix of a node agent's field manager: `tessera-node-<node>` (see
/// [`node_field_manager`]).
pub const NODE_FIELD_MANAGER_PREFIX: &str = "tessera-node-";

/// The field manager of the node agent on `node`.
pub fn node_field_manager(node: &str) -> String {
    format!("{NODE_FIELD_MANAGER_PREFIX}{node}")
}

// Finalizers.

/// Finalizer on Volumes: the data is removed (through a cleanup ticket) before the
/// Volume goes.
pub const VOLUME_FINALIZER: &str = "tessera.io/volume-data";
/// Finalizer on VolumeAttachments: removed only when no workload ticket is satisfied.
pub const ATTACHMENT_FINALIZER: &str = "tessera.io/workload-protection";
/// Finalizer on MountPods: the node has unmounted (or, for RemoveData, finished)
/// before the MountPod goes. The node agent adds it before it serves a MountPod; the
/// controller sets it already when it creates a MountPod for a node whose agent is
/// registered, which saves the agent that write.
pub const MOUNT_FINALIZER: &str = "tessera.io/mount";

// Labels.

/// Label on a MountPod carrying the node name, so a node agent can watch only its own
/// MountPods.
pub const LABEL_NODE: &str = "tessera.io/node";
/// Label on a MountPod carrying the volume name.
pub const LABEL_VOLUME: &str = "tessera.io/volume";
/// Label on a snapshot's Volume (value `"true"`): ListVolumes leaves it out.
pub const LABEL_SNAPSHOT: &str = "tessera.io/snapshot";
/// Label on every inline (CSI ephemeral) Volume.
pub const LABEL_INLINE: &str = "tessera.io/inline";
/// `app.kubernetes.io/component` of every mount Pod (the agent's watch selects on it).
pub const MOUNT_POD_COMPONENT: &str = "mount";
/// The mount Pod's one container.
pub const MOUNT_POD_CONTAINER: &str = "tessera-mount";

// Annotations.

/// Annotation on a Volume: `"true"` lets a deleted Volume go without removing its data
/// when that cannot be done (its node-local node is gone). The data, if any is left,
/// stays where it was.
pub const ANNOTATION_ABANDON_DATA: &str = "tessera.io/abandon-data";
/// Annotation on a Volume: `Retain` keeps the data when the Volume is deleted.
pub const ANNOTATION_RECLAIM: &str = "tessera.io/reclaim-policy";
/// Annotation on a Volume with a `dataSource`: `"true"` once its data was copied (set
/// by the CSI controller when the `volume-restore` ticket was satisfied). A populated
/// volume is never filled again.
pub const ANNOTATION_POPULATED: &str = "tessera.io/populated";
/// Annotation beside [`ANNOTATION_POPULATED`]: the node that copied the data, written
/// in the same change (absent when there was nothing to copy). Where a restore from a
/// snapshot copies when the Volume's status does not say yet.
pub const ANNOTATION_FILLED_ON: &str = "tessera.io/filled-on";
/// Annotation on a Volume with the CSI name it was created for.
pub const ANNOTATION_CSI_NAME: &str = "tessera.io/csi-name";
/// Annotation on a snapshot's Volume: the volume it is a snapshot of.
pub const ANNOTATION_SNAPSHOT_OF: &str = "tessera.io/snapshot-of";
/// Annotation on an inline Volume: its Pod, `<namespace>/<name>`.
pub const ANNOTATION_INLINE_POD: &str = "tessera.io/inline-pod";
/// Annotation on an inline Volume: the uid of that Pod.
pub const ANNOTATION_INLINE_POD_UID: &str = "tessera.io/inline-pod-uid";
/// Annotation on an inline Volume: the kubelet's volume handle (the CSI `volume_id`).
pub const ANNOTATION_INLINE_CSI_VOLUME: &str = "tessera.io/inline-csi-volume";
/// Annotation on a mount Pod naming the MountPod it serves (also a `volume_context`
/// key of NodePublish).
pub const ANNOTATION_MOUNTPOD: &str = "tessera.io/mountpod";
/// Annotation on a Volume created for a PersistentVolumeClaim (and on its MountPods):
/// the claim's name, from the external-provisioner's `csi.storage.k8s.io/pvc/name`
/// parameter (`--extra-create-metadata`). The `pvc` label of the per-volume metrics.
pub const ANNOTATION_PVC_NAME: &str = "tessera.io/pvc-name";
/// Annotation beside [`ANNOTATION_PVC_NAME`]: the claim's namespace (the
/// `pvc_namespace` label of the per-volume metrics).
pub const ANNOTATION_PVC_NAMESPACE: &str = "tessera.io/pvc-namespace";
/// On a node's liveness Lease: the controller fenced the node (docs/failover.md); the
/// node's agent finds it when its next renewal fails, revokes its daemons, and takes
/// the Lease again under a new epoch (`spec.leaseTransitions`).
pub const ANNOTATION_FENCED: &str = "tessera.io/fenced";
/// The prefix of a node's liveness Lease, in Tessera's namespace: `tessera-node-<node>`.
pub const LIVENESS_LEASE_PREFIX: &str = "tessera-node-";

/// The name of `node`'s liveness Lease.
pub fn liveness_lease(node: &str) -> String {
    format!("{LIVENESS_LEASE_PREFIX}{node}")
}

/// The node a Lease of that name is the liveness Lease of (the inverse of
/// [`liveness_lease`]; `None`: not one).
pub fn liveness_lease_node(lease: &str) -> Option<&str> {
    lease.strip_prefix(LIVENESS_LEASE_PREFIX)
}
/// On a node's liveness Lease, written with each renewal by its agent: the free bytes
/// of each backend root the node has, as a JSON object `{"<root>": bytes}` (coarsened,
/// so it changes only when the space does). The CSI controller answers GetCapacity
/// from it (docs/operations.md "Capacity").
pub const ANNOTATION_FREE_BYTES: &str = "tessera.io/free-bytes";

// Conditions every kind carries for GitOps tools (docs/gitops.md). `Ready` is for
// `kubectl wait --for=condition=Ready`; `Reconciling` and `Stalled` are kstatus's
// "abnormal-true" conditions (Flux, cli-utils, `kpt live status`): present with status
// True while the object is on its way (kstatus: InProgress) or stuck until a person
// acts (kstatus: Failed), absent otherwise, never both. The shipped Argo CD health
// scripts (config/argocd/) read the same three.

/// Condition type: the object is where its spec wants it.
pub const CONDITION_READY: &str = "Ready";
/// Condition type (kstatus): work towards the spec is under way.
pub const CONDITION_RECONCILING: &str = "Reconciling";
/// Condition type (kstatus): no progress without a person acting (see its reason).
pub const CONDITION_STALLED: &str = "Stalled";
/// Condition type of a Volume whose mount (reason `MountFailed`) or backend root
/// (`BackendRootNotAllowed`) failed.
pub const CONDITION_FAULTED: &str = "Faulted";
/// Condition type of a Volume that fenced failover (docs/failover.md) moves off a
/// fenced node (reason `FailedOver`) or leaves on a down one (`StaysOnDownNode`):
/// True while that lasts, absent otherwise. Not one of kstatus's: it never makes a
/// Volume look unhealthy by itself.
pub const CONDITION_NODE_FAILOVER: &str = "NodeFailover";
/// Condition type of a MountPod on a node the controller fenced (docs/failover.md),
/// written by the controller (the node's agent is dead or cut off): True while the
/// node is fenced, since its lastTransitionTime; absent otherwise.
pub const CONDITION_FENCED: &str = "Fenced";

// Reserved ticket ids.

/// Id of the ticket that removes a deleted volume's data.
pub const CLEANUP_TICKET: &str = "cleanup-data";

/// The Volume of the inline volume `volume_name` of Pod `pod_uid`: `inline-` and 40
/// hex digits of a hash of both (47 characters, whatever their lengths).
pub fn inline_volume_name(pod_uid: &str, volume_name: &str) -> String {
    let digest = Sha256::digest(format!("{pod_uid}/{volume_name}").as_bytes());
    format!("inline-{}", &hex::encode(digest)[..40])
}

/// The id of the `csi-ephemeral` ticket of `volume` on `node`.
pub fn inline_ticket_id(volume: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{volume}{}{node}", CSI_DRIVER_NAME).as_bytes());
    format!("inline-{}", hex::encode(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_agent_field_manager_names_its_node() {
        assert_eq!(node_field_manager("node-a"), "tessera-node-node-a");
        assert!(node_field_manager("x").starts_with(NODE_FIELD_MANAGER_PREFIX));
    }

    /// A label key: an optional DNS-subdomain prefix, `/`, and a name of at most 63
    /// characters, alphanumeric at both ends, `-`, `_`, `.` inside.
    fn is_label_key(k: &str) -> bool {
        let Some((prefix, name)) = k.split_once('/') else {
            return false;
        };
        let inner = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        prefix.len() <= 253
            && !name.is_empty()
            && name.len() <= 63
            && name.chars().all(inner)
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric())
    }

    #[test]
    fn a_root_topology_key_is_a_readable_label_key_unique_per_path() {
        let k = root_topology_key("/mnt/shared/tessera");
        assert!(
            k.starts_with("topology.tessera.io/root-mnt.shared.tessera-"),
            "{k}"
        );
        assert_eq!(k, root_topology_key("/mnt/shared/tessera"), "stable");
        let long = format!("/{}", "Very Long_Directory/".repeat(20));
        for root in ["/mnt/shared/tessera", "/", "/ü/€", &long, "/a//b/", "/a.b"] {
            let k = root_topology_key(root);
            assert!(is_label_key(&k), "{root:?} gives {k:?}");
        }
        // Paths whose slugs agree still differ by the hash.
        assert_ne!(root_topology_key("/a/b"), root_topology_key("/a.b"));
        assert_ne!(root_topology_key("/a/b"), root_topology_key("/A/b"));
    }
}
