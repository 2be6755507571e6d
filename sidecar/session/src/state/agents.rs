//! The agents this server runs ([`Agents`]): those its files define and,
//! with `serve --stored-agents`, those kept in the session store by the
//! API (`PUT /v1/agents/:slug`).
//!
//! Only with `serve --stored-agents`. A stored definition is checked
//! exactly as a file is, and more: whoever holds the owner token chooses
//! all of it, so it may use nothing that runs code, reads the server's
//! files or environment, or hands on a value the server holds
//! ([`bindery_spec::checks::stored_agent_refusals`]); it gets none of the
//! server's process values or API keys. A file agent's slug is never
//! shadowed.
//!
//! Loaded agents are kept in memory by the time their definition was put:
//! all of them at start, one again when it is put, and each time a session
//! is created for it (so that another server's put or delete on a shared
//! store is seen there).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use crate::clients::{build_clients, ClientOptions};
use crate::error::{Code, ErrorKind, ServiceError};
use crate::state::audit::{actor, AuditLog};
use crate::validate::Caller;
use bindery_llm::ChatClient;
use bindery_store::audit::Action;
use bindery_store::clock::Clock;
use bindery_store::{SessionStore, StoredAgent};
use bindery_tools::bash::Limits;
use bindery_tree::{AgentTree, LoadOptions, LoadedAgent};

/// The agents this server runs, each with its model client.
pub struct Agents {
    /// The files' agents, loaded at start.
    tree: Arc<AgentTree>,
    clients: BTreeMap<String, ChatClient>,
    /// Where the files' agents come from, as `GET /v1/agents` shows it.
    source: AgentSource,
    /// The store's agents, when the server keeps them.
    stored: OnceLock<StoredAgents>,
    store: Arc<dyn SessionStore>,
    clock: Arc<dyn Clock>,
    /// Where a stored agent's change is recorded before it is made.
    audit: Arc<AuditLog>,
}

/// What building a stored agent needs (the server's model options).
pub struct StoredAgents {
    pub limits: Limits,
    pub client: ClientOptions,
    loaded: Mutex<HashMap<String, Loaded>>,
}

#[derive(Clone)]
struct Loaded {
    updated_at: i64,
    agent: Arc<LoadedAgent>,
    client: ChatClient,
}

impl StoredAgents {
    pub fn new(limits: Limits, client: ClientOptions) -> StoredAgents {
        StoredAgents {
            limits,
            client,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Loaded>> {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where an agent comes from, as `GET /v1/agents` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentSource {
    /// An agent file given to the server.
    File,
    /// An `Agent` resource, which the operator gives the server as a file.
    Crd,
    /// Sent over the API and kept in the session store.
    Store,
}

impl AgentSource {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentSource::File => "file",
            AgentSource::Crd => "crd",
            AgentSource::Store => "store",
        }
    }
}

/// How deep a definition sent over the API may nest (an agent's file
/// nests a dozen levels).
const MAX_DEPTH: usize = 128;

/// Whether `text` (JSON or YAML) may nest deeper than `max` levels, by one
/// linear scan before any parser sees it: libyaml's scanner takes time
/// that grows with the square of the depth (40,000 levels held a worker
/// for 5 s). Block nesting: a line's indentation and its leading `- `,
/// `? ` and `: ` markers. Flow nesting: every `[` and `{` counts, quoted or
/// not (what YAML takes for a quote is not a scan's to tell), and more
/// than `32 × max` of them is refused; a definition has a few dozen, and
/// at that bound the parser's time stays small.
pub fn nests_deeper_than(text: &str, max: usize) -> bool {
    let openers = text.bytes().filter(|b| matches!(b, b'[' | b'{')).count();
    if openers > max.saturating_mul(32) {
        return true;
    }
    text.lines().any(|line| {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let mut rest = &line[indent..];
        let mut markers = 0;
        while let Some(r) = ["- ", "? ", ": "].iter().find_map(|m| rest.strip_prefix(m)) {
            markers += 1;
            rest = r.trim_start_matches(' ');
        }
        indent / 2 + markers > max
    })
}

/// Whether YAML `text` has an anchor or an alias (`&name`, `*name` where
/// a node starts): each alias is expanded into a copy of what it names, so
/// a few kB of them make billions of values ("billion laughs") while no
/// bracket or indentation shows it. Where a plain scalar would start with
/// `*`, YAML reads an alias too, so nothing else is refused.
pub fn has_yaml_alias(text: &str) -> bool {
    // The indentation of the line that opened a block scalar (`|`, `>`):
    // lines indented deeper are its text, not nodes.
    let mut scalar_at: Option<usize> = None;
    text.lines().any(|line| {
        let indent = line.len() - line.trim_start().len();
        if let Some(at) = scalar_at {
            if line.trim().is_empty() || indent > at {
                return false;
            }
            scalar_at = None;
        }
        let end = line.trim_end();
        if ["|", ">", "|-", ">-", "|+", ">+"]
            .iter()
            .any(|m| end.ends_with(m))
        {
            scalar_at = Some(indent);
        }
        let chars: Vec<char> = line.chars().collect();
        (0..chars.len()).any(|i| {
            let c = chars[i];
            let starts_node = chars[..i]
                .iter()
                .rev()
                .find(|p| !p.is_whitespace())
                .is_none_or(|p| matches!(p, '-' | ':' | '[' | '{' | ',' | '?'));
            let spaced =
                i == 0 || chars[i - 1].is_whitespace() || matches!(chars[i - 1], '[' | '{' | ',');
            matches!(c, '&' | '*')
                && starts_node
                && spaced
                && chars
                    .get(i + 1)
                    .is_some_and(|n| !n.is_whitespace() && !matches!(n, ',' | ']' | '}'))
        })
    })
}

/// A definition the API sent, as JSON text: JSON as given, YAML turned
/// into JSON (one document).
fn as_json(body: &str) -> Result<String, ServiceError> {
    if body.trim_start().starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(body)
            .map_err(|e| ServiceError::bad_request(format!("the body is not valid JSON: {e}")))?;
        return Ok(v.to_string());
    }
    let v: serde_json::Value = serde_yaml::from_str(body).map_err(|e| {
        ServiceError::bad_request(format!(
            "the body is neither JSON nor one YAML document: {e}"
        ))
    })?;
    Ok(v.to_string())
}

fn disabled() -> ServiceError {
    ServiceError::new(
        ErrorKind::Forbidden,
        Code::StoredAgentsDisabled,
        "this server keeps no agents sent over the API; start it with --stored-agents to allow it (see docs/agents.md, Stored agents)",
    )
}

impl Agents {
    pub(crate) fn new(
        tree: Arc<AgentTree>,
        clients: BTreeMap<String, ChatClient>,
        source: AgentSource,
        store: Arc<dyn SessionStore>,
        clock: Arc<dyn Clock>,
        audit: Arc<AuditLog>,
    ) -> Agents {
        Agents {
            tree,
            clients,
            source,
            stored: OnceLock::new(),
            store,
            clock,
            audit,
        }
    }

