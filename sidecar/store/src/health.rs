//! What the store's operations say of it, as they happen: a server whose
//! store is out is not ready at once, not a heartbeat later, and ready
//! again with the first operation that writes and is answered (a read
//! answered through another process's write lock says nothing of writes;
//! the heartbeat writes, so readiness comes back within one); a damaged
//! store keeps it not ready until it is repaired and the server restarted.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::StoreError;

/// The store as its operations found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreState {
    Answering,
    /// The last operation found it out (see [`StoreError::Unavailable`]).
    Unavailable,
    /// An operation found it damaged (see [`StoreError::Corrupt`]).
    Corrupt,
}

#[derive(Debug, Default)]
pub struct Health(AtomicU8);

const ANSWERING: u8 = 0;
const UNAVAILABLE: u8 = 1;
const CORRUPT: u8 = 2;

impl Health {
    /// Note the outcome of the operation named `op` (as
    /// [`Timed`](crate::timed::Timed) names it; `None`: it succeeded, or
    /// failed for a reason of its own, such as a conflict).
    pub fn saw(&self, op: &str, error: Option<&StoreError>) {
        let now = match error {
            Some(StoreError::Corrupt(_)) => CORRUPT,
            Some(StoreError::Unavailable(_)) => UNAVAILABLE,
            _ if crate::timed::writes(op) => ANSWERING,
            // A read answered mends no outage.
            _ => return,
        };
        // Corruption stays: an answer from an undamaged page mends nothing.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |was| {
                (was != CORRUPT).then_some(now)
            });
    }

    pub fn state(&self) -> StoreState {
        match self.0.load(Ordering::Relaxed) {
            ANSWERING => StoreState::Answering,
            UNAVAILABLE => StoreState::Unavailable,
            _ => StoreState::Corrupt,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_comes_and_goes_and_corruption_stays() {
        let h = Health::default();
        assert_eq!(h.state(), StoreState::Answering);
        h.saw("get", Some(&StoreError::Unavailable("down".into())));
        assert_eq!(h.state(), StoreState::Unavailable);
        h.saw("update", Some(&StoreError::NotFound("s".into())));
        assert_eq!(h.state(), StoreState::Answering);
        h.saw("beat", Some(&StoreError::Corrupt("page 7".into())));
        h.saw("beat", None);
        h.saw("get", Some(&StoreError::Unavailable("down".into())));
        assert_eq!(h.state(), StoreState::Corrupt);
    }

    /// Reads go on through another process's write lock: only a write
    /// answered ends an outage.
    #[test]
    fn only_a_write_answered_ends_an_outage() {
        let h = Health::default();
        h.saw("create", Some(&StoreError::Unavailable("locked".into())));
        h.saw("list", None);
        h.saw("get", Some(&StoreError::NotFound("s".into())));
        h.saw("release_memory", None);
        assert_eq!(h.state(), StoreState::Unavailable);
        h.saw("beat", None);
        assert_eq!(h.state(), StoreState::Answering);
    }
}
