//! The few JSONPath forms dependencies use: `$` (the whole value), member
//! steps (`$.a.b`), array indices (`$.a[0]`) and every element
//! (`$.items[*].id`, which reads a list). Nothing else (no filters, no
//! recursive descent, no quoted names).

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
    Every,
}

/// Why a path in a `depends_on` cannot be used; the text says how to write
/// it instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PathError {
    #[error("a path starts with `$` (`$.date`, `$.slots[0].id`)")]
    NoRoot,
    #[error("a `.` is followed by a member name")]
    NoMemberName,
    #[error("`[{0}]` is neither an index nor `[*]`")]
    BadBracket(String),
    #[error("unexpected `{0}`; use `.name`, `[0]` or `[*]`")]
    Unexpected(char),
    #[error("a destination is made of member names only (`$.slot_token`)")]
    NotAMemberPath,
}

/// A parsed path.
#[derive(Clone, Debug, PartialEq)]
pub struct Path(Vec<Step>);

impl Path {
    pub fn parse(text: &str) -> Result<Path, PathError> {
        let rest = text.trim().strip_prefix('$').ok_or(PathError::NoRoot)?;
        let mut steps = Vec::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '.' => {
                    let mut key = String::new();
                    while let Some(&c) = chars.peek() {
                        if c == '.' || c == '[' {
                            break;
                        }
                        key.push(c);
                        chars.next();
                    }
                    if key.is_empty() || key == "*" {
                        return Err(PathError::NoMemberName);
                    }
                    steps.push(Step::Key(key));
                }
                '[' => {
                    let inner: String = chars.by_ref().take_while(|c| *c != ']').collect();
                    steps.push(match inner.as_str() {
                        "*" => Step::Every,
                        n => Step::Index(
                            n.parse()
                                .map_err(|_| PathError::BadBracket(n.to_string()))?,
                        ),
                    });
                }
                other => return Err(PathError::Unexpected(other)),
            }
        }
        Ok(Path(steps))
    }

    /// The first member name (`slot_token` of `$.slot_token`), if the path
    /// starts with one.
    pub fn top(&self) -> Option<&str> {
        match self.0.first() {
            Some(Step::Key(k)) => Some(k),
            _ => None,
        }
    }

    /// What the path reads in `v` (a list where `[*]` is used); `None` when
    /// a step finds nothing.
    pub fn read(&self, v: &Value) -> Option<Value> {
        read(&self.0, v)
    }

    /// Write `value` at the path in `v`, creating objects on the way
    /// (member steps only).
    pub fn write(&self, v: &mut Value, value: Value) -> Result<(), PathError> {
        let mut at = v;
        for (i, s) in self.0.iter().enumerate() {
            let Step::Key(k) = s else {
                return Err(PathError::NotAMemberPath);
            };
            if !at.is_object() {
                *at = Value::Object(Default::default());
            }
            let obj = at.as_object_mut().expect("an object");
            if i + 1 == self.0.len() {
                obj.insert(k.clone(), value);
                return Ok(());
            }
            at = obj.entry(k.clone()).or_insert(Value::Null);
        }
        *at = value;
        Ok(())
    }
}

fn read(steps: &[Step], v: &Value) -> Option<Value> {
    let Some((first, rest)) = steps.split_first() else {
        return Some(v.clone());
    };
    match first {
        Step::Key(k) => read(rest, v.get(k)?),
        Step::Index(i) => read(rest, v.get(*i)?),
        Step::Every => Some(Value::Array(
            v.as_array()?.iter().filter_map(|e| read(rest, e)).collect(),
        )),
    }
}

/// Read `path` (already checked at load) in `v`.
pub fn get(path: &str, v: &Value) -> Option<Value> {
    Path::parse(path).ok()?.read(v).filter(|v| !v.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_documented_forms_read_and_others_are_refused() {
        let v = json!({"a": {"b": 1}, "items": [{"id": "x"}, {"id": "y"}]});
        assert_eq!(get("$.a.b", &v), Some(json!(1)));
        assert_eq!(get("$.items[1].id", &v), Some(json!("y")));
        assert_eq!(get("$.items[*].id", &v), Some(json!(["x", "y"])));
        assert_eq!(get("$", &v), Some(v.clone()));
        assert_eq!(get("$.nope", &v), None);
        assert_eq!(Path::parse("a.b"), Err(PathError::NoRoot));
        assert_eq!(Path::parse("$..a"), Err(PathError::NoMemberName));
        assert_eq!(
            Path::parse("$.a[?(@.x)]"),
            Err(PathError::BadBracket("?(@.x)".into()))
        );
        assert_eq!(Path::parse("$a"), Err(PathError::Unexpected('a')));
        assert_eq!(
            Path::parse("$.a[0]")
                .unwrap()
                .write(&mut json!({}), json!(1)),
            Err(PathError::NotAMemberPath)
        );
    }

    #[test]
    fn a_destination_is_written_with_its_objects() {
        let mut v = json!({"date": "d"});
        Path::parse("$.slot_token")
            .unwrap()
            .write(&mut v, json!("t"))
            .unwrap();
        Path::parse("$.a.b")
            .unwrap()
            .write(&mut v, json!(2))
            .unwrap();
        assert_eq!(v, json!({"date": "d", "slot_token": "t", "a": {"b": 2}}));
        assert_eq!(
            Path::parse("$.slot_token").unwrap().top(),
            Some("slot_token")
        );
    }
}
