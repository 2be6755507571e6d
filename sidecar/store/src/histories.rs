//! The histories a store read lately, decoded, so that reading a session
//! again reads only its row and the turns added since.
//!
//! A session's turns are never rewritten (a write appends the turns after
//! those the store holds), so turns read once stay true whoever writes
//! next: a kept history is a prefix of the session's, and a read or a
//! write extends it with the turns after it. A read or write that finds the kept turns
//! other than it expects (another server's or process's write came in
//! between) leaves them, or drops them; it never guesses.
//!
//! Bounded by [`Histories::new`]'s budget (what the turns hold: each its
//! message and its JSON text; plus a little per session), the least recently used going first; a session
//! with no turns is not kept (there is nothing to save), and
//! [`Histories::clear`] forgets them all.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bindery_llm::Turn;

/// What a kept session costs beyond its turns' text, about.
const PER_SESSION: usize = 256;

pub struct Histories {
    budget: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    kept: HashMap<String, Kept>,
    /// Use order: tick to session, oldest first.
    order: BTreeMap<u64, String>,
    tick: u64,
    bytes: usize,
}

struct Kept {
    /// The session's `created_at`: a session of the same id that is not
    /// this one (a database swapped under the store) is not extended.
    created_at: i64,
    turns: Vec<Turn>,
    bytes: usize,
    used: u64,
}

/// What keeping `turns` costs: each holds its message and its JSON text,
/// about the text's size each.
fn held(turns: &[Turn]) -> usize {
    turns.iter().map(|t| 2 * t.json().len()).sum()
}

