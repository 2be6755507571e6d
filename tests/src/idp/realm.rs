//! A test's realm: what it holds (made through the admin REST API by
//! [`RealmBuilder::create`]) and the parties a test plays against it.

use std::fmt;
use std::time::Duration;

use reqwest::{Method, Url};
use serde_json::{json, Value};

use super::jwt::{self, ClientKey, Pkce};
use super::login::{self, LoginError};
use super::Idp;

/// How a client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A public client: no secret, its `client_id` in the form.
    Public,
    /// `client_secret_basic`: HTTP Basic with the id and secret.
    SecretBasic,
    /// `client_secret_post`: the id and secret in the form.
    SecretPost,
    /// `private_key_jwt` (RFC 7523): an assertion signed with the client's
    /// key (P-256, ES256), whose public half the realm holds.
    PrivateKeyJwt,
}

/// A client of the realm to make.
#[derive(Debug, Clone)]
pub struct Client {
    id: String,
    auth: ClientAuth,
    redirect_uris: Vec<String>,
    audiences: Vec<String>,
    token_exchange: bool,
    optional_scopes: Vec<String>,
    password_grant: bool,
    access_token_lifespan: Option<Duration>,
}

impl Client {
    /// A public client of the authorization-code flow, PKCE (S256)
    /// required, redirecting to `redirect_uri`.
    pub fn public(id: &str, redirect_uri: &str) -> Client {
        Client::new(id, ClientAuth::Public).redirect_uri(redirect_uri)
    }

    /// A confidential client authenticating with `auth`, with a service
    /// account (the client-credentials grant).
    pub fn confidential(id: &str, auth: ClientAuth) -> Client {
        assert!(
            auth != ClientAuth::Public,
            "a confidential client authenticates: SecretBasic, SecretPost or PrivateKeyJwt"
        );
        Client::new(id, auth)
    }

    fn new(id: &str, auth: ClientAuth) -> Client {
        Client {
            id: id.to_string(),
            auth,
            redirect_uris: Vec::new(),
            audiences: Vec::new(),
            token_exchange: false,
            optional_scopes: Vec::new(),
            password_grant: false,
            access_token_lifespan: None,
        }
    }

    /// Also the authorization-code flow (PKCE S256 required), back to
    /// `uri`.
    pub fn redirect_uri(mut self, uri: &str) -> Client {
        self.redirect_uris.push(uri.to_string());
        self
    }

    /// Its access tokens also carry `aud` = `audience` (another client of
    /// the realm, or any string).
    pub fn audience(mut self, audience: &str) -> Client {
        self.audiences.push(audience.to_string());
        self
    }

    /// It may exchange tokens (RFC 8693, Keycloak's standard token
    /// exchange): a subject token whose `aud` holds this client, for a
    /// token of an audience this client's tokens may carry
    /// ([`Self::audience`]).
    pub fn token_exchange(mut self) -> Client {
        self.token_exchange = true;
        self
    }

    /// It may ask for the realm's client scope `scope` (made with
    /// [`RealmBuilder::scope`]); its tokens carry it only when asked.
    pub fn optional_scope(mut self, scope: &str) -> Client {
        self.optional_scopes.push(scope.to_string());
        self
    }

    /// It may use the resource owner password grant (not OAuth 2.1; for a
    /// quick user token).
    pub fn password_grant(mut self) -> Client {
        self.password_grant = true;
        self
    }

    /// Its access tokens live `lifespan` (whole seconds), not the realm's.
    pub fn access_token_lifespan(mut self, lifespan: Duration) -> Client {
        self.access_token_lifespan = Some(lifespan);
        self
    }
}

/// What a client presents at the token endpoint. Tests make wrong ones
/// (another secret, another key) to see them refused.
#[derive(Clone)]
pub enum Credentials {
    Public { client_id: String },
    SecretBasic { client_id: String, secret: String },
    SecretPost { client_id: String, secret: String },
    PrivateKeyJwt { client_id: String, key: ClientKey },
}

impl fmt::Debug for Credentials {
    // Secrets and keys are never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Credentials::Public { .. } => "Public",
            Credentials::SecretBasic { .. } => "SecretBasic",
            Credentials::SecretPost { .. } => "SecretPost",
            Credentials::PrivateKeyJwt { .. } => "PrivateKeyJwt",
        };
        write!(f, "{kind}({})", self.client_id())
    }
}

