//! A real MCP client for tests: `tests/mcp/client.py` (the official Python
//! SDK, in the virtualenv `tests/setup.sh` makes at `tests/mcp/.venv`).
//!
//! [`run`] hands the script a plan (the URL, then per connection its HTTP
//! headers and its `tools/call`s) and returns what it printed: per
//! connection the `initialize` result, the tools, and each call's result or
//! JSON-RPC error. See the script's docstring for the exact shapes.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;

const INSTALL_HINT: &str = "run `tests/setup.sh` (it makes tests/mcp/.venv with the pinned MCP SDK), or point BINDERY_MCP_PYTHON at a python that has `mcp` 2.3";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp")
}

/// The python to run the client with.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("BINDERY_MCP_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = dir().join(".venv/bin/python");
    assert!(
        venv.exists(),
        "no MCP client: {} is missing; {INSTALL_HINT}",
        venv.display()
    );
    venv
}

/// Run the client on `plan` (`{"url", "connections": [...]}`).
pub async fn run(plan: &Value) -> Value {
    let python = python();
    let mut child = tokio::process::Command::new(&python)
        .arg(dir().join("client.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not start ({e}); {INSTALL_HINT}", python.display()));
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(plan.to_string().as_bytes())
        .await
        .expect("the plan reaches the client");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("the MCP client finishes")
        .expect("the MCP client runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("ModuleNotFoundError") {
        panic!("the MCP SDK is not installed: {INSTALL_HINT}\n{stderr}");
    }
    assert!(
        out.status.success(),
        "the MCP client failed ({}):\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the MCP client printed no JSON ({e}):\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
