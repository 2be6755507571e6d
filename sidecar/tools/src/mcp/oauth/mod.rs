//! OAuth 2.1 for remote MCP servers, as the MCP authorization spec
//! (2025-11-25) says, with its 2025-03-26 fallbacks.
//!
//! A request without a token, or with one the server refuses, gets a 401
//! whose `WWW-Authenticate` names the protected-resource metadata; that
//! names the authorization server, whose metadata names its endpoints.
//! Tokens come from the `client-credentials` grant (the tenant's own
//! connection) or the `authorization-code` grant with PKCE (a person's,
//! through [`Consent`]), always with the `resource` indicator (RFC 8707).
//! A 403 `insufficient_scope` asks again with the union of the scopes.
//!
//! Everything here goes through the egress policy's clients (no
//! `Referer`; metadata follows same-origin redirects only, token and
//! registration requests none), to https URLs or this machine only. Tokens
//! are [`SecretString`]s: in memory for the server's life, registered with
//! the logs' scrubber while held, never written anywhere.

pub mod assertion;
pub mod challenge;
pub mod consent;
pub mod discovery;
pub mod error;
pub mod pkce;
pub mod transport;

pub use consent::{Consent, Terminal};
pub use error::{KeyError, OAuthError};

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Url;
use serde::Deserialize;

use assertion::SigningKey;
use bindery_llm::egress;
use bindery_params::live::Registration;
use bindery_params::SecretString;
use bindery_spec::{JwtAlgorithm, McpOAuth, OAuthGrant, Redirects, TokenEndpointAuth};
use challenge::Bearer;
use discovery::{ResourceMetadata, ServerMetadata};

/// How long one OAuth request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The most bytes of a metadata or token answer read.
const MAX_BODY: usize = 1 << 20;
/// A token is renewed this long before it expires.
const EXPIRY_MARGIN: Duration = Duration::from_secs(60);
/// The redirect URI of an `authorization-code` client that names none.
pub const DEFAULT_REDIRECT_URI: &str = "http://localhost/oauth/callback";

/// What the toolbox's `oauth` says, read at load.
pub struct Settings {
    pub grant: OAuthGrant,
    pub client_id: Option<String>,
    pub client_secret: Option<SecretString>,
    pub key: Option<(SigningKey, JwtAlgorithm)>,
    pub auth: Option<TokenEndpointAuth>,
    pub scopes: Vec<String>,
    pub redirect_uri: String,
    pub client_metadata_url: Option<String>,
    /// The one authorization server trusted (`oauth.issuer`).
    pub issuer: Option<String>,
}

impl Settings {
    /// `oauth` with its values read (`client_id`, `client_secret`,
    /// `private_key`: text, a secret, a PEM secret).
    pub fn new(
        o: &McpOAuth,
        client_id: Option<String>,
        client_secret: Option<SecretString>,
        private_key: Option<SecretString>,
    ) -> Result<Settings, OAuthError> {
        let key = match private_key {
            None => None,
            Some(pem) => {
                let key = SigningKey::from_pem(pem.expose())?;
                let alg = o.signing_algorithm.unwrap_or(key.algorithm());
                if alg != key.algorithm() {
                    return Err(OAuthError::AlgorithmMismatch {
                        alg,
                        key: key.algorithm(),
                    });
                }
                Some((key, alg))
            }
        };
        Ok(Settings {
            grant: o.grant,
            client_id,
            client_secret,
            key,
            auth: o.token_endpoint_auth,
            scopes: o.scopes.clone(),
            redirect_uri: o
                .redirect_uri
                .clone()
                .unwrap_or_else(|| DEFAULT_REDIRECT_URI.into()),
            client_metadata_url: o.client_metadata_url.clone(),
            issuer: o.issuer.clone(),
        })
    }
}

/// Where tokens come from, once discovered.
#[derive(Debug, Clone)]
struct Discovered {
    /// The resource indicator sent (RFC 8707).
    resource: String,
    /// The protected resource's `scopes_supported`.
    resource_scopes: Option<Vec<String>>,
    server: ServerMetadata,
    /// The authorization server's URL (its issuer, or the MCP server's
    /// origin for a 2025-03-26 server).
    server_url: String,
    /// A 2025-03-26 server (no protected-resource metadata).
    legacy: bool,
}

/// The client as the authorization server knows it.
#[derive(Clone)]
struct Client {
    id: String,
    secret: Option<SecretString>,
    method: TokenEndpointAuth,
}

struct Cached {
    access: SecretString,
    refresh: Option<SecretString>,
    expires: Option<Instant>,
    /// The scopes asked for when it was issued.
    scopes: Vec<String>,
    _live: Option<Registration>,
}

impl Cached {
    fn fresh(&self) -> bool {
        self.expires
            .is_none_or(|at| Instant::now() + EXPIRY_MARGIN < at)
    }
}

#[derive(Default)]
struct State {
    discovered: Option<Discovered>,
    client: Option<Client>,
    token: Option<Cached>,
}