impl Credentials {
    /// The client's id.
    pub fn client_id(&self) -> &str {
        match self {
            Credentials::Public { client_id }
            | Credentials::SecretBasic { client_id, .. }
            | Credentials::SecretPost { client_id, .. }
            | Credentials::PrivateKeyJwt { client_id, .. } => client_id,
        }
    }

    /// The client's secret (the two secret methods).
    pub fn secret(&self) -> Option<&str> {
        match self {
            Credentials::SecretBasic { secret, .. } | Credentials::SecretPost { secret, .. } => {
                Some(secret)
            }
            _ => None,
        }
    }

    /// The client's key (`private_key_jwt`): its private half as PEM with
    /// [`ClientKey::private_key_pem`].
    pub fn key(&self) -> Option<&ClientKey> {
        match self {
            Credentials::PrivateKeyJwt { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The same client with another secret, or another key: what the
    /// server must refuse.
    pub fn wrong(&self) -> Credentials {
        let mut wrong = self.clone();
        match &mut wrong {
            Credentials::SecretBasic { secret, .. } | Credentials::SecretPost { secret, .. } => {
                *secret = jwt::random_token(24)
            }
            Credentials::PrivateKeyJwt { key, .. } => {
                // Another key under the same kid: only the signature differs.
                let kid = key.kid.clone();
                *key = ClientKey::generate();
                key.kid = kid;
            }
            Credentials::Public { .. } => {}
        }
        wrong
    }

    /// `request` with this client's authentication; `issuer` is the
    /// audience of a client assertion.
    fn apply(
        &self,
        request: reqwest::RequestBuilder,
        form: &mut Vec<(String, String)>,
        issuer: &str,
    ) -> reqwest::RequestBuilder {
        let mut add = |k: &str, v: &str| form.push((k.to_string(), v.to_string()));
        match self {
            Credentials::Public { client_id } => {
                add("client_id", client_id);
                request
            }
            Credentials::SecretBasic { client_id, secret } => {
                request.basic_auth(client_id, Some(secret))
            }
            Credentials::SecretPost { client_id, secret } => {
                add("client_id", client_id);
                add("client_secret", secret);
                request
            }
            Credentials::PrivateKeyJwt { client_id, key } => {
                add("client_id", client_id);
                add(
                    "client_assertion_type",
                    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                );
                add("client_assertion", &key.client_assertion(client_id, issuer));
                request
            }
        }
    }
}

/// A refusal by the server's OAuth endpoints (RFC 6749 section 5.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthError {
    pub status: u16,
    /// `error`: `invalid_client`, `invalid_grant`, …
    pub error: String,
    pub description: String,
}

impl fmt::Display for OAuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.error, self.description)
    }
}

impl std::error::Error for OAuthError {}

/// A token endpoint's answer.
#[derive(Clone)]
pub struct Tokens {
    pub access_token: String,
    pub id_token: Option<String>,
    pub refresh_token: Option<String>,
    /// `expires_in`, seconds.
    pub expires_in: u64,
    /// The granted scopes (`scope`).
    pub scope: String,
    /// The whole answer.
    pub raw: Value,
}

impl fmt::Debug for Tokens {
    // Tokens are credentials: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens")
            .field("id_token", &self.id_token.is_some())
            .field("refresh_token", &self.refresh_token.is_some())
            .field("expires_in", &self.expires_in)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// The access token's claims (unverified; [`Realm::verify`] verifies).
    pub fn claims(&self) -> Value {
        jwt::claims(&self.access_token).expect("Keycloak's access tokens are JWTs")
    }
}

/// A realm to make ([`Idp::realm`]).
pub struct RealmBuilder<'a> {
    idp: &'a Idp,
    name: String,
    users: Vec<(String, String)>,
    clients: Vec<Client>,
    scopes: Vec<String>,
    access_token_lifespan: Option<Duration>,
    session_idle: Option<Duration>,
}

