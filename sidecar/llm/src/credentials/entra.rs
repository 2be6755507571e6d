//! An Entra ID access token for Azure OpenAI, from the pod's workload
//! identity (AKS's webhook sets `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
//! `AZURE_FEDERATED_TOKEN_FILE` and `AZURE_AUTHORITY_HOST`).
//!
//! The projected service account token is exchanged with the client
//! credentials grant, the token as a `jwt-bearer` client assertion, at
//! `{authority}{tenant}/oauth2/v2.0/token`, for the scope
//! `https://cognitiveservices.azure.com/.default`: what azure-identity's
//! `WorkloadIdentityCredential` does.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bindery_params::SecretString;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::Url;
use serde_json::Value;

use super::{busy, exchange, failed, identity_url, not_expired, read_token_file, scrubbed};
use super::{system_clock, var, Cache, Clock, Env, HttpHosts};
use crate::error::LlmError;

/// Entra ID's public cloud, when `AZURE_AUTHORITY_HOST` is not set.
const DEFAULT_AUTHORITY: &str = "https://login.microsoftonline.com/";
/// The scope of a token Azure OpenAI takes.
pub(crate) const SCOPE: &str = "https://cognitiveservices.azure.com/.default";
/// RFC 7523's client assertion type.
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The longest lifetime believed (Entra's tokens live 1 to 24 hours).
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// An Entra ID access token for Azure OpenAI from the pod's workload
/// identity: `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
/// `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_AUTHORITY_HOST` (default
/// `https://login.microsoftonline.com/`), exchanged at
/// `{authority}{tenant}/oauth2/v2.0/token`; cached until 5 minutes before
/// it expires, one refresh at a time, the file re-read each time.
pub(crate) struct EntraToken {
    client_id: String,
    tenant_id: String,
    token_file: PathBuf,
    url: Url,
    cache: Cache<SecretString>,
    clock: Clock,
}

impl fmt::Debug for EntraToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntraToken")
            .field("client_id", &self.client_id)
            .field("tenant_id", &self.tenant_id)
            .field("token_file", &self.token_file)
            .field("url", &crate::egress::shown(&self.url))
            .finish()
    }
}

impl EntraToken {
    /// The workload identity the environment sets up. No I/O. A Config
    /// error names the variables missing.
    pub fn from_env(env: Arc<dyn Env>) -> Result<Self, LlmError> {
        let get = |name: &str| var(&*env, name);
        let (client_id, tenant_id, token_file) = (
            get("AZURE_CLIENT_ID"),
            get("AZURE_TENANT_ID"),
            get("AZURE_FEDERATED_TOKEN_FILE"),
        );
        let (Some(client_id), Some(tenant_id), Some(token_file)) =
            (client_id.clone(), tenant_id.clone(), token_file.clone())
        else {
            let missing: Vec<&str> = [
                ("AZURE_CLIENT_ID", client_id.is_none()),
                ("AZURE_TENANT_ID", tenant_id.is_none()),
                ("AZURE_FEDERATED_TOKEN_FILE", token_file.is_none()),
            ]
            .iter()
            .filter(|(_, absent)| *absent)
            .map(|(name, _)| *name)
            .collect();
            return Err(LlmError::Config(format!(
                "no Azure workload identity: {} not set; label the pod azure.workload.identity/use: \"true\" and annotate its ServiceAccount with azure.workload.identity/client-id (AKS's webhook then sets them)",
                missing.join(", ")
            )));
        };
        // It goes in the token URL's path: a GUID or a domain name.
        if !tenant_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Err(LlmError::Config(format!(
                "AZURE_TENANT_ID {tenant_id:?} is not a tenant id (a GUID or a domain name)"
            )));
        }
        let authority = get("AZURE_AUTHORITY_HOST").unwrap_or_else(|| DEFAULT_AUTHORITY.to_owned());
        let mut authority =
            identity_url(&authority, "AZURE_AUTHORITY_HOST", HttpHosts::LoopbackOnly)?;
        if !authority.path().ends_with('/') {
            let path = format!("{}/", authority.path());
            authority.set_path(&path);
        }
        let url = authority
            .join(&format!("{tenant_id}/oauth2/v2.0/token"))
            .map_err(|e| {
                LlmError::Config(format!(
                    "AZURE_AUTHORITY_HOST does not take the token path: {e}"
                ))
            })?;
        Ok(EntraToken {
            client_id,
            tenant_id,
            token_file: PathBuf::from(token_file),
            url,
            cache: Cache::default(),
            clock: system_clock(),
        })
    }

    #[cfg(test)]
    pub(crate) fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Where the token comes from, for `check` and errors.
    pub fn source(&self) -> String {
        format!(
            "Azure workload identity (client {} in tenant {})",
            self.client_id, self.tenant_id
        )
    }

    /// The access token, to go as `Authorization: Bearer {token}`.
    pub async fn bearer(&self, http: &reqwest::Client) -> Result<SecretString, LlmError> {
        self.cache.get(&self.clock, || self.exchange(http)).await
    }

    /// The federated token exchanged for an access token.
    async fn exchange(
        &self,
        http: &reqwest::Client,
    ) -> Result<(SecretString, SystemTime), LlmError> {
        let from = self.source();
        let assertion = read_token_file(&self.token_file).await.map_err(|e| {
            failed(
                &from,
                format!("{e}; is the pod labelled azure.workload.identity/use: \"true\" (the webhook mounts the token)?"),
                false,
            )
        })?;
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("client_id", &self.client_id)
            .append_pair("scope", SCOPE)
            .append_pair("grant_type", "client_credentials")
            .append_pair("client_assertion_type", JWT_BEARER)
            .append_pair("client_assertion", assertion.expose())
            .finish();
        let request = http
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ACCEPT, "application/json")
            .body(form);
        let answer = exchange(request, &self.url)
            .await
            .map_err(|b| failed(&from, format!("Entra ID: {}", b.message), b.transient))?;
        if answer.status != 200 {
            return Err(refused(
                &from,
                answer.status,
                &answer.body,
                assertion.expose(),
            ));
        }
        let (token, lifetime) = token_of(&answer.body).map_err(|what| {
            failed(
                &from,
                format!("Entra ID answered HTTP 200, but not with an access token: {what} (is AZURE_AUTHORITY_HOST Entra ID's?)"),
                false,
            )
        })?;
        let now = (self.clock)();
        let expires = now.checked_add(lifetime).unwrap_or(now);
        let expires = not_expired(&from, expires, now)?;
        Ok((token, expires))
    }
}

