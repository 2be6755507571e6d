//! The thin async layer: gather the inputs of [`desired`], apply what it
//! returns, write the status, publish the events. Watches make a tenant
//! reconcile when it, what it owns, its Agents or the Secrets and
//! ConfigMaps it references change. Each watch is kept seeing
//! ([`crate::watches`]): started again from a fresh list after any error,
//! and every tenant reconciled once it sees again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{ObjectMeta, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::crd::{Agent, AgentSpec, AgentTenant, AgentTenantStatus};
use crate::desired::{desired, referenced, Inputs, OperatorConfig, RefObject, Rollout};
use crate::key_names;
use crate::metrics::Metrics;
use crate::names;
use crate::own_writes::{self, OwnWrites};
use crate::retries::Retries;
use crate::watches::{self, Health, OnFailure};

pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
    pub metrics: Arc<Metrics>,
    pub events: crate::events::Publisher,
    /// Whether the watches see: what `/readyz` answers.
    pub watches: Arc<Health>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("AgentTenant {0} has no namespace")]
    NoNamespace(String),
    #[error("generating the replicas' peer certificate: {0}")]
    PeerCertificate(rcgen::Error),
    /// The OS gave no random bytes for an owner token: retried with the
    /// other failures, counted as `randomness`.
    #[error("no randomness from the OS for the owner token ({0}); retried, nothing was created")]
    Randomness(getrandom::Error),
    /// An object of one of the tenant's names exists and the tenant does
    /// not control it: left as it is, never taken over.
    #[error("a {kind} named {name} exists in namespace {namespace} and is not this AgentTenant's (it controls none of it): rename the AgentTenant, or delete or rename that {kind}; until then the tenant is not deployed")]
    NotOurs {
        kind: String,
        name: String,
        namespace: String,
    },
    /// A Secret the operator makes for the tenant and mounts in its pods
    /// (its owner token, its peer certificate) exists and the tenant does
    /// not control it: someone else's, never mounted.
    #[error("a Secret named {name} exists in namespace {namespace} and is not this AgentTenant's: the operator makes {what} itself and mounts only its own, never one someone else made; delete or rename that Secret{hint}; until then the tenant is not deployed")]
    SecretNotOurs {
        name: String,
        namespace: String,
        what: &'static str,
        hint: &'static str,
    },
}

impl Error {
    /// What failed, as the `error` label of the failure metrics: few
    /// values, so that a dashboard can tell a conflict storm from RBAC
    /// drift or an unreachable API server.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) => match s.code {
                403 => "api_forbidden",
                404 => "api_not_found",
                409 => "api_conflict",
                422 => "api_invalid",
                429 => "api_throttled",
                500..=599 => "api_server_error",
                _ => "api_other",
            },
            Error::Kube(
                kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_),
            ) => "transport",
            Error::Kube(_) => "client",
            Error::NoNamespace(_) => "no_namespace",
            Error::PeerCertificate(_) => "peer_certificate",
            Error::Randomness(_) => "randomness",
            Error::NotOurs { .. } | Error::SecretNotOurs { .. } => "not_ours",
        }
    }
}

/// How many tenants are reconciled at the same time.
pub const RECONCILES_AT_ONCE: u16 = 128;
/// A tenant is reconciled once the changes that concern it have been quiet
/// this long: one apply changes several of its objects at once, and each
/// would otherwise reconcile it again. The operator's own writes are not
/// changes (they never reach the queue); what is folded is the
/// controllers' status updates, four in 70 to 90 ms per rollout step. Every
/// tenant's first reconcile and each Ready waits this long, so it is short
/// (docs/benchmarks.md, Tenant startup).
const QUIET: Duration = Duration::from_millis(100);

/// What the tenants' reconciles of one scope share: the context, the
/// Agents as watched, and the operator's own writes.
struct Scope {
    ctx: Arc<Context>,
    agents: Store<Agent>,
    own: OwnWrites,
    retries: Retries,
}

