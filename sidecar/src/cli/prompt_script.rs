//! agents-exe's prompt directives (`run`, `echo-prompt`, and `run` in the
//! bash tool protocol): the prompt is composed of pieces taken in
//! command-line order, each followed by a line break. `--alias NAME`
//! comes first wherever it is written; no directive at all means the
//! prompt is stdin, as it is.
//!
//! The composition is pure: what it reads (files, a shell command's
//! output, stdin) comes through [`Sources`], so it is tested without I/O;
//! [`Local`] is the process's own, every read bounded.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::agents_exe_session::print::Verbosity;

/// Why a prompt could not be made: a directive given wrong, or a piece
/// (a file, a command, stdin, the aliases' configuration) that could not
/// be read. Each names the flag or file it comes from.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("--alias is given twice (`{first}`, then `{second}`): one alias per prompt")]
    AliasTwice { first: String, second: String },
    #[error("{file}: promptAliases: {source}")]
    AliasConfig {
        file: String,
        source: serde_json::Error,
    },
    /// `listed`: each alias a line, with its description.
    #[error("unknown alias '{name}'\n\nAvailable aliases:{listed}")]
    UnknownAlias { name: String, listed: String },
    /// `what` (a flag and its file, or the configuration) cannot be opened.
    #[error("{what}: {source}")]
    Open {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot read {what}: {source}")]
    Read {
        what: String,
        source: std::io::Error,
    },
    #[error("{what} is longer than {} MiB: give less", MAX_PIECE / (1024 * 1024))]
    TooLong { what: String },
    #[error("{what} is not UTF-8 text")]
    NotUtf8 { what: String },
    #[error("--shell `{command}`: cannot start sh: {source}")]
    ShellStart {
        command: String,
        source: std::io::Error,
    },
    #[error("--shell `{command}`: no stdout")]
    ShellNoStdout { command: String },
    #[error("--shell `{command}`: {source}")]
    ShellWait {
        command: String,
        source: std::io::Error,
    },
    #[error("--shell `{command}` took longer than {secs} s and was stopped, with what it started: make it quicker, or run it first and give its output with --file")]
    ShellTimeout { command: String, secs: u64 },
    #[error("--shell `{command}` failed ({status})")]
    ShellFailed {
        command: String,
        status: std::process::ExitStatus,
    },
    /// stdin, read for `what` a command takes there.
    #[error("{what}: {source}")]
    Stdin {
        what: &'static str,
        source: Box<PromptError>,
    },
    #[error("cannot read the working directory: {0}")]
    WorkingDirectory(#[source] std::io::Error),
}

/// The most bytes one piece (a file, a command's output, stdin) may bring.
pub const MAX_PIECE: u64 = 8 * 1024 * 1024;

/// One piece of a prompt, in agents-exe's meaning. A new kind of piece is
/// a variant, a flag in [`PromptScript::take`] and [`FLAGS`], and what it
/// reads a method of [`Sources`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Directive {
    /// `-p/--prompt TEXT`: the text.
    Text(String),
    /// `-f/--file FILE`: the file's text.
    File(PathBuf),
    /// `--shell CMD`: what `sh -c CMD` prints on stdout.
    Shell(String),
    /// `-s/--sep4 TEXT` (4 times), `-S/--sep40 TEXT` (40 times).
    Separator { times: usize, text: String },
    /// `--session-xs|s|m|l|xl FILE`: an agents-exe session file, rendered
    /// for a prompt at that verbosity.
    Session(Verbosity, PathBuf),
}

/// The `--session-*` flags and the verbosity each renders at.
const SESSION_FLAGS: [(&str, Verbosity); 5] = [
    ("--session-xs", Verbosity::Xs),
    ("--session-s", Verbosity::S),
    ("--session-m", Verbosity::M),
    ("--session-l", Verbosity::L),
    ("--session-xl", Verbosity::Xl),
];

