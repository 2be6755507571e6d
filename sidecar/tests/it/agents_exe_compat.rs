//! agents-exe users move over unchanged: their JSON agent files load with
//! the fields Bindery does not read, and `check` and `serve` name each such
//! field by its file and its path in the document.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::{bin, repo, sqlite_in};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents-exe")
}

/// Every key named `unused…` in `v`, by its path in the document, written
/// as `a.b[0].c`: the corpus marks each field Bindery must skip that way.
fn unused_paths(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let here = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                if k.starts_with("unused") {
                    out.push(here.clone());
                }
                unused_paths(v, &here, out);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                unused_paths(v, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The warning lines loading `file` must give: one per `unused…` key, in
/// it and in the helper files its `extraAgents` name.
fn expected_warnings(file: &Path) -> Vec<String> {
    let doc = read(file);
    let mut lines = Vec::new();
    let mut add = |f: &Path, doc: &Value| {
        let mut paths = Vec::new();
        unused_paths(doc, "", &mut paths);
        lines.extend(
            paths
                .into_iter()
                .map(|p| format!("warning: {}: ignored field {p} ", f.display())),
        );
    };
    add(file, &doc);
    for helper in doc["contents"]["extraAgents"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let f = file
            .parent()
            .unwrap()
            .join(helper["path"].as_str().unwrap());
        add(&f, &read(&f));
    }
    lines
}

/// The corpus: agents-exe files with an unread field at every level (the
/// file, the agent, a parameter and its default, each toolbox kind and its
/// tagged wrapper, a binding and its value, an OpenAPI secret, an MCP
/// server, a builtin toolbox, an extra agent and the helper file it names),
/// a typo'd field, and the agents-exe examples the repository already has.
/// Each loads, and `check` names every unread field, nothing else.
#[test]
fn agents_exe_files_load_with_a_warning_naming_each_field_bindery_does_not_read() {
    let files = [
        corpus().join("extras.json"),
        corpus().join("typo.json"),
        repo().join("examples/invoices/agents-exe/invoices.json"),
        repo().join("sidecar/tests/fixtures/mcp/everything-agents-exe.json"),
    ];
    let mut total = 0;
    for file in &files {
        let out = Command::new(bin())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("EVERYTHING_TOKEN", "t")
            // Run from the repository's root, as agents-exe runs its own
            // files: their paths are relative to the working directory.
            .current_dir(repo())
            .args(["check", "--agent-file"])
            .arg(file)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {stdout}{stderr}", file.display());
        let expected = expected_warnings(file);
        for line in &expected {
            assert!(
                stdout.lines().any(|l| l.starts_with(line.as_str())),
                "{line}\nnot in:\n{stdout}"
            );
        }
        assert_eq!(
            stdout.matches("ignored field").count(),
            expected.len(),
            "{stdout}"
        );
        total += expected.len();
    }
    // The corpus does mark fields at every level listed above.
    assert!(total >= 20, "{total}");
}

/// Bindery's own format stays strict: the same stray field there is a typo
/// to fix, and the file is refused.
#[test]
fn a_native_agent_file_still_refuses_an_unknown_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.yaml");
    std::fs::write(
        &file,
        "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec:\n  model: {url: \"http://127.0.0.1:9/v1\", name: m}\n  unusedVersion: 3\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .env_clear()
        .args(["check", "--agent-file"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("at `spec.unusedVersion`: unknown field `unusedVersion`"),
        "{stderr}"
    );
}

/// `serve`'s start-up log names the unread fields of the files it serves.
#[test]
fn serve_logs_each_ignored_field_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let file = corpus().join("typo.json");
    std::fs::create_dir(dir.path().join("logs")).unwrap();
    // From the repository's root, which the file's paths are relative to.
    let mut cmd = Command::new(bin());
    cmd.current_dir(repo())
        .args(["serve", "--listen", "127.0.0.1:0", "--agent-file"])
        .arg(&file)
        .args(["--store", &sqlite_in(dir.path())])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("BINDERY_OWNER_TOKEN", crate::common::OWNER);
    let sidecar =
        bindery_tests::sidecar::Sidecar::spawn(cmd, &dir.path().join("logs"), crate::common::OWNER);
    let logs = sidecar.logs();
    let line = format!(
        "{}: ignored field contents.bashToolboxes[0].contents.unusedBindngs",
        file.display()
    );
    assert!(logs.contains(&line), "{line}\nnot in:\n{logs}");
}

/// A field written in another spelling than agents-exe's (`filter`,
/// `token`, `headers`, `secrets` in an `OpenAPIServer`) is ignored by
/// agents-exe, so Bindery would ignore it too: the file is refused,
/// naming each field and the spelling that is read, rather than loading
/// a toolbox that exposes `deletePet` or calls the API unauthenticated.
#[test]
fn a_guarding_field_in_another_spelling_refuses_the_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents-exe/guarded");
    let out = Command::new(bin())
        .args(["check", "--agent-file"])
        .arg(dir.join("openapi-filter.json"))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    for (field, spelled) in [
        ("filter", "Filter"),
        ("token", "Token"),
        ("headers", "Headers"),
    ] {
        let part = format!("contents.openApiToolboxes[0].contents.{field}: this field is not read as written (agents-exe, and Bindery, read `{spelled}`");
        assert!(said.contains(&part), "`{part}` not in:\n{said}");
    }
    assert!(!said.contains("deletePet"), "{said}");
    assert!(!said.contains("pet-token-CANARY-1"), "{said}");

    // The same with every `contents` written before its `tag` (which
    // serde reads otherwise): still refused.
    let out = Command::new(bin())
        .args(["check", "--agent-file"])
        .arg(dir.join("contents-first.json"))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(
            "contents.openApiToolboxes[0].contents.filter: this field is not read as written"
        ),
        "{said}"
    );
}

