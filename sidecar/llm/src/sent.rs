//! The credentials one request carried, and what an endpoint sends back
//! with them taken out.
//!
//! An endpoint may echo what it was sent: an error quoting the request's
//! headers, a reply that repeats them. What the client itself sent (the
//! key, the pod's Entra ID token, the AWS session token) is replaced by a
//! marker in every text read back, whole, before anything is cut to an
//! excerpt, parsed, logged or kept: so no sink downstream ever holds one,
//! nor the first bytes of one.

use std::borrow::Cow;

use bindery_params::SecretString;
use reqwest::header::{HeaderName, HeaderValue};

use serde_json::Value;

use super::types::{ChatResponse, ModelEndpoint, StreamDelta};

/// What a credential becomes in a text read back.
pub(crate) const MARKER: &str = "<secret:model credential>";

/// Shorter values are not taken for credentials (they would match
/// ordinary text); every real key and token is far longer.
const SHORTEST: usize = 8;

/// The credentials of one request.
#[derive(Clone, Default)]
pub(crate) struct Sent {
    secrets: Vec<SecretString>,
}

impl Sent {
    /// What the endpoint's own configuration sends: its fixed sensitive
    /// headers (the key), and Bedrock's static keys.
    pub(crate) fn of(headers: &[(HeaderName, HeaderValue)], endpoint: &ModelEndpoint) -> Sent {
        let mut sent = Sent::default();
        sent.add(headers);
        if let Some(key) = &endpoint.api_key {
            sent.push(key.expose());
        }
        if let Some(aws) = &endpoint.aws_keys {
            sent.push(aws.secret_access_key.expose());
            if let Some(token) = &aws.session_token {
                sent.push(token.expose());
            }
        }
        sent
    }

    /// The sensitive ones of `headers` (a bearer token, a session token):
    /// each value, and a bearer's token alone.
    pub(crate) fn add(&mut self, headers: &[(HeaderName, HeaderValue)]) {
        for (_, value) in headers.iter().filter(|(_, v)| v.is_sensitive()) {
            let Ok(text) = value.to_str() else { continue };
            self.push(text);
            if let Some(token) = text.strip_prefix("Bearer ") {
                self.push(token);
            }
        }
    }

    fn push(&mut self, secret: &str) {
        let secret = secret.trim();
        if secret.len() >= SHORTEST && !self.secrets.iter().any(|s| s.expose() == secret) {
            self.secrets.push(SecretString::new(secret.to_owned()));
        }
    }

    /// `text` with every credential sent replaced by [`MARKER`], longest
    /// first (a token inside a header value goes with it).
    pub(crate) fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut found: Vec<&str> = self
            .secrets
            .iter()
            .map(SecretString::expose)
            .filter(|s| text.contains(s))
            .collect();
        if found.is_empty() {
            return Cow::Borrowed(text);
        }
        found.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut out = text.to_owned();
        for secret in found {
            out = out.replace(secret, MARKER);
        }
        Cow::Owned(out)
    }

    /// The longest credential, in bytes (0: none).
    fn longest(&self) -> usize {
        self.secrets
            .iter()
            .map(|s| s.expose().len())
            .max()
            .unwrap_or(0)
    }

    /// `response` as it is kept, run and sent on: its text, its calls'
    /// names and arguments (the JSON's decoded strings too, where an
    /// escaped credential hides) and its reasoning, each put together
    /// from its pieces, with every credential taken out.
    pub(crate) fn scrub_response(&self, mut response: ChatResponse) -> ChatResponse {
        if self.secrets.is_empty() {
            return response;
        }
        if let Some(text) = &mut response.content {
            if let Cow::Owned(clean) = self.scrub(text) {
                *text = clean;
            }
        }
        for call in &mut response.tool_calls {
            if let Cow::Owned(clean) = self.scrub(&call.name) {
                call.name = clean;
            }
            if let Cow::Owned(clean) = self.scrub(&call.arguments) {
                call.arguments = clean;
            }
            if let Ok(mut value) = serde_json::from_str::<Value>(&call.arguments) {
                if self.scrub_value(&mut value) {
                    call.arguments = value.to_string();
                }
            }
        }
        if let Some(reasoning) = &mut response.reasoning {
            for block in &mut reasoning.blocks {
                self.scrub_value(block);
            }
        }
        response
    }

    /// Scrubs every string of `value` (keys too); whether one changed.
    fn scrub_value(&self, value: &mut Value) -> bool {
        match value {
            Value::String(text) => match self.scrub(text) {
                Cow::Owned(clean) => {
                    *text = clean;
                    true
                }
                Cow::Borrowed(_) => false,
            },
            Value::Array(items) => items
                .iter_mut()
                .fold(false, |changed, v| self.scrub_value(v) | changed),
            Value::Object(map) => {
                let renamed: Vec<String> = map
                    .keys()
                    .filter(|k| matches!(self.scrub(k), Cow::Owned(_)))
                    .cloned()
                    .collect();
                let changed = !renamed.is_empty();
                for key in renamed {
                    if let Some(v) = map.remove(&key) {
                        map.insert(self.scrub(&key).into_owned(), v);
                    }
                }
                map.values_mut()
                    .fold(changed, |c, v| self.scrub_value(v) | c)
            }
            _ => false,
        }
    }

    /// `bytes` scrubbed as text, when they are text holding a credential.
    pub(crate) fn scrub_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        match std::str::from_utf8(bytes).map(|t| self.scrub(t)) {
            Ok(Cow::Owned(text)) => Cow::Owned(text.into_bytes()),
            _ => Cow::Borrowed(bytes),
        }
    }
}

