//! Running a script: argv, stdin and environment from the arguments, with a
//! timeout, an output limit and a command line that is safe to trace.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::protocol::{env_var_name, EmptyResult, Mode, ScriptInfo};
use super::BashTool;
use crate::{CallArgs, CallContext, ToolError, ToolOutput};
use bindery_params::value::ArgText;

/// Bytes of stderr kept for an error message.
pub(super) const MAX_STDERR: usize = 16 * 1024;

/// A finished process.
pub(super) struct Exec {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// stdout went past what was read of it, and the process was stopped.
    pub truncated: bool,
}

pub(super) enum ExecError {
    Spawn(std::io::Error),
    /// Not started: the server is ending.
    Ending,
    Timeout(Duration),
    /// The call's processes held more than this many bytes together.
    Memory(u64),
}

/// How often a running call's memory is read.
const MEMORY_WATCH: Duration = Duration::from_millis(200);

/// Start `path` with `argv` and `env` (added to the sidecar's environment,
/// less its `BINDERY_*` variables), feed it `stdin`, and collect its output
/// within `timeout`: `read` bytes of stdout, and of stderr. On a timeout,
/// or when stdout passes `read.0`, the whole process group is killed so
/// that no grandchild lingers.
pub(super) async fn exec(
    path: &Path,
    argv: &[String],
    env: &[(String, String)],
    stdin: Option<String>,
    limits: &super::Limits,
    timeout: Duration,
    read: (usize, usize),
) -> Result<Exec, ExecError> {
    let mut vars: Vec<(OsString, OsString)> = bindery_params::inherited::environment()
        .into_iter()
        .filter(|(k, _)| !env.iter().any(|(name, _)| OsStr::new(name) == k))
        .collect();
    vars.extend(env.iter().map(|(k, v)| (k.into(), v.into())));
    // What the call starts carries the server's mark: a server that died
    // leaves it running, and the next one ends it.
    let (mark, server) = bindery_reaper::mark();
    vars.push((mark.into(), server.into()));
    // Each process of the call (its children inherit both) may write at
    // most `memory`, and fork only while the user has fewer than
    // `processes`: set in the child before it runs the script.
    let spec = super::spawn::Spawn {
        path,
        args: argv,
        env: vars,
        stdin: stdin.is_some(),
        memory: limits.memory,
        processes: limits.processes,
    };
    let memory = limits.memory;
    let (mut child, kept) = bindery_reaper::spawn_kept(|| {
        let child = super::spawn::spawn(&spec)?;
        let pid = child.id();
        Ok((child, Some(pid)))
    })
    .map_err(|e| match bindery_reaper::ending() {
        true => ExecError::Ending,
        false => ExecError::Spawn(e),
    })?;
    child.keep(kept);
    let pgid = Some(child.id());
    let mut child_stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();

    let child = &mut child;
    let work = async {
        let feed = async {
            if let (Some(w), Some(text)) = (child_stdin.as_mut(), stdin.as_ref()) {
                // A script that does not read its stdin closes the pipe; that is its right.
                let _ = w.write_all(text.as_bytes()).await;
            }
            drop(child_stdin.take());
        };
        let (_, (out, truncated), (err, _)) = tokio::join!(
            feed,
            read_limited(stdout, read.0, pgid),
            read_limited(stderr, read.1, None),
        );
        let status = child.wait().await;
        (status, out, err, truncated)
    };
    // The call's processes together (shared memory included, which
    // RLIMIT_DATA does not count) may hold at most `memory`; so may the
    // orphans calls left (escaped with `setsid`, now the server's, and
    // no call's that can be told): those are killed, largest first, and
    // no call is stopped for another's.
    let watch = async {
        let (Some(limit), Some(pid)) = (memory, pgid) else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(MEMORY_WATCH).await;
            let held = tokio::task::spawn_blocking(move || {
                bindery_reaper::trim_orphans(limit);
                bindery_reaper::tree_memory(pid)
            })
            .await
            .unwrap_or(0);
            if held > limit {
                return limit;
            }
        }
    };
    let done = tokio::select! {
        done = tokio::time::timeout(timeout, work) => done.map_err(|_| ExecError::Timeout(timeout)),
        limit = watch => Err(ExecError::Memory(limit)),
    };
    if done.is_err() {
        kill_group(pgid);
        // Its end orphans what it started outside its group: the sweep
        // below finds them once it is gone.
        child.kill();
        let _ = child.wait().await;
    }
    // Whatever the call left behind (a `setsid` child, a daemon) ends with it.
    bindery_reaper::sweep_async().await;
    match done {
        Ok((Ok(status), stdout, stderr, truncated)) => Ok(Exec {
            status,
            stdout,
            stderr,
            truncated,
        }),
        Ok((Err(e), ..)) => Err(ExecError::Spawn(e)),
        Err(e) => Err(e),
    }
}

