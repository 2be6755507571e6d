//! The `Agent` custom resource: `spec` is [`AgentSpec`](super::AgentSpec)
//! itself; this module adds its status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the operator found when it checked the definition.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Valid`: the static checks passed (reason and message otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The tools whose calls wait for a person (`confirm …`) or the client
    /// (`deferred …`), as the definition selects them, for `kubectl describe`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_tools: Vec<String>,
}
