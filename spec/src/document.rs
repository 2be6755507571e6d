//! The Kubernetes-style envelope around an [`AgentSpec`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::AgentSpec;

pub const API_VERSION: &str = "bindery.dev/v1alpha1";
pub const KIND: &str = "Agent";

/// `apiVersion: bindery.dev/v1alpha1`, `kind: Agent`, `metadata`, `spec`:
/// the same document `kubectl apply` takes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentDocument {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: AgentSpec,
}

/// The part of object metadata an agent file may carry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// YAML text as Kubernetes and JSON mean it: enums are one-key maps
/// (`{env: X}`), not YAML tags, which is what serde_yaml would write for
/// them on its own. Every YAML the project writes goes through here.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, String> {
    let json = serde_json::to_value(value).map_err(|e| e.to_string())?;
    serde_yaml::to_string(&json).map_err(|e| e.to_string())
}

/// The reverse of [`to_yaml`]: YAML read as a JSON value first.
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let json: serde_json::Value = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    serde_json::from_value(json).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ValueSource;

    #[test]
    fn enums_are_maps_both_ways() {
        let text = to_yaml(&ValueSource::Env("X".into())).unwrap();
        assert_eq!(text, "env: X\n");
        assert_eq!(
            from_yaml::<ValueSource>(&text).unwrap(),
            ValueSource::Env("X".into())
        );
    }
}
