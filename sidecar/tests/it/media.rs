//! Images reach the model as images: a bash tool's stdout of the media
//! type its `describe` declares (agents-exe's `output-media-type`), stdout
//! that is not UTF-8, a medium past the limit of a result, `run -m`'s
//! files, and a media result in the session API and its store.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use bindery_tests::mock_llm::{MockLlm, MockReply};
use serde_json::{json, Value};

use crate::common::*;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents-exe/media")
}

/// The fixture in a directory of its own (its `toolDirectory` is taken
/// from the working directory, as agents-exe takes it).
fn painter_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("agent.json"), dir.path().join("agent.json")).unwrap();
    std::fs::create_dir(dir.path().join("tools")).unwrap();
    for tool in ["chart", "blob", "poster"] {
        std::fs::copy(
            fixture().join("tools").join(tool),
            dir.path().join("tools").join(tool),
        )
        .unwrap();
    }
    dir
}

/// What the chart tool prints: a PNG.
fn chart_png() -> Vec<u8> {
    let out = Command::new(fixture().join("tools/chart"))
        .arg("run")
        .output()
        .unwrap();
    assert!(out.stdout.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(out.stdout.len(), 69);
    out.stdout
}

fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The prompt's text, whether the user message is text or parts.
fn prompt_of(req: &Value) -> String {
    let content = &req["messages"][1]["content"];
    content
        .as_str()
        .or_else(|| content[0]["text"].as_str())
        .unwrap_or_default()
        // Each prompt directive ends with a line break, as agents-exe's.
        .trim_end()
        .to_string()
}

/// Calls `bash_<prompt>` once, then answers `seen`; a prompt that names
/// no tool (`look`) is answered at once.
fn painter(req: &Value) -> MockReply {
    let messages = req["messages"].as_array().unwrap();
    let prompt = prompt_of(req);
    if prompt == "look" || messages.iter().any(|m| m["role"] == "tool") {
        return MockReply::text("seen");
    }
    MockReply::tool_call(format!("bash_{prompt}"), json!({}))
}

fn run_in(dir: &Path, mock: &MockLlm, args: &[&str]) -> (bool, String) {
    let url = mock.url();
    let mut all = vec!["run", "--agent-file", "agent.json", "--model-url", &url];
    all.extend_from_slice(args);
    in_dir(dir, &[], &all)
}

/// The messages of the request after the tool ran, and the call's id.
fn after_the_call(mock: &MockLlm) -> (Vec<Value>, String) {
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let messages = requests[1]["messages"].as_array().unwrap().clone();
    let id = messages[2]["tool_calls"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    (messages, id)
}

/// The chart tool's PNG, declared `image/png`: the tool message says
/// where it went, and the image follows in a user message, as Chat
/// Completions takes it. The request body, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bash_tools_image_reaches_the_model_as_an_image() {
    let dir = painter_dir();
    let mock = MockLlm::start(painter).await;
    let (ok, said) = run_in(dir.path(), &mock, &["-p", "chart"]);
    assert!(ok, "{said}");
    assert!(said.contains("seen"), "{said}");
    let (messages, id) = after_the_call(&mock);
    assert_eq!(
        json!(messages[3..]),
        json!([
            {"role": "tool", "tool_call_id": id,
             "content": "[image/png attached in the next user message]"},
            {"role": "user", "content": [
                {"type": "text", "text": format!("[output of tool call {id}, not a message from the user]")},
                {"type": "image_url", "image_url": {"url": data_url("image/png", &chart_png())}}]},
        ])
    );
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "You draw charts."})
    );
    assert_eq!(messages[1], json!({"role": "user", "content": "chart\n"}));
    assert_eq!(messages.len(), 5);
    mock.shutdown().await;
}

