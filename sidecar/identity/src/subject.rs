//! A subject: the identity provider's id of a person, as Bindery keeps it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest subject kept: OIDC says `sub` is at most 255 ASCII
/// characters.
pub const MAX_LEN: usize = 255;

/// Who an end user is: the `sub` (or the configured claim) of their
/// identity token. An id, never a credential: it is stored on sessions and
/// usage rows, shown in events, logs and spans.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Subject(String);

/// Why a text is no subject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSubject {
    #[error("a subject is never empty")]
    Empty,
    #[error("a subject is at most {MAX_LEN} bytes (this one has {0})")]
    TooLong(usize),
    #[error("a subject holds no control characters")]
    Control,
    #[error("a subject holds no bidirectional formatting characters (they make a log line or a view read otherwise than it is)")]
    Bidi,
}

/// Characters that reorder the text around them when shown (Unicode's
/// bidirectional formatting characters): in an id they only serve to make
/// a log line, a view or an audit record read as something else.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

impl Subject {
    pub fn new(text: impl Into<String>) -> Result<Subject, BadSubject> {
        let text = text.into();
        if text.is_empty() {
            return Err(BadSubject::Empty);
        }
        if text.len() > MAX_LEN {
            return Err(BadSubject::TooLong(text.len()));
        }
        if text.chars().any(char::is_control) {
            return Err(BadSubject::Control);
        }
        if text.chars().any(is_bidi_control) {
            return Err(BadSubject::Bidi);
        }
        Ok(Subject(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Subject {
    type Error = BadSubject;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Subject::new(s)
    }
}

impl From<Subject> for String {
    fn from(s: Subject) -> String {
        s.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_is_a_short_printable_id() {
        assert_eq!(Subject::new("alice").unwrap().as_str(), "alice");
        assert_eq!(Subject::new(""), Err(BadSubject::Empty));
        assert_eq!(Subject::new("a\nb"), Err(BadSubject::Control));
        assert_eq!(Subject::new("x".repeat(256)), Err(BadSubject::TooLong(256)));
        for c in ['\u{202E}', '\u{2066}', '\u{200F}', '\u{061C}'] {
            assert_eq!(
                Subject::new(format!("bob{c}eci")),
                Err(BadSubject::Bidi),
                "{c:?}"
            );
        }
        // Other scripts are ids like any.
        assert!(Subject::new("ユーザー-7").is_ok());
        assert!(Subject::new("x\" subject=\"bob").is_ok());
        let back: Subject = serde_json::from_str("\"bob\"").unwrap();
        assert_eq!(back.as_str(), "bob");
        assert!(serde_json::from_str::<Subject>("\"\"").is_err());
    }
}
