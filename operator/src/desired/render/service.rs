//! The tenant's Service (for clients, port 80 to the sidecar's HTTP port)
//! and the ServiceAccount its pods run as (no token mounted).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServiceAccount, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta;
use crate::desired::Inputs;
use crate::names::{workload, TENANT_LABEL};

pub(super) fn service(inputs: &Inputs<'_>, owner: &OwnerReference) -> Service {
    let tenant = inputs.tenant_name();
    Service {
        metadata: meta(workload(tenant), inputs, owner),
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(
                TENANT_LABEL.to_string(),
                tenant.to_string(),
            )])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn service_account(inputs: &Inputs<'_>, owner: &OwnerReference) -> ServiceAccount {
    let mut metadata = meta(workload(inputs.tenant_name()), inputs, owner);
    let annotations = inputs
        .tenant
        .spec
        .pod_overrides
        .as_ref()
        .map(|o| o.service_account_annotations.clone())
        .unwrap_or_default();
    metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    ServiceAccount {
        metadata,
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}
