//! The HTTP side: sending requests, retrying, reading replies and streams.

use std::collections::hash_map::RandomState;
use std::error::Error as _;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bindery_spec::provider::Provider;
use futures::StreamExt;
use reqwest::header::{HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};

use super::anthropic;
use super::conversation::Conversation;
use super::dialect::{self, Streamed};
use super::error::{excerpt, LlmError};
use super::parse::deltas_of;
use super::sent::{Held, Sent};
use super::types::{ChatRequest, ChatResponse, FellBack, ModelEndpoint, ReplyLimits, StreamDelta};
use bindery_spec::Redirects;

/// The longest `Retry-After` the client honours; a longer one is cut to this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The longest computed backoff between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A model that answers in this process, without HTTP: the seam the
/// in-process service tests script their model turns through (see
/// [`ChatClient::in_process`]).
pub trait LocalModel: Send + Sync {
    fn complete<'a>(
        &'a self,
        req: &'a ChatRequest,
    ) -> futures::future::BoxFuture<'a, Result<ChatResponse, LlmError>>;
}

/// A client for one [`ModelEndpoint`]. Cheap to clone: clones share one
/// connection pool.
#[derive(Clone)]
pub struct ChatClient {
    inner: Arc<Inner>,
}

impl ChatClient {
    /// The key this client sends, if any: one of the server's own
    /// credentials.
    pub fn api_key(&self) -> Option<&bindery_params::SecretString> {
        self.inner.endpoint.api_key.as_ref()
    }

    /// The keys of this client and its fallbacks, in order (`None` where a
    /// model has none).
    pub fn api_keys(&self) -> impl Iterator<Item = Option<&bindery_params::SecretString>> {
        std::iter::once(self.api_key()).chain(self.inner.fallbacks.iter().map(ChatClient::api_key))
    }

    /// The chain from fallback `at` (0-based) on: that model, then the
    /// fallbacks after it.
    pub fn from_fallback(&self, at: usize) -> Option<ChatClient> {
        let first = self.inner.fallbacks.get(at)?.clone();
        Some(first.with_fallbacks(self.inner.fallbacks[at + 1..].to_vec()))
    }

    /// This client, with `fallbacks` tried in order when it fails in a way
    /// another model may not (429, 5xx, unreachable, too slow).
    pub fn with_fallbacks(self, fallbacks: Vec<ChatClient>) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            http: shared.http.clone(),
            identity_http: shared.identity_http.clone(),
            auth: shared.auth.clone(),
            reasoner: shared.reasoner.clone(),
            endpoint: shared.endpoint.clone(),
            url: shared.url.clone(),
            stream_url: shared.stream_url.clone(),
            headers: shared.headers.clone(),
            local: shared.local.clone(),
            fallbacks: shared.fallbacks.clone(),
        });
        ChatClient {
            inner: Arc::new(Inner { fallbacks, ..inner }),
        }
    }
}

/// What a request accepts back.
fn accept(stream: bool) -> &'static str {
    match stream {
        true => "text/event-stream",
        false => "application/json",
    }
}

/// How requests are authorized beyond the fixed headers.
#[derive(Clone)]
enum Auth {
    /// By the fixed headers alone (a key, or nothing).
    Headers,
    /// Bedrock without a key: SigV4 with the agent's keys or the pod's
    /// AWS identity.
    SigV4(Arc<crate::credentials::AwsSigner>),
    /// Azure OpenAI without a key: an Entra ID token of the pod's
    /// workload identity.
    Entra(Arc<crate::credentials::EntraToken>),
}

