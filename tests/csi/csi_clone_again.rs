//! A clone of a volume made again under a deleted one's name (csi-sanity does this:
//! its "source" volume has the same name in every test). The new Volume exists while
//! the old one's VolumeAttachment, with the old cleanup ticket satisfied on the node,
//! is still there for a moment; a clone that took it for the source's put its source
//! ticket on it and failed NOT_FOUND when the controller replaced it (CI, 2026-12-07).

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use tessera_api::{CLEANUP_TICKET, Volume, VolumeAttachment};
use tessera_csi_proto::volume_content_source::{Type, VolumeSource};
use tessera_csi_proto::*;

use crate::support;
use support::csi::create;
use support::env::CsiEnv;

#[tokio::test]
async fn a_clone_of_a_volume_made_again_under_its_name_is_made() {
    let env = CsiEnv::builder("csiagain", 1, Duration::from_secs(30))
        .csinodes()
        .agents(1)
        .default_backend_root()
        .start()
        .await;
    let (client, id, node) = (env.client.clone(), env.id.clone(), env.nodes[0].clone());
    let mut ctrl = env.csi();
    let volumes: Api<Volume> = Api::all(client.clone());
    const G: i64 = 1 << 30;
    let source = format!("{id}-source");
    let topology = || {
        Some(TopologyRequirement {
            requisite: vec![],
            preferred: vec![Topology {
                segments: [(tessera_api::TOPOLOGY_NODE_KEY.to_string(), node.clone())].into(),
            }],
        })
    };
    for round in 0..5 {
        let mut req = create(&source, G, None);
        req.accessibility_requirements = topology();
        let made = ctrl.create_volume(req).await.unwrap().into_inner();
        let volume_id = made.volume.unwrap().volume_id;
        ctrl.delete_volume(DeleteVolumeRequest {
            volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
        // The same name again at once, as csi-sanity's next test does, then its clone.
        let mut req = create(&source, G, None);
        req.accessibility_requirements = topology();
        let again = ctrl
            .create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let clone = format!("{id}-clone-{round}");
        let mut req = create(
            &clone,
            G,
            Some(Type::Volume(VolumeSource {
                volume_id: again.volume_id.clone(),
            })),
        );
        req.accessibility_requirements = topology();
        let cloned = ctrl
            .create_volume(req)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the clone of {source} made again: {e:?}"))
            .into_inner()
            .volume
            .unwrap();
        // Nothing removed the new Volume's data: the deleted one's cleanup ticket,
        // on its VolumeAttachment not yet collected, was once taken for the new one's.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let uid = volumes.get(&again.volume_id).await.unwrap().uid().unwrap();
        let removing = Api::<Event>::all(client.clone())
            .list(
                &ListParams::default()
                    .fields(&format!("involvedObject.uid={uid},reason=RemovingData")),
            )
            .await
            .unwrap();
        assert!(
            removing.items.is_empty(),
            "round {round}: the data of {} made again was removed: {:?}",
            again.volume_id,
            removing
                .items
                .iter()
                .map(|e| &e.message)
                .collect::<Vec<_>>()
        );
        // The source made again is the new Volume's alone: the deleted one's
        // VolumeAttachment, with its cleanup-data ticket, must not have been taken
        // over (the cleanup would remove the new Volume's data once nothing else
        // holds it).
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let volume = volumes.get(&again.volume_id).await.unwrap();
        let va = vas.get(&again.volume_id).await.unwrap();
        assert!(
            !va.spec.attachment_tickets.contains_key(CLEANUP_TICKET),
            "round {round}: the new {} carries the deleted one's cleanup ticket: {:?}",
            again.volume_id,
            va.spec.attachment_tickets.keys().collect::<Vec<_>>()
        );
        assert!(
            va.owner_references()
                .iter()
                .all(|o| Some(&o.uid) == volume.metadata.uid.as_ref()),
            "round {round}: owners {:?}",
            va.owner_references()
        );
        for volume_id in [cloned.volume_id, again.volume_id] {
            ctrl.delete_volume(DeleteVolumeRequest {
                volume_id,
                ..Default::default()
            })
            .await
            .unwrap();
        }
    }
}
