//! agents-exe's session files, and its commands over them:
//! `list-tool-calls`, `replay-tool-call`'s numbering, `session-print`,
//! `session-edit`, `session-index` and `session-search`.
//!
//! An agents-exe session file is one JSON line (rewritten whole on every
//! step; a reader takes the last line) shaped by agents-exe's
//! `Session/Types.hs`: `{"turns": [...newest first...], "sessionId", …}`.
//! Bindery's own session file is what `GET /v1/sessions/ID` answers
//! (`{"session_id", "agent", "session": {"turns": [{"role", …}]}}`); the
//! two are told apart by shape ([`shape`]).

pub mod calls;
pub mod edit;
pub mod history;
pub mod index;
pub mod model;
pub mod print;
pub mod run;
pub mod signals;

use std::io::Read;
use std::path::Path;

use serde_json::Value;

/// The most of a session file (or of stdin) read: a session is rewritten
/// whole on every step, so a real one stays far below this.
pub const MAX_SESSION_BYTES: u64 = 64 * 1024 * 1024;

/// Why a session file (or the session on stdin) could not be used, or a
/// command over them could not finish; each names the file (`what`) as the
/// user gave it.
#[derive(Debug, thiserror::Error)]
pub enum SessionFileError {
    #[error("cannot read {what}: {source}")]
    Read {
        what: String,
        source: std::io::Error,
    },
    #[error("{what} is larger than {} MiB, the most a session is read at; is it a session file?", MAX_SESSION_BYTES / (1024 * 1024))]
    TooLarge { what: String },
    #[error("{what} is not UTF-8 text")]
    NotUtf8 { what: String },
    #[error("no session in {what} (it is empty)")]
    Empty { what: String },
    #[error("{what} is neither a session (agents-exe's session file, or what GET /v1/sessions/ID answers) nor JSON lines ending with one: {source}")]
    NotJson {
        what: String,
        source: serde_json::Error,
    },
    #[error("session file {file} is Bindery's (what GET /v1/sessions/ID answers); this command reads agents-exe's session files")]
    Bindery { file: String },
    #[error("{what} is not an agents-exe session: {source}")]
    NotAgentsExe {
        what: String,
        source: model::ShapeError,
    },
    #[error("{what} has no tool call with index {index} (available: {available})")]
    NoToolCall {
        what: String,
        index: usize,
        /// [`calls::available`]: the calls there are, by turn.
        available: String,
    },
    #[error("cannot write the output: {0}")]
    Write(#[source] std::io::Error),
    #[error("cannot read the working directory: {0}")]
    WorkingDirectory(#[source] std::io::Error),
    /// `--after` or `--before` of `session-search`.
    #[error("{flag} {source}")]
    Date {
        flag: &'static str,
        source: index::IndexError,
    },
    #[error(transparent)]
    Edit(#[from] edit::EditError),
    #[error(transparent)]
    Index(#[from] index::IndexError),
}

/// Which program wrote a session document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// agents-exe: `turns` of `{"tag": "LlmTurn"|"UserTurn"|…, "contents"}`.
    AgentsExe,
    /// Bindery: what `GET /v1/sessions/ID` answers (turns with a `role`).
    Bindery,
}

/// agents-exe's when its turns are tagged as agents-exe tags them (or it
/// has agents-exe's ids and no turn yet), Bindery's otherwise.
pub fn shape(doc: &Value) -> Shape {
    let Some(turns) = doc.get("turns").and_then(Value::as_array) else {
        return Shape::Bindery;
    };
    let tagged = turns
        .iter()
        .any(|t| t.get("tag").and_then(Value::as_str).is_some());
    if tagged || (turns.is_empty() && doc.get("sessionId").is_some()) {
        Shape::AgentsExe
    } else {
        Shape::Bindery
    }
}

/// Up to [`MAX_SESSION_BYTES`] of `from`; more is an error naming `what`.
pub fn read_capped(from: impl Read, what: &str) -> Result<String, SessionFileError> {
    use super::prompt_script::{read_text, Capped};
    let what = || what.to_string();
    match read_text(from, MAX_SESSION_BYTES).map_err(|source| SessionFileError::Read {
        what: what(),
        source,
    })? {
        Capped::Text(text) => Ok(text),
        Capped::TooLong => Err(SessionFileError::TooLarge { what: what() }),
        Capped::NotUtf8 => Err(SessionFileError::NotUtf8 { what: what() }),
    }
}

/// The session in `text`: one JSON document, or JSON lines whose last
/// (non-empty) one is the session, as agents-exe reads its files.
pub fn parse_text(text: &str, what: &str) -> Result<Value, SessionFileError> {
    if let Ok(v) = serde_json::from_str(text) {
        return Ok(v);
    }
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| SessionFileError::Empty {
            what: what.to_string(),
        })?;
    serde_json::from_str(last).map_err(|source| SessionFileError::NotJson {
        what: what.to_string(),
        source,
    })
}

/// A session file, read (at most [`MAX_SESSION_BYTES`]) and parsed as JSON.
pub fn read_file(path: &Path) -> Result<Value, SessionFileError> {
    let what = format!("session file {}", path.display());
    let file = std::fs::File::open(path).map_err(|source| SessionFileError::Read {
        what: what.clone(),
        source,
    })?;
    parse_text(&read_capped(file, &what)?, &what)
}

/// A file agents-exe's way: the session in it, typed.
pub fn read_agents_exe(path: &Path) -> Result<model::Session, SessionFileError> {
    let doc = read_file(path)?;
    if doc.pointer("/session/turns").is_some() {
        return Err(SessionFileError::Bindery {
            file: path.display().to_string(),
        });
    }
    model::Session::parse(&doc).map_err(|source| SessionFileError::NotAgentsExe {
        what: format!("session file {}", path.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_two_kinds_of_session_are_told_apart_by_shape() {
        assert_eq!(
            shape(&json!({"turns": [{"tag": "UserTurn", "contents": {}}]})),
            Shape::AgentsExe
        );
        assert_eq!(
            shape(&json!({"turns": [], "sessionId": "x"})),
            Shape::AgentsExe
        );
        assert_eq!(
            shape(&json!({"session_id": "s", "session": {"turns": [{"role": "user"}]}})),
            Shape::Bindery
        );
        assert_eq!(shape(&json!({"turns": [{"role": "user"}]})), Shape::Bindery);
        assert_eq!(shape(&json!([1, 2])), Shape::Bindery);
    }

    #[test]
    fn the_last_line_is_the_session_and_too_much_is_refused() {
        let v = parse_text("{\"turns\": []}\n{\"turns\": [1]}\n\n", "f").unwrap();
        assert_eq!(v, json!({"turns": [1]}));
        assert!(parse_text("", "f")
            .unwrap_err()
            .to_string()
            .contains("empty"));
        let err = read_capped(std::io::repeat(b' '), "stdin")
            .unwrap_err()
            .to_string();
        assert!(err.contains("larger than 64 MiB"), "{err}");
    }

    /// Every command's logic over what a truncated or mutated file may
    /// hold: errors, never a panic.
    #[test]
    fn no_broken_session_makes_a_command_panic() {
        use print::{PrintOptions, Verbosity, Visibility};
        let text = include_str!("../../../tests/fixtures/agents-exe/sessions/multi.session.json");
        let exercise = |doc: &Value| {
            let _ = calls::of_doc(doc, "f");
            if let Ok(s) = model::Session::parse(doc) {
                let all = PrintOptions {
                    results: Visibility::ELIDED,
                    arguments: Visibility::Shown,
                    n_turns: Some(2),
                    antichronological: true,
                    ..PrintOptions::default()
                };
                let _ = print::render(&s, &PrintOptions::default());
                let _ = print::render(&s, &all);
                for v in [Verbosity::Xs, Verbosity::M, Verbosity::Xl] {
                    let _ = print::render_for_prompt(v, &s);
                }
                let _ = index::searchable_text(&s, true);
                let _ = index::tool_counts(&s);
                let resumed = history::history_of(&s);
                let added: Vec<history::Added> = resumed
                    .messages
                    .into_iter()
                    .map(|message| history::Added {
                        message,
                        tools: Default::default(),
                    })
                    .collect();
                let _ = history::session_doc(Some(doc), &added, "p", "s", "t");
            }
            let mut d = doc.clone();
            use edit::Op::*;
            edit::apply(
                &mut d,
                &[Take(2), CensorToolCalls, CensorThinking, DropTail(1)],
            );
        };
        for cut in (0..text.len()).step_by(5) {
            if let Some(Ok(v)) = text.get(..cut).map(|t| parse_text(t, "f")) {
                exercise(&v);
            }
        }
        let doc: Value = serde_json::from_str(text).unwrap();
        fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
            match v {
                Value::Object(o) => o.iter().for_each(|(k, x)| {
                    pointers(
                        x,
                        format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                        out,
                    )
                }),
                Value::Array(a) => a
                    .iter()
                    .enumerate()
                    .for_each(|(i, x)| pointers(x, format!("{at}/{i}"), out)),
                _ => {}
            }
            out.push(at);
        }
        let mut all = Vec::new();
        pointers(&doc, String::new(), &mut all);
        let odd = [
            json!(null),
            json!(true),
            json!(-1),
            json!(1e308),
            json!("x"),
            json!([]),
            json!({}),
            json!([[1], {"tag": 1}]),
        ];
        for p in &all {
            for r in &odd {
                let mut d = doc.clone();
                if let Some(slot) = d.pointer_mut(p) {
                    *slot = r.clone();
                }
                exercise(&d);
            }
        }
        assert!(all.len() > 100, "the fixture is walked: {}", all.len());
    }
}