/// A copy of the layout of agents-exe's own repository: `agents/*.json`
/// and `dev-agents/agent.json` whose tool paths (`tools/dev`, a
/// `toolDirectory`, SQLite files under `data/`) are relative to the
/// repository's root, where agents-exe runs them from.
fn repo_layout() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            let target = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &target);
            } else {
                // Keeps the scripts' executable bits.
                std::fs::copy(e.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&corpus().join("repo-layout"), dir.path());
    dir
}

fn in_dir(dir: &Path, args: &[&str]) -> (bool, String) {
    in_dir_with(dir, &[], args)
}

/// [`in_dir`] with these variables besides `PATH`.
fn in_dir_with(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    let out = Command::new(bin())
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

/// [`in_dir_with`] from an async test, while a mock model answers on the
/// runtime's other workers.
fn in_dir_async(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String) {
    tokio::task::block_in_place(|| in_dir_with(dir, env, args))
}

/// Run from the root, as agents-exe runs them, the files load with every
/// tool: the directory's scripts through its `BasenameFilter`, the single
/// tool, the `toolDirectory`'s scripts, `SqliteToolbox` and
/// `SystemToolbox` in agents-exe's spelling (the databases created, as
/// agents-exe's SQLite open does), the helper by its path from the agent
/// file; `check` says which base the paths were taken from.
#[test]
fn agents_exe_files_load_from_the_repository_root_with_all_their_tools() {
    let root = repo_layout();
    let (ok, said) = in_dir(
        root.path(),
        &[
            "check",
            "--agent-file",
            "agents/desk.json",
            "--agent-file",
            "dev-agents/agent.json",
        ],
    );
    assert!(ok, "{said}");
    let base = std::fs::canonicalize(root.path()).unwrap();
    assert!(
        said.contains(&format!(
            "relative paths from: {} (the working directory, as agents-exe resolves them)",
            base.display()
        )),
        "{said}"
    );
    let agent = |name: &str| -> String {
        let start = said.find(&format!("agent {name} (")).unwrap();
        let rest = &said[start + 1..];
        let end = rest.find("\nagent ").unwrap_or(rest.len());
        rest[..end].to_string()
    };
    let desk = agent("desk");
    for tool in [
        "bash_read-file(path)",
        "bash_word-count(text)",
        "sqlite_kb_query(sql)",
        "system_sys_system_info(capability)",
    ] {
        assert!(desk.contains(tool), "{tool} not in:\n{desk}");
    }
    assert!(desk.contains("faq"), "{desk}");
    // The filter keeps `.sh` scripts only; the text file is no tool.
    assert!(!desk.contains("git-status"), "{desk}");
    let dev = agent("dev");
    for tool in ["bash_read-file(path)", "bash_git-status()"] {
        assert!(dev.contains(tool), "{tool} not in:\n{dev}");
    }
    assert!(root.path().join("data/kb.sqlite").is_file());
    assert!(root.path().join("data/faq.sqlite").is_file());

    // A call runs from the same root: the path the model gives is the
    // repository's.
    let (ok, said) = in_dir(
        root.path(),
        &[
            "tool-call",
            "--agent-file",
            "agents/desk.json",
            "--tool",
            "bash_read-file",
            "--args",
            r#"{"path": "tools/dev/notes.txt"}"#,
        ],
    );
    assert!(ok, "{said}");
    assert!(said.contains("Deploys go out on Tuesdays."), "{said}");

    // From elsewhere the same file does not find its tools, and says where
    // it looked.
    let (ok, said) = in_dir(
        &root.path().join("agents"),
        &["check", "--agent-file", "desk.json"],
    );
    assert!(!ok, "{said}");
    assert!(said.contains("cannot read tool directory"), "{said}");
    assert!(said.contains("agents/tools/dev"), "{said}");
}

/// `OpenAPIServerOnDisk`: the toolbox in a file of its own, found from
/// the agent file's directory as agents-exe finds it, its `Filter` kept;
/// the document it names, from the working directory.
#[test]
fn an_on_disk_toolbox_loads_from_beside_its_agent_file() {
    let (ok, said) = in_dir(
        &repo(),
        &[
            "check",
            "--agent-file",
            "sidecar/tests/fixtures/agents-exe/on-disk/agent.json",
        ],
    );
    assert!(ok, "{said}");
    assert!(said.contains("openapi_openapi_getPet(p_id)"), "{said}");
    assert!(!said.contains("deletePet"), "{said}");
}

/// A helper of an agents-exe file is the tool agents-exe names
/// `io_prompt_agent_<slug>`, taking `what`: the model calls it by that
/// name, the helper runs, and its answer is the tool's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_is_agents_exes_io_prompt_agent_tool() {
    use bindery_tests::mock_llm::{tool_names, tool_results, MockLlm, MockReply};
    let mock = MockLlm::start(|req| {
        let system = req["messages"][0]["content"].as_str().unwrap_or("");
        if system.starts_with("You answer questions from the FAQ.") {
            return MockReply::text("the FAQ says: Tuesdays");
        }
        match tool_results(req).first() {
            None => MockReply::tool_call(
                "io_prompt_agent_faq",
                serde_json::json!({"what": "when do deploys go out?"}),
            ),
            Some(r) => MockReply::text(format!("desk relays: {r}")),
        }
    })
    .await;
    let root = repo_layout();
    let url = mock.url();
    let model = [("BINDERY_MODEL_URL", url.as_str())];
    let (ok, said) = in_dir_async(
        root.path(),
        &model,
        &[
            "run",
            "--agent-file",
            "agents/desk.json",
            "--prompt",
            "deploys?",
        ],
    );
    assert!(ok, "{said}");
    assert!(
        said.contains("desk relays: the FAQ says: Tuesdays"),
        "{said}"
    );
    let first = &mock.requests()[0];
    let names = tool_names(first);
    assert!(
        names.contains(&"io_prompt_agent_faq".to_string()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"prompt_agent_faq".to_string()),
        "{names:?}"
    );

    // `tool-call` of the helper's tool runs the helper on `what`.
    let (ok, said) = in_dir_async(
        root.path(),
        &model,
        &[
            "tool-call",
            "--agent-file",
            "agents/desk.json",
            "--tool",
            "io_prompt_agent_faq",
            "--args",
            r#"{"what": "when?"}"#,
        ],
    );
    assert!(ok, "{said}");
    assert!(said.contains("the FAQ says: Tuesdays"), "{said}");
    mock.shutdown().await;
}