/// A prompt as the command line gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptScript {
    /// `--alias NAME`: placed first, whatever its place on the line.
    pub alias: Option<String>,
    /// The other directives, in command-line order.
    pub directives: Vec<Directive>,
}

impl PromptScript {
    /// Take `value` for the directive flag `flag` (`-p`, `--file`, …).
    /// `Ok(false)`: `flag` is not a directive. A second `--alias` is an
    /// error, as in agents-exe.
    pub fn take(&mut self, flag: &str, value: String) -> Result<bool, PromptError> {
        if let Some((_, size)) = SESSION_FLAGS.iter().find(|(f, _)| *f == flag) {
            self.directives
                .push(Directive::Session(*size, PathBuf::from(value)));
            return Ok(true);
        }
        let directive = match flag {
            "-p" | "--prompt" => Directive::Text(value),
            "-f" | "--file" => Directive::File(PathBuf::from(value)),
            "--shell" => Directive::Shell(value),
            "-s" | "--sep4" => Directive::Separator {
                times: 4,
                text: value,
            },
            "-S" | "--sep40" => Directive::Separator {
                times: 40,
                text: value,
            },
            "--alias" => {
                if let Some(first) = &self.alias {
                    return Err(PromptError::AliasTwice {
                        first: first.clone(),
                        second: value,
                    });
                }
                self.alias = Some(value);
                return Ok(true);
            }
            _ => return Ok(false),
        };
        self.directives.push(directive);
        Ok(true)
    }

    pub fn is_empty(&self) -> bool {
        self.alias.is_none() && self.directives.is_empty()
    }
}

/// Where an alias's `{{content}}` comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputMode {
    Stdin,
    /// agents-exe reads its `--session-file` here, and stdin without one.
    File,
}

impl<'de> Deserialize<'de> for InputMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.to_ascii_lowercase().as_str() {
            "stdin" => Ok(InputMode::Stdin),
            "file" => Ok(InputMode::File),
            _ => Err(serde::de::Error::custom(format!(
                "unknown inputMode `{s}` (\"stdin\" or \"file\")"
            ))),
        }
    }
}

/// A prompt alias: `promptAliases` in `agents-exe.cfg.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alias {
    pub description: String,
    /// `{{content}}`, `{{filename}}` and `{{language}}` are replaced.
    pub template: String,
    pub input_mode: InputMode,
}

/// The aliases `--alias` may name: agents-exe's four, and the
/// configuration's, which win by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aliases(BTreeMap<String, Alias>);

impl Aliases {
    /// agents-exe's built-in aliases. Their templates are what the model
    /// receives, so they are agents-exe's words.
    pub fn builtin() -> Aliases {
        let alias = |description: &str, template: &str, input_mode| Alias {
            description: description.into(),
            template: template.into(),
            input_mode,
        };
        let fenced = |ask: &str| format!("{ask}\n\n```{{{{language}}}}\n{{{{content}}}}\n```");
        Aliases(BTreeMap::from([
            (
                "translate".into(),
                alias(
                    "Translate to English",
                    "Please translate the following text to English:\n\n{{content}}",
                    InputMode::Stdin,
                ),
            ),
            (
                "summarize".into(),
                alias(
                    "Summarize text",
                    "Please provide a concise summary of the following:\n\n{{content}}",
                    InputMode::Stdin,
                ),
            ),
            (
                "code-review".into(),
                alias(
                    "Review code for issues",
                    &fenced("Please review the following code for potential bugs, security issues, and style improvements:"),
                    InputMode::File,
                ),
            ),
            (
                "explain".into(),
                alias(
                    "Explain code in plain English",
                    &fenced("Please explain what the following code does in plain English:"),
                    InputMode::File,
                ),
            ),
        ]))
    }

    /// The built-ins with `configured` over them.
    pub fn with(configured: BTreeMap<String, Alias>) -> Aliases {
        let mut all = Aliases::builtin();
        all.0.extend(configured);
        all
    }