/// Bytes that are not UTF-8, with no declared type: taken as
/// `application/octet-stream` (agents-exe's rule), which no chat model
/// takes, so the model is told what they were, never sent them mangled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_that_is_not_utf8_is_octet_stream_not_mangled_text() {
    let dir = painter_dir();
    let mock = MockLlm::start(painter).await;
    let (ok, said) = run_in(dir.path(), &mock, &["-p", "blob"]);
    assert!(ok, "{said}");
    let (messages, id) = after_the_call(&mock);
    assert_eq!(
        json!(messages[3..]),
        json!([{"role": "tool", "tool_call_id": id,
                "content": "[application/octet-stream, 7 bytes: not text, and not a type a model is sent (an image or a PDF); not sent]"}])
    );
    assert!(!serde_json::to_string(&messages)
        .unwrap()
        .contains('\u{fffd}'));
    mock.shutdown().await;
}

/// An image past the limit of a result (`--tool-max-output`) is refused
/// whole, and the model is told why: a cut image is no image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_past_the_limit_of_a_result_is_refused_whole() {
    let dir = painter_dir();
    let mock = MockLlm::start(painter).await;
    let (ok, said) = run_in(dir.path(), &mock, &["-p", "poster"]);
    assert!(ok, "{said}");
    let (messages, id) = after_the_call(&mock);
    assert_eq!(
        json!(messages[3..]),
        json!([{"role": "tool", "tool_call_id": id,
                "content": "error: the tool printed more than 262144 bytes of image/png (the limit of a result, --tool-max-output); nothing of it was kept"}])
    );
    // A smaller limit refuses the chart's 69 bytes too.
    let before = mock.requests().len();
    let (ok, said) = run_in(
        dir.path(),
        &mock,
        &["--tool-max-output", "32", "-p", "chart"],
    );
    assert!(ok, "{said}");
    let last = mock.requests()[before + 1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .cloned()
        .unwrap();
    assert_eq!(
        last["content"],
        "error: the tool printed more than 32 bytes of image/png (the limit of a result, --tool-max-output); nothing of it was kept"
    );
    mock.shutdown().await;
}

/// `run -m`: the user message carrying the prompt is the prompt's text
/// then each file, an image as `image_url`, a PDF as `file`, the type from
/// the extension or given before a `;`. A type that cannot be told, a file
/// that is neither, or files past 4 MiB together are errors that say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_m_sends_the_files_with_the_prompt() {
    let dir = painter_dir();
    let png = chart_png();
    std::fs::write(dir.path().join("image.png"), &png).unwrap();
    std::fs::write(dir.path().join("scan"), &png).unwrap();
    std::fs::write(dir.path().join("report.pdf"), b"%PDF-1.4 tiny").unwrap();
    let mock = MockLlm::start(painter).await;
    let (ok, said) = run_in(
        dir.path(),
        &mock,
        &[
            "-p",
            "look",
            "-m",
            "image.png",
            "--media",
            "report.pdf",
            "-m",
            "image/png;scan",
        ],
    );
    assert!(ok, "{said}");
    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0]["messages"][1],
        json!({"role": "user", "content": [
            {"type": "text", "text": "look\n"},
            {"type": "image_url", "image_url": {"url": data_url("image/png", &png)}},
            {"type": "file", "file": {"filename": "report.pdf",
                                      "file_data": data_url("application/pdf", b"%PDF-1.4 tiny")}},
            {"type": "image_url", "image_url": {"url": data_url("image/png", &png)}},
        ]})
    );

    let (ok, said) = run_in(dir.path(), &mock, &["-p", "look", "-m", "scan"]);
    assert!(!ok);
    assert!(
        said.contains(
            "cannot tell the media type of scan from its extension; give it as -m 'MIME;scan'"
        ),
        "{said}"
    );
    std::fs::write(dir.path().join("notes.txt"), "hi").unwrap();
    let (ok, said) = run_in(dir.path(), &mock, &["-p", "look", "-m", "notes.txt"]);
    assert!(
        !ok && said.contains("text/plain is neither an image nor a PDF"),
        "{said}"
    );
    std::fs::write(dir.path().join("huge.png"), vec![0u8; 4 * 1024 * 1024 + 1]).unwrap();
    let (ok, said) = run_in(dir.path(), &mock, &["-p", "look", "-m", "huge.png"]);
    assert!(
        !ok && said.contains("may hold 4194304 bytes together"),
        "{said}"
    );
    assert_eq!(mock.requests().len(), 1, "no request for a refused file");
    mock.shutdown().await;
}

