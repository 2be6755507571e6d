//! A model provider's API played by its official SDK (`tests/providers/mock.py`,
//! in the virtualenv `tests/setup.sh` makes at `tests/providers/.venv`):
//! every request is checked with the SDK's own request types and the
//! provider's documented rules, every answer built from the SDK's response
//! models. See the script's docstring for the script and log shapes.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

const INSTALL_HINT: &str =
    "run `tests/setup.sh` (it makes tests/providers/.venv with the providers' pinned SDKs)";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("providers")
}

/// A running mock; stopped when dropped.
pub struct ProviderMock {
    child: Child,
    port: u16,
    log: PathBuf,
    _files: tempfile::TempDir,
}

impl ProviderMock {
    /// The mock of `provider` (`anthropic`, `openai`, `gemini`,
    /// `responses`, `bedrock`, `azure`), expecting `key` (as the
    /// provider's module reads it), answering each request with the next
    /// of `script`.
    pub fn start(provider: &str, key: &str, script: &Value) -> ProviderMock {
        let files = tempfile::tempdir().expect("a temporary directory");
        let script_path = files.path().join("script.json");
        std::fs::write(&script_path, script.to_string()).expect("the script is written");
        let log = files.path().join("log.jsonl");
        let mut args: Vec<std::ffi::OsString> = vec![
            "--provider".into(),
            provider.into(),
            "--key".into(),
            key.into(),
        ];
        args.extend(["--script".into(), script_path.into_os_string()]);
        args.extend(["--log".into(), log.clone().into_os_string()]);
        let (child, port) = spawn("mock.py", &args);
        ProviderMock {
            child,
            port,
            log,
            _files: files,
        }
    }

    /// `http://127.0.0.1:<port>`: the root of APIs whose paths have no
    /// version of ours (Bedrock, Azure OpenAI).
    pub fn root(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The API root an agent file names: `http://127.0.0.1:<port>/v1`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Every request so far, as the log has them.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a log line is JSON"))
            .collect()
    }

    /// The requests so far, after asserting that the SDK's types and the
    /// provider's rules took each of them.
    pub fn valid_requests(&self) -> Vec<Value> {
        let requests = self.requests();
        for (i, r) in requests.iter().enumerate() {
            let violations = r["violations"].as_array().cloned().unwrap_or_default();
            assert!(
                violations.is_empty(),
                "request {i} is not one the provider takes:\n{}\n{:#}",
                violations
                    .iter()
                    .map(|v| v.as_str().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join("\n"),
                r["body"]
            );
        }
        requests
    }
}

/// Starts `script` of tests/providers in its virtualenv with `args`: the
/// child and the port it printed.
fn spawn(script: &str, args: &[std::ffi::OsString]) -> (Child, u16) {
    let python = dir().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing; {INSTALL_HINT}",
        python.display()
    );
    let mut child = Command::new(&python)
        .arg(dir().join(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not start ({e}); {INSTALL_HINT}", python.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the mock prints its port");
    let port = line
        .strip_prefix("PORT ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{script} did not start: {line:?}; {INSTALL_HINT}"));
    (child, port)
}

/// The cloud identity endpoints (`tests/providers/identity.py`): AWS STS
/// for IRSA, the EKS Pod Identity agent, Entra ID's token endpoint; each
/// checks what it is sent. See the script's docstring for its flags.
pub struct IdentityMock {
    child: Child,
    port: u16,
    log: PathBuf,
    _files: tempfile::TempDir,
}

impl IdentityMock {
    /// Started with `args` (identity.py's flags but `--log`).
    pub fn start(args: &[&str]) -> IdentityMock {
        let files = tempfile::tempdir().expect("a temporary directory");
        let log = files.path().join("log.jsonl");
        let mut all: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        all.extend(["--log".into(), log.clone().into_os_string()]);
        let (child, port) = spawn("identity.py", &all);
        IdentityMock {
            child,
            port,
            log,
            _files: files,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far, as the log has them, after asserting that
    /// each was one the endpoint takes.
    pub fn valid_requests(&self) -> Vec<Value> {
        let requests: Vec<Value> = std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a log line is JSON"))
            .collect();
        for r in &requests {
            assert!(
                r["violations"].as_array().is_none_or(Vec::is_empty),
                "an identity request the endpoint does not take: {r:#}"
            );
        }
        requests
    }
}

impl Drop for IdentityMock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ProviderMock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
