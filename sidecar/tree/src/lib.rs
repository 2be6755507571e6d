//! The agent tree: every agent file loaded, its parameters resolved, its
//! toolboxes described and bound, and every load-time check run.
//!
//! Loading either succeeds with an [`AgentTree`] (plus warnings) or fails
//! with every problem found, each naming the file, agent, toolbox, tool,
//! argument or parameter to fix.

#![forbid(unsafe_code)]

pub mod files;
pub mod live;
pub mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bindery_bindings::confirm::apply_toolbox_confirm;
use bindery_bindings::{apply_bindings, BindingLayer, BoundTool, Diagnostic, Level};
use bindery_params::scrub::Scrubber;
use bindery_params::{AgentParams, ApiKeys, ProcessValues, SecretString, Values};
use bindery_spec::{AgentSpec, BindingValue, Scope, Toolbox};
use bindery_tools::bash::{self, Limits};
use bindery_tools::{Disposition, Tool};

pub use live::LiveTools;

/// What loading needs besides the files.
#[derive(Default)]
pub struct LoadOptions {
    pub process: ProcessValues,
    pub api_keys: ApiKeys,
    pub limits: Limits,
    /// A script that cannot describe itself is skipped with a warning
    /// naming it (as agents-exe does) instead of failing the load: for
    /// `serve` and `run`; `check` stays strict.
    pub skip_broken_scripts: bool,
    /// Who gives a person's consent to an MCP server's `authorization-code`
    /// OAuth grant: the terminal for the command line; none for the server
    /// (such a toolbox fails to connect, saying so).
    pub mcp_consent: Option<Arc<dyn bindery_tools::mcp::oauth::Consent>>,
}

/// Where the agents are.
#[derive(Clone, Debug)]
pub enum AgentSources {
    /// Each file holds one or more agents; all are top-level agents.
    Files(Vec<PathBuf>),
    /// Every `*.yaml`, `*.yml` and `*.json` file in the directory.
    Dir(PathBuf),
}

/// A helper as its caller refers to it.
#[derive(Clone, Debug)]
pub struct Helper {
    /// `prompt_agent_<slug>`.
    pub slug: String,
    /// The helper agent's name in the tree.
    pub agent: String,
    pub with: BTreeMap<String, BindingValue>,
    pub narrowable: bool,
}

/// One agent, ready to run.
pub struct LoadedAgent {
    pub name: String,
    pub file: PathBuf,
    /// What its relative paths were resolved against.
    pub base: PathBuf,
    pub spec: AgentSpec,
    pub params: AgentParams,
    /// A run takes a snapshot; MCP servers may change the list.
    pub tools: LiveTools,
    pub helpers: Vec<Helper>,
    /// The key its file names for its model, read as it loaded.
    pub model_key: ModelKey,
    /// Each model fallback's key, in the fallbacks' order.
    pub fallback_keys: Vec<ModelKey>,
    /// Bedrock's keys (`bedrock.accessKeyId`, …) of the model and each
    /// fallback, in the chain's order (`None` where a model names none).
    pub aws_keys: Vec<Option<AwsKeysRead>>,
    /// The end user's values its bindings take (`{identity: …}`), found
    /// once as it loads: a run of a person's session gets these.
    pub identity_values: BTreeSet<bindery_spec::IdentityValue>,
    /// What must live as long as the agent (its MCP servers).
    _keep: Vec<Arc<dyn std::any::Any + Send + Sync>>,
}

/// The key an agent file names for its model (`apiKey`), read once, as the
/// agents load: the clients send it, and no listing may show it.
#[derive(Debug)]
pub enum ModelKey {
    /// The file names none.
    Absent,
    Key(SecretString),
    /// Its source gave something other than a string.
    NotText,
    Unreadable(bindery_params::sources::SourceError),
}

/// A model's Bedrock keys as read from their sources.
#[derive(Debug)]
pub struct AwsKeysRead {
    pub access_key_id: ModelKey,
    pub secret_access_key: ModelKey,
    pub session_token: ModelKey,
}

impl AwsKeysRead {
    /// The Bedrock keys of each model of `p`'s chain.
    fn read_chain(p: &Pending, opts: &LoadOptions) -> Vec<Option<AwsKeysRead>> {
        p.spec
            .model
            .chain()
            .iter()
            .map(|m| {
                let b = m.bedrock.as_ref()?;
                b.access_key_id.as_ref()?;
                Some(AwsKeysRead {
                    access_key_id: ModelKey::read_source(b.access_key_id.as_ref(), p, opts),
                    secret_access_key: ModelKey::read_source(b.secret_access_key.as_ref(), p, opts),
                    session_token: ModelKey::read_source(b.session_token.as_ref(), p, opts),
                })
            })
            .collect()
    }

    /// Its secrets, named as a scrubber shows them.
    fn named(&self, model: &str) -> impl Iterator<Item = (String, SecretString)> + '_ {
        let secret = self
            .secret_access_key
            .named(&format!("{model} AWS secret key"));
        let token = self
            .session_token
            .named(&format!("{model} AWS session token"));
        secret.into_iter().chain(token)
    }
}

impl ModelKey {
    fn read(p: &Pending, opts: &LoadOptions) -> ModelKey {
        Self::read_source(p.spec.model.api_key.as_ref(), p, opts)
    }

    /// The keys of `p`'s model fallbacks, in order.
    fn read_fallbacks(p: &Pending, opts: &LoadOptions) -> Vec<ModelKey> {
        p.spec
            .model
            .fallbacks
            .iter()
            .map(|f| Self::read_source(f.api_key.as_ref(), p, opts))
            .collect()
    }

    fn read_source(
        src: Option<&bindery_spec::ValueSource>,
        p: &Pending,
        opts: &LoadOptions,
    ) -> ModelKey {
        let Some(src) = src else {
            return ModelKey::Absent;
        };
        match bindery_params::sources::read_source(src, &p.base, &opts.api_keys) {
            Ok(serde_json::Value::String(k)) => ModelKey::Key(SecretString::new(k)),
            Ok(_) => ModelKey::NotText,
            Err(e) => ModelKey::Unreadable(e),
        }
    }

    /// The key as `what`'s, named as a scrubber shows it.
    fn named(&self, what: &str) -> Option<(String, SecretString)> {
        Some((what.to_owned(), self.key()?.clone()))
    }

