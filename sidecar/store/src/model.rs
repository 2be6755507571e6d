//! What a session is, as it is stored: everything but secret values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use bindery_llm::Turn;
use bindery_params::Values;

/// Where a session stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// No run in progress; ready for a message.
    Idle,
    /// A run is in progress.
    Running,
    /// The last run failed (see `status_detail`); a new message may follow.
    Failed,
    /// The run stopped with tool calls pending (see `pending`): it resumes
    /// once each is answered through its continuation.
    WaitingExternal,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Idle => "idle",
            SessionStatus::Running => "running",
            SessionStatus::Failed => "failed",
            SessionStatus::WaitingExternal => "waiting_external",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "idle" => Some(SessionStatus::Idle),
            "running" => Some(SessionStatus::Running),
            "failed" => Some(SessionStatus::Failed),
            "waiting_external" => Some(SessionStatus::WaitingExternal),
            _ => None,
        }
    }
}

/// Session-scope values that may be written down: never a secret. The only
/// way to build one from live values drops every secret.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StoredParams(BTreeMap<String, serde_json::Value>);

impl StoredParams {
    pub fn from_values(values: &Values) -> Self {
        StoredParams(
            values
                .iter()
                .filter_map(|(k, v)| v.plain().map(|p| (k.clone(), p.clone())))
                .collect(),
        )
    }

    pub fn as_map(&self) -> &BTreeMap<String, serde_json::Value> {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Who may do what with a session, beyond its owner.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Security {
    /// Parameters may no longer be changed by anyone but the owner.
    pub sealed: bool,
    /// SHA-256 (hex) of the session tokens; never the tokens.
    pub token_digests: Vec<String>,
    /// Who created the session: `owner` (the session API) or `mcp` (a
    /// `tools/call` on `/mcp`). Absent in sessions stored before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The end user the session belongs to (created by them with their
    /// identity token, or forked by them): they, and the owner, may use
    /// it; no other end user sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<bindery_identity::Subject>,
    /// Session pins: names whose value was fixed when the session was
    /// created (or forked); no request may give them again. The values are
    /// the session's own (a secret one is never stored, like any secret).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<String>,
    /// A person cleared the taint guard when the session had this many
    /// turns: untrusted results before it no longer hold egress calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint_cleared_at: Option<usize>,
    /// The session's share links, live and revoked (each by its token's
    /// digest, never the token). Absent in sessions stored before shares.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<Share>,
}

/// What a share link lets its holder do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShareMode {
    /// Read the session, its events and its pending items.
    Read,
    /// What a session token may do: read, post messages, cancel a run.
    Write,
}

impl ShareMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareMode::Read => "read",
            ShareMode::Write => "write",
        }
    }
}

/// One share link of a session, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Share {
    /// `sh_…`: names the share in its list, its revocation and the audit.
    pub id: String,
    pub mode: ShareMode,
    /// SHA-256 (hex) of the share's token; emptied when it is revoked.
    pub digest: String,
    /// Who shared, as the audit names them: `owner`, or `user:<subject>`.
    pub shared_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<i64>,
}

impl Share {
    pub fn live(&self) -> bool {
        self.revoked_at.is_none()
    }
}

impl Security {
    /// The share `id`, live (not revoked).
    pub fn live_share(&self, id: &str) -> Option<&Share> {
        self.shares.iter().find(|s| s.id == id && s.live())
    }
}

/// A session as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRecord {
    pub id: String,
    pub agent: String,
    pub status: SessionStatus,
    pub status_detail: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    pub updated_at: i64,
    /// Bumped on every update; the store refuses a stale write.
    pub version: i64,
    /// The conversation as the model made it: bound values never appear.
    /// It only grows: a write appends, it never rewrites a turn.
    pub turns: Vec<Turn>,
    /// How many of `turns` the store holds (the store sets it when it
    /// reads or writes the record): a write stores only the ones after
    /// them, and is refused as a conflict if the store holds another
    /// number.
    pub stored_turns: usize,
    pub params: StoredParams,
    pub security: Security,
    pub forked_from: Option<String>,
    /// The server instance running the session's run (`Some` only while
    /// `status` is `running`): whose heartbeat vouches for the run.
    pub runner: Option<String>,
    /// A server that does not run the session asked its runner to cancel
    /// the run; the runner acts on it within a heartbeat (cleared when the
    /// run's end is written).
    pub cancel_requested: bool,
    /// The calls the session waits for (never a bound value, never a token).
    pub pending: crate::pending::Pending,
    /// On a shared store: the server instance whose memory holds the
    /// session's secret values (they are never stored), so that another
    /// server forwards the requests that need them there.
    pub holder: Option<String>,
}

