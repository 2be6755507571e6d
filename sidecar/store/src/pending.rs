//! Calls a run stopped before (pure: no I/O). Each pending item says why it
//! waits (its [`Disposition`]), what the model asked for, and how its
//! continuation is checked: a digest of the exact call (tool, the model's
//! arguments, the names of the bound parameters, never a value) and the
//! SHA-256 of its single-use token. The token itself is never stored: it
//! is derived from a nonce with the server's continuation key, so every
//! replica that shares the key shows the same token, before and after a
//! restart.
//!
//! Another reason to wait is another [`Disposition`], the answer it takes
//! ([`resolution_for`]), a [`Resolution`], and what the resumed run does
//! with it (`runner::answer_resolved`).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::wire::{Outcome, PendingItem};
use bindery_tools::Disposition;

/// What a session waits for, and the tokens already answered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    pub items: Vec<PendingCall>,
    /// Digests of the tokens of answered or closed calls: a second use of
    /// one is a conflict, not an unknown token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used: Vec<String>,
    /// Of those, the digests of calls that expired unanswered: a late
    /// answer is told so (`continuation_expired`), not that someone
    /// answered first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expired: Vec<String>,
    /// The calls were a client's (an MCP `tools/call`), not the model's:
    /// once they are answered the run ends with no model turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client_call: bool,
    /// The run that waits, which goes on once the items are answered: its
    /// id (what `per: run` budgets count) and the budgets a person let it
    /// go past.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<WaitingRun>,
}

/// A waiting run, as its resumption needs it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitingRun {
    pub id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets_approved: Vec<String>,
}

/// One call that waits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    pub tool_call_id: String,
    /// The model-visible tool name.
    pub tool: String,
    pub disposition: Disposition,
    /// The model's arguments, as it sent them (bound values never appear).
    pub call: serde_json::Value,
    /// Names of the parameters bound into the call, never their values.
    pub bound_params: Vec<String>,
    /// [`call_digest`] of the call.
    pub digest: String,
    /// Random; the token is derived from it (see [`token_for`]).
    pub nonce: String,
    /// SHA-256 of the token.
    pub token_digest: String,
    /// Milliseconds since the epoch; past it, the call is closed as not approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// Set once answered; the run resumes when every item is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    /// The helpers the call was made in, outermost first (empty: the
    /// session's own agent made it): what resuming them needs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<Frame>,
    /// For an input, a selection or a confirmation of a tool with
    /// dependencies: where its orchestration stands (server-side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<crate::lookup::LookupState>,
    /// An egress call held by the taint guard: the untrusted calls whose
    /// results the session took in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tainted_by: Vec<TaintSource>,
    /// A used-up `confirm` budget the run waits at (disposition `budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::wire::Exceeded>,
}

pub use crate::wire::TaintSource;

/// A helper run suspended at a pending call: the `prompt_agent_*` call
/// that started it (in its caller's history) and its own history so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    pub call_id: String,
    /// `prompt_agent_<slug>`.
    pub tool: String,
    /// The calling model's arguments, as it sent them.
    pub arguments: String,
    /// The helper's conversation (never a bound value, like any history).
    pub history: Vec<bindery_llm::Turn>,
}

impl PendingCall {
    /// The id the API shows: unique in the session even for a call made
    /// inside a helper (`<prompt_agent call id>/<call id>`).
    pub fn id(&self) -> String {
        let mut parts: Vec<&str> = self.frames.iter().map(|f| f.call_id.as_str()).collect();
        parts.push(&self.tool_call_id);
        parts.join("/")
    }

    /// The helpers it was made in, outermost first.
    pub fn via(&self) -> Vec<String> {
        self.frames.iter().map(|f| f.tool.clone()).collect()
    }

    /// The item as clients see it, without its token (events carry this;
    /// the session view adds the token and when it expires).
    pub fn shown(&self) -> PendingItem {
        let asked = self.lookup.as_ref().map(|l| l.asked()).unwrap_or_default();
        PendingItem {
            tool_call_id: self.id(),
            continuation_token: None,
            tool: self.tool.clone(),
            via: self.via(),
            disposition: self.disposition,
            call: self.call.clone(),
            missing: asked.missing,
            lookup: asked.lookup,
            options: asked.options,
            facts: asked.facts,
            note: asked.note,
            tainted_by: self.tainted_by.clone(),
            expires_at: None,
            budget: self.budget.clone(),
        }
    }
}

/// How a pending call was answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Resolution {
    /// A deferred call's result, from the client.
    Result { output: String },
    /// A person approved: the tool runs when the run resumes.
    Approved,
    /// A person said no.
    Rejected {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A selection's answer: the option id as shown.
    Chosen { option: String },
    /// The user-owned fields a `needs_input` item asked for.
    Input {
        values: serde_json::Map<String, serde_json::Value>,
    },
    /// Nobody answered within `confirmTtl`, or what the answer rests on went stale.
    Expired,
    /// The run was cancelled while the call waited.
    Cancelled,
}

