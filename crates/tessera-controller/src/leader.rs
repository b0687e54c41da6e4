//! Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas of the
//! controller can run and exactly one of them acts.
//!
//! The holder renews the lease every `renew` interval; another candidate takes it over
//! only after `duration` has passed without a renewal, or at once when the holder
//! released it ([`Elector::release`], on a graceful stop: candidates watch the Lease).
//! Every write is a replace guarded by `resourceVersion`, so two candidates can never
//! both believe they won the same term. A leader that fails to renew before its own
//! lease runs out steps down (the caller stops acting and becomes a candidate again),
//! which keeps the "one decider" rule even across network splits and API server
//! restarts.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info, warn};

use tessera_runtime::backoff::ShortBackoff;
use tessera_runtime::error_chain;

/// Settings of the election.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This candidate's identity (pod name or hostname + pid).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub duration: Duration,
    /// How often the holder renews.
    pub renew: Duration,
}

/// Errors of the election.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused a read or write of the Lease.
    #[error("reading or writing Lease {namespace}/{name}")]
    Lease {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The leader could not renew before its lease ran out.
    #[error("lost the leadership of Lease {0}")]
    Lost(String),
}

/// A candidate for the lease.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
}

impl Elector {
    /// A candidate with the given settings.
    pub fn new(client: Client, cfg: LeaseConfig) -> Self {
        Elector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
        }
    }

    fn err(&self, source: kube::Error) -> Error {
        Error::Lease {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            source,
        }
    }

    /// Wait until this candidate holds the lease: try again every `renew` interval, and
    /// at once whenever the Lease changes (a release). Errors (an API server away) are
    /// retried.
    pub async fn acquire(&self) {
        let mut changes = watcher::watch_object(self.api.clone(), &self.cfg.name)
            .backoff(ShortBackoff::default())
            .boxed();
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    info!(lease = %self.cfg.name, identity = %self.cfg.identity, "became leader");
                    return;
                }
                Ok(false) => {}
                Err(e) => warn!(error = %error_chain(&e), "trying to acquire the lease failed"),
            }
            tokio::select! {
                _ = changes.next() => {}
                () = tokio::time::sleep(self.cfg.renew) => {}
            }
        }
    }

    /// Give the lease up (a graceful stop), so that another candidate takes over now
    /// rather than after `duration`: clear the holder, if it is still this one.
    pub async fn release(&self) -> Result<(), Error> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.cfg.name)
            .await
            .map_err(|e| self.err(e))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                info!(lease = %self.cfg.name, "released the lease");
                Ok(())
            }
            // Taken over meanwhile: nothing of ours to release.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Keep renewing; returns only when leadership is lost.
    pub async fn hold(&self) -> Error {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.cfg.renew).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => return Error::Lost(self.cfg.name.clone()),
                Err(e) => {
                    warn!(error = %e, "renewing the lease failed");
                    // Step down before another candidate may take over.
                    if last_renewal.elapsed() + self.cfg.renew >= self.cfg.duration {
                        return Error::Lost(self.cfg.name.clone());
                    }
                }
            }
        }
    }

    /// One attempt: true when this candidate holds the lease afterwards.
    async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = jiff::Timestamp::now();
        let duration_secs = self.cfg.duration.as_secs().max(1) as i32;
        let existing = self
            .api
            .get_opt(&self.cfg.name)
            .await
            .map_err(|e| self.err(e))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(self.err(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.cfg.identity;
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(MicroTime(renewed)), Some(secs)) => {
                now.duration_since(*renewed).as_secs_f64() > f64::from(secs)
            }
            _ => true,
        };
        if !ours && !holder.is_empty() && !expired {
            debug!(holder = %holder, "lease held by another candidate");
            return Ok(false);
        }
        if !ours {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(self.cfg.identity.clone());
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(duration_secs);
        // Replace is guarded by the resourceVersion we read: a concurrent winner makes
        // this fail with 409 instead of both holding the lease.
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }
}
