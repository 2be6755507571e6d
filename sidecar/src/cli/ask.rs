//! Asking a person on the terminal about the calls a run (`run`) or one
//! call (`tool-call`) waits for.

use crate::session::pending::{PendingCall, Resolution};
use crate::session::runner;
use crate::tools::Disposition;

/// Ask on the terminal about each waiting call: y/n for a confirmation
/// (`yes`: approved without asking), a choice among a lookup's options
/// (`choose`: the option's id, number or label, without asking), the
/// result for a deferred call. Only the model's arguments are shown: a
/// bound value never is.
pub(super) fn ask_terminal(
    calls: &[runner::Blocked],
    yes: bool,
    choose: Option<&str>,
) -> Result<Vec<PendingCall>, String> {
    use std::io::{BufRead, Write};
    let stdin = std::io::stdin();
    let line = || -> Result<Option<String>, String> {
        let mut s = String::new();
        match stdin.lock().read_line(&mut s) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(s.trim_end_matches(['\n', '\r']).to_string())),
            Err(e) => Err(format!("error: reading the terminal: {e}")),
        }
    };
    let mut out = Vec::new();
    for b in calls {
        let args = runner::call_arguments(&b.call);
        let resolution = match b.disposition {
            Disposition::NeedsConfirmation | Disposition::Confirm if yes => {
                eprintln!("{} {args}: approved (--yes)", b.call.name);
                Resolution::Approved
            }
            Disposition::NeedsConfirmation | Disposition::Confirm => {
                let facts = b
                    .lookup
                    .as_ref()
                    .map(|l| format!(" ({})", l.shown()["facts"]))
                    .unwrap_or_default();
                eprint!(
                    "{} wants to run with {args}{facts}. Approve? [y/N] ",
                    b.call.name
                );
                let _ = std::io::stderr().flush();
                match line()?.as_deref().map(str::trim) {
                    Some("y" | "Y" | "yes") => Resolution::Approved,
                    _ => Resolution::Rejected { reason: None },
                }
            }
            Disposition::NeedsSelection if choose.is_some() => {
                let said = choose.unwrap_or_default();
                let state = b.lookup.as_ref().map(|l| l.shown()).unwrap_or_default();
                let by_id = state["options"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|o| o["id"] == said)
                    .and_then(|o| o["id"].as_str().map(str::to_string));
                match by_id.or_else(|| b.lookup.as_ref().and_then(|l| l.option_named(said))) {
                    Some(option) => {
                        eprintln!("{} needs a choice: `{said}` (--choose)", b.call.name);
                        Resolution::Chosen { option }
                    }
                    None => {
                        let offered: Vec<String> = state["options"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|o| {
                                format!(
                                    "{} ({})",
                                    o["id"].as_str().unwrap_or_default(),
                                    o["label"].as_str().unwrap_or_default()
                                )
                            })
                            .collect();
                        return Err(format!(
                            "error: --choose `{said}` is none of the options of {}: {}",
                            b.call.name,
                            offered.join(", ")
                        ));
                    }
                }
            }
            Disposition::NeedsSelection => {
                let state = b.lookup.as_ref().map(|l| l.shown()).unwrap_or_default();
                eprintln!("{} needs a choice:", b.call.name);
                for (n, o) in state["options"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    eprintln!("  {}. {}", n + 1, o["label"].as_str().unwrap_or_default());
                }
                eprint!("your choice (number or label): ");
                let _ = std::io::stderr().flush();
                let said = line()?.unwrap_or_default();
                match b.lookup.as_ref().and_then(|l| l.option_named(&said)) {
                    Some(option) => Resolution::Chosen { option },
                    None => Resolution::Rejected {
                        reason: Some(format!("`{said}` is none of the options")),
                    },
                }
            }
            Disposition::NeedsInput => {
                let missing = b.lookup.as_ref().map(|l| l.shown()["missing"].clone());
                eprint!(
                    "{} {args} needs {} (a JSON object): ",
                    b.call.name,
                    missing.unwrap_or_default()
                );
                let _ = std::io::stderr().flush();
                match line()?.and_then(|l| serde_json::from_str(&l).ok()) {
                    Some(values) => Resolution::Input { values },
                    None => return Err(format!("error: no input given for {}", b.call.name)),
                }
            }
            Disposition::Deferred => {
                eprint!("{} {args} is yours to run; its result: ", b.call.name);
                let _ = std::io::stderr().flush();
                match line()? {
                    Some(output) => Resolution::Result { output },
                    None => return Err(format!("error: no result given for {}", b.call.name)),
                }
            }
        };
        out.push(PendingCall {
            tool_call_id: b.call.id.clone(),
            tool: b.call.name.clone(),
            disposition: b.disposition,
            call: args,
            bound_params: b.bound_params.clone(),
            digest: String::new(),
            nonce: String::new(),
            token_digest: String::new(),
            expires_at: None,
            resolution: Some(resolution),
            frames: b.frames.clone(),
            lookup: b.lookup.clone(),
        });
    }
    Ok(out)
}
