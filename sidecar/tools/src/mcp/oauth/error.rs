//! Why a remote MCP server's OAuth did not give a token. Messages name the
//! toolbox's `oauth` fields and what to do; they never hold a token, a
//! secret, a code or a URL's query (see `egress::shown`).

use bindery_spec::JwtAlgorithm;

/// Why `privateKey` cannot sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("`privateKey` is not a PEM private key (`-----BEGIN PRIVATE KEY-----`)")]
    NotPem,
    #[error("`privateKey` is encrypted; give it unencrypted (`openssl pkcs8 -topk8 -nocrypt`), from a secret parameter")]
    Encrypted,
    #[error("`privateKey` is a PEM `{0}`, not a private key")]
    Label(String),
    #[error("`privateKey` is neither an RSA key (2048 bits or more) nor a P-256 EC key")]
    Unsupported,
}

#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("{0}")]
    Key(#[from] KeyError),
    #[error("`signingAlgorithm: {alg:?}` does not fit `privateKey`, a key that signs {key:?}")]
    AlgorithmMismatch {
        alg: JwtAlgorithm,
        key: JwtAlgorithm,
    },
    #[error("the system's random generator failed")]
    Random,
    #[error("signing the client assertion failed")]
    Sign,
    #[error("{what} {url} is not https (plain http only to this machine); no token or credential goes there")]
    Insecure { what: &'static str, url: String },
    #[error("{what} {url} is not a URL")]
    BadUrl { what: &'static str, url: String },
    #[error("the protected-resource metadata at {at} is for resource {resource}, not this server ({server}); no authorization is asked for another resource. Check the toolbox's `url`")]
    ResourceMismatch {
        at: String,
        resource: String,
        server: String,
    },
    #[error("the protected-resource metadata at {at} names no authorization server")]
    NoAuthorizationServer { at: String },
    #[error("authorization server {url} publishes no metadata at its well-known URIs ({tried})")]
    NoServerMetadata { url: String, tried: String },
    #[error("the metadata of authorization server {url} names issuer {issuer}; it must name the server itself")]
    IssuerMismatch { url: String, issuer: String },
    #[error("the MCP server's authorization server is {found}, not the one `oauth.issuer` trusts ({pinned}); no credential is sent to it. Check `oauth.issuer` and the toolbox's `url`")]
    IssuerNotPinned { found: String, pinned: String },
    #[error("the MCP server names authorization server {found}, on another origin than the server ({server}); the client's credential is not sent there unless `oauth.issuer` names it: set `oauth.issuer: {found}` to trust it")]
    ForeignIssuer { found: String, server: String },
    #[error("authorization server {url} does not say it supports PKCE with S256; an authorization code without it is not asked for")]
    NoPkce { url: String },
    #[error("authorization server {url} has no authorization endpoint")]
    NoAuthorizationEndpoint { url: String },
    #[error("authorization server {url} offers no dynamic client registration and takes no client metadata URL: give `oauth.clientId` (registered with it)")]
    NoClient { url: String },
    #[error("{what} {url}: {why}")]
    Request {
        what: &'static str,
        url: String,
        why: String,
    },
    #[error("{what} {url} answered {status}{detail}")]
    Status {
        what: &'static str,
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{what} {url} answered something that is not its JSON: {why}")]
    Body {
        what: &'static str,
        url: String,
        why: String,
    },
    #[error("the token endpoint {url} refused: {error}{description}; check `oauth.clientId` and its credential")]
    TokenRefused {
        url: String,
        error: String,
        description: String,
    },
    #[error("the token endpoint {url} gave a `{kind}` token; only Bearer tokens are used")]
    NotBearer { url: String, kind: String },
    #[error("`grant: authorization-code` needs a person's consent, and nobody can be asked here: connect this toolbox from the command line (`bindery-sidecar describe --tools`)")]
    NoConsent,
    #[error("the person's consent was not given: {0}")]
    Consent(String),
    #[error("the redirect {0}")]
    Redirect(String),
    #[error("the server still answers 401 to a new token: it does not take the tokens of its authorization server; check `oauth` (scopes, client)")]
    StillUnauthorized,
    #[error("the server wants scopes {wanted} beyond those granted ({granted}), and asking again got none more; the client may not be allowed them")]
    ScopeNotGranted { wanted: String, granted: String },
}