/// A media result in the session API: the tool's turn shows its image
/// part (its `data:` URL), the event its type and size; the turn is the
/// same after a restart on the SQLite store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_media_result_shows_in_the_session_and_survives_the_store() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let mock = MockLlm::start(painter).await;
    let agent = dir.path().join("painter.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: painter}}\nspec:\n  model: {{url: \"{}\", name: m}}\n  systemPrompt: You draw charts.\n  toolboxes:\n    - bash: {{directory: \"{}\"}}\n",
            mock.url(),
            fixture().join("tools").display()
        ),
    )
    .unwrap();
    let store = format!("sqlite://{}", dir.path().join("s.sqlite").display());
    let (mut sidecar, api) = serve(&agent, &store, &[], &[], dir.path());
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "painter", "prompt": "chart"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["session_id"].as_str().unwrap().to_string();
    let turns = r.json["session"]["turns"].as_array().unwrap().clone();
    let call = turns[1]["tool_calls"][0]["id"].as_str().unwrap();
    let expected = json!({"role": "tool", "tool_call_id": call, "content": [
        {"type": "image_url", "image_url": {"url": data_url("image/png", &chart_png())}}]});
    assert_eq!(turns[2], expected, "{}", r.text);
    assert_eq!(turns.len(), 4, "{}", r.text);
    let (status, events) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut events = events.unwrap();
    let seen = events
        .until("run_finished", std::time::Duration::from_secs(30))
        .await;
    let result = seen
        .iter()
        .find(|e| e.event == "tool_result")
        .unwrap_or_else(|| panic!("{seen:?}"));
    assert!(
        result.data.contains(r#""output":"[image/png, 69 bytes]""#),
        "{result:?}"
    );
    drop(events);
    sidecar.kill();

    let (_sidecar, api) = serve(&agent, &store, &[], &[], dir.path());
    let r = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["session"]["turns"][2], expected, "{}", r.text);
    mock.shutdown().await;
}

/// A medium is no way around the scrubber: an image whose bytes carry a
/// secret value (here in a PNG text chunk, and as base64) is withheld
/// whole, and the model is told so; the same image without it goes
/// through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_holding_a_secret_is_withheld_whole() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("stamp");
    executable(
        &script,
        r#"#!/usr/bin/env bash
if [[ "${1:-}" == describe ]]; then
  echo '{"slug": "stamp", "description": "Stamps the chart.", "args": [
    {"name": "key", "description": "", "type": "string", "arity": "single", "mode": "env"},
    {"name": "how", "description": "", "type": "string", "arity": "single", "mode": "positional"}],
    "output-media-type": "image/png"}'
  exit 0
fi
printf '\x89PNG\r\n\x1a\n'
case "$2" in
  text) printf 'tEXtComment\0%s' "$KEY" ;;
  base64) printf '%s' "$KEY" | base64 ;;
