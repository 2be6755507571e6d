//! Asking a person on the terminal about the calls a run (`run`), one
//! call (`tool-call`) or a server's session (`session follow`) waits for.

use serde_json::Value;

use bindery_session::run;
use bindery_store::pending::{PendingCall, Resolution};
use bindery_tools::Disposition;

/// Why a waiting call got no answer here.
#[derive(Debug, thiserror::Error)]
pub(super) enum AskError {
    #[error("reading the terminal: {0}")]
    Terminal(#[source] std::io::Error),
    #[error("{tool} waits in a way this client does not know ({disposition})")]
    UnknownDisposition { tool: String, disposition: String },
    #[error("--choose `{said}` is none of the options of {tool}: {offered}")]
    NoSuchOption {
        said: String,
        tool: String,
        offered: String,
    },
    #[error("no input given for {tool}")]
    NoInput { tool: String },
    #[error("no result given for {tool}")]
    NoResult { tool: String },
}

/// Ask on the terminal about each waiting call: y/n for a confirmation
/// (`yes`: approved without asking), a choice among a lookup's options
/// (`choose`: the option's id, number or label, without asking), the
/// result for a deferred call. Only the model's arguments are shown: a
/// bound value never is. An approval or a choice is taken only from a
/// terminal: with stdin piped it is refused.
pub(super) fn ask_terminal(
    calls: &[run::Blocked],
    yes: bool,
    choose: Option<&str>,
) -> Result<Vec<PendingCall>, AskError> {
    let mut out = Vec::new();
    for b in calls {
        let mut call = pending(b);
        // The item as the session API would show it, for the same prompts.
        let item = serde_json::to_value(call.shown()).expect("a pending item is plain JSON");
        call.resolution = Some(ask_item(&item, yes, choose)?);
        out.push(call);
    }
    Ok(out)
}

/// Each waiting call refused, with `why`: where nobody can be asked.
pub(super) fn refuse_all(calls: &[run::Blocked], why: &str) -> Vec<PendingCall> {
    calls
        .iter()
        .map(|b| PendingCall {
            resolution: Some(Resolution::Rejected {
                reason: Some(why.to_string()),
            }),
            ..pending(b)
        })
        .collect()
}

/// A waiting call as a pending item, not answered yet.
fn pending(b: &run::Blocked) -> PendingCall {
    PendingCall {
        tool_call_id: b.call.id.clone(),
        tool: b.call.name.clone(),
        disposition: b.disposition,
        call: run::call_arguments(&b.call),
        bound_params: b.bound_params.clone(),
        digest: String::new(),
        nonce: String::new(),
        token_digest: String::new(),
        expires_at: None,
        resolution: None,
        frames: b.frames.clone(),
        lookup: b.lookup.clone(),
        tainted_by: b.tainted_by.clone(),
        budget: b.budget.clone(),
    }
}

/// The option `said` names among `options` (as a pending item shows them):
/// its id, its one-based number, or its label.
pub(super) fn option_named(options: &Value, said: &str) -> Option<String> {
    let said = said.trim();
    let options = options.as_array()?;
    let id = |o: &Value| o["id"].as_str().map(str::to_string);
    if let Some(o) = options.iter().find(|o| o["id"] == said) {
        return id(o);
    }
    if let Ok(n) = said.parse::<usize>() {
        return n.checked_sub(1).and_then(|i| options.get(i)).and_then(id);
    }
    options.iter().find(|o| o["label"] == said).and_then(id)
}

/// Ask about one waiting call, given as a session's `pending` item shows it
/// (`tool`, `disposition`, `call`, and `options`, `facts`, `missing` when
/// it has them); `yes` and `choose` answer without asking.
pub(super) fn ask_item(
    item: &Value,
    yes: bool,
    choose: Option<&str>,
) -> Result<Resolution, AskError> {
    use std::io::{BufRead, Write};
    let stdin = std::io::stdin();
    let line = || -> Result<Option<String>, AskError> {
        let mut s = String::new();
        match stdin.lock().read_line(&mut s) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(s.trim_end_matches(['\n', '\r']).to_string())),
            Err(e) => Err(AskError::Terminal(e)),
        }
    };
    // What the person reads is the model's (or a file's) text: it may not
    // drive the terminal nor reorder what is shown (bidi marks).
    let shown = |text: &str| super::terminal_text::for_terminal(text).into_owned();
    let tool = &shown(item["tool"].as_str().unwrap_or("the tool"));
    let args = &shown(&item["call"].to_string());
    // A decision (an approval, a choice) is a person's: piped stdin is
    // data (a calling tool's, a script's), never taken as one.
    let nobody = |what: &str| {
        eprintln!("{tool} {args} needs {what}, and stdin is not a terminal: refused (--yes approves, --choose chooses)");
        Resolution::Rejected {
            reason: Some(format!(
                "{what} was needed and nobody was at a terminal to give it"
            )),
        }
    };
    let person = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let disposition = match item["disposition"].as_str() {
        Some("deferred") => Disposition::Deferred,
        Some("confirm") => Disposition::Confirm,
        Some("needs_input") => Disposition::NeedsInput,
        Some("needs_selection") => Disposition::NeedsSelection,
        Some("needs_confirmation") => Disposition::NeedsConfirmation,
        Some("budget") => Disposition::Budget,
        other => {
            return Err(AskError::UnknownDisposition {
                tool: tool.clone(),
                disposition: other.unwrap_or("none given").to_string(),
            })
        }
    };
    let offered = || -> Vec<String> {
        item["options"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                shown(&format!(
                    "{} ({})",
                    o["id"].as_str().unwrap_or_default(),
                    o["label"].as_str().unwrap_or_default()
                ))
            })
            .collect()
    };
    Ok(match disposition {
        Disposition::Budget => {
            let budget: Option<bindery_session::budget::Exceeded> =
                serde_json::from_value(item["budget"].clone()).ok();
            let what = budget
                .map(|b| b.detail())
                .unwrap_or_else(|| "a budget is used up".into());
            if yes {
                eprintln!("{what}: the run goes on (--yes)");
                return Ok(Resolution::Approved);
            }
            if !person {
                return Ok(nobody("a person's leave to go past a budget"));
            }
            eprint!("{what}. Let this run go on to its end? [y/N] ");
            let _ = std::io::stderr().flush();
            match line()?.as_deref().map(str::trim) {
                Some("y" | "Y" | "yes") => Resolution::Approved,
                _ => Resolution::Rejected { reason: None },
            }
        }
        Disposition::NeedsConfirmation | Disposition::Confirm if yes => {
            eprintln!("{tool} {args}: approved (--yes)");
            Resolution::Approved
        }
        Disposition::NeedsConfirmation | Disposition::Confirm if !person => {
            nobody("a person's approval")
        }
        Disposition::NeedsConfirmation | Disposition::Confirm => {
            let facts = match item.get("facts") {
                Some(f) if !f.is_null() => format!(" ({})", shown(&f.to_string())),
                _ => String::new(),
            };
            eprint!("{tool} wants to run with {args}{facts}. Approve? [y/N] ");
            let _ = std::io::stderr().flush();
            match line()?.as_deref().map(str::trim) {
                Some("y" | "Y" | "yes") => Resolution::Approved,
                _ => Resolution::Rejected { reason: None },
            }
        }
        Disposition::NeedsSelection if choose.is_some() => {
            let said = choose.unwrap_or_default();
            match option_named(&item["options"], said) {
                Some(option) => {
                    eprintln!("{tool} needs a choice: `{said}` (--choose)");
                    Resolution::Chosen { option }
                }
                None => {
                    return Err(AskError::NoSuchOption {
                        said: said.to_string(),
                        tool: tool.clone(),
                        offered: offered().join(", "),
                    });
                }
            }
        }
        Disposition::NeedsSelection if !person => nobody("a person's choice"),
        Disposition::NeedsSelection => {
            eprintln!("{tool} needs a choice:");
            for (n, o) in item["options"].as_array().into_iter().flatten().enumerate() {
                eprintln!(
                    "  {}. {}",
                    n + 1,
                    shown(o["label"].as_str().unwrap_or_default())
                );
            }
            eprint!("your choice (number or label): ");
            let _ = std::io::stderr().flush();
            let said = line()?.unwrap_or_default();
            match option_named(&item["options"], &said) {
                Some(option) => Resolution::Chosen { option },
                None => Resolution::Rejected {
                    reason: Some(format!("`{said}` is none of the options")),
                },
            }
        }
        Disposition::NeedsInput => {
            eprint!(
                "{tool} {args} needs {} (a JSON object): ",
                item.get("missing").cloned().unwrap_or_default()
            );
            let _ = std::io::stderr().flush();
            match line()?.and_then(|l| serde_json::from_str(&l).ok()) {
                Some(values) => Resolution::Input { values },
                None => return Err(AskError::NoInput { tool: tool.clone() }),
            }
        }
        Disposition::Deferred => {
            eprint!("{tool} {args} is yours to run; its result: ");
            let _ = std::io::stderr().flush();
            match line()? {
                Some(output) => Resolution::Result { output },
                None => return Err(AskError::NoResult { tool: tool.clone() }),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_option_is_named_by_id_number_or_label() {
        let options = json!([{"id": "c-7", "label": "Acme"}, {"id": "c-9", "label": "Beta"}]);
        assert_eq!(option_named(&options, "c-9").as_deref(), Some("c-9"));
        assert_eq!(option_named(&options, "1").as_deref(), Some("c-7"));
        assert_eq!(option_named(&options, " Beta ").as_deref(), Some("c-9"));
        assert_eq!(option_named(&options, "3"), None);
        assert_eq!(option_named(&options, "Gamma"), None);
    }
}
