//! Approval webhooks (`spec.approvals.webhook`): a signed notice for every
//! call that starts waiting for a person, delivered at least once.
//!
//! The notice says which session, agent and tool, the call as the model
//! made it (a bound or secret value never), the facts a person decides on,
//! when it expires, and a one-time answer URL (`POST
//! /v1/approvals/{token}`, the item's continuation token). Each attempt is
//! signed over its timestamp and body with HMAC-SHA256, in the manner of
//! Stripe's and GitHub's webhooks:
//!
//! ```text
//! Bindery-Signature: t=1764614400,v1=<hex HMAC-SHA256(key, "1764614400." + body)>
//! Idempotency-Key: <the notice's id, the same on every attempt>
//! ```
//!
//! so a receiver checks the signature, refuses a timestamp outside its
//! tolerance (a replay) and drops an id it has seen (a retry it already
//! took). A failed attempt (no answer, a 5xx, 408 or 429) is tried again
//! with backoff; any other 4xx, or the last attempt, fails for good.
//! Everything here but [`deliver`] is pure.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "bindery-signature";
/// The header carrying the notice's id.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// How notices are delivered: how many attempts, and the first backoff
/// (doubled after each failure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retries {
    pub attempts: u32,
    pub backoff: Duration,
}

impl Default for Retries {
    fn default() -> Self {
        Retries {
            attempts: 5,
            backoff: Duration::from_millis(500),
        }
    }
}

/// The notice of one pending item, `item` as the session API shows it to
/// the owner (its continuation token included, which becomes the answer
/// URL under `base`).
pub fn notice(
    session: &str,
    agent: &str,
    item: &Value,
    base: &str,
    now_ms: i64,
) -> (String, Value) {
    let token = item["continuation_token"].as_str().unwrap_or_default();
    let id = format!(
        "{session}/{}/{}",
        item["tool_call_id"].as_str().unwrap_or_default(),
        &bindery_store::pending::token_digest(token)[..16]
    );
    let mut facts = serde_json::Map::new();
    for key in [
        "facts",
        "tainted_by",
        "options",
        "lookup",
        "missing",
        "note",
        "via",
    ] {
        if let Some(v) = item.get(key) {
            facts.insert(key.to_string(), v.clone());
        }
    }
    let body = json!({
        "id": id,
        "type": "approval.pending",
        "created_at": humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + Duration::from_millis(now_ms.max(0) as u64)
        )
        .to_string(),
        "session_id": session,
        "agent": agent,
        "tool": item["tool"],
        "tool_call_id": item["tool_call_id"],
        "disposition": item["disposition"],
        "call": item["call"],
        "facts": facts,
        "expires_at": item.get("expires_at").cloned().unwrap_or(Value::Null),
        "answer_url": format!("{}/v1/approvals/{token}", base.trim_end_matches('/')),
    });
    (id, body)
}

/// The signature header's value for `body` sent at `timestamp` (Unix seconds).
pub fn signature(key: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// Whether `header` signs `body` with `key`, at most `tolerance` seconds
/// from `now`: what a receiver checks (and the tests' receiver does).
pub fn verify(key: &[u8], header: &str, body: &[u8], now: u64, tolerance: u64) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", x)) => t = x.parse::<u64>().ok(),
            Some(("v1", x)) => v1 = hex::decode(x).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    if now.abs_diff(t) > tolerance {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&v1).is_ok()
}

/// What became of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// Worth trying again: no answer, a 5xx, 408 or 429.
    Retry(String),
    /// Refused for good: another 4xx.
    Refused(String),
}

/// An answer's status as an [`Attempt`].
pub fn judge(status: u16) -> Attempt {
    match status {
        200..=299 => Attempt::Delivered,
        408 | 429 | 500..=599 => Attempt::Retry(format!("the receiver answered {status}")),
        _ => Attempt::Refused(format!("the receiver answered {status}")),
    }
}