/// With no agent file named, as agents-exe: the files the nearest
/// `agents-exe.cfg.json` lists (`agentsFiles`, the `.json` files of
/// `agentsDirectories`; one not there holds none), and the model key from
/// `~/.config/agents-exe/secret-keys` by the agent's `apiKeyId`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_agent_file_the_configuration_names_them_and_the_keys_file_is_read() {
    use bindery_tests::mock_llm::{MockLlm, MockReply};
    let root = repo_layout();
    let (ok, said) = in_dir(root.path(), &["check"]);
    assert!(ok, "{said}");
    for agent in ["agent desk (", "agent faq (", "agent dev ("] {
        assert!(said.contains(agent), "{agent} not in:\n{said}");
    }
    // From a directory the listed paths are not relative to: said so.
    let (ok, said) = in_dir(&root.path().join("tools"), &["check"]);
    assert!(!ok, "{said}");
    assert!(said.contains("cannot read"), "{said}");

    let mock = MockLlm::start(|_| MockReply::text("ok")).await;
    let home = tempfile::tempdir().unwrap();
    let keys = home.path().join(".config/agents-exe");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::write(
        keys.join("secret-keys"),
        r#"{"keys": [{"id": "main-key", "value": "sk-CANARY-main-77"}]}"#,
    )
    .unwrap();
    let doc = serde_json::json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "keyed", "apiKeyId": "main-key", "flavor": "OpenAIv1",
        "modelUrl": mock.url(), "modelName": "m", "announce": "k", "systemPrompt": ["x"]}});
    std::fs::write(root.path().join("keyed.json"), doc.to_string()).unwrap();
    let home_dir = home.path().display().to_string();
    let (ok, said) = in_dir_async(
        root.path(),
        &[("HOME", &home_dir)],
        &["run", "--agent-file", "keyed.json", "-p", "hi"],
    );
    assert!(ok, "{said}");
    assert!(!said.contains("sk-CANARY-main-77"), "{said}");
    let (headers, _) = &mock.raw_requests()[0];
    let auth = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.as_str());
    assert_eq!(auth, Some("Bearer sk-CANARY-main-77"));
    mock.shutdown().await;
}

