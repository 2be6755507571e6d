//! What the store's operations say of it, as they happen: a server whose
//! store is out is not ready at once, not a heartbeat later, and ready
//! again with the first operation that succeeds; a damaged store keeps it
//! not ready until it is repaired and the server restarted.

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
    /// Note an operation's outcome (`None`: it succeeded, or failed for a
    /// reason of its own, such as a conflict).
    pub fn saw(&self, error: Option<&StoreError>) {
        let now = match error {
            Some(StoreError::Corrupt(_)) => CORRUPT,
            Some(StoreError::Unavailable(_)) => UNAVAILABLE,
            _ => ANSWERING,
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
        h.saw(Some(&StoreError::Unavailable("down".into())));
        assert_eq!(h.state(), StoreState::Unavailable);
        h.saw(Some(&StoreError::NotFound("s".into())));
        assert_eq!(h.state(), StoreState::Answering);
        h.saw(Some(&StoreError::Corrupt("page 7".into())));
        h.saw(None);
        h.saw(Some(&StoreError::Unavailable("down".into())));
        assert_eq!(h.state(), StoreState::Corrupt);
    }
}
