//! Why a file that holds secrets does not read, without what it holds.
//! serde's messages quote the input (`invalid type: string "sk-…",
//! expected a map`, `unknown field `sk-…``): for an API-keys file or a
//! params file that would print the very value the file keeps. A
//! [`ShapeError`] keeps the place, what kind of problem it is, and what
//! was expected (which comes from the schema, never from the input).

use std::fmt;

/// A secret-bearing file's parse error: its place and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError {
    /// 1-based; 0 when the parser gave no place.
    pub line: usize,
    pub column: usize,
    /// `not valid JSON`, `not valid YAML`, or `not the expected shape`.
    pub problem: &'static str,
    /// What the schema wanted there (`expected struct Entry`), if serde said.
    pub expected: Option<String>,
}

/// The `expected …` part of a serde message (up to ` at line`): it names
/// the schema's types and fields, not the input.
fn expected_of(message: &str) -> Option<String> {
    let start = message.find("expected ")?;
    let tail = &message[start..];
    let end = tail.find(" at line").unwrap_or(tail.len());
    let expected = &tail[..end];
    // Never a quoted piece of input, whatever the message's form.
    (!expected.contains('"')).then(|| expected.to_string())
}

impl ShapeError {
    pub fn json(e: &serde_json::Error) -> ShapeError {
        use serde_json::error::Category;
        ShapeError {
            line: e.line(),
            column: e.column(),
            problem: match e.classify() {
                Category::Data => "not the expected shape",
                Category::Syntax | Category::Eof | Category::Io => "not valid JSON",
            },
            expected: match e.classify() {
                Category::Data => expected_of(&e.to_string()),
                _ => None,
            },
        }
    }

    pub fn yaml(e: &serde_yaml::Error) -> ShapeError {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        let message = e.to_string();
        let data = message.starts_with("invalid ")
            || message.starts_with("unknown ")
            || message.starts_with("missing ");
        ShapeError {
            line,
            column,
            problem: if data {
                "not the expected shape"
            } else {
                "not valid YAML"
            },
            expected: expected_of(&message),
        }
    }
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.problem)?;
        if self.line > 0 {
            write!(f, " at line {} column {}", self.line, self.column)?;
        }
        if let Some(expected) = &self.expected {
            write!(f, " ({expected})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ShapeError {}

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = "CANARY-sk-live-1234";

    #[test]
    fn a_value_of_the_wrong_type_is_placed_and_never_quoted() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct File {
            keys: Vec<std::collections::BTreeMap<String, String>>,
        }
        for text in [
            format!("{{\"keys\": [\"{CANARY}\"]}}"),
            format!("{{\"keys\": \"{CANARY}\"}}"),
            format!("{{\"{CANARY}\": 1}}"),
            format!("{{\"keys\": [{{\"id\": 1, \"value\": \"{CANARY}\"}}]}}"),
        ] {
            let e = serde_json::from_str::<File>(&text).unwrap_err();
            let shown = ShapeError::json(&e).to_string();
            assert!(!shown.contains(CANARY), "{shown}");
            assert!(shown.contains("at line 1 column"), "{shown}");
        }
        let e = serde_json::from_str::<File>(&format!("{{\"keys\": [\"{CANARY}\"]}}")).unwrap_err();
        assert_eq!(
            ShapeError::json(&e).to_string(),
            "not the expected shape at line 1 column 31 (expected a map)"
        );
    }

    #[test]
    fn yaml_too() {
        for text in [
            format!("API_KEY={CANARY}\n"),
            format!("- {CANARY}\n"),
            format!("a: [{CANARY}\n"),
        ] {
            let e = serde_yaml::from_str::<std::collections::BTreeMap<String, String>>(&text)
                .unwrap_err();
            let shown = ShapeError::yaml(&e).to_string();
            assert!(!shown.contains(CANARY), "{shown}");
        }
    }
}
