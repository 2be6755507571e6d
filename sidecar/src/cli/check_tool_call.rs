//! `check-tool-call -t PATH`: does a tool call's arguments (JSON on stdin)
//! fit a bash tool script's `describe`? agents-exe's command, with its
//! messages and exit codes: the verdict on stdout, exit 0 when they fit
//! and 1 with each problem numbered when not; a script that does not load
//! or a payload that is not JSON is an error on stderr (exit 1).
//!
//! Bash arguments carry any JSON value (a non-string travels as its JSON
//! text), so only the names are checked: no unknown one, and every
//! `single` one present. agents-exe requires the `optional` ones too
//! (it marks every bash argument required); Bindery's model is told they
//! are optional, so they may be left out.

use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

use bindery_tools::bash::{load_script, Arity, Limits, ScriptArg};

/// One problem: where (an argument's name; empty for the whole payload)
/// and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: &'static str,
}

/// What is wrong with `payload` as the arguments of a script taking `args`.
pub fn problems(args: &[ScriptArg], payload: &Value) -> Vec<Problem> {
    let required = args.iter().filter(|a| a.arity == Arity::Single);
    let problem = |path: &str, message| Problem {
        path: path.to_string(),
        message,
    };
    match payload {
        Value::Object(given) => {
            let mut unknown: Vec<&String> = given
                .keys()
                .filter(|k| !args.iter().any(|a| &a.name == *k))
                .collect();
            unknown.sort();
            unknown
                .into_iter()
                .map(|k| problem(k, "Unknown property (not in schema)"))
                .chain(
                    required
                        .filter(|a| !given.contains_key(&a.name))
                        .map(|a| problem(&a.name, "Required property missing")),
                )
                .collect()
        }
        Value::Null => required
            .map(|a| {
                problem(
                    &a.name,
                    "Required property missing (input was null or missing)",
                )
            })
            .collect(),
        _ => vec![problem("", "Tool input must be a JSON object")],
    }
}

/// agents-exe's report of `problems` for the tool `tool`.
pub fn report(tool: &str, problems: &[Problem]) -> String {
    let n = problems.len();
    let mut out = format!(
        "Tool call validation failed for '{tool}' with {n} error{}:\n\n",
        if n == 1 { "" } else { "s" }
    );
    for (i, p) in problems.iter().enumerate() {
        if p.path.is_empty() {
            out.push_str(&format!("{}. {}\n", i + 1, p.message));
        } else {
            out.push_str(&format!("{}. {}: {}\n", i + 1, p.path, p.message));
        }
    }
    out.push_str("\nPlease correct these issues and try again.\n");
    out
}

/// Why a tool call's payload was not checked. The texts are agents-exe's
/// (the first two printed without `error: `, as agents-exe prints them).
#[derive(Debug, thiserror::Error)]
pub enum CheckCallError {
    #[error("Failed to load tool: {0}")]
    Script(#[source] bindery_tools::bash::ScriptError),
    #[error("Error: Invalid JSON input from stdin ({0})")]
    NotJson(#[source] serde_json::Error),
    #[error("error: {0}")]
    Stdin(#[from] super::prompt_script::PromptError),
}

pub async fn main(tool: &Path) -> Result<ExitCode, CheckCallError> {
    let script = load_script(tool, Limits::default())
        .await
        .map_err(CheckCallError::Script)?;
    let text = super::prompt_script::read_stdin("the tool call's arguments")?;
    let payload: Value = serde_json::from_str(&text).map_err(CheckCallError::NotJson)?;
    let found = problems(&script.info().args, &payload);
    if found.is_empty() {
        println!("✓ Tool call payload is valid");
        return Ok(ExitCode::SUCCESS);
    }
    let name = format!("{} ({})", tool.display(), script.info().slug);
    // The report quotes the payload's names: made safe for a terminal.
    println!(
        "{}",
        super::terminal_text::for_terminal(&report(&name, &found))
    );
    Ok(ExitCode::FAILURE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_tools::bash::Mode;
    use serde_json::json;

    fn arg(name: &str, arity: Arity) -> ScriptArg {
        ScriptArg {
            name: name.into(),
            description: String::new(),
            type_: "string".into(),
            backing_type: None,
            arity,
            mode: Mode::Positional,
        }
    }

    fn args() -> Vec<ScriptArg> {
        vec![
            arg("path", Arity::Single),
            arg("limit", Arity::Optional),
            arg("mode", Arity::Single),
        ]
    }

    #[test]
    fn any_value_fits_and_optional_arguments_may_be_left_out() {
        let ok = json!({"path": 3, "mode": {"deep": true}});
        assert_eq!(problems(&args(), &ok), []);
        assert_eq!(problems(&[], &json!({})), []);
        assert_eq!(problems(&[], &Value::Null), []);
    }

    #[test]
    fn unknown_names_sorted_then_missing_ones_in_order() {
        let got = problems(&args(), &json!({"zeta": 1, "alpha": 2, "limit": "5"}));
        let said: Vec<(&str, &str)> = got.iter().map(|p| (p.path.as_str(), p.message)).collect();
        assert_eq!(
            said,
            [
                ("alpha", "Unknown property (not in schema)"),
                ("zeta", "Unknown property (not in schema)"),
                ("path", "Required property missing"),
                ("mode", "Required property missing"),
            ]
        );
        assert_eq!(problems(&args(), &Value::Null).len(), 2);
        assert_eq!(
            problems(&args(), &json!([1])),
            [Problem {
                path: String::new(),
                message: "Tool input must be a JSON object"
            }]
        );
    }

    #[test]
    fn the_report_numbers_each_problem() {
        let one = report(
            "t.sh (t)",
            &[Problem {
                path: String::new(),
                message: "Tool input must be a JSON object",
            }],
        );
        assert_eq!(
            one,
            "Tool call validation failed for 't.sh (t)' with 1 error:\n\n1. Tool input must be a JSON object\n\nPlease correct these issues and try again.\n"
        );
        let two = report("t", &problems(&args(), &json!({})));
        assert!(
            two.contains("with 2 errors:\n\n1. path: Required property missing\n2. mode: "),
            "{two}"
        );
    }
}
