//! Builtin toolboxes, driven as a user would: agents-exe files using each
//! builtin kind load or are refused with the documented reason (`check`),
//! bindings apply to builtin tools as to any other (`describe`,
//! `tool-call`), and through the real server the model asking for the
//! environment never gets a secret back.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, tool_results, MockLlm, MockReply};
use serde_json::{json, Value};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents-exe/builtins")
}

/// The corpus copied into a fresh directory, with the `notes.sqlite` its
/// SQLite toolboxes read.
fn corpus_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(corpus()).unwrap().flatten() {
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    notes_db(&dir.path().join("notes.sqlite"));
    dir
}

fn notes_db(path: &Path) {
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
             c.execute('CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)'); \
             c.executemany('INSERT INTO notes VALUES (?,?)', [(1,'ship on friday'),(2,'rotate the keys')]); \
             c.commit()",
        )
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

fn sidecar(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(bin())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Each file of the corpus that Bindery refuses, and the words of the
/// refusal: which entry, why, and what to use instead.
const REFUSED: &[(&str, &[&str])] = &[
    (
        "developer.json",
        &[
            "builtinToolboxes[0] (`DeveloperToolbox`)",
            "every tenant shares",
            "give the agent a bash tool",
        ],
    ),
    (
        "lua.json",
        &[
            "builtinToolboxes[0] (`LuaToolbox`)",
            "model-written Lua",
            "give the agent the tools the script would call",
        ],
    ),
    (
        "unknown-kind.json",
        &[
            "builtinToolboxes[0] (`BrowserToolbox`)",
            "it offers `SystemToolbox` and `SqliteToolbox`",
        ],
    ),
    (
        "env-vars-unlisted.json",
        &[
            "toolbox 1 (builtin env): capability `env-vars` needs the list of variables",
            "`envVarFilter`",
        ],
    ),
    (
        "env-vars-secret-source.json",
        &[
            "toolbox 1 (builtin env): `env-vars` may not show `SVC_TOKEN`",
            "declare a parameter and bind it",
        ],
    ),
    (
        "env-vars-param-prefix.json",
        &["`env-vars` may not show `BINDERY_PARAM_TENANT` holds a parameter's value"],
    ),
    (
        "env-vars-server-credentials.json",
        &[
            "`env-vars` may not show `BINDERY_OWNER_TOKEN`: by its name it holds a credential",
            "`BINDERY_APPROVER_TOKEN`",
            "`BINDERY_MCP_CLIENT_TOKEN`",
            "`BINDERY_MODEL_API_KEY`",
            "`AWS_SECRET_ACCESS_KEY`",
            "`DATABASE_URL`",
            "a secret parameter bound to its argument",
        ],
    ),
    (
        "env-vars-pattern.json",
        &["`APP_*` is not a variable name: list exact names"],
    ),
];

#[test]
fn each_builtin_kind_loads_or_is_refused_saying_why_and_what_instead() {
    let dir = corpus_copy();
    let (ok, out) = sidecar(
        dir.path(),
        &["check", "--agent-file", "system-and-sqlite.json"],
        &[],
    );
    assert!(ok, "{out}");
    for tool in [
        "system_system_system_info",
        "system_env_system_info",
        "system_session_system_info",
        "sqlite_notes_query",
        "sqlite_scratch_query",
    ] {
        assert!(out.contains(tool), "{tool} not in:\n{out}");
    }
    // agents-exe's session retrospective (its `retro.json` form): every
    // session capability loads, `all` narrowed to the lineage and said so.
    let (ok, out) = sidecar(dir.path(), &["check", "--agent-file", "sessions.json"], &[]);
    assert!(ok, "{out}");
    for w in [
        "system_history_system_info(capability, session_id?, query?)",
        "session scope `all` (agents-exe's `SessionIntrospectionScope`) reaches the calling session's fork lineage only",
    ] {
        assert!(out.contains(w), "`{w}` not in:\n{out}");
    }
    assert!(!out.contains("ignored field"), "{out}");
    // agents-exe's versioned SQLite (each write on a copy) loads too.
    let (ok, out) = sidecar(
        dir.path(),
        &["check", "--agent-file", "sqlite-versioned.json"],
        &[],
    );
    assert!(ok, "{out}");
    assert!(out.contains("sqlite_memory_query"), "{out}");
    // `attach-file` with agents-exe's `FileSandbox` loads; without one it
    // loads too (agents-exe's deny-all default), and `check` says so.
    let (ok, out) = sidecar(
        dir.path(),
        &["check", "--agent-file", "attach-file-sandbox.json"],
        &[],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("system_files_system_info(capability, filepath?)"),
        "{out}"
    );
    assert!(
        !out.contains("ignored field") && !out.contains("warning"),
        "{out}"
    );
    let (ok, out) = sidecar(
        dir.path(),
        &["check", "--agent-file", "attach-file.json"],
        &[],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("capability `attach-file` without `fileSandbox` (agents-exe's `FileSandbox`) denies every file"),
        "{out}"
    );
    let mut seen = 0;
    for (file, words) in REFUSED {
        let (ok, out) = sidecar(dir.path(), &["check", "--agent-file", file], &[]);
        assert!(!ok, "{file} loaded:\n{out}");
        for w in *words {
            assert!(out.contains(w), "{file}: `{w}` not in:\n{out}");
        }
        seen += 1;
    }
    // Every refused file of the corpus is in the table; five load.
    let files = std::fs::read_dir(corpus()).unwrap().count();
    assert_eq!(seen + 5, files);
}

/// A binding on a builtin tool works as on any other: `io_env` has its
/// `capability` bound (agent-level binding), so the model sees no
/// argument and the call reports the listed variables; `sqlite_notes`
/// answers a read and refuses a write, `sqlite_scratch` may write.
#[test]
fn bindings_apply_to_builtin_tools_and_sqlite_is_read_only_unless_declared() {
    let dir = corpus_copy();
    let (ok, out) = sidecar(
        dir.path(),
        &[
            "describe",
            "--agent-file",
            "system-and-sqlite.json",
            "--tool",
            "system_env_system_info",
        ],
        &[],
    );
    assert!(ok, "{out}");
    let described: Value = serde_json::from_str(&out[..out.rfind('}').unwrap() + 1]).unwrap();
    let tool = &described["tools"][0];
    assert_eq!(tool["bound"][0]["arg"], "capability", "{out}");
    assert_eq!(
        tool["function"]["parameters"]["properties"],
        json!({}),
        "{out}"
    );

    let env = [("APP_REGION", "eu-west"), ("HOME_SECRET_ELSEWHERE", "zzz")];
    let (ok, out) = sidecar(
        dir.path(),
        &[
            "tool-call",
            "--agent-file",
            "system-and-sqlite.json",
            "--tool",
            "system_env_system_info",
            "--args",
            "{}",
        ],
        &env,
    );
    assert!(ok, "{out}");
    assert!(out.contains("\"APP_REGION\":\"eu-west\""), "{out}");
    assert!(out.contains("\"APP_MIRROR\":null"), "{out}");
    assert!(
        !out.contains("zzz") && !out.contains("HOME_SECRET"),
        "{out}"
    );

    let call = |tool: &str, args: Value| {
        sidecar(
            dir.path(),
            &[
                "tool-call",
                "--agent-file",
                "system-and-sqlite.json",
                "--tool",
                tool,
                "--args",
                &args.to_string(),
            ],
            &[],
        )
    };
    let (ok, out) = call(
        "sqlite_notes_query",
        json!({"sql": "SELECT body FROM notes WHERE id = 2"}),
    );
    assert!(ok && out.contains("rotate the keys"), "{out}");
    let (_, out) = call("sqlite_notes_query", json!({"sql": "DELETE FROM notes"}));
    assert!(out.contains("read-only"), "{out}");
    let (ok, out) = call(
        "sqlite_scratch_query",
        json!({"sql": "INSERT INTO notes(body) VALUES ('x')"}),
    );
    assert!(ok && out.contains("\"changes\":1"), "{out}");
    let (_, out) = call(
        "sqlite_scratch_query",
        json!({"sql": "ATTACH DATABASE 'other.sqlite' AS o"}),
    );
    assert!(out.contains("not allowed"), "{out}");
    assert!(!dir.path().join("other.sqlite").exists());
}

/// One call of `io_env`'s `env-vars` through the server: agent `envy`
/// with `parameters` and a builtin toolbox showing `env_vars`, served with
/// `env`, in a session created with `params`. The tool's answer, and
/// every place a value could have reached: the model's requests, the
/// reply, the session's view, the store's files and the server's logs.
struct EnvCall {
    out: Value,
    sinks: Vec<(&'static str, Vec<u8>)>,
}

async fn env_call(
    parameters: &str,
    env_vars: &str,
    env: &[(&str, &str)],
    params: Value,
) -> EnvCall {
    env_call_with("", parameters, env_vars, env, params).await
}

/// [`env_call`] with `model_extra` in the agent's `model` mapping.
async fn env_call_with(
    model_extra: &str,
    parameters: &str,
    env_vars: &str,
    env: &[(&str, &str)],
    params: Value,
) -> EnvCall {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(|req: &Value| {
        let last = last_message(req);
        if last["role"] == "tool" {
            return MockReply::text(format!("env: {}", last["content"].as_str().unwrap_or("")));
        }
        MockReply::tool_call("io_env", json!({"capability": "env-vars"}))
    })
    .await;
    let agent = dir.path().join("env.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: envy}}
spec:
  model: {{url: "{}", name: mock-model{model_extra}}}
  parameters: {parameters}
  toolboxes:
    - builtin:
        name: env
        capabilities: [env-vars, date]
        envVars: {env_vars}
"#,
            mock.url()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let (sidecar, api) = serve(&agent, &sqlite_in(dir.path()), &[], env, dir.path());
    let id = new_session(&api, json!({"agent": "envy", "params": params})).await;
    let reply = message_waited(&api, &id, "what is set?").await;
    let session = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    let results: Vec<String> = mock
        .requests()
        .iter()
        .flat_map(|r| {
            tool_results(r)
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(results.len(), 1, "{results:?}");
    let out: Value = serde_json::from_str(&results[0]).unwrap();
    let requests = serde_json::to_string(&mock.requests()).unwrap();
    drop(sidecar);
    mock.shutdown().await;
    EnvCall {
        out,
        sinks: vec![
            ("the model's requests", requests.into_bytes()),
            ("the reply", reply.text.into_bytes()),
            ("the session's view", session.text.into_bytes()),
            ("the store", raw_files(dir.path(), "store.sqlite")),
            ("the logs", raw_files(&dir.path().join("logs"), "")),
        ],
    }
}

impl EnvCall {
    fn assert_nowhere(&self, secret: &str) {
        for (sink, bytes) in &self.sinks {
            assert!(!contains(bytes, secret), "{secret} reached {sink}");
        }
    }
}

/// The attack: the model asks for the environment. The variables listed
/// are shown, but one whose value is the process's secret parameter (read
/// from `SVC_TOKEN`) or the session's secret is withheld, by name only:
/// neither value reaches the model, the API's replies or the store.
#[tokio::test]
async fn the_model_asking_for_env_vars_never_gets_a_secret() {
    const PROCESS_SECRET: &str = "svc-SEKRIT-41";
    const SESSION_SECRET: &str = "sess-SEKRIT-42";
    let call = env_call(
        "\n    - {name: api_token, secret: true, scope: process, default: {env: SVC_TOKEN}}\n    - {name: billing_key, secret: true, scope: session}",
        "[APP_REGION, APP_MIRROR, APP_SESSION_COPY]",
        &[
            ("SVC_TOKEN", PROCESS_SECRET),
            ("APP_REGION", "eu-west"),
            ("APP_MIRROR", PROCESS_SECRET),
            ("APP_SESSION_COPY", SESSION_SECRET),
        ],
        json!({"billing_key": SESSION_SECRET}),
    )
    .await;
    let out = &call.out;
    assert_eq!(
        out["data"]["variables"],
        json!({"APP_REGION": "eu-west"}),
        "{out}"
    );
    assert_eq!(
        out["data"]["withheld"],
        json!(["APP_MIRROR", "APP_SESSION_COPY"]),
        "{out}"
    );
    for secret in [PROCESS_SECRET, SESSION_SECRET] {
        call.assert_nowhere(secret);
    }
}

/// The server's own credentials are live secrets: a variable that holds a
/// copy of the owner token, the approver token or the model's key under a
/// name `check` lets through is withheld at call time, and none of them
/// reaches the model, the store, the session's view or the logs.
#[tokio::test]
async fn env_vars_never_hands_over_the_servers_own_credentials() {
    const APPROVER: &str = "approver-SEKRIT-51";
    const MODEL_KEY: &str = "model-key-SEKRIT-52";
    let call = env_call(
        "[]",
        "[APP_REGION, APP_OWNER_COPY, APP_APPROVER_COPY, APP_MODEL_COPY]",
        &[
            ("BINDERY_APPROVER_TOKEN", APPROVER),
            ("BINDERY_MODEL_API_KEY", MODEL_KEY),
            ("APP_REGION", "eu-west"),
            ("APP_OWNER_COPY", OWNER),
            ("APP_APPROVER_COPY", APPROVER),
            ("APP_MODEL_COPY", MODEL_KEY),
        ],
        json!({}),
    )
    .await;
    let out = &call.out;
    assert_eq!(
        out["data"]["variables"],
        json!({"APP_REGION": "eu-west"}),
        "{out}"
    );
    assert_eq!(
        out["data"]["withheld"],
        json!(["APP_OWNER_COPY", "APP_APPROVER_COPY", "APP_MODEL_COPY"]),
        "{out}"
    );
    for secret in [OWNER, APPROVER, MODEL_KEY] {
        call.assert_nowhere(secret);
    }
}

/// The model key an agent file reads (`apiKey: {env: …}`) is the server's
/// own credential too: a copy under another name is withheld.
#[tokio::test]
async fn env_vars_never_hands_over_an_agents_model_key() {
    const KEY: &str = "sk-modelkey-SEKRIT-53";
    let call = env_call_with(
        ", apiKey: {env: LLMCRED}",
        "[]",
        "[APP_REGION, COPY_OF_MODEL]",
        &[
            ("LLMCRED", KEY),
            ("APP_REGION", "eu-west"),
            ("COPY_OF_MODEL", KEY),
        ],
        json!({}),
    )
    .await;
    assert_eq!(
        call.out["data"]["withheld"],
        json!(["COPY_OF_MODEL"]),
        "{}",
        call.out
    );
    call.assert_nowhere(KEY);
}

/// `read-session` and `get-session-stats` report the calling session and
/// nothing else: two sessions of one agent, the second reads itself and
/// sees none of the first's conversation, with the tool cache on (a
/// result is never served to another session).
#[tokio::test]
async fn the_session_capabilities_see_only_the_calling_session() {
    const FIRST: &str = "first-session-private-note-31";
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(|req: &Value| {
        let last = last_message(req);
        if last["role"] == "tool" {
            return MockReply::text(format!("seen: {}", last["content"].as_str().unwrap_or("")));
        }
        let prompt = last["content"].as_str().unwrap_or("");
        let capability = if prompt.contains("stats") {
            "get-session-stats"
        } else {
            "read-session"
        };
        MockReply::tool_call("io_session", json!({"capability": capability}))
    })
    .await;
    let agent = dir.path().join("s.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: reader}}
spec:
  model: {{url: "{}", name: mock-model}}
  toolboxes:
    - builtin: {{name: session, capabilities: [read-session, get-session-stats]}}
"#,
            mock.url()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let (_sidecar, api) = serve(
        &agent,
        &sqlite_in(dir.path()),
        &["--tool-cache-ttl", "300"],
        &[],
        dir.path(),
    );
    let first = new_session(&api, json!({"agent": "reader"})).await;
    let r = message_waited(&api, &first, FIRST).await;
    assert!(
        r.text.contains(FIRST),
        "the first session reads itself: {}",
        r.text
    );
    let second = new_session(&api, json!({"agent": "reader"})).await;
    let r = message_waited(&api, &second, "what was said?").await;
    assert!(!r.text.contains(FIRST), "{}", r.text);
    assert!(
        r.text.contains(&second) && !r.text.contains(&first),
        "{}",
        r.text
    );
    let r = message_waited(&api, &second, "stats please").await;
    let seen = r.json["session"]["turns"]
        .as_array()
        .and_then(|t| t.last())
        .and_then(|t| t["content"].as_str())
        .unwrap_or("")
        .to_string();
    let stats: Value = serde_json::from_str(seen.trim_start_matches("seen: ")).unwrap();
    assert_eq!(stats["data"]["session_id"], json!(second), "{stats}");
    assert_eq!(stats["data"]["toolCalls"]["io_session"], 2, "{stats}");
    assert_eq!(stats["data"]["byRole"]["user"], 2, "{stats}");
    // Outside a session (the CLI), there is nothing to report.
    let out = Command::new(bin())
        .args(["tool-call", "--agent-file"])
        .arg(&agent)
        .args([
            "--tool",
            "io_session",
            "--args",
            r#"{"capability": "read-session"}"#,
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("there is no session here"), "{text}");
    mock.shutdown().await;
}

/// The tool's output the model was shown last in `r`'s session (the mock
/// answers a tool's result with `seen: <output>`).
fn seen(r: &bindery_tests::sidecar::Reply) -> Value {
    let last = r.json["session"]["turns"]
        .as_array()
        .and_then(|t| t.last())
        .and_then(|t| t["content"].as_str())
        .unwrap_or("");
    let out: Value = serde_json::from_str(last.trim_start_matches("seen: "))
        .unwrap_or_else(|e| panic!("{e}: {last}"));
    out["data"].clone()
}

/// The ids a `list-sessions` answer names.
fn listed(data: &Value) -> Vec<String> {
    data["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap().to_string())
        .collect()
}

/// `list-sessions` and `search-sessions` reach the calling session's
/// forks, and the session it was forked from, and never another session
/// of the same server: a stranger's session holds a canary, and no model
/// request but the stranger's own ever carries it.
#[tokio::test]
async fn list_and_search_sessions_reach_the_callers_lineage_and_no_other_session() {
    const CANARY: &str = "STRANGER-CANARY-77";
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(|req: &Value| {
        let last = last_message(req);
        if last["role"] == "tool" {
            return MockReply::text(format!("seen: {}", last["content"].as_str().unwrap_or("")));
        }
        let prompt = last["content"].as_str().unwrap_or("");
        if prompt == "list" {
            return MockReply::tool_call("io_history", json!({"capability": "list-sessions"}));
        }
        if let Some(id) = prompt.strip_prefix("read ") {
            return MockReply::tool_call(
                "io_history",
                json!({"capability": "read-session", "session_id": id}),
            );
        }
        if let Some(q) = prompt.strip_prefix("search ") {
            return MockReply::tool_call(
                "io_history",
                json!({"capability": "search-sessions", "query": q}),
            );
        }
        MockReply::text("noted")
    })
    .await;
    let agent = dir.path().join("retro.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: retro}}
spec:
  model: {{url: "{}", name: mock-model}}
  toolboxes:
    - builtin:
        name: history
        capabilities: [list-sessions, search-sessions, read-session]
        sessionMaxResults: 10
"#,
            mock.url()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let (_sidecar, api) = serve(&agent, &sqlite_in(dir.path()), &[], &[], dir.path());

    // Someone else's session on the same server.
    let stranger = new_session(&api, json!({"agent": "retro"})).await;
    message_waited(&api, &stranger, &format!("zebra-word {CANARY} is my note")).await;
    let stranger_requests = mock.requests().len();

    let root = new_session(&api, json!({"agent": "retro"})).await;
    message_waited(&api, &root, "hello from the root").await;
    let fork = api
        .call(
            "POST",
            &format!("/v1/sessions/{root}/fork"),
            Some(OWNER),
            Some(&json!({})),
        )
        .await;
    assert_eq!(fork.status, 201, "{}", fork.text);
    let fork = fork.json["session_id"].as_str().unwrap().to_string();
    message_waited(&api, &fork, "the fork talks about FORK-NEEDLE-5").await;
    let grandchild = api
        .call(
            "POST",
            &format!("/v1/sessions/{fork}/fork"),
            Some(OWNER),
            Some(&json!({})),
        )
        .await;
    assert_eq!(grandchild.status, 201, "{}", grandchild.text);
    let grandchild = grandchild.json["session_id"].as_str().unwrap().to_string();

    // The root lists itself and its forks, transitively, newest first.
    let listing = seen(&message_waited(&api, &root, "list").await);
    assert_eq!(
        listed(&listing),
        [grandchild.clone(), fork.clone(), root.clone()],
        "{listing}"
    );
    assert_eq!(listing["totalAccessible"], 3, "{listing}");
    assert_eq!(listing["scope"], "subtree");
    let of_fork = &listing["sessions"][1];
    assert_eq!(
        (
            &of_fork["isChild"],
            &of_fork["forkedFrom"],
            &of_fork["agent"]
        ),
        (&json!(true), &json!(root), &json!("retro")),
        "{listing}"
    );
    // The fork sees the root as its parent, and its own child.
    let listing = seen(&message_waited(&api, &fork, "list").await);
    assert_eq!(
        listed(&listing),
        [grandchild.clone(), fork.clone(), root.clone()],
        "{listing}"
    );
    assert_eq!(listing["sessions"][2]["isParent"], true, "{listing}");

    // A search from the root finds what was said in the fork.
    let found = seen(&message_waited(&api, &root, "search fork-needle-5").await);
    let hits = found["results"].as_array().unwrap();
    assert!(
        hits.iter().any(|h| h["sessionId"] == json!(fork)
            && h["preview"].as_str().unwrap().contains("FORK-NEEDLE-5")),
        "{found}"
    );
    assert_eq!(found["complete"], true);
    // …and nothing of the stranger's, whose words it never reaches (the
    // root's own prompt holds the word: the search finds that one only).
    let found = seen(&message_waited(&api, &root, "search zebra-word").await);
    let hits: Vec<&Value> = found["results"].as_array().unwrap().iter().collect();
    assert_eq!(hits.len(), 1, "{found}");
    assert_eq!(
        (
            &hits[0]["sessionId"],
            &hits[0]["isCurrent"],
            &hits[0]["role"]
        ),
        (&json!(root), &json!(true), &json!("user")),
        "{found}"
    );
    assert_eq!(found["totalMatches"], 1, "{found}");

    // The root reads its fork whole; the stranger's session it may not
    // read, refused as a session that is nowhere would be.
    let read = seen(&message_waited(&api, &root, &format!("read {fork}")).await);
    assert_eq!(
        (&read["session_id"], &read["relation"]),
        (&json!(fork), &json!("child")),
        "{read}"
    );
    assert!(read.to_string().contains("FORK-NEEDLE-5"), "{read}");
    let refused = message_waited(&api, &root, &format!("read {stranger}")).await;
    let nowhere = message_waited(&api, &root, "read no-such-session").await;
    let last = |r: &bindery_tests::sidecar::Reply| {
        r.json["session"]["turns"]
            .as_array()
            .and_then(|t| t.last())
            .and_then(|t| t["content"].as_str())
            .unwrap_or("")
            .to_string()
    };
    assert!(
        last(&refused).contains("is not one this session may read"),
        "{}",
        refused.text
    );
    assert_eq!(
        last(&refused).replace(&stranger, "ID"),
        last(&nowhere).replace("no-such-session", "ID"),
        "a stranger's session is refused as one that does not exist"
    );

    let requests = mock.requests();
    let later = serde_json::to_string(&requests[stranger_requests..]).unwrap();
    assert!(
        !later.contains(CANARY),
        "the canary reached another session's model"
    );

    // Outside a session (the CLI) there is no store: nothing to list.
    let out = Command::new(bin())
        .args(["tool-call", "--agent-file"])
        .arg(&agent)
        .args([
            "--tool",
            "io_history",
            "--args",
            r#"{"capability": "list-sessions"}"#,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("no session store here"), "{text}");
    mock.shutdown().await;
}

/// `attach-file` through the binary, on agents-exe's file whose
/// `FileSandbox` allows `./shared`: a picture there comes back as media;
/// one outside, a symlink inside leading outside, `..` out of it and a
/// dot-file are refused; the file without a sandbox attaches nothing.
#[test]
fn attach_file_reads_only_what_the_sandbox_allows_where_the_file_really_is() {
    let dir = corpus_copy();
    let d = dir.path();
    std::fs::create_dir_all(d.join("shared/pics")).unwrap();
    std::fs::create_dir(d.join("private")).unwrap();
    std::fs::write(d.join("shared/pics/cat.png"), b"\x89PNG\r\n\x1a\ncat").unwrap();
    std::fs::write(d.join("shared/.hidden.png"), b"\x89PNG").unwrap();
    std::fs::write(d.join("private/dog.png"), b"\x89PNG\r\n\x1a\ndog").unwrap();
    std::os::unix::fs::symlink(d.join("private/dog.png"), d.join("shared/dog.png")).unwrap();
    let call = |file: &str, path: &str| {
        sidecar(
            d,
            &[
                "tool-call",
                "--agent-file",
                file,
                "--tool",
                "system_files_system_info",
                "--args",
                &json!({"capability": "attach-file", "filepath": path}).to_string(),
            ],
            &[],
        )
    };
    let (ok, out) = call("attach-file-sandbox.json", "shared/pics/cat.png");
    assert!(ok, "{out}");
    assert!(out.contains("[image/png, 11 bytes]"), "{out}");
    for path in [
        "private/dog.png",
        "shared/dog.png",
        "shared/pics/../../private/dog.png",
        "shared/.hidden.png",
    ] {
        let (ok, out) = call("attach-file-sandbox.json", path);
        assert!(!ok, "{path}: {out}");
        assert!(
            out.contains("is not allowed by this toolbox's file sandbox"),
            "{path}: {out}"
        );
    }
    let (ok, out) = call("attach-file-sandbox.json", "shared/pics");
    assert!(!ok && out.contains("is not a regular file"), "{out}");
    let (ok, out) = call("attach-file.json", "shared/pics/cat.png");
    assert!(!ok && out.contains("has no file sandbox"), "{out}");
}

/// A server's private files are never attached, whatever the sandbox
/// allows (here everything): its `--api-keys` file, its approver token
/// file, its SQLite store, and `/proc`; a file beside them is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_file_never_reads_the_servers_credentials_or_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mock = MockLlm::start(|req: &Value| {
        let last = last_message(req);
        if last["role"] == "tool" {
            return MockReply::text(format!("tool: {}", last["content"].as_str().unwrap_or("")));
        }
        let path = last["content"].as_str().unwrap_or("").trim().to_string();
        MockReply::tool_call(
            "io_files",
            json!({"capability": "attach-file", "filepath": path}),
        )
    })
    .await;
    let agent = d.join("viewer.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: viewer}}\nspec:\n  model: {{url: \"{}\", name: m}}\n  toolboxes:\n    - builtin:\n        name: files\n        capabilities: [attach-file]\n        fileSandbox: {{predicate: alwaysAllow}}\n",
            mock.url()
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("keys.json"),
        r#"{"keys": [{"id": "unused", "value": "key-SEKRIT-61"}]}"#,
    )
    .unwrap();
    std::fs::write(d.join("approver.txt"), "approver-SEKRIT-62").unwrap();
    std::fs::write(d.join("public.png"), b"\x89PNG\r\n\x1a\n").unwrap();
    std::fs::create_dir_all(d.join("logs")).unwrap();
    let keys = d.join("keys.json").display().to_string();
    let approver = d.join("approver.txt").display().to_string();
    let (sidecar, api) = serve(
        &agent,
        &sqlite_in(d),
        &["--api-keys", &keys, "--approver-token-file", &approver],
        &[],
        d,
    );
    let id = new_session(&api, json!({"agent": "viewer"})).await;
    let mut said = Vec::new();
    for path in [
        keys.clone(),
        approver.clone(),
        d.join("store.sqlite").display().to_string(),
        "/proc/self/environ".to_string(),
        d.join("public.png").display().to_string(),
    ] {
        let reply = message_waited(&api, &id, &path).await;
        said.push((path, reply.text));
    }
    let requests = serde_json::to_string(&mock.requests()).unwrap();
    drop(sidecar);
    mock.shutdown().await;
    let (public, private) = said.split_last().unwrap();
    for (path, text) in private {
        assert!(
            text.contains(&format!(
                "`{path}` is not allowed by this toolbox's file sandbox"
            )),
            "{path}: {text}"
        );
    }
    assert!(
        public.1.contains("data:image/png;base64,iVBORw0KGgo="),
        "{}",
        public.1
    );
    for secret in ["key-SEKRIT-61", "approver-SEKRIT-62"] {
        assert!(!requests.contains(secret), "{secret}");
    }
}