impl Auth {
    fn of(endpoint: &ModelEndpoint) -> Result<Auth, LlmError> {
        let cloud = matches!(endpoint.provider, Provider::Bedrock | Provider::AzureOpenAi);
        if cloud
            && endpoint
                .api_key
                .as_ref()
                .is_some_and(|k| k.expose().trim().is_empty())
        {
            // Never the pod's identity in place of a key that was meant.
            return Err(LlmError::Config(
                "the model's apiKey is empty (without a key the pod's cloud identity would be used); give the key, or remove apiKey to use the pod's identity"
                    .to_owned(),
            ));
        }
        let keyed = endpoint.api_key.is_some();
        let env =
            || -> Arc<dyn crate::credentials::Env> { Arc::new(crate::credentials::ProcessEnv) };
        Ok(match endpoint.provider {
            Provider::Bedrock if !keyed => {
                let region = endpoint.region.clone().ok_or_else(|| {
                    LlmError::Config(
                        "no AWS region for Bedrock: give `bedrock: {region: …}` or a bedrock-runtime.REGION.amazonaws.com URL".to_owned(),
                    )
                })?;
                Auth::SigV4(Arc::new(crate::credentials::AwsSigner::new(
                    endpoint.aws_keys.clone(),
                    region,
                    "bedrock",
                    env(),
                )?))
            }
            Provider::AzureOpenAi if !keyed => {
                Auth::Entra(Arc::new(crate::credentials::EntraToken::from_env(env())?))
            }
            _ => Auth::Headers,
        })
    }

    /// Where its credentials come from, for `check` and errors.
    fn source(&self) -> Option<String> {
        match self {
            Auth::Headers => None,
            Auth::SigV4(s) => Some(s.source()),
            Auth::Entra(t) => Some(t.source()),
        }
    }
}

fn token_source(auth: &Auth) -> String {
    auth.source().unwrap_or_default()
}

/// A status that says the endpoint is rate limited or failing, not the
/// request wrong: the same request is retried, then another model asked.
fn busy(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

/// Whether `e` is a failure the next model of a chain may not have: the
/// endpoint overloaded or rate limited (429, 529, any 5xx) after its
/// retries, unreachable, or too slow. A refusal of the request itself
/// (4xx), a reply that does not read or is too large are the request's,
/// and would be the next model's too.
pub fn falls_back(e: &LlmError) -> bool {
    match e {
        LlmError::RetriesExhausted { last, .. } => falls_back(last),
        LlmError::Http { status, .. } => busy(*status),
        LlmError::Transport(_) | LlmError::Timeout | LlmError::Deadline(_) => true,
        // The pod's identity endpoint busy or unreachable: another model
        // may take other credentials.
        LlmError::Credentials { transient, .. } => *transient,
        _ => false,
    }
}

struct Inner {
    http: reqwest::Client,
    /// Asks the pod's identity for credentials (STS, EKS Pod Identity,
    /// Entra ID): no redirect followed.
    identity_http: Option<reqwest::Client>,
    /// What each request is signed or authorized with beyond `headers`.
    auth: Auth,
    /// Who reasons here ([`dialect::reasoner`]), made once: each request
    /// and reply names it.
    reasoner: String,
    endpoint: ModelEndpoint,
    /// `{base_url}/chat/completions` (or the provider's path), parsed
    /// once: a request clones it instead of parsing the text anew.
    url: reqwest::Url,
    /// Where a streamed request goes (the same but for Gemini and Bedrock,
    /// whose streams have paths of their own).
    stream_url: reqwest::Url,
    /// The headers every request carries: the key (`Authorization:
    /// Bearer`, or the provider's own header), marked sensitive, and the
    /// provider's version.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Answers instead of the endpoint, in this process.
    local: Option<Arc<dyn LocalModel>>,
    /// The models tried, in order, when this one fails in a way another
    /// may not ([`falls_back`]).
    fallbacks: Vec<ChatClient>,
}

impl fmt::Debug for ChatClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatClient")
            .field("url", &super::egress::shown(&self.inner.url))
            .field("model", &self.inner.endpoint.model)
            .field("api_key", &self.inner.endpoint.api_key)
            .finish()
    }
}

/// What one attempt came to, when it did not fail for good.
enum Attempt<T> {
    Done(T),
    Retry {
        error: LlmError,
        retry_after: Option<Duration>,
    },
}

