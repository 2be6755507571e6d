//! The agent server's one source of randomness: tokens, keys and nonces,
//! all from the operating system (`getrandom`). A failure is an error the
//! caller names, never a weaker fallback: a guessable token is worse than
//! none.

/// The operating system gave no random bytes.
#[derive(Debug, thiserror::Error)]
#[error("the operating system gave no randomness for {what}: {reason}")]
pub struct NoRandomness {
    /// What the bytes were for ("a session token").
    pub what: &'static str,
    reason: getrandom::Error,
}

/// `N` random bytes for `what` (named in the error).
pub fn bytes<const N: usize>(what: &'static str) -> Result<[u8; N], NoRandomness> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|reason| NoRandomness { what, reason })?;
    Ok(out)
}

/// `N` random bytes for `what`, as lower-case hex.
pub fn hex<const N: usize>(what: &'static str) -> Result<String, NoRandomness> {
    bytes::<N>(what).map(hex::encode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_draw_is_fresh_and_of_its_length() {
        let a = bytes::<32>("a test").unwrap();
        let b = bytes::<32>("a test").unwrap();
        assert_ne!(a, b);
        let h = hex::<16>("a test").unwrap();
        assert_eq!(h.len(), 32);
        assert!(h
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
}