/// The watch events of `stream` that are not our own writes coming back:
/// only someone else's changes make a tenant reconcile again.
fn foreign<K>(
    stream: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    scope: &Arc<Scope>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Send + 'static,
{
    let scope = scope.clone();
    stream.try_filter(move |obj| {
        let key = key_of(obj);
        futures::future::ready(scope.own.is_foreign(&key, obj.meta()))
    })
}

/// Someone else's changes to the objects of kind `K` (what tenants own).
fn owned_changes<K>(
    watching: &Watching,
    scope: &Arc<Scope>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Namespaced + Send + Sync + 'static,
{
    let changes = watching.observe(
        watching.relist::<K>(),
        &format!("{} (owned)", K::kind(&())),
        watching.forgetting::<K>(scope),
    );
    // A deletion's last state can carry the very generation we applied:
    // forget the write, or the next reconcile would take the object for
    // up to date and never create it again.
    let own = scope.clone();
    let changes = changes.map_ok(move |e| {
        if let watcher::Event::Delete(obj) = &e {
            own.own.forget(&key_of(obj));
        }
        e
    });
    foreign(changes.touched_objects(), scope)
}

/// The watches of one scope (a namespace, or all of them): where they
/// watch, their health, the resync their recoveries ask for.
struct Watching {
    client: Client,
    namespace: Option<String>,
    health: Arc<Health>,
    resync: futures::channel::mpsc::UnboundedSender<()>,
}

impl Watching {
    /// A watch of `K` in the scope, started again from a fresh list
    /// after any error.
    fn relist<K>(
        &self,
    ) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let api = scoped::<K>(&self.client, &self.namespace);
        watches::relisting(move || watcher(api.clone(), watcher::Config::default()))
    }

    /// `stream`'s events without its errors, which tell the health of
    /// the watch named `what` and forget with `forget`
    /// ([`watches::observed`]).
    fn observe<K>(
        &self,
        stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
        what: &str,
        forget: Box<dyn Fn() + Send + Sync>,
    ) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
    where
        K: Resource<DynamicType = ()> + Send + 'static,
    {
        let name = match &self.namespace {
            Some(ns) => format!("{what} in namespace {ns}"),
            None => format!("{what} in all namespaces"),
        };
        let id = self.health.register(&K::kind(&()), name.clone());
        watches::observed(
            stream,
            self.health.clone(),
            id,
            name,
            OnFailure {
                forget,
                resync: self.resync.clone(),
            },
        )
    }

    /// Forgetting what the own-writes cache holds of kind `K`.
    fn forgetting<K: Resource<DynamicType = ()>>(
        &self,
        scope: &Arc<Scope>,
    ) -> Box<dyn Fn() + Send + Sync> {
        let (scope, kind) = (scope.clone(), K::kind(&()).into_owned());
        Box::new(move || scope.own.forget_kind(&kind))
    }
}

/// Forgetting nothing: a watch of a kind the operator does not record.
fn nothing() -> Box<dyn Fn() + Send + Sync> {
    Box::new(|| {})
}

fn key_of<K: Resource<DynamicType = ()>>(obj: &K) -> own_writes::Key {
    (
        K::kind(&()).into_owned(),
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default(),
    )
}

/// Run the controller on `namespace` (all namespaces when `None`) until
/// SIGTERM/SIGINT.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let (resync, resyncs) = futures::channel::mpsc::unbounded();
    let watching = Watching {
        client: ctx.client.clone(),
        namespace: namespace.clone(),
        health: ctx.watches.clone(),
        resync,
    };
    let (agents, agents_writer) = reflector::store();
    let scope = Arc::new(Scope {
        ctx,
        agents,
        own: OwnWrites::default(),
        retries: Retries::default(),
    });
    let agent_changes = watching
        .observe(
            watching.relist::<Agent>().reflect(agents_writer),
            "Agent (for tenants)",
            nothing(),
        )
        .touched_objects();
    let (store, tenants_writer) = reflector::store();
    let tenant_changes = watching
        .observe(
            watching.relist::<AgentTenant>().reflect(tenants_writer),
            "AgentTenant",
            watching.forgetting::<AgentTenant>(&scope),
        )
        .applied_objects()
        .predicate_filter(tenant_view, Default::default());
    // A bounded number of reconciles at once: with a thousand tenants
    // queued together, unbounded concurrency holds every one's objects in
    // memory at the same time (and gains nothing against one API server).
    let controller = Controller::for_stream(foreign(tenant_changes, &scope), store.clone())
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(RECONCILES_AT_ONCE)
                .debounce(QUIET),
        );
    let by_agent = store.clone();
    let by_secret = store.clone();
    let by_config_map = store.clone();

    // Secrets and ConfigMaps by metadata only: their values never enter
    // the operator's caches. A Secret's annotations can hold its values
    // (client-side `kubectl apply`): dropped as each event arrives.
    let secrets = watching
        .observe(
            watching.relist::<PartialObjectMeta<Secret>>(),
            "Secret",
            watching.forgetting::<Secret>(&scope),
        )
        .touched_objects()
        .map_ok(|mut s| {
            s.metadata = key_names::without_values(s.metadata);
            s
        });
    let config_maps = watching
        .observe(
            watching.relist::<PartialObjectMeta<ConfigMap>>(),
            "ConfigMap (referenced)",
            watching.forgetting::<ConfigMap>(&scope),
        )
        .touched_objects();

    controller
        .owns_stream(owned_changes::<Deployment>(&watching, &scope))
        .owns_stream(owned_changes::<ConfigMap>(&watching, &scope))
        .owns_stream(owned_changes::<Service>(&watching, &scope))
        .owns_stream(owned_changes::<ServiceAccount>(&watching, &scope))
        .owns_stream(owned_changes::<PersistentVolumeClaim>(&watching, &scope))
        .owns_stream(owned_changes::<Role>(&watching, &scope))
        .owns_stream(owned_changes::<RoleBinding>(&watching, &scope))
        // An Agent change concerns every tenant of its namespace: the
        // tenant's agent, or one of its helpers, may be it.
        .watches_stream(agent_changes, move |agent: Agent| {
            let ns = agent.namespace();
            by_agent
                .state()
                .into_iter()
                .filter(|t| t.namespace() == ns)
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        .watches_stream(foreign(secrets, &scope), move |s| {
            referring(&by_secret, &s.namespace(), &s.name_any(), true)
        })
        .watches_stream(config_maps, move |c| {
            referring(&by_config_map, &c.namespace(), &c.name_any(), false)
        })
        // A watch that sees again may have missed anything (a deletion
        // shows in no list): every tenant is reconciled, and the
        // own-writes cache no longer vouches for the watch's kind.
        .reconcile_all_on(resyncs)
        .shutdown_on_signal()
        .run(reconcile, error_policy, scope.clone())
        .for_each(|r| async move {
            match r {
                Ok((obj, _)) => tracing::debug!(tenant = %obj.name, "reconciled"),
                Err(e) => tracing::warn!("reconcile: {e}"),
            }
        })
        .await;
}

/// What the Agents' reconciles share: the context and the Agents as
/// watched.
struct AgentScope {
    ctx: Arc<Context>,
    agents: Store<Agent>,
    retries: Retries,
}

/// Keep every Agent's `Valid` condition current (a change to one Agent can
/// make another valid or not: its helpers).
pub async fn run_agents(ctx: Arc<Context>, namespace: Option<String>) {
    let (resync, resyncs) = futures::channel::mpsc::unbounded();
    let watching = Watching {
        client: ctx.client.clone(),
        namespace,
        health: ctx.watches.clone(),
        resync,
    };
    let (store, writer) = reflector::store();
    let agents = watching
        .observe(
            watching.relist::<Agent>().reflect(writer),
            "Agent (their status)",
            nothing(),
        )
        .applied_objects();
    let controller = Controller::for_stream(agents, store.clone());
    let scope = Arc::new(AgentScope {
        ctx,
        agents: store.clone(),
        retries: Retries::default(),
    });
    let others = watching
        .observe(
            watching.relist::<Agent>(),
            "Agent (their helpers)",
            nothing(),
        )
        .touched_objects();
    controller
        .reconcile_all_on(resyncs)
        .watches_stream(others, move |changed: Agent| {
            let ns = changed.namespace();
            store
                .state()
                .into_iter()
                .filter(|a| a.namespace() == ns)
                .map(|a| ObjectRef::from_obj(&*a))
                .collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(reconcile_agent, agent_error_policy, scope)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::warn!("agent reconcile: {e}");
            }
        })
        .await;
}

