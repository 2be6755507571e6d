//! `session-print`: an agents-exe session as Markdown, in agents-exe's
//! layout (its `SessionPrint.hs`): a header, the session's id, statistics
//! (turns, tool calls by name, bytes, tokens), then each step. And
//! [`render_for_prompt`], the `run --session-xs|s|m|l|xl` renderings
//! (its `SessionPrint/Inject.hs`).

use serde_json::Value;

use super::calls::display_name;
use super::model::{Media, Part, Session, SystemTool, ToolResponse, TurnKind, UserTurn};

/// How a part of a step is shown (`hidden|shown|elided`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visibility {
    Hidden,
    Shown,
    /// The first and last lines kept, the middle elided.
    Elided {
        leading: usize,
        trailing: usize,
    },
}

/// A `--show-tool-call-*` value that is none of the three.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?}: one of hidden, shown, elided")]
pub struct NotAVisibility(pub String);

impl Visibility {
    /// agents-exe's `elided`: ten lines each side.
    pub const ELIDED: Visibility = Visibility::Elided {
        leading: 10,
        trailing: 10,
    };

    /// `hidden`, `shown` or `elided`.
    pub fn parse(s: &str) -> Result<Visibility, NotAVisibility> {
        match s {
            "hidden" => Ok(Visibility::Hidden),
            "shown" => Ok(Visibility::Shown),
            "elided" => Ok(Visibility::ELIDED),
            other => Err(NotAVisibility(other.to_string())),
        }
    }
}

/// `session-print`'s options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrintOptions {
    pub results: Visibility,
    pub arguments: Visibility,
    /// Only the last N steps.
    pub n_turns: Option<usize>,
    pub repeat_system_prompt: bool,
    pub repeat_tools: bool,
    pub antichronological: bool,
    pub no_funny_stamp: bool,
}

impl Default for PrintOptions {
    fn default() -> Self {
        PrintOptions {
            results: Visibility::Hidden,
            arguments: Visibility::Hidden,
            n_turns: None,
            repeat_system_prompt: false,
            repeat_tools: false,
            antichronological: false,
            no_funny_stamp: false,
        }
    }
}

const LOGO: [&str; 14] = [
    "```",
    "    λλ",
    "   λ⊙λ⊙",
    "  λλλλλλ",
    " λλλλλλλλ",
    "    λλ",
    "    λλ",
    "    λλ",
    "    λλ",
    "    λλ",
    "    λλ",
    "    λλ",
    "    λλ",
    "```",
];

/// The session as Markdown. Steps are numbered from the oldest (1);
/// `n_turns` keeps the newest N of them.
pub fn render(session: &Session, opts: &PrintOptions) -> String {
    let chronological: Vec<(usize, &TurnKind)> = session
        .turns
        .iter()
        .rev()
        .map(|t| &t.kind)
        .enumerate()
        .map(|(i, t)| (i + 1, t))
        .collect();
    let from = opts
        .n_turns
        .map_or(0, |n| chronological.len().saturating_sub(n));
    let mut shown = chronological[from..].to_vec();
    if opts.antichronological {
        shown.reverse();
    }
    let first = shown.first().map(|(n, _)| *n);
    let turns: Vec<String> = shown
        .iter()
        .map(|(n, t)| render_step(opts, Some(*n) == first, *n, t))
        .collect();
    let mut out = header(opts.no_funny_stamp);
    out.push_str(&format!(
        "**🔑 Session ID:** {}\n",
        session.session_id.as_deref().unwrap_or("(none)")
    ));
    if let Some(f) = &session.forked_from {
        out.push_str(&format!("**🍴 Forked from:** {f}\n"));
    }
    out.push_str("\n---\n\n");
    out.push_str(&statistics(session));
    out.push_str("\n---\n\n");
    out.push_str(&turns.join("\n\n---\n\n"));
    if let Some(n) = opts.n_turns {
        out.push_str(&format!("\n\n_(Showing last {n} turns)_\n"));
    }
    out
}

