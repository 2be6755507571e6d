//! How soon a failed reconcile is tried again.
//!
//! Most failures pass within seconds: an API server restarting, a write
//! conflict, an API server that does not yet map a CRD's kind after its
//! own restart (it refuses owner references to it for up to 30 s). So the
//! first retry comes soon and each next one later, up to a ceiling, per
//! object; a success forgets the count. Objects that fail together (every
//! tenant during an outage) spread their retries by a fraction of the delay
//! drawn from their names, so they do not all come back in the same instant.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

/// The first retry's delay.
pub const FIRST: Duration = Duration::from_millis(500);
/// The longest delay between two tries.
pub const CEILING: Duration = Duration::from_secs(30);

/// The delay before try `failures + 1` of an object that has failed
/// `failures` times in a row (at least once), before its spread.
pub fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(CEILING)
}

/// `delay` lengthened by up to a quarter, by `key`: the same key always
/// waits the same, two keys rarely alike.
pub fn spread(delay: Duration, key: &str) -> Duration {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    let quarter = delay / 4;
    delay + quarter.mul_f64((h.finish() % 1000) as f64 / 1000.0)
}

/// The failures in a row of each object (`namespace/name`) whose last
/// reconcile failed.
#[derive(Default)]
pub struct Retries {
    failures: Mutex<HashMap<String, u32>>,
}

impl Retries {
    /// Count a failure of `key`; the delay before its next try.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_owned()).or_default();
        *n = n.saturating_add(1);
        spread(delay(*n), key)
    }

    /// `key` reconciled: its next failure is a first one again.
    pub fn succeeded(&self, key: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(key);
    }

    /// How many objects are failing now.
    pub fn failing(&self) -> usize {
        self.failures.lock().map(|f| f.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_retry_is_soon_and_each_next_one_later_up_to_the_ceiling() {
        let delays: Vec<_> = (1..=8).map(delay).collect();
        assert_eq!(delays[0], FIRST);
        assert_eq!(delays[1], FIRST * 2);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]), "{delays:?}");
        assert_eq!(delays[7], CEILING);
        assert_eq!(delay(u32::MAX), CEILING);
        // Up to the apiserver's 30 s of not mapping a CRD after its
        // restart, the tries come at most 16 s apart.
        let by_30s: Duration = (1..=6).map(delay).sum();
        assert!(by_30s >= Duration::from_secs(30), "{by_30s:?}");
    }

    #[test]
    fn a_spread_is_at_most_a_quarter_and_the_same_for_the_same_key() {
        let d = Duration::from_secs(8);
        let keys = ["ns/acme", "ns/globex", "ns/initech", "other/acme"];
        let spread_out: Vec<_> = keys.iter().map(|k| spread(d, k)).collect();
        for s in &spread_out {
            assert!(*s >= d && *s <= d + d / 4, "{s:?}");
        }
        assert_eq!(spread(d, "ns/acme"), spread_out[0]);
        let distinct: std::collections::BTreeSet<_> = spread_out.iter().collect();
        assert!(distinct.len() > 1, "{spread_out:?}");
    }

    #[test]
    fn failures_count_per_object_and_a_success_forgets_them() {
        let r = Retries::default();
        let first = r.failed("ns/acme");
        let second = r.failed("ns/acme");
        assert!(second > first, "{first:?} then {second:?}");
        assert!(r.failed("ns/globex") < second);
        assert_eq!(r.failing(), 2);
        r.succeeded("ns/acme");
        assert_eq!(r.failing(), 1);
        assert!(r.failed("ns/acme") <= spread(FIRST, "ns/acme"));
    }
}
