//! What lets a tenant's pods post Warning Events on it and write its
//! budgets' use to its status: a token of the pod's ServiceAccount, the CA
//! and namespace (mounted), and a Role allowing that and nothing else.
//!
//! An approval notice that fails for good, or a budget used up, is a
//! Warning Event on the tenant, which the sidecar posts itself; and a
//! tenant with budgets has their use in its status (`status.budgets`),
//! which the sidecar writes too. A tenant with neither a webhook nor a
//! budget gets no token at all (the account's and the pod's
//! automountServiceAccountToken stay false either way).

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
    ObjectFieldSelector, ProjectedVolumeSource, ServiceAccountTokenProjection, Volume,
    VolumeProjection,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::env::{field_env, literal_env};
use super::pod::Parts;
use super::{meta, mount, EventsAccess};
use crate::desired::Inputs;
use crate::names::{workload, EVENTS_DIR, ROOT_CA_CONFIG_MAP};

/// The token, CA and namespace mounted at `EVENTS_DIR`, and what the
/// sidecar needs to know of its tenant and pod.
pub(super) fn events_parts(inputs: &Inputs<'_>) -> Parts {
    let volume = Volume {
        name: "events".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(3600),
                        audience: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: ROOT_CA_CONFIG_MAP.into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.namespace".into(),
                                api_version: None,
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
            default_mode: None,
        }),
        ..Default::default()
    };
    Parts {
        volumes: vec![volume],
        mounts: vec![mount("events", EVENTS_DIR, true)],
        env: vec![
            literal_env("BINDERY_EVENTS_DIR", EVENTS_DIR),
            literal_env("BINDERY_TENANT", inputs.tenant_name()),
            literal_env(
                "BINDERY_TENANT_UID",
                inputs.tenant.metadata.uid.clone().unwrap_or_default(),
            ),
            field_env("POD_NAME", "metadata.name"),
        ],
        ..Default::default()
    }
}

/// The tenant's Role to create Events and, with `budgets`, to write its
/// own status, bound to its ServiceAccount.
pub(super) fn events_rbac(
    inputs: &Inputs<'_>,
    owner: &OwnerReference,
    budgets: bool,
) -> EventsAccess {
    let tenant = inputs.tenant_name();
    let mut rules = vec![PolicyRule {
        api_groups: Some(vec!["events.k8s.io".into()]),
        resources: Some(vec!["events".into()]),
        verbs: vec!["create".into()],
        ..Default::default()
    }];
    if budgets {
        // The sidecar applies `status.budgets` server-side (a patch) and
        // may read what it last wrote (a get); of this tenant only.
        rules.push(PolicyRule {
            api_groups: Some(vec!["bindery.dev".into()]),
            resources: Some(vec!["agenttenants/status".into()]),
            resource_names: Some(vec![tenant.to_string()]),
            verbs: vec!["get".into(), "patch".into()],
            ..Default::default()
        });
    }
    let role = Role {
        metadata: meta(workload(tenant), inputs, owner),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: meta(workload(tenant), inputs, owner),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: workload(tenant),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: workload(tenant),
            namespace: inputs.tenant.metadata.namespace.clone(),
            api_group: None,
        }]),
    };
    EventsAccess { role, binding }
}
