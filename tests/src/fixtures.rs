//! Agent files and tools that the sidecar's spawned tests and the API's
//! in-process tests share: one definition of each.

use std::path::{Path, PathBuf};

/// Write `text` to `path` as an executable (a bash tool of a test).
pub fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// An agent `metered` with a bash tool `bash_count` (it counts its runs
/// in `dir/count`), the model at `model_url`, and `spec` (YAML lines,
/// indented two spaces) added to its spec.
pub fn metered_agent(dir: &Path, model_url: &str, model_extra: &str, spec: &str) -> PathBuf {
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    executable(
        &tools.join("count"),
        &format!(
            r#"#!/usr/bin/env bash
if [[ "${{1:-}}" == "describe" ]]; then
  echo '{{"slug": "count", "description": "Counts.", "args": []}}'
  exit 0
fi
echo x >> '{count}'
echo counted
"#,
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
