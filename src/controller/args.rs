//! The command line of `tessera controller`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::labels::{Labels, parse_labels};

/// Command line of `tessera controller`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Address of the metrics and health endpoint.
    #[arg(long, env = "TESSERA_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Namespace of the leader-election Lease (and of nothing else).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "tessera-controller")]
    pub lease_name: String,
    /// This replica's identity in the election (default: hostname and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Run without leader election (only one replica must run).
    #[arg(long)]
    pub no_leader_election: bool,
    /// How long the Lease is valid without renewal: how long a killed leader (kill -9,
    /// a lost node) keeps the others waiting (`15s`, `500ms`, or seconds). A leader
    /// that stops gracefully releases the Lease at once.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// How often the leader renews the Lease, and how often a candidate looks again
    /// (it also watches the Lease); well below `--lease-duration`.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub lease_renew_interval: Duration,
    /// Only handle Volumes, VolumeAttachments and MountPods carrying these labels
    /// (`key=value[,key=value]`), for sharding or for tests sharing a cluster. The
    /// labels are copied onto the objects the controller creates.
    #[arg(long, value_parser = parse_labels)]
    pub watch_selector: Option<Labels>,
    /// How often the reaper looks for tickets nothing stands behind, in seconds.
    #[arg(long, default_value_t = 10)]
    pub reap_interval_seconds: u64,
    /// Serve the CSI Identity and Controller services on this unix socket
    /// (`unix:///csi/csi.sock` next to the sidecars).
    #[arg(long, env = "CSI_ENDPOINT")]
    pub csi_endpoint: Option<String>,
    /// Backend root of volumes whose StorageClass names none.
    #[arg(long, default_value = "/var/lib/tessera/volumes")]
    pub default_backend_root: String,
    /// How long ControllerPublishVolume waits for its ticket, in seconds (keep it below
    /// the external-attacher's --timeout, 15 s by default).
    #[arg(long, default_value_t = 10)]
    pub publish_timeout_seconds: u64,
    /// Capacity reported by GetCapacity: bytes or a Kubernetes quantity (`500Gi`, `1T`)
    /// (default: free space of the default backend root as the controller sees it).
    #[arg(long, value_parser = crate::api::quantity_bytes)]
    pub capacity_bytes: Option<u64>,
    /// How many Volumes each controller (the Volume one, the VolumeAttachment one)
    /// reconciles at once. Each reconcile in flight may hold a connection to the API
    /// server: unbounded, a burst of 1,000 new Volumes opened hundreds of them. The
    /// others wait in the queue, where the changes to one object fold into one
    /// reconcile.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_concurrent_reconciles: u16,
    /// How old a ticket must be before the reaper may remove it for a missing owner
    /// (storage.k8s.io VolumeAttachment or Node), in seconds: covers watch lag.
    #[arg(long, default_value_t = 30)]
    pub reap_grace_seconds: u64,
    /// The backend roots Volumes and StorageClasses may name (the node administrator's).
    #[command(flatten)]
    pub roots: crate::host::roots::RootArgs,
}

/// A duration: `500ms`, `15s`, or a number of seconds (`15`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = match s.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (s.strip_suffix('s').unwrap_or(s), 1.0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 500ms, 15s or 15"))?;
    if !value.is_finite() || value <= 0.0 || value * unit > 3600.0 {
        return Err(format!("{s:?} must be more than 0 and at most 1 hour"));
    }
    Ok(Duration::from_secs_f64(value * unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("15s", 15_000),
            ("15", 15_000),
            ("500ms", 500),
            ("1.5s", 1_500),
        ];
        for (s, ms) in ok {
            assert_eq!(parse_duration(s).map(|d| d.as_millis()), Ok(ms), "{s}");
        }
        for bad in ["", "s", "0", "-1s", "2h", "1e9", "abc", "NaN"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
