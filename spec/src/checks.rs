//! Checks of an agent definition that need neither its tools' descriptions
//! nor any value: the sidecar runs them when it loads a file, the operator
//! when it reconciles an `Agent`. Each message names the place to fix.

use std::collections::BTreeSet;

use std::collections::BTreeMap;

use super::valid_param_name as valid_name;
use super::{
    AgentSpec, Binding, BindingValue, BuiltinToolbox, McpToolbox, OpenApiToolbox, PostgrestToolbox,
    Scope, SecretSource, Toolbox, WhenUnbound,
};
use crate::diagnostic::Diagnostic;

/// Why a toolgroup's name cannot be one, if so: the model writes it back
/// in `meta_activate_tool`, so it is a short plain word.
pub fn bad_toolgroup(name: &str) -> Option<String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok) {
        return Some(format!(
            "`{name}` is not a group name: 1 to 64 letters, digits, `_`, `-`, `.` or `:`"
        ));
    }
    None
}

/// `toolbox 2 (bash directory ./tools)`: how messages name a toolbox.
pub fn toolbox_label(index: usize, tb: &Toolbox) -> String {
    let b = match tb {
        Toolbox::Bash(b) => b,
        Toolbox::Openapi(o) => return format!("toolbox {} (openapi {})", index + 1, o.spec),
        Toolbox::Mcp(m) => return format!("toolbox {} (mcp {})", index + 1, m.name),
        Toolbox::Deferred(_) => return format!("toolbox {} (deferred)", index + 1),
        Toolbox::Postgrest(p) => return format!("toolbox {} (postgrest {})", index + 1, p.name),
        Toolbox::Builtin(b) => return format!("toolbox {} (builtin {})", index + 1, b.name),
        Toolbox::Sqlite(q) => return format!("toolbox {} (sqlite {})", index + 1, q.name),
    };
    match (&b.directory, &b.script) {
        (Some(d), None) => format!("toolbox {} (bash directory {d})", index + 1),
        (None, Some(s)) => format!("toolbox {} (bash script {s})", index + 1),
        _ => format!("toolbox {} (bash)", index + 1),
    }
}

/// The tools whose calls wait, as the definition selects them (pure: the
/// tools themselves are known only once loaded): `confirm bash_delete-*`,
/// `confirm toolbox 2 (openapi ./api.yaml): every write`, `deferred get_location`.
pub fn waiting_tools(spec: &AgentSpec) -> Vec<String> {
    use super::{ConfirmKeyword, ToolboxConfirm};
    let mut out: Vec<String> = spec
        .confirm
        .iter()
        .map(|s| format!("confirm {}", s.tool))
        .collect();
    for (i, tb) in spec.toolboxes.iter().enumerate() {
        if let Toolbox::Deferred(d) = tb {
            out.extend(d.tools.iter().map(|t| format!("deferred {}", t.name)));
            continue;
        }
        let confirm = toolbox_confirm(tb);
        let label = toolbox_label(i, tb);
        match confirm {
            Some(ToolboxConfirm::Writes(ConfirmKeyword::Writes)) => {
                out.push(format!("confirm {label}: every write"))
            }
            Some(ToolboxConfirm::Tools(sel)) => {
                out.extend(sel.iter().map(|s| format!("confirm {label}: {}", s.tool)))
            }
            None => {}
        }
    }
    out
}

/// A toolbox's `confirm`, for the kinds that have one.
fn toolbox_confirm(tb: &Toolbox) -> Option<&super::ToolboxConfirm> {
    match tb {
        Toolbox::Bash(b) => b.confirm.as_ref(),
        Toolbox::Openapi(o) => o.confirm.as_ref(),
        Toolbox::Mcp(m) => m.confirm.as_ref(),
        Toolbox::Postgrest(p) => p.confirm.as_ref(),
        Toolbox::Builtin(_) | Toolbox::Sqlite(_) | Toolbox::Deferred(_) => None,
    }
}

/// A name the model can call a tool by (OpenAI's rule for function names).
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Every check of `spec` (the agent `name`); `here` prefixes messages
/// (`agent.yaml: agent `invoices``).
pub fn check_definition(name: &str, spec: &AgentSpec, here: &str) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    if !valid_tool_name(&format!("prompt_agent_{name}")) {
        diags.push(Diagnostic::error(format!(
            "{here}: the name may use only letters, digits, `_` and `-` (at most 50 characters)"
        )));
    }
    let mut names = BTreeSet::new();
    for d in &spec.parameters {
        if !valid_name(&d.name) {
            diags.push(Diagnostic::error(format!(
                "{here}, parameter `{}`: a parameter name is lower-case letters, digits and `_`, starting with a letter",
                d.name
            )));
        }
        if !names.insert(d.name.as_str()) {
            diags.push(Diagnostic::error(format!(
                "{here}, parameter `{}` is declared twice",
                d.name
            )));
        }
    }
    for (i, tb) in spec.toolboxes.iter().enumerate() {
        let place = format!("{here}, {}", toolbox_label(i, tb));
        if let Some(why) = tb.toolgroup().and_then(bad_toolgroup) {
            diags.push(Diagnostic::error(format!("{place}, toolgroup: {why}")));
        }
        let b = match tb {
            Toolbox::Bash(b) => b,
            Toolbox::Openapi(o) => {
                check_openapi(spec, o, &place, &mut diags);
                check_bindings(spec, &o.bindings, &place, &mut diags);
                super::depends::check_decls(&o.tools, &place, &mut diags);
                continue;
            }
            Toolbox::Mcp(m) => {
                check_mcp(spec, m, &place, &mut diags);
                check_bindings(spec, &m.bindings, &place, &mut diags);
                super::depends::check_decls(&m.tools, &place, &mut diags);
                continue;
            }
            Toolbox::Deferred(d) => {
                for t in &d.tools {
                    if !valid_tool_name(&t.name) {
                        diags.push(Diagnostic::error(format!(
                            "{place}, tool `{}`: a model-visible tool name may use only letters, digits, `_` and `-`, at most 64 characters",
                            t.name
                        )));
                    }
                }
                continue;
            }
            Toolbox::Postgrest(p) => {
                check_postgrest(p, &place, &mut diags);
                check_openapi(spec, &p.as_openapi(), &place, &mut diags);
                check_bindings(spec, &p.bindings, &place, &mut diags);
                continue;
            }
            Toolbox::Builtin(b) => {
                check_builtin(spec, b, &place, &mut diags);
                check_bindings(spec, &b.bindings, &place, &mut diags);
                continue;
            }
            Toolbox::Sqlite(q) => {
                check_sqlite(q, &place, &mut diags);
                check_bindings(spec, &q.bindings, &place, &mut diags);
                continue;
            }
        };
        let shape_ok = matches!(
            (&b.directory, &b.script, &b.basename_filter),
            (Some(_), None, _) | (None, Some(_), None)
        );
        if !shape_ok {
            diags.push(Diagnostic::error(format!(
                "{here}, toolbox {}: a bash toolbox takes either `directory` (with an optional `basenameFilter`) or `script`",
                i + 1
            )));
        }
        check_bindings(spec, &b.bindings, &place, &mut diags);
        super::depends::check_decls(&b.tools, &place, &mut diags);
    }
    super::depends::check_decls(
        &spec.tools,
        &format!("{here}, agent-level tools"),
        &mut diags,
    );
    check_bindings(
        spec,
        &spec.bindings,
        &format!("{here}, agent-level bindings"),
        &mut diags,
    );
    check_conditions(
        &spec.confirm,
        &format!("{here}, agent-level confirm"),
        &mut diags,
    );
    for (i, tb) in spec.toolboxes.iter().enumerate() {
        if let Some(super::ToolboxConfirm::Tools(selectors)) = toolbox_confirm(tb) {
            let place = format!("{here}, {}, confirm", toolbox_label(i, tb));
            check_conditions(selectors, &place, &mut diags);
        }
    }
    if let Some(w) = spec.approvals.as_ref().and_then(|a| a.webhook.as_ref()) {
        let place = format!("{here}, approvals.webhook");
        if !(w.url.starts_with("https://") || w.url.starts_with("http://")) {
            diags.push(Diagnostic::error(format!(
                "{place}: url `{}` is not an http(s) URL; write where the notices go, such as `https://approvals.example.com/bindery`",
                w.url
            )));
        }
        let key = &w.signing_key.param;
        match spec.parameters.iter().find(|d| &d.name == key) {
            None => diags.push(Diagnostic::error(format!(
                "{place}: signingKey reads parameter `{key}`, which this agent does not declare; declare it (secret: true, scope: process)"
            ))),
            Some(d) if !d.secret || d.scope != Scope::Process => diags.push(Diagnostic::error(format!(
                "{place}: signingKey parameter `{key}` must be `secret: true` and `scope: process` (the operator's value, never a client's)"
            ))),
            Some(_) => {}
        }
    }
    if let Some(ttl) = spec
        .confirm_ttl
        .as_deref()
        .filter(|t| super::parse_ttl(t).is_none())
    {
        diags.push(Diagnostic::error(format!(
            "{here}: confirmTtl `{ttl}` is not a duration; write a number and a unit: `90s`, `15m`, `2h` or `1d`"
        )));
    }
    let price = spec.model.price().map(|(p, _)| p);
    super::budget::check(&spec.budgets, price.as_ref(), here, &mut diags);
    model_checks(&spec.model, here, &mut diags);
    for b in &spec.budgets {
        let Some(d) = &b.downgrade else { continue };
        let place = format!("{here}, budget `{}` downgrade", super::printable(&b.name));
        if b.tool_calls.is_some() {
            diags.push(Diagnostic::error(format!(
                "{place}: a budget of tool calls is not spent by the model; downgrade a `tokens` or `cost` budget"
            )));
        }
        if !(1..=99).contains(&d.at) {
            diags.push(Diagnostic::error(format!(
                "{place}: `at` is a percent of the limit from 1 to 99; got {}",
                d.at
            )));
        }
        if !spec.model.fallbacks.iter().any(|f| f.name == d.to) {
            diags.push(Diagnostic::error(format!(
                "{place}: `to: {}` names no model fallback; write the `name` of one of spec.model.fallbacks",
                super::printable(&d.to)
            )));
        }
    }
    if spec.model.fallbacks.len() > MAX_FALLBACKS {
        diags.push(Diagnostic::error(format!(
            "{here}: model has {} fallbacks; at most {MAX_FALLBACKS} (each is tried within the one request's deadline)",
            spec.model.fallbacks.len()
        )));
    }
    for (i, f) in spec.model.fallbacks.iter().enumerate() {
        let place = format!("{here}, model fallback {}", i + 1);
        model_checks(&f.as_model(), &place, &mut diags);
        if !super::http_url(&f.url) {
            diags.push(Diagnostic::error(format!(
                "{place}: url `{}` is not an http(s) URL; write the API's root, such as https://api.openai.com/v1",
                super::printable(&f.url)
            )));
        }
        if let Some(p) = &f.pricing {
            super::budget::check_pricing(p, &format!("{place} pricing"), &mut diags);
        }
        // What a fallback answers is counted at its own price, against
        // this agent's budgets and, for a helper, its caller's: a priced
        // model's fallbacks are priced, in the same currency.
        match (&price, f.as_model().price().map(|(p, _)| p)) {
            (Some(_), None) => diags.push(Diagnostic::error(format!(
                "{place} (`{}`): the model is priced, so every fallback is (what it answers counts against the budgets, a caller's too); give it `pricing` (Bindery's price table does not know it)",
                super::printable(&f.name)
            ))),
            (Some(m), Some(p)) if m.currency != p.currency => diags.push(Diagnostic::error(format!(
                "{place} (`{}`): priced in {}, the model in {}; budgets add costs in one currency: price it in {}",
                super::printable(&f.name),
                super::printable(&p.currency),
                super::printable(&m.currency),
                super::printable(&m.currency)
            ))),
            _ => {}
        }
    }
    for (i, h) in spec.helpers.iter().enumerate() {
        if h.agent.is_some() == h.path.is_some() {
            diags.push(Diagnostic::error(format!(
                "{here}, helper {}: give exactly one of `agent` (an agent by name) or `path` (an agent file)",
                i + 1
            )));
        }
        for (key, value) in &h.with {
            if let BindingValue::Param(p) = value {
                if !spec.parameters.iter().any(|d| &d.name == p) {
                    diags.push(Diagnostic::error(format!(
                        "{here}, helper {}: `with.{key}` reads parameter `{p}`, which this agent does not declare",
                        i + 1
                    )));
                }
            }
        }
    }
    diags
}

