//! Kubernetes Events for what a human must fix, as core/v1 Events so that
//! `kubectl describe agenttenant` lists them.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use crate::crd::AgentTenant;

pub const COMPONENT: &str = "bindery-operator";

pub fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

/// Publish a Warning about `tenant`.
pub async fn warn(
    client: &Client,
    tenant: &AgentTenant,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let ns = tenant.namespace().unwrap_or_else(|| "default".into());
    let now = now();
    let ev = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", tenant.name_any())),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("bindery.dev/v1alpha1".into()),
            kind: Some("AgentTenant".into()),
            name: Some(tenant.name_any()),
            namespace: Some(ns.clone()),
            uid: tenant.metadata.uid.clone(),
            ..Default::default()
        },
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
    Api::<Event>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ev)
        .await
        .map(|_| ())
}
