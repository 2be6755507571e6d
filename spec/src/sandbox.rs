//! A builtin toolbox's file sandbox: which files `attach-file` may read,
//! agents-exe's `FileSandbox` and its `PathPredicate`. Judging is pure:
//! the caller hands over the canonical path (symlinks and `..` resolved)
//! and its size, and the predicate's own paths already made absolute.

use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which files the toolbox may read. Absent: none (agents-exe's default).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSandbox {
    /// The rule a file's canonical path must pass.
    #[schemars(schema_with = "predicate_schema")]
    pub predicate: PathPredicate,
    /// The largest file, in bytes (never more than the media limit, 4 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_file_size: Option<u64>,
}

/// The schema the `Agent` resource shows for `predicate`: a recursive type
/// has no structural schema, so the API server keeps it as written and
/// `check` (and the operator) read it.
fn predicate_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Which files may be read, judged on the canonical path: `{fileExactly: …}`, `{directoryExactly: …}`, `{directoryRecursive: …}`, `{directoryShallow: …}`, `{childOf: …}`, `{filePattern: \"*.png\"}`, `{fileExtension: [png, pdf]}`, `{fileSizeLessThan: n}`, `alwaysAllow`, `alwaysDeny`, combined with `{and: [a, b]}`, `{or: [a, b]}`, `{not: …}`, `{any: [...]}`, `{all: [...]}`. Relative paths are taken from the working directory.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A rule on a file's canonical path. Relative paths in it are taken from
/// the working directory, as agents-exe does.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum PathPredicate {
    /// This one file.
    FileExactly(String),
    /// This one path (a directory itself, not what it holds).
    DirectoryExactly(String),
    /// This directory and everything below it.
    DirectoryRecursive(String),
    /// The entries directly in this directory, not in its subdirectories.
    DirectoryShallow(String),
    /// The file name matches this pattern (`*` any characters, `?` one).
    FilePattern(String),
    /// Below this directory (as `directoryRecursive`).
    ChildOf(String),
    /// The extension, without its dot, is one of these.
    FileExtension(Vec<String>),
    /// The file has at most this many bytes.
    FileSizeLessThan(u64),
    And(Box<PathPredicate>, Box<PathPredicate>),
    Or(Box<PathPredicate>, Box<PathPredicate>),
    Not(Box<PathPredicate>),
    /// At least one of these (none: denied).
    Any(Vec<PathPredicate>),
    /// Each of these (none: allowed).
    All(Vec<PathPredicate>),
    AlwaysAllow,
    AlwaysDeny,
}

impl PathPredicate {
    /// Whether `path` (canonical, absolute) of `size` bytes passes, the
    /// predicate's relative paths taken from `cwd`.
    pub fn allows(&self, path: &Path, size: u64, cwd: &Path) -> bool {
        let at = |p: &str| lexical(&cwd.join(p));
        match self {
            PathPredicate::AlwaysAllow => true,
            PathPredicate::AlwaysDeny => false,
            PathPredicate::FileExactly(p) | PathPredicate::DirectoryExactly(p) => path == at(p),
            PathPredicate::DirectoryRecursive(p) | PathPredicate::ChildOf(p) => {
                path.starts_with(at(p))
            }
            PathPredicate::DirectoryShallow(p) => path.parent() == Some(at(p).as_path()),
            PathPredicate::FilePattern(g) => path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| glob(g.as_bytes(), n.as_bytes())),
            PathPredicate::FileExtension(exts) => {
                let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
                exts.iter().any(|e| e == ext)
            }
            PathPredicate::FileSizeLessThan(max) => size <= *max,
            PathPredicate::And(a, b) => a.allows(path, size, cwd) && b.allows(path, size, cwd),
            PathPredicate::Or(a, b) => a.allows(path, size, cwd) || b.allows(path, size, cwd),
            PathPredicate::Not(p) => !p.allows(path, size, cwd),
            PathPredicate::Any(ps) => ps.iter().any(|p| p.allows(path, size, cwd)),
            PathPredicate::All(ps) => ps.iter().all(|p| p.allows(path, size, cwd)),
        }
    }

    /// The predicate with each of its paths as `at` gives it (the caller
    /// makes them absolute and canonical).
    pub fn with_paths(&self, at: &dyn Fn(&str) -> String) -> PathPredicate {
        use PathPredicate as P;
        let b = |p: &PathPredicate| Box::new(p.with_paths(at));
        let v = |ps: &[PathPredicate]| ps.iter().map(|p| p.with_paths(at)).collect();
        match self {
            P::FileExactly(p) => P::FileExactly(at(p)),
            P::DirectoryExactly(p) => P::DirectoryExactly(at(p)),
            P::DirectoryRecursive(p) => P::DirectoryRecursive(at(p)),
            P::DirectoryShallow(p) => P::DirectoryShallow(at(p)),
            P::ChildOf(p) => P::ChildOf(at(p)),
            P::And(x, y) => P::And(b(x), b(y)),
            P::Or(x, y) => P::Or(b(x), b(y)),
            P::Not(x) => P::Not(b(x)),
            P::Any(ps) => P::Any(v(ps)),
            P::All(ps) => P::All(v(ps)),
            other => other.clone(),
        }
    }

    /// Whether no file can pass (`check` warns): a denial at its root.
    pub fn denies_all(&self) -> bool {
        match self {
            PathPredicate::AlwaysDeny => true,
            PathPredicate::Any(ps) => ps.iter().all(PathPredicate::denies_all),
            PathPredicate::Or(a, b) => a.denies_all() && b.denies_all(),
            PathPredicate::And(a, b) => a.denies_all() || b.denies_all(),
            PathPredicate::All(ps) => ps.iter().any(PathPredicate::denies_all),
            PathPredicate::Not(p) => matches!(**p, PathPredicate::AlwaysAllow),
            _ => false,
        }
    }
}

