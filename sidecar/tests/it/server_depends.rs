//! API-owned inputs over TCP: the booking example's tools (real bash tools
//! over a file-backed fake API), a scripted model that only extracts what
//! the user owns, and the pending items a dependency leaves: input,
//! selection, confirmation. The write count stays zero until a person
//! confirms, and a canary API key never shows.

use crate::common::booking::*;
use crate::common::*;
use bindery_tests::mock_llm::{last_message, tool_schema, MockLlm, MockReply};
use bindery_tests::sidecar::{Api, Reply};
use serde_json::{json, Value};

/// A session asked `book {args}`, run until it stops.
async fn ask(api: &Api, args: Value) -> Reply {
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "booking", "prompt": format!("book {args}")})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    r
}

async fn answer(api: &Api, item: &Value, body: Value) -> Reply {
    let token = item["continuation_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token in {item}"));
    api.call(
        "POST",
        &format!("/v1/continuations/{token}?wait=true"),
        Some(OWNER),
        Some(&body),
    )
    .await
}

async fn message(api: &Api, id: &str, text: &str) -> Reply {
    api.call(
        "POST",
        &format!("/v1/sessions/{id}/messages?wait=true"),
        Some(OWNER),
        Some(&json!({"prompt": text})),
    )
    .await
}

async fn session(api: &Api, id: &str) -> Reply {
    api.call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await
}

/// The one open pending item, checked to have `disposition`.
fn pending<'a>(r: &'a Reply, disposition: &str) -> &'a Value {
    let items = r.json["pending"]
        .as_array()
        .unwrap_or_else(|| panic!("no pending: {}", r.text));
    assert_eq!(items.len(), 1, "{}", r.text);
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    assert_eq!(items[0]["disposition"], disposition, "{}", r.text);
    &items[0]
}

fn option_labeled<'a>(item: &'a Value, label: &str) -> &'a Value {
    item["options"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["label"] == label)
        .unwrap_or_else(|| panic!("no option {label} in {item}"))
}

/// Ask `book {args}` of a run that ends without waiting: its tool's output.
async fn ended(api: &Api, args: Value) -> (Reply, String) {
    let r = ask(api, args).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let out = last_tool_output(&r);
    (r, out)
}

