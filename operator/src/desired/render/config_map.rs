//! The tenant's ConfigMap: one file per agent of the tree and the params
//! file of the non-secret values. Secret and referenced values become
//! environment variables instead ([`Parameters`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, EnvVar};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::env::{config_map_env, secret_env};
use super::meta;
use crate::desired::params::Supply;
use crate::desired::tree::TreeAgent;
use crate::desired::Inputs;
use crate::names::{self, param_env, PARAMS_FILE, TOOLS_DIR};
use bindery_spec::budget;
use bindery_spec::{AgentDocument, Metadata, Toolbox, API_VERSION, KIND};

/// Where each supplied parameter goes: a non-secret value into the params
/// file, a Secret or ConfigMap key into the sidecar's environment.
#[derive(Default)]
pub(super) struct Parameters {
    pub file: serde_json::Map<String, serde_json::Value>,
    pub env: Vec<EnvVar>,
}

impl Parameters {
    pub(super) fn of(supplies: &BTreeMap<String, (Supply, bool)>) -> Parameters {
        let mut out = Parameters::default();
        for (name, (supply, pinned)) in supplies {
            match supply {
                Supply::Value(v) => {
                    out.file.insert(
                        name.clone(),
                        serde_json::json!({"value": v, "pinned": pinned}),
                    );
                }
                Supply::Secret(r) => out.env.push(secret_env(param_env(name, *pinned), r)),
                Supply::ConfigMap(r) => out.env.push(config_map_env(param_env(name, *pinned), r)),
            }
        }
        out
    }
}

/// The ConfigMap's files: `NAME.yaml` per agent, and the params file.
pub(super) fn files(
    tree: &[TreeAgent<'_>],
    tenant: &crate::crd::AgentTenantSpec,
    params_file: &serde_json::Map<String, serde_json::Value>,
) -> BTreeMap<String, String> {
    let mut data = BTreeMap::new();
    for a in tree {
        data.insert(format!("{}.yaml", a.name), agent_file(a, tenant));
    }
    data.insert(
        PARAMS_FILE.to_string(),
        serde_json::to_string_pretty(params_file).expect("JSON serializes"),
    );
    data
}

pub(super) fn config_map(
    inputs: &Inputs<'_>,
    owner: &OwnerReference,
    files: BTreeMap<String, String>,
) -> ConfigMap {
    ConfigMap {
        metadata: meta(names::config_map(inputs.tenant_name()), inputs, owner),
        data: Some(files),
        ..Default::default()
    }
}

/// An agent's file as the pod reads it: bash tools come from the tenant's
/// tools ConfigMap, mounted at one directory, and so does an MCP server
/// program given by a relative path (`./servers/billing.py`). The tenant's
/// agent (the root) carries the tenant's budgets over its own; a helper
/// keeps its own. Every agent's models are priced at the tenant's prices.
fn agent_file(agent: &TreeAgent<'_>, tenant: &crate::crd::AgentTenantSpec) -> String {
    let spec = rendered_spec(agent, tenant);
    agent_yaml(agent, spec)
}

/// `agent`'s spec with what the tenant puts over it: its budgets (the
/// root's only) and its prices (every agent's).
pub(crate) fn rendered_spec(
    agent: &TreeAgent<'_>,
    tenant: &crate::crd::AgentTenantSpec,
) -> bindery_spec::AgentSpec {
    let mut spec = agent.spec.clone();
    if agent.root {
        spec.budgets = budget::overlay(&spec.budgets, &tenant.budgets);
    }
    bindery_spec::prices::apply(&mut spec.model, &tenant.pricing);
    spec
}

fn agent_yaml(agent: &TreeAgent<'_>, mut spec: bindery_spec::AgentSpec) -> String {
    for tb in &mut spec.toolboxes {
        // OpenAPI toolboxes name a URL or a file the author placed; left as
        // written. So do MCP programs found in `PATH` or by an absolute path
        // (they are the image's) and remote MCP servers.
        let b = match tb {
            Toolbox::Bash(b) => b,
            Toolbox::Mcp(m) => {
                if let Some(program) = m.command.first_mut() {
                    if program.contains('/') && !program.starts_with('/') {
                        let base = program.rsplit('/').next().unwrap_or(program);
                        *program = format!("{TOOLS_DIR}/{base}");
                    }
                }
                continue;
            }
            Toolbox::Openapi(_)
            | Toolbox::Deferred(_)
            | Toolbox::Postgrest(_)
            | Toolbox::Builtin(_)
            | Toolbox::Sqlite(_) => continue,
        };
        if b.directory.is_some() {
            b.directory = Some(TOOLS_DIR.to_string());
        }
        if let Some(s) = &b.script {
            let base = s.rsplit('/').next().unwrap_or(s);
            b.script = Some(format!("{TOOLS_DIR}/{base}"));
        }
    }
    let doc = AgentDocument {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        metadata: Metadata {
            name: agent.name.clone(),
            ..Default::default()
        },
        spec,
    };
    bindery_spec::to_yaml(&doc).expect("an agent document serializes")
}
