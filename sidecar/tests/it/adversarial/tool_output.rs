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
const PREFIX: usize = bindery_sidecar::params::scrub::MIN_LEN;

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
