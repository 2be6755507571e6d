//! agents-exe's session files and its commands over them, through the
//! binary: `list-tool-calls`, `replay-tool-call`'s numbering,
//! `session-print`, `session-edit`, `session-index`, `session-search`.
//! The fixtures are shaped by agents-exe's `Session/Types.hs`: each call
//! stored three times (the step's calls, the provider's raw response, the
//! next step's results), turns newest first.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::*;
use serde_json::{json, Value};

fn sessions() -> PathBuf {
    repo().join("sidecar/tests/fixtures/agents-exe/sessions")
}

fn multi() -> String {
    sessions().join("multi.session.json").display().to_string()
}

fn partial() -> String {
    sessions()
        .join("partial.session.json")
        .display()
        .to_string()
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// The binary in `dir` (also its HOME), `stdin` given.
fn sx(dir: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    let mut child = Command::new(bin())
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

fn sha256(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn calls_of(json: &str) -> Vec<(u64, u64, String)> {
    let v: Value = serde_json::from_str(json).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["turn"].as_u64().unwrap(),
                c["index"].as_u64().unwrap(),
                c["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Each call is listed once, with its turn (from 1, newest first) and its
/// place in that turn, in agents-exe's three formats; Bindery's own
/// session file is listed with the numbering its replay takes.
#[test]
fn list_tool_calls_lists_each_call_once_in_agents_exes_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = sx(d, &["list-tool-calls", &multi(), "-f", "json"], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        calls_of(&out.stdout),
        [
            (3, 0, "bash_ls".to_string()),
            (5, 0, "bash_probe".to_string()),
            (5, 1, "bash_probe".to_string())
        ]
    );
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        v[2]["arguments"],
        json!("{\"repo\":\"r2\",\"repo-token\":\"tok-2\",\"note\":\"second\"}")
    );

    let out = sx(d, &["list-tool-calls", &multi()], None);
    assert!(
        out.stdout.starts_with(
            "Found 3 tool call(s):\n\n[0] bash_ls\n  Turn: 3\n  Arguments: \n    \"{\\\"dir\\\":\\\"/tmp\\\"}\"\n\n[0] bash_probe\n  Turn: 5\n"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("To replay a tool call:"),
        "{}",
        out.stdout
    );

    // agents-exe's global options first, and the brief format; the last
    // line of a file of snapshots, legacy forms, a step in progress.
    let out = sx(
        d,
        &[
            "--agent-file",
            "nowhere.json",
            "list-tool-calls",
            &partial(),
            "--format",
            "brief",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "0\tbash_probe\t\"{\\\"repo\\\":\\\"r9\\\",\\\"repo-token\\\":\\\"tok-9\\\"}\"\n1\tbash_ls\t\"{\\\"dir\\\":\\\"/var\\\"}\"\n0\tbash_ls\t\"{\\\"dir\\\":\\\"/tmp\\\"}\"\n"
    );

    let bindery = d.join("bindery.json");
    let call = |id: &str, name: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}});
    std::fs::write(
        &bindery,
        json!({"session_id": "s-1", "agent": "a", "session": {"turns": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [call("a", "bash_x"), call("b", "bash_y")]},
            {"role": "tool", "tool_call_id": "a", "content": "r"},
            {"role": "tool", "tool_call_id": "b", "content": "r"},
            {"role": "assistant", "tool_calls": [call("c", "bash_x")]}]}})
        .to_string(),
    )
    .unwrap();
    let out = sx(d, &["list-tool-calls", "bindery.json", "-f", "json"], None);
    assert_eq!(
        calls_of(&out.stdout),
        [
            (2, 0, "bash_x".to_string()),
            (2, 1, "bash_y".to_string()),
            (5, 2, "bash_x".to_string())
        ]
    );

    std::fs::write(
        d.join("empty.json"),
        r#"{"turns":[],"sessionId":"x","turnId":"y"}"#,
    )
    .unwrap();
    let out = sx(d, &["list-tool-calls", "empty.json"], None);
    assert_eq!(out.stdout, "No tool calls found in session: empty.json\n");
    let out = sx(d, &["list-tool-calls", "missing.json"], None);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("cannot read session file missing.json"),
        "{}",
        out.stderr
    );
    // What is read is bounded: a file past 64 MiB is refused, named.
    std::fs::File::create(d.join("huge.json"))
        .unwrap()
        .set_len(65 * 1024 * 1024)
        .unwrap();
    let out = sx(d, &["list-tool-calls", "huge.json"], None);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("session file huge.json is larger than 64 MiB"),
        "{}",
        out.stderr
    );
    std::fs::write(
        d.join("bad.json"),
        r#"{"turns":[{"tag":"LlmTurn","contents":{"llmResponse":{"responseText":7}}}]}"#,
    )
    .unwrap();
    let out = sx(d, &["list-tool-calls", "bad.json"], None);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("bad.json is not an agents-exe session: turns[0].contents.llmResponse.responseText is not a string"),
        "{}",
        out.stderr
    );
}