impl<'a> RealmBuilder<'a> {
    pub(super) fn new(idp: &'a Idp, name: String) -> RealmBuilder<'a> {
        RealmBuilder {
            idp,
            name,
            users: Vec::new(),
            clients: Vec::new(),
            scopes: Vec::new(),
            access_token_lifespan: None,
            session_idle: None,
        }
    }

    /// A user who logs in with `password` (email `USER@example.test`,
    /// verified, and a name: nothing left for Keycloak to ask at login).
    pub fn user(mut self, name: &str, password: &str) -> Self {
        self.users.push((name.to_string(), password.to_string()));
        self
    }

    /// A client (see [`Client`]).
    pub fn client(mut self, client: Client) -> Self {
        self.clients.push(client);
        self
    }

    /// A client scope `name`, put in the token's `scope` when granted; a
    /// client asks for it when [`Client::optional_scope`] lets it.
    pub fn scope(mut self, name: &str) -> Self {
        self.scopes.push(name.to_string());
        self
    }

    /// The realm's access tokens live `lifespan` (whole seconds; default
    /// 5 minutes).
    pub fn access_token_lifespan(mut self, lifespan: Duration) -> Self {
        self.access_token_lifespan = Some(lifespan);
        self
    }

    /// A session (and its refresh tokens) idle for `idle` ends (default
    /// 30 minutes).
    pub fn session_idle(mut self, idle: Duration) -> Self {
        self.session_idle = Some(idle);
        self
    }

    /// Make it.
    pub async fn create(self) -> Realm<'a> {
        let idp = self.idp;
        let name = self.name;
        let users: Vec<Value> = self
            .users
            .iter()
            .map(|(user, password)| {
                json!({
                    "username": user,
                    "enabled": true,
                    "email": format!("{user}@example.test"),
                    "emailVerified": true,
                    "firstName": user,
                    "lastName": "Test",
                    "credentials": [{"type": "password", "value": password, "temporary": false}],
                })
            })
            .collect();
        let mut realm = json!({
            // The id is the name: the key providers' parent.
            "id": name,
            "realm": name,
            "enabled": true,
            "sslRequired": "none",
            // A test's passwords need no slow hash (Keycloak's default,
            // argon2, costs CPU at every login on a shared machine).
            "passwordPolicy": "hashAlgorithm(pbkdf2-sha256) and hashIterations(1)",
            "users": users,
        });
        if let Some(lifespan) = self.access_token_lifespan {
            realm["accessTokenLifespan"] = json!(lifespan.as_secs());
        }
        if let Some(idle) = self.session_idle {
            realm["ssoSessionIdleTimeout"] = json!(idle.as_secs());
        }
        idp.admin(Method::POST, "", Some(&realm)).await;

        let mut scope_ids = Vec::new();
        for scope in &self.scopes {
            let (_, location) = idp
                .admin(
                    Method::POST,
                    &format!("/{name}/client-scopes"),
                    Some(&json!({
                        "name": scope,
                        "protocol": "openid-connect",
                        "attributes": {
                            "include.in.token.scope": "true",
                            "display.on.consent.screen": "false",
                        },
                    })),
                )
                .await;
            scope_ids.push((scope.clone(), last_segment(&location)));
        }

        let client_ids: Vec<&str> = self.clients.iter().map(|c| c.id.as_str()).collect();
        let mut clients = Vec::new();
        for client in &self.clients {
            let credentials = match client.auth {
                ClientAuth::Public => Credentials::Public {
                    client_id: client.id.clone(),
                },
                ClientAuth::SecretBasic => Credentials::SecretBasic {
                    client_id: client.id.clone(),
                    secret: jwt::random_token(24),
                },
                ClientAuth::SecretPost => Credentials::SecretPost {
                    client_id: client.id.clone(),
                    secret: jwt::random_token(24),
                },
                ClientAuth::PrivateKeyJwt => Credentials::PrivateKeyJwt {
                    client_id: client.id.clone(),
                    key: ClientKey::generate(),
                },
            };
            let representation = client_representation(client, &credentials, &client_ids);
            let (_, location) = idp
                .admin(
                    Method::POST,
                    &format!("/{name}/clients"),
                    Some(&representation),
                )
                .await;
            let uuid = last_segment(&location);
            for scope in &client.optional_scopes {
                let scope_id = scope_ids
                    .iter()
                    .find(|(s, _)| s == scope)
                    .map(|(_, id)| id)
                    .unwrap_or_else(|| {
                        panic!(
                            "client {} names the optional scope {scope}, which the realm does \
                             not have: add it with RealmBuilder::scope",
                            client.id
                        )
                    });
                idp.admin(
                    Method::PUT,
                    &format!("/{name}/clients/{uuid}/optional-client-scopes/{scope_id}"),
                    None,
                )
                .await;
            }
            clients.push(RealmClient {
                credentials,
                redirect_uri: client.redirect_uris.first().cloned(),
            });
        }
        Realm {
            idp,
            name,
            users: self.users,
            clients,
            rotations: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

/// The id at the end of a `Location` (`.../clients/UUID`).
fn last_segment(location: &str) -> String {
    let id = location.rsplit('/').next().unwrap_or_default();
    assert!(
        !id.is_empty(),
        "Keycloak's admin API created an object without a Location"
    );
    id.to_string()
}

/// The admin API's representation of `client`.
fn client_representation(
    client: &Client,
    credentials: &Credentials,
    realm_clients: &[&str],
) -> Value {
    let public = client.auth == ClientAuth::Public;
    let mut attributes = json!({
        // OAuth 2.1: every authorization-code flow with PKCE, S256 only.
        "pkce.code.challenge.method": "S256",
        "standard.token.exchange.enabled": client.token_exchange.to_string(),
    });
    if let Some(lifespan) = client.access_token_lifespan {
        attributes["access.token.lifespan"] = json!(lifespan.as_secs().to_string());
    }
    if let Some(key) = credentials.key() {
        attributes["use.jwks.string"] = json!("true");
        attributes["jwks.string"] = json!(key.jwks().to_string());
        attributes["token.endpoint.auth.signing.alg"] = json!("ES256");
    }
    let mappers: Vec<Value> = client
        .audiences
        .iter()
        .map(|audience| {
            // A client of the realm by its id (what token exchange's
            // `audience` names), anything else as a custom audience.
            let key = if realm_clients.contains(&audience.as_str()) {
                "included.client.audience"
            } else {
                "included.custom.audience"
            };
            json!({
                "name": format!("audience {audience}"),
                "protocol": "openid-connect",
                "protocolMapper": "oidc-audience-mapper",
                "config": {
                    key: audience,
                    "access.token.claim": "true",
                    "id.token.claim": "false",
                    "introspection.token.claim": "true",
                },
            })
        })
        .collect();
    let mut representation = json!({
        "clientId": client.id,
        "enabled": true,
        "protocol": "openid-connect",
        "publicClient": public,
        "standardFlowEnabled": !client.redirect_uris.is_empty(),
        "implicitFlowEnabled": false,
        "directAccessGrantsEnabled": client.password_grant,
        "serviceAccountsEnabled": !public,
        "redirectUris": client.redirect_uris,
        "webOrigins": [],
        "attributes": attributes,
        "protocolMappers": mappers,
    });
    match credentials {
        // Keycloak's `client-secret` takes the secret either way (Basic or
        // the form); which one a test uses is its Credentials'.
        Credentials::SecretBasic { secret, .. } | Credentials::SecretPost { secret, .. } => {
            representation["clientAuthenticatorType"] = json!("client-secret");
            representation["secret"] = json!(secret);
        }
        Credentials::PrivateKeyJwt { .. } => {
            representation["clientAuthenticatorType"] = json!("client-jwt");
        }
        Credentials::Public { .. } => {}
    }
    representation
}

struct RealmClient {
    credentials: Credentials,
    redirect_uri: Option<String>,
}

/// A realm made by [`RealmBuilder::create`]. It stays until the server
/// stops.
pub struct Realm<'a> {
    idp: &'a Idp,
    name: String,
    /// (user, password): the admin API does not give passwords back.
    users: Vec<(String, String)>,
    clients: Vec<RealmClient>,
    rotations: std::sync::atomic::AtomicUsize,
}

impl Realm<'_> {
    /// The realm's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The issuer (`iss` of its tokens; discovery at
    /// `ISSUER/.well-known/openid-configuration`).
    pub fn issuer(&self) -> String {
        self.idp.issuer(&self.name)
    }

    fn endpoint(&self, name: &str) -> String {
        format!("{}/protocol/openid-connect/{name}", self.issuer())
    }

    /// The token endpoint.
    pub fn token_endpoint(&self) -> String {
        self.endpoint("token")
    }

    /// The authorization endpoint.
    pub fn authorization_endpoint(&self) -> String {
        self.endpoint("auth")
    }

    /// The JWKS document's URL.
    pub fn jwks_uri(&self) -> String {
        self.endpoint("certs")
    }

    /// The revocation endpoint (RFC 7009).
    pub fn revocation_endpoint(&self) -> String {
        self.endpoint("revoke")
    }

    /// The UserInfo endpoint.
    pub fn userinfo_endpoint(&self) -> String {
        self.endpoint("userinfo")
    }

    fn client(&self, client_id: &str) -> &RealmClient {
        self.clients
            .iter()
            .find(|c| c.credentials.client_id() == client_id)
            .unwrap_or_else(|| panic!("realm {} has no client {client_id}", self.name))
    }

    /// What client `client_id` presents (its secret or key): to configure
    /// Bindery with, or to make a wrong one from ([`Credentials::wrong`]).
    pub fn credentials(&self, client_id: &str) -> Credentials {
        self.client(client_id).credentials.clone()
    }

    /// Client `client_id`'s (first) redirect URI.
    pub fn redirect_uri(&self, client_id: &str) -> String {
        self.client(client_id)
            .redirect_uri
            .clone()
            .unwrap_or_else(|| panic!("client {client_id} has no redirect URI"))
    }

    /// A token request with `credentials` and the `form`'s parameters.
    pub async fn token_request(
        &self,
        credentials: &Credentials,
        form: &[(&str, &str)],
    ) -> Result<Tokens, OAuthError> {
        let answer = self.post(&self.token_endpoint(), credentials, form).await?;
        let access_token = answer["access_token"]
            .as_str()
            .ok_or_else(|| OAuthError {
                status: 200,
                error: "no access_token".into(),
                description: "the token endpoint's answer has no access_token".into(),
            })?
            .to_string();
        Ok(Tokens {
            access_token,
            id_token: answer["id_token"].as_str().map(str::to_string),
            refresh_token: answer["refresh_token"].as_str().map(str::to_string),
            expires_in: answer["expires_in"].as_u64().unwrap_or_default(),
            scope: answer["scope"].as_str().unwrap_or_default().to_string(),
            raw: answer,
        })
    }

    /// POST `form` to `url` with the client's authentication: the JSON
    /// answer, or the refusal.
    async fn post(
        &self,
        url: &str,
        credentials: &Credentials,
        form: &[(&str, &str)],
    ) -> Result<Value, OAuthError> {
        let mut fields: Vec<(String, String)> = form
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let request = credentials.apply(self.idp.http.post(url), &mut fields, &self.issuer());
        let answer = request.form(&fields).send().await.map_err(|e| OAuthError {
            status: 0,
            error: "unreachable".into(),
            description: e.to_string(),
        })?;
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(OAuthError {
                status,
                error: body["error"].as_str().unwrap_or("(none)").to_string(),
                description: body["error_description"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or(text),
            })
        }
    }

    /// The client-credentials grant for client `client_id`, with `scopes`.
    pub async fn client_credentials(
        &self,
        client_id: &str,
        scopes: &[&str],
    ) -> Result<Tokens, OAuthError> {
        let scope = scopes.join(" ");
        let mut form = vec![("grant_type", "client_credentials")];
        if !scopes.is_empty() {
            form.push(("scope", &scope));
        }
        self.token_request(&self.credentials(client_id), &form)
            .await
    }

    /// The authorization URL of client `client_id` asking for `openid`
    /// and `scopes`, with `pkce`'s challenge (S256) and `state`.
    pub fn authorization_url(
        &self,
        client_id: &str,
        scopes: &[&str],
        pkce: &Pkce,
        state: &str,
    ) -> String {
        let scope = std::iter::once("openid")
            .chain(scopes.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        let mut url = Url::parse(&self.authorization_endpoint()).expect("the endpoint's URL");
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", client_id)
            .append_pair("redirect_uri", &self.redirect_uri(client_id))
            .append_pair("scope", &scope)
            .append_pair("state", state)
            .append_pair("code_challenge", &pkce.challenge)
            .append_pair("code_challenge_method", "S256");
        url.into()
    }

    /// The person at the browser: open `authorization_url` (this realm's,
    /// made by the test or by Bindery), log in as `user` with `password`;
    /// the URL Keycloak sends the browser back to (the client's redirect
    /// URI with `code` and `state`, or with `error`).
    pub async fn login(
        &self,
        authorization_url: &str,
        user: &str,
        password: &str,
    ) -> Result<String, LoginError> {
        login::login(&self.idp.browser, authorization_url, user, password).await
    }

    /// Exchange an authorization `code` for tokens, as client
    /// `credentials` with the PKCE `verifier`.
    pub async fn code_token(
        &self,
        credentials: &Credentials,
        code: &str,
        verifier: &str,
    ) -> Result<Tokens, OAuthError> {
        let redirect_uri = self.redirect_uri(credentials.client_id());
        self.token_request(
            credentials,
            &[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", &redirect_uri),
                ("code_verifier", verifier),
            ],
        )
        .await
    }

    /// `user`'s tokens for client `client_id` with `scopes` (and
    /// `openid`), through the whole authorization-code flow with PKCE.
    /// Panics, saying where, if any step fails.
    pub async fn user_token(&self, user: &str, client_id: &str, scopes: &[&str]) -> Tokens {
        let password = self.password(user);
        let pkce = Pkce::new();
        let state = jwt::random_token(12);
        let url = self.authorization_url(client_id, scopes, &pkce, &state);
        let back = self
            .login(&url, user, &password)
            .await
            .unwrap_or_else(|e| panic!("{user}'s login to {client_id}: {e}"));
        let code = query_param(&back, "code").unwrap_or_else(|| {
            panic!("{user}'s login to {client_id} came back without a code: {back}")
        });
        assert_eq!(
            query_param(&back, "state").as_deref(),
            Some(state.as_str()),
            "the state came back changed"
        );
        self.code_token(&self.credentials(client_id), &code, &pkce.verifier)
            .await
            .unwrap_or_else(|e| panic!("{user}'s code for {client_id}: {e}"))
    }

    /// The password `user` was made with.
    fn password(&self, user: &str) -> String {
        self.users
            .iter()
            .find(|(u, _)| u == user)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| panic!("realm {} has no user {user}", self.name))
    }

    /// The refresh grant.
    pub async fn refresh(
        &self,
        credentials: &Credentials,
        refresh_token: &str,
    ) -> Result<Tokens, OAuthError> {
        self.token_request(
            credentials,
            &[
                ("grant_type", "refresh_token"),
                ("refresh_token", refresh_token),
            ],
        )
        .await
    }

    /// Revoke `refresh_token` (RFC 7009) as its client: the session it
    /// belongs to ends, and a refresh with it is refused afterwards.
    pub async fn revoke(
        &self,
        credentials: &Credentials,
        refresh_token: &str,
    ) -> Result<(), OAuthError> {
        self.post(
            &self.revocation_endpoint(),
            credentials,
            &[
                ("token", refresh_token),
                ("token_type_hint", "refresh_token"),
            ],
        )
        .await
        .map(|_| ())
    }

    /// End every session of `user` (the administrator's logout).
    pub async fn logout(&self, user: &str) {
        let (found, _) = self
            .idp
            .admin(
                Method::GET,
                &format!("/{}/users?exact=true&username={user}", self.name),
                None,
            )
            .await;
        let id = found[0]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("realm {} has no user {user}", self.name))
            .to_string();
        self.idp
            .admin(
                Method::POST,
                &format!("/{}/users/{id}/logout", self.name),
                None,
            )
            .await;
    }