fn header(no_stamp: bool) -> String {
    const TITLE: &str = "# 📋 Session Report";
    if no_stamp {
        return format!("{TITLE}\n\n");
    }
    let lines: Vec<String> = LOGO
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let padded = pad_right(l, 20);
            if i == 0 {
                format!("{padded}  {TITLE}")
            } else {
                padded
            }
        })
        .collect();
    lines.join("\n") + "\n\n"
}

fn pad_right(s: &str, width: usize) -> String {
    let n = s.chars().count();
    format!("{s}{}", " ".repeat(width.saturating_sub(n)))
}

fn pad_left(s: &str, width: usize) -> String {
    let n = s.chars().count();
    format!("{}{s}", " ".repeat(width.saturating_sub(n)))
}

fn render_step(opts: &PrintOptions, first: bool, n: usize, turn: &TurnKind) -> String {
    match turn {
        TurnKind::User(u) => {
            format!("## 👤 Step {n}: User Turn\n\n{}", user_turn(opts, first, u))
        }
        TurnKind::Llm(l) => {
            let mut out = format!("## 🤖 Step {n}: LLM Turn\n\n");
            if let Some(t) = &l.thinking {
                out.push_str(&format!("### 💭 Thinking Process\n\n<details>\n<summary>Click to expand reasoning</summary>\n\n{t}\n</details>\n\n"));
            }
            match &l.text {
                Some(t) => out.push_str(&format!("### 💬 Response\n\n{t}\n")),
                None => out.push_str("### 💬 Response\n\n_(No text response)_\n"),
            }
            if !l.calls.is_empty() {
                let calls: Vec<String> = l
                    .calls
                    .iter()
                    .map(|c| tool_call(opts.arguments, c))
                    .collect();
                out.push_str("\n### 🔧 Tool Calls\n\n");
                out.push_str(&calls.join("\n\n"));
            }
            out
        }
        TurnKind::Partial { .. } => format!(
            "## ⏸️ Step {n}: Partial Turn (in progress)\n\n_(Turn execution paused - async mode)_\n"
        ),
    }
}

fn user_turn(opts: &PrintOptions, first: bool, u: &UserTurn) -> String {
    let mut out = String::new();
    if opts.repeat_system_prompt || first {
        out.push_str(&format!(
            "### 📝 System Prompt\n\n```\n{}```\n",
            u.system_prompt
        ));
    }
    if let Some(q) = &u.query {
        out.push_str(&format!("\n### 💬 User Query\n\n{q}\n"));
    }
    if !u.tools.is_empty() && (opts.repeat_tools || first) {
        let tools: Vec<String> = u.tools.iter().map(system_tool).collect();
        out.push_str("\n### 🛠️ Available Tools\n\n");
        out.push_str(&tools.join("\n"));
    }
    if opts.results != Visibility::Hidden && !u.responses.is_empty() {
        let responses: Vec<String> = u
            .responses
            .iter()
            .map(|(c, r)| tool_response(opts.results, c, r))
            .collect();
        out.push_str("\n### 📥 Tool Responses\n\n");
        out.push_str(&responses.join("\n\n"));
    }
    out
}

fn system_tool(t: &SystemTool) -> String {
    match t {
        SystemTool::V0(v) => format!("- **Tool (V0):** `{}`", shown_encoding(v)),
        SystemTool::V1 {
            name,
            llm_name,
            description,
        } => format!("- **{name}** (`{llm_name}`)\n  - Description: {description}"),
    }
}

fn tool_call(vis: Visibility, call: &Value) -> String {
    let (name, holder) = match call.get("function") {
        Some(f @ Value::Object(_)) => (
            f.get("name").and_then(Value::as_str).unwrap_or("(unnamed)"),
            f,
        ),
        _ => match call.get("name").and_then(Value::as_str) {
            Some(n) => (n, call),
            None => return format!("- (unnamed tool call): `{}`", shown_encoding(call)),
        },
    };
    let args = match (vis, holder.get("arguments")) {
        (Visibility::Hidden, _) | (_, None) => String::new(),
        (vis, Some(a)) => {
            let formatted = pretty(&parse_arguments(a));
            let kept = apply(vis, &formatted);
            if kept.is_empty() {
                String::new()
            } else {
                format!(
                    "\n\n  ```json\n  {}\n  ```\n  _({})_",
                    kept.replace('\n', "\n  "),
                    bytes(formatted.len())
                )
            }
        }
    };
    format!("- **{name}**{args}")
}

