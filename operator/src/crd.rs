//! The custom resources and the generated CRD documents.
//!
//! `Agent` is derived in the sidecar crate from the very `AgentSpec` the
//! sidecar reads from files; `AgentTenant` is the operator's own.

use k8s_openapi::api::core::v1::{Container, EnvVar, ResourceRequirements, Toleration, Volume};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use bindery_spec::budget::{Budget, BudgetStatus};
pub use bindery_spec::crd::AgentStatus;
pub use bindery_spec::{Agent, AgentSpec};

/// One tenant of one agent: its pinned and set parameter values, the
/// Secrets its secret parameters come from, and how its pods run.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "bindery.dev",
    version = "v1alpha1",
    kind = "AgentTenant",
    namespaced,
    status = "AgentTenantStatus",
    shortname = "tenant",
    shortname = "at",
    category = "bindery",
    printcolumn = r#"{"name":"Agent","type":"string","jsonPath":".spec.agentRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Params","type":"string","jsonPath":".status.paramsBound","description":"required parameters bound / required"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.replicas) || self.replicas <= 1 || !has(self.store) || !has(self.store.pvcSize)").message("replicas above 1 need a store they share (spec.store.postgres): a pvcSize claim holds one pod's SQLite file"))]
pub struct AgentTenantSpec {
    /// The `Agent` (same namespace) this tenant runs.
    pub agent_ref: AgentRef,
    /// Values for the agent tree's parameters, shaped like a container's `env`.
    // `maxItems` (and the name's `maxLength`) bound the apiserver's static
    // cost estimate of the uniqueness rule, which is quadratic in the list:
    // unbounded, it is estimated far past the per-rule limit and the CRD is
    // refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q.name == p.name))").message("each parameter may be listed once"))]
    pub parameters: Vec<TenantParameter>,
    /// Agent server pods (default 1). More than one needs `store.postgres`
    /// to share sessions (and route requests to each other); a `pvcSize`
    /// store is refused with more than one, an emptyDir one gives each pod
    /// sessions of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The sidecar image (default: the operator's `--sidecar-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Where sessions are kept (default: SQLite on an emptyDir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreSpec>,
    /// Bash tools: a ConfigMap whose keys are the scripts, mounted executable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolsSpec>,
    /// A Secret key holding the owner token; one is generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_token_secret_ref: Option<KeyRef>,
    /// A Secret key holding the token MCP clients present on `/mcp` to call
    /// the agent's exposed tools (and nothing else). Absent: no such token;
    /// only the owner token opens `/mcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_client_token_secret_ref: Option<KeyRef>,
    /// A Secret key holding the approver token: its bearer lists the
    /// tenant's pending approvals (`GET /v1/approvals`) and answers them,
    /// and reads nothing else of a conversation. Absent: no approver token;
    /// the owner answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver_token_secret_ref: Option<KeyRef>,
    /// Where people and webhook receivers reach the tenant's agent server
    /// (`https://acme.agents.example.com`): the base of the answer links in
    /// approval notices. Default, for a tenant whose agents have an
    /// approval webhook: its Service inside the cluster
    /// (`http://<tenant>.<namespace>.svc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub public_url: Option<String>,
    /// Forget a session's secret values once it has been idle this long
    /// (`30m`, `1h`, `90s`); its next message then answers 409
    /// `params_required` until they are supplied again. `off`: keep them
    /// as long as the pod runs. Default: one hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(off|0*[1-9][0-9]*(ms|s|m|h|d)([0-9]+(ms|s|m|h|d))*)$"))]
    pub live_session_ttl: Option<String>,
    /// Keep at most this many sessions live (holding secret values in
    /// memory) in each pod; past it, the least recently used idle session
    /// forgets its secrets and answers 409 `params_required` until they are
    /// supplied again. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_live_sessions: Option<i64>,
    /// Send a comment on each event stream with nothing to say this often
    /// (`10s`, `1m`), so that a proxy whose idle timeout is shorter keeps
    /// it open. Default: every 15 seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^0*[1-9][0-9]*(ms|s|m|h|d)([0-9]+(ms|s|m|h|d))*$"))]
    pub events_keep_alive: Option<String>,
    /// Extra containers (the tenant's own tool services, reached on
    /// localhost), volumes, tolerations, node selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_overrides: Option<PodOverrides>,
    /// This tenant's budgets: each replaces the agent's budget of the same
    /// name, or is added to them. They cap the tenant's agent (the
    /// `agentRef` one), not its helpers, which keep their own. A `cost`
    /// budget needs the agent's `spec.model.pricing`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub budgets: Vec<Budget>,
    /// This tenant's prices, by model name: each wins over the agent's
    /// `pricing` and Bindery's price table for that model or fallback, in
    /// every agent of the tenant (its usage, its `cost` budgets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["model"]))]
    pub pricing: Vec<bindery_spec::prices::ModelPrice>,
    /// The platform's identity provider: people call the tenant's agents
    /// with its identity tokens, each using their own sessions, and tools
    /// may act with their rights (`{identity: …}` bindings). Absent:
    /// identity tokens are not taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<TenantIdentity>,
    /// Limits on each end user of the tenant (people signed in with the
    /// platform's identity tokens, `identity`): without an identity
    /// provider they limit no one (the pods say so in their log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_user: Option<PerUserSpec>,
    /// Requests and tool calls per minute, counted by each pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<RateLimitsSpec>,
}