/// Why a notice was not delivered (never the URL: it may carry a
/// receiver's secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotDelivered {
    /// Refused for good (a 4xx other than 408 and 429).
    #[error("{0}")]
    Refused(String),
    /// Every attempt failed; the last one's reason.
    #[error("{last} (after {attempts} attempts)")]
    GaveUp { last: String, attempts: u32 },
}

/// Deliver `body` to `url`, signed with `key`, as `retries` says: how
/// many attempts it took, and whether it was delivered (else why not).
pub async fn deliver(
    client: &reqwest::Client,
    url: &str,
    key: &[u8],
    id: &str,
    body: &Value,
    retries: Retries,
) -> (u32, Result<(), NotDelivered>) {
    let bytes = body.to_string().into_bytes();
    let attempts = retries.attempts.max(1);
    let mut wait = retries.backoff;
    let mut last = String::new();
    for attempt in 1..=attempts {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let sent = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature(key, now, &bytes))
            .header(IDEMPOTENCY_HEADER, id)
            .timeout(Duration::from_secs(10))
            .body(bytes.clone())
            .send()
            .await;
        let outcome = match sent {
            Ok(r) => judge(r.status().as_u16()),
            // Never the URL's path or query: it may carry a receiver's secret.
            Err(e) => Attempt::Retry(match bindery_llm::egress::refused(&e) {
                Some(r) => format!("a redirect to {} was not followed", r.to),
                None => e.without_url().to_string(),
            }),
        };
        match outcome {
            Attempt::Delivered => return (attempt, Ok(())),
            Attempt::Refused(why) => return (attempt, Err(NotDelivered::Refused(why))),
            Attempt::Retry(why) => last = why,
        }
        if attempt < attempts {
            tracing::info!(
                notice = id,
                attempt,
                "an approval notice was not delivered; trying again: {last}"
            );
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
        }
    }
    (attempts, Err(NotDelivered::GaveUp { last, attempts }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_key_body_and_time() {
        let key = b"whsec-test";
        let sig = signature(key, 1_700_000_000, b"{\"a\":1}");
        assert!(sig.starts_with("t=1700000000,v1="), "{sig}");
        assert!(verify(key, &sig, b"{\"a\":1}", 1_700_000_010, 300));
        assert!(!verify(b"other", &sig, b"{\"a\":1}", 1_700_000_010, 300));
        assert!(!verify(key, &sig, b"{\"a\":2}", 1_700_000_010, 300));
        // Replayed later than the receiver's tolerance.
        assert!(!verify(key, &sig, b"{\"a\":1}", 1_700_000_400, 300));
        assert!(!verify(key, "v1=00", b"{}", 0, 300));
    }

    #[test]
    fn a_notice_says_what_a_person_decides_and_where_to_answer() {
        let item = json!({
            "tool_call_id": "call_1", "tool": "bash_send-email", "disposition": "confirm",
            "call": {"to": "x@y"}, "continuation_token": "ct_s1_abc",
            "tainted_by": [{"tool_call_id": "call_0", "tool": "bash_fetch-ticket"}],
        });
        let (id, n) = notice("s1", "helpdesk", &item, "https://bindery.example/", 0);
        assert!(id.starts_with("s1/call_1/"), "{id}");
        assert_eq!(n["id"], id.as_str());
        assert_eq!(
            n["answer_url"],
            "https://bindery.example/v1/approvals/ct_s1_abc"
        );
        assert_eq!(n["facts"]["tainted_by"][0]["tool"], "bash_fetch-ticket");
        assert_eq!(n["call"], json!({"to": "x@y"}));
        assert!(n.get("continuation_token").is_none());
    }

    #[test]
    fn what_is_worth_another_attempt() {
        assert_eq!(judge(204), Attempt::Delivered);
        assert!(matches!(judge(503), Attempt::Retry(_)));
        assert!(matches!(judge(429), Attempt::Retry(_)));
        assert!(matches!(judge(400), Attempt::Refused(_)));
    }
}