fn tool_response(vis: Visibility, call: &Value, r: &ToolResponse) -> String {
    let name = display_name(call);
    let fenced = |fence: &str, text: &str| {
        let kept = apply(vis, text);
        if kept.is_empty() {
            String::new()
        } else {
            format!(
                "**{name}** response:\n```{fence}\n{kept}\n```\n_({})_",
                bytes(text.len())
            )
        }
    };
    match r {
        ToolResponse::Text(t) => fenced("", t),
        ToolResponse::Json(v) => fenced("json", &pretty(v)),
        ToolResponse::Media(m) => format!("**{name}** response:\n```\n{}\n```", media(m)),
        ToolResponse::Mixed(parts) => {
            let text: Vec<String> = parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => t.clone(),
                    Part::Media(m) => media(m),
                })
                .collect();
            fenced("", &text.join("\n"))
        }
    }
}

fn media(m: &Media) -> String {
    let name = m
        .filename
        .as_ref()
        .map(|f| format!(", {f}"))
        .unwrap_or_default();
    format!("[Media: {}{name}, {}]", m.mime, bytes(m.base64_len))
}

/// A recorded `arguments`: the JSON a string holds, else the value.
fn parse_arguments(a: &Value) -> Value {
    match a {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| a.clone()),
        other => other.clone(),
    }
}

/// JSON as agents-exe pretty-prints it (aeson-pretty: four spaces, keys
/// sorted).
pub fn pretty(v: &Value) -> String {
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    match serde::Serialize::serialize(v, &mut ser) {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => v.to_string(),
    }
}

/// agents-exe's `show (encode v)`: the compact JSON as a Haskell string
/// literal of its bytes (quoted, escaped, non-ASCII bytes in decimal).
fn shown_encoding(v: &Value) -> String {
    let json = serde_json::to_string(v).unwrap_or_default();
    let mut out = String::from("\"");
    let mut numeric = false;
    for b in json.bytes() {
        if numeric && b.is_ascii_digit() {
            out.push_str("\\&");
        }
        numeric = false;
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                out.push_str(&format!("\\{b}"));
                numeric = true;
            }
        }
    }
    out.push('"');
    out
}

fn apply(vis: Visibility, text: &str) -> String {
    match vis {
        Visibility::Hidden => String::new(),
        Visibility::Shown => text.to_string(),
        Visibility::Elided { leading, trailing } => elide_lines(leading, trailing, text),
    }
}

/// The first `leading` and last `trailing` lines, the rest counted.
pub fn elide_lines(leading: usize, trailing: usize, text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    // Haskell's `lines`: a final newline ends the last line.
    let lines: Vec<&str> = text
        .strip_suffix('\n')
        .unwrap_or(text)
        .split('\n')
        .collect();
    let total = lines.len();
    let (lead, trail) = (leading.min(total), trailing.min(total));
    if lead + trail >= total {
        return lines.join("\n");
    }
    let elided = total - lead - trail;
    format!(
        "{}\n... ({elided} line{} elided) ...\n{}",
        lines[..lead].join("\n"),
        if elided == 1 { "" } else { "s" },
        lines[total - trail..].join("\n")
    )
}

/// `12 B`, `3 KiB`, `5 MiB`, `1 GiB` (whole units, rounded down).
fn bytes(n: usize) -> String {
    const K: usize = 1024;
    match n {
        n if n >= K * K * K => format!("{} GiB", n / (K * K * K)),
        n if n >= K * K => format!("{} MiB", n / (K * K)),
        n if n >= K => format!("{} KiB", n / K),
        n => format!("{n} B"),
    }
}

/// `1,234,567`.
fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn bar(value: i64, max: i64) -> String {
    let filled = if max <= 0 {
        0
    } else {
        (value.max(0) as i128 * 60 / max as i128) as usize
    };
    "█".repeat(filled.min(60))
}