    /// `promptAliases` of an `agents-exe.cfg.json` (`text`, read from
    /// `shown`) over the built-ins; none there is none.
    pub fn from_config(text: &str, shown: &Path) -> Result<Aliases, PromptError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Config {
            #[serde(default)]
            prompt_aliases: Option<BTreeMap<String, Alias>>,
        }
        let c: Config = serde_json::from_str(text).map_err(|source| PromptError::AliasConfig {
            file: shown.display().to_string(),
            source,
        })?;
        Ok(Aliases::with(c.prompt_aliases.unwrap_or_default()))
    }

    fn get(&self, name: &str) -> Result<&Alias, PromptError> {
        self.0.get(name).ok_or_else(|| {
            let listed: String = self
                .0
                .iter()
                .map(|(n, a)| format!("\n  - {n}: {}", a.description))
                .collect();
            PromptError::UnknownAlias {
                name: name.to_string(),
                listed,
            }
        })
    }
}

/// What a prompt's directives read.
pub trait Sources {
    /// The text of `path`, given with `flag` (errors name both).
    fn file(&mut self, flag: &str, path: &Path) -> Result<String, PromptError>;
    /// The agents-exe session in `path` rendered at `size`; one that
    /// cannot be read is agents-exe's inline note of why (and a warning),
    /// not an error: agents-exe's prompt goes out without it.
    fn session(&mut self, size: Verbosity, path: &Path) -> String;
    /// `sh -c command`'s stdout; a command that fails is an error.
    fn shell(&mut self, command: &str) -> Result<String, PromptError>;
    fn stdin(&mut self) -> Result<String, PromptError>;
}

/// The prompt `script` makes. Without any directive it is stdin, as is;
/// otherwise each piece (the alias's first) followed by a line break. A
/// file-mode alias (`code-review`, `explain`) takes its content from
/// `alias_file` (agents-exe's `--session-file`), stdin without one.
pub fn compose(
    script: &PromptScript,
    aliases: &Aliases,
    alias_file: Option<&Path>,
    io: &mut dyn Sources,
) -> Result<String, PromptError> {
    if script.is_empty() {
        return io.stdin();
    }
    let mut out = String::new();
    if let Some(name) = &script.alias {
        let alias = aliases.get(name)?;
        let (content, file) = match (alias.input_mode, alias_file) {
            (InputMode::File, Some(f)) => (io.file("--session-file", f)?, Some(f)),
            _ => (io.stdin()?, None),
        };
        out.push_str(&fill(&alias.template, &content, file));
        out.push('\n');
    }
    for d in &script.directives {
        match d {
            Directive::Text(t) => out.push_str(t),
            Directive::File(p) => out.push_str(&io.file("--file", p)?),
            Directive::Session(size, p) => out.push_str(&io.session(*size, p)),
            Directive::Shell(c) => out.push_str(&io.shell(c)?),
            Directive::Separator { times, text } => out.push_str(&text.repeat(*times)),
        }
        out.push('\n');
    }
    Ok(out)
}

