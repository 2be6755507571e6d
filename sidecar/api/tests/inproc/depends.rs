//! API-owned inputs (`depends_on`) in process: the booking example's
//! tools (real bash tools over a file-backed fake API), a model script
//! that only extracts what the user owns, and the pending items a
//! dependency leaves: input, selection, confirmation. The write count
//! stays zero until a person confirms. The end-to-end secrecy check (the
//! API key in no event, store file or log), the CLI's prompts and `serve`'s
//! refusal stay in the sidecar's `tests/it/server_depends.rs`.

use crate::harness::*;
use bindery_tests::eventually::{eventually, PATIENCE};
use bindery_tests::fixtures::booking::{self, ask, two_slots, BookingFiles, DAY};
use bindery_tests::fixtures::session::{
    answer_item as answer, id_of, message, option_labeled, pending, session,
};
use bindery_tests::mock_llm::{last_message, MockReply};
use serde_json::{json, Value};

/// The booking example ([`BookingFiles`]) in a directory of its own.
struct Booking {
    dir: tempfile::TempDir,
    files: BookingFiles,
}

impl std::ops::Deref for Booking {
    type Target = BookingFiles;
    fn deref(&self) -> &BookingFiles {
        &self.files
    }
}

/// The example agent with its tools where they are, its fake API's data
/// in a temporary directory (`slots` by day), and `edit` applied to its
/// text.
async fn booking(slots: Value, edit: impl Fn(String) -> String) -> Booking {
    let dir = tempfile::tempdir().unwrap();
    let files = BookingFiles::write(dir.path(), MODEL_URL, slots, edit);
    Booking { dir, files }
}

impl Booking {
    /// A server of the agent, its fake API's directory and API key given
    /// as `serve --set` and `BINDERY_PARAM_API_KEY` give them.
    async fn start(&self) -> Server {
        let store = format!("booking_store={}", self.store.display());
        let load = process_values(&[("--set", &store)], &[("BINDERY_PARAM_API_KEY", CANARY)]);
        Server::with_options(
            std::slice::from_ref(&self.agent),
            self.dir.path(),
            booking::script,
            load,
        )
        .await
    }
}

/// Ask `book {args}` of a run that ends without waiting: its tool's output.
async fn ended(api: &Api, args: Value) -> (Reply, String) {
    let r = ask(api, args).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let out = last_tool_output(&r);
    (r, out)
}

