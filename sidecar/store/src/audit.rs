//! The tenant's audit log: every decision that grants or uses authority,
//! one record each, hash-chained (docs/audit.md).
//!
//! A record is a JSON object: `seq` (gapless, from 1), `at` (RFC 3339
//! UTC), `actor`, `action`, `session` (where there is one), `details`,
//! `prev` (the previous record's `hash`, [`GENESIS`] for the first) and
//! `hash`, the SHA-256 of the record's [canonical] form without
//! `hash`. The store seals a record ([`seal`]) in the transaction that
//! appends it, under the log's lock, so the chain never forks or skips.
//! Nothing secret is ever put in one: an [`Action`] names parameters and
//! where their values came from, never a value.

pub mod verify;

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The `prev` of the first record: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Who acted. Derived from the API's caller in one place
/// (`bindery_session::audit::actor`); a tool call is made by a run on
/// behalf of whoever started it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Actor {
    /// The bearer of the owner token.
    Owner,
    /// The bearer of the approver token.
    Approver,
    /// The bearer of a session token of `session`.
    SessionToken { session: String },
    /// The holder of share link `share` (`sh_…`) of `session`.
    Share { session: String, share: String },
    /// An end user signed in by the tenant's identity provider.
    EndUser { subject: String },
    /// The holder of a webhook notice's answer link.
    AnswerLink,
    /// The server itself (a `confirmTtl` that ran out).
    Server,
    /// A run of a session, acting for whoever started it.
    Run {
        run: String,
        on_behalf_of: Box<Actor>,
    },
}

/// A secret parameter bound into a tool call: its name and where its
/// value came from (`session`, `message`, `pinned`, `env BINDERY_PARAM_X`,
/// `default:env X`, …), never the value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    pub name: String,
    pub origin: String,
}

/// What was done; one variant per kind of decision. Its name is the
/// record's `action`, its fields the record's `details`. A new kind of
/// decision is a new variant here and a call that records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", content = "details", rename_all = "snake_case")]
pub enum Action {
    /// A session was created (or forked), with a session token or not.
    SessionCreated {
        agent: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        forked_from: Option<String>,
        sealed: bool,
    },
    /// A session token was issued for the record's session.
    SessionTokenIssued {},
    /// The session's tokens were revoked.
    SessionTokenRevoked {},
    /// A share link of the record's session was made: its id and what it
    /// lets its holder do (`read` or `write`), never its token.
    SessionShared { share: String, mode: String },
    /// A share link of the record's session was revoked.
    ShareRevoked { share: String },
    /// A message was posted (its text is in the session, not here).
    MessagePosted {},
    /// A waiting run was resumed.
    RunResumed {},
    /// Session-scope parameter values were set (names only).
    ParamsSet { names: Vec<String> },
    /// A run called a tool, with these secret parameters bound into it.
    ToolCalled {
        tool: String,
        tool_call_id: String,
        credentials: Vec<Credential>,
    },
    /// A pending call was answered: approved, rejected, given a result.
    PendingAnswered {
        tool: String,
        tool_call_id: String,
        outcome: String,
        cleared_taint: bool,
    },
    /// A person let a run go past a budget.
    BudgetOverridden {
        budget: String,
        tool_call_id: String,
    },
    /// A stored agent was created or replaced.
    AgentStored { slug: String, created: bool },
    /// A stored agent was removed.
    AgentDeleted { slug: String },
    /// The end user's identity token, exchanged for one issued to
    /// `audience` (`AUDIENCE [SCOPE…]`), was handed to a run.
    TokenExchanged { audience: String },
}

/// A record before the store numbers and seals it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Milliseconds since the epoch.
    pub at: i64,
    pub actor: Actor,
    pub session: Option<String>,
    pub action: Action,
}

/// A record as stored: its number, its hash and its line (the canonical
/// JSON with `hash`, which the export hands out as it is).
#[derive(Clone, Debug, PartialEq)]
pub struct Sealed {
    pub seq: i64,
    pub hash: String,
    pub line: String,
}

/// The log's last record, the anchor a verifier checks an export against.
#[derive(Clone, Debug, PartialEq)]
pub struct Head {
    pub seq: i64,
    pub hash: String,
}

/// Why an entry cannot be sealed (not seen: every field serializes).
#[derive(Debug, thiserror::Error)]
#[error("an audit record does not encode: {0}")]
pub struct Unencodable(String);

