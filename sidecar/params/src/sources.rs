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

/// agents-exe's API-keys file: `{"keys": [{"id": "openai", "value": "sk-…"}]}`.
#[derive(Default)]
pub struct ApiKeys {
    path: Option<PathBuf>,
    keys: BTreeMap<String, SecretString>,
}

impl ApiKeys {
    pub fn load(path: &Path) -> Result<ApiKeys, String> {
        #[derive(serde::Deserialize)]
        struct File {
            keys: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            id: String,
            value: String,
        }
        let shown = path.display();
        crate::live::private_file(path);
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the API-keys file {shown}: {e}"))?;
        // serde_json's errors give a position, not the text around it.
        let file: File = serde_json::from_str(&text).map_err(|e| {
            format!("the API-keys file {shown} is not {{\"keys\": [{{\"id\", \"value\"}}]}}: {e}")
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

    pub fn get(&self, id: &str) -> Result<&SecretString, String> {
        match (&self.path, self.keys.get(id)) {
            (_, Some(k)) => Ok(k),
            (None, None) => Err(format!(
                "API key `{id}` is wanted but no API-keys file was given (use --api-keys FILE)"
            )),
            (Some(p), None) => Err(format!(
                "the API-keys file {} has no key with id `{id}`",
                p.display()
            )),
        }
    }
}

/// Read a source. `base` is the directory relative file paths start from.
/// A file's or a command's trailing white space is removed.
pub fn read_source(
    source: &ValueSource,
    base: &Path,
    api_keys: &ApiKeys,
) -> Result<serde_json::Value, String> {
    read_source_as(source, base, api_keys, true)
}

/// [`read_source`], a file's or a command's trailing white space kept
/// unless `trim`.
pub fn read_source_as(
    source: &ValueSource,
    base: &Path,
    api_keys: &ApiKeys,
    trim: bool,
) -> Result<serde_json::Value, String> {
    let text = match source {
        ValueSource::Value(v) => return Ok(v.clone()),
        ValueSource::Env(var) => match std::env::var(var) {
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => {
                return Err(format!("environment variable {var} is not set"))
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!("environment variable {var} is not valid UTF-8"))
            }
        },
        ValueSource::File(p) => {
            let path = base.join(p);
            crate::live::private_file(&path);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read file {}: {e}", path.display()))?;
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

fn run_command(argv: &[String], base: &Path, trim: bool) -> Result<String, String> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| "a command source needs at least a program".to_string())?;
    let (mut child, _kept) = bindery_reaper::spawn_kept(|| {
        let child = Command::new(program)
            .args(args)
            .current_dir(base)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let pid = child.id();
        Ok((child, Some(pid)))
    })
    .map_err(|e| format!("cannot start command `{program}`: {e}"))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > COMMAND_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "command `{program}` did not finish within {}s",
                    COMMAND_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("command `{program}`: {e}")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("command `{program}`: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "command `{program}` failed ({}): {}",
            out.status,
            stderr.trim()
        ));
    }
    String::from_utf8(out.stdout)
        .map(|s| if trim { s.trim_end().to_string() } else { s })
        .map_err(|_| format!("command `{program}` printed something that is not UTF-8"))
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
        assert_eq!(
            err,
            "environment variable BINDERY_SURELY_UNSET_VAR is not set"
        );
        let err = read(ValueSource::ApiKey("nope".into())).unwrap_err();
        assert!(err.contains("has no key with id `nope`"), "{err}");
        let err = read(ValueSource::Command(vec!["false".into()])).unwrap_err();
        assert!(err.contains("command `false` failed"), "{err}");
        let err = read(ValueSource::File("missing".into())).unwrap_err();
        assert!(err.contains("cannot read file"), "{err}");
    }
}