/// `Activation: on-demand`: the toolbox's tools stay hidden (and cannot
/// be called) until the model activates their group with agents-exe's
/// `meta_activate_tool`; `meta_deactivate_tool` hides them again. The
/// state is the conversation's own: each request offers what it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_tools_appear_when_the_model_activates_their_group() {
    use bindery_tests::mock_llm::{tool_names, tool_results, MockLlm, MockReply};
    use serde_json::json;
    let root = repo_layout();
    let agent = json!({"tag": "OpenAIAgentDescription", "contents": {
    "slug": "lazy", "apiKeyId": "main-key", "flavor": "OpenAIv1",
    "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m", "announce": "lazy",
    "systemPrompt": ["You read files when you must."],
    "bashToolboxes": [
        {"tag": "FileSystemDirectory", "contents": {"Path": "tools/dev", "BasenameFilter": ".sh",
          "Activation": {"tag": "on-demand", "toolgroup": "files"}}},
        {"tag": "SingleTool", "contents": {"Path": "tools/extra/word-count", "Activation": "always"}}
    ]}});
    std::fs::write(root.path().join("agents/lazy.json"), agent.to_string()).unwrap();
    let read = json!({"path": "tools/dev/notes.txt"});
    let mock = MockLlm::start_sequence(vec![
        MockReply::tool_call("bash_read-file", read.clone()),
        MockReply::tool_call("meta_discover_tools", json!({})),
        MockReply::tool_call("meta_activate_tool", json!({"toolgroup": "files"})),
        MockReply::tool_call("bash_read-file", read),
        MockReply::tool_call("meta_deactivate_tool", json!({"toolgroup": "files"})),
        MockReply::text("Tuesdays"),
    ])
    .await;
    let url = mock.url();
    let (ok, said) = in_dir_async(
        root.path(),
        &[("BINDERY_MODEL_URL", url.as_str())],
        &["run", "--agent-file", "agents/lazy.json", "-p", "when?"],
    );
    assert!(ok, "{said}");
    assert!(said.contains("Tuesdays"), "{said}");
    let requests = mock.requests();
    let offered: Vec<Vec<String>> = requests.iter().map(tool_names).collect();
    let hidden = [
        "meta_activate_tool",
        "meta_discover_tools",
        "bash_word-count",
    ];
    let shown = [
        "meta_deactivate_tool",
        "meta_discover_tools",
        "bash_read-file",
        "bash_word-count",
    ];
    assert_eq!(offered[0], hidden);
    assert_eq!(offered[3], shown);
    assert_eq!(offered[5], hidden, "deactivated again");
    let results = tool_results(&requests[5]);
    assert!(
        results[0].contains("toolgroup 'files', which is not active"),
        "{results:?}"
    );
    assert_eq!(results[1], r#"{"toolgroups":["files"]}"#);
    assert_eq!(results[2], "Toolgroup 'files' activated");
    assert!(
        results[3].contains("Deploys go out on Tuesdays."),
        "{results:?}"
    );
    assert_eq!(results[4], "Toolgroup 'files' deactivated");

    let (ok, said) = in_dir(root.path(), &["check", "--agent-file", "agents/lazy.json"]);
    assert!(ok, "{said}");
    assert!(
        said.contains("on demand: hidden until the model activates toolgroup 'files'"),
        "{said}"
    );
    assert!(
        said.contains("added by Bindery: meta_activate_tool"),
        "{said}"
    );

    // Anything but agents-exe's two forms is refused, naming the field.
    let bad = agent
        .to_string()
        .replace(r#""Activation":"always""#, r#""Activation":"sticky""#);
    std::fs::write(root.path().join("agents/lazy.json"), bad).unwrap();
    let (ok, said) = in_dir(root.path(), &["check", "--agent-file", "agents/lazy.json"]);
    assert!(!ok, "{said}");
    assert!(said.contains("`Activation` is \"always\""), "{said}");
    mock.shutdown().await;
}

/// `SqliteVersioned`: a write runs on a new copy of the database (the
/// named file untouched) and answers its `versionHandle`; the session's
/// next statement reads that copy (`shared: conversation`);
/// `sqlite_<Name>_promote` makes it the named file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_versioned_sqlite_toolbox_writes_copies_and_promotes_one() {
    use bindery_tests::mock_llm::{tool_names, tool_results, MockLlm, MockReply};
    use serde_json::json;
    let root = repo_layout();
    let agent = json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "notes", "apiKeyId": "main-key", "flavor": "OpenAIv1",
        "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m", "announce": "notes",
        "systemPrompt": ["You keep notes."],
        "builtinToolboxes": [{"tag": "SqliteToolbox", "contents": {
            "Name": "notes", "Description": "the notes",
            "Versioning": {"tag": "SqliteVersioned", "shared": "conversation",
                           "basePath": "data/notes.sqlite", "storageRoot": "data/versions"}}}]}});
    std::fs::write(root.path().join("agents/notes.json"), agent.to_string()).unwrap();
    let mock = MockLlm::start_sequence(vec![
        MockReply::tool_call(
            "sqlite_notes_query",
            json!({"sql": "CREATE TABLE note(body TEXT)"}),
        ),
        MockReply::tool_call(
            "sqlite_notes_query",
            json!({"sql": "INSERT INTO note VALUES ('ship it')"}),
        ),
        MockReply::tool_call(
            "sqlite_notes_query",
            json!({"sql": "SELECT body FROM note"}),
        ),
        MockReply::tool_call("sqlite_notes_promote", json!({})),
        MockReply::text("noted"),
    ])
    .await;
    let url = mock.url();
    let (ok, said) = in_dir_async(
        root.path(),
        &[("BINDERY_MODEL_URL", url.as_str())],
        &[
            "run",
            "--agent-file",
            "agents/notes.json",
            "-p",
            "note: ship it",
        ],
    );
    assert!(ok, "{said}");
    let requests = mock.requests();
    assert_eq!(
        tool_names(&requests[0]),
        ["sqlite_notes_query", "sqlite_notes_promote"]
    );
    let results = tool_results(&requests[4]);
    let created: Value = serde_json::from_str(results[0]).unwrap();
    let handle = &created["versionHandle"];
    assert_eq!(handle["toolbox_name"], "notes", "{created}");
    assert_eq!(handle["tool_call_index"], 0, "{created}");
    assert!(results[2].contains("ship it"), "{results:?}");
    assert!(results[3].contains("promoted_to"), "{results:?}");
    // Each write made a copy under the storage root.
    let session = handle["session_id"].as_str().unwrap();
    let copies = root.path().join("data/versions").join(session);
    assert!(copies.is_dir(), "{}", copies.display());

    // The promoted file holds the note; a new process reads it.
    let (ok, said) = in_dir(
        root.path(),
        &[
            "tool-call",
            "--agent-file",
            "agents/notes.json",
            "--tool",
            "sqlite_notes_query",
            "--args",
            r#"{"sql": "SELECT count(*) AS n FROM note"}"#,
        ],
    );
    assert!(ok, "{said}");
    assert!(said.contains("[[1]]"), "{said}");
    // A handle is the model's text: another session's copy is not its to read.
    let (ok, said) = in_dir(
        root.path(),
        &[
            "tool-call",
            "--agent-file",
            "agents/notes.json",
            "--tool",
            "sqlite_notes_query",
            "--args",
            &json!({"sql": "SELECT * FROM note", "restore_from": handle}).to_string(),
        ],
    );
    assert!(!ok, "{said}");
    assert!(said.contains("another session"), "{said}");
    mock.shutdown().await;
}

