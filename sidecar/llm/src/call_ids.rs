//! Tool-call ids as a provider takes them, and a turn's reasoning that
//! another provider made: what the Messages API, Bedrock's Converse and
//! the Responses API share.
//!
//! A conversation may have been begun with another provider, whose call ids
//! (`functions.find:1`, an id a model reused in a later turn) the next one
//! refuses; each id is mapped, the same way in the call and in its result,
//! and no two calls of a request share one.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use super::types::ChatMessage;

/// A provider's ids: letters, digits, `_` and `-`, at most `max` of them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule {
    pub max: usize,
    /// How much of a refused id is kept before its hash (the rest would
    /// not fit in `max`).
    pub keep: usize,
}

fn taken(rule: Rule, id: &str) -> bool {
    (1..=rule.max).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `id` as the provider takes it: itself when it is; otherwise its first
/// `keep` characters with the others `_`, and a hash of the whole. The
/// same id always maps the same; [`Ids`] makes a request's distinct.
pub(crate) fn wire_id(rule: Rule, id: &str) -> String {
    if taken(rule, id) {
        return id.to_owned();
    }
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    let kept: String = id
        .chars()
        .take(rule.keep)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{kept}_{:016x}", h.finish())
}

/// The ids a request gives the calls, each its own across the whole
/// conversation: [`wire_id`] of the call's, or, when another call has that
/// one already (an id that maps onto another's mapping, or a model that
/// reused an id in a later turn), the same cut to fit with `_2`, `_3`…. A
/// result answers the call of that id in the turn before it.
pub(crate) struct Ids {
    rule: Rule,
    used: HashSet<String>,
    turn: HashMap<String, String>,
}

impl Ids {
    pub(crate) fn new(rule: Rule) -> Ids {
        Ids {
            rule,
            used: HashSet::new(),
            turn: HashMap::new(),
        }
    }

    pub(crate) fn next_turn(&mut self) {
        self.turn.clear();
    }

    pub(crate) fn of_call(&mut self, id: &str) -> String {
        let first = wire_id(self.rule, id);
        let mut wire = first.clone();
        let mut n = 1u64;
        while !self.used.insert(wire.clone()) {
            n += 1;
            let suffix = format!("_{n}");
            // `first` is ASCII: any cut is at a character's boundary.
            let keep = first.len().min(self.rule.max.saturating_sub(suffix.len()));
            wire = format!("{}{suffix}", first.get(..keep).unwrap_or_default());
        }
        self.turn.insert(id.to_owned(), wire.clone());
        wire
    }

    pub(crate) fn of_result(&self, id: &str) -> String {
        self.turn
            .get(id)
            .cloned()
            .unwrap_or_else(|| wire_id(self.rule, id))
    }
}

/// Whether the request goes on with an assistant turn of tool calls made
/// without `provider`'s reasoning (by a fallback of another provider, or
/// another endpoint): with thinking on, Claude requires such a turn to
/// begin with its reasoning, which it never had, so the request asks for
/// none.
pub(crate) fn continues_a_turn_without_reasoning<'a>(
    history: impl IntoIterator<Item = &'a ChatMessage>,
    provider: &str,
) -> bool {
    let last = history
        .into_iter()
        .filter(|m| matches!(m, ChatMessage::Assistant { .. }))
        .last();
    matches!(
        last,
        Some(ChatMessage::Assistant { tool_calls, reasoning, .. })
            if !tool_calls.is_empty()
                && reasoning.as_ref().is_none_or(|r| r.provider != provider)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Rule = Rule { max: 64, keep: 40 };

    #[test]
    fn ids_are_kept_mapped_and_made_distinct_within_the_bound() {
        assert_eq!(wire_id(SHORT, "call_01"), "call_01");
        let mapped = wire_id(SHORT, "functions.find:1");
        assert!(taken(SHORT, &mapped), "{mapped}");
        assert_eq!(mapped, wire_id(SHORT, "functions.find:1"));
        let long = "x".repeat(200);
        assert!(taken(SHORT, &wire_id(SHORT, &long)));
        let mut ids = Ids::new(SHORT);
        let a = ids.of_call(&"y".repeat(64));
        ids.next_turn();
        let b = ids.of_call(&"y".repeat(64));
        assert_ne!(a, b);
        assert!(taken(SHORT, &b), "{b}");
        assert_eq!(ids.of_result(&"y".repeat(64)), b);
        assert_eq!(ids.of_result("unknown.id"), wire_id(SHORT, "unknown.id"));
    }
}
