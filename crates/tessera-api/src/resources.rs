//! `MountResources`: the CPU and memory a volume's mount daemon may ask for and use
//! (a StorageClass's `mountCPURequest`, `mountCPULimit`, `mountMemoryRequest` and
//! `mountMemoryLimit`, recorded on the Volume, carried to its MountPods, and put on the
//! mount Pod's container in pod mode), with the bounds the API server and the CSI
//! driver both enforce.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The least memory a mount daemon may be given (request or limit): below this the
/// daemon does not start.
pub const MIN_MOUNT_MEMORY: u64 = 16 << 20;
/// The most memory a mount daemon may be given.
pub const MAX_MOUNT_MEMORY: u64 = 64 << 30;
/// The least CPU, in millicores.
pub const MIN_MOUNT_MILLICPU: u64 = 1;
/// The most CPU, in millicores (64 cores).
pub const MAX_MOUNT_MILLICPU: u64 = 64_000;

/// CEL: a memory quantity within [`MIN_MOUNT_MEMORY`] and [`MAX_MOUNT_MEMORY`].
const MEMORY_RULE: &str = "isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('16Mi')) >= 0 && quantity(string(self)).compareTo(quantity('64Gi')) <= 0";
/// CEL: a CPU quantity within 1m and 64.
const CPU_RULE: &str = "isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('1m')) >= 0 && quantity(string(self)).compareTo(quantity('64')) <= 0";

/// Requests and limits of a mount daemon. Unset values take the node agent's defaults
/// (`--mount-cpu-request`, …; see `config/node.yaml`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.requests) || !has(self.limits) || !has(self.requests.memory) || !has(self.limits.memory) || !isQuantity(string(self.requests.memory)) || !isQuantity(string(self.limits.memory)) || quantity(string(self.requests.memory)).compareTo(quantity(string(self.limits.memory))) <= 0")
        .message("the memory request may not exceed the memory limit"),
    validation = Rule::new("!has(self.requests) || !has(self.limits) || !has(self.requests.cpu) || !has(self.limits.cpu) || !isQuantity(string(self.requests.cpu)) || !isQuantity(string(self.limits.cpu)) || quantity(string(self.requests.cpu)).compareTo(quantity(string(self.limits.cpu))) <= 0")
        .message("the CPU request may not exceed the CPU limit")
)]
pub struct MountResources {
    /// What the scheduler reserves for the daemon.
    #[serde(default, skip_serializing_if = "ResourceAmounts::is_empty")]
    pub requests: ResourceAmounts,
    /// What the daemon may use: past its memory limit the kernel OOM-kills it (an
    /// Event on the application Pods says so); the daemon sizes its caches to it.
    #[serde(default, skip_serializing_if = "ResourceAmounts::is_empty")]
    pub limits: ResourceAmounts,
}

/// CPU and memory amounts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceAmounts {
    /// CPU, from `1m` to `64` cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(CPU_RULE).message("cpu must be a quantity from 1m to 64"))]
    pub cpu: Option<Quantity>,
    /// Memory, from `16Mi` to `64Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(MEMORY_RULE).message("memory must be a quantity from 16Mi to 64Gi"))]
    pub memory: Option<Quantity>,
}

// Quantities compare as their strings, which is an equivalence.
impl Eq for ResourceAmounts {}
impl Eq for MountResources {}

impl ResourceAmounts {
    /// Neither amount set.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none()
    }
}

impl MountResources {
    /// Nothing set.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.limits.is_empty()
    }
}

/// A CPU amount that is not a quantity of millicores within the bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an amount of CPU from 1m to 64 (like 100m, 0.5 or 2)")]
pub struct CpuError(pub String);

/// Millicores in a CPU quantity (`100m`, `0.5`, `2`), within
/// [`MIN_MOUNT_MILLICPU`]..=[`MAX_MOUNT_MILLICPU`].
pub fn cpu_millis(q: &str) -> Result<u64, CpuError> {
    let err = || CpuError(q.to_string());
    let millis = if let Some(m) = q.strip_suffix('m') {
        if m.is_empty() || m.len() > 9 || !m.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        m.parse::<u64>().map_err(|_| err())?
    } else {
        let (whole, frac) = q.split_once('.').unwrap_or((q, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.len() > 6 || frac.len() > 3 || !digits(whole) || !digits(frac) {
            return Err(err());
        }
        if whole.is_empty() && frac.is_empty() {
            return Err(err());
        }
        let w: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| err())?
        };
        let f: u64 = format!("{frac:0<3}").parse().map_err(|_| err())?;
        w * 1000 + f
    };
    if !(MIN_MOUNT_MILLICPU..=MAX_MOUNT_MILLICPU).contains(&millis) {
        return Err(err());
    }
    Ok(millis)
}

/// Bytes in a memory quantity, within [`MIN_MOUNT_MEMORY`]..=[`MAX_MOUNT_MEMORY`]
/// (`None` when it is no quantity or out of bounds).
pub fn memory_bytes(q: &str) -> Option<u64> {
    super::quantity_bytes(q)
        .ok()
        .filter(|b| (MIN_MOUNT_MEMORY..=MAX_MOUNT_MEMORY).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_amounts() {
        for (q, want) in [
            ("100m", Some(100)),
            ("1m", Some(1)),
            ("0.5", Some(500)),
            (".25", Some(250)),
            ("2", Some(2000)),
            ("1.5", Some(1500)),
            ("64", Some(64_000)),
            ("64001m", None),
            ("65", None),
            ("0", None),
            ("0m", None),
            ("0.0001", None),
            ("", None),
            ("m", None),
            ("1.", Some(1000)),
            (".", None),
            ("-1", None),
            ("1e3", None),
            ("1 m", None),
            ("99999999999999999999m", None),
        ] {
            assert_eq!(cpu_millis(q).ok(), want, "{q:?}");
        }
    }

    #[test]
    fn memory_amounts() {
        assert_eq!(memory_bytes("16Mi"), Some(16 << 20));
        assert_eq!(memory_bytes("1Gi"), Some(1 << 30));
        assert_eq!(memory_bytes("64Gi"), Some(64 << 30));
        assert_eq!(memory_bytes("15Mi"), None);
        assert_eq!(memory_bytes("65Gi"), None);
        assert_eq!(memory_bytes("lots"), None);
    }
}
