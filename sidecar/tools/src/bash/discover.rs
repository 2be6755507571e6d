//! Finding scripts and asking each to `describe` itself.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::protocol::ScriptInfo;
use super::run::{exec, ExecError};
use super::{BashTool, Limits};

/// Every executable file in `dir` (whose name contains `filter`, when
/// given), described in parallel. Each script that fails to describe itself
/// is one error naming the script.
pub async fn load_directory(
    dir: &Path,
    filter: Option<&str>,
    limits: Limits,
) -> Result<(Vec<BashTool>, Vec<String>), String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read tool directory {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if filter.is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let path = entry.path();
        // Follows symlinks: a link to an executable is a tool.
        if let Ok(meta) = std::fs::metadata(&path) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                paths.push(path);
            }
        }
    }
    paths.sort();
    let results = futures::future::join_all(paths.iter().map(|p| load_script(p, limits))).await;
    let mut tools = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(t) => tools.push(t),
            Err(e) => errors.push(e),
        }
    }
    Ok((tools, errors))
}

/// What a script printed for `describe`, read (pure: the fuzz targets in
/// tests/it/proptest_parsers.rs drive it).
pub fn parse_description(stdout: &[u8]) -> Result<ScriptInfo, String> {
    let info: ScriptInfo = serde_json::from_slice(stdout)
        .map_err(|e| format!("`describe` did not print a valid tool description: {e}"))?;
    if info.slug.is_empty() {
        return Err("`describe` gave an empty slug".to_string());
    }
    if let Some(mime) = &info.output_media_type {
        if !bindery_llm::content::is_media_type(mime) {
            return Err(format!(
                "`describe` gave \"output-media-type\": {mime:?}, which is not a media type (type/subtype, e.g. \"image/png\")"
            ));
        }
    }
    Ok(info)
}

/// Run `path describe` and read its description.
pub async fn load_script(path: &Path, limits: Limits) -> Result<BashTool, String> {
    let shown = path.display();
    // Absolute, so a call works whatever the working directory is then.
    let path = &std::fs::canonicalize(path).map_err(|e| format!("script {shown}: {e}"))?;
    let meta = std::fs::metadata(path).map_err(|e| format!("script {shown}: {e}"))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(format!(
            "script {shown} is not an executable file (chmod +x it)"
        ));
    }
    let out = exec(
        path,
        &["describe".to_string()],
        &[],
        None,
        &limits,
        limits.describe_timeout,
        (1024 * 1024, super::run::MAX_STDERR),
    )
    .await
    .map_err(|e| match e {
        ExecError::Spawn(e) => format!("script {shown}: cannot run `describe`: {e}"),
        ExecError::Memory(m) => format!(
            "script {shown}: `describe` held more than {} MiB and was stopped",
            m / (1024 * 1024)
        ),
        ExecError::Timeout(t) => format!(
            "script {shown}: `describe` did not finish within {}s",
            t.as_secs()
        ),
    })?;
    if !out.status.success() {
        return Err(format!(
            "script {shown}: `describe` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let info = parse_description(&out.stdout).map_err(|e| format!("script {shown}: {e}"))?;
    Ok(BashTool::new(path.to_path_buf(), info, limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_media_type_must_be_one() {
        let info = parse_description(br#"{"slug":"c","output-media-type":"image/png"}"#).unwrap();
        assert_eq!(info.output_media_type.as_deref(), Some("image/png"));
        let e = parse_description(br#"{"slug":"c","output-media-type":"png"}"#).unwrap_err();
        assert!(
            e.contains(r#""output-media-type": "png", which is not a media type"#),
            "{e}"
        );
    }
}