    /// RFC 8693 token exchange as client `credentials`: `subject_token`
    /// (an access token) for one whose `aud` is `audience`, with `scopes`.
    pub async fn exchange(
        &self,
        credentials: &Credentials,
        subject_token: &str,
        audience: &str,
        scopes: &[&str],
    ) -> Result<Tokens, OAuthError> {
        let scope = scopes.join(" ");
        let mut form = vec![
            (
                "grant_type",
                "urn:ietf:params:oauth:grant-type:token-exchange",
            ),
            ("subject_token", subject_token),
            (
                "subject_token_type",
                "urn:ietf:params:oauth:token-type:access_token",
            ),
            (
                "requested_token_type",
                "urn:ietf:params:oauth:token-type:access_token",
            ),
            ("audience", audience),
        ];
        if !scopes.is_empty() {
            form.push(("scope", &scope));
        }
        self.token_request(credentials, &form).await
    }

    /// The realm's JWKS document.
    pub async fn jwks(&self) -> Value {
        self.idp
            .http
            .get(self.jwks_uri())
            .send()
            .await
            .expect("Keycloak answers for the JWKS")
            .json()
            .await
            .expect("the JWKS is JSON")
    }

    /// The claims of `token` once its signature verifies against the
    /// realm's JWKS (fetched now) and its `iss` is the realm's.
    pub async fn verify(&self, token: &str) -> Result<Value, String> {
        let claims = jwt::verify(token, &self.jwks().await).map_err(|e| e.to_string())?;
        if claims["iss"] != self.issuer().as_str() {
            return Err(format!("iss is {}, not {}", claims["iss"], self.issuer()));
        }
        Ok(claims)
    }

