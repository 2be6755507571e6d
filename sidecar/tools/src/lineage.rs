//! The calling session's fork lineage, as `list-sessions` and
//! `search-sessions` see it: itself, the sessions it was forked from and
//! the sessions forked from it, transitively. Never another session:
//! other sessions of the same server may be other people's.
//!
//! The tools layer knows no store: a run hands its tools a
//! [`SessionLineage`] (the session layer's, over the store, bound to the
//! calling session) in the [`super::CallContext`]. What decides which
//! sessions are in scope ([`in_scope`]) and what a search matches
//! ([`search_session`]) is pure and lives here.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use async_trait::async_trait;

use bindery_llm::{ChatMessage, Turn};
use bindery_spec::SessionScope;

/// The most sessions a lineage is read with (its newest first): a
/// lineage past it is answered in part.
pub const LINEAGE_MAX: usize = 1000;

/// The most bytes of turns one search reads, over all the sessions it
/// looks in; past it the answer says it is not complete.
pub const SEARCH_BYTES: usize = 8 << 20;

/// The longest query a search takes (characters), and the most words of it.
pub const QUERY_CHARS: usize = 500;
pub const QUERY_TERMS: usize = 16;

/// Characters of context an excerpt keeps on each side of a match.
pub const EXCERPT_SIDE: usize = 100;

/// A session as its row says, without its conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kin {
    pub id: String,
    pub forked_from: Option<String>,
    pub agent: String,
    pub status: String,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    pub updated_at: i64,
    pub turns: usize,
}

/// How a session of the lineage stands to the calling one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    Current,
    /// One it was forked from (transitively).
    Ancestor,
    /// One forked from it (transitively).
    Descendant,
}

/// The sessions of `kin` that are of `caller`'s lineage and within
/// `scope`, in `kin`'s order, each with how it stands to `caller`. A
/// session of `kin` that is not of the lineage (another fork of an
/// ancestor, an unrelated session) is never kept, whatever the scope.
pub fn in_scope(kin: Vec<Kin>, caller: &str, scope: SessionScope) -> Vec<(Kin, Relation)> {
    let parent: BTreeMap<&str, &str> = kin
        .iter()
        .filter_map(|k| Some((k.id.as_str(), k.forked_from.as_deref()?)))
        .collect();
    // Ancestors: up the chain (a cycle, which only ids made anew could
    // make, stops where it comes back).
    let mut ancestors = BTreeSet::new();
    let mut at = caller;
    while let Some(&p) = parent.get(at) {
        if p == caller || !ancestors.insert(p) {
            break;
        }
        at = p;
    }
    // Descendants: down from the caller, breadth first.
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (&child, &p) in &parent {
        children.entry(p).or_default().push(child);
    }
    let mut descendants = BTreeSet::new();
    let mut queue = vec![caller];
    while let Some(id) = queue.pop() {
        for &c in children.get(id).into_iter().flatten() {
            if c != caller && descendants.insert(c) {
                queue.push(c);
            }
        }
    }
    let relation = |id: &str| {
        if id == caller {
            Some(Relation::Current)
        } else if ancestors.contains(id) {
            Some(Relation::Ancestor)
        } else if descendants.contains(id) {
            Some(Relation::Descendant)
        } else {
            None
        }
    };
    let wanted = |r: Relation| match scope {
        SessionScope::ParentsOnly => r == Relation::Ancestor,
        SessionScope::ChildrenOnly => r == Relation::Descendant,
        SessionScope::Subtree | SessionScope::All => true,
    };
    let kept: Vec<(String, Relation)> = kin
        .iter()
        .filter_map(|k| {
            relation(&k.id)
                .filter(|r| wanted(*r))
                .map(|r| (k.id.clone(), r))
        })
        .collect();
    let mut by_id: BTreeMap<String, Kin> = kin.into_iter().map(|k| (k.id.clone(), k)).collect();
    kept.into_iter()
        .filter_map(|(id, r)| by_id.remove(&id).map(|k| (k, r)))
        .collect()
}

/// The words of `query`, lower-cased, each once: at most [`QUERY_TERMS`]
/// of its first [`QUERY_CHARS`] characters.
pub fn terms(query: &str) -> Vec<String> {
    let cut: String = query.chars().take(QUERY_CHARS).collect();
    let mut out: Vec<String> = Vec::new();
    for w in cut.split_whitespace().map(str::to_lowercase) {
        if !out.contains(&w) {
            out.push(w);
        }
        if out.len() == QUERY_TERMS {
            break;
        }
    }
    out
}

/// The text of a turn a search looks in, and its role: what the user and
/// the model said, and a tool's output when `tool_outputs`. Not the
/// system prompt (every session of an agent shares it).
pub fn searched_text(
    msg: &ChatMessage,
    tool_outputs: bool,
) -> Option<(&'static str, Cow<'_, str>)> {
    match msg {
        ChatMessage::User { content } => Some(("user", content.text())),
        ChatMessage::Assistant {
            content: Some(t), ..
        } => Some(("assistant", Cow::Borrowed(t.as_str()))),
        ChatMessage::Tool { content, .. } if tool_outputs => Some(("tool", content.text())),
        _ => None,
    }
}

