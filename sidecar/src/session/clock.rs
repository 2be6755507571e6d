//! What time it is and what no one can guess: the two things every part of
//! a session reads, kept in a leaf module so that none of them has to
//! import the service for them.

/// Milliseconds since the Unix epoch, by this machine's clock: what the
/// store's timestamps, leases, heartbeats, TTLs and budgets' windows count
/// (0 for a clock before 1970, saturating far in the future).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A key of this process's own (one server, no replica to agree with), or
/// an id no one can guess: 256 bits from the OS.
pub fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    if getrandom::fill(&mut key).is_err() {
        // Without randomness the tokens would be guessable: refuse to run.
        panic!("no randomness for the continuation key");
    }
    key
}