    /// The files' agents.
    pub fn tree(&self) -> &Arc<AgentTree> {
        &self.tree
    }

    /// The files' agents' model clients, by agent.
    pub fn clients(&self) -> &BTreeMap<String, ChatClient> {
        &self.clients
    }

    /// Keep agents sent over the API (`serve --stored-agents`).
    pub fn enable_stored(&self, stored: StoredAgents) {
        let _ = self.stored.set(stored);
    }

    /// Agent `name`, from the files or the store's agents as loaded here.
    pub fn agent(&self, name: &str) -> Result<Arc<LoadedAgent>, ServiceError> {
        self.find(name)
            .map(|(a, _)| a)
            .ok_or_else(|| ServiceError::not_found(format!("no agent named `{name}`")))
    }

    /// Agent `name` and where it comes from, as known here now.
    pub fn find(&self, name: &str) -> Option<(Arc<LoadedAgent>, AgentSource)> {
        if let Some(a) = self.tree.agent(name) {
            return Some((a.clone(), self.source));
        }
        let stored = self.stored.get()?;
        let map = stored.map();
        map.get(name).map(|l| (l.agent.clone(), AgentSource::Store))
    }

    /// The model client of agent `name`.
    pub fn client_for(&self, name: &str) -> Option<ChatClient> {
        if let Some(c) = self.clients.get(name) {
            return Some(c.clone());
        }
        let stored = self.stored.get()?;
        let map = stored.map();
        map.get(name).map(|l| l.client.clone())
    }

    /// Every agent (the files' then the store's), with its source.
    pub async fn all(&self) -> Vec<(Arc<LoadedAgent>, AgentSource)> {
        let mut out: Vec<_> = self
            .tree
            .agents
            .values()
            .map(|a| (a.clone(), self.source))
            .collect();
        if self.stored.get().is_some() {
            if let Err(e) = self.load_stored().await {
                tracing::warn!("stored agents: {}", e.message);
            }
            let stored = self
                .stored
                .get()
                .map(|s| s.map().clone())
                .unwrap_or_default();
            let mut names: Vec<_> = stored.keys().cloned().collect();
            names.sort();
            out.extend(names.into_iter().filter_map(|n| {
                stored
                    .get(&n)
                    .map(|l| (l.agent.clone(), AgentSource::Store))
            }));
        }
        out
    }

