//! Agent files and tools that the sidecar's spawned tests and the API's
//! in-process tests share: one definition of each. Each test agent has
//! its own module; [`session`] holds the API calls both kinds of test
//! make.

use std::path::{Path, PathBuf};

pub mod booking;
pub mod chain;
pub mod clerk;
pub mod guard;
pub mod session;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Write `text` to `path` as an executable (a bash tool of a test).
pub fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Write a bash tool `slug` to `dir/slug`: `describe` prints its
/// description (no arguments), any other run runs `body`.
pub fn bash_tool(dir: &Path, slug: &str, description: &str, body: &str) {
    bash_tool_with_args(dir, slug, description, "[]", body);
}

/// [`bash_tool`] with `args`, the JSON list of its arguments as its
/// `describe` prints it (no single quote in it).
pub fn bash_tool_with_args(dir: &Path, slug: &str, description: &str, args: &str, body: &str) {
    executable(
        &dir.join(slug),
        &format!(
            r#"#!/usr/bin/env bash
if [[ "${{1:-}}" == "describe" ]]; then
  echo '{{"slug": "{slug}", "description": "{description}", "args": {args}}}'
  exit 0
fi
{body}"#
        ),
    );
}

/// An agent `prober` at `dir/prober.yaml`, its model at `model_url`: the
/// probe tool (`sidecar/tests/fixtures/tools/probe`) with `repo` bound to
/// the session parameter `tenant` and `repo-token` to the secret
/// message-scope `otp`; its output shows the digest of the token it got,
/// or the call fails.
pub fn probe_agent(dir: &Path, model_url: &str) -> PathBuf {
    let probe = repo().join("sidecar/tests/fixtures/tools/probe");
    let text = format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: prober
spec:
  model: {{url: "{model_url}", name: mock-model}}
  parameters:
    - {{name: tenant, scope: session}}
    - {{name: otp, secret: true, scope: message, required: false}}
  toolboxes:
    - bash:
        script: "{probe}"
        bindings:
          - {{arg: repo, value: {{param: tenant}}}}
          - {{arg: repo-token, value: {{param: otp}}}}
"#,
        probe = probe.display()
    );
    let path = dir.join("prober.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The text of `examples/<example>/agent.yaml` with its model at
/// `model_url` (no API key) and its bash tools where they are.
pub fn example_agent_text(example: &str, model_url: &str) -> String {
    let dir = repo().join("examples").join(example);
    std::fs::read_to_string(dir.join("agent.yaml"))
        .unwrap()
        .replace(
            "url: https://api.openai.com/v1",
            &format!("url: \"{model_url}\""),
        )
        .replace(
            "name: gpt-4o-mini\n    apiKey:\n      env: OPENAI_API_KEY\n",
            "name: mock-model\n",
        )
        .replace(
            "directory: tools",
            &format!("directory: \"{}\"", dir.join("tools").display()),
        )
}

/// An invoices agent like the example's at `dir/invoices.yaml`, its model
/// at `model_url`, with `parameters` (YAML list items, indented four
/// spaces, which must declare `tenant` and `billing_token`, bound to its
/// bash tool) and `extra_toolboxes` (YAML list items, indented four
/// spaces) after its own toolbox.
pub fn invoices_agent_file(
    dir: &Path,
    model_url: &str,
    parameters: &str,
    extra_toolboxes: &str,
) -> PathBuf {
    let tools = repo().join("examples/invoices/tools");
    let text = format!(
        r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: invoices
spec:
  announce: answers questions about one tenant's invoices
  model: {{url: "{model_url}", name: mock-model}}
  systemPrompt: You are an invoices assistant.
  parameters:
{parameters}  toolboxes:
    - bash:
        directory: "{tools}"
        bindings:
          - {{arg: tenant_id, value: {{param: tenant}}}}
          - {{arg: token, value: {{param: billing_token}}}}
{extra_toolboxes}"#,
        tools = tools.display()
    );
    let path = dir.join("invoices.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The parameters of the invoices agent most tests serve: `tenant` and
/// the secret `billing_token` (session-scope), a message-scope secret
/// `otp` and a process-scope `region`.
pub const INVOICES_PARAMETERS: &str =
    "    - {name: tenant, scope: session, description: the tenant}
    - {name: billing_token, secret: true, scope: session}
    - {name: otp, secret: true, scope: message, required: false}
    - {name: region, scope: process, required: false, default: {value: eu}}
";

/// How many times [`metered_agent`]'s count tool ran.
pub fn counted(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("count"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// An agent `metered` with a bash tool `bash_count` (it counts its runs
/// in `dir/count`), the model at `model_url`, and `spec` (YAML lines,
/// indented two spaces) added to its spec.
pub fn metered_agent(dir: &Path, model_url: &str, model_extra: &str, spec: &str) -> PathBuf {
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    bash_tool(
        &tools,
        "count",
        "Counts.",
        &format!(
            "echo x >> '{count}'\necho counted\n",
            count = dir.join("count").display()
        ),
    );
    let path = dir.join("metered.yaml");
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: metered
spec:
  model: {{url: "{model_url}", name: mock-model{model_extra}}}
  systemPrompt: You count things.
  toolboxes:
    - bash: {{directory: "{tools}"}}
{spec}"#,
            tools = tools.display()
        ),
    )
    .unwrap();
    path
}
