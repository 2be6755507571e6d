//! AWS SigV4 for Bedrock, with the agent's keys or the pod's identity.
//!
//! The credentials come from the first of these that is set up (the order
//! of AWS's SDKs' default chain, less the profiles and IMDS a pod has no
//! use for):
//! 1. the keys the agent gives (its Kubernetes Secret);
//! 2. `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and
//!    `AWS_SESSION_TOKEN`);
//! 3. IRSA's web identity: `AWS_ROLE_ARN` and `AWS_WEB_IDENTITY_TOKEN_FILE`
//!    (and `AWS_ROLE_SESSION_NAME`), the token exchanged with STS's
//!    `AssumeRoleWithWebIdentity` at `AWS_ENDPOINT_URL_STS`, else
//!    `AWS_ENDPOINT_URL`, else `https://sts.{region}.amazonaws.com`;
//! 4. EKS Pod Identity (or ECS): `AWS_CONTAINER_CREDENTIALS_FULL_URI` with
//!    `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` or
//!    `AWS_CONTAINER_AUTHORIZATION_TOKEN` (or ECS's
//!    `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`).
//!
//! The signature is AWS's own signer's (`aws-sigv4`): the payload signed,
//! every header the request carries signed but those botocore leaves out
//! (`user-agent`, hop-by-hop ones), and `host`, `x-amz-date` and
//! `x-amz-security-token`: what botocore's `SigV4Auth` signs, byte for
//! byte (the tests hold a vector it computed).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use bindery_params::SecretString;
use reqwest::header::{HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Url;

use super::{busy, system_clock, Cache, Clock, Env, HttpHosts};
use super::{exchange, failed, identity_url, not_expired, read_token_file, scrubbed, var};
use crate::error::LlmError;

/// AWS credentials the agent gives (its Kubernetes Secret).
#[derive(Clone, Debug)]
pub struct AwsKeys {
    pub access_key_id: String,
    pub secret_access_key: SecretString,
    pub session_token: Option<SecretString>,
}

/// AWS credentials for SigV4: static keys given by the agent (its
/// Kubernetes Secret), or the pod's identity found in the environment, in
/// this order: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`
/// [/`AWS_SESSION_TOKEN`]; web identity (IRSA: `AWS_ROLE_ARN` +
/// `AWS_WEB_IDENTITY_TOKEN_FILE` [+ `AWS_ROLE_SESSION_NAME`], STS
/// `AssumeRoleWithWebIdentity`); EKS Pod Identity / container credentials
/// (`AWS_CONTAINER_CREDENTIALS_FULL_URI` +
/// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` or
/// `AWS_CONTAINER_AUTHORIZATION_TOKEN`). Temporary credentials are cached
/// until 5 minutes before they expire, refreshed by one request at a time,
/// the token file re-read at each refresh.
pub(crate) struct AwsSigner {
    region: String,
    service: &'static str,
    source: Source,
    cache: Cache<Credentials>,
    clock: Clock,
}

enum Source {
    /// Long-term (or already temporary) keys, used as they are.
    Keys {
        credentials: Credentials,
        from: &'static str,
    },
    WebIdentity(WebIdentity),
    Container(Container),
}

struct WebIdentity {
    role_arn: String,
    token_file: PathBuf,
    /// `AWS_ROLE_SESSION_NAME`; else `bindery-<unix seconds>`, as botocore
    /// names a session `botocore-session-<unix seconds>`.
    session_name: Option<String>,
    sts: Url,
}

struct Container {
    url: Url,
    token: Option<ContainerToken>,
}

enum ContainerToken {
    /// Read at each refresh (EKS Pod Identity's is rotated).
    File(PathBuf),
    Value(SecretString),
}

impl fmt::Debug for AwsSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsSigner")
            .field("source", &self.source())
            .field("region", &self.region)
            .field("service", &self.service)
            .finish()
    }
}

/// STS's API version (botocore's `data/sts/2011-06-15`).
const STS_VERSION: &str = "2011-06-15";

/// Headers botocore's `SigV4Auth` does not sign
/// (`SIGNED_HEADERS_BLACKLIST`), and `authorization`, which the signature
/// replaces.
const UNSIGNED: &[&str] = &[
    "authorization",
    "baggage",
    "connection",
    "expect",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "traceparent",
    "tracestate",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "x-amzn-trace-id",
];

