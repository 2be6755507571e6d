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

/// Why a document could not be written as YAML or read from it; the text
/// is the parser's, which names the line or field.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// Not YAML (or a value YAML cannot hold).
    #[error("{0}")]
    Yaml(#[from] serde_yaml::Error),
    /// YAML, but not the shape expected (a field missing, a wrong type).
    #[error("{0}")]
    Shape(#[from] serde_json::Error),
}

/// YAML text as Kubernetes and JSON mean it: enums are one-key maps
/// (`{env: X}`), not YAML tags, which is what serde_yaml would write for
/// them on its own. Every YAML the project writes goes through here.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, YamlError> {
    let json = serde_json::to_value(value)?;
    Ok(serde_yaml::to_string(&json)?)
}

/// The reverse of [`to_yaml`]: YAML read as a JSON value first.
pub fn from_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let json: serde_json::Value = serde_yaml::from_str(text)?;
    Ok(serde_json::from_value(json)?)
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

    #[test]
    fn text_that_is_not_yaml_and_yaml_of_another_shape_are_told_apart() {
        let broken = from_yaml::<ValueSource>("{env: [");
        assert!(matches!(broken, Err(YamlError::Yaml(_))), "{broken:?}");
        let other = from_yaml::<ValueSource>("{nope: X}");
        assert!(matches!(other, Err(YamlError::Shape(_))), "{other:?}");
        assert!(other.unwrap_err().to_string().contains("nope"));
    }
}
