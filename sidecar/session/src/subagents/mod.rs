//! Helpers: sub-agents an agent prompts as `prompt_agent_<slug>`, with
//! `describe_agent` to see what is still open below it and `derive_agent`
//! to name a narrowing for the rest of the session.
//!
//! Each call runs the helper's own loop (its own model, tools and
//! parameters) and returns its answer as the tool result. Values reach a
//! helper only explicitly: the reference's `with`, and a call's `with` and
//! bindings, resolved in the caller's scope (a secret stays a secret).

pub mod narrowing;

/// How deep helpers may nest below the agent a session talks to.
pub const MAX_HELPER_DEPTH: usize = 5;

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use self::narrowing::{
    carry, check_binding, fits, narrow, resolve_bindings, resolve_value, Address, CallBinding,
    CallValue, ScopedBinding,
};
use bindery_bindings::BoundValue;
use bindery_llm::{ChatClient, ChatMessage, ToolDefinition, Turn};
use bindery_params::{ParamValue, Values};
use bindery_spec::Scope;
use bindery_tools::ToolError;
use bindery_tree::{AgentTree, Helper, LoadedAgent};

pub const DESCRIBE: &str = "describe_agent";
pub const DERIVE: &str = "derive_agent";
pub const PROMPT_PREFIX: &str = "prompt_agent_";

/// The prefix of `agent`'s helper tools, by its `naming`.
pub fn prompt_prefix(agent: &LoadedAgent) -> &'static str {
    agent.spec.naming.helper_prefix()
}

/// The helper slug a tool name of `agent`'s asks for, if it is one.
pub fn helper_slug<'a>(agent: &LoadedAgent, name: &'a str) -> Option<&'a str> {
    name.strip_prefix(prompt_prefix(agent))
}

/// What helper calls need beyond the run itself.
#[derive(Clone)]
pub struct HelperEnv<'a> {
    pub tree: &'a AgentTree,
    pub clients: &'a BTreeMap<String, ChatClient>,
    /// Agents on the call stack, the current one last.
    pub stack: Vec<String>,
    /// Narrowings from above, relative to the current agent.
    pub inherited: Vec<ScopedBinding>,
    pub max_depth: usize,
}

/// The helper tools an agent gets (none without helpers).
pub fn definitions(agent: &LoadedAgent, tree: &AgentTree) -> Vec<ToolDefinition> {
    if agent.helpers.is_empty() {
        return Vec::new();
    }
    let mut defs: Vec<ToolDefinition> = agent
        .helpers
        .iter()
        .map(|h| {
            let announce = tree
                .agent(&h.agent)
                .and_then(|a| a.spec.announce.clone())
                .unwrap_or_else(|| format!("the {} agent", h.agent));
            let mut props = json!({
                "what": {"type": "string", "description": "What the helper should do, in full: it sees nothing else of this conversation."},
            });
            if h.narrowable {
                props["bindings"] = json!({
                    "type": "array",
                    "description": "Fix arguments of the helper's tools for this call (see describe_agent for what is open). `agent` addresses a helper below it (`a/b`) or all (`**`); absent: the helper itself.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "agent": {"type": "string"},
                            "tool": {"type": "string", "description": "tool name or glob (`*`); absent: every tool"},
                            "arg": {"type": "string"},
                            "value": {"type": "object", "description": "{\"tag\": \"Literal\", \"contents\": VALUE} or {\"tag\": \"Param\", \"contents\": YOUR_PARAMETER}"}
                        },
                        "required": ["arg", "value"]
                    }
                });
                props["with"] = json!({
                    "type": "object",
                    "description": "The helper's parameters to fill, NAME → {\"tag\": \"Literal\"|\"Param\", \"contents\": …}.",
                });
                props["as"] = json!({"type": "string", "description": "Use a narrowing named earlier with derive_agent."});
            }
            ToolDefinition {
                name: format!("{}{}", prompt_prefix(agent), h.slug),
                description: format!("Ask the helper `{}`: {announce}. Returns its answer.", h.slug),
                parameters: json!({"type": "object", "properties": props, "required": ["what"]}),
            }
        })
        .collect();
    let slugs: Vec<&str> = agent.helpers.iter().map(|h| h.slug.as_str()).collect();
    defs.push(ToolDefinition {
        name: DESCRIBE.into(),
        description: "Show what a helper can do from here: its parameters, its tools' still-open arguments, and the same for its helpers.".into(),
        parameters: json!({"type": "object", "properties": {"slug": {"type": "string", "enum": slugs}}, "required": ["slug"]}),
    });
    defs.push(ToolDefinition {
        name: DERIVE.into(),
        description: "Name a narrowing of a helper (bindings and with) for the rest of this session; then call prompt_agent_<from> with \"as\": SLUG.".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "from": {"type": "string", "enum": slugs},
                "slug": {"type": "string"},
                "bindings": {"type": "array", "items": {"type": "object"}},
                "with": {"type": "object"}
            },
            "required": ["from", "slug"]
        }),
    });
    defs
}