    pub fn key(&self) -> Option<&SecretString> {
        match self {
            ModelKey::Key(k) => Some(k),
            _ => None,
        }
    }
}

impl LoadedAgent {
    pub fn tool(&self, name: &str) -> Option<BoundTool> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// Why a call of the tool (or helper) called `name` waits instead of
    /// running: its toolbox's say, else the agent-level `confirm`.
    pub fn disposition(&self, name: &str, tool: Option<&BoundTool>) -> Option<Disposition> {
        tool.and_then(BoundTool::disposition).or_else(|| {
            bindery_bindings::confirm::selects(&self.spec.confirm, name)
                .then_some(Disposition::Confirm)
        })
    }

    /// How long a call waits for approval (`confirmTtl`), if bounded.
    pub fn confirm_ttl(&self) -> Option<std::time::Duration> {
        self.spec
            .confirm_ttl
            .as_deref()
            .and_then(bindery_spec::parse_ttl)
            .map(std::time::Duration::from_secs)
    }

    /// The agent's budgets as the server measures them (`check` refuses
    /// any that does not read).
    pub fn budget_limits(&self) -> Vec<bindery_spec::budget::Limit> {
        self.spec
            .budgets
            .iter()
            .filter_map(bindery_spec::budget::Budget::limit)
            .collect()
    }

    /// Parameter values with process values and defaults only.
    pub fn process_values(&self) -> Values {
        self.params.snapshot(&Values::new(), &Values::new())
    }
}

pub struct AgentTree {
    pub agents: BTreeMap<String, Arc<LoadedAgent>>,
    /// Agents given directly (not only reached as helpers), in order.
    pub roots: Vec<String>,
    pub warnings: Vec<Diagnostic>,
}

impl AgentTree {
    pub fn agent(&self, name: &str) -> Option<&Arc<LoadedAgent>> {
        self.agents.get(name)
    }

    /// The agent called `name`, or the only top-level agent when no name is given.
    pub fn pick(&self, name: Option<&str>) -> Result<&Arc<LoadedAgent>, PickError> {
        let roots = || self.roots.join(", ");
        match name {
            Some(n) => self.agent(n).ok_or_else(|| PickError::NoSuchAgent {
                name: n.to_string(),
                roots: roots(),
            }),
            None if self.roots.len() == 1 => Ok(&self.agents[&self.roots[0]]),
            None => Err(PickError::WhichAgent(roots())),
        }
    }
}

/// Why no one agent was picked; the text lists the top-level agents.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PickError {
    #[error("no agent named `{name}` (agents: {roots})")]
    NoSuchAgent { name: String, roots: String },
    #[error("several agents are loaded ({0}); say which with --agent NAME")]
    WhichAgent(String),
}