/// One event of a session's stream (`GET /v1/sessions/:id/events`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Per session, from 1, in order; the SSE `id`.
    pub seq: i64,
    /// `run_started`, `message`, `tool_call`, `tool_result`, `run_finished`, …
    pub kind: String,
    pub data: serde_json::Value,
    pub at: i64,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use bindery_params::{ParamValue, SecretString};

    const ALL: [SessionStatus; 4] = [
        SessionStatus::Idle,
        SessionStatus::Running,
        SessionStatus::Failed,
        SessionStatus::WaitingExternal,
    ];

    #[test]
    fn each_status_reads_back_from_its_name_as_stored_and_shown() {
        let names: Vec<&str> = ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["idle", "running", "failed", "waiting_external"]);
        for s in ALL {
            assert_eq!(SessionStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
            assert_eq!(
                serde_json::from_value::<SessionStatus>(json!(s.as_str())).unwrap(),
                s
            );
        }
    }

    #[test]
    fn a_status_is_read_from_its_exact_name_only() {
        for text in ["", "Idle", " idle", "idle ", "waiting-external", "waiting"] {
            assert_eq!(SessionStatus::parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn stored_params_keep_the_plain_values_and_drop_every_secret() {
        let values: Values = [
            ("tenant".to_string(), ParamValue::Plain(json!("acme"))),
            ("limits".to_string(), ParamValue::Plain(json!({"max": 3}))),
            (
                "token".to_string(),
                ParamValue::Secret(SecretString::new("sk-canary-7f3a")),
            ),
        ]
        .into();
        let stored = StoredParams::from_values(&values);
        assert_eq!(
            serde_json::to_value(&stored).unwrap(),
            json!({"limits": {"max": 3}, "tenant": "acme"})
        );
        assert!(!format!("{stored:?}").contains("7f3a"));
        let only_secret: Values = [(
            "token".to_string(),
            ParamValue::Secret(SecretString::new("sk-canary-7f3a")),
        )]
        .into();
        assert!(StoredParams::from_values(&only_secret).is_empty());
    }

    #[test]
    fn security_stored_before_owners_pins_and_the_taint_guard_reads_without_them() {
        let old: Security =
            serde_json::from_value(json!({"sealed": true, "token_digests": ["ab"]})).unwrap();
        assert_eq!(
            old,
            Security {
                sealed: true,
                token_digests: vec!["ab".into()],
                ..Default::default()
            }
        );
        assert_eq!(
            serde_json::to_value(Security::default()).unwrap(),
            json!({"sealed": false, "token_digests": []})
        );
    }

    #[test]
    fn a_share_is_stored_by_its_digest_and_read_back() {
        let share = Share {
            id: "sh_1".into(),
            mode: ShareMode::Read,
            digest: "ab".repeat(32),
            shared_by: "owner".into(),
            note: None,
            created_at: 7,
            revoked_at: None,
        };
        let sec = Security {
            shares: vec![share.clone()],
            ..Default::default()
        };
        let stored = serde_json::to_value(&sec).unwrap();
        assert_eq!(
            stored["shares"],
            json!([{"id": "sh_1", "mode": "read", "digest": "ab".repeat(32),
                    "shared_by": "owner", "created_at": 7}])
        );
        let back: Security = serde_json::from_value(stored).unwrap();
        assert_eq!(back, sec);
        assert_eq!(back.live_share("sh_1"), Some(&share));
        assert_eq!(back.live_share("sh_2"), None);
        let mut revoked = sec;
        revoked.shares[0].revoked_at = Some(8);
        assert_eq!(
            revoked.live_share("sh_1"),
            None,
            "a revoked share is not live"
        );
        assert!(serde_json::from_value::<ShareMode>(json!("admin")).is_err());
    }
}
