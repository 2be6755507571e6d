//! Where an MCP server's authorization is described, and what the
//! descriptions must say: the protected-resource metadata (RFC 9728), the
//! authorization server's metadata (RFC 8414, OpenID Connect Discovery),
//! with the well-known URIs in the MCP authorization spec's order, and the
//! 2025-03-26 spec's fallbacks for servers that publish neither. Pure.

use reqwest::Url;
use serde::Deserialize;

/// RFC 9728 protected-resource metadata, the fields used.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ResourceMetadata {
    pub resource: String,
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    #[serde(default)]
    pub scopes_supported: Option<Vec<String>>,
}

/// RFC 8414 authorization-server metadata, the fields used.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct ServerMetadata {
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub authorization_endpoint: Option<String>,
    pub token_endpoint: String,
    #[serde(default)]
    pub registration_endpoint: Option<String>,
    /// RFC 7009 (its metadata name, RFC 8414 §2).
    #[serde(default)]
    pub revocation_endpoint: Option<String>,
    #[serde(default)]
    pub scopes_supported: Option<Vec<String>>,
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub code_challenge_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub client_id_metadata_document_supported: Option<bool>,
}

impl ServerMetadata {
    /// The 2025-03-26 spec's default endpoints at `origin`, for a server
    /// that publishes no metadata.
    pub fn fallback(origin: &Url) -> ServerMetadata {
        let at = |path: &str| origin.join(path).map(String::from).ok();
        ServerMetadata {
            authorization_endpoint: at("/authorize"),
            token_endpoint: at("/token").unwrap_or_default(),
            registration_endpoint: at("/register"),
            ..ServerMetadata::default()
        }
    }

    /// Whether the server takes client authentication `method` (RFC 8414:
    /// `client_secret_basic` when it does not say).
    pub fn takes(&self, method: &str) -> bool {
        match &self.token_endpoint_auth_methods_supported {
            Some(list) => list.iter().any(|m| m == method),
            None => method == "client_secret_basic",
        }
    }
}

/// `url`'s path without a trailing `/` (`""` for the root).
fn path_of(url: &Url) -> &str {
    url.path().trim_end_matches('/')
}

fn with_path(url: &Url, path: &str) -> Url {
    let mut u = url.clone();
    u.set_path(path);
    u.set_query(None);
    u.set_fragment(None);
    u
}

/// The well-known URIs of a server's protected-resource metadata, in the
/// order tried: the path-inserted one (for a URL with a path), then the
/// root one.
pub fn resource_metadata_urls(server: &Url) -> Vec<Url> {
    const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";
    let path = path_of(server);
    let mut out = Vec::new();
    if !path.is_empty() {
        out.push(with_path(server, &format!("{WELL_KNOWN}{path}")));
    }
    out.push(with_path(server, WELL_KNOWN));
    out
}

/// The well-known URIs of an authorization server's metadata, in the MCP
/// spec's order: for an issuer with a path, OAuth path-inserted, OpenID
/// path-inserted, OpenID path-appended; for one without, OAuth then
/// OpenID.
pub fn server_metadata_urls(issuer: &Url) -> Vec<Url> {
    const OAUTH: &str = "/.well-known/oauth-authorization-server";
    const OPENID: &str = "/.well-known/openid-configuration";
    let path = path_of(issuer);
    if path.is_empty() {
        vec![with_path(issuer, OAUTH), with_path(issuer, OPENID)]
    } else {
        vec![
            with_path(issuer, &format!("{OAUTH}{path}")),
            with_path(issuer, &format!("{OPENID}{path}")),
            with_path(issuer, &format!("{path}{OPENID}")),
        ]
    }
}

/// The resource indicator (RFC 8707) of a server URL: the URL without a
/// fragment.
pub fn canonical_resource(server: &Url) -> Url {
    let mut u = server.clone();
    u.set_fragment(None);
    u
}

/// Whether metadata naming `resource` may describe the server at `server`:
/// the same origin, and `resource`'s path the server's own or a parent of
/// it on a `/` boundary (the root metadata of a server names its origin).
pub fn resource_matches(resource: &str, server: &Url) -> bool {
    let Ok(r) = Url::parse(resource) else {
        return false;
    };
    if r.origin() != server.origin() || r.fragment().is_some() {
        return false;
    }
    let (rp, sp) = (path_of(&r), path_of(server));
    rp.is_empty() || sp == rp || sp.starts_with(&format!("{rp}/"))
}

