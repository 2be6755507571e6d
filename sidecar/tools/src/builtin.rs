//! Builtin toolboxes: tools the sidecar answers itself, agents-exe's
//! `io_<slug>` tools. One toolbox is one tool, `io_<name>`, whose
//! `capability` argument picks what it reports (agents-exe's system
//! toolbox: the date, the host name, …). Being an ordinary [`Tool`], it
//! gets bindings through the same combinator: bind `capability` to a
//! literal and the model sees a tool without arguments.
//!
//! `read-session` and `get-session-stats` report the calling session: the
//! tool is handed that run's own conversation (as a bash tool's
//! `AGENT_SESSION_JSON`: what the model already saw, never a bound value).
//! `list-sessions`, `search-sessions` and `read-session` given a
//! `session_id` reach the calling session's fork lineage and nothing else,
//! through the [`super::lineage::SessionLineage`] the run hands over.
//!
//! The sidecar's environment holds parameter values and tokens: `env-vars`
//! reads only the variables its declaration lists (`spec::checks` refuses a
//! list naming a parameter's or credential's variable), and at each call
//! leaves out any whose value holds a live secret.

use std::collections::BTreeSet;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde_json::{json, Value};

use super::lineage::{Found, Kin, Listing, Relation};
use super::{ArgSpec, CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec, Transport};
use bindery_spec::{BuiltinToolbox, SessionScope};

/// How many sessions a `list-sessions` or `search-sessions` answer holds
/// when the toolbox does not say (agents-exe's default).
const SESSION_RESULTS_DEFAULT: u32 = 50;

pub struct SystemTool {
    spec: ToolSpec,
    capabilities: Vec<String>,
    /// What `env-vars` may show: the listed names, less any refused.
    env_vars: Vec<String>,
    /// `read-session` shows the tools' outputs (and `search-sessions`
    /// looks in them).
    tool_outputs: bool,
    /// Which part of the lineage `list-sessions` and `search-sessions` reach.
    scope: SessionScope,
    /// The most sessions one of their answers holds.
    max_results: usize,
    /// What `attach-file` may read (none when absent).
    sandbox: Option<bindery_spec::sandbox::FileSandbox>,
}

impl SystemTool {
    /// The toolbox's tool; `sources` are the variables the agent reads
    /// values from ([`bindery_spec::checks::env_sources`]), never shown.
    pub fn new(
        tb: &BuiltinToolbox,
        sources: &BTreeSet<String>,
        naming: bindery_spec::Naming,
    ) -> SystemTool {
        let has = |c: &str| tb.capabilities.iter().any(|x| x == c);
        // `read-session` reads another session of the lineage only where
        // the toolbox also gives the ids to read.
        let reads_lineage = has("read-session") && (has("list-sessions") || has("search-sessions"));
        let spec = ToolSpec {
            name: match naming {
                bindery_spec::Naming::Bindery => format!("io_{}", tb.name),
                // agents-exe's name for its system toolbox's one tool.
                bindery_spec::Naming::AgentsExe => format!("system_{}_system_info", tb.name),
            },
            local_name: tb.name.clone(),
            description: tb.description.clone().unwrap_or_else(|| {
                format!("Reports about the system: {}.", tb.capabilities.join(", "))
            }),
            args: std::iter::once(ArgSpec {
                name: "capability".into(),
                description: "what to report".into(),
                required: true,
                schema: json!({"type": "string", "enum": tb.capabilities, "description": "what to report"}),
                transport: Transport::Json,
            })
            .chain(reads_lineage.then(|| {
                // agents-exe's argument: which session to read.
                let description = "For read-session: the id of a session list-sessions or search-sessions gave (default: this session)";
                ArgSpec {
                    name: "session_id".into(),
                    description: description.into(),
                    required: false,
                    schema: json!({"type": "string", "description": description}),
                    transport: Transport::Json,
                }
            }))
            .chain(has("attach-file").then(|| {
                // agents-exe's argument name.
                let description = "For attach-file: the path of the file to attach (from the working directory)";
                ArgSpec {
                    name: "filepath".into(),
                    description: description.into(),
                    required: false,
                    schema: json!({"type": "string", "description": description}),
                    transport: Transport::Json,
                }
            }))
            .chain(tb.capabilities.iter().any(|c| c == "search-sessions").then(|| {
                // agents-exe's argument, offered only with the capability.
                let description = "For search-sessions: the words to look for (a session matches when its conversation holds any of them, in any case)";
                ArgSpec {
                    name: "query".into(),
                    description: description.into(),
                    required: false,
                    schema: json!({"type": "string", "description": description}),
                    transport: Transport::Json,
                }
            }))
            .collect(),
            writes: false,
        };
        SystemTool {
            spec,
            tool_outputs: tb.session_tool_outputs,
            scope: tb.session_scope,
            max_results: tb
                .session_max_results
                .unwrap_or(SESSION_RESULTS_DEFAULT)
                .clamp(1, bindery_spec::checks::SESSION_RESULTS_MAX)
                as usize,
            capabilities: tb.capabilities.clone(),
            sandbox: tb.file_sandbox.clone(),
            env_vars: tb
                .env_vars
                .iter()
                .filter(|n| bindery_spec::checks::env_var_refusal(n, sources).is_none())
                .cloned()
                .collect(),
        }
    }

