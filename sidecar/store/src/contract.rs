//! What every [`SessionStore`] promises, as tests run against each backend:
//! a backend's tests call [`store_contract!`] with a function that opens a
//! fresh, empty store.

use std::sync::Arc;

use serde_json::json;

use super::{Peer, SessionStore, StoreError};
use crate::model::{EventRecord, Security, SessionRecord, SessionStatus, StoredParams};
use crate::quota::{RunCap, Started};
use crate::usage::{Claimed, Gauge, Group, PeakBy, Scope, Standing, Totals, Unwritten, Use};
use bindery_llm::{ChatMessage, ToolCall, Turn};
use bindery_params::{ParamValue, Values};
use bindery_spec::budget::Meter;

/// A fresh store and whatever must live as long as it (a directory, a
/// database server).
pub struct Fresh {
    pub store: Arc<dyn SessionStore>,
    pub keep: Box<dyn Send>,
}

/// One test per promise below, each on its own fresh store from
/// `$fresh().await` (a function of the calling module).
#[cfg(test)]
macro_rules! store_contract {
    ($fresh:ident) => {
        mod contract {
            use crate::contract as c;
            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test]
                    async fn $name() {
                        let fresh = super::$fresh().await;
                        c::$name(fresh.store.clone()).await;
                        drop(fresh.keep);
                    }
                };
            }
            case!(create_then_get_returns_the_same_record);
            case!(create_refuses_an_existing_id);
            case!(update_needs_the_next_version);
            case!(a_share_and_its_revocation_are_kept_with_the_session);
            case!(turns_are_appended_and_a_write_from_a_stale_count_is_refused);
            case!(update_of_an_unknown_session_is_not_found);
            case!(update_of_a_session_made_anew_under_its_id_is_refused);
            case!(list_is_newest_first_then_by_id);
            case!(a_lineage_is_the_session_its_ancestors_and_descendants_only);
            case!(events_are_numbered_per_session_and_read_in_order);
            case!(an_update_and_its_events_are_stored_together);
            case!(an_update_and_its_usage_are_stored_together);
            case!(concurrent_appends_get_distinct_seqs);
            case!(the_runner_of_a_run_is_stored_and_cleared);
            case!(waiting_sessions_are_listed_apart);
            case!(a_cancel_request_is_stored_and_cleared);
            case!(heartbeats_are_kept_per_instance_and_forgotten);
            case!(a_servers_address_is_kept_with_its_heartbeat);
            case!(the_holder_of_a_sessions_secrets_is_stored_and_cleared);
            case!(agents_are_put_replaced_listed_and_deleted);
            case!(connections_are_kept_per_person_and_toolbox);
            case!(usage_is_claimed_settled_and_summed_by_scope);
            case!(a_rolling_window_frees_up_as_its_oldest_use_leaves_it);
            case!(racing_claims_for_the_last_room_pass_once);
            case!(usage_is_reported_by_group_and_per_session);
            case!(cache_and_reasoning_tokens_are_kept_and_summed);
            case!(audit_records_are_chained_from_the_genesis_and_read_in_pages);
            case!(concurrent_audit_appends_leave_one_gapless_chain);
            case!(usage_is_kept_by_user_and_a_users_window_counts_only_theirs);
            case!(a_users_runs_are_capped_and_a_start_past_the_cap_writes_nothing);
            case!(racing_starts_of_one_user_pass_the_cap_once);
        }
    };
}
#[cfg(test)]
pub(crate) use store_contract;

pub fn record(id: &str, created_at: i64) -> SessionRecord {
    SessionRecord {
        id: id.to_owned(),
        agent: "helper".to_owned(),
        status: SessionStatus::Idle,
        status_detail: None,
        created_at,
        updated_at: created_at,
        version: 1,
        turns: Vec::new(),
        stored_turns: 0,
        params: StoredParams::default(),
        security: Security::default(),
        forked_from: None,
        runner: None,
        cancel_requested: false,
        pending: Default::default(),
        holder: None,
    }
}

/// A record with every field set, including a tool call and its result.
pub fn full_record() -> SessionRecord {
    let mut values = Values::new();
    values.insert("tenant".into(), ParamValue::Plain(json!("acme")));
    values.insert("limits".into(), ParamValue::Plain(json!({"max": 3})));
    SessionRecord {
        id: "s-full".to_owned(),
        agent: "billing".to_owned(),
        status: SessionStatus::Failed,
        status_detail: Some("the model endpoint timed out".to_owned()),
        created_at: 1_700_000_000_000,
        updated_at: 1_700_000_000_500,
        version: 1,
        turns: vec![
            ChatMessage::system("be brief"),
            ChatMessage::user("what is in a.txt?"),
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.txt"}"#.into(),
                }],
                reasoning: None,
            },
            ChatMessage::tool_result("call_1", "hello"),
            ChatMessage::assistant("It says hello."),
        ]
        .into_iter()
        .map(Turn::new)
        .collect(),
        stored_turns: 0,
        params: StoredParams::from_values(&values),
        security: Security {
            sealed: true,
            token_digests: vec!["ab".repeat(32), "cd".repeat(32)],
            owner: Some("mcp".to_owned()),
            subject: Some(bindery_identity::Subject::new("alice@example.com").unwrap()),
            pinned: vec!["tenant".to_owned()],
            taint_cleared_at: Some(3),
            shares: vec![
                crate::model::Share {
                    id: "sh_0123456789abcdef".into(),
                    mode: crate::model::ShareMode::Read,
                    digest: "ef".repeat(32),
                    shared_by: "user:alice@example.com".into(),
                    note: Some("for the auditors".into()),
                    created_at: 1_700_000_000_100,
                    revoked_at: None,
                },
                crate::model::Share {
                    id: "sh_fedcba9876543210".into(),
                    mode: crate::model::ShareMode::Write,
                    digest: String::new(),
                    shared_by: "owner".into(),
                    note: None,
                    created_at: 1_700_000_000_200,
                    revoked_at: Some(1_700_000_000_300),
                },
            ],
        },
        forked_from: Some("s-parent".to_owned()),
        runner: Some("runner-1".to_owned()),
        cancel_requested: true,
        holder: Some("runner-2".to_owned()),
        pending: crate::pending::Pending {
            run: Some(crate::pending::WaitingRun {
                id: "r1".into(),
                budgets_approved: vec!["b".into()],
            }),
            items: vec![crate::pending::PendingCall {
                budget: None,
                tool_call_id: "call_2".into(),
                tool: "bash_delete".into(),
                disposition: bindery_tools::Disposition::Confirm,
                call: json!({"path": "a.txt"}),
                bound_params: vec!["token".into()],
                digest: "ef".repeat(32),
                nonce: "01".repeat(16),
                token_digest: "12".repeat(32),
                expires_at: Some(1_700_000_060_000),
                resolution: Some(crate::pending::Resolution::Rejected {
                    reason: Some("not today".into()),
                }),
                frames: vec![crate::pending::Frame {
                    call_id: "call_0".into(),
                    tool: "prompt_agent_clerk".into(),
                    arguments: r#"{"what":"delete a.txt"}"#.into(),
                    history: vec![Turn::new(ChatMessage::user("delete a.txt"))],
                }],
                // Where a dependency's orchestration stands round-trips too.
                lookup: Some(crate::lookup::LookupState {
                    args: json!({"date": "2026-10-01"}),
                    choices: [("bash_book/1:availability".to_string(), "slot-a".to_string())]
                        .into(),
                    context: "ab".repeat(32),
                    approved: None,
                    refreshed: true,
                    ask: crate::lookup::Ask::Confirmation {
                        prepared: "cd".repeat(32),
                        facts: json!({"time": "10:00"}).as_object().cloned().unwrap(),
                        note: None,
                    },
                    expires_at: Some(1_700_000_030_000),
                }),
                tainted_by: vec![crate::pending::TaintSource {
                    tool_call_id: "call_1".into(),
                    tool: "bash_fetch-ticket".into(),
                }],
            }],
            used: vec!["34".repeat(32), "56".repeat(32)],
            expired: vec!["56".repeat(32)],
            // A client's call that waits: its run ends once it is answered.
            client_call: true,
        },
    }
}