/// `p` with `.` and `..` taken away without touching the file system
/// (`..` at the root stays at the root).
pub fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// agents-exe's glob on a file name: `*` any characters, `?` one, the
/// rest literally. Iterative, so a long pattern costs no recursion.
fn glob(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pat.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(c) if *c == b'?' || *c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pat[p..].iter().all(|c| *c == b'*')
}

/// agents-exe's JSON form: `{"fsbPredicate", "fsbMaxFileSize"?, "fsbName"?}`.
#[derive(Deserialize, Debug)]
pub struct AgentsExeSandbox {
    #[serde(rename = "fsbPredicate")]
    pub predicate: AgentsExePredicate,
    #[serde(rename = "fsbMaxFileSize", default)]
    pub max_file_size: Option<u64>,
    /// A label only.
    #[serde(rename = "fsbName", default)]
    pub name: Option<String>,
}

/// agents-exe's `PathPredicate`: `{"tag", "contents"}`.
#[derive(Deserialize, Debug)]
#[serde(tag = "tag", content = "contents")]
pub enum AgentsExePredicate {
    FileExactly(String),
    DirectoryExactly(String),
    DirectoryRecursive(String),
    DirectoryShallow(String),
    FilePattern(String),
    ChildOf(String),
    FileExtension(Vec<String>),
    FileSizeLessThan(u64),
    And(Box<AgentsExePredicate>, Box<AgentsExePredicate>),
    Or(Box<AgentsExePredicate>, Box<AgentsExePredicate>),
    Not(Box<AgentsExePredicate>),
    Any(Vec<AgentsExePredicate>),
    All(Vec<AgentsExePredicate>),
    AlwaysAllow,
    AlwaysDeny,
}

impl From<AgentsExeSandbox> for FileSandbox {
    fn from(s: AgentsExeSandbox) -> Self {
        FileSandbox {
            predicate: s.predicate.into(),
            max_file_size: s.max_file_size,
        }
    }
}