/// `check` says every problem of a file at once: an entry that does not
/// read, a refused kind, a guarding field misspelt, a missing tool
/// directory and a bad toolgroup, each with its place, and the entries
/// that read are loaded all the same.
#[test]
fn check_shows_every_class_of_error_at_once() {
    use serde_json::json;
    let root = repo_layout();
    let agent = json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "many", "apiKeyId": "main-key", "flavor": "OpenAIv1",
        "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m", "announce": "many",
        "systemPrompt": ["x"],
        "bashToolboxes": [
            {"tag": "FileSystemDirectory", "contents": {"Pth": "tools/dev"}},
            {"tag": "FileSystemDirectory", "contents": {"Path": "tools/nowhere"}},
            {"tag": "SingleTool", "contents": {"Path": "tools/extra/word-count",
                "Activation": {"tag": "on-demand", "toolgroup": "no spaces"}}}
        ],
        "openApiToolboxes": [{"tag": "OpenAPIServer", "contents": {
            "SpecUrl": "file://nowhere.json", "BaseUrl": "http://127.0.0.1:9", "Filtre": {"tag": "AlwaysTrue"}}}],
        "builtinToolboxes": [{"tag": "LuaToolbox", "contents": {}}]}});
    std::fs::write(root.path().join("agents/many.json"), agent.to_string()).unwrap();
    let (ok, said) = in_dir(root.path(), &["check", "--agent-file", "agents/many.json"]);
    assert!(!ok, "{said}");
    for problem in [
        "at `contents.bashToolboxes[0].contents`: missing field `Path`",
        "builtinToolboxes[0] (`LuaToolbox`)",
        "contents.openApiToolboxes[0].contents.Filtre: this field is not read as written",
        "cannot read tool directory",
        "toolgroup: `no spaces` is not a group name",
    ] {
        assert!(said.contains(problem), "{problem} not in:\n{said}");
    }
}

