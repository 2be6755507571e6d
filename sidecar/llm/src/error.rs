//! What can go wrong talking to a model.

/// Why a chat completion failed. No variant ever holds the API key or the
/// request; reply bodies are cut to a short excerpt.
#[derive(thiserror::Error, Debug)]
pub enum LlmError {
    /// The endpoint answered with a non-success status.
    #[error("the model endpoint answered HTTP {status}{hint}: {body}", hint = http_hint(*.status))]
    Http {
        /// The HTTP status code.
        status: u16,
        /// An excerpt of the reply body.
        body: String,
    },
    /// The endpoint could not be reached, or the connection broke.
    #[error("{0} (check the base URL and that the model server is running)")]
    Transport(String),
    /// No answer within the endpoint's timeout.
    #[error(
        "the model endpoint did not answer in time (check the base URL, or raise the timeout for a slow model)"
    )]
    Timeout,
    /// The reply is not a chat completion.
    #[error(
        "the model endpoint's reply does not read: {0} (check that the base URL points at the API the model's `provider` names: chat completions, or Anthropic's Messages)"
    )]
    Malformed(String),
    /// The reply passed `--model-max-reply-bytes`: it was cut off there
    /// and none of it kept.
    #[error("the model's reply passed {limit} bytes (--model-max-reply-bytes); it was cut off there and none of it kept: ask for a shorter answer, or raise the limit")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The reply asked for more tool calls than `--model-max-tool-calls`.
    #[error("the model asked for {count} tool calls in one reply, more than {limit} (--model-max-tool-calls); none of them ran")]
    TooManyCalls {
        /// How many it asked for.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// The whole request (retries and a streamed reply included) took
    /// longer than `--llm-deadline`.
    #[error("the model's request went on past {}s (--llm-deadline), retries and streaming included; it was stopped", .0.as_secs())]
    Deadline(std::time::Duration),
    /// Every attempt failed with a retryable error.
    #[error("gave up after {attempts} attempt(s); the last error: {last}")]
    RetriesExhausted {
        /// How many requests were sent.
        attempts: u32,
        /// The error of the last one.
        last: Box<LlmError>,
    },
    /// The [`ModelEndpoint`](super::ModelEndpoint) cannot be used.
    #[error("invalid model endpoint: {0}")]
    Config(String),
    /// The endpoint's cloud credentials (AWS's for SigV4, an Entra ID
    /// token) could not be had. The message names the source that failed
    /// and what to check; it holds no credential.
    #[error("no credentials for the model endpoint from {from}: {message}")]
    Credentials {
        /// Where they were to come from (`web identity (arn:…)`, …).
        from: String,
        /// What went wrong, and what to do.
        message: String,
        /// Whether the same request may succeed later (the identity
        /// endpoint unreachable, too slow, busy or failing), not a setup
        /// to fix.
        transient: bool,
    },
    /// The model and each fallback failed, in order.
    #[error("every model failed: {}; the last, {}: {last}", passed_over(.tried), .last_model)]
    ChainFailed {
        tried: Vec<crate::FellBack>,
        last_model: String,
        last: Box<LlmError>,
    },
}

fn passed_over(tried: &[crate::FellBack]) -> String {
    tried
        .iter()
        .map(|f| format!("{} ({})", f.model, f.error))
        .collect::<Vec<_>>()
        .join(", then ")
}

fn http_hint(status: u16) -> &'static str {
    match status {
        400 | 422 => " (the endpoint rejected the request; check the model name)",
        401 | 403 => " (check the API key)",
        404 => " (check the base URL and the model name)",
        408 => " (the endpoint gave up waiting for the request)",
        429 => " (rate limited or overloaded)",
        500..=599 => " (the model server failed)",
        _ => "",
    }
}

/// Longest excerpt of a reply body kept in an error.
const EXCERPT_CHARS: usize = 300;

/// The start of `text`, cut at a character boundary, on one line.
pub(crate) fn excerpt(text: &str) -> String {
    let text = text.trim();
    let mut out: String = text
        .chars()
        .take(EXCERPT_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(EXCERPT_CHARS).is_some() {
        out.push('…');
    }
    if out.is_empty() {
        out.push_str("<empty body>");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_check() {
        let e = LlmError::Http {
            status: 401,
            body: "bad key".into(),
        };
        assert_eq!(
            e.to_string(),
            "the model endpoint answered HTTP 401 (check the API key): bad key"
        );
        let e = LlmError::RetriesExhausted {
            attempts: 3,
            last: Box::new(LlmError::Timeout),
        };
        assert!(e.to_string().starts_with("gave up after 3 attempt(s)"));
    }

    #[test]
    fn excerpts_are_short_and_on_one_line() {
        assert_eq!(excerpt("  a\nb  "), "a b");
        assert_eq!(excerpt(""), "<empty body>");
        let long = "é".repeat(1000);
        let e = excerpt(&long);
        assert_eq!(e.chars().count(), EXCERPT_CHARS + 1);
        assert!(e.ends_with('…'));
    }
}