fn statistics(s: &Session) -> String {
    let count = |f: fn(&TurnKind) -> bool| s.turns.iter().filter(|t| f(&t.kind)).count();
    let users = count(|t| matches!(t, TurnKind::User(_)));
    let llms = count(|t| matches!(t, TurnKind::Llm(_)));
    let calls: Vec<&Value> = s.calls().map(|(_, _, c)| c).collect();
    let mut out = format!(
        "## 📊 Statistics\n\n### Turn Counts\n\n| Metric | Value |\n|--------|-------|\n| Total Turns | {} |\n| 👤 User Turns | {users} |\n| 🤖 LLM Turns | {llms} |\n\n### 🔧 Tool Calls\n\n**Total Tool Calls:** {}\n\n",
        s.turns.len(),
        calls.len()
    );
    out.push_str(&calls_by_name(&calls));
    out.push_str("\n### 💾 Byte Usage\n\n");
    out.push_str(&byte_chart(s));
    if let Some(tokens) = token_chart(s) {
        out.push_str("\n\n### 🎫 Token Usage\n\n");
        out.push_str(&tokens);
    }
    out.push_str("\n\n### 📡 Signal Metrics\n\n");
    out.push_str(&super::signals::render(&super::signals::Signals::of(s)));
    out
}

fn calls_by_name(calls: &[&Value]) -> String {
    let mut by_name = std::collections::BTreeMap::<&str, i64>::new();
    for c in calls {
        let name = display_name(c);
        if name != "(unnamed)" {
            *by_name.entry(name).or_default() += 1;
        }
    }
    if by_name.is_empty() {
        return "_No tool calls recorded_\n".into();
    }
    let max = by_name.values().copied().max().unwrap_or(0);
    let mut sorted: Vec<_> = by_name.into_iter().collect();
    sorted.sort_by_key(|(_, n)| -n);
    let mut out = String::new();
    for (name, n) in sorted {
        out.push_str(&format!(
            "`{}` {} {}\n\n",
            pad_right(name, 20),
            pad_left(&n.to_string(), 4),
            bar(n, max)
        ));
    }
    out
}

/// agents-exe's byte counts: what the user side sent (system prompt,
/// query, tool results; a text result counted at four bytes a
/// character), the model's text, its thinking.
fn byte_counts(s: &Session) -> (i64, i64, i64) {
    let (mut input, mut output, mut reasoning) = (0i64, 0i64, 0i64);
    let chars4 = |t: &str| t.chars().count() as i64 * 4;
    for t in &s.turns {
        match &t.kind {
            TurnKind::User(u) => {
                input += u.system_prompt.len() as i64;
                input += u.query.as_ref().map_or(0, |q| q.len() as i64);
                for (_, r) in &u.responses {
                    input += match r {
                        ToolResponse::Text(t) => chars4(t),
                        ToolResponse::Json(v) => {
                            serde_json::to_string(v).map_or(0, |j| j.len()) as i64
                        }
                        ToolResponse::Media(m) => m.base64_len as i64,
                        ToolResponse::Mixed(parts) => parts
                            .iter()
                            .map(|p| match p {
                                Part::Text(t) => chars4(t),
                                Part::Media(m) => m.base64_len as i64,
                            })
                            .sum(),
                    };
                }
            }
            TurnKind::Llm(l) => {
                output += l.text.as_ref().map_or(0, |t| t.len() as i64);
                reasoning += l.thinking.as_ref().map_or(0, |t| t.len() as i64);
            }
            TurnKind::Partial { .. } => {}
        }
    }
    (input, output, reasoning)
}

fn byte_chart(s: &Session) -> String {
    let (input, output, reasoning) = byte_counts(s);
    let total = input + output + reasoning;
    if total == 0 {
        return "_No byte data recorded_\n".into();
    }
    let rows = [
        ("Input", input),
        ("Output", output),
        ("Reasoning", reasoning),
    ];
    let max = rows.iter().map(|r| r.1).max().unwrap_or(0);
    let bars: Vec<String> = rows
        .iter()
        .map(|(label, n)| {
            format!(
                "`{}` {} {}",
                pad_right(label, 10),
                pad_left(&bytes(*n as usize), 10),
                bar(*n, max)
            )
        })
        .collect();
    format!(
        "{}\n**Total:** {}\n",
        bars.join("\n\n"),
        bytes(total as usize)
    )
}