/// Every problem found while loading.
#[derive(Debug)]
pub struct LoadError {
    pub diagnostics: Vec<Diagnostic>,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let errors = self
            .diagnostics
            .iter()
            .filter(|d| d.level == Level::Error)
            .count();
        writeln!(
            f,
            "the agents did not load ({errors} error{}):",
            if errors == 1 { "" } else { "s" }
        )?;
        for d in &self.diagnostics {
            writeln!(f, "  {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// An agent read from a file, before its tools are loaded.
struct Pending {
    name: String,
    file: PathBuf,
    /// What the toolboxes' relative paths (and the parameters' files)
    /// are resolved against: the agent file's directory, or for an
    /// agents-exe file the working directory, as agents-exe does.
    base: PathBuf,
    spec: AgentSpec,
    helpers: Vec<Helper>,
}

pub async fn load(sources: &AgentSources, opts: &LoadOptions) -> Result<AgentTree, LoadError> {
    let mut diags = Vec::new();
    let files = match sources {
        AgentSources::Files(f) => f.clone(),
        AgentSources::Dir(dir) => match agent_files_in(dir) {
            Ok(f) => f,
            Err(e) => {
                return Err(LoadError {
                    diagnostics: vec![Diagnostic::error(e.to_string())],
                })
            }
        },
    };
    let mut reader = Reader::default();
    let mut roots = Vec::new();
    for f in &files {
        match reader.read(f) {
            Ok(names) => roots.extend(names),
            Err(e) => diags.push(Diagnostic::error(e.to_string())),
        }
    }
    reader.resolve_helpers(&mut diags);
    let unread = !diags.is_empty() || !reader.errors.is_empty();
    diags.append(&mut reader.errors);
    diags.append(&mut reader.ignored);

    let mut agents = BTreeMap::new();
    let mut keys = model_keys(reader.pending.values(), opts);
    let mut aws: BTreeMap<String, Vec<Option<AwsKeysRead>>> = reader
        .pending
        .values()
        .map(|p| (p.name.clone(), AwsKeysRead::read_chain(p, opts)))
        .collect();
    let mut named = named_keys(&keys);
    named.extend(aws.iter().flat_map(|(agent, chain)| {
        chain.iter().enumerate().flat_map(move |(i, k)| {
            let model = match i {
                0 => agent.clone(),
                n => format!("{agent} fallback {n}"),
            };
            k.iter()
                .flat_map(move |k| k.named(&model).collect::<Vec<_>>())
        })
    }));
    // The keys are the server's own from here: a parameter's value
    // command, run as the agents load, is not given one in its
    // environment (under whatever variable holds it).
    let _keys = bindery_params::live::register_own(named.clone());
    let loaded =
        futures::future::join_all(reader.pending.values().map(|p| load_agent(p, opts, &named)))
            .await;
    for (mut agent, mut d) in loaded {
        diags.append(&mut d);
        let (key, fallbacks) = keys
            .remove(&agent.name)
            .unwrap_or((ModelKey::Absent, Vec::new()));
        agent.model_key = key;
        agent.fallback_keys = fallbacks;
        agent.aws_keys = aws.remove(&agent.name).unwrap_or_default();
        agents.insert(agent.name.clone(), Arc::new(agent));
    }
    check_helpers(&agents, &mut diags);
    // With a file unread, "declared by no agent" would be noise.
    if !unread {
        check_process_values(&agents, &opts.process, &mut diags);
    }

    if diags.iter().any(|d| d.level == Level::Error) {
        return Err(LoadError { diagnostics: diags });
    }
    Ok(AgentTree {
        agents,
        roots,
        warnings: diags,
    })
}

/// One agent from a definition's text (`PUT /v1/agents/:slug`), named
/// `label` in messages where a file would be named, checked exactly as a
/// file's agent is, plus `refuse` (reasons it may not be kept, each an
/// error); the document must hold one agent, called `slug`. It gets no
/// helper: helpers are refused before loading.
pub async fn load_document(
    label: &str,
    slug: &str,
    text: &str,
    opts: &LoadOptions,
    refuse: impl Fn(&AgentSpec) -> Vec<String>,
) -> Result<(Arc<LoadedAgent>, Vec<Diagnostic>), LoadError> {
    let fail = |m: String| LoadError {
        diagnostics: vec![Diagnostic::error(m)],
    };
    let mut parsed = files::parse_text(text).map_err(|e| fail(format!("{label}: {e}")))?;
    if parsed.len() != 1 {
        return Err(fail(format!(
            "{label}: give one agent ({} given)",
            parsed.len()
        )));
    }
    let agent = parsed.remove(0);
    if !agent.errors.is_empty() {
        return Err(LoadError {
            diagnostics: agent
                .errors
                .iter()
                .map(|e| Diagnostic::error(format!("{label}: {e}")))
                .collect(),
        });
    }
    if agent.name != slug {
        return Err(fail(format!(
            "{label}: the definition names agent `{}`; its name must be the slug in the path, `{slug}`",
            agent.name
        )));
    }
    let here = format!("{label}: agent `{slug}`");
    let mut diags: Vec<Diagnostic> = agent
        .ignored
        .iter()
        .map(|f| {
            Diagnostic::warning(format!(
                "{label}: ignored field {f} (Bindery does not read it: it guards nothing Bindery offers, or agents-exe does not know it either; remove it to silence this warning)"
            ))
        })
        .collect();
    let refused = refuse(&agent.spec);
    if agent.tool_directory.is_some() {
        diags.push(Diagnostic::error(format!(
            "{here}: `toolDirectory` reads the server's files; a stored agent has no helpers"
        )));
    }
    diags.extend(
        refused
            .into_iter()
            .map(|r| Diagnostic::error(format!("{here}, {r}"))),
    );
    if diags.iter().any(|d| d.level == Level::Error) {
        // Nothing it names is loaded: no program runs, no file is read.
        diags.extend(bindery_spec::checks::check_definition(
            slug,
            &agent.spec,
            &here,
        ));
        return Err(LoadError { diagnostics: diags });
    }
    let pending = Pending {
        name: agent.name,
        file: PathBuf::from(label),
        base: PathBuf::from("."),
        spec: agent.spec,
        helpers: Vec::new(),
    };
    // A stored agent's model keys are refused above; none is read here
    // whatever the definition says (a key's source may be a command or
    // a file of the server's).
    let (loaded, mut d) = load_agent(&pending, opts, &[]).await;
    diags.append(&mut d);
    if diags.iter().any(|d| d.level == Level::Error) {
        return Err(LoadError { diagnostics: diags });
    }
    Ok((Arc::new(loaded), diags))
}

/// Why `--agents-dir` gave no agent file.
#[derive(Debug, thiserror::Error)]
pub enum AgentsDirError {
    #[error("cannot read agents directory {}: {source}", dir.display())]
    Read {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("agents directory {} holds no .yaml, .yml or .json file", dir.display())]
    Empty { dir: PathBuf },
}

fn agent_files_in(dir: &Path) -> Result<Vec<PathBuf>, AgentsDirError> {
    let entries = std::fs::read_dir(dir).map_err(|source| AgentsDirError::Read {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(AgentsDirError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    Ok(files)
}

/// Why an agent file (or one it names) could not be read into the tree.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Parse(#[from] files::ParseError),
    #[error("{}: agent `{agent}` is already defined in {}; agent names must be unique", path.display(), first.display())]
    Duplicate {
        path: PathBuf,
        agent: String,
        first: PathBuf,
    },
    #[error("cannot read the working directory: {0}")]
    WorkingDirectory(std::io::Error),
}

/// Reads files, following helper paths, each file once.
#[derive(Default)]
struct Reader {
    pending: BTreeMap<String, Pending>,
    /// Canonical file path → the agent names it holds.
    seen: BTreeMap<PathBuf, Vec<String>>,
    /// (caller, helper reference index, file) for helpers given by path.
    by_path: Vec<(String, usize, PathBuf)>,
    /// One per field of an agents-exe file that Bindery does not read.
    ignored: Vec<Diagnostic>,
    /// What is wrong with a file that did not stop its reading.
    errors: Vec<Diagnostic>,
}

impl Reader {
    fn read(&mut self, path: &Path) -> Result<Vec<String>, ReadError> {
        let canonical = std::fs::canonicalize(path).map_err(|source| files::ParseError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        if let Some(names) = self.seen.get(&canonical) {
            return Ok(names.clone());
        }
        self.seen.insert(canonical.clone(), Vec::new());
        let parsed = files::parse_file(path)?;
        let base = files::dir_of(path);
        let mut names = Vec::new();
        for agent in parsed {
            self.errors.extend(
                agent
                    .errors
                    .iter()
                    .map(|e| Diagnostic::error(format!("{}: {e}", path.display()))),
            );
            self.ignored.extend(agent.ignored.iter().map(|f| {
                Diagnostic::warning(format!(
                    "{}: ignored field {f} (Bindery does not read it: it guards nothing Bindery offers, or agents-exe does not know it either; remove it to silence this warning)",
                    path.display()
                ))
            }));
            if let Some(other) = self.pending.get(&agent.name) {
                return Err(ReadError::Duplicate {
                    path: path.to_path_buf(),
                    agent: agent.name,
                    first: other.file.clone(),
                });
            }
            let mut helpers = Vec::new();
            for (i, h) in agent.spec.helpers.iter().enumerate() {
                helpers.push(Helper {
                    slug: h.slug.clone().unwrap_or_default(),
                    agent: h.agent.clone().unwrap_or_default(),
                    with: h.with.clone(),
                    narrowable: h.narrowable,
                });
                // Giving both or neither is reported by `spec::checks`.
                if let (None, Some(p)) = (&h.agent, &h.path) {
                    self.by_path.push((agent.name.clone(), i, base.join(p)));
                }
            }
            // Its helper agent files, from the agent file's directory as
            // agents-exe looks for them (its scripts, from the working
            // directory, are a bash toolbox); none there is no error.
            if let Some(dir) = agent.tool_directory.as_ref().map(|d| base.join(d)) {
                let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "json"))
                    .collect();
                found.sort();
                for f in found {
                    let i = helpers.len();
                    helpers.push(Helper {
                        slug: String::new(),
                        agent: String::new(),
                        with: BTreeMap::new(),
                        narrowable: true,
                    });
                    self.by_path.push((agent.name.clone(), i, f));
                }
            }
            names.push(agent.name.clone());
            let tool_base = if agent.agents_exe {
                std::env::current_dir().map_err(ReadError::WorkingDirectory)?
            } else {
                base.to_path_buf()
            };
            self.pending.insert(
                agent.name.clone(),
                Pending {
                    name: agent.name,
                    file: path.to_path_buf(),
                    base: tool_base,
                    spec: agent.spec,
                    helpers,
                },
            );
        }
        self.seen.insert(canonical, names.clone());
        Ok(names)
    }

    /// Read every helper file (and theirs), then fill in helper names.
    fn resolve_helpers(&mut self, diags: &mut Vec<Diagnostic>) {
        let mut next = 0;
        while next < self.by_path.len() {
            let (caller, i, path) = self.by_path[next].clone();
            next += 1;
            match self.read(&path) {
                Ok(names) if names.len() == 1 => {
                    if let Some(p) = self.pending.get_mut(&caller) {
                        p.helpers[i].agent = names[0].clone();
                    }
                }
                Ok(names) => diags.push(Diagnostic::error(format!(
                    "{}: a helper file must hold exactly one agent, it holds {}",
                    path.display(),
                    names.len()
                ))),
                Err(e) => diags.push(Diagnostic::error(e.to_string())),
            }
        }
        for p in self.pending.values_mut() {
            for h in &mut p.helpers {
                if h.slug.is_empty() {
                    h.slug = h.agent.clone();
                }
            }
        }
    }
}

/// Every agent's model key (see [`ModelKey`]), by agent: what no listing
/// of any agent may show, though the server's scrubbers know the keys only
/// once its clients are built.
fn model_keys<'p>(
    pending: impl IntoIterator<Item = &'p Pending>,
    opts: &LoadOptions,
) -> BTreeMap<String, (ModelKey, Vec<ModelKey>)> {
    pending
        .into_iter()
        .map(|p| {
            (
                p.name.clone(),
                (ModelKey::read(p, opts), ModelKey::read_fallbacks(p, opts)),
            )
        })
        .collect()
}

/// The keys of `keys` (each model's and its fallbacks'), each named as a
/// scrubber shows it.
fn named_keys(keys: &BTreeMap<String, (ModelKey, Vec<ModelKey>)>) -> Vec<(String, SecretString)> {
    keys.iter()
        .flat_map(|(agent, (key, fallbacks))| {
            key.named(&format!("{agent} model key")).into_iter().chain(
                fallbacks.iter().enumerate().filter_map(move |(i, k)| {
                    k.named(&format!("{agent} fallback {} model key", i + 1))
                }),
            )
        })
        .collect()
}

/// Load agent `p`; `keys`: the model keys no listing may show.
async fn load_agent(
    p: &Pending,
    opts: &LoadOptions,
    keys: &[(String, SecretString)],
) -> (LoadedAgent, Vec<Diagnostic>) {
    let mut diags = Vec::new();
    let file = p.file.display().to_string();
    let here = format!("{file}: agent `{}`", p.name);
    let base = p.base.clone();

    diags.extend(bindery_spec::checks::check_definition(
        &p.name, &p.spec, &here,
    ));
    let (params, errors) =
        AgentParams::build(&p.spec.parameters, &opts.process, &base, &opts.api_keys);
    diags.extend(
        errors
            .into_iter()
            .map(|e| Diagnostic::error(format!("{here}, {e}"))),
    );
    for s in params.statuses() {
        if s.scope == Scope::Process && s.required && !s.bound {
            let why = s.problem.map(|p| format!(" ({p})")).unwrap_or_default();
            diags.push(Diagnostic::error(format!(
                "{here}, parameter `{}`: required, process scope, and has no value{why}; supply it with --set {}=…, --params-file, or the environment variable BINDERY_PARAM_{}",
                s.name,
                s.name,
                s.name.to_ascii_uppercase()
            )));
        } else if let (Some(problem), false) = (&s.problem, s.bound) {
            diags.push(Diagnostic::warning(format!(
                "{here}, parameter `{}`: {problem}",
                s.name
            )));
        }
    }

    let mut tools: Vec<BoundTool> = Vec::new();
    // Each toolbox's tools, for rebuilding the list when an MCP server's change.
    let mut parts: Vec<Vec<BoundTool>> = Vec::new();
    let mut mcp = McpLoader::default();
    // The values known at load: what a toolbox's listing or a load error
    // may echo, and must not show.
    let known = params.snapshot(&Values::new(), &Values::new());
    for (i, tb) in p.spec.toolboxes.iter().enumerate() {
        let before = tools.len();
        load_toolbox(
            i, tb, p, &base, &params, opts, &here, &mut mcp, &mut tools, &mut diags,
        )
        .await;
        let loaded = tools.split_off(before);
        let mut secrets = bindery_bindings::secrets_for(&known, &loaded);
        secrets.extend_from_slice(keys);
        let scrubber = Scrubber::of(&secrets);
        let scrub = |x: &str| scrubber.scrub(x);
        let guard = bindery_bindings::listing::Guard::new(&scrub, secrets.iter().map(|(_, s)| s));
        let place = format!("{here}, {}", bindery_spec::checks::toolbox_label(i, tb));
        for t in loaded {
            match guard.check(t) {
                Ok(t) => tools.push(t),
                Err(e) => diags.push(Diagnostic::error(format!("{place}: {e}"))),
            }
        }
        for t in &mut tools[before..] {
            *t = t.clone().in_group(tb.toolgroup());
        }
        parts.push(tools[before..].to_vec());
    }
    bindery_bindings::apply::apply_bindings_with(
        &mut tools,
        &p.spec.bindings,
        BindingLayer::Agent,
        &p.spec.parameters,
        &format!("{here}, agent-level bindings"),
        bindery_bindings::apply::agent_typo_level,
        &mut diags,
    );
    bindery_bindings::depends::apply_agent_decls(&mut tools, &p.spec.tools);
    bindery_bindings::depends::check_loaded(&tools, &here, &mut diags);
    for t in tools
        .iter()
        .filter(|t| t.disposition() == Some(Disposition::Deferred) && !t.bindings().is_empty())
    {
        diags.push(Diagnostic::error(format!(
            "{here}, agent-level bindings: tool `{}` is deferred (the client runs it, and gets only the model's arguments), so nothing can be bound into it; remove the binding of `{}` or narrow its `tool` glob",
            t.name(),
            t.bindings()[0].arg
        )));
    }
    let mut names: Vec<String> = tools.iter().map(|t| t.name().to_string()).collect();
    let prefix = p.spec.naming.helper_prefix();
    names.extend(p.helpers.iter().map(|h| format!("{prefix}{}", h.slug)));
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    bindery_bindings::confirm::check_selectors(
        &p.spec.confirm,
        &names,
        &format!("{here}, agent-level confirm"),
        |s| {
            if s.tool.starts_with("mcp_") {
                Level::Warning
            } else {
                Level::Error
            }
        },
        &mut diags,
    );
    // A load error may quote what a server sent (a spec's text, a
    // listing): it is shown as the values' markers.
    let mut secrets = bindery_bindings::secrets_for(&known, &tools);
    secrets.extend_from_slice(keys);
    let scrubber = Scrubber::of(&secrets);
    for d in &mut diags {
        d.message = scrubber.scrub(&d.message);
    }
    let tools = LiveTools::new(tools);
    let keep = mcp.watch(
        live::Assembly {
            parts,
            agent_bindings: p.spec.bindings.clone(),
            agent_decls: p.spec.tools.clone(),
            params: p.spec.parameters.clone(),
            here: here.clone(),
        },
        &tools,
    );
    let agent = LoadedAgent {
        name: p.name.clone(),
        file: p.file.clone(),
        base: p.base.clone(),
        spec: p.spec.clone(),
        params,
        tools,
        helpers: p.helpers.clone(),
        model_key: ModelKey::Absent,
        fallback_keys: Vec::new(),
        aws_keys: Vec::new(),
        identity_values: p.spec.identity_values(),
        _keep: keep,
    };
    (agent, diags)
}

/// A script that failed to describe itself: an error, or with
/// `skip_broken_scripts` a warning saying the tool is left out.
fn broken_script(place: &str, e: bash::ScriptError, opts: &LoadOptions) -> Diagnostic {
    if opts.skip_broken_scripts {
        Diagnostic::warning(format!(
            "{place}: {e}; its tool is left out (`check` fails on this)"
        ))
    } else {
        Diagnostic::error(format!("{place}: {e}"))
    }
}

/// Load toolbox `i` of agent `p`, appending its tools (bound by the
/// toolbox's own bindings) to `tools`.
#[allow(clippy::too_many_arguments)]
async fn load_toolbox(
    i: usize,
    tb: &Toolbox,
    p: &Pending,
    base: &Path,
    params: &AgentParams,
    opts: &LoadOptions,
    here: &str,
    mcp: &mut McpLoader,
    tools: &mut Vec<BoundTool>,
    diags: &mut Vec<Diagnostic>,
) {
    let b = match tb {
        Toolbox::Bash(b) => b,
        Toolbox::Deferred(d) => {
            let place = format!("{here}, {}", bindery_spec::checks::toolbox_label(i, tb));
            let mut bound = Vec::new();
            for decl in &d.tools {
                match bindery_tools::deferred::DeferredTool::new(decl) {
                    Ok(t) => bound.push(
                        BoundTool::new(Arc::new(t) as Arc<dyn Tool>)
                            .with_disposition(Disposition::Deferred),
                    ),
                    Err(e) => diags.push(Diagnostic::error(format!("{place}: {e}"))),
                }
            }
            check_names(&bound, tools, &place, "the tool's `name`", diags);
            tools.extend(bound);
            return;
        }
        Toolbox::Mcp(m) => {
            let place = format!("{here}, {}", bindery_spec::checks::toolbox_label(i, tb));
            mcp.load(i, m, base, p, params, opts, &place, tools, diags)
                .await;
            return;
        }
        Toolbox::Builtin(bt) => {
            let place = format!("{here}, {}", bindery_spec::checks::toolbox_label(i, tb));
            let sources = bindery_spec::checks::env_sources(&p.spec);
            let tool = bindery_tools::builtin::SystemTool::new(bt, &sources, p.spec.naming);
            let bound = vec![BoundTool::new(Arc::new(tool) as Arc<dyn Tool>)];
            let added = Added {
                what: "the toolbox `name`",
                bindings: &bt.bindings,
                decls: &[],
                confirm: None,
                place: &place,
            };
            added.add(bound, p, tools, diags);
            return;
        }
        Toolbox::Sqlite(q) => {
            let place = format!("{here}, {}", bindery_spec::checks::toolbox_label(i, tb));
            let root = match q.versioned.as_ref().and_then(|v| v.storage_root.as_ref()) {
                Some(r) => base.join(r),
                None => bindery_tools::sqlite_versions::default_root(|k| std::env::var(k).ok()),
            };
            let path = base.join(&q.path);
            match bindery_tools::sqlite::SqliteTool::open_all(q, path, root, p.spec.naming) {
                Ok(found) => {
                    let added = Added {
                        what: "the toolbox `name`",
                        bindings: &q.bindings,
                        decls: &[],
                        confirm: None,
                        place: &place,
                    };
                    let bound = found
                        .into_iter()
                        .map(|t| BoundTool::new(Arc::new(t) as Arc<dyn Tool>))
                        .collect();
                    added.add(bound, p, tools, diags);
                }
                Err(e) => diags.push(Diagnostic::error(format!("{place}: {e}"))),
            }
            return;
        }
        Toolbox::Postgrest(pg) => {
            let label = bindery_spec::checks::toolbox_label(i, tb);
            let place = format!("{here}, {label}");
            let o = pg.as_openapi();
            let names = (place.as_str(), label.as_str());
            if let Some(bound) =
                load_openapi(&o, Some(pg), base, p, params, opts, names, diags).await
            {
                let added = Added {
                    what: "the table",
                    bindings: &pg.bindings,
                    decls: &[],
                    confirm: pg.confirm.as_ref(),
                    place: &place,
                };
                added.add(bound, p, tools, diags);
            }
            return;
        }
        Toolbox::Openapi(o) => {
            let label = bindery_spec::checks::toolbox_label(i, tb);
            let place = format!("{here}, {label}");
            let names = (place.as_str(), label.as_str());
            if let Some(bound) = load_openapi(o, None, base, p, params, opts, names, diags).await {
                let added = Added {
                    what: "operationId",
                    bindings: &o.bindings,
                    decls: &o.tools,
                    confirm: o.confirm.as_ref(),
                    place: &place,
                };
                added.add(bound, p, tools, diags);
            }
            return;
        }
    };
    let loaded = match (&b.directory, &b.script) {
        (Some(dir), None) => {
            bash::load_directory(&base.join(dir), b.basename_filter.as_deref(), opts.limits).await
        }
        (None, Some(script)) if b.basename_filter.is_none() => {
            match bash::load_script(&base.join(script), opts.limits).await {
                Ok(t) => Ok((vec![t], Vec::new())),
                Err(e) => Ok((Vec::new(), vec![e])),
            }
        }
        // A malformed toolbox is reported by `spec::checks`.
        _ => return,
    };
    let place = format!("{here}, {}", bindery_spec::checks::toolbox_label(i, tb));
    let (found, errors) = match loaded {
        Ok(x) => x,
        Err(e) => {
            diags.push(Diagnostic::error(format!("{place}: {e}")));
            return;
        }
    };
    diags.extend(errors.into_iter().map(|e| broken_script(&place, e, opts)));
    let bound: Vec<BoundTool> = found
        .into_iter()
        .map(|t| {
            let shared = b.cache == Some(bindery_spec::ToolboxCache::Shared);
            BoundTool::new(Arc::new(t.shared(shared)) as Arc<dyn Tool>)
        })
        .collect();
    let added = Added {
        what: "the script's slug",
        bindings: &b.bindings,
        decls: &b.tools,
        confirm: b.confirm.as_ref(),
        place: &place,
    };
    added.add(bound, p, tools, diags);
}

/// A toolbox's tools joining the agent's: their names checked against
/// the earlier ones (`what` names where a clash comes from), then the
/// toolbox's own bindings, tool declarations (`readOnly`, `depends_on`)
/// and `confirm` applied.
struct Added<'a> {
    what: &'a str,
    bindings: &'a [bindery_spec::Binding],
    decls: &'a [bindery_spec::ToolDecl],
    confirm: Option<&'a bindery_spec::ToolboxConfirm>,
    place: &'a str,
}

impl Added<'_> {
    fn add(
        &self,
        mut bound: Vec<BoundTool>,
        p: &Pending,
        tools: &mut Vec<BoundTool>,
        diags: &mut Vec<Diagnostic>,
    ) {
        check_names(&bound, tools, self.place, self.what, diags);
        apply_bindings(
            &mut bound,
            self.bindings,
            BindingLayer::Toolbox,
            &p.spec.parameters,
            self.place,
            diags,
        );
        bindery_bindings::depends::apply_toolbox_decls(&mut bound, self.decls);
        apply_toolbox_confirm(&mut bound, self.confirm);
        check_toolbox_confirm(&bound, self.confirm, self.place, Level::Error, diags);
        tools.extend(bound);
    }
}

/// The typo guard of a toolbox's `confirm` selectors, on its own tools.
fn check_toolbox_confirm(
    tools: &[BoundTool],
    confirm: Option<&bindery_spec::ToolboxConfirm>,
    place: &str,
    level: Level,
    diags: &mut Vec<Diagnostic>,
) {
    let names: Vec<&str> = tools.iter().map(|t| t.spec().local_name.as_str()).collect();
    bindery_bindings::confirm::check_selectors(
        bindery_bindings::confirm::toolbox_selectors(confirm),
        &names,
        place,
        |_| level,
        diags,
    );
}

/// One MCP server of an agent, and what re-listing its tools needs: its
/// toolbox's index, place in messages, bindings and `confirm`.
type Watched = (
    usize,
    bindery_tools::mcp::McpConnection,
    String,
    Vec<bindery_spec::Binding>,
    (
        Option<bindery_spec::ToolboxConfirm>,
        Vec<bindery_spec::ToolDecl>,
        Option<String>,
    ),
    Vec<bindery_bindings::AppliedBinding>,
);

/// The bound arguments of an MCP toolbox's tools: a per-user server's
/// person and header values, from the run's end user (left out in a run
/// without one: the tool then says so, and makes no call).
fn mcp_credentials(m: &bindery_spec::McpToolbox) -> Vec<bindery_bindings::AppliedBinding> {
    bindery_tools::mcp::McpConnection::credentials(m)
        .into_iter()
        .map(|(arg, key)| bindery_bindings::AppliedBinding {
            arg,
            value: bindery_bindings::BoundValue::Param(key),
            when_unbound: bindery_spec::WhenUnbound::Omit,
        })
        .collect()
}

/// The MCP servers of one agent: started at load, then watched for
/// changes to their tool lists.
#[derive(Default)]
struct McpLoader {
    servers: Vec<Watched>,
    changes: Option<(
        tokio::sync::mpsc::UnboundedSender<usize>,
        tokio::sync::mpsc::UnboundedReceiver<usize>,
    )>,
}

impl McpLoader {
    /// Start MCP toolbox `i` and append its tools. The typo guard of its
    /// bindings is a warning: an MCP server's tools come late and may change.
    #[allow(clippy::too_many_arguments)]
    async fn load(
        &mut self,
        i: usize,
        m: &bindery_spec::McpToolbox,
        base: &Path,
        p: &Pending,
        params: &AgentParams,
        opts: &LoadOptions,
        place: &str,
        tools: &mut Vec<BoundTool>,
        diags: &mut Vec<Diagnostic>,
    ) {
        use bindery_tools::mcp::McpConnection;
        // A server whose configuration is wrong is not started (the
        // problem is reported by `spec::checks`).
        let mut own = Vec::new();
        bindery_spec::checks::check_mcp(&p.spec, m, place, &mut own);
        if own.iter().any(|d| d.level == Level::Error) {
            return;
        }
        // Only values known at load configure a process shared by every session.
        let values = params.snapshot(&Values::new(), &Values::new());
        let (tx, _) = self
            .changes
            .get_or_insert_with(tokio::sync::mpsc::unbounded_channel);
        let server = match McpConnection::start(
            m,
            base,
            &values,
            opts.limits,
            tx.clone(),
            i,
            opts.mcp_consent.clone(),
        )
        .await
        {
            Ok(s) => s,
            Err(e) => {
                diags.push(Diagnostic::error(format!("{place}: {e}")));
                return;
            }
        };
        let (found, warnings) = match server.tools().await {
            Ok(x) => x,
            Err(e) => {
                diags.push(Diagnostic::error(format!("{place}: {e}")));
                return;
            }
        };
        diags.extend(
            warnings
                .into_iter()
                .map(|w| Diagnostic::warning(format!("{place}: {w}"))),
        );
        let credentials = mcp_credentials(m);
        let mut bound: Vec<BoundTool> = found
            .into_iter()
            .map(|t| {
                BoundTool::new(Arc::new(t) as Arc<dyn Tool>)
                    .with_bindings(credentials.iter().cloned())
            })
            .collect();
        check_names(&bound, tools, place, "the server's `name`", diags);
        bindery_bindings::apply::apply_bindings_with(
            &mut bound,
            &m.bindings,
            BindingLayer::Toolbox,
            &p.spec.parameters,
            place,
            |_| Level::Warning,
            diags,
        );
        bindery_bindings::depends::apply_toolbox_decls(&mut bound, &m.tools);
        apply_toolbox_confirm(&mut bound, m.confirm.as_ref());
        check_toolbox_confirm(&bound, m.confirm.as_ref(), place, Level::Warning, diags);
        tools.extend(bound);
        self.servers.push((
            i,
            server,
            place.to_string(),
            m.bindings.clone(),
            (m.confirm.clone(), m.tools.clone(), m.toolgroup.clone()),
            credentials,
        ));
    }

