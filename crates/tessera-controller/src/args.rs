//! The command line of `tessera controller`.

use std::net::SocketAddr;
use std::time::Duration;

use tessera_runtime::labels::{Labels, parse_labels};
use tessera_text::duration::parse_duration;

/// Command line of `tessera controller`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Address of the metrics and health endpoint.
    #[arg(long, env = "TESSERA_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Tessera's namespace: the leader-election Lease's and the nodes' liveness Leases'.
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
    /// a lost node) keeps the others waiting (`15s`, `500ms`, `1m` or seconds). A leader
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
    /// How often the reaper looks for tickets nothing stands behind (`10s`; the older
    /// `--reap-interval-seconds` still works).
    #[arg(long, default_value = "10s", value_parser = parse_duration, alias = "reap-interval-seconds")]
    pub reap_interval: Duration,
    /// Serve the CSI Identity and Controller services on this unix socket
    /// (`unix:///csi/csi.sock` next to the sidecars).
    #[arg(long, env = "CSI_ENDPOINT")]
    pub csi_endpoint: Option<String>,
    /// Backend root of volumes whose StorageClass names none.
    #[arg(long, default_value = "/var/lib/tessera/volumes")]
    pub default_backend_root: String,
    /// How long ControllerPublishVolume (and Unpublish) waits for its ticket (`10s`;
    /// keep it below the external-attacher's --timeout, 15 s by default; the older
    /// `--publish-timeout-seconds` still works).
    #[arg(long, default_value = "10s", value_parser = parse_duration, alias = "publish-timeout-seconds")]
    pub publish_timeout: Duration,
    /// Capacity reported by GetCapacity for every node and root: bytes or a Kubernetes
    /// quantity (`500Gi`, `1T`) (default: the free space each node reports on its
    /// liveness Lease).
    #[arg(long, value_parser = tessera_api::quantity_bytes)]
    pub capacity_bytes: Option<u64>,
    /// How many Volumes each controller (the Volume one, the VolumeAttachment one)
    /// reconciles at once. Each reconcile in flight may hold a connection to the API
    /// server: unbounded, a burst of 1,000 new Volumes opened hundreds of them. The
    /// others wait in the queue, where the changes to one object fold into one
    /// reconcile.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_concurrent_reconciles: u16,
    /// How old a ticket must be before the reaper may remove it for a missing owner
    /// (storage.k8s.io VolumeAttachment or Node): covers watch lag (`30s`; the older
    /// `--reap-grace-seconds` still works).
    #[arg(long, default_value = "30s", value_parser = parse_duration, alias = "reap-grace-seconds")]
    pub reap_grace: Duration,
    /// Fenced failover (docs/failover.md): what the controller waits beyond a node's
    /// fenceAfter (its liveness Lease's duration), on its own clock from the last
    /// change it saw, before it releases the node's tickets of volumes with
    /// `nodeFailover: Fenced`. Covers clock-rate drift and a write between its check
    /// and the backend.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub fence_margin: Duration,
    /// Fenced failover: taint a node whose liveness Lease went unrenewed for
    /// fenceAfter + margin while its kubelet still reports it Ready with
    /// `tessera.io/fenced:NoSchedule`, and release its tickets then, instead of after
    /// Kubernetes marks it not Ready; the taint goes when the node's agent renews
    /// again. Off by default (needs `patch` on Nodes).
    #[arg(long)]
    pub fence_taint: bool,
    /// The most nodes, in percent of the cluster's (rounded down, at least one of two
    /// or more), that carry the fence taint at once; beyond it a node waits for
    /// Kubernetes to mark it not Ready.
    #[arg(long, default_value_t = 34, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub fence_taint_max_percent: u8,
    /// The backend roots Volumes and StorageClasses may name (the node administrator's).
    #[command(flatten)]
    pub roots: tessera_host::roots::RootArgs,
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        controller: ControllerArgs,
    }

    #[test]
    fn durations_take_one_syntax_and_the_old_flags_still_work() {
        let c = Cli::try_parse_from(["t"]).unwrap().controller;
        assert_eq!(c.reap_interval, Duration::from_secs(10));
        assert_eq!(c.publish_timeout, Duration::from_secs(10));
        assert_eq!(c.reap_grace, Duration::from_secs(30));
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        let c = Cli::try_parse_from([
            "t",
            "--reap-interval=500ms",
            "--publish-timeout=1m",
            "--reap-grace=2s",
        ])
        .unwrap()
        .controller;
        assert_eq!(c.reap_interval, Duration::from_millis(500));
        assert_eq!(c.publish_timeout, Duration::from_secs(60));
        assert_eq!(c.reap_grace, Duration::from_secs(2));
        let c = Cli::try_parse_from([
            "t",
            "--reap-interval-seconds=1",
            "--publish-timeout-seconds",
            "7",
            "--reap-grace-seconds=3600",
        ])
        .unwrap()
        .controller;
        assert_eq!(c.reap_interval, Duration::from_secs(1));
        assert_eq!(c.publish_timeout, Duration::from_secs(7));
        assert_eq!(c.reap_grace, Duration::from_secs(3600));
        assert!(Cli::try_parse_from(["t", "--reap-grace=0"]).is_err());
    }
}
