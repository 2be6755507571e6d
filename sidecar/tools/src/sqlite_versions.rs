//! Versioned SQLite (agents-exe's `SqliteVersioned`): a statement that
//! writes runs on a fresh copy of the database, never on the file the
//! author named, and answers with a handle to that copy. Which copy the
//! next statement reads is the toolbox's `shared`:
//!
//! - `global`: the latest copy any session made;
//! - `conversation`: the latest the session made;
//! - `turn`: the latest made in the same model turn;
//! - `tool-call`: none (each call starts from the named file).
//!
//! A call may name a copy instead (`restore_from`, the handle a write
//! answered), but only one its own session made: a handle is the model's
//! text, and another session's data is not its to read. `promote` makes a
//! copy the named file itself. Copies live under the storage root as
//! agents-exe lays them out (`<session>/<turn>/snap-<n>/<name>.sqlite`);
//! each is the whole database, so a session may make `max_copies`, of at
//! most `max_bytes` together: a copy that would pass it is not made, and a
//! write cannot grow one past what is left (SQLite's `max_page_count`).
//!
//! The heads are kept in memory, as agents-exe keeps them: after a
//! restart a statement reads the named file until the next write.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::{CallContext, ToolError};

/// Why a call has no copy to read or write. The `restore_from` ones are
/// the model's to fix; the others are the session's limits or the disk.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error("`restore_from` names toolbox `{named}`, not `{this}`")]
    OtherToolbox { named: String, this: String },
    #[error("`restore_from` names a copy another session made; only this session's copies can be restored")]
    OtherSession,
    #[error("`restore_from`: no copy {index} of turn `{turn}` in this session")]
    NoCopy { index: usize, turn: String },
    #[error("this session has made {max} copies of the database, as many as it may; promote one, or start a new session")]
    MaxCopies { max: usize },
    #[error("this session's copies of the database take {taken} bytes, and another of {size} would pass the {max} they may; promote one, or start a new session")]
    MaxBytes { taken: u64, size: u64, max: u64 },
    #[error("cannot read {}: {error}", .path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot make {}: {error}", .dir.display())]
    MakeDir { dir: PathBuf, error: std::io::Error },
    #[error("cannot copy {} to {}: {error}", .from.display(), .to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        error: std::io::Error,
    },
    /// A `-wal` or `-shm` file beside the database.
    #[error("cannot copy {}: {error}", .path.display())]
    CopySide {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl From<VersionError> for ToolError {
    /// A bad `restore_from` is the model's to fix; the rest failed the call.
    fn from(e: VersionError) -> ToolError {
        match e {
            VersionError::OtherToolbox { .. }
            | VersionError::OtherSession
            | VersionError::NoCopy { .. } => ToolError::InvalidArguments(e.to_string()),
            _ => ToolError::Failed(e.to_string()),
        }
    }
}
use bindery_spec::SqliteSharing;

/// A session may make this many copies when the toolbox does not say.
pub const DEFAULT_MAX_COPIES: usize = 100;
/// A session's copies may take this many bytes together by default.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// agents-exe's `SqliteVersionHandle`: where a write's copy is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Handle {
    pub session_id: String,
    pub turn_id: String,
    pub tool_call_index: usize,
    pub toolbox_name: String,
    #[serde(default)]
    pub timestamp: String,
}

pub struct Versions {
    base: PathBuf,
    root: PathBuf,
    name: String,
    shared: SqliteSharing,
    max_copies: usize,
    max_bytes: u64,
    /// The latest copy per sharing scope.
    heads: Mutex<HashMap<String, PathBuf>>,
    /// Copies made and the bytes they take, per session.
    made: Mutex<HashMap<String, (usize, u64)>>,
    /// The next copy's number (agents-exe's `tool_call_index`).
    counter: AtomicUsize,
}

/// A session or turn id as a directory name: agents-exe's (`-` as `_`)
/// for ids of letters, digits and `-`; any other id hex-encoded behind a
/// `~`, which no id of the first kind gives, so that no two ids share a
/// directory and none climbs out of it.
pub fn dir_name(id: &str) -> String {
    if !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        id.replace('-', "_")
    } else {
        let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
        format!("~{hex}")
    }
}

/// agents-exe's default storage root.
pub fn default_root(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(xdg) = env("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return Path::new(&xdg).join("agents/sqlite-versions");
    }
    if let Some(home) = env("HOME").filter(|v| !v.is_empty()) {
        return Path::new(&home).join(".local/share/agents/sqlite-versions");
    }
    PathBuf::from("/tmp/agents-sqlite-versions")
}