fn agent_error_policy(agent: Arc<Agent>, err: &Error, scope: Arc<AgentScope>) -> Action {
    let retry = scope.retries.failed(&retry_key(&*agent));
    tracing::warn!(agent = %agent.name_any(), error = err.kind(), ?retry, "agent status failed: {err}");
    Action::requeue(retry)
}

/// An object's key among the failing ones: `namespace/name`.
fn retry_key(object: &impl ResourceExt) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// The Agents of `ns` in `store`, by name.
fn agents_of(store: &Store<Agent>, ns: &str) -> BTreeMap<String, AgentSpec> {
    store
        .state()
        .into_iter()
        .filter(|a| a.namespace().as_deref() == Some(ns))
        .map(|a| (a.name_any(), a.spec.clone()))
        .collect()
}

async fn reconcile_agent(agent: Arc<Agent>, scope: Arc<AgentScope>) -> Result<Action, Error> {
    let result = agent_status(&agent, &scope).await;
    if result.is_ok() {
        scope.retries.succeeded(&retry_key(&*agent));
    }
    result
}

async fn agent_status(agent: &Agent, scope: &AgentScope) -> Result<Action, Error> {
    let ctx = &scope.ctx;
    let name = agent.name_any();
    let ns = agent
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let api = Api::<Agent>::namespaced(ctx.client.clone(), &ns);
    // The Agents as watched, not a LIST per reconcile: with many Agents in
    // a namespace, each change would otherwise read them all once per
    // Agent. A helper the cache has not seen yet makes this Agent invalid
    // for a moment; its arrival reconciles this Agent again.
    let _ = scope.agents.wait_until_ready().await;
    let agents = agents_of(&scope.agents, &ns);
    let previous = agent
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let status = crate::desired::agent_status(
        &name,
        &agents,
        agent.metadata.generation,
        previous,
        &Time(crate::events::now()),
    );
    // What the checks found, once per new finding: a Warning on the Agent.
    if let Some(found) = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Valid" && c.status == "False")
    {
        if !previous.iter().any(|c| c.message == found.message) {
            if let Err(e) = ctx
                .events
                .warn_agent(agent, "InvalidAgent", &found.message)
                .await
            {
                tracing::warn!(agent = %name, "cannot publish an event: {e}");
            }
        }
    }
    if agent.status.as_ref() != Some(&status) {
        api.patch_status(
            &name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "bindery.dev/v1alpha1",
                "kind": "Agent",
                "status": status,
            })),
        )
        .await?;
    }
    Ok(Action::requeue(Duration::from_secs(600)))
}

