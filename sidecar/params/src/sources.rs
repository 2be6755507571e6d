//! Reading a [`ValueSource`]: an inline value, an environment variable, a
//! file, a command's output, or an entry of the API-keys file.
//!
//! Errors say which source failed and why, never what it held.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::SecretString;
use bindery_spec::ValueSource;

/// How long a `command` source may run.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a source gave no value; it names the source (the variable, the file,
/// the command, the key's id), never what it held.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot read the API-keys file {}: {source}", .path.display())]
    ApiKeysUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    // Its place and what was expected, never the file's text (serde's
    // own messages quote values).
    #[error("the API-keys file {} is not {{\"keys\": [{{\"id\", \"value\"}}]}}: {source}", .path.display())]
    ApiKeysShape {
        path: PathBuf,
        source: crate::shape::ShapeError,
    },
    #[error("API key `{0}` is wanted but no API-keys file was given (use --api-keys FILE)")]
    NoApiKeysFile(String),
    #[error("the API-keys file {} has no key with id `{id}`", .path.display())]
    NoSuchApiKey { path: PathBuf, id: String },
    #[error("environment variable {0} is not set")]
    EnvUnset(String),
    #[error("environment variable {0} is not valid UTF-8")]
    EnvNotUtf8(String),
    #[error("cannot read file {}: {source}", .path.display())]
    FileUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("a command source needs at least a program")]
    NoProgram,
    #[error("cannot start command `{program}`: {source}")]
    CommandUnstarted {
        program: String,
        source: std::io::Error,
    },
    #[error("command `{program}` did not finish within {}s", COMMAND_TIMEOUT.as_secs())]
    CommandTimedOut { program: String },
    #[error("command `{program}`: {source}")]
    CommandLost {
        program: String,
        source: std::io::Error,
    },
    #[error("command `{program}` failed ({status}): {stderr}")]
    CommandFailed {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("command `{0}` printed something that is not UTF-8")]
    CommandNotUtf8(String),
}

/// agents-exe's API-keys file: `{"keys": [{"id": "openai", "value": "sk-…"}]}`.
#[derive(Default)]
pub struct ApiKeys {
    path: Option<PathBuf>,
    keys: BTreeMap<String, SecretString>,
}

impl ApiKeys {
    pub fn load(path: &Path) -> Result<ApiKeys, SourceError> {
        #[derive(serde::Deserialize)]
        struct File {
            keys: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            id: String,
            value: String,
        }
        crate::live::private_file(path);
        let text =
            std::fs::read_to_string(path).map_err(|source| SourceError::ApiKeysUnreadable {
                path: path.to_path_buf(),
                source,
            })?;
        let file: File = serde_json::from_str(&text).map_err(|e| SourceError::ApiKeysShape {
            path: path.to_path_buf(),
            source: crate::shape::ShapeError::json(&e),
        })?;
        Ok(ApiKeys {
            path: Some(path.to_path_buf()),
            keys: file
                .keys
                .into_iter()
                .map(|k| (k.id, SecretString::new(k.value)))
                .collect(),
        })
    }

    /// Every key, by its id.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &SecretString)> {
        self.keys.iter().map(|(id, k)| (id.as_str(), k))
    }

    pub fn get(&self, id: &str) -> Result<&SecretString, SourceError> {
        match (&self.path, self.keys.get(id)) {
            (_, Some(k)) => Ok(k),
            (None, None) => Err(SourceError::NoApiKeysFile(id.to_string())),
            (Some(p), None) => Err(SourceError::NoSuchApiKey {
                path: p.clone(),
                id: id.to_string(),
            }),
        }
    }
}

/// Read a source. `base` is the directory relative file paths start from.
/// A file's or a command's trailing white space is removed.
pub fn read_source(
    source: &ValueSource,
    base: &Path,
    api_keys: &ApiKeys,
) -> Result<serde_json::Value, SourceError> {
    read_source_as(source, base, api_keys, true)
}

