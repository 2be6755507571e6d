//! The HTTP client of a remote MCP server with OAuth: rmcp's reqwest
//! client, each request given the current token; a 401 gets a token (once
//! more if it came with one), a 403 `insufficient_scope` a token with more
//! scopes, at most [`MAX_AUTHORIZATIONS`] times per request.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use super::{OAuth, OAuthError};

/// The most tokens one request gets: a first one and two step-ups.
pub const MAX_AUTHORIZATIONS: usize = 3;

/// What failed a request: the HTTP client, or the OAuth behind it.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Http(reqwest::Error),
    #[error("OAuth: {0}")]
    OAuth(#[from] OAuthError),
}

#[derive(Clone)]
pub struct Authorized {
    pub inner: reqwest::Client,
    pub oauth: Arc<OAuth>,
}

type Inner = StreamableHttpError<reqwest::Error>;
type Outer = StreamableHttpError<Failure>;

/// The same error with [`Failure`] as the client's: what rmcp looks at
/// (a session gone, SSE unsupported) stays what it was.
fn lift(e: Inner) -> Outer {
    use StreamableHttpError as E;
    match e {
        E::Client(e) => E::Client(Failure::Http(e)),
        E::Sse(e) => E::Sse(e),
        E::Io(e) => E::Io(e),
        E::HttpStatus(h) => E::HttpStatus(h),
        E::UnexpectedEndOfStream => E::UnexpectedEndOfStream,
        E::UnexpectedServerResponse(s) => E::UnexpectedServerResponse(s),
        E::ResponseBodyTooLarge { max_size } => E::ResponseBodyTooLarge { max_size },
        E::UnexpectedContentType(c) => E::UnexpectedContentType(c),
        E::ServerDoesNotSupportSse => E::ServerDoesNotSupportSse,
        E::ServerDoesNotSupportDeleteSession => E::ServerDoesNotSupportDeleteSession,
        E::TokioJoinError(e) => E::TokioJoinError(e),
        E::Deserialize(e) => E::Deserialize(e),
        E::TransportChannelClosed => E::TransportChannelClosed,
        E::MissingSessionIdInResponse => E::MissingSessionIdInResponse,
        E::AuthRequired(a) => E::AuthRequired(a),
        E::InsufficientScope(i) => E::InsufficientScope(i),
        E::ReservedHeaderConflict(h) => E::ReservedHeaderConflict(h),
        E::SessionExpired => E::SessionExpired,
        E::SessionRecoveryTimeout => E::SessionRecoveryTimeout,
        E::ReinitializationFailed(d) => E::ReinitializationFailed(d),
        E::ControlRequestTimeout => E::ControlRequestTimeout,
        other => E::UnexpectedServerResponse(other.to_string().into()),
    }
}

impl Authorized {
    /// `send` with the current token, renewed as the server's challenges
    /// ask.
    async fn with_token<T, F, Fut>(&self, send: F) -> Result<T, Outer>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, Inner>>,
    {
        let oauth = &self.oauth;
        let mut token = oauth.token().await.map_err(oauth_error)?;
        let mut authorizations = 0;
        loop {
            let sent = token.as_ref().map(|t| t.expose().to_string());
            let header = match send(sent.clone()).await {
                Ok(v) => return Ok(v),
                Err(StreamableHttpError::AuthRequired(a)) => Err(Some(a.www_authenticate_header)),
                Err(StreamableHttpError::HttpStatus(h)) if h.status == 401 => Err(None),
                Err(StreamableHttpError::InsufficientScope(i)) => Ok(i.www_authenticate_header),
                Err(e) => return Err(lift(e)),
            };
            if authorizations == MAX_AUTHORIZATIONS {
                return Err(oauth_error(match header {
                    Err(_) => OAuthError::StillUnauthorized,
                    Ok(h) => OAuthError::ScopeNotGranted {
                        wanted: super::challenge::bearer(&h).scope.unwrap_or_default(),
                        granted: String::new(),
                    },
                }));
            }
            authorizations += 1;
            let renewed = match header {
                Err(h) => {
                    // A second 401 to a token just issued: asking again would loop.
                    if sent.is_some() && authorizations > 1 {
                        return Err(oauth_error(OAuthError::StillUnauthorized));
                    }
                    oauth.unauthorized(h.as_deref(), sent.as_deref()).await
                }
                Ok(h) => oauth.insufficient_scope(&h).await,
            };
            token = Some(renewed.map_err(oauth_error)?);
        }
    }
}

fn oauth_error(e: OAuthError) -> Outer {
    StreamableHttpError::Client(Failure::OAuth(e))
}

impl StreamableHttpClient for Authorized {
    type Error = Failure;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Outer> {
        self.with_token(|token| {
            self.inner.post_message(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Outer> {
        self.with_token(|token| {
            self.inner.post_message_with_response_limits(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                limits,
            )
        })
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Outer> {
        // Ending a session asks for no new token.
        let token = self.oauth.token().await.ok().flatten();
        self.inner
            .delete_session(
                uri,
                session_id,
                token.map(|t| t.expose().to_string()),
                custom_headers,
            )
            .await
            .map_err(lift)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Outer> {
        self.with_token(|token| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Outer> {
        self.with_token(|token| {
            self.inner.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }
}