impl AwsSigner {
    /// A signer for `service` in `region`, with `keys` or else the first
    /// source the environment sets up. No I/O: the pod's identity is
    /// exchanged at the first [`sign`](Self::sign). A Config error says
    /// what is missing or wrong.
    pub fn new(
        keys: Option<AwsKeys>,
        region: String,
        service: &'static str,
        env: Arc<dyn Env>,
    ) -> Result<Self, LlmError> {
        let region = region.trim().to_owned();
        if region.is_empty()
            || !region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(LlmError::Config(format!(
                "the AWS region {region:?} is not a region name (such as us-east-1)"
            )));
        }
        let source = source(keys, &region, &*env)?;
        Ok(AwsSigner {
            region,
            service,
            source,
            cache: Cache::default(),
            clock: system_clock(),
        })
    }

    #[cfg(test)]
    pub(crate) fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Where the credentials come from, for `check` and errors: "static
    /// keys", "environment keys (AWS_ACCESS_KEY_ID)", "web identity (role
    /// ARN)", "EKS Pod Identity (URL)", "container credentials (URL)".
    pub fn source(&self) -> String {
        match &self.source {
            Source::Keys { from, .. } => (*from).to_owned(),
            Source::WebIdentity(w) => format!("web identity ({})", w.role_arn),
            Source::Container(c) => {
                let host = c.url.host_str().unwrap_or_default();
                let kind = if host == "169.254.170.23" || host == "[fd00:ec2::23]" {
                    "EKS Pod Identity"
                } else {
                    "container credentials"
                };
                format!("{kind} ({})", crate::egress::shown(&c.url))
            }
        }
    }

    /// The headers to add to a request so AWS accepts it: `authorization`,
    /// `x-amz-date` and `x-amz-security-token` (with temporary
    /// credentials), each marked sensitive where secret. `headers` are the
    /// ones the request carries (all signed but `user-agent` and
    /// hop-by-hop ones); `host` is `url`'s.
    pub async fn sign(
        &self,
        http: &reqwest::Client,
        method: &str,
        url: &Url,
        headers: &[(HeaderName, HeaderValue)],
        body: &[u8],
    ) -> Result<Vec<(HeaderName, HeaderValue)>, LlmError> {
        let credentials = self.credentials(http).await?;
        signed(
            &credentials,
            &self.region,
            self.service,
            &Request {
                method,
                url,
                headers,
                body,
            },
            (self.clock)(),
        )
    }

    /// The credentials, fetched when none are kept or they are due.
    async fn credentials(&self, http: &reqwest::Client) -> Result<Credentials, LlmError> {
        match &self.source {
            Source::Keys { credentials, .. } => Ok(credentials.clone()),
            Source::WebIdentity(w) => {
                self.cache
                    .get(&self.clock, || self.assume_role(http, w))
                    .await
            }
            Source::Container(c) => {
                self.cache
                    .get(&self.clock, || self.ask_container(http, c))
                    .await
            }
        }
    }

    /// STS's `AssumeRoleWithWebIdentity` with the token file's token.
    async fn assume_role(
        &self,
        http: &reqwest::Client,
        w: &WebIdentity,
    ) -> Result<(Credentials, SystemTime), LlmError> {
        let from = self.source();
        let token = read_token_file(&w.token_file).await.map_err(|e| {
            failed(
                &from,
                format!("{e}; is the ServiceAccount annotated with eks.amazonaws.com/role-arn, and the pod started since?"),
                false,
            )
        })?;
        let session_name = w.session_name.clone().unwrap_or_else(|| {
            let secs = (self.clock)()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            format!("bindery-{secs}")
        });
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", "AssumeRoleWithWebIdentity")
            .append_pair("Version", STS_VERSION)
            .append_pair("RoleArn", &w.role_arn)
            .append_pair("RoleSessionName", &session_name)
            .append_pair("WebIdentityToken", token.expose())
            .finish();
        let request = http
            .post(w.sts.clone())
            .header(
                CONTENT_TYPE,
                "application/x-www-form-urlencoded; charset=utf-8",
            )
            .body(form);
        let answer = exchange(request, &w.sts)
            .await
            .map_err(|b| failed(&from, format!("AWS STS: {}", b.message), b.transient))?;
        if answer.status != 200 {
            return Err(sts_refused(
                &from,
                &w.role_arn,
                answer.status,
                &answer.body,
                token.expose(),
            ));
        }
        let got = sts_credentials(&answer.body).map_err(|what| {
            failed(
                &from,
                format!("AWS STS answered HTTP 200, but not with AssumeRoleWithWebIdentity's credentials: {what} (is AWS_ENDPOINT_URL_STS an STS endpoint?)"),
                false,
            )
        })?;
        self.credentials_of(&from, got, "assume-role-with-web-identity")
    }

    /// The container credentials endpoint's (EKS Pod Identity agent's)
    /// credentials, the token (file) in `Authorization`.
    async fn ask_container(
        &self,
        http: &reqwest::Client,
        c: &Container,
    ) -> Result<(Credentials, SystemTime), LlmError> {
        let from = self.source();
        let token = match &c.token {
            Some(ContainerToken::File(path)) => Some(read_token_file(path).await.map_err(|e| {
                failed(
                    &from,
                    format!("{e}; is the pod's ServiceAccount in an EKS Pod Identity association (the association mounts the token)?"),
                    false,
                )
            })?),
            Some(ContainerToken::Value(token)) => Some(token.clone()),
            None => None,
        };
        let mut request = http.get(c.url.clone()).header(ACCEPT, "application/json");
        if let Some(token) = &token {
            let mut value = HeaderValue::from_str(token.expose()).map_err(|_| {
                failed(
                    &from,
                    "the container authorization token has characters that cannot go in an HTTP header (a line break?)".to_owned(),
                    false,
                )
            })?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        let answer = exchange(request, &c.url).await.map_err(|b| {
            let hint = if b.transient {
                "; is the EKS Pod Identity Agent add-on installed and running on this node?"
            } else {
                ""
            };
            failed(&from, format!("{}{hint}", b.message), b.transient)
        })?;
        if answer.status != 200 {
            let secrets: Vec<&str> = token.iter().map(SecretString::expose).collect();
            let hint = if busy(answer.status) {
                "the agent failed; it is tried again at the next request"
            } else {
                "is there an EKS Pod Identity association for this namespace and ServiceAccount, to a role the agent may assume?"
            };
            return Err(failed(
                &from,
                format!(
                    "the credentials endpoint answered HTTP {}: {}; {hint}",
                    answer.status,
                    scrubbed(&answer.body, &secrets)
                ),
                busy(answer.status),
            ));
        }
        let got = container_credentials(&answer.body).map_err(|what| {
            failed(
                &from,
                format!(
                    "the credentials endpoint answered HTTP 200, but not with credentials: {what}"
                ),
                false,
            )
        })?;
        self.credentials_of(&from, got, "container-credentials")
    }

    /// `got` as AWS's credentials, with when they expire.
    fn credentials_of(
        &self,
        from: &str,
        got: Temporary,
        provider: &'static str,
    ) -> Result<(Credentials, SystemTime), LlmError> {
        let expires = aws_smithy_types::DateTime::from_str(
            &got.expiration,
            aws_smithy_types::date_time::Format::DateTime,
        )
        .ok()
        .and_then(|t| SystemTime::try_from(t).ok())
        .ok_or_else(|| {
            failed(
                from,
                format!(
                    "the credentials' Expiration {} is not an RFC 3339 time",
                    crate::error::excerpt(&got.expiration)
                ),
                false,
            )
        })?;
        let expires = not_expired(from, expires, (self.clock)())?;
        let credentials = Credentials::new(
            got.access_key_id,
            got.secret_access_key.expose(),
            Some(got.session_token.expose().to_owned()),
            Some(expires),
            provider,
        );
        Ok((credentials, expires))
    }
}

