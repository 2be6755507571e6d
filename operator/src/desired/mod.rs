//! A tenant's desired state as a pure function: from the `AgentTenant`, the
//! namespace's `Agent`s, which referenced Secrets and ConfigMaps exist (and
//! their keys) and the operator's configuration, to the objects to apply,
//! the status to write and the events a human must see. No I/O here.

pub(crate) mod params;
pub(crate) mod render;
pub(crate) mod tree;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};

use crate::crd::{AgentTenant, AgentTenantStatus, KeyRef};
use crate::names;
use bindery_spec::budget::{self, Budget, Meter, Pricing};
use bindery_spec::checks::check_definition;
use bindery_spec::diagnostic::Level;
use bindery_spec::AgentSpec;

pub use render::{EventsAccess, Objects};

/// A Secret or ConfigMap as reconcile sees it: its key names and version,
/// never its values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RefObject {
    /// `None` when they are not known: a Secret whose metadata does not
    /// name its keys for certain ([`crate::key_names`]); no key of it is
    /// checked then.
    pub keys: Option<BTreeSet<String>>,
    pub resource_version: String,
}

impl RefObject {
    /// Known to have no key `key`.
    pub(crate) fn lacks(&self, key: &str) -> bool {
        self.keys.as_ref().is_some_and(|k| !k.contains(key))
    }
}

#[derive(Clone, Debug)]
pub struct OperatorConfig {
    pub sidecar_image: String,
    /// The cluster's DNS suffix for Service URLs.
    pub cluster_domain: String,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            sidecar_image: "ghcr.io/bindery-dev/bindery-sidecar:0.1.0".into(),
            cluster_domain: "cluster.local".into(),
        }
    }
}

/// The tenant's Deployment as last seen.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rollout {
    pub replicas: i32,
    pub ready_replicas: i32,
}

pub struct Inputs<'a> {
    pub tenant: &'a AgentTenant,
    /// The namespace's Agents by name.
    pub agents: &'a BTreeMap<String, AgentSpec>,
    /// Referenced Secrets that exist, by name.
    pub secrets: &'a BTreeMap<String, RefObject>,
    /// Referenced ConfigMaps that exist, by name.
    pub config_maps: &'a BTreeMap<String, RefObject>,
    pub config: &'a OperatorConfig,
    /// `None` when no Deployment exists yet.
    pub rollout: Option<Rollout>,
    pub now: Time,
}

impl Inputs<'_> {
    pub(crate) fn tenant_name(&self) -> &str {
        self.tenant.metadata.name.as_deref().unwrap_or_default()
    }

    /// Where the owner token is: the tenant's reference, or the Secret the
    /// operator generates.
    pub(crate) fn owner_token_ref(&self) -> KeyRef {
        self.tenant
            .spec
            .owner_token_secret_ref
            .clone()
            .unwrap_or_else(|| KeyRef {
                name: names::owner_token_secret(self.tenant_name()),
                key: names::OWNER_FILE.into(),
            })
    }
}

/// The peer certificate's Secret to create for a tenant on Postgres
/// ([`Desired::generate_peer_tls`]), issued at `now`.
pub fn generated_peer_tls(
    inputs: &Inputs<'_>,
    now: jiff::Timestamp,
) -> Result<k8s_openapi::api::core::v1::Secret, rcgen::Error> {
    render::generated_peer_tls(inputs, &owner_reference(inputs.tenant), now)
}

/// A Kubernetes Event for a human.
#[derive(Clone, Debug, PartialEq)]
pub struct Warning {
    pub reason: &'static str,
    pub message: String,
}

#[derive(Debug)]
pub struct Desired {
    /// What to apply; `None` when something must be fixed first (nothing
    /// is deployed that would crash-loop; what runs keeps running).
    pub objects: Option<Objects>,
    /// The owner-token Secret to create when it does not exist.
    pub generate_owner_token: bool,
    /// The peer certificate's Secret to create when it does not exist (a
    /// tenant on Postgres, whose replicas forward to each other).
    pub generate_peer_tls: bool,
    pub status: AgentTenantStatus,
    pub warnings: Vec<Warning>,
}