/// Every `when` of `selectors` compiles; an error names the selector and
/// where in its condition the mistake is.
fn check_conditions(
    selectors: &[super::ConfirmSelector],
    place: &str,
    diags: &mut Vec<Diagnostic>,
) {
    for s in selectors {
        let Some(when) = &s.when else { continue };
        if let Some(e) = super::condition::compile_error(when) {
            diags.push(Diagnostic::error(format!(
                "{place} `{}`: the condition `when: {when}` does not compile {e}; write a CEL expression over `args` and `params`, such as `args.amount > 100`",
                s.tool
            )));
        }
    }
}

/// The capabilities a builtin toolbox may offer (`env-vars` only with
/// its list of names, see [`env_var_refusal`]; `read-session` and
/// `get-session-stats` report the calling session only; `list-sessions`
/// and `search-sessions` reach its fork lineage only; `attach-file` reads
/// only what `fileSandbox` allows).
pub const BUILTIN_CAPABILITIES: [&str; 13] = [
    "date",
    "hostname",
    "operating-system",
    "working-directory",
    "running-user",
    "uptime",
    "process-info",
    "env-vars",
    "read-session",
    "get-session-stats",
    "list-sessions",
    "search-sessions",
    "attach-file",
];

/// The most sessions one `list-sessions` or `search-sessions` answer
/// holds, whatever `sessionMaxResults` says.
pub const SESSION_RESULTS_MAX: u32 = 1000;

/// The prefixes of the variables that set and pin process parameters
/// (`params::process` reads them).
pub const PARAM_ENV_PREFIXES: [&str; 2] = ["BINDERY_PARAM_", "BINDERY_PIN_"];

/// The environment variables the definition reads a value from: a
/// parameter's default, the model's API key, a toolbox's credential. Their
/// values are parameters or credentials, so `env-vars` never shows them.
pub fn env_sources(spec: &AgentSpec) -> BTreeSet<String> {
    use super::ValueSource;
    let mut out = BTreeSet::new();
    let mut add = |v: Option<&ValueSource>| {
        if let Some(ValueSource::Env(n)) = v {
            out.insert(n.clone());
        }
    };
    for d in &spec.parameters {
        add(d.default.as_ref());
    }
    for model in spec.model.chain() {
        add(model.api_key.as_ref());
        for source in model.bedrock.iter().flat_map(|b| b.sources()) {
            add(Some(source));
        }
    }
    let mut secrets = |list: &[super::OpenApiSecret]| {
        for s in list {
            if let SecretSource::Env(n) = &s.source {
                out.insert(n.clone());
            }
        }
    };
    for tb in &spec.toolboxes {
        match tb {
            Toolbox::Openapi(o) => secrets(&o.secrets),
            Toolbox::Postgrest(p) => secrets(&p.secrets),
            _ => {}
        }
    }
    out
}

/// The environment variables that carry the server's own credentials:
/// the tokens it accepts, the model's key, the store's URL (a password in
/// it), the session client's token, the trace exporter's headers. The one
/// list: `env-vars` never shows them (`check` refuses them by name), and
/// `serve` registers their values as live secrets, so a copy of one under
/// another name is withheld too and no log line carries it.
pub const SERVER_CREDENTIAL_ENV: [&str; 8] = [
    "BINDERY_OWNER_TOKEN",
    "BINDERY_APPROVER_TOKEN",
    "BINDERY_MCP_CLIENT_TOKEN",
    "BINDERY_MODEL_API_KEY",
    "BINDERY_STORE",
    "BINDERY_TOKEN",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
];

/// Parts of a variable's name that say it holds a credential, whoever set
/// it: a platform's own (`AWS_SECRET_ACCESS_KEY`, `GITHUB_TOKEN`,
/// `PGPASSWORD`, `clientsecret`) as much as Bindery's. Found anywhere in
/// the name, written together or apart.
const CREDENTIAL_PARTS: [&str; 8] = [
    "TOKEN",
    "SECRET",
    "PASSW",
    "APIKEY",
    "ACCESSKEY",
    "PRIVATEKEY",
    "CREDENTIAL",
    "WEBHOOK",
];

/// Words (between `_`) that say it too, only as whole words: `PASS` but
/// not `PASSPORT_OFFICE`'s, `PAT` but not `PATH`.
const CREDENTIAL_WORDS: [&str; 8] = [
    "PASS",
    "PWD",
    "PAT",
    "KEY",
    "KEYS",
    "AUTH",
    "AUTHORIZATION",
    "COOKIE",
];

/// Names whose value is a connection string that carries a password.
const CREDENTIAL_NAMES: [&str; 5] = [
    "DATABASE_URL",
    "REDIS_URL",
    "MONGODB_URI",
    "AMQP_URL",
    "KUBECONFIG",
];

/// Whether the variable `name` carries a credential by its name alone.
pub fn credential_env(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let joined = upper.replace(['_', '-'], "");
    SERVER_CREDENTIAL_ENV.contains(&upper.as_str())
        || CREDENTIAL_NAMES.contains(&upper.as_str())
        || upper.ends_with("_DSN")
        || upper.ends_with("_PROXY")
        || CREDENTIAL_PARTS.iter().any(|p| joined.contains(p))
        || upper
            .split('_')
            .any(|w| CREDENTIAL_WORDS.contains(&w) && !matches!(upper.as_str(), "PWD" | "OLDPWD"))
}

/// Whether a request header carries a credential by its name
/// (`Authorization`, `Cookie`, `X-Api-Key`, …).
pub fn credential_header(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let joined = upper.replace(['-', '_'], "");
    credential_env(&name.replace('-', "_"))
        || HEADER_CREDENTIAL_PARTS.iter().any(|p| joined.contains(p))
        || upper
            .split(['-', '_'])
            .any(|w| HEADER_CREDENTIAL_WORDS.contains(&w))
}

/// Parts of a header's name that say it carries a credential, beyond a
/// variable's: `X-Authentication`, `X-Jwt`, `Session`, `X-AppKey`,
/// `X-Passcode`, …. A header is not a variable: a false alarm here only
/// asks for it to be given as a secret.
const HEADER_CREDENTIAL_PARTS: [&str; 10] = [
    "AUTH",
    "JWT",
    "SESSION",
    "SIGNATURE",
    "BEARER",
    "CSRF",
    "XSRF",
    "KEY",
    "PASS",
    "HMAC",
];

/// Short words that say it only as a whole word (`X-Sid`, not `X-Side`).
const HEADER_CREDENTIAL_WORDS: [&str; 5] = ["SID", "OTP", "PIN", "SIG", "MAC"];

/// Whether a variable's value carries a credential by its form: a URL
/// with a password in it (`scheme://user:password@host`).
pub fn credential_value(value: &str) -> bool {
    value.split("://").skip(1).any(|rest| {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        authority
            .rsplit_once('@')
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    })
}

/// Why `env-vars` may not show the variable `name` (of an agent whose
/// definition reads `sources`), or `None` when it may.
pub fn env_var_refusal(name: &str, sources: &BTreeSet<String>) -> Option<String> {
    let [set, pin] = PARAM_ENV_PREFIXES;
    if name.starts_with(set) || name.starts_with(pin) {
        return Some(format!(
            "`{name}` holds a parameter's value (a {set}*/{pin}* variable); bind the parameter to a tool argument instead"
        ));
    }
    if sources.contains(name) {
        return Some(format!(
            "`{name}` is where this agent reads a parameter's or credential's value from; declare a parameter and bind it to a tool argument instead"
        ));
    }
    if credential_env(name) {
        return Some(format!(
            "`{name}`: by its name it holds a credential (the server's own, or one the platform set); a tool that needs it gets it as a secret parameter bound to its argument, never through `env-vars`"
        ));
    }
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    (!valid).then(|| {
        format!("`{name}` is not a variable name: list exact names (letters, digits and `_`), no patterns")
    })
}