    /// Rebuild `tools` whenever a server says its tools changed; returns
    /// what keeps the servers alive. An agent tree is never unloaded, so
    /// they live as long as the process; when it ends, the runtime drops
    /// the tasks holding each program, which stops it (kill on drop).
    fn watch(
        self,
        mut asm: live::Assembly,
        tools: &LiveTools,
    ) -> Vec<Arc<dyn std::any::Any + Send + Sync>> {
        let Some((_, mut rx)) = self.changes else {
            return Vec::new();
        };
        let keep = self
            .servers
            .iter()
            .map(|(_, s, _, _, _, _)| Arc::new(s.clone()) as Arc<dyn std::any::Any + Send + Sync>)
            .collect();
        let servers = self.servers;
        let live = tools.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut changed = BTreeSet::from([first]);
                while let Ok(i) = rx.try_recv() {
                    changed.insert(i);
                }
                for (i, server, place, bindings, (confirm, decls, group), credentials) in &servers {
                    if !changed.contains(i) {
                        continue;
                    }
                    match server.tools().await {
                        Ok((found, warnings)) => {
                            for w in warnings {
                                tracing::warn!("{place}: {w}");
                            }
                            let bound = found
                                .into_iter()
                                .map(|t| {
                                    BoundTool::new(Arc::new(t) as Arc<dyn Tool>)
                                        .with_bindings(credentials.iter().cloned())
                                })
                                .collect::<Vec<_>>();
                            let bound = live::guard_listings(bound, place);
                            let (mut bound, diags) = live::rebind(
                                bound,
                                bindings,
                                BindingLayer::Toolbox,
                                &asm.params,
                                place,
                            );
                            bindery_bindings::depends::apply_toolbox_decls(&mut bound, decls);
                            apply_toolbox_confirm(&mut bound, confirm.as_ref());
                            for d in diags {
                                tracing::warn!("{}", d.message);
                            }
                            asm.parts[*i] = bound
                                .into_iter()
                                .map(|t| t.in_group(group.as_deref()))
                                .collect();
                        }
                        Err(e) => {
                            tracing::warn!("{place}: the tools changed but cannot be listed: {e}")
                        }
                    }
                }
                let (all, diags) = asm.assemble();
                for d in diags {
                    tracing::warn!("{}", d.message);
                }
                tracing::info!(
                    "{}: tools changed, now {}",
                    asm.here,
                    all.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
                );
                live.set(all);
            }
        });
        keep
    }
}

