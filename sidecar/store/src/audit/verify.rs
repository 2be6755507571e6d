//! Checking an exported audit log (JSON lines, in seq order): each
//! record's hash against its content, each `prev` against the record
//! before, the seqs gapless; and, given an anchor taken elsewhere (the
//! head a `GET /v1/audit` answer names), that nothing was cut off the end.

use std::fmt;

use serde_json::Value;

use super::{digest, GENESIS};

/// What the verifier is told besides the file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Anchor {
    /// The hash of the last record the log held when the anchor was
    /// taken: it must be in the file.
    pub head: Option<String>,
    /// How many records the log held then (the head's seq): the file
    /// must reach it.
    pub count: Option<i64>,
    /// The hash of the record before the file's first, when the file
    /// does not start at seq 1 (an export with `?after=`).
    pub prev: Option<String>,
}

/// A chain that holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub records: u64,
    pub first_seq: Option<i64>,
    pub last_seq: Option<i64>,
    /// The last record's hash (the genesis for an empty file).
    pub head: String,
}

/// The first thing found wrong; `line` counts from 1.
#[derive(Clone, Debug, PartialEq)]
pub enum Broken {
    /// A line that is not a record (not a JSON object, or without an
    /// integer `seq` or a string `prev` and `hash`).
    Unreadable { line: usize, why: String },
    /// The record's hash does not match its content: it was altered.
    Altered { line: usize, seq: i64 },
    /// Records `expected`..`found - 1` are missing before this line.
    Removed {
        line: usize,
        expected: i64,
        found: i64,
    },
    /// The record's seq is not the next one: a record was inserted (or
    /// the file's lines were reordered).
    Inserted {
        line: usize,
        seq: i64,
        expected: i64,
    },
    /// The record's `prev` is not the hash of the record before it: that
    /// record was altered and its hash computed again, or this one was
    /// inserted in its place.
    Unlinked { line: usize, seq: i64 },
    /// The file starts after seq 1 and no `--prev` says what came before.
    Headless { line: usize, seq: i64 },
    /// The anchor's head or count is past the file's end: the records
    /// from `missing_from` on were removed.
    Truncated { missing_from: i64, why: String },
}

impl Broken {
    /// The seq of the first record removed, altered or inserted.
    pub fn seq(&self) -> Option<i64> {
        match self {
            Broken::Unreadable { .. } => None,
            Broken::Altered { seq, .. }
            | Broken::Inserted { seq, .. }
            | Broken::Unlinked { seq, .. }
            | Broken::Headless { seq, .. } => Some(*seq),
            Broken::Removed { expected, .. } => Some(*expected),
            Broken::Truncated { missing_from, .. } => Some(*missing_from),
        }
    }
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::Unreadable { line, why } => {
                write!(f, "line {line} is not an audit record: {why}")
            }
            Broken::Altered { line, seq } => write!(
                f,
                "record seq {seq} (line {line}) was altered: its hash does not match its content"
            ),
            Broken::Removed {
                line,
                expected,
                found,
            } => {
                let last = found - 1;
                let which = match last == *expected {
                    true => format!("record seq {expected} was"),
                    false => format!("records seq {expected} to {last} were"),
                };
                write!(f, "{which} removed: line {line} holds seq {found}")
            }
            Broken::Inserted {
                line,
                seq,
                expected,
            } => write!(
                f,
                "record seq {seq} (line {line}) was inserted or moved: seq {expected} was expected there"
            ),
            Broken::Unlinked { line, seq } => write!(
                f,
                "the chain breaks at record seq {seq} (line {line}): its prev is not the hash of record seq {}, which was altered and hashed again, or this record was inserted",
                seq - 1
            ),
            Broken::Headless { line, seq } => write!(
                f,
                "the file starts at seq {seq} (line {line}), not 1: give --prev HASH (the hash of record seq {}) to check it, else the records before it were removed",
                seq - 1
            ),
            Broken::Truncated { missing_from, why } => write!(
                f,
                "records from seq {missing_from} on were removed: {why}"
            ),
        }
    }
}

