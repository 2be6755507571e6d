//! API-owned inputs: before a tool with `depends_on` runs, its read-only
//! lookups run (deepest first, each parent's in declaration order), their
//! results fill the arguments the model never saw, and a person chooses
//! among the options a lookup returned, or approves the prepared call of a
//! tool that writes. Each of those stops is a pending item whose
//! [`LookupState`] says how to go on. Lookups are cached per tool,
//! arguments and session context for their `ttl_ms`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use bindery_bindings::depends::lookup_tool;
use bindery_bindings::BoundTool;
use bindery_params::Values;
use bindery_store::pending::canonical;

use bindery_spec::jsonpath::{get, Path};
use bindery_spec::Dependency;
use bindery_tools::{CallContext, Disposition, ToolError};

use bindery_store::lookup::{Ask, Choice, LookupState};

/// Cached lookup results, with when each goes stale.
#[derive(Default)]
pub struct LookupCache {
    entries: Mutex<HashMap<[u8; 32], (i64, i64, Value)>>,
}

impl LookupCache {
    /// A fresh result: the response, when it was fetched.
    fn get(&self, key: &[u8; 32], now: i64) -> Option<(i64, Value)> {
        let mut map = self.entries.lock().ok()?;
        map.retain(|_, (_, until, _)| *until > now);
        map.get(key).map(|(at, _, v)| (*at, v.clone()))
    }

    fn put(&self, key: [u8; 32], at: i64, until: i64, v: Value) {
        if let Ok(mut map) = self.entries.lock() {
            map.insert(key, (at, until, v));
        }
    }
}

/// The session context lookups and choices are valid in: the session and
/// its non-secret values.
pub fn context_digest(session: &str, values: &Values) -> String {
    let plain: Vec<(&String, &Value)> = values
        .iter()
        .filter_map(|(k, v)| v.plain().map(|p| (k, p)))
        .collect();
    let text = json!([session, plain]).to_string();
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// What orchestration needs from the run.
pub struct Env<'a> {
    pub tools: &'a [BoundTool],
    pub values: &'a Values,
    pub call: &'a CallContext,
    pub cache: &'a LookupCache,
    /// What a lookup's answer is scrubbed with before anything is read
    /// from it: no option, label or fact carries a secret the run holds.
    pub scrubber: &'a bindery_params::scrub::Scrubber,
    /// At most this many lookups per orchestration (the agent's maxSteps).
    pub max_steps: u32,
    pub now: i64,
    /// The tool needs a person's approval even if it writes nothing (a
    /// `confirm` selector names it).
    pub confirm: bool,
    /// The run's session, whose budgets count each lookup that runs as a
    /// tool call of its own (none: nothing is counted).
    pub host: Option<&'a dyn crate::run::Host>,
}

/// Where an orchestration got to.
#[derive(Debug)]
pub enum Step {
    /// Every argument is there (and a write was approved): run with these.
    /// Second, the real ids of the `id_sensitive` options chosen on the
    /// way: the caller keeps them out of the logs while the call runs.
    Ready(Value, Vec<String>),
    /// A pending item.
    Wait(Disposition, LookupState),
    /// A lookup found nothing to choose from (not an error).
    NoOptions { lookup: String },
    /// A lookup would pass a `confirm` budget: the call waits for a person.
    OverBudget(crate::budget::Exceeded),
    /// It cannot go on (a malformed response, a step bound).
    Failed(String),
}