#[tokio::test]
async fn no_date_asks_for_input_before_any_lookup() {
    let b = booking(two_slots(), |t| t).await;
    let api = &b.start().await.api;
    let r = ask(api, json!({"service": "Haircut"})).await;
    let item = pending(&r, "needs_input");
    assert_eq!(item["missing"], json!(["date"]));
    assert_eq!(b.lookups(), 0, "a lookup ran before the user's date");
    let wrong = answer(api, item, json!({"choice": "x"})).await;
    assert_eq!(wrong.status, 400, "{}", wrong.text);
    let r = answer(api, item, json!({"input": {"date": DAY}})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    pending(&r, "needs_selection");
    assert!(b.bookings().is_empty());
}

#[tokio::test]
async fn zero_slots_are_an_outcome_and_one_slot_goes_straight_to_confirmation() {
    let b = booking(
        json!({"2026-10-02": [{"slot_token": "slot-z", "label": "09:00", "service": "svc-cut"}]}),
        |t| t,
    )
    .await;
    let api = &b.start().await.api;
    let (_, out) = ended(api, json!({"date": DAY, "service": "Haircut"})).await;
    assert!(out.contains("\"outcome\":\"no_options\""), "{out}");
    assert!(!out.starts_with("error"), "{out}");

    let r = ask(api, json!({"date": "2026-10-02", "service": "Haircut"})).await;
    let confirm = pending(&r, "needs_confirmation");
    assert_eq!(confirm["facts"], json!({"time": "09:00"}));
    assert!(b.bookings().is_empty());
    let r = answer(
        api,
        confirm,
        json!({"approve": false, "reason": "not that early"}),
    )
    .await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert!(last_tool_output(&r).contains("not that early"));
    assert!(b.bookings().is_empty(), "a refused booking ran");
}

#[tokio::test]
async fn duplicate_ids_and_a_missing_token_are_refused_without_showing_them() {
    let b = booking(
        json!({
            DAY: [{"slot_token": "slot-dup", "label": "10:00"}, {"slot_token": "slot-dup", "label": "11:00"}],
            "2026-10-02": [{"slot_token": "slot-a", "label": "10:00"}, {"label": "11:00"}]
        }),
        |t| t,
    )
    .await;
    let api = &b.start().await.api;
    let (r, out) = ended(api, json!({"date": DAY, "service": "Haircut"})).await;
    assert!(out.contains("options 1 and 2 have the same id"), "{out}");
    assert!(!r.text.contains("slot-dup"), "{}", r.text);
    let r = ask(api, json!({"date": "2026-10-02", "service": "Haircut"})).await;
    let out = last_tool_output(&r);
    assert!(
        out.contains("option 2 has no id at `$.slot_token`"),
        "{out}"
    );
    assert!(b.bookings().is_empty());
}

#[tokio::test]
async fn match_selects_exactly_one_and_asks_for_several_or_none() {
    let b = booking(
        json!({
            DAY: [{"slot_token": "slot-a", "label": "10:00"}, {"slot_token": "slot-b", "label": "11:00"}],
            "2026-10-02": [{"slot_token": "slot-c", "label": "10:00"}, {"slot_token": "slot-d", "label": "10:00"}]
        }),
        |t| t,
    )
    .await;
    let api = &b.start().await.api;
    // Trimmed, case-insensitive: exactly one is chosen by itself.
    let r = ask(
        api,
        json!({"date": DAY, "service": "Haircut", "preferred_time": " 11:00 "}),
    )
    .await;
    let confirm = pending(&r, "needs_confirmation");
    assert_eq!(confirm["facts"], json!({"time": "11:00"}));
    // Several: still a choice.
    let r = ask(
        api,
        json!({"date": "2026-10-02", "service": "Haircut", "preferred_time": "10:00"}),
    )
    .await;
    let item = pending(&r, "needs_selection");
    assert_eq!(item["options"].as_array().unwrap().len(), 2);
    assert!(item["note"].as_str().unwrap().contains("several"), "{item}");
    // None: the alternatives, nothing invented.
    let r = ask(
        api,
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

#[tokio::test]
async fn an_expired_choice_is_refused_and_asked_again() {
    let b = booking(two_slots(), |t| t.replace("ttl_ms: 30000", "ttl_ms: 1")).await;
    let api = &b.start().await.api;
    let r = ask(api, json!({"date": DAY, "service": "Haircut"})).await;
    let id = id_of(&r);
    let item = pending(&r, "needs_selection").clone();
    assert!(item["expires_at"].is_string(), "{item}");
    let before = b.lookups();
    let late = answer(
        api,
        &item,
        json!({"choice": option_labeled(&item, "10:00")["id"]}),
    )
    .await;
    assert_eq!(error_of(&late).0, 409, "{}", late.text);
    assert_eq!(error_of(&late).1, "continuation_expired", "{}", late.text);
    let again = until(api, &id, |s| {
        s.json["status"] == "waiting_external"
            && s.json["pending"][0]["continuation_token"] != item["continuation_token"]
    })
    .await;
    pending(&again, "needs_selection");
    assert!(b.lookups() > before, "the lookup did not run again");
    assert!(b.bookings().is_empty());
}

#[tokio::test]
async fn a_changed_context_drops_the_choice_and_asks_again() {
    let b = booking(two_slots(), |t| {
        t.replace(
            "  parameters:\n",
            "  parameters:\n    - {name: customer, scope: session, required: false}\n",
        )
    })
    .await;
    let api = &b.start().await.api;
    let r = ask(api, json!({"date": DAY, "service": "Haircut"})).await;
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
        api,
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

#[tokio::test]
async fn a_409_or_410_runs_the_lookups_again_and_asks_again() {
    let b = booking(two_slots(), |t| t).await;
    let api = &b.start().await.api;
    for (status, file) in [("409", "taken.json"), ("410", "gone.json")] {
        let r = ask(api, json!({"date": DAY, "service": "Haircut"})).await;
        let item = pending(&r, "needs_selection");
        let r = answer(
            api,
            item,
            json!({"choice": option_labeled(item, "11:00")["id"]}),
        )
        .await;
        let confirm = pending(&r, "needs_confirmation");
        // Meanwhile the slot went.
        b.put(file, json!(["slot-b"]));
        let before = b.lookups();
        let r = answer(api, confirm, json!({"approve": true})).await;
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
            api,
            item,
            json!({"choice": option_labeled(item, "10:00")["id"]}),
        )
        .await;
        let confirm = pending(&r, "needs_confirmation");
        assert_eq!(confirm["facts"], json!({"time": "10:00"}));
        std::fs::remove_file(b.store.join(file)).unwrap();
        let r = answer(api, confirm, json!({"approve": false})).await;
        assert_eq!(r.json["status"], "idle", "{}", r.text);
    }
    assert!(b.bookings().is_empty());
}

#[tokio::test]
async fn a_chained_lookup_asks_for_the_service_first_and_a_chat_message_chooses() {
    let b = booking(two_slots(), |t| t).await;
    let api = &b.start().await.api;
    let r = ask(api, json!({"date": DAY})).await;
    let id = id_of(&r);
    // The deepest lookup first: which service (its ids are not sensitive).
    let item = pending(&r, "needs_selection");
    assert_eq!(item["lookup"], "bash_services");
    assert_eq!(option_labeled(item, "Colour")["id"], "svc-colour");
    // "2" is the second option as shown.
    let r = message(api, &id, "2").await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Colour has one slot: nothing to choose, only to confirm.
    let confirm = pending(&r, "needs_confirmation");
    assert_eq!(confirm["facts"], json!({"time": "10:00"}));
    let r = answer(api, confirm, json!({"approve": true})).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(b.bookings(), vec![format!("{DAY} slot-c")]);

    // An exact label chooses too; anything else is a message, refused while waiting.
    let r = ask(api, json!({"date": DAY})).await;
    let id = id_of(&r);
    let nope = message(api, &id, "the blue one").await;
    assert_eq!(error_of(&nope).1, "waiting_external", "{}", nope.text);
    let r = message(api, &id, "Haircut").await;
    let item = pending(&r, "needs_selection");
    assert_eq!(item["lookup"], "bash_availability");
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
#[tokio::test]
async fn an_openapi_get_is_the_lookup_and_a_409_from_the_post_asks_again() {
    let (addr, seen) = booking_api().await;
    let dir = tempfile::tempdir().unwrap();
    let script = |req: &Value| {
        let last = last_message(req);
        match last["role"].as_str() {
            Some("tool") => MockReply::text("done"),
            _ => MockReply::tool_call("createBooking", json!({"date": DAY})),
        }
    };
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
            url = MODEL_URL
        ),
    )
    .unwrap();
    let api = &Server::start(&[agent], dir.path(), script).await.api;
    let seen_now = || seen.lock().unwrap().clone();
    let r = ask(api, json!({})).await;
    let item = pending(&r, "needs_selection");
    let r = answer(
        api,
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
    let r = answer(api, confirm, json!({"approve": true})).await;
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
        api,
        item,
        json!({"choice": option_labeled(item, "11:00")["id"]}),
    )
    .await;
    let confirm = pending(&r, "needs_confirmation");
    assert!(
        confirm["note"].as_str().unwrap().contains("409/410"),
        "{confirm}"
    );
    let r = answer(api, confirm, json!({"approve": true})).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(seen_now().last().unwrap(), "POST tok-2");
    assert!(last_tool_output(&r).contains("booked"), "{}", r.text);
}
