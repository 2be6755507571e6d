//! JSON-RPC 2.0 as MCP uses it: telling requests from notifications and
//! responses, and error objects that carry the session API's error code.

use serde_json::{json, Value};

use bindery_session::error::{ErrorKind, ServiceError};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// Server-defined: no valid owner token (the HTTP status is 401).
pub const UNAUTHORIZED: i64 = -32001;

/// One message a client posts.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification, or a response to a request of ours (we send none):
    /// either way nothing to answer.
    NoReply,
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.data {
            e["data"] = d.clone();
        }
        e
    }
}

/// A session API error as a JSON-RPC error: `data` holds the REST code,
/// status and parameter names, so a client can tell `unknown_params` from
/// `forbidden_params` exactly as a REST client would.
impl From<ServiceError> for RpcError {
    fn from(e: ServiceError) -> Self {
        let code = match e.kind {
            ErrorKind::Unauthorized => UNAUTHORIZED,
            ErrorKind::Internal => INTERNAL_ERROR,
            _ => INVALID_PARAMS,
        };
        let status = crate::status::of(e.kind).as_u16();
        let mut data = json!({"error": e.code, "status": status});
        if !e.params.is_empty() || e.code.refuses_values() {
            data["params"] = json!(e.params);
        }
        // A used-up budget's name, limit and use, as the 429 carries them.
        for (k, v) in e.extra.into_iter().flat_map(|m| *m) {
            data[k] = v;
        }
        RpcError {
            code,
            message: e.message,
            data: Some(data),
        }
    }
}

/// Tell what `v` is; a malformed message is an `INVALID_REQUEST` error
/// (with the id, when one could be read).
pub fn classify(v: Value) -> Result<Incoming, (Value, RpcError)> {
    let Value::Object(mut m) = v else {
        return Err((
            Value::Null,
            RpcError::new(INVALID_REQUEST, "a JSON-RPC message is a JSON object"),
        ));
    };
    let id = m.remove("id");
    let err_id = id.clone().filter(is_valid_id).unwrap_or(Value::Null);
    let bad = |why: &str| Err((err_id.clone(), RpcError::new(INVALID_REQUEST, why)));
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return bad("`jsonrpc` must be \"2.0\"");
    }
    let Some(method) = m.get("method") else {
        // A response (`result` or `error` with the id of our request).
        if m.contains_key("result") || m.contains_key("error") {
            if !id.as_ref().is_some_and(is_valid_id) {
                return bad("a response carries the `id` of the request it answers");
            }
            if !m
                .get("result")
                .or(m.get("error"))
                .is_some_and(Value::is_object)
            {
                return bad("a response's `result` or `error` is an object");
            }
            return Ok(Incoming::NoReply);
        }
        return bad("neither a request, a notification nor a response");
    };
    let Some(method) = method.as_str().map(str::to_string) else {
        return bad("`method` must be a string");
    };
    let params = m.remove("params");
    if params.as_ref().is_some_and(|p| !p.is_object()) {
        return bad("`params` must be an object (or left out)");
    }
    let params = params.unwrap_or(Value::Null);
    match id {
        None => Ok(Incoming::NoReply),
        Some(id) if is_valid_id(&id) => Ok(Incoming::Request { id, method, params }),
        // MCP forbids null ids (and JSON-RPC any other type).
        Some(_) => bad("`id` must be a string or an integer"),
    }
}

/// A string, or an integer of 64 bits with a sign (as the document says).
fn is_valid_id(v: &Value) -> bool {
    v.is_string() || v.is_i64()
}

/// The response to request `id`.
pub fn response(id: Value, outcome: Result<Value, RpcError>) -> Value {
    match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_session::error::Code;

    #[test]
    fn requests_notifications_and_responses() {
        assert_eq!(
            classify(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})),
            Ok(Incoming::Request {
                id: json!(1),
                method: "ping".into(),
                params: Value::Null
            })
        );
        assert_eq!(
            classify(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
            Ok(Incoming::NoReply)
        );
        assert_eq!(
            classify(json!({"jsonrpc": "2.0", "id": "a", "result": {}})),
            Ok(Incoming::NoReply)
        );
        assert_eq!(
            classify(json!({"jsonrpc": "2.0", "id": 9, "error": {"code": 1}})),
            Ok(Incoming::NoReply)
        );
        for (bad, id) in [
            (json!([1]), Value::Null),
            (json!({"id": 3, "method": "ping"}), json!(3)),
            (
                json!({"jsonrpc": "2.0", "id": "x", "method": 7}),
                json!("x"),
            ),
            (
                json!({"jsonrpc": "2.0", "id": null, "method": "ping"}),
                Value::Null,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}),
                Value::Null,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 2, "method": "ping", "params": [1]}),
                json!(2),
            ),
            (json!({"jsonrpc": "2.0", "id": 4}), json!(4)),
            (json!({"jsonrpc": "2.0", "error": {}}), Value::Null),
            (
                json!({"jsonrpc": "2.0", "id": {}, "error": {}}),
                Value::Null,
            ),
            (json!({"jsonrpc": "2.0", "id": 5, "result": 3}), json!(5)),
            (
                json!({"jsonrpc": "2.0", "id": null, "error": {}}),
                Value::Null,
            ),
            (
                json!({"jsonrpc": "2.0", "id": 6, "method": "ping", "params": null}),
                json!(6),
            ),
        ] {
            let (got_id, e) = classify(bad.clone()).unwrap_err();
            assert_eq!(e.code, INVALID_REQUEST, "{bad}");
            assert_eq!(got_id, id, "{bad}");
        }
    }

    #[test]
    fn service_errors_keep_their_rest_code() {
        let e = RpcError::from(ServiceError {
            extra: None,
            kind: ErrorKind::Invalid,
            code: Code::UnknownParams,
            message: "no".into(),
            params: vec!["tennant".into()],
        });
        assert_eq!(e.code, INVALID_PARAMS);
        assert_eq!(
            e.data,
            Some(json!({"error": "unknown_params", "status": 422, "params": ["tennant"]}))
        );
        let e = RpcError::from(ServiceError::new(
            ErrorKind::Unauthorized,
            Code::Unauthorized,
            "no token",
        ));
        assert_eq!(e.code, UNAUTHORIZED);
        assert_eq!(
            e.data,
            Some(json!({"error": "unauthorized", "status": 401}))
        );
        let e = RpcError::from(ServiceError::new(
            ErrorKind::Internal,
            Code::Internal,
            "store",
        ));
        assert_eq!(e.code, INTERNAL_ERROR);
        assert_eq!(
            response(json!(9), Err(e))["error"]["data"]["error"],
            "internal"
        );
    }
}
