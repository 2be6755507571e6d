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

use super::types::ModelEndpoint;

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

    /// `bytes` scrubbed as text, when they are text holding a credential.
    pub(crate) fn scrub_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        match std::str::from_utf8(bytes).map(|t| self.scrub(t)) {
            Ok(Cow::Owned(text)) => Cow::Owned(text.into_bytes()),
            _ => Cow::Borrowed(bytes),
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

    #[test]
    fn short_values_are_not_taken_for_credentials() {
        let mut sent = Sent::default();
        sent.push("abc");
        sent.push("   ");
        assert_eq!(sent.scrub("abc def"), "abc def");
    }
}