impl ChatClient {
    /// A client for `endpoint`. Fails if the base URL is not an http(s) URL,
    /// the timeout is zero, or the API key cannot go in an HTTP header.
    pub fn new(endpoint: ModelEndpoint) -> Result<Self, LlmError> {
        let base = endpoint.base_url.trim().trim_end_matches('/');
        match reqwest::Url::parse(base) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            _ => {
                return Err(LlmError::Config(format!(
                    "the base URL {base:?} is not an http(s) URL"
                )))
            }
        }
        if endpoint.timeout.is_zero() {
            return Err(LlmError::Config("the timeout is zero".to_owned()));
        }
        let mut headers = Vec::new();
        if let Some(key) = endpoint.api_key.as_ref().filter(|k| !k.is_empty()) {
            // Each API's own header; Bedrock's API keys are bearer tokens.
            let (name, text) = match endpoint.provider {
                Provider::OpenAi | Provider::OpenAiResponses | Provider::Bedrock => {
                    (AUTHORIZATION, format!("Bearer {}", key.expose()))
                }
                Provider::Anthropic => (
                    HeaderName::from_static("x-api-key"),
                    key.expose().to_owned(),
                ),
                Provider::Gemini => (
                    HeaderName::from_static("x-goog-api-key"),
                    key.expose().to_owned(),
                ),
                Provider::AzureOpenAi => {
                    (HeaderName::from_static("api-key"), key.expose().to_owned())
                }
            };
            let mut value = HeaderValue::try_from(text).map_err(|_| {
                LlmError::Config(
                    "the API key has characters that cannot go in an HTTP header".to_owned(),
                )
            })?;
            value.set_sensitive(true);
            headers.push((name, value));
        }
        let auth = Auth::of(&endpoint)?;
        if endpoint.provider == Provider::Anthropic {
            headers.push((
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static(anthropic::VERSION),
            ));
        }
        // The key goes only to the endpoint's own origin (see `egress`).
        let http = super::egress::client(Redirects::SameOrigin)
            .connect_timeout(endpoint.timeout)
            .user_agent(concat!("bindery-sidecar/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmError::Config(format!("cannot set up HTTP: {}", error_chain(&e))))?;
        let url_of = |stream: bool| -> Result<reqwest::Url, LlmError> {
            let path = dialect::path(&endpoint, stream)?;
            reqwest::Url::parse(&format!("{base}{path}")).map_err(|e| {
                LlmError::Config(format!(
                    "the base URL {base:?} does not take the path {path}: {e}"
                ))
            })
        };
        let url = url_of(false)?;
        let stream_url = url_of(true)?;
        let identity_http = match auth {
            Auth::Headers => None,
            _ => Some(
                super::egress::client(Redirects::Never)
                    .user_agent(concat!("bindery-sidecar/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(|e| {
                        LlmError::Config(format!("cannot set up HTTP: {}", error_chain(&e)))
                    })?,
            ),
        };
        Ok(ChatClient {
            inner: Arc::new(Inner {
                http,
                identity_http,
                auth,
                reasoner: dialect::reasoner(&endpoint),
                endpoint,
                url,
                stream_url,
                headers,
                local: None,
                fallbacks: Vec::new(),
            }),
        })
    }

    /// A client for `endpoint` whose requests `model` answers in this
    /// process: no HTTP and no retries, but the endpoint's timeout, and a
    /// streamed reply comes as its whole text in one delta.
    pub fn in_process(
        endpoint: ModelEndpoint,
        model: Arc<dyn LocalModel>,
    ) -> Result<Self, LlmError> {
        let mut client = ChatClient::new(endpoint)?;
        if let Some(inner) = Arc::get_mut(&mut client.inner) {
            inner.local = Some(model);
        }
        Ok(client)
    }

    /// What the in-process model says, within the endpoint's timeout.
    async fn ask_local(
        &self,
        model: &dyn LocalModel,
        req: &ChatRequest,
    ) -> Result<ChatResponse, LlmError> {
        tokio::time::timeout(self.inner.endpoint.timeout, model.complete(req))
            .await
            .unwrap_or(Err(LlmError::Timeout))
    }

    /// Where the pod's cloud identity comes from, when requests are signed
    /// or authorized with it (`check` shows it).
    pub fn identity_source(&self) -> Option<String> {
        self.inner.auth.source()
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &ModelEndpoint {
        &self.inner.endpoint
    }

    /// Sends `req` with `stream: false` and returns the whole reply: this
    /// model's, or the first fallback's that answers.
    pub async fn complete(&self, req: &Conversation) -> Result<ChatResponse, LlmError> {
        // `--llm-deadline` bounds the whole request, its fallbacks too.
        let deadline = self.deadline();
        tokio::time::timeout(deadline, self.complete_chain(req))
            .await
            .unwrap_or(Err(LlmError::Deadline(deadline)))
    }

    async fn complete_chain(&self, req: &Conversation) -> Result<ChatResponse, LlmError> {
        let mut fell_back = Vec::new();
        let mut result = self.complete_alone(req).await;
        for (i, next) in self.inner.fallbacks.iter().enumerate() {
            match &result {
                Err(e) if falls_back(e) => {
                    fell_back.push(self.passed_over(i, e));
                    result = next.complete_alone(req).await.map(|mut r| {
                        r.served_by = i + 1;
                        r
                    });
                }
                _ => break,
            }
        }
        self.chain_result(result, fell_back)
    }

    /// A chain's outcome: the answer with the models passed over, or,
    /// when some were and the last failed too, every failure in order.
    fn chain_result(
        &self,
        result: Result<ChatResponse, LlmError>,
        fell_back: Vec<FellBack>,
    ) -> Result<ChatResponse, LlmError> {
        match result {
            Ok(mut r) => {
                r.fell_back = fell_back;
                Ok(r)
            }
            Err(last) if !fell_back.is_empty() => Err(LlmError::ChainFailed {
                last_model: self.inner.fallbacks[fell_back.len() - 1]
                    .inner
                    .endpoint
                    .model
                    .clone(),
                tried: fell_back,
                last: Box::new(last),
            }),
            Err(e) => Err(e),
        }
    }

    /// The model of the chain at `at` (0: this one) passed over for `e`.
    fn passed_over(&self, at: usize, e: &LlmError) -> FellBack {
        let model = match at {
            0 => &self.inner.endpoint.model,
            n => &self.inner.fallbacks[n - 1].inner.endpoint.model,
        };
        tracing::warn!(model = %model, error = %error_summary(e), "the model failed; trying its next fallback");
        FellBack {
            model: model.clone(),
            error: error_summary(e),
        }
    }

    /// [`complete`](Self::complete) of this model alone.
    async fn complete_alone(&self, req: &Conversation) -> Result<ChatResponse, LlmError> {
        let limits = self.inner.endpoint.limits;
        let deadline = self.deadline();
        let response = tokio::time::timeout(deadline, self.complete_within(req))
            .await
            .unwrap_or(Err(LlmError::Deadline(deadline)))?;
        within_calls(response, &limits)
    }

    /// The whole request's deadline (the command line makes it at least
    /// one attempt's timeout unless it was given).
    fn deadline(&self) -> Duration {
        self.inner.endpoint.limits.deadline
    }

    async fn complete_within(&self, req: &Conversation) -> Result<ChatResponse, LlmError> {
        if let Some(model) = &self.inner.local {
            return self.ask_local(&**model, &req.request()?).await;
        }
        let body = &self.body(req, false)?;
        let timeout = self.inner.endpoint.timeout;
        let this = self;
        let text = self
            .with_retries(false, move || async move {
                let attempt = async {
                    match this.send(body, false).await? {
                        Attempt::Done((response, sent)) => {
                            let text = this.read_capped(response, timeout).await?;
                            Ok(Attempt::Done((sent.scrub(&text).into_owned(), sent)))
                        }
                        Attempt::Retry { error, retry_after } => {
                            Ok(Attempt::Retry { error, retry_after })
                        }
                    }
                };
                tokio::time::timeout(timeout, attempt)
                    .await
                    .unwrap_or(Err(LlmError::Timeout))
            })
            .await?;
        let (text, sent) = text;
        let response = sent.scrub_response(self.parse(&text)?);
        tracing::debug!(
            finish_reason = response.finish_reason.as_deref(),
            tool_calls = response.tool_calls.len(),
            "chat completion received"
        );
        Ok(response)
    }

    /// A whole reply's body, read to at most `--model-max-reply-bytes`
    /// (refused past it before it is all held), each wait for more within
    /// `timeout`.
    async fn read_capped(
        &self,
        mut response: reqwest::Response,
        timeout: Duration,
    ) -> Result<String, LlmError> {
        let limit = self.inner.endpoint.limits.max_bytes;
        if response
            .content_length()
            .is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX))
        {
            return Err(LlmError::TooLarge { limit });
        }
        let mut body = Vec::new();
        loop {
            let chunk = tokio::time::timeout(timeout, response.chunk())
                .await
                .map_err(|_| LlmError::Timeout)?
                .map_err(|e| self.read_error(e))?;
            let Some(chunk) = chunk else { break };
            if body.len() + chunk.len() > limit {
                return Err(LlmError::TooLarge { limit });
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body)
            .map_err(|e| LlmError::Malformed(format!("the reply is not UTF-8: {e}")))
    }

    /// Sends `req` with `stream: true`, calls `on_delta` with each piece of
    /// the reply as it arrives, and returns the assembled reply.
    ///
    /// Only the request itself is retried: once the reply has started,
    /// a failure ends the call. The endpoint's timeout bounds the wait for
    /// the response headers and then each wait for the next chunk.
    pub async fn complete_streaming(
        &self,
        req: &Conversation,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<ChatResponse, LlmError> {
        let deadline = self.deadline();
        tokio::time::timeout(deadline, self.complete_streaming_chain(req, on_delta))
            .await
            .unwrap_or(Err(LlmError::Deadline(deadline)))
    }

    async fn complete_streaming_chain(
        &self,
        req: &Conversation,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<ChatResponse, LlmError> {
        // A fallback takes over only while nothing of a reply was
        // forwarded: a reply is never two models' halves.
        let forwarded = std::sync::atomic::AtomicBool::new(false);
        let mut forward = |d: StreamDelta| {
            forwarded.store(true, std::sync::atomic::Ordering::Relaxed);
            on_delta(d)
        };
        let mut fell_back = Vec::new();
        let mut result = self.complete_streaming_alone(req, &mut forward).await;
        for (i, next) in self.inner.fallbacks.iter().enumerate() {
            match &result {
                Err(e)
                    if falls_back(e) && !forwarded.load(std::sync::atomic::Ordering::Relaxed) =>
                {
                    fell_back.push(self.passed_over(i, e));
                    result = next
                        .complete_streaming_alone(req, &mut forward)
                        .await
                        .map(|mut r| {
                            r.served_by = i + 1;
                            r
                        });
                }
                _ => break,
            }
        }
        self.chain_result(result, fell_back)
    }

    /// [`complete_streaming`](Self::complete_streaming) of this model alone.
    async fn complete_streaming_alone(
        &self,
        req: &Conversation,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<ChatResponse, LlmError> {
        let limits = self.inner.endpoint.limits;
        let deadline = self.deadline();
        let response =
            tokio::time::timeout(deadline, self.complete_streaming_within(req, on_delta))
                .await
                .unwrap_or(Err(LlmError::Deadline(deadline)))?;
        within_calls(response, &limits)
    }

    async fn complete_streaming_within(
        &self,
        req: &Conversation,
        on_delta: &mut (dyn FnMut(StreamDelta) + Send),
    ) -> Result<ChatResponse, LlmError> {
        if let Some(model) = &self.inner.local {
            let response = self.ask_local(&**model, &req.request()?).await?;
            deltas_of(&response, on_delta);
            return Ok(response);
        }
        let body = &self.body(req, true)?;
        let timeout = self.inner.endpoint.timeout;
        let this = self;
        let (response, sent) = self
            .with_retries(true, move || async move {
                tokio::time::timeout(timeout, this.send(body, true))
                    .await
                    .unwrap_or(Err(LlmError::Timeout))
            })
            .await?;

        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        if is_json {
            // The endpoint ignored `stream: true` and sent a whole reply.
            let text = self.read_capped(response, timeout).await?;
            let response = sent.scrub_response(self.parse(&sent.scrub(&text))?);
            deltas_of(&response, on_delta);
            return Ok(response);
        }

        let mut chunks = std::pin::pin!(response.bytes_stream());
        let mut state = Streamed::of(self.inner.endpoint.provider, sent.clone());
        let mut held = Held::new(&sent);
        let mut forward = |d: StreamDelta| held.pass(d, &mut *on_delta);
        let limit = self.inner.endpoint.limits.max_bytes;
        let mut read = 0usize;
        while !state.is_done() {
            let next = tokio::time::timeout(timeout, chunks.next())
                .await
                .map_err(|_| LlmError::Timeout)?;
            let Some(chunk) = next else {
                state.end(&mut forward)?;
                break;
            };
            let chunk = chunk.map_err(|e| self.read_error(e))?;
            read += chunk.len();
            if read > limit {
                return Err(LlmError::TooLarge { limit });
            }
            state.feed(&chunk, &mut forward)?;
        }
        let response = self.reasoned(sent.scrub_response(state.finish()?));
        held.flush(on_delta);
        tracing::debug!(
            finish_reason = response.finish_reason.as_deref(),
            tool_calls = response.tool_calls.len(),
            "streamed chat completion received"
        );
        Ok(response)
    }

    /// Runs `attempt` until it is done, fails for good, or the retries run
    /// out, waiting between attempts.
    async fn with_retries<T, F, Fut>(&self, stream: bool, mut attempt: F) -> Result<T, LlmError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Attempt<T>, LlmError>>,
    {
        let endpoint = &self.inner.endpoint;
        let mut retries = 0u32;
        loop {
            tracing::debug!(
                url = %super::egress::shown(&self.inner.url),
                model = %endpoint.model,
                stream,
                attempt = retries + 1,
                "sending chat completion request"
            );
            let started = Instant::now();
            let outcome = attempt().await;
            let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            match outcome {
                Ok(Attempt::Done(value)) => {
                    tracing::debug!(elapsed_ms, "chat completion request succeeded");
                    return Ok(value);
                }
                Err(error) => {
                    tracing::debug!(elapsed_ms, %error, "chat completion request failed");
                    return Err(error);
                }
                Ok(Attempt::Retry { error, retry_after }) => {
                    if retries >= endpoint.max_retries {
                        return Err(LlmError::RetriesExhausted {
                            attempts: retries + 1,
                            last: Box::new(error),
                        });
                    }
                    let wait = match retry_after {
                        Some(wait) => wait.min(MAX_RETRY_AFTER),
                        None => backoff(endpoint.initial_backoff, retries),
                    };
                    tracing::warn!(
                        url = %super::egress::shown(&self.inner.url),
                        model = %endpoint.model,
                        attempt = retries + 1,
                        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        error = %error_summary(&error),
                        "chat completion request failed; retrying"
                    );
                    tokio::time::sleep(wait).await;
                    retries += 1;
                }
            }
        }
    }

    /// Sends one request and checks its status. A success is `Done` with the
    /// response, its body unread; a 429, a 5xx or a failed connection is
    /// `Retry`; anything else is an error.
    async fn send(
        &self,
        body: &bytes::Bytes,
        stream: bool,
    ) -> Result<Attempt<(reqwest::Response, Sent)>, LlmError> {
        let url = match stream {
            true => &self.inner.stream_url,
            false => &self.inner.url,
        };
        let mut request = self
            .inner
            .http
            .post(url.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept(stream))
            .body(body.clone());
        for (name, value) in &self.inner.headers {
            request = request.header(name, value.clone());
        }
        let mut sent = Sent::of(&self.inner.headers, &self.inner.endpoint);
        match self.authorization(url, stream, body).await {
            Ok(headers) => {
                sent.add(&headers);
                for (name, value) in headers {
                    request = request.header(name, value);
                }
            }
            Err(
                error @ LlmError::Credentials {
                    transient: true, ..
                },
            ) => {
                return Ok(Attempt::Retry {
                    error,
                    retry_after: None,
                })
            }
            Err(error) => return Err(error),
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_timeout() => return Err(LlmError::Timeout),
            Err(e) if e.is_connect() => {
                return Ok(Attempt::Retry {
                    error: self.transport_error("could not connect to", &e),
                    retry_after: None,
                })
            }
            Err(e) => return Err(self.transport_error("the request failed at", &e)),
        };
        let status = response.status();
        if status.is_success() {
            return Ok(Attempt::Done((response, sent)));
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = match response.text().await {
            Ok(text) => text,
            Err(e) if e.is_timeout() => return Err(LlmError::Timeout),
            Err(_) => String::new(),
        };
        // Scrubbed whole, then cut: a cut never leaves a credential's
        // first bytes behind.
        let error = LlmError::Http {
            status: status.as_u16(),
            body: excerpt(&sent.scrub(&text)),
        };
        if busy(status.as_u16()) {
            Ok(Attempt::Retry { error, retry_after })
        } else {
            Err(error)
        }
    }

    /// The headers that authorize one request with the pod's identity: a
    /// SigV4 signature over it (made anew for each attempt: it holds the
    /// time), or an Entra ID token. None with a key.
    async fn authorization(
        &self,
        url: &reqwest::Url,
        stream: bool,
        body: &bytes::Bytes,
    ) -> Result<Vec<(HeaderName, HeaderValue)>, LlmError> {
        let Some(http) = &self.inner.identity_http else {
            return Ok(Vec::new());
        };
        match &self.inner.auth {
            Auth::Headers => Ok(Vec::new()),
            Auth::SigV4(signer) => {
                let signed = [
                    (CONTENT_TYPE, HeaderValue::from_static("application/json")),
                    (ACCEPT, HeaderValue::from_static(accept(stream))),
                ];
                signer.sign(http, "POST", url, &signed, body).await
            }
            Auth::Entra(token) => {
                let token = token.bearer(http).await?;
                let mut value = HeaderValue::try_from(format!("Bearer {}", token.expose()))
                    .map_err(|_| LlmError::Credentials {
                        from: token_source(&self.inner.auth),
                        message: "the access token cannot go in an HTTP header".to_owned(),
                        transient: false,
                    })?;
                value.set_sensitive(true);
                Ok(vec![(AUTHORIZATION, value)])
            }
        }
    }

    fn transport_error(&self, what: &str, e: &reqwest::Error) -> LlmError {
        if let Some(refused) = super::egress::refused(e) {
            return LlmError::Transport(format!(
                "{}: {refused}",
                super::egress::shown(&self.inner.url)
            ));
        }
        LlmError::Transport(format!(
            "{what} {}: {}",
            super::egress::shown(&self.inner.url),
            error_chain(e)
        ))
    }

    /// An error while reading a reply body.
    fn read_error(&self, e: reqwest::Error) -> LlmError {
        if e.is_timeout() {
            LlmError::Timeout
        } else {
            self.transport_error("the reply broke off from", &e)
        }
    }
}

impl ChatClient {
    /// The request body in the endpoint's provider's shape.
    fn body(&self, req: &Conversation, stream: bool) -> Result<bytes::Bytes, LlmError> {
        dialect::body(req, &self.inner.endpoint, &self.inner.reasoner, stream)
    }

    /// A whole reply in the endpoint's provider's shape.
    fn parse(&self, text: &str) -> Result<ChatResponse, LlmError> {
        dialect::parse(self.inner.endpoint.provider, text).map(|r| self.reasoned(r))
    }

    /// `response` with its reasoning marked as this endpoint's.
    fn reasoned(&self, mut response: ChatResponse) -> ChatResponse {
        if let Some(r) = &mut response.reasoning {
            r.endpoint = Some(self.inner.reasoner.clone());
        }
        response
    }
}

/// A reqwest error and its causes, without the URL (the caller names it).
fn error_chain(e: &reqwest::Error) -> String {
    let mut out = String::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = e.source();
    // reqwest's own message is generic ("error sending request"); the
    // causes say what really happened.
    out.push_str(if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the body failed"
    } else {
        "request failed"
    });
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// An error for a log line: the status alone for HTTP errors, so that no
/// reply body is logged at warn level.
fn error_summary(error: &LlmError) -> String {
    match error {
        LlmError::Http { status, .. } => format!("HTTP {status}"),
        LlmError::RetriesExhausted { attempts: 1, last } => error_summary(last),
        LlmError::RetriesExhausted { attempts, last } => {
            format!("{} after {attempts} attempts", error_summary(last))
        }
        LlmError::Transport(_) => "unreachable".to_owned(),
        LlmError::Timeout => "no answer in time".to_owned(),
        LlmError::Deadline(_) => "past its deadline".to_owned(),
        other => other.to_string(),
    }
}

/// The wait before retry number `retry` (0-based): `initial` doubled
/// `retry` times, capped, plus up to 10% jitter.
fn backoff(initial: Duration, retry: u32) -> Duration {
    let base = initial
        .checked_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX))
        .unwrap_or(MAX_BACKOFF)
        .min(MAX_BACKOFF);
    base + base.mul_f64(jitter_fraction() * 0.1)
}

/// A number in [0, 1), different on each call; good enough for jitter.
fn jitter_fraction() -> f64 {
    let h = RandomState::new().hash_one(Instant::now());
    (h % 10_000) as f64 / 10_000.0
}

/// `response`, unless it asks for more tool calls than one reply may.
fn within_calls(response: ChatResponse, limits: &ReplyLimits) -> Result<ChatResponse, LlmError> {
    match response.tool_calls.len() {
        count if count > limits.max_tool_calls => Err(LlmError::TooManyCalls {
            count,
            limit: limits.max_tool_calls,
        }),
        _ => Ok(response),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_params::SecretString;

    #[test]
    fn backoff_doubles_with_a_little_jitter() {
        let initial = Duration::from_millis(100);
        for retry in 0..5 {
            let b = backoff(initial, retry);
            let base = initial * 2u32.pow(retry);
            assert!(b >= base && b <= base + base / 10, "{retry}: {b:?}");
        }
        assert!(backoff(initial, 40) <= MAX_BACKOFF + MAX_BACKOFF / 10);
        assert!(backoff(Duration::from_secs(u64::MAX / 4), 3) <= MAX_BACKOFF * 2);
    }

    #[test]
    fn only_overload_unreachability_and_slowness_fall_back() {
        let http = |status| LlmError::Http {
            status,
            body: String::new(),
        };
        for e in [
            http(429),
            http(500),
            http(529),
            LlmError::Timeout,
            LlmError::Transport("x".into()),
            LlmError::Deadline(Duration::from_secs(1)),
            LlmError::RetriesExhausted {
                attempts: 3,
                last: Box::new(http(503)),
            },
        ] {
            assert!(falls_back(&e), "{e}");
        }
        for e in [
            http(400),
            http(401),
            http(404),
            LlmError::Malformed("x".into()),
            LlmError::TooLarge { limit: 1 },
            LlmError::TooManyCalls { count: 2, limit: 1 },
            LlmError::Config("x".into()),
            LlmError::RetriesExhausted {
                attempts: 3,
                last: Box::new(http(400)),
            },
        ] {
            assert!(!falls_back(&e), "{e}");
        }
        let summary = error_summary(&LlmError::RetriesExhausted {
            attempts: 2,
            last: Box::new(LlmError::Http {
                status: 529,
                body: "sk-canary".into(),
            }),
        });
        assert_eq!(summary, "HTTP 529 after 2 attempts");
    }

    #[test]
    fn new_checks_the_endpoint() {
        let ok = ChatClient::new(ModelEndpoint::new("http://127.0.0.1:1/v1/", "m")).unwrap();
        assert_eq!(
            ok.inner.url.as_str(),
            "http://127.0.0.1:1/v1/chat/completions"
        );
        for url in ["", "127.0.0.1:8080", "ftp://x/v1", "not a url"] {
            assert!(matches!(
                ChatClient::new(ModelEndpoint::new(url, "m")),
                Err(LlmError::Config(_))
            ));
        }
        let mut zero = ModelEndpoint::new("http://x/v1", "m");
        zero.timeout = Duration::ZERO;
        assert!(matches!(ChatClient::new(zero), Err(LlmError::Config(_))));
        let bad_key = ModelEndpoint::new("http://x/v1", "m")
            .with_api_key(SecretString::new("line\nbreak-canary"));
        let err = ChatClient::new(bad_key).unwrap_err();
        assert!(!format!("{err} {err:?}").contains("canary"));
    }

    #[test]
    fn debug_hides_the_key() {
        let client = ChatClient::new(
            ModelEndpoint::new("http://x/v1", "m").with_api_key(SecretString::new("sk-canary")),
        )
        .unwrap();
        let shown = format!("{client:?} {:?}", client.endpoint());
        assert!(!shown.contains("sk-canary"), "{shown}");
        assert!(shown.contains("<secret>"));
    }

    #[test]
    fn futures_are_send() {
        fn assert_send<T: Send>(_: &T) {}
        let client = ChatClient::new(ModelEndpoint::new("http://x/v1", "m")).unwrap();
        let req = Conversation::new(vec![]);
        assert_send(&client.complete(&req));
        let mut sink = |_: StreamDelta| {};
        assert_send(&client.complete_streaming(&req, &mut sink));
    }
}
