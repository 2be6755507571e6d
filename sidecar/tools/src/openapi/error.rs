//! Why an OpenAPI (or PostgREST) toolbox does not load, and why a request
//! URL cannot be built. Messages name the toolbox's own words (`secrets`,
//! `headers`, `spec`) and never hold a secret's value: a secret is named
//! by its place in `secrets` (1-based) and where it was read from.

use std::path::PathBuf;

use reqwest::{StatusCode, Url};

use super::document::DocumentError;
use super::MAX_DOCUMENT;
use bindery_llm::egress::Refused;
use bindery_params::scrub::Scrubber;
use bindery_params::sources::SourceError;

/// What [`Url::parse`] fails with.
pub type UrlParseError = <Url as std::str::FromStr>::Err;

/// Why an OpenAPI toolbox did not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot build an HTTP client: {0}")]
    Client(reqwest::Error),
    /// `secret`: its place in `secrets`, from 1.
    #[error("secret {secret}: {problem}")]
    SecretPlace {
        secret: usize,
        problem: SecretPlaceError,
    },
    #[error("secret {secret}: parameter `{param}` has no value when the agent loads, so the spec cannot be fetched with it; give it a process value or a default")]
    FetchSecretUnset { secret: usize, param: String },
    /// `from`: the value source, described (never its value).
    #[error("secret {secret} ({from}): {error}")]
    SecretSource {
        secret: usize,
        from: String,
        error: SourceError,
    },
    #[error("secret {secret} ({from}): {error}")]
    SecretDecode {
        secret: usize,
        from: String,
        error: DecodeError,
    },
    #[error("header `{name}`: not a valid header name")]
    HeaderName { name: String },
    #[error("header `{name}`: its value cannot be sent in a header")]
    HeaderValue { name: String },
    /// A `fetchSpec` secret's value is no header value (the value is not kept).
    #[error("a secret does not fit in header {header}")]
    SecretHeader { header: String },
    #[error("spec {spec}: bad URL: {error}")]
    SpecUrl { spec: String, error: UrlParseError },
    /// Fetching the spec met a redirect it may not follow.
    #[error("cannot fetch spec {spec}: {refused}")]
    FetchRefused { spec: String, refused: Refused },
    /// `error` is kept without its URL, which may carry a secret.
    #[error("cannot fetch spec {spec}: {error}")]
    Fetch { spec: String, error: reqwest::Error },
    /// `with_secrets`: the fetch sent credentials (else the message says
    /// how to add them).
    #[error("cannot fetch spec {spec}: HTTP {status}{}", if *.with_secrets { "" } else { "; if it needs credentials, add a secret with `fetchSpec: true` (from a value source or a process-scope parameter: the spec is fetched at load, before any session)" })]
    FetchStatus {
        spec: String,
        status: StatusCode,
        with_secrets: bool,
    },
    #[error("spec {spec} is larger than {MAX_DOCUMENT} bytes")]
    TooLarge { spec: String },
    #[error("cannot read spec {}: {error}", .path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("spec {spec} is neither JSON ({json}) nor YAML ({yaml})")]
    Syntax {
        spec: String,
        json: Quoting<serde_json::Error>,
        yaml: Quoting<serde_yaml::Error>,
    },
    #[error("spec {spec}: {error}")]
    Document {
        spec: String,
        error: Quoting<DocumentError>,
    },
}

/// An error that quotes what a spec's server sent, which may echo the
/// credentials the spec was fetched with: shown (`Display` and `Debug`)
/// with every secret of the toolbox as its marker. `error` is the error
/// itself, to match on.
pub struct Quoting<E> {
    pub error: E,
    shown: String,
}

impl<E: std::fmt::Display> Quoting<E> {
    pub fn new(error: E, scrubber: &Scrubber) -> Self {
        let shown = scrubber.scrub(&error.to_string());
        Quoting { error, shown }
    }
}

impl<E> std::fmt::Display for Quoting<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl<E> std::fmt::Debug for Quoting<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Quoting").field(&self.shown).finish()
    }
}

/// Why a secret of `secrets` has no place in a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretPlaceError {
    #[error("`{0}` is not a valid header name")]
    HeaderName(String),
    #[error("give exactly one of `header` or `query`")]
    NotOneOf,
}

/// Why a secret's value does not decode as its `decode` says; never
/// quotes the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("its value is not base64 (`decode: base64`)")]
    NotBase64,
    #[error("its value is not hexadecimal digits in pairs (`decode: hex`)")]
    NotHex,
    #[error("its decoded bytes are not UTF-8 text")]
    NotUtf8,
}

/// Why a call's URL cannot be built; the model's arguments are to blame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// `value` is empty, `.` or `..` (never anything else).
    #[error("path parameter `{name}` may not be `{value}`")]
    PathValue { name: String, value: String },
    #[error("bad URL: {0}")]
    Url(UrlParseError),
    #[error("bad base URL: {0}")]
    BaseUrl(UrlParseError),
    #[error("the path `{path}` does not stay below the toolbox's base URL")]
    LeavesBase { path: String },
}