/// `replay-tool-call -s F -i N -t SCRIPT`: agents-exe's short flags and
/// index (the first call at place N of its turn, turns newest first); the
/// recorded arguments (a JSON string) are run as the object they hold.
#[test]
fn replay_tool_call_takes_agents_exes_index_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let probe = repo()
        .join("sidecar/tests/fixtures/tools/probe")
        .display()
        .to_string();
    let out = sx(
        d,
        &["replay-tool-call", "-s", &multi(), "-i", "1", "-t", &probe],
        None,
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .starts_with("✓ Tool call validation passed\nTool: probe\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("=== Tool Output ===\nargv: [--repo] [r2] [second]\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(&format!("token-sha256: {}\n", sha256("tok-2"))),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("session: 5e1d0a4e-8c8b-4f6e-9d8c-2b7f0c1d9e01"),
        "{}",
        out.stdout
    );

    // Index 0 is the newest step's first call: bash_ls's, which the probe
    // does not fit.
    let out = sx(
        d,
        &[
            "replay-tool-call",
            "--session",
            &multi(),
            "--tool-call",
            "0",
            "--tool",
            &probe,
        ],
        None,
    );
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("bash_ls")
            && out
                .stdout
                .contains("missing required arguments repo, repo-token"),
        "{}",
        out.stdout
    );

    let out = sx(
        d,
        &["replay-tool-call", "-s", &multi(), "-i", "2", "-t", &probe],
        None,
    );
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains(&format!(
            "session file {} has no tool call with index 2 (available: turn 3: 0; turn 5: 0, 1)",
            multi()
        )),
        "{}",
        out.stderr
    );

    // As agents-exe is invoked: its global options first.
    let out = sx(
        d,
        &[
            "--agent-file",
            "agent.json",
            "replay-tool-call",
            "-s",
            &multi(),
            "-i",
            "1",
            "-t",
            &probe,
            "--raw",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.starts_with("argv: [--repo] [r2] [second]\n"),
        "{}",
        out.stdout
    );
}