/// The source `keys` or the environment sets up; a Config error when none
/// is, or one only in part.
fn source(keys: Option<AwsKeys>, region: &str, env: &dyn Env) -> Result<Source, LlmError> {
    if let Some(keys) = keys {
        if keys.access_key_id.trim().is_empty() || keys.secret_access_key.is_empty() {
            return Err(LlmError::Config(
                "the agent's AWS keys are empty: give both the access key id and the secret access key".to_owned(),
            ));
        }
        return Ok(Source::Keys {
            credentials: Credentials::new(
                keys.access_key_id.trim(),
                keys.secret_access_key.expose(),
                keys.session_token
                    .filter(|t| !t.is_empty())
                    .map(|t| t.expose().to_owned()),
                None,
                "static keys",
            ),
            from: "static keys",
        });
    }
    let get = |name: &str| var(env, name);
    match (get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => {
            return Ok(Source::Keys {
                credentials: Credentials::new(
                    id,
                    secret,
                    get("AWS_SESSION_TOKEN"),
                    None,
                    "environment keys",
                ),
                from: "environment keys (AWS_ACCESS_KEY_ID)",
            })
        }
        (Some(_), None) => return Err(missing("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")),
        (None, Some(_)) => return Err(missing("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")),
        (None, None) => {}
    }
    match (get("AWS_ROLE_ARN"), get("AWS_WEB_IDENTITY_TOKEN_FILE")) {
        (Some(role_arn), Some(file)) => {
            let session_name = get("AWS_ROLE_SESSION_NAME");
            if let Some(name) = &session_name {
                if !valid_session_name(name) {
                    return Err(LlmError::Config(format!(
                        "AWS_ROLE_SESSION_NAME {name:?} is not a session name STS takes: 2 to 64 letters, digits and +=,.@_-"
                    )));
                }
            }
            let (endpoint, name) = match (get("AWS_ENDPOINT_URL_STS"), get("AWS_ENDPOINT_URL")) {
                (Some(url), _) => (url, "AWS_ENDPOINT_URL_STS"),
                (None, Some(url)) => (url, "AWS_ENDPOINT_URL"),
                (None, None) => (sts_url(region), "the STS endpoint"),
            };
            return Ok(Source::WebIdentity(WebIdentity {
                role_arn,
                token_file: PathBuf::from(file),
                session_name,
                sts: identity_url(&endpoint, name, HttpHosts::LoopbackOnly)?,
            }));
        }
        (Some(_), None) => return Err(missing("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")),
        (None, Some(_)) => return Err(missing("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")),
        (None, None) => {}
    }
    // botocore: the relative URI (ECS's) before the full one.
    let container = match (
        get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
        get("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
    ) {
        (Some(path), _) => Some((
            format!("http://169.254.170.2{path}"),
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        )),
        (None, Some(url)) => Some((url, "AWS_CONTAINER_CREDENTIALS_FULL_URI")),
        (None, None) => None,
    };
    if let Some((text, name)) = container {
        let url = identity_url(&text, name, HttpHosts::ContainerAgents)?;
        let token = match (
            get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"),
            get("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
        ) {
            (Some(file), _) => Some(ContainerToken::File(PathBuf::from(file))),
            (None, Some(token)) => Some(ContainerToken::Value(SecretString::new(token))),
            (None, None) => None,
        };
        return Ok(Source::Container(Container { url, token }));
    }
    Err(LlmError::Config(
        "no AWS credentials: give the agent AWS keys (a Secret), or run the pod with an AWS identity: IRSA (a ServiceAccount annotated with eks.amazonaws.com/role-arn sets AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE) or EKS Pod Identity (an association for the ServiceAccount sets AWS_CONTAINER_CREDENTIALS_FULL_URI)".to_owned(),
    ))
}

fn missing(unset: &str, set: &str) -> LlmError {
    LlmError::Config(format!(
        "{set} is set but {unset} is not: AWS credentials from the environment need both"
    ))
}

/// STS's regional endpoint (China's regions are under `amazonaws.com.cn`).
fn sts_url(region: &str) -> String {
    let domain = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    format!("https://sts.{region}.{domain}/")
}

/// STS's `roleSessionNameType`: 2 to 64 of `[\w+=,.@-]`.
fn valid_session_name(name: &str) -> bool {
    (2..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+=,.@-".contains(&b))
}

/// The headers SigV4 adds to `request`, signed with `credentials` at
/// `time`. Pure.
pub(crate) struct Request<'a> {
    pub method: &'a str,
    pub url: &'a Url,
    pub headers: &'a [(HeaderName, HeaderValue)],
    pub body: &'a [u8],
}

fn signed(
    credentials: &Credentials,
    region: &str,
    service: &str,
    request: &Request<'_>,
    time: SystemTime,
) -> Result<Vec<(HeaderName, HeaderValue)>, LlmError> {
    let mut pairs = Vec::with_capacity(request.headers.len());
    for (name, value) in request.headers {
        if UNSIGNED.contains(&name.as_str()) {
            continue;
        }
        let value = value.to_str().map_err(|_| {
            LlmError::Config(format!(
                "the header {name} has bytes SigV4 cannot sign (not visible ASCII)"
            ))
        })?;
        pairs.push((name.as_str(), value));
    }
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| LlmError::Config(format!("cannot sign the request: {e}")))?
        .into();
    let signable = SignableRequest::new(
        request.method,
        request.url.as_str(),
        pairs.into_iter(),
        SignableBody::Bytes(request.body),
    )
    .map_err(|e| LlmError::Config(format!("cannot sign the request: {e}")))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|e| LlmError::Config(format!("cannot sign the request: {e}")))?
        .into_parts();
    let (headers, _query) = instructions.into_parts();
    let mut out = Vec::with_capacity(headers.len());
    for header in headers {
        let name = HeaderName::from_bytes(header.name().as_bytes()).map_err(|_| {
            LlmError::Config(format!(
                "the signature's header {:?} cannot go in a request",
                header.name()
            ))
        })?;
        let mut value = HeaderValue::from_str(header.value()).map_err(|_| {
            LlmError::Config(format!(
                "the signature's {name} header cannot go in a request"
            ))
        })?;
        if header.sensitive() || name == AUTHORIZATION || name == "x-amz-security-token" {
            value.set_sensitive(true);
        }
        out.push((name, value));
    }
    Ok(out)
}

