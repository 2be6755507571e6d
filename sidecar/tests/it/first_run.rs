//! A newcomer's first run: the README's commands, read out of README.md so
//! that they cannot drift, run in a fresh copy of the repository (no
//! `data/`, no owner token, no API key, no network) and talked to over TCP.
//!
//! `cargo run -p PACKAGE [--bin NAME] -- ARGS` is run as the binary Cargo
//! would build and run (this test's own `bindery-sidecar`), with ARGS as
//! written, in the copy: a nested `cargo run` would rebuild the crate for
//! the copy's path, for minutes. The one change made to a command: its
//! `--listen HOST:PORT` becomes port 0, so that the test never collides
//! with another server; each binary prints the address it got.

use std::path::{Path, PathBuf};
use std::process::Command;

use bindery_tests::sidecar::{Api, Sidecar};

fn readme() -> String {
    std::fs::read_to_string(crate::common::repo().join("README.md")).expect("README.md is readable")
}

/// The README's command line that starts with `start` (shell words,
/// split on whitespace: the README's commands quote nothing).
fn readme_command(readme: &str, start: &str) -> Vec<String> {
    let line = readme
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("README.md has no command line starting with `{start}`"));
    line.split_whitespace().map(str::to_owned).collect()
}

/// `cargo run -p PACKAGE [--bin NAME] -- ARGS` as `(PACKAGE, ARGS)`, with
/// `--listen`'s port made 0.
fn cargo_run_args(words: &[String]) -> (String, Vec<String>) {
    assert_eq!(words[..3], ["cargo", "run", "-p"], "{words:?}");
    let dashes = words
        .iter()
        .position(|w| w == "--")
        .unwrap_or_else(|| panic!("no `--` in {words:?}"));
    let mut args = words[dashes + 1..].to_vec();
    if let Some(i) = args.iter().position(|a| a == "--listen") {
        let host = args[i + 1]
            .rsplit_once(':')
            .map(|(host, _)| host.to_owned())
            .unwrap_or_else(|| panic!("--listen {} has no port", args[i + 1]));
        args[i + 1] = format!("{host}:0");
    }
    (words[3].clone(), args)
}

/// The repository as a fresh clone has it: the tracked files plus new
/// ones not ignored (work not committed yet), nothing else (no `data/`,
/// no `target/`).
fn fresh_copy() -> tempfile::TempDir {
    let repo = crate::common::repo();
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(&repo)
        .output()
        .expect("git lists the repository's files");
    assert!(out.status.success(), "git ls-files: {out:?}");
    let copy = tempfile::tempdir().unwrap();
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = Path::new(std::str::from_utf8(name).expect("UTF-8 file names"));
        let from = repo.join(name);
        if !from.is_file() {
            continue; // deleted in the work tree, or a submodule
        }
        let to = copy.path().join(name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        // `copy` keeps the mode: the example's tools stay executable.
        std::fs::copy(&from, &to).unwrap();
    }
    assert!(!copy.path().join("data").exists());
    copy
}

/// `program ARGS` in `dir`, with only what a newcomer's shell has that
/// matters here: PATH and HOME; no BINDERY_*, no OPENAI_API_KEY.
fn in_copy(program: &Path, args: &[String], dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir);
    cmd
}

fn sidecar_bin() -> PathBuf {
    PathBuf::from(crate::common::bin())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_main_command_serves_in_a_fresh_clone() {
    let readme = readme();
    let words = readme_command(&readme, "cargo run -p bindery-sidecar -- serve");
    let (package, args) = cargo_run_args(&words);
    assert_eq!(package, "bindery-sidecar");
    assert!(
        args.iter().any(|a| a == "--agent-file"),
        "the main command serves an agent file: {words:?}"
    );

    let copy = fresh_copy();
    let logs = tempfile::tempdir().unwrap();
    let mut sidecar = Sidecar::spawn(in_copy(&sidecar_bin(), &args, copy.path()), logs.path(), "");
    let api = Api::new(&sidecar.url);

    let health = api.call("GET", "/healthz", None, None).await;
    assert_eq!(health.status, 200, "{}", health.text);

    // The token it generated, where the README says to read it.
    let token = std::fs::read_to_string(copy.path().join("data/owner-token"))
        .expect("serve generated data/owner-token");
    let token = token.trim();
    assert!(!token.is_empty());
    assert!(copy.path().join("data/bindery.sqlite").is_file());

    let agents = api.call("GET", "/v1/agents", Some(token), None).await;
    assert_eq!(agents.status, 200, "{}", agents.text);
    let invoices = &agents.json["agents"][0];
    assert_eq!(invoices["slug"], "invoices", "{}", agents.text);
    let tenant = invoices["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "tenant")
        .expect("the tenant parameter is listed");
    assert_eq!(tenant["pinned"], true, "--pin tenant=acme-corp: {tenant}");
    let refused = api.call("GET", "/v1/agents", None, None).await;
    assert_eq!(refused.status, 401);

    // A second start reads the same token back rather than failing on it.
    sidecar.stop();
    let sidecar = Sidecar::spawn(
        in_copy(&sidecar_bin(), &args, copy.path()),
        logs.path(),
        token,
    );
    let again = Api::new(&sidecar.url)
        .call("GET", "/v1/agents", Some(token), None)
        .await;
    assert_eq!(again.status, 200, "{}\n{}", again.text, sidecar.logs());
}

/// The `mock-model` binary, built with the cargo running this test (a
/// no-op once built): Cargo hands a test the path of its own package's
/// binaries only, and `mock-model` is the `tests` crate's.
fn mock_model_bin() -> PathBuf {
    let bin_dir = Path::new(crate::common::bin())
        .parent()
        .unwrap()
        .to_path_buf();
    let target_dir = bin_dir.parent().unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-q", "-p", "bindery-tests", "--bin", "mock-model"])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(crate::common::repo());
    if bin_dir.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("cargo runs");
    assert!(
        status.success(),
        "cargo build -p bindery-tests --bin mock-model: {status}"
    );
    bin_dir.join("mock-model")
}

/// The README's fenced block that holds `line` (its lines, trimmed).
fn readme_block<'a>(readme: &'a str, line: &str) -> Vec<&'a str> {
    let mut block = Vec::new();
    let mut inside = false;
    for l in readme.lines() {
        if l.starts_with("```") {
            if inside && block.iter().any(|b: &&str| b.starts_with(line)) {
                return block;
            }
            inside = !inside;
            block.clear();
        } else if inside {
            block.push(l.trim());
        }
    }
    panic!("README.md has no code block with a line starting `{line}`")
}

