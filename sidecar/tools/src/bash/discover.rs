//! Finding scripts and asking each to `describe` itself.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::protocol::ScriptInfo;
use super::run::{exec, ExecError};
use super::{BashTool, Limits};

/// Why what a script printed for `describe` is no tool description.
#[derive(Debug, thiserror::Error)]
pub enum DescriptionError {
    #[error("`describe` did not print a valid tool description: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("`describe` gave an empty slug")]
    EmptySlug,
    #[error("`describe` gave \"output-media-type\": {0:?}, which is not a media type (type/subtype, e.g. \"image/png\")")]
    NotAMediaType(String),
}

/// Why a script is not a tool; each names the script (as given).
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("script {path}: {source}")]
    Unreadable {
        path: String,
        source: std::io::Error,
    },
    #[error("script {0} is not an executable file (chmod +x it)")]
    NotExecutable(String),
    #[error("script {path}: cannot run `describe`: {source}")]
    Unstarted {
        path: String,
        source: std::io::Error,
    },
    #[error("script {path}: `describe` held more than {mib} MiB and was stopped")]
    OverMemory { path: String, mib: u64 },
    #[error("script {path}: `describe` did not finish within {secs}s")]
    TimedOut { path: String, secs: u64 },
    #[error("script {path}: `describe` failed ({status}): {stderr}")]
    DescribeFailed {
        path: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("script {path}: {source}")]
    Description {
        path: String,
        source: DescriptionError,
    },
}

/// A tool directory that cannot be listed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read tool directory {}: {source}", .path.display())]
pub struct ToolDirectoryUnreadable {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Every executable file in `dir` (whose name contains `filter`, when
/// given), described in parallel. Each script that fails to describe itself
/// is one error naming the script.
pub async fn load_directory(
    dir: &Path,
    filter: Option<&str>,
    limits: Limits,
) -> Result<(Vec<BashTool>, Vec<ScriptError>), ToolDirectoryUnreadable> {
    let entries = std::fs::read_dir(dir).map_err(|source| ToolDirectoryUnreadable {
        path: dir.to_path_buf(),
        source,
    })?;
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
pub fn parse_description(stdout: &[u8]) -> Result<ScriptInfo, DescriptionError> {
    let info: ScriptInfo = serde_json::from_slice(stdout)?;
    if info.slug.is_empty() {
        return Err(DescriptionError::EmptySlug);
    }
    if let Some(mime) = &info.output_media_type {
        if !bindery_llm::content::is_media_type(mime) {
            return Err(DescriptionError::NotAMediaType(mime.clone()));
        }
    }
    Ok(info)
}

/// Run `path describe` and read its description.
pub async fn load_script(path: &Path, limits: Limits) -> Result<BashTool, ScriptError> {
    let shown = path.display().to_string();
    let unreadable = |source| ScriptError::Unreadable {
        path: shown.clone(),
        source,
    };
    // Absolute, so a call works whatever the working directory is then.
    let path = &std::fs::canonicalize(path).map_err(unreadable)?;
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(ScriptError::NotExecutable(shown));
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
        ExecError::Spawn(source) => ScriptError::Unstarted {
            path: shown.clone(),
            source,
        },
        ExecError::Ending => ScriptError::Unstarted {
            path: shown.clone(),
            source: std::io::Error::other("the server is stopping"),
        },
        ExecError::Memory(m) => ScriptError::OverMemory {
            path: shown.clone(),
            mib: m / (1024 * 1024),
        },
        ExecError::Timeout(t) => ScriptError::TimedOut {
            path: shown.clone(),
            secs: t.as_secs(),
        },
    })?;
    if !out.status.success() {
        return Err(ScriptError::DescribeFailed {
            path: shown,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let info = parse_description(&out.stdout).map_err(|source| ScriptError::Description {
        path: shown,
        source,
    })?;
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
            matches!(&e, DescriptionError::NotAMediaType(m) if m == "png"),
            "{e:?}"
        );
        assert!(matches!(
            parse_description(br#"{"slug":""}"#),
            Err(DescriptionError::EmptySlug)
        ));
        assert!(matches!(
            parse_description(b"not json"),
            Err(DescriptionError::NotJson(_))
        ));
        let e = e.to_string();
        assert!(
            e.contains(r#""output-media-type": "png", which is not a media type"#),
            "{e}"
        );
    }
}