fn token_chart(s: &Session) -> Option<String> {
    let usages: Vec<_> = s.turns.iter().filter_map(|t| t.tokens.as_ref()).collect();
    if usages.is_empty() {
        return None;
    }
    let sum = |f: fn(&super::model::TokenUsage) -> i64| {
        usages.iter().fold(0i64, |a, u| a.saturating_add(f(u)))
    };
    let sum_some = |f: fn(&super::model::TokenUsage) -> Option<i64>| {
        let vs: Vec<i64> = usages.iter().filter_map(|u| f(u)).collect();
        (!vs.is_empty()).then(|| vs.iter().fold(0i64, |a, v| a.saturating_add(*v)))
    };
    let total = sum(|u| u.total);
    if total == 0 {
        return Some("_No token data recorded_\n".into());
    }
    let cached = sum_some(|u| u.cached).filter(|n| *n > 0);
    let thinking = sum_some(|u| u.thinking).filter(|n| *n > 0);
    let mut rows: Vec<(&str, i64)> = [
        ("Prompt", sum(|u| u.prompt)),
        ("Completion", sum(|u| u.completion)),
    ]
    .into_iter()
    .filter(|r| r.1 > 0)
    .collect();
    rows.extend(cached.map(|n| ("Cached", n)));
    rows.extend(thinking.map(|n| ("Thinking", n)));
    let max = rows.iter().map(|r| r.1).max().unwrap_or(1);
    let bars: Vec<String> = rows
        .iter()
        .map(|(label, n)| {
            format!(
                "`{}` {} {}",
                pad_right(label, 12),
                pad_left(&thousands(*n), 10),
                bar(*n, max)
            )
        })
        .collect();
    let mut out = format!("{}\n**Total:** {}\n", bars.join("\n\n"), thousands(total));
    if let Some(n) = cached {
        out.push_str(&format!("\n_({} cached)_\n", thousands(n)));
    }
    if let Some(n) = thinking {
        out.push_str(&format!("\n_({} thinking tokens)_\n", thousands(n)));
    }
    Some(out)
}

/// `run --session-xs|s|m|l|xl`: how much of a prior session a prompt
/// carries (`session-print --as-prompt SIZE` shows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Verbosity {
    /// Queries and answers; steps that only call tools left out.
    Xs,
    /// And the thinking, and the names of the tools called.
    S,
    /// And the counts of steps and calls.
    M,
    /// And each call as recorded.
    L,
    /// As L.
    Xl,
}

/// A prior session rendered for a prompt, as agents-exe's `run
/// --session-*` directives render it: its own compact layout, oldest step
/// first (not `session-print`'s report).
pub fn render_for_prompt(v: Verbosity, s: &Session) -> String {
    let kept: Vec<&TurnKind> = s
        .turns
        .iter()
        .map(|t| &t.kind)
        .filter(|t| v != Verbosity::Xs || !tool_only(t))
        .collect();
    let steps: Vec<String> = kept
        .iter()
        .rev()
        .enumerate()
        .map(|(i, t)| prompt_step(v, i + 1, t))
        .collect();
    let header = match v {
        Verbosity::Xs => "## Session Summary (minimal)\n\n",
        Verbosity::S => "## Session Summary\n\n",
        Verbosity::M => "## Session Summary with Statistics\n\n",
        Verbosity::L | Verbosity::Xl => "## Complete Session\n\n",
    };
    let stats = if v >= Verbosity::M {
        let count = |f: fn(&TurnKind) -> bool| s.turns.iter().filter(|t| f(&t.kind)).count();
        format!(
            "**Statistics:**\n- Total turns: {}\n- User turns: {}\n- Assistant turns: {}\n- Total tool calls: {}\n\n",
            s.turns.len(),
            count(|t| matches!(t, TurnKind::User(_))),
            count(|t| matches!(t, TurnKind::Llm(_))),
            s.calls().count()
        )
    } else {
        String::new()
    };
    format!("{header}{stats}{}", steps.join("\n---\n\n"))
}