/// Temporary credentials as STS or a container endpoint gives them.
struct Temporary {
    access_key_id: String,
    secret_access_key: SecretString,
    session_token: SecretString,
    expiration: String,
}

/// The path of each of STS's credentials in its reply.
const STS_RESULT: [&str; 3] = [
    "AssumeRoleWithWebIdentityResponse",
    "AssumeRoleWithWebIdentityResult",
    "Credentials",
];

/// STS's `AssumeRoleWithWebIdentityResponse` read: its `Credentials`. The
/// error says what is missing or where the XML broke, never a value.
fn sts_credentials(xml: &str) -> Result<Temporary, String> {
    let leaves = [
        "AccessKeyId",
        "SecretAccessKey",
        "SessionToken",
        "Expiration",
    ];
    let paths: Vec<Vec<&str>> = leaves
        .iter()
        .map(|leaf| STS_RESULT.iter().copied().chain([*leaf]).collect())
        .collect();
    let mut found = xml_texts(xml, &paths)?.into_iter();
    let mut next = |leaf: &str| {
        found
            .next()
            .flatten()
            .filter(|v| !v.trim().is_empty())
            .map(|v| v.trim().to_owned())
            .ok_or_else(|| format!("it has no {} in {}", leaf, STS_RESULT.join("/")))
    };
    Ok(Temporary {
        access_key_id: next("AccessKeyId")?,
        secret_access_key: SecretString::new(next("SecretAccessKey")?),
        session_token: SecretString::new(next("SessionToken")?),
        expiration: next("Expiration")?,
    })
}