fn id_of(r: &Reply) -> String {
    r.json["session_id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_slots_ask_a_person_and_the_booking_waits_for_confirmation() {
    let b = booking(two_slots(), |t| t).await;
    let (mut sidecar, api) = b.start();
    let agent = api
        .call("GET", "/v1/agents/booking", Some(OWNER), None)
        .await;
    assert_eq!(
        agent.json["depends_on"],
        json!({"bash_availability": ["services"], "bash_book": ["availability"]}),
        "{}",
        agent.text
    );
    let r = ask(&api, json!({"date": DAY, "service": "haircut"})).await;
    let id = id_of(&r);
    let item = pending(&r, "needs_selection");
    assert_eq!(item["tool"], "bash_book");
    assert_eq!(item["lookup"], "bash_availability");
    let options = item["options"].as_array().unwrap();
    assert_eq!(options.len(), 2, "{item}");
    // Opaque ids: the API's slot tokens stay on the server.
    assert!(
        !r.text.contains("slot-a") && !r.text.contains("slot-b"),
        "{}",
        r.text
    );
    assert!(options
        .iter()
        .all(|o| o["id"].as_str().unwrap().starts_with("opt_")));
    assert_eq!(
        option_labeled(item, "11:00")["facts"],
        json!({"time": "11:00"})
    );
    assert!(b.bookings().is_empty(), "booked before any choice");

    let r = answer(
        &api,
        item,
        json!({"choice": option_labeled(item, "11:00")["id"]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let confirm = pending(&r, "needs_confirmation");
    assert_eq!(confirm["facts"], json!({"time": "11:00"}));
    assert!(!r.text.contains("slot-b"), "{}", r.text);
    assert!(b.bookings().is_empty(), "booked before confirmation");

    let r = answer(&api, confirm, json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(b.bookings(), vec![format!("{DAY} slot-b")]);
    assert!(
        last_tool_output(&r).contains("\"booked\": true"),
        "{}",
        r.text
    );

    // The model never saw the slot token: not in the schema, not in a turn.
    for req in b._mock.requests() {
        let schema = tool_schema(&req, "bash_book").unwrap();
        assert!(schema["properties"].get("slot_token").is_none(), "{schema}");
        assert!(schema["properties"].get("date").is_some(), "{schema}");
        assert!(!req.to_string().contains("slot-b"), "{req}");
    }
    // The canary API key reached the lookups (they refuse to run without
    // one) and shows in no option, fact, event, store file or log.
    let (status, stream) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    let mut kinds = Vec::new();
    let read = async {
        while let Some(e) = stream.next().await {
            kinds.push(e.event.clone());
            if kinds.iter().filter(|k| *k == "run_finished").count() == 3 {
                break;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("the three runs' events");
    assert_eq!(
        kinds.iter().filter(|k| *k == "pending").count(),
        2,
        "{kinds:?}"
    );
    assert!(stream.raw.contains("\"needs_selection\"") && stream.raw.contains("\"11:00\""));
    assert!(
        !stream.raw.contains("slot-b"),
        "a real slot token in an event"
    );
    assert!(!stream.raw.contains(CANARY));
    let s = session(&api, &id).await;
    assert!(!s.text.contains(CANARY));
    // An open stream would hold the graceful shutdown.
    drop(stream);
    sidecar.stop();
    assert!(!sidecar.logs().contains(CANARY));
    assert!(!contains(&raw_files(b.dir.path(), "store.sqlite"), CANARY));
    for req in b._mock.requests() {
        assert!(!req.to_string().contains(CANARY));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_date_asks_for_input_before_any_lookup() {
    let b = booking(two_slots(), |t| t).await;
    let (_sidecar, api) = b.start();
    let r = ask(&api, json!({"service": "Haircut"})).await;
    let item = pending(&r, "needs_input");
    assert_eq!(item["missing"], json!(["date"]));
    assert_eq!(b.lookups(), 0, "a lookup ran before the user's date");
    let wrong = answer(&api, item, json!({"choice": "x"})).await;
    assert_eq!(wrong.status, 400, "{}", wrong.text);
    let r = answer(&api, item, json!({"input": {"date": DAY}})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    pending(&r, "needs_selection");
    assert!(b.bookings().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_slots_are_an_outcome_and_one_slot_goes_straight_to_confirmation() {
    let b = booking(
        json!({"2026-10-02": [{"slot_token": "slot-z", "label": "09:00", "service": "svc-cut"}]}),
        |t| t,
    )
    .await;
    let (_sidecar, api) = b.start();
    let (_, out) = ended(&api, json!({"date": DAY, "service": "Haircut"})).await;
    assert!(out.contains("\"outcome\":\"no_options\""), "{out}");
    assert!(!out.starts_with("error"), "{out}");

    let r = ask(&api, json!({"date": "2026-10-02", "service": "Haircut"})).await;
    let confirm = pending(&r, "needs_confirmation");
    assert_eq!(confirm["facts"], json!({"time": "09:00"}));
    assert!(b.bookings().is_empty());
    let r = answer(
        &api,
        confirm,
        json!({"approve": false, "reason": "not that early"}),
    )
    .await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert!(last_tool_output(&r).contains("not that early"));
    assert!(b.bookings().is_empty(), "a refused booking ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_ids_and_a_missing_token_are_refused_without_showing_them() {
    let b = booking(
        json!({
            DAY: [{"slot_token": "slot-dup", "label": "10:00"}, {"slot_token": "slot-dup", "label": "11:00"}],
            "2026-10-02": [{"slot_token": "slot-a", "label": "10:00"}, {"label": "11:00"}]
        }),
        |t| t,
    )
    .await;
    let (_sidecar, api) = b.start();
    let (r, out) = ended(&api, json!({"date": DAY, "service": "Haircut"})).await;
    assert!(out.contains("options 1 and 2 have the same id"), "{out}");
    assert!(!r.text.contains("slot-dup"), "{}", r.text);
    let r = ask(&api, json!({"date": "2026-10-02", "service": "Haircut"})).await;
    let out = last_tool_output(&r);
    assert!(
        out.contains("option 2 has no id at `$.slot_token`"),
        "{out}"
    );
    assert!(b.bookings().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn match_selects_exactly_one_and_asks_for_several_or_none() {
    let b = booking(
        json!({
            DAY: [{"slot_token": "slot-a", "label": "10:00"}, {"slot_token": "slot-b", "label": "11:00"}],
            "2026-10-02": [{"slot_token": "slot-c", "label": "10:00"}, {"slot_token": "slot-d", "label": "10:00"}]
        }),
        |t| t,
    )
    .await;
    let (_sidecar, api) = b.start();
    // Trimmed, case-insensitive: exactly one is chosen by itself.
    let r = ask(
        &api,
        json!({"date": DAY, "service": "Haircut", "preferred_time": " 11:00 "}),
    )
    .await;
    let confirm = pending(&r, "needs_confirmation");
    assert_eq!(confirm["facts"], json!({"time": "11:00"}));
    // Several: still a choice.
    let r = ask(
        &api,
        json!({"date": "2026-10-02", "service": "Haircut", "preferred_time": "10:00"}),
    )
    .await;
    let item = pending(&r, "needs_selection");
    assert_eq!(item["options"].as_array().unwrap().len(), 2);
    assert!(item["note"].as_str().unwrap().contains("several"), "{item}");
    // None: the alternatives, nothing invented.
    let r = ask(
        &api,
        json!({"date": DAY, "service": "Haircut", "preferred_time": "4 PM"}),
    )
    .await;
    let item = pending(&r, "needs_selection");
    assert_eq!(item["options"].as_array().unwrap().len(), 2);
    assert!(
        item["note"].as_str().unwrap().contains("no option matches"),
        "{item}"
    );
    assert!(b.bookings().is_empty());
}

/// Polls the session until `ok` holds for it.
async fn until(api: &Api, id: &str, ok: impl Fn(&Reply) -> bool) -> Reply {
    eventually("the session gets there", PATIENCE, || async {
        let r = session(api, id).await;
        ok(&r).then_some(r)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_choice_is_refused_and_asked_again() {
    let b = booking(two_slots(), |t| t.replace("ttl_ms: 30000", "ttl_ms: 1")).await;
    let (_sidecar, api) = b.start();
    let r = ask(&api, json!({"date": DAY, "service": "Haircut"})).await;
    let id = id_of(&r);
    let item = pending(&r, "needs_selection").clone();
    assert!(item["expires_at"].is_string(), "{item}");
    let before = b.lookups();
    let late = answer(
        &api,
        &item,
        json!({"choice": option_labeled(&item, "10:00")["id"]}),
    )
    .await;
    assert_eq!(error_of(&late).0, 409, "{}", late.text);
    assert_eq!(error_of(&late).1, "continuation_expired", "{}", late.text);
    let again = until(&api, &id, |s| {
        s.json["status"] == "waiting_external"
            && s.json["pending"][0]["continuation_token"] != item["continuation_token"]
    })
    .await;
    pending(&again, "needs_selection");
    assert!(b.lookups() > before, "the lookup did not run again");
    assert!(b.bookings().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_context_drops_the_choice_and_asks_again() {
    let b = booking(two_slots(), |t| {
        t.replace(
            "  parameters:\n",
            "  parameters:\n    - {name: customer, scope: session, required: false}\n",
        )
    })
    .await;
    let (_sidecar, api) = b.start();
    let r = ask(&api, json!({"date": DAY, "service": "Haircut"})).await;
    let id = id_of(&r);
    let item = pending(&r, "needs_selection").clone();
    let before = b.lookups();
    let r = api
        .call(
            "PUT",
            &format!("/v1/sessions/{id}/params"),
            Some(OWNER),
            Some(&json!({"params": {"customer": "someone-else"}})),
        )
        .await;
    assert!(r.status < 300, "{}", r.text);
    let r = answer(
        &api,
        &item,
        json!({"choice": option_labeled(&item, "10:00")["id"]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Made in another context, the choice counts for nothing: asked anew.
    let again = pending(&r, "needs_selection");
    assert_ne!(again["continuation_token"], item["continuation_token"]);
    assert!(b.lookups() > before, "the lookups were not run again");
    assert!(b.bookings().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_or_410_runs_the_lookups_again_and_asks_again() {
    let b = booking(two_slots(), |t| t).await;
    let (_sidecar, api) = b.start();
    for (status, file) in [("409", "taken.json"), ("410", "gone.json")] {
        let r = ask(&api, json!({"date": DAY, "service": "Haircut"})).await;
        let item = pending(&r, "needs_selection");
        let r = answer(
            &api,
            item,
            json!({"choice": option_labeled(item, "11:00")["id"]}),
        )
        .await;
        let confirm = pending(&r, "needs_confirmation");
        // Meanwhile the slot went.
        b.put(file, json!(["slot-b"]));
        let before = b.lookups();
        let r = answer(&api, confirm, json!({"approve": true})).await;
        assert_eq!(r.status, 200, "{status}: {}", r.text);
        // A new review step, never another slot booked unasked.
        let item = pending(&r, "needs_selection");
        assert!(b.lookups() > before, "{status}: no fresh lookup");
        assert!(
            b.bookings().is_empty(),
            "{status}: booked {:?}",
            b.bookings()
        );
        let r = answer(
            &api,
            item,
            json!({"choice": option_labeled(item, "10:00")["id"]}),
        )
        .await;
        let confirm = pending(&r, "needs_confirmation");
        assert_eq!(confirm["facts"], json!({"time": "10:00"}));
        std::fs::remove_file(b.store.join(file)).unwrap();
        let api2 = &api;
        let r = answer(api2, confirm, json!({"approve": false})).await;
        assert_eq!(r.json["status"], "idle", "{}", r.text);
    }
    assert!(b.bookings().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_lookup_asks_for_the_service_first_and_a_chat_message_chooses() {
    let b = booking(two_slots(), |t| t).await;
    let (_sidecar, api) = b.start();
    let r = ask(&api, json!({"date": DAY})).await;
    let id = id_of(&r);
    // The deepest lookup first: which service (its ids are not sensitive).
    let item = pending(&r, "needs_selection");
    assert_eq!(item["lookup"], "bash_services");
    assert_eq!(option_labeled(item, "Colour")["id"], "svc-colour");
    // "2" is the second option as shown.
    let r = message(&api, &id, "2").await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Colour has one slot: nothing to choose, only to confirm.
    let confirm = pending(&r, "needs_confirmation");
    assert_eq!(confirm["facts"], json!({"time": "10:00"}));
    let r = answer(&api, confirm, json!({"approve": true})).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(b.bookings(), vec![format!("{DAY} slot-c")]);

    // An exact label chooses too; anything else is a message, refused while waiting.
    let r = ask(&api, json!({"date": DAY})).await;
    let id = id_of(&r);
    let nope = message(&api, &id, "the blue one").await;
    assert_eq!(error_of(&nope).1, "waiting_external", "{}", nope.text);
    let r = message(&api, &id, "Haircut").await;
    let item = pending(&r, "needs_selection");
    assert_eq!(item["lookup"], "bash_availability");
}

#[test]
fn the_example_checks_and_hides_the_slot_token_from_the_model() {
    let out = std::process::Command::new(bin())
        .args(["check", "--agent-file"])
        .arg(repo().join("examples/booking/agent.yaml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("bash_book(date, service?, preferred_time?)"),
        "{text}"
    );
    assert!(
        text.contains("depends on: availability (fills slot_token)"),
        "{text}"
    );
}

/// `run` asks on the terminal: the options by number, then y/n for the
/// prepared booking with its facts; a canary key shows nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_asks_for_the_choice_and_the_confirmation_on_the_terminal() {
    let b = booking(two_slots(), |t| t).await;
    let prompt = format!("book {}", json!({"date": DAY, "service": "Haircut"}));
    let agent = b.agent.display().to_string();
    let store = format!("booking_store={}", b.store.display());
    let args = [
        "run",
        "--agent-file",
        &agent,
        "--set",
        &store,
        "--prompt",
        &prompt,
    ];
    let out = tokio::task::block_in_place(|| {
        on_a_terminal(&args, &[("BINDERY_PARAM_API_KEY", CANARY)], false, "2\ny\n")
    });
    let (stdout, stderr) = (&out.stdout, &out.stderr);
    assert_eq!(out.code, 0, "{stderr}");
    assert!(stderr.contains("  1. 10:00\n  2. 11:00\n"), "{stderr}");
    assert!(
        stderr.contains(r#"({"time":"11:00"}). Approve? [y/N]"#),
        "{stderr}"
    );
    assert!(stdout.contains("\"booked\": true"), "{stdout}");
    assert_eq!(b.bookings(), vec![format!("{DAY} slot-b")]);
    for s in [&stdout, &stderr] {
        assert!(!s.contains(CANARY), "{s}");
    }
    // The slot token is in no prompt (only the operator's log of the command line).
    let asked: Vec<&str> = stderr.lines().filter(|l| !l.contains(" INFO ")).collect();
    assert!(!asked.join("\n").contains("slot-b"), "{stderr}");
    assert!(!stdout.contains("slot-b"), "{stdout}");
}

/// `tool-call` orchestrates `depends_on` as `run` does: the lookups, then
/// the choice and the confirmation asked on the terminal; no model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_asks_for_the_choice_and_the_confirmation_on_the_terminal() {
    let b = booking(two_slots(), |t| t).await;
    let agent = b.agent.display().to_string();
    let store = format!("booking_store={}", b.store.display());
    let call = json!({"date": DAY, "service": "Haircut"}).to_string();
    let args = [
        "tool-call",
        "--agent-file",
        &agent,
        "--set",
        &store,
        "--tool",
        "bash_book",
        "--args",
        &call,
    ];
    let out = tokio::task::block_in_place(|| {
        on_a_terminal(&args, &[("BINDERY_PARAM_API_KEY", CANARY)], false, "2\ny\n")
    });
    let (stdout, stderr) = (&out.stdout, &out.stderr);
    assert_eq!(out.code, 0, "{stderr}");
    assert!(stderr.contains("  1. 10:00\n  2. 11:00\n"), "{stderr}");
    assert!(
        stderr.contains(r#"({"time":"11:00"}). Approve? [y/N]"#),
        "{stderr}"
    );
    assert!(stdout.contains("\"booked\": true"), "{stdout}");
    assert_eq!(b.bookings(), vec![format!("{DAY} slot-b")]);
    for s in [&stdout, &stderr] {
        assert!(!s.contains(CANARY), "{s}");
    }
}

/// Without a terminal: `--choose` takes an option (by label here) and
/// `--yes` approves; a refused confirmation books nothing; an option that
/// is not offered is an error naming the options.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_chooses_and_approves_from_its_flags() {
    let b = booking(two_slots(), |t| t).await;
    let call = |extra: &[&str]| {
        let out = std::process::Command::new(bin())
            .args(["tool-call", "--agent-file"])
            .arg(&b.agent)
            .args(["--set", &format!("booking_store={}", b.store.display())])
            .args(["--tool", "bash_book"])
            .args([
                "--args",
                &json!({"date": DAY, "service": "Haircut"}).to_string(),
            ])
            .args(extra)
            .env("BINDERY_PARAM_API_KEY", CANARY)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // No answer on stdin: the confirmation is refused, nothing is booked.
    let (code, _, stderr) = call(&["--choose", "10:00"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(b.bookings().is_empty());
    let (code, _, stderr) = call(&["--choose", "12:00", "--yes"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--choose `12:00` is none of the options of bash_book"),
        "{stderr}"
    );
    assert!(
        stderr.contains("(10:00)") && stderr.contains("(11:00)"),
        "{stderr}"
    );
    let (code, stdout, stderr) = call(&["--choose", "10:00", "--yes"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("\"booked\": true"), "{stdout}");
    assert_eq!(b.bookings(), vec![format!("{DAY} slot-a")]);
    // The slot token is in no prompt (only the operator's log of the command line).
    let asked: Vec<&str> = stderr.lines().filter(|l| !l.contains(" INFO ")).collect();
    assert!(!asked.join("\n").contains("slot-a"), "{stderr}");
}

/// A booking API on 127.0.0.1 described by OpenAPI: `getAvailability` (a
/// GET, so read-only) and `createBooking` (a POST), which refuses its first
/// call with 409. What it saw: `GET <date>` and `POST <slot>` lines.
async fn booking_api() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use axum::extract::{Query, State};
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    use axum::{Json, Router};
    type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;
    let doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "booking", "version": "1"},
        "paths": {
            "/availability": {"get": {
                "operationId": "getAvailability",
                "parameters": [{"name": "date", "in": "query", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "slots"}}
            }},
            "/bookings": {"post": {
                "operationId": "createBooking",
                "requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "required": ["date", "slot_token"],
                    "properties": {"date": {"type": "string"}, "slot_token": {"type": "string"}}
                }}}},
                "responses": {"201": {"description": "booked"}, "409": {"description": "taken"}}
            }}
        }
    });
    let seen: Seen = Default::default();
    let app = Router::new()
        .route("/openapi.json", get(move || async move { Json(doc) }))
        .route(
            "/availability",
            get(|State(seen): State<Seen>, Query(q): Query<std::collections::BTreeMap<String, String>>| async move {
                seen.lock().unwrap().push(format!("GET {}", q["date"]));
                Json(json!({"data": {"slots": [
                    {"slot_token": "tok-1", "label": "10:00"}, {"slot_token": "tok-2", "label": "11:00"}
                ]}}))
            }),
        )
        .route(
            "/bookings",
            post(|State(seen): State<Seen>, Json(b): Json<Value>| async move {
                let mut seen = seen.lock().unwrap();
                let first = !seen.iter().any(|l| l.starts_with("POST"));
                seen.push(format!("POST {}", b["slot_token"].as_str().unwrap_or("")));
                if first {
                    (StatusCode::CONFLICT, "the slot was taken meanwhile").into_response()
                } else {
                    (StatusCode::CREATED, "booked").into_response()
                }
            }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

/// The same flow through an OpenAPI toolbox: the GET is a lookup without
/// any declaration, the POST waits for confirmation, and its 409 brings a
/// fresh lookup and a new choice instead of another booking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openapi_get_is_the_lookup_and_a_409_from_the_post_asks_again() {
    let (addr, seen) = booking_api().await;
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(|req: &Value| {
        let last = last_message(req);
        match last["role"].as_str() {
            Some("tool") => MockReply::text("done"),
            _ => MockReply::tool_call("createBooking", json!({"date": DAY})),
        }
    })
    .await;
    let agent = dir.path().join("api.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: booking
spec:
  model: {{url: "{url}", name: mock-model}}
  toolboxes:
    - openapi:
        spec: "http://{addr}/openapi.json"
        baseUrl: "http://{addr}"
        tools:
          - tool: createBooking
            depends_on:
              - tool: getAvailability
                arguments: {{date: $.date}}
                select: {{items_path: $.data.slots, id_path: $.slot_token, label_path: $.label, id_sensitive: true}}
                map: {{$.slot_token: $.slot_token}}
"#,
            url = mock.url()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let (_sidecar, api) = serve(&agent, &sqlite_in(dir.path()), &[], &[], dir.path());
    let seen_now = || seen.lock().unwrap().clone();
    let r = ask(&api, json!({})).await;
    let item = pending(&r, "needs_selection");
    let r = answer(
        &api,
        item,
        json!({"choice": option_labeled(item, "10:00")["id"]}),
    )
    .await;
    let confirm = pending(&r, "needs_confirmation");
    assert_eq!(
        seen_now(),
        vec![format!("GET {DAY}")],
        "a write before confirmation"
    );
    let r = answer(&api, confirm, json!({"approve": true})).await;
    let item = pending(&r, "needs_selection");
    assert!(item["note"].as_str().is_none());
    assert_eq!(
        seen_now(),
        vec![
            format!("GET {DAY}"),
            "POST tok-1".into(),
            format!("GET {DAY}")
        ]
    );
    let r = answer(
        &api,
        item,
        json!({"choice": option_labeled(item, "11:00")["id"]}),
    )
    .await;
    let confirm = pending(&r, "needs_confirmation");
    assert!(
        confirm["note"].as_str().unwrap().contains("409/410"),
        "{confirm}"
    );
    let r = answer(&api, confirm, json!({"approve": true})).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(seen_now().last().unwrap(), "POST tok-2");
    assert!(last_tool_output(&r).contains("booked"), "{}", r.text);
}

/// `serve` refuses to start on a dependency mistake, naming the file and the tool.
#[test]
fn serve_does_not_start_with_an_effectful_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/invalid/depends-effectful.yaml");
    let out = std::process::Command::new(bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            &sqlite_in(dir.path()),
        ])
        .arg("--agent-file")
        .arg(&fixture)
        .env("BINDERY_OWNER_TOKEN", OWNER)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("depends-effectful.yaml: agent `depends-effectful`, tool `bash_probe`, depends_on 1 (tool `lister`): `bash_lister` may change something"),
        "{stderr}"
    );
}
