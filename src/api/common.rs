//! Types and validation rules shared by more than one kind.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// A quantity that is not a whole, non-negative number of bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a quantity of bytes (like 10Gi, 500M or 1073741824)")]
pub struct QuantityError(pub String);

/// Bytes in a Kubernetes quantity (`10Gi`, `500M`, `1.5Gi`, `1e9`), rounded up to a
/// whole byte, as the quota to enforce.
pub fn quantity_bytes(q: &str) -> Result<u64, QuantityError> {
    let err = || QuantityError(q.to_string());
    let s = q.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let (mantissa, scale): (&str, f64) = match suffix {
        "" => (num, 1.0),
        "Ki" => (num, 1024.0),
        "Mi" => (num, 1024f64.powi(2)),
        "Gi" => (num, 1024f64.powi(3)),
        "Ti" => (num, 1024f64.powi(4)),
        "Pi" => (num, 1024f64.powi(5)),
        "Ei" => (num, 1024f64.powi(6)),
        "k" => (num, 1e3),
        "M" => (num, 1e6),
        "G" => (num, 1e9),
        "T" => (num, 1e12),
        "P" => (num, 1e15),
        "E" => (num, 1e18),
        "m" => (num, 1e-3),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().map_err(|_| err())?;
            (num, 10f64.powi(exp))
        }
        _ => return Err(err()),
    };
    if mantissa.is_empty() {
        return Err(err());
    }
    // Exact integer arithmetic where possible (the common case: "10Gi").
    if let (Ok(n), true) = (
        mantissa.parse::<u64>(),
        scale >= 1.0 && scale.fract() == 0.0,
    ) {
        return n.checked_mul(scale as u64).ok_or_else(err);
    }
    let v: f64 = mantissa.parse().map_err(|_| err())?;
    let bytes = (v * scale).ceil();
    if !(0.0..=(u64::MAX as f64)).contains(&bytes) {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// Bytes as the shortest exact quantity (`1Gi`, `500Mi`, `1000`), the inverse of
/// [`quantity_bytes`], so `kubectl get volumes` reads like the PVC that asked.
pub fn quantity_of(bytes: u64) -> String {
    for (suffix, unit) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
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

    #[test]
    fn quantities_in_bytes() {
        for (q, want) in [
            ("1Gi", 1 << 30),
            ("10Gi", 10 << 30),
            ("500M", 500_000_000),
            ("1.5Gi", 3 << 29),
            ("1e3", 1000),
            ("1073741824", 1 << 30),
            ("100m", 1),
            ("2k", 2000),
        ] {
            assert_eq!(quantity_bytes(q), Ok(want), "{q}");
        }
        for bad in ["", "Gi", "1Zi", "abc", "-1Gi", "1..2"] {
            assert!(quantity_bytes(bad).is_err(), "{bad} must be rejected");
        }
    }

    #[test]
    fn quantities_from_bytes() {
        for (bytes, want) in [
            (1u64 << 30, "1Gi"),
            (3 << 29, "1536Mi"),
            (1000, "1000"),
            (0, "0"),
            (5 << 40, "5Ti"),
            (1 << 50, "1024Ti"),
        ] {
            assert_eq!(quantity_of(bytes), want, "{bytes}");
        }
        for bytes in [123_456_789, 1 << 30, 0, 1023, u64::MAX] {
            assert_eq!(quantity_bytes(&quantity_of(bytes)), Ok(bytes), "{bytes}");
        }
    }
}
