//! The owner reference the controller puts on what it creates for a Volume: its
//! VolumeAttachment (the volume controller) and its MountPods (the attachment
//! controller). A leaf both use, so neither imports the other for it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

use crate::api::Volume;

/// Controller owner reference to the Volume.
pub fn owner_reference(volume: &Volume) -> OwnerReference {
    volume
        .controller_owner_ref(&())
        .expect("a Volume read from the API has a uid")
}
