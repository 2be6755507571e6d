//! Share links: a session handed to someone else, read-only or
//! read-write, by its owner or its end user; each revocable on its own
//! (its open event streams ending at once), all with the session's tokens;
//! a share's token shown once and never listed; both decisions on record.

use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use serde_json::{json, Value};

use crate::harness::*;
use bindery_tests::fixtures::clerk::{self, waiting};
use bindery_tests::fixtures::session::{id_of, token_of};

/// A clerk server in a fresh directory.
async fn clerk_server() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let agent = clerk::agent(dir.path(), MODEL_URL, "");
    let server = Server::start(std::slice::from_ref(&agent), dir.path(), clerk::script).await;
    (dir, server)
}

/// An idle clerk session of the owner.
async fn idle(api: &Api) -> String {
    let r = api
        .call(
            "POST",
            "/v1/sessions",
            Some(OWNER),
            Some(&json!({"agent": "clerk", "params": {"tenant": "acme"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    id_of(&r)
}

/// Share session `id` as `by`, in `mode`: the answer, 201 or not.
async fn share_as(api: &Api, id: &str, by: &str, body: Value) -> Reply {
    api.call(
        "POST",
        &format!("/v1/sessions/{id}/shares"),
        Some(by),
        Some(&body),
    )
    .await
}

/// Share session `id` as the owner: the share's id and token.
async fn share(api: &Api, id: &str, mode: &str) -> (String, String) {
    let r = share_as(api, id, OWNER, json!({"mode": mode})).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let field = |k: &str| r.json[k].as_str().unwrap().to_string();
    (field("id"), field("token"))
}

async fn revoke(api: &Api, id: &str, share: &str) -> Reply {
    api.call(
        "DELETE",
        &format!("/v1/sessions/{id}/shares/{share}"),
        Some(OWNER),
        None,
    )
    .await
}

/// The status and `error` of a refusal, and whether its message says `what`.
fn refused(r: &Reply, status: u16, code: &str, what: &str) {
    assert_eq!(r.status, status, "{}", r.text);
    assert_eq!(r.json["error"], code, "{}", r.text);
    let message = r.json["message"].as_str().unwrap_or_default();
    assert!(message.contains(what), "{message:?} should say {what:?}");
}

/// An open event stream's body.
struct Stream(Body);

impl Stream {
    async fn open(api: &Api, id: &str, token: &str) -> Stream {
        let r = api
            .open(&format!("/v1/sessions/{id}/events"), Some(token))
            .await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        Stream(r.into_body())
    }

    /// The next data the stream sends besides keep-alives; `None` once it
    /// has ended. Waits at most 20 s (a stream that neither sends nor ends
    /// fails the test).
    async fn next(&mut self) -> Option<String> {
        let body = &mut self.0;
        let read = async {
            loop {
                let frame = std::future::poll_fn(|cx| {
                    http_body::Body::poll_frame(Pin::new(&mut *body), cx)
                })
                .await?;
                let data = frame.expect("an event stream does not fail").into_data();
                match data {
                    Ok(bytes) if bytes.as_ref() != b":\n\n" => {
                        return Some(String::from_utf8_lossy(&bytes).into_owned())
                    }
                    _ => continue,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("the stream neither sent nor ended")
    }

    /// Read until an event of `kind` comes (the stream still open).
    async fn until(&mut self, kind: &str) {
        let marker = format!("event: {kind}\n");
        loop {
            let data = self.next().await.expect("the stream is open");
            if data.contains(&marker) {
                return;
            }
        }
    }
}

/// The audit log's records, each as `(action, actor, details)`.
async fn audit(api: &Api) -> Vec<(String, Value, Value)> {
    let r = api.call("GET", "/v1/audit", Some(OWNER), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let action = v["action"].as_str().unwrap().to_string();
            (action, v["actor"].clone(), v["details"].clone())
        })
        .collect()
}

#[tokio::test]
async fn a_read_share_reads_and_streams_and_does_nothing_else() {
    let (_dir, s) = clerk_server().await;
    let api = &s.api;
    let r = waiting(api, "delete invoice 7").await;
    let (id, continuation) = (id_of(&r), token_of(&r));
    let r = share_as(
        api,
        &id,
        OWNER,
        json!({"mode": "read", "note": "for the auditors"}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let (share_id, token) = (
        r.json["id"].as_str().unwrap().to_string(),
        r.json["token"].as_str().unwrap().to_string(),
    );
    assert!(share_id.starts_with("sh_"), "{share_id}");
    assert!(
        token.starts_with("bsh_") && token.len() == 4 + 64,
        "{token}"
    );
    assert_eq!(r.json["mode"], "read");
    assert_eq!(r.json["shared_by"], "owner");
    assert!(r.json["created_at"].is_i64(), "{}", r.text);
    assert_eq!(
        r.json["link"],
        format!("/#session={id}&token={token}&mode=read")
    );

    // It reads the conversation and what waits, never a value or an
    // answer's token.
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(&token), None)
        .await;
    assert_eq!(view.status, 200, "{}", view.text);
    assert_eq!(view.json["status"], "waiting_external");
    assert!(!view.text.contains("acme"), "{}", view.text);
    assert!(!view.text.contains("ct_"), "{}", view.text);
    assert_eq!(view.json["pending"].as_array().unwrap().len(), 1);
    // It follows the events.
    let mut stream = Stream::open(api, &id, &token).await;
    stream.until("run_started").await;

    // Nothing else.
    let may = "a read-only share link may read the session, its events and its pending items";
    let on = |p: &str| format!("/v1/sessions/{id}{p}");
    for (method, path, body) in [
        ("POST", on("/messages"), Some(json!({"prompt": "count"}))),
        ("POST", on("/cancel"), None),
        ("POST", on("/resume"), None),
        ("POST", on("/fork"), None),
        (
            "PUT",
            on("/params"),
            Some(json!({"params": {"tenant": "x"}})),
        ),
        ("DELETE", on("/token"), None),
        ("POST", on("/shares"), Some(json!({"mode": "write"}))),
        ("GET", on("/shares"), None),
        ("DELETE", on(&format!("/shares/{share_id}")), None),
    ] {
        let r = api.call(method, &path, Some(&token), body.as_ref()).await;
        refused(&r, 403, "forbidden", may);
    }
    let r = api
        .call(
            "POST",
            &format!("/v1/continuations/{continuation}"),
            Some(&token),
            Some(&json!({"approve": true})),
        )
        .await;
    refused(&r, 403, "forbidden", "only the session's owner may answer");
    // Nor `/mcp`, its session named or not.
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    for headers in [vec![], vec![("bindery-session-id", id.as_str())]] {
        let r = api
            .call_with("POST", "/mcp", Some(&token), &headers, Some(&list))
            .await
            .reply;
        assert_eq!(r.status, 401, "{}", r.text);
    }
    // Routes about no session know no share.
    for path in ["/v1/sessions", "/v1/audit", "/v1/agents", "/v1/approvals"] {
        let r = api.call("GET", path, Some(&token), None).await;
        assert_eq!(r.status, 401, "{path}: {}", r.text);
    }
    assert_eq!(clerk::runs(_dir.path()), 0, "nothing was approved");
    assert_eq!(
        api.call("GET", &on(""), Some(OWNER), None).await.json["status"],
        "waiting_external"
    );
}

#[tokio::test]
async fn a_write_share_posts_and_cancels_but_answers_sets_and_shares_nothing() {
    let (_dir, s) = clerk_server().await;
    let api = &s.api;
    let id = idle(api).await;
    let (share_id, token) = share(api, &id, "write").await;
    let on = |p: &str| format!("/v1/sessions/{id}{p}");

    let r = api
        .call(
            "POST",
            &on("/messages?wait=true"),
            Some(&token),
            Some(&json!({"prompt": "count the invoices"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert!(
        r.json["params"].as_object().is_none_or(|p| p.is_empty()),
        "{}",
        r.text
    );
    let r = api.call("POST", &on("/cancel"), Some(&token), None).await;
    refused(&r, 409, "not_running", "");

    // A message that carries values is refused, and so is PUT params.
    let r = api
        .call(
            "POST",
            &on("/messages"),
            Some(&token),
            Some(&json!({"prompt": "count", "params": {"tenant": "globex"}})),
        )
        .await;
    refused(
        &r,
        403,
        "forbidden_params",
        "a share link cannot set parameters",
    );
    let r = api
        .call(
            "PUT",
            &on("/params"),
            Some(&token),
            Some(&json!({"params": {"tenant": "x"}})),
        )
        .await;
    refused(
        &r,
        403,
        "forbidden_params",
        "a share link cannot set parameters",
    );

    // What waits for a person is the owner's to answer.
    let r = api
        .call(
            "POST",
            &on("/messages?wait=true"),
            Some(&token),
            Some(&json!({"prompt": "delete invoice 7"})),
        )
        .await;
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    assert!(!r.text.contains("ct_"), "{}", r.text);
    let owners = api.call("GET", &on(""), Some(OWNER), None).await;
    let r = api
        .call(
            "POST",
            &format!("/v1/continuations/{}", token_of(&owners)),
            Some(&token),
            Some(&json!({"approve": true})),
        )
        .await;
    refused(&r, 403, "forbidden", "only the session's owner may answer");
    assert_eq!(clerk::runs(_dir.path()), 0);
    let may = "a share link may read the session and its events, post messages and cancel a run";
    for (method, path, body) in [
        ("POST", on("/resume"), None),
        ("POST", on("/fork"), None),
        ("DELETE", on("/token"), None),
        ("POST", on("/shares"), Some(json!({"mode": "read"}))),
        ("DELETE", on(&format!("/shares/{share_id}")), None),
    ] {
        let r = api.call(method, &path, Some(&token), body.as_ref()).await;
        refused(&r, 403, "forbidden", may);
    }

    // On record: the owner shared, the share posted, its run's call is the
    // share's.
    let share_actor = json!({"kind": "share", "session": id, "share": share_id});
    let records = audit(api).await;
    let shared: Vec<_> = records.iter().filter(|r| r.0 == "session_shared").collect();
    assert_eq!(shared.len(), 1);
    assert_eq!(shared[0].1, json!({"kind": "owner"}));
    assert_eq!(shared[0].2, json!({"share": share_id, "mode": "write"}));
    let posted: Vec<_> = records.iter().filter(|r| r.0 == "message_posted").collect();
    assert_eq!(posted.len(), 2, "{records:?}");
    assert!(posted.iter().all(|r| r.1 == share_actor), "{posted:?}");
    let called = records.iter().find(|r| r.0 == "tool_called").unwrap();
    assert_eq!(called.1["on_behalf_of"], share_actor);
    assert!(!format!("{records:?}").contains("bsh_"));
}

#[tokio::test]
async fn a_share_opens_its_own_session_only() {
    let (_dir, s) = clerk_server().await;
    let api = &s.api;
    let (a, b) = (idle(api).await, idle(api).await);
    for mode in ["read", "write"] {
        let (_, token) = share(api, &a, mode).await;
        for (method, path) in [
            ("GET", format!("/v1/sessions/{b}")),
            ("GET", format!("/v1/sessions/{b}/events")),
            ("POST", format!("/v1/sessions/{b}/messages")),
            ("POST", format!("/v1/sessions/{b}/cancel")),
            ("GET", "/v1/sessions/nope".to_string()),
        ] {
            let body = json!({"prompt": "count"});
            let r = api.call(method, &path, Some(&token), Some(&body)).await;
            refused(&r, 401, "unauthorized", "the token is not valid here");
        }
        let r = api
            .call("GET", &format!("/v1/sessions/{a}"), Some(&token), None)
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
}

#[tokio::test]
async fn a_revoked_share_is_refused_at_once_and_its_open_stream_ends() {
    let (_dir, s) = clerk_server().await;
    let api = &s.api;
    let id = idle(api).await;
    let (one, one_token) = share(api, &id, "read").await;
    let (two, two_token) = share(api, &id, "write").await;
    let on = |p: &str| format!("/v1/sessions/{id}{p}");
    let mut first = Stream::open(api, &id, &one_token).await;
    let mut second = Stream::open(api, &id, &two_token).await;
    let mut owners = Stream::open(api, &id, OWNER).await;

    let r = revoke(api, &id, &one).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["id"], one);
    assert_eq!(r.json["mode"], "read");
    let revoked_at = r.json["revoked_at"].as_i64().expect("revoked_at");
    assert_eq!(first.next().await, None, "the revoked share's stream ended");
    let r = api.call("GET", &on(""), Some(&one_token), None).await;
    refused(&r, 401, "unauthorized", "the token is not valid here");
    // Again: the same answer, nothing more on record.
    let r = revoke(api, &id, &one).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["revoked_at"], revoked_at);
    let r = revoke(api, &id, "sh_0000000000000000").await;
    refused(&r, 404, "not_found", "has no share sh_0000000000000000");
    let keys: Vec<&String> = r.json.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["error", "message"],
        "the API's error shape: {}",
        r.text
    );

    // The other share, and the owner, go on.
    let r = api
        .call(
            "POST",
            &on("/messages"),
            Some(&two_token),
            Some(&json!({"prompt": "count"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    second.until("run_finished").await;
    owners.until("run_finished").await;

    // The list: both, the first revoked; never a token or a digest.
    let r = api.call("GET", &on("/shares"), Some(OWNER), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let listed = r.json["shares"].as_array().unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["id"], one);
    assert_eq!(listed[0]["revoked_at"], revoked_at);
    assert_eq!(listed[1]["id"], two);
    assert!(listed[1].get("revoked_at").is_none());
    assert_eq!(listed[1]["shared_by"], "owner");
    for secret in ["token", "digest", "bsh_", &one_token[4..], &two_token[4..]] {
        assert!(!r.text.contains(secret), "{secret} in {}", r.text);
    }

    // Revoking the session's tokens revokes every share, and ends its
    // streams; the owner's stays.
    let r = api.call("DELETE", &on("/token"), Some(OWNER), None).await;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(second.next().await, None);
    let r = api.call("GET", &on(""), Some(&two_token), None).await;
    refused(&r, 401, "unauthorized", "the token is not valid here");
    let r = api.call("GET", &on("/shares"), Some(OWNER), None).await;
    assert!(r.json["shares"][1]["revoked_at"].is_i64(), "{}", r.text);
    let r = api
        .call(
            "POST",
            &on("/messages"),
            Some(OWNER),
            Some(&json!({"prompt": "count"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    owners.until("run_finished").await;

    // On record before each took effect, once each.
    let what: Vec<(String, Value)> = audit(api)
        .await
        .into_iter()
        .filter(|r| r.0.contains("share") || r.0.contains("token"))
        .map(|r| (r.0, r.2))
        .collect();
    assert_eq!(
        what,
        [
            (
                "session_shared".into(),
                json!({"share": one, "mode": "read"})
            ),
            (
                "session_shared".into(),
                json!({"share": two, "mode": "write"})
            ),
            ("share_revoked".into(), json!({"share": one})),
            ("share_revoked".into(), json!({"share": two})),
            ("session_token_revoked".into(), json!({})),
        ]
    );
}

#[tokio::test]
async fn an_end_user_shares_their_own_session_and_no_one_elses() {
    use bindery_identity::testkeys::TestIssuer;
    const AUD: &str = "bindery-chat";
    let dir = tempfile::tempdir().unwrap();
    let agent = clerk::agent(dir.path(), MODEL_URL, "");
    let issuer = TestIssuer::start().await;
    let config = bindery_identity::IdentityConfig::new(&issuer.url, vec![AUD.into()]).unwrap();
    let s = Server::identified(&[agent], dir.path(), clerk::script, config).await;
    let api = &s.api;
    let (alice, bob) = (
        issuer.token("alice", AUD, json!({})),
        issuer.token("bob", AUD, json!({})),
    );
    let r = api
        .call(
            "POST",
            "/v1/sessions",
            Some(&alice),
            Some(&json!({"agent": "clerk", "params": {"tenant": "acme"}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = id_of(&r);
    let r = share_as(api, &id, &alice, json!({"mode": "read"})).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["shared_by"], "user:alice");
    let (share_id, token) = (
        r.json["id"].as_str().unwrap().to_string(),
        r.json["token"].as_str().unwrap().to_string(),
    );
    let r = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(&token), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // A write share's run is counted as Alice's, the session's person.
    let r = share_as(api, &id, &alice, json!({"mode": "write"})).await;
    let writer = r.json["token"].as_str().unwrap().to_string();
    let r = api
        .call(
            "POST",
            &format!("/v1/sessions/{id}/messages?wait=true"),
            Some(&writer),
            Some(&json!({"prompt": "count the invoices"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let usage = api
        .call("GET", "/v1/usage?group_by=user", Some(OWNER), None)
        .await;
    let rows = usage.json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{}", usage.text);
    assert_eq!(rows[0]["key"], "alice", "{}", usage.text);
    assert_eq!(rows[0]["model_requests"], 2, "{}", usage.text);

    // Bob cannot share, list or revoke what is Alice's: as if there were
    // no such session.
    let r = share_as(api, &id, &bob, json!({"mode": "write"})).await;
    refused(&r, 404, "not_found", &format!("no session {id}"));
    for (method, path) in [
        ("GET", format!("/v1/sessions/{id}/shares")),
        ("DELETE", format!("/v1/sessions/{id}/shares/{share_id}")),
    ] {
        let r = api.call(method, &path, Some(&bob), None).await;
        refused(&r, 404, "not_found", &format!("no session {id}"));
    }
    // Alice lists and revokes hers.
    let r = api
        .call(
            "GET",
            &format!("/v1/sessions/{id}/shares"),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(r.json["shares"][0]["id"], share_id, "{}", r.text);
    let r = api
        .call(
            "DELETE",
            &format!("/v1/sessions/{id}/shares/{share_id}"),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let records = audit(api).await;
    let alice_actor = json!({"kind": "end-user", "subject": "alice"});
    for action in ["session_shared", "share_revoked"] {
        let r = records.iter().find(|r| r.0 == action).unwrap();
        assert_eq!(r.1, alice_actor, "{action}");
    }
}

#[tokio::test]
async fn a_session_has_at_most_fifty_live_shares_and_a_share_says_what_it_is() {
    let (_dir, s) = clerk_server().await;
    let api = &s.api;
    let id = idle(api).await;
    for (body, what) in [
        (json!({}), "`mode` is required"),
        (json!({"mode": "admin"}), "unknown variant `admin`"),
        (
            json!({"mode": "read", "expires": 5}),
            "unknown field `expires`",
        ),
        (
            json!({"mode": "read", "note": "x".repeat(201)}),
            "at most 200",
        ),
        (
            json!({"mode": "read", "note": "a\u{1b}[2Jb"}),
            "control character",
        ),
    ] {
        let r = share_as(api, &id, OWNER, body).await;
        refused(&r, 400, "bad_request", what);
    }
    let r = share_as(api, &id, OWNER, json!({"mode": "read"})).await;
    let first = r.json["id"].as_str().unwrap().to_string();
    for _ in 1..50 {
        share(api, &id, "read").await;
    }
    let r = share_as(api, &id, OWNER, json!({"mode": "write"})).await;
    refused(&r, 409, "too_many_shares", "revoke one");
    assert_eq!(revoke(api, &id, &first).await.status, 200);
    share(api, &id, "write").await;
    let r = api
        .call("GET", "/v1/sessions/nope/shares", Some(OWNER), None)
        .await;
    refused(&r, 404, "not_found", "no session nope");
}
