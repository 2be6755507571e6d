//! The pod template's config hash: pods roll when the ConfigMap's files
//! change or an object they read does (by its resourceVersion: values
//! never pass through here).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::desired::params::Supply;
use crate::desired::{postgres_url, Inputs};
use crate::names::peer_tls_secret;

pub(super) fn config_hash(
    inputs: &Inputs<'_>,
    files: &BTreeMap<String, String>,
    supplies: &BTreeMap<String, (Supply, bool)>,
) -> String {
    let spec = &inputs.tenant.spec;
    let mut hash = Sha256::new();
    for (k, v) in files {
        hash.update(k.as_bytes());
        hash.update([0]);
        hash.update(v.as_bytes());
        hash.update([0]);
    }
    let owner_ref = inputs.owner_token_ref();
    let mut referenced: Vec<(&str, &str)> = supplies
        .values()
        .filter_map(|(s, _)| match s {
            Supply::Secret(r) => Some(("secret", r.name.as_str())),
            Supply::ConfigMap(r) => Some(("configmap", r.name.as_str())),
            Supply::Value(_) => None,
        })
        .collect();
    referenced.push(("secret", owner_ref.name.as_str()));
    if let Some(r) = &spec.mcp_client_token_secret_ref {
        referenced.push(("secret", r.name.as_str()));
    }
    if let Some(r) = &spec.approver_token_secret_ref {
        referenced.push(("secret", r.name.as_str()));
    }
    if let Some(x) = spec.identity.as_ref().and_then(|i| i.exchange.as_ref()) {
        referenced.push(("secret", x.client_secret_secret_ref.name.as_str()));
    }
    let peer_tls = peer_tls_secret(inputs.tenant_name());
    if let Some(r) = postgres_url(inputs.tenant) {
        referenced.push(("secret", r.name.as_str()));
        referenced.push(("secret", peer_tls.as_str()));
    }
    if let Some(t) = &spec.tools {
        referenced.push(("configmap", t.config_map_ref.name.as_str()));
    }
    referenced.sort();
    referenced.dedup();
    for (kind, name) in referenced {
        let objs = if kind == "secret" {
            inputs.secrets
        } else {
            inputs.config_maps
        };
        let rv = objs.get(name).map_or("", |o| o.resource_version.as_str());
        hash.update(format!("{kind}/{name}@{rv}\0").as_bytes());
    }
    hex::encode(hash.finalize())
}