/// Work through `tool`'s dependencies from `state`. `fresh`: ignore cached
/// results (after the API refused the call).
pub async fn resolve(env: &Env<'_>, tool: &BoundTool, mut state: LookupState, fresh: bool) -> Step {
    let context = context_digest(&env.call.session_id, env.values);
    if state.context != context {
        // Choices made in another context say nothing about this one.
        state.choices.clear();
        state.approved = None;
        state.context = context.clone();
    }
    let missing = missing_inputs(tool, env.values, &state.args);
    if !missing.is_empty() {
        state.ask = Ask::Input { missing };
        state.expires_at = None;
        return Step::Wait(Disposition::NeedsInput, state);
    }
    let choices = state.choices.clone();
    let mut run = Walk {
        env,
        choices: &choices,
        context,
        fresh,
        steps: 0,
        expires_at: None,
        facts: serde_json::Map::new(),
        sensitive: Vec::new(),
    };
    let mut args = state.args.clone();
    if let Err(stop) = run.fill(tool, &mut args, tool.name().to_string()).await {
        return match stop {
            Stop::Ask(ask) => {
                let expires_at = run.expires_at;
                state.ask = ask;
                state.expires_at = expires_at;
                Step::Wait(Disposition::NeedsSelection, state)
            }
            Stop::NoOptions(lookup) => Step::NoOptions { lookup },
            Stop::OverBudget(e) => Step::OverBudget(e),
            Stop::Failed(why) => Step::Failed(why),
        };
    }
    if let Some(a) = tool.spec().args.iter().find(|a| {
        a.required
            && tool.filled_args().contains(&a.name)
            && args.get(&a.name).is_none_or(Value::is_null)
    }) {
        return Step::Failed(format!(
            "after its lookups, `{}` still has no `{}`; the lookup's `map` does not fill it",
            tool.name(),
            a.name
        ));
    }
    if !tool.writes() && !env.confirm {
        return Step::Ready(args, run.sensitive);
    }
    let prepared = hex::encode(Sha256::digest(canonical(&args).to_string().as_bytes()));
    if state.approved.as_deref() == Some(prepared.as_str()) {
        return Step::Ready(args, run.sensitive);
    }
    let note = state.refreshed.then(|| {
        "the API refused the earlier call (409/410); the lookups ran again: review this one"
            .to_string()
    });
    state.approved = None;
    state.expires_at = run.expires_at;
    state.ask = Ask::Confirmation {
        prepared,
        facts: run.facts,
        note,
    };
    Step::Wait(Disposition::NeedsConfirmation, state)
}

enum Stop {
    OverBudget(crate::budget::Exceeded),
    Ask(Ask),
    NoOptions(String),
    Failed(String),
}

struct Walk<'a, 'e> {
    env: &'a Env<'e>,
    choices: &'a BTreeMap<String, String>,
    context: String,
    fresh: bool,
    steps: u32,
    expires_at: Option<i64>,
    facts: serde_json::Map<String, Value>,
    /// The real ids of the `id_sensitive` options chosen.
    sensitive: Vec<String>,
}

type Filled<'f> = Pin<Box<dyn Future<Output = Result<(), Stop>> + Send + 'f>>;

