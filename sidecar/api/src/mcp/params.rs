//! Parameter values of a `tools/call`: `Agents-Param-<name>` request
//! headers (strings: MCP clients are usually configured with static
//! headers), overlaid by `_meta."agents-exe/params"` (any JSON).
//!
//! Header names are case-insensitive and proxies often drop names with
//! underscores, so the part after the prefix is lower-cased and `-` read
//! as `_`: `Agents-Param-Billing-Token` sets `billing_token`. Values are
//! never logged nor echoed; errors name parameters only.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use serde_json::Value;

use bindery_session::error::{Code, ErrorKind, ServiceError};

const PREFIX: &str = "agents-param-";
/// Where `tools/call` carries values in its `_meta`.
pub const META_KEY: &str = "agents-exe/params";

/// The parameter name a header sets, if it is an `Agents-Param-*` header.
pub fn param_name(header: &str) -> Option<String> {
    let lower = header.to_ascii_lowercase();
    let rest = lower.strip_prefix(PREFIX)?;
    Some(rest.replace('-', "_"))
}

fn invalid(name: &str, why: &str) -> ServiceError {
    ServiceError {
        extra: None,
        kind: ErrorKind::Invalid,
        code: Code::InvalidParams,
        message: format!("{name}: {why}"),
        params: vec![name.to_string()],
    }
}

/// Values from `Agents-Param-*` headers, as JSON strings.
pub fn from_headers(headers: &HeaderMap) -> Result<BTreeMap<String, Value>, ServiceError> {
    let mut out = BTreeMap::new();
    for (header, value) in headers {
        let Some(name) = param_name(header.as_str()) else {
            continue;
        };
        let Ok(text) = std::str::from_utf8(value.as_bytes()) else {
            return Err(invalid(
                &name,
                "an Agents-Param header value must be UTF-8 text; send other values in _meta \"agents-exe/params\"",
            ));
        };
        if out
            .insert(name.clone(), Value::String(text.to_string()))
            .is_some()
        {
            return Err(invalid(
                &name,
                "given by more than one Agents-Param header; send it once",
            ));
        }
    }
    Ok(out)
}

/// `headers` overlaid with the `_meta` of a `tools/call` (`meta` is the
/// whole `_meta` object, if any): a name in both takes `_meta`'s value.
pub fn merge(
    mut headers: BTreeMap<String, Value>,
    meta: Option<&Value>,
) -> Result<BTreeMap<String, Value>, ServiceError> {
    let Some(given) = meta.and_then(|m| m.get(META_KEY)) else {
        return Ok(headers);
    };
    let Value::Object(given) = given else {
        return Err(ServiceError::bad_request(format!(
            "_meta \"{META_KEY}\" must be an object: parameter name → value"
        )));
    };
    headers.extend(given.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderName, HeaderValue};
    use serde_json::json;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn header_names_map_to_parameter_names() {
        assert_eq!(param_name("Agents-Param-tenant").as_deref(), Some("tenant"));
        assert_eq!(
            param_name("AGENTS-PARAM-Billing-Token").as_deref(),
            Some("billing_token")
        );
        assert_eq!(
            param_name("agents-param-billing_token").as_deref(),
            Some("billing_token")
        );
        assert_eq!(param_name("Agents-Params-x"), None);
        assert_eq!(param_name("authorization"), None);
    }

    #[test]
    fn headers_give_strings_and_meta_wins_by_name() {
        let h = headers(&[
            ("Agents-Param-Tenant", b"acme"),
            ("Agents-Param-Billing-Token", b"t0k"),
            ("Authorization", b"Bearer x"),
        ]);
        let from = from_headers(&h).unwrap();
        assert_eq!(
            Value::Object(from.clone().into_iter().collect()),
            json!({"tenant": "acme", "billing_token": "t0k"})
        );
        let merged = merge(
            from.clone(),
            Some(
                &json!({"agents-exe/params": {"tenant": "globex", "limit": 3}, "progressToken": 1}),
            ),
        )
        .unwrap();
        assert_eq!(
            Value::Object(merged.into_iter().collect()),
            json!({"tenant": "globex", "billing_token": "t0k", "limit": 3})
        );
        assert_eq!(merge(from.clone(), None).unwrap(), from);
        assert_eq!(
            merge(from.clone(), Some(&json!({"other": 1}))).unwrap(),
            from
        );
        let e = merge(from, Some(&json!({"agents-exe/params": ["tenant"]}))).unwrap_err();
        assert_eq!((e.kind, e.code), (ErrorKind::BadRequest, Code::BadRequest));
    }

    #[test]
    fn a_name_twice_or_a_binary_value_is_invalid_without_the_value() {
        let twice = headers(&[
            ("Agents-Param-billing_token", b"one-secret"),
            ("Agents-Param-Billing-Token", b"two-secret"),
        ]);
        let e = from_headers(&twice).unwrap_err();
        assert_eq!((e.kind, e.code), (ErrorKind::Invalid, Code::InvalidParams));
        assert_eq!(e.params, ["billing_token"]);
        assert!(!e.message.contains("secret"), "{}", e.message);
        let utf8 = headers(&[("Agents-Param-tenant", "café".as_bytes())]);
        assert_eq!(from_headers(&utf8).unwrap()["tenant"], "café");
        let binary = headers(&[("Agents-Param-tenant", b"caf\xe9")]);
        let e = from_headers(&binary).unwrap_err();
        assert_eq!(
            (e.code, e.params.clone()),
            (Code::InvalidParams, vec!["tenant".to_string()])
        );
    }
}
