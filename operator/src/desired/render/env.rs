//! The sidecar's environment variables, by where their value comes from.

use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector,
};

use crate::crd::KeyRef;

/// An environment variable from the Pod's own fields (the downward API).
pub(super) fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                api_version: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn literal_env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// Variable `name` from a Secret's key, which must exist: the value goes
/// from the Secret to the pod and never through the operator.
pub(super) fn secret_env(name: String, r: &KeyRef) -> EnvVar {
    EnvVar {
        name,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: r.name.clone(),
                key: r.key.clone(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Variable `name` from a ConfigMap's key, which must exist.
pub(super) fn config_map_env(name: String, r: &KeyRef) -> EnvVar {
    EnvVar {
        name,
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: r.name.clone(),
                key: r.key.clone(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
