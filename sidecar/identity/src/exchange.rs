//! An end user's identity token exchanged for one issued to a downstream
//! audience (OAuth 2.0 Token Exchange, RFC 8693): the tool then acts with
//! that person's rights, never with a shared credential.
//!
//! The exchanged token is a secret value: kept in memory only, per
//! subject, audience and scopes, until shortly before it expires; a token
//! of one subject never answers another's call.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::Url;
use tokio::time::Instant;

use bindery_params::secret::SecretString;
use bindery_spec::TokenExchange;

use crate::config::{fetched_from, ConfigError, IdentityConfig};
use crate::jwks::{discover, read_capped, unreachable, FetchError};
use crate::subject::Subject;

/// RFC 8693's grant type.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// The type of the subject token and of the one asked for.
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// An exchanged token is used until this long before it expires.
const EARLY: Duration = Duration::from_secs(30);
/// The most exchanged tokens kept at once; past it the expired ones go,
/// then the oldest.
const MAX_KEPT: usize = 10_000;

/// The client this server exchanges tokens as.
#[derive(Debug)]
pub struct ExchangeClient {
    pub client_id: String,
    pub client_secret: SecretString,
    /// The issuer's token endpoint, when its discovery document is not to
    /// be read.
    pub token_url: Option<Url>,
}

/// Why a token could not be exchanged. Never holds a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    #[error("no token exchange is configured (--identity-exchange-client-id and its secret): an end user's token cannot be exchanged for audience `{0}`")]
    NotConfigured(String),
    #[error("the session's end user presented no token this server holds, or it has expired (a forwarded request, one from before a restart, or a run resumed long after); their next message brings a fresh one")]
    NoToken,
    #[error("the identity provider refused to exchange the end user's token for audience `{audience}`: {error}{}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        audience: String,
        error: String,
        description: Option<String>,
    },
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

struct Kept {
    token: SecretString,
    until: Instant,
}

/// Exchanges end users' tokens at the issuer's token endpoint, and keeps
/// what it got.
pub struct Exchanger {
    http: reqwest::Client,
    config: IdentityConfig,
    client: ExchangeClient,
    endpoint: tokio::sync::OnceCell<Url>,
    kept: Mutex<HashMap<(Subject, String), Kept>>,
}

impl Exchanger {
    pub fn new(config: IdentityConfig, client: ExchangeClient) -> Result<Exchanger, ConfigError> {
        config.check()?;
        if let Some(url) = &client.token_url {
            fetched_from("token URL", url)?;
        }
        let http = bindery_llm::egress::client(bindery_spec::Redirects::Never)
            .timeout(Duration::from_secs(15))
            .build()
            .map_err(|_| ConfigError::IssuerNotUrl(config.issuer.clone()))?;
        Ok(Exchanger {
            http,
            config,
            client,
            endpoint: tokio::sync::OnceCell::new(),
            kept: Mutex::new(HashMap::new()),
        })
    }

    /// A token for `want` acting as `subject`, whose identity token is
    /// `subject_token`: the one kept for that subject and audience while
    /// it lasts, else exchanged now.
    pub async fn exchange(
        &self,
        subject: &Subject,
        subject_token: &SecretString,
        want: &TokenExchange,
    ) -> Result<SecretString, ExchangeError> {
        let key = (subject.clone(), cache_key(want));
        if let Some(k) = self.kept.lock().expect("kept lock").get(&key) {
            if k.until > Instant::now() {
                return Ok(k.token.clone());
            }
        }
        let endpoint = self
            .endpoint
            .get_or_try_init(|| async {
                match &self.client.token_url {
                    Some(url) => Ok::<_, ExchangeError>(url.clone()),
                    None => {
                        let doc = discover(&self.http, &self.config).await?;
                        let url = doc
                            .token_endpoint
                            .and_then(|u| Url::parse(&u).ok())
                            .ok_or_else(|| FetchError::Unreadable {
                                what: "discovery document's token_endpoint",
                                url: doc.at.clone(),
                            })?;
                        fetched_from("token endpoint", &url)?;
                        Ok(url)
                    }
                }
            })
            .await?;
        let mut form = vec![
            ("grant_type", GRANT_TYPE.to_string()),
            ("subject_token", subject_token.expose().to_string()),
            ("subject_token_type", ACCESS_TOKEN_TYPE.to_string()),
            ("requested_token_type", ACCESS_TOKEN_TYPE.to_string()),
            ("audience", want.audience.clone()),
        ];
        if !want.scopes.is_empty() {
            form.push(("scope", want.scopes.join(" ")));
        }
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form.iter().map(|(k, v)| (*k, v.as_str())))
            .finish();
        let shown = bindery_llm::egress::shown(endpoint);
        let what = "token endpoint";
        let resp = self
            .http
            .post(endpoint.clone())
            .basic_auth(
                &self.client.client_id,
                Some(self.client.client_secret.expose()),
            )
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| unreachable(what, &shown, &e))?;
        let status = resp.status();
        let bytes = read_capped(resp, what, &shown).await?;
        let answer: Answer =
            serde_json::from_slice(&bytes).map_err(|_| FetchError::Unreadable {
                what,
                url: shown.clone(),
            })?;
        let (token, expires_in) = match (status.is_success(), answer) {
            (
                true,
                Answer {
                    access_token: Some(t),
                    expires_in,
                    ..
                },
            ) => (SecretString::new(t), expires_in),
            (_, a) => {
                // The error code only, and only when it is one: a provider
                // may echo what it was sent (the person's token, the
                // client's secret) into its description, and this is logged.
                return Err(ExchangeError::Refused {
                    audience: want.audience.clone(),
                    error: a.error.as_deref().map_or_else(
                        || format!("HTTP {}", status.as_u16()),
                        bindery_spec::oauth_error_code,
                    ),
                    description: None,
                });
            }
        };
        let lifetime = Duration::from_secs(expires_in.unwrap_or(60)).saturating_sub(EARLY);
        self.keep(key, &token, lifetime);
        tracing::info!(
            subject = subject.as_str(),
            audience = want.audience.as_str(),
            "an end user's token was exchanged"
        );
        Ok(token)
    }

    fn keep(&self, key: (Subject, String), token: &SecretString, lifetime: Duration) {
        if lifetime.is_zero() {
            return;
        }
        let mut kept = self.kept.lock().expect("kept lock");
        if kept.len() >= MAX_KEPT {
            let now = Instant::now();
            kept.retain(|_, k| k.until > now);
            if kept.len() >= MAX_KEPT {
                if let Some(oldest) = kept
                    .iter()
                    .min_by_key(|(_, k)| k.until)
                    .map(|(k, _)| k.clone())
                {
                    kept.remove(&oldest);
                }
            }
        }
        kept.insert(
            key,
            Kept {
                token: token.clone(),
                until: Instant::now() + lifetime,
            },
        );
    }

    /// Forget every token kept for `subject` (their session ended, or
    /// they were forgotten).
    pub fn forget(&self, subject: &Subject) {
        self.kept
            .lock()
            .expect("kept lock")
            .retain(|(s, _), _| s != subject);
    }
}

#[derive(serde::Deserialize)]
struct Answer {
    access_token: Option<String>,
    expires_in: Option<u64>,
    error: Option<String>,
}

fn cache_key(want: &TokenExchange) -> String {
    bindery_spec::IdentityValue::Token(want.clone()).key()
}

#[cfg(test)]
mod tests;
