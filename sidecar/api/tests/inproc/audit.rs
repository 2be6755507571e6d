//! The audit log through the API: a session with a tool call that waits
//! for approval, approved, read back from `GET /v1/audit` as a chain that
//! holds, naming who did what and with which credential, never its value.

use crate::harness::*;
use bindery_store::audit::verify::{verify, Anchor};
use bindery_tests::fixtures::clerk::{self, waiting};
use bindery_tests::fixtures::session::{answer, id_of, token_of};
use serde_json::{json, Value};

/// The records of `GET /v1/audit?…` and the head its headers name.
async fn audit(api: &Api, query: &str) -> (Vec<String>, i64, String) {
    let a = api
        .call_with("GET", &format!("/v1/audit{query}"), Some(OWNER), &[], None)
        .await;
    assert_eq!(a.reply.status, 200, "{}", a.reply.text);
    assert_eq!(a.content_type, "application/jsonl");
    let header = |name: &str| a.headers[name].to_str().unwrap().to_string();
    let seq = header("bindery-audit-head-seq").parse().unwrap();
    let lines = a.reply.text.lines().map(str::to_string).collect();
    (lines, seq, header("bindery-audit-head-hash"))
}

#[tokio::test]
async fn a_session_its_approval_and_its_tool_call_are_on_record_without_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let agent = clerk::agent(dir.path(), MODEL_URL, "");
    let s = Server::start(std::slice::from_ref(&agent), dir.path(), clerk::script).await;
    let api = &s.api;
    let r = waiting(api, "delete invoice 7").await;
    let id = id_of(&r);
    let r = answer(api, &token_of(&r), json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(clerk::runs(dir.path()), 1);

    let (lines, head_seq, head_hash) = audit(api, "").await;
    let summary = verify(&lines, &Anchor::default()).expect("the chain holds");
    assert_eq!(summary.last_seq, Some(head_seq));
    assert_eq!(summary.head, head_hash);
    let records: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let owner = json!({"kind": "owner"});
    let what: Vec<(&str, &Value)> = records
        .iter()
        .map(|r| (r["action"].as_str().unwrap(), &r["actor"]))
        .collect();
    let run = &records[3]["actor"];
    assert_eq!(
        what,
        [
            ("session_created", &owner),
            ("message_posted", &owner),
            ("pending_answered", &owner),
            ("tool_called", run),
        ]
    );
    assert_eq!(run["kind"], "run");
    assert_eq!(run["on_behalf_of"], owner);
    assert!(records.iter().all(|r| r["session"] == id.as_str()));
    assert_eq!(records[0]["details"]["agent"], "clerk");
    assert_eq!(records[2]["details"]["outcome"], "approved");
    assert_eq!(
        records[3]["details"],
        json!({
            "tool": "bash_delete-invoice",
            "tool_call_id": records[2]["details"]["tool_call_id"],
            "credentials": [{"name": "billing_token", "origin": "session"}],
        })
    );
    // The canary secret is in no record, and so in no row (the export is
    // the rows' lines as stored).
    for line in &lines {
        assert!(!line.contains(CANARY), "{line}");
    }
    let stored = s.store.audit_after(0, 100).await.unwrap();
    assert!(stored.iter().all(|r| !r.line.contains(CANARY)));

    // A page: after seq 2, at most one.
    let (page, seq, hash) = audit(api, "?after=2&limit=1").await;
    assert_eq!(
        (page.as_slice(), seq, hash),
        (&lines[2..3], head_seq, head_hash)
    );
}

#[tokio::test]
async fn only_the_owner_reads_the_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let agent = clerk::agent(dir.path(), MODEL_URL, "");
    let s = Server::start(std::slice::from_ref(&agent), dir.path(), clerk::script).await;
    let api = &s.api;
    let r = create(
        api,
        json!({"agent": "clerk", "session_token": true, "params": {"tenant": "acme"}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let token = r.json["session_token"].as_str().unwrap().to_string();
    for who in [None, Some(token.as_str()), Some("nope")] {
        let r = api.call("GET", "/v1/audit", who, None).await;
        assert!(matches!(r.status, 401 | 403), "{who:?}: {}", r.text);
    }
    let (lines, seq, _) = audit(api, "").await;
    let actions: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["action"].clone())
        .collect();
    assert_eq!(
        actions,
        [json!("session_created"), json!("session_token_issued")]
    );
    assert_eq!(seq, 2);
    let r = api
        .call("GET", "/v1/audit?limit=0", Some(OWNER), None)
        .await;
    assert_eq!(error_of(&r).0, 400, "{}", r.text);
}
