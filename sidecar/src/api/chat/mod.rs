//! The chat page at `/`: a person picks an agent, fills its open
//! parameters, chats in a session and watches the run stream, through the
//! same session API as any client. Its three files are embedded in the
//! binary (no build step, nothing fetched from elsewhere) and served with a
//! Content-Security-Policy that allows this server's own script, style and
//! API only: no inline script, no third-party origin, no framing. The page
//! holds its tokens in the tab (sessionStorage, the URL fragment), never in
//! cookies, and no route here reads or sets one.

use std::sync::Arc;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::server::AppState;

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("chat.js");
const STYLE: &str = include_str!("chat.css");

/// Sent with each file of the page.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// `GET /`, `/chat.js` and `/chat.css`; public, as the page holds no data.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/chat.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/chat.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
