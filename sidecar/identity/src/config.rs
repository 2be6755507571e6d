//! Which identity tokens a server takes: the issuer, the audience, where
//! the keys are, how much clocks may disagree.

use std::time::Duration;

use reqwest::Url;

/// The claim a subject is read from when none is configured.
pub const DEFAULT_SUBJECT_CLAIM: &str = "sub";
/// How far the issuer's clock and ours may disagree by default.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// The most skew taken: a token is a bearer credential, and skew extends
/// its life past the `exp` its issuer gave it.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);

/// The identity provider a server trusts for end users.
#[derive(Clone, Debug, PartialEq)]
pub struct IdentityConfig {
    /// The `iss` every token must carry, exactly; the keys are found from
    /// its `/.well-known/openid-configuration` unless `jwks_url` is set.
    pub issuer: String,
    /// A token's `aud` must hold one of these.
    pub audiences: Vec<String>,
    /// Where the issuer's keys are, when its discovery document is not
    /// to be read.
    pub jwks_url: Option<Url>,
    /// The claim that names the person (`sub` unless set).
    pub subject_claim: String,
    pub clock_skew: Duration,
    /// A token naming a key not in the cached set refetches the keys, at
    /// most this often (a stream of forged `kid`s must not become a stream
    /// of requests to the issuer); it waits for that fetch.
    pub min_refetch: Duration,
    /// The cached keys are fetched again after this long, so a key the
    /// issuer withdrew stops being accepted.
    pub max_age: Duration,
}

/// Why an identity configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("the identity issuer `{0}` is not a URL: give the issuer exactly as its tokens' `iss` says (e.g. https://login.example.com/realms/acme)")]
    IssuerNotUrl(String),
    #[error("the identity {what} `{url}` is plain http on a host that is not loopback: keys fetched without TLS can be forged on the way; use https")]
    NotHttps { what: &'static str, url: String },
    #[error("the identity {what} `{url}` carries a user, password, query or fragment: give the bare URL")]
    Decorated { what: &'static str, url: String },
    #[error("no identity audience: set the audience the platform's tokens are issued for (`--identity-audience`, `spec.identity.audiences`), or any service's tokens from that issuer would be taken")]
    NoAudience,
    #[error("the identity subject claim is empty: leave it unset for `sub`")]
    EmptyClaim,
    #[error("the identity clock skew is {0}s; at most {max}s is taken", max = MAX_CLOCK_SKEW.as_secs())]
    SkewTooLarge(u64),
}

impl IdentityConfig {
    /// A configuration with the defaults for everything but the issuer
    /// and the audiences, checked.
    pub fn new(issuer: &str, audiences: Vec<String>) -> Result<IdentityConfig, ConfigError> {
        let config = IdentityConfig {
            issuer: issuer.to_string(),
            audiences,
            jwks_url: None,
            subject_claim: DEFAULT_SUBJECT_CLAIM.to_string(),
            clock_skew: DEFAULT_CLOCK_SKEW,
            min_refetch: Duration::from_secs(2),
            max_age: Duration::from_secs(3600),
        };
        config.check()?;
        Ok(config)
    }

    /// Whether the configuration can be used.
    pub fn check(&self) -> Result<(), ConfigError> {
        let issuer =
            Url::parse(&self.issuer).map_err(|_| ConfigError::IssuerNotUrl(self.issuer.clone()))?;
        fetched_from("issuer", &issuer)?;
        if let Some(url) = &self.jwks_url {
            fetched_from("JWKS URL", url)?;
        }
        if self.audiences.iter().all(|a| a.trim().is_empty()) {
            return Err(ConfigError::NoAudience);
        }
        if self.subject_claim.is_empty() {
            return Err(ConfigError::EmptyClaim);
        }
        if self.clock_skew > MAX_CLOCK_SKEW {
            return Err(ConfigError::SkewTooLarge(self.clock_skew.as_secs()));
        }
        Ok(())
    }

    /// Where the issuer's discovery document is.
    pub fn discovery_url(&self) -> Result<Url, ConfigError> {
        let base = self.issuer.trim_end_matches('/');
        Url::parse(&format!("{base}/.well-known/openid-configuration"))
            .map_err(|_| ConfigError::IssuerNotUrl(self.issuer.clone()))
    }
}

/// Whether keys may be fetched from `url`: https, or http on loopback
/// (a test's, or a sidecar IdP proxy's), with nothing but a path.
pub fn fetched_from(what: &'static str, url: &Url) -> Result<(), ConfigError> {
    if !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(ConfigError::Decorated {
            what,
            url: bindery_llm::egress::shown(url),
        });
    }
    match url.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(url) => Ok(()),
        _ => Err(ConfigError::NotHttps {
            what,
            url: bindery_llm::egress::shown(url),
        }),
    }
}

fn is_loopback(url: &Url) -> bool {
    let host = url.host_str().unwrap_or("");
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issuer_is_https_or_loopback_and_an_audience_is_required() {
        assert!(
            IdentityConfig::new("https://idp.example.com/realms/a", vec!["bindery".into()]).is_ok()
        );
        assert!(IdentityConfig::new("http://127.0.0.1:8080/realms/a", vec!["b".into()]).is_ok());
        assert!(matches!(
            IdentityConfig::new("http://idp.example.com", vec!["b".into()]),
            Err(ConfigError::NotHttps { .. })
        ));
        assert!(matches!(
            IdentityConfig::new("https://u:p@idp.example.com", vec!["b".into()]),
            Err(ConfigError::Decorated { .. })
        ));
        assert_eq!(
            IdentityConfig::new("https://idp.example.com", vec![]),
            Err(ConfigError::NoAudience)
        );
        assert!(matches!(
            IdentityConfig::new("idp", vec!["b".into()]),
            Err(ConfigError::IssuerNotUrl(_))
        ));
        let c = IdentityConfig::new("https://idp.example.com/realms/a/", vec!["b".into()]).unwrap();
        assert_eq!(
            c.discovery_url().unwrap().as_str(),
            "https://idp.example.com/realms/a/.well-known/openid-configuration"
        );
    }
}
