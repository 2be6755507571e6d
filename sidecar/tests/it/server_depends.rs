//! API-owned inputs through the binary, where only it shows them: the
//! booking flow end to end with a canary API key in no event, store file
//! or log; the CLI's prompts and flags; `check` and `serve` refusing a
//! dependency mistake. Their logic over the API (input, selection,
//! confirmation, expiry, a changed context, 409/410, chained lookups,
//! OpenAPI lookups) is tested in process
//! (`sidecar/api/tests/inproc/depends.rs`).

use crate::common::booking::*;
use crate::common::*;
use bindery_tests::fixtures::session::{
    answer_item as answer, id_of, option_labeled, pending, session,
};
use bindery_tests::mock_llm::tool_schema;
use serde_json::json;

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