esac
"#,
    );
    let mock = MockLlm::start(|req: &Value| {
        let messages = req["messages"].as_array().unwrap();
        if messages.iter().any(|m| m["role"] == "tool") {
            return MockReply::text("seen");
        }
        MockReply::tool_call("bash_stamp", json!({"how": prompt_of(req)}))
    })
    .await;
    let agent = dir.path().join("stamper.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: stamper}}\nspec:\n  model: {{url: \"{}\", name: m}}\n  systemPrompt: You stamp.\n  parameters:\n    - {{name: key, secret: true, default: {{env: STAMP_KEY}}}}\n  toolboxes:\n    - bash:\n        script: \"{}\"\n        bindings:\n          - {{arg: key, value: {{param: key}}}}\n",
            mock.url(),
            script.display()
        ),
    )
    .unwrap();
    let agent = agent.display().to_string();
    let env = [("STAMP_KEY", CANARY)];
    for (how, withheld) in [("text", true), ("base64", true), ("plain", false)] {
        let before = mock.requests().len();
        let (ok, said) = in_dir(
            dir.path(),
            &env,
            &["run", "--agent-file", &agent, "-p", how],
        );
        assert!(ok, "{said}");
        let requests = mock.requests_after(before);
        let body = serde_json::to_string(&requests).unwrap();
        assert!(!body.contains(CANARY), "{how}: {body}");
        let tool = requests[1]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool")
            .cloned()
            .unwrap();
        let content = tool["content"].as_str().unwrap();
        assert_eq!(
            content.ends_with("withheld, it holds a secret value]"),
            withheld,
            "{how}: {content}"
        );
        assert_eq!(body.contains("data:image/png;base64,"), !withheld, "{how}");
    }
    mock.shutdown().await;
}

fn in_dir(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    tokio::task::block_in_place(|| {
        let out = Command::new(bin())
            .current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    })
}

/// `attach-file` (a builtin toolbox's `fileSandbox`, here in Bindery's
/// own form): the model asks for a picture of the shared directory and
/// gets it as an image; a text file there holding a secret value is
/// withheld whole, the value reaching no request; a file outside is
/// refused, the model told why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_file_reaches_the_model_and_one_holding_a_secret_is_withheld() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("shared")).unwrap();
    std::fs::write(d.join("shared/chart.png"), chart_png()).unwrap();
    std::fs::write(d.join("shared/notes.md"), format!("key: {CANARY}\n")).unwrap();
    std::fs::write(d.join("outside.png"), chart_png()).unwrap();
    let mock = MockLlm::start(|req: &Value| {
        let messages = req["messages"].as_array().unwrap();
        if messages.iter().any(|m| m["role"] == "tool") {
            return MockReply::text("seen");
        }
        MockReply::tool_call(
            "io_files",
            json!({"capability": "attach-file", "filepath": prompt_of(req)}),
        )
    })
    .await;
    std::fs::write(
        d.join("viewer.yaml"),
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: viewer}}\nspec:\n  model: {{url: \"{}\", name: m}}\n  systemPrompt: You look.\n  parameters:\n    - {{name: key, secret: true, default: {{env: STAMP_KEY}}}}\n  toolboxes:\n    - builtin:\n        name: files\n        capabilities: [attach-file]\n        fileSandbox:\n          predicate: {{directoryRecursive: shared}}\n          maxFileSize: 100000\n",
            mock.url()
        ),
    )
    .unwrap();
    let env = [("STAMP_KEY", CANARY)];
    let mut tool_said = Vec::new();
    for path in ["shared/chart.png", "shared/notes.md", "outside.png"] {
        let before = mock.requests().len();
        let (ok, said) = in_dir(d, &env, &["run", "--agent-file", "viewer.yaml", "-p", path]);
        assert!(ok, "{path}: {said}");
        let requests = mock.requests_after(before);
        let body = serde_json::to_string(&requests).unwrap();
        assert!(!body.contains(CANARY), "{path}: {body}");
        let messages = requests[1]["messages"].as_array().unwrap().clone();
        let tool = messages.iter().find(|m| m["role"] == "tool").unwrap();
        tool_said.push(tool["content"].as_str().unwrap().to_string());
        if path == "shared/chart.png" {
            let image = json!({"type": "image_url", "image_url": {"url": data_url("image/png", &chart_png())}});
            assert_eq!(messages.last().unwrap()["content"][1], image, "{body}");
        }
    }
    assert_eq!(
        tool_said[0],
        "[image/png attached in the next user message]"
    );
    assert!(
        tool_said[1].ends_with("withheld, it holds a secret value]"),
        "{}",
        tool_said[1]
    );
    assert!(
        tool_said[2].contains("`outside.png` is not allowed by this toolbox's file sandbox"),
        "{}",
        tool_said[2]
    );
    mock.shutdown().await;
}
