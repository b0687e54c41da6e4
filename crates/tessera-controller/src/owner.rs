//! The owner reference the controller puts on what it creates for a Volume: its
//! VolumeAttachment (the volume controller) and its MountPods (the attachment
//! controller), and whether an object is a previous Volume's of the same name. A leaf
//! both use, so neither imports the other for it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use tessera_api::Volume;

/// Controller owner reference to the Volume.
pub fn owner_reference(volume: &Volume) -> OwnerReference {
    volume
        .controller_owner_ref(&())
        .expect("a Volume read from the API has a uid")
}

/// Whether `object` (a VolumeAttachment or MountPod) belongs to a previous Volume of
/// `volume`'s name: a Volume deleted and made again under the same name, whose
/// objects the garbage collector has not removed yet. Its tickets are not this
/// Volume's: a `cleanup-data` ticket carried over would remove the new Volume's data.
/// An object no Volume owns (applied before its Volume, say by GitOps) is not.
pub fn of_previous_volume<K: Resource>(object: &K, volume: &Volume) -> bool {
    let Some(uid) = volume.uid() else {
        return false;
    };
    object
        .owner_references()
        .iter()
        .any(|o| o.kind == "Volume" && o.name == volume.name_any() && o.uid != uid)
}

#[cfg(test)]
mod tests {
    use tessera_api::VolumeAttachment;

    use super::*;

    #[test]
    fn a_previous_volumes_object_is_told_from_this_ones_and_from_an_unowned_one() {
        let volume = |uid: Option<&str>| {
            let mut v: Volume = serde_json::from_value(serde_json::json!({
                "apiVersion": "tessera.io/v1alpha1", "kind": "Volume",
                "metadata": {"name": "v"},
                "spec": {"size": "1Gi", "accessMode": "ReadWriteOnce", "backend": {"root": "/srv"}}
            }))
            .unwrap();
            v.metadata.uid = uid.map(str::to_string);
            v
        };
        let va = |owner: Option<(&str, &str, &str)>| {
            let mut va = VolumeAttachment::new("v", Default::default());
            va.metadata.owner_references = owner.map(|(kind, name, uid)| {
                vec![OwnerReference {
                    api_version: "tessera.io/v1alpha1".into(),
                    kind: kind.into(),
                    name: name.into(),
                    uid: uid.into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            });
            va
        };
        let now = volume(Some("new"));
        assert!(of_previous_volume(&va(Some(("Volume", "v", "old"))), &now));
        assert!(!of_previous_volume(&va(Some(("Volume", "v", "new"))), &now));
        assert!(
            !of_previous_volume(&va(None), &now),
            "GitOps, before its Volume"
        );
        assert!(!of_previous_volume(&va(Some(("Pod", "v", "old"))), &now));
        assert!(!of_previous_volume(&va(Some(("Volume", "w", "old"))), &now));
        assert!(!of_previous_volume(
            &va(Some(("Volume", "v", "old"))),
            &volume(None)
        ));
    }
}