/// Whether the answer of `agent`'s helper `slug` may carry text from
/// outside: the helper, or any helper below it, has an `untrusted` tool.
/// Its answer is then untrusted for the caller's taint guard, whatever this
/// one call of it read: the caller's history keeps the answer, not what
/// the helper's run took in, so the answer counts by what its run could.
pub fn reaches_untrusted(tree: &AgentTree, agent: &LoadedAgent, slug: &str) -> bool {
    let Some(first) = agent.helpers.iter().find(|h| h.slug == slug) else {
        return false;
    };
    let mut todo = vec![first.agent.as_str()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = todo.pop() {
        if !seen.insert(name) {
            continue;
        }
        let Some(a) = tree.agent(name) else { continue };
        let tools = a.tools.snapshot();
        if tools.iter().any(|t| {
            t.untrusted() || !bindery_bindings::depends::untrusted_lookups(&tools, t).is_empty()
        }) {
            return true;
        }
        todo.extend(a.helpers.iter().map(|h| h.agent.as_str()));
    }
    false
}

/// Whether `name` is one of `agent`'s helper tools.
pub fn is_helper_tool(agent: &LoadedAgent, name: &str) -> bool {
    !agent.helpers.is_empty()
        && (name == DESCRIBE
            || name == DERIVE
            || helper_slug(agent, name).is_some_and(|s| agent.helpers.iter().any(|h| h.slug == s)))
}

fn invalid(msg: impl std::fmt::Display) -> ToolError {
    ToolError::InvalidArguments(msg.to_string())
}

fn helper<'a>(agent: &'a LoadedAgent, slug: &str) -> Result<&'a Helper, ToolError> {
    agent
        .helpers
        .iter()
        .find(|h| h.slug == slug)
        .ok_or_else(|| {
            let slugs: Vec<&str> = agent.helpers.iter().map(|h| h.slug.as_str()).collect();
            invalid(format!(
                "no helper `{slug}` (helpers: {})",
                slugs.join(", ")
            ))
        })
}

/// The arguments of `prompt_agent_<slug>` and `derive_agent`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Narrowing {
    #[serde(default)]
    pub bindings: Vec<CallBinding>,
    #[serde(default)]
    pub with: BTreeMap<String, CallValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptArgs {
    what: String,
    #[serde(default)]
    bindings: Vec<CallBinding>,
    #[serde(default)]
    with: BTreeMap<String, CallValue>,
    #[serde(default, rename = "as")]
    as_: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeriveArgs {
    from: String,
    slug: String,
    #[serde(default)]
    bindings: Vec<CallBinding>,
    #[serde(default)]
    with: BTreeMap<String, CallValue>,
}

fn parse<T: serde::de::DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| invalid(e.to_string()))
}

