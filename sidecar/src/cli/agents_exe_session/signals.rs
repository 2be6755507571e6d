//! `session-print`'s "Signal Metrics": agents-exe's word-list heuristics
//! over a session (its `Session/Signals.hs`): misunderstandings, going in
//! circles, giving up and satisfaction in the queries and answers; failed
//! tool results and loops of calls; resource limits hit. Pure, and as
//! agents-exe computes them (the turns walked as stored, newest first).

use serde_json::Value;

use super::calls::display_name;
use super::model::{Part, Session, ToolResponse, TurnKind};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    pub misalignment: usize,
    pub stagnation: usize,
    pub disengagement: bool,
    pub satisfaction: bool,
    pub failures: usize,
    /// The tools of a loop of calls, if any.
    pub looping: Option<Vec<String>>,
    pub exhaustion: usize,
    /// The kinds of exhaustion, each once, in order of appearance.
    pub exhaustion_kinds: Vec<String>,
}

const MISALIGNMENT: &[&str] = &[
    "rephrase",
    "correction",
    "clarify",
    "i meant",
    "not what i asked",
    "that's not right",
    "you misunderstood",
    "wrong",
    "incorrect",
    "fix",
    "change",
    "update",
    "revise",
    "modify",
    "adjust",
    "rewrite",
    "redo",
    "start over",
    "try again",
    "different approach",
    "another way",
    "not quite",
    "close but",
    "almost",
    "better",
    "instead",
    "rather",
    "prefer",
    "want",
    "need",
    "should be",
    "must be",
    "has to be",
    "supposed to",
];

const DISENGAGEMENT: &[&str] = &[
    "talk to human",
    "talk to a human",
    "speak to human",
    "real person",
    "human agent",
    "customer service",
    "support team",
    "stop",
    "cancel",
    "quit",
    "exit",
    "done",
    "enough",
    "this isn't working",
    "not working",
    "doesn't work",
    "won't work",
    "can't help",
    "useless",
    "waste of time",
    "giving up",
    "forget it",
    "never mind",
    "goodbye",
    "bye",
    "end",
    "terminate",
    "abort",
    "this is frustrating",
    "frustrated",
    "annoying",
    "terrible",
    "awful",
    "worst",
    "hate",
    "disappointed",
    "unsatisfied",
];

const SATISFACTION: &[&str] = &[
    "thank you",
    "thanks",
    "appreciate",
    "grateful",
    "that worked",
    "it worked",
    "works now",
    "working",
    "perfect",
    "excellent",
    "great",
    "awesome",
    "amazing",
    "fantastic",
    "wonderful",
    "brilliant",
    "outstanding",
    "superb",
    "exactly",
    "precisely",
    "that's it",
    "that's right",
    "correct",
    "solved",
    "fixed",
    "resolved",
    "done",
    "complete",
    "finished",
    "mission accomplished",
    "goal achieved",
    "success",
    "successful",
    "beautiful",
    "love it",
    "like it",
    "good job",
    "well done",
    "nice work",
    "impressive",
];

const STAGNATION: &[&str] = &[
    "as i said",
    "as mentioned",
    "as explained",
    "again",
    "repeating",
    "same",
    "similar",
    "identical",
    "just like",
    "same as",
    "no change",
    "unchanged",
    "still",
    "yet again",
    "once more",
    "previously",
    "before",
    "earlier",
    "last time",
    "in the previous",
];

const FAILURE: &[&str] = &[
    "error",
    "failed",
    "failure",
    "exception",
    "timeout",
    "unavailable",
    "not found",
    "does not exist",
    "invalid",
    "unauthorized",
    "forbidden",
    "permission denied",
    "no such",
    "unable to",
    "could not",
    "can't",
    "cannot",
    "empty",
    "null",
    "undefined",
    "no results",
    "nothing found",
    "404",
    "500",
    "503",
];

const EXHAUSTION: &[(&str, &str)] = &[
    ("rate limit", "rate_limit"),
    ("rate_limit", "rate_limit"),
    ("too many requests", "rate_limit"),
    ("context limit", "context_overflow"),
    ("context_overflow", "context_overflow"),
    ("context length", "context_overflow"),
    ("token limit", "context_overflow"),
    ("maximum context", "context_overflow"),
    ("quota exceeded", "quota_exceeded"),
    ("insufficient quota", "quota_exceeded"),
    ("billing limit", "quota_exceeded"),
    ("timeout", "timeout"),
    ("timed out", "timeout"),
    ("deadline exceeded", "timeout"),
    ("connection refused", "connection_error"),
    ("connection reset", "connection_error"),
    ("network error", "connection_error"),
    ("unavailable", "service_unavailable"),
    ("service unavailable", "service_unavailable"),
    ("503", "service_unavailable"),
    ("internal error", "internal_error"),
    ("500", "internal_error"),
];

fn hits(text: &str, words: &[&str]) -> usize {
    let lower = text.to_lowercase();
    words.iter().filter(|w| lower.contains(*w)).count()
}