/// An alias's template with its variables replaced: the content, and the
/// name and language of the file it came from (empty without one).
pub fn fill(template: &str, content: &str, file: Option<&Path>) -> String {
    let filename = file
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let language = file.map(language_of).unwrap_or("");
    // One pass over the template: what goes in (a file's content, which may
    // hold `{{filename}}` itself) is never expanded again.
    let mut out = String::with_capacity(template.len() + content.len());
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let variable = [
            ("{{content}}", content),
            ("{{filename}}", filename.as_str()),
            ("{{language}}", language),
        ]
        .into_iter()
        .find(|(name, _)| rest.starts_with(name));
        match variable {
            Some((name, value)) => {
                out.push_str(value);
                rest = &rest[name.len()..];
            }
            None => {
                out.push('{');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The code fence's language for a file, by its extension.
fn language_of(file: &Path) -> &'static str {
    let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
    match ext {
        "hs" => "haskell",
        "py" => "python",
        "js" => "javascript",
        "ts" => "typescript",
        "java" => "java",
        "c" | "h" => "c",
        "cpp" | "cc" | "hpp" => "cpp",
        "rs" => "rust",
        "go" => "go",
        "rb" => "ruby",
        "php" => "php",
        "sh" | "bash" => "bash",
        "zsh" => "zsh",
        "pl" => "perl",
        "r" => "r",
        "swift" => "swift",
        "kt" => "kotlin",
        "scala" => "scala",
        "clj" => "clojure",
        "ex" | "exs" => "elixir",
        "erl" => "erlang",
        "ml" => "ocaml",
        "fs" => "fsharp",
        "cs" => "csharp",
        "lua" => "lua",
        "vim" => "vim",
        "md" => "markdown",
        "json" => "json",
        "yaml" | "yml" => "yaml",
        "xml" => "xml",
        "html" => "html",
        "css" => "css",
        "scss" => "scss",
        "sass" => "sass",
        "sql" => "sql",
        _ => "",
    }
}

/// The aliases where the process runs: the nearest `agents-exe.cfg.json`'s
/// (from `cwd` up) over the built-ins.
pub fn aliases_from(cwd: &Path) -> Result<Aliases, PromptError> {
    match super::load::nearest_agents_exe_cfg(cwd) {
        None => Ok(Aliases::builtin()),
        Some(cfg) => {
            let what = cfg.display().to_string();
            let file = std::fs::File::open(&cfg).map_err(|source| PromptError::Open {
                what: what.clone(),
                source,
            })?;
            let text = read_capped(file, &what)?;
            Aliases::from_config(&text, &cfg)
        }
    }
}

/// What reading text of at most some bytes came to.
pub enum Capped {
    Text(String),
    /// More than the limit: nothing past it was read.
    TooLong,
    NotUtf8,
}

/// All of `from` as text, if it holds at most `max` bytes (one past them
/// is read, to know).
pub fn read_text(from: impl Read, max: u64) -> std::io::Result<Capped> {
    let mut bytes = Vec::new();
    from.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Ok(Capped::TooLong);
    }
    Ok(String::from_utf8(bytes).map_or(Capped::NotUtf8, Capped::Text))
}

/// All of `from` as text, refused past [`MAX_PIECE`] bytes.
pub fn read_capped(from: impl Read, what: &str) -> Result<String, PromptError> {
    let what = || what.to_string();
    match read_text(from, MAX_PIECE).map_err(|source| PromptError::Read {
        what: what(),
        source,
    })? {
        Capped::Text(text) => Ok(text),
        Capped::TooLong => Err(PromptError::TooLong { what: what() }),
        Capped::NotUtf8 => Err(PromptError::NotUtf8 { what: what() }),
    }
}

/// All of stdin (bounded), for a command that takes `what` there
/// (agents-exe's commands that take their arguments on stdin).
pub fn read_stdin(what: &'static str) -> Result<String, PromptError> {
    read_capped(std::io::stdin().lock(), "stdin").map_err(|e| PromptError::Stdin {
        what,
        source: Box::new(e),
    })
}

/// How long a `--shell` command may take, its children included.
pub const SHELL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// `command` run by `sh -c`, its stdout the text. It runs in a process
/// group of its own; past `timeout` the whole group is killed (what it
/// started too) and the directive fails, so a prompt is never waited on
/// for ever.
pub fn run_shell(command: &str, timeout: std::time::Duration) -> Result<String, PromptError> {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let what = format!("--shell `{command}`");
    let command = || command.to_string();
    // Its stdin is empty and its stderr the user's, as in agents-exe.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .map_err(|source| PromptError::ShellStart {
            command: command(),
            source,
        })?;
    let group = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let kill = move || {
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    };
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = matches!(
            finished.recv_timeout(timeout),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        );
        if late {
            kill();
        }
        late
    });
    let out = child
        .stdout
        .take()
        .ok_or_else(|| PromptError::ShellNoStdout { command: command() })
        .and_then(|o| read_capped(o, &format!("the output of {what}")));
    if out.is_err() {
        // Too long or not text: the rest is not wanted.
        kill();
    }
    let status = child.wait().map_err(|source| PromptError::ShellWait {
        command: command(),
        source,
    });
    let _ = done.send(());
    if watchdog.join().unwrap_or(false) {
        return Err(PromptError::ShellTimeout {
            command: command(),
            secs: timeout.as_secs(),
        });
    }
    let status = status?;
    let out = out?;
    if !status.success() {
        return Err(PromptError::ShellFailed {
            command: command(),
            status,
        });
    }
    Ok(out)
}

