//! Which live sessions to evict when there are more than
//! `--max-live-sessions`: the least recently used of those nothing is
//! working on.
//!
//! Eviction forgets a session's secret values, as a restart does; a session
//! with a run in progress, an open event stream or a request in flight is
//! busy and never chosen, so nothing it is doing loses a value half-way.
//! When every session over the limit is busy, none is evicted: the count
//! stays above the limit until they are done.

/// One live session, as the choice sees it: `T` is whatever orders the
/// times of use (an instant of the service's clock; numbers in tests).
#[derive(Clone, Copy, Debug)]
pub struct Entry<K, T> {
    pub key: K,
    /// When its secrets were last set or used, or a run ended.
    pub used: T,
    pub busy: bool,
}

/// The keys of the `excess` least recently used entries that are not busy,
/// oldest first (fewer when not enough are idle).
pub fn victims<K, T: Ord + Copy>(
    entries: impl IntoIterator<Item = Entry<K, T>>,
    excess: usize,
) -> Vec<K> {
    if excess == 0 {
        return Vec::new();
    }
    let mut idle: Vec<(T, K)> = entries
        .into_iter()
        .filter(|e| !e.busy)
        .map(|e| (e.used, e.key))
        .collect();
    if idle.len() > excess {
        // Only the oldest `excess` need to be in order.
        idle.select_nth_unstable_by_key(excess - 1, |(used, _)| *used);
        idle.truncate(excess);
    }
    idle.sort_by_key(|(used, _)| *used);
    idle.into_iter().map(|(_, k)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(spec: &[(&'static str, u64, bool)]) -> Vec<Entry<&'static str, u64>> {
        spec.iter()
            .map(|&(key, used, busy)| Entry { key, used, busy })
            .collect()
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let e = entries(&[("b", 20, false), ("a", 10, false), ("c", 30, false)]);
        assert_eq!(victims(e.clone(), 1), vec!["a"]);
        assert_eq!(victims(e.clone(), 2), vec!["a", "b"]);
        assert_eq!(victims(e, 0), Vec::<&str>::new());
    }

    #[test]
    fn busy_sessions_are_never_chosen() {
        let e = entries(&[("running", 1, true), ("old", 5, false), ("new", 9, false)]);
        assert_eq!(victims(e.clone(), 1), vec!["old"]);
        assert_eq!(victims(e, 3), vec!["old", "new"]);
        let all_busy = entries(&[("x", 1, true), ("y", 2, true)]);
        assert!(victims(all_busy, 1).is_empty());
    }

    #[test]
    fn nothing_live_has_no_victim() {
        assert!(victims(entries(&[]), 3).is_empty());
    }

    #[test]
    fn an_excess_as_large_as_the_idle_ones_takes_them_all_oldest_first() {
        let e = entries(&[("c", 30, false), ("a", 10, false), ("b", 20, false)]);
        assert_eq!(victims(e.clone(), 3), vec!["a", "b", "c"]);
        assert_eq!(victims(e, 10), vec!["a", "b", "c"]);
    }

    #[test]
    fn the_oldest_come_first_whatever_order_they_are_given_in() {
        let keys: Vec<&'static str> =
            vec!["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"];
        // Used at 90, 80, …, 0, with every third one busy.
        let spec: Vec<(&'static str, u64, bool)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, 90 - 10 * i as u64, i % 3 == 0))
            .collect();
        assert_eq!(victims(entries(&spec), 4), vec!["k8", "k7", "k5", "k4"]);
    }
}