impl Signals {
    pub fn of(s: &Session) -> Signals {
        let queries: Vec<&str> = s
            .turns
            .iter()
            .filter_map(|t| match &t.kind {
                TurnKind::User(u) => u.query.as_deref(),
                _ => None,
            })
            .collect();
        let answers: Vec<&str> = s
            .turns
            .iter()
            .filter_map(|t| match &t.kind {
                TurnKind::Llm(l) => l.text.as_deref(),
                _ => None,
            })
            .collect();
        let results = s.turns.iter().flat_map(|t| match &t.kind {
            TurnKind::User(u) => u.responses.as_slice(),
            _ => &[],
        });
        let mut kinds: Vec<String> = Vec::new();
        for t in &s.turns {
            match &t.kind {
                TurnKind::Llm(l) => kinds.extend(exhausted(l.text.as_deref().unwrap_or(""))),
                TurnKind::User(u) => {
                    for (_, r) in &u.responses {
                        match r {
                            ToolResponse::Text(t) => kinds.extend(exhausted(t)),
                            // agents-exe reads the value's `show`; its JSON
                            // holds the same words.
                            ToolResponse::Json(v) => kinds.extend(exhausted(&v.to_string())),
                            _ => {}
                        }
                    }
                }
                TurnKind::Partial { .. } => {}
            }
        }
        let mut unique: Vec<String> = Vec::new();
        for k in &kinds {
            if !unique.contains(k) {
                unique.push(k.clone());
            }
        }
        let names: Vec<&str> = s.calls().map(|(_, _, c)| display_name(c)).collect();
        Signals {
            misalignment: queries.iter().map(|q| hits(q, MISALIGNMENT)).sum(),
            stagnation: near_duplicates(&answers)
                + answers.iter().map(|a| hits(a, STAGNATION)).sum::<usize>(),
            disengagement: queries.iter().any(|q| hits(q, DISENGAGEMENT) > 0),
            satisfaction: queries.iter().any(|q| hits(q, SATISFACTION) > 0),
            failures: results.map(|(_, r)| failures(r)).sum(),
            looping: looping(&names),
            exhaustion: kinds.len(),
            exhaustion_kinds: unique,
        }
    }

    /// 0 to 100: how likely the session holds something to learn from.
    pub fn score(&self) -> i64 {
        let capped = |n: usize, each: i64, max: i64| (n as i64).saturating_mul(each).min(max);
        let raw = 30
            + capped(self.failures, 10, 30)
            + capped(self.misalignment, 5, 20)
            + if self.looping.is_some() { 20 } else { 0 }
            + if self.disengagement { 15 } else { 0 }
            + capped(self.stagnation, 3, 10)
            + capped(self.exhaustion, 5, 10)
            - if self.satisfaction { 10 } else { 0 };
        raw.clamp(0, 100)
    }
}

fn exhausted(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    EXHAUSTION
        .iter()
        .filter(|(p, _)| lower.contains(p))
        .map(|(_, k)| k.to_string())
        .collect()
}

/// Windows of three answers holding two alike: one inside the other, or
/// (past five words) sharing 80 % of their words.
fn near_duplicates(texts: &[&str]) -> usize {
    let alike = |a: &str, b: &str| {
        let (la, lb) = (a.to_lowercase(), b.to_lowercase());
        let (wa, wb): (Vec<&str>, Vec<&str>) = (
            la.split_whitespace().collect(),
            lb.split_whitespace().collect(),
        );
        let common = wa.iter().filter(|w| wb.contains(w)).count();
        let total = wa.len().max(wb.len());
        a.contains(b) || b.contains(a) || (total > 5 && common * 100 / total >= 80)
    };
    if texts.len() < 3 {
        return 0;
    }
    texts
        .windows(3)
        .filter(|w| w[1..].iter().any(|b| alike(w[0], b)))
        .count()
}

fn failures(r: &ToolResponse) -> usize {
    let text = |t: &str| usize::from(hits(t, FAILURE) > 0);
    match r {
        ToolResponse::Text(t) => text(t),
        ToolResponse::Json(v) => usize::from(match v {
            Value::Object(o) => {
                o.contains_key("error")
                    || o.get("success") == Some(&Value::Bool(false))
                    || o.get("status").and_then(Value::as_str).is_some_and(|s| {
                        ["error", "failed", "failure"].contains(&s.to_lowercase().as_str())
                    })
            }
            Value::Array(a) => a.is_empty(),
            Value::Null => true,
            _ => false,
        }),
        ToolResponse::Media(_) => 0,
        ToolResponse::Mixed(parts) => parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => text(t),
                Part::Media(_) => 0,
            })
            .sum(),
    }
}

