//! The tenant's audit log as the service writes it: who acted ([`actor`],
//! the one place an API caller becomes a record's `actor`) and the record
//! appended before the decision takes effect ([`AuditLog::record`]). An
//! append that fails fails the decision: nothing is granted unaudited.

use std::sync::Arc;

use crate::error::ServiceError;
use crate::validate::Caller;
use bindery_store::audit::{Action, Actor, Entry, Sealed};
use bindery_store::clock::Clock;
use bindery_store::SessionStore;

/// Who the API's `caller` is, in an audit record.
pub fn actor(caller: &Caller) -> Actor {
    match caller {
        Caller::Owner => Actor::Owner,
        Caller::Approver => Actor::Approver,
        Caller::SessionToken(session) => Actor::SessionToken {
            session: session.clone(),
        },
        Caller::EndUser(person) => Actor::EndUser {
            subject: person.subject.to_string(),
        },
        Caller::Share(holder) => Actor::Share {
            session: holder.session.clone(),
            share: holder.share.clone(),
        },
    }
}

/// Who answered a pending call: the holder of a notice's answer link
/// (which comes through the approver's door), else the caller.
pub fn answerer(caller: &Caller, by_link: bool) -> Actor {
    match by_link {
        true => Actor::AnswerLink,
        false => actor(caller),
    }
}

/// The audit log in the store.
pub struct AuditLog {
    store: Arc<dyn SessionStore>,
    clock: Arc<dyn Clock>,
}

impl AuditLog {
    pub fn new(store: Arc<dyn SessionStore>, clock: Arc<dyn Clock>) -> AuditLog {
        AuditLog { store, clock }
    }

    /// Append that `by` did `action` (in `session`, where there is one).
    /// Called before the action takes effect: an `Err` means it must not.
    pub async fn record(
        &self,
        by: Actor,
        session: Option<&str>,
        action: Action,
    ) -> Result<Sealed, ServiceError> {
        let entry = Entry {
            at: self.clock.now_ms(),
            actor: by,
            session: session.map(str::to_string),
            action,
        };
        self.store.append_audit(&entry).await.map_err(|e| {
            tracing::error!(
                session = session.unwrap_or(""),
                "the audit log could not record a decision, which was therefore not carried out: {e}"
            );
            ServiceError::from(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_caller_is_an_actor_of_its_kind() {
        let kinds: Vec<serde_json::Value> = [
            Caller::Owner,
            Caller::Approver,
            Caller::SessionToken("s1".into()),
            Caller::Share(crate::validate::ShareHolder {
                session: "s1".into(),
                share: "sh_1".into(),
                mode: bindery_store::model::ShareMode::Write,
            }),
        ]
        .iter()
        .map(|c| serde_json::to_value(actor(c)).unwrap())
        .collect();
        assert_eq!(
            kinds,
            [
                serde_json::json!({"kind": "owner"}),
                serde_json::json!({"kind": "approver"}),
                serde_json::json!({"kind": "session-token", "session": "s1"}),
                serde_json::json!({"kind": "share", "session": "s1", "share": "sh_1"}),
            ]
        );
    }
}