/// The named narrowings of this conversation: a fold over its successful
/// `derive_agent` calls (nothing is stored anywhere else).
pub fn derived(history: &[Turn]) -> BTreeMap<(String, String), Narrowing> {
    let mut calls = BTreeMap::new();
    let mut table = BTreeMap::new();
    for m in history {
        match m.message() {
            ChatMessage::Assistant { tool_calls, .. } => {
                for c in tool_calls.iter().filter(|c| c.name == DERIVE) {
                    calls.insert(c.id.clone(), c.arguments.clone());
                }
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => {
                let stored = serde_json::from_str::<Value>(&content.text())
                    .is_ok_and(|v| v["stored"] == json!(true));
                if let (true, Some(args)) = (stored, calls.get(tool_call_id)) {
                    if let Ok(d) = serde_json::from_str::<DeriveArgs>(args) {
                        table.insert(
                            (d.from, d.slug),
                            Narrowing {
                                bindings: d.bindings,
                                with: d.with,
                            },
                        );
                    }
                }
            }
            _ => {}
        }
    }
    table
}

/// Check that every path of `bindings` names a narrowable helper below `from`.
fn check_paths(
    tree: &AgentTree,
    from: &LoadedAgent,
    bindings: &[CallBinding],
) -> Result<(), ToolError> {
    for b in bindings {
        let address = Address::parse(b.agent.as_deref()).map_err(invalid)?;
        let Address::Path(path) = address else {
            continue;
        };
        let mut at = from;
        for (i, slug) in path.iter().enumerate() {
            let h = at.helpers.iter().find(|h| &h.slug == slug).ok_or_else(|| {
                let slugs: Vec<&str> = at.helpers.iter().map(|h| h.slug.as_str()).collect();
                invalid(format!(
                    "`agent: {}`: `{}` has no helper `{slug}` (its helpers: {})",
                    path.join("/"),
                    at.name,
                    if slugs.is_empty() {
                        "none".to_string()
                    } else {
                        slugs.join(", ")
                    }
                ))
            })?;
            if !h.narrowable {
                return Err(invalid(format!(
                    "`agent: {}`: helper `{slug}` is not narrowable",
                    path[..=i].join("/")
                )));
            }
            at = tree
                .agent(&h.agent)
                .ok_or_else(|| invalid(format!("helper `{slug}` is not loaded")))?;
        }
    }
    Ok(())
}

/// The call's own bindings aimed below the helper (`a/b`, `**`), checked
/// against the agents they reach before anything runs: a binding that
/// would fill nothing, or fill an argument with a value that does not fit,
/// is the calling model's to fix. (Those aimed at the helper itself are
/// checked by `narrow`.)
fn check_below(
    tree: &AgentTree,
    target: &LoadedAgent,
    own: &[ScopedBinding],
) -> Result<(), BelowError> {
    for b in own {
        match &b.address {
            Address::Here => {}
            Address::Path(path) => {
                let mut at = target;
                // `check_paths` has checked each step.
                for slug in path {
                    let next = at
                        .helpers
                        .iter()
                        .find(|h| &h.slug == slug)
                        .and_then(|h| tree.agent(&h.agent));
                    match next {
                        Some(a) => at = a,
                        None => {
                            return Err(BelowError::NotLoaded {
                                path: path.join("/"),
                            })
                        }
                    }
                }
                check_binding(&at.tools.snapshot(), b).map_err(|error| BelowError::At {
                    path: path.join("/"),
                    error,
                })?;
            }
            Address::Everywhere => {
                let glob = b.tool.as_deref().unwrap_or("*");
                let mut filled = 0;
                for agent in narrowable_below(tree, target) {
                    for t in agent.tools.snapshot().iter() {
                        let Some(arg) = t
                            .spec()
                            .arg(&b.arg)
                            .filter(|_| bindery_bindings::glob_matches(glob, t.name()))
                        else {
                            continue;
                        };
                        fits(arg, &b.value).map_err(|why| BelowError::Misfit {
                            arg: b.arg.clone(),
                            tool: t.name().to_string(),
                            agent: agent.name.clone(),
                            why,
                        })?;
                        filled += 1;
                    }
                }
                if filled == 0 {
                    return Err(BelowError::NothingFilled {
                        glob: glob.to_string(),
                        target: target.name.clone(),
                        arg: b.arg.clone(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Why a call's binding aimed below the helper is the calling model's to fix.
#[derive(Debug, thiserror::Error)]
enum BelowError {
    #[error("`agent: {path}` is not loaded")]
    NotLoaded { path: String },
    #[error("`agent: {path}`: {error}")]
    At {
        path: String,
        error: narrowing::NarrowingError,
    },
    #[error("`agent: **`: `{arg}` of `{tool}` (agent `{agent}`) {why}")]
    Misfit {
        arg: String,
        tool: String,
        agent: String,
        why: narrowing::Misfit,
    },
    #[error("`agent: **`: no tool matching `{glob}` of `{target}` or of its narrowable helpers has an argument `{arg}`")]
    NothingFilled {
        glob: String,
        target: String,
        arg: String,
    },
}

/// `target` and every helper below it that narrowings reach, each once.
fn narrowable_below<'a>(tree: &'a AgentTree, target: &'a LoadedAgent) -> Vec<&'a LoadedAgent> {
    let mut out = vec![target];
    let mut next = 0;
    while next < out.len() {
        let at = out[next];
        next += 1;
        for h in at.helpers.iter().filter(|h| h.narrowable) {
            if let Some(a) = tree.agent(&h.agent) {
                if !out.iter().any(|o| o.name == a.name) {
                    out.push(a);
                }
            }
        }
    }
    out
}

/// A helper's tool that would put a secret on a command line: a value its
/// caller passed with `with` (secrecy travels with the value) into a
/// parameter the helper binds to a positional or `--` argument.
fn check_secret_argv(
    tools: &[bindery_bindings::BoundTool],
    values: &Values,
) -> Result<(), ToolError> {
    for t in tools {
        for b in t.bindings() {
            let (BoundValue::Param(p), Some(arg)) = (&b.value, t.spec().arg(&b.arg)) else {
                continue;
            };
            if let Some(v) = values.get(p).filter(|v| v.is_secret()) {
                if let Err(why) = fits(arg, v) {
                    return Err(invalid(format!(
                        "`with.{p}`: a secret value, and `{}` of `{}` {why}",
                        b.arg,
                        t.name()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// `describe_agent {slug}`.
pub fn describe(
    agent: &LoadedAgent,
    env: &HelperEnv<'_>,
    args: Value,
) -> Result<String, ToolError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Args {
        slug: String,
    }
    let a: Args = parse(args)?;
    let h = helper(agent, &a.slug)?;
    let mut stack = env.stack.clone();
    let view = helper_view(
        env,
        h,
        &carry(&env.inherited, &h.slug, h.narrowable),
        &mut stack,
    );
    Ok(serde_json::to_string_pretty(&view).unwrap_or_default())
}

fn helper_view(
    env: &HelperEnv<'_>,
    h: &Helper,
    inherited: &[ScopedBinding],
    stack: &mut Vec<String>,
) -> Value {
    let Some(agent) = env.tree.agent(&h.agent) else {
        return json!({"slug": h.slug, "error": "not loaded"});
    };
    let announce = agent.spec.announce.clone().unwrap_or_default();
    if !h.narrowable {
        return json!({"slug": h.slug, "announce": announce, "narrowable": false});
    }
    if stack.contains(&agent.name) {
        return json!({"slug": h.slug, "announce": announce, "cut": "already on the call stack"});
    }
    if stack.len() >= env.max_depth {
        return json!({"slug": h.slug, "announce": announce, "cut": "maximum depth"});
    }
    let process = agent.process_values();
    let parameters: Vec<Value> = agent
        .params
        .decls()
        .iter()
        .map(|d| json!({"name": d.name, "description": d.description, "bound": process.contains_key(&d.name) || h.with.contains_key(&d.name)}))
        .collect();
    // What is open from here: neither bound by the helper's file nor by a
    // narrowing from above.
    let own_tools = agent.tools.snapshot();
    let narrowed = narrow(&own_tools, inherited, &[])
        .map(|n| n.tools)
        .unwrap_or_else(|_| own_tools.to_vec());
    let tools: Vec<Value> = narrowed
        .iter()
        .map(|t| {
            let hidden = t.hidden_args(&process);
            let open: Vec<Value> = t
                .spec()
                .args
                .iter()
                .filter(|a| !hidden.contains(a.name.as_str()))
                .map(|a| json!({"arg": a.name, "type": a.schema["type"], "description": a.description, "required": a.required}))
                .collect();
            json!({"name": t.name(), "description": t.spec().description, "open": open})
        })
        .collect();
    stack.push(agent.name.clone());
    let helpers: Vec<Value> = agent
        .helpers
        .iter()
        .map(|h2| helper_view(env, h2, &carry(inherited, &h2.slug, h2.narrowable), stack))
        .collect();
    stack.pop();
    json!({"slug": h.slug, "announce": announce, "parameters": parameters, "tools": tools, "helpers": helpers})
}

/// `derive_agent {from, slug, bindings, with}`: checked, then echoed; the
/// call in the history is the record.
pub fn derive(agent: &LoadedAgent, env: &HelperEnv<'_>, args: Value) -> Result<String, ToolError> {
    let a: DeriveArgs = parse(args)?;
    let h = helper(agent, &a.from)?;
    if !h.narrowable {
        return Err(invalid(format!("helper `{}` is not narrowable", a.from)));
    }
    if a.slug.trim().is_empty() {
        return Err(invalid("`slug` names the narrowing; give one"));
    }
    let target = env
        .tree
        .agent(&h.agent)
        .ok_or_else(|| invalid("helper not loaded"))?;
    check_paths(env.tree, target, &a.bindings)?;
    for b in &a.bindings {
        if let bindery_spec::BindingValue::Identity(i) = b.value.binding_value() {
            return Err(invalid(format!(
                "binding of `{}`: {} is the author's to bind, not a narrowing's",
                b.arg,
                i.describe()
            )));
        }
        if let bindery_spec::BindingValue::Param(p) = b.value.binding_value() {
            if agent.params.decl(&p).is_none() {
                return Err(invalid(format!(
                    "binding of `{}`: you declare no parameter `{p}`",
                    b.arg
                )));
            }
        }
    }
    check_with_keys(target, h, &a.with)?;
    Ok(json!({"stored": true, "from": a.from, "slug": a.slug}).to_string())
}

fn check_with_keys(
    target: &LoadedAgent,
    h: &Helper,
    with: &BTreeMap<String, CallValue>,
) -> Result<(), ToolError> {
    for key in with.keys() {
        if target.params.decl(key).is_none() {
            let names: Vec<&str> = target
                .params
                .decls()
                .iter()
                .map(|d| d.name.as_str())
                .collect();
            return Err(invalid(format!(
                "`with.{key}`: helper `{}` has no such parameter (parameters: {})",
                h.slug,
                names.join(", ")
            )));
        }
        if target
            .params
            .decl(key)
            .is_some_and(|d| d.scope == Scope::Process)
        {
            return Err(invalid(format!(
                "`with.{key}`: a process-scope parameter of helper `{}`; only the operator sets it",
                h.slug
            )));
        }
        if h.with.contains_key(key) {
            return Err(invalid(format!(
                "`with.{key}`: already filled by this agent's definition; it cannot be refilled"
            )));
        }
    }
    Ok(())
}

/// What a `prompt_agent_<slug>` call runs: the helper, its per-call tools,
/// its values, and what travels further down.
pub struct Prepared<'a> {
    pub agent: &'a LoadedAgent,
    pub client: &'a ChatClient,
    pub what: String,
    pub tools: Vec<bindery_bindings::BoundTool>,
    pub values: Values,
    pub env: HelperEnv<'a>,
}

/// Everything that can fail before the helper runs fails here, with a
/// message the calling model can act on (or, for configuration problems,
/// the generic "tool unavailable" with the reason in the operator's log).
pub fn prepare<'a>(
    caller: &LoadedAgent,
    caller_values: &Values,
    env: &HelperEnv<'a>,
    slug: &str,
    args: Value,
    history: &[Turn],
) -> Result<Prepared<'a>, ToolError> {
    let a: PromptArgs = parse(args)?;
    let h = helper(caller, slug)?;
    if !h.narrowable && (!a.bindings.is_empty() || !a.with.is_empty() || a.as_.is_some()) {
        return Err(invalid(format!(
            "helper `{slug}` is not narrowable: call it with `what` only"
        )));
    }
    let target = env.tree.agent(&h.agent).ok_or_else(|| {
        tracing::warn!(helper = %h.agent, "helper agent is not loaded");
        ToolError::Unavailable
    })?;
    if env.stack.contains(&target.name) {
        return Err(invalid(format!(
            "helper `{slug}` (agent `{}`) is already on the call stack ({}); it cannot call itself",
            target.name,
            env.stack.join(" → ")
        )));
    }
    if env.stack.len() >= env.max_depth {
        return Err(invalid(format!(
            "helpers may nest {} deep; `{slug}` would be one more",
            env.max_depth
        )));
    }
    let mut narrowing = Narrowing::default();
    if let Some(name) = &a.as_ {
        let table = derived(history);
        narrowing = table
            .into_iter()
            .find(|((from, s), _)| from == slug && s == name)
            .map(|(_, n)| n)
            .ok_or_else(|| {
                invalid(format!(
                    "no narrowing `{name}` of `{slug}`: call derive_agent first"
                ))
            })?;
    }
    // Derived bindings apply before the call's own.
    let mut call_bindings = narrowing.bindings;
    call_bindings.extend(a.bindings);
    check_paths(env.tree, target, &call_bindings)?;
    let own = resolve_bindings(&call_bindings, caller_values).map_err(invalid)?;
    check_below(env.tree, target, &own).map_err(|e| invalid(format!("helper `{slug}`: {e}")))?;
    let inherited = carry(&env.inherited, slug, h.narrowable);
    let narrowed = narrow(&target.tools.snapshot(), &inherited, &own)
        .map_err(|e| invalid(format!("helper `{slug}`: {e}")))?;

    check_with_keys(target, h, &a.with)?;
    let mut values = target.process_values();
    let mut fill = |key: &str, v: ParamValue| {
        if target.params.is_pinned(key) {
            tracing::info!(helper = %target.name, param = key, "a pinned parameter keeps its value");
            return Ok(());
        }
        let secret = target.params.decl(key).is_some_and(|d| d.secret);
        let v = match (secret, v) {
            // Secrecy travels with the value, and a secret parameter stays secret.
            (true, ParamValue::Plain(p)) => ParamValue::for_parameter(true, p)
                .map_err(|e| invalid(format!("`with.{key}`: {e}")))?,
            (_, v) => v,
        };
        values.insert(key.to_string(), v);
        Ok::<(), ToolError>(())
    };
    for (key, v) in &h.with {
        match resolve_value(v, caller_values, &format!("with.{key}")) {
            Ok(v) => fill(key, v)?,
            Err(e) => {
                tracing::warn!(helper = %target.name, "{e}");
                return Err(ToolError::Unavailable);
            }
        }
    }
    for (key, v) in narrowing
        .with
        .iter()
        .filter(|(k, _)| !a.with.contains_key(*k))
        .chain(a.with.iter())
    {
        let v = resolve_value(&v.binding_value(), caller_values, &format!("with.{key}"))
            .map_err(invalid)?;
        fill(key, v)?;
    }
    check_secret_argv(&narrowed.tools, &values)?;
    let missing = target.params.missing_required(&values);
    if !missing.is_empty() {
        tracing::warn!(helper = %target.name, missing = ?missing, "helper called without required parameters");
        return Err(ToolError::Unavailable);
    }
    let client = env.clients.get(&target.name).ok_or_else(|| {
        tracing::warn!(helper = %target.name, "no model client for the helper");
        ToolError::Unavailable
    })?;
    let mut all = inherited;
    all.extend(own);
    let mut stack = env.stack.clone();
    stack.push(target.name.clone());
    Ok(Prepared {
        agent: target,
        client,
        what: a.what,
        tools: narrowed.tools,
        values,
        env: HelperEnv {
            tree: env.tree,
            clients: env.clients,
            stack,
            inherited: all,
            max_depth: env.max_depth,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_llm::ToolCall;

    fn call(id: &str, name: &str, args: Value) -> ChatMessage {
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: name.into(),
                arguments: args.to_string(),
            }],
            reasoning: None,
        }
    }

    #[test]
    fn a_secret_with_never_reaches_a_command_line() {
        use super::narrowing::tests::{arg, tool};
        use bindery_bindings::AppliedBinding;
        use bindery_params::SecretString;
        use bindery_spec::WhenUnbound;
        use bindery_tools::bash::Mode;
        use bindery_tools::Transport;
        // The helper's file binds its plain parameter `note` to a
        // positional argument and `key` to an env one.
        let tool = tool(
            "bash_probe",
            vec![
                arg("note", "string", Transport::Bash(Mode::Positional)),
                arg("key", "string", Transport::Bash(Mode::Env)),
            ],
        )
        .with_bindings([
            AppliedBinding {
                arg: "note".into(),
                value: BoundValue::Param("note".into()),
                when_unbound: WhenUnbound::Fail,
            },
            AppliedBinding {
                arg: "key".into(),
                value: BoundValue::Param("key".into()),
                when_unbound: WhenUnbound::Fail,
            },
        ]);
        let secret = || ParamValue::Secret(SecretString::new("canary-7f3a9c"));
        let plain = Values::from([("note".to_string(), ParamValue::Plain(json!("hi")))]);
        assert!(check_secret_argv(std::slice::from_ref(&tool), &plain).is_ok());
        let key = Values::from([("key".to_string(), secret())]);
        assert!(check_secret_argv(std::slice::from_ref(&tool), &key).is_ok());
        // A caller's `with` made `note` secret: refused, naming it, never the value.
        let note = Values::from([("note".to_string(), secret())]);
        let err = check_secret_argv(std::slice::from_ref(&tool), &note)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`with.note`: a secret value, and `note` of `bash_probe` is passed on the command line (positional)"),
            "{err}"
        );
        assert!(!err.contains("canary"));
    }

    #[test]
    fn the_derive_table_is_a_fold_over_successful_calls() {
        let args = |slug: &str, repo: &str| json!({"from": "mid", "slug": slug, "bindings": [{"arg": "repo", "value": {"tag": "Literal", "contents": repo}}]});
        let history = vec![
            call("1", DERIVE, args("a", "one")),
            ChatMessage::tool_result(
                "1",
                json!({"stored": true, "from": "mid", "slug": "a"}).to_string(),
            ),
            call("2", DERIVE, args("b", "two")),
            ChatMessage::tool_result("2", "error: invalid arguments: nope"),
            call("3", DERIVE, args("a", "three")),
            ChatMessage::tool_result("3", json!({"stored": true}).to_string()),
        ];
        let history: Vec<Turn> = history.into_iter().map(Turn::new).collect();
        let table = derived(&history);
        assert_eq!(table.len(), 1, "the failed call is not in the table");
        let a = &table[&("mid".to_string(), "a".to_string())];
        assert_eq!(
            a.bindings[0].value.binding_value(),
            bindery_spec::BindingValue::Literal(json!("three")),
            "the later call wins"
        );
    }
}
