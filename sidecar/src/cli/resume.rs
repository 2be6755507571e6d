//! `run --session-file FILE`: the session a run goes on from, and FILE
//! rewritten, whole and in agents-exe's format, after each step of the
//! run. The conversion is [`history`]'s; this is its I/O.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::Value;

use super::agents_exe_session::history::{self, Added, Resumed};
use super::agents_exe_session::{self as aes, model::Session, Shape};
use super::serve::CliSink;
use bindery_llm::Turn;
use bindery_session::budget::{Gate, Spent};
use bindery_session::run::{self, Events, Host, RunContext};
use bindery_spec::ModelSpec;

/// Why `--session-file` cannot be gone on from, or was not rewritten.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("--session-file {file}: {source}")]
    Unreadable {
        file: String,
        source: std::io::Error,
    },
    /// Anything but agents-exe's session is refused, never overwritten.
    #[error("--session-file {file} holds no agents-exe session ({why}); `run` rewrites this file after each step: give a new path, or a session file agents-exe or `run` wrote")]
    NoSession { file: String, why: Box<NoSession> },
    #[error("cannot write --session-file {file}: {source}")]
    Write {
        file: String,
        source: std::io::Error,
    },
    /// A write panicked while it held the session: the file was not
    /// rewritten after it.
    #[error("a write failed before")]
    Poisoned,
}