/// A write appends the turns after those the store holds, and never
/// rewrites one: a record that miscounts them is a conflict, like a stale
/// version, so its writer reads the session again.
pub async fn turns_are_appended_and_a_write_from_a_stale_count_is_refused(
    store: Arc<dyn SessionStore>,
) {
    let mut rec = full_record();
    let n = rec.turns.len();
    store.create(&mut rec).await.unwrap();
    assert_eq!(rec.stored_turns, n);
    let mut read = store.get(&rec.id).await.unwrap().unwrap();
    assert_eq!(read.stored_turns, n);
    read.turns.push(ChatMessage::user("and b.txt?").into());
    read.version += 1;
    store.update(&mut read).await.unwrap();
    assert_eq!(read.stored_turns, n + 1);
    // Written again with nothing new: nothing is appended twice.
    read.version += 1;
    store.update(&mut read).await.unwrap();
    let back = store.get(&rec.id).await.unwrap().unwrap();
    assert_eq!(back, read);
    assert_eq!(back.turns.len(), n + 1);
    assert_eq!(
        back.turns.last().map(Turn::message),
        Some(&ChatMessage::user("and b.txt?"))
    );
    // The right version, but the writer thinks the store holds fewer turns.
    let mut stale = back.clone();
    stale.stored_turns = n;
    stale.version += 1;
    match store.update(&mut stale).await {
        Err(StoreError::Conflict(id)) => assert_eq!(id, rec.id),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(store.get(&rec.id).await.unwrap().unwrap(), back);
    // Turns and sessions are listed alike.
    assert_eq!(store.list().await.unwrap(), [back]);
}

pub async fn create_then_get_returns_the_same_record(store: Arc<dyn SessionStore>) {
    let mut rec = full_record();
    assert!(!rec.params.is_empty());
    store.create(&mut rec).await.unwrap();
    assert_eq!(store.get("s-full").await.unwrap(), Some(rec));
    assert_eq!(store.get("nope").await.unwrap(), None);
}

pub async fn create_refuses_an_existing_id(store: Arc<dyn SessionStore>) {
    store.create(&mut record("s1", 1)).await.unwrap();
    let mut other = record("s1", 2);
    other.agent = "other".into();
    match store.create(&mut other).await {
        Err(StoreError::Exists(id)) => assert_eq!(id, "s1"),
        other => panic!("expected Exists, got {other:?}"),
    }
    assert_eq!(store.get("s1").await.unwrap().unwrap().agent, "helper");
}

pub async fn update_needs_the_next_version(store: Arc<dyn SessionStore>) {
    let mut rec = record("s1", 1);
    store.create(&mut rec).await.unwrap();

    rec.version = 2;
    rec.status = SessionStatus::Running;
    rec.turns.push(ChatMessage::user("hi").into());
    store.update(&mut rec).await.unwrap();
    assert_eq!(store.get("s1").await.unwrap(), Some(rec.clone()));

    // A writer that loaded version 1 and also writes version 2 loses.
    let mut stale = rec.clone();
    stale.status = SessionStatus::Failed;
    match store.update(&mut stale).await {
        Err(StoreError::Conflict(id)) => assert_eq!(id, "s1"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    // So does one that skips a version.
    stale.version = 4;
    assert!(matches!(
        store.update(&mut stale).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.get("s1").await.unwrap(), Some(rec));
}

/// A share is written with the session's record, and its revocation too
/// (the digest gone, the time kept): a session stored before shares reads
/// with none.
pub async fn a_share_and_its_revocation_are_kept_with_the_session(store: Arc<dyn SessionStore>) {
    let mut rec = record("s1", 1);
    store.create(&mut rec).await.unwrap();
    assert!(store
        .get("s1")
        .await
        .unwrap()
        .unwrap()
        .security
        .shares
        .is_empty());
    rec.security.shares.push(crate::model::Share {
        id: "sh_1".into(),
        mode: crate::model::ShareMode::Write,
        digest: "ab".repeat(32),
        shared_by: "owner".into(),
        note: Some("pairing".into()),
        created_at: 5,
        revoked_at: None,
    });
    rec.version = 2;
    store.update(&mut rec).await.unwrap();
    let read = store.get("s1").await.unwrap().unwrap();
    assert_eq!(read, rec);
    assert!(read.security.live_share("sh_1").is_some());
    rec.security.shares[0].digest.clear();
    rec.security.shares[0].revoked_at = Some(9);
    rec.version = 3;
    store.update(&mut rec).await.unwrap();
    let read = store.get("s1").await.unwrap().unwrap();
    assert_eq!(read, rec);
    assert!(read.security.live_share("sh_1").is_none());
    assert_eq!(read.security.shares[0].revoked_at, Some(9));
}

pub async fn update_of_a_session_made_anew_under_its_id_is_refused(store: Arc<dyn SessionStore>) {
    let mut rec = record("s1", 1);
    store.create(&mut rec).await.unwrap();
    // What a writer holds of an earlier session of the same id.
    let mut earlier = rec.clone();
    earlier.created_at = 0;
    earlier.version = 2;
    earlier.status = SessionStatus::Failed;
    match store.update(&mut earlier).await {
        Err(StoreError::Conflict(id)) => assert_eq!(id, "s1"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(store.get("s1").await.unwrap(), Some(rec.clone()));

    rec.version = 2;
    rec.status = SessionStatus::Running;
    store.update(&mut rec).await.unwrap();
    assert_eq!(store.get("s1").await.unwrap(), Some(rec));
}

pub async fn update_of_an_unknown_session_is_not_found(store: Arc<dyn SessionStore>) {
    let mut rec = record("ghost", 1);
    rec.version = 2;
    match store.update(&mut rec).await {
        Err(StoreError::NotFound(id)) => assert_eq!(id, "ghost"),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

pub async fn list_is_newest_first_then_by_id(store: Arc<dyn SessionStore>) {
    for (id, at) in [("b", 10), ("c", 30), ("a", 10), ("d", 20), ("B", 10)] {
        store.create(&mut record(id, at)).await.unwrap();
    }
    let ids: Vec<String> = store
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    // Ids in byte order (upper case first), whatever a database's collation.
    assert_eq!(ids, ["c", "d", "B", "a", "b"]);
}

/// root ── a ── me ── c1 ── g1, with another fork of `root` (`sib`) and of
/// `a` (`aunt`), and a stranger: `me`'s lineage is root, a, me, c1, g1,
/// newest first, its turns counted, and no other.
pub async fn a_lineage_is_the_session_its_ancestors_and_descendants_only(
    store: Arc<dyn SessionStore>,
) {
    let family = [
        ("root", None, 1),
        ("a", Some("root"), 2),
        ("sib", Some("root"), 3),
        ("aunt", Some("a"), 4),
        ("me", Some("a"), 5),
        ("c1", Some("me"), 6),
        ("stranger", None, 7),
        ("g1", Some("c1"), 8),
    ];
    for (id, from, at) in family {
        let mut rec = record(id, at);
        rec.forked_from = from.map(str::to_owned);
        if id == "me" {
            rec.turns = vec![
                Turn::new(ChatMessage::user("hello")),
                Turn::new(ChatMessage::assistant("hi")),
            ];
        }
        store.create(&mut rec).await.unwrap();
    }
    let kin = store.lineage("me", 100).await.unwrap();
    let ids: Vec<&str> = kin.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(ids, ["g1", "c1", "me", "a", "root"]);
    let me = &kin[2];
    assert_eq!(
        (
            me.forked_from.as_deref(),
            me.turns,
            me.agent.as_str(),
            me.status.as_str()
        ),
        (Some("a"), 2, "helper", "idle")
    );
    assert_eq!((me.created_at, me.updated_at), (5, 5));
    // At most `max`, the newest.
    let ids: Vec<String> = store
        .lineage("me", 2)
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(ids, ["g1", "c1"]);
    // A session alone is its own lineage; no session, none.
    let alone = store.lineage("stranger", 100).await.unwrap();
    assert_eq!(alone.len(), 1);
    assert!(store.lineage("nobody", 100).await.unwrap().is_empty());
}

pub async fn events_are_numbered_per_session_and_read_in_order(store: Arc<dyn SessionStore>) {
    store.create(&mut record("s1", 1)).await.unwrap();
    store.create(&mut record("s2", 2)).await.unwrap();
    for i in 1..=4 {
        let seq = store
            .append_event("s1", "message", &json!({"n": i}), 100 + i)
            .await
            .unwrap();
        assert_eq!(seq, i);
    }
    assert_eq!(
        store
            .append_event("s2", "run_started", &json!(null), 7)
            .await
            .unwrap(),
        1
    );

    let all = store.events_after("s1", 0).await.unwrap();
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(
        all[2],
        EventRecord {
            seq: 3,
            kind: "message".into(),
            data: json!({"n": 3}),
            at: 103
        }
    );
    let later = store.events_after("s1", 2).await.unwrap();
    assert_eq!(later.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    assert!(store.events_after("s1", 4).await.unwrap().is_empty());
    assert!(store.events_after("nope", 0).await.unwrap().is_empty());

    match store.append_event("nope", "message", &json!({}), 1).await {
        Err(StoreError::NotFound(id)) => assert_eq!(id, "nope"),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

pub async fn an_update_and_its_events_are_stored_together(store: Arc<dyn SessionStore>) {
    let mut rec = record("s1", 1);
    store.create(&mut rec).await.unwrap();
    store
        .append_event("s1", "run_started", &json!(null), 10)
        .await
        .unwrap();

    rec.version = 2;
    rec.turns.push(ChatMessage::user("hi").into());
    let events = [("message", json!({"n": 1})), ("tool_call", json!({"n": 2}))];
    let seqs = store
        .update_with_events(&mut rec, &events, 50)
        .await
        .unwrap();
    assert_eq!(seqs, [2, 3]);
    assert_eq!(store.get("s1").await.unwrap(), Some(rec.clone()));
    let stored = store.events_after("s1", 1).await.unwrap();
    assert_eq!(
        stored,
        [
            EventRecord {
                seq: 2,
                kind: "message".into(),
                data: json!({"n": 1}),
                at: 50
            },
            EventRecord {
                seq: 3,
                kind: "tool_call".into(),
                data: json!({"n": 2}),
                at: 50
            },
        ]
    );

    // A stale write stores neither the record nor its events.
    let mut stale = rec.clone();
    stale.status = SessionStatus::Failed;
    match store.update_with_events(&mut stale, &events, 60).await {
        Err(StoreError::Conflict(id)) => assert_eq!(id, "s1"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(store.get("s1").await.unwrap(), Some(rec.clone()));
    assert!(store.events_after("s1", 3).await.unwrap().is_empty());

    // Without events it is an update.
    rec.version = 3;
    rec.status = SessionStatus::Idle;
    assert!(store
        .update_with_events(&mut rec, &[], 70)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.get("s1").await.unwrap(), Some(rec));

    let mut ghost = record("ghost", 1);
    ghost.version = 2;
    assert!(matches!(
        store.update_with_events(&mut ghost, &events, 80).await,
        Err(StoreError::NotFound(_))
    ));
}

pub async fn an_update_and_its_usage_are_stored_together(store: Arc<dyn SessionStore>) {
    let mut rec = record("s1", 1);
    store.create(&mut rec).await.unwrap();
    rec.version = 2;
    rec.turns.push(ChatMessage::assistant("done").into());
    let events = [("run_finished", json!({"n": 1}))];
    let used = unwritten(usage_row(10, "a", "s1", "r1", 7));
    let seqs = store
        .update_with_usage(&mut rec, &events, 50, &used)
        .await
        .unwrap();
    assert_eq!(seqs, [1]);
    assert_eq!(rec.stored_turns, 1);
    assert_eq!(store.get("s1").await.unwrap(), Some(rec.clone()));
    assert_eq!(store.session_totals("s1").await.unwrap().total_tokens, 7);

    // A stale write stores neither the record, nor its events, nor its usage.
    let mut stale = rec.clone();
    stale.status = SessionStatus::Failed;
    match store
        .update_with_usage(&mut stale, &events, 60, &used)
        .await
    {
        Err(StoreError::Conflict(id)) => assert_eq!(id, "s1"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(store.get("s1").await.unwrap(), Some(rec.clone()));
    assert!(store.events_after("s1", 1).await.unwrap().is_empty());
    assert_eq!(store.session_totals("s1").await.unwrap().total_tokens, 7);

    // Without usage it is an update with events.
    rec.version = 3;
    let seqs = store
        .update_with_usage(&mut rec, &events, 70, &Unwritten::default())
        .await
        .unwrap();
    assert_eq!(seqs, [2]);
    assert_eq!(store.get("s1").await.unwrap(), Some(rec));
    assert_eq!(store.session_totals("s1").await.unwrap().total_tokens, 7);
}

pub async fn concurrent_appends_get_distinct_seqs(store: Arc<dyn SessionStore>) {
    store.create(&mut record("s1", 1)).await.unwrap();
    assert_distinct_seqs(&[store], "s1", 16).await;
}

/// `n` appends at once to `session`, spread over `stores` (one store, or
/// several opened on one database: replicas), number 1..=n.
pub async fn assert_distinct_seqs(stores: &[Arc<dyn SessionStore>], session: &str, n: i64) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = Arc::clone(&stores[usize::try_from(i).unwrap() % stores.len()]);
            let session = session.to_owned();
            tokio::spawn(async move { store.append_event(&session, "message", &json!(i), i).await })
        })
        .collect();
    let mut seqs = Vec::new();
    for t in tasks {
        seqs.push(t.await.unwrap().unwrap());
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=n).collect::<Vec<i64>>());
}

/// An audit entry with a field that tells it apart.
pub fn audit_entry(n: i64) -> crate::audit::Entry {
    crate::audit::Entry {
        at: 1_700_000_000_000 + n,
        actor: crate::audit::Actor::Owner,
        session: Some(format!("s{n}")),
        action: crate::audit::Action::ParamsSet {
            names: vec![format!("p{n}")],
        },
    }
}

/// Records are numbered from 1, each `prev` the hash before it (the
/// genesis first), kept as sealed, and read after a seq, a page at a time.
pub async fn audit_records_are_chained_from_the_genesis_and_read_in_pages(
    store: Arc<dyn SessionStore>,
) {
    use crate::audit::{seal, Head, GENESIS};
    assert_eq!(store.audit_head().await.unwrap(), None);
    assert!(store.audit_after(0, 10).await.unwrap().is_empty());
    let mut prev = GENESIS.to_string();
    let mut written = Vec::new();
    for n in 1..=5 {
        let sealed = store.append_audit(&audit_entry(n)).await.unwrap();
        assert_eq!(sealed, seal(&audit_entry(n), n, &prev).unwrap());
        prev = sealed.hash.clone();
        written.push(sealed);
    }
    assert_eq!(
        store.audit_head().await.unwrap(),
        Some(Head {
            seq: 5,
            hash: prev.clone()
        })
    );
    assert_eq!(store.audit_after(0, 100).await.unwrap(), written);
    assert_eq!(store.audit_after(1, 2).await.unwrap(), written[1..3]);
    assert!(store.audit_after(5, 10).await.unwrap().is_empty());
    let lines: Vec<&str> = written.iter().map(|s| s.line.as_str()).collect();
    let summary = crate::audit::verify::verify(&lines, &Default::default()).unwrap();
    assert_eq!((summary.records, summary.head), (5, prev));
}

/// Appends at once (from several stores on one database: replicas) each
/// get their own seq, and the records form one chain with no gap or fork.
pub async fn assert_one_audit_chain(stores: &[Arc<dyn SessionStore>], n: i64) {
    let tasks: Vec<_> = (1..=n)
        .map(|i| {
            let store = Arc::clone(&stores[usize::try_from(i).unwrap() % stores.len()]);
            tokio::spawn(async move { store.append_audit(&audit_entry(i)).await })
        })
        .collect();
    let mut seqs = Vec::new();
    for t in tasks {
        seqs.push(t.await.unwrap().unwrap().seq);
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=n).collect::<Vec<i64>>());
    let all = stores[0].audit_after(0, usize::MAX).await.unwrap();
    let lines: Vec<&str> = all.iter().map(|s| s.line.as_str()).collect();
    let summary = crate::audit::verify::verify(&lines, &Default::default()).unwrap();
    assert_eq!((summary.records, summary.last_seq), (n as u64, Some(n)));
    // Every entry is in it once.
    let mut sessions: Vec<String> = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["session"].to_string())
        .collect();
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), lines.len());
}

pub async fn concurrent_audit_appends_leave_one_gapless_chain(store: Arc<dyn SessionStore>) {
    assert_one_audit_chain(&[store], 24).await;
}

pub async fn the_runner_of_a_run_is_stored_and_cleared(store: Arc<dyn SessionStore>) {
    let mut rec = record("s1", 1);
    store.create(&mut rec).await.unwrap();
    rec.version = 2;
    rec.status = SessionStatus::Running;
    rec.runner = Some("instance-a".into());
    store.update(&mut rec).await.unwrap();
    store.create(&mut record("s0", 2)).await.unwrap();
    assert_eq!(store.get("s1").await.unwrap(), Some(rec.clone()));
    assert_eq!(store.running().await.unwrap(), [rec.clone()]);
    rec.version = 3;
    rec.status = SessionStatus::Idle;
    rec.runner = None;
    store.update(&mut rec).await.unwrap();
    assert_eq!(store.get("s1").await.unwrap().unwrap().runner, None);
    assert!(store.running().await.unwrap().is_empty());
}

pub async fn waiting_sessions_are_listed_apart(store: Arc<dyn SessionStore>) {
    let mut waits = record("s2", 1);
    waits.status = SessionStatus::WaitingExternal;
    let mut runs = record("s1", 2);
    runs.status = SessionStatus::Running;
    for rec in [&mut waits, &mut runs, &mut record("s3", 3)] {
        store.create(rec).await.unwrap();
    }
    assert_eq!(store.waiting().await.unwrap(), [waits.clone()]);
    assert_eq!(store.running().await.unwrap(), [runs]);
    waits.version = 2;
    waits.status = SessionStatus::Idle;
    store.update(&mut waits).await.unwrap();
    assert!(store.waiting().await.unwrap().is_empty());
}

pub async fn a_cancel_request_is_stored_and_cleared(store: Arc<dyn SessionStore>) {
    let mut rec = record("s1", 1);
    rec.status = SessionStatus::Running;
    rec.runner = Some("instance-a".into());
    store.create(&mut rec).await.unwrap();
    assert!(!store.get("s1").await.unwrap().unwrap().cancel_requested);
    rec.version = 2;
    rec.cancel_requested = true;
    store.update(&mut rec).await.unwrap();
    assert_eq!(store.running().await.unwrap(), [rec.clone()]);
    // A request written on a stale version is refused like any other write.
    let mut stale = rec.clone();
    stale.cancel_requested = false;
    assert!(matches!(
        store.update(&mut stale).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(store.get("s1").await.unwrap().unwrap().cancel_requested);
    rec.version = 3;
    rec.status = SessionStatus::Idle;
    rec.runner = None;
    rec.cancel_requested = false;
    store.update(&mut rec).await.unwrap();
    assert_eq!(store.get("s1").await.unwrap(), Some(rec));
}

pub async fn heartbeats_are_kept_per_instance_and_forgotten(store: Arc<dyn SessionStore>) {
    assert!(store.heartbeats().await.unwrap().is_empty());
    store.beat("a", 100, None).await.unwrap();
    store.beat("b", 150, None).await.unwrap();
    store.beat("a", 200, None).await.unwrap();
    let beats = |pairs: &[(&str, i64)]| {
        pairs
            .iter()
            .map(|(i, at)| ((*i).to_owned(), *at))
            .collect::<std::collections::HashMap<_, _>>()
    };
    assert_eq!(
        store.heartbeats().await.unwrap(),
        beats(&[("a", 200), ("b", 150)])
    );

    // Only heartbeats older than the cutoff go: "a" beat since.
    store.beat("c", 10, None).await.unwrap();
    assert_eq!(store.prune_runners(160).await.unwrap(), 2);
    assert_eq!(store.heartbeats().await.unwrap(), beats(&[("a", 200)]));

    store.forget_runner("a").await.unwrap();
    store.forget_runner("never-seen").await.unwrap();
    assert!(store.heartbeats().await.unwrap().is_empty());
}

pub async fn a_servers_address_is_kept_with_its_heartbeat(store: Arc<dyn SessionStore>) {
    assert_eq!(store.peer("a").await.unwrap(), None);
    store
        .beat("a", 100, Some("http://10.0.0.7:8080"))
        .await
        .unwrap();
    store.beat("b", 150, None).await.unwrap();
    let peer = |at, address: Option<&str>| {
        Some(Peer {
            at,
            address: address.map(str::to_owned),
        })
    };
    assert_eq!(
        store.peer("a").await.unwrap(),
        peer(100, Some("http://10.0.0.7:8080"))
    );
    assert_eq!(store.peer("b").await.unwrap(), peer(150, None));
    // A later beat moves the address with it (a pod restarted elsewhere).
    store
        .beat("a", 200, Some("http://10.0.0.9:8080"))
        .await
        .unwrap();
    assert_eq!(
        store.peer("a").await.unwrap(),
        peer(200, Some("http://10.0.0.9:8080"))
    );
    store.forget_runner("a").await.unwrap();
    assert_eq!(store.peer("a").await.unwrap(), None);
}

pub async fn the_holder_of_a_sessions_secrets_is_stored_and_cleared(store: Arc<dyn SessionStore>) {
    let mut rec = record("s1", 1);
    rec.holder = Some("server-a".into());
    store.create(&mut rec).await.unwrap();
    assert_eq!(
        store.get("s1").await.unwrap().unwrap().holder.as_deref(),
        Some("server-a")
    );
    rec.holder = None;
    rec.version += 1;
    store.update(&mut rec).await.unwrap();
    assert_eq!(store.get("s1").await.unwrap().unwrap().holder, None);
}

pub async fn agents_are_put_replaced_listed_and_deleted(store: Arc<dyn SessionStore>) {
    use crate::StoredAgent;
    assert!(store.put_agent("b", r#"{"v":1}"#, 10).await.unwrap());
    assert!(store.put_agent("a", r#"{"v":2}"#, 11).await.unwrap());
    assert!(!store.put_agent("b", r#"{"v":3}"#, 12).await.unwrap());
    assert_eq!(
        store.get_agent("b").await.unwrap(),
        Some(StoredAgent {
            slug: "b".into(),
            document: r#"{"v":3}"#.into(),
            updated_at: 12
        })
    );
    let slugs: Vec<String> = store
        .agents()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.slug)
        .collect();
    assert_eq!(slugs, ["a", "b"]);
    assert!(store.delete_agent("b").await.unwrap());
    assert!(!store.delete_agent("b").await.unwrap());
    assert_eq!(store.get_agent("b").await.unwrap(), None);
}

/// A model request's use of `tokens` (prompt) at `at`.
/// A person's connection to a toolbox: one row per (subject, toolbox),
/// replaced by a new grant, listed by person, deleted alone.
pub async fn connections_are_kept_per_person_and_toolbox(store: Arc<dyn SessionStore>) {
    use crate::connections::StoredConnection;
    let row = |subject: &str, toolbox: &str, at: i64| StoredConnection {
        subject: subject.into(),
        toolbox: toolbox.into(),
        scopes: vec!["crm.read".into(), "offline_access".into()],
        connected_at: at,
        last_used_at: at + 1,
        sealed: vec![0, 1, 2, 255, at as u8],
    };
    store.put_connection(&row("bob", "crm", 10)).await.unwrap();
    store
        .put_connection(&row("alice", "erp", 11))
        .await
        .unwrap();
    store
        .put_connection(&row("alice", "crm", 12))
        .await
        .unwrap();
    // A new grant replaces the person's row for that toolbox.
    store
        .put_connection(&row("alice", "crm", 13))
        .await
        .unwrap();
    assert_eq!(
        store.get_connection("alice", "crm").await.unwrap(),
        Some(row("alice", "crm", 13))
    );
    assert_eq!(store.get_connection("carol", "crm").await.unwrap(), None);
    let keys = |v: Vec<StoredConnection>| {
        v.into_iter()
            .map(|c| format!("{}/{}", c.subject, c.toolbox))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keys(store.connections(None).await.unwrap()),
        ["alice/crm", "alice/erp", "bob/crm"]
    );
    assert_eq!(
        keys(store.connections(Some("alice")).await.unwrap()),
        ["alice/crm", "alice/erp"]
    );
    assert!(store.delete_connection("alice", "crm").await.unwrap());
    assert!(!store.delete_connection("alice", "crm").await.unwrap());
    assert_eq!(
        keys(store.connections(None).await.unwrap()),
        ["alice/erp", "bob/crm"]
    );
}

pub fn usage_row(at: i64, agent: &str, session: &str, run: &str, tokens: u64) -> Use {
    Use {
        at,
        agent: agent.into(),
        session: session.into(),
        run: run.into(),
        subject: None,
        model: "m".into(),
        tool: None,
        prompt_tokens: tokens,
        completion_tokens: 0,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        reasoning_tokens: 0,
        estimated: false,
        tool_calls: 0,
        cost: 0.0,
    }
}

/// The usage rows each store's upgrade test writes before it takes the
/// store back to before the kept sums: two model requests of s1 (5 and
/// 7 tokens) and one of s2 (11).
pub async fn usage_before_an_upgrade(store: &dyn SessionStore) {
    for (at, session, tokens) in [(1, "s1", 5), (2, "s1", 7), (3, "s2", 11)] {
        let row = usage_row(at, "a", session, "r", tokens);
        store.record(&unwritten(row)).await.unwrap();
    }
}

/// The sums after the upgrade, with the tool call (cost 0.5) an older
/// server added to s1 meanwhile, and kept from then on: a new row of s2.
pub async fn sums_kept_after_an_upgrade(store: &dyn SessionStore) {
    let s1 = store.session_totals("s1").await.unwrap();
    assert_eq!(
        (s1.prompt_tokens, s1.model_requests, s1.tool_calls, s1.cost),
        (12, 2, 1, 0.5)
    );
    assert_eq!(store.session_totals("s2").await.unwrap().total_tokens, 11);
    let row = usage_row(5, "a", "s2", "r", 1);
    store.record(&unwritten(row)).await.unwrap();
    assert_eq!(store.session_totals("s2").await.unwrap().total_tokens, 12);
}

/// `row`, unwritten.
pub fn unwritten(row: Use) -> Unwritten {
    Unwritten {
        rows: vec![row],
        settled: Vec::new(),
    }
}

fn tokens_of(scope: Scope, since: i64) -> Gauge {
    Gauge {
        meter: Meter::Tokens,
        scope,
        since,
    }
}

fn granted(c: Claimed) -> i64 {
    match c {
        Claimed::Granted { id, .. } => id,
        other => panic!("expected a grant, got {other:?}"),
    }
}

pub async fn usage_is_claimed_settled_and_summed_by_scope(store: Arc<dyn SessionStore>) {
    let id = granted(
        store
            .claim(
                &[],
                &Unwritten::default(),
                &usage_row(10, "a", "s1", "r1", 5),
            )
            .await
            .unwrap(),
    );
    let mut actual = usage_row(10, "a", "s1", "r1", 30);
    actual.completion_tokens = 12;
    actual.cost = 0.25;
    store
        .record(&Unwritten {
            rows: Vec::new(),
            settled: vec![(id, actual)],
        })
        .await
        .unwrap();
    let mut call = usage_row(11, "a", "s1", "r2", 0);
    call.tool = Some("bash_x".into());
    call.tool_calls = 1;
    store.record(&unwritten(call.clone())).await.unwrap();
    store
        .record(&unwritten(usage_row(12, "b", "s2", "r3", 100)))
        .await
        .unwrap();
    let cost = Gauge {
        meter: Meter::Cost,
        scope: Scope::Agent("a".into()),
        since: 0,
    };
    let calls = Gauge {
        meter: Meter::ToolCalls,
        scope: Scope::Session("s1".into()),
        since: 0,
    };
    let got = store
        .measure(&[
            tokens_of(Scope::Agent("a".into()), 0),
            tokens_of(Scope::Session("s1".into()), 0),
            tokens_of(Scope::Run("r1".into()), 0),
            tokens_of(Scope::Run("r2".into()), 0),
            cost,
            calls,
        ])
        .await
        .unwrap();
    let used: Vec<f64> = got.iter().map(|s| s.used).collect();
    assert_eq!(used, [42.0, 42.0, 42.0, 0.0, 0.25, 1.0]);
    assert_eq!(got[0].oldest, Some(10));
    // A limit already reached refuses and records nothing of the claim,
    // but what was used before it (`earlier`) is recorded all the same.
    let limits = [
        (tokens_of(Scope::Run("r9".into()), 0), 1.0),
        (tokens_of(Scope::Agent("a".into()), 0), 42.0),
    ];
    let mut earlier = usage_row(13, "a", "s1", "r8", 0);
    earlier.tool = Some("bash_y".into());
    earlier.tool_calls = 1;
    let refused = store
        .claim(
            &limits,
            &unwritten(earlier),
            &usage_row(13, "a", "s1", "r9", 1),
        )
        .await
        .unwrap();
    assert_eq!(
        refused,
        Claimed::Exhausted {
            index: 1,
            standing: Standing {
                used: 42.0,
                oldest: Some(10)
            }
        }
    );
    let after = store
        .measure(&[tokens_of(Scope::Agent("a".into()), 0)])
        .await
        .unwrap();
    assert_eq!(after[0].used, 42.0, "a refused claim records nothing");
    let calls = Gauge {
        meter: Meter::ToolCalls,
        scope: Scope::Session("s1".into()),
        since: 0,
    };
    assert_eq!(store.measure(&[calls]).await.unwrap()[0].used, 2.0);
    assert_eq!(
        store
            .peak("a", Meter::Tokens, PeakBy::Session, 0)
            .await
            .unwrap(),
        42.0
    );
    assert_eq!(
        store
            .peak("a", Meter::Tokens, PeakBy::Run, 11)
            .await
            .unwrap(),
        0.0
    );
    assert_eq!(
        store
            .peak("a", Meter::Tokens, PeakBy::Run, 0)
            .await
            .unwrap(),
        42.0
    );
    // A session's sums, kept as its rows come and change, are what its
    // rows add up to.
    let report = store.report(0, i64::MAX, Group::Session).await.unwrap();
    for session in ["s1", "s2"] {
        let row = report.iter().find(|r| r.key.as_deref() == Some(session));
        assert_eq!(
            store.session_totals(session).await.unwrap(),
            row.expect("a report row").totals,
            "{session}"
        );
    }
    let s1 = store.session_totals("s1").await.unwrap();
    assert_eq!(
        (s1.prompt_tokens, s1.completion_tokens, s1.model_requests),
        (30, 12, 1)
    );
    assert_eq!((s1.tool_calls, s1.cost), (2, 0.25));
}

/// The clock is the caller's: a claim at a later `at` with a later
/// `since` sees the old use leave the window.
pub async fn a_rolling_window_frees_up_as_its_oldest_use_leaves_it(store: Arc<dyn SessionStore>) {
    const HOUR: i64 = 3_600_000;
    let t0 = 1_000 * HOUR;
    store
        .record(&unwritten(usage_row(t0, "a", "s1", "r1", 60)))
        .await
        .unwrap();
    store
        .record(&unwritten(usage_row(t0 + HOUR, "a", "s1", "r2", 40)))
        .await
        .unwrap();
    let window = |now: i64| [(tokens_of(Scope::Agent("a".into()), now - 24 * HOUR), 100.0)];
    // 23 hours on: both uses are in the window, which is full.
    let now = t0 + 23 * HOUR;
    let refused = store
        .claim(
            &window(now),
            &Unwritten::default(),
            &usage_row(now, "a", "s1", "r3", 1),
        )
        .await
        .unwrap();
    assert_eq!(
        refused,
        Claimed::Exhausted {
            index: 0,
            standing: Standing {
                used: 100.0,
                oldest: Some(t0)
            }
        }
    );
    // Just past 24 hours: the first use has left it.
    let now = t0 + 24 * HOUR + 1;
    granted(
        store
            .claim(
                &window(now),
                &Unwritten::default(),
                &usage_row(now, "a", "s1", "r3", 1),
            )
            .await
            .unwrap(),
    );
    let standing = store.measure(&[window(now)[0].0.clone()]).await.unwrap();
    assert_eq!(
        standing[0],
        Standing {
            used: 41.0,
            oldest: Some(t0 + HOUR)
        }
    );
}

/// Ten claims at once for a budget with room for one claim's amount: one
/// passes.
pub async fn racing_claims_for_the_last_room_pass_once(store: Arc<dyn SessionStore>) {
    store
        .record(&unwritten(usage_row(1, "a", "s1", "r1", 99)))
        .await
        .unwrap();
    let limits = [(tokens_of(Scope::Agent("a".into()), 0), 100.0)];
    let claims = (0..10).map(|i| {
        let store = store.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            store
                .claim(
                    &limits,
                    &Unwritten::default(),
                    &usage_row(2, "a", &format!("s{i}"), "r", 5),
                )
                .await
                .unwrap()
        })
    });
    let outcomes = futures::future::join_all(claims).await;
    let passed = outcomes
        .into_iter()
        .filter(|o| matches!(o.as_ref().unwrap(), Claimed::Granted { .. }))
        .count();
    assert_eq!(passed, 1);
}

pub async fn usage_is_reported_by_group_and_per_session(store: Arc<dyn SessionStore>) {
    let mut estimated = usage_row(10, "a", "s1", "r1", 7);
    estimated.estimated = true;
    estimated.completion_tokens = 3;
    store.record(&unwritten(estimated.clone())).await.unwrap();
    store
        .record(&unwritten(usage_row(20, "b", "s2", "r2", 100)))
        .await
        .unwrap();
    let mut call = usage_row(30, "a", "s1", "r1", 0);
    call.tool = Some("bash_x".into());
    call.tool_calls = 1;
    store.record(&unwritten(call.clone())).await.unwrap();
    store
        .record(&unwritten(usage_row(99, "a", "s3", "r3", 1000)))
        .await
        .unwrap();
    let by_agent = store.report(0, 99, Group::Agent).await.unwrap();
    let keys: Vec<_> = by_agent.iter().map(|r| r.key.clone()).collect();
    assert_eq!(
        keys,
        [Some("b".into()), Some("a".into())],
        "largest first; `to` excluded"
    );
    assert_eq!(
        by_agent[1].totals,
        Totals {
            prompt_tokens: 7,
            completion_tokens: 3,
            total_tokens: 10,
            estimated_tokens: 10,
            model_requests: 1,
            tool_calls: 1,
            cost: 0.0,
            ..Totals::default()
        }
    );
    let by_tool = store.report(0, 99, Group::Tool).await.unwrap();
    let keys: Vec<_> = by_tool.iter().map(|r| r.key.clone()).collect();
    assert_eq!(keys, [None, Some("bash_x".into())]);
    let s1 = store.session_totals("s1").await.unwrap();
    assert_eq!(
        (s1.total_tokens, s1.tool_calls, s1.model_requests),
        (10, 1, 1)
    );
    assert_eq!(
        store.session_totals("none").await.unwrap(),
        Totals::default()
    );
}

/// A request's cache reads and writes and its reasoning tokens are kept
/// with its row, whether written at once or settled after a claim, and
/// summed in its session's totals and in reports; settling a claim
/// replaces the estimate's (none) with the reply's.
pub async fn cache_and_reasoning_tokens_are_kept_and_summed(store: Arc<dyn SessionStore>) {
    let id = granted(
        store
            .claim(
                &[],
                &Unwritten::default(),
                &usage_row(10, "a", "s1", "r1", 50),
            )
            .await
            .unwrap(),
    );
    let mut settled = usage_row(10, "a", "s1", "r1", 1050);
    settled.completion_tokens = 22;
    settled.cache_read_tokens = 1000;
    settled.cache_write_tokens = 20;
    settled.reasoning_tokens = 4;
    store
        .record(&Unwritten {
            rows: Vec::new(),
            settled: vec![(id, settled)],
        })
        .await
        .unwrap();
    let mut other = usage_row(11, "a", "s1", "r1", 300);
    other.cache_read_tokens = 200;
    other.reasoning_tokens = 7;
    other.completion_tokens = 9;
    store.record(&unwritten(other)).await.unwrap();
    let want = |t: &Totals| {
        (
            t.cache_read_tokens,
            t.cache_write_tokens,
            t.reasoning_tokens,
        )
    };
    let session = store.session_totals("s1").await.unwrap();
    assert_eq!(want(&session), (1200, 20, 11), "{session:?}");
    assert_eq!(session.prompt_tokens, 1350);
    let report = store.report(0, 99, Group::Session).await.unwrap();
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(want(&report[0].totals), (1200, 20, 11));
    assert_eq!(report[0].totals, session);
}

/// `row` of end user `subject`.
fn of_user(mut row: Use, subject: &str) -> Use {
    row.subject = Some(subject.into());
    row
}

fn user(agent: &str, subject: &str) -> Scope {
    Scope::User {
        agent: agent.into(),
        subject: subject.into(),
    }
}

/// Each end user's rows carry their subject: a user's window sums theirs
/// of that agent only (never the owner's sessions, nor another user's),
/// a claim against it is refused for them and granted to another, the
/// report by user groups by subject (the owner's under `None`), and the
/// peak by user is the most one user used.
pub async fn usage_is_kept_by_user_and_a_users_window_counts_only_theirs(
    store: Arc<dyn SessionStore>,
) {
    for row in [
        of_user(usage_row(10, "a", "s1", "r1", 10), "alice"),
        of_user(usage_row(20, "a", "s2", "r2", 5), "alice"),
        of_user(usage_row(30, "a", "s3", "r3", 7), "bob"),
        usage_row(40, "a", "s4", "r4", 100),
        of_user(usage_row(50, "b", "s5", "r5", 50), "alice"),
    ] {
        store.record(&unwritten(row)).await.unwrap();
    }
    let standings = store
        .measure(&[
            tokens_of(user("a", "alice"), 0),
            tokens_of(user("a", "bob"), 0),
            tokens_of(user("a", "carol"), 0),
            tokens_of(user("a", "alice"), 15),
        ])
        .await
        .unwrap();
    let used: Vec<_> = standings.iter().map(|s| (s.used, s.oldest)).collect();
    assert_eq!(
        used,
        [
            (15.0, Some(10)),
            (7.0, Some(30)),
            (0.0, None),
            (5.0, Some(20))
        ]
    );
    let limits = [(tokens_of(user("a", "alice"), 0), 15.0)];
    let refused = store
        .claim(
            &limits,
            &Unwritten::default(),
            &of_user(usage_row(60, "a", "s1", "r6", 1), "alice"),
        )
        .await
        .unwrap();
    assert!(
        matches!(refused, Claimed::Exhausted { index: 0, .. }),
        "{refused:?}"
    );
    let limits = [(tokens_of(user("a", "bob"), 0), 15.0)];
    let bobs = of_user(usage_row(60, "a", "s3", "r7", 1), "bob");
    granted(
        store
            .claim(&limits, &Unwritten::default(), &bobs)
            .await
            .unwrap(),
    );
    let by_user = store.report(0, 99, Group::User).await.unwrap();
    let rows: Vec<_> = by_user
        .iter()
        .map(|r| (r.key.clone(), r.totals.total_tokens))
        .collect();
    assert_eq!(
        rows,
        [
            (None, 100),
            (Some("alice".into()), 65),
            (Some("bob".into()), 8)
        ]
    );
    assert_eq!(
        store
            .peak("a", Meter::Tokens, PeakBy::User, 0)
            .await
            .unwrap(),
        15.0
    );
    assert_eq!(
        store
            .peak("a", Meter::Tokens, PeakBy::User, 25)
            .await
            .unwrap(),
        8.0,
        "only what each user used since then"
    );
}

/// A session of end user `subject`, stored.
async fn users_session(store: &dyn SessionStore, id: &str, subject: &str) -> SessionRecord {
    let mut rec = record(id, 1);
    rec.security.subject = Some(bindery_identity::Subject::new(subject).unwrap());
    store.create(&mut rec).await.unwrap();
    rec
}

/// `rec` as a run's start writes it.
fn starting(rec: &mut SessionRecord) {
    rec.version += 1;
    rec.status = SessionStatus::Running;
    rec.runner = Some("instance-a".into());
}

/// A user's starts pass while fewer than the cap of their sessions run
/// (another user's do not count, nor the session being started); one
/// past it writes nothing; once a run ends, the next passes.
pub async fn a_users_runs_are_capped_and_a_start_past_the_cap_writes_nothing(
    store: Arc<dyn SessionStore>,
) {
    let cap = RunCap {
        subject: "alice".into(),
        max: 2,
    };
    let mut s1 = users_session(&*store, "s1", "alice").await;
    let mut s2 = users_session(&*store, "s2", "alice").await;
    let mut s3 = users_session(&*store, "s3", "alice").await;
    let mut bobs = users_session(&*store, "s4", "bob").await;
    for rec in [&mut s1, &mut s2] {
        starting(rec);
        let started = store
            .start_capped(rec, &[("run_started", json!({}))], 5, &cap)
            .await
            .unwrap();
        assert!(
            matches!(started, Started::Stored(ref seqs) if seqs == &[1]),
            "{started:?}"
        );
    }
    starting(&mut s3);
    let full = store
        .start_capped(&mut s3, &[("run_started", json!({}))], 5, &cap)
        .await
        .unwrap();
    assert_eq!(full, Started::Full { running: 2 });
    let stored = store.get("s3").await.unwrap().unwrap();
    assert_eq!((stored.status, stored.version), (SessionStatus::Idle, 1));
    assert!(store.events_after("s3", 0).await.unwrap().is_empty());
    starting(&mut bobs);
    let bob_cap = RunCap {
        subject: "bob".into(),
        max: 2,
    };
    let started = store
        .start_capped(&mut bobs, &[], 5, &bob_cap)
        .await
        .unwrap();
    assert!(matches!(started, Started::Stored(_)));
    // A session already running is not counted against its own start.
    s1.version += 1;
    let again = store.start_capped(&mut s1, &[], 6, &cap).await.unwrap();
    assert!(matches!(again, Started::Stored(_)), "{again:?}");
    s2.version += 1;
    s2.status = SessionStatus::Idle;
    s2.runner = None;
    store.update(&mut s2).await.unwrap();
    let started = store.start_capped(&mut s3, &[], 7, &cap).await.unwrap();
    assert!(matches!(started, Started::Stored(_)), "{started:?}");
    assert_eq!(
        store.get("s3").await.unwrap().unwrap().status,
        SessionStatus::Running
    );
}

/// Ten starts at once of one user's sessions under a cap of one: one
/// passes.
pub async fn racing_starts_of_one_user_pass_the_cap_once(store: Arc<dyn SessionStore>) {
    let mut recs = Vec::new();
    for i in 0..10 {
        recs.push(users_session(&*store, &format!("s{i}"), "alice").await);
    }
    let starts = recs.into_iter().map(|mut rec| {
        let store = store.clone();
        tokio::spawn(async move {
            starting(&mut rec);
            let cap = RunCap {
                subject: "alice".into(),
                max: 1,
            };
            store.start_capped(&mut rec, &[], 5, &cap).await.unwrap()
        })
    });
    let outcomes = futures::future::join_all(starts).await;
    let passed = outcomes
        .into_iter()
        .filter(|o| matches!(o.as_ref().unwrap(), Started::Stored(_)))
        .count();
    assert_eq!(passed, 1);
    assert_eq!(store.running().await.unwrap().len(), 1);
}
