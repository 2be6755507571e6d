//! DNS rebinding: a page of another site whose name resolves to this
//! server's address makes the visitor's browser send requests here. The
//! MCP transport requires a server to validate `Origin`; every route here
//! is guarded the same way. A request is refused (403) when its `Host` is
//! not a name this server answers to, or when it carries an `Origin` that
//! is neither this server's own (the `Host` it was sent to) nor one the
//! platform allowed. A request without `Origin` (no browser sent it) only
//! has its `Host` checked.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Which `Host` and `Origin` values a request may carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginPolicy {
    /// The host names (no port) requests may be sent to; `None`: any.
    hosts: Option<Vec<String>>,
    /// Origins besides the server's own (`scheme://host[:port]`).
    origins: Vec<String>,
    /// `--allowed-origins '*'`.
    any_origin: bool,
}

impl OriginPolicy {
    /// The policy of a server listening on `listen`: the `hosts` given
    /// (`--allowed-hosts`), or, for a server on a loopback address, the
    /// loopback names only (a rebinding page reaches it under its own
    /// name), else any host; the `origins` given (`--allowed-origins`,
    /// `*` for any) besides the server's own.
    pub fn new(listen: SocketAddr, hosts: &[String], origins: &[String]) -> OriginPolicy {
        let hosts = if hosts.iter().any(|h| h.trim() == "*") {
            None
        } else if !hosts.is_empty() {
            Some(hosts.iter().map(|h| host_name(h)).collect())
        } else if listen.ip().is_loopback() {
            Some(vec!["localhost".into()])
        } else {
            None
        };
        OriginPolicy {
            hosts,
            any_origin: origins.iter().any(|o| o.trim() == "*"),
            origins: origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .filter(|o| o != "*")
                .collect(),
        }
    }

    /// Whether a request with these headers may be served; why not.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::trim)
            .unwrap_or("");
        if let Some(allowed) = &self.hosts {
            let name = host_name(host);
            let loopback = allowed.iter().any(|a| a == "localhost")
                && name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
            if !loopback && !allowed.contains(&name) {
                return Err(Refused::Host { host: shown(host) });
            }
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = origin.to_str().unwrap_or("").trim().to_ascii_lowercase();
        if self.any_origin || self.origins.contains(&origin) || same_origin(&origin, host) {
            return Ok(());
        }
        Err(Refused::Origin {
            origin: shown(&origin),
        })
    }
}

/// Why a request was refused, its `Host` or `Origin` shown escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this server does not answer to the host `{host}`; a server on a loopback address answers to localhost and loopback addresses only, and --allowed-hosts names the others")]
    Host { host: String },
    #[error("requests from the page at `{origin}` are not allowed here; --allowed-origins names the origins allowed besides this server's own")]
    Origin { origin: String },
}

/// A `Host` value's name: lower case, without its port or IPv6 brackets.
fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_string();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_string(),
        _ => host,
    }
}

/// Whether `origin` (`scheme://host[:port]`) is the server `host` (a
/// `Host` value) names, a default port written or not.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return false,
    };
    let host = host.to_ascii_lowercase();
    let bare = |a: &str| a.strip_suffix(default).unwrap_or(a).to_string();
    !authority.is_empty() && bare(authority) == bare(&host)
}

/// At most 100 characters of a header value, for an error message.
fn shown(value: &str) -> String {
    value
        .chars()
        .take(100)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The middleware: a request the policy refuses is answered 403 (a
/// JSON-RPC error on `/mcp`). A peer's forward is left to `admit`, which
/// checks its signature: the `Host` it was sent to is the peer's address.
pub async fn guard(State(policy): State<Arc<OriginPolicy>>, req: Request, next: Next) -> Response {
    if req.headers().contains_key(super::peers::PEER_HEADER)
        || req.extensions().get::<super::peers::PeerPort>().is_some()
    {
        return next.run(req).await;
    }
    match policy.check(req.headers()) {
        Ok(()) => next.run(req).await,
        Err(why) => {
            let why = why.to_string();
            tracing::info!(path = req.uri().path(), "a request refused: {why}");
            let body = if req.uri().path() == "/mcp" {
                serde_json::json!({"jsonrpc": "2.0", "id": null,
                    "error": {"code": -32600, "message": why}})
            } else {
                serde_json::json!({"error": "forbidden_origin", "message": why})
            };
            (StatusCode::FORBIDDEN, Json(body)).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(host: &str, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().unwrap());
        if let Some(o) = origin {
            h.insert(header::ORIGIN, o.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_loopback_server_answers_to_loopback_names_and_its_own_origin() {
        let p = OriginPolicy::new("127.0.0.1:4100".parse().unwrap(), &[], &[]);
        for (host, origin) in [
            ("127.0.0.1:4100", None),
            ("localhost:4100", Some("http://localhost:4100")),
            ("[::1]:4100", Some("http://[::1]:4100")),
            ("127.0.0.2", None),
            ("LOCALHOST", Some("http://localhost:80")),
        ] {
            assert_eq!(p.check(&headers(host, origin)), Ok(()), "{host} {origin:?}");
        }
        for (host, origin) in [
            ("evil.example.com", Some("http://evil.example.com")),
            ("evil.example.com:4100", None),
            ("127.0.0.1:4100", Some("http://evil.example.com")),
            ("127.0.0.1:4100", Some("null")),
            ("127.0.0.1:4100", Some("http://127.0.0.1:4101")),
        ] {
            assert!(
                p.check(&headers(host, origin)).is_err(),
                "{host} {origin:?}"
            );
        }
    }

    #[test]
    fn elsewhere_any_host_is_answered_and_origins_are_configured() {
        let any = OriginPolicy::new("0.0.0.0:8080".parse().unwrap(), &[], &[]);
        assert_eq!(
            any.check(&headers("agents.tenant-a.svc:8080", None)),
            Ok(())
        );
        assert!(any
            .check(&headers(
                "agents.tenant-a.svc:8080",
                Some("https://evil.example")
            ))
            .is_err());
        let p = OriginPolicy::new(
            "0.0.0.0:8080".parse().unwrap(),
            &["agents.example.com".into()],
            &["https://console.example.com/".into()],
        );
        assert_eq!(
            p.check(&headers(
                "agents.example.com",
                Some("https://console.example.com")
            )),
            Ok(())
        );
        assert!(p.check(&headers("10.0.0.7:8080", None)).is_err());
        let star = OriginPolicy::new("0.0.0.0:8080".parse().unwrap(), &[], &["*".into()]);
        let any = OriginPolicy::new("127.0.0.1:8080".parse().unwrap(), &["*".into()], &[]);
        assert_eq!(any.check(&headers("acme.shop.svc", None)), Ok(()));
        assert_eq!(
            star.check(&headers("x", Some("https://anything.example"))),
            Ok(())
        );
    }
}