    /// Bring the stored agents loaded here in line with the store: each
    /// one put since it was loaded is loaded again, each one deleted is
    /// dropped. A definition that no longer loads (an API it reads is
    /// down) is left out, with a warning.
    pub async fn load_stored(&self) -> Result<(), ServiceError> {
        let Some(stored) = self.stored.get() else {
            return Ok(());
        };
        let all = self.store.agents().await?;
        let keep: std::collections::HashSet<&str> = all.iter().map(|a| a.slug.as_str()).collect();
        stored.map().retain(|k, _| keep.contains(k.as_str()));
        for a in &all {
            if let Err(e) = self.refresh_one(a).await {
                tracing::warn!(agent = %a.slug, "stored agent left out: {}", e.message);
            }
        }
        Ok(())
    }

    /// Stored agent `name` as the store has it now (a no-op for a file
    /// agent's name, or when agents are not stored).
    pub async fn refresh_stored(&self, name: &str) -> Result<(), ServiceError> {
        let Some(stored) = self.stored.get() else {
            return Ok(());
        };
        if self.tree.agent(name).is_some() {
            return Ok(());
        }
        match self.store.get_agent(name).await? {
            Some(a) => self.refresh_one(&a).await,
            None => {
                stored.map().remove(name);
                Ok(())
            }
        }
    }

    async fn refresh_one(&self, a: &StoredAgent) -> Result<(), ServiceError> {
        let Some(stored) = self.stored.get() else {
            return Ok(());
        };
        if stored
            .map()
            .get(&a.slug)
            .is_some_and(|l| l.updated_at == a.updated_at)
        {
            return Ok(());
        }
        let (agent, client, _) = self.build_stored(&a.slug, &a.document).await?;
        stored.map().insert(
            a.slug.clone(),
            Loaded {
                updated_at: a.updated_at,
                agent,
                client,
            },
        );
        Ok(())
    }

    /// Load `document` as stored agent `slug`, checked as a file and
    /// against [`bindery_spec::checks::stored_agent_refusals`]; a 422 with
    /// every diagnostic when it does not load. Also its warnings.
    async fn build_stored(
        &self,
        slug: &str,
        document: &str,
    ) -> Result<(Arc<LoadedAgent>, ChatClient, Vec<String>), ServiceError> {
        let stored = self.stored.get().ok_or_else(disabled)?;
        // No process values, no API keys: the server's own values never
        // reach an agent an API client defined.
        let opts = LoadOptions {
            limits: stored.limits,
            ..LoadOptions::default()
        };
        let label = format!("PUT /v1/agents/{slug}");
        let (agent, diags) = bindery_tree::load_document(
            &label,
            slug,
            document,
            &opts,
            bindery_spec::checks::stored_agent_refusals,
        )
        .await
        .map_err(|e| {
            let lines: Vec<String> = e.diagnostics.iter().map(|d| d.to_string()).collect();
            ServiceError::new(
                ErrorKind::Invalid,
                Code::InvalidAgent,
                format!("the agent did not load:\n{}", lines.join("\n")),
            )
        })?;
        let tree = AgentTree {
            agents: BTreeMap::from([(slug.to_string(), agent.clone())]),
            roots: vec![slug.to_string()],
            warnings: Vec::new(),
        };
        let (mut clients, warnings) = build_clients(&tree, &stored.client).map_err(|e| {
            ServiceError::new(ErrorKind::Invalid, Code::InvalidAgent, e.to_string())
        })?;
        let client = clients.remove(slug).ok_or_else(|| {
            ServiceError::new(ErrorKind::Internal, Code::Internal, "no model client")
        })?;
        let mut notes: Vec<String> = diags.iter().map(|d| d.to_string()).collect();
        notes.extend(warnings);
        Ok((agent, client, notes))
    }

