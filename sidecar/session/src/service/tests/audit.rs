//! An audit record that cannot be appended fails what it would record:
//! no session is created, no tool is called, unaudited.

use std::sync::Arc;

use serde_json::json;

use super::harness::{agent, no_params, Client, Hook, Reply, World};
use crate::error::ErrorKind;
use crate::service::{CreateSession, ServiceConfig};
use crate::validate::Caller;
use bindery_store::audit::{Action, Entry};
use bindery_store::StoreError;

/// A store whose audit appends of `refused` kinds fail, as a store that
/// stops answering does.
struct Refuses(fn(&Action) -> bool);

impl Hook for Refuses {
    fn audit(&self, entry: &Entry) -> Result<(), StoreError> {
        match (self.0)(&entry.action) {
            true => Err(StoreError::Unavailable("the audit table is locked".into())),
            false => Ok(()),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_session_whose_creation_cannot_be_recorded_is_not_created() {
    let world = World::watched(&[agent("clerk", "")], false, Arc::new(Refuses(|_| true))).await;
    let server = world.server(ServiceConfig::default()).await;
    let refused = server
        .sessions()
        .create(
            &Caller::Owner,
            CreateSession {
                agent: Some("clerk".into()),
                ..Default::default()
            },
        )
        .await
        .err()
        .expect("created unaudited");
    assert_eq!(refused.kind, ErrorKind::Unavailable);
    assert!(world.store.list().await.unwrap().is_empty());
    assert!(world.store.audit_after(0, 10).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_that_cannot_be_recorded_is_not_made() {
    let refuse_calls = |a: &Action| matches!(a, Action::ToolCalled { .. });
    let world = World::watched(
        &[agent("clerk", "")],
        false,
        Arc::new(Refuses(refuse_calls)),
    )
    .await;
    world
        .model
        .then(Reply::Calls(vec![(
            "io_system",
            json!({"capability": "hostname"}),
        )]))
        .then(Reply::Text("I could not look."));
    let server = world.server(ServiceConfig::default()).await;
    let client = Client(&server);
    let id = client.open("clerk", no_params()).await;
    client.say(&id, "which host is this?").await;

    let seen = world.model.seen();
    let result = seen[1].messages.last().unwrap();
    let bindery_llm::ChatMessage::Tool { content, .. } = result else {
        panic!("the second request ends with the call's result: {result:?}");
    };
    let content = content.text();
    assert!(
        content.contains("the audit log could not record this call, so it was not made"),
        "{content}"
    );
    // Nothing of the host's name reached the model: the tool did not run.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    assert!(
        host.trim().is_empty() || !content.contains(host.trim()),
        "{content}"
    );
    let actions: Vec<String> = world
        .store
        .audit_after(0, 10)
        .await
        .unwrap()
        .iter()
        .map(|s| serde_json::from_str::<serde_json::Value>(&s.line).unwrap()["action"].to_string())
        .collect();
    assert_eq!(actions, ["\"session_created\"", "\"message_posted\""]);
}
