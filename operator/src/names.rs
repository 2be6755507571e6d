//! Names, labels and paths shared by what the operator renders.

use std::collections::BTreeMap;

/// The field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "bindery-operator";
/// Pod annotation whose change rolls the pods.
pub(crate) const CONFIG_HASH: &str = "bindery.dev/config-hash";
pub const TENANT_LABEL: &str = "bindery.dev/tenant";

pub(crate) const AGENTS_DIR: &str = "/etc/bindery/agents";
pub(crate) const PARAMS_DIR: &str = "/etc/bindery/params";
pub(crate) const PARAMS_FILE: &str = "params.json";
pub(crate) const TOOLS_DIR: &str = "/etc/bindery/tools";
pub(crate) const OWNER_DIR: &str = "/etc/bindery/owner";
pub(crate) const OWNER_FILE: &str = "token";
pub(crate) const STORE_DIR: &str = "/var/lib/bindery";
pub(crate) const PORT: i32 = 8080;
/// Where replicas take each other's forwards, over mutual TLS.
pub(crate) const PEER_PORT: i32 = 8443;
pub(crate) const PEER_TLS_DIR: &str = "/etc/bindery/peer-tls";
/// Where a tenant whose agents have an approval webhook or a budget finds
/// what it takes to post Events on its `AgentTenant` and, with a budget, to
/// write its `status.budgets` (`BINDERY_EVENTS_DIR`): a projected
/// ServiceAccount token, the cluster's CA and the namespace.
pub(crate) const EVENTS_DIR: &str = "/var/run/secrets/bindery/events";
/// The ConfigMap every namespace has with the cluster's CA (`ca.crt`),
/// published by the controller manager.
pub(crate) const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

/// The Deployment, Service and ServiceAccount of a tenant; and, for a
/// tenant whose agents have an approval webhook or a budget, the Role that
/// lets that account create Events (and, with a budget, write its tenant's
/// status) and its RoleBinding.
pub fn workload(tenant: &str) -> String {
    tenant.to_string()
}

pub fn config_map(tenant: &str) -> String {
    format!("{tenant}-agents")
}

pub fn owner_token_secret(tenant: &str) -> String {
    format!("{tenant}-owner-token")
}

/// The tenant's peer certificate (kubernetes.io/tls plus `ca.crt`).
pub fn peer_tls_secret(tenant: &str) -> String {
    format!("{tenant}-peer-tls")
}

/// The files of the peer certificate's Secret.
pub const PEER_TLS_KEYS: [&str; 3] = ["ca.crt", "tls.crt", "tls.key"];

pub(crate) fn store_claim(tenant: &str) -> String {
    format!("{tenant}-store")
}

pub(crate) fn labels(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "bindery-tenant".into()),
        ("app.kubernetes.io/instance".into(), tenant.into()),
        (
            "app.kubernetes.io/managed-by".into(),
            "bindery-operator".into(),
        ),
        (TENANT_LABEL.into(), tenant.into()),
    ])
}

/// The environment variable a parameter value travels in.
pub(crate) fn param_env(name: &str, pinned: bool) -> String {
    let prefix = if pinned {
        "BINDERY_PIN_"
    } else {
        "BINDERY_PARAM_"
    };
    format!("{prefix}{}", name.to_ascii_uppercase())
}
