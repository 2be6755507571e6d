//! A server's `WWW-Authenticate` challenge (RFC 9110 §11.6.1), as the MCP
//! authorization spec reads a Bearer one: where the protected-resource
//! metadata is (`resource_metadata`, RFC 9728 §5.1), which scopes the
//! request needs (`scope`), and why it failed (`error`). Pure.

/// What a Bearer challenge says; a header without one says nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bearer {
    pub resource_metadata: Option<String>,
    pub scope: Option<String>,
    pub error: Option<String>,
}

impl Bearer {
    /// The challenge's scopes, one word each.
    pub fn scopes(&self) -> Vec<String> {
        self.scope
            .as_deref()
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    }

    pub fn insufficient_scope(&self) -> bool {
        self.error.as_deref() == Some("insufficient_scope")
    }
}

/// The Bearer challenge of a `WWW-Authenticate` value (which may hold
/// several challenges); parameter names are case-insensitive.
pub fn bearer(header: &str) -> Bearer {
    let mut out = Bearer::default();
    for (scheme, params) in challenges(header) {
        if !scheme.eq_ignore_ascii_case("bearer") {
            continue;
        }
        for (name, value) in params {
            let slot = match name.to_ascii_lowercase().as_str() {
                "resource_metadata" => &mut out.resource_metadata,
                "scope" => &mut out.scope,
                "error" => &mut out.error,
                _ => continue,
            };
            slot.get_or_insert(value);
        }
        break;
    }
    out
}

/// Each challenge: its scheme and its `name=value` parameters (a
/// token68 is skipped).
fn challenges(header: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out: Vec<(String, Vec<(String, String)>)> = Vec::new();
    let mut rest = header;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return out;
        }
        let (word, after) = token(rest);
        if word.is_empty() {
            // Not a token: skip one character rather than loop.
            rest = &rest[rest.chars().next().map_or(1, char::len_utf8)..];
            continue;
        }
        let after_ws = after.trim_start_matches([' ', '\t']);
        if let Some(value_part) = after_ws.strip_prefix('=') {
            // A parameter of the current challenge (or a token68's `=`).
            let value_part = value_part.trim_start_matches([' ', '\t']);
            let (value, next) = if let Some(q) = value_part.strip_prefix('"') {
                quoted(q)
            } else {
                // Lenient: an unquoted URL is not a token, but servers send one.
                let end = value_part
                    .find(|c: char| c == ',' || c.is_whitespace())
                    .unwrap_or(value_part.len());
                (value_part[..end].to_string(), &value_part[end..])
            };
            if let Some((_, params)) = out.last_mut() {
                params.push((word.to_string(), value));
            }
            rest = next;
        } else {
            out.push((word.to_string(), Vec::new()));
            rest = after;
        }
    }
}

fn token(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~/".contains(c)))
        .unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// A quoted string's value (after its opening quote) and what follows it.
fn quoted(s: &str) -> (String, &str) {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (value, &s[i + 1..]),
            '\\' => {
                if let Some((_, n)) = chars.next() {
                    value.push(n);
                }
            }
            c => value.push(c),
        }
    }
    (value, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_gives_its_metadata_scope_and_error() {
        let b = bearer(
            r#"Bearer error="insufficient_scope", scope="mcp:basic mcp:write", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp""#,
        );
        assert_eq!(
            b.resource_metadata.as_deref(),
            Some("https://mcp.example.com/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(b.scopes(), ["mcp:basic", "mcp:write"]);
        assert!(b.insufficient_scope());
    }

    #[test]
    fn other_schemes_tokens_and_escapes_are_read_right() {
        let b = bearer(
            r#"Basic realm="x, y", Bearer realm=api, SCOPE="a \"b\"", Resource_Metadata=https://h/p"#,
        );
        assert_eq!(b.scope.as_deref(), Some(r#"a "b""#));
        assert_eq!(b.resource_metadata.as_deref(), Some("https://h/p"));
        assert_eq!(b.error, None);
        // The first value of a parameter given twice is kept.
        assert_eq!(
            bearer(r#"Bearer scope="a", scope="b""#).scope.as_deref(),
            Some("a")
        );
    }

    #[test]
    fn a_header_without_a_bearer_challenge_says_nothing() {
        assert_eq!(bearer(r#"Basic realm="api""#), Bearer::default());
        assert_eq!(bearer(""), Bearer::default());
        assert_eq!(bearer("Bearer"), Bearer::default());
        assert_eq!(
            bearer(r#"Bearer scope="unterminated"#).scope.as_deref(),
            Some("unterminated")
        );
        assert_eq!(bearer("=,=\"é"), Bearer::default());
    }
}