/// The Secrets and ConfigMaps a tenant refers to (for watches and gets).
pub fn referenced(tenant: &AgentTenant) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut secrets = BTreeSet::new();
    let mut config_maps = BTreeSet::new();
    for p in &tenant.spec.parameters {
        if let Some(vf) = &p.value_from {
            if let Some(r) = &vf.secret_key_ref {
                secrets.insert(r.name.clone());
            }
            if let Some(r) = &vf.config_map_key_ref {
                config_maps.insert(r.name.clone());
            }
        }
    }
    if let Some(r) = &tenant.spec.owner_token_secret_ref {
        secrets.insert(r.name.clone());
    }
    if let Some(r) = &tenant.spec.mcp_client_token_secret_ref {
        secrets.insert(r.name.clone());
    }
    if let Some(r) = &tenant.spec.approver_token_secret_ref {
        secrets.insert(r.name.clone());
    }
    if let Some(x) = tenant
        .spec
        .identity
        .as_ref()
        .and_then(|i| i.exchange.as_ref())
    {
        secrets.insert(x.client_secret_secret_ref.name.clone());
    }
    if let Some(r) = postgres_url(tenant) {
        secrets.insert(r.name.clone());
    }
    if let Some(t) = &tenant.spec.tools {
        config_maps.insert(t.config_map_ref.name.clone());
    }
    (secrets, config_maps)
}

/// The Secret key of a Postgres store's URL, if the tenant has one.
pub(crate) fn postgres_url(tenant: &AgentTenant) -> Option<&KeyRef> {
    let store = tenant.spec.store.as_ref()?;
    store.postgres.as_ref().map(|p| &p.url_secret_ref)
}