/// Elements deeper than this are refused (STS's reply has 4 levels).
const MAX_XML_DEPTH: usize = 32;

/// The text of the element at each of `paths` (local names from the root),
/// or `None` where there is none; an element given twice, one with
/// elements inside where text is wanted, or XML that does not read is an
/// error that names no value.
fn xml_texts(xml: &str, paths: &[Vec<&str>]) -> Result<Vec<Option<String>>, String> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut stack: Vec<String> = Vec::new();
    let mut out: Vec<Option<String>> = vec![None; paths.len()];
    // The wanted element open now, whose text is being gathered.
    let mut open: Option<usize> = None;
    let mut roots = 0;
    let at = |stack: &[String]| {
        paths
            .iter()
            .position(|p| p.len() == stack.len() && p.iter().zip(stack).all(|(a, b)| a == b))
    };
    loop {
        let event = reader
            .read_event()
            .map_err(|_| format!("the XML does not read at byte {}", reader.error_position()))?;
        match event {
            Event::Start(e) => {
                if open.is_some() {
                    return Err("an element where text is wanted".to_owned());
                }
                if stack.is_empty() {
                    roots += 1;
                }
                if stack.len() >= MAX_XML_DEPTH || roots > 1 {
                    return Err(format!(
                        "the XML is not one document of at most {MAX_XML_DEPTH} levels"
                    ));
                }
                let name = e.local_name();
                stack.push(name.into_inner().to_owned());
                if let Some(i) = at(&stack) {
                    if out[i].is_some() {
                        return Err(format!("{} is given twice", paths[i].join("/")));
                    }
                    out[i] = Some(String::new());
                    open = Some(i);
                }
            }
            Event::End(_) => {
                stack.pop();
                open = None;
            }
            Event::Empty(e) => {
                if open.is_some() {
                    return Err("an element where text is wanted".to_owned());
                }
                let name = e.local_name();
                stack.push(name.into_inner().to_owned());
                if let Some(i) = at(&stack) {
                    if out[i].is_some() {
                        return Err(format!("{} is given twice", paths[i].join("/")));
                    }
                    out[i] = Some(String::new());
                }
                stack.pop();
            }
            Event::Text(t) => {
                if let Some(i) = open {
                    if let Some(text) = out[i].as_mut() {
                        text.push_str(&t.xml10_content());
                    }
                }
            }
            Event::CData(t) => {
                if let Some(i) = open {
                    if let Some(text) = out[i].as_mut() {
                        text.push_str(&t.into_inner());
                    }
                }
            }
            Event::GeneralRef(r) => {
                let resolved = match r.resolve_char_ref() {
                    Ok(Some(c)) => Some(c.to_string()),
                    Ok(None) => quick_xml::escape::resolve_predefined_entity(&r).map(str::to_owned),
                    Err(_) => None,
                };
                let resolved = resolved.ok_or_else(|| {
                    format!(
                        "the XML has an entity XML does not define, at byte {}",
                        reader.buffer_position()
                    )
                })?;
                if let Some(i) = open {
                    if let Some(text) = out[i].as_mut() {
                        text.push_str(&resolved);
                    }
                }
            }
            Event::Eof => break,
            // The declaration, comments, processing instructions, a DOCTYPE
            // (its entities are not expanded: a reference to one fails).
            _ => {}
        }
    }
    if !stack.is_empty() || roots == 0 {
        return Err("the XML ends before its document does".to_owned());
    }
    Ok(out)
}