/// Read up to `limit` bytes; past that, kill the group (when given) so the
/// writer stops, and drain nothing more.
async fn read_limited<R: AsyncRead + Unpin>(
    reader: Option<R>,
    limit: usize,
    kill_on_overflow: Option<u32>,
) -> (Vec<u8>, bool) {
    let Some(mut reader) = reader else {
        return (Vec::new(), false);
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return (buf, false),
            Ok(n) => {
                let room = limit.saturating_sub(buf.len());
                if n > room {
                    buf.extend_from_slice(&chunk[..room]);
                    if let Some(pgid) = kill_on_overflow {
                        kill_group(Some(pgid));
                        return (buf, true);
                    }
                    // Keep draining so the writer does not block, but keep nothing.
                    continue;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

fn kill_group(pgid: Option<u32>) {
    if let Some(pid) = pgid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// argv, stdin and environment for one call.
struct Invocation {
    argv: Vec<String>,
    stdin: Option<String>,
    env: Vec<(String, String)>,
}

fn invocation(tool: &BashTool, args: &CallArgs) -> Result<Invocation, ToolError> {
    let mut inv = Invocation {
        argv: vec!["run".to_string()],
        stdin: None,
        env: Vec::new(),
    };
    let mut stdin_lines = Vec::new();
    for arg in &tool.info.args {
        let Some(value) = args.get(&arg.name) else {
            if arg.arity == super::Arity::Single {
                return Err(ToolError::InvalidArguments(format!(
                    "missing required argument `{}`",
                    arg.name
                )));
            }
            continue;
        };
        let (text, secret) = match value.to_text() {
            Some(ArgText::Plain(s)) => (s, false),
            Some(ArgText::Secret(s)) => (s.to_string(), true),
            // Objects and arrays from the model travel as their JSON text.
            None => (
                value.plain().map(|v| v.to_string()).unwrap_or_default(),
                false,
            ),
        };
        // Whatever bound it (a narrowing, a helper's `with`), a secret never
        // goes on a command line, which every process on the host can read.
        if secret && !matches!(arg.mode, Mode::Stdin | Mode::Env) {
            tracing::warn!(
                tool = %tool.spec.name,
                arg = %arg.name,
                mode = arg.mode.as_str(),
                "call refused: a secret value would be passed on the command line; bind it to an env or stdin argument"
            );
            return Err(ToolError::Unavailable);
        }
        match arg.mode {
            Mode::Positional => inv.argv.push(text),
            Mode::Dashdashspace => inv.argv.extend([format!("--{}", arg.name), text]),
            Mode::Dashdashequal => inv.argv.push(format!("--{}={text}", arg.name)),
            Mode::Stdin => stdin_lines.push(text),
            Mode::Env => inv.env.push((env_var_name(&arg.name), text)),
        }
    }
    if !stdin_lines.is_empty() {
        let mut s = stdin_lines.join("\n");
        s.push('\n');
        inv.stdin = Some(s);
    }
    Ok(inv)
}

/// The longest `AGENT_SESSION_JSON` passed: Linux refuses a single
/// environment string past 128 KiB (`E2BIG`), which would fail the call.
const MAX_SESSION_JSON: usize = 120 * 1024;

fn context_env(ctx: &CallContext) -> Vec<(String, String)> {
    // What is not known is left unset: scripts default it themselves
    // (`${AGENT_SESSION_ID:-unknown}`).
    let mut env: Vec<(String, String)> = [
        ("AGENT_SESSION_ID", &ctx.session_id),
        ("AGENT_CONVERSATION_ID", &ctx.conversation_id),
        ("AGENT_TURN_ID", &ctx.turn_id),
        ("AGENT_AGENT_ID", &ctx.agent_id),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| (k.to_string(), v.clone()))
    .collect();
    match &ctx.session_json {
        Some(json) if json.len() <= MAX_SESSION_JSON => {
            env.push(("AGENT_SESSION_JSON".to_string(), json.to_string()))
        }
        Some(json) => tracing::debug!(
            bytes = json.len(),
            "AGENT_SESSION_JSON left out: the session is too long for one environment variable"
        ),
        None => {}
    }
    env
}

pub(super) async fn run(
    tool: &BashTool,
    args: CallArgs,
    ctx: &CallContext,
) -> Result<ToolOutput, ToolError> {
    let inv = invocation(tool, &args)?;
    drop(args);
    // Its run's and the server's bound on processes at once: it may wait,
    // holding nothing of the process it will start.
    let _slot = ctx.processes.take().await;
    let mut env = context_env(ctx);
    env.extend(inv.env);
    let name = tool.spec.name.as_str();
    let path = tool.path.display().to_string();
    // The arguments are the model's (tenant data, or an injection's text):
    // like every other toolbox's, they are not logged.
    let argc = inv.argv.len();
    tracing::info!(tool = name, session = %ctx.session_id, script = %path, argc, "bash tool started");
    let started = Instant::now();
    // Past each limit, read as much as the longest form of a secret: a
    // secret that starts before the limit is scrubbed whole, then cut.
    let scrubber = &ctx.scrubber;
    let max_output = tool.limits.max_output;
    let result = exec(
        &tool.path,
        &inv.argv,
        &env,
        inv.stdin,
        &tool.limits,
        tool.limits.call_timeout,
        (
            max_output.saturating_add(scrubber.lookahead()),
            MAX_STDERR.saturating_add(scrubber.lookahead()),
        ),
    )
    .await;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    // Killed (and maybe reaped) by the server's end, not by anything of
    // its own: whatever it did is not known.
    let killed = match &result {
        Ok(e) => e.status.code().is_none(),
        Err(ExecError::Ending) => false,
        Err(_) => true,
    };
    if killed && bindery_reaper::ending() {
        tracing::warn!(tool = name, script = %path, elapsed_ms, "bash tool stopped: the server is stopping");
        return Err(ToolError::Failed(
            "the server stopped during this call, which was killed; its side effect may have happened: check before calling it again".into(),
        ));
    }
    let exec = match result {
        Ok(e) => e,
        Err(ExecError::Ending) => {
            return Err(ToolError::Failed(
                "the server is stopping: this call did not run".into(),
            ));
        }
        Err(ExecError::Spawn(e)) => {
            tracing::warn!(tool = name, script = %path, "cannot start the script: {e}");
            return Err(ToolError::Failed(format!(
                "the tool could not be started: {e}"
            )));
        }
        Err(ExecError::Memory(limit)) => {
            tracing::warn!(tool = name, script = %path, elapsed_ms, "bash tool stopped: over its memory");
            return Err(ToolError::Failed(format!(
                "the tool's processes held more than {} MiB together and were stopped",
                limit / (1024 * 1024)
            )));
        }
        Err(ExecError::Timeout(t)) => {
            tracing::warn!(tool = name, script = %path, elapsed_ms, "bash tool timed out");
            return Err(ToolError::Failed(format!(
                "the tool did not finish within {}s and was stopped",
                t.as_secs()
            )));
        }
    };
    let code = exec.status.code();
    tracing::info!(tool = name, exit = ?code, signal = ?exec.status.signal(), elapsed_ms, truncated = exec.truncated, "bash tool stopped");
    let output = match stdout_kind(&exec.stdout, exec.truncated, &tool.info) {
        Stdout::Text => None,
        Stdout::Media(mime) if exec.truncated || exec.stdout.len() > max_output => {
            // A cut image is no image: nothing of it is kept.
            return Err(ToolError::Failed(format!(
                "the tool printed more than {max_output} bytes of {mime} (the limit of a result, --tool-max-output); nothing of it was kept"
            )));
        }
        Stdout::Media(mime) => Some(mime),
    };
    let (mut out, cut) = match output {
        // Media are checked for secrets where every result is (the run's
        // record of it), not scrubbed: see docs/security.md.
        Some(_) => (String::new(), false),
        None => scrubber.scrub_cut(&String::from_utf8_lossy(&exec.stdout), max_output),
    };
    if exec.truncated || cut {
        out.push_str(&format!("\n[output cut at {max_output} bytes]"));
        return Ok(ToolOutput::Text(out));
    }
    if !exec.status.success() {
        let (stderr, _) = scrubber.scrub_cut(&String::from_utf8_lossy(&exec.stderr), MAX_STDERR);
        let how = match (code, exec.status.signal()) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "failed".to_string(),
        };
        let message = format!("{how}: {}", stderr.trim());
        return Err(match stated_status(&stderr) {
            Some(status) => ToolError::Http { status, message },
            None => ToolError::Failed(message),
        });
    }
    if let Some(mime) = output {
        if !exec.stdout.is_empty() {
            return Ok(ToolOutput::from_stdout(exec.stdout, Some(mime)));
        }
    }
    if out.is_empty() {
        if let Some(EmptyResult::AddMessage(m)) = &tool.info.empty_result {
            out = m.clone();
        }
    }
    Ok(ToolOutput::Text(out))
}

/// How a script's stdout is taken.
#[derive(Debug, PartialEq)]
enum Stdout<'a> {
    Text,
    /// Media of this type.
    Media(&'a str),
}

/// Media of the type `describe` declares; else text when it is UTF-8 (or
/// was cut inside a character, which is text too); else
/// `application/octet-stream`, as agents-exe takes it.
/// The HTTP status a failed script states by starting its error output
/// with `HTTP <status>` (the API it called answered so): docs/agents.md.
fn stated_status(stderr: &str) -> Option<u16> {
    let rest = stderr.trim_start().strip_prefix("HTTP ")?;
    let digits = rest.get(..3)?;
    let after = rest[3..].chars().next();
    if !digits.bytes().all(|b| b.is_ascii_digit()) || after.is_some_and(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|s| (100..600).contains(s))
}

fn stdout_kind<'a>(stdout: &[u8], truncated: bool, info: &'a ScriptInfo) -> Stdout<'a> {
    if let Some(mime) = info.output_media_type.as_deref() {
        return Stdout::Media(mime);
    }
    match std::str::from_utf8(stdout) {
        Ok(_) => Stdout::Text,
        // Valid up to a character the read limit cut.
        Err(e) if truncated && e.error_len().is_none() => Stdout::Text,
        Err(_) => Stdout::Media(crate::OCTET_STREAM),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bash::{Arity, Limits, ScriptArg, ScriptInfo};
    use bindery_params::{ParamValue, SecretString};

    fn tool() -> BashTool {
        let arg = |name: &str, mode| ScriptArg {
            name: name.into(),
            description: String::new(),
            type_: "string".into(),
            backing_type: None,
            arity: Arity::Optional,
            mode,
        };
        BashTool::new(
            "/bin/true".into(),
            ScriptInfo {
                slug: "t".into(),
                description: String::new(),
                args: vec![
                    arg("pos", Mode::Positional),
                    arg("space", Mode::Dashdashspace),
                    arg("equal", Mode::Dashdashequal),
                    arg("input", Mode::Stdin),
                    arg("var", Mode::Env),
                ],
                empty_result: None,
                output_media_type: None,
            },
            Limits::default(),
        )
    }

    #[test]
    fn stdout_is_declared_media_text_or_octet_stream() {
        let mut info = tool().info;
        assert_eq!(stdout_kind(b"plain \xc3\xa9", false, &info), Stdout::Text);
        assert_eq!(
            stdout_kind(b"\x89PNG\xff", false, &info),
            Stdout::Media("application/octet-stream")
        );
        // Cut by the read limit inside a character: still text.
        assert_eq!(stdout_kind(b"caf\xc3", true, &info), Stdout::Text);
        assert_eq!(
            stdout_kind(b"caf\xc3", false, &info),
            Stdout::Media("application/octet-stream")
        );
        info.output_media_type = Some("image/png".into());
        assert_eq!(
            stdout_kind(b"text too", false, &info),
            Stdout::Media("image/png")
        );
    }

    fn secret() -> ParamValue {
        ParamValue::Secret(SecretString::new("canary-7f3a9c"))
    }

    #[test]
    fn a_secret_never_goes_on_the_command_line() {
        let t = tool();
        for arg in ["pos", "space", "equal"] {
            let args: CallArgs = [(arg.to_string(), secret())].into();
            assert_eq!(
                invocation(&t, &args).err(),
                Some(ToolError::Unavailable),
                "{arg}"
            );
        }
        let args: CallArgs = [
            ("input".to_string(), secret()),
            ("var".to_string(), secret()),
        ]
        .into();
        let inv = invocation(&t, &args).ok().unwrap();
        assert_eq!(inv.argv, ["run"]);
        assert_eq!(inv.stdin.as_deref(), Some("canary-7f3a9c\n"));
        assert_eq!(inv.env, [("VAR".to_string(), "canary-7f3a9c".to_string())]);
        let plain: CallArgs =
            [("pos".to_string(), ParamValue::Plain(serde_json::json!("x")))].into();
        assert_eq!(invocation(&t, &plain).ok().unwrap().argv, ["run", "x"]);
    }

    #[test]
    fn a_script_states_an_http_status_only_at_the_start_of_its_error_output() {
        let table = [
            ("HTTP 409 slot taken", Some(409)),
            ("  HTTP 410\n", Some(410)),
            ("HTTP 500", Some(500)),
            ("booking failed: HTTP 409", None),
            ("HTTP 4090", None),
            ("HTTP 40", None),
            ("HTTP 999 no such status", None),
            ("HTTP409", None),
            ("", None),
        ];
        for (stderr, status) in table {
            assert_eq!(stated_status(stderr), status, "{stderr:?}");
        }
    }
}