/// What `--session-file` holds instead of an agents-exe session.
#[derive(Debug, thiserror::Error)]
pub enum NoSession {
    #[error(transparent)]
    Unread(#[from] aes::SessionFileError),
    #[error("it is not shaped as agents-exe's, with tagged turns")]
    Bindery,
    #[error(transparent)]
    Shape(#[from] aes::model::ShapeError),
}

/// A `--session-file` and the session it held.
pub struct SessionFile {
    path: PathBuf,
    /// The session as stored (none: the file is new).
    prior: Option<Value>,
    pub resumed: Resumed,
    session_id: String,
}

impl SessionFile {
    /// The session in `path` (none when it does not exist or is empty).
    /// A file holding anything else is refused, not overwritten.
    pub fn open(path: &Path) -> Result<SessionFile, ResumeError> {
        let file = || path.display().to_string();
        let exists = match std::fs::metadata(path) {
            Ok(m) => m.len() > 0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(source) => {
                return Err(ResumeError::Unreadable {
                    file: file(),
                    source,
                })
            }
        };
        let refuse = |why: NoSession| ResumeError::NoSession {
            file: file(),
            why: Box::new(why),
        };
        let (prior, resumed) = if exists {
            let doc = aes::read_file(path).map_err(|e| refuse(e.into()))?;
            if aes::shape(&doc) == Shape::Bindery {
                return Err(refuse(NoSession::Bindery));
            }
            let session = Session::parse(&doc).map_err(|e| refuse(e.into()))?;
            (Some(doc), history::history_of(&session))
        } else {
            (
                None,
                Resumed {
                    messages: Vec::new(),
                    carried: 0,
                },
            )
        };
        let session_id = prior
            .as_ref()
            .and_then(|d| d.get("sessionId"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        Ok(SessionFile {
            path: path.to_path_buf(),
            prior,
            resumed,
            session_id,
        })
    }

    /// The file rewritten: its session with `new` (the run's messages) on top.
    fn write(&self, new: &[Added], prompt: &str) -> Result<(), ResumeError> {
        let turn_id = uuid::Uuid::new_v4().to_string();
        let doc =
            history::session_doc(self.prior.as_ref(), new, prompt, &self.session_id, &turn_id);
        replace(&self.path, &(doc.to_string() + "\n")).map_err(|source| ResumeError::Write {
            file: self.path.display().to_string(),
            source,
        })
    }
}

/// `path`'s content replaced by `text` at once: written to a file beside
/// it, then renamed over it, so a crash leaves the old file or the new,
/// never half of one. A new file is the user's only; an old one keeps its
/// permissions.
fn replace(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("it names no file"))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    // A leftover of this process id's own earlier crash.
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut f = options.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        if let Ok(old) = std::fs::metadata(path) {
            std::fs::set_permissions(&tmp, old.permissions())?;
        }
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The command line's sink, which also rewrites the session file after
/// each message the run adds.
pub struct FileSink<'a, 'c> {
    file: &'a SessionFile,
    ctx: &'a RunContext<'c>,
    written: Mutex<Written>,
    failed: Mutex<Option<ResumeError>>,
}

/// What the run has so far.
struct Written {
    /// The whole history (which tools it has activated).
    history: Vec<Turn>,
    /// The run's own messages (not the file's), oldest first.
    new: Vec<Added>,
}

impl<'a, 'c> FileSink<'a, 'c> {
    /// `history`: the run's before its first step; the last `own` of it
    /// are the run's to write (its query, and answers to calls the file
    /// left open).
    pub fn new(
        file: &'a SessionFile,
        ctx: &'a RunContext<'c>,
        history: &[Turn],
        own: usize,
    ) -> Self {
        let tools = std::sync::Arc::new(run::tools_on_offer(ctx, history));
        let new = history[history.len().saturating_sub(own)..]
            .iter()
            .map(|t| Added {
                message: t.message().clone(),
                tools: tools.clone(),
            })
            .collect();
        FileSink {
            file,
            ctx,
            written: Mutex::new(Written {
                history: history.to_vec(),
                new,
            }),
            failed: Mutex::new(None),
        }
    }

    /// The first write that failed (taken: asked once, at the run's end).
    pub fn error(&self) -> Option<ResumeError> {
        match self.failed.lock() {
            Ok(mut f) => f.take(),
            Err(_) => Some(ResumeError::Poisoned),
        }
    }
}

#[async_trait]
impl Host for FileSink<'_, '_> {
    async fn turn(&self, msg: &Turn, events: Events) {
        CliSink.turn(msg, events).await;
        let written = tokio::task::block_in_place(|| {
            let mut w = self.written.lock().map_err(|_| ResumeError::Poisoned)?;
            w.history.push(msg.clone());
            let tools = run::tools_on_offer(self.ctx, &w.history);
            w.new.push(Added {
                message: msg.message().clone(),
                tools: std::sync::Arc::new(tools),
            });
            self.file.write(&w.new, &self.ctx.agent.spec.system_prompt)
        });
        if let Err(e) = written {
            tracing::warn!("error: {e}");
            if let Ok(mut f) = self.failed.lock() {
                f.get_or_insert(e);
            }
        }
    }

    fn delta(&self, _: &str) {}
    // The command line counts no budget: every request and call goes.
    async fn before_model(&self, _: &ModelSpec, _: &(dyn Fn() -> u64 + Send + Sync)) -> Gate {
        Gate::Go(None)
    }
    async fn after_model(&self, _: Option<i64>, _: &ModelSpec, _: Option<Spent>) {}
    async fn before_tool(&self, _: &str) -> Gate {
        Gate::Go(None)
    }
    fn approve(&self, _: &str) {}
    async fn before_call(
        &self,
        tool: &str,
        call: &str,
        secrets: &[String],
    ) -> Result<(), run::Unaudited> {
        CliSink.before_call(tool, call, secrets).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_file_keeps_its_permissions_and_leaves_nothing_beside_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.json");
        replace(&f, "one\n").unwrap();
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        replace(&f, "two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "two\n");
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o640
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
        // A directory in the way: an error, nothing left behind.
        let d = dir.path().join("d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("x"), "").unwrap();
        assert!(replace(&d, "x").is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn only_a_missing_empty_or_agents_exe_file_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.json");
        assert!(SessionFile::open(&f).unwrap().prior.is_none());
        std::fs::write(&f, "").unwrap();
        assert!(SessionFile::open(&f).unwrap().prior.is_none());
        for text in [
            "fn main() {}",
            r#"{"session_id": "x", "session": {"turns": []}}"#,
        ] {
            std::fs::write(&f, text).unwrap();
            let e = SessionFile::open(&f).err().unwrap().to_string();
            assert!(e.contains("holds no agents-exe session"), "{e}");
        }
        std::fs::write(&f, "{}\n{\"turns\": [], \"sessionId\": \"abc\"}\n").unwrap();
        let s = SessionFile::open(&f).unwrap();
        assert_eq!(s.session_id, "abc");
        assert!(s.resumed.messages.is_empty());
    }
}