/// Check `lines` (the file's lines, blank ones skipped) against each
/// other and `anchor`.
pub fn verify<I, S>(lines: I, anchor: &Anchor) -> Result<Summary, Broken>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut summary = Summary {
        records: 0,
        first_seq: None,
        last_seq: None,
        head: anchor.prev.clone().unwrap_or_else(|| GENESIS.to_string()),
    };
    let mut head_seen = false;
    for (i, text) in lines.into_iter().enumerate() {
        let line = i + 1;
        let text = text.as_ref().trim();
        if text.is_empty() {
            continue;
        }
        let (seq, prev, hash, record) = read(line, text)?;
        if digest(&record) != hash {
            return Err(Broken::Altered { line, seq });
        }
        match summary.last_seq {
            None if seq != 1 && anchor.prev.is_none() => {
                return Err(Broken::Headless { line, seq });
            }
            None => {}
            Some(last) if seq > last + 1 => {
                return Err(Broken::Removed {
                    line,
                    expected: last + 1,
                    found: seq,
                })
            }
            Some(last) if seq != last + 1 => {
                return Err(Broken::Inserted {
                    line,
                    seq,
                    expected: last + 1,
                })
            }
            Some(_) => {}
        }
        if prev != summary.head {
            return Err(Broken::Unlinked { line, seq });
        }
        summary.records += 1;
        summary.first_seq.get_or_insert(seq);
        summary.last_seq = Some(seq);
        head_seen |= anchor.head.as_deref() == Some(hash.as_str());
        summary.head = hash;
    }
    let next = summary.last_seq.map_or(1, |s| s + 1);
    if let Some(head) = &anchor.head {
        if !head_seen {
            return Err(Broken::Truncated {
                missing_from: next,
                why: format!("the head {head} is not the hash of any record in the file"),
            });
        }
    }
    if let Some(count) = anchor.count {
        if next <= count {
            return Err(Broken::Truncated {
                missing_from: next,
                why: format!(
                    "the log held {count} records, the file ends at seq {}",
                    next - 1
                ),
            });
        }
    }
    Ok(summary)
}

/// A line's seq, prev, hash and object.
fn read(
    line: usize,
    text: &str,
) -> Result<(i64, String, String, serde_json::Map<String, Value>), Broken> {
    let unreadable = |why: &str| Broken::Unreadable {
        line,
        why: why.to_string(),
    };
    let record = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(unreadable("not a JSON object")),
        Err(e) => return Err(unreadable(&format!("not JSON ({e})"))),
    };
    // The line is held to the very bytes sealed: a line rewritten into
    // another form that parses to the same record (a key given twice,
    // which another reader takes the first of; keys reordered; escapes)
    // could be read otherwise than what was hashed.
    if super::canonical(&Value::Object(record.clone())) != text {
        return Err(unreadable(
            "not in the canonical form it was sealed in (keys sorted and each once, no spaces, no escapes a record does not need): the line was rewritten",
        ));
    }
    let seq = record
        .get("seq")
        .and_then(Value::as_i64)
        .ok_or_else(|| unreadable("no integer `seq`"))?;
    let field = |name: &str| {
        record
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| unreadable(&format!("no string `{name}`")))
    };
    let (prev, hash) = (field("prev")?, field("hash")?);
    Ok((seq, prev, hash, record))
}

#[cfg(test)]
mod tests {
    use super::super::{seal, Action, Actor, Entry};
    use super::*;

    fn log(n: i64) -> Vec<String> {
        let mut prev = GENESIS.to_string();
        (1..=n)
            .map(|seq| {
                let entry = Entry {
                    at: seq * 1000,
                    actor: Actor::Owner,
                    session: Some(format!("s{seq}")),
                    action: Action::MessagePosted {},
                };
                let s = seal(&entry, seq, &prev).unwrap();
                prev = s.hash;
                s.line
            })
            .collect()
    }

    fn hash_of(line: &str) -> String {
        let v: Value = serde_json::from_str(line).unwrap();
        v["hash"].as_str().unwrap().to_string()
    }

    fn rewrite(line: &str, f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
        let mut v: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
        f(&mut v);
        super::super::canonical(&Value::Object(v))
    }

    #[test]
    fn an_intact_log_holds() {
        let lines = log(4);
        let s = verify(&lines, &Anchor::default()).unwrap();
        assert_eq!(
            (s.records, s.first_seq, s.last_seq, s.head.as_str()),
            (4, Some(1), Some(4), hash_of(&lines[3]).as_str())
        );
        let empty: Vec<String> = Vec::new();
        assert_eq!(verify(&empty, &Anchor::default()).unwrap().records, 0);
    }