/// A step with no query and no answer: only calls, or only their results.
fn tool_only(t: &TurnKind) -> bool {
    match t {
        TurnKind::User(u) => u.query.is_none() && u.responses.is_empty(),
        TurnKind::Llm(l) => l.text.is_none() && !l.calls.is_empty(),
        TurnKind::Partial { .. } => false,
    }
}

fn prompt_step(v: Verbosity, n: usize, t: &TurnKind) -> String {
    match t {
        TurnKind::User(u) => {
            let mut out = format!("### Turn {n} (User)\n\n");
            if let Some(q) = &u.query {
                out.push_str(&format!("**User:** {q}\n\n"));
            }
            if !u.responses.is_empty() {
                out.push_str("_(tool responses available at higher verbosity)_\n\n");
            }
            out
        }
        TurnKind::Llm(l) => {
            let mut out = format!("### Turn {n} (Assistant)\n\n");
            if v >= Verbosity::S {
                if let Some(t) = &l.thinking {
                    out.push_str(&format!("**Thinking:**\n```\n{t}\n```\n\n"));
                }
            }
            match &l.text {
                Some(t) => out.push_str(&format!("**Assistant:** {t}\n\n")),
                None => out.push_str("_(no response text)_\n\n"),
            }
            if v >= Verbosity::S && !l.calls.is_empty() {
                let names: Vec<&str> = l.calls.iter().map(display_name).collect();
                out.push_str(&format!("**Tools called:** {}\n\n", names.join(", ")));
            }
            if v >= Verbosity::L && !l.calls.is_empty() {
                let details: Vec<String> = l
                    .calls
                    .iter()
                    .map(|c| format!("- `{}`: `{}`", display_name(c), shown_encoding(c)))
                    .collect();
                out.push_str(&format!("**Tool call details:**\n{}", details.join("\n")));
            }
            out
        }
        TurnKind::Partial { .. } => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session() -> Session {
        let call = json!({"id": "a", "type": "function",
            "function": {"name": "bash_ls", "arguments": "{\"dir\":\"/tmp\"}"}});
        Session::parse(&json!({"sessionId": "0b7c", "turnId": "t", "turns": [
            {"tag": "LlmTurn", "contents": {"llmResponse": {"responseText": "done",
                "responseThinking": null, "rawResponse": {}}, "llmToolCalls": []},
             "byteUsage": {"stepTotalBytes": 0, "stepInputBytes": 0, "stepOutputBytes": 0,
                "stepReasoningBytes": 0, "stepToolBytes": 0,
                "stepTokenUsage": {"prompt_tokens": 1200, "completion_tokens": 34,
                    "total_tokens": 1234, "cached_tokens": 1000}}},
            {"tag": "UserTurn", "contents": {"userPrompt": "be brief\n", "userTools": [],
                "userQuery": null, "userToolResponses": [[call, {"type": "text", "content": "a\nb"}]]}},
            {"tag": "LlmTurn", "contents": {"llmResponse": {"responseText": null,
                "responseThinking": "look first", "rawResponse": {}}, "llmToolCalls": [call]}},
            {"tag": "UserTurn", "contents": {"userPrompt": "be brief\n", "userTools": [
                {"tag": "V1", "contents": {"name": "ls", "llmName": "bash_ls",
                    "description": "lists", "properties": [], "raw": {}}}],
                "userQuery": {"text": "what is in /tmp?", "media": []}, "userToolResponses": []}}
        ]}))
        .unwrap()
    }

    #[test]
    fn a_session_prints_as_agents_exe_prints_it() {
        let opts = PrintOptions {
            results: Visibility::Shown,
            arguments: Visibility::Shown,
            no_funny_stamp: true,
            ..PrintOptions::default()
        };
        let md = render(&session(), &opts);
        assert!(md.starts_with("# 📋 Session Report\n\n**🔑 Session ID:** 0b7c\n\n---\n\n## 📊 Statistics\n\n### Turn Counts\n\n| Metric | Value |\n|--------|-------|\n| Total Turns | 4 |\n| 👤 User Turns | 2 |\n| 🤖 LLM Turns | 2 |\n\n### 🔧 Tool Calls\n\n**Total Tool Calls:** 1\n\n`bash_ls             `    1 ████"), "{md}");
        assert!(
            md.contains("\n**Total:** 1,234\n\n_(1,000 cached)_\n"),
            "{md}"
        );
        assert!(md.contains("## 👤 Step 1: User Turn\n\n### 📝 System Prompt\n\n```\nbe brief\n```\n\n### 💬 User Query\n\nwhat is in /tmp?\n\n### 🛠️ Available Tools\n\n- **ls** (`bash_ls`)\n  - Description: lists\n\n---\n\n## 🤖 Step 2: LLM Turn\n\n### 💭 Thinking Process\n\n<details>\n<summary>Click to expand reasoning</summary>\n\nlook first\n</details>\n\n### 💬 Response\n\n_(No text response)_\n\n### 🔧 Tool Calls\n\n- **bash_ls**\n\n  ```json\n  {\n      \"dir\": \"/tmp\"\n  }\n  ```\n  _(21 B)_\n\n---\n\n## 👤 Step 3: User Turn\n\n\n### 📥 Tool Responses\n\n**bash_ls** response:\n```\na\nb\n```\n_(3 B)_\n\n---\n\n## 🤖 Step 4: LLM Turn\n\n### 💬 Response\n\ndone\n"), "{md}");
        // The system prompt is shown on the first step shown only.
        assert_eq!(md.matches("System Prompt").count(), 1);
    }

    #[test]
    fn the_last_turns_newest_first() {
        let opts = PrintOptions {
            n_turns: Some(2),
            antichronological: true,
            ..PrintOptions::default()
        };
        let md = render(&session(), &opts);
        let four = md.find("Step 4: LLM Turn").unwrap();
        let three = md.find("Step 3: User Turn").unwrap();
        assert!(four < three && !md.contains("Step 2"), "{md}");
        // Only the first step shown (4, the model's) may show the system
        // prompt: agents-exe's rule, so here none does.
        assert!(!md.contains("System Prompt"), "{md}");
        assert!(md.ends_with("\n\n_(Showing last 2 turns)_\n"), "{md}");
        assert!(
            md.starts_with("```                   # 📋 Session Report\n    λλ              \n"),
            "{md}"
        );
    }

    #[test]
    fn elision_keeps_both_ends_and_counts_the_middle() {
        assert_eq!(
            elide_lines(2, 2, "1\n2\n3\n4\n5"),
            "1\n2\n... (1 line elided) ...\n4\n5"
        );
        assert_eq!(
            elide_lines(1, 1, "1\n2\n3\n4\n"),
            "1\n... (2 lines elided) ...\n4"
        );
        assert_eq!(elide_lines(3, 3, "a\nb\n"), "a\nb");
        assert_eq!(elide_lines(3, 3, ""), "");
    }

    #[test]
    fn the_five_prompt_renderings_grow() {
        let s = session();
        let xs = render_for_prompt(Verbosity::Xs, &s);
        assert_eq!(xs, "## Session Summary (minimal)\n\n### Turn 1 (User)\n\n**User:** what is in /tmp?\n\n\n---\n\n### Turn 2 (User)\n\n_(tool responses available at higher verbosity)_\n\n\n---\n\n### Turn 3 (Assistant)\n\n**Assistant:** done\n\n");
        let s_ = render_for_prompt(Verbosity::S, &s);
        assert!(s_.contains("**Thinking:**\n```\nlook first\n```\n\n_(no response text)_\n\n**Tools called:** bash_ls\n\n"), "{s_}");
        let m = render_for_prompt(Verbosity::M, &s);
        assert!(m.starts_with("## Session Summary with Statistics\n\n**Statistics:**\n- Total turns: 4\n- User turns: 2\n- Assistant turns: 2\n- Total tool calls: 1\n\n"), "{m}");
        let l = render_for_prompt(Verbosity::L, &s);
        assert!(
            l.contains(
                "**Tool call details:**\n- `bash_ls`: `\"{\\\"function\\\":{\\\"arguments\\\":"
            ),
            "{l}"
        );
        assert_eq!(
            l.replace("## Complete Session", ""),
            render_for_prompt(Verbosity::Xl, &s).replace("## Complete Session", "")
        );
    }
}
