//! Requests about a session reach the replica that holds it: two real
//! servers on one PostgreSQL database, B holding a session's secret value
//! (it was created there), a client reaching A. The view, an `/mcp` call
//! that names the session and the chat page's requests are answered by B;
//! on the embedded SQLite store nothing is forwarded and a request costs
//! the store what it always did.

use std::collections::BTreeMap;

use crate::common::*;
use bindery_tests::sidecar::{Api, Reply};
use serde_json::{json, Value};

#[cfg(feature = "postgres-tests")]
mod postgres;

/// A session created on `holder` with a session token, its secret value
/// held there: its id and token.
async fn held_on(holder: &Api) -> (String, String) {
    let r = create(
        holder,
        json!({"agent": "invoices", "params": valid_params(), "session_token": true}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    (
        r.json["session_id"].as_str().unwrap().to_string(),
        r.json["session_token"].as_str().unwrap().to_string(),
    )
}

/// `message` (one JSON-RPC message or a batch: protocol 2025-03-26, the
/// default) over `POST /mcp` with `token` and `headers`: the status and
/// the answer.
async fn mcp_post(
    api: &Api,
    token: &str,
    headers: &[(&str, &str)],
    message: Value,
) -> (u16, Value) {
    let mut req = api
        .http
        .post(format!("{}/mcp", api.base))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.body(message.to_string()).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// One JSON-RPC `tools/call` over `POST /mcp` with `token` and `headers`.
async fn mcp_call(api: &Api, token: &str, headers: &[(&str, &str)], params: Value) -> Value {
    let message = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params});
    let (status, answer) = mcp_post(api, token, headers, message).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

/// Every store operation a server counted, by name (`/metrics`).
async fn store_operations(api: &Api) -> BTreeMap<String, f64> {
    let m = api.call("GET", "/metrics", None, None).await;
    m.text
        .lines()
        .filter_map(|l| l.strip_prefix("bindery_store_operations_total{op=\""))
        .filter_map(|l| {
            let (op, rest) = l.split_once('"')?;
            Some((op.to_string(), rest.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// What `request` cost the store, operation by operation.
async fn cost<F: std::future::Future<Output = Reply>>(
    api: &Api,
    request: F,
) -> (Reply, BTreeMap<String, f64>) {
    let before = store_operations(api).await;
    let r = request.await;
    let after = store_operations(api).await;
    let spent = after
        .into_iter()
        .map(|(op, n)| (op.clone(), n - before.get(&op).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n != 0.0)
        .collect();
    (r, spent)
}

fn ops(list: &[(&str, f64)]) -> BTreeMap<String, f64> {
    list.iter().map(|(op, n)| (op.to_string(), *n)).collect()
}

/// On the embedded SQLite store nothing is held elsewhere: the requests
/// the forwarding layer looks at cost the store exactly what they cost
/// without it (one read of the session where the route reads it, one more
/// where a session token is checked), and no other server is looked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_nothing_is_forwarded_and_a_request_costs_what_it_did() {
    let w = World::new(tool_then_answer).await;
    // No heartbeat or sweep during the test.
    let (sidecar, api) = w.start(&["--runner-heartbeat", "1h", "--runner-lease", "2h"], &[]);
    let (id, token) = held_on(&api).await;
    let path = format!("/v1/sessions/{id}");

    let (r, spent) = cost(&api, api.call("GET", &path, Some(OWNER), None)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["secret_params"],
        json!(["billing_token"]),
        "{}",
        r.text
    );
    assert_eq!(
        spent,
        ops(&[("get", 1.0), ("session_totals", 1.0)]),
        "owner's view"
    );
    let (r, spent) = cost(&api, api.call("GET", &path, Some(&token), None)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        spent,
        ops(&[("get", 2.0), ("session_totals", 1.0)]),
        "token's view"
    );
    let (r, spent) = cost(&api, api.call("GET", &path, None, None)).await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(spent, ops(&[]), "no token");
    let (r, spent) = cost(
        &api,
        api.call("POST", &format!("{path}/cancel"), Some(OWNER), None),
    )
    .await;
    assert_eq!(error_of(&r).1, "not_running", "{}", r.text);
    let cancel = spent;
    let (r, spent) = cost(
        &api,
        api.call(
            "PUT",
            &format!("{path}/params"),
            Some(OWNER),
            Some(&json!({"params": {"tenant": "globex"}})),
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let put = spent;
    let (r, spent) = cost(
        &api,
        api.call(
            "POST",
            &format!("/v1/continuations/ct_{id}_{}", "0".repeat(64)),
            Some(OWNER),
            Some(&json!({"approve": true})),
        ),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text);
    let answer = spent;
    let (v, spent) = cost(&api, async {
        let v = mcp_call(
            &api,
            OWNER,
            &[],
            json!({"name": "ask_invoices", "arguments": {},
                   "_meta": {"bindery.dev/session_id": id}}),
        )
        .await;
        Reply {
            status: 200,
            text: v.to_string(),
            json: v,
        }
    })
    .await;
    assert_eq!(v.json["error"]["code"], -32602, "{}", v.text);
    assert_eq!(
        spent,
        ops(&[("get", 1.0)]),
        "an /mcp call naming the session"
    );
    let (r, spent) = cost(
        &api,
        api.call("DELETE", &format!("{path}/token"), Some(OWNER), None),
    )
    .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let revoke = spent;
    assert_eq!(
        [cancel, put, answer, revoke],
        [
            ops(&[("get", 3.0)]),
            // Setting values and revoking tokens are on the audit record.
            ops(&[
                ("append_audit", 1.0),
                ("append_event", 1.0),
                ("get", 2.0),
                ("session_totals", 1.0),
                ("update", 1.0)
            ]),
            ops(&[("get", 2.0)]),
            // Its event ends the revoked tokens' streams on every replica.
            ops(&[
                ("append_audit", 1.0),
                ("append_event", 1.0),
                ("get", 2.0),
                ("update", 1.0)
            ]),
        ],
        "cancel, PUT params, an unknown continuation, revoke"
    );
    let all = store_operations(&api).await;
    assert!(
        !all.contains_key("peer"),
        "another server was looked for: {all:?}"
    );
    assert!(!sidecar.logs().contains("forward"), "{}", sidecar.logs());
}
