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