impl Versions {
    pub fn new(
        base: PathBuf,
        root: PathBuf,
        name: &str,
        shared: SqliteSharing,
        max_copies: Option<u32>,
        max_bytes: Option<u64>,
    ) -> Versions {
        Versions {
            base,
            root,
            name: name.to_string(),
            shared,
            max_copies: max_copies.map_or(DEFAULT_MAX_COPIES, |n| n as usize),
            max_bytes: max_bytes.unwrap_or(DEFAULT_MAX_BYTES),
            heads: Mutex::default(),
            made: Mutex::default(),
            counter: AtomicUsize::new(0),
        }
    }

    pub fn base(&self) -> &Path {
        &self.base
    }

    fn head_key(&self, ctx: &CallContext) -> Option<String> {
        match self.shared {
            SqliteSharing::Global => Some(String::new()),
            SqliteSharing::Conversation => Some(format!("c/{}", ctx.session_id)),
            SqliteSharing::Turn => Some(format!("t/{}/{}", ctx.session_id, ctx.step_id)),
            SqliteSharing::ToolCall => None,
        }
    }

    /// The file a call reads: the copy `restore` names (its own session's
    /// only), else the scope's latest copy, else the named file.
    pub fn source(
        &self,
        ctx: &CallContext,
        restore: Option<&Handle>,
    ) -> Result<PathBuf, VersionError> {
        if let Some(h) = restore {
            return self.restored(ctx, h);
        }
        let heads = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        Ok(self
            .head_key(ctx)
            .and_then(|k| heads.get(&k).cloned())
            .unwrap_or_else(|| self.base.clone()))
    }

    fn restored(&self, ctx: &CallContext, h: &Handle) -> Result<PathBuf, VersionError> {
        if h.toolbox_name != self.name {
            return Err(VersionError::OtherToolbox {
                named: h.toolbox_name.clone(),
                this: self.name.clone(),
            });
        }
        if h.session_id != dir_name(&ctx.session_id) {
            return Err(VersionError::OtherSession);
        }
        let path = self.copy_path(&ctx.session_id, &h.turn_id, h.tool_call_index);
        // The turn id is the model's text: it must name a directory of
        // this session's, not climb out of it.
        let fits = !h.turn_id.is_empty()
            && h.turn_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !fits || !path.is_file() {
            return Err(VersionError::NoCopy {
                index: h.tool_call_index,
                turn: h.turn_id.clone(),
            });
        }
        Ok(path)
    }

    fn copy_path(&self, session: &str, turn_dir: &str, index: usize) -> PathBuf {
        self.root
            .join(dir_name(session))
            .join(turn_dir)
            .join(format!("snap-{index}"))
            .join(format!("{}.sqlite", self.name))
    }

    /// A new copy of `source` for a write of this call, and how many bytes
    /// it may grow to; or why not (the session made its `max_copies`, or
    /// its copies take `max_bytes`).
    pub fn copy(
        &self,
        ctx: &CallContext,
        source: &Path,
    ) -> Result<(PathBuf, Handle, u64), VersionError> {
        let size = std::fs::metadata(source)
            .map_err(|error| VersionError::Read {
                path: source.to_path_buf(),
                error,
            })?
            .len();
        let room = {
            let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
            let (n, bytes) = made.entry(ctx.session_id.clone()).or_default();
            if *n >= self.max_copies {
                return Err(VersionError::MaxCopies {
                    max: self.max_copies,
                });
            }
            let left = self.max_bytes.saturating_sub(*bytes);
            if size > left {
                return Err(VersionError::MaxBytes {
                    taken: *bytes,
                    size,
                    max: self.max_bytes,
                });
            }
            *n += 1;
            // Counted at its largest; what the write leaves is counted after.
            *bytes += left;
            left
        };
        let index = self.counter.fetch_add(1, Ordering::Relaxed);
        let turn = dir_name(&ctx.step_id);
        let path = self.copy_path(&ctx.session_id, &turn, index);
        let dir = path.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir).map_err(|error| VersionError::MakeDir {
            dir: dir.to_path_buf(),
            error,
        })?;
        copy_database(source, &path)?;
        let handle = Handle {
            session_id: dir_name(&ctx.session_id),
            turn_id: turn,
            tool_call_index: index,
            toolbox_name: self.name.clone(),
            timestamp: chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        };
        Ok((path, handle, room))
    }

    /// After a write of this session: its copy takes `size` bytes of the
    /// `room` [`Versions::copy`] set aside.
    pub fn settle(&self, ctx: &CallContext, room: u64, size: u64) {
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, bytes)) = made.get_mut(&ctx.session_id) {
            *bytes = bytes.saturating_sub(room.saturating_sub(size));
        }
    }

    /// After a write on `copy`, the scope reads it from now on.
    pub fn advance(&self, ctx: &CallContext, copy: PathBuf) {
        if let Some(k) = self.head_key(ctx) {
            let mut heads = self.heads.lock().unwrap_or_else(|p| p.into_inner());
            heads.insert(k, copy);
        }
    }
}