/// The identity provider whose tokens a tenant's agent servers take.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantIdentity {
    /// The tokens' `iss`, exactly (https; the keys are found through its
    /// `/.well-known/openid-configuration`).
    #[schemars(length(max = 2048), regex(pattern = r"^https://[^\s]+$"))]
    pub issuer: String,
    /// A token's `aud` must hold one of these.
    #[schemars(length(min = 1, max = 16))]
    pub audiences: Vec<String>,
    /// The keys' URL, when the discovery document is not to be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https://[^\s]+$"))]
    pub jwks_url: Option<String>,
    /// The claim that names the person (default `sub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub subject_claim: Option<String>,
    /// How far clocks may disagree, in seconds (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 300))]
    pub clock_skew_seconds: Option<i64>,
    /// The client the agent servers exchange people's tokens as (RFC
    /// 8693), for `{identity: "token:…"}` bindings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<TenantExchange>,
}

/// The token-exchange client of a tenant.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantExchange {
    #[schemars(length(min = 1, max = 256))]
    pub client_id: String,
    /// The Secret key holding the client's secret.
    pub client_secret_secret_ref: KeyRef,
    /// The token endpoint, when the discovery document is not to be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https://[^\s]+$"))]
    pub token_url: Option<String>,
}

/// What each end user may hold of the tenant at once.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PerUserSpec {
    /// At most this many runs in progress at once per end user, counted in
    /// the tenant's store (across replicas); one more is answered 429
    /// `too_many_runs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_runs: Option<u32>,
}

/// Requests and tool calls per minute. Each is a bucket of that many that
/// refills at that many per minute, kept by each pod: with `replicas: N`
/// the tenant takes up to N times as much.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitsSpec {
    /// Requests per minute to the tenant's API, every client together
    /// (probes and `/metrics` are not counted); past it, 429 `rate_limited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub requests_per_minute: Option<u32>,
    /// Requests per minute of each end user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub per_user_requests_per_minute: Option<u32>,
    /// Calls per minute of the tools a glob names: a call over it does
    /// not run, and the model is told it is rate limited.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tools: Vec<ToolRateSpec>,
}

/// One tool glob's calls per minute.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolRateSpec {
    /// A glob over the agent's tool names (`openapi_billing_*`): the
    /// calls of every tool it names count together.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9_.*?-]+$"))]
    pub tool: String,
    #[schemars(range(min = 1))]
    pub calls_per_minute: u32,
    /// Each end user has their own bucket.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_user: bool,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct AgentRef {
    pub name: String,
}

/// A value for one parameter: exactly one of `value` or `valueFrom` a
/// Secret or ConfigMap key; `pinned` makes it one no client can override.
// "Exactly one of value or valueFrom" is a `oneOf` of two `required`s, not a
// CEL rule: `value` is free-form JSON (no `type`), and an apiserver's CEL
// type-check only sees typed fields, so `has(self.value)` would not compile
// there and the CRD would be refused. The operator's status says it in words.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("oneOf" = [{"required": ["value"]}, {"required": ["valueFrom"]}]))]
pub struct TenantParameter {
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z][a-z0-9_]*$')").message("a parameter name is lower-case letters, digits and _, starting with a letter"))]
    pub name: String,
    /// The value (any JSON). Never for a secret parameter: use `valueFrom.secretKeyRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub value: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<ValueFrom>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Any JSON value.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretKeyRef) != has(self.configMapKeyRef)").message("give exactly one of secretKeyRef or configMapKeyRef"))]
pub struct ValueFrom {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// A key of a Secret or ConfigMap in the tenant's namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRef {
    pub name: String,
    pub key: String,
}