impl Resolution {
    pub fn outcome(&self) -> Outcome {
        match self {
            Resolution::Result { .. } => Outcome::Result,
            Resolution::Approved => Outcome::Approved,
            Resolution::Chosen { .. } => Outcome::Chosen,
            Resolution::Input { .. } => Outcome::Input,
            Resolution::Rejected { .. } => Outcome::Rejected,
            Resolution::Expired => Outcome::Expired,
            Resolution::Cancelled => Outcome::Cancelled,
        }
    }

    /// Why the call did not run, as the model reads it (`None`: it ran,
    /// here or at the client).
    pub fn refusal(&self) -> Option<String> {
        match self {
            Resolution::Result { .. }
            | Resolution::Approved
            | Resolution::Chosen { .. }
            | Resolution::Input { .. } => None,
            Resolution::Rejected { reason: Some(r) } => Some(format!(
                "a person did not approve this call, so it did not run; their reason: {r}"
            )),
            Resolution::Rejected { reason: None } => {
                Some("a person did not approve this call, so it did not run".into())
            }
            Resolution::Expired => {
                Some("nobody approved this call in time, so it did not run".into())
            }
            Resolution::Cancelled => Some("the run was cancelled".into()),
        }
    }
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Every item is answered: the run can resume.
    pub fn all_resolved(&self) -> bool {
        self.items.iter().all(|i| i.resolution.is_some())
    }

    /// The items nobody answered yet.
    pub fn open(&self) -> impl Iterator<Item = &PendingCall> {
        self.items.iter().filter(|i| i.resolution.is_none())
    }

    /// Close every open item with `r`; their tokens become used.
    pub fn close_all(&mut self, r: &Resolution) -> Vec<String> {
        let mut closed = Vec::new();
        for i in self.items.iter_mut().filter(|i| i.resolution.is_none()) {
            i.resolution = Some(r.clone());
            closed.push(i.id());
        }
        self.retire_tokens();
        closed
    }

    /// The waiting run ends without going on (a cancel): its open items
    /// closed with `r`, and nothing of it left to resume (neither its
    /// items, nor that they were a client's calls, nor the run itself);
    /// the used and expired tokens stay known. The ids of the items it
    /// closed.
    pub fn end_run(&mut self, r: &Resolution) -> Vec<String> {
        let closed = self.close_all(r);
        self.items.clear();
        self.client_call = false;
        self.run = None;
        closed
    }

    /// Record every answered item's token as used.
    pub fn retire_tokens(&mut self) {
        for i in self.items.iter().filter(|i| i.resolution.is_some()) {
            if !self.used.contains(&i.token_digest) {
                self.used.push(i.token_digest.clone());
            }
        }
    }

    /// Close the open items whose time ran out at `now`; their ids.
    pub fn expire(&mut self, now: i64) -> Vec<String> {
        let mut expired = Vec::new();
        for i in self.items.iter_mut() {
            if i.resolution.is_none() && i.expires_at.is_some_and(|t| t <= now) {
                i.resolution = Some(Resolution::Expired);
                expired.push(i.id());
                self.expired.push(i.token_digest.clone());
            }
        }
        self.retire_tokens();
        expired
    }

    /// The summary of what the session waits for (`status_detail`); with
    /// every call answered, that is a resume.
    pub fn detail(&self) -> String {
        let what: Vec<String> = self
            .open()
            .map(|i| {
                let via = match i.frames.last() {
                    Some(f) => format!(" (in {})", f.tool),
                    None => String::new(),
                };
                match i.disposition {
                    Disposition::Confirm => format!("a person's approval of {}{via}", i.tool),
                    Disposition::Deferred => format!("the client's result of {}{via}", i.tool),
                    Disposition::NeedsInput => format!("the user's input to {}{via}", i.tool),
                    Disposition::NeedsSelection => format!("a person's choice for {}{via}", i.tool),
                    Disposition::NeedsConfirmation => {
                        format!("a person's confirmation of {}{via}", i.tool)
                    }
                    Disposition::Budget => match &i.budget {
                        Some(b) => format!("a person to let the run go past budget {}", b.budget),
                        None => "a person to let the run go past a budget".to_string(),
                    },
                }
            })
            .collect();
        if what.is_empty() {
            return "waiting for a resume: every pending call is answered".to_string();
        }
        format!("waiting for {}", what.join(", "))
    }
}

/// An answer to a pending call, as the client sent it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reply<'a> {
    pub result: Option<&'a serde_json::Value>,
    pub approve: Option<bool>,
    pub reason: Option<&'a str>,
    pub choice: Option<&'a str>,
    pub input: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// Why an answer does not fit what its item waits for (in the client's