/// The token endpoint's reply read: `access_token` and `expires_in`
/// (seconds, a number or a numeral), `token_type` Bearer when given. The
/// error names what is wrong, never a value.
fn token_of(text: &str) -> Result<(SecretString, Duration), String> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "it is not JSON (at line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    let token = value
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty())
        .ok_or("it has no access_token string")?;
    if let Some(kind) = value.get("token_type") {
        if !kind
            .as_str()
            .is_some_and(|k| k.eq_ignore_ascii_case("bearer"))
        {
            return Err(format!(
                "its token_type is {}, not Bearer",
                crate::error::excerpt(&kind.to_string())
            ));
        }
    }
    let seconds = match value.get("expires_in") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
        _ => None,
    }
    .ok_or("it has no expires_in of whole seconds")?;
    let lifetime = Duration::from_secs(seconds).min(MAX_LIFETIME);
    Ok((SecretString::new(token.trim()), lifetime))
}

/// Entra ID's refusal: its `error` and `error_description` (the assertion
/// scrubbed), and what the AADSTS code says to check.
fn refused(from: &str, status: u16, body: &str, assertion: &str) -> LlmError {
    let value: Option<Value> = serde_json::from_str(body).ok();
    let field = |k: &str| {
        value
            .as_ref()
            .and_then(|v| v.get(k))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let (error, description) = (field("error"), field("error_description"));
    let said = match (&error, &description) {
        (Some(e), Some(d)) => format!(
            "{}: {}",
            scrubbed(e, &[assertion]),
            scrubbed(d, &[assertion])
        ),
        _ => scrubbed(body, &[assertion]),
    };
    let text = description.as_deref().unwrap_or(body);
    let code = |c: &str| text.contains(c);
    let hint = if code("AADSTS70021") {
        "the identity has no federated credential matching this token: add one with the cluster's OIDC issuer URL and the subject system:serviceaccount:<namespace>:<serviceaccount>, audience api://AzureADTokenExchange"
    } else if code("AADSTS700016") {
        "no application of that client id in the tenant: check the ServiceAccount's azure.workload.identity/client-id annotation and AZURE_TENANT_ID"
    } else if code("AADSTS90002") {
        "no such tenant: check AZURE_TENANT_ID (azure.workload.identity/tenant-id)"
    } else if code("AADSTS700024") || code("AADSTS700027") {
        "the federated token is not valid now (expired, or this machine's clock is off): the kubelet rotates the file; is it still mounted?"
    } else if busy(status) {
        "Entra ID failed; it is tried again at the next request"
    } else {
        "check the identity's federated credential (issuer, subject, audience api://AzureADTokenExchange) and that it may use the Azure OpenAI resource"
    };
    failed(
        from,
        format!("Entra ID refused the token: HTTP {status} {said}; {hint}"),
        busy(status),
    )
}

#[cfg(test)]
mod tests;