/// Where sessions are kept: SQLite on an emptyDir (the default), SQLite on
/// a PersistentVolumeClaim (`pvcSize`), or a PostgreSQL database
/// (`postgres`) that every replica shares.
// The fields are all typed, so the exclusivity is a CEL rule (unlike
// TenantParameter's `value`, which is free-form JSON).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.postgres) || (!has(self.pvcSize) && !has(self.storageClassName))").message("store.postgres keeps sessions in PostgreSQL: give it without pvcSize and storageClassName (they are for the SQLite store)"))]
pub struct StoreSpec {
    /// Keep the SQLite store on a PersistentVolumeClaim of this size
    /// (e.g. `1Gi`) instead of an emptyDir; needs `replicas: 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Keep sessions in a PostgreSQL database, which any number of
    /// replicas share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<PostgresStoreSpec>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PostgresStoreSpec {
    /// The Secret key holding the URL,
    /// `postgres://USER:PASSWORD@HOST:PORT/DB` (with `?sslmode=verify-full`
    /// and the like, as libpq takes them).
    /// It reaches the pod as `BINDERY_STORE` through a `secretKeyRef`.
    pub url_secret_ref: KeyRef,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolsSpec {
    pub config_map_ref: NameRef,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct NameRef {
    pub name: String,
}

// Every field is a decision about the tenant's pods: the operator chart's
// tenants policy (`variables.podLevel`) names each one and asks for pod
// create to set it, so a field added here is added there too.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Extra environment of the sidecar container, e.g. the model's API key
    /// from a Secret (`OPENAI_API_KEY`). Names starting with `BINDERY_` are
    /// refused: parameters go through `spec.parameters`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Extra labels of the tenant's pods, e.g. AKS workload identity's
    /// `azure.workload.identity/use: "true"`. The operator's own labels
    /// (its selector's) are not among them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the tenant's ServiceAccount: the cloud identity its
    /// pods take, e.g. IRSA's `eks.amazonaws.com/role-arn` or AKS's
    /// `azure.workload.identity/client-id` (docs/providers.md).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub service_account_annotations: BTreeMap<String, String>,
}

// The operator chart's tenant-status-policy.yaml names every field but
// budgets and budgetSummary: those the tenant's own account may not change.
/// What the operator found and did; and, in `budgets` and
/// `budgetSummary`, what the tenant's agent server measured.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentTenantStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `AgentValid`, `ParametersResolved`, `Available`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// One row per parameter declared anywhere in the agent tree. Never a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<ParameterRow>,
    /// The same rows, one line each, for `kubectl describe`:
    /// `billing_token (invoices; process, secret, required): secret acme-billing/token`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub summary: Vec<String>,
    /// The tools whose calls wait for a person or the client, in the agent
    /// and its helpers: `confirm bash_delete-* (invoices)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_tools: Vec<String>,
    /// Required parameters bound / required (`3/4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_bound: Option<String>,
    /// The Service URL of the session API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The limit of live sessions in each pod (`spec.maxLiveSessions`). How
    /// many are live is each pod's `bindery_sessions_live` metric: the
    /// operator does not scrape pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_live_sessions: Option<i64>,
    /// Each budget's use in its current window, one row per agent and
    /// budget. Written by the tenant's agent server (field manager
    /// `bindery-sidecar`), never by the operator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["agent", "name"]))]
    pub budgets: Vec<BudgetStatus>,
    /// The same rows, one line each, for `kubectl describe`:
    /// `daily-tokens (agent invoices): 1200 of 200000 tokens per 24h, 1%`.
    /// Written with `budgets`, by the agent server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(max = 1024), regex(pattern = bindery_spec::budget::NO_CONTROL_CHARACTERS)))]
    pub budget_summary: Vec<String>,
}

impl AgentTenantStatus {
    /// The status fields the tenant's agent server writes, never the
    /// operator (as they are named in the object).
    pub const SERVER_FIELDS: [&'static str; 2] = ["budgets", "budgetSummary"];

    /// The status as the operator writes it: without the fields the agent
    /// server writes.
    pub fn operators_part(&self) -> AgentTenantStatus {
        AgentTenantStatus {
            budgets: Vec::new(),
            budget_summary: Vec::new(),
            ..self.clone()
        }
    }
}

/// How one declared parameter stands for this tenant.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParameterRow {
    pub name: String,
    /// The agent that declares it (the tenant's agent or one of its helpers).
    pub agent: String,
    pub scope: String,
    pub secret: bool,
    pub required: bool,
    /// `pinned`, `value`, `secret NAME/KEY`, `configmap NAME/KEY`, `default`,
    /// `per-session`, `with` (a helper's caller fills it), `unbound`.
    pub source: String,
    pub bound: bool,
    pub pinned: bool,
    /// What is wrong or worth knowing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Every CRD of Bindery, as `(file name, YAML)`.
pub fn crd_documents() -> Vec<(&'static str, String)> {
    let yaml = |crd: CustomResourceDefinition| {
        format!(
            "# Generated by `bindery-operator crdgen`; do not edit.\n{}",
            serde_yaml::to_string(&crd).expect("a CRD serializes")
        )
    };
    vec![
        ("agents.bindery.dev.yaml", yaml(Agent::crd())),
        ("agenttenants.bindery.dev.yaml", yaml(AgentTenant::crd())),
    ]
}

/// Write every CRD into `dir`; returns the files written.
pub fn write_crds(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    crd_documents()
        .into_iter()
        .map(|(name, doc)| {
            let path = dir.join(name);
            std::fs::write(&path, doc)?;
            Ok(path)
        })
        .collect()
}
