//! Credentials for the cloud providers' model endpoints, from the pod's own
//! identity: AWS SigV4 for Bedrock ([`AwsSigner`]: keys, IRSA's web
//! identity, EKS Pod Identity) and Entra ID access tokens for Azure OpenAI
//! ([`EntraToken`]: AKS workload identity).
//!
//! What every source takes care of:
//! - no credential (a secret key, a session token, a projected service
//!   account token, a client assertion, an access token) is ever in an
//!   error, a `Debug` or a log line: each is held as a
//!   [`SecretString`](bindery_params::SecretString) or AWS's own
//!   (zeroized, redacted) `Credentials`, and a reply body quoted in an
//!   error is first scrubbed of every value sent ([`scrubbed`]); a reply
//!   that succeeded but does not read is never quoted (it may hold the new
//!   credentials);
//! - temporary credentials are kept until five minutes before they expire
//!   and refreshed by one caller at a time ([`Cache`]): the others wait for
//!   it, or go on with the ones in hand while those are still good; the
//!   token file is read anew at each refresh (the kubelet rotates it);
//! - the identity endpoints are https, or http to a loopback address (and,
//!   for AWS's container credentials, to the EKS Pod Identity agent's and
//!   ECS's link-local addresses, http by design, as AWS's SDKs allow);
//!   each request is bounded in time ([`REQUEST_TIMEOUT`]) and its reply in
//!   size ([`MAX_REPLY_BYTES`]); the client passed in is to follow no
//!   redirect elsewhere ([`crate::egress::client`]), and a redirect that
//!   reaches here is refused.

mod aws;
mod entra;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bindery_params::SecretString;
use reqwest::Url;
use tokio::io::AsyncReadExt;

use super::error::{excerpt, LlmError};

// Nothing uses them yet (the client's wiring will): the lead removes this.
pub use aws::AwsKeys;
pub(crate) use aws::AwsSigner;
pub(crate) use entra::EntraToken;

/// Where a process's environment comes from: the real one, or a test's map.
pub(crate) trait Env: Send + Sync {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process's own environment (`std::env`).
pub(crate) struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// `name`'s value, trimmed; unset when empty (a manifest's `value: ""`).
fn var(env: &dyn Env, name: &str) -> Option<String> {
    env.var(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// What time it is: the system's clock, or a test's.
pub(crate) type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

fn system_clock() -> Clock {
    Arc::new(SystemTime::now)
}

/// The longest one request to an identity endpoint may take, reply read.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest reply of an identity endpoint read (STS's is about 2 KB).
pub(crate) const MAX_REPLY_BYTES: usize = 64 * 1024;
/// The largest token file read (a projected service account token is a
/// JWT of 1 to 2 KB; STS takes 20,000 characters at most).
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;
/// Temporary credentials are refreshed this long before they expire.
pub(crate) const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// Credentials closer to their expiry than this are not used.
const STILL_GOOD_FOR: Duration = Duration::from_secs(30);

/// A credentials failure from `from`.
fn failed(from: &str, message: String, transient: bool) -> LlmError {
    LlmError::Credentials {
        from: from.to_owned(),
        message,
        transient,
    }
}

/// An excerpt of `body`, every one of `secrets` (and each long enough
/// segment of one that is a JWT: a server may echo its claims) replaced by
/// `<secret>` before it is cut.
pub(crate) fn scrubbed(body: &str, secrets: &[&str]) -> String {
    let mut out = body.to_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret, "<secret>");
        for segment in secret.split('.').filter(|s| s.len() >= 16) {
            out = out.replace(segment, "<secret>");
        }
    }
    excerpt(&out)
}

/// Which http hosts an identity URL may name besides loopback ones.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HttpHosts {
    LoopbackOnly,
    /// The EKS Pod Identity agent (`169.254.170.23`, `fd00:ec2::23`) and
    /// ECS's container endpoint (`169.254.170.2`), as botocore's
    /// `ContainerMetadataFetcher` allows them.
    ContainerAgents,
}

