//! A string that refuses to be shown.
//!
//! `SecretString` is how Bindery holds every secret parameter value. Its
//! `Debug`, `Display` and `Serialize` all print `<secret>`; the only way to
//! the text is [`SecretString::expose`], which is greppable and used only
//! where the value really leaves the process on purpose (a tool's
//! environment, an HTTP header). It deliberately implements neither
//! `Deserialize` nor `Clone`-into-`String` conversions.

use std::fmt;

/// What a secret prints as, everywhere.
pub const REDACTED: &str = "<secret>";

/// Whether `a` and `b` are equal, in a time that depends on their lengths
/// only: a credential compared byte by byte until the first difference
/// would tell a guesser how much of it was right. The comparison is
/// `subtle`'s (dalek's, written against the optimiser turning it back
/// into an early exit), not a hand-written fold.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(Box<str>);

impl SecretString {
    pub fn new(value: impl Into<String>) -> Self {
        SecretString(value.into().into_boxed_str())
    }

    /// The value itself. Call only where the value is handed to its
    /// intended consumer (a tool's environment, a request header).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl serde::Serialize for SecretString {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_compare_equal_and_any_difference_or_length_does_not() {
        assert!(constant_time_eq(b"token-1", b"token-1"));
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"token-1", b"token-2"));
        assert!(!constant_time_eq(b"token", b"token-1"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn never_prints_its_value() {
        let s = SecretString::new("canary-7f3a9c");
        assert_eq!(format!("{s}"), REDACTED);
        assert_eq!(format!("{s:?}"), REDACTED);
        assert_eq!(
            format!("{:#?}", Some(&s)),
            format!("Some(\n    {REDACTED},\n)")
        );
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"<secret>\"");
        assert_eq!(s.expose(), "canary-7f3a9c");
    }
}
