//! `session-edit`: agents-exe's session transformations, applied in the
//! order given to the session read from stdin. Turns are stored newest
//! first, so `--take N` keeps the N newest turns and `--take-tail N` the N
//! oldest (agents-exe's `take`/`takeLast` on the stored list). The
//! session is edited as JSON: every field an operation does not change
//! (unknown ones included) is kept with its value (re-serialised: keys
//! sorted, numbers past 64 bits as doubles; docs/agents.md says exactly).

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Take(i64),
    TakeTail(i64),
    Drop(i64),
    DropTail(i64),
    CensorToolCalls,
    CensorThinking,
}

/// What `session-edit`'s operations cannot be: each names the flag given.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EditError {
    #[error("{flag} needs a number")]
    NoCount { flag: String },
    #[error("{flag} {given}: not a whole number")]
    NotACount { flag: String, given: String },
    #[error("{flag} {given} counts the turns of the --take, --take-tail, --drop or --drop-tail just before it")]
    CountsNothing { flag: String, given: String },
    #[error("session-edit does not know {given:?}; its operations are --take, --take-tail, --drop, --drop-tail (each with -n/--count N, default 1), --censor-tool-calls and --censor-thinking")]
    Unknown { given: String },
}

/// The operations in `args`, in order: `--take`, `--take-tail`, `--drop`,
/// `--drop-tail` (each counting `-n/--count N` after it, default 1),
/// `--censor-tool-calls`, `--censor-thinking`.
pub fn parse_ops(args: &[String]) -> Result<Vec<Op>, EditError> {
    let mut ops = Vec::new();
    let mut counted = false;
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        i += 1;
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (arg.as_str(), None),
        };
        let op = match name {
            "--take" => Op::Take(1),
            "--take-tail" => Op::TakeTail(1),
            "--drop" => Op::Drop(1),
            "--drop-tail" => Op::DropTail(1),
            "--censor-tool-calls" => Op::CensorToolCalls,
            "--censor-thinking" => Op::CensorThinking,
            "-n" | "--count" => {
                let value = match inline {
                    Some(v) => v.to_string(),
                    None => {
                        i += 1;
                        args.get(i - 1).cloned().ok_or_else(|| EditError::NoCount {
                            flag: name.to_string(),
                        })?
                    }
                };
                let n: i64 = value.parse().map_err(|_| EditError::NotACount {
                    flag: name.to_string(),
                    given: value.clone(),
                })?;
                match ops.last_mut() {
                    Some(Op::Take(c) | Op::TakeTail(c) | Op::Drop(c) | Op::DropTail(c))
                        if !counted =>
                    {
                        *c = n;
                        counted = true;
                    }
                    _ => {
                        return Err(EditError::CountsNothing {
                            flag: name.to_string(),
                            given: value,
                        })
                    }
                }
                continue;
            }
            other => {
                return Err(EditError::Unknown {
                    given: other.to_string(),
                })
            }
        };
        ops.push(op);
        counted = false;
    }
    Ok(ops)
}

/// `ops` applied to the session `doc`, left to right.
pub fn apply(doc: &mut Value, ops: &[Op]) {
    for op in ops {
        apply_one(doc, op);
    }
}