    /// UserInfo with `access_token`: the server's own word on whether it
    /// still takes the token.
    pub async fn userinfo(&self, access_token: &str) -> Result<Value, OAuthError> {
        let answer = self
            .idp
            .http
            .get(self.userinfo_endpoint())
            .bearer_auth(access_token)
            .send()
            .await
            .map_err(|e| OAuthError {
                status: 0,
                error: "unreachable".into(),
                description: e.to_string(),
            })?;
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status == 200 {
            Ok(body)
        } else {
            Err(OAuthError {
                status,
                error: body["error"].as_str().unwrap_or("(none)").to_string(),
                description: text,
            })
        }
    }

    /// The kid the realm signs RS256 tokens with now.
    pub async fn signing_kid(&self) -> String {
        let (keys, _) = self
            .idp
            .admin(Method::GET, &format!("/{}/keys", self.name), None)
            .await;
        keys["active"]["RS256"]
            .as_str()
            .expect("the realm has an active RS256 key")
            .to_string()
    }

    /// Rotate the signing key: a new RSA key (its own provider, of a
    /// higher priority than any) signs the tokens from now on; the old one
    /// stays in the JWKS (tokens it signed still verify) until
    /// [`Self::retire_signing_key`]. The new kid.
    pub async fn rotate_signing_key(&self) -> String {
        let (keys, _) = self
            .idp
            .admin(Method::GET, &format!("/{}/keys", self.name), None)
            .await;
        let highest = keys["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|k| k["algorithm"] == "RS256")
            .filter_map(|k| k["providerPriority"].as_i64())
            .max()
            .unwrap_or(100);
        let n = self
            .rotations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.idp
            .admin(
                Method::POST,
                &format!("/{}/components", self.name),
                Some(&json!({
                    "name": format!("rotated-rsa-{n}"),
                    "providerId": "rsa-generated",
                    "providerType": "org.keycloak.keys.KeyProvider",
                    "parentId": self.name,
                    "config": {
                        "priority": [(highest + 10).to_string()],
                        "enabled": ["true"],
                        "active": ["true"],
                        "keySize": ["2048"],
                        "algorithm": ["RS256"],
                    },
                })),
            )
            .await;
        self.signing_kid().await
    }

    /// Disable the key `kid` (its provider): it leaves the JWKS, and the
    /// tokens it signed no longer verify.
    pub async fn retire_signing_key(&self, kid: &str) {
        let (keys, _) = self
            .idp
            .admin(Method::GET, &format!("/{}/keys", self.name), None)
            .await;
        let provider = keys["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|k| k["kid"] == kid)
            .and_then(|k| k["providerId"].as_str())
            .unwrap_or_else(|| panic!("realm {} has no key {kid}", self.name))
            .to_string();
        let path = format!("/{}/components/{provider}", self.name);
        let (mut component, _) = self.idp.admin(Method::GET, &path, None).await;
        component["config"]["enabled"] = json!(["false"]);
        component["config"]["active"] = json!(["false"]);
        self.idp.admin(Method::PUT, &path, Some(&component)).await;
    }
}

/// The value of `name` in `url`'s query (the code of a redirect).
pub fn query_param(url: &str, name: &str) -> Option<String> {
    Url::parse(url)
        .ok()?
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}