use bindery_spec::checks::valid_tool_name;

/// Each new tool has a valid name that no earlier tool took; `what` says
/// where the name comes from.
fn check_names(
    new: &[BoundTool],
    earlier: &[BoundTool],
    place: &str,
    what: &str,
    diags: &mut Vec<Diagnostic>,
) {
    for (k, t) in new.iter().enumerate() {
        if !valid_tool_name(t.name()) {
            diags.push(Diagnostic::error(format!(
                "{place}: tool `{}`: a model-visible tool name may use only letters, digits, `_` and `-`, at most 64 characters; change {what}",
                t.name()
            )));
        }
        let dup = earlier
            .iter()
            .chain(&new[..k])
            .find(|x| x.name() == t.name());
        if let Some(dup) = dup {
            diags.push(Diagnostic::error(format!(
                "{place}: tool `{}` is defined twice (also by {}); tool names must be unique in an agent",
                t.name(),
                dup.spec().local_name
            )));
        }
    }
}

/// The argument names a toolbox's or the agent's bindings name, and those
/// a `depends_on` lookup fills (the first step of each `map` destination).
fn filled_args(
    toolbox: &[bindery_spec::Binding],
    decls: &[bindery_spec::ToolDecl],
    agent: &AgentSpec,
) -> BTreeSet<String> {
    let lookups = decls.iter().chain(&agent.tools).flat_map(|d| &d.depends_on);
    let destinations = lookups.flat_map(|d| d.map.keys()).filter_map(|dest| {
        let rest = dest.strip_prefix("$.")?;
        Some(rest.split(['.', '[']).next().unwrap_or(rest).to_string())
    });
    toolbox
        .iter()
        .chain(&agent.bindings)
        .map(|b| b.arg.clone())
        .chain(destinations)
        .collect()
}