/// `run --session-file`: each UserTurn records the tools the next request
/// offers, so a toolgroup the model activates shows from that step on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_file_records_the_tools_each_step_offers() {
    use bindery_tests::mock_llm::{MockLlm, MockReply};
    use serde_json::json;
    let root = repo_layout();
    let agent = json!({"tag": "OpenAIAgentDescription", "contents": {
    "slug": "lazy", "apiKeyId": "main-key", "flavor": "OpenAIv1",
    "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m", "announce": "lazy",
    "systemPrompt": ["You read files when you must."],
    "bashToolboxes": [
        {"tag": "FileSystemDirectory", "contents": {"Path": "tools/dev", "BasenameFilter": ".sh",
          "Activation": {"tag": "on-demand", "toolgroup": "files"}}}
    ]}});
    std::fs::write(root.path().join("agents/lazy.json"), agent.to_string()).unwrap();
    let mock = MockLlm::start_sequence(vec![
        MockReply::tool_call("meta_activate_tool", json!({"toolgroup": "files"})),
        MockReply::text("ready"),
    ])
    .await;
    let url = mock.url();
    let (ok, said) = in_dir_async(
        root.path(),
        &[("BINDERY_MODEL_URL", url.as_str())],
        &[
            "run",
            "--agent-file",
            "agents/lazy.json",
            "--session-file",
            "lazy.session.json",
            "-p",
            "get ready",
        ],
    );
    assert!(ok, "{said}");
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(root.path().join("lazy.session.json")).unwrap(),
    )
    .unwrap();
    let names = |turn: usize| -> Vec<String> {
        doc["turns"][turn]["contents"]["userTools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["contents"]["llmName"].as_str().unwrap().to_string())
            .collect()
    };
    // Oldest first: the query's turn, then the activation's result.
    assert!(
        names(3).contains(&"meta_activate_tool".to_string()),
        "{doc}"
    );
    assert!(!names(3).contains(&"bash_read-file".to_string()), "{doc}");
    assert!(names(1).contains(&"bash_read-file".to_string()), "{doc}");
    mock.shutdown().await;
}