/// The `-d '…'` body and the URL of a README `curl` line.
fn curl_request(line: &str) -> (String, serde_json::Value) {
    let (_, body) = line
        .split_once(" -d '")
        .unwrap_or_else(|| panic!("no -d '…' in {line}"));
    let body = body.rsplit_once('\'').unwrap().0;
    let url = line
        .split_whitespace()
        .find(|w| w.trim_matches('"').starts_with("localhost:"))
        .unwrap_or_else(|| panic!("no localhost URL in {line}"))
        .trim_matches('"');
    let path = &url[url.find('/').unwrap()..];
    (
        path.to_owned(),
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_first_run_without_a_key_calls_the_tool_through_the_mock_model() {
    let readme = readme();
    let block = readme_block(&readme, "cargo run -p bindery-tests --bin mock-model");
    let words = |start: &str| -> Vec<String> {
        let line = block
            .iter()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("the first-run block has no line starting `{start}`"));
        line.split_whitespace().map(str::to_owned).collect()
    };
    let (package, mock_args) =
        cargo_run_args(&words("cargo run -p bindery-tests --bin mock-model"));
    assert_eq!(package, "bindery-tests");
    let (package, mut serve_args) = cargo_run_args(&words("cargo run -p bindery-sidecar -- serve"));
    assert_eq!(package, "bindery-sidecar");
    let (path, body) = curl_request(
        block
            .iter()
            .find(|l| l.starts_with("curl") && l.contains("/v1/sessions"))
            .expect("the first-run block creates a session with curl"),
    );

    let copy = fresh_copy();
    let logs = tempfile::tempdir().unwrap();
    let mock = Sidecar::spawn(
        in_copy(&mock_model_bin(), &mock_args, copy.path()),
        logs.path(),
        "",
    );
    // The second change: --model-url names the mock's port of this run.
    let i = serve_args
        .iter()
        .position(|a| a == "--model-url")
        .expect("the first run's serve names the mock with --model-url");
    assert!(
        serve_args[i + 1].starts_with("http://127.0.0.1:"),
        "{serve_args:?}"
    );
    serve_args[i + 1] = format!("{}/v1", mock.url);
    let sidecar = Sidecar::spawn(
        in_copy(&sidecar_bin(), &serve_args, copy.path()),
        logs.path(),
        "",
    );
    let token = std::fs::read_to_string(copy.path().join("data/owner-token")).unwrap();
    let api = Api::new(&sidecar.url);
    let r = api
        .call("POST", &path, Some(token.trim()), Some(&body))
        .await;
    assert_eq!(r.status, 201, "{}\n{}", r.text, sidecar.logs());
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let turns = r.json["session"]["turns"].as_array().unwrap();
    let roles: Vec<_> = turns.iter().map(|t| t["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "assistant"],
        "{}",
        r.text
    );
    assert_eq!(
        turns[1]["tool_calls"][0]["function"]["name"],
        "bash_query-invoices"
    );
    // The pinned tenant's invoices, and only them.
    let answer = turns[3]["content"].as_str().unwrap();
    assert!(answer.contains("INV-1002"), "{answer}");
    assert!(!answer.contains("INV-2002"), "{answer}");
}

/// `--model-url` takes every agent's requests with its own key
/// (BINDERY_MODEL_API_KEY) and model name; the agent file's key, meant for
/// its own server, is never sent there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_url_sends_its_own_key_and_never_the_agent_files() {
    let mock = bindery_tests::mock_llm::MockLlm::start(crate::common::tool_then_answer).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let agent = crate::common::repo().join("examples/invoices/agent.yaml");
    let url = mock.url();
    let (sidecar, api) = crate::common::serve(
        &agent,
        &crate::common::sqlite_in(dir.path()),
        &[
            "--pin",
            "tenant=acme-corp",
            "--model-url",
            &url,
            "--model-name",
            "local-model",
        ],
        &[
            ("OPENAI_API_KEY", crate::common::CANARY),
            ("BINDERY_MODEL_API_KEY", "key-for-the-local-server"),
        ],
        dir.path(),
    );
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(crate::common::OWNER),
            Some(
                &serde_json::json!({"agent": "invoices", "prompt": "Which invoices are overdue?"}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}\n{}", r.text, sidecar.logs());
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    let requests = mock.raw_requests();
    assert_eq!(requests.len(), 2, "a tool call, then the answer");
    for (headers, body) in &requests {
        let auth: Vec<_> = headers
            .iter()
            .filter(|(k, _)| k == "authorization")
            .collect();
        assert_eq!(
            auth,
            [&(
                "authorization".to_string(),
                "Bearer key-for-the-local-server".to_string()
            )]
        );
        assert!(!body.contains(crate::common::CANARY));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["model"], "local-model");
    }
}