    /// `env-vars`: each listed variable's value, `null` when unset; one
    /// whose value holds a secret this process or this call knows is
    /// named under `withheld`, its value not read out.
    fn env_report(&self, ctx: &CallContext) -> Value {
        let live = bindery_params::live::scrubber();
        let mut vars = serde_json::Map::new();
        let mut withheld = Vec::new();
        for name in &self.env_vars {
            match std::env::var(name) {
                Ok(v)
                    if live.scrub(&v) != v
                        || ctx.scrubber.scrub(&v) != v
                        || bindery_spec::checks::credential_value(&v) =>
                {
                    withheld.push(name.clone())
                }
                Ok(v) => {
                    vars.insert(name.clone(), Value::String(v));
                }
                Err(_) => {
                    vars.insert(name.clone(), Value::Null);
                }
            }
        }
        json!({"variables": vars, "withheld": withheld})
    }

    /// The session of the lineage `read-session` is asked for, when it is
    /// not the calling one (and the toolbox offers `session_id`).
    fn other_session(
        &self,
        capability: &str,
        args: &CallArgs,
        ctx: &CallContext,
    ) -> Option<String> {
        if capability != "read-session" || self.spec.arg("session_id").is_none() {
            return None;
        }
        match args.get("session_id").and_then(|v| v.plain()) {
            Some(Value::String(id)) if !id.is_empty() && *id != ctx.session_id => Some(id.clone()),
            _ => None,
        }
    }

    /// Session `id` of the calling session's lineage within the scope, as
    /// [`own_session`] gives the calling one; refused alike whether it is
    /// elsewhere or nowhere.
    async fn lineage_session(&self, id: &str, ctx: &CallContext) -> Result<Value, ToolError> {
        let not_here = || {
            ToolError::InvalidArguments(format!(
                "session `{id}` is not one this session may read (its fork lineage, scope {}): take an id `list-sessions` or `search-sessions` gave",
                self.scope.as_str()
            ))
        };
        let lineage = ctx.lineage.as_ref().ok_or_else(not_here)?;
        let read = lineage.read(self.scope, id).await?.ok_or_else(not_here)?;
        let relation = match read.relation {
            Relation::Ancestor => "parent",
            Relation::Descendant => "child",
            Relation::Current => "current",
        };
        Ok(json!({"session_id": read.session.id, "turns": read.turns, "relation": relation}))
    }