/// Replayed through an agent's bindings, agents-exe's numbering holds:
/// the bound value is merged over the recorded arguments.
#[test]
fn replay_through_the_bindings_takes_agents_exes_index() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let probe = repo()
        .join("sidecar/tests/fixtures/tools/probe")
        .display()
        .to_string();
    std::fs::write(
        d.join("prober.json"),
        json!({"tag": "OpenAIAgentDescription", "contents": {
            "slug": "prober", "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m",
            "announce": "probes", "systemPrompt": ["probe"], "apiKeyId": "k", "flavor": "OpenAIv1",
            "parameters": [{"name": "tenant"}],
            "bashToolboxes": [{"tag": "SingleTool", "contents": {"Path": probe,
                "Bindings": [{"arg": "repo", "value": {"tag": "Param", "contents": "tenant"}}]}}]}})
        .to_string(),
    )
    .unwrap();
    let out = sx(
        d,
        &[
            "replay-tool-call",
            "--agent-file",
            "prober.json",
            "--set",
            "tenant=acme",
            "-s",
            &multi(),
            "-i",
            "1",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.starts_with("argv: [--repo] [acme] [second]\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(&format!("token-sha256: {}\n", sha256("tok-2"))),
        "{}",
        out.stdout
    );
}

/// `session-print`: agents-exe's Markdown report.
#[test]
fn session_print_prints_agents_exes_report() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = sx(
        d,
        &[
            "session-print",
            &multi(),
            "--show-tool-call-results",
            "elided",
            "--show-tool-call-arguments",
            "shown",
            "--no-funny-stamp",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let md = out.stdout;
    for part in [
        "# 📋 Session Report\n\n**🔑 Session ID:** 5e1d0a4e-8c8b-4f6e-9d8c-2b7f0c1d9e01\n\n---\n\n## 📊 Statistics\n",
        "| Total Turns | 6 |\n| 👤 User Turns | 3 |\n| 🤖 LLM Turns | 3 |\n",
        "**Total Tool Calls:** 3\n\n`bash_probe          `    2 ",
        "### 🎫 Token Usage\n\n`Prompt      `      3,900 ",
        "**Total:** 3,975\n\n_(1,024 cached)_\n\n\n### 📡 Signal Metrics\n\n**Informativeness Score:** 30/100 🔴\n\n#### Interaction Signals\n\n",
        "| Loop | ✓ No | No loops detected |\n\n#### Environment Signals\n\n| Signal | Status | Details |\n|--------|--------|---------|\n| Exhaustion | ✓ 0 | No resource exhaustion detected |\n---\n\n## 👤 Step 1",
        "## 👤 Step 1: User Turn\n\n### 📝 System Prompt\n\n```\nYou are the repository prober.\nBe brief.\n```\n\n### 💬 User Query\n\nProbe the repositories r1 and r2, then list /tmp.\n\n### 🛠️ Available Tools\n\n- **probe** (`bash_probe`)\n  - Description: Reports what it received.\n- **ls** (`bash_ls`)",
        "## 🤖 Step 2: LLM Turn\n\n### 💭 Thinking Process\n\n<details>\n<summary>Click to expand reasoning</summary>\n\nBoth repositories first, in one step.\n</details>\n\n### 💬 Response\n\n_(No text response)_\n\n### 🔧 Tool Calls\n\n- **bash_probe**\n\n  ```json\n  {\n      \"note\": \"first\",\n      \"repo\": \"r1\",\n      \"repo-token\": \"tok-1\"\n  }\n  ```\n  _(68 B)_\n\n- **bash_probe**",
        "### 📥 Tool Responses\n\n**bash_probe** response:\n```\nprobed r1\nall good\n```\n_(18 B)_\n\n**bash_probe** response:\n```json\n{\n    \"ok\": true,\n    \"repo\": \"r2\"\n}\n```",
        "## 🤖 Step 6: LLM Turn\n\n### 💬 Response\n\nDone: both repositories probed; /tmp holds three files.\n",
    ] {
        assert!(md.contains(part), "missing {part:?} in:\n{md}");
    }
    assert_eq!(md.matches("System Prompt").count(), 1, "{md}");

    let out = sx(
        d,
        &[
            "session-print",
            &partial(),
            "--n-turns",
            "2",
            "--antichronological",
            "--repeat-system-prompt",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let md = out.stdout;
    assert!(
        md.starts_with("```                   # 📋 Session Report\n"),
        "{md}"
    );
    assert!(
        md.contains("**🍴 Forked from:** 5e1d0a4e-8c8b-4f6e-9d8c-2b7f0c1d9e01\n"),
        "{md}"
    );
    let five = md
        .find(
            "## ⏸️ Step 5: Partial Turn (in progress)\n\n_(Turn execution paused - async mode)_\n",
        )
        .unwrap();
    let four = md.find("## 🤖 Step 4: LLM Turn").unwrap();
    assert!(five < four && !md.contains("Step 3"), "{md}");
    assert!(md.ends_with("\n\n_(Showing last 2 turns)_\n"), "{md}");

    let out = sx(d, &["session-print", &multi(), "--as-prompt", "s"], None);
    assert!(
        out.stdout.starts_with(
            "## Session Summary\n\n### Turn 1 (User)\n\n**User:** Probe the repositories"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("**Tools called:** bash_probe, bash_probe\n"),
        "{}",
        out.stdout
    );

    let bindery = d.join("bindery.json");
    std::fs::write(&bindery, r#"{"session_id": "s", "session": {"turns": []}}"#).unwrap();
    let out = sx(d, &["session-print", "bindery.json"], None);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("bindery.json is Bindery's (what GET /v1/sessions/ID answers)"),
        "{}",
        out.stderr
    );

    let out = sx(
        d,
        &[
            "session-print",
            &multi(),
            "--show-tool-call-results",
            "some",
        ],
        None,
    );
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("one of hidden, shown, elided"),
        "{}",
        out.stderr
    );
}

/// `session-edit`: the session on stdin, agents-exe's operations in
/// order, everything else written back as it came.
#[test]
fn session_edit_edits_stdin_and_keeps_what_it_does_not_change() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = std::fs::read_to_string(partial()).unwrap();
    let out = sx(
        d,
        &[
            "session-edit",
            "--take",
            "-n",
            "3",
            "--drop",
            "--censor-thinking",
        ],
        Some(&text),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("{\n    \""),
        "pretty, four spaces: {}",
        out.stdout
    );
    let edited: Value = serde_json::from_str(&out.stdout).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let turns = last["turns"].as_array().unwrap();
    // The three newest, then the newest of those dropped.
    assert_eq!(edited["turns"], json!([turns[1], turns[2]]));
    for key in [
        "laterField",
        "sessionId",
        "forkedFromSessionId",
        "turnId",
        "sessionVersion",
        "sessionExecutionMode",
    ] {
        assert_eq!(edited[key], last[key], "{key}");
    }

    let out = sx(d, &["session-edit", "--censor-tool-calls"], Some(&text));
    let edited: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(edited["turns"][0]["contents"]["pendingCalls"], json!([]));
    assert_eq!(edited["turns"][1]["contents"]["llmToolCalls"], json!([]));
    assert_eq!(
        edited["turns"][2]["contents"]["userToolResponses"],
        json!([])
    );
    // The provider's raw response is not a field the operation names.
    assert_eq!(
        edited["turns"][1]["contents"]["llmResponse"],
        last["turns"][1]["contents"]["llmResponse"]
    );

    // The edited session is still one: the other commands read it.
    std::fs::write(d.join("edited.json"), &out.stdout).unwrap();
    let out = sx(d, &["list-tool-calls", "edited.json"], None);
    assert_eq!(out.stdout, "No tool calls found in session: edited.json\n");

    let out = sx(d, &["session-edit", "--head"], Some(&text));
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("does not know \"--head\""),
        "{}",
        out.stderr
    );
    let out = sx(
        d,
        &["session-edit", "--take"],
        Some("{\"session_id\": \"s\"}"),
    );
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("not an agents-exe session"),
        "{}",
        out.stderr
    );
}

/// `session-index` and `session-search` over the session files where
/// agents-exe's configuration says they are.
#[test]
fn session_index_and_search_find_agents_exes_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("agents-exe.cfg.json"),
        r#"{"agentsDirectories": [], "sessions": {"writeLocation": "./sessions/", "readLocations": ["./archive/"]}}"#,
    )
    .unwrap();
    let (live, archive) = (d.join("sessions"), d.join("archive"));
    std::fs::create_dir_all(&live).unwrap();
    std::fs::create_dir_all(&archive).unwrap();
    let multi_id = "5e1d0a4e-8c8b-4f6e-9d8c-2b7f0c1d9e01";
    let partial_id = "0c9a7f51-3b1e-4d52-a7a9-6e0b3c2d1f10";
    std::fs::copy(multi(), live.join(format!("conv.{multi_id}.json"))).unwrap();
    std::fs::copy(partial(), archive.join(format!("conv.{partial_id}.json"))).unwrap();
    std::fs::write(
        archive.join("conv.7f0e1d2c-3b4a-4596-8877-665544332211.json"),
        "not json",
    )
    .unwrap();
    // The configuration's directories are from the working directory, as
    // agents-exe takes them.
    let db = d.join("index.db").display().to_string();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--db-path", &db]);
        sx(d, &all, None)
    };

    let out = run(&["session-index"]);
    assert_eq!(
        out.stdout,
        "Index status: Missing\nRun 'session-index --build' to create the index.\n"
    );
    let out = run(&["session-index", "--build"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with(
            "Building search index...\n2 sessions indexed, 0 unchanged, 0 removed\nskipped: "
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.ends_with("Index built successfully.\n"),
        "{}",
        out.stdout
    );
    assert_eq!(
        run(&["session-index", "--status"]).stdout,
        "Index status: Current (up to date)\n"
    );

    let out = run(&["session-search", "LEGACY query"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.starts_with("Found 1 matches\nQuery time: "),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(&format!("Session: {partial_id}\nFile: ")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("Turns: 5\nRank: "), "{}", out.stdout);

    // Tool results are not indexed unless asked.
    assert!(run(&["session-search", "needle-in"])
        .stdout
        .starts_with("Found 0 matches"));
    run(&["session-index", "--build", "--include-tool-outputs"]);
    let out = run(&["session-search", "needle-in", "--json", "--preview", "1"]);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["resultTotalMatches"], 1, "{v}");
    let item = &v["resultItems"][0];
    assert_eq!(item["resultMetadata"]["resultSessionId"], multi_id);
    assert_eq!(item["resultMatchedTerms"], json!(["needle-in"]));
    assert!(
        item["resultPreview"]
            .as_str()
            .unwrap()
            .contains("needle-in-haystack"),
        "{item}"
    );

    // Filters: the tools called (by name, any of them), the file's date.
    let ids = |out: &Out| -> Vec<String> {
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        v["resultItems"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                i["resultMetadata"]["resultSessionId"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let out = run(&["session-search", "repository prober", "--json"]);
    assert_eq!(ids(&out).len(), 2, "{}", out.stdout);
    let out = run(&[
        "session-search",
        "repository prober",
        "--json",
        "--limit",
        "1",
    ]);
    assert_eq!(ids(&out).len(), 1);
    assert_eq!(
        serde_json::from_str::<Value>(&out.stdout).unwrap()["resultTotalMatches"],
        2
    );
    let out = run(&[
        "session-search",
        "prober",
        "--json",
        "--tool",
        "bash_nothing",
        "--tool",
        "bash_probe",
    ]);
    assert_eq!(ids(&out).len(), 2);
    assert!(ids(&run(&[
        "session-search",
        "prober",
        "--json",
        "--tool",
        "bash_nothing"
    ]))
    .is_empty());
    assert_eq!(
        ids(&run(&[
            "session-search",
            "prober",
            "--json",
            "--after",
            "2000-01-01"
        ]))
        .len(),
        2
    );
    assert!(ids(&run(&[
        "session-search",
        "prober",
        "--json",
        "--before",
        "2000-01-01"
    ]))
    .is_empty());
    assert!(ids(&run(&[
        "session-search",
        "prober",
        "--json",
        "--agent",
        "prober"
    ]))
    .is_empty());
    let out = run(&["session-search", "prober", "--after", "yesterday"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("--after \"yesterday\" is not a date YYYY-MM-DD"),
        "{}",
        out.stderr
    );

    // Whatever the query holds, FTS5 is not confused by it.
    for q in [
        "\"unbalanced",
        "prober AND (x",
        "NOT",
        "col:umn",
        "*",
        "a b",
    ] {
        let out = run(&["session-search", q]);
        assert_eq!(out.code, 0, "{q}: {}", out.stderr);
    }
    // Short words are looked for as they are.
    assert_eq!(ids(&run(&["session-search", "r9", "--json"])), [partial_id]);

    // A session written since is stale; --auto brings the index up to date.
    let file = live.join(format!("conv.{multi_id}.json"));
    let mut text = std::fs::read_to_string(&file).unwrap();
    text = text.replace(
        "Done: both repositories probed",
        "Done: zebra-striped repositories",
    );
    std::fs::write(&file, text).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(later)
        .unwrap();
    assert_eq!(
        run(&["session-index", "--status"]).stdout,
        "Index status: Stale (1 of 3 sessions need update)\nRun 'session-index --update' to refresh the index.\n"
    );
    assert!(run(&["session-search", "zebra-striped"])
        .stdout
        .starts_with("Found 0 matches"));
    let out = run(&["session-search", "zebra-striped", "--auto"]);
    assert!(
        out.stdout.starts_with(
            "Index is stale (1 of 3 sessions need update). Updating...\nFound 1 matches\n"
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("(Index was auto-updated)\n"),
        "{}",
        out.stdout
    );

    // A limit that lists nothing is a mistake.
    let out = run(&["session-search", "repository", "--limit", "0"]);
    assert_eq!(out.code, 2, "{}", out.stdout);
    assert!(out.stderr.contains("--limit"), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);

    // A session gone is forgotten on update; clean removes the index.
    std::fs::remove_file(&file).unwrap();
    let out = run(&["session-index", "--update"]);
    assert!(
        out.stdout
            .contains("0 sessions indexed, 2 unchanged, 1 removed\n"),
        "{}",
        out.stdout
    );
    assert!(run(&["session-search", "zebra"])
        .stdout
        .starts_with("Found 0 matches"));
    assert_eq!(
        run(&["session-index", "--clean"]).stdout,
        "Removing search index...\nIndex removed.\n"
    );
    assert!(!Path::new(&db).exists());

    // A missing index is built by the search; agents-exe's argv order;
    // --sessions-dir names the directory instead.
    let out = sx(
        d,
        &[
            "--agent-file",
            "a.json",
            "session-search",
            "legacy",
            "--db-path",
            &db,
            "--sessions-dir",
            &archive.display().to_string(),
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .starts_with("Search index not found. Building index...\nFound 1 matches\n"),
        "{}",
        out.stdout
    );
}

/// `--db-path` naming something that is not a search index — a text
/// file, another program's database, a directory, a symbolic link — is
/// refused by every verb that would write or remove it, untouched.
#[test]
fn session_index_refuses_a_file_that_is_not_an_index() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("sessions")).unwrap();
    let text = d.join("notes.txt");
    std::fs::write(&text, "my notes\n").unwrap();
    let other = d.join("app.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE accounts (name TEXT); INSERT INTO accounts VALUES ('kept');")
        .unwrap();
    let other_bytes = std::fs::read(&other).unwrap();
    let a_dir = d.join("a-dir");
    std::fs::create_dir(&a_dir).unwrap();
    let link = d.join("link.db");
    std::os::unix::fs::symlink(d.join("elsewhere.db"), &link).unwrap();
    let verbs: [&[&str]; 5] = [
        &["session-index", "--build"],
        &["session-index", "--update"],
        &["session-index", "--clean"],
        &["session-index", "--status"],
        &["session-search", "anything"],
    ];
    for db in [&text, &other, &a_dir, &link] {
        let db = db.display().to_string();
        for verb in verbs {
            let mut args = verb.to_vec();
            args.extend(["--db-path", &db, "--sessions-dir", "sessions"]);
            let out = sx(d, &args, None);
            assert_ne!(out.code, 0, "{args:?}: {}", out.stdout);
            assert!(
                out.stderr.contains(&db) && out.stderr.contains("not a session search index"),
                "{args:?}: {}",
                out.stderr
            );
            assert!(!out.stdout.contains("Index removed."), "{}", out.stdout);
        }
    }
    assert_eq!(std::fs::read_to_string(&text).unwrap(), "my notes\n");
    assert_eq!(std::fs::read(&other).unwrap(), other_bytes);
    assert!(a_dir.is_dir());
    assert!(!d.join("elsewhere.db").exists());
}

/// What a session file's author wrote reaches the terminal escaped: no
/// ESC/OSC/CSI sequence, C1 control, BEL or bidi override in the human
/// output of `session-print`, `list-tool-calls`, `session-search`,
/// `check-tool-call` and `tool-call NAME`'s message (JSON output is
/// escaped JSON already).
#[test]
fn a_session_files_author_cannot_drive_the_terminal() {
    let raw = ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}', '\u{2066}', '\r'];
    let clean = |what: &str, text: &str| {
        for c in raw {
            assert!(!text.contains(c), "{what}: {c:?} in {text:?}");
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The fixture, its answer, a tool's name and its arguments laced with
    // a title change, a screen wipe, a C1 CSI and a bidi override (JSON
    // escapes: the file stays valid JSON).
    let evil = r"\u001b]0;owned\u0007\u001b[2J\u009b1A\u202e\u2066\r";
    let text = std::fs::read_to_string(multi())
        .unwrap()
        .replace("Done: both", &format!("Done:{evil} both"))
        .replace("bash_ls", &format!("bash_ls{evil}"))
        .replace(r#"\"repo\""#, &format!(r#"\"repo{evil}\""#));
    let sessions = d.join("sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let file = sessions.join("conv.5e1d0a4e-8c8b-4f6e-9d8c-2b7f0c1d9e01.json");
    std::fs::write(&file, &text).unwrap();
    let f = file.display().to_string();

    let out = sx(d, &["session-print", &f], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    clean("session-print", &out.stdout);
    assert!(
        out.stdout.contains(r"Done:\u{1b}]0;owned\u{7}"),
        "{}",
        out.stdout
    );
    for format in ["human", "brief"] {
        let out = sx(d, &["list-tool-calls", &f, "-f", format], None);
        assert_eq!(out.code, 0, "{}", out.stderr);
        clean(format, &out.stdout);
        assert!(out.stdout.contains(r"bash_ls\u{1b}"), "{}", out.stdout);
    }
    let out = sx(
        d,
        &[
            "session-search",
            "both",
            "--preview",
            "2",
            "--sessions-dir",
            "sessions",
            "--db-path",
            "i.db",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("Preview:"), "{}", out.stdout);
    clean("session-search", &out.stdout);

    // check-tool-call names the unknown properties it was sent.
    let probe = repo().join("sidecar/tests/fixtures/tools/probe");
    let out = sx(
        d,
        &["check-tool-call", "-t", probe.to_str().unwrap()],
        Some("{\"repo\": \"r\", \"x\\u001b]0;owned\\u0007\\u202e\": 1}"),
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stdout.contains("Unknown property"), "{}", out.stdout);
    clean("check-tool-call", &out.stdout);

    // tool-call NAME: the name it does not know, echoed on stderr.
    let invoices = repo().join("examples/invoices/agent.yaml");
    let out = sx(
        d,
        &[
            "tool-call",
            "nope\u{1b}]0;owned\u{7}\u{202e}",
            "--agent-file",
            invoices.to_str().unwrap(),
            "--set",
            "tenant=globex",
        ],
        Some("{}"),
    );
    assert!(out.stderr.contains("has no tool"), "{}", out.stderr);
    clean("tool-call stderr", &out.stderr);
}
