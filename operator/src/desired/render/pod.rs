//! The pod template: the sidecar (and the tenant's own containers), the
//! volumes, and the security context every tenant pod runs with. What goes
//! into the sidecar and its pod is gathered as [`Parts`], one per concern.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::crd::PodOverrides;
use crate::names::{labels, workload, CONFIG_HASH};

/// A piece of the sidecar and its pod: volumes, their mounts, the server's
/// arguments, ports and environment. Joined in order, the pieces give each
/// list in the order the pod spec lists it.
#[derive(Default)]
pub(super) struct Parts {
    pub volumes: Vec<Volume>,
    pub mounts: Vec<VolumeMount>,
    pub args: Vec<String>,
    pub ports: Vec<ContainerPort>,
    pub env: Vec<EnvVar>,
}

impl Parts {
    /// The pieces one after the other.
    pub(super) fn join(pieces: impl IntoIterator<Item = Parts>) -> Parts {
        let mut all = Parts::default();
        for p in pieces {
            all.volumes.extend(p.volumes);
            all.mounts.extend(p.mounts);
            all.args.extend(p.args);
            all.ports.extend(p.ports);
            all.env.extend(p.env);
        }
        all
    }
}

/// What the tenant's `podOverrides` add to the sidecar's pod: volumes and
/// environment (after the operator's own), the rest to the pod template.
pub(super) fn overrides_parts(overrides: &PodOverrides) -> Parts {
    Parts {
        volumes: overrides.volumes.clone(),
        env: overrides.env.clone(),
        ..Default::default()
    }
}

/// The pod template of the tenant's Deployment: the sidecar first, then the
/// tenant's own containers; `config_hash` rolls the pods when it changes.
pub(super) fn template(
    tenant: &str,
    sidecar: Container,
    volumes: Vec<Volume>,
    overrides: PodOverrides,
    config_hash: String,
) -> PodTemplateSpec {
    let mut containers = vec![sidecar];
    containers.extend(overrides.containers);
    let mut annotations: BTreeMap<String, String> = overrides.annotations;
    annotations.insert(CONFIG_HASH.into(), config_hash);
    // The operator's labels win: they are the Deployment's selector.
    let mut pod_labels = overrides.labels;
    pod_labels.extend(labels(tenant));
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(annotations),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(workload(tenant)),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                run_as_group: Some(65532),
                fs_group: Some(65532),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers,
            volumes: Some(volumes),
            tolerations: (!overrides.tolerations.is_empty()).then_some(overrides.tolerations),
            node_selector: (!overrides.node_selector.is_empty()).then_some(overrides.node_selector),
            ..Default::default()
        }),
    }
}