/// Where in `text` (a byte offset) `term` (lower case) first occurs,
/// compared case-insensitively.
fn find_ci(text: &str, term: &str) -> Option<usize> {
    let lower = text.to_lowercase();
    let p = lower.find(term)?;
    // Lower-casing may change a character's length: walk to the offset.
    let mut seen = 0;
    for (i, c) in text.char_indices() {
        if seen >= p {
            return Some(i);
        }
        seen += c.to_lowercase().map(char::len_utf8).sum::<usize>();
    }
    Some(text.len())
}

/// [`EXCERPT_SIDE`] characters either side of byte `at` of `text`, with
/// `…` where it was cut.
fn excerpt(text: &str, at: usize) -> String {
    let before: Vec<char> = text[..at].chars().rev().take(EXCERPT_SIDE + 1).collect();
    let after: Vec<char> = text[at..].chars().take(EXCERPT_SIDE + 1).collect();
    let mut out = String::new();
    if before.len() > EXCERPT_SIDE {
        out.push('…');
    }
    out.extend(before.iter().take(EXCERPT_SIDE).rev());
    out.extend(after.iter().take(EXCERPT_SIDE));
    if after.len() > EXCERPT_SIDE {
        out.push('…');
    }
    out
}

/// Where a session matched a search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// The turn's index in the session (0: its first).
    pub turn: usize,
    pub role: &'static str,
    pub excerpt: String,
}

/// The newest turn of `turns` whose text holds one of `terms` (agents-exe
/// matches a session holding any word of the query), with an excerpt
/// around it; and how many bytes of turns were read.
pub fn search_session(
    turns: &[Turn],
    terms: &[String],
    tool_outputs: bool,
) -> (Option<Match>, usize) {
    let mut read = 0;
    for (i, turn) in turns.iter().enumerate().rev() {
        let Some((role, text)) = searched_text(turn.message(), tool_outputs) else {
            continue;
        };
        read += text.len();
        if let Some(at) = terms.iter().filter_map(|t| find_ci(&text, t)).min() {
            return (
                Some(Match {
                    turn: i,
                    role,
                    excerpt: excerpt(&text, at),
                }),
                read,
            );
        }
    }
    (None, read)
}

/// A session a search matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    pub session: Kin,
    pub relation: Relation,
    pub found: Match,
}

/// What `list-sessions` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// Newest first, at most the limit asked.
    pub sessions: Vec<(Kin, Relation)>,
    /// How many the scope holds in all.
    pub total: usize,
}

/// What `search-sessions` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Newest session first, at most the limit asked.
    pub hits: Vec<Hit>,
    /// How many sessions matched among those read.
    pub total: usize,
    /// Whether every session of the scope was read (not when
    /// [`SEARCH_BYTES`] ran out first).
    pub complete: bool,
}

/// The lineage could not be read (its store failed). The text is what the
/// model is told; the log says why (a store's message may name files and
/// hosts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the session store could not be read; try again later")]
pub struct LineageUnreadable;

impl From<LineageUnreadable> for crate::ToolError {
    fn from(e: LineageUnreadable) -> Self {
        crate::ToolError::Failed(e.to_string())
    }
}

/// The lineage of one session (the run's): what `list-sessions` and
/// `search-sessions` read. It knows which session it speaks for, so a
/// tool cannot ask it about another.
#[async_trait]
pub trait SessionLineage: Send + Sync + fmt::Debug {
    /// The sessions of the lineage within `scope`, newest first.
    async fn list(&self, scope: SessionScope, limit: usize) -> Result<Listing, LineageUnreadable>;
    /// The sessions of the lineage within `scope` whose turns hold a word
    /// of `query` (case-insensitive), newest first; tools' outputs are
    /// searched when `tool_outputs`.
    async fn search(
        &self,
        scope: SessionScope,
        query: &str,
        limit: usize,
        tool_outputs: bool,
    ) -> Result<Found, LineageUnreadable>;
    /// Session `id` with its turns, if it is of the lineage within
    /// `scope`; `None` otherwise, whether or not a session `id` exists
    /// elsewhere (the answer does not tell).
    async fn read(&self, scope: SessionScope, id: &str) -> Result<Option<Read>, LineageUnreadable>;
}

/// A session of the lineage, read whole.
#[derive(Clone, Debug, PartialEq)]
pub struct Read {
    pub session: Kin,
    pub relation: Relation,
    pub turns: Vec<Turn>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kin(id: &str, from: Option<&str>) -> Kin {
        Kin {
            id: id.into(),
            forked_from: from.map(Into::into),
            agent: "a".into(),
            status: "idle".into(),
            created_at: 0,
            updated_at: 0,
            turns: 0,
        }
    }

