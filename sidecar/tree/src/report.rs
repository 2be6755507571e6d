//! What an operator is shown about a loaded agent: parameters and how each
//! resolved, tools as the model sees them, and what is bound. Never a
//! parameter's value.

use serde::Serialize;

use crate::LoadedAgent;
use bindery_bindings::{BoundArg, BoundTool};
use bindery_params::{ParamStatus, Values};
use bindery_tools::Disposition;

#[derive(Serialize)]
pub struct AgentReport {
    pub name: String,
    pub file: String,
    /// What its relative paths are resolved against: the agent file's
    /// directory, or for an agents-exe file the working directory.
    #[serde(rename = "pathsFrom")]
    pub paths_from: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announce: Option<String>,
    pub model: ModelReport,
    pub parameters: Vec<ParamStatus>,
    pub tools: Vec<ToolReport>,
    pub helpers: Vec<HelperReport>,
}

/// The agent's model: which API, which model, where (the URL without
/// credentials or query), the reply's bounds and its prices.
#[derive(Serialize)]
pub struct ModelReport {
    pub provider: &'static str,
    pub name: String,
    pub url: String,
    #[serde(rename = "maxTokens", skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(rename = "thinkingBudget", skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pricing: Option<bindery_spec::budget::Pricing>,
    /// Where `pricing` comes from: `agent` (its own), or `table DATE`
    /// (Bindery's shipped price table, checked that day).
    #[serde(rename = "pricingFrom", skip_serializing_if = "Option::is_none")]
    pub pricing_from: Option<String>,
    /// How requests are authorized: `key` (`apiKey`), `aws keys`
    /// (Bedrock's own), `pod identity` (the pod's cloud identity), `none`.
    pub credentials: &'static str,
    /// Bedrock's region, Azure OpenAI's api-version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(rename = "apiVersion", skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// The models tried, in order, when this one fails.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<ModelReport>,
}

fn model_report(m: &bindery_spec::ModelSpec) -> ModelReport {
    ModelReport {
        fallbacks: m
            .fallbacks
            .iter()
            .map(|f| model_report(&f.as_model()))
            .collect(),
        provider: m.provider.name(),
        name: m.name.clone(),
        url: bindery_llm::egress::shown_text(&m.url),
        max_tokens: m.max_tokens.or(m.provider.default_max_tokens()),
        thinking_budget: m.thinking.as_ref().map(|t| t.budget_tokens),
        pricing: m.price().map(|(p, _)| p),
        pricing_from: m.price().map(|(_, from)| match from {
            bindery_spec::prices::Origin::Given => "agent".to_owned(),
            bindery_spec::prices::Origin::Shipped => {
                format!("table {}", bindery_spec::prices::checked())
            }
        }),
        credentials: credentials_of(m),
        region: match m.provider {
            Provider::Bedrock => m.bedrock.clone().unwrap_or_default().region_of(&m.url),
            _ => None,
        },
        api_version: match m.provider {
            Provider::AzureOpenAi => {
                Some(m.azure.clone().unwrap_or_default().api_version().to_owned())
            }
            _ => None,
        },
    }
}

use bindery_spec::provider::Provider;

/// How `m`'s requests are authorized (see [`ModelReport::credentials`]).
fn credentials_of(m: &bindery_spec::ModelSpec) -> &'static str {
    let aws_keys = m
        .bedrock
        .as_ref()
        .is_some_and(|b| b.access_key_id.is_some());
    match (m.provider, m.api_key.is_some()) {
        (_, true) => "key",
        (Provider::Bedrock, false) if aws_keys => "aws keys",
        (Provider::Bedrock | Provider::AzureOpenAi, false) => "pod identity",
        _ => "none",
    }
}

#[derive(Serialize)]
pub struct ToolReport {
    pub name: String,
    /// The arguments the model sees, `?` marking optional ones.
    pub arguments: Vec<String>,
    pub bound: Vec<BoundArg>,
    /// `confirm` (a person approves each call) or `deferred` (the client
    /// runs it); absent: the tool runs when called.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits: Option<Disposition>,
    /// The lookups that run first, each with the arguments it fills.
    #[serde(rename = "dependsOn", skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Whether a call may change something (so a lookup cannot be it, and
    /// with dependencies it runs only once confirmed).
    pub writes: bool,
    /// `confirm` conditions (CEL): a call asks when one holds.
    #[serde(rename = "confirmWhen", skip_serializing_if = "Vec::is_empty")]
    pub confirm_when: Vec<String>,
    /// Its output may carry instructions from outside.
    pub untrusted: bool,
    /// It can send data out: after an untrusted result, its calls ask.
    pub egress: bool,
    /// Hidden until the model activates this group (`meta_activate_tool`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toolgroup: Option<String>,
}