/// The process's files, shell and stdin; stdin is read once (an alias and
/// an empty script both read it).
#[derive(Default)]
pub struct Local {
    stdin: Option<String>,
}

impl Sources for Local {
    fn file(&mut self, flag: &str, path: &Path) -> Result<String, PromptError> {
        let what = format!("{flag} {}", path.display());
        let f = std::fs::File::open(path).map_err(|source| PromptError::Open {
            what: what.clone(),
            source,
        })?;
        read_capped(f, &what)
    }

    fn session(&mut self, size: Verbosity, path: &Path) -> String {
        use super::agents_exe_session as aes;
        match aes::read_agents_exe(path) {
            Ok(s) => aes::print::render_for_prompt(size, &s),
            Err(e) => {
                let e = e.to_string();
                eprintln!(
                    "Warning: could not load session file {}: {e}",
                    path.display()
                );
                format!("_(Error loading session: {e} )_\n")
            }
        }
    }

    fn shell(&mut self, command: &str) -> Result<String, PromptError> {
        run_shell(command, SHELL_TIMEOUT)
    }

    fn stdin(&mut self) -> Result<String, PromptError> {
        if let Some(s) = &self.stdin {
            return Ok(s.clone());
        }
        let s = read_capped(std::io::stdin().lock(), "stdin")?;
        self.stdin = Some(s.clone());
        Ok(s)
    }
}

/// The prompt of `script` as the process gives it, with the aliases of
/// the working directory's `agents-exe.cfg.json` (read only when an
/// alias is named); `alias_file` is `--session-file`.
pub fn compose_here(
    script: &PromptScript,
    alias_file: Option<&Path>,
) -> Result<String, PromptError> {
    let aliases = match &script.alias {
        None => Aliases::builtin(),
        Some(_) => {
            let cwd = std::env::current_dir().map_err(PromptError::WorkingDirectory)?;
            aliases_from(&cwd)?
        }
    };
    compose(script, &aliases, alias_file, &mut Local::default())
}

/// The directives as clap options, for `run` and `echo-prompt`: clap
/// keeps each option's values apart, so their order across options is
/// rebuilt from their indices on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptArgs(pub PromptScript);

/// (clap id, flag as [`PromptScript::take`] knows it) for each directive.
const FLAGS: [(&str, &str); 11] = [
    ("prompt", "--prompt"),
    ("file", "--file"),
    ("shell", "--shell"),
    ("sep4", "--sep4"),
    ("sep40", "--sep40"),
    ("session-xs", "--session-xs"),
    ("session-s", "--session-s"),
    ("session-m", "--session-m"),
    ("session-l", "--session-l"),
    ("session-xl", "--session-xl"),
    ("alias", "--alias"),
];

