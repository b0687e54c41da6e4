//! Types and validation rules shared by more than one kind.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Sizes are Kubernetes quantities of bytes, read and written as `tessera_text` does.
pub use tessera_text::quantity::{QuantityError, quantity_bytes, quantity_of};

/// CEL: a lowercase RFC 1123 subdomain, the form of a Kubernetes object name
/// (a Node name in particular).
pub(crate) const DNS_SUBDOMAIN_RULE: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";

/// Mount options a Volume (and so a MountPod) may ask for. Everything else is refused
/// at the API server and again by the node agent: `suid` and `dev` would let a volume's
/// owner plant set-ID binaries and device nodes for pods, `fsname=`/`subtype=` rename
/// the mount, and a comma would smuggle in more options.
pub const MOUNT_OPTIONS: [&str; 14] = [
    "ro",
    "rw",
    "exec",
    "noexec",
    "nosuid",
    "nodev",
    "atime",
    "noatime",
    "relatime",
    "sync",
    "async",
    "dirsync",
    "allow_other",
    "default_permissions",
];

/// CEL: every item of a mount option list is one of [`MOUNT_OPTIONS`] (checked equal by
/// a unit test).
pub(crate) const MOUNT_OPTIONS_RULE: &str = "self.all(o, o in ['ro', 'rw', 'exec', 'noexec', 'nosuid', 'nodev', 'atime', 'noatime', 'relatime', 'sync', 'async', 'dirsync', 'allow_other', 'default_permissions'])";

/// The message of [`MOUNT_OPTIONS_RULE`].
pub(crate) const MOUNT_OPTIONS_MESSAGE: &str = "mountOptions may only hold ro, rw, exec, noexec, nosuid, nodev, atime, noatime, relatime, sync, async, dirsync, allow_other and default_permissions (suid, dev, fsname= and anything else are refused)";

/// Whether `option` is one a Volume may ask for.
pub fn mount_option_allowed(option: &str) -> bool {
    MOUNT_OPTIONS.contains(&option)
}

/// The largest volume: 1 EiB (2^60 bytes).
pub const MAX_VOLUME_BYTES: u64 = 1 << 60;

/// How many nodes and writers a volume may have. The names are those of
/// `PersistentVolumeClaim.spec.accessModes`, so a CSI request maps one to one.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum AccessMode {
    /// One node reads and writes.
    ReadWriteOnce,
    /// One pod on one node reads and writes.
    ReadWriteOncePod,
    /// Many nodes read.
    ReadOnlyMany,
    /// Many nodes read and write.
    ReadWriteMany,
}

/// What happens to a single-writer volume's tickets on a node that stops renewing
/// its liveness Lease (docs/failover.md); a StorageClass's `nodeFailover` parameter.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NodeFailover {
    /// The volume stays with the node until it comes back (or until the
    /// `node.kubernetes.io/out-of-service` taint).
    #[default]
    Off,
    /// The node's mount daemons fence themselves; once the controller has seen no
    /// renewal for `fenceAfter` + its margin, it releases the node's tickets.
    Fenced,
}

impl AccessMode {
    /// Whether the volume may be attached to more than one node at a time.
    pub fn is_multi_node(self) -> bool {
        matches!(self, AccessMode::ReadOnlyMany | AccessMode::ReadWriteMany)
    }
}

impl std::fmt::Display for AccessMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteOncePod => "ReadWriteOncePod",
            AccessMode::ReadOnlyMany => "ReadOnlyMany",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        };
        f.write_str(s)
    }
}

/// Condition status values, as in `metav1.Condition`.
pub mod condition_status {
    /// The condition holds.
    pub const TRUE: &str = "True";
    /// The condition does not hold.
    pub const FALSE: &str = "False";
    /// Not known yet.
    pub const UNKNOWN: &str = "Unknown";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cel_rule_lists_exactly_the_allowed_options() {
        let list: Vec<String> = MOUNT_OPTIONS.iter().map(|o| format!("'{o}'")).collect();
        assert_eq!(
            MOUNT_OPTIONS_RULE,
            format!("self.all(o, o in [{}])", list.join(", "))
        );
        for o in MOUNT_OPTIONS {
            assert!(MOUNT_OPTIONS_MESSAGE.contains(o), "{o}");
        }
        for bad in ["suid", "dev", "fsname=x", "ro,suid", "", " ro"] {
            assert!(!mount_option_allowed(bad), "{bad:?}");
        }
    }
}
