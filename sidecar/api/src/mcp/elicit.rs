//! Asking the person at an MCP client (protocol 2026-07-28's multi
//! round-trip requests): a `tools/call` whose run waits answers with
//! `resultType: "input_required"` and one `elicitation/create` form per
//! pending item; the client shows the forms and calls the tool again with
//! `inputResponses` and the `requestState` it was given, and those answers
//! go to the items' continuations as the session API's would.
//!
//! Only for the owner, and only for a client that declared the
//! `elicitation` capability: anyone else gets the pending items in the
//! result. The state carries the items' continuation tokens, which the
//! owner is shown anyway; a token is still checked, and good once, when
//! the answer comes back. Older protocol versions have no handshake state
//! here (the endpoint is stateless), so they get the pending items too.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Map, Value};

use bindery_session::ask::Reply;
use bindery_session::service::Answer;
use bindery_store::wire::PendingItem;
use bindery_tools::Disposition;

const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// Whether the request's `_meta` declares form elicitation.
pub fn supported(params: &Value) -> bool {
    params
        .get("_meta")
        .and_then(|m| m.get(META_CAPABILITIES))
        .and_then(|c| c.get("elicitation"))
        .is_some_and(Value::is_object)
}

/// The `input_required` result for a run that waits on `pending` (the
/// items as the session API shows them to the owner, tokens included).
pub fn input_required(session: &str, pending: &[PendingItem]) -> Value {
    let mut requests = Map::new();
    let mut tokens = Map::new();
    for (i, item) in pending.iter().enumerate() {
        let key = format!("pending-{i}");
        requests.insert(
            key.clone(),
            json!({"method": "elicitation/create", "params": form(item)}),
        );
        tokens.insert(
            key,
            json!({
                "token": item.continuation_token,
                "disposition": item.disposition,
            }),
        );
    }
    let state = json!({"session": session, "items": tokens});
    json!({
        "resultType": "input_required",
        "inputRequests": requests,
        "requestState": URL_SAFE_NO_PAD.encode(state.to_string()),
    })
}

/// One item's form: what the person decides, and on what facts.
fn form(item: &PendingItem) -> Value {
    let tool = Some(item.tool.as_str())
        .filter(|t| !t.is_empty())
        .unwrap_or("a tool");
    let call = &item.call;
    let (message, schema) = match item.disposition {
        Disposition::NeedsSelection => {
            let options: Vec<Value> = item
                .options
                .iter()
                .flatten()
                .map(|o| json!({"const": o.id, "title": o.label}))
                .collect();
            (
                format!(
                    "`{tool}` needs a choice from `{}` before it runs.",
                    item.lookup.as_deref().unwrap_or("a lookup")
                ),
                json!({
                    "type": "object",
                    "properties": {"choice": {"type": "string", "title": "Choice", "oneOf": options}},
                    "required": ["choice"],
                }),
            )
        }
        Disposition::NeedsInput => {
            let mut props = Map::new();
            for n in item.missing.iter().flatten() {
                props.insert(n.to_string(), json!({"type": "string", "title": n}));
            }
            let required: Vec<Value> = props.keys().map(|k| json!(k)).collect();
            (
                format!("`{tool}` needs these fields before it runs."),
                json!({"type": "object", "properties": props, "required": required}),
            )
        }
        _ => {
            let facts = item.facts.as_ref().filter(|f| !f.is_null());
            let mut message = format!("Approve this call of `{tool}`? Arguments: {call}");
            if let Some(f) = facts {
                message.push_str(&format!(". Facts: {f}"));
            }
            (
                message,
                json!({
                    "type": "object",
                    "properties": {
                        "approve": {"type": "boolean", "title": "Approve", "description": "Run the call"},
                        "reason": {"type": "string", "title": "Reason", "description": "Why not, if you decline"},
                    },
                    "required": ["approve"],
                }),
            )
        }
    };
    json!({"mode": "form", "message": message, "requestedSchema": schema})
}

/// The session a retry's `requestState` says it answers, if it reads.
pub fn state_session(params: &Value) -> Option<String> {
    let state = params.get("requestState")?.as_str()?;
    let state: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(state).ok()?).ok()?;
    state["session"].as_str().map(str::to_string)
}

/// Why a retry's answers do not read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RetryError {
    #[error("a retry carries both `inputResponses` and the `requestState` it was given")]
    HalfARetry,
    #[error("`requestState` is not one this server gave: call the tool again without it")]
    ForeignState,
    #[error("`inputResponses` has no answer for `{0}`")]
    NoAnswer(String),
}