    /// root ── a ── me ── c1 ── g1
    ///   │          └──── c2
    ///   └── sibling-of-a      a ── aunt (another fork of my parent)
    /// and an unrelated session, and one whose parent is gone.
    fn family() -> Vec<Kin> {
        vec![
            kin("root", None),
            kin("a", Some("root")),
            kin("sibling-of-a", Some("root")),
            kin("aunt", Some("a")),
            kin("me", Some("a")),
            kin("c1", Some("me")),
            kin("c2", Some("me")),
            kin("g1", Some("c1")),
            kin("stranger", None),
            kin("orphan", Some("gone")),
        ]
    }

    fn ids(scope: SessionScope) -> Vec<(String, Relation)> {
        in_scope(family(), "me", scope)
            .into_iter()
            .map(|(k, r)| (k.id, r))
            .collect()
    }

    fn pairs(list: &[(&str, Relation)]) -> Vec<(String, Relation)> {
        list.iter().map(|(i, r)| (i.to_string(), *r)).collect()
    }

    #[test]
    fn each_scope_keeps_its_part_of_the_lineage_and_nothing_else() {
        use Relation::*;
        let lineage = [
            ("root", Ancestor),
            ("a", Ancestor),
            ("me", Current),
            ("c1", Descendant),
            ("c2", Descendant),
            ("g1", Descendant),
        ];
        assert_eq!(ids(SessionScope::Subtree), pairs(&lineage));
        // `all` never widens past the lineage: no sibling, aunt, stranger.
        assert_eq!(ids(SessionScope::All), pairs(&lineage));
        assert_eq!(
            ids(SessionScope::ParentsOnly),
            pairs(&[("root", Ancestor), ("a", Ancestor)])
        );
        assert_eq!(
            ids(SessionScope::ChildrenOnly),
            pairs(&[("c1", Descendant), ("c2", Descendant), ("g1", Descendant)])
        );
    }

    #[test]
    fn a_session_alone_has_only_itself_and_cycles_end() {
        assert_eq!(in_scope(family(), "stranger", SessionScope::All).len(), 1);
        assert!(in_scope(family(), "stranger", SessionScope::ParentsOnly).is_empty());
        // An id not in the list: nothing at all.
        assert!(in_scope(family(), "nobody", SessionScope::All).is_empty());
        // Ids made anew could in principle close a loop: it ends.
        let looped = vec![
            kin("x", Some("y")),
            kin("y", Some("x")),
            kin("z", Some("y")),
        ];
        let got: Vec<_> = in_scope(looped, "x", SessionScope::All)
            .into_iter()
            .map(|(k, r)| (k.id, r))
            .collect();
        assert_eq!(
            got,
            pairs(&[
                ("x", Relation::Current),
                ("y", Relation::Ancestor),
                ("z", Relation::Descendant)
            ])
        );
    }

    #[test]
    fn terms_are_bounded_lower_case_words() {
        assert_eq!(
            terms("  Revert  restore REVERT "),
            vec!["revert", "restore"]
        );
        let many = (0..100)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(terms(&many).len(), QUERY_TERMS);
        assert!(terms(&"x".repeat(10_000))[0].len() <= QUERY_CHARS);
        assert!(terms("   ").is_empty());
    }

    #[test]
    fn a_search_finds_the_newest_matching_turn_case_insensitively() {
        let turns: Vec<Turn> = vec![
            ChatMessage::user("the Invoice is LATE").into(),
            ChatMessage::assistant("noted").into(),
            ChatMessage::tool_result("c1", "late fee: TOOL-ONLY").into(),
            ChatMessage::user("İstanbul office: invoice again").into(),
        ];
        let (m, read) = search_session(&turns, &terms("INVOICE"), false);
        let m = m.unwrap();
        assert_eq!((m.turn, m.role), (3, "user"));
        assert_eq!(m.excerpt, "İstanbul office: invoice again");
        assert!(read > 0);
        // Tool outputs only when asked.
        assert_eq!(search_session(&turns, &terms("tool-only"), false).0, None);
        let (m, _) = search_session(&turns, &terms("tool-only"), true);
        assert_eq!(m.unwrap().role, "tool");
        assert_eq!(search_session(&turns, &terms("absent"), true).0, None);
    }

    #[test]
    fn an_excerpt_keeps_the_context_around_the_match() {
        let text = format!("{}NEEDLE{}", "a".repeat(300), "é".repeat(300));
        let at = find_ci(&text, "needle").unwrap();
        let e = excerpt(&text, at);
        assert!(e.starts_with('…') && e.ends_with('…'), "{e}");
        assert_eq!(e.chars().count(), 2 * EXCERPT_SIDE + 2);
        assert!(e.contains("NEEDLE"));
        assert_eq!(excerpt("short needle", 6), "short needle");
    }
}