/// `attach-file` reads only what `fileSandbox` allows: without one (or
/// with one that denies everything) it loads, as in agents-exe, but no file
/// can be attached.
fn check_sandbox(b: &BuiltinToolbox, place: &str, diags: &mut Vec<Diagnostic>) {
    let attaches = b.capabilities.iter().any(|c| c == "attach-file");
    match &b.file_sandbox {
        Some(_) if !attaches => diags.push(Diagnostic::warning(format!(
            "{place}: `fileSandbox` is given but capability `attach-file` is not listed; it has no effect"
        ))),
        None if attaches => diags.push(Diagnostic::warning(format!(
            "{place}: capability `attach-file` without `fileSandbox` (agents-exe's `FileSandbox`) denies every file; give one, e.g. {{\"predicate\": {{\"directoryRecursive\": \"./shared\"}}}}"
        ))),
        Some(s) if attaches && s.predicate.denies_all() => diags.push(Diagnostic::warning(format!(
            "{place}: `fileSandbox` denies every file: `attach-file` can attach none"
        ))),
        _ => {}
    }
}

fn check_builtin(spec: &AgentSpec, b: &BuiltinToolbox, place: &str, diags: &mut Vec<Diagnostic>) {
    if !valid_mcp_name(&b.name) {
        diags.push(Diagnostic::error(format!(
            "{place}: a builtin toolbox's `name` is its tool's name (`io_<name>`): use 1 to 32 letters, digits, `_` and `-`"
        )));
    }
    if b.capabilities.is_empty() {
        diags.push(Diagnostic::error(format!(
            "{place}: list at least one capability ({})",
            BUILTIN_CAPABILITIES.join(", ")
        )));
    }
    for c in &b.capabilities {
        if BUILTIN_CAPABILITIES.contains(&c.as_str()) {
            continue;
        }
        diags.push(Diagnostic::error(format!(
            "{place}: capability `{c}`: no such capability; the capabilities are {}",
            BUILTIN_CAPABILITIES.join(", ")
        )));
    }
    check_session_reach(b, place, diags);
    check_sandbox(b, place, diags);
    let env = b.capabilities.iter().any(|c| c == "env-vars");
    if env && b.env_vars.is_empty() {
        diags.push(Diagnostic::error(format!(
            "{place}: capability `env-vars` needs the list of variables it may show (`envVars`, or agents-exe's `envVarFilter`): without one it would show the whole environment, parameter values and tokens included"
        )));
    }
    if !env && !b.env_vars.is_empty() {
        diags.push(Diagnostic::error(format!(
            "{place}: `envVars` is given but capability `env-vars` is not listed; add it or remove `envVars`"
        )));
    }
    let sources = env_sources(spec);
    for name in &b.env_vars {
        if let Some(why) = env_var_refusal(name, &sources) {
            diags.push(Diagnostic::error(format!(
                "{place}: `env-vars` may not show {why}"
            )));
        }
    }
}

/// `sessionScope` and `sessionMaxResults`: the lineage is as far as
/// `list-sessions` and `search-sessions` ever reach.
fn check_session_reach(b: &BuiltinToolbox, place: &str, diags: &mut Vec<Diagnostic>) {
    let reaches = b
        .capabilities
        .iter()
        .any(|c| c == "list-sessions" || c == "search-sessions");
    if reaches && b.session_scope == super::SessionScope::All {
        diags.push(Diagnostic::warning(format!(
            "{place}: session scope `all` (agents-exe's `SessionIntrospectionScope`) reaches the calling session's fork lineage only (the sessions it was forked from and those forked from it), as `subtree`: Bindery never lists or searches another session of the server, whoever holds it; write `subtree` to silence this warning"
        )));
    }
    match b.session_max_results {
        Some(0) => diags.push(Diagnostic::error(format!(
            "{place}: `sessionMaxResults` (agents-exe's `SessionIntrospectionMaxResults`) is at least 1"
        ))),
        Some(n) if n > SESSION_RESULTS_MAX => diags.push(Diagnostic::warning(format!(
            "{place}: `sessionMaxResults` is {n}; an answer holds at most {SESSION_RESULTS_MAX} sessions"
        ))),
        _ => {}
    }
}

fn check_sqlite(q: &super::SqliteToolbox, place: &str, diags: &mut Vec<Diagnostic>) {
    if !valid_mcp_name(&q.name) {
        diags.push(Diagnostic::error(format!(
            "{place}: an SQLite toolbox's `name` is its tool's name (`sqlite_<name>`): use 1 to 32 letters, digits, `_` and `-`"
        )));
    }
    if q.path.trim().is_empty() {
        diags.push(Diagnostic::error(format!(
            "{place}: `path` is empty; give the database file (relative to the agent file)"
        )));
    }
    if q.max_rows == Some(0) || q.timeout_seconds == Some(0) {
        diags.push(Diagnostic::error(format!(
            "{place}: `maxRows` and `timeoutSeconds` are at least 1"
        )));
    }
}

fn check_postgrest(p: &PostgrestToolbox, place: &str, diags: &mut Vec<Diagnostic>) {
    if !valid_mcp_name(&p.name) {
        diags.push(Diagnostic::error(format!(
            "{place}: a PostgREST toolbox's `name` is part of its tools' names (`postgrest_<name>_<method>_<table>`): use 1 to 32 letters, digits, `_` and `-`"
        )));
    }
    for m in &p.allowed_methods {
        if !["GET", "POST", "PATCH", "DELETE"].contains(&m.as_str()) {
            diags.push(Diagnostic::error(format!(
                "{place}: `allowedMethods` holds `{m}`; give GET, POST, PATCH or DELETE (upper case)"
            )));
        }
    }
}

/// An MCP server's name, as it appears in `mcp_<name>_<tool>`.
pub fn valid_mcp_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The checks of one MCP toolbox (part of [`check_definition`]).
pub fn check_mcp(spec: &AgentSpec, m: &McpToolbox, place: &str, diags: &mut Vec<Diagnostic>) {
    if !valid_mcp_name(&m.name) {
        diags.push(Diagnostic::error(format!(
            "{place}: an MCP server's `name` is part of its tools' names (`mcp_<name>_<tool>`): use 1 to 32 letters, digits, `_` and `-`"
        )));
    }
    let twice = spec
        .toolboxes
        .iter()
        .filter(|t| matches!(t, Toolbox::Mcp(o) if o.name == m.name))
        .count();
    if twice > 1 {
        diags.push(Diagnostic::error(format!(
            "{place}: two MCP servers of this agent are named `{}`; their tools would share names",
            m.name
        )));
    }
    match (m.command.is_empty(), &m.url) {
        (false, None) => {
            if m.command[0].is_empty() {
                diags.push(Diagnostic::error(format!(
                    "{place}: `command` starts with the program to run, not an empty string"
                )));
            }
            if !m.headers.is_empty() {
                diags.push(Diagnostic::error(format!(
                    "{place}: `headers` are for a remote server (`url`); a program started with `command` gets `env`"
                )));
            }
        }
        (true, Some(url)) => {
            if !super::http_url(url) {
                diags.push(Diagnostic::error(format!(
                    "{place}: `url` must be an http:// or https:// URL, got `{url}`"
                )));
            }
            if !m.env.is_empty() {
                diags.push(Diagnostic::error(format!(
                    "{place}: `env` is for a program started with `command`; a remote server (`url`) gets `headers`"
                )));
            }
        }
        _ => diags.push(Diagnostic::error(format!(
            "{place}: give exactly one of `command` (a program and its arguments, run over stdio) or `url` (a streamable-HTTP server)"
        ))),
    }
    for key in m.env.keys() {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            diags.push(Diagnostic::error(format!(
                "{place}, env `{key}`: not a valid environment variable name"
            )));
        }
    }
    for key in m.headers.keys() {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if key.is_empty() || !key.chars().all(token) {
            diags.push(Diagnostic::error(format!(
                "{place}, header `{key}`: not a valid header name"
            )));
        }
    }
    check_shared_values(spec, &m.env, &format!("{place}, env"), Shared::Env, diags);
    // A remote server's headers may take an end user's values: the toolbox
    // then connects once per person (see `McpToolbox::per_user`).
    let headers = match m.url {
        Some(_) => Shared::PerUser,
        None => Shared::Server,
    };
    check_shared_values(
        spec,
        &m.headers,
        &format!("{place}, header"),
        headers,
        diags,
    );
    if m.per_user() && !m.shared_tool_list {
        diags.push(Diagnostic::error(format!(
            "{place}: its `headers` take an end user's value, so it connects once per person, and its tools are listed through one person's connection and shown to every person's model; a server whose tool list holds a person's data (their projects in a schema, say) would show it to others. Set `sharedToolList: true` if this server lists the same tools for everyone (per-person tool lists are not offered)"
        )));
    }
    if !m.per_user() && m.shared_tool_list {
        diags.push(Diagnostic::error(format!(
            "{place}: `sharedToolList` is for a remote server whose `headers` take an end user's value (`{{identity: …}}`); this one connects once for every session"
        )));
    }
    if let Some(oauth) = &m.oauth {
        check_mcp_oauth(spec, m, oauth, place, diags);
    }
}