/// The database and its WAL files, as agents-exe copies them.
fn copy_database(from: &Path, to: &Path) -> Result<(), VersionError> {
    std::fs::copy(from, to).map_err(|error| VersionError::Copy {
        from: from.to_path_buf(),
        to: to.to_path_buf(),
        error,
    })?;
    for suffix in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{suffix}", from.display()));
        if side.is_file() {
            let dest = PathBuf::from(format!("{}{suffix}", to.display()));
            std::fs::copy(&side, &dest)
                .map_err(|error| VersionError::CopySide { path: side, error })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(session: &str, step: &str) -> CallContext {
        CallContext {
            session_id: session.into(),
            step_id: step.into(),
            ..CallContext::default()
        }
    }

    #[test]
    fn directory_names_are_agents_exes_and_never_shared_or_climbing() {
        assert_eq!(dir_name("1b4e28ba-2fa1"), "1b4e28ba_2fa1");
        assert_eq!(dir_name("a_b"), "~615f62");
        assert_eq!(dir_name("../x"), "~2e2e2f78");
        assert_ne!(dir_name("a-b"), dir_name("a_b"));
        // An id that looks like another's hex form is still its own.
        assert_ne!(dir_name("x63305f30"), dir_name("c0_0"));
        assert_eq!(dir_name(""), "~");
    }

    #[test]
    fn heads_follow_the_sharing_and_restores_stay_in_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.sqlite");
        std::fs::write(&base, b"base").unwrap();
        let v = Versions::new(
            base.clone(),
            dir.path().join("root"),
            "kb",
            SqliteSharing::Conversation,
            Some(2),
            Some(100),
        );
        let (a, b) = (ctx("s-1", "t-1"), ctx("s-2", "t-1"));
        assert_eq!(v.source(&a, None).unwrap(), base);
        let (copy, handle, room) = v.copy(&a, &base).unwrap();
        assert_eq!(room, 100);
        v.settle(&a, room, 4);
        assert!(copy.starts_with(dir.path().join("root/s_1/t_1/snap-0")));
        assert_eq!(std::fs::read(&copy).unwrap(), b"base");
        v.advance(&a, copy.clone());
        assert_eq!(v.source(&a, None).unwrap(), copy);
        assert_eq!(v.source(&b, None).unwrap(), base, "another session's head");
        assert_eq!(v.source(&a, Some(&handle)).unwrap(), copy);
        let theirs = v.source(&b, Some(&handle)).unwrap_err();
        assert!(matches!(theirs, VersionError::OtherSession), "{theirs}");
        assert!(
            matches!(ToolError::from(theirs), ToolError::InvalidArguments(m) if m.contains("another session"))
        );
        let climbing = Handle {
            turn_id: "../../s_2".into(),
            ..handle.clone()
        };
        assert!(matches!(
            v.source(&a, Some(&climbing)),
            Err(VersionError::NoCopy { .. })
        ));
        let (_, _, room) = v.copy(&a, &base).unwrap();
        v.settle(&a, room, 4);
        let full = v.copy(&a, &base).unwrap_err();
        assert!(matches!(full, VersionError::MaxCopies { max: 2 }), "{full}");
        assert!(full.to_string().contains("2 copies"), "{full}");
        // Bytes are counted too: a session whose copies take its budget
        // makes no more.
        let (_, _, room) = v.copy(&b, &base).unwrap();
        v.settle(&b, room, 98);
        let big = v.copy(&b, &base).unwrap_err();
        assert!(matches!(big, VersionError::MaxBytes { .. }), "{big}");
        assert!(matches!(ToolError::from(big), ToolError::Failed(m) if m.contains("bytes")));
    }
}