/// `text` as an identity endpoint's URL: https, or http to a host
/// `hosts` allows. `name` is where it came from, for the error.
fn identity_url(text: &str, name: &str, hosts: HttpHosts) -> Result<Url, LlmError> {
    let url = Url::parse(text).map_err(|e| {
        LlmError::Config(format!(
            "{name} ({}) is not a URL: {e}",
            super::egress::shown_text(text)
        ))
    })?;
    let host = url.host_str().unwrap_or_default();
    let allowed = match url.scheme() {
        "https" => !host.is_empty(),
        "http" if host.eq_ignore_ascii_case("localhost") => true,
        "http" => {
            let ip = host.trim_start_matches('[').trim_end_matches(']');
            ip.parse::<IpAddr>().is_ok_and(|ip| {
                ip.is_loopback()
                    || (hosts == HttpHosts::ContainerAgents
                        && [
                            IpAddr::from([169, 254, 170, 23]),
                            IpAddr::from([169, 254, 170, 2]),
                            IpAddr::from([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23]),
                        ]
                        .contains(&ip))
            })
        }
        _ => false,
    };
    if !allowed {
        let also = match hosts {
            HttpHosts::LoopbackOnly => "",
            HttpHosts::ContainerAgents => {
                ", or the EKS Pod Identity agent (169.254.170.23, [fd00:ec2::23])"
            }
        };
        return Err(LlmError::Config(format!(
            "{name} ({}) is not https: a credential goes over http only to a loopback address{also}",
            super::egress::shown(&url)
        )));
    }
    Ok(url)
}

/// The token in the file at `path`, read now (it is rotated under us),
/// whitespace around it left out. The error says what failed, never what
/// the file holds.
async fn read_token_file(path: &Path) -> Result<SecretString, String> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| format!("the token file {} cannot be read: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| format!("the token file {} cannot be read: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(format!(
            "the token file {} is larger than {MAX_TOKEN_FILE_BYTES} bytes: it is not a service account token",
            path.display()
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        format!(
            "the token file {} is not UTF-8 text: it is not a service account token",
            path.display()
        )
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("the token file {} is empty", path.display()));
    }
    Ok(SecretString::new(token))
}

/// An identity endpoint's answer: its status and its body, read whole.
struct Answer {
    status: u16,
    body: String,
}

/// Why an exchange failed: what to say, and whether trying later may do.
struct Broke {
    message: String,
    transient: bool,
}

/// Sends `request` to `url` and reads the answer, within
/// [`REQUEST_TIMEOUT`] and [`MAX_REPLY_BYTES`].
async fn exchange(request: reqwest::RequestBuilder, url: &Url) -> Result<Answer, Broke> {
    let shown = super::egress::shown(url);
    let late = || Broke {
        message: format!(
            "{shown} did not answer within {}s",
            REQUEST_TIMEOUT.as_secs()
        ),
        transient: true,
    };
    let work = async {
        let mut response = request
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| sending_failed(&e, &shown))?;
        let status = response.status();
        if status.is_redirection() {
            return Err(Broke {
                message: format!(
                    "{shown} answered {status}, a redirect; it was not followed (point the URL where it redirects)"
                ),
                transient: false,
            });
        }
        let too_large = || {
            Broke {
            message: format!(
                "{shown} answered HTTP {} with more than {MAX_REPLY_BYTES} bytes; none of it was read as credentials",
                status.as_u16()
            ),
            transient: false,
        }
        };
        if response
            .content_length()
            .is_some_and(|n| n > MAX_REPLY_BYTES as u64)
        {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| sending_failed(&e, &shown))?
        {
            if body.len() + chunk.len() > MAX_REPLY_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        let body = String::from_utf8(body).map_err(|_| Broke {
            message: format!(
                "{shown} answered HTTP {} with a body that is not UTF-8",
                status.as_u16()
            ),
            transient: false,
        })?;
        Ok(Answer {
            status: status.as_u16(),
            body,
        })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, work)
        .await
        .map_err(|_| late())?
}