/// A binding in an agents-exe file pins its argument however its key is
/// cased where Bindery reads it (`Bindings`, `bindings`); a spelling it
/// does not read refuses the file rather than hand the argument to the
/// model.
#[test]
fn a_binding_in_any_spelling_pins_or_refuses() {
    use serde_json::json;
    let root = repo_layout();
    let agent = |key: &str| {
        json!({"tag": "OpenAIAgentDescription", "contents": {
            "slug": "pinned", "apiKeyId": "main-key", "flavor": "OpenAIv1",
            "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m", "announce": "pinned",
            "systemPrompt": ["x"],
            "bashToolboxes": [{"tag": "FileSystemDirectory", "contents": {
                "Path": "tools/dev", "BasenameFilter": ".sh",
                key: [{"arg": "path", "value": {"tag": "Literal", "contents": "tools/dev/notes.txt"}}]}}]}})
        .to_string()
    };
    for key in ["Bindings", "bindings"] {
        std::fs::write(root.path().join("agents/pinned.json"), agent(key)).unwrap();
        let (ok, said) = in_dir(
            root.path(),
            &["check", "--agent-file", "agents/pinned.json"],
        );
        assert!(ok, "{key}: {said}");
        assert!(said.contains("bash_read-file()"), "{key}: {said}");
        assert!(said.contains("bound: path := literal"), "{key}: {said}");
    }
    for key in ["BINDINGS", "Bindngs", "binding"] {
        std::fs::write(root.path().join("agents/pinned.json"), agent(key)).unwrap();
        let (ok, said) = in_dir(
            root.path(),
            &["check", "--agent-file", "agents/pinned.json"],
        );
        assert!(!ok, "{key}: {said}");
        assert!(
            said.contains("this field is not read as written"),
            "{key}: {said}"
        );
    }
}

