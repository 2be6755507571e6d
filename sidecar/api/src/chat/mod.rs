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
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::state::AppState;

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("chat.js");
const STYLE: &str = include_str!("chat.css");

/// Sent with each file of the page.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// `GET /`, `/chat.js` and `/chat.css`; public, as the page holds no data.
pub fn routes() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new()
        .routes(routes!(page))
        .routes(routes!(script))
        .routes(routes!(style))
}

/// The chat page
#[utoipa::path(get, path = "/", tag = "chat", operation_id = "chatPage", security(),
    responses((status = 200, description = "The file, embedded in the server.", body = String,
        content_type = "text/html", headers(("Content-Security-Policy" = String)))),
)]
async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

/// The chat page's script
#[utoipa::path(get, path = "/chat.js", tag = "chat", operation_id = "chatScript", security(),
    responses((status = 200, description = "The file, embedded in the server.", body = String,
        content_type = "text/javascript", headers(("Content-Security-Policy" = String)))),
)]
async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The chat page's style sheet
#[utoipa::path(get, path = "/chat.css", tag = "chat", operation_id = "chatStyle", security(),
    responses((status = 200, description = "The file, embedded in the server.", body = String,
        content_type = "text/css", headers(("Content-Security-Policy" = String)))),
)]
async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
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
