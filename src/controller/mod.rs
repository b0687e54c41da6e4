//! `tessera controller`: the Volume, VolumeAttachment and reaper controllers.
//!
//! ```text
//!  Volume ──▶ volume::reconcile ──▶ creates the VolumeAttachment (owned, same name);
//!                                   on delete: adds a cleanup ticket, waits, lets go
//!  VolumeAttachment ─┐
//!  Volume ───────────┼─▶ attachment::reconcile ──▶ tickets::decide (pure)
//!  MountPod ─────────┘        │ MountPods created/deleted per the decision
//!                             │ ticket statuses + Volume status written (SSA, status only)
//!  Node, storage VA, clock ─▶ reaper ──▶ removes tickets nothing stands behind (+ Event)
//! ```
//!
//! Everything is level-triggered: a reconcile reads the current objects, decides, and
//! writes only what differs, so killing the process at any point and starting it again
//! converges to the same state. One replica acts at a time (leader election on a
//! Lease). All writes use one field manager, [`FIELD_MANAGER`]; tickets are upserted
//! with merge patches (never server-side apply), so Tessera never takes ownership of,
//! or removes, a ticket that a GitOps tool applied.

pub mod attachment;
pub mod leader;
pub mod reaper;
pub mod recent;
pub mod volume;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tracing::{debug, error, info, warn};

use crate::api::{MountPod, Volume, VolumeAttachment};
use crate::metrics::Metrics;

/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "tessera-controller";
/// Finalizer on Volumes: the data is removed (through a cleanup ticket) before the
/// Volume goes.
pub const VOLUME_FINALIZER: &str = "tessera.io/volume-data";
/// Annotation on a Volume: `Retain` keeps the data when the Volume is deleted.
pub const ANNOTATION_RECLAIM: &str = "tessera.io/reclaim-policy";

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
    /// Capacity reported by GetCapacity, in bytes (default: free space of the default
    /// backend root as the controller sees it).
    #[arg(long)]
    pub capacity_bytes: Option<u64>,
    /// How old a ticket must be before the reaper may remove it for a missing owner
    /// (storage.k8s.io VolumeAttachment or Node), in seconds: covers watch lag.
    #[arg(long, default_value_t = 30)]
    pub reap_grace_seconds: u64,
}

pub use crate::labels::Labels;
use crate::labels::parse_labels;

/// Errors of the controllers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{action}")]
    Kube {
        /// What was being done.
        action: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The Volume's spec cannot be served (for example its size does not parse).
    #[error("volume {volume}: {message}")]
    InvalidVolume {
        /// The Volume.
        volume: String,
        /// What is wrong.
        message: String,
    },
    /// Leader election failed.
    #[error(transparent)]
    Leader(#[from] leader::Error),
    /// The metrics endpoint could not start.
    #[error("serving metrics on {addr}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The CSI socket could not be served.
    #[error(transparent)]
    Csi(#[from] crate::csi::ServeError),
    /// No client configuration.
    #[error("connecting to Kubernetes")]
    Connect(#[source] kube::Error),
}

/// Attach a description of the action to a kube error.
pub(crate) trait KubeContext<T> {
    fn context(self, action: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> KubeContext<T> for Result<T, kube::Error> {
    fn context(self, action: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::Kube {
            action: action(),
            source,
        })
    }
}

/// What every reconcile needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Metrics (reconciles, errors, durations, writes, ticket latency).
    pub metrics: Arc<Metrics>,
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
    /// Cache of Volumes (from the volume controller's watch).
    pub volumes: Store<Volume>,
    /// Cache of VolumeAttachments (from the attachment controller's watch).
    pub attachments: Store<VolumeAttachment>,
    /// Cache of MountPods.
    pub mountpods: Store<MountPod>,
    /// Labels copied onto created objects (the watch selector).
    pub labels: Labels,
    /// Reaper settings.
    pub reap_grace: Duration,
    /// One flag per cache, set once it has had its first full list.
    pub caches_ready: [Arc<std::sync::atomic::AtomicBool>; 3],
    /// Volumes as this controller last wrote them, until the caches catch up.
    pub recent_volumes: recent::Recent<Volume>,
    /// VolumeAttachments as this controller last wrote them.
    pub recent_attachments: recent::Recent<VolumeAttachment>,
    /// MountPods as this controller last wrote (or deleted) them.
    pub recent_mountpods: recent::Recent<MountPod>,
}

/// Run one watch of a kind into `writer` (the cache) and hand every touched object to
/// each of `outputs` consumers, so two controllers share one watch. `ready` is set when
/// the first full list has reached the cache.
fn fan_out<K>(
    api: Api<K>,
    wc: watcher::Config,
    writer: reflector::store::Writer<K>,
    ready: Arc<std::sync::atomic::AtomicBool>,
    outputs: usize,
) -> (
    impl std::future::Future<Output = ()>,
    Vec<tokio_stream::wrappers::UnboundedReceiverStream<Result<K, watcher::Error>>>,
)
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..outputs)
        .map(|_| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            (tx, tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        })
        .unzip();
    let kind = K::kind(&Default::default()).to_string();
    let run = async move {
        let mut events = reflector(writer, watcher(api, wc).default_backoff()).boxed();
        while let Some(event) = events.next().await {
            let obj = match event {
                Ok(
                    watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o),
                ) => o,
                Ok(watcher::Event::InitDone) => {
                    ready.store(true, std::sync::atomic::Ordering::Release);
                    debug!(%kind, "cache ready");
                    continue;
                }
                Ok(watcher::Event::Init) => continue,
                Err(e) => {
                    warn!(%kind, error = %e, "watch failed; retrying");
                    continue;
                }
            };
            for tx in &txs {
                let _ = tx.send(Ok(obj.clone()));
            }
        }
    };
    (run, rxs)
}

