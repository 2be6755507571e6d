//! Why an MCP server does not start or list its tools, and why one of
//! its tools is skipped. Messages name the toolbox's own words (`env`,
//! `headers`, `command`, `url`) and never hold a value of `env` or
//! `headers`, which may be secrets.

use std::path::PathBuf;

use super::START_TIMEOUT;

/// Why a value of `env` or `headers` cannot be read at load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharedValueError {
    /// `kind`: what the literal is (`an object`, `an array`).
    #[error("`{key}`: the literal is {kind}; give a string, number or boolean")]
    Literal { key: String, kind: &'static str },
    /// `holds`: what the parameter's value is (`a secret` when it is one).
    #[error("`{key}`: parameter `{param}` holds {holds}; give it a string, number or boolean")]
    Param {
        key: String,
        param: String,
        holds: &'static str,
    },
    /// An end user's value: it differs from session to session, and the
    /// server is shared by all.
    #[error("`{key}`: {what} differs from session to session, but the MCP server is shared by every session; bind it to a tool argument instead")]
    Identity { key: String, what: String },
}

/// Why an MCP server did not start (or could not be reached).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("header {0}")]
    Header(SharedValueError),
    #[error("env {0}")]
    Env(SharedValueError),
    #[error("oauth {0}")]
    OAuthValue(SharedValueError),
    #[error("oauth: {0}")]
    OAuth(super::oauth::OAuthError),
    #[error("give exactly one of `command` or `url`")]
    CommandOrUrl,
    #[error("header `{name}`: not a valid header name")]
    HeaderName { name: String },
    /// The value is left out: it may be a secret.
    #[error("header `{name}`: its value does not fit in a header")]
    HeaderValue { name: String },
    #[error("cannot build an HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("{url} did not answer `initialize` within {START_TIMEOUT:?}")]
    ConnectTimeout { url: String },
    /// `why`: a refused redirect, or what the transport said.
    #[error("cannot connect to {url}: {why}")]
    Connect { url: String, why: String },
    #[error("cannot start `{}`: {error}", .path.display())]
    Spawn {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the program's pipes were not set up")]
    Pipes,
    #[error("`{program}` did not answer `initialize` within {START_TIMEOUT:?}")]
    StartTimeout { program: String },
    /// The program ended before it answered `initialize`; `how` is its exit status.
    #[error(
        "`{program}` did not start as an MCP server: it exited ({how}); its stderr is in the log"
    )]
    Exited { program: String, how: String },
    #[error("`{program}` did not start as an MCP server: {error}; its stderr is in the log")]
    Handshake {
        program: String,
        error: Box<rmcp::service::ClientInitializeError>,
    },
}

/// What went wrong talking to a running server: the exit of its program
/// if it has exited.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    #[error("MCP server `{server}` exited ({how})")]
    Exited { server: String, how: String },
    /// `why`: what the protocol or the transport said.
    #[error("MCP server `{server}`: {why}")]
    Failed { server: String, why: String },
}

/// Why a listed tool is skipped (a warning, not a failed load).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolSpecError {
    #[error("a listed tool has no name")]
    NoName,
    #[error("tool `{name}`: its name has no letter or digit")]
    NoLetterOrDigit { name: String },
}