    #[test]
    fn a_removed_record_is_named_by_its_seq() {
        let mut lines = log(5);
        lines.remove(2);
        let e = verify(&lines, &Anchor::default()).unwrap_err();
        assert_eq!(
            e,
            Broken::Removed {
                line: 3,
                expected: 3,
                found: 4
            }
        );
        assert_eq!(
            e.to_string(),
            "record seq 3 was removed: line 3 holds seq 4"
        );
    }

    #[test]
    fn an_altered_field_is_named_by_its_seq() {
        let mut lines = log(4);
        lines[1] = rewrite(&lines[1], |v| {
            v.insert("session".into(), "other".into());
        });
        assert_eq!(
            verify(&lines, &Anchor::default()),
            Err(Broken::Altered { line: 2, seq: 2 })
        );
    }

    #[test]
    fn a_record_hashed_again_after_an_alteration_breaks_the_chain_at_the_next() {
        let mut lines = log(4);
        lines[1] = rewrite(&lines[1], |v| {
            v.insert("actor".into(), serde_json::json!({"kind": "approver"}));
            let h = digest(v);
            v.insert("hash".into(), h.into());
        });
        assert_eq!(
            verify(&lines, &Anchor::default()),
            Err(Broken::Unlinked { line: 3, seq: 3 })
        );
    }

    #[test]
    fn an_inserted_or_moved_record_is_found() {
        let mut lines = log(4);
        lines.swap(1, 2);
        assert!(matches!(
            verify(&lines, &Anchor::default()),
            Err(Broken::Removed { expected: 2, .. })
        ));
        let mut lines = log(4);
        let dup = lines[1].clone();
        lines.insert(2, dup);
        assert_eq!(
            verify(&lines, &Anchor::default()),
            Err(Broken::Inserted {
                line: 3,
                seq: 2,
                expected: 3
            })
        );
    }

    #[test]
    fn the_last_records_removed_are_found_only_against_an_anchor() {
        let full = log(5);
        let head = hash_of(&full[4]);
        let cut = &full[..3];
        assert!(verify(cut, &Anchor::default()).is_ok());
        let by_head = Anchor {
            head: Some(head.clone()),
            ..Default::default()
        };
        let e = verify(cut, &by_head).unwrap_err();
        assert_eq!(e.seq(), Some(4));
        let by_count = Anchor {
            count: Some(5),
            ..Default::default()
        };
        assert_eq!(verify(cut, &by_count).unwrap_err().seq(), Some(4));
        // A log that grew past its anchor holds.
        assert!(verify(&full, &by_head).is_ok());
        assert!(verify(&full, &by_count).is_ok());
    }

    #[test]
    fn a_page_after_seq_one_needs_the_hash_before_it() {
        let full = log(4);
        let page = &full[2..];
        assert_eq!(
            verify(page, &Anchor::default()),
            Err(Broken::Headless { line: 1, seq: 3 })
        );
        let anchored = Anchor {
            prev: Some(hash_of(&full[1])),
            ..Default::default()
        };
        assert_eq!(verify(page, &anchored).unwrap().records, 2);
    }

    #[test]
    fn a_line_rewritten_into_another_form_of_the_same_record_is_refused() {
        let lines = log(2);
        let first = &lines[0];
        // A key given twice: serde keeps the last, another reader the first.
        let dup = first.replacen('{', "{\"action\":\"agent_deleted\",", 1);
        let pretty = first.replacen(',', ", ", 1);
        let escaped = first.replacen("\"seq\"", "\"\\u0073eq\"", 1);
        for bad in [dup, pretty, escaped] {
            let mut l = lines.clone();
            l[0] = bad.clone();
            let e = verify(&l, &Anchor::default()).unwrap_err();
            assert!(
                matches!(e, Broken::Unreadable { line: 1, .. }),
                "{bad}: {e:?}"
            );
        }
        // The canonical lines themselves, with a CRLF, hold.
        let crlf: Vec<String> = lines.iter().map(|l| format!("{l}\r")).collect();
        assert!(verify(&crlf, &Anchor::default()).is_ok());
    }

    #[test]
    fn a_line_that_is_no_record_is_named() {
        let mut lines = log(2);
        lines[1] = "{\"seq\":2}".into();
        assert!(matches!(
            verify(&lines, &Anchor::default()),
            Err(Broken::Unreadable { line: 2, .. })
        ));
    }
}
