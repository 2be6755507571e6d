//! What the server tests share: agent files pointing at a mock LLM, a
//! model script that calls the tool once then answers, and a started sidecar.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use bindery_tests::sidecar::{Api, Launch, Sidecar};
use serde_json::{json, Value};

pub const CANARY: &str = "canary-7f3a9c";
pub const OWNER: &str = "owner-token-for-tests";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_bindery-sidecar")
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// An invoices agent like the example's, talking to `model_url`, with both
/// parameters session-scope (the token secret) plus a message-scope `otp`.
pub fn invoices_agent(dir: &Path, model_url: &str) -> PathBuf {
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
    - {{name: tenant, scope: session, description: the tenant}}
    - {{name: billing_token, secret: true, scope: session}}
    - {{name: otp, secret: true, scope: message, required: false}}
    - {{name: region, scope: process, required: false, default: {{value: eu}}}}
  toolboxes:
    - bash:
        directory: "{tools}"
        bindings:
          - {{arg: tenant_id, value: {{param: tenant}}}}
          - {{arg: token, value: {{param: billing_token}}}}
"#,
        tools = tools.display()
    );
    let path = dir.join("invoices.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Call `bash_query-invoices` once per user message, then answer with
/// what the tool returned.
pub fn tool_then_answer(req: &Value) -> MockReply {
    let last = last_message(req);
    match last["role"].as_str() {
        Some("tool") => MockReply::text(format!(
            "answer: {}",
            last["content"].as_str().unwrap_or("")
        )),
        _ => MockReply::tool_call(
            "bash_query-invoices",
            json!({"status": "overdue", "tenant_id": "globex"}),
        ),
    }
}

pub struct World {
    pub dir: tempfile::TempDir,
    pub mock: MockLlm,
    pub agent: PathBuf,
    pub store: String,
}

impl World {
    pub async fn new(script: impl Fn(&Value) -> MockReply + Send + Sync + 'static) -> World {
        let dir = tempfile::tempdir().unwrap();
        let mock = MockLlm::start(script).await;
        let agent = invoices_agent(dir.path(), &mock.url());
        let store = format!(
            "sqlite://{}",
            dir.path().join("store/bindery.sqlite").display()
        );
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        World {
            dir,
            mock,
            agent,
            store,
        }
    }

    pub fn start(&self, extra: &[&str], env: &[(&str, &str)]) -> (Sidecar, Api) {
        let mut args = vec![
            "--agent-file".to_string(),
            self.agent.display().to_string(),
            "--store".to_string(),
            self.store.clone(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let sidecar = Sidecar::start(Launch {
            bin: bin(),
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log_dir: &self.dir.path().join("logs"),
            owner_token: OWNER,
        });
        let api = Api::new(&sidecar.url);
        (sidecar, api)
    }
}

/// The probe tool (fixtures/tools/probe) with `repo` bound to the session
/// parameter `tenant` and `repo-token` to the secret message-scope `otp`:
/// its output shows the digest of the token it got, or the call fails.
pub fn probe_agent(dir: &Path, model_url: &str) -> PathBuf {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tools");
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
        probe = tools.join("probe").display()
    );
    let path = dir.join("prober.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Every byte of every file under `dir` whose name starts with `prefix`.
pub fn raw_files(dir: &Path, prefix: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(prefix) {
            out.extend(std::fs::read(e.path()).unwrap_or_default());
        }
    }
    out
}

pub fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}