impl Walk<'_, '_> {
    /// Run `tool`'s dependencies in order, each one's own first, filling `args`.
    fn fill<'f>(&'f mut self, tool: &'f BoundTool, args: &'f mut Value, at: String) -> Filled<'f> {
        Box::pin(async move {
            for (i, dep) in tool.depends().iter().enumerate() {
                let key = format!("{at}/{}:{}", i + 1, dep.tool);
                let dests = dep.destinations();
                if dep.when == bindery_spec::depends::When::Missing
                    && dests
                        .iter()
                        .all(|d| args.get(d).is_some_and(|v| !v.is_null()))
                {
                    continue;
                }
                let Some(lookup) = lookup_tool(self.env.tools, &dep.tool) else {
                    return Err(Stop::Failed(format!(
                        "the lookup `{}` is not available",
                        dep.tool
                    )));
                };
                let mut dep_args = json!({});
                for (name, path) in &dep.arguments {
                    if let Some(v) = get(path, args) {
                        dep_args[name] = v;
                    }
                }
                self.fill(lookup, &mut dep_args, key.clone()).await?;
                let response = self.lookup(lookup, dep, &dep_args).await?;
                let source = match &dep.select {
                    None => response,
                    Some(_) => self.select(dep, &key, lookup.name(), &response, args)?,
                };
                for (dest, src) in &dep.map {
                    let Some(v) = get(src, &source) else {
                        return Err(Stop::Failed(format!(
                            "the lookup `{}` gave nothing at `{src}` for `{dest}`",
                            lookup.name()
                        )));
                    };
                    if let Ok(p) = Path::parse(dest) {
                        p.write(args, v).map_err(|e| Stop::Failed(e.to_string()))?;
                    }
                }
            }
            Ok(())
        })
    }

    /// One lookup's response, cached.
    async fn lookup(
        &mut self,
        tool: &BoundTool,
        dep: &Dependency,
        args: &Value,
    ) -> Result<Value, Stop> {
        let key: [u8; 32] = Sha256::new()
            .chain_update(tool.name().as_bytes())
            .chain_update([0])
            .chain_update(canonical(args).to_string().as_bytes())
            .chain_update([0])
            .chain_update(self.context.as_bytes())
            .finalize()
            .into();
        let ttl = i64::try_from(dep.ttl_ms()).unwrap_or(i64::MAX / 4);
        let cached = (!self.fresh)
            .then(|| self.env.cache.get(&key, self.env.now))
            .flatten();
        let (at, v) = match cached {
            Some(hit) => hit,
            None => {
                self.steps += 1;
                if self.steps > self.env.max_steps {
                    return Err(Stop::Failed(format!(
                        "resolving the inputs took more than {} lookups (the agent's maxSteps)",
                        self.env.max_steps
                    )));
                }
                if let Some(host) = self.env.host {
                    use crate::budget::Gate;
                    match host.before_tool(tool.name()).await {
                        Gate::Go(_) => {}
                        Gate::Refuse(e) => {
                            return Err(Stop::Failed(format!(
                                "{}, so the lookup `{}` did not run",
                                e.detail(),
                                tool.name()
                            )))
                        }
                        Gate::Ask(e) => return Err(Stop::OverBudget(e)),
                    }
                }
                let mut ctx = self.env.call.clone();
                ctx.turn_id = format!("lookup-{}", tool.name());
                crate::run::audited(self.env.host, tool, &ctx.turn_id, self.env.values)
                    .await
                    .map_err(|e| {
                        Stop::Failed(format!("the lookup `{}` did not run: {e}", tool.name()))
                    })?;
                let out = tool
                    .call(args.clone(), self.env.values, &ctx)
                    .await
                    .map_err(|e| {
                        Stop::Failed(format!("the lookup `{}` failed: {e}", tool.name()))
                    })?;
                let text = self.env.scrubber.scrub(&out.shown());
                let v: Value = serde_json::from_str(text.trim()).map_err(|_| {
                    Stop::Failed(format!(
                        "the lookup `{}` did not answer with JSON",
                        tool.name()
                    ))
                })?;
                self.env
                    .cache
                    .put(key, self.env.now, self.env.now + ttl, v.clone());
                (self.env.now, v)
            }
        };
        let until = at + ttl;
        self.expires_at = Some(self.expires_at.map_or(until, |e| e.min(until)));
        Ok(v)
    }

    /// The chosen option of a lookup with `select`, or why it stops.
    fn select(
        &mut self,
        dep: &Dependency,
        key: &str,
        lookup: &str,
        response: &Value,
        args: &Value,
    ) -> Result<Value, Stop> {
        let sel = dep.select.as_ref().expect("a select");
        let Some(Value::Array(items)) = get(&sel.items_path, response) else {
            return Err(Stop::Failed(format!(
                "the lookup `{lookup}` answered without a list at `{}`",
                sel.items_path
            )));
        };
        if items.is_empty() {
            return Err(Stop::NoOptions(lookup.to_string()));
        }
        let mut options = Vec::new();
        for (n, item) in items.iter().enumerate() {
            let Some(real) = get(&sel.id_path, item).and_then(|v| text(&v)) else {
                return Err(Stop::Failed(format!(
                    "the lookup `{lookup}`: option {} has no id at `{}`, so it cannot be chosen",
                    n + 1,
                    sel.id_path
                )));
            };
            if let Some(first) = options.iter().position(|o: &Choice| o.real == real) {
                return Err(Stop::Failed(format!(
                    "the lookup `{lookup}`: options {} and {} have the same id, so a choice would be ambiguous",
                    first + 1,
                    n + 1
                )));
            }
            let label = sel
                .label_path
                .as_ref()
                .and_then(|p| get(p, item))
                .and_then(|v| text(&v))
                .unwrap_or_else(|| {
                    if sel.id_sensitive {
                        format!("option {}", n + 1)
                    } else {
                        real.clone()
                    }
                });
            let facts = sel
                .facts
                .iter()
                .filter_map(|(k, p)| get(p, item).map(|v| (k.clone(), v)))
                .collect();
            let id = if sel.id_sensitive {
                format!(
                    "opt_{}",
                    &hex::encode(bindery_store::clock::random_key())[..16]
                )
            } else {
                real.clone()
            };
            options.push(Choice {
                id,
                label,
                facts,
                real,
            });
        }
        let pick = |i: usize, this: &mut Self| {
            this.facts.extend(options[i].facts.clone());
            if sel.id_sensitive {
                this.sensitive.push(options[i].real.clone());
            }
            Ok(items[i].clone())
        };
        let mut note = None;
        if let Some(real) = self.choices.get(key) {
            if let Some(i) = options.iter().position(|o| &o.real == real) {
                return pick(i, self);
            }
            note = Some("the option chosen before is no longer offered; choose again".to_string());
        } else if let Some(m) = &sel.match_ {
            if let Some(wanted) = get(&m.input_path, args).and_then(|v| text(&v)) {
                let wanted = wanted.trim().to_lowercase();
                let hits: Vec<usize> = items
                    .iter()
                    .enumerate()
                    .filter(|(_, it)| {
                        get(&m.item_path, it)
                            .and_then(|v| text(&v))
                            .is_some_and(|t| t.trim().to_lowercase() == wanted)
                    })
                    .map(|(i, _)| i)
                    .collect();
                match hits.as_slice() {
                    [one] => return pick(*one, self),
                    [] => {
                        note = Some(format!(
                            "no option matches `{}` exactly; these are the alternatives",
                            wanted
                        ))
                    }
                    _ => note = Some(format!("several options match `{wanted}`; choose one")),
                }
            } else if options.len() == 1 {
                return pick(0, self);
            }
        } else if options.len() == 1 {
            return pick(0, self);
        }
        Err(Stop::Ask(Ask::Selection {
            key: key.to_string(),
            lookup: lookup.to_string(),
            options,
            note,
        }))
    }
}

