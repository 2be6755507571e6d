//! Hostile tools that print secrets in every form the scrubber promises to
//! catch, cut at every point a limit can cut them.
//!
//! Each test runs the real server with a session whose secret `token` is
//! [`CANARY`], lets the mock model call one hostile tool and answer with
//! what it got, then looks at every place the tool's output reaches: the
//! model's requests, the store's files, the event stream, the session's
//! view. None may hold the canary, nor the first [`PREFIX`] bytes of it or
//! of any of its encodings.

use std::path::{Path, PathBuf};

use crate::common::*;
use bindery_tests::mock_llm::{last_message, tool_results, MockLlm, MockReply};
use serde_json::{json, Value};

/// The session's secret: non-ASCII (one character outside the BMP), and
/// characters JSON, URL and form encoders each change. Its first bytes
/// occur nowhere else in the test.
const CANARY: &str = "Zq9!adv-SEKRIT&<\u{e9}>/+?= \"q\" \\ \u{1F600} end";

/// The longest run of a secret's leading bytes that may show: one less
/// than the scrubber's shortest value.
const PREFIX: usize = bindery_params::scrub::MIN_LEN;

/// The hostile tool `forms`: prints its token (bound from the session's
/// secret, in its environment) in every promised form, one `name: form`
/// entry each, base64 forms wrapped at several widths.
const FORMS_TOOL: &str = r#"#!/usr/bin/env python3
import base64, json, os, re, sys, urllib.parse
if sys.argv[1:] == ["describe"]:
    print(json.dumps({"slug": "forms", "description": "Prints its token.", "args": [
        {"name": "token", "description": "a token", "type": "string",
         "backing_type": "string", "arity": "single", "mode": "env"}]}))
    sys.exit(0)
v = os.environ["TOKEN"]
b = v.encode()

def esc(c, upper):
    units = c.encode("utf-16-be")
    f = "\\u%04X" if upper else "\\u%04x"
    return "".join(f % int.from_bytes(units[i:i + 2], "big") for i in range(0, len(units), 2))

forms = {
    "plain": v,
    "json-all-lower": "".join(esc(c, False) for c in v),
    "json-all-upper": "".join(esc(c, True) for c in v),
    "json-python": json.dumps(v),
    "json-go": json.dumps(v, ensure_ascii=False)
        .replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e"),
    "json-mixed": "".join(esc(c, i % 4 == 0) if i % 2 == 0 else json.dumps(c, ensure_ascii=False)[1:-1]
                          for i, c in enumerate(v)),
    "percent-upper": urllib.parse.quote(v, safe=""),
    "percent-lower": re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(v, safe="")),
    "form": urllib.parse.urlencode({"t": v}),
    "hex-lower": b.hex(),
    "hex-upper": b.hex().upper(),
}
for alphabet, encode in (("std", base64.b64encode), ("url", base64.urlsafe_b64encode)):
    for pad in (True, False):
        for shift in (0, 1, 2):
            text = encode(b"xy"[:shift] + b + b"!").decode()
            if not pad:
                text = text.rstrip("=")
            for width in (0, 1, 4, 64, 76):
                for nl in ("\n", "\r\n"):
                    if width == 0 and nl == "\r\n":
                        continue
                    wrapped = nl.join(text[i:i + width] for i in range(0, len(text), width)) if width else text
                    kind = "crlf" if nl == "\r\n" else "lf"
                    forms[f"b64-{alphabet}-{'pad' if pad else 'nopad'}-s{shift}-w{width}-{kind}"] = wrapped
for name, text in forms.items():
    sys.stdout.write(f"{name}: {text}\n")
print(f"forms: {len(forms)}")
"#;

/// What one call of a hostile tool left behind.
struct Seen {
    /// The tool's result as the model got it.
    result: String,
    /// `(place, text)` for every place the output may reach.
    places: Vec<(String, String)>,
}

/// An agent with the secret session parameter `token` bound to the `token`
/// argument of every bash tool in `tools`, plus `extra` toolboxes (YAML
/// list items indented four spaces).
fn agent_file(dir: &Path, model_url: &str, tools: &Path, extra: &str) -> PathBuf {
    let path = dir.join("hostile.yaml");
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: hostile
spec:
  model: {{url: "{model_url}", name: mock-model}}
  systemPrompt: You are HOSTILE.
  parameters:
    - {{name: token, secret: true, scope: session}}
  toolboxes:
    - bash:
        directory: "{tools}"
        bindings:
          - {{arg: token, value: {{param: token}}}}
{extra}"#,
            tools = tools.display()
        ),
    )
    .unwrap();
    path
}