impl Context {
    /// Whether every cache has had its first full list, so no decision is taken on an
    /// empty cache. Callers requeue when not. (Flags set by the watches themselves —
    /// see [`fan_out`] — because a store's readiness wakes only one waiter, and each
    /// controller already waits on its own store.)
    pub(crate) async fn caches_ready(&self) -> bool {
        self.caches_ready
            .iter()
            .all(|r| r.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// Run the controller role until a signal or a lost election.
pub async fn run(args: ControllerArgs) -> Result<(), Error> {
    let client = Client::try_default().await.map_err(Error::Connect)?;
    let metrics = Arc::new(Metrics::new());
    let addr = crate::metrics::serve(args.metrics_addr, metrics.clone())
        .await
        .map_err(|source| Error::Metrics {
            addr: args.metrics_addr,
            source,
        })?;
    info!(%addr, "metrics endpoint listening");

    if let Some(endpoint) = &args.csi_endpoint {
        let path = crate::csi::endpoint_path(endpoint);
        let listener = crate::csi::bind_unix(&path)?;
        let service = crate::csi::controller::ControllerService::new(
            client.clone(),
            crate::csi::controller::Settings {
                default_backend_root: args.default_backend_root.clone(),
                publish_timeout: Duration::from_secs(args.publish_timeout_seconds),
                unpublish_timeout: Duration::from_secs(args.publish_timeout_seconds),
                capacity_bytes: args.capacity_bytes,
                labels: args.watch_selector.clone().unwrap_or_default(),
            },
        );
        info!(socket = %path.display(), "serving CSI identity and controller");
        tokio::spawn(async move {
            let res = tonic::transport::Server::builder()
                .add_service(crate::csi::proto::identity_server::IdentityServer::new(
                    crate::csi::identity::IdentityService { controller: true },
                ))
                .add_service(crate::csi::proto::controller_server::ControllerServer::new(
                    service,
                ))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await;
            if let Err(e) = res {
                error!(error = %e, "CSI server stopped");
            }
        });
    }

    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let elector = (!args.no_leader_election).then(|| {
        leader::Elector::new(
            client.clone(),
            leader::LeaseConfig {
                namespace: args.namespace.clone(),
                name: args.lease_name.clone(),
                identity: identity.clone(),
                duration: Duration::from_secs(15),
                renew: Duration::from_secs(2),
            },
        )
    });
    if let Some(elector) = &elector {
        info!(lease = %args.lease_name, %identity, "waiting for leadership");
        elector.acquire().await?;
    }

    let run = run_controllers(client, metrics.clone(), &args, identity);
    tokio::select! {
        () = run => Ok(()),
        err = async {
            match &elector {
                Some(e) => e.hold().await,
                None => std::future::pending().await,
            }
        } => {
            error!(error = %err, "stepping down");
            Err(err.into())
        }
        _ = tokio::signal::ctrl_c() => { info!("interrupted"); Ok(()) }
    }
}

async fn run_controllers(
    client: Client,
    metrics: Arc<Metrics>,
    args: &ControllerArgs,
    identity: String,
) {
    let labels = args.watch_selector.clone().unwrap_or_default();
    let wc = if labels.0.is_empty() {
        watcher::Config::default()
    } else {
        watcher::Config::default().labels(&labels.selector())
    };
    let volumes: Api<Volume> = Api::all(client.clone());
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let mountpods: Api<MountPod> = Api::all(client.clone());

    // One watch per kind. Each fills the cache the reconcilers read and fans the
    // objects out to the controllers it triggers: Volumes trigger both controllers,
    // VolumeAttachments both (the volume controller keeps each Volume's attachment),
    // MountPods the attachment controller.
    let ready: [Arc<std::sync::atomic::AtomicBool>; 3] = Default::default();
    let (volume_store, volume_writer) = reflector::store();
    let (volume_watch, mut volume_streams) =
        fan_out(volumes, wc.clone(), volume_writer, ready[0].clone(), 2);
    let (va_store, va_writer) = reflector::store();
    let (va_watch, mut va_streams) =
        fan_out(attachments, wc.clone(), va_writer, ready[1].clone(), 2);
    let (mp_store, mp_writer) = reflector::store();
    let (mp_watch, mut mp_streams) = fan_out(mountpods, wc, mp_writer, ready[2].clone(), 1);

    // A VolumeAttachment has its Volume's name; a MountPod names its volume.
    let volume_ctrl = Controller::for_stream(volume_streams.remove(0), volume_store.clone())
        .watches_stream(va_streams.remove(0), |va: VolumeAttachment| {
            va.metadata.name.map(|n| ObjectRef::new(&n))
        });
    let attachment_ctrl = Controller::for_stream(va_streams.remove(0), va_store.clone())
        .watches_stream(mp_streams.remove(0), |mp: MountPod| {
            Some(ObjectRef::new(&mp.spec.volume))
        })
        .watches_stream(volume_streams.remove(0), |v: Volume| {
            v.metadata.name.map(|n| ObjectRef::new(&n))
        });

    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(identity),
            },
        ),
        client,
        metrics: metrics.clone(),
        volumes: volume_store,
        attachments: va_store,
        mountpods: mp_store,
        labels,
        reap_grace: Duration::from_secs(args.reap_grace_seconds),
        caches_ready: ready,
        recent_volumes: Default::default(),
        recent_attachments: Default::default(),
        recent_mountpods: Default::default(),
    });
    metrics.set_ready(true);

    let volume_run = volume_ctrl
        .run(volume::reconcile, volume::error_policy, ctx.clone())
        .for_each(|res| async move {
            if let Err(e) = res {
                log_run_error("volume", &e);
            }
        });
    let attachment_run = attachment_ctrl
        .run(attachment::reconcile, attachment::error_policy, ctx.clone())
        .for_each(|res| async move {
            if let Err(e) = res {
                log_run_error("attachment", &e);
            }
        });
    let reaper_run = reaper::run(ctx.clone(), Duration::from_secs(args.reap_interval_seconds));
    tokio::join!(
        volume_watch,
        va_watch,
        mp_watch,
        volume_run,
        attachment_run,
        reaper_run
    );
}