impl clap::FromArgMatches for PromptArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut given: Vec<(usize, &str, String)> = Vec::new();
        for (id, flag) in FLAGS {
            let (Some(at), Some(values)) = (m.indices_of(id), m.get_many::<String>(id)) else {
                continue;
            };
            given.extend(at.zip(values).map(|(i, v)| (i, flag, v.clone())));
        }
        given.sort_by_key(|(i, _, _)| *i);
        let mut script = PromptScript::default();
        for (_, flag, value) in given {
            script
                .take(flag, value)
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, e))?;
        }
        Ok(PromptArgs(script))
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for PromptArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction};
        let many = |id: &'static str, name: &'static str, help: &'static str| {
            Arg::new(id)
                .long(id)
                .value_name(name)
                .action(ArgAction::Append)
                .allow_hyphen_values(true)
                .help(help)
        };
        cmd.arg(
            many(
                "prompt",
                "TEXT",
                "A paragraph of the prompt. Directives (-p, -f, --shell, -s, -S, --session-*) are taken in \
                 command-line order, each followed by a line break; without any, the prompt \
                 is stdin.",
            )
            .short('p'),
        )
        .arg(many("file", "FILE", "The text of FILE.").short('f'))
        .arg(many(
            "shell",
            "CMD",
            "What `sh -c CMD` prints on stdout (a failing command is an error).",
        ))
        .arg(many("sep4", "TEXT", "TEXT 4 times: a short separator.").short('s'))
        .arg(many("sep40", "TEXT", "TEXT 40 times: a long separator.").short('S'))
        .arg(many(
            "session-xs",
            "FILE",
            "An agents-exe session file, rendered for the prompt: queries and answers.",
        ))
        .arg(many(
            "session-s",
            "FILE",
            "As --session-xs, with thinking and the names of the tools called.",
        ))
        .arg(many(
            "session-m",
            "FILE",
            "As --session-s, with counts of steps and calls.",
        ))
        .arg(many(
            "session-l",
            "FILE",
            "As --session-m, with each call as recorded.",
        ))
        .arg(many("session-xl", "FILE", "As --session-l."))
        .arg(
            Arg::new("alias")
                .long("alias")
                .value_name("NAME")
                .action(ArgAction::Set)
                .help(
                    "A prompt alias, placed first: translate, summarize (their content \
                     is stdin), code-review, explain, or one of agents-exe.cfg.json's \
                     promptAliases.",
                ),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sources from memory; what was read, in order.
    #[derive(Default)]
    struct Fake {
        files: BTreeMap<PathBuf, String>,
        stdin: String,
        read: Vec<String>,
    }

    impl Sources for Fake {
        fn file(&mut self, flag: &str, path: &Path) -> Result<String, PromptError> {
            self.read.push(format!("file {}", path.display()));
            self.files
                .get(path)
                .cloned()
                .ok_or_else(|| PromptError::Open {
                    what: format!("{flag} {}", path.display()),
                    source: std::io::ErrorKind::NotFound.into(),
                })
        }
        fn session(&mut self, size: Verbosity, path: &Path) -> String {
            self.read
                .push(format!("session {size:?} {}", path.display()));
            format!("<{size:?} {}>", path.display())
        }
        fn shell(&mut self, command: &str) -> Result<String, PromptError> {
            self.read.push(format!("shell {command}"));
            match command {
                "false" => Err(PromptError::ShellFailed {
                    command: command.into(),
                    status: std::os::unix::process::ExitStatusExt::from_raw(256),
                }),
                c => Ok(format!("<{c}>\n")),
            }
        }
        fn stdin(&mut self) -> Result<String, PromptError> {
            self.read.push("stdin".into());
            Ok(self.stdin.clone())
        }
    }

    fn script(flags: &[(&str, &str)]) -> PromptScript {
        let mut s = PromptScript::default();
        for (f, v) in flags {
            assert!(s.take(f, v.to_string()).unwrap(), "{f}");
        }
        s
    }

    #[test]
    fn directives_are_taken_in_order_each_ending_a_line() {
        let mut io = Fake {
            files: BTreeMap::from([(PathBuf::from("notes.txt"), "a note".to_string())]),
            ..Fake::default()
        };
        let s = script(&[
            ("-S", "="),
            ("--file", "notes.txt"),
            ("-p", "ask"),
            ("-s", "-"),
            ("--shell", "date"),
        ]);
        let got = compose(&s, &Aliases::builtin(), None, &mut io).unwrap();
        assert_eq!(
            got,
            format!("{}\na note\nask\n----\n<date>\n\n", "=".repeat(40))
        );
        assert_eq!(io.read, ["file notes.txt", "shell date"]);
    }

    #[test]
    fn no_directive_is_stdin_as_it_is() {
        let mut io = Fake {
            stdin: "as typed".into(),
            ..Fake::default()
        };
        let got = compose(&PromptScript::default(), &Aliases::builtin(), None, &mut io).unwrap();
        assert_eq!(got, "as typed");
    }

    #[test]
    fn a_shell_directive_past_its_time_is_stopped_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("pid");
        let started = std::time::Instant::now();
        let e = run_shell(
            &format!("sleep 30 & echo $! > '{}'; wait", pid.display()),
            std::time::Duration::from_millis(300),
        )
        .unwrap_err()
        .to_string();
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert!(e.contains("took longer than 0 s and was stopped"), "{e}");
        let pid: i32 = std::fs::read_to_string(&pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The background sleep is gone too (a zombie at most, until init reaps it).
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !gone() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(gone(), "the background sleep outlived the directive");
        assert_eq!(run_shell("echo hi", SHELL_TIMEOUT).unwrap(), "hi\n");
    }

    #[test]
    fn a_template_is_filled_in_one_pass() {
        let file = Path::new("src/a.py");
        assert_eq!(
            fill(
                "{{filename}} ({{language}}): {{content}} {{x}} {{",
                "say {{filename}} {{language}}",
                Some(file)
            ),
            "a.py (python): say {{filename}} {{language}} {{x}} {{"
        );
        assert_eq!(fill("{{{content}}}", "c", None), "{c}");
    }

    #[test]
    fn an_alias_comes_first_with_stdin_as_its_content() {
        let mut io = Fake {
            stdin: "bonjour".into(),
            ..Fake::default()
        };
        let s = script(&[("-p", "after"), ("--alias", "translate")]);
        let got = compose(&s, &Aliases::builtin(), None, &mut io).unwrap();
        assert_eq!(
            got,
            "Please translate the following text to English:\n\nbonjour\nafter\n"
        );
        // A file-mode alias without a file: stdin, no language.
        let s = script(&[("--alias", "explain")]);
        let got = compose(&s, &Aliases::builtin(), None, &mut io).unwrap();
        assert!(
            got.ends_with("plain English:\n\n```\nbonjour\n```\n"),
            "{got}"
        );
    }

    #[test]
    fn session_pieces_keep_their_place_and_a_file_alias_reads_the_session_file() {
        let mut io = Fake {
            files: BTreeMap::from([(PathBuf::from("lib.rs"), "fn f() {}".to_string())]),
            stdin: "unused".into(),
            ..Fake::default()
        };
        let s = script(&[
            ("--session-m", "a.json"),
            ("-s", "-"),
            ("--session-xs", "b.json"),
            ("--alias", "explain"),
            ("--session-xl", "c.json"),
        ]);
        let got = compose(&s, &Aliases::builtin(), Some(Path::new("lib.rs")), &mut io).unwrap();
        assert!(
            got.ends_with("```rust\nfn f() {}\n```\n<M a.json>\n----\n<Xs b.json>\n<Xl c.json>\n"),
            "{got}"
        );
        assert_eq!(
            io.read,
            [
                "file lib.rs",
                "session M a.json",
                "session Xs b.json",
                "session Xl c.json"
            ]
        );
        // A stdin-mode alias ignores the file.
        let s = script(&[("--alias", "summarize")]);
        let got = compose(&s, &Aliases::builtin(), Some(Path::new("lib.rs")), &mut io).unwrap();
        assert!(got.ends_with(":\n\nunused\n"), "{got}");
    }

    #[test]
    fn a_second_alias_and_an_unknown_one_are_refused_naming_the_others() {
        let mut s = script(&[("--alias", "summarize")]);
        let e = s.take("--alias", "explain".into()).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        let s = script(&[("--alias", "poem")]);
        let e = compose(&s, &Aliases::builtin(), None, &mut Fake::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("unknown alias 'poem'"), "{e}");
        assert!(e.contains("  - code-review: Review code for issues"), "{e}");
        assert!(!PromptScript::default()
            .take("--thinking", "x".into())
            .unwrap());
    }

    #[test]
    fn configured_aliases_join_and_override_the_builtin_ones() {
        let cfg = r#"{"agentsFiles": [], "promptAliases": {
            "haiku": {"description": "a haiku", "template": "Haiku on {{content}}", "inputMode": "STDIN"},
            "translate": {"description": "to French", "template": "En français : {{content}}", "inputMode": "stdin"}}}"#;
        let aliases = Aliases::from_config(cfg, Path::new("agents-exe.cfg.json")).unwrap();
        let mut io = Fake {
            stdin: "rain".into(),
            ..Fake::default()
        };
        let got = compose(&script(&[("--alias", "haiku")]), &aliases, None, &mut io).unwrap();
        assert_eq!(got, "Haiku on rain\n");
        let got = compose(
            &script(&[("--alias", "translate")]),
            &aliases,
            None,
            &mut io,
        )
        .unwrap();
        assert_eq!(got, "En français : rain\n");
        assert!(aliases.get("summarize").is_ok());
        let bad = r#"{"promptAliases": {"x": {"description": "d", "template": "t", "inputMode": "pipe"}}}"#;
        let e = Aliases::from_config(bad, Path::new("agents-exe.cfg.json"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("agents-exe.cfg.json") && e.contains("pipe"),
            "{e}"
        );
        let none = Aliases::from_config("{}", Path::new("c.json")).unwrap();
        assert_eq!(none, Aliases::builtin());
    }

    #[test]
    fn a_template_knows_the_file_name_and_language() {
        let got = fill(
            "{{filename}} ({{language}}): {{content}}",
            "fn main() {}",
            Some(Path::new("src/main.rs")),
        );
        assert_eq!(got, "main.rs (rust): fn main() {}");
        assert_eq!(
            fill("[{{language}}]", "", Some(Path::new("x.unknown"))),
            "[]"
        );
    }

    #[test]
    fn a_failing_piece_fails_the_prompt() {
        let s = script(&[("-p", "a"), ("--shell", "false")]);
        let e = compose(&s, &Aliases::builtin(), None, &mut Fake::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("--shell `false` failed"), "{e}");
        let s = script(&[("-f", "missing.txt")]);
        let e = compose(&s, &Aliases::builtin(), None, &mut Fake::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.txt"), "{e}");
    }

    #[test]
    fn clap_options_keep_their_order_across_flags() {
        use clap::{Args, FromArgMatches};
        let cmd = PromptArgs::augment_args(clap::Command::new("t"));
        let m = cmd
            .try_get_matches_from([
                "t",
                "-p",
                "one",
                "-f",
                "a.txt",
                "-s",
                "-",
                "--alias",
                "summarize",
                "-p",
                "two",
                "--shell",
                "ls",
                "-S",
                "=",
                "--session-s",
                "x.json",
            ])
            .unwrap();
        let PromptArgs(s) = PromptArgs::from_arg_matches(&m).unwrap();
        assert_eq!(s.alias.as_deref(), Some("summarize"));
        assert_eq!(
            s.directives,
            [
                Directive::Text("one".into()),
                Directive::File("a.txt".into()),
                Directive::Separator {
                    times: 4,
                    text: "-".into()
                },
                Directive::Text("two".into()),
                Directive::Shell("ls".into()),
                Directive::Separator {
                    times: 40,
                    text: "=".into()
                },
                Directive::Session(Verbosity::S, "x.json".into()),
            ]
        );
        let cmd = PromptArgs::augment_args(clap::Command::new("t"));
        assert!(cmd
            .try_get_matches_from(["t", "--alias", "a", "--alias", "b"])
            .is_err());
    }

    #[test]
    fn a_read_past_the_cap_is_refused() {
        let long = std::io::repeat(b'x').take(MAX_PIECE + 1);
        let e = read_capped(long, "stdin").unwrap_err().to_string();
        assert!(e.contains("stdin is longer than"), "{e}");
        let e = read_capped(&[0xff, 0xfe][..], "--file x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }
}