/// Whether `issuer` names the authorization server at `url` (RFC 8414
/// §3.3), a trailing `/` aside.
pub fn issuer_matches(issuer: &str, url: &Url) -> bool {
    issuer.trim_end_matches('/') == url.as_str().trim_end_matches('/')
}

/// Whether two issuer identifiers are the same (RFC 8414 compares them
/// exactly; a trailing `/` aside).
pub fn same_issuer(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// Whether `url` may carry a token or a credential: https, or http to
/// this machine.
pub fn secure(url: &Url) -> bool {
    url.scheme() == "https"
        || (url.scheme() == "http" && bindery_spec::checks::loopback_url(url.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    fn strs(v: Vec<Url>) -> Vec<String> {
        v.into_iter().map(String::from).collect()
    }

    #[test]
    fn resource_metadata_is_looked_for_path_inserted_then_at_the_root() {
        assert_eq!(
            strs(resource_metadata_urls(&u(
                "https://h.example/public/mcp?x=1"
            ))),
            [
                "https://h.example/.well-known/oauth-protected-resource/public/mcp",
                "https://h.example/.well-known/oauth-protected-resource",
            ]
        );
        assert_eq!(
            strs(resource_metadata_urls(&u("https://h.example/"))),
            ["https://h.example/.well-known/oauth-protected-resource"]
        );
    }

    #[test]
    fn server_metadata_is_looked_for_in_the_specs_order() {
        assert_eq!(
            strs(server_metadata_urls(&u("https://auth.example/tenant1"))),
            [
                "https://auth.example/.well-known/oauth-authorization-server/tenant1",
                "https://auth.example/.well-known/openid-configuration/tenant1",
                "https://auth.example/tenant1/.well-known/openid-configuration",
            ]
        );
        assert_eq!(
            strs(server_metadata_urls(&u("https://auth.example"))),
            [
                "https://auth.example/.well-known/oauth-authorization-server",
                "https://auth.example/.well-known/openid-configuration",
            ]
        );
    }

    #[test]
    fn metadata_for_another_resource_does_not_match() {
        let server = u("https://mcp.example/v1/mcp");
        assert!(resource_matches("https://mcp.example/v1/mcp", &server));
        assert!(resource_matches("https://mcp.example/v1/mcp/", &server));
        assert!(resource_matches("https://mcp.example", &server));
        assert!(resource_matches("https://mcp.example/v1", &server));
        assert!(!resource_matches("https://mcp.example/v1/mc", &server));
        assert!(!resource_matches("https://evil.example.com/mcp", &server));
        assert!(!resource_matches("http://mcp.example/v1/mcp", &server));
        assert!(!resource_matches(
            "https://mcp.example:8443/v1/mcp",
            &server
        ));
        assert!(!resource_matches("not a url", &server));
    }

    #[test]
    fn tokens_go_over_https_or_to_this_machine() {
        assert!(secure(&u("https://a.example/token")));
        assert!(secure(&u("http://localhost:8080/token")));
        assert!(secure(&u("http://127.0.0.2/token")));
        assert!(secure(&u("http://[::1]:9/token")));
        assert!(!secure(&u("http://a.example/token")));
        assert!(!secure(&u("http://localhost.evil.example/token")));
        assert!(!secure(&u("ftp://localhost/token")));
    }

    #[test]
    fn a_server_without_metadata_has_the_default_endpoints() {
        let m = ServerMetadata::fallback(&u("http://localhost:9/mcp"));
        assert_eq!(m.token_endpoint, "http://localhost:9/token");
        assert_eq!(
            m.authorization_endpoint.as_deref(),
            Some("http://localhost:9/authorize")
        );
        assert!(m.takes("client_secret_basic") && !m.takes("client_secret_post"));
        assert!(issuer_matches(
            "https://a.example/t1/",
            &u("https://a.example/t1")
        ));
        assert!(!issuer_matches(
            "https://a.example/t2",
            &u("https://a.example/t1")
        ));
    }
}
