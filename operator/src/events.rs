//! Kubernetes Events for what a human must fix, as core/v1 Events so that
//! `kubectl describe agenttenant` (or `agent`) lists them.
//!
//! One Event per problem of a tenant or Agent: its name derives from the
//! object's uid, the reason and the message, so a problem that comes back counts up
//! (`count`, `lastTimestamp`) on the Event it already has instead of adding
//! another. kube-runtime's `Recorder` would do the same with
//! events.k8s.io/v1 series, but the API emulator the tests run against
//! stores the two Event APIs apart (an API server shows one through the
//! other), so `kubectl describe` there would not see them.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use sha2::{Digest, Sha256};

use crate::crd::{Agent, AgentTenant};

pub(crate) const COMPONENT: &str = "bindery-operator";

pub(crate) fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

/// The Event's name for one problem of one object.
fn name(about: &ObjectReference, reason: &str, message: &str) -> String {
    let mut h = Sha256::new();
    for part in [about.uid.as_deref().unwrap_or_default(), reason, message] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let object = about.name.as_deref().unwrap_or_default();
    format!("{object}.{}", &hex::encode(h.finalize())[..16])
}

fn reference(kind: &str, name: String, ns: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("bindery.dev/v1alpha1".into()),
        kind: Some(kind.into()),
        name: Some(name),
        namespace: Some(ns.into()),
        uid,
        ..Default::default()
    }
}

/// Publish a Warning about `tenant`, or count one more occurrence of it.
pub(crate) async fn warn(
    client: &Client,
    tenant: &AgentTenant,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let ns = tenant.namespace().unwrap_or_else(|| "default".into());
    let about = reference("AgentTenant", tenant.name_any(), &ns, tenant.uid());
    publish(client, about, reason, message).await
}

/// Publish a Warning about `agent` (what its checks found), or count one
/// more occurrence of it.
pub(crate) async fn warn_agent(
    client: &Client,
    agent: &Agent,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let ns = agent.namespace().unwrap_or_else(|| "default".into());
    let about = reference("Agent", agent.name_any(), &ns, agent.uid());
    publish(client, about, reason, message).await
}

async fn publish(
    client: &Client,
    about: ObjectReference,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let ns = about.namespace.clone().unwrap_or_default();
    let api = Api::<Event>::namespaced(client.clone(), &ns);
    let name = name(&about, reason, message);
    let now = now();
    if let Some(seen) = api.get_opt(&name).await? {
        // The resourceVersion makes a concurrent count a conflict, not a loss.
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": seen.metadata.resource_version},
            "count": seen.count.unwrap_or(1) + 1,
            "lastTimestamp": Time(now),
        });
        return api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ());
    }
    let ev = Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: about,
        reason: Some(reason.into()),
        // An Event message is at most 1 kB.
        message: Some(message.chars().take(1000).collect()),
        type_: Some("Warning".into()),
        action: Some("Reconcile".into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: None,
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(std::env::var("POD_NAME").unwrap_or_else(|_| COMPONENT.into())),
        ..Default::default()
    };
    api.create(&PostParams::default(), &ev).await.map(|_| ())
}
