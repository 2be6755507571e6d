//! The Kubernetes objects of a tenant whose agent and parameters resolved,
//! each rendered by the module named after it: the ConfigMap of the agents'
//! files and params file (`config_map`), the pod's config hash
//! (`config_hash`), the sidecar container and its flags (`sidecar`), the
//! session store (`store`, with the claim), the access to post Events and
//! write budgets (`events`), the pod template (`pod`), the Deployment
//! (`deployment`), the Service and ServiceAccount (`service`), the
//! environment variables (`env`), and the Secrets made once when absent
//! (`generated`). All pure: inputs in, objects out.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Service, ServiceAccount, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::params::Supply;
use super::tree::TreeAgent;
use super::Inputs;
use crate::names::labels;
use bindery_spec::budget::Budget;

mod config_hash;
mod config_map;
mod deployment;
mod env;
mod events;
mod generated;
mod pod;
mod service;
mod sidecar;
mod store;

pub(crate) use generated::{generated_owner_token, generated_peer_tls};

/// Everything a tenant runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects {
    pub config_map: ConfigMap,
    pub service_account: ServiceAccount,
    pub deployment: Deployment,
    pub service: Service,
    pub claim: Option<PersistentVolumeClaim>,
    /// For a tenant whose agent tree has an approval webhook or a budget:
    /// what lets its pods post Warning Events on it (and, with a budget,
    /// write the budgets' use to its status). None otherwise, and then the
    /// pods hold no ServiceAccount token at all.
    pub events_access: Option<EventsAccess>,
}

/// A Role allowing its holder to create Events in the tenant's namespace
/// (`events.k8s.io`, nothing else: not read them, not change one) and,
/// for a tenant with budgets, to get and patch the status of its own
/// `AgentTenant` (by name: no other tenant's, not the spec); and its
/// binding to the tenant's ServiceAccount.
#[derive(Clone, Debug, PartialEq)]
pub struct EventsAccess {
    pub role: Role,
    pub binding: RoleBinding,
}

/// Whether an agent of the tree announces calls that wait for a person to
/// an approval webhook (whose failures the sidecar reports as Events).
pub(crate) fn has_webhook(tree: &[TreeAgent<'_>]) -> bool {
    tree.iter().any(|a| {
        a.spec
            .approvals
            .as_ref()
            .is_some_and(|p| p.webhook.is_some())
    })
}

/// Whether an agent of the tree, as rendered for the tenant, has a budget
/// (whose use the sidecar writes to the tenant's status, and whose
/// exhaustion it posts as an Event): the tenant's own budgets, which
/// overlay its agent's, or any agent's of the tree.
pub(crate) fn has_budgets(tree: &[TreeAgent<'_>], tenant_budgets: &[Budget]) -> bool {
    !tenant_budgets.is_empty() || tree.iter().any(|a| !a.spec.budgets.is_empty())
}

/// The metadata of an object the tenant owns: its name, the tenant's
/// namespace and labels, and the tenant as its controller.
fn meta(name: String, inputs: &Inputs<'_>, owner: &OwnerReference) -> ObjectMeta {
    let tenant = inputs.tenant_name();
    ObjectMeta {
        name: Some(name),
        namespace: inputs.tenant.metadata.namespace.clone(),
        labels: Some(labels(tenant)),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

pub(crate) fn render(
    inputs: &Inputs<'_>,
    tree: &[TreeAgent<'_>],
    supplies: &BTreeMap<String, (Supply, bool)>,
    owner: &OwnerReference,
) -> Objects {
    let spec = &inputs.tenant.spec;
    let params = config_map::Parameters::of(supplies);
    let files = config_map::files(tree, spec, &params.file);
    let config_hash = config_hash::config_hash(inputs, &files, supplies);
    let claim = store::claim(inputs, owner);
    let webhook = has_webhook(tree);
    let budgets = has_budgets(tree, &spec.budgets);
    let events = webhook || budgets;
    let overrides = spec.pod_overrides.clone().unwrap_or_default();

    // In the order the pod lists its volumes, mounts, arguments, ports
    // and environment.
    let mut parts = pod::Parts::join([
        sidecar::files_and_serve(inputs, tree, params.env),
        store::store(inputs, claim.as_ref()),
        sidecar::tmp(),
        sidecar::server_flags(spec),
        sidecar::tools(spec),
        if events {
            events::events_parts(inputs)
        } else {
            pod::Parts::default()
        },
        sidecar::public_url(inputs, webhook),
        pod::overrides_parts(&overrides),
    ]);
    let volumes = std::mem::take(&mut parts.volumes);
    let sidecar = sidecar::container(inputs, parts);
    let template = pod::template(
        inputs.tenant_name(),
        sidecar,
        volumes,
        overrides,
        config_hash,
    );
    Objects {
        config_map: config_map::config_map(inputs, owner, files),
        service_account: service::service_account(inputs, owner),
        deployment: deployment::deployment(inputs, owner, template, claim.is_some()),
        service: service::service(inputs, owner),
        events_access: events.then(|| events::events_rbac(inputs, owner, budgets)),
        claim,
    }
}