impl From<AgentsExePredicate> for PathPredicate {
    fn from(p: AgentsExePredicate) -> Self {
        use AgentsExePredicate as A;
        let b = |p: Box<A>| Box::new(PathPredicate::from(*p));
        let v = |ps: Vec<A>| ps.into_iter().map(PathPredicate::from).collect();
        match p {
            A::FileExactly(s) => PathPredicate::FileExactly(s),
            A::DirectoryExactly(s) => PathPredicate::DirectoryExactly(s),
            A::DirectoryRecursive(s) => PathPredicate::DirectoryRecursive(s),
            A::DirectoryShallow(s) => PathPredicate::DirectoryShallow(s),
            A::FilePattern(s) => PathPredicate::FilePattern(s),
            A::ChildOf(s) => PathPredicate::ChildOf(s),
            A::FileExtension(e) => PathPredicate::FileExtension(e),
            A::FileSizeLessThan(n) => PathPredicate::FileSizeLessThan(n),
            A::And(x, y) => PathPredicate::And(b(x), b(y)),
            A::Or(x, y) => PathPredicate::Or(b(x), b(y)),
            A::Not(x) => PathPredicate::Not(b(x)),
            A::Any(ps) => PathPredicate::Any(v(ps)),
            A::All(ps) => PathPredicate::All(v(ps)),
            A::AlwaysAllow => PathPredicate::AlwaysAllow,
            A::AlwaysDeny => PathPredicate::AlwaysDeny,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn yes(p: &PathPredicate, path: &str) -> bool {
        p.allows(Path::new(path), 10, Path::new("/w"))
    }

    fn native(v: serde_json::Value) -> PathPredicate {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_predicate_judges_its_paths() {
        let p = native(json!({"fileExactly": "a/b.png"}));
        assert!(yes(&p, "/w/a/b.png"));
        assert!(!yes(&p, "/w/a/c.png"));
        let p = native(json!({"directoryExactly": "/d"}));
        assert!(yes(&p, "/d") && !yes(&p, "/d/x"));
        for key in ["directoryRecursive", "childOf"] {
            let p = native(json!({key: "./pics/../pics"}));
            assert!(yes(&p, "/w/pics/x.png") && yes(&p, "/w/pics/a/b/x.png"));
            // A sibling sharing the prefix is outside.
            assert!(!yes(&p, "/w/pics2/x.png") && !yes(&p, "/w/x.png"));
        }
        let p = native(json!({"directoryShallow": "/d"}));
        assert!(yes(&p, "/d/x.png") && !yes(&p, "/d/e/x.png"));
        let p = native(json!({"filePattern": "img-??.*"}));
        assert!(yes(&p, "/any/img-01.png") && !yes(&p, "/any/img-1.png"));
        let p = native(json!({"fileExtension": ["png", "pdf"]}));
        assert!(yes(&p, "/a/x.pdf") && !yes(&p, "/a/x.PNG2") && !yes(&p, "/a/png"));
        let p = native(json!({"fileSizeLessThan": 10}));
        assert!(p.allows(Path::new("/a"), 10, Path::new("/")));
        assert!(!p.allows(Path::new("/a"), 11, Path::new("/")));
        assert!(yes(&native(json!("alwaysAllow")), "/x"));
        assert!(!yes(&native(json!("alwaysDeny")), "/x"));
    }

    #[test]
    fn combinators_combine() {
        let png = json!({"fileExtension": ["png"]});
        let d = json!({"directoryRecursive": "/d"});
        let and = native(json!({"and": [d, png]}));
        assert!(yes(&and, "/d/x.png") && !yes(&and, "/d/x.txt") && !yes(&and, "/e/x.png"));
        let or = native(json!({"or": [d, png]}));
        assert!(yes(&or, "/d/x.txt") && yes(&or, "/e/x.png") && !yes(&or, "/e/x.txt"));
        let not = native(json!({"not": png}));
        assert!(!yes(&not, "/d/x.png") && yes(&not, "/d/x.txt"));
        let any = native(json!({"any": [d, png]}));
        assert!(yes(&any, "/e/x.png") && !yes(&native(json!({"any": []})), "/x"));
        let all = native(json!({"all": [d, png]}));
        assert!(!yes(&all, "/e/x.png") && yes(&native(json!({"all": []})), "/x"));
    }

    #[test]
    fn globs_match_as_agents_exe() {
        assert!(glob(b"*.png", b"a.png"));
        assert!(glob(b"*", b""));
        assert!(!glob(b"*.png", b"a.png.txt"));
        assert!(glob(b"a*b*c", b"axxbyyc"));
        assert!(!glob(b"a?c", b"ac"));
        // A long pattern of stars stays quick.
        assert!(!glob(
            "*".repeat(10_000)
                .as_bytes()
                .iter()
                .chain(b"x")
                .copied()
                .collect::<Vec<_>>()
                .as_slice(),
            &[b'y'; 10_000]
        ));
    }

    #[test]
    fn lexical_takes_dots_away() {
        assert_eq!(lexical(Path::new("/a/./b/../c")), Path::new("/a/c"));
        assert_eq!(lexical(Path::new("/../..")), Path::new("/"));
    }

    #[test]
    fn a_denial_at_the_root_is_seen() {
        assert!(native(json!("alwaysDeny")).denies_all());
        assert!(native(json!({"any": []})).denies_all());
        assert!(native(json!({"and": ["alwaysAllow", "alwaysDeny"]})).denies_all());
        assert!(!native(json!({"directoryRecursive": "/d"})).denies_all());
    }

    #[test]
    fn agents_exe_sandboxes_convert() {
        let s: AgentsExeSandbox = serde_json::from_value(json!({
            "fsbName": "pics",
            "fsbMaxFileSize": 1000,
            "fsbPredicate": {"tag": "Any", "contents": [
                {"tag": "And", "contents": [
                    {"tag": "DirectoryRecursive", "contents": "./pics"},
                    {"tag": "Not", "contents": {"tag": "FileExtension", "contents": ["svg"]}}]},
                {"tag": "FileSizeLessThan", "contents": 5},
                {"tag": "AlwaysDeny"}]}}))
        .unwrap();
        let s = FileSandbox::from(s);
        assert_eq!(s.max_file_size, Some(1000));
        assert_eq!(
            s.predicate,
            native(json!({"any": [
                {"and": [{"directoryRecursive": "./pics"}, {"not": {"fileExtension": ["svg"]}}]},
                {"fileSizeLessThan": 5}, "alwaysDeny"]}))
        );
        for bad in [
            json!({}),
            json!({"fsbPredicate": {"tag": "PathPrefix", "contents": "/"}}),
            json!({"fsbPredicate": {"tag": "And", "contents": [{"tag": "AlwaysAllow"}]}}),
            json!({"fsbPredicate": {"tag": "FileSizeLessThan", "contents": "big"}}),
        ] {
            assert!(serde_json::from_value::<AgentsExeSandbox>(bad).is_err());
        }
    }
}