/// The reply's text as it streams, held back by a credential's length
/// less one so that a credential sent in pieces is whole, and taken out,
/// before any of it is forwarded.
pub(crate) struct Held<'a> {
    sent: &'a Sent,
    hold: usize,
    text: String,
}

impl<'a> Held<'a> {
    pub(crate) fn new(sent: &'a Sent) -> Held<'a> {
        Held {
            sent,
            hold: sent.longest().saturating_sub(1),
            text: String::new(),
        }
    }

    /// `delta`, or what of the text it completes may go, to `forward`.
    pub(crate) fn pass(
        &mut self,
        delta: StreamDelta,
        forward: &mut (dyn FnMut(StreamDelta) + Send),
    ) {
        let StreamDelta::Content(piece) = delta else {
            return forward(delta);
        };
        if self.hold == 0 {
            return forward(StreamDelta::Content(piece));
        }
        self.text.push_str(&piece);
        let clean = self.sent.scrub(&self.text).into_owned();
        let mut cut = clean.len().saturating_sub(self.hold);
        while !clean.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut > 0 {
            forward(StreamDelta::Content(clean[..cut].to_owned()));
        }
        self.text = clean[cut..].to_owned();
    }

    /// The text still held, at the reply's end.
    pub(crate) fn flush(self, forward: &mut (dyn FnMut(StreamDelta) + Send)) {
        let rest = self.sent.scrub(&self.text).into_owned();
        if !rest.is_empty() {
            forward(StreamDelta::Content(rest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sensitive(name: &'static str, value: &str) -> (HeaderName, HeaderValue) {
        let mut v = HeaderValue::try_from(value).unwrap();
        v.set_sensitive(true);
        (HeaderName::from_static(name), v)
    }

    #[test]
    fn every_credential_sent_is_taken_out_whole_before_any_cut() {
        let endpoint = ModelEndpoint::new("http://x/v1", "m")
            .with_api_key(SecretString::new("sk-key-canary-1234"));
        let mut sent = Sent::of(&[], &endpoint);
        sent.add(&[
            sensitive("authorization", "Bearer entra-token-canary-5678"),
            sensitive("x-amz-security-token", "session-canary-9abc"),
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            ),
        ]);
        let echoed = format!(
            "{}auth=Bearer entra-token-canary-5678 key=sk-key-canary-1234 tok=session-canary-9abc type=application/json",
            "A".repeat(265)
        );
        let scrubbed = sent.scrub(&echoed);
        assert!(!scrubbed.contains("canary"), "{scrubbed}");
        assert!(
            scrubbed.contains(&format!("auth={MARKER} key={MARKER} tok={MARKER}")),
            "{scrubbed}"
        );
        assert!(scrubbed.contains("application/json"));
        let cut = crate::error::excerpt(&scrubbed);
        assert!(
            !cut.contains("sk-key") && !cut.contains("entra-tok"),
            "{cut}"
        );
        assert!(matches!(sent.scrub("nothing here"), Cow::Borrowed(_)));
        assert_eq!(&*sent.scrub_bytes(b"\xff\xfe"), b"\xff\xfe");
        assert!(
            !String::from_utf8_lossy(&sent.scrub_bytes(b"x sk-key-canary-1234")).contains("canary")
        );
    }

    /// Review 69 (second): a credential sent in pieces, or escaped in a
    /// call's JSON arguments, is whole, and taken out, before it goes on.
    #[test]
    fn a_credential_in_pieces_or_escaped_is_taken_out_too() {
        let endpoint = ModelEndpoint::new("http://x/v1", "m")
            .with_api_key(SecretString::new("sk-CANARYKEY0123456789"));
        let sent = Sent::of(&[], &endpoint);
        let mut out = Vec::new();
        let mut forward = |d: StreamDelta| out.push(d);
        let mut held = Held::new(&sent);
        for piece in ["text: sk-CA", "NARYKEY", "0123456789 end", " é"] {
            held.pass(StreamDelta::Content(piece.to_owned()), &mut forward);
        }
        held.flush(&mut forward);
        let text: String = out
            .iter()
            .map(|d| match d {
                StreamDelta::Content(t) => t.clone(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(text, format!("text: {MARKER} end é"));
        let response = ChatResponse {
            content: Some("a sk-CANARYKEY0123456789".into()),
            tool_calls: vec![crate::ToolCall {
                id: "c".into(),
                name: "t".into(),
                arguments: r#"{"text": "sk-CANARYKEY0123456789", "n": 1}"#.into(),
            }],
            ..ChatResponse::default()
        };
        let clean = sent.scrub_response(response);
        assert!(!clean.content.unwrap().contains("CANARY"));
        let args: Value = serde_json::from_str(&clean.tool_calls[0].arguments).unwrap();
        assert_eq!(args["text"], MARKER);
        assert_eq!(args["n"], 1);
    }

    #[test]
    fn short_values_are_not_taken_for_credentials() {
        let mut sent = Sent::default();
        sent.push("abc");
        sent.push("   ");
        assert_eq!(sent.scrub("abc def"), "abc def");
    }
}