#[derive(Serialize)]
pub struct HelperReport {
    /// Its tool's name (`prompt_agent_<slug>`, or agents-exe's
    /// `io_prompt_agent_<slug>`).
    pub tool: String,
    pub slug: String,
    pub agent: String,
    pub narrowable: bool,
}

/// A tool as an OpenAI-compatible model receives it, plus (for the
/// operator) what is bound.
#[derive(Serialize)]
pub struct ToolView {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionView,
    pub bound: Vec<BoundArg>,
    /// `confirm` or `deferred`: calls wait (see [`ToolReport::waits`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits: Option<Disposition>,
}

#[derive(Serialize)]
pub struct FunctionView {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

pub fn agent_report(agent: &LoadedAgent) -> AgentReport {
    let values = agent.process_values();
    AgentReport {
        name: agent.name.clone(),
        file: agent.file.display().to_string(),
        paths_from: paths_from(agent),
        announce: agent.spec.announce.clone(),
        model: model_report(&agent.spec.model),
        parameters: agent.params.statuses(),
        tools: agent
            .tools
            .iter()
            .map(|t| ToolReport {
                name: t.name().to_string(),
                arguments: visible_args(&t, &values),
                bound: t.bound_args(),
                waits: agent.disposition(t.name(), Some(&t)),
                depends_on: t
                    .depends()
                    .iter()
                    .map(|d| format!("{} (fills {})", d.tool, d.destinations().join(", ")))
                    .collect(),
                writes: t.writes(),
                confirm_when: t
                    .confirm_when()
                    .iter()
                    .cloned()
                    .chain(
                        bindery_bindings::confirm::conditions(&agent.spec.confirm, t.name())
                            .map(str::to_string),
                    )
                    .collect(),
                untrusted: t.untrusted(),
                egress: t.egress(),
                toolgroup: t.toolgroup().map(str::to_string),
            })
            .collect(),
        helpers: agent
            .helpers
            .iter()
            .map(|h| HelperReport {
                tool: format!("{}{}", agent.spec.naming.helper_prefix(), h.slug),
                slug: h.slug.clone(),
                agent: h.agent.clone(),
                narrowable: h.narrowable,
            })
            .collect(),
    }
}

fn paths_from(agent: &LoadedAgent) -> String {
    let base = agent.base.display().to_string();
    let native = agent.file.parent().is_some_and(|p| p == agent.base);
    match (native, base.as_str()) {
        (true, "") => ".".to_string(),
        (true, _) => base,
        (false, _) => format!("{base} (the working directory, as agents-exe resolves them)"),
    }
}

fn visible_args(t: &BoundTool, values: &Values) -> Vec<String> {
    let hidden = t.hidden_args(values);
    let filled = t.filled_args();
    t.spec()
        .args
        .iter()
        .filter(|a| !hidden.contains(a.name.as_str()) && !filled.contains(&a.name))
        .map(|a| {
            if a.required {
                a.name.clone()
            } else {
                format!("{}?", a.name)
            }
        })
        .collect()
}

/// The tool of `agent` as the model receives it under `values`.
pub fn tool_view(agent: &LoadedAgent, t: &BoundTool, values: &Values) -> ToolView {
    ToolView {
        kind: "function",
        function: FunctionView {
            name: t.name().to_string(),
            description: t.spec().description.clone(),
            parameters: t.model_schema(values),
        },
        bound: t.bound_args(),
        waits: agent.disposition(t.name(), Some(t)),
    }
}

/// A model's lines of `check`'s report, under `title`.
fn render_model(out: &mut String, title: &str, m: &ModelReport) {
    out.push_str(&format!(
        "  {title}: {} ({}, {})\n",
        m.name, m.provider, m.url
    ));
    let mut credentials = m.credentials.to_owned();
    if let Some(r) = &m.region {
        credentials.push_str(&format!(", region {r}"));
    }
    if let Some(v) = &m.api_version {
        credentials.push_str(&format!(", api-version {v}"));
    }
    out.push_str(&format!("    credentials: {credentials}\n"));
    if let Some(n) = m.max_tokens {
        out.push_str(&format!("    max tokens: {n}\n"));
    }
    if let Some(n) = m.thinking_budget {
        out.push_str(&format!("    thinking: up to {n} tokens\n"));
    }
    if let Some(p) = &m.pricing {
        let per = |price: Option<f64>| price.unwrap_or(p.input_per_million);
        let from = match m.pricing_from.as_deref() {
            Some(t) if t.starts_with("table ") => format!(", from Bindery's price {t}"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "    prices per million tokens ({}{from}): input {}, output {}, cache read {}, cache write {}, reasoning {}\n",
            p.currency,
            p.input_per_million,
            p.output_per_million,
            per(p.cache_read_per_million),
            per(p.cache_write_per_million),
            p.reasoning_per_million.unwrap_or(p.output_per_million)
        ));
    }
}

/// `check`'s human-readable report of one agent.
pub fn render_text(r: &AgentReport) -> String {
    let mut out = format!("agent {} ({})\n", r.name, r.file);
    out.push_str(&format!("  relative paths from: {}\n", r.paths_from));
    render_model(&mut out, "model", &r.model);
    for (i, f) in r.model.fallbacks.iter().enumerate() {
        render_model(&mut out, &format!("fallback {}", i + 1), f);
    }
    if r.parameters.is_empty() {
        out.push_str("  parameters: none\n");
    } else {
        out.push_str("  parameters:\n");
        let rows: Vec<[String; 5]> = r
            .parameters
            .iter()
            .map(|p| {
                [
                    p.name.clone(),
                    p.scope.as_str().to_string(),
                    if p.secret { "secret" } else { "-" }.to_string(),
                    if p.required { "required" } else { "optional" }.to_string(),
                    p.source.clone(),
                ]
            })
            .collect();
        let header = ["NAME", "SCOPE", "SECRET", "REQUIRED", "SOURCE"].map(String::from);
        out.push_str(&table(&header, &rows, "    "));
    }
    if r.tools.is_empty() {
        out.push_str("  tools: none\n");
    } else {
        out.push_str("  tools:\n");
        for t in &r.tools {
            out.push_str(&format!("    {}({})\n", t.name, t.arguments.join(", ")));
            if let Some(g) = &t.toolgroup {
                out.push_str(&format!(
                    "      on demand: hidden until the model activates toolgroup '{g}'\n"
                ));
            }
            match t.waits {
                Some(Disposition::Confirm) => {
                    out.push_str("      needs confirmation: a person approves each call\n")
                }
                Some(Disposition::Deferred) => {
                    out.push_str("      deferred: the client runs it and posts the result\n")
                }
                Some(_) | None => {}
            }
            for c in &t.confirm_when {
                out.push_str(&format!("      needs confirmation when: {c}\n"));
            }
            if t.untrusted {
                out.push_str(
                    "      untrusted: its results hold the session's egress calls for a person\n",
                );
            }
            if t.egress {
                out.push_str(
                    "      egress: after an untrusted result, each call waits for a person\n",
                );
            }
            for d in &t.depends_on {
                out.push_str(&format!("      depends on: {d}\n"));
            }
            if !t.depends_on.is_empty() && t.writes {
                out.push_str("      writes: runs only once a person confirms the prepared call\n");
            }
            for b in &t.bound {
                let mode = b
                    .mode
                    .as_ref()
                    .map(|m| format!(" [{m}]"))
                    .unwrap_or_default();
                out.push_str(&format!("      bound: {} := {}{mode}\n", b.arg, b.to));
            }
        }
    }
    if r.tools.iter().any(|t| t.toolgroup.is_some()) {
        out.push_str("  added by Bindery: meta_activate_tool, meta_deactivate_tool, meta_discover_tools (the on-demand groups)\n");
    }
    for h in &r.helpers {
        out.push_str(&format!(
            "  helper: {} -> agent {}{}\n",
            h.tool,
            h.agent,
            if h.narrowable {
                ""
            } else {
                " (not narrowable)"
            }
        ));
    }
    out
}

fn table<const N: usize>(header: &[String; N], rows: &[[String; N]], indent: &str) -> String {
    let mut widths = header.clone().map(|h| h.len());
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: &[String; N]| {
        let mut s = indent.to_string();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header);
    for r in rows {
        out.push_str(&line(r));
    }
    out
}
