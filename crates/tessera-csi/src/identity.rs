//! The CSI Identity service, served by both `tessera controller` and `tessera node`.

use tonic::{Request, Response, Status};

use tessera_api::CSI_DRIVER_NAME;

use super::proto::identity_server::Identity;
use super::proto::plugin_capability::{self, service, volume_expansion};
use super::proto::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};

/// Identity of the driver, the same on every instance.
///
/// CSI spec, GetPluginCapabilities: "All instances of the same version […] of the
/// Plugin SHALL return the same set of capabilities, regardless of both: (a) where
/// instances are deployed on the cluster as well as; (b) which RPCs an instance is
/// serving." So `tessera node`, which serves no Controller service, still reports
/// CONTROLLER_SERVICE: the driver as a whole has one (the external-provisioner and
/// external-attacher ask the controller's socket, csi-sanity asks the node's).
#[derive(Clone, Debug, Default)]
pub struct IdentityService;

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: CSI_DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let svc = |t: service::Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        let capabilities = vec![
            svc(service::Type::VolumeAccessibilityConstraints),
            svc(service::Type::ControllerService),
            PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(
                    plugin_capability::VolumeExpansion {
                        r#type: volume_expansion::Type::Online as i32,
                    },
                )),
            },
        ];
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_instance_reports_the_controller_service() {
        let caps = IdentityService
            .get_plugin_capabilities(Request::new(GetPluginCapabilitiesRequest {}))
            .await
            .unwrap()
            .into_inner()
            .capabilities;
        let services: Vec<i32> = caps
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
                _ => None,
            })
            .collect();
        assert!(services.contains(&(service::Type::ControllerService as i32)));
        assert!(services.contains(&(service::Type::VolumeAccessibilityConstraints as i32)));
    }
}
