//! MCP protocol 2026-07-28: no handshake and no protocol session.
//!
//! Each request carries its protocol version and the client's capabilities
//! in `_meta`; the `MCP-Protocol-Version`, `Mcp-Method` and (for
//! `tools/call`) `Mcp-Name` headers repeat what the body says, so that a
//! proxy can route without reading it, and must agree with it. Every result
//! says `resultType: "complete"`, list results say how long they may be
//! cached, and `server/discover` tells a client which versions are spoken.
//! The endpoint was stateless already; this is the wire shape only.

use serde_json::{json, Value};

use super::jsonrpc::{RpcError, INVALID_PARAMS};
use super::PROTOCOL_VERSIONS;

/// The first protocol version without `initialize`.
pub const VERSION: &str = "2026-07-28";

const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// The protocol version asked for is not one this server speaks.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
/// A header contradicts the body (or is missing where the body needs it).
pub const HEADER_MISMATCH: i64 = -32020;

/// How long a client may keep `tools/list`'s answer: the agents a server
/// serves change only when it restarts.
const TOOLS_TTL_MS: u64 = 60_000;

/// Which lifecycle a request follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// `initialize` first, then requests that carry nothing of it.
    Legacy,
    /// Every request describes itself (2026-07-28 and later).
    Stateless,
}

impl Era {
    /// The lifecycle of one request, once its headers and `_meta` agree;
    /// what does not agree is refused (HTTP 400) with the error a
    /// 2026-07-28 client expects.
    pub fn of(
        headers: &axum::http::HeaderMap,
        method: &str,
        params: &Value,
    ) -> Result<Era, RpcError> {
        let header_version = header(headers, "mcp-protocol-version")?;
        if method == "initialize" {
            // The handshake of the older versions; a method header, when
            // one is sent anyway, must still name it.
            if let Some(m) = header(headers, "mcp-method")? {
                if m != method {
                    return Err(mismatch(format!(
                        "Mcp-Method header `{m}` does not match body method `{method}`"
                    )));
                }
            }
            return Ok(Era::Legacy);
        }
        let meta = params.get("_meta");
        let meta_version = meta.and_then(|m| m.get(META_VERSION));
        let inline = method == "server/discover"
            || meta_version.is_some()
            || header_version.is_some_and(|v| v >= VERSION);
        if !inline {
            return Ok(Era::Legacy);
        }
        let missing = missing_meta(meta);
        let Some(version) = meta_version.and_then(Value::as_str) else {
            return Err(malformed_meta(&missing));
        };
        if !PROTOCOL_VERSIONS.contains(&version) {
            return Err(unsupported(version));
        }
        if !missing.is_empty() {
            return Err(malformed_meta(&missing));
        }
        let Some(header_version) = header_version else {
            return Err(mismatch(
                "a request with _meta protocolVersion needs the MCP-Protocol-Version header",
            ));
        };
        if header_version != version {
            return Err(mismatch(format!(
                "MCP-Protocol-Version header ({header_version}) does not match request _meta protocolVersion ({version})"
            )));
        }
        if version < VERSION {
            return Ok(Era::Legacy);
        }
        routing_headers(headers, method, params)?;
        Ok(Era::Stateless)
    }
}

/// `Mcp-Method` always, `Mcp-Name` for `tools/call`: both must be there
/// and say what the body says.
fn routing_headers(
    headers: &axum::http::HeaderMap,
    method: &str,
    params: &Value,
) -> Result<(), RpcError> {
    match header(headers, "mcp-method")? {
        None => return Err(mismatch("missing required Mcp-Method header")),
        Some(m) if m != method => {
            return Err(mismatch(format!(
                "Mcp-Method header `{m}` does not match body method `{method}`"
            )))
        }
        Some(_) => {}
    }
    if method == "tools/call" {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        match header(headers, "mcp-name")?.map(decode) {
            None => {
                return Err(mismatch(
                    "missing required Mcp-Name header for `tools/call`",
                ))
            }
            Some(None) => return Err(mismatch("the Mcp-Name header is not valid Base64")),
            Some(Some(h)) if h != name => {
                return Err(mismatch(format!(
                    "Mcp-Name header `{h}` does not match body value `{name}`"
                )))
            }
            Some(Some(_)) => {}
        }
    }
    Ok(())
}

/// A header's one value, if present; two values, or one that is not text,
/// contradict themselves.
fn header<'h>(headers: &'h axum::http::HeaderMap, name: &str) -> Result<Option<&'h str>, RpcError> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(mismatch(format!("more than one {name} header")));
    }
    first
        .to_str()
        .map(|v| Some(v.trim()))
        .map_err(|_| mismatch(format!("the {name} header is not text")))
}

/// A header value as sent: plain, or `=?base64?…?=` for text a header
/// cannot carry as it is.
fn decode(value: &str) -> Option<String> {
    use base64::Engine as _;
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        None => Some(value.to_owned()),
        Some(inner) => base64::engine::general_purpose::STANDARD
            .decode(inner)
            .ok()
            .and_then(|b| String::from_utf8(b).ok()),
    }
}

fn missing_meta(meta: Option<&Value>) -> Vec<&'static str> {
    let mut missing = Vec::new();
    if !meta
        .and_then(|m| m.get(META_VERSION))
        .is_some_and(Value::is_string)
    {
        missing.push(META_VERSION);
    }
    if !meta
        .and_then(|m| m.get(META_CAPABILITIES))
        .is_some_and(Value::is_object)
    {
        missing.push(META_CAPABILITIES);
    }
    missing
}

