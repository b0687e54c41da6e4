//! A publish's wait, once its ticket is written: until the service's MountPod watch
//! shows the ticket's node's mount decided and on its way ([`super::grant`]), or the
//! VolumeAttachment says the ticket is satisfied (a mount there before the ticket),
//! bounded by the publish timeout; past it, the ticket's reason as the error.

use kube::api::{Api, ListParams};
use tracing::{debug, warn};

use tessera_api::{self as api, AccessMode, MountPod, TicketReason, VolumeAttachment};
use tessera_runtime::KubeContext;

use super::error::Error;
use super::{ControllerService, grant};
use crate::mountpods::MountPodWatch;
use crate::proto::ControllerPublishVolumeResponse;

/// What a publish waits for.
pub(super) struct Publish<'a> {
    pub volume: &'a str,
    pub node: &'a str,
    /// The ticket's id.
    pub id: &'a str,
    pub mode: AccessMode,
    pub read_only: bool,
    /// Whether this call wrote the ticket (else it was in place).
    pub wrote: bool,
}

impl ControllerService {
    /// Wait until the publish `p` of the ticket in `current` (the VolumeAttachment as
    /// read or written) is granted or satisfied, at most the publish timeout.
    pub(super) async fn wait_granted(
        &self,
        p: Publish<'_>,
        current: VolumeAttachment,
    ) -> Result<ControllerPublishVolumeResponse, Error> {
        let Publish {
            volume,
            node,
            id,
            mode,
            read_only,
            wrote,
        } = p;
        let mp_name = api::mountpod_name(volume, node);
        let generation = current
            .spec
            .attachment_tickets
            .get(id)
            .map(|t| t.generation);
        // What the watch held for the node when the ticket was written (this call's
        // write, or a call before it in this process); any MountPod once the status
        // says the ticket is chosen; `None`: the status alone answers.
        let wanted_before = match (grant::decided(&current, id), wrote, generation) {
            (true, _, _) => Some(None),
            (false, true, Some(generation)) => {
                let held = self.mountpods.uid_held(&mp_name);
                if let Some(before) = &held {
                    self.written_before.record(id, generation, before.clone());
                }
                held
            }
            (false, false, Some(generation)) => self.written_before.get(id, generation),
            (false, _, None) => None,
        };
        let mounted = async {
            let Some(before) = wanted_before else {
                return std::future::pending().await;
            };
            let wanted = grant::Wanted {
                mode,
                read_only,
                before: before.as_deref(),
            };
            let cond = |w: &MountPodWatch| {
                grant::granted(&wanted, w.get(&mp_name).as_deref(), || {
                    w.others(volume, node)
                })
            };
            if self.mountpods.wait_for(&mp_name, cond).await.is_none() {
                // The watch has not listed yet: the status alone answers.
                return std::future::pending().await;
            }
            // A single-node volume: asked once more of the API server, as a
            // satisfaction is re-checked (a deposed leader's late write would show
            // here). Not alone: the status alone answers.
            if !mode.is_multi_node() {
                match self.mountpods_elsewhere(volume, node).await? {
                    0 => {}
                    n => {
                        warn!(ticket = %id, others = n, "MountPods of the volume on other nodes; waiting for the ticket's status");
                        return std::future::pending().await;
                    }
                }
            }
            Ok("granted")
        };
        // Watch from the version just read or written: no list round trip before the
        // watch, and no change after it can be missed. One watch of the
        // VolumeAttachment for every publish waiting on it.
        let satisfied = self.watches.wait(current, {
            let id = id.to_string();
            move |va: Option<&VolumeAttachment>| va.is_some_and(|va| va.ticket_satisfied(&id))
        });
        let wait = async {
            tokio::select! {
                r = mounted => r,
                r = satisfied => r.map(|_| "satisfied").map_err(Error::from),
            }
        };
        match tokio::time::timeout(self.settings.publish_timeout, wait).await {
            Ok(res) => {
                let how = res?;
                debug!(ticket = %id, how, "published");
                let ctx = [("tessera.io/mountpod".to_string(), mp_name)].into();
                Ok(ControllerPublishVolumeResponse {
                    publish_context: ctx,
                })
            }
            Err(_) => {
                let va = self
                    .attachments()
                    .get(volume)
                    .await
                    .context(|| format!("reading VolumeAttachment {volume}"))?;
                let (reason, message) = va
                    .ticket_status(id)
                    .and_then(|s| s.blocked_by())
                    .map(|(reason, message)| (reason, message.to_owned()))
                    .unwrap_or((TicketReason::Attaching, "waiting for the controller".into()));
                warn!(ticket = %id, %reason, "publish not done in time");
                Err(Error::NotSatisfied {
                    ticket: id.to_string(),
                    reason,
                    message,
                })
            }
        }
    }

    /// How many MountPods of `volume` on nodes other than `node` the API server holds
    /// (one list by the volume's label: a consistent read).
    async fn mountpods_elsewhere(&self, volume: &str, node: &str) -> Result<usize, Error> {
        let lp = ListParams::default().labels(&format!("{}={volume}", api::LABEL_VOLUME));
        let list = Api::<MountPod>::all(self.client.clone())
            .list(&lp)
            .await
            .context(|| format!("listing the MountPods of {volume}"))?;
        Ok(list
            .items
            .iter()
            .filter(|m| m.spec.volume == volume && m.spec.node_name != node)
            .count())
    }
}