/// Write each `(name, script)` as an executable into a fresh tools
/// directory under `dir`.
fn tools_dir(dir: &Path, tools: &[(&str, &str)]) -> PathBuf {
    let tools_dir = dir.join("tools");
    std::fs::create_dir_all(&tools_dir).unwrap();
    for (name, script) in tools {
        executable(&tools_dir.join(name), script);
    }
    tools_dir
}

/// Start the server (with `flags`) on an agent with the bash tools
/// `tools` and `extra` toolboxes; the model calls `tool` once and answers
/// with its result.
async fn call_once(
    tools: &[(&str, &str)],
    extra: &str,
    flags: &[&str],
    tool: &'static str,
) -> Seen {
    let mock = MockLlm::start(move |req: &Value| {
        if tool_results(req).is_empty() {
            MockReply::tool_call(tool, json!({}))
        } else {
            MockReply::text(format!(
                "the tool said: {}",
                last_message(req)["content"].as_str().unwrap_or("")
            ))
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::create_dir_all(dir.path().join("store")).unwrap();
    let tools = tools_dir(dir.path(), tools);
    let agent = agent_file(dir.path(), &mock.url(), &tools, extra);
    let store = sqlite_in(&dir.path().join("store"));
    let (mut sidecar, api) = serve(&agent, &store, flags, &[], dir.path());
    let id = new_session(
        &api,
        json!({"agent": "hostile", "params": {"token": CANARY}}),
    )
    .await;
    let (status, events) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut events = events.unwrap();
    let reply = message_waited(&api, &id, "call your tool").await;
    assert_eq!(reply.json["status"], "idle", "{}", reply.text);
    let seen = events
        .until("run_finished", std::time::Duration::from_secs(30))
        .await;
    assert!(seen.iter().any(|e| e.event == "tool_result"), "{seen:?}");
    // An open stream would hold the server's graceful shutdown.
    let stream = std::mem::take(&mut events.raw);
    drop(events);
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    sidecar.stop();
    let result = mock
        .requests()
        .iter()
        .flat_map(|r| tool_results(r).into_iter().map(str::to_string))
        .next_back()
        .expect("the tool's result reached the model");
    let mut places = vec![
        ("the reply".to_string(), reply.text),
        ("the session".to_string(), view.text),
        ("the event stream".to_string(), stream),
        (
            "the store".to_string(),
            String::from_utf8_lossy(&raw_files(&dir.path().join("store"), "")).into_owned(),
        ),
    ];
    for (_, body) in mock.raw_requests() {
        places.push(("a model request".to_string(), body));
    }
    Seen { result, places }
}

/// `text` as it shows inside a JSON string.
fn json_escaped(text: &str) -> String {
    let s = serde_json::to_string(text).unwrap();
    s[1..s.len() - 1].to_string()
}

/// The canary's leading bytes in the forms a place can hold them: as they
/// are, JSON-escaped, and the first characters of each of its encodings.
fn leading_forms() -> Vec<String> {
    let head: String = CANARY.chars().take(PREFIX).collect();
    let bytes = CANARY.as_bytes();
    let mut out = vec![head.clone(), json_escaped(&head)];
    let hex = hex::encode(bytes);
    for encoded in [
        hex.clone(),
        hex.to_uppercase(),
        base64(bytes, false),
        base64(bytes, true),
        // `Zq9!`: `!` is the first character percent-encoding changes.
        format!("{}%21", &head[..3]),
        CANARY
            .chars()
            .take(2)
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect(),
    ] {
        let lead: String = encoded.chars().take(2 * PREFIX).collect();
        out.push(json_escaped(&lead));
        out.push(lead);
    }
    out
}

/// Standard (or URL-safe) padded base64, for the leading forms.
fn base64(data: &[u8], url: bool) -> String {
    let alphabet: &[u8] = if url {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(alphabet[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// No place holds the canary or the leading bytes of any of its forms.
fn assert_nothing_leaked(seen: &Seen) {
    for lead in leading_forms() {
        for (place, text) in &seen.places {
            assert!(
                !text.contains(&lead),
                "{lead:?} (the start of a form of the secret) is in {place}:\n{text}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_promised_form_is_scrubbed() {
    let seen = call_once(&[("forms", FORMS_TOOL)], "", &[], "bash_forms").await;
    let count: usize = seen
        .result
        .lines()
        .find_map(|l| l.strip_prefix("forms: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the tool printed its forms:\n{}", seen.result));
    assert!(count > 100, "{}", seen.result);
    // One marker a form: each was replaced whole, not in pieces.
    let markers = seen.result.matches("<secret:token>").count();
    let missed: Vec<&str> = seen
        .result
        .lines()
        .filter(|l| l.contains(": ") && !l.contains("<secret:token>") && !l.starts_with("forms:"))
        .collect();
    assert_eq!(
        markers, count,
        "forms not scrubbed to one marker each: {missed:#?}\n{}",
        seen.result
    );
    assert_nothing_leaked(&seen);
}

/// The bash tool `cut`: prints `limit - offset` bytes of padding, then the
/// form `form` of its token, then more, to stdout or (failing) to stderr:
/// the tool's limit falls `offset` bytes into the form.
const CUT_TOOL: &str = r#"#!/usr/bin/env python3
import base64, json, os, sys
if sys.argv[1:] == ["describe"]:
    arg = lambda name, mode: {"name": name, "description": name, "type": "string",
                              "backing_type": "string", "arity": "single", "mode": mode}
    print(json.dumps({"slug": "cut", "description": "Prints its token at a cut.", "args": [
        arg("token", "env"), arg("form", "positional"), arg("offset", "positional"),
        arg("stream", "positional")]}))
    sys.exit(0)
form, offset, stream = sys.argv[2], int(sys.argv[3]), sys.argv[4]
v = os.environ["TOKEN"]
b = v.encode()
text = {
    "plain": v,
    "base64": "\n".join(base64.b64encode(b).decode()[i:i + 76] for i in range(0, 200, 76)),
    "json": "".join("\\u%04x" % int.from_bytes(c.encode("utf-16-be")[i:i + 2], "big")
                    for c in v for i in range(0, len(c.encode("utf-16-be")), 2)),
    "hex": b.hex(),
}[form]
limit = 1000 if stream == "stdout" else 16 * 1024
out = sys.stdout if stream == "stdout" else sys.stderr
out.write("x" * (limit - offset) + text + "\n" + "y" * 3000 + "\n")
out.flush()
sys.exit(0 if stream == "stdout" else 1)
"#;

/// The forms the cut tests print, and offsets into each: every offset
/// lies inside every form.
const CUT_FORMS: [&str; 4] = ["plain", "base64", "json", "hex"];
const CUT_OFFSETS: [usize; 4] = [1, 3, 11, 30];

/// The same forms as `CUT_TOOL` prints them.
fn cut_form(form: &str) -> String {
    match form {
        "plain" => CANARY.to_string(),
        "base64" => base64(CANARY.as_bytes(), false)
            .as_bytes()
            .chunks(76)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect::<Vec<_>>()
            .join("\n"),
        "json" => CANARY
            .encode_utf16()
            .map(|u| format!("\\u{u:04x}"))
            .collect(),
        "hex" => hex::encode(CANARY),
        other => panic!("no form {other}"),
    }
}

/// A model that calls `tool` with the arguments the user's message holds
/// (as JSON), then answers with the result.
/// Call `tool` once with each of the arguments the user message lists (a
/// JSON array), all in one turn; then answer with the last result.
fn call_as_told(tool: &'static str) -> impl Fn(&Value) -> MockReply {
    move |req: &Value| {
        let last = last_message(req);
        match last["role"].as_str() {
            Some("tool") => MockReply::text(format!(
                "the tool said: {}",
                last["content"].as_str().unwrap_or("")
            )),
            _ => {
                let calls: Vec<Value> =
                    serde_json::from_str(last["content"].as_str().unwrap_or("[]")).unwrap();
                MockReply::ToolCalls(calls.into_iter().map(|c| (tool.to_string(), c)).collect())
            }
        }
    }
}

/// An API whose `pad` operation answers 200 with `limit - offset` bytes of
/// padding and then a form of the canary (which the session holds: the
/// API need not be sent it to print it), and whose `reject` answers 401
/// the same way, at the error excerpt's limit.
async fn start_padding_api() -> std::net::SocketAddr {
    use axum::extract::Query;
    use axum::routing::get;
    use std::collections::HashMap;
    fn padded(q: &HashMap<String, String>, limit: usize) -> String {
        let offset: usize = q["offset"].parse().unwrap();
        format!(
            "{}{}\n{}",
            "x".repeat(limit - offset),
            cut_form(&q["form"]),
            "y".repeat(3000)
        )
    }
    let param = |name: &str| json!({"name": name, "in": "query", "required": true, "schema": {"type": "string"}});
    let doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "padding", "version": "1"},
        "paths": {
            "/pad": {"get": {"operationId": "pad_http", "parameters": [param("form"), param("offset")],
                "responses": {"200": {"description": "ok"}}}},
            "/reject": {"get": {"operationId": "reject_http", "parameters": [param("form"), param("offset")],
                "responses": {"401": {"description": "no"}}}}
        }
    });
    let app = axum::Router::new()
        .route("/openapi.json", get(move || async move { axum::Json(doc) }))
        .route(
            "/pad",
            get(|Query(q): Query<HashMap<String, String>>| async move { padded(&q, 4096) }),
        )
        .route(
            "/reject",
            get(|Query(q): Query<HashMap<String, String>>| async move {
                (axum::http::StatusCode::UNAUTHORIZED, padded(&q, 2048))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Post `calls` (the tool's arguments) as one message to a session of a
/// server whose model calls `tool` with each of them in one turn; the
/// results the model got, in the calls' order, and every place they may
/// have reached.
async fn cut_everywhere(
    tool: &'static str,
    extra: &str,
    flags: &[&str],
    calls: &[Value],
) -> (Vec<String>, Vec<(String, String)>) {
    let mock = MockLlm::start(call_as_told(tool)).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::create_dir_all(dir.path().join("store")).unwrap();
    let tools = tools_dir(dir.path(), &[("cut", CUT_TOOL)]);
    let agent = agent_file(dir.path(), &mock.url(), &tools, extra);
    let store = sqlite_in(&dir.path().join("store"));
    let (mut sidecar, api) = serve(&agent, &store, flags, &[], dir.path());
    let id = new_session(
        &api,
        json!({"agent": "hostile", "params": {"token": CANARY}}),
    )
    .await;
    let (status, events) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut events = events.unwrap();
    let reply = message_waited(&api, &id, &Value::from(calls.to_vec()).to_string()).await;
    assert_eq!(reply.json["status"], "idle", "{}", reply.text);
    let seen = events.until("run_finished", PATIENCE).await;
    assert_eq!(
        seen.iter().filter(|e| e.event == "tool_result").count(),
        calls.len(),
        "{seen:?}\n{}",
        sidecar.logs()
    );
    let stream = std::mem::take(&mut events.raw);
    drop(events);
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    sidecar.stop();
    // The request after the calls holds their results, in the calls' order.
    let results: Vec<String> = mock
        .requests()
        .iter()
        .find(|r| last_message(r)["role"] == "tool")
        .and_then(|r| r["messages"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(results.len(), calls.len(), "{results:#?}");
    let mut places = vec![
        ("the session".to_string(), view.text),
        ("the event stream".to_string(), stream),
        (
            "the store".to_string(),
            String::from_utf8_lossy(&raw_files(&dir.path().join("store"), "")).into_owned(),
        ),
    ];
    places.push(("the reply".to_string(), reply.text));
    for (_, body) in mock.raw_requests() {
        places.push(("a model request".to_string(), body));
    }
    (results, places)
}

/// Each call's result holds the marker where the form was cut, and no
/// place holds the leading bytes of any form.
fn assert_cut_whole(results: Vec<String>, places: Vec<(String, String)>, calls: &[Value]) {
    for (result, call) in results.iter().zip(calls) {
        assert!(
            result.contains("x<secret:token>"),
            "{call}: the form cut at the limit is not replaced whole: {:?}",
            &result[result.len().saturating_sub(300)..]
        );
        assert!(!result.contains("yyy"), "{call}: kept past the limit");
    }
    assert_nothing_leaked(&Seen {
        result: String::new(),
        places,
    });
}

fn cut_calls(stream: Option<&str>) -> Vec<Value> {
    let mut calls = Vec::new();
    for form in CUT_FORMS {
        for offset in CUT_OFFSETS {
            let mut call = json!({"form": form, "offset": offset.to_string()});
            if let Some(s) = stream {
                call["stream"] = json!(s);
            }
            calls.push(call);
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_output_cut_inside_a_secret_keeps_none_of_it() {
    for stream in ["stdout", "stderr"] {
        let calls = cut_calls(Some(stream));
        let (results, places) =
            cut_everywhere("bash_cut", "", &["--tool-max-output", "1000"], &calls).await;
        if stream == "stdout" {
            for r in &results {
                assert!(r.contains("[output cut at 1000 bytes]"), "{r}");
            }
        }
        assert_cut_whole(results, places, &calls);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_bodies_and_excerpts_cut_inside_a_secret_keep_none_of_it() {
    let api = start_padding_api().await;
    let extra = format!(
        "    - openapi:\n        spec: \"http://{api}/openapi.json\"\n        baseUrl: \"http://{api}\"\n        maxResponseBytes: 4096\n"
    );
    for tool in ["pad_http", "reject_http"] {
        let calls = cut_calls(None);
        let (results, places) = cut_everywhere(tool, &extra, &[], &calls).await;
        assert_cut_whole(results, places, &calls);
    }
}