    /// `list-sessions` or `search-sessions` over the calling session's
    /// lineage; outside a session's run there is none to reach.
    async fn lineage_report(
        &self,
        capability: &str,
        args: &CallArgs,
        ctx: &CallContext,
    ) -> Result<Value, ToolError> {
        let scope = self.scope.as_str();
        // `list-sessions` takes no query, whatever the model sends.
        let query = match args.get("query").and_then(|v| v.plain()) {
            _ if capability == "list-sessions" => None,
            Some(Value::String(q)) if !q.trim().is_empty() => Some(q.clone()),
            _ => {
                return Err(ToolError::InvalidArguments(
                    "search-sessions needs `query`: the words to look for, as a string".into(),
                ))
            }
        };
        let Some(lineage) = &ctx.lineage else {
            let note =
                "there is no session store here (a command-line run): no session to list or search";
            return Ok(match query {
                None => json!({"sessions": [], "totalAccessible": 0, "scope": scope, "note": note}),
                Some(q) => {
                    json!({"query": q, "results": [], "totalMatches": 0, "scope": scope, "note": note})
                }
            });
        };
        match query {
            None => lineage
                .list(self.scope, self.max_results)
                .await
                .map(|l| listing_json(&l, scope)),
            Some(q) => lineage
                .search(self.scope, &q, self.max_results, self.tool_outputs)
                .await
                .map(|f| found_json(&q, &f, scope)),
        }
        .map_err(ToolError::from)
    }
}

/// One session of the lineage as `list-sessions` shows it (agents-exe's
/// keys; `isParent`/`isChild` say ancestor/descendant).
fn kin_json(k: &Kin, r: Relation) -> Value {
    let secs = |ms: i64| rfc3339(u64::try_from(ms / 1000).unwrap_or(0));
    json!({
        "sessionId": k.id,
        "conversationId": k.id,
        "agent": k.agent,
        "forkedFrom": k.forked_from,
        "createdAt": secs(k.created_at),
        "modificationTime": secs(k.updated_at),
        "turnCount": k.turns,
        "isParent": r == Relation::Ancestor,
        "isChild": r == Relation::Descendant,
        "isCurrent": r == Relation::Current,
        "status": k.status,
    })
}

fn listing_json(l: &Listing, scope: &str) -> Value {
    let sessions: Vec<Value> = l.sessions.iter().map(|(k, r)| kin_json(k, *r)).collect();
    json!({"sessions": sessions, "totalAccessible": l.total, "scope": scope})
}

fn found_json(query: &str, f: &Found, scope: &str) -> Value {
    let results: Vec<Value> = f
        .hits
        .iter()
        .map(|h| {
            json!({
                "sessionId": h.session.id,
                "conversationId": h.session.id,
                "turnCount": h.session.turns,
                "isParent": h.relation == Relation::Ancestor,
                "isChild": h.relation == Relation::Descendant,
                "isCurrent": h.relation == Relation::Current,
                "turn": h.found.turn,
                "role": h.found.role,
                "preview": h.found.excerpt,
                "matchType": "content",
            })
        })
        .collect();
    json!({"query": query, "results": results, "totalMatches": f.total,
           "complete": f.complete, "scope": scope})
}

/// Why a capability has nothing to report; the model is told.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot read the host name: {0}")]
    Hostname(std::io::Error),
    #[error("cannot read the working directory: {0}")]
    WorkingDirectory(std::io::Error),
    #[error("cannot read the uptime")]
    Uptime,
    #[error("unknown capability `{0}`")]
    Unknown(String),
    #[error("there is no session here: this capability reports the session that calls it")]
    NoSession,
    #[error("the session did not read: {0}")]
    Session(serde_json::Error),
}

/// What one capability reports (Linux facts from `/proc`).
pub fn report(capability: &str) -> Result<Value, ReportError> {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string());
    match capability {
        "date" => {
            let now = SystemTime::now();
            let unix = now
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            Ok(json!({"utc": rfc3339(unix), "unix": unix}))
        }
        "hostname" => read("/proc/sys/kernel/hostname")
            .or_else(|_| read("/etc/hostname"))
            .map(|h| json!({"hostname": h}))
            .map_err(ReportError::Hostname),
        "operating-system" => {
            let pretty = read("/etc/os-release").ok().and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                    .map(|v| v.trim_matches('"').to_string())
            });
            Ok(
                json!({"os": std::env::consts::OS, "arch": std::env::consts::ARCH,
                      "family": std::env::consts::FAMILY, "release": pretty}),
            )
        }
        "working-directory" => std::env::current_dir()
            .map(|d| json!({"path": d.display().to_string()}))
            .map_err(ReportError::WorkingDirectory),
        "running-user" => {
            let status = read("/proc/self/status").unwrap_or_default();
            let id = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Ok(json!({"uid": id("Uid:"), "gid": id("Gid:")}))
        }
        "uptime" => read("/proc/uptime")
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
            .map(|s| json!({"seconds": s}))
            .ok_or(ReportError::Uptime),
        "process-info" => Ok(json!({"pid": std::process::id(),
                                    "ppid": nix::unistd::getppid().as_raw()})),
        other => Err(ReportError::Unknown(other.to_string())),
    }
}