/// A request that failed before an answer was read: the URL shown without
/// its query, the causes without a URL.
fn sending_failed(e: &reqwest::Error, shown: &str) -> Broke {
    if let Some(refused) = super::egress::refused(e) {
        return Broke {
            message: format!("{shown}: {refused}"),
            transient: false,
        };
    }
    if e.is_timeout() {
        return Broke {
            message: format!(
                "{shown} did not answer within {}s",
                REQUEST_TIMEOUT.as_secs()
            ),
            transient: true,
        };
    }
    let mut causes = Vec::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        causes.push(c.to_string());
        cause = c.source();
    }
    let what = if e.is_connect() {
        "could not connect to"
    } else {
        "the request failed at"
    };
    let causes = if causes.is_empty() {
        String::new()
    } else {
        format!(": {}", causes.join(": "))
    };
    Broke {
        message: format!("{what} {shown}{causes}"),
        transient: true,
    }
}

/// Whether a status says the endpoint is busy or failing, not the
/// request wrong.
fn busy(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

/// A credential kept until shortly before it expires, refreshed by one
/// caller at a time.
pub(crate) struct Cache<T> {
    slot: Mutex<Option<Cached<T>>>,
    /// Held by the caller refreshing.
    refreshing: tokio::sync::Mutex<()>,
}

struct Cached<T> {
    value: T,
    refresh_at: SystemTime,
    expires: SystemTime,
}

impl<T> Default for Cache<T> {
    fn default() -> Self {
        Cache {
            slot: Mutex::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }
}

/// When credentials that expire at `expires`, had at `now`, are fetched
/// anew: [`REFRESH_BEFORE`] before, or half-way through a lifetime too
/// short for that.
fn refresh_time(now: SystemTime, expires: SystemTime) -> SystemTime {
    match expires.duration_since(now) {
        Ok(left) if left > REFRESH_BEFORE * 2 => expires - REFRESH_BEFORE,
        Ok(left) => now + left / 2,
        Err(_) => now,
    }
}

impl<T: Clone> Cache<T> {
    /// The value kept, if `keep` says it may still be used at `now`.
    fn peek(&self, keep: impl Fn(&Cached<T>) -> bool) -> Option<T> {
        let slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        slot.as_ref().filter(|c| keep(c)).map(|c| c.value.clone())
    }

    /// The value, fetched with `fetch` (which says when it expires) when
    /// none is kept or it is due for refresh. One caller fetches at a time;
    /// the others wait for it, or take the value in hand while it is still
    /// good. A failed refresh with a value still good keeps that value.
    pub(crate) async fn get<F, Fut>(&self, clock: &Clock, fetch: F) -> Result<T, LlmError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, SystemTime), LlmError>>,
    {
        let now = clock();
        if let Some(v) = self.peek(|c| now < c.refresh_at) {
            return Ok(v);
        }
        let still_good = |c: &Cached<T>| now + STILL_GOOD_FOR < c.expires;
        let _gate = match self.refreshing.try_lock() {
            Ok(gate) => gate,
            Err(_) => {
                if let Some(v) = self.peek(still_good) {
                    return Ok(v);
                }
                self.refreshing.lock().await
            }
        };
        // Refreshed by the caller this one waited for?
        let now = clock();
        if let Some(v) = self.peek(|c| now < c.refresh_at) {
            return Ok(v);
        }
        match fetch().await {
            Ok((value, expires)) => {
                let now = clock();
                let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
                *slot = Some(Cached {
                    value: value.clone(),
                    refresh_at: refresh_time(now, expires),
                    expires,
                });
                Ok(value)
            }
            Err(e) => {
                let now = clock();
                match self.peek(|c| now + STILL_GOOD_FOR < c.expires) {
                    Some(v) => {
                        tracing::warn!(error = %e, "refreshing the model endpoint's credentials failed; the ones in hand are still good and kept");
                        Ok(v)
                    }
                    None => Err(e),
                }
            }
        }
    }
}

/// `expires` as given by `from`, refused when it is already past at `now`
/// (a clock wrong by hours, or credentials cached by a proxy).
fn not_expired(from: &str, expires: SystemTime, now: SystemTime) -> Result<SystemTime, LlmError> {
    if expires <= now + STILL_GOOD_FOR {
        return Err(failed(
            from,
            format!(
                "the credentials given expire at {}, which is already past by this machine's clock: is the clock right?",
                aws_smithy_types::DateTime::from(expires)
                    .fmt(aws_smithy_types::date_time::Format::DateTime)
                    .unwrap_or_else(|_| "a time that does not print".to_owned())
            ),
            false,
        ));
    }
    Ok(expires)
}