/// One MCP server's OAuth: its settings, what was discovered, its tokens.
pub struct OAuth {
    toolbox: String,
    server: Url,
    settings: Settings,
    get: reqwest::Client,
    post: reqwest::Client,
    consent: Option<Arc<dyn Consent>>,
    state: tokio::sync::Mutex<State>,
    /// The current token, for the scrubbing of tool results (read without
    /// waiting on a flow in progress).
    current: std::sync::Mutex<Option<SecretString>>,
}

/// What a person's consent got: the tokens, with the scopes asked for.
pub struct Granted {
    pub access: SecretString,
    pub refresh: Option<SecretString>,
    /// Seconds, as the server said.
    pub expires_in: Option<u64>,
    pub scopes: Vec<String>,
}

/// The token endpoint's answer (RFC 6749 §5.1).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    refresh_token: Option<String>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: String,
}

#[derive(Deserialize)]
struct Registered {
    client_id: String,
    #[serde(default)]
    client_secret: Option<String>,
    #[serde(default)]
    token_endpoint_auth_method: Option<String>,
}

/// Text a server chose, as an error may quote it: printable, short.
fn quoted(s: &str) -> String {
    bindery_spec::printable(s)
}

/// Percent-encodes all but RFC 3986's unreserved characters (RFC 6749
/// §2.3.1 encodes the id and secret of Basic authentication).
fn pct(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The union of `a` and `b`, in order, without repeats.
fn union(a: &[String], b: &[String]) -> Vec<String> {
    let mut out = a.to_vec();
    for s in b {
        if !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}

impl OAuth {
    pub fn new(
        toolbox: &str,
        server: &str,
        settings: Settings,
        consent: Option<Arc<dyn Consent>>,
    ) -> Result<OAuth, OAuthError> {
        let server = Url::parse(server).map_err(|_| OAuthError::BadUrl {
            what: "the toolbox's `url`",
            url: egress::shown_text(server),
        })?;
        if !discovery::secure(&server) {
            return Err(OAuthError::Insecure {
                what: "the toolbox's `url`",
                url: egress::shown(&server),
            });
        }
        let build = |r| {
            egress::client(r)
                .timeout(REQUEST_TIMEOUT)
                .build()
                .map_err(|e| OAuthError::Request {
                    what: "building an HTTP client for",
                    url: egress::shown(&server),
                    why: e.to_string(),
                })
        };
        Ok(OAuth {
            toolbox: toolbox.to_string(),
            get: build(Redirects::SameOrigin)?,
            post: build(Redirects::Never)?,
            server,
            settings,
            consent,
            state: Default::default(),
            current: Default::default(),
        })
    }

    /// The secrets this holds, as tool results are scrubbed of them.
    pub fn secrets(&self) -> Vec<(String, SecretString)> {
        let mut out = Vec::new();
        if let Some(t) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            out.push((format!("mcp_{}_access_token", self.toolbox), t));
        }
        if let Some(s) = &self.settings.client_secret {
            out.push(("oauth.clientSecret".into(), s.clone()));
        }
        out
    }

    /// A token to send now: the cached one while fresh, else a renewed one
    /// where that needs nobody (a refresh, the client-credentials grant);
    /// `None` until a server's 401 has started the discovery.
    pub async fn token(&self) -> Result<Option<SecretString>, OAuthError> {
        let mut state = self.state.lock().await;
        if let Some(t) = &state.token {
            if t.fresh() {
                return Ok(Some(t.access.clone()));
            }
        }
        if state.discovered.is_none() {
            return Ok(None);
        }
        let scopes = state.token.as_ref().map(|t| t.scopes.clone());
        if let Some(t) = self.refreshed(&mut state).await? {
            return Ok(Some(t));
        }
        if self.settings.grant == OAuthGrant::ClientCredentials {
            let scopes = scopes.unwrap_or_else(|| self.initial_scopes(&state, &Bearer::default()));
            return self.grant(&mut state, scopes).await.map(Some);
        }
        Ok(None)
    }

    /// A new token after a 401 whose `WWW-Authenticate` is `header`;
    /// `sent` is the token the request carried, if any (dropped now).
    pub async fn unauthorized(
        &self,
        header: Option<&str>,
        sent: Option<&str>,
    ) -> Result<SecretString, OAuthError> {
        let challenge = header.map(challenge::bearer).unwrap_or_default();
        let mut state = self.state.lock().await;
        let refreshable = match (&state.token, sent) {
            // Another request renewed it meanwhile.
            (Some(t), Some(s)) if t.access.expose() != s && t.fresh() => {
                return Ok(t.access.clone())
            }
            (Some(t), _) => t.refresh.is_some(),
            (None, _) => false,
        };
        if state.discovered.is_none() {
            state.discovered = Some(
                self.discover(challenge.resource_metadata.as_deref())
                    .await?,
            );
        }
        if refreshable && sent.is_some() {
            // Expire it, so that a refresh is what renews it.
            if let Some(t) = state.token.as_mut() {
                t.expires = Some(Instant::now());
            }
            if let Some(t) = self.refreshed(&mut state).await? {
                return Ok(t);
            }
        }
        let scopes = match &state.token {
            Some(t) if !t.scopes.is_empty() => union(&t.scopes, &challenge.scopes()),
            _ => self.initial_scopes(&state, &challenge),
        };
        self.forget(&mut state);
        self.grant(&mut state, scopes).await
    }

    /// A token with more scopes after a 403 `insufficient_scope` whose
    /// `WWW-Authenticate` is `header` (step-up authorization).
    pub async fn insufficient_scope(&self, header: &str) -> Result<SecretString, OAuthError> {
        let challenge = challenge::bearer(header);
        let mut state = self.state.lock().await;
        if state.discovered.is_none() {
            state.discovered = Some(
                self.discover(challenge.resource_metadata.as_deref())
                    .await?,
            );
        }
        let had = state
            .token
            .as_ref()
            .map(|t| t.scopes.clone())
            .unwrap_or_default();
        let wanted = union(&had, &challenge.scopes());
        if state.token.is_some() && wanted.len() == had.len() {
            // Asking again for what was asked would loop.
            return Err(OAuthError::ScopeNotGranted {
                wanted: challenge.scope.clone().unwrap_or_default(),
                granted: had.join(" "),
            });
        }
        self.forget(&mut state);
        self.grant(&mut state, wanted).await
    }

    fn forget(&self, state: &mut State) {
        state.token = None;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The scopes of a first authorization: the toolbox's own, else the
    /// challenge's, else the resource's `scopes_supported`, else none (and
    /// `offline_access` with them for a person's connection, where the
    /// authorization server lists it, for a refresh token).
    fn initial_scopes(&self, state: &State, challenge: &Bearer) -> Vec<String> {
        let mut scopes = if !self.settings.scopes.is_empty() {
            self.settings.scopes.clone()
        } else if challenge.scope.is_some() {
            challenge.scopes()
        } else {
            state
                .discovered
                .as_ref()
                .and_then(|d| d.resource_scopes.clone())
                .unwrap_or_default()
        };
        let offline = state.discovered.as_ref().is_some_and(|d| {
            d.server
                .scopes_supported
                .as_ref()
                .is_some_and(|s| s.iter().any(|s| s == "offline_access"))
        });
        if self.settings.grant == OAuthGrant::AuthorizationCode
            && offline
            && !scopes.is_empty()
            && !scopes.iter().any(|s| s == "offline_access")
        {
            scopes.push("offline_access".into());
        }
        scopes
    }

    /// GET `url` as JSON: `Ok(None)` for a 4xx (nothing there).
    async fn fetch_json<T: serde::de::DeserializeOwned>(
        &self,
        what: &'static str,
        url: &Url,
    ) -> Result<Option<T>, OAuthError> {
        if !discovery::secure(url) {
            return Err(OAuthError::Insecure {
                what,
                url: egress::shown(url),
            });
        }
        let answer = self
            .get
            .get(url.clone())
            .header(ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| request_error(what, url, e))?;
        let status = answer.status();
        if status.is_client_error() {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(OAuthError::Status {
                what,
                url: egress::shown(url),
                status: status.as_u16(),
                detail: String::new(),
            });
        }
        let body = read_body(answer, what, url).await?;
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| OAuthError::Body {
                what,
                url: egress::shown(url),
                why: e.to_string(),
            })
    }

    /// Where tokens come from: the protected-resource metadata (the
    /// challenge's `resource_metadata`, else the well-known URIs), its
    /// authorization server's metadata; for a server without either, the
    /// 2025-03-26 spec's metadata at its origin or default endpoints.
    async fn discover(&self, named: Option<&str>) -> Result<Discovered, OAuthError> {
        let mut candidates = Vec::new();
        if let Some(n) = named {
            let url = self.server.join(n).map_err(|_| OAuthError::BadUrl {
                what: "the challenge's resource_metadata",
                url: egress::shown_text(n),
            })?;
            candidates.push(url);
        }
        candidates.extend(discovery::resource_metadata_urls(&self.server));
        let mut found = None;
        for url in &candidates {
            if let Some(m) = self
                .fetch_json::<ResourceMetadata>("the protected-resource metadata", url)
                .await?
            {
                found = Some((url.clone(), m));
                break;
            }
        }
        let Some((at, prm)) = found else {
            return self.discover_legacy().await;
        };
        if !discovery::resource_matches(&prm.resource, &self.server) {
            return Err(OAuthError::ResourceMismatch {
                at: egress::shown(&at),
                resource: egress::shown_text(&prm.resource),
                server: egress::shown(&self.server),
            });
        }
        let first =
            prm.authorization_servers
                .first()
                .ok_or_else(|| OAuthError::NoAuthorizationServer {
                    at: egress::shown(&at),
                })?;
        let issuer = Url::parse(first).map_err(|_| OAuthError::BadUrl {
            what: "the authorization server",
            url: egress::shown_text(first),
        })?;
        let tried = discovery::server_metadata_urls(&issuer);
        let mut server = None;
        for url in &tried {
            if let Some(m) = self
                .fetch_json::<ServerMetadata>("the authorization server metadata", url)
                .await?
            {
                server = Some(m);
                break;
            }
        }
        let server = server.ok_or_else(|| OAuthError::NoServerMetadata {
            url: egress::shown(&issuer),
            tried: tried
                .iter()
                .map(egress::shown)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        if let Some(i) = &server.issuer {
            if !discovery::issuer_matches(i, &issuer) {
                return Err(OAuthError::IssuerMismatch {
                    url: egress::shown(&issuer),
                    issuer: egress::shown_text(i),
                });
            }
        }
        self.check_endpoints(&server)?;
        self.check_trusted(&issuer, &server)?;
        Ok(Discovered {
            resource: prm.resource.clone(),
            resource_scopes: prm.scopes_supported.clone(),
            server,
            server_url: issuer.to_string(),
            legacy: false,
        })
    }

    /// A 2025-03-26 server: the authorization server is at its origin.
    async fn discover_legacy(&self) -> Result<Discovered, OAuthError> {
        let mut origin = self.server.clone();
        origin.set_path("/");
        origin.set_query(None);
        origin.set_fragment(None);
        let url = origin
            .join("/.well-known/oauth-authorization-server")
            .map_err(|_| OAuthError::BadUrl {
                what: "the server's origin",
                url: egress::shown(&origin),
            })?;
        let server = match self
            .fetch_json::<ServerMetadata>("the authorization server metadata", &url)
            .await?
        {
            Some(m) => m,
            None => ServerMetadata::fallback(&origin),
        };
        // The document is the origin's own: whatever issuer it names (a
        // 2025-03-26 server may name one with a path), it is trusted as
        // that origin only, never as the issuer it claims to be.
        self.check_endpoints(&server)?;
        self.check_trusted(&origin, &server)?;
        Ok(Discovered {
            resource: discovery::canonical_resource(&self.server).to_string(),
            resource_scopes: None,
            server,
            server_url: egress::origin(&origin),
            legacy: true,
        })
    }

    /// The discovered authorization server is one this toolbox may send
    /// its credential to. `url` is where its metadata was derived from (its
    /// `issuer`, checked to say the same, or the MCP server's origin for a
    /// 2025-03-26 server): never what a document claims to be. It is
    /// exactly `oauth.issuer` when given (and then its own metadata, read
    /// from its own well-known URLs, names its token endpoint); else, for a
    /// client with a secret or a key, the MCP server's own origin, and so
    /// must its token endpoint be: metadata the MCP server serves cannot
    /// send the credential elsewhere.
    fn check_trusted(&self, url: &Url, server: &ServerMetadata) -> Result<(), OAuthError> {
        if let Some(pinned) = &self.settings.issuer {
            if !discovery::same_issuer(url.as_str(), pinned) {
                return Err(OAuthError::IssuerNotPinned {
                    found: egress::shown(url),
                    pinned: egress::shown_text(pinned),
                });
            }
            return Ok(());
        }
        let credential = self.settings.client_secret.is_some() || self.settings.key.is_some();
        if !credential {
            return Ok(());
        }
        if url.origin() != self.server.origin() {
            return Err(OAuthError::ForeignIssuer {
                found: egress::shown(url),
                server: egress::origin(&self.server),
            });
        }
        let token = Url::parse(&server.token_endpoint).map_err(|_| OAuthError::BadUrl {
            what: "the token endpoint",
            url: egress::shown_text(&server.token_endpoint),
        })?;
        if token.origin() != self.server.origin() {
            return Err(OAuthError::ForeignTokenEndpoint {
                found: egress::shown(&token),
                server: egress::origin(&self.server),
            });
        }
        Ok(())
    }

    fn check_endpoints(&self, m: &ServerMetadata) -> Result<(), OAuthError> {
        let named = [
            ("the token endpoint", Some(&m.token_endpoint)),
            (
                "the authorization endpoint",
                m.authorization_endpoint.as_ref(),
            ),
            (
                "the registration endpoint",
                m.registration_endpoint.as_ref(),
            ),
            ("the revocation endpoint", m.revocation_endpoint.as_ref()),
        ];
        for (what, url) in named {
            let Some(url) = url else { continue };
            let parsed = Url::parse(url).map_err(|_| OAuthError::BadUrl {
                what,
                url: egress::shown_text(url),
            })?;
            if !discovery::secure(&parsed) {
                return Err(OAuthError::Insecure {
                    what,
                    url: egress::shown(&parsed),
                });
            }
        }
        Ok(())
    }

    /// The cached token refreshed (its refresh token rotated when the
    /// server sends a new one), if it has a refresh token and the server
    /// takes it.
    async fn refreshed(&self, state: &mut State) -> Result<Option<SecretString>, OAuthError> {
        let (Some(t), Some(d), Some(client)) = (&state.token, &state.discovered, &state.client)
        else {
            return Ok(None);
        };
        let Some(refresh) = t.refresh.clone() else {
            return Ok(None);
        };
        let (d, client, scopes) = (d.clone(), client.clone(), t.scopes.clone());
        let form = vec![
            ("grant_type".to_string(), "refresh_token".to_string()),
            ("refresh_token".into(), refresh.expose().to_string()),
            ("resource".into(), d.resource.clone()),
        ];
        match self.token_request(&d, &client, form).await {
            Ok(answer) => Ok(Some(self.keep(state, answer, scopes, Some(refresh))?)),
            // A refused refresh token starts over.
            Err(OAuthError::TokenRefused { .. }) => {
                self.forget(state);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// A new token by the toolbox's grant, asking for `scopes`.
    async fn grant(
        &self,
        state: &mut State,
        scopes: Vec<String>,
    ) -> Result<SecretString, OAuthError> {
        let (d, client) = self.discovered_client(state).await?;
        let mut form = Vec::new();
        match self.settings.grant {
            OAuthGrant::ClientCredentials => {
                form.push(("grant_type".to_string(), "client_credentials".to_string()));
            }
            OAuthGrant::AuthorizationCode => {
                let (code, verifier) = self.consent(&d, &client, &scopes).await?;
                form.push(("grant_type".into(), "authorization_code".into()));
                form.push(("code".into(), code));
                form.push(("redirect_uri".into(), self.settings.redirect_uri.clone()));
                form.push(("code_verifier".into(), verifier));
            }
        }
        if !scopes.is_empty() {
            form.push(("scope".into(), scopes.join(" ")));
        }
        form.push(("resource".into(), d.resource.clone()));
        let answer = self.token_request(&d, &client, form).await?;
        self.keep(state, answer, scopes, None)
    }

    /// The client: the configured one, a client metadata document URL, or
    /// one registered now (RFC 7591).
    async fn client(&self, d: &Discovered) -> Result<Client, OAuthError> {
        let s = &self.settings;
        if let Some(id) = &s.client_id {
            let method = s.auth.unwrap_or(if s.key.is_some() {
                TokenEndpointAuth::PrivateKeyJwt
            } else if s.client_secret.is_some() {
                if !d.server.takes("client_secret_basic") && d.server.takes("client_secret_post") {
                    TokenEndpointAuth::ClientSecretPost
                } else {
                    TokenEndpointAuth::ClientSecretBasic
                }
            } else {
                TokenEndpointAuth::None
            });
            return Ok(Client {
                id: id.clone(),
                secret: s.client_secret.clone(),
                method,
            });
        }
        if let Some(url) = &s.client_metadata_url {
            if d.server.client_id_metadata_document_supported == Some(true) {
                return Ok(Client {
                    id: url.clone(),
                    secret: None,
                    method: TokenEndpointAuth::None,
                });
            }
        }
        let Some(endpoint) = &d.server.registration_endpoint else {
            return Err(OAuthError::NoClient {
                url: egress::shown_text(&d.server_url),
            });
        };
        self.register(d, endpoint).await
    }

    async fn register(&self, d: &Discovered, endpoint: &str) -> Result<Client, OAuthError> {
        const WHAT: &str = "the registration endpoint";
        let url = Url::parse(endpoint).map_err(|_| OAuthError::BadUrl {
            what: WHAT,
            url: egress::shown_text(endpoint),
        })?;
        let method = if d.server.takes("none") {
            "none"
        } else if d.server.takes("client_secret_basic") {
            "client_secret_basic"
        } else {
            "client_secret_post"
        };
        let body = serde_json::json!({
            "client_name": format!("Bindery ({})", self.toolbox),
            "redirect_uris": [self.settings.redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": method,
        });
        let answer = self
            .post
            .post(url.clone())
            .header(ACCEPT, "application/json")
            .json(&body)
            .send()
            .await
            .map_err(|e| request_error(WHAT, &url, e))?;
        let status = answer.status();
        let bytes = read_body(answer, WHAT, &url).await?;
        if !status.is_success() {
            return Err(status_error(WHAT, &url, status.as_u16(), &bytes));
        }
        let r: Registered = serde_json::from_slice(&bytes).map_err(|e| OAuthError::Body {
            what: WHAT,
            url: egress::shown(&url),
            why: e.to_string(),
        })?;
        let secret = r
            .client_secret
            .filter(|s| !s.is_empty())
            .map(SecretString::new);
        let method = match (r.token_endpoint_auth_method.as_deref(), &secret) {
            (Some("client_secret_post"), Some(_)) => TokenEndpointAuth::ClientSecretPost,
            (Some("client_secret_basic"), Some(_)) => TokenEndpointAuth::ClientSecretBasic,
            (Some(_), _) | (None, None) => TokenEndpointAuth::None,
            (None, Some(_)) if method == "client_secret_post" => {
                TokenEndpointAuth::ClientSecretPost
            }
            (None, Some(_)) => TokenEndpointAuth::ClientSecretBasic,
        };
        Ok(Client {
            id: r.client_id,
            secret,
            method,
        })
    }

    /// The person's consent: the authorization URL, then the code of the
    /// URL they were redirected to, with the code verifier.
    async fn consent(
        &self,
        d: &Discovered,
        client: &Client,
        scopes: &[String],
    ) -> Result<(String, String), OAuthError> {
        let consent = self.consent.as_ref().ok_or(OAuthError::NoConsent)?;
        let verifier = pkce::verifier()?;
        let state = pkce::random(24)?;
        let url = self.authorization_url_for(d, client, scopes, &state, &verifier)?;
        let back = consent
            .redirected(&self.toolbox, url.as_str())
            .await
            .map_err(OAuthError::Consent)?;
        let code = code_of(&back, &self.settings.redirect_uri, &state)?;
        Ok((code, verifier))
    }

    /// The authorization URL of a consent: PKCE S256 with `verifier`'s
    /// challenge, `state`, the resource indicator and `scopes`.
    fn authorization_url_for(
        &self,
        d: &Discovered,
        client: &Client,
        scopes: &[String],
        state: &str,
        verifier: &str,
    ) -> Result<Url, OAuthError> {
        let pkce = match &d.server.code_challenge_methods_supported {
            Some(methods) => methods.iter().any(|m| m == "S256"),
            // Only a 2025-03-26 server's metadata may leave it unsaid.
            None => d.legacy,
        };
        if !pkce {
            return Err(OAuthError::NoPkce {
                url: egress::shown_text(&d.server_url),
            });
        }
        let endpoint = d.server.authorization_endpoint.as_deref().ok_or_else(|| {
            OAuthError::NoAuthorizationEndpoint {
                url: egress::shown_text(&d.server_url),
            }
        })?;
        let mut url = Url::parse(endpoint).map_err(|_| OAuthError::BadUrl {
            what: "the authorization endpoint",
            url: egress::shown_text(endpoint),
        })?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("response_type", "code")
                .append_pair("client_id", &client.id)
                .append_pair("redirect_uri", &self.settings.redirect_uri)
                .append_pair("code_challenge", &pkce::challenge(verifier))
                .append_pair("code_challenge_method", "S256")
                .append_pair("state", state)
                .append_pair("resource", &d.resource);
            if !scopes.is_empty() {
                q.append_pair("scope", &scopes.join(" "));
            }
        }
        Ok(url)
    }

    /// What a person's consent needs, discovered now if not yet: where the
    /// tokens come from and the client.
    async fn ready(&self, state: &mut State) -> Result<(Discovered, Client), OAuthError> {
        if state.discovered.is_none() {
            state.discovered = Some(self.discover(None).await?);
        }
        self.discovered_client(state).await
    }

    /// Where tokens come from, as discovered already, and the client (made
    /// now, once, if not yet).
    async fn discovered_client(
        &self,
        state: &mut State,
    ) -> Result<(Discovered, Client), OAuthError> {
        let Some(d) = state.discovered.clone() else {
            return Err(OAuthError::NoAuthorizationServer {
                at: egress::shown(&self.server),
            });
        };
        let client = match &state.client {
            Some(c) => c.clone(),
            None => {
                let c = self.client(&d).await?;
                state.client = Some(c.clone());
                c
            }
        };
        Ok((d, client))
    }

    /// The URL a person opens to consent to a connection (the server's
    /// way: the state and verifier are the caller's, so that whoever gets
    /// the redirect can finish it), with the scopes it asks for.
    pub async fn consent_url(
        &self,
        state: &str,
        verifier: &str,
    ) -> Result<(String, Vec<String>), OAuthError> {
        let mut st = self.state.lock().await;
        let (d, client) = self.ready(&mut st).await?;
        let scopes = self.initial_scopes(&st, &Bearer::default());
        let url = self.authorization_url_for(&d, &client, &scopes, state, verifier)?;
        Ok((url.into(), scopes))
    }

    /// The tokens for the code a person's consent brought back (with the
    /// verifier of its URL); they are this connection's from now on.
    pub async fn redeem(
        &self,
        code: &str,
        verifier: &str,
        scopes: Vec<String>,
    ) -> Result<Granted, OAuthError> {
        let mut st = self.state.lock().await;
        let (d, client) = self.ready(&mut st).await?;
        let form = vec![
            ("grant_type".to_string(), "authorization_code".to_string()),
            ("code".into(), code.to_string()),
            ("redirect_uri".into(), self.settings.redirect_uri.clone()),
            ("code_verifier".into(), verifier.to_string()),
            ("resource".into(), d.resource.clone()),
        ];
        let answer = self.token_request(&d, &client, form).await?;
        let expires_in = answer.expires_in;
        let access = self.keep(&mut st, answer, scopes.clone(), None)?;
        let refresh = st.token.as_ref().and_then(|t| t.refresh.clone());
        Ok(Granted {
            access,
            refresh,
            expires_in,
            scopes,
        })
    }

    /// A grant kept from an earlier consent: its refresh token gets the
    /// tokens from now on (the first request refreshes it; discovery is
    /// done now, so that it can).
    pub async fn resume(
        &self,
        refresh: SecretString,
        scopes: Vec<String>,
    ) -> Result<(), OAuthError> {
        let mut st = self.state.lock().await;
        self.ready(&mut st).await?;
        let live = vec![(
            format!("mcp_{}_refresh_token", self.toolbox),
            refresh.clone(),
        )];
        st.token = Some(Cached {
            access: SecretString::new(""),
            refresh: Some(refresh),
            // Expired: the first use refreshes it.
            expires: Some(Instant::now()),
            scopes,
            _live: bindery_params::live::register(live),
        });
        Ok(())
    }

    /// The refresh token now held (rotated by a refresh), to keep.
    pub async fn refresh_token(&self) -> Option<SecretString> {
        let st = self.state.lock().await;
        st.token.as_ref().and_then(|t| t.refresh.clone())
    }

    /// Revoke `token` at the authorization server (RFC 7009), when its
    /// metadata names a revocation endpoint; `Ok(false)` when it names none.
    pub async fn revoke(&self, token: &SecretString) -> Result<bool, OAuthError> {
        let mut st = self.state.lock().await;
        let (d, client) = self.ready(&mut st).await?;
        let Some(endpoint) = d.server.revocation_endpoint.clone() else {
            return Ok(false);
        };
        let form = vec![
            ("token".to_string(), token.expose().to_string()),
            ("token_type_hint".into(), "refresh_token".into()),
        ];
        self.client_request(&d, &client, &endpoint, "the revocation endpoint", form)
            .await?;
        Ok(true)
    }

    /// POST `form` to the token endpoint with the client's authentication.
    async fn token_request(
        &self,
        d: &Discovered,
        client: &Client,
        form: Vec<(String, String)>,
    ) -> Result<TokenAnswer, OAuthError> {
        const WHAT: &str = "the token endpoint";
        let endpoint = d.server.token_endpoint.clone();
        let (url, bytes) = self
            .client_request(d, client, &endpoint, WHAT, form)
            .await?;
        let answer: TokenAnswer = serde_json::from_slice(&bytes).map_err(|e| OAuthError::Body {
            what: WHAT,
            url: egress::shown(&url),
            // serde's message quotes no value of a field it read.
            why: e.to_string(),
        })?;
        if let Some(kind) = &answer.token_type {
            if !kind.eq_ignore_ascii_case("bearer") {
                return Err(OAuthError::NotBearer {
                    url: egress::shown(&url),
                    kind: quoted(kind),
                });
            }
        }
        Ok(answer)
    }

    /// POST `form` to `endpoint` (the token or revocation endpoint) with
    /// the client's authentication; the body of a success.
    async fn client_request(
        &self,
        d: &Discovered,
        client: &Client,
        endpoint: &str,
        what: &'static str,
        mut form: Vec<(String, String)>,
    ) -> Result<(Url, Vec<u8>), OAuthError> {
        const WHAT: &str = "the token endpoint";
        let url = Url::parse(endpoint).map_err(|_| OAuthError::BadUrl {
            what,
            url: egress::shown_text(endpoint),
        })?;
        if !discovery::secure(&url) {
            return Err(OAuthError::Insecure {
                what,
                url: egress::shown(&url),
            });
        }
        let mut basic = None;
        match client.method {
            TokenEndpointAuth::ClientSecretBasic => {
                let secret = client.secret.as_ref().map_or("", |s| s.expose());
                let mut v = HeaderValue::from_str(&format!(
                    "Basic {}",
                    STANDARD.encode(format!("{}:{}", pct(&client.id), pct(secret)))
                ))
                .map_err(|_| OAuthError::BadUrl {
                    what: "`oauth.clientId`",
                    url: quoted(&client.id),
                })?;
                v.set_sensitive(true);
                basic = Some(v);
            }
            TokenEndpointAuth::ClientSecretPost => {
                form.push(("client_id".into(), client.id.clone()));
                let secret = client.secret.as_ref().map_or("", |s| s.expose());
                form.push(("client_secret".into(), secret.to_string()));
            }
            TokenEndpointAuth::PrivateKeyJwt => {
                let Some((key, alg)) = &self.settings.key else {
                    return Err(OAuthError::Key(KeyError::NotPem));
                };
                let audience = d
                    .server
                    .issuer
                    .clone()
                    .unwrap_or_else(|| d.server.token_endpoint.clone());
                let claims =
                    assertion::claims(&client.id, &audience, now_secs(), &pkce::random(16)?);
                form.push(("client_id".into(), client.id.clone()));
                form.push((
                    "client_assertion_type".into(),
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".into(),
                ));
                form.push((
                    "client_assertion".into(),
                    assertion::sign(key, *alg, &claims)?,
                ));
            }
            TokenEndpointAuth::None => form.push(("client_id".into(), client.id.clone())),
        }
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form.iter())
            .finish();
        let mut request = self
            .post
            .post(url.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ACCEPT, "application/json")
            .body(body);
        if let Some(v) = basic {
            request = request.header(AUTHORIZATION, v);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| request_error(what, &url, e))?;
        let status = answer.status();
        let bytes = read_body(answer, what, &url).await?;
        if !status.is_success() {
            if let Ok(e) = serde_json::from_slice::<ErrorAnswer>(&bytes) {
                // The error code only, and only when it is one: a token
                // endpoint may echo the credential it was sent into its
                // description (or its "code"), and this error is logged.
                if what == WHAT {
                    return Err(OAuthError::TokenRefused {
                        url: egress::shown(&url),
                        error: bindery_spec::oauth_error_code(&e.error),
                        description: String::new(),
                    });
                }
            }
            return Err(status_error(what, &url, status.as_u16(), &bytes));
        }
        Ok((url, bytes))
    }

    /// Cache `answer`'s token (its refresh token, else `old_refresh`).
    fn keep(
        &self,
        state: &mut State,
        answer: TokenAnswer,
        scopes: Vec<String>,
        old_refresh: Option<SecretString>,
    ) -> Result<SecretString, OAuthError> {
        let access = SecretString::new(answer.access_token);
        let refresh = answer.refresh_token.map(SecretString::new).or(old_refresh);
        let mut live = vec![(format!("mcp_{}_access_token", self.toolbox), access.clone())];
        if let Some(r) = &refresh {
            live.push((format!("mcp_{}_refresh_token", self.toolbox), r.clone()));
        }
        state.token = Some(Cached {
            access: access.clone(),
            refresh,
            expires: answer
                .expires_in
                .map(|s| Instant::now() + Duration::from_secs(s)),
            scopes,
            _live: bindery_params::live::register(live),
        });
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(access.clone());
        Ok(access)
    }
}

/// The code of the URL the person was redirected to, checked: it is the
/// redirect URI, with this flow's `state`, and no `error`. Pure.
pub fn code_of(redirected: &str, redirect_uri: &str, state: &str) -> Result<String, OAuthError> {
    let (Ok(got), Ok(want)) = (Url::parse(redirected.trim()), Url::parse(redirect_uri)) else {
        return Err(OAuthError::Redirect(format!(
            "is not a URL; paste the whole address the browser was sent to (it starts with {redirect_uri})"
        )));
    };
    if got.origin() != want.origin() || got.path() != want.path() {
        return Err(OAuthError::Redirect(format!(
            "goes to {}, not to the redirect URI {redirect_uri}",
            egress::shown(&got)
        )));
    }
    let param = |name: &str| {
        got.query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    if let Some(e) = param("error") {
        let d = param("error_description")
            .map(|d| format!(" ({})", quoted(&d)))
            .unwrap_or_default();
        return Err(OAuthError::Consent(format!(
            "the authorization server answered {}{d}",
            quoted(&e)
        )));
    }
    if param("state").as_deref() != Some(state) {
        return Err(OAuthError::Redirect(
            "carries another `state` than this authorization's: it is not the answer to it (start again)".into(),
        ));
    }
    param("code")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| OAuthError::Redirect("carries no `code`".into()))
}

fn request_error(what: &'static str, url: &Url, e: reqwest::Error) -> OAuthError {
    let why = match egress::refused(&e) {
        Some(r) => r.to_string(),
        // Without the URL: reqwest's message would repeat its query.
        None => e.without_url().to_string(),
    };
    OAuthError::Request {
        what,
        url: egress::shown(url),
        why,
    }
}

fn status_error(what: &'static str, url: &Url, status: u16, body: &[u8]) -> OAuthError {
    let detail = serde_json::from_slice::<ErrorAnswer>(body)
        .map(|e| format!(": {}", bindery_spec::oauth_error_code(&e.error)))
        .unwrap_or_default();
    OAuthError::Status {
        what,
        url: egress::shown(url),
        status,
        detail,
    }
}

/// The body, at most [`MAX_BODY`] bytes.
async fn read_body(
    mut answer: reqwest::Response,
    what: &'static str,
    url: &Url,
) -> Result<Vec<u8>, OAuthError> {
    let mut out = Vec::new();
    while let Some(chunk) = answer
        .chunk()
        .await
        .map_err(|e| request_error(what, url, e))?
    {
        if out.len() + chunk.len() > MAX_BODY {
            return Err(OAuthError::Body {
                what,
                url: egress::shown(url),
                why: format!("more than {MAX_BODY} bytes"),
            });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
