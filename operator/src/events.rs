//! Kubernetes Events for what a human must fix: events.k8s.io/v1 Events
//! published through kube-runtime's `Recorder`, which `kubectl describe
//! agenttenant` (or `agent`) lists, since the API server serves one Event
//! through both Event APIs.
//!
//! One Event per problem of a tenant or Agent, and a problem that comes
//! back counts up on the Event it already has (its `series`). A `Recorder`
//! tells events apart by object, reason and action but not by message, so
//! two problems with one reason (a Secret missing, then another) would
//! count up on one Event that names only the first. Hence one `Recorder`
//! per problem: object, reason and message.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

use crate::crd::{Agent, AgentTenant};

pub(crate) const COMPONENT: &str = "bindery-operator";
/// The longest note the API server takes (bytes).
const NOTE_MAX: usize = 1024;
/// A problem not seen again for this long starts a new Event when it
/// comes back (the `Recorder` itself forgets an Event after six minutes).
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

pub(crate) fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

/// One problem: the object's uid, the reason and the message's hash.
type Problem = (String, &'static str, u64);

/// Publishes Warnings, one Event per problem.
pub struct Publisher {
    client: Client,
    reporter: Reporter,
    /// (object uid, reason, message hash) → its Recorder and when it last
    /// published.
    problems: Mutex<HashMap<Problem, (Recorder, Instant)>>,
}

impl Publisher {
    /// Events reported as `bindery-operator`, from the instance `POD_NAME`
    /// (the pod, as the chart sets it).
    pub fn new(client: Client) -> Publisher {
        let instance = std::env::var("POD_NAME").ok().filter(|p| !p.is_empty());
        Publisher {
            client,
            reporter: Reporter {
                controller: COMPONENT.into(),
                instance,
            },
            problems: Mutex::default(),
        }
    }

    /// Publish a Warning about `tenant`, or count one more occurrence of it.
    pub(crate) async fn warn(
        &self,
        tenant: &AgentTenant,
        reason: &'static str,
        message: &str,
    ) -> Result<(), kube::Error> {
        self.publish(tenant.object_ref(&()), reason, message).await
    }

    /// Publish a Warning about `agent` (what its checks found), or count
    /// one more occurrence of it.
    pub(crate) async fn warn_agent(
        &self,
        agent: &Agent,
        reason: &'static str,
        message: &str,
    ) -> Result<(), kube::Error> {
        self.publish(agent.object_ref(&()), reason, message).await
    }

    async fn publish(
        &self,
        about: ObjectReference,
        reason: &'static str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let recorder = self.recorder(&about, reason, message);
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(truncate(message, NOTE_MAX).to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        recorder.publish(&event, &about).await
    }

    /// The problem's Recorder: the one it had, or a new one.
    fn recorder(&self, about: &ObjectReference, reason: &'static str, message: &str) -> Recorder {
        let mut h = DefaultHasher::new();
        message.hash(&mut h);
        let key = (about.uid.clone().unwrap_or_default(), reason, h.finish());
        let now = Instant::now();
        let mut problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        problems.retain(|_, (_, used)| now.duration_since(*used) < FORGET_AFTER);
        let entry = problems.entry(key).or_insert_with(|| {
            (
                Recorder::new(self.client.clone(), self.reporter.clone()),
                now,
            )
        });
        entry.1 = now;
        entry.0.clone()
    }
}

/// At most `max` bytes of `text`, cut on a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_note_is_cut_on_a_character_boundary() {
        assert_eq!(super::truncate("abc", 10), "abc");
        assert_eq!(super::truncate("ééé", 3), "é");
        assert_eq!(super::truncate("ééé", 4), "éé");
    }
}