/// [`read_source`], a file's or a command's trailing white space kept
/// unless `trim`.
pub fn read_source_as(
    source: &ValueSource,
    base: &Path,
    api_keys: &ApiKeys,
    trim: bool,
) -> Result<serde_json::Value, SourceError> {
    let text = match source {
        ValueSource::Value(v) => return Ok(v.clone()),
        ValueSource::Env(var) => match std::env::var(var) {
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => return Err(SourceError::EnvUnset(var.clone())),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(SourceError::EnvNotUtf8(var.clone()))
            }
        },
        ValueSource::File(p) => {
            let path = base.join(p);
            crate::live::private_file(&path);
            let text = std::fs::read_to_string(&path)
                .map_err(|source| SourceError::FileUnreadable { path, source })?;
            if trim {
                text.trim_end().to_string()
            } else {
                text
            }
        }
        ValueSource::Command(argv) => run_command(argv, base, trim)?,
        ValueSource::ApiKey(id) => api_keys.get(id)?.expose().to_string(),
    };
    Ok(serde_json::Value::String(text))
}

fn run_command(argv: &[String], base: &Path, trim: bool) -> Result<String, SourceError> {
    let (program, args) = argv.split_first().ok_or(SourceError::NoProgram)?;
    let (mut child, _kept) = bindery_reaper::spawn_kept(|| {
        // Marked as a tool's process is: what it leaves running when the
        // server dies is ended by the next start.
        let (mark, server) = bindery_reaper::mark();
        // The server's environment less its secrets, as a bash tool's call
        // gets it: an Agent's command is not given the tenant's values.
        let child = Command::new(program)
            .args(args)
            .env_clear()
            .envs(crate::inherited::environment())
            .env(mark, server)
            .current_dir(base)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let pid = child.id();
        Ok((child, Some(pid)))
    })
    .map_err(|source| SourceError::CommandUnstarted {
        program: program.clone(),
        source,
    })?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > COMMAND_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SourceError::CommandTimedOut {
                    program: program.clone(),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(source) => {
                return Err(SourceError::CommandLost {
                    program: program.clone(),
                    source,
                })
            }
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|source| SourceError::CommandLost {
            program: program.clone(),
            source,
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(SourceError::CommandFailed {
            program: program.clone(),
            status: out.status,
            stderr: stderr.trim().to_string(),
        });
    }
    String::from_utf8(out.stdout)
        .map(|s| if trim { s.trim_end().to_string() } else { s })
        .map_err(|_| SourceError::CommandNotUtf8(program.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_every_kind_of_source() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tok"), "file-value\n").unwrap();
        let keys_path = dir.path().join("keys.json");
        std::fs::write(&keys_path, r#"{"keys":[{"id":"openai","value":"sk-1"}]}"#).unwrap();
        let keys = ApiKeys::load(&keys_path).unwrap();
        let read = |s: ValueSource| read_source(&s, dir.path(), &keys);
        // agents-exe's `Clear false`: the file's last newline kept.
        assert_eq!(
            read_source_as(&ValueSource::File("tok".into()), dir.path(), &keys, false).unwrap(),
            json!("file-value\n")
        );

        assert_eq!(read(ValueSource::Value(json!(3))).unwrap(), json!(3));
        assert_eq!(
            read(ValueSource::File("tok".into())).unwrap(),
            json!("file-value")
        );
        assert_eq!(
            read(ValueSource::Command(vec!["echo".into(), "hi".into()])).unwrap(),
            json!("hi")
        );
        assert_eq!(
            read(ValueSource::ApiKey("openai".into())).unwrap(),
            json!("sk-1")
        );
        let err = read(ValueSource::Env("BINDERY_SURELY_UNSET_VAR".into())).unwrap_err();
        assert!(matches!(err, SourceError::EnvUnset(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "environment variable BINDERY_SURELY_UNSET_VAR is not set"
        );
        let err = read(ValueSource::ApiKey("nope".into())).unwrap_err();
        assert!(matches!(err, SourceError::NoSuchApiKey { .. }), "{err:?}");
        assert!(
            err.to_string().contains("has no key with id `nope`"),
            "{err}"
        );
        let err = read(ValueSource::Command(vec!["false".into()])).unwrap_err();
        assert!(matches!(err, SourceError::CommandFailed { .. }), "{err:?}");
        assert!(err.to_string().contains("command `false` failed"), "{err}");
        let err = read(ValueSource::Command(vec![])).unwrap_err();
        assert!(matches!(err, SourceError::NoProgram), "{err:?}");
        let err = read(ValueSource::File("missing".into())).unwrap_err();
        assert!(matches!(err, SourceError::FileUnreadable { .. }), "{err:?}");
        assert!(err.to_string().contains("cannot read file"), "{err}");
        let none = ApiKeys::default().get("openai").unwrap_err();
        assert!(matches!(none, SourceError::NoApiKeysFile(_)), "{none:?}");
    }
}