    /// `PUT /v1/agents/:slug`: keep `body` (Bindery's form or agents-exe's,
    /// JSON or YAML) as agent `slug`. Whether it is new, the agent, and
    /// its load warnings.
    pub async fn put(
        &self,
        by: &Caller,
        slug: &str,
        body: &str,
    ) -> Result<(bool, Arc<LoadedAgent>, Vec<String>), ServiceError> {
        let stored = self.stored.get().ok_or_else(disabled)?;
        if self.tree.agent(slug).is_some() {
            return Err(ServiceError::new(
                ErrorKind::Conflict,
                Code::AgentExists,
                format!("agent `{slug}` is defined by the server's files; a stored agent takes another slug"),
            ));
        }
        if !body.trim_start().starts_with('{') && has_yaml_alias(body) {
            return Err(ServiceError::bad_request(
                "the definition has a YAML anchor or alias (`&name`, `*name`), which a definition sent over the API may not: each alias copies what it names, so a small text can grow without bound; write the value out (a glob like `*` is quoted: `tool: \"*\"`)",
            ));
        }
        if nests_deeper_than(body, MAX_DEPTH) {
            return Err(ServiceError::bad_request(format!(
                "the definition nests deeper than {MAX_DEPTH} levels; an agent's definition needs a dozen"
            )));
        }
        // Parsed on a blocking thread: a large document holds up no
        // session's work on the async workers.
        let text = body.to_string();
        let document = tokio::task::spawn_blocking(move || as_json(&text))
            .await
            .map_err(|e| ServiceError::new(ErrorKind::Internal, Code::Internal, e.to_string()))??;
        // Checked as sent, so that messages point into the text as given.
        let (agent, client, notes) = self.build_stored(slug, body).await?;
        // On record before it is kept: a change nobody can trace is not made.
        let created = self.store.get_agent(slug).await?.is_none();
        let stored_as = Action::AgentStored {
            slug: slug.to_string(),
            created,
        };
        self.audit.record(actor(by), None, stored_as).await?;
        let at = self.clock.now_ms();
        let created = self.store.put_agent(slug, &document, at).await?;
        stored.map().insert(
            slug.to_string(),
            Loaded {
                updated_at: at,
                agent: agent.clone(),
                client,
            },
        );
        Ok((created, agent, notes))
    }

    /// `DELETE /v1/agents/:slug`. Sessions of the agent stay readable;
    /// they can no longer run.
    pub async fn delete(&self, by: &Caller, slug: &str) -> Result<(), ServiceError> {
        let stored = self.stored.get().ok_or_else(disabled)?;
        if self.tree.agent(slug).is_some() {
            return Err(ServiceError::new(
                ErrorKind::Conflict,
                Code::AgentExists,
                format!("agent `{slug}` is defined by the server's files, not stored; remove it from them"),
            ));
        }
        if self.store.get_agent(slug).await?.is_some() {
            let deleted = Action::AgentDeleted {
                slug: slug.to_string(),
            };
            self.audit.record(actor(by), None, deleted).await?;
        }
        let gone = self.store.delete_agent(slug).await?;
        stored.map().remove(slug);
        if !gone {
            return Err(ServiceError::not_found(format!(
                "no stored agent named `{slug}`"
            )));
        }
        Ok(())
    }

    /// Agent `slug` for `GET /v1/agents/:slug`, a stored one read again.
    pub async fn get(&self, slug: &str) -> Result<(Arc<LoadedAgent>, AgentSource), ServiceError> {
        if let Err(e) = self.refresh_stored(slug).await {
            tracing::warn!(agent = %slug, "stored agent left out: {}", e.message);
        }
        self.find(slug)
            .ok_or_else(|| ServiceError::not_found(format!("no agent named `{slug}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::nests_deeper_than;

    #[test]
    fn anchors_and_aliases_are_found() {
        use super::has_yaml_alias;
        let laughs = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n";
        assert!(has_yaml_alias(laughs));
        assert!(has_yaml_alias("a: &a\n  - x\nb:\n  - *a\n"));
        for fine in [
            "systemPrompt: Tom & Jerry, R&D, 2*3 and a * b\n",
            "bindings:\n  - {tool: \"bash_query-*\", arg: token}\n  - tool: bash_*\n",
            "confirm: [{tool: \"*\"}]\n",
            "prompt: |\n  use bold *text* here\n  *all* of it, &more\nnext: x\n",
        ] {
            assert!(!has_yaml_alias(fine), "{fine}");
        }
    }

    #[test]
    fn deep_nesting_is_found_in_one_pass() {
        let agent = "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nspec:\n  model: {url: \"http://m\", name: m}\n  toolboxes:\n    - bash:\n        tools:\n          - {tool: a, readOnly: true}\n  systemPrompt: |\n    Say [[[[ what you like ]] # not a comment\n";
        assert!(!nests_deeper_than(agent, 16));
        let json = r#"{"a": {"b": [1, {"c": "[[[[[[[[["}]}, "d": '{{{{{{{'}"#;
        assert!(!nests_deeper_than(json, 1));
        // Quotes YAML does not take for quotes hide nothing.
        for tricked in [
            format!("c: [a'b, {}{}]", "[".repeat(5000), "]".repeat(5000)),
            format!("c: ['a\\', {}", "[".repeat(5000)),
            format!("a: x[\n{}", "[".repeat(5000)),
        ] {
            assert!(nests_deeper_than(&tricked, 128), "{}", &tricked[..12]);
        }
        for deep in [
            "[".repeat(5000),
            "{a: ".repeat(5000),
            "- ".repeat(200) + "x",
            (0..200)
                .map(|i| format!("{}a:\n", "  ".repeat(i)))
                .collect::<String>(),
        ] {
            assert!(nests_deeper_than(&deep, 128), "{}", &deep[..20]);
        }
        assert!(nests_deeper_than(&"[".repeat(100_000), 128));
    }
}
