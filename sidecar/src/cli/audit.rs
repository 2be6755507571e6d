//! `bindery-sidecar audit`: export a server's audit log (an HTTP client of
//! `GET /v1/audit`, as `session` is of the session API) and verify an
//! exported file: the chain (seqs, each `prev` and `hash`) and, given the
//! anchor an export printed, that nothing was cut off its end.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::session_client::{read_answer, read_token, refusal, ClientError, ServerArgs};
use bindery_store::audit::verify::{verify, Anchor, Broken};

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Write the server's audit log as JSON lines (to stdout or --output),
    /// in seq order; the head (last seq and hash) the server named goes to
    /// stderr: keep it apart from the store, as `verify --head`'s anchor.
    /// The owner's token.
    Export {
        #[command(flatten)]
        server: ServerArgs,
        /// Only the records after this seq.
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Write the records to FILE instead of stdout.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Check an exported audit log: every record's hash, each `prev`
    /// against the record before it, the seqs gapless from 1. Exit 1 naming
    /// the first record removed, altered or inserted (its seq and line);
    /// else 0 and a summary.
    Verify {
        /// The export (JSON lines); `-` or none: stdin.
        file: Option<PathBuf>,
        /// The head hash an export printed (or a `GET /v1/audit` answer's
        /// `Bindery-Audit-Head-Hash`) then: it must be in the file, else
        /// records were cut off its end.
        #[arg(long, value_name = "HASH")]
        head: Option<String>,
        /// How many records the log held then (its head seq): the file
        /// must reach it.
        #[arg(long, value_name = "N")]
        count: Option<i64>,
        /// A file that starts after seq 1 (`export --after N`): the hash of
        /// record N.
        #[arg(long, value_name = "HASH")]
        prev: Option<String>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("cannot read {file}: {source}")]
    Unreadable {
        file: String,
        source: std::io::Error,
    },
    #[error("cannot write {file}: {source}")]
    Unwritable {
        file: String,
        source: std::io::Error,
    },
    /// The chain does not hold: the first record found wrong.
    #[error("the audit log does not hold: {0}")]
    Broken(Broken),
    #[error("the server's answer to /v1/audit has no {0} header: is it a Bindery server of this version?")]
    NoHead(&'static str),
    #[error("--after is a seq: 0 or more, not {0}")]
    NegativeAfter(i64),
}

pub async fn main(cmd: AuditCommand) -> Result<ExitCode, AuditError> {
    match cmd {
        AuditCommand::Export {
            server,
            after,
            output,
        } => export(&server, after, output).await,
        AuditCommand::Verify {
            file,
            head,
            count,
            prev,
        } => {
            let anchor = Anchor { head, count, prev };
            let summary = check(file, &anchor)?;
            match (summary.first_seq, summary.last_seq) {
                (Some(first), Some(last)) => println!(
                    "the audit log holds: {} records, seq {first} to {last}, head {}",
                    summary.records, summary.head
                ),
                _ => println!("the audit log holds: no records"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The file's (or stdin's) lines, verified against `anchor`.
fn check(
    file: Option<PathBuf>,
    anchor: &Anchor,
) -> Result<bindery_store::audit::verify::Summary, AuditError> {
    let (name, lines) = match file.filter(|f| f.as_os_str() != "-") {
        Some(f) => {
            let name = f.display().to_string();
            let text = std::fs::File::open(&f).map_err(|source| AuditError::Unreadable {
                file: name.clone(),
                source,
            })?;
            (name, read_lines(std::io::BufReader::new(text)))
        }
        None => ("stdin".to_string(), read_lines(std::io::stdin().lock())),
    };
    let lines = lines.map_err(|source| AuditError::Unreadable { file: name, source })?;
    verify(&lines, anchor).map_err(AuditError::Broken)
}

fn read_lines(r: impl BufRead) -> std::io::Result<Vec<String>> {
    r.lines().collect()
}

/// Records a page of the export asks for (the server's most).
const PAGE: usize = 10_000;

async fn export(
    args: &ServerArgs,
    mut after: i64,
    output: Option<PathBuf>,
) -> Result<ExitCode, AuditError> {
    if after < 0 {
        return Err(AuditError::NegativeAfter(after));
    }
    let http = bindery_llm::egress::client(bindery_spec::Redirects::SameOrigin)
        .connect_timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(ClientError::Setup)?;
    let token = read_token(args)?;
    let base = args.server.trim_end_matches('/').to_string();
    let (shown, mut out): (String, Box<dyn Write>) = match &output {
        Some(f) => {
            let name = f.display().to_string();
            let file = std::fs::File::create(f).map_err(|source| AuditError::Unwritable {
                file: name.clone(),
                source,
            })?;
            (name, Box::new(std::io::BufWriter::new(file)))
        }
        None => ("stdout".into(), Box::new(std::io::stdout().lock())),
    };
    let unwritable = |source| AuditError::Unwritable {
        file: shown.clone(),
        source,
    };
    let mut head = None;
    let mut written = 0u64;
    loop {
        let path = format!("/v1/audit?after={after}&limit={PAGE}");
        let resp = http
            .get(format!("{base}{path}"))
            .bearer_auth(&token)
            .timeout(std::time::Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| ClientError::Connect {
                base: base.clone(),
                source: e.without_url(),
            })?;
        let status = resp.status().as_u16();
        let header = |name: &'static str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .ok_or(AuditError::NoHead(name))
        };
        let page_head = match status {
            200 => Some((
                header("bindery-audit-head-seq")?,
                header("bindery-audit-head-hash")?,
            )),
            _ => None,
        };
        let body = read_answer(resp).await?;
        let Some(page_head) = page_head else {
            let json = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
            return Err(refusal(status, &path, &json).into());
        };
        // The head as the first page found it: the export reaches it.
        head.get_or_insert(page_head);
        let mut n = 0usize;
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            writeln!(out, "{line}").map_err(unwritable)?;
            n += 1;
            if let Some(seq) = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["seq"].as_i64())
            {
                after = seq;
            }
        }
        written += n as u64;
        if n < PAGE {
            break;
        }
    }
    out.flush().map_err(unwritable)?;
    if let Some((seq, hash)) = head {
        eprintln!(
            "exported {written} records; the log's head: seq {seq}, hash {hash} (keep it apart, and check with `audit verify --head {hash} --count {seq}`)"
        );
    }
    Ok(ExitCode::SUCCESS)
}