/// A versioned database's copies are bounded in bytes as in number: a
/// write cannot grow a copy past what the session has left (`maxBytes`).
#[test]
fn a_versioned_copy_cannot_grow_past_the_sessions_bytes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.yaml"),
        "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {name: notes}\nspec:\n  model: {url: http://127.0.0.1:9/v1, name: m}\n  toolboxes:\n    - sqlite: {name: notes, path: notes.sqlite, readWrite: true, create: true,\n              versioned: {shared: conversation, storageRoot: copies, maxBytes: 200000}}\n",
    )
    .unwrap();
    let call = |sql: &str| {
        in_dir(
            dir.path(),
            &[
                "tool-call",
                "--agent-file",
                "agent.yaml",
                "--tool",
                "sqlite_notes",
                "--args",
                &serde_json::json!({ "query": sql }).to_string(),
            ],
        )
    };
    let (ok, said) = call(
        "CREATE TABLE big AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) SELECT i, randomblob(5000) AS b FROM n",
    );
    assert!(!ok, "{said}");
    assert!(said.contains("full"), "{said}");
    let mut largest = 0;
    for e in walk(&dir.path().join("copies")) {
        largest = largest.max(std::fs::metadata(e).unwrap().len());
    }
    assert!(largest <= 200_000, "a copy grew to {largest} bytes");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

/// A hidden tool that needs a person's approval asks nobody: the call is
/// answered with the group to activate, and nothing waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hidden_tool_asks_no_approval() {
    use bindery_tests::mock_llm::{tool_results, MockLlm, MockReply};
    let root = repo_layout();
    std::fs::write(
        root.path().join("gated.yaml"),
        "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {name: gated}\nspec:\n  model: {url: http://127.0.0.1:9/v1, name: m}\n  confirm: [{tool: bash_word-count}]\n  toolboxes:\n    - bash: {script: tools/extra/word-count, toolgroup: text}\n",
    )
    .unwrap();
    let mock = MockLlm::start_sequence(vec![
        MockReply::tool_call("bash_word-count", serde_json::json!({"text": "a b"})),
        MockReply::text("fine"),
    ])
    .await;
    let url = mock.url();
    let (ok, said) = in_dir_async(
        root.path(),
        &[("BINDERY_MODEL_URL", url.as_str())],
        &["run", "--agent-file", "gated.yaml", "-p", "count"],
    );
    assert!(ok, "{said}");
    let requests = mock.requests();
    let results = tool_results(&requests[1]);
    assert!(results[0].contains("which is not active"), "{results:?}");
    mock.shutdown().await;
}

/// `check` shows what a file says (a field's name, an announcement) with
/// its controls and bidi marks escaped: no file drives the terminal.
#[test]
fn check_output_drives_no_terminal() {
    let root = repo_layout();
    let agent = serde_json::json!({"tag": "OpenAIAgentDescription", "contents": {
        "slug": "loud", "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m",
        "announce": "hi\u{1b}]0;owned\u{7}\u{202e}", "systemPrompt": ["x"],
        "odd\u{1b}[2Jfield": 1}});
    std::fs::write(root.path().join("agents/loud.json"), agent.to_string()).unwrap();
    let (ok, said) = in_dir(root.path(), &["check", "--agent-file", "agents/loud.json"]);
    assert!(ok, "{said}");
    assert!(
        !said.contains('\u{1b}') && !said.contains('\u{202e}'),
        "{said:?}"
    );
    assert!(said.contains("\\u{1b}"), "{said}");
}
