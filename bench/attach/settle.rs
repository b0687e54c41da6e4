//! Waiting, untimed, for Tessera's detach to finish after the storage.k8s.io
//! VolumeAttachment is gone: the attacher's view of a detach ends before Tessera's
//! (the MountPod's deletion, the daemon's unmount, the status writes), and a round
//! that starts meanwhile, Tessera's own next one or another contender's, shares the
//! machine and the API server with that tail.
//!
//! ```text
//!  VolumeAttachment gone ─▶ poll (10 ms): MountPod <volume>-<node hash> gone, and the
//!  Volume's status Detached with no mounted node ─▶ the next round
//! ```

use std::time::{Duration, Instant};

use kube::Client;
use kube::api::Api;

use tessera_api::{MountPod, Volume, VolumeState, mountpod_name};

/// Wait until `volume` has no MountPod on `node` and its status says it is detached
/// everywhere (at most `timeout`); how long that took, or `None` on timeout.
pub async fn detached(
    client: &Client,
    volume: &str,
    node: &str,
    timeout: Duration,
) -> Option<Duration> {
    let mps: Api<MountPod> = Api::all(client.clone());
    let volumes: Api<Volume> = Api::all(client.clone());
    let mp = mountpod_name(volume, node);
    let t0 = Instant::now();
    loop {
        let gone = matches!(mps.get_opt(&mp).await, Ok(None));
        let at_rest = gone
            && volumes
                .get_opt(volume)
                .await
                .ok()
                .flatten()
                .is_some_and(|v| {
                    v.status.is_some_and(|s| {
                        s.state == Some(VolumeState::Detached) && s.mounted_nodes.is_empty()
                    })
                });
        if at_rest {
            return Some(t0.elapsed());
        }
        if t0.elapsed() > timeout {
            eprintln!(
                "  warning: Tessera volume {volume} not detached {timeout:?} after its VolumeAttachment went"
            );
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
