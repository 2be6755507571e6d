//! Tool declarations applied to loaded tools (`readOnly`, `depends_on`,
//! selected by the same globs as bindings), and the load-time checks that
//! need the tools themselves: a lookup that names no tool, a lookup that may
//! write, a destination the tool does not declare.

use super::{glob_matches, BoundTool};
use bindery_spec::diagnostic::Diagnostic;
use bindery_spec::ToolDecl;

/// Apply a toolbox's `tools` declarations (globs on the names inside it).
pub fn apply_toolbox_decls(tools: &mut [BoundTool], decls: &[ToolDecl]) {
    for t in tools.iter_mut() {
        let name = t.spec().local_name.clone();
        for d in decls.iter().filter(|d| glob_matches(&d.tool, &name)) {
            *t = t.with_decl(d);
        }
    }
}

/// Apply the agent-level `tools` declarations (globs on model-visible names).
pub fn apply_agent_decls(tools: &mut [BoundTool], decls: &[ToolDecl]) {
    for t in tools.iter_mut() {
        let name = t.name().to_string();
        for d in decls.iter().filter(|d| glob_matches(&d.tool, &name)) {
            *t = t.with_decl(d);
        }
    }
}

/// The lookup tool a dependency names: a model-visible name, else the one
/// tool with that name inside its toolbox.
pub fn lookup_tool<'a>(tools: &'a [BoundTool], name: &str) -> Option<&'a BoundTool> {
    tools.iter().find(|t| t.name() == name).or_else(|| {
        let mut local = tools.iter().filter(|t| t.spec().local_name == name);
        match (local.next(), local.next()) {
            (Some(t), None) => Some(t),
            _ => None,
        }
    })
}

/// The `untrusted` tools among `tool`'s lookups, their own lookups
/// included: what they answer flows into its arguments, its facts and so
/// its result, which is then as untrusted as they are.
pub fn untrusted_lookups(tools: &[BoundTool], tool: &BoundTool) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut todo: Vec<String> = tool.depends().iter().map(|d| d.tool.clone()).collect();
    while let Some(name) = todo.pop() {
        let Some(t) = lookup_tool(tools, &name) else {
            continue;
        };
        if !seen.insert(t.name().to_string()) {
            continue;
        }
        if t.untrusted() {
            out.push(t.name().to_string());
        }
        todo.extend(t.depends().iter().map(|d| d.tool.clone()));
    }
    out
}

/// The checks of every tool's dependencies against the loaded tools.
pub fn check_loaded(tools: &[BoundTool], here: &str, diags: &mut Vec<Diagnostic>) {
    for t in tools.iter().filter(|t| !t.depends().is_empty()) {
        for (i, dep) in t.depends().iter().enumerate() {
            let at = format!(
                "{here}, tool `{}`, depends_on {} (tool `{}`)",
                t.name(),
                i + 1,
                dep.tool
            );
            match lookup_tool(tools, &dep.tool) {
                None => {
                    let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
                    diags.push(Diagnostic::error(format!(
                        "{at}: no tool of the agent is called `{}` (tools: {}); fix the name",
                        dep.tool,
                        names.join(", ")
                    )));
                }
                Some(l) if l.writes() => diags.push(Diagnostic::error(format!(
                    "{at}: `{}` may change something, and a lookup must be read-only; use an OpenAPI GET or HEAD, an MCP tool annotated readOnlyHint: true, or declare it `readOnly: true` under the toolbox's `tools`",
                    l.name()
                ))),
                Some(_) => {}
            }
            for dest in dep.destinations() {
                if t.spec().arg(&dest).is_none() {
                    let args: Vec<&str> = t.spec().args.iter().map(|a| a.name.as_str()).collect();
                    diags.push(Diagnostic::error(format!(
                        "{at}: map destination `$.{dest}` is not an argument of `{}` (arguments: {}); declare it on the tool or fix the path",
                        t.name(),
                        args.join(", ")
                    )));
                }
            }
        }
    }
}