pub fn desired(inputs: &Inputs<'_>) -> Desired {
    let tenant = inputs.tenant;
    let generation = tenant.metadata.generation;
    let previous = tenant
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let mut warnings = Vec::new();
    let mut status = AgentTenantStatus {
        observed_generation: generation,
        max_live_sessions: tenant.spec.max_live_sessions,
        ..Default::default()
    };

    // The agent tree, and the checks of every definition in it.
    let agent_name = &tenant.spec.agent_ref.name;
    let (tree, agent_problems) = match tree::resolve(agent_name, inputs.agents) {
        Ok(t) => {
            let problems: Vec<String> = t
                .iter()
                .flat_map(|a| check_definition(&a.name, a.spec, &format!("Agent `{}`", a.name)))
                .filter(|d| d.level == Level::Error)
                .map(|d| d.message)
                .collect();
            (t, problems)
        }
        Err(p) => (Vec::new(), p),
    };
    let agent_ok = agent_problems.is_empty();
    let agent_cond = if agent_ok {
        let helpers = match tree.len() {
            1 => String::new(),
            2 => " and its helper".to_string(),
            n => format!(" and its {} helpers", n - 1),
        };
        cond(
            "AgentValid",
            true,
            "Valid",
            format!("Agent `{agent_name}`{helpers}: valid"),
        )
    } else {
        let reason = if inputs.agents.contains_key(agent_name) {
            "InvalidAgent"
        } else {
            "AgentNotFound"
        };
        warnings.push(Warning {
            reason,
            message: agent_problems.join("; "),
        });
        cond("AgentValid", false, reason, agent_problems.join("; "))
    };

    // Parameters, and the owner token.
    let mut resolution = params::resolve(&tree, inputs);
    let owner = inputs.owner_token_ref();
    let generated = tenant.spec.owner_token_secret_ref.is_none();
    match inputs.secrets.get(&owner.name) {
        Some(o) if o.lacks(&owner.key) => resolution.problems.push(format!(
            "the owner token: Secret `{}` has no key `{}`",
            owner.name, owner.key
        )),
        None if !generated => resolution.problems.push(format!(
            "the owner token: Secret `{}` (spec.ownerTokenSecretRef) does not exist",
            owner.name
        )),
        _ => {}
    }
    // Never generated: without one, only the owner token opens `/mcp`, and
    // the owner answers approvals.
    for (what, field, r) in [
        (
            "the MCP client token",
            "mcpClientTokenSecretRef",
            &tenant.spec.mcp_client_token_secret_ref,
        ),
        (
            "the approver token",
            "approverTokenSecretRef",
            &tenant.spec.approver_token_secret_ref,
        ),
        (
            "the identity exchange client's secret",
            "identity.exchange.clientSecretSecretRef",
            &tenant
                .spec
                .identity
                .as_ref()
                .and_then(|i| i.exchange.as_ref())
                .map(|x| x.client_secret_secret_ref.clone()),
        ),
    ] {
        let Some(r) = r else { continue };
        match inputs.secrets.get(&r.name) {
            Some(o) if o.lacks(&r.key) => resolution.problems.push(format!(
                "{what}: Secret `{}` (spec.{field}) has no key `{}`",
                r.name, r.key
            )),
            None => resolution.problems.push(format!(
                "{what}: Secret `{}` (spec.{field}, key `{}`) does not exist",
                r.name, r.key
            )),
            Some(_) => {}
        }
    }
    if let Some(r) = postgres_url(tenant) {
        if let Err(e) = params::check_key("Secret", r, inputs.secrets) {
            resolution.problems.push(format!(
                "the session store (spec.store.postgres.urlSecretRef): {e}"
            ));
        }
    }
    // Made by the operator when absent (one of that name the tenant does
    // not control stops the reconcile before this: NameTaken); its own
    // must hold the three files.
    let peer_tls = names::peer_tls_secret(inputs.tenant_name());
    if postgres_url(tenant).is_some() {
        if let Some(o) = inputs.secrets.get(&peer_tls) {
            let missing: Vec<&str> = names::PEER_TLS_KEYS
                .into_iter()
                .filter(|k| o.lacks(k))
                .collect();
            if !missing.is_empty() {
                resolution.problems.push(format!(
                    "the replicas' peer certificate: Secret `{peer_tls}` has no key {}: give it ca.crt, tls.crt and tls.key, or delete it and the operator makes a new one",
                    missing.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    if let Some(n) = tenant.spec.replicas.filter(|n| *n > 1) {
        let claim = tenant.spec.store.as_ref().and_then(|s| s.pvc_size.as_ref());
        if claim.is_some() && postgres_url(tenant).is_none() {
            resolution.problems.push(format!(
                "spec.replicas is {n}, but the sessions are kept in SQLite on a claim (spec.store.pvcSize), which holds one pod's file: give replicas: 1, or keep the sessions in PostgreSQL (spec.store.postgres), which replicas share"
            ));
        }
    }
    // The tenant's budgets, once its agent tree is valid (the agent's own
    // budgets are checked with the agent).
    if let Some(root) = tree.first().filter(|_| agent_ok) {
        resolution
            .problems
            .extend(pricing_problems(&tenant.spec, &tree));
        resolution
            .problems
            .extend(budget_problems(&tenant.spec, root));
    }
    for e in tenant.spec.pod_overrides.iter().flat_map(|o| o.env.iter()) {
        if e.name.starts_with("BINDERY_") {
            resolution.problems.push(format!(
                "spec.podOverrides.env `{}`: BINDERY_ variables are set by the operator; give parameters in spec.parameters",
                e.name
            ));
        }
    }
    let params_ok = agent_ok && resolution.problems.is_empty();
    let params_cond = if !agent_ok {
        cond(
            "ParametersResolved",
            false,
            "AgentInvalid",
            "the agent tree must be valid first".into(),
        )
    } else if params_ok {
        cond(
            "ParametersResolved",
            true,
            "Resolved",
            "every parameter has a source or comes with each session".into(),
        )
    } else {
        warnings.push(Warning {
            reason: "ParametersUnresolved",
            message: resolution.problems.join("; "),
        });
        cond(
            "ParametersResolved",
            false,
            "Unresolved",
            resolution.problems.join("; "),
        )
    };

    let required = resolution.rows.iter().filter(|r| r.required).count();
    let bound = resolution
        .rows
        .iter()
        .filter(|r| r.required && r.bound)
        .count();
    status.params_bound = Some(format!("{bound}/{required}"));
    status.summary = resolution.rows.iter().map(summary_line).collect();
    // Each agent of the tree: its own tools, then its helpers'.
    status.waiting_tools = tree
        .iter()
        .flat_map(|a| {
            bindery_spec::checks::waiting_tools(a.spec)
                .into_iter()
                .map(move |w| format!("{} ({})", w, a.name))
        })
        .collect();
    status.parameters = resolution.rows;

    let tenant_name = inputs.tenant_name();
    let namespace = tenant
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let objects = params_ok.then(|| {
        render::render(
            inputs,
            &tree,
            &resolution.supplies,
            &owner_reference(tenant),
        )
    });
    if objects.is_some() {
        status.endpoint = Some(format!(
            "http://{}.{namespace}.svc.{}",
            names::workload(tenant_name),
            inputs.config.cluster_domain
        ));
    }
    let available = match &inputs.rollout {
        Some(r) => {
            status.replicas = Some(r.replicas);
            status.ready_replicas = Some(r.ready_replicas);
            let want = tenant.spec.replicas.unwrap_or(1).max(r.replicas);
            if r.ready_replicas > 0 {
                cond(
                    "Available",
                    true,
                    "PodsReady",
                    format!("{} of {want} pods ready", r.ready_replicas),
                )
            } else {
                cond(
                    "Available",
                    false,
                    "PodsNotReady",
                    format!("0 of {want} pods ready"),
                )
            }
        }
        None if objects.is_some() => cond(
            "Available",
            false,
            "Deploying",
            "the Deployment is being created".into(),
        ),
        None => cond(
            "Available",
            false,
            "NotDeployed",
            "nothing is deployed until the problems above are fixed".into(),
        ),
    };
    let ready = [&agent_cond, &params_cond, &available]
        .iter()
        .all(|c| c.status == "True");
    let ready_cond = if ready {
        cond("Ready", true, "Ready", "the tenant serves sessions".into())
    } else {
        let first = [&agent_cond, &params_cond, &available]
            .into_iter()
            .find(|c| c.status != "True")
            .expect("one is not ready");
        cond("Ready", false, first.reason.as_str(), first.message.clone())
    };
    status.conditions = [ready_cond, agent_cond, params_cond, available]
        .into_iter()
        .map(|c| c.finish(generation, &inputs.now, previous))
        .collect();
    Desired {
        objects,
        generate_owner_token: generated && !inputs.secrets.contains_key(&owner.name),
        generate_peer_tls: postgres_url(tenant).is_some()
            && !inputs.secrets.contains_key(&peer_tls),
        status,
        warnings,
    }
}

/// What is wrong with the tenant's budgets (`spec.budgets`) over those of
/// its agent `root`, in the tenant's words.
///
/// They are checked as the tenant wrote them, against the agent's model
/// pricing: the agent's own budgets passed the same checks (or the agent is
/// invalid) and the overlay keeps names unique, so whatever the merged list
/// fails, the tenant's list fails too, and by the tenant's budget's name
/// (a name the tenant gives twice can even vanish in the overlay).
fn budget_problems(
    tenant: &crate::crd::AgentTenantSpec,
    root: &tree::TreeAgent<'_>,
) -> Vec<String> {
    let budgets = &tenant.budgets;
    let mut model = root.spec.model.clone();
    bindery_spec::prices::apply(&mut model, &tenant.pricing);
    let price = model.price().map(|(p, _)| p);
    let pricing = price.as_ref();
    // A cost budget the agent's model has no price for is said below,
    // naming the Agent; the shape checks go against any price.
    let any_price = Pricing {
        input_per_million: 0.0,
        output_per_million: 0.0,
        cache_read_per_million: None,
        cache_write_per_million: None,
        reasoning_per_million: None,
        currency: String::new(),
    };
    let mut diags = Vec::new();
    budget::check(
        budgets,
        Some(pricing.unwrap_or(&any_price)),
        "spec.budgets",
        &mut diags,
    );
    let mut problems: Vec<String> = diags
        .into_iter()
        .filter(|d| d.level == Level::Error)
        .map(|d| d.message)
        .collect();
    if pricing.is_none() {
        let costs = |b: &&Budget| matches!(b.meter(), Some((Meter::Cost, _)));
        for b in budgets.iter().filter(costs) {
            problems.push(format!(
                "spec.budgets, budget `{}` caps cost, but Agent `{}` gives its model no price \
                 (and Bindery's price table does not know it): add `spec.model.pricing` (inputPerMillion, outputPerMillion) to the Agent, \
                 or cap tokens or toolCalls in this budget instead",
                b.name, root.name
            ));
        }
    }
    problems
}

/// What is wrong with the tenant's prices (`spec.pricing`): a price that
/// is not one, a model no agent of the tenant names (the price would be
/// ignored), and what the agents' own checks say of them once priced so
/// (a fallback priced in another currency than its model).
fn pricing_problems(
    tenant: &crate::crd::AgentTenantSpec,
    tree: &[tree::TreeAgent<'_>],
) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, p) in tenant.pricing.iter().enumerate() {
        let place = format!(
            "spec.pricing[{i}], model `{}`",
            bindery_spec::printable(&p.model)
        );
        let mut diags = Vec::new();
        budget::check_pricing(&p.price, &place, &mut diags);
        problems.extend(diags.into_iter().map(|d| d.message));
        if tenant.pricing[..i].iter().any(|q| q.model == p.model) {
            problems.push(format!(
                "{place} is priced twice; give each model one price"
            ));
        }
        let named = tree
            .iter()
            .flat_map(|a| a.spec.model.chain())
            .any(|m| m.name == p.model);
        if !named {
            problems.push(format!(
                "{place}: no model or fallback of the tenant's agents is named so (the price would count nothing); write a model's `name`"
            ));
        }
    }
    if tenant.pricing.is_empty() {
        return problems;
    }
    for a in tree {
        let here = format!("spec.pricing, Agent `{}`", a.name);
        let before: Vec<String> = check_definition(&a.name, a.spec, &here)
            .into_iter()
            .map(|d| d.message)
            .collect();
        let mut priced = a.spec.clone();
        bindery_spec::prices::apply(&mut priced.model, &tenant.pricing);
        problems.extend(
            check_definition(&a.name, &priced, &here)
                .into_iter()
                .filter(|d| d.level == Level::Error && !before.contains(&d.message))
                .map(|d| d.message),
        );
    }
    problems
}

/// `billing_token (invoices; process, secret, required): secret acme-billing/token — message`.
fn summary_line(r: &crate::crd::ParameterRow) -> String {
    let mut traits = vec![r.scope.clone()];
    if r.secret {
        traits.push("secret".into());
    }
    traits.push(if r.required { "required" } else { "optional" }.into());
    if r.pinned && r.source != "pinned" {
        traits.push("pinned".into());
    }
    let state = if r.bound { "" } else { " [not bound]" };
    let message = r
        .message
        .as_ref()
        .map(|m| format!(" — {m}"))
        .unwrap_or_default();
    format!(
        "{} ({}; {}): {}{state}{message}",
        r.name,
        r.agent,
        traits.join(", "),
        r.source
    )
}

/// An `Agent`'s own status: `Valid` from the static checks of its
/// definition and the existence of its helpers (pure, like [`desired`]).
pub fn agent_status(
    name: &str,
    agents: &BTreeMap<String, AgentSpec>,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> crate::crd::AgentStatus {
    let mut problems: Vec<String> = match agents.get(name) {
        Some(spec) => check_definition(name, spec, &format!("Agent `{name}`"))
            .into_iter()
            .filter(|d| d.level == Level::Error)
            .map(|d| d.message)
            .collect(),
        None => vec![format!("Agent `{name}` does not exist")],
    };
    if problems.is_empty() {
        if let Err(p) = tree::resolve(name, agents) {
            problems.extend(p);
        }
    }
    let c = if problems.is_empty() {
        cond(
            "Valid",
            true,
            "Valid",
            "the definition passes every static check".into(),
        )
    } else {
        cond("Valid", false, "Invalid", problems.join("; "))
    };
    crate::crd::AgentStatus {
        observed_generation: generation,
        conditions: vec![c.finish(generation, now, previous)],
        waiting_tools: agents
            .get(name)
            .map(bindery_spec::checks::waiting_tools)
            .unwrap_or_default(),
    }
}

/// A condition before its timestamps.
struct Cond {
    type_: &'static str,
    status: &'static str,
    reason: String,
    message: String,
}

fn cond(type_: &'static str, ok: bool, reason: &str, message: String) -> Cond {
    Cond {
        type_,
        status: if ok { "True" } else { "False" },
        reason: reason.to_string(),
        message,
    }
}

impl Cond {
    /// Keep the previous transition time when the status did not change.
    fn finish(self, generation: Option<i64>, now: &Time, previous: &[Condition]) -> Condition {
        let last = previous
            .iter()
            .find(|c| c.type_ == self.type_ && c.status == self.status)
            .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
        Condition {
            type_: self.type_.into(),
            status: self.status.into(),
            reason: self.reason,
            message: self.message,
            observed_generation: generation,
            last_transition_time: last,
        }
    }
}

/// `status` for a tenant left undeployed because an object of one of its
/// names is not its own (`message`: which, and what to do): `Ready` and
/// `Available` False with reason `NameTaken`, so `kubectl describe` says
/// why; the rest as computed.
pub fn name_taken(
    tenant: &AgentTenant,
    status: &AgentTenantStatus,
    message: &str,
    now: &Time,
) -> AgentTenantStatus {
    let previous = tenant
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let mut out = status.clone();
    for c in &mut out.conditions {
        let type_ = match c.type_.as_str() {
            "Ready" => "Ready",
            "Available" => "Available",
            _ => continue,
        };
        *c = cond(type_, false, "NameTaken", message.to_string()).finish(
            tenant.metadata.generation,
            now,
            previous,
        );
    }
    out
}

/// The reference every owned object carries: the tenant as its controller,
/// blocking the tenant's foreground deletion until the object is gone.
pub(crate) fn owner_reference(tenant: &AgentTenant) -> OwnerReference {
    OwnerReference {
        api_version: "bindery.dev/v1alpha1".into(),
        kind: "AgentTenant".into(),
        name: tenant.metadata.name.clone().unwrap_or_default(),
        uid: tenant.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}