/// Whether a controller's error is expected in normal operation: a reconcile that a
/// related object's event asked for, of an object not (yet, or no longer) in the store,
/// e.g. a new Volume's VolumeAttachment before it is created, or either after deletion.
fn expected_run_error<R, Q>(e: &kube::runtime::controller::Error<R, Q>) -> bool {
    matches!(e, kube::runtime::controller::Error::ObjectNotFound(_))
}

/// Log a controller's error: expected ones at debug, every other one as a warning.
fn log_run_error<R, Q>(controller: &str, e: &kube::runtime::controller::Error<R, Q>)
where
    kube::runtime::controller::Error<R, Q>: std::fmt::Display,
{
    if expected_run_error(e) {
        debug!(error = %e, "{controller} controller");
    } else {
        warn!(error = %e, "{controller} controller");
    }
}

/// Time a reconcile and count it.
pub(crate) async fn measured<F, T>(metrics: &Metrics, controller: &str, fut: F) -> Result<T, Error>
where
    F: std::future::Future<Output = Result<T, Error>>,
{
    let start = Instant::now();
    let res = fut.await;
    metrics.reconciled(controller, start.elapsed(), res.is_err());
    res
}

/// Parameters of a merge or JSON patch by the controller (field manager set, so
/// `managedFields` tells who wrote what).
pub(crate) fn merge_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::controller::Error as RunError;

    #[test]
    fn a_reconcile_of_an_object_not_in_the_store_is_expected() {
        let missing: RunError<Error, std::io::Error> =
            RunError::ObjectNotFound(Box::new(ObjectRef::<Volume>::new("v").erase()));
        assert!(expected_run_error(&missing));
        let failed: RunError<std::io::Error, std::io::Error> = RunError::ReconcilerFailed(
            std::io::Error::other("boom"),
            Box::new(ObjectRef::<Volume>::new("v").erase()),
        );
        assert!(!expected_run_error(&failed));
        let queue: RunError<Error, std::io::Error> =
            RunError::QueueError(std::io::Error::other("watch failed"));
        assert!(!expected_run_error(&queue));
    }
}