impl Histories {
    /// Keep up to `budget` bytes of histories.
    pub fn new(budget: usize) -> Histories {
        Histories {
            budget,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many turns of session `id` are kept, if any.
    pub fn known(&self, id: &str) -> Option<usize> {
        self.lock().kept.get(id).map(|k| k.turns.len())
    }

    /// The first `from` turns of session `id` (created at `created_at`),
    /// if that many are kept.
    pub fn prefix(&self, id: &str, created_at: i64, from: usize) -> Option<Vec<Turn>> {
        let mut state = self.lock();
        let kept = state.kept.get(id)?;
        if kept.created_at != created_at || kept.turns.len() < from {
            return None;
        }
        let turns = kept.turns[..from].to_vec();
        state.touch(id);
        Some(turns)
    }

    /// Keep `turns`, the whole history of session `id` as just read.
    pub fn keep(&self, id: &str, created_at: i64, turns: &[Turn]) {
        let mut state = self.lock();
        state.forget(id);
        state.extend(self.budget, id, created_at, 0, turns);
    }

    /// Turns stored for session `id` after its first `at` (written or
    /// read): kept if its first `at` are, and only those.
    pub fn written(&self, id: &str, created_at: i64, at: usize, turns: &[Turn]) {
        let mut state = self.lock();
        if state.kept.contains_key(id) {
            state.extend(self.budget, id, created_at, at, turns);
        }
    }

    /// Forget session `id`'s history.
    pub fn forget(&self, id: &str) {
        self.lock().forget(id);
    }

    /// Forget every history.
    pub fn clear(&self) {
        *self.lock() = State::default();
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl State {
    /// Add `new` to session `id`'s kept turns if it holds exactly `at`
    /// (a new session when `at` is 0); then fit the budget, the least
    /// recently used going first.
    fn extend(&mut self, budget: usize, id: &str, created_at: i64, at: usize, new: &[Turn]) {
        self.tick += 1;
        let tick = self.tick;
        let bytes = held(new);
        match self.kept.get_mut(id) {
            Some(k) if k.created_at == created_at && k.turns.len() == at => {
                k.turns.extend_from_slice(new);
                k.bytes += bytes;
                self.bytes += bytes;
                self.order.remove(&k.used);
                k.used = tick;
                self.order.insert(tick, id.to_owned());
            }
            Some(_) => {
                // Not the prefix this write or read extends: unknown now.
                self.forget(id);
                return;
            }
            None if at == 0 && !new.is_empty() => {
                let bytes = PER_SESSION + bytes;
                self.kept.insert(
                    id.to_owned(),
                    Kept {
                        created_at,
                        turns: new.to_vec(),
                        bytes,
                        used: tick,
                    },
                );
                self.order.insert(tick, id.to_owned());
                self.bytes += bytes;
            }
            None => return,
        }
        while self.bytes > budget {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(k) = self.kept.remove(&oldest) {
                self.bytes -= k.bytes;
            }
        }
    }

    fn touch(&mut self, id: &str) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(k) = self.kept.get_mut(id) {
            self.order.remove(&k.used);
            k.used = tick;
            self.order.insert(tick, id.to_owned());
        }
    }

    fn forget(&mut self, id: &str) {
        if let Some(k) = self.kept.remove(id) {
            self.order.remove(&k.used);
            self.bytes -= k.bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_llm::ChatMessage;

    fn turns(n: usize) -> Vec<Turn> {
        (0..n)
            .map(|i| Turn::new(ChatMessage::user(format!("turn {i}"))))
            .collect()
    }

    #[test]
    fn a_kept_history_is_extended_by_what_comes_after_it_and_only_that() {
        let h = Histories::new(1 << 20);
        let all = turns(5);
        h.keep("s", 1, &all[..2]);
        assert_eq!(h.known("s"), Some(2));
        // A write after the second turn extends it…
        h.written("s", 1, 2, &all[2..3]);
        assert_eq!(h.known("s"), Some(3));
        // …as does a read of the rest after it.
        assert_eq!(h.prefix("s", 1, 3).as_deref(), Some(&all[..3]));
        h.written("s", 1, 3, &all[3..]);
        assert_eq!(h.known("s"), Some(5));
        // Fewer than are kept read as kept.
        assert_eq!(h.prefix("s", 1, 4).as_deref(), Some(&all[..4]));
        assert_eq!(h.prefix("s", 1, 5).unwrap(), all);
    }

    #[test]
    fn what_does_not_follow_the_kept_turns_is_not_guessed_at() {
        let h = Histories::new(1 << 20);
        let all = turns(4);
        h.keep("s", 1, &all[..2]);
        // A write from a count that is not the kept one: forgotten.
        h.written("s", 1, 3, &all[3..]);
        assert_eq!(h.known("s"), None);
        // Of another session of the same id: not extended, not read.
        h.keep("s", 1, &all[..2]);
        assert!(h.prefix("s", 2, 2).is_none());
        h.written("s", 2, 2, &all[2..]);
        assert_eq!(h.known("s"), None);
        // More asked for than is kept: the whole history is to be read.
        h.keep("s", 1, &all[..2]);
        assert!(h.prefix("s", 1, 3).is_none());
        // A write to a session not kept keeps nothing; nor does an empty one.
        h.written("t", 1, 0, &all);
        h.keep("u", 1, &[]);
        assert_eq!((h.known("t"), h.known("u")), (None, None));
    }

    #[test]
    fn the_least_recently_used_go_past_the_budget() {
        let all = turns(3);
        let one = PER_SESSION + held(&all);
        let h = Histories::new(2 * one);
        h.keep("a", 1, &all);
        h.keep("b", 1, &all);
        assert!(h.prefix("a", 1, 3).is_some());
        h.keep("c", 1, &all);
        assert_eq!(h.known("b"), None, "the least recently used went");
        assert_eq!((h.known("a"), h.known("c")), (Some(3), Some(3)));
        assert_eq!(h.bytes(), 2 * one);
        h.clear();
        assert_eq!((h.known("a"), h.bytes()), (None, 0));
        // One history larger than the whole budget is not kept.
        let big = Histories::new(one - 1);
        big.keep("a", 1, &all);
        assert_eq!((big.known("a"), big.bytes()), (None, 0));
    }
}