/// words: which field to send).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Misanswer {
    #[error("the call of {tool} is deferred: send its `result` (and no `approve`)")]
    Deferred { tool: String },
    #[error("the run waits at a used-up budget: send `approve: true` to let it go on, or `approve: false` to end it")]
    Budget,
    #[error("the call of {tool} waits for approval: send `approve: true` or `approve: false` (and no `result`)")]
    Approval { tool: String },
    #[error("`{id}` is not one of the options offered for {tool}; send the `id` of one of them")]
    NotOffered { id: String, tool: String },
    #[error("the call of {tool} waits for a choice: send `choice` with an option's `id` (or `approve: false` to decline)")]
    Choice { tool: String },
    #[error("the call of {tool} waits for the user's input: send `input` with the missing fields (or `approve: false` to decline)")]
    Input { tool: String },
}

/// What an answer resolves `item` to, or why it does not fit the item's
/// disposition (in the client's words).
pub fn resolution_for(item: &PendingCall, r: Reply<'_>) -> Result<Resolution, Misanswer> {
    let only = |result: bool, approve: bool, choice: bool, input: bool| {
        r.result.is_some() == result
            && r.approve.is_some() == approve
            && r.choice.is_some() == choice
            && r.input.is_some() == input
    };
    let approval = || match r.approve {
        Some(true) => Resolution::Approved,
        _ => Resolution::Rejected {
            reason: r.reason.map(str::to_string),
        },
    };
    let tool = &item.tool;
    match item.disposition {
        Disposition::Deferred if only(true, false, false, false) => Ok(Resolution::Result {
            output: match r.result {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            },
        }),
        Disposition::Deferred => Err(Misanswer::Deferred { tool: tool.clone() }),
        Disposition::Confirm | Disposition::NeedsConfirmation | Disposition::Budget
            if only(false, true, false, false) =>
        {
            Ok(approval())
        }
        Disposition::Budget => Err(Misanswer::Budget),
        Disposition::Confirm | Disposition::NeedsConfirmation => {
            Err(Misanswer::Approval { tool: tool.clone() })
        }
        Disposition::NeedsSelection if only(false, false, true, false) => {
            let id = r.choice.unwrap_or_default();
            let known = match item.lookup.as_ref().map(|l| &l.ask) {
                Some(crate::lookup::Ask::Selection { options, .. }) => {
                    options.iter().any(|o| o.id == id)
                }
                _ => false,
            };
            if !known {
                return Err(Misanswer::NotOffered {
                    id: id.to_string(),
                    tool: tool.clone(),
                });
            }
            Ok(Resolution::Chosen {
                option: id.to_string(),
            })
        }
        Disposition::NeedsSelection
            if only(false, true, false, false) && r.approve == Some(false) =>
        {
            Ok(approval())
        }
        Disposition::NeedsSelection => Err(Misanswer::Choice { tool: tool.clone() }),
        Disposition::NeedsInput if only(false, false, false, true) => Ok(Resolution::Input {
            values: r.input.cloned().unwrap_or_default(),
        }),
        Disposition::NeedsInput if only(false, true, false, false) && r.approve == Some(false) => {
            Ok(approval())
        }
        Disposition::NeedsInput => Err(Misanswer::Input { tool: tool.clone() }),
    }
}

/// The digest a continuation is bound to: the tool, the model's arguments
/// (canonical JSON) and the sorted names of the bound parameters.
pub fn call_digest(tool: &str, call: &serde_json::Value, bound_params: &[String]) -> String {
    let mut names = bound_params.to_vec();
    names.sort();
    let text = serde_json::json!([tool, canonical(call), names]).to_string();
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// JSON with object keys sorted, whatever order they came in.
pub fn canonical(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let sorted: std::collections::BTreeMap<_, _> =
                m.iter().map(|(k, v)| (k.clone(), canonical(v))).collect();
            serde_json::to_value(sorted).unwrap_or_default()
        }
        serde_json::Value::Array(a) => a.iter().map(canonical).collect(),
        other => other.clone(),
    }
}

/// The continuation token of call `tool_call_id` of session `session`:
/// `ct_<session>_<mac>`, where the mac is HMAC-SHA256 under `key` of the
/// session, the call and the item's nonce. The session travels in the
/// token, so the route needs no other name for it.
pub fn token_for(key: &[u8; 32], session: &str, tool_call_id: &str, nonce: &str) -> String {
    let msg = format!("{session}\n{tool_call_id}\n{nonce}");
    format!("ct_{session}_{}", hex::encode(hmac(key, msg.as_bytes())))
}

/// The session a continuation token names (`None`: not a token's shape).
pub fn token_session(token: &str) -> Option<&str> {
    let rest = token.strip_prefix("ct_")?;
    let (session, mac) = rest.rsplit_once('_')?;
    (mac.len() == 64 && !session.is_empty()).then_some(session)
}

/// SHA-256 of a token, as stored.
pub fn token_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// HMAC-SHA256 of `msg` under `key` (RFC 2104).
pub fn hmac(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, k) in key.iter().enumerate() {
        ipad[i] ^= k;
        opad[i] ^= k;
    }
    let inner = Sha256::new()
        .chain_update(ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(opad)
        .chain_update(inner)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests;
