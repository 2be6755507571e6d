//! `bindery-sidecar check`, `describe` and `tool-call`, driven as a user
//! would: the real binary, real agent files, real bash scripts.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

const CANARY: &str = "canary-7f3a9c";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bindery-sidecar"));
    // Only what the test gives: no BINDERY_* leaking in from the outside.
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    c
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn invoices() -> String {
    repo()
        .join("examples/invoices/agent.yaml")
        .display()
        .to_string()
}

fn invoices_exe() -> String {
    repo()
        .join("examples/invoices/agents-exe/invoices.json")
        .display()
        .to_string()
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(cmd: &mut Command) -> Out {
    let o = cmd.output().expect("the binary runs");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn sha256(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Each file in fixtures/invalid is an agent with one mistake; its
/// `# expect:` lines (or `<file>.expect`) hold what `check` must say.
#[test]
fn every_invalid_fixture_fails_with_a_precise_message() {
    let dir = fixtures().join("invalid");
    let mut seen = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        if path.extension().is_some_and(|e| e == "expect") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut expected: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .map(str::to_string)
            .collect();
        let side = PathBuf::from(format!("{}.expect", path.display()));
        if let Ok(s) = std::fs::read_to_string(&side) {
            expected.extend(s.lines().map(str::to_string));
        }
        assert!(
            !expected.is_empty(),
            "{} says nothing it expects",
            path.display()
        );
        let out = run(bin().arg("check").arg("--agent-file").arg(&path));
        assert_eq!(out.code, 1, "{}: {}", path.display(), out.stdout);
        for e in &expected {
            assert!(
                out.stderr.contains(e.as_str()),
                "{}: expected\n  {e}\nin\n{}",
                path.display(),
                out.stderr
            );
        }
        // Every message names the file it is about.
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for line in out
            .stderr
            .lines()
            .filter(|l| l.trim_start().starts_with("error:") && !l.starts_with("error: the agents"))
        {
            assert!(line.contains(&name), "{line}");
        }
        seen += 1;
    }
    assert!(seen >= 14, "only {seen} fixtures");
}

#[test]
fn check_json_lists_diagnostics_for_machines() {
    let bad = fixtures().join("invalid/secret-in-argv.yaml");
    let out = run(bin()
        .args(["check", "--output", "json", "--agent-file"])
        .arg(&bad));
    assert_eq!(out.code, 1);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["diagnostics"][0]["level"], "error");
    assert!(v["diagnostics"][0]["message"]
        .as_str()
        .unwrap()
        .contains("mode `dashdashspace`"));
}

#[test]
fn check_shows_how_each_parameter_resolved() {
    let out = run(bin().args(["check", "--agent-file", &invoices()]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("tenant         session  -       required  session"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("billing_token  process  secret  required  default:file demo-billing-token"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("bash_query-invoices(status?, since?)"));
    assert!(out
        .stdout
        .contains("bound: token := param billing_token [env]"));

    let out = run(bin()
        .args([
            "check",
            "--output",
            "json",
            "--agent-file",
            &invoices(),
            "--pin",
            "tenant=acme-corp",
        ])
        .env("BINDERY_PARAM_BILLING_TOKEN", CANARY));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let params = &v["agents"][0]["parameters"];
    assert_eq!(params[0]["name"], "tenant");
    assert_eq!(params[0]["source"], "pinned");
    assert_eq!(params[0]["pinned"], true);
    assert_eq!(params[1]["source"], "env BINDERY_PARAM_BILLING_TOKEN");
    assert_eq!(params[1]["bound"], true);
    assert_eq!(
        v["agents"][0]["tools"][0]["arguments"],
        serde_json::json!(["status?", "since?"])
    );

    let out = run(bin()
        .args(["check", "--output", "json", "--agent-file", &invoices()])
        .env("BINDERY_PIN_TENANT", "acme-corp")
        .env("BINDERY_PARAM_BILLING_TOKEN", CANARY));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        v["agents"][0]["parameters"][0]["source"],
        "pinned (env BINDERY_PIN_TENANT)"
    );
}

#[test]
fn a_value_for_an_undeclared_parameter_is_a_typo() {
    let out = run(bin().args([
        "check",
        "--agent-file",
        &invoices(),
        "--set",
        "tenantt=acme",
    ]));
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("parameter `tenantt` (--set) is declared by no loaded agent (declared: billing_token, tenant)"),
        "{}",
        out.stderr
    );
    let out = run(bin()
        .args(["check", "--agent-file", &invoices()])
        .env("BINDERY_PARAM_TENANTT", "x"));
    assert!(
        out.stderr
            .contains("parameter `tenantt` (env BINDERY_PARAM_TENANTT)"),
        "{}",
        out.stderr
    );
    let out = run(bin().args([
        "check",
        "--agent-file",
        &invoices(),
        "--set",
        "tenant=a",
        "--pin",
        "tenant=b",
    ]));
    assert!(
        out.stderr
            .contains("`tenant` is given twice (--set and --pin)"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_secret_must_be_a_string() {
    let out = run(bin().args([
        "check",
        "--agent-file",
        &invoices(),
        "--set-json",
        "billing_token={\"t\": 1}",
    ]));
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("parameter `billing_token` (--set-json): a secret parameter takes a string, got an object"), "{}", out.stderr);
}

#[test]
fn describe_prints_exactly_what_the_model_receives() {
    let out = run(bin().args([
        "describe",
        "--agent-file",
        &invoices(),
        "--tool",
        "bash_query-invoices",
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let tool = &v["tools"][0];
    assert_eq!(tool["type"], "function");
    assert_eq!(tool["function"]["name"], "bash_query-invoices");
    let params = &tool["function"]["parameters"];
    assert_eq!(params["required"], serde_json::json!([]));
    let props: Vec<&String> = params["properties"].as_object().unwrap().keys().collect();
    assert_eq!(props, ["since", "status"]);
    let schema = tool["function"].to_string();
    assert!(
        !schema.contains("tenant") && !schema.contains("token"),
        "{schema}"
    );
    assert_eq!(tool["bound"][0]["arg"], "tenant_id");
    assert_eq!(tool["bound"][1]["mode"], "env");

    let out = run(bin().args(["describe", "--agent-file", &invoices(), "--tool", "nope"]));
    assert_eq!(out.code, 1);
    assert!(out
        .stderr
        .contains("agent `invoices` has no tool `nope` (tools: bash_query-invoices)"));
}

/// `describe --tools PROVIDER`: the tools as that provider's requests
/// carry them, bound arguments gone from each; `check` names the model.
#[test]
fn describe_prints_the_tools_as_each_provider_receives_them() {
    let sent = |provider: &str| -> serde_json::Value {
        let out = run(bin().args(["describe", "--agent-file", &invoices(), "--tools", provider]));
        assert_eq!(out.code, 0, "{}", out.stderr);
        serde_json::from_str(&out.stdout).unwrap()
    };
    let anthropic = sent("anthropic");
    assert_eq!(anthropic["provider"], "anthropic");
    let tool = &anthropic["tools"][0];
    assert_eq!(tool["name"], "bash_query-invoices");
    let props: Vec<&String> = tool["input_schema"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(props, ["since", "status"]);
    assert_eq!(tool["cache_control"]["type"], "ephemeral");
    assert!(tool.get("bound").is_none() && tool.get("function").is_none());
    let openai = sent("openai");
    assert_eq!(
        openai["tools"][0]["function"]["name"],
        "bash_query-invoices"
    );
    assert!(openai["tools"][0].get("bound").is_none());

    // Each native shape: Gemini's declarations, Bedrock's toolSpecs with
    // a cache point, the Responses API's flat functions.
    let gemini = sent("gemini");
    let declared = &gemini["tools"][0]["functionDeclarations"][0];
    assert_eq!(declared["name"], "bash_query-invoices");
    assert!(declared["parametersJsonSchema"]["properties"]
        .get("tenant_id")
        .is_none());
    let bedrock = sent("bedrock");
    assert_eq!(
        bedrock["tools"][0]["toolSpec"]["name"],
        "bash_query-invoices"
    );
    assert!(
        bedrock["tools"][0]["toolSpec"]["inputSchema"]["json"]["properties"]
            .get("tenant_id")
            .is_none()
    );
    assert_eq!(
        bedrock["tools"].as_array().unwrap().last().unwrap()["cachePoint"]["type"],
        "default"
    );
    for name in ["responses", "openai-responses"] {
        let responses = sent(name);
        assert_eq!(responses["provider"], "openai-responses");
        assert_eq!(responses["tools"][0]["type"], "function");
        assert_eq!(responses["tools"][0]["name"], "bash_query-invoices");
    }
    assert_eq!(sent("azure-openai")["tools"], openai["tools"]);

    let out = run(bin().args(["describe", "--agent-file", &invoices(), "--tools", "vertex"]));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains(
            "`vertex` is not a provider Bindery speaks: openai, openai-responses, anthropic, gemini, bedrock, azure-openai"
        ),
        "{}",
        out.stderr
    );

    let out = run(bin()
        .args(["check", "--agent-file", &invoices()])
        .env("BINDERY_PARAM_BILLING_TOKEN", CANARY));
    assert!(
        out.stdout
            .contains("  model: gpt-4o-mini (openai, https://api.openai.com/v1)\n"),
        "{}",
        out.stdout
    );
    // Each fallback too. A URL with a user and password in it is refused,
    // and its password is shown nowhere.
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("a.yaml");
    let with_fallback = |url: &str| {
        format!("apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model:\n    provider: anthropic\n    url: https://api.anthropic.com/v1\n    name: claude\n    thinking: {{budgetTokens: 2048}}\n    fallbacks:\n      - {{url: \"{url}\", name: gpt, pricing: {{inputPerMillion: 2, outputPerMillion: 8}}}}\n")
    };
    std::fs::write(
        &agent,
        with_fallback("https://u:pw-canary@api.openai.com/v1"),
    )
    .unwrap();
    let out = run(bin().arg("check").arg("--agent-file").arg(&agent));
    assert_ne!(out.code, 0);
    assert!(
        (out.stdout.clone() + &out.stderr).contains("url has a user or password before its host"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(!(out.stdout.clone() + &out.stderr).contains("pw-canary"));
    std::fs::write(&agent, with_fallback("https://api.openai.com/v1")).unwrap();
    let out = run(bin().arg("check").arg("--agent-file").arg(&agent));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("  model: claude (anthropic, https://api.anthropic.com/v1)\n    credentials: none\n    max tokens: 8192\n    thinking: up to 2048 tokens\n"), "{}", out.stdout);
    assert!(out.stdout.contains("  fallback 1: gpt (openai, https://api.openai.com/v1)\n    credentials: none\n    prices per million tokens (USD): input 2, output 8"), "{}", out.stdout);
    // The cloud providers: where their credentials come from; a model the
    // shipped table knows is priced from it, with the table's date.
    std::fs::write(
        &agent,
        "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec:\n  model:\n    provider: bedrock\n    url: https://bedrock-runtime.eu-west-3.amazonaws.com\n    name: m\n    fallbacks:\n      - {provider: azure-openai, url: \"https://r.openai.azure.com\", name: d}\n      - {provider: anthropic, url: \"https://api.anthropic.com/v1\", name: claude-haiku-4-5-20251001, apiKey: {env: K}}\n",
    )
    .unwrap();
    let out = run(bin().arg("check").arg("--agent-file").arg(&agent));
    assert_eq!(out.code, 0, "{}", out.stderr);
    for line in [
        "  model: m (bedrock, https://bedrock-runtime.eu-west-3.amazonaws.com/)\n    credentials: pod identity, region eu-west-3\n",
        "  fallback 1: d (azure-openai, https://r.openai.azure.com/)\n    credentials: pod identity, api-version 2024-10-21\n",
        "  fallback 2: claude-haiku-4-5-20251001 (anthropic, https://api.anthropic.com/v1)\n    credentials: key\n    max tokens: 8192\n    prices per million tokens (USD, from Bindery's price table 2026-12-07): input 1, output 5, cache read 0.1, cache write 1.25, reasoning 5\n",
    ] {
        assert!(out.stdout.contains(line), "{line}\nnot in\n{}", out.stdout);
    }
    assert!(!out.stdout.contains("canary"), "{}", out.stdout);
}

#[test]
fn tool_call_runs_through_the_bindings() {
    let out = run(bin().args([
        "tool-call",
        "--agent-file",
        &invoices(),
        "--set",
        "tenant=acme-corp",
        "--tool",
        "bash_query-invoices",
        "--args",
        r#"{"status": "overdue", "tenant_id": "globex"}"#,
    ]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "2026-10-01\tINV-1002\t850.50 EUR\toverdue\n");
    assert!(out
        .stderr
        .contains("the model sent a bound argument; the bound value was used"));

    let out = run(bin().args([
        "tool-call",
        "--agent-file",
        &invoices(),
        "--set",
        "tenant=acme-corp",
        "--tool",
        "bash_query-invoices",
        "--args",
        r#"{"since": "2099-01-01"}"#,
    ]));
    assert_eq!(out.stdout, "No invoices match.\n", "empty-result applies");
}

#[test]
fn an_unbound_parameter_tells_the_operator_and_not_the_model() {
    let out = run(bin().args([
        "tool-call",
        "--agent-file",
        &invoices(),
        "--tool",
        "bash_query-invoices",
    ]));
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("argument `tenant_id` is bound to parameter `tenant`, which has no value"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("error: tool bash_query-invoices: tool unavailable"),
        "{}",
        out.stderr
    );
}

fn probe() -> String {
    fixtures().join("valid/probe.yaml").display().to_string()
}

#[test]
fn env_mode_keeps_the_token_out_of_argv() {
    let out = run(bin()
        .args([
            "tool-call",
            "--agent-file",
            &probe(),
            "--set",
            "repo=r1",
            "--tool",
            "bash_probe",
        ])
        .args([
            "--args",
            r#"{"note": "hello world", "level": 3, "body": "line"}"#,
        ])
        .env("BINDERY_PARAM_TOKEN", CANARY));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("argv: [--repo] [r1] [hello world] [--level=3]"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("stdin: line|"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains(&format!("token-sha256: {}", sha256(CANARY))),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("bindery-vars: 0"),
        "the sidecar's BINDERY_* variables are withheld (the mark BINDERY_TOOL_SERVER aside): {}",
        out.stdout
    );
    assert!(out.stdout.contains("agent: prober"), "{}", out.stdout);
    assert!(!out.stdout.contains(CANARY) && !out.stderr.contains(CANARY));
}

#[test]
fn required_arguments_timeouts_output_limits_and_failures() {
    let call = |args: &str, extra: &[&str]| {
        run(bin()
            .args([
                "tool-call",
                "--agent-file",
                &probe(),
                "--tool",
                "bash_sleeper",
                "--args",
                args,
            ])
            .args(extra))
    };
    let out = call("{}", &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("invalid arguments: missing required argument `mode`"),
        "{}",
        out.stderr
    );

    let out = call(r#"{"mode": "fail"}"#, &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("exit status 4: it broke"),
        "{}",
        out.stderr
    );

    let out = call(r#"{"mode": "sleep"}"#, &["--tool-timeout", "1"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("the tool did not finish within 1s and was stopped"),
        "{}",
        out.stderr
    );

    let out = call(r#"{"mode": "flood"}"#, &["--tool-max-output", "1000"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("flood\nflood\n"));
    assert!(
        out.stdout.ends_with("[output cut at 1000 bytes]\n"),
        "{}",
        &out.stdout[out.stdout.len() - 60..]
    );

    let out = call("[1]", &[]);
    assert!(
        out.stderr
            .contains("arguments must be a JSON object, got an array"),
        "{}",
        out.stderr
    );
}

/// The invoices agent in agents-exe's JSON form and in Bindery's YAML form
/// load to the same agent and behave the same.
#[test]
fn agents_exe_files_behave_like_native_ones() {
    // agents-exe's paths are relative to the working directory: the
    // repository's root, as for agents-exe's own files.
    let describe = |file: &str| {
        run(bin()
            .current_dir(repo())
            .args(["describe", "--agent-file", file]))
        .stdout
    };
    let native = describe(&invoices());
    assert!(native.contains("bash_query-invoices"));
    assert_eq!(native, describe(&invoices_exe()));

    let report = |file: &str| {
        let out = run(bin()
            .current_dir(repo())
            .args(["check", "--output", "json", "--agent-file", file])
            .env("BINDERY_PARAM_TENANT", "acme-corp"));
        assert_eq!(out.code, 0, "{}", out.stderr);
        let mut v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let agent = v["agents"][0].take();
        (
            agent["tools"].clone(),
            agent["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["name"].clone(),
                        p["scope"].clone(),
                        p["secret"].clone(),
                        p["bound"].clone(),
                    )
                })
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(report(&invoices()), report(&invoices_exe()));

    let call = |file: &str| {
        run(bin().current_dir(repo()).args([
            "tool-call",
            "--agent-file",
            file,
            "--set",
            "tenant=globex",
            "--tool",
            "bash_query-invoices",
            "--args",
            "{}",
        ]))
        .stdout
    };
    let native = call(&invoices());
    assert!(native.contains("INV-2002"), "{native}");
    assert_eq!(native, call(&invoices_exe()));
}

/// A secret canary given every way a secret can be given appears in no
/// output of check, describe or tool-call, in either log format.
#[test]
fn secrecy_canary() {
    let dir = tempfile::tempdir().unwrap();
    let params_file = dir.path().join("params.json");
    std::fs::write(
        &params_file,
        format!(r#"{{"billing_token": {{"value": "{CANARY}", "pinned": true}}}}"#),
    )
    .unwrap();
    // (flags, environment) for each way of giving the secret.
    type Way<'a> = (Vec<String>, Vec<(&'a str, &'a str)>);
    let ways: Vec<Way<'_>> = vec![
        (
            vec!["--set".into(), format!("billing_token={CANARY}")],
            vec![],
        ),
        (
            vec!["--params-file".into(), params_file.display().to_string()],
            vec![],
        ),
        (vec![], vec![("BINDERY_PARAM_BILLING_TOKEN", CANARY)]),
        (vec![], vec![("BINDERY_PIN_BILLING_TOKEN", CANARY)]),
    ];
    for (flags, env) in &ways {
        for log in ["text", "json"] {
            for cmd in [
                vec!["check".to_string()],
                vec!["check".into(), "--output".into(), "json".into()],
                vec!["describe".into()],
                vec![
                    "tool-call".into(),
                    "--tool".into(),
                    "bash_query-invoices".into(),
                    "--args".into(),
                    "{\"status\": \"open\"}".into(),
                ],
            ] {
                let mut c = bin();
                c.args(&cmd)
                    .args([
                        "--agent-file",
                        &invoices(),
                        "--set",
                        "tenant=acme-corp",
                        "--log-format",
                        log,
                    ])
                    .args(flags)
                    .envs(env.iter().copied())
                    .env("BINDERY_LOG", "debug");
                let out = run(&mut c);
                assert_eq!(out.code, 0, "{cmd:?} {flags:?}: {}", out.stderr);
                assert!(
                    !out.stdout.contains(CANARY),
                    "{cmd:?} {flags:?} stdout: {}",
                    out.stdout
                );
                assert!(
                    !out.stderr.contains(CANARY),
                    "{cmd:?} {flags:?} stderr: {}",
                    out.stderr
                );
            }
        }
    }
}

#[test]
fn an_agents_directory_loads_every_agent_file_in_it() {
    let dir = repo().join("examples/invoices");
    let out = run(bin().args(["check", "--agents-dir"]).arg(&dir));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("agent invoices ("), "{}", out.stdout);
    let empty = tempfile::tempdir().unwrap();
    let out = run(bin().args(["check", "--agents-dir"]).arg(empty.path()));
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("holds no .yaml, .yml or .json file"),
        "{}",
        out.stderr
    );
}

#[test]
fn describe_lists_the_helper_tools_the_model_receives() {
    let root = fixtures().join("chain/root.yaml");
    let out = run(bin()
        .args(["describe", "--agent", "root", "--agent-file"])
        .arg(&root));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let names: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "prompt_agent_middle",
            "prompt_agent_sealed",
            "describe_agent",
            "derive_agent"
        ]
    );
    let sealed = &v["tools"][1]["function"]["parameters"]["properties"];
    assert!(
        sealed.get("bindings").is_none(),
        "a helper that is not narrowable takes `what` only"
    );
}

/// `check --tools=…` prints the tools the model receives in agents-exe's
/// three renderings; bound arguments are not in them.
#[test]
fn check_tools_renders_like_agents_exe() {
    let check = |mode: &str| {
        let out = run(bin()
            .args(["check", "--agent-file", &probe(), "--set", "repo=r1"])
            .arg(format!("--tools={mode}"))
            .env("BINDERY_PARAM_TOKEN", CANARY));
        assert_eq!(out.code, 0, "{mode}: {}{}", out.stdout, out.stderr);
        assert!(!out.stdout.contains(CANARY));
        out.stdout
    };
    let list = check("list");
    assert!(list.contains("\n**Tools:**\n- **bash_lister**: Lists items within the given scope.\n- **bash_probe**: Reports what it received.\n"), "{list}");

    // The JSON documents between the fence lines.
    let json_in = |text: &str| -> Vec<serde_json::Value> {
        let body = text
            .split("```json\n")
            .nth(1)
            .unwrap()
            .split("```")
            .next()
            .unwrap();
        serde_json::Deserializer::from_str(body)
            .into_iter()
            .map(Result::unwrap)
            .collect()
    };
    let openai = check("openai");
    assert!(
        openai.contains("<summary>OpenAI LLM tool representation</summary>"),
        "{openai}"
    );
    let tools = json_in(&openai).remove(0);
    assert_eq!(tools[1]["type"], "function");
    assert_eq!(tools[1]["function"]["name"], "bash_probe");
    let props = tools[1]["function"]["parameters"]["properties"]
        .as_object()
        .unwrap();
    assert!(
        props.contains_key("note")
            && !props.contains_key("repo")
            && !props.contains_key("repo-token"),
        "{props:?}"
    );

    let exe = check("agents-exe");
    assert!(
        exe.contains("<summary>agents-exe tool representation</summary>"),
        "{exe}"
    );
    let tool = json_in(&exe).remove(1);
    assert_eq!(tool["name"], "bash_probe");
    let keys: Vec<&str> = tool["paramProperties"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["propertyKey"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["body", "level", "note"]);

    let out = run(bin()
        .args([
            "check",
            "--agent-file",
            &probe(),
            "--set",
            "repo=r1",
            "--output",
            "json",
            "--tools=openai",
        ])
        .env("BINDERY_PARAM_TOKEN", CANARY));
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        doc["tools"]["prober"][1]["function"]["name"], "bash_probe",
        "{}",
        out.stdout
    );

    let bad = run(bin().args(["check", "--agent-file", &probe(), "--tools=yaml"]));
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("list, agents-exe, openai"),
        "{}",
        bad.stderr
    );
}

/// `replay-tool-call` runs one call of a saved session (as `GET
/// /v1/sessions/ID` answers) against a bash script, as agents-exe does.
#[test]
fn replay_tool_call_runs_a_saved_call_again() {
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("session.json");
    let call = |id: &str, args: serde_json::Value| {
        serde_json::json!({"id": id, "type": "function",
            "function": {"name": "bash_probe", "arguments": args.to_string()}})
    };
    std::fs::write(
        &session,
        serde_json::json!({"session_id": "s-1", "agent": "prober", "session": {"turns": [
            {"role": "user", "content": "probe it"},
            {"role": "assistant", "tool_calls": [call("a", serde_json::json!({"repo": "r1"}))]},
            {"role": "tool", "tool_call_id": "a", "content": "error"},
            {"role": "assistant", "tool_calls": [call("b", serde_json::json!({"repo": "r2", "repo-token": "tok-9a1", "note": "n"}))]},
        ]}})
        .to_string(),
    )
    .unwrap();
    let probe_tool = fixtures().join("tools/probe");
    let replay = |index: &str, extra: &[&str]| {
        run(bin()
            .args(["replay-tool-call", "--session"])
            .arg(&session)
            .args(["--tool-call", index, "--tool"])
            .arg(&probe_tool)
            .args(extra))
    };
    let out = replay("1", &[]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .starts_with("✓ Tool call validation passed\nTool: probe\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("=== Tool Output ===\nargv: [--repo] [r2] [n]\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("session: s-1"), "{}", out.stdout);

    let out = replay("1", &["--raw"]);
    assert!(
        out.stdout.starts_with("argv: [--repo] [r2] [n]\n"),
        "{}",
        out.stdout
    );

    // The first call lacks the bound token: it is refused, naming the argument.
    let out = replay("0", &[]);
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stdout.contains("missing required argument repo-token"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("tool-call --agent-file"),
        "{}",
        out.stdout
    );

    let out = replay("0", &["--validate-only"]);
    assert_eq!(out.code, 1);
    let out = replay("7", &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("has no tool call 7 (available: 0 to 1)"),
        "{}",
        out.stderr
    );
}

/// `replay-tool-call --agent-file` replays a recorded call as a live call
/// goes: the agent's bindings merge the bound values (`--set`, a secret
/// from the environment) over the recorded arguments; `--raw-tool` runs
/// the recorded arguments alone, and misses the bound one.
#[test]
fn replay_tool_call_through_the_agents_bindings() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("prober.json");
    std::fs::write(
        &agent,
        serde_json::json!({"tag": "OpenAIAgentDescription", "contents": {
            "slug": "prober", "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m",
            "parameters": [{"name": "tenant"}, {"name": "token", "secret": true}],
            "bashToolboxes": [{"tag": "SingleTool", "contents": {
                "Path": fixtures().join("tools/probe").display().to_string(),
                "Bindings": [
                    {"arg": "repo", "value": {"tag": "Param", "contents": "tenant"}},
                    {"arg": "repo-token", "value": {"tag": "Param", "contents": "token"}}]}}]}})
        .to_string(),
    )
    .unwrap();
    let session = dir.path().join("session.json");
    std::fs::write(
        &session,
        serde_json::json!({"session_id": "s-2", "agent": "prober", "session": {"turns": [
            {"role": "user", "content": "probe it"},
            {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                "function": {"name": "bash_probe", "arguments": "{\"note\": \"n\"}"}}]},
        ]}})
        .to_string(),
    )
    .unwrap();
    let replay = |extra: &[&str]| {
        run(bin()
            .env("BINDERY_PARAM_TOKEN", CANARY)
            .args(["replay-tool-call", "--session"])
            .arg(&session)
            .args(["--tool-call", "0"])
            .args(extra))
    };
    let agent = agent.display().to_string();
    let out = replay(&["--agent-file", &agent, "--set", "tenant=acme"]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.starts_with("argv: [--repo] [acme] [n]\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(&format!("token-sha256: {}\n", sha256(CANARY))),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("session: s-2"), "{}", out.stdout);
    assert!(!out.stdout.contains(CANARY) && !out.stderr.contains(CANARY));

    let out = replay(&[
        "--agent-file",
        &agent,
        "--set",
        "tenant=acme",
        "--validate-only",
    ]);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .starts_with("✓ Tool call validation passed\nTool: bash_probe\n"),
        "{}",
        out.stdout
    );
    // Without the tenant, the bound argument has no value: refused, named.
    let out = replay(&["--agent-file", &agent]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);

    let probe = fixtures().join("tools/probe").display().to_string();
    let out = replay(&["--raw-tool", &probe]);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("missing required arguments repo, repo-token"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("replay-tool-call --agent-file"),
        "{}",
        out.stdout
    );
    // One or the other: an agent file and a raw script together are refused.
    let out = replay(&["--raw-tool", &probe, "--agent-file", &agent]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    let out = replay(&[]);
    assert_eq!(out.code, 2, "{}", out.stderr);
}

/// Builtin toolboxes: `io_<name>`, its `capability` bound like any
/// argument; agents-exe's `SystemToolbox` loads as one.
#[test]
fn builtin_toolboxes_answer_through_their_bindings() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("sys.yaml");
    std::fs::write(
        &agent,
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {name: sys}
spec:
  model: {url: "http://127.0.0.1:9/v1", name: m}
  toolboxes:
    - builtin: {name: system, capabilities: [date, hostname]}
    - builtin:
        name: clock
        capabilities: [date]
        bindings: [{arg: capability, value: {literal: date}}]
"#,
    )
    .unwrap();
    let agent = agent.display().to_string();
    let out = run(bin().args(["describe", "--agent-file", &agent]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let tools: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let schema = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == name)
            .unwrap()["function"]["parameters"]
            .clone()
    };
    assert_eq!(
        schema("io_system")["properties"]["capability"]["enum"],
        serde_json::json!(["date", "hostname"])
    );
    assert_eq!(
        schema("io_clock")["properties"],
        serde_json::json!({}),
        "the bound capability is hidden"
    );

    let call = |tool: &str, args: &str| {
        run(bin().args([
            "tool-call",
            "--agent-file",
            &agent,
            "--tool",
            tool,
            "--args",
            args,
        ]))
    };
    let out = call("io_system", r#"{"capability": "hostname"}"#);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(v["capability"], "hostname");
    assert_eq!(v["data"]["hostname"], host.trim());
    let out = call("io_clock", "{}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["capability"], "date");
    assert!(v["data"]["utc"].as_str().unwrap().ends_with('Z'), "{v}");
    let out = call("io_system", r#"{"capability": "uptime"}"#);
    assert_ne!(out.code, 0);
    assert!(
        out.stdout.contains("not enabled here") || out.stderr.contains("not enabled here"),
        "{}{}",
        out.stdout,
        out.stderr
    );

    // agents-exe's form, and a capability Bindery refuses.
    let exe = dir.path().join("sys.json");
    let write = |caps: &str| {
        std::fs::write(
            &exe,
            format!(r#"{{"tag": "OpenAIAgentDescription", "contents": {{"slug": "sys", "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m",
                "builtinToolboxes": [{{"tag": "SystemToolbox", "contents": {{"name": "system", "description": "System context", "capabilities": {caps}, "envVarFilter": null}}}}]}}}}"#),
        )
        .unwrap();
    };
    write(r#"["date"]"#);
    let out = run(bin()
        .args(["check", "--agent-file"])
        .arg(&exe)
        .arg("--tools=list"));
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("- **system_system_system_info**: System context"),
        "{}",
        out.stdout
    );
    write(r#"["env-vars"]"#);
    let out = run(bin().args(["check", "--agent-file"]).arg(&exe));
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("capability `env-vars` needs the list of variables it may show"),
        "{}",
        out.stderr
    );
}

/// `serve --agent-file <invoices> FLAG VALUE`: refused before anything
/// starts (exit 2, nothing on stdout), its message containing `says`.
fn serve_refuses(flag: &str, value: &str, says: &str) {
    let out = run(bin().args(["serve", "--agent-file", &invoices(), flag, value]));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains(says), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

/// A keep-alive interval of zero would mean a comment without pause:
/// refused, with the flag's name.
#[test]
fn a_zero_keep_alive_interval_is_refused() {
    serve_refuses(
        "--events-keep-alive",
        "0s",
        "'--events-keep-alive <DURATION>': must be more than zero",
    );
}

/// No worker threads would be no server: refused, with the flag's name.
#[test]
fn zero_worker_threads_are_refused() {
    serve_refuses("--worker-threads", "0", "'--worker-threads <N>'");
}

/// `check | head`: the reader goes away after a line; the command ends
/// as a Unix tool does on SIGPIPE (status 141), without a panic.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    let mut child = bin()
        .args(["check", "--agent-file", &invoices()])
        .env("BINDERY_PARAM_TENANT", "acme-corp")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader leaves before anything is printed.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// An agent file given by its bare name, from its own directory: a
/// `command` value source runs there (the empty parent path was no
/// directory a program could start in).
#[test]
fn a_command_value_runs_for_an_agent_file_given_by_its_bare_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agent.yaml"),
        "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {name: bare}\nspec:\n  model: {url: http://127.0.0.1:9/v1, name: m}\n  parameters:\n  - {name: region, default: {command: [printf, eu-west]}}\n",
    )
    .unwrap();
    let out = run(bin()
        .current_dir(dir.path())
        .args(["check", "--agent-file", "agent.yaml"]));
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("region"), "{}", out.stdout);
}

/// Found by the attacker's second review: a file that holds secrets, read
/// in the wrong shape, had serde quote its value in the error. The error
/// says where and what was expected, never what the file holds.
#[test]
fn a_secret_file_of_the_wrong_shape_is_refused_without_its_values() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.json");
    std::fs::write(&keys, format!("{{\"keys\": [\"{CANARY}\"]}}")).unwrap();
    let params = dir.path().join("params.env");
    std::fs::write(&params, format!("API_KEY={CANARY}\n")).unwrap();
    for args in [
        vec![
            "check",
            "--agent-file",
            &invoices(),
            "--api-keys",
            keys.to_str().unwrap(),
        ],
        vec![
            "run",
            "--agent-file",
            &invoices(),
            "--params-file",
            params.to_str().unwrap(),
            "-p",
            "hi",
        ],
        vec![
            "session",
            "start",
            "--server",
            "http://127.0.0.1:9",
            "--params-file",
            params.to_str().unwrap(),
            "--agent",
            "invoices",
        ],
    ] {
        let out = bin()
            .args(&args)
            .env("BINDERY_TOKEN", "t")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(!err.contains(CANARY), "{args:?}: {err}");
        assert!(
            err.contains("API-keys file") || err.contains("--params-file"),
            "{args:?}: {err}"
        );
    }
}

/// The session client's errors show --server without its user, password
/// or query.
#[test]
fn the_session_clients_errors_show_no_credential_of_its_server() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let server = format!("http://someone:{CANARY}@127.0.0.1:{port}/?t={CANARY}");
    let out = bin()
        .args(["session", "list", "--server", &server])
        .env("BINDERY_TOKEN", "t")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(!err.contains(CANARY), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
}
