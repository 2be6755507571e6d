//! What time it is and what no one can guess: the two things every part of
//! a session reads, kept in a leaf module so that none of them has to
//! import the service for them.
//!
//! The service reads the time through a [`Clock`] it is given: the wall
//! clock when it serves, tokio's clock in the tests that drive it in
//! process, so that `tokio::time::pause` and `advance` move leases,
//! heartbeats, TTLs and `confirmTtl` together with the timers that wait on
//! them. Durations it measures in memory (how long a session was idle,
//! when a peer's heartbeat was read) are `tokio::time::Instant`s, which
//! follow the same paused clock.

use std::fmt;

/// The time of day, as the session service reads it.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Milliseconds since the Unix epoch: what the store's timestamps,
    /// leases, heartbeats, TTLs and budgets' windows count.
    fn now_ms(&self) -> i64;
}

/// This machine's clock ([`now_ms`]): what a server runs on, since other
/// replicas compare its heartbeats and leases with their own wall clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// The wall time when it was made, moved on by tokio's clock since: under
/// `tokio::time::pause` it stands still until the test advances it (or the
/// runtime, idle, jumps to its next timer).
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    start_ms: i64,
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> TokioClock {
        TokioClock {
            start_ms: now_ms(),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> i64 {
        let since = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.start_ms.saturating_add(since)
    }
}

/// Milliseconds since the Unix epoch, by this machine's clock (0 for a
/// clock before 1970, saturating far in the future).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A key of this process's own (one server, no replica to agree with), or
/// an id no one can guess: 256 bits from the OS.
pub fn random_key() -> [u8; 32] {
    match bindery_params::random::bytes("the continuation key") {
        Ok(key) => key,
        // Without randomness the tokens would be guessable: refuse to run.
        Err(e) => panic!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_moves_only_with_tokios_time() {
        let clock = TokioClock::new();
        let t0 = clock.now_ms();
        assert!((t0 - now_ms()).abs() < 60_000, "it starts at the wall time");
        assert_eq!(clock.now_ms(), t0, "paused, it stands still");
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(clock.now_ms(), t0 + 90_000);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(clock.now_ms(), t0 + 90_250);
    }
}