fn apply_one(doc: &mut Value, op: &Op) {
    let Some(Value::Array(turns)) = doc.get_mut("turns") else {
        return;
    };
    let len = turns.len();
    let n = |c: i64| usize::try_from(c.max(0)).unwrap_or(usize::MAX).min(len);
    match *op {
        Op::Take(c) => turns.truncate(n(c)),
        Op::TakeTail(c) => {
            turns.drain(..len - n(c));
        }
        Op::Drop(c) => {
            turns.drain(..n(c));
        }
        Op::DropTail(c) => turns.truncate(len - n(c)),
        Op::CensorToolCalls => {
            for t in turns.iter_mut() {
                let tag = t
                    .get("tag")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let Some(Value::Object(c)) = t.get_mut("contents") else {
                    continue;
                };
                let emptied: &[&str] = match tag.as_str() {
                    "LlmTurn" | "LlmTurn_v0" => &["llmToolCalls"],
                    "UserTurn" | "UserTurn_v0" => &["userToolResponses"],
                    "PartialUserTurn" => {
                        &["completedResponses", "pendingCalls", "pendingContinuations"]
                    }
                    _ => &[],
                };
                for key in emptied {
                    c.insert(key.to_string(), Value::Array(Vec::new()));
                }
            }
        }
        Op::CensorThinking => {
            for t in turns.iter_mut() {
                if !matches!(
                    t.get("tag").and_then(Value::as_str),
                    Some("LlmTurn" | "LlmTurn_v0")
                ) {
                    continue;
                }
                if let Some(Value::Object(r)) = t.pointer_mut("/contents/llmResponse") {
                    r.insert("responseThinking".into(), Value::Null);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn operations_keep_their_order_and_their_counts() {
        assert_eq!(
            parse_ops(&args(
                "--drop -n 2 --take --censor-thinking --take-tail --count=3 --drop-tail"
            ))
            .unwrap(),
            [
                Op::Drop(2),
                Op::Take(1),
                Op::CensorThinking,
                Op::TakeTail(3),
                Op::DropTail(1)
            ]
        );
        assert!(parse_ops(&args("-n 2 --take"))
            .unwrap_err()
            .to_string()
            .contains("just before it"));
        assert!(parse_ops(&args("--take -n 2 -n 3"))
            .unwrap_err()
            .to_string()
            .contains("just before it"));
        assert!(parse_ops(&args("--take -n two"))
            .unwrap_err()
            .to_string()
            .contains("not a whole number"));
        assert!(parse_ops(&args("--head"))
            .unwrap_err()
            .to_string()
            .contains("does not know \"--head\""));
    }

    #[test]
    fn take_keeps_the_newest_turns_as_stored() {
        let doc = || json!({"turns": [5, 4, 3, 2, 1], "sessionId": "s", "extra": {"kept": true}});
        let run = |ops: &[Op]| {
            let mut d = doc();
            apply(&mut d, ops);
            d
        };
        assert_eq!(run(&[Op::Take(2)])["turns"], json!([5, 4]));
        assert_eq!(run(&[Op::TakeTail(2)])["turns"], json!([2, 1]));
        assert_eq!(run(&[Op::Drop(2)])["turns"], json!([3, 2, 1]));
        assert_eq!(run(&[Op::DropTail(2)])["turns"], json!([5, 4, 3]));
        assert_eq!(run(&[Op::Drop(1), Op::Take(2)])["turns"], json!([4, 3]));
        // agents-exe's edges: take ≤ 0 empties, drop ≤ 0 keeps, more than
        // there is is all.
        assert_eq!(run(&[Op::Take(0)])["turns"], json!([]));
        assert_eq!(run(&[Op::TakeTail(-1)])["turns"], json!([]));
        assert_eq!(run(&[Op::Drop(-3)])["turns"], doc()["turns"]);
        assert_eq!(run(&[Op::DropTail(99)])["turns"], json!([]));
        assert_eq!(run(&[Op::Take(i64::MAX)]), doc());
    }

    #[test]
    fn censoring_empties_calls_and_thinking_and_nothing_else() {
        let mut d = json!({"turns": [
            {"tag": "PartialUserTurn", "contents": {"userPrompt": "p", "completedResponses": [1],
                "pendingCalls": [2]}, "byteUsage": {"x": 1}},
            {"tag": "UserTurn", "contents": {"userPrompt": "p", "userToolResponses": [[{}, "r"]],
                "future": 1}},
            {"tag": "LlmTurn", "contents": {"llmResponse": {"responseText": "t",
                "responseThinking": "secret", "rawResponse": {"keep": 1}}, "llmToolCalls": [{}]}}]});
        apply(&mut d, &[Op::CensorToolCalls, Op::CensorThinking]);
        assert_eq!(
            d,
            json!({"turns": [
            {"tag": "PartialUserTurn", "contents": {"userPrompt": "p", "completedResponses": [],
                "pendingCalls": [], "pendingContinuations": []}, "byteUsage": {"x": 1}},
            {"tag": "UserTurn", "contents": {"userPrompt": "p", "userToolResponses": [],
                "future": 1}},
            {"tag": "LlmTurn", "contents": {"llmResponse": {"responseText": "t",
                "responseThinking": null, "rawResponse": {"keep": 1}}, "llmToolCalls": []}}]})
        );
    }
}