/// The same tool three times in a row, two tools alternating, or a cycle
/// of tools repeated: agents-exe's three loops, in that order.
fn looping(names: &[&str]) -> Option<Vec<String>> {
    if names.len() < 3 {
        return None;
    }
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut run = 1;
    for i in 1..=names.len() {
        if i < names.len() && names[i] == names[i - 1] {
            run += 1;
            continue;
        }
        if run >= 3 {
            return Some(owned(&names[i - 1..i]));
        }
        run = 1;
    }
    if let Some(w) = names
        .windows(4)
        .find(|w| w[0] == w[2] && w[1] == w[3] && w[0] != w[1])
    {
        return Some(owned(&w[..2]));
    }
    if names.len() >= 6 {
        for n in 2..=names.len() / 2 {
            let first = &names[..n];
            let starts: Vec<usize> = (0..=names.len() - n).step_by(n).collect();
            if starts.len() >= 2 && starts.iter().all(|&i| &names[i..i + n] == first) {
                return Some(owned(first));
            }
        }
    }
    None
}

/// The "Signal Metrics" section's body.
pub fn render(s: &Signals) -> String {
    let count = |n: usize| {
        if n == 0 {
            "✓ 0".to_string()
        } else {
            format!("⚠️ {n}")
        }
    };
    let yes = |b: bool| if b { "⚠️ Yes" } else { "✓ No" };
    let score = s.score();
    let light = match score {
        70.. => "🟢",
        40.. => "🟡",
        _ => "🔴",
    };
    const HEAD: &str = "| Signal | Status | Details |\n|--------|--------|---------|\n";
    let interaction = format!(
        "{HEAD}| Misalignment | {} | {} |\n| Stagnation | {} | {} |\n| Disengagement | {} | {} |\n| Satisfaction | {} | {} |",
        count(s.misalignment),
        if s.misalignment > 0 { format!("{} instances detected", s.misalignment) } else { "None detected".into() },
        count(s.stagnation),
        if s.stagnation > 0 { format!("{} instances detected", s.stagnation) } else { "None detected".into() },
        yes(s.disengagement),
        if s.disengagement { "⚠️ Exit/withdrawal markers found" } else { "Not detected" },
        yes(s.satisfaction),
        if s.satisfaction { "✓ Success markers found" } else { "Not detected" },
    );
    let execution = format!(
        "{HEAD}| Failures | {} | {} |\n| Loop | {} | {} |",
        count(s.failures),
        if s.failures > 0 {
            format!("{} tool/action failures", s.failures)
        } else {
            "No failures detected".into()
        },
        yes(s.looping.is_some()),
        match &s.looping {
            Some(tools) => format!("🔴 Loop detected: {}", tools.join(" → ")),
            None => "No loops detected".into(),
        },
    );
    let environment = format!(
        "{HEAD}| Exhaustion | {} | {} |",
        count(s.exhaustion),
        if s.exhaustion > 0 {
            format!(
                "{} resource boundary hits: {}",
                s.exhaustion,
                s.exhaustion_kinds.join(", ")
            )
        } else {
            "No resource exhaustion detected".into()
        },
    );
    format!(
        "**Informativeness Score:** {score}/100 {light}\n\n#### Interaction Signals\n\n{interaction}\n\n#### Execution Signals\n\n{execution}\n\n#### Environment Signals\n\n{environment}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_are_agents_exes_three_kinds() {
        assert_eq!(looping(&["a", "b", "b", "b"]), Some(vec!["b".into()]));
        assert_eq!(
            looping(&["a", "b", "a", "b"]),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            looping(&["a", "b", "c", "a", "b", "c"]),
            Some(vec!["a".into(), "b".into(), "c".into()])
        );
        assert_eq!(looping(&["a", "b", "c", "a", "c", "b"]), None);
        assert_eq!(looping(&["a", "a"]), None);
    }

    #[test]
    fn the_score_weighs_what_was_found() {
        let mut s = Signals::default();
        assert_eq!(s.score(), 30);
        s.failures = 9;
        s.looping = Some(vec![]);
        s.disengagement = true;
        s.misalignment = 9;
        assert_eq!(s.score(), 100);
        let s = Signals {
            satisfaction: true,
            stagnation: 1,
            ..Signals::default()
        };
        assert_eq!(s.score(), 23);
        assert!(render(&s).starts_with("**Informativeness Score:** 23/100 🔴\n\n#### Interaction Signals\n\n| Signal | Status | Details |\n|--------|--------|---------|\n| Misalignment | ✓ 0 | None detected |\n| Stagnation | ⚠️ 1 | 1 instances detected |\n"));
    }

    #[test]
    fn near_duplicates_and_failures_are_counted() {
        assert_eq!(near_duplicates(&["a b c", "x", "a b c d"]), 1);
        assert_eq!(near_duplicates(&["one", "two"]), 0);
        assert_eq!(failures(&ToolResponse::Text("File not found".into())), 1);
        assert_eq!(
            failures(&ToolResponse::Json(serde_json::json!({"status": "Failed"}))),
            1
        );
        assert_eq!(failures(&ToolResponse::Json(serde_json::json!([]))), 1);
        assert_eq!(
            failures(&ToolResponse::Json(serde_json::json!({"ok": 1}))),
            0
        );
        assert_eq!(
            exhausted("HTTP 503: Service Unavailable"),
            [
                "service_unavailable",
                "service_unavailable",
                "service_unavailable"
            ]
        );
    }
}