/// An OpenAPI toolbox's tools, or `None` with the problem reported.
/// `(place, label)`: the toolbox in the load's messages, and in its tools'
/// errors (without the agent file's path).
#[allow(clippy::too_many_arguments)]
async fn load_openapi(
    o: &bindery_spec::OpenApiToolbox,
    postgrest: Option<&bindery_spec::PostgrestToolbox>,
    base: &Path,
    p: &Pending,
    params: &AgentParams,
    opts: &LoadOptions,
    (place, label): (&str, &str),
    diags: &mut Vec<Diagnostic>,
) -> Option<Vec<BoundTool>> {
    use bindery_tools::openapi;
    // Values known at load (process values and defaults) may fetch the spec.
    let values = params.snapshot(&Values::new(), &Values::new());
    let keys = &opts.api_keys;
    let agents_exe = p.spec.naming == bindery_spec::Naming::AgentsExe;
    // Arguments a binding or a lookup fills keep Bindery's names and places.
    let kept = filled_args(&o.bindings, &o.tools, &p.spec);
    let kept = |arg: &str| kept.contains(arg);
    let loaded = match postgrest {
        Some(pg) => {
            // agents-exe names every PostgREST toolbox `postgrest`.
            let toolbox = if agents_exe { "postgrest" } else { &pg.name };
            let read = |doc: &serde_json::Value| {
                let (ops, warnings) =
                    openapi::postgrest::operations(doc, toolbox, &pg.allowed_methods)?;
                let ops = match agents_exe {
                    true => ops
                        .into_iter()
                        .map(|op| openapi::agents_exe_args::regroup(op, kept))
                        .collect(),
                    false => ops,
                };
                Ok((ops, warnings))
            };
            openapi::load_with(o, label, base, &values, keys, read).await
        }
        None if agents_exe => {
            let read = |doc: &serde_json::Value| {
                let (ops, warnings) = openapi::operations(doc)?;
                let ops = ops.into_iter().map(|mut op| {
                    op.spec.name = openapi::document::agents_exe_name(&op);
                    openapi::agents_exe_args::regroup(op, kept)
                });
                Ok((ops.collect(), warnings))
            };
            openapi::load_with(o, label, base, &values, keys, read).await
        }
        None => openapi::load(o, label, base, &values, keys).await,
    };
    match loaded {
        Ok(loaded) => {
            diags.extend(
                loaded
                    .warnings
                    .into_iter()
                    .map(|w| Diagnostic::warning(format!("{place}: {w}"))),
            );
            // Each credential argument is bound to its parameter: the
            // model never sees it, and a required parameter without a
            // value fails the call rather than sending no credential.
            let credentials: Vec<bindery_bindings::AppliedBinding> = loaded
                .credentials
                .into_iter()
                .map(|(arg, param)| {
                    let required = p
                        .spec
                        .parameters
                        .iter()
                        .any(|d| d.name == param && d.required);
                    bindery_bindings::AppliedBinding {
                        arg,
                        value: bindery_bindings::BoundValue::Param(param),
                        when_unbound: if required {
                            bindery_spec::WhenUnbound::Fail
                        } else {
                            bindery_spec::WhenUnbound::Omit
                        },
                    }
                })
                .collect();
            Some(
                loaded
                    .tools
                    .into_iter()
                    .map(|t| BoundTool::new(t).with_bindings(credentials.iter().cloned()))
                    .collect(),
            )
        }
        Err(e) => {
            diags.push(Diagnostic::error(format!("{place}: {e}")));
            None
        }
    }
}