/// `2026-11-30T11:15:33Z` for seconds since the Unix epoch (UTC).
fn rfc3339(unix: u64) -> String {
    // Days to a civil date (Howard Hinnant's algorithm).
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// The calling session, `{"session_id", "turns"}`, as the run hands it.
fn own_session(ctx: &CallContext) -> Result<Value, ReportError> {
    let json = ctx.session_json.as_deref().ok_or(ReportError::NoSession)?;
    serde_json::from_str(json).map_err(ReportError::Session)
}

/// `read-session` (a session's turns) or `get-session-stats` (how many
/// turns of each role, and which tools were called how often) of
/// `session`, `{"session_id", "turns"}`.
fn session_report(capability: &str, session: Value, tool_outputs: bool) -> Value {
    let mut turns = session["turns"].as_array().cloned().unwrap_or_default();
    if capability == "read-session" {
        if !tool_outputs {
            for t in turns.iter_mut().filter(|t| t["role"] == "tool") {
                t["content"] = json!("(a tool's output, not shown here)");
            }
        }
        let mut out = json!({"session_id": session["session_id"], "turns": turns});
        if let Some(r) = session.get("relation") {
            out["relation"] = r.clone();
        }
        return out;
    }
    let mut roles = serde_json::Map::new();
    let mut tools = serde_json::Map::new();
    for t in &turns {
        let role = t["role"].as_str().unwrap_or("unknown").to_string();
        let n = roles.get(&role).and_then(Value::as_u64).unwrap_or(0);
        roles.insert(role, json!(n + 1));
        for call in t["tool_calls"].as_array().into_iter().flatten() {
            let name = call["function"]["name"].as_str().unwrap_or("").to_string();
            let n = tools.get(&name).and_then(Value::as_u64).unwrap_or(0);
            tools.insert(name, json!(n + 1));
        }
    }
    json!({"session_id": session["session_id"], "turns": turns.len(),
          "byRole": roles, "toolCalls": tools})
}

#[async_trait]
impl Tool for SystemTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// With a session capability, the tool is handed the calling session
    /// (and a cached result answers only that same session).
    fn receives_session(&self) -> bool {
        self.capabilities.iter().any(|c| {
            [
                "read-session",
                "get-session-stats",
                "list-sessions",
                "search-sessions",
            ]
            .contains(&c.as_str())
        })
    }

    async fn call(&self, args: CallArgs, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let capability = match args.get("capability").and_then(|v| v.plain()) {
            Some(Value::String(c)) => c.clone(),
            _ => {
                return Err(ToolError::InvalidArguments(format!(
                    "`capability` must be one of {}",
                    self.capabilities.join(", ")
                )))
            }
        };
        if !self.capabilities.contains(&capability) {
            return Err(ToolError::InvalidArguments(format!(
                "capability `{capability}` is not enabled here; use one of {}",
                self.capabilities.join(", ")
            )));
        }
        if capability == "attach-file" {
            let Some(Value::String(path)) = args.get("filepath").and_then(|v| v.plain()) else {
                return Err(ToolError::InvalidArguments(
                    "attach-file needs `filepath`: the path of the file, as a string".into(),
                ));
            };
            let cwd = std::env::current_dir().map_err(|e| {
                ToolError::Failed(format!("cannot read the working directory: {e}"))
            })?;
            // Reading is blocking file I/O, bounded by the media limit.
            let (sandbox, path) = (self.sandbox.clone(), path.clone());
            let media = tokio::task::spawn_blocking(move || {
                super::attach::attach(sandbox.as_ref(), &path, &cwd)
            })
            .await
            .map_err(|e| ToolError::Failed(format!("attach-file stopped: {e}")))?
            .map_err(|e| ToolError::Failed(e.to_string()))?;
            return Ok(ToolOutput::Media(media));
        }
        let started = Instant::now();
        let data = match capability.as_str() {
            "env-vars" => self.env_report(ctx),
            "read-session" | "get-session-stats" => {
                let session = match self.other_session(&capability, &args, ctx) {
                    Some(id) => self.lineage_session(&id, ctx).await?,
                    None => own_session(ctx).map_err(|e| ToolError::Failed(e.to_string()))?,
                };
                session_report(&capability, session, self.tool_outputs)
            }
            "list-sessions" | "search-sessions" => {
                self.lineage_report(&capability, &args, ctx).await?
            }
            _ => report(&capability).map_err(|e| ToolError::Failed(e.to_string()))?,
        };
        let out = json!({"capability": capability, "data": data,
                         "executionTime": started.elapsed().as_secs_f64()});
        Ok(ToolOutput::Json(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_037_333), "2026-11-30T11:15:33Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn every_capability_reports() {
        for c in bindery_spec::checks::BUILTIN_CAPABILITIES
            .iter()
            .filter(|c| {
                ![
                    "env-vars",
                    "read-session",
                    "get-session-stats",
                    "list-sessions",
                    "search-sessions",
                    "attach-file",
                ]
                .contains(*c)
            })
        {
            let v = report(c).unwrap_or_else(|e| panic!("{c}: {e}"));
            assert!(v.is_object(), "{c}: {v}");
        }
        assert!(matches!(report("env-vars"), Err(ReportError::Unknown(c)) if c == "env-vars"));
    }

    /// A lineage that answers what it was asked, to see what the tool asks.
    #[derive(Debug, Default)]
    struct Asked(std::sync::Mutex<Vec<String>>);

    #[async_trait]
    impl crate::lineage::SessionLineage for Asked {
        async fn list(
            &self,
            scope: SessionScope,
            limit: usize,
        ) -> Result<Listing, crate::lineage::LineageUnreadable> {
            self.0
                .lock()
                .unwrap()
                .push(format!("list {} {limit}", scope.as_str()));
            let kin = Kin {
                id: "s0".into(),
                forked_from: None,
                agent: "a".into(),
                status: "idle".into(),
                created_at: 1_796_037_333_000,
                updated_at: 1_796_037_333_000,
                turns: 3,
            };
            Ok(Listing {
                sessions: vec![(kin, Relation::Ancestor)],
                total: 7,
            })
        }
        async fn search(
            &self,
            scope: SessionScope,
            query: &str,
            limit: usize,
            tool_outputs: bool,
        ) -> Result<Found, crate::lineage::LineageUnreadable> {
            self.0.lock().unwrap().push(format!(
                "search {} {query} {limit} {tool_outputs}",
                scope.as_str()
            ));
            Ok(Found {
                hits: Vec::new(),
                total: 0,
                complete: true,
            })
        }
        async fn read(
            &self,
            scope: SessionScope,
            id: &str,
        ) -> Result<Option<crate::lineage::Read>, crate::lineage::LineageUnreadable> {
            self.0
                .lock()
                .unwrap()
                .push(format!("read {} {id}", scope.as_str()));
            Ok(None)
        }
    }

    fn call_args(v: Value) -> CallArgs {
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), bindery_params::ParamValue::Plain(v.clone())))
            .collect()
    }

    /// The toolbox's scope and cap reach the lineage; `query` is offered
    /// with `search-sessions` only, needed by it and ignored by
    /// `list-sessions`; without a lineage (the CLI) there is nothing.
    #[tokio::test]
    async fn the_lineage_capabilities_ask_within_the_toolboxs_scope_and_cap() {
        let tb: BuiltinToolbox = serde_json::from_value(json!({
            "name": "s", "capabilities": ["list-sessions", "search-sessions", "read-session"],
            "sessionScope": "children-only", "sessionMaxResults": 5000,
            "sessionToolOutputs": false}))
        .unwrap();
        let tool = SystemTool::new(&tb, &BTreeSet::new(), bindery_spec::Naming::Bindery);
        assert!(tool.spec().arg("query").is_some());
        assert!(tool.receives_session());
        let asked = std::sync::Arc::new(Asked::default());
        let ctx = CallContext {
            lineage: Some(asked.clone()),
            ..CallContext::default()
        };
        let list = tool
            .call(
                call_args(json!({"capability": "list-sessions", "query": "x"})),
                &ctx,
            )
            .await
            .unwrap();
        let ToolOutput::Json(list) = list else {
            panic!("{list:?}")
        };
        let s = &list["data"]["sessions"][0];
        assert_eq!(
            (
                &s["sessionId"],
                &s["isParent"],
                &s["isChild"],
                &s["turnCount"]
            ),
            (&json!("s0"), &json!(true), &json!(false), &json!(3))
        );
        assert_eq!(s["modificationTime"], "2026-11-30T11:15:33Z");
        assert_eq!(list["data"]["totalAccessible"], 7);
        assert_eq!(list["data"]["scope"], "children-only");
        let none = tool
            .call(call_args(json!({"capability": "search-sessions"})), &ctx)
            .await;
        assert!(
            matches!(&none, Err(ToolError::InvalidArguments(m)) if m.contains("`query`")),
            "{none:?}"
        );
        tool.call(
            call_args(json!({"capability": "search-sessions", "query": "late fee"})),
            &ctx,
        )
        .await
        .unwrap();
        let elsewhere = tool
            .call(
                call_args(json!({"capability": "read-session", "session_id": "elsewhere"})),
                &ctx,
            )
            .await;
        assert!(
            matches!(&elsewhere, Err(ToolError::InvalidArguments(m)) if m.contains("not one this session may read")),
            "{elsewhere:?}"
        );
        assert_eq!(
            *asked.0.lock().unwrap(),
            [
                "list children-only 1000",
                "search children-only late fee 1000 false",
                "read children-only elsewhere"
            ]
        );
        let ToolOutput::Json(cli) = tool
            .call(
                call_args(json!({"capability": "list-sessions"})),
                &CallContext::default(),
            )
            .await
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(cli["data"]["sessions"], json!([]));
        assert!(cli["data"]["note"]
            .as_str()
            .unwrap()
            .contains("no session store"));
        let tb: BuiltinToolbox =
            serde_json::from_value(json!({"name": "s", "capabilities": ["list-sessions"]}))
                .unwrap();
        let tool = SystemTool::new(&tb, &BTreeSet::new(), bindery_spec::Naming::Bindery);
        assert!(tool.spec().arg("query").is_none());
        assert!(tool.spec().arg("session_id").is_none());
        assert_eq!(tool.max_results, 50);
        // `read-session` alone reads the calling session only.
        let tb: BuiltinToolbox =
            serde_json::from_value(json!({"name": "s", "capabilities": ["read-session"]})).unwrap();
        let tool = SystemTool::new(&tb, &BTreeSet::new(), bindery_spec::Naming::Bindery);
        assert!(tool.spec().arg("session_id").is_none());
    }

    /// agents-exe's `SessionIntrospectionIncludeToolOutputs: false`: the
    /// tools' outputs in the session read are elided, the rest kept.
    #[test]
    fn read_session_can_leave_the_tools_outputs_out() {
        let session = json!({"session_id": "s1", "turns": [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "c1", "content": "CANARY-output"},
            {"role": "assistant", "content": "done"}]});
        let ctx = CallContext {
            session_json: Some(session.to_string().into()),
            ..CallContext::one_off("s1", "t", "a")
        };
        let shown = session_report("read-session", own_session(&ctx).unwrap(), true);
        assert!(shown.to_string().contains("CANARY-output"));
        let elided = session_report("read-session", own_session(&ctx).unwrap(), false);
        assert!(!elided.to_string().contains("CANARY-output"), "{elided}");
        assert_eq!(elided["turns"][1]["tool_call_id"], "c1");
        assert_eq!(elided["turns"][2]["content"], "done");
    }
}
