//! Types and validation rules shared by more than one kind.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// CEL: a lowercase RFC 1123 subdomain, the form of a Kubernetes object name
/// (a Node name in particular).
pub(crate) const DNS_SUBDOMAIN_RULE: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";

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