/// Helper references point at loaded agents; `with` names declared
/// parameters on both sides and covers the helper's required session
/// parameters.
fn check_helpers(agents: &BTreeMap<String, Arc<LoadedAgent>>, diags: &mut Vec<Diagnostic>) {
    for a in agents.values() {
        let here = format!("{}: agent `{}`", a.file.display(), a.name);
        let mut slugs = BTreeSet::new();
        for (i, h) in a.helpers.iter().enumerate() {
            let at = format!("{here}, helper {} (`{}`)", i + 1, h.slug);
            if !slugs.insert(h.slug.as_str()) {
                diags.push(Diagnostic::error(format!(
                    "{at}: two helpers share this slug"
                )));
            }
            let Some(helper) = agents.get(&h.agent) else {
                if !h.agent.is_empty() {
                    diags.push(Diagnostic::error(format!(
                        "{at}: no loaded agent is named `{}` (agents: {})",
                        h.agent,
                        agents.keys().cloned().collect::<Vec<_>>().join(", ")
                    )));
                }
                continue;
            };
            if !valid_tool_name(&format!("prompt_agent_{}", h.slug)) {
                diags.push(Diagnostic::error(format!(
                    "{at}: a slug may use only letters, digits, `_` and `-`"
                )));
            }
            for key in h.with.keys() {
                if helper.params.decl(key).is_none() {
                    diags.push(Diagnostic::error(format!(
                        "{at}: `with` fills `{key}`, which agent `{}` does not declare",
                        helper.name
                    )));
                }
            }
            for s in helper.params.statuses() {
                if s.required
                    && s.scope != Scope::Process
                    && !s.bound
                    && !h.with.contains_key(&s.name)
                {
                    diags.push(Diagnostic::error(format!(
                        "{at}: agent `{}` requires {}-scope parameter `{}`, which neither `with` nor its own process value or default fills",
                        helper.name,
                        s.scope.as_str(),
                        s.name
                    )));
                }
            }
        }
    }
}

/// Every process value names a parameter some loaded agent declares.
fn check_process_values(
    agents: &BTreeMap<String, Arc<LoadedAgent>>,
    process: &ProcessValues,
    diags: &mut Vec<Diagnostic>,
) {
    let declared: BTreeSet<&str> = agents
        .values()
        .flat_map(|a| a.params.decls().iter().map(|d| d.name.as_str()))
        .collect();
    for (name, pv) in process.iter() {
        if !declared.contains(name.as_str()) {
            diags.push(Diagnostic::error(format!(
                "parameter `{name}` ({}) is declared by no loaded agent (declared: {})",
                pv.origin,
                if declared.is_empty() {
                    "none".to_string()
                } else {
                    declared.iter().copied().collect::<Vec<_>>().join(", ")
                }
            )));
        }
    }
}