/// STS's refusal, with its `Code` and `Message` (the token scrubbed), and
/// what to check.
fn sts_refused(from: &str, role_arn: &str, status: u16, body: &str, token: &str) -> LlmError {
    let paths = [
        vec!["ErrorResponse", "Error", "Code"],
        vec!["ErrorResponse", "Error", "Message"],
    ];
    let (code, message) = match xml_texts(body, &paths) {
        Ok(found) => {
            let mut found = found.into_iter();
            (
                found.next().flatten().map(|c| c.trim().to_owned()),
                found.next().flatten(),
            )
        }
        Err(_) => (None, None),
    };
    let said = match (&code, &message) {
        (Some(code), Some(message)) => {
            format!(
                "{}: {}",
                scrubbed(code, &[token]),
                scrubbed(message, &[token])
            )
        }
        _ => scrubbed(body, &[token]),
    };
    let hint = match code.as_deref() {
        Some("AccessDenied") => format!(
            "check that the trust policy of {role_arn} lets the cluster's OIDC provider assume it for this ServiceAccount (system:serviceaccount:<namespace>:<name>), with audience sts.amazonaws.com"
        ),
        Some("InvalidIdentityToken") => "check that the cluster's OIDC issuer is an IAM identity provider of the role's account, with audience sts.amazonaws.com".to_owned(),
        Some("ExpiredTokenException" | "ExpiredToken") => "the token file holds an expired token: the kubelet refreshes it; is the projected token still mounted?".to_owned(),
        Some("IDPCommunicationError") | Some("Throttling") => "it is tried again at the next request".to_owned(),
        Some("RegionDisabledException") => "activate STS in this region (IAM account settings), or set AWS_ENDPOINT_URL_STS".to_owned(),
        _ if busy(status) => "it is tried again at the next request".to_owned(),
        _ => format!("check the role {role_arn} and its trust policy"),
    };
    let transient = busy(status)
        || matches!(
            code.as_deref(),
            Some("IDPCommunicationError" | "Throttling")
        );
    failed(
        from,
        format!("AWS STS refused AssumeRoleWithWebIdentity: HTTP {status} {said}; {hint}"),
        transient,
    )
}

/// A container credentials endpoint's JSON read: `AccessKeyId`,
/// `SecretAccessKey`, `Token`, `Expiration`. The error names what is
/// missing, never a value.
fn container_credentials(text: &str) -> Result<Temporary, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "it is not JSON (at line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    let field = |k: &str| {
        value
            .get(k)
            .and_then(serde_json::Value::as_str)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("it has no {k} string"))
    };
    Ok(Temporary {
        access_key_id: field("AccessKeyId")?,
        secret_access_key: SecretString::new(field("SecretAccessKey")?),
        session_token: SecretString::new(field("Token")?),
        expiration: field("Expiration")?,
    })
}

#[cfg(test)]
mod tests;