/// A string or a number as text.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The user-owned arguments a call lacks or gives with the wrong type: the
/// required ones that neither a binding nor a dependency fills.
pub fn missing_inputs(tool: &BoundTool, values: &Values, args: &Value) -> Vec<String> {
    let hidden = tool.hidden_args(values);
    let filled = tool.filled_args();
    tool.spec()
        .args
        .iter()
        .filter(|a| !hidden.contains(a.name.as_str()) && !filled.contains(&a.name))
        .filter(|a| match args.get(&a.name) {
            None | Some(Value::Null) => a.required,
            Some(v) => !fits(&a.schema, v),
        })
        .map(|a| a.name.clone())
        .collect()
}

/// Whether `v` has the schema's simple `type` (anything fits no type), and
/// a string is not blank.
fn fits(schema: &Value, v: &Value) -> bool {
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => v.as_str().is_some_and(|s| !s.trim().is_empty()),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("array") => v.is_array(),
        Some("object") => v.is_object(),
        _ => true,
    }
}

/// Whether a failed call is the API saying the prepared input went stale:
/// an HTTP 409 or 410 (an OpenAPI tool's status, or a bash tool whose error
/// output starts with `HTTP 409` or `HTTP 410`).
pub fn is_stale(e: &ToolError) -> bool {
    matches!(
        e,
        ToolError::Http {
            status: 409 | 410,
            ..
        }
    )
}

#[cfg(test)]
pub(crate) mod tests;