/// Whether `url`'s host is this machine (`localhost`, 127.0.0.0/8, `::1`):
/// the one place plain http may carry a token. Pure.
pub fn loopback_url(url: &str) -> bool {
    let Some(rest) = url
        .split_once("://")
        .map(|(_, r)| r.split(['/', '?', '#']).next().unwrap_or(""))
    else {
        return false;
    };
    let host_port = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    let host = host.to_ascii_lowercase();
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `url` may carry a token or a credential: https, or http to this machine.
pub fn secure_url(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
        || (super::http_url(url) && loopback_url(url))
}

/// An MCP server's `oauth`: what each grant needs, values read at load.
fn check_mcp_oauth(
    spec: &AgentSpec,
    m: &McpToolbox,
    o: &super::McpOAuth,
    place: &str,
    diags: &mut Vec<Diagnostic>,
) {
    use super::{OAuthGrant, TokenEndpointAuth};
    let here = format!("{place}, oauth");
    let mut error = |text: String| diags.push(Diagnostic::error(format!("{here}: {text}")));
    match &m.url {
        None => error("OAuth is for a remote server: give `url`, not `command`".into()),
        Some(url) if !secure_url(url) => error(format!(
            "`url` must be https:// (or http:// to this machine) when the server gets OAuth tokens, got `{}`",
            egress_shown(url)
        )),
        Some(_) => {}
    }
    if m.headers
        .keys()
        .any(|k| k.eq_ignore_ascii_case("authorization"))
    {
        error(
            "a `headers` entry `Authorization` would replace the OAuth token; remove one of them"
                .into(),
        );
    }
    if m.per_user() && o.grant == OAuthGrant::AuthorizationCode {
        error(
            "`grant: authorization-code` on a server whose `headers` take an end user's value is not offered (a person's consent per connection is not built yet): send the person's exchanged token in `headers` instead, or use `grant: client-credentials`"
                .into(),
        );
    }
    let auth = o.token_endpoint_auth;
    match auth {
        Some(TokenEndpointAuth::PrivateKeyJwt) if o.private_key.is_none() => {
            error("`tokenEndpointAuth: private_key_jwt` signs with `privateKey`: give it".into())
        }
        Some(TokenEndpointAuth::ClientSecretBasic | TokenEndpointAuth::ClientSecretPost)
            if o.client_secret.is_none() =>
        {
            error(format!(
                "`tokenEndpointAuth: {}` sends `clientSecret`: give it",
                auth.map_or("", |a| a.as_str())
            ))
        }
        Some(TokenEndpointAuth::None) if o.client_secret.is_some() || o.private_key.is_some() => {
            error("`tokenEndpointAuth: none` sends no credential: remove `clientSecret` and `privateKey`, or choose how to send them".into())
        }
        _ => {}
    }
    if o.client_secret.is_some() && o.private_key.is_some() {
        error("give `clientSecret` or `privateKey`, not both".into());
    }
    if o.signing_algorithm.is_some() && o.private_key.is_none() {
        error("`signingAlgorithm` is for `privateKey`: give the key, or remove it".into());
    }
    if (o.client_secret.is_some() || o.private_key.is_some()) && o.client_id.is_none() {
        error(
            "a `clientSecret` or `privateKey` belongs to a registered client: give its `clientId`"
                .into(),
        );
    }
    if let Some(i) = &o.issuer {
        if !secure_url(i) || i.contains('#') || i.contains('?') {
            error(format!(
                "`issuer` must be an https:// URL (or http:// to this machine) without a query or fragment, got `{}`",
                egress_shown(i)
            ));
        }
    }
    match o.grant {
        OAuthGrant::ClientCredentials => {
            if o.client_id.is_none() {
                error("`grant: client-credentials` needs the registered `clientId`".into());
            }
            if o.client_secret.is_none() && o.private_key.is_none() {
                error("`grant: client-credentials` authenticates the client: give `clientSecret` or `privateKey`".into());
            }
            if o.redirect_uri.is_some() || o.client_metadata_url.is_some() {
                error(
                    "`redirectUri` and `clientMetadataUrl` are for `grant: authorization-code`"
                        .into(),
                );
            }
        }
        OAuthGrant::AuthorizationCode => {
            if let Some(r) = &o.redirect_uri {
                if !super::http_url(r) || r.contains('#') {
                    error(format!(
                        "`redirectUri` must be an http:// or https:// URL without a fragment, got `{}`",
                        egress_shown(r)
                    ));
                }
            }
            if let Some(c) = &o.client_metadata_url {
                let path = c
                    .split_once("://")
                    .map_or("", |(_, r)| r.split_once('/').map_or("", |(_, p)| p));
                if !c
                    .get(..8)
                    .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
                    || path.is_empty()
                {
                    error(format!(
                        "`clientMetadataUrl` must be an https:// URL with a path (it is the client id), got `{}`",
                        egress_shown(c)
                    ));
                }
            }
        }
    }
    for s in &o.scopes {
        if s.is_empty()
            || s.chars()
                .any(|c| c.is_whitespace() || c == '"' || c == '\\')
        {
            error(format!(
                "scope `{}`: a scope is one word, without spaces or quotes",
                super::printable(s)
            ));
        }
    }
    check_shared_values(spec, &o.values(), &here, Shared::Server, diags);
}

/// A URL as a diagnostic shows it: no user, password or query.
fn egress_shown(url: &str) -> String {
    let cut = url.split(['?', '#']).next().unwrap_or("");
    let cut = match cut.split_once("://") {
        Some((scheme, rest)) => {
            let (auth, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
            let host = auth.rsplit_once('@').map_or(auth, |(_, h)| h);
            if path.is_empty() {
                format!("{scheme}://{host}")
            } else {
                format!("{scheme}://{host}/{path}")
            }
        }
        None => cut.to_string(),
    };
    super::printable(&cut)
}

/// Values of an MCP server's `env` or `headers`: read once, when the server
/// starts, and shared by every session, so only literals and process-scope
/// parameters; text, since both carry text.
/// Who the values of an MCP server's map serve.
#[derive(Clone, Copy, PartialEq)]
enum Shared {
    /// A program's `env`: one process for every session.
    Env,
    /// Values read once, at load (`oauth`'s, a command server's headers).
    Server,
    /// A remote server's `headers`: an end user's value makes the toolbox
    /// connect once per person.
    PerUser,
}

fn check_shared_values(
    spec: &AgentSpec,
    values: &BTreeMap<String, BindingValue>,
    what: &str,
    shared: Shared,
    diags: &mut Vec<Diagnostic>,
) {
    for (key, value) in values {
        let here = format!("{what} `{key}`");
        match value {
            BindingValue::Literal(l @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) => {
                diags.push(Diagnostic::error(format!(
                    "{here}: the literal is {}; give a string, number or boolean",
                    super::json_kind(l)
                )))
            }
            BindingValue::Literal(_) => {}
            BindingValue::Param(p) => match spec.parameters.iter().find(|d| &d.name == p) {
                None => diags.push(Diagnostic::error(format!(
                    "{here}: parameter `{p}` is not declared by this agent"
                ))),
                Some(d) if d.scope != Scope::Process => diags.push(Diagnostic::error(format!(
                    "{here}: parameter `{p}` is {}-scope, but the MCP server is started once, when the agent loads, and shared by every session, so it can only get a literal or a process-scope parameter; declare `{p}` with `scope: process`, or bind the value to a tool argument instead",
                    d.scope.as_str()
                ))),
                Some(_) => {}
            },
            BindingValue::Identity(_) if shared == Shared::PerUser => {}
            BindingValue::Identity(i) if shared == Shared::Env => diags.push(Diagnostic::error(format!(
                "{here}: {} differs from person to person, but a program started with `command` is one process shared by every session (one process per person is not offered); give a remote server (`url`) the value in `headers`, which connects once per person, or bind it to a tool argument instead",
                i.describe()
            ))),
            BindingValue::Identity(i) => diags.push(Diagnostic::error(format!(
                "{here}: {} differs from session to session, but the MCP server is started once and shared by every session, so it can only get a literal or a process-scope parameter; bind it to a tool argument instead",
                i.describe()
            ))),
        }
    }
}

fn check_openapi(spec: &AgentSpec, o: &OpenApiToolbox, place: &str, diags: &mut Vec<Diagnostic>) {
    if !super::http_url(&o.base_url) {
        diags.push(Diagnostic::error(format!(
            "{place}: `baseUrl` must be an http:// or https:// URL, got `{}`",
            o.base_url
        )));
    }
    let fetched = super::http_url(&o.spec);
    for (name, value) in &o.headers {
        let here = format!("{place}, header `{name}`");
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            diags.push(Diagnostic::error(format!(
                "{here}: not a valid header name (letters, digits and `-`)"
            )));
        } else if credential_header(name) {
            diags.push(Diagnostic::error(format!(
                "{here}: by its name it carries a credential, which `headers` would show to anyone who reads the agent; give it as a secret instead (`secrets: [{{source: …, header: {{name: {name}}}}}]`), never shown or logged"
            )));
        }
        if value.chars().any(|c| c.is_control()) {
            diags.push(Diagnostic::error(format!(
                "{here}: the value holds a control character (a line break?), which no header may"
            )));
        }
        if credential_value(value) {
            diags.push(Diagnostic::error(format!(
                "{here}: the value is a URL with a password in it; give the header as a secret instead"
            )));
        }
    }
    for (i, s) in o.secrets.iter().enumerate() {
        let here = format!("{place}, secret {} ({})", i + 1, s.source.describe());
        match (&s.header, &s.query) {
            (Some(h), None) if h.name.is_empty() => diags.push(Diagnostic::error(format!(
                "{here}: the header needs a `name`"
            ))),
            (Some(_), None) => {}
            (None, Some(q)) if q.is_empty() => diags.push(Diagnostic::error(format!(
                "{here}: `query` needs a parameter name"
            ))),
            (None, Some(_)) => {}
            _ => diags.push(Diagnostic::error(format!(
                "{here}: give exactly one of `header` ({{name, template}}) or `query` (a parameter name)"
            ))),
        }
        if let Some(t) = s.header.as_ref().and_then(|h| h.template.as_ref()) {
            if !t.contains("{{secret}}") {
                diags.push(Diagnostic::error(format!(
                    "{here}: the header template must contain `{{{{secret}}}}` where the secret goes"
                )));
            }
        }
        if s.fetch_spec && !fetched {
            diags.push(Diagnostic::warning(format!(
                "{here}: `fetchSpec` has no effect: `spec` is a file, not an http(s) URL"
            )));
        }
        if let SecretSource::Identity(id) = &s.source {
            if s.decode.is_some() || s.keep_whitespace {
                diags.push(Diagnostic::error(format!(
                    "{here}: `decode` and `keepWhitespace` apply to a value read when the agent loads, not to {}, which comes with each session",
                    id.describe()
                )));
            }
            if s.fetch_spec && fetched {
                diags.push(Diagnostic::error(format!(
                    "{here}: the spec is fetched once, when the agent loads, before any end user is there, so its credential cannot be {}; use a process-scope parameter or a value source",
                    id.describe()
                )));
            }
            continue;
        }
        let SecretSource::Param(p) = &s.source else {
            continue;
        };
        if s.decode.is_some() || s.keep_whitespace {
            diags.push(Diagnostic::error(format!(
                "{here}: `decode` and `keepWhitespace` apply to a value read when the agent loads, not to parameter `{p}`, which a client gives as it is"
            )));
        }
        match spec.parameters.iter().find(|d| &d.name == p) {
            None => diags.push(Diagnostic::error(format!(
                "{here}: parameter `{p}` is not declared by this agent"
            ))),
            Some(d) if s.fetch_spec && fetched && d.scope != Scope::Process => {
                diags.push(Diagnostic::error(format!(
                    "{here}: the spec is fetched once, when the agent loads, before any session exists, so a credential for fetching it cannot come from {}-scope parameter `{p}`; use a process-scope parameter or a value source (env, file, command, apiKey) for it",
                    d.scope.as_str()
                )))
            }
            Some(_) => {}
        }
    }
}

fn check_bindings(
    spec: &AgentSpec,
    bindings: &[Binding],
    place: &str,
    diags: &mut Vec<Diagnostic>,
) {
    for (i, b) in bindings.iter().enumerate() {
        let glob = b.tool.as_deref().unwrap_or("*");
        let here = format!(
            "{place}, binding {} (tool \"{glob}\", arg \"{}\")",
            i + 1,
            b.arg
        );
        if let BindingValue::Identity(id) = &b.value {
            if b.when_unbound == WhenUnbound::Expose {
                diags.push(Diagnostic::error(format!(
                    "{here}: `whenUnbound: expose` on {} would let the model give it in a session no end user owns (the owner's), and so choose whose it is; use fail or omit",
                    id.describe()
                )));
            }
            continue;
        }
        let BindingValue::Param(p) = &b.value else {
            continue;
        };
        match spec.parameters.iter().find(|d| &d.name == p) {
            None => {
                let declared: Vec<&str> = spec.parameters.iter().map(|d| d.name.as_str()).collect();
                diags.push(Diagnostic::error(format!(
                    "{here}: parameter `{p}` is not declared by this agent ({})",
                    if declared.is_empty() {
                        "it declares no parameters".to_string()
                    } else {
                        format!("declared: {}", declared.join(", "))
                    }
                )));
            }
            Some(d) if d.secret && b.when_unbound == WhenUnbound::Expose => {
                diags.push(Diagnostic::error(format!(
                    "{here}: `whenUnbound: expose` on secret parameter `{p}` would let the model type the secret in plain text; use fail or omit"
                )));
            }
            Some(_) => {}
        }
    }
}

/// Why an agent definition sent over the API (`PUT /v1/agents/:slug`)
/// may not be kept, one reason per offending place; empty when it may.
///
/// An API client chooses the whole definition, so nothing in it may make
/// the server run code, read its files or environment, or hand on a
/// value the server holds: only toolboxes that reach out over HTTP
/// (OpenAPI and PostgREST by URL, MCP by URL), that the client runs
/// itself (deferred), or builtins that report no secret; no helper, no
/// model API key, no value read from the server, and no credential
/// written into the definition (it would be stored in clear).
pub fn stored_agent_refusals(spec: &AgentSpec) -> Vec<String> {
    use super::ValueSource;
    let mut out = Vec::new();
    let is_url = super::http_url;
    for d in &spec.parameters {
        match &d.default {
            Some(ValueSource::Value(_)) if d.secret => out.push(format!(
                "parameter `{}`: a secret's value may not be written into a stored agent (it would be kept in clear); give it per session instead",
                d.name
            )),
            Some(ValueSource::Value(_)) | None => {}
            Some(other) => out.push(format!(
                "parameter `{}`: its default is read from the server ({}); a stored agent's values come from its sessions: remove the default",
                d.name,
                other.describe()
            )),
        }
        if d.scope == Scope::Process && d.default.is_none() {
            out.push(format!(
                "parameter `{}`: process scope would read the server's own values; use session or message scope",
                d.name
            ));
        }
    }
    if spec.model.api_key.is_some() {
        out.push("model `apiKey`: a stored agent uses no key of its own (one written in would be kept in clear, one of the server's would go to a URL the client chose); serve with --model-url and BINDERY_MODEL_API_KEY, or use a model that needs no key".to_string());
    }
    for (i, f) in spec.model.fallbacks.iter().enumerate() {
        if f.api_key.is_some() {
            out.push(format!(
                "model fallback {} `apiKey`: a stored agent uses no key of its own, a fallback's neither (one written in would be kept in clear, one of the server's would go to a URL the client chose); remove it",
                i + 1
            ));
        }
    }
    for (place, model) in std::iter::once(("model".to_string(), spec.model.clone())).chain(
        spec.model
            .fallbacks
            .iter()
            .enumerate()
            .map(|(i, f)| (format!("model fallback {}", i + 1), f.as_model())),
    ) {
        use super::provider::Provider;
        if matches!(model.provider, Provider::Bedrock | Provider::AzureOpenAi) {
            out.push(format!(
                "{place}: provider `{}` signs with the server's own cloud identity (or keys), which a stored agent may not send to a URL its client chose; put the agent in a file the server loads",
                model.provider.name()
            ));
        }
    }
    if !spec.helpers.is_empty() {
        out.push("helpers: a stored agent has none (a helper by path reads the server's files); store the helper as an agent of its own and call it from the client".to_string());
    }
    let secrets = |list: &[super::OpenApiSecret], place: &str, out: &mut Vec<String>| {
        for s in list {
            if !matches!(s.source, SecretSource::Param(_) | SecretSource::Identity(_)) {
                out.push(format!(
                    "{place}: a credential from {} is read from the server or kept in clear; take it from a secret parameter (`param`) given per session",
                    match &s.source {
                        SecretSource::Value(_) => "a written-in `value`".to_string(),
                        SecretSource::Env(v) => format!("env {v}"),
                        SecretSource::File(f) => format!("file {f}"),
                        SecretSource::Command(_) => "a command".to_string(),
                        SecretSource::ApiKey(k) => format!("api-key {k}"),
                        SecretSource::Param(_) | SecretSource::Identity(_) => String::new(),
                    }
                ));
            }
        }
    };
    for (i, tb) in spec.toolboxes.iter().enumerate() {
        let place = toolbox_label(i, tb);
        match tb {
            Toolbox::Bash(_) => out.push(format!(
                "{place}: a bash toolbox runs executables on the server, and a stored agent's are chosen by an API client; put the agent in a file the server loads, or use an OpenAPI or MCP-by-URL toolbox"
            )),
            Toolbox::Sqlite(_) => out.push(format!(
                "{place}: an SQLite toolbox reads a file on the server; put the agent in a file the server loads, or serve the data over PostgREST"
            )),
            Toolbox::Mcp(m) => {
                if m.url.is_none() {
                    out.push(format!(
                        "{place}: an MCP server started as a program runs on the server; give its `url` instead"
                    ));
                }
                if !m.headers.is_empty() {
                    out.push(format!(
                        "{place}: `headers` would be kept in clear in the store (and may read the server's process parameters); a stored agent reaches MCP servers that need no header"
                    ));
                }
            }
            Toolbox::Openapi(o) => {
                if !is_url(&o.spec) {
                    out.push(format!(
                        "{place}: `spec` must be an http(s) URL (a path would read the server's files)"
                    ));
                }
                secrets(&o.secrets, &place, &mut out);
            }
            Toolbox::Postgrest(p) => {
                if p.spec.as_deref().is_some_and(|s| !is_url(s)) {
                    out.push(format!(
                        "{place}: `spec` must be an http(s) URL (a path would read the server's files)"
                    ));
                }
                secrets(&p.secrets, &place, &mut out);
            }
            Toolbox::Builtin(b) => {
                if b.capabilities.iter().any(|c| c == "env-vars") {
                    out.push(format!(
                        "{place}: capability `env-vars` would show the server's environment to an agent an API client defined; remove it"
                    ));
                }
                if b.capabilities.iter().any(|c| c == "attach-file") {
                    out.push(format!(
                        "{place}: capability `attach-file` would read the server's files for an agent an API client defined; remove it (and `fileSandbox`)"
                    ));
                }
            }
            Toolbox::Deferred(_) => {}
        }
    }
    out
}

/// The most fallbacks a model has.
pub const MAX_FALLBACKS: usize = 8;
/// The longest model name.
const MAX_MODEL_NAME: usize = 256;

/// What a model's provider takes: thinking only where the API has it,
/// within the reply's tokens and above the API's least budget; a flavour
/// is a dialect of chat completions only.
fn model_checks(model: &super::ModelSpec, here: &str, diags: &mut Vec<Diagnostic>) {
    use super::provider::{Provider, MIN_THINKING_BUDGET};
    let provider = model.provider;
    if model.name.is_empty()
        || model.name.len() > MAX_MODEL_NAME
        || model.name.chars().any(char::is_control)
    {
        diags.push(Diagnostic::error(format!(
            "{here}: model name must be 1 to {MAX_MODEL_NAME} characters, none of them a control character (it names the model in every request, metric and report)"
        )));
    }
    if super::flavor::Flavor::parse(&model.flavor).is_none() {
        diags.push(Diagnostic::error(format!(
            "{here}: model flavor `{}` is not one Bindery speaks (it changes what each request sends); write one of {}",
            super::printable(&model.flavor),
            super::flavor::FLAVORS
        )));
    }
    if model.max_tokens == Some(0) {
        diags.push(Diagnostic::error(format!(
            "{here}: model maxTokens is 0: every request would be refused; give at least 1, or leave it out"
        )));
    }
    let flavor = super::flavor::Flavor::parse(&model.flavor).unwrap_or_default();
    if let (Some(budget), Some(max)) = (flavor.thinking_budget(), model.max_tokens) {
        if max <= budget {
            diags.push(Diagnostic::error(format!(
                "{here}: model flavor `{}` asks for {budget} tokens of thinking, which must be less than maxTokens ({max}); raise maxTokens or remove it",
                model.flavor
            )));
        }
    }
    if !provider.speaks_chat_completions() && flavor != Default::default() {
        diags.push(Diagnostic::error(format!(
            "{here}: model flavor `{}` is a dialect of OpenAI's chat completions, and provider `{}` is not them; remove `flavor`",
            model.flavor,
            provider.name()
        )));
    }
    if model.url.contains(['?', '#']) {
        diags.push(Diagnostic::error(format!(
            "{here}: model url {} has a query or a fragment; each request adds its path to the url, so give the API's root alone (Azure's api-version goes in `azure.apiVersion`)",
            super::printable(&url_before_query(&model.url))
        )));
    }
    let authority = model
        .url
        .split("://")
        .nth(1)
        .and_then(|r| r.split(['/', '?', '#']).next())
        .unwrap_or("");
    if authority.contains('@') {
        diags.push(Diagnostic::error(format!(
            "{here}: model url has a user or password before its host; a credential goes in `apiKey` (a URL's would be sent as Basic authorization, and shown wherever the URL is)"
        )));
    }
    provider_settings_checks(model, here, diags);
    let Some(thinking) = &model.thinking else {
        return;
    };
    if !provider.takes_thinking() {
        diags.push(Diagnostic::error(format!(
            "{here}: model thinking is a thinking budget, and provider `{}` takes none (anthropic, bedrock and gemini do); remove `thinking`",
            provider.name()
        )));
        return;
    }
    if thinking.budget_tokens < MIN_THINKING_BUDGET {
        diags.push(Diagnostic::error(format!(
            "{here}: model thinking.budgetTokens {} is below the least Bindery sends, {MIN_THINKING_BUDGET} (Anthropic's)",
            thinking.budget_tokens
        )));
    }
    if provider == Provider::Bedrock && model.max_tokens.is_none() {
        diags.push(Diagnostic::error(format!(
            "{here}: model thinking on bedrock needs maxTokens (more than thinking.budgetTokens): the model's own default may be below the budget"
        )));
        return;
    }
    let max = model
        .max_tokens
        .or(provider.default_max_tokens())
        .unwrap_or(u32::MAX);
    if thinking.budget_tokens >= max {
        diags.push(Diagnostic::error(format!(
            "{here}: model thinking.budgetTokens {} must be less than maxTokens ({max}{}): the thinking is part of the reply",
            thinking.budget_tokens,
            if model.max_tokens.is_none() { ", the default" } else { "" }
        )));
    }
}

/// `url` up to its query, for a message (a query may hold a credential).
fn url_before_query(url: &str) -> String {
    url.split(['?', '#']).next().unwrap_or("").to_owned() + "?..."
}

/// The provider's own settings: `bedrock` and `azure` only with their
/// provider; Bedrock's region known and its keys whole; and the pod's
/// cloud identity sent only to its cloud (or loopback).
fn provider_settings_checks(model: &super::ModelSpec, here: &str, diags: &mut Vec<Diagnostic>) {
    use super::provider::{ambient_credential_may_reach, Provider};
    let provider = model.provider;
    if model.bedrock.is_some() && provider != Provider::Bedrock {
        diags.push(Diagnostic::error(format!(
            "{here}: model `bedrock` settings are for provider bedrock, and the provider is `{}`; remove them or set `provider: bedrock`",
            provider.name()
        )));
    }
    if model.azure.is_some() && provider != Provider::AzureOpenAi {
        diags.push(Diagnostic::error(format!(
            "{here}: model `azure` settings are for provider azure-openai, and the provider is `{}`; remove them or set `provider: azure-openai`",
            provider.name()
        )));
    }
    let segment_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let ambient = match provider {
        Provider::Bedrock => {
            let settings = model.bedrock.clone().unwrap_or_default();
            match settings.region_of(&model.url) {
                None => diags.push(Diagnostic::error(format!(
                    "{here}: model url {} names no AWS region (bedrock-runtime.REGION.amazonaws.com); give `bedrock: {{region: …}}`",
                    super::printable(&model.url)
                ))),
                Some(r) if !segment_ok(&r) || r.contains('.') => {
                    diags.push(Diagnostic::error(format!(
                        "{here}: model bedrock.region `{}` is not an AWS region name (like us-east-1)",
                        super::printable(&r)
                    )))
                }
                Some(_) => {}
            }
            let keys = (
                settings.access_key_id.is_some(),
                settings.secret_access_key.is_some(),
            );
            if keys.0 != keys.1 {
                diags.push(Diagnostic::error(format!(
                    "{here}: model bedrock gives one of accessKeyId and secretAccessKey; give both, or neither to sign with the pod's identity"
                )));
            }
            if settings.session_token.is_some() && !keys.0 {
                diags.push(Diagnostic::error(format!(
                    "{here}: model bedrock.sessionToken goes with accessKeyId and secretAccessKey; give them too"
                )));
            }
            if model.api_key.is_some() && (keys.0 || keys.1) {
                diags.push(Diagnostic::error(format!(
                    "{here}: model has both `apiKey` (a Bedrock API key) and bedrock keys; give one"
                )));
            }
            model.api_key.is_none() && !keys.0 && !keys.1
        }
        Provider::AzureOpenAi => {
            if !segment_ok(&model.name) {
                diags.push(Diagnostic::error(format!(
                    "{here}: model name `{}` is an Azure OpenAI deployment and goes in the URL's path: letters, digits, `-`, `_` and `.` only",
                    super::printable(&model.name)
                )));
            }
            let version = model.azure.clone().unwrap_or_default();
            if !segment_ok(version.api_version()) {
                diags.push(Diagnostic::error(format!(
                    "{here}: model azure.apiVersion `{}` is not an api-version (like {})",
                    super::printable(version.api_version()),
                    super::provider::AZURE_API_VERSION
                )));
            }
            model.api_key.is_none()
        }
        _ => false,
    };
    if ambient && !ambient_credential_may_reach(provider, &model.url) {
        let (what, domains) = match provider {
            Provider::Bedrock => ("the pod's AWS credentials sign", "https://*.amazonaws.com"),
            _ => (
                "the pod's Entra ID token goes",
                "https://*.openai.azure.com, *.cognitiveservices.azure.com or *.services.ai.azure.com",
            ),
        };
        diags.push(Diagnostic::error(format!(
            "{here}: model url {} is not {}'s own: without `apiKey`, {what} only for {domains} (or a loopback address); give the cloud's URL, or an `apiKey`",
            super::printable(&model.url),
            provider.name()
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored agent's client chooses its URL: a provider that signs
    /// with the server's cloud identity is refused, as a fallback too.
    #[test]
    fn a_stored_agent_speaks_no_provider_that_signs_with_the_servers_identity() {
        for (model, refused) in [
            ("{provider: bedrock, url: 'https://bedrock-runtime.us-east-1.amazonaws.com', name: m}", Some("model: provider `bedrock`")),
            ("{provider: azure-openai, url: 'https://r.openai.azure.com', name: m}", Some("model: provider `azure-openai`")),
            ("{url: http://m, name: m, fallbacks: [{provider: azure-openai, url: 'https://r.openai.azure.com', name: d}]}", Some("model fallback 1: provider `azure-openai`")),
            ("{provider: gemini, url: http://m, name: m}", None),
        ] {
            let yaml = format!("apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {model}\n");
            let doc: crate::AgentDocument = crate::from_yaml(&yaml).unwrap();
            let said = stored_agent_refusals(&doc.spec);
            match refused {
                Some(words) => assert!(
                    said.len() == 1 && said[0].starts_with(words) && said[0].contains("cloud identity"),
                    "{model}: {said:?}"
                ),
                None => assert!(said.is_empty(), "{model}: {said:?}"),
            }
        }
    }

    /// Review 69: a fallback's key read from the environment was missing
    /// from the variables `env-vars` withholds.
    #[test]
    fn a_fallbacks_key_variable_is_withheld_like_the_models() {
        let yaml = "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec:\n  model: {url: http://m, name: m, apiKey: {env: MAIN_KEY}, fallbacks: [{url: http://f, name: f, apiKey: {env: FALLBACK_KEY}}]}\n";
        let agent: crate::AgentDocument = crate::from_yaml(yaml).unwrap();
        let sources = env_sources(&agent.spec);
        assert!(sources.contains("MAIN_KEY"), "{sources:?}");
        assert!(sources.contains("FALLBACK_KEY"), "{sources:?}");
    }

    /// `attach-file` loads with or without a sandbox; `check` warns when
    /// no file can be attached, or the sandbox has no capability to serve.
    #[test]
    fn attach_file_is_warned_when_it_can_attach_nothing() {
        let said = |toolbox: &str| -> Vec<String> {
            let yaml = format!(
                "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: http://m, name: m}}\n  toolboxes:\n  - builtin: {toolbox}\n"
            );
            let doc: crate::AgentDocument = crate::from_yaml(&yaml).unwrap();
            check_definition("a", &doc.spec, "here")
                .into_iter()
                .map(|d| format!("{:?}: {}", d.level, d.message))
                .collect()
        };
        let ok = said("{name: f, capabilities: [attach-file], fileSandbox: {predicate: {directoryRecursive: ./shared}, maxFileSize: 10}}");
        assert_eq!(ok, Vec::<String>::new());
        for (toolbox, words) in [
            ("{name: f, capabilities: [attach-file]}", "without `fileSandbox`"),
            (
                "{name: f, capabilities: [attach-file], fileSandbox: {predicate: {any: [alwaysDeny]}}}",
                "denies every file",
            ),
            (
                "{name: f, capabilities: [date], fileSandbox: {predicate: alwaysAllow}}",
                "capability `attach-file` is not listed",
            ),
        ] {
            let said = said(toolbox);
            assert!(
                said.len() == 1 && said[0].starts_with("Warning") && said[0].contains(words),
                "{toolbox}: {said:?}"
            );
        }
    }

    /// What `check` says of agent `a` whose spec is `spec` (YAML lines,
    /// indented two spaces), as "here".
    fn messages_of(spec: &str) -> Vec<String> {
        let yaml = format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n{spec}"
        );
        let doc: crate::AgentDocument = crate::from_yaml(&yaml).unwrap();
        check_definition("a", &doc.spec, "here")
            .into_iter()
            .map(|d| d.message)
            .collect()
    }

    #[test]
    fn a_models_provider_takes_only_what_its_api_has() {
        let said = |model: &str| {
            let url = if model.contains("url:") {
                ""
            } else {
                "url: http://m, "
            };
            let name = if model.contains("name:") {
                ""
            } else {
                "name: m, "
            };
            messages_of(&format!("  model: {{{url}{name}{model}}}\n"))
        };
        assert_eq!(
            said("provider: anthropic, thinking: {budgetTokens: 2048}"),
            Vec::<String>::new()
        );
        assert_eq!(
            said("provider: anthropic, maxTokens: 100"),
            Vec::<String>::new()
        );
        for (model, words) in [
            (
                "thinking: {budgetTokens: 2048}",
                "provider `openai` takes none",
            ),
            (
                "provider: openai-responses, thinking: {budgetTokens: 2048}",
                "provider `openai-responses` takes none",
            ),
            (
                "provider: anthropic, thinking: {budgetTokens: 512}",
                "below the least Bindery sends, 1024",
            ),
            (
                "provider: gemini, flavor: KimiV1",
                "remove `flavor`",
            ),
            (
                "provider: bedrock, url: 'https://bedrock-runtime.us-east-1.amazonaws.com', thinking: {budgetTokens: 2048}",
                "thinking on bedrock needs maxTokens",
            ),
            (
                "provider: bedrock, apiKey: {env: K}",
                "names no AWS region",
            ),
            (
                "url: 'http://user:pw-canary@m/v1'",
                "model url has a user or password before its host",
            ),
            (
                "url: 'http://m/v1?key=q-canary'",
                "model url http://m/v1?... has a query or a fragment",
            ),
            (
                "provider: bedrock, url: 'https://ec2-1-2-3-4.compute-1.amazonaws.com', bedrock: {region: us-east-1}",
                "is not bedrock's own",
            ),
            (
                "provider: bedrock, bedrock: {region: us-east-1}",
                "is not bedrock's own: without `apiKey`, the pod's AWS credentials sign only for https://*.amazonaws.com",
            ),
            (
                "provider: bedrock, bedrock: {region: 'us-east-1/../x'}, apiKey: {env: K}",
                "is not an AWS region name",
            ),
            (
                "provider: bedrock, bedrock: {region: us-east-1, accessKeyId: {env: A}}",
                "give both, or neither",
            ),
            (
                "provider: bedrock, bedrock: {region: us-east-1, sessionToken: {env: T}}, apiKey: {env: K}",
                "sessionToken goes with accessKeyId",
            ),
            (
                "provider: bedrock, bedrock: {region: us-east-1, accessKeyId: {env: A}, secretAccessKey: {env: S}}, apiKey: {env: K}",
                "both `apiKey` (a Bedrock API key) and bedrock keys",
            ),
            (
                "bedrock: {region: us-east-1}",
                "settings are for provider bedrock",
            ),
            (
                "azure: {apiVersion: 2024-10-21}",
                "settings are for provider azure-openai",
            ),
            (
                "provider: azure-openai",
                "the pod's Entra ID token goes only for https://*.openai.azure.com",
            ),
            (
                "provider: azure-openai, url: 'https://r.openai.azure.com', name: 'a/b'",
                "is an Azure OpenAI deployment",
            ),
            (
                "provider: azure-openai, apiKey: {env: K}, azure: {apiVersion: '2024?x=1'}",
                "is not an api-version",
            ),
            (
                "provider: anthropic, thinking: {budgetTokens: 8192}",
                "less than maxTokens (8192, the default)",
            ),
            (
                "provider: anthropic, maxTokens: 2000, thinking: {budgetTokens: 2000}",
                "less than maxTokens (2000)",
            ),
            ("provider: anthropic, flavor: MistralV1", "remove `flavor`"),
            ("maxTokens: 0", "maxTokens is 0"),
            (
                "flavor: claude, maxTokens: 5000",
                "10000 tokens of thinking, which must be less than maxTokens (5000)",
            ),
        ] {
            let said = said(model);
            assert!(
                said.len() == 1 && said[0].contains(words),
                "{model}: {said:?}"
            );
        }
        let unknown = crate::from_yaml::<crate::AgentDocument>(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\nspec:\n  model: {url: http://m, name: m, provider: vertex}\n",
        );
        let err = format!("{:?}", unknown.err());
        assert!(err.contains("vertex") && err.contains("anthropic"), "{err}");
        for fine in [
            "provider: gemini, thinking: {budgetTokens: 2048}",
            "provider: bedrock, url: 'https://bedrock-runtime.eu-west-1.amazonaws.com', maxTokens: 4096, thinking: {budgetTokens: 2048}",
            "provider: bedrock, url: 'http://127.0.0.1:9', bedrock: {region: us-east-1}",
            "provider: bedrock, url: 'https://proxy.example', bedrock: {region: us-east-1, accessKeyId: {env: A}, secretAccessKey: {env: S}}",
            "provider: azure-openai, url: 'https://r.openai.azure.com', name: gpt-4o",
            "provider: azure-openai, apiKey: {env: K}, azure: {apiVersion: 2025-04-01-preview}",
            "provider: openai-responses",
        ] {
            assert_eq!(said(fine), Vec::<String>::new(), "{fine}");
        }
    }

    #[test]
    fn a_fallback_is_checked_as_a_model_and_priced_under_a_cost_budget() {
        let said = |fallback: &str| {
            messages_of(&format!(
                "  model: {{url: http://m, name: m, pricing: {{inputPerMillion: 1, outputPerMillion: 1}}, fallbacks: [{fallback}]}}\n  budgets: [{{name: c, cost: 1, per: 24h}}]\n"
            ))
        };
        assert_eq!(
            said("{url: http://f, name: f, pricing: {inputPerMillion: 1, outputPerMillion: 1}}"),
            Vec::<String>::new()
        );
        let unpriced = said("{url: http://f, name: f}");
        assert!(
            unpriced.len() == 1 && unpriced[0].contains("model fallback 1 (`f`)"),
            "{unpriced:?}"
        );
        let thinking = said("{url: http://f, name: f, pricing: {inputPerMillion: 1, outputPerMillion: 1}, thinking: {budgetTokens: 2048}}");
        assert!(
            thinking.len() == 1 && thinking[0].starts_with("here, model fallback 1:"),
            "{thinking:?}"
        );
        // Review 68 (second): what else a fallback is held to.
        let priced = "pricing: {inputPerMillion: 1, outputPerMillion: 1}";
        for (fallback, words) in [
            ("{url: http://f, name: f, pricing: {inputPerMillion: 1, outputPerMillion: 1, currency: XYZ}}".to_string(), "priced in XYZ, the model in USD"),
            (format!("{{url: http://f, name: f, flavor: bogus, {priced}}}"), "model flavor `bogus` is not one"),
            (format!("{{url: \"ftp://f\", name: f, {priced}}}"), "url `ftp://f` is not an http(s) URL"),
            (format!("{{url: http://f, name: \"f\\u001b[31m\", {priced}}}"), "none of them a control character"),
        ] {
            let said = said(&fallback);
            assert!(said.len() == 1 && said[0].contains(words), "{fallback}: {said:?}");
        }
        let nine = vec![format!("{{url: http://f, name: f, {priced}}}"); 9].join(", ");
        let said = said(&nine);
        assert!(
            said.iter().any(|s| s.contains("9 fallbacks; at most 8")),
            "{said:?}"
        );
    }

    #[test]
    fn a_downgrade_names_a_fallback_of_a_budget_the_model_spends() {
        let said = |budget: &str| {
            messages_of(&format!(
                "  model: {{url: http://m, name: m, fallbacks: [{{url: http://f, name: cheap}}]}}\n  budgets: [{budget}]\n"
            ))
        };
        assert_eq!(
            said("{name: d, tokens: 1000, per: 24h, downgrade: {at: 80, to: cheap}}"),
            Vec::<String>::new()
        );
        for (budget, words) in [
            (
                "{name: d, tokens: 1000, per: 24h, downgrade: {at: 80, to: nope}}",
                "`to: nope` names no model fallback",
            ),
            (
                "{name: d, toolCalls: 10, per: 24h, downgrade: {at: 80, to: cheap}}",
                "a budget of tool calls is not spent by the model",
            ),
            (
                "{name: d, tokens: 1000, per: 24h, downgrade: {at: 100, to: cheap}}",
                "from 1 to 99; got 100",
            ),
        ] {
            let said = said(budget);
            assert!(
                said.len() == 1 && said[0].contains(words),
                "{budget}: {said:?}"
            );
        }
    }

    #[test]
    fn an_http_url_is_one_whatever_its_schemes_case() {
        for url in ["http://a", "HTTPS://a/b", "Http://a"] {
            assert!(crate::http_url(url), "{url}");
        }
        for not in ["file://x", "httpx://a", "http:/a", "ht", "./http://a", "é"] {
            assert!(!crate::http_url(not), "{not}");
        }
    }

    #[test]
    fn an_end_users_value_is_bound_where_it_cannot_be_chosen_or_shared() {
        let doc = |toolbox: &str| -> Vec<String> {
            let yaml = format!(
                "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: http://m, name: m}}\n  toolboxes:\n  - {toolbox}\n"
            );
            let doc: crate::AgentDocument = crate::from_yaml(&yaml).unwrap();
            check_definition("a", &doc.spec, "here")
                .into_iter()
                .map(|d| d.message)
                .collect()
        };
        let fine = doc("openapi: {spec: api.json, baseUrl: http://api, filter: {methodEquals: GET}, secrets: [{source: {identity: 'token:billing'}, header: {name: Authorization, template: 'Bearer {{secret}}'}}], bindings: [{arg: user, value: {identity: subject}}]}");
        assert_eq!(fine, Vec::<String>::new());
        let exposed = doc("bash: {directory: t, bindings: [{arg: user, value: {identity: 'claim:email'}, whenUnbound: expose}]}");
        assert!(
            exposed
                .iter()
                .any(|m| m.contains("`whenUnbound: expose` on the end user's claim `email`")),
            "{exposed:?}"
        );
        // A remote server's headers take it: the toolbox connects per person.
        let per_user = doc("mcp: {name: s, url: 'http://mcp/mcp', sharedToolList: true, headers: {Authorization: {identity: 'token:x'}}}");
        assert_eq!(per_user, Vec::<String>::new());
        // Its tool list, listed through one person's connection, is shown
        // to everyone: only when the author says it holds nothing of a person's.
        let unsaid = doc("mcp: {name: s, url: 'http://mcp/mcp', headers: {Authorization: {identity: 'token:x'}}}");
        assert!(
            unsaid
                .iter()
                .any(|m| m.contains("Set `sharedToolList: true`")),
            "{unsaid:?}"
        );
        let misplaced = doc("mcp: {name: s, url: 'http://mcp/mcp', sharedToolList: true}");
        assert!(
            misplaced
                .iter()
                .any(|m| m.contains("`sharedToolList` is for")),
            "{misplaced:?}"
        );
        let shared = doc("mcp: {name: s, command: [srv], env: {TOKEN: {identity: 'token:x'}}}");
        assert!(
            shared
                .iter()
                .any(|m| m
                    .contains("shared by every session (one process per person is not offered)")),
            "{shared:?}"
        );
        let fetched = doc("openapi: {spec: 'https://api/doc.json', baseUrl: http://api, filter: {methodEquals: GET}, secrets: [{source: {identity: subject}, header: {name: X-User}, fetchSpec: true}]}");
        assert!(
            fetched
                .iter()
                .any(|m| m.contains("before any end user is there")),
            "{fetched:?}"
        );
    }

    #[test]
    fn an_http_toolboxs_plain_headers_hold_no_credential() {
        let doc = |headers: &str| -> Vec<String> {
            let yaml = format!(
                "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: http://m, name: m}}\n  toolboxes:\n  - openapi:\n      spec: api.json\n      baseUrl: http://api\n      filter: {{methodEquals: GET}}\n      headers: {headers}\n"
            );
            let doc: crate::AgentDocument = crate::from_yaml(&yaml).unwrap();
            check_definition("a", &doc.spec, "here")
                .into_iter()
                .map(|d| d.message)
                .collect()
        };
        assert_eq!(
            doc("{X-Tenant: acme, Accept: application/json}"),
            Vec::<String>::new()
        );
        for name in [
            "Authorization",
            "X-Api-Key",
            "Cookie",
            "X-Auth-Token",
            "Proxy-Authorization",
            "X-Authentication",
            "X-Jwt",
            "Session",
            "X-Session-Id",
            "X-Hub-Signature",
            "X-CSRF-Token",
            "X-AppKey",
            "X-MasterKey",
            "X-Subscriptionkey",
            "X-Passcode",
            "X-Sid",
            "X-Otp",
            "X-Hmac",
            "X-Pin",
            "X-Api-Sig",
        ] {
            let said = doc(&format!("{{{name}: v}}"));
            assert!(
                said.len() == 1 && said[0].contains("give it as a secret instead"),
                "{name}: {said:?}"
            );
        }
        assert!(doc("{\"bad name\": v}")[0].contains("not a valid header name"));
        assert!(doc("{X-Next: \"a\\nb\"}")[0].contains("control character"));
    }

    #[test]
    fn env_vars_never_shows_a_credential_by_name() {
        let none = BTreeSet::new();
        for name in SERVER_CREDENTIAL_ENV.iter().copied().chain([
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "DATABASE_URL",
            "GITHUB_TOKEN",
            "PGPASSWORD",
            "SENTRY_DSN",
            "OPENAI_API_KEY",
            "my_service_password",
            "KUBECONFIG",
        ]) {
            let why = env_var_refusal(name, &none).unwrap_or_else(|| panic!("{name} shown"));
            assert!(why.contains(name), "{why}");
        }
        for name in [
            "DB_PASS",
            "SMTP_PASS",
            "MYSQL_PWD",
            "APITOKEN",
            "ACCESSKEY",
            "PRIVATEKEY",
            "clientsecret",
            "GH_PAT",
            "SLACK_WEBHOOK_URL",
            "HTTP_PROXY",
        ] {
            assert!(env_var_refusal(name, &none).is_some(), "{name} shown");
        }
        for name in [
            "APP_REGION",
            "HOME",
            "LANG",
            "PATH",
            "PWD",
            "OLDPWD",
            "MONKEY",
        ] {
            assert_eq!(env_var_refusal(name, &none), None, "{name}");
        }
        assert!(credential_value("http://u:hunter2@proxy:3128"));
        assert!(!credential_value("http://proxy:3128/a@b"));
        assert!(!credential_value("eu-west"));
    }

    fn oauth_errors(mcp: &str) -> Vec<String> {
        let text = format!(
            r#"
model: {{url: "http://llm", name: m}}
parameters:
  - {{name: secret, secret: true, scope: process}}
  - {{name: user_secret, secret: true, scope: session}}
toolboxes:
  - mcp:
{mcp}
"#
        );
        let spec: AgentSpec = crate::from_yaml(&text).unwrap();
        check_definition("a", &spec, "here")
            .into_iter()
            .filter(|d| d.level == crate::diagnostic::Level::Error)
            .map(|d| d.to_string())
            .collect()
    }

    #[test]
    fn an_mcp_servers_oauth_is_checked_at_load() {
        let ok = oauth_errors(
            r#"      name: crm
      url: https://mcp.example.com/mcp
      oauth: {grant: client-credentials, clientId: {literal: c}, clientSecret: {param: secret}}"#,
        );
        assert_eq!(ok, Vec::<String>::new());
        let cases = [
            (
                "url: http://mcp.example.com/mcp\n      oauth: {grant: authorization-code}",
                "must be https://",
            ),
            (
                "url: https://m/mcp\n      oauth: {grant: client-credentials, clientId: {literal: c}}",
                "give `clientSecret` or `privateKey`",
            ),
            (
                "url: https://m/mcp\n      oauth: {grant: client-credentials, clientId: {literal: c}, clientSecret: {param: user_secret}}",
                "session-scope",
            ),
            (
                "url: https://m/mcp\n      oauth: {grant: authorization-code, tokenEndpointAuth: private_key_jwt}",
                "signs with `privateKey`",
            ),
            (
                "url: https://m/mcp\n      headers: {Authorization: {literal: x}}\n      oauth: {grant: authorization-code}",
                "would replace the OAuth token",
            ),
            (
                "url: https://m/mcp\n      oauth: {grant: authorization-code, clientMetadataUrl: 'http://c/x'}",
                "`clientMetadataUrl` must be an https://",
            ),
            (
                "command: [x]\n      oauth: {grant: authorization-code}",
                "give `url`, not `command`",
            ),
            (
                "url: https://m/mcp\n      headers: {X-User: {identity: subject}}\n      oauth: {grant: authorization-code}",
                "a person's consent per connection is not built yet",
            ),
        ];
        for (body, want) in cases {
            let errs = oauth_errors(&format!("      name: crm\n      {body}"));
            assert!(errs.iter().any(|e| e.contains(want)), "{body}: {errs:?}");
        }
        // Plain http to this machine is fine (a local server, a test).
        assert_eq!(
            oauth_errors("      name: crm\n      url: http://localhost:8080/mcp\n      oauth: {grant: authorization-code}"),
            Vec::<String>::new()
        );
        assert!(loopback_url("http://127.0.0.1:9/x") && loopback_url("http://[::1]/"));
        assert!(
            !loopback_url("http://localhost.evil.example/")
                && !loopback_url("http://u@evil/@localhost")
        );
    }

    #[test]
    fn a_remote_servers_headers_may_take_an_end_users_values_and_a_programs_env_not() {
        let per_user =
            "      name: crm\n      url: https://m/mcp\n      sharedToolList: true\n      headers: {Authorization: {identity: 'token:crm'}, X-User: {identity: subject}}";
        assert_eq!(oauth_errors(per_user), Vec::<String>::new());
        let env = oauth_errors(
            "      name: crm\n      command: [x]\n      env: {TOKEN: {identity: 'token:crm'}}",
        );
        assert!(
            env.iter()
                .any(|e| e.contains("one process per person is not offered")),
            "{env:?}"
        );
        // Its calls find the person by their subject.
        let spec: AgentSpec = crate::from_yaml(&format!(
            "model: {{url: 'http://llm', name: m}}\ntoolboxes:\n  - mcp:\n{}",
            per_user
        ))
        .unwrap();
        assert!(spec
            .identity_values()
            .contains(&crate::IdentityValue::Subject));
    }

    #[test]
    fn an_oauth_issuer_is_an_https_url() {
        let errs = oauth_errors(
            "      name: crm\n      url: https://m/mcp\n      oauth: {grant: client-credentials, clientId: {literal: c}, clientSecret: {param: secret}, issuer: 'http://auth.example.com'}",
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("`issuer` must be an https://")),
            "{errs:?}"
        );
    }

    fn agent(toolbox: &str) -> AgentSpec {
        let text = format!(
            r#"
model: {{url: "http://llm", name: m}}
parameters:
  - {{name: project_id, scope: session}}
  - {{name: callback_token, secret: true, scope: session}}
  - {{name: spec_token, secret: true, scope: process}}
toolboxes:
  - openapi:
{toolbox}
"#
        );
        crate::from_yaml(&text).unwrap()
    }

    fn errors(spec: &AgentSpec) -> Vec<String> {
        check_definition("a", spec, "here")
            .into_iter()
            .filter(|d| d.level == crate::diagnostic::Level::Error)
            .map(|d| d.to_string())
            .collect()
    }

    #[test]
    fn a_session_secret_per_request_is_fine() {
        let spec = agent(
            r#"      spec: "http://api/openapi.json"
      baseUrl: "http://api"
      secrets:
        - source: {param: callback_token}
          header: {name: Authorization, template: "Bearer {{secret}}"}
        - source: {param: spec_token}
          query: key
          fetchSpec: true
        - source: {env: API_KEY}
          header: {name: X-Key}
          fetchSpec: true
      bindings:
        - {arg: project_id, value: {param: project_id}}"#,
        );
        assert_eq!(errors(&spec), Vec::<String>::new());
    }

    #[test]
    fn a_secret_param_must_be_declared() {
        let spec = agent(
            r#"      spec: "./api.yaml"
      baseUrl: "http://api"
      secrets:
        - source: {param: nope}
          header: {name: Authorization}"#,
        );
        let e = errors(&spec);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("toolbox 1 (openapi ./api.yaml), secret 1 (param nope): parameter `nope` is not declared"),
            "{e:?}"
        );
    }

    #[test]
    fn fetching_the_spec_cannot_use_a_session_parameter() {
        let spec = agent(
            r#"      spec: "https://api/openapi.json"
      baseUrl: "https://api"
      secrets:
        - source: {param: callback_token}
          header: {name: Authorization, template: "Bearer {{secret}}"}
          fetchSpec: true"#,
        );
        let e = errors(&spec);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("session-scope parameter `callback_token`"),
            "{e:?}"
        );
        assert!(
            e[0].contains("use a process-scope parameter or a value source"),
            "{e:?}"
        );
    }

    #[test]
    fn a_secret_goes_exactly_one_place_and_templates_name_the_secret() {
        let spec = agent(
            r#"      spec: "./api.yaml"
      baseUrl: "ftp://api"
      secrets:
        - source: {env: A}
        - source: {env: B}
          header: {name: Authorization, template: "Bearer"}"#,
        );
        let e = errors(&spec);
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].contains("`baseUrl` must be an http"), "{e:?}");
        assert!(
            e[1].contains("secret 1 (env A): give exactly one of `header`"),
            "{e:?}"
        );
        assert!(
            e[2].contains("secret 2 (env B): the header template must contain `{{secret}}`"),
            "{e:?}"
        );
    }
}
