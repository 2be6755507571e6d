//! The commands over session files: reading, writing, printing. The
//! logic is in the sibling modules.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::calls::{self, ListFormat};
use super::edit;
use super::index::{self, IndexConfig, SearchOptions, Status};
use super::print::{self, PrintOptions};
use super::SessionFileError;

/// Human output, which quotes a session file's text: made safe for a
/// terminal (JSON output is escaped JSON already).
fn shown(text: &str) -> Result<ExitCode, SessionFileError> {
    out(&crate::cli::terminal_text::for_terminal(text))
}

fn out(text: &str) -> Result<ExitCode, SessionFileError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(SessionFileError::Write)?;
    Ok(ExitCode::SUCCESS)
}

pub fn list_tool_calls(path: &Path, format: ListFormat) -> Result<ExitCode, SessionFileError> {
    let what = format!("session file {}", path.display());
    let doc = super::read_file(path)?;
    let (_, found) = calls::of_doc(&doc, &what)?;
    let text = calls::render(&found, format, &path.display().to_string());
    match format {
        ListFormat::Json => out(&text),
        ListFormat::Human | ListFormat::Brief => shown(&text),
    }
}

pub fn session_print(
    as_prompt: Option<print::Verbosity>,
    path: &Path,
    opts: &PrintOptions,
) -> Result<ExitCode, SessionFileError> {
    let session = super::read_agents_exe(path)?;
    match as_prompt {
        Some(size) => shown(&print::render_for_prompt(size, &session)),
        None => shown(&print::render(&session, opts)),
    }
}

/// The session on stdin, edited, on stdout (pretty, as agents-exe writes it).
pub fn session_edit(args: &[String]) -> Result<ExitCode, SessionFileError> {
    let ops = edit::parse_ops(args)?;
    let text = super::read_capped(std::io::stdin().lock(), "the session on stdin")?;
    let mut doc = super::parse_text(&text, "the session on stdin")?;
    super::model::Session::parse(&doc).map_err(|source| SessionFileError::NotAgentsExe {
        what: "the session on stdin".into(),
        source,
    })?;
    edit::apply(&mut doc, &ops);
    out(&(print::pretty(&doc) + "\n"))
}

/// Where the sessions are: the directories given, else agents-exe's.
fn dirs(given: &[PathBuf]) -> Result<Vec<PathBuf>, SessionFileError> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let cwd = std::env::current_dir().map_err(SessionFileError::WorkingDirectory)?;
    let home = std::env::var_os("HOME").map(PathBuf::from);
    Ok(index::session_dirs(&cwd, home.as_deref())?)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexOp {
    Build,
    Update,
    Status,
    Clean,
}

fn report(done: &index::Indexed) -> String {
    let mut text = format!(
        "{} session{} indexed, {} unchanged, {} removed\n",
        done.indexed,
        if done.indexed == 1 { "" } else { "s" },
        done.unchanged,
        done.removed
    );
    for s in &done.skipped {
        text.push_str(&format!("skipped: {s}\n"));
    }
    text
}

pub fn session_index(
    op: IndexOp,
    db: PathBuf,
    sessions_dirs: &[PathBuf],
    tool_outputs: bool,
) -> Result<ExitCode, SessionFileError> {
    let cfg = IndexConfig {
        db,
        dirs: dirs(sessions_dirs)?,
        tool_outputs,
    };
    match op {
        IndexOp::Build => {
            out("Building search index...\n")?;
            let done = index::build(&cfg)?;
            shown(&format!("{}Index built successfully.\n", report(&done)))
        }
        IndexOp::Update => {
            out("Updating search index...\n")?;
            let done = index::update(&cfg)?;
            shown(&format!("{}Index updated successfully.\n", report(&done)))
        }
        IndexOp::Status => out(&match index::status(&cfg)? {
            Status::Current => "Index status: Current (up to date)\n".to_string(),
            Status::Stale { stale, total } => format!("Index status: Stale ({stale} of {total} sessions need update)\nRun 'session-index --update' to refresh the index.\n"),
            Status::Missing => "Index status: Missing\nRun 'session-index --build' to create the index.\n".to_string(),
        }),
        IndexOp::Clean => {
            out("Removing search index...\n")?;
            index::clean(&cfg)?;
            out("Index removed.\n")
        }
    }
}

/// `session-search`'s command line.
#[derive(Clone, Debug)]
pub struct Search {
    pub db: PathBuf,
    pub sessions_dirs: Vec<PathBuf>,
    pub tool_outputs: bool,
    pub json: bool,
    pub auto: bool,
    pub after: Option<String>,
    pub before: Option<String>,
    pub options: SearchOptions,
}

/// A missing index is built first; a stale one is brought up to date
/// with `--auto` (searched as it is otherwise), as agents-exe does.
pub fn session_search(mut s: Search) -> Result<ExitCode, SessionFileError> {
    let day = |flag: &'static str, d: &Option<String>| {
        d.as_deref()
            .map(index::day_start)
            .transpose()
            .map_err(|source| SessionFileError::Date { flag, source })
    };
    s.options.after = day("--after", &s.after)?;
    s.options.before = day("--before", &s.before)?;
    let cfg = IndexConfig {
        db: s.db.clone(),
        dirs: dirs(&s.sessions_dirs)?,
        tool_outputs: s.tool_outputs,
    };
    let mut updated = false;
    match index::status(&cfg)? {
        Status::Missing => {
            if !s.json {
                out("Search index not found. Building index...\n")?;
            }
            index::build(&cfg)?;
            updated = s.auto;
        }
        Status::Stale { stale, total } if s.auto => {
            if !s.json {
                out(&format!(
                    "Index is stale ({stale} of {total} sessions need update). Updating...\n"
                ))?;
            }
            index::update(&cfg)?;
            updated = true;
        }
        _ => {}
    }
    let found = index::search(&cfg, &s.options, updated)?;
    if s.json {
        out(&(print::pretty(&index::to_json(&found)) + "\n"))
    } else {
        shown(&index::to_text(&found))
    }
}