/// An Api on one namespace, or on all of them.
fn scoped<K>(c: &Client, ns: &Option<String>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    match ns {
        Some(n) => Api::namespaced(c.clone(), n),
        None => Api::all(c.clone()),
    }
}

/// Tenants of `namespace` that reference the Secret (or ConfigMap) `name`.
fn referring(
    store: &Store<AgentTenant>,
    namespace: &Option<String>,
    name: &str,
    secret: bool,
) -> Vec<ObjectRef<AgentTenant>> {
    store
        .state()
        .into_iter()
        .filter(|t| &t.namespace() == namespace)
        .filter(|t| {
            let (secrets, config_maps) = referenced(t);
            let owner = names::owner_token_secret(&t.name_any());
            let peer_tls = names::peer_tls_secret(&t.name_any());
            if secret {
                secrets.contains(name) || owner == name || peer_tls == name
            } else {
                config_maps.contains(name)
            }
        })
        .map(|t| ObjectRef::from_obj(&*t))
        .collect()
}

fn error_policy(tenant: Arc<AgentTenant>, err: &Error, scope: Arc<Scope>) -> Action {
    let retry = scope.retries.failed(&retry_key(&*tenant));
    tracing::warn!(tenant = %tenant.name_any(), error = err.kind(), ?retry, "reconcile failed: {err}");
    Action::requeue(retry)
}

async fn reconcile(tenant: Arc<AgentTenant>, scope: Arc<Scope>) -> Result<Action, Error> {
    // Timed whatever the outcome: a slow failure (an API server timing
    // out) is what the duration of failures is there to show.
    let started = Instant::now();
    let result = reconcile_inner(&tenant, &scope).await;
    if result.is_ok() {
        scope.retries.succeeded(&retry_key(&*tenant));
    }
    scope.ctx.metrics.reconciled(
        started.elapsed().as_secs_f64(),
        result.as_ref().err().map(Error::kind),
    );
    result
}

