//! The issuer's keys: found through its discovery document (or a
//! configured URL), fetched, kept, and fetched again when they are old or
//! a token names a key not among them (the issuer rotated its keys).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use reqwest::Url;
use tokio::time::Instant;

use crate::config::{fetched_from, ConfigError, IdentityConfig};
use crate::verify::KeySet;

/// The most bytes read of a discovery or JWKS document.
const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;
/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the keys could not be fetched. Names the URL as it may be shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("the identity provider's {what} at {url} could not be reached: {why}")]
    Unreachable {
        what: &'static str,
        url: String,
        why: String,
    },
    #[error("the identity provider's {what} at {url} answered {status}")]
    Status {
        what: &'static str,
        url: String,
        status: u16,
    },
    #[error("the identity provider's {what} at {url} is not the JSON document it should be (or is over 1 MiB)")]
    Unreadable { what: &'static str, url: String },
    #[error("the discovery document at {url} names the issuer `{found}`, not the configured `{expected}`: configure the issuer exactly as its tokens' `iss` says")]
    OtherIssuer {
        url: String,
        found: String,
        expected: String,
    },
    #[error("the discovery document at {url} has no usable `jwks_uri`")]
    NoJwksUri { url: String },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

struct Cached {
    keys: Arc<KeySet>,
    at: Instant,
}

/// The issuer's keys as this server last fetched them.
pub struct Jwks {
    http: reqwest::Client,
    config: IdentityConfig,
    cached: RwLock<Option<Cached>>,
    /// The JWKS URL the discovery document gave, once read.
    discovered: RwLock<Option<Url>>,
    /// One fetch at a time: the tokens that arrive meanwhile wait for it.
    fetching: tokio::sync::Mutex<()>,
}

impl Jwks {
    pub fn new(config: IdentityConfig) -> Result<Jwks, ConfigError> {
        config.check()?;
        // The egress policy of every outbound client: redirects only
        // within the origin, no Referer.
        let http = bindery_llm::egress::client(bindery_spec::Redirects::SameOrigin)
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|_| ConfigError::IssuerNotUrl(config.issuer.clone()))?;
        Ok(Jwks {
            http,
            discovered: RwLock::new(config.jwks_url.clone()),
            config,
            cached: RwLock::new(None),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    /// The keys to verify a token naming key `kid` with: the cached set
    /// when it is young enough and holds `kid`; else fetched again, one
    /// fetch at a time and at most one per `min_refetch`: a token naming a
    /// key not seen waits for the next fetch (the issuer just rotated its
    /// keys), and a stream of forged key ids costs the issuer one request
    /// per `min_refetch`, not one each. A fetch that fails leaves the cached
    /// keys in use until they are `max_age` old twice over, so a short
    /// outage of the issuer refuses nobody.
    pub async fn keys(&self, kid: Option<&str>) -> Result<Arc<KeySet>, FetchError> {
        let asked = Instant::now();
        if let Some(keys) = self.usable(kid, asked) {
            return Ok(keys);
        }
        let _one = self.fetching.lock().await;
        // Fetched by another request while this one waited.
        if let Some(keys) = self.fetched_since(asked) {
            return Ok(keys);
        }
        let last = self
            .cached
            .read()
            .expect("keys lock")
            .as_ref()
            .map(|c| c.at);
        if let Some(at) = last {
            tokio::time::sleep_until(at + self.config.min_refetch).await;
        }
        match self.fetch().await {
            Ok(set) => {
                let keys = Arc::new(set);
                tracing::info!(keys = keys.len(), "identity provider keys fetched");
                *self.cached.write().expect("keys lock") = Some(Cached {
                    keys: keys.clone(),
                    at: Instant::now(),
                });
                Ok(keys)
            }
            Err(e) => {
                let grace = self.config.max_age * 2;
                let cached = self.cached.read().expect("keys lock");
                match cached.as_ref() {
                    Some(c) if c.at.elapsed() < grace => {
                        tracing::warn!("{e}; the keys fetched before stay in use");
                        Ok(c.keys.clone())
                    }
                    _ => Err(e),
                }
            }
        }
    }

    fn usable(&self, kid: Option<&str>, now: Instant) -> Option<Arc<KeySet>> {
        let cached = self.cached.read().expect("keys lock");
        let c = cached.as_ref()?;
        let age = now.saturating_duration_since(c.at);
        if age >= self.config.max_age {
            return None;
        }
        kid.is_none_or(|kid| c.keys.has(kid))
            .then(|| c.keys.clone())
    }

    fn fetched_since(&self, asked: Instant) -> Option<Arc<KeySet>> {
        let cached = self.cached.read().expect("keys lock");
        cached
            .as_ref()
            .filter(|c| c.at >= asked)
            .map(|c| c.keys.clone())
    }

    async fn fetch(&self) -> Result<KeySet, FetchError> {
        let url = self.jwks_url().await?;
        let body = self.get("JWKS", &url).await?;
        KeySet::parse(&body).map_err(|_| FetchError::Unreadable {
            what: "JWKS",
            url: bindery_llm::egress::shown(&url),
        })
    }

    async fn jwks_url(&self) -> Result<Url, FetchError> {
        if let Some(url) = self.discovered.read().expect("discovery lock").clone() {
            return Ok(url);
        }
        let doc = discover(&self.http, &self.config).await?;
        let url = doc
            .jwks_uri
            .and_then(|u| Url::parse(&u).ok())
            .ok_or(FetchError::NoJwksUri {
                url: doc.at.clone(),
            })?;
        fetched_from("JWKS URL", &url)?;
        *self.discovered.write().expect("discovery lock") = Some(url.clone());
        Ok(url)
    }

    async fn get(&self, what: &'static str, url: &Url) -> Result<Vec<u8>, FetchError> {
        get(&self.http, what, url).await
    }
}

/// What the issuer's discovery document says that Bindery uses.
#[derive(serde::Deserialize)]
pub(crate) struct Discovery {
    pub issuer: String,
    pub jwks_uri: Option<String>,
    pub token_endpoint: Option<String>,
    /// Where it was read from, as it may be shown.
    #[serde(skip)]
    pub at: String,
}

/// The issuer's discovery document, checked to be that issuer's.
pub(crate) async fn discover(
    http: &reqwest::Client,
    config: &IdentityConfig,
) -> Result<Discovery, FetchError> {
    let at = config.discovery_url()?;
    let shown = bindery_llm::egress::shown(&at);
    let body = get(http, "discovery document", &at).await?;
    let mut doc: Discovery = serde_json::from_slice(&body).map_err(|_| FetchError::Unreadable {
        what: "discovery document",
        url: shown.clone(),
    })?;
    // OpenID Connect Discovery 1.0, 4.3: the document's issuer is the one
    // asked for, or its keys and endpoints are not that issuer's.
    if doc.issuer != config.issuer {
        return Err(FetchError::OtherIssuer {
            url: shown,
            found: doc.issuer,
            expected: config.issuer.clone(),
        });
    }
    doc.at = shown;
    Ok(doc)
}

/// The body of `url` (at most 1 MiB), or why not.
pub(crate) async fn get(
    http: &reqwest::Client,
    what: &'static str,
    url: &Url,
) -> Result<Vec<u8>, FetchError> {
    let shown = bindery_llm::egress::shown(url);
    let resp = http
        .get(url.clone())
        .send()
        .await
        .map_err(|e| unreachable(what, &shown, &e))?;
    if !resp.status().is_success() {
        return Err(FetchError::Status {
            what,
            url: shown,
            status: resp.status().as_u16(),
        });
    }
    read_capped(resp, what, &shown).await
}

pub(crate) fn unreachable(what: &'static str, shown: &str, e: &reqwest::Error) -> FetchError {
    FetchError::Unreachable {
        what,
        url: shown.to_string(),
        why: bindery_llm::egress::refused(e)
            .map_or_else(|| "no answer".to_string(), |r| r.to_string()),
    }
}

/// A response's body, at most 1 MiB of it.
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    what: &'static str,
    shown: &str,
) -> Result<Vec<u8>, FetchError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| unreachable(what, shown, &e))?
    {
        if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(FetchError::Unreadable {
                what,
                url: shown.to_string(),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests;