/// The answers a retry carries: one reply per item of its `requestState`.
pub fn replies(params: &Value) -> Result<Option<Vec<Reply>>, RetryError> {
    let (Some(responses), Some(state)) = (params.get("inputResponses"), params.get("requestState"))
    else {
        return match (params.get("inputResponses"), params.get("requestState")) {
            (None, None) => Ok(None),
            _ => Err(RetryError::HalfARetry),
        };
    };
    let bad_state = || RetryError::ForeignState;
    let state: Value = state
        .as_str()
        .and_then(|s| URL_SAFE_NO_PAD.decode(s).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(bad_state)?;
    let items = state["items"].as_object().ok_or_else(bad_state)?;
    let mut out = Vec::new();
    for (key, item) in items {
        let token = item["token"].as_str().ok_or_else(bad_state)?.to_string();
        let response = responses
            .get(key)
            .ok_or_else(|| RetryError::NoAnswer(key.clone()))?;
        let answer = answer(item["disposition"].as_str().unwrap_or(""), response);
        out.push((
            token,
            Answer {
                session_id: state["session"].as_str().map(str::to_string),
                ..answer
            },
        ));
    }
    Ok(Some(out))
}

/// A form's response as a continuation's answer: a decline or a cancel
/// (or an approval not given) says no.
fn answer(disposition: &str, response: &Value) -> Answer {
    let accepted = response["action"] == "accept";
    let content = response["content"].as_object();
    let no = || Answer {
        approve: Some(false),
        reason: Some(
            content
                .and_then(|c| c.get("reason"))
                .and_then(Value::as_str)
                .filter(|r| !r.is_empty())
                .unwrap_or("declined at the MCP client")
                .to_string(),
        ),
        ..Default::default()
    };
    if !accepted {
        return no();
    }
    match disposition {
        "needs_selection" => match content
            .and_then(|c| c.get("choice"))
            .and_then(Value::as_str)
        {
            Some(choice) => Answer {
                choice: Some(choice.to_string()),
                ..Default::default()
            },
            None => no(),
        },
        "needs_input" => Answer {
            input: content.cloned(),
            ..Default::default()
        },
        _ => match content.and_then(|c| c.get("approve")) {
            Some(Value::Bool(true)) => Answer {
                approve: Some(true),
                ..Default::default()
            },
            _ => no(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confirm_item() -> PendingItem {
        serde_json::from_value(json!({
            "tool_call_id": "mcp-1", "tool": "bash_pay", "disposition": "confirm",
            "call": {"amount": 5}, "continuation_token": "ct_abc",
        }))
        .unwrap()
    }

    #[test]
    fn a_waiting_call_becomes_a_form_and_its_answer_a_continuation() {
        let r = input_required("s1", &[confirm_item()]);
        assert_eq!(r["resultType"], "input_required");
        let form = &r["inputRequests"]["pending-0"];
        assert_eq!(form["method"], "elicitation/create");
        assert_eq!(form["params"]["mode"], "form");
        assert_eq!(
            form["params"]["requestedSchema"]["required"],
            json!(["approve"])
        );
        let retry = json!({
            "name": "bash_pay",
            "inputResponses": {"pending-0": {"action": "accept", "content": {"approve": true}}},
            "requestState": r["requestState"],
        });
        let replies = replies(&retry).unwrap().unwrap();
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].0, "ct_abc");
        assert_eq!(replies[0].1.approve, Some(true));
        assert_eq!(replies[0].1.session_id.as_deref(), Some("s1"));
    }

    #[test]
    fn a_decline_or_a_cancel_says_no() {
        for action in ["decline", "cancel"] {
            let a = answer("confirm", &json!({"action": action}));
            assert_eq!(a.approve, Some(false));
            assert!(a.reason.unwrap().contains("declined"));
        }
        let a = answer(
            "confirm",
            &json!({"action": "accept", "content": {"approve": false, "reason": "too much"}}),
        );
        assert_eq!(
            (a.approve, a.reason.as_deref()),
            (Some(false), Some("too much"))
        );
        let a = answer(
            "needs_selection",
            &json!({"action": "accept", "content": {"choice": "acct-2"}}),
        );
        assert_eq!(a.choice.as_deref(), Some("acct-2"));
    }

    #[test]
    fn a_state_not_ours_or_half_a_retry_is_refused() {
        let e = replies(&json!({"inputResponses": {}, "requestState": "%%%"})).unwrap_err();
        assert_eq!(e, RetryError::ForeignState);
        assert!(e.to_string().contains("requestState"), "{e}");
        let e = replies(&json!({"inputResponses": {}})).unwrap_err();
        assert_eq!(e, RetryError::HalfARetry);
        assert!(replies(&json!({"name": "x"})).unwrap().is_none());
    }

    #[test]
    fn elicitation_is_used_only_when_declared() {
        assert!(!supported(&json!({})));
        assert!(!supported(&json!({"_meta": {META_CAPABILITIES: {}}})));
        assert!(supported(
            &json!({"_meta": {META_CAPABILITIES: {"elicitation": {}}}})
        ));
    }
}