async fn reconcile_inner(cached: &AgentTenant, scope: &Scope) -> Result<Action, Error> {
    let (ctx, own) = (&scope.ctx, &scope.own);
    let name = cached.name_any();
    let ns = cached
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let c = &ctx.client;

    // The tenant as it is now: the cache can lag behind our own last status
    // write (a reconcile queued by one of its writes can start before that
    // write reaches the cache), and the previous status decides which
    // Warnings are new. The cache will do when it holds that very write.
    let fresh;
    let tenant = if own.is_ours(&key_of(cached), cached.meta()) {
        cached
    } else {
        let Some(t) = Api::<AgentTenant>::namespaced(c.clone(), &ns)
            .get_opt(&name)
            .await?
        else {
            return Ok(Action::await_change()); // deleted meanwhile
        };
        fresh = t;
        &fresh
    };

    // The Agents as watched (a change to one reconciles its tenants once
    // the cache has it); read from the API when the tenant's own Agent is
    // not in the cache yet, rather than report it missing.
    let _ = scope.agents.wait_until_ready().await;
    let mut agents = agents_of(&scope.agents, &ns);
    if !agents.contains_key(&tenant.spec.agent_ref.name) {
        agents = Api::<Agent>::namespaced(c.clone(), &ns)
            .list(&Default::default())
            .await?
            .into_iter()
            .map(|a| (a.name_any(), a.spec))
            .collect();
    }
    let (mut secret_names, config_map_names) = referenced(tenant);
    if tenant.spec.owner_token_secret_ref.is_none() {
        secret_names.insert(names::owner_token_secret(&name));
    }
    if crate::desired::postgres_url(tenant).is_some() {
        secret_names.insert(names::peer_tls_secret(&name));
    }
    let (mut secrets, controllers) = secrets_key_names(c, &ns, &secret_names).await?;
    let config_maps = config_maps_key_names(c, &ns, &config_map_names).await?;
    let rollout = Api::<Deployment>::namespaced(c.clone(), &ns)
        .get_opt(&names::workload(&name))
        .await?
        .map(|d| {
            let s = d.status.unwrap_or_default();
            Rollout {
                replicas: s.replicas.unwrap_or(0),
                ready_replicas: s.ready_replicas.unwrap_or(0),
            }
        });

    let now = Time(crate::events::now());
    let mut minted = false;
    let mut certified = false;
    let d = loop {
        let inputs = Inputs {
            tenant,
            agents: &agents,
            secrets: &secrets,
            config_maps: &config_maps,
            config: &ctx.config,
            rollout: rollout.clone(),
            now: now.clone(),
        };
        let d = desired(&inputs);
        if d.generate_peer_tls && !certified {
            certified = true;
            let secret = crate::desired::generated_peer_tls(&inputs, now.0)
                .map_err(Error::PeerCertificate)?;
            // Created once, never overwritten, like the owner token.
            match Api::<Secret>::namespaced(c.clone(), &ns)
                .create(&PostParams::default(), &secret)
                .await
            {
                Ok(created) => {
                    own.wrote(key_of(&created), &created.metadata, None);
                    tracing::info!(tenant = %name, "peer certificate generated");
                    secrets.insert(names::peer_tls_secret(&name), created_keys(created));
                    continue;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !d.generate_owner_token || minted {
            break d;
        }
        let token = owner_token().map_err(Error::Randomness)?;
        let owner = crate::desired::owner_reference(tenant);
        let secret = crate::desired::render::generated_owner_token(&inputs, &owner, &token);
        // Created once, never overwritten: the token is its holder's.
        match Api::<Secret>::namespaced(c.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await
        {
            Ok(created) => {
                own.wrote(key_of(&created), &created.metadata, None);
                tracing::info!(tenant = %name, "owner token generated");
                // Once more with the token there: the pods start with it,
                // not again when the next reconcile sees it.
                secrets.insert(names::owner_token_secret(&name), created_keys(created));
                minted = true;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => break d,
            Err(e) => return Err(e.into()),
        }
    };
    // The Secrets the operator makes for the tenant go into its pods only
    // if they are its own: one of that name someone else made (a user who
    // may create AgentTenants but not read that Secret) is never mounted.
    if let Some(e) = generated_not_ours(tenant, &ns, &controllers) {
        return Err(name_taken(ctx, own, tenant, &d.status, &now, e).await);
    }
    if let Some(o) = &d.objects {
        let applied = async {
            let mut sent = apply(c, own, &ns, &o.config_map).await?;
            sent |= apply(c, own, &ns, &o.service_account).await?;
            if let Some(claim) = &o.claim {
                sent |= apply::<PersistentVolumeClaim>(c, own, &ns, claim).await?;
            }
            // Before the pods that use it: their first Event is allowed.
            if let Some(a) = &o.events_access {
                sent |= apply(c, own, &ns, &a.role).await?;
                sent |= apply(c, own, &ns, &a.binding).await?;
            }
            sent |= apply(c, own, &ns, &o.deployment).await?;
            sent |= apply(c, own, &ns, &o.service).await?;
            Ok::<_, Error>(sent)
        }
        .await;
        let sent = match applied {
            Err(e @ Error::NotOurs { .. }) => {
                return Err(name_taken(ctx, own, tenant, &d.status, &now, e).await)
            }
            other => other?,
        };
        // What the tenant owns and no longer asks for goes, by its label:
        // a claim once its store is PostgreSQL, the Role and RoleBinding
        // once no agent has an approval webhook or a budget (after the
        // Deployment whose pods no longer hold a token), objects an older
        // operator named otherwise. Only after the new Deployment is applied (its
        // pods no longer mount the claim), and only when something was
        // sent: nothing applied, nothing the tenant asks for changed. A
        // restarted operator sends everything once, so what an interrupted
        // reconcile left behind goes then.
        if sent {
            let name_of = |m: &ObjectMeta| m.name.clone().unwrap_or_default();
            let one = |m: &ObjectMeta| [name_of(m)];
            prune::<ConfigMap>(c, own, &ns, tenant, &one(&o.config_map.metadata)).await?;
            prune::<ServiceAccount>(c, own, &ns, tenant, &one(&o.service_account.metadata)).await?;
            let claims: Vec<String> = o.claim.iter().map(|c| name_of(&c.metadata)).collect();
            prune::<PersistentVolumeClaim>(c, own, &ns, tenant, &claims).await?;
            prune::<Deployment>(c, own, &ns, tenant, &one(&o.deployment.metadata)).await?;
            prune::<Service>(c, own, &ns, tenant, &one(&o.service.metadata)).await?;
            let roles: Vec<String> = o
                .events_access
                .iter()
                .map(|a| name_of(&a.role.metadata))
                .collect();
            prune::<Role>(c, own, &ns, tenant, &roles).await?;
            let bindings: Vec<String> = o
                .events_access
                .iter()
                .map(|a| name_of(&a.binding.metadata))
                .collect();
            prune::<RoleBinding>(c, own, &ns, tenant, &bindings).await?;
        }
    }
    let previous: Vec<String> = tenant
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().map(|c| c.message.clone()))
        .collect();
    for w in &d.warnings {
        // Once per new problem, not on every reconcile.
        if !previous
            .iter()
            .any(|m| m == &w.message || m.contains(&w.message))
        {
            match ctx.events.warn(tenant, w.reason, &w.message).await {
                Ok(()) => ctx.metrics.warning_published(),
                Err(e) => tracing::warn!(tenant = %name, "cannot publish an event: {e}"),
            }
        }
    }
    let ready = d
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    write_status(c, own, tenant, &d.status).await?;
    tracing::info!(tenant = %name, namespace = %ns, ready, deployed = d.objects.is_some(), "reconciled");
    Ok(Action::requeue(Duration::from_secs(if ready {
        600
    } else {
        60
    })))
}

/// The operator's part of the tenant's status applied, unless it is
/// already so.
async fn write_status(
    c: &Client,
    own: &OwnWrites,
    tenant: &AgentTenant,
    status: &AgentTenantStatus,
) -> Result<(), Error> {
    // Compared, and applied, without what the tenant's agent server writes
    // (its budgets' use): the operator neither takes those fields nor
    // clears them, and their changes call for no write of its own.
    let current = tenant
        .status
        .as_ref()
        .map(AgentTenantStatus::operators_part);
    if current.as_ref() == Some(status) {
        return Ok(());
    }
    let ns = tenant.namespace().unwrap_or_default();
    let written = Api::<AgentTenant>::namespaced(c.clone(), &ns)
        .patch_status(
            &tenant.name_any(),
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(status_apply(status)),
        )
        .await?;
    own.wrote(key_of(&written), &written.metadata, None);
    Ok(())
}

/// Told on the tenant, in its status (Ready False, NameTaken) and by a
/// Warning (once per problem), and retried: the object may go, or the
/// tenant be renamed.
async fn name_taken(
    ctx: &Context,
    own: &OwnWrites,
    tenant: &AgentTenant,
    status: &AgentTenantStatus,
    now: &Time,
    e: Error,
) -> Error {
    let status = crate::desired::name_taken(tenant, status, &e.to_string(), now);
    if let Err(w) = write_status(&ctx.client, own, tenant, &status).await {
        tracing::warn!(tenant = %tenant.name_any(), "cannot write the status: {w}");
    }
    if let Err(w) = ctx.events.warn(tenant, "NameTaken", &e.to_string()).await {
        tracing::warn!(tenant = %tenant.name_any(), "cannot publish an event: {w}");
    }
    e
}

/// The first Secret the operator makes for `tenant` (its owner token
/// unless the tenant names one, its peer certificate on Postgres) that
/// exists and is not controlled by the tenant (`controllers`: the
/// controlling owner's uid of each Secret read).
fn generated_not_ours(
    tenant: &AgentTenant,
    ns: &str,
    controllers: &BTreeMap<String, Option<String>>,
) -> Option<Error> {
    let name = tenant.name_any();
    let mut generated = Vec::new();
    if tenant.spec.owner_token_secret_ref.is_none() {
        generated.push((
            names::owner_token_secret(&name),
            "the tenant's owner token",
            ", or, if this tenant is to use it, name it in spec.ownerTokenSecretRef (its author must be allowed to read it)",
        ));
    }
    if crate::desired::postgres_url(tenant).is_some() {
        generated.push((
            names::peer_tls_secret(&name),
            "the replicas' peer certificate",
            "",
        ));
    }
    let uid = tenant.metadata.uid.as_deref();
    generated.into_iter().find_map(|(secret, what, hint)| {
        let controller = controllers.get(&secret)?;
        (controller.as_deref() != uid || uid.is_none()).then(|| Error::SecretNotOurs {
            name: secret,
            namespace: ns.to_string(),
            what,
            hint,
        })
    })
}

/// A new owner token: 32 bytes from the OS, hex. The operator's one
/// source of randomness (the peer certificate's key pair is rcgen's, from
/// aws-lc-rs). A failure is the reconcile's error: logged, counted and
/// retried; no Secret is created without a token.
fn owner_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// The body of the operator's server-side apply of a tenant's status:
/// every field it computes, never those the tenant's agent server writes
/// ([`AgentTenantStatus::SERVER_FIELDS`]). Under a forced apply, a field
/// named here would become the operator's (the server's next apply would
/// conflict), and one the operator once named and then left out would be
/// removed; never named, they stay the server's alone.
pub fn status_apply(status: &AgentTenantStatus) -> serde_json::Value {
    let mut status = serde_json::to_value(status).expect("a status serializes");
    if let Some(fields) = status.as_object_mut() {
        for f in AgentTenantStatus::SERVER_FIELDS {
            fields.remove(f);
        }
    }
    serde_json::json!({
        "apiVersion": "bindery.dev/v1alpha1",
        "kind": "AgentTenant",
        "status": status,
    })
}

/// What of a tenant a change must touch to reconcile it: all of it but
/// its resourceVersion, its managed fields and the status fields the
/// tenant's agent server writes. That server writes its budgets' use as it
/// goes; a reconcile would find nothing to do.
fn tenant_view(tenant: &AgentTenant) -> Option<u64> {
    let mut t = tenant.clone();
    t.metadata.resource_version = None;
    t.metadata.managed_fields = None;
    t.status = t.status.as_ref().map(AgentTenantStatus::operators_part);
    Some(own_writes::digest(&t))
}

/// A namespaced kind that reconcile reads, applies or deletes.
trait Namespaced:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Namespaced for K where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
{
}

/// The key names and resourceVersion of a Secret the operator just
/// created: the keys it gave it (the values, its own, are dropped here).
fn created_keys(s: Secret) -> RefObject {
    let mut keys: BTreeSet<String> = s.data.into_iter().flatten().map(|(k, _)| k).collect();
    keys.extend(s.string_data.into_iter().flatten().map(|(k, _)| k));
    RefObject {
        keys: Some(keys),
        resource_version: s.metadata.resource_version.unwrap_or_default(),
    }
}

/// Key names and resourceVersion of each named Secret that exists, read
/// by metadata only (a GET answered as `PartialObjectMetadata`): the
/// operator never receives a Secret's `data`. The names come from the
/// metadata's record of its writers ([`key_names::secret_key_names`]).
/// Beside them, the uid of each one's controlling owner, if any.
async fn secrets_key_names(
    c: &Client,
    ns: &str,
    names: &BTreeSet<String>,
) -> Result<
    (
        BTreeMap<String, RefObject>,
        BTreeMap<String, Option<String>>,
    ),
    kube::Error,
> {
    let api = Api::<Secret>::namespaced(c.clone(), ns);
    let mut out = BTreeMap::new();
    let mut controllers = BTreeMap::new();
    for n in names {
        if let Some(s) = api.get_metadata_opt(n).await? {
            let keys = key_names::secret_key_names(&s.metadata);
            let meta = key_names::without_values(s.metadata);
            controllers.insert(n.clone(), controller_uid(&meta).map(str::to_string));
            out.insert(
                n.clone(),
                RefObject {
                    keys,
                    resource_version: meta.resource_version.unwrap_or_default(),
                },
            );
        }
    }
    Ok((out, controllers))
}

/// Key names and resourceVersion of each named ConfigMap that exists.
async fn config_maps_key_names(
    c: &Client,
    ns: &str,
    names: &BTreeSet<String>,
) -> Result<BTreeMap<String, RefObject>, kube::Error> {
    let api = Api::<ConfigMap>::namespaced(c.clone(), ns);
    let mut out = BTreeMap::new();
    for n in names {
        if let Some(m) = api.get_opt(n).await? {
            let mut keys: BTreeSet<String> = m.data.into_iter().flatten().map(|(k, _)| k).collect();
            keys.extend(m.binary_data.into_iter().flatten().map(|(k, _)| k));
            out.insert(
                n.clone(),
                RefObject {
                    keys: Some(keys),
                    resource_version: m.metadata.resource_version.unwrap_or_default(),
                },
            );
        }
    }
    Ok(out)
}

/// Delete the objects of kind `K` that the tenant owns (by its label and
/// ownerReference) other than `wanted`: what it no longer asks for.
/// Someone else's object that merely carries the label stays.
async fn prune<K>(
    c: &Client,
    own: &OwnWrites,
    ns: &str,
    tenant: &AgentTenant,
    wanted: &[String],
) -> Result<(), kube::Error>
where
    K: Namespaced,
{
    let api = Api::<K>::namespaced(c.clone(), ns);
    let name = tenant.name_any();
    let selector = format!("{}={name}", names::TENANT_LABEL);
    let uid = tenant.metadata.uid.as_deref();
    // Metadata is all it takes to decide: the objects' bodies never enter
    // the operator's memory.
    for obj in api
        .list_metadata(&ListParams::default().labels(&selector))
        .await?
    {
        let owned = obj
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid);
        let obj_name = obj.name_any();
        if !owned || wanted.contains(&obj_name) {
            continue;
        }
        // Exactly the object listed: one created again meanwhile under
        // the same name is not ours to judge here.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: obj.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match api.delete(&obj_name, &params).await {
            Ok(_) => {
                own.forget(&(K::kind(&()).into_owned(), ns.to_string(), obj_name.clone()));
                tracing::info!(tenant = %name, kind = K::kind(&()).as_ref(), name = %obj_name, "deleted what the tenant no longer asks for")
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Server-side apply under the operator's one field manager, unless it
/// would send what was last applied with nobody's change seen since;
/// whether it was sent.
async fn apply<K>(c: &Client, own: &OwnWrites, ns: &str, obj: &K) -> Result<bool, Error>
where
    K: Namespaced + Serialize,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let key = (K::kind(&()).into_owned(), ns.to_string(), name.clone());
    let digest = own_writes::digest(obj);
    if own.unchanged(&key, digest) {
        return Ok(false);
    }
    let api = Api::<K>::namespaced(c.clone(), ns);
    // A forced apply takes over whatever has the name: one that exists
    // and is not the tenant's (a Role, a ServiceAccount of the same name)
    // is refused instead of overwritten and adopted.
    if let Some(existing) = api.get_metadata_opt(&name).await? {
        if !controlled_alike(&existing.metadata, obj.meta()) {
            return Err(Error::NotOurs {
                kind: key.0,
                name,
                namespace: ns.to_string(),
            });
        }
    }
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(names::FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await?;
    own.wrote(key, applied.meta(), Some(digest));
    Ok(true)
}

/// Whether `existing` is controlled by the owner `desired` names (the
/// tenant, by its uid).
fn controlled_alike(existing: &ObjectMeta, desired: &ObjectMeta) -> bool {
    matches!((controller_uid(existing), controller_uid(desired)), (Some(a), Some(b)) if a == b)
}

/// The uid of the object's controlling owner, if it has one.
fn controller_uid(m: &ObjectMeta) -> Option<&str> {
    m.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::BudgetStatus;

    #[test]
    fn an_owner_token_is_32_random_bytes_in_hex_and_a_failure_names_itself() {
        let (a, b) = (owner_token().unwrap(), owner_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
        let e = Error::Randomness(getrandom::Error::UNSUPPORTED);
        assert_eq!(e.kind(), "randomness");
        assert!(
            e.to_string()
                .starts_with("no randomness from the OS for the owner token"),
            "{e}"
        );
    }

    /// A status the tenant's agent server has written its budget rows to,
    /// on top of the operator's.
    fn with_budgets() -> AgentTenantStatus {
        AgentTenantStatus {
            observed_generation: Some(4),
            params_bound: Some("2/2".into()),
            summary: vec!["tenant (invoices; session, required): pinned".into()],
            budgets: vec![BudgetStatus {
                name: "daily-tokens".into(),
                agent: "invoices".into(),
                meter: "tokens".into(),
                used: 1200.0,
                limit: 200000.0,
                per: "24h".into(),
                on_exceed: Default::default(),
                exhausted: false,
                measured_at: "2026-11-29T12:00:00Z".into(),
            }],
            budget_summary: vec![
                "daily-tokens (agent invoices): 1200 of 200000 tokens per 24h, 0%".into(),
            ],
            ..Default::default()
        }
    }

    /// The operator's status apply never names the fields the agent server
    /// writes (so it neither takes them nor clears them), whatever the
    /// status it is given holds; everything else it computes goes out.
    #[test]
    fn the_operators_status_apply_has_no_budget_fields() {
        let body = status_apply(&with_budgets());
        assert_eq!(body["apiVersion"], "bindery.dev/v1alpha1");
        assert_eq!(body["kind"], "AgentTenant");
        let status = body["status"].as_object().expect("a status");
        for field in ["budgets", "budgetSummary"] {
            assert!(!status.contains_key(field), "{field}: {body:#}");
        }
        assert_eq!(status["observedGeneration"], 4);
        assert_eq!(status["paramsBound"], "2/2");
        assert_eq!(
            status["summary"][0],
            "tenant (invoices; session, required): pinned"
        );
        // Every field of the status but those two is the operator's.
        let all = serde_json::to_value(with_budgets()).unwrap();
        let mut theirs: Vec<&str> = all
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !status.contains_key(*k))
            .map(String::as_str)
            .collect();
        let mut server_fields = AgentTenantStatus::SERVER_FIELDS;
        theirs.sort();
        server_fields.sort();
        assert_eq!(theirs, server_fields);
    }

    /// The budget rows make no difference to whether the operator writes
    /// its status, nor to whether a tenant's change reconciles it.
    #[test]
    fn the_agent_servers_budget_rows_call_for_no_write_and_no_reconcile() {
        let theirs = with_budgets();
        let ours = theirs.operators_part();
        assert!(ours.budgets.is_empty() && ours.budget_summary.is_empty());
        assert_eq!(ours.params_bound, theirs.params_bound);
        assert_eq!(
            ours,
            AgentTenantStatus {
                budgets: vec![],
                budget_summary: vec![],
                ..with_budgets()
            }
        );

        let mut tenant = AgentTenant::new(
            "acme",
            serde_json::from_value(serde_json::json!({"agentRef": {"name": "invoices"}})).unwrap(),
        );
        tenant.metadata.resource_version = Some("10".into());
        tenant.status = Some(ours.clone());
        let before = tenant_view(&tenant);
        // The agent server's apply: new rows, a new resourceVersion, its
        // managed fields.
        tenant.status = Some(theirs);
        tenant.metadata.resource_version = Some("11".into());
        tenant.metadata.managed_fields = Some(vec![Default::default()]);
        assert_eq!(tenant_view(&tenant), before);
        // Anyone else's change to the status (or the spec) does reconcile.
        let mut changed = tenant.clone();
        changed.status.as_mut().unwrap().params_bound = Some("1/2".into());
        assert_ne!(tenant_view(&changed), before);
        let mut changed = tenant.clone();
        changed.spec.replicas = Some(2);
        assert_ne!(tenant_view(&changed), before);
    }
}
