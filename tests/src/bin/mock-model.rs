//! `mock-model`: the tests' scripted OpenAI-compatible model as a server,
//! for trying an agent with no API key and no network (the README's first
//! run). A user's message makes it call a tool; the tool's result makes it
//! answer with that result.
//!
//! ```text
//! mock-model [--listen 127.0.0.1:9090] [--tool NAME] [--args JSON]
//! ```
//!
//! `--tool` defaults to the first tool the request offers, `--args` to
//! `{}`. It prints `listening on http://ADDR` and serves until Ctrl-C or
//! SIGTERM.

use std::process::ExitCode;

use bindery_tests::mock_llm::{first_tool_then_answer, MockLlm};
use serde_json::Value;

const USAGE: &str = "usage: mock-model [--listen HOST:PORT] [--tool NAME] [--args JSON]";

#[derive(Debug)]
struct Options {
    listen: String,
    tool: Option<String>,
    args: Value,
}

fn options(mut argv: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut o = Options {
        listen: "127.0.0.1:9090".into(),
        tool: None,
        args: Value::Object(Default::default()),
    };
    while let Some(flag) = argv.next() {
        let mut value = || {
            argv.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--listen" => o.listen = value()?,
            "--tool" => o.tool = Some(value()?),
            "--args" => {
                let text = value()?;
                o.args = serde_json::from_str(&text)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| format!("--args {text}: not a JSON object"))?;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(o)
}

#[tokio::main]
async fn main() -> ExitCode {
    let o = match options(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&o.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mock-model: cannot listen on {}: {e}", o.listen);
            return ExitCode::FAILURE;
        }
    };
    let mock = MockLlm::serve(listener, first_tool_then_answer(o.tool, o.args));
    println!("listening on http://{}", mock.addr());
    eprintln!(
        "mock-model: point an agent at {} (serve --model-url {})",
        mock.url(),
        mock.url()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    mock.shutdown().await;
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, String> {
        options(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn options_have_defaults_and_name_what_is_wrong() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.listen, "127.0.0.1:9090");
        assert_eq!(o.tool, None);
        assert_eq!(o.args, serde_json::json!({}));
        let o = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--tool",
            "t",
            "--args",
            r#"{"a": 1}"#,
        ])
        .unwrap();
        assert_eq!(
            (o.listen.as_str(), o.tool.as_deref()),
            ("127.0.0.1:0", Some("t"))
        );
        assert_eq!(o.args, serde_json::json!({"a": 1}));
        assert!(parse(&["--args", "[1]"])
            .unwrap_err()
            .contains("not a JSON object"));
        assert!(parse(&["--listen"])
            .unwrap_err()
            .contains("--listen needs a value"));
        assert!(parse(&["--port", "1"])
            .unwrap_err()
            .contains("unknown argument `--port`"));
    }
}
