//! The tenant's Deployment of its pod template.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};

use super::meta;
use crate::desired::Inputs;
use crate::names::{workload, TENANT_LABEL};

/// `claimed`: the sessions are a SQLite file on a claim.
pub(super) fn deployment(
    inputs: &Inputs<'_>,
    owner: &OwnerReference,
    template: PodTemplateSpec,
    claimed: bool,
) -> Deployment {
    let tenant = inputs.tenant_name();
    Deployment {
        metadata: meta(workload(tenant), inputs, owner),
        spec: Some(DeploymentSpec {
            replicas: Some(inputs.tenant.spec.replicas.unwrap_or(1)),
            // A SQLite file on a claim is one pod's: a rolling update would
            // start the new pod while the old one holds the volume (on
            // another node it never attaches, and the rollout stalls; on
            // the same one two servers would share the file). The old pod
            // goes first.
            strategy: claimed.then(|| DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..Default::default()
            }),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    TENANT_LABEL.to_string(),
                    tenant.to_string(),
                )])),
                ..Default::default()
            },
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}
