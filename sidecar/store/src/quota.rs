//! A cap on the runs an end user has in progress at once, as the store
//! keeps it: a run's start is stored only if the user's running sessions
//! (others than this one) are fewer than the cap, read and written in one
//! transaction that every start of the same user takes its turn at, on
//! every server sharing the store.

/// At most `max` sessions of end user `subject` running at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunCap {
    pub subject: String,
    pub max: u32,
}

/// What a capped start did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Started {
    /// The start is stored: its events' seqs.
    Stored(Vec<i64>),
    /// The user had `running` sessions running already: nothing was written.
    Full { running: u64 },
}

impl RunCap {
    /// Whether `running` other runs leave room for one more.
    pub fn admits(&self, running: u64) -> bool {
        running < u64::from(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_admits_up_to_its_max_and_a_zero_cap_admits_none() {
        let cap = |max| RunCap {
            subject: "alice".into(),
            max,
        };
        assert!(cap(2).admits(0));
        assert!(cap(2).admits(1));
        assert!(!cap(2).admits(2));
        assert!(!cap(2).admits(7));
        assert!(!cap(0).admits(0));
    }
}