fn malformed_meta(missing: &[&str]) -> RpcError {
    RpcError::new(
        INVALID_PARAMS,
        format!(
            "request _meta is missing or has malformed required fields: {}",
            missing.join(", ")
        ),
    )
}

fn mismatch(message: impl Into<String>) -> RpcError {
    RpcError::new(HEADER_MISMATCH, message)
}

/// A version this server does not speak, with the ones it does.
pub fn unsupported(requested: &str) -> RpcError {
    RpcError {
        code: UNSUPPORTED_PROTOCOL_VERSION,
        message: format!(
            "unsupported protocol version `{requested}`; this server speaks {}",
            PROTOCOL_VERSIONS.join(", ")
        ),
        data: Some(json!({"requested": requested, "supported": PROTOCOL_VERSIONS})),
    }
}

/// `server/discover`'s answer.
pub fn discover(instructions: &str) -> Value {
    json!({
        "supportedVersions": PROTOCOL_VERSIONS,
        "capabilities": {"tools": {"listChanged": false}},
        "instructions": instructions,
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": {META_SERVER_INFO: {"name": "bindery-sidecar", "version": env!("CARGO_PKG_VERSION")}},
    })
}

/// A result as 2026-07-28 shapes it: complete, and a list with how long it
/// may be cached (by this caller only: it took the owner token).
pub fn complete(method: &str, mut result: Value) -> Value {
    if let Value::Object(m) = &mut result {
        // A result that asks for input (`elicit::input_required`) says so itself.
        m.entry("resultType").or_insert_with(|| json!("complete"));
        if method == "tools/list" {
            m.insert("ttlMs".into(), json!(TOOLS_TTL_MS));
            m.insert("cacheScope".into(), json!("private"));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn meta(version: &str) -> Value {
        json!({"_meta": {META_VERSION: version, META_CAPABILITIES: {}}, "name": "ask_invoices"})
    }

    #[test]
    fn older_requests_stay_as_they_were() {
        let none = headers(&[]);
        assert_eq!(Era::of(&none, "ping", &json!({})), Ok(Era::Legacy));
        let old = headers(&[("mcp-protocol-version", "2025-11-25")]);
        assert_eq!(Era::of(&old, "tools/list", &Value::Null), Ok(Era::Legacy));
        assert_eq!(Era::of(&none, "initialize", &json!({})), Ok(Era::Legacy));
    }

    #[test]
    fn a_self_describing_request_is_checked_against_its_headers() {
        let good = headers(&[
            ("mcp-protocol-version", VERSION),
            ("mcp-method", "tools/call"),
            ("mcp-name", "ask_invoices"),
        ]);
        assert_eq!(
            Era::of(&good, "tools/call", &meta(VERSION)),
            Ok(Era::Stateless)
        );
        // The name may come Base64-wrapped.
        let wrapped = headers(&[
            ("mcp-protocol-version", VERSION),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?YXNrX2ludm9pY2Vz?="),
        ]);
        assert_eq!(
            Era::of(&wrapped, "tools/call", &meta(VERSION)),
            Ok(Era::Stateless)
        );
        let code = |h: &HeaderMap, method: &str, p: &Value| Era::of(h, method, p).unwrap_err().code;
        // No _meta at all, or no capabilities.
        assert_eq!(
            code(&good, "tools/call", &json!({"name": "ask_invoices"})),
            INVALID_PARAMS
        );
        assert_eq!(
            code(
                &good,
                "tools/call",
                &json!({"_meta": {META_VERSION: VERSION}})
            ),
            INVALID_PARAMS
        );
        // A version nobody speaks.
        let e = Era::of(&good, "tools/call", &meta("2099-01-01")).unwrap_err();
        assert_eq!(e.code, UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(e.data.unwrap()["requested"], "2099-01-01");
        // Headers that disagree with the body, or are missing.
        for bad in [
            headers(&[("mcp-method", "tools/call"), ("mcp-name", "ask_invoices")]),
            headers(&[
                ("mcp-protocol-version", "2025-11-25"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "ask_invoices"),
            ]),
            headers(&[
                ("mcp-protocol-version", VERSION),
                ("mcp-name", "ask_invoices"),
            ]),
            headers(&[
                ("mcp-protocol-version", VERSION),
                ("mcp-method", "tools/list"),
                ("mcp-name", "ask_invoices"),
            ]),
            headers(&[
                ("mcp-protocol-version", VERSION),
                ("mcp-method", "tools/call"),
            ]),
            headers(&[
                ("mcp-protocol-version", VERSION),
                ("mcp-method", "tools/call"),
                ("mcp-name", "ask_other"),
            ]),
            headers(&[
                ("mcp-protocol-version", VERSION),
                ("mcp-method", "tools/call"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "ask_invoices"),
            ]),
        ] {
            assert_eq!(
                code(&bad, "tools/call", &meta(VERSION)),
                HEADER_MISMATCH,
                "{bad:?}"
            );
        }
        // discover always describes itself.
        assert_eq!(
            code(&headers(&[]), "server/discover", &json!({})),
            INVALID_PARAMS
        );
    }

    #[test]
    fn results_say_they_are_complete() {
        let r = complete("tools/list", json!({"tools": []}));
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["cacheScope"], "private");
        assert!(r["ttlMs"].is_u64());
        let r = complete("tools/call", json!({"content": []}));
        assert_eq!(r, json!({"content": [], "resultType": "complete"}));
        let d = complete("server/discover", discover("hi"));
        assert!(d["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!(VERSION)));
        assert_eq!(d["_meta"][META_SERVER_INFO]["name"], "bindery-sidecar");
    }
}