/// `ms` since the epoch in RFC 3339, UTC, to the millisecond.
pub fn rfc3339(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0);
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `entry` as record `seq` after a record whose hash is `prev`.
pub fn seal(entry: &Entry, seq: i64, prev: &str) -> Result<Sealed, Unencodable> {
    let mut record = match serde_json::to_value(&entry.action) {
        Ok(Value::Object(m)) => m,
        Ok(other) => return Err(Unencodable(format!("an action is {other}"))),
        Err(e) => return Err(Unencodable(e.to_string())),
    };
    let actor = serde_json::to_value(&entry.actor).map_err(|e| Unencodable(e.to_string()))?;
    record.insert("seq".into(), seq.into());
    record.insert("at".into(), rfc3339(entry.at).into());
    record.insert("actor".into(), actor);
    if let Some(s) = &entry.session {
        record.insert("session".into(), s.clone().into());
    }
    record.insert("prev".into(), prev.into());
    let hash = digest(&record);
    record.insert("hash".into(), hash.clone().into());
    Ok(Sealed {
        seq,
        hash,
        line: canonical(&Value::Object(record)),
    })
}

/// The hex SHA-256 of `record`'s canonical form, without its `hash`.
pub fn digest(record: &Map<String, Value>) -> String {
    let mut without = record.clone();
    without.remove("hash");
    hex::encode(Sha256::digest(
        canonical(&Value::Object(without)).as_bytes(),
    ))
}

/// The canonical form: JSON with no whitespace, object keys sorted by
/// their UTF-8 bytes, strings escaped as serde_json escapes them (`"`,
/// `\`, control characters; nothing else), numbers as serde_json prints
/// them (records hold integers only).
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::String(s) => write_string(s, out),
        // null, booleans and numbers print one way.
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // serde_json's escaping of a string cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry() -> Entry {
        Entry {
            at: 1_700_000_000_123,
            actor: Actor::Run {
                run: "r1".into(),
                on_behalf_of: Box::new(Actor::SessionToken {
                    session: "s1".into(),
                }),
            },
            session: Some("s1".into()),
            action: Action::ToolCalled {
                tool: "bash_deploy".into(),
                tool_call_id: "call_1".into(),
                credentials: vec![Credential {
                    name: "token".into(),
                    origin: "session".into(),
                }],
            },
        }
    }

    #[test]
    fn a_record_reads_field_by_field_and_its_hash_covers_all_but_itself() {
        let sealed = seal(&entry(), 7, GENESIS).unwrap();
        let v: Value = serde_json::from_str(&sealed.line).unwrap();
        assert_eq!(
            v,
            json!({
                "seq": 7,
                "at": "2023-11-14T22:13:20.123Z",
                "actor": {"kind": "run", "run": "r1",
                          "on_behalf_of": {"kind": "session-token", "session": "s1"}},
                "session": "s1",
                "action": "tool_called",
                "details": {"tool": "bash_deploy", "tool_call_id": "call_1",
                            "credentials": [{"name": "token", "origin": "session"}]},
                "prev": GENESIS,
                "hash": sealed.hash,
            })
        );
        // The line is canonical: keys sorted, no whitespace.
        assert!(sealed
            .line
            .starts_with(r#"{"action":"tool_called","actor":{"kind":"run","#));
        assert!(!sealed.line.contains(' '));
        assert_eq!(digest(v.as_object().unwrap()), sealed.hash);
        // Any field changes the hash.
        let next = seal(&entry(), 8, GENESIS).unwrap();
        assert_ne!(next.hash, sealed.hash);
        let other_prev = seal(&entry(), 7, &"1".repeat(64)).unwrap();
        assert_ne!(other_prev.hash, sealed.hash);
    }

    #[test]
    fn the_canonical_form_sorts_keys_by_bytes_and_escapes_as_json() {
        let v = json!({"b": 1, "a": [true, null, "x\"\n"], "B": {"z": -2, "é": "ü"}});
        assert_eq!(
            canonical(&v),
            r#"{"B":{"z":-2,"é":"ü"},"a":[true,null,"x\"\n"],"b":1}"#
        );
    }

    #[test]
    fn an_end_user_is_named_by_subject() {
        let a = Actor::EndUser {
            subject: "alice@example.com".into(),
        };
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            json!({"kind": "end-user", "subject": "alice@example.com"})
        );
    }

    #[test]
    fn a_share_is_named_by_its_id_and_its_records_hold_no_token() {
        let a = Actor::Share {
            session: "s1".into(),
            share: "sh_1".into(),
        };
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            json!({"kind": "share", "session": "s1", "share": "sh_1"})
        );
        let shared = Action::SessionShared {
            share: "sh_1".into(),
            mode: "read".into(),
        };
        assert_eq!(
            serde_json::to_value(&shared).unwrap(),
            json!({"action": "session_shared", "details": {"share": "sh_1", "mode": "read"}})
        );
        let revoked = Action::ShareRevoked {
            share: "sh_1".into(),
        };
        assert_eq!(
            serde_json::to_value(&revoked).unwrap(),
            json!({"action": "share_revoked", "details": {"share": "sh_1"}})
        );
    }
}
