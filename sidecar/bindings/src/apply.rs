//! Applying an agent file's bindings to loaded tools, with every load-time
//! check: each problem is reported with the place it was written (agent file,
//! toolbox, binding) and the tool and argument it concerns.

use super::{AppliedBinding, BoundTool};
pub use bindery_spec::diagnostic::{Diagnostic, Level};
use bindery_spec::{Binding, BindingValue, ParameterDecl, WhenUnbound};

/// Which tool name a binding's glob is matched against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingLayer {
    /// A toolbox's own bindings: the name inside the toolbox (`query-*`).
    Toolbox,
    /// Agent-level bindings: the model-visible name (`bash_query-*`).
    Agent,
}

/// Apply `bindings` to `tools` in order, after the bindings they already
/// carry. `place` says where the bindings were written, for messages.
pub fn apply_bindings(
    tools: &mut [BoundTool],
    bindings: &[Binding],
    layer: BindingLayer,
    params: &[ParameterDecl],
    place: &str,
    diags: &mut Vec<Diagnostic>,
) {
    apply_bindings_with(
        tools,
        bindings,
        layer,
        params,
        place,
        |_| Level::Error,
        diags,
    )
}

/// At what level an agent-level binding that matches nothing is reported:
/// one aimed at MCP tools (`mcp_*`) is a warning, as their list comes from
/// the server and may change; any other is an error.
pub fn agent_typo_level(b: &Binding) -> Level {
    match b.tool.as_deref() {
        Some(glob) if glob.starts_with("mcp_") => Level::Warning,
        _ => Level::Error,
    }
}

/// [`apply_bindings`], with the typo guard (a binding that matches no tool,
/// or no argument of the tools it matches) at the level `unmatched` gives:
/// a warning for an MCP server, whose tools come late and may change.
pub fn apply_bindings_with(
    tools: &mut [BoundTool],
    bindings: &[Binding],
    layer: BindingLayer,
    params: &[ParameterDecl],
    place: &str,
    unmatched: fn(&Binding) -> Level,
    diags: &mut Vec<Diagnostic>,
) {
    for (i, b) in bindings.iter().enumerate() {
        let typo = |msg: String| Diagnostic {
            level: unmatched(b),
            message: msg,
        };
        let glob = b.tool.as_deref().unwrap_or("*");
        let here = format!(
            "{place}, binding {} (tool \"{glob}\", arg \"{}\")",
            i + 1,
            b.arg
        );
        // An undeclared parameter and `expose` on a secret are reported by
        // `spec::checks` (they need no tools); such a binding is skipped here.
        let param = match &b.value {
            BindingValue::Param(p) => match params.iter().find(|d| &d.name == p) {
                Some(d) => Some(d),
                None => continue,
            },
            BindingValue::Literal(_) | BindingValue::Identity(_) => None,
        };
        // What secret the binding hands over, as messages name it.
        let secret = match &b.value {
            BindingValue::Identity(i) if i.is_secret() => Some(i.describe()),
            _ => param
                .filter(|d| d.secret)
                .map(|d| format!("secret parameter `{}`", d.name)),
        };
        if b.when_unbound == WhenUnbound::Expose && param.is_some_and(|d| d.secret) {
            continue;
        }
        let name_of = |t: &BoundTool| match layer {
            BindingLayer::Toolbox => t.spec().local_name.clone(),
            BindingLayer::Agent => t.spec().name.clone(),
        };
        let matched: Vec<usize> = (0..tools.len())
            .filter(|&t| super::glob_matches(glob, &name_of(&tools[t])))
            .collect();
        if matched.is_empty() {
            let names: Vec<String> = tools.iter().map(name_of).collect();
            diags.push(typo(format!(
                "{here}: matches no tool (tools here: {})",
                list_or_none(&names)
            )));
            continue;
        }
        let with_arg: Vec<usize> = matched
            .iter()
            .copied()
            .filter(|&t| tools[t].spec().arg(&b.arg).is_some())
            .collect();
        if with_arg.is_empty() {
            let described: Vec<String> = matched
                .iter()
                .map(|&t| {
                    let args: Vec<String> = tools[t]
                        .spec()
                        .args
                        .iter()
                        .map(|a| a.name.clone())
                        .collect();
                    format!("{} has {}", name_of(&tools[t]), list_or_none(&args))
                })
                .collect();
            diags.push(typo(format!(
                "{here}: no matched tool has an argument \"{}\" ({})",
                b.arg,
                described.join("; ")
            )));
            continue;
        }
        for t in with_arg {
            let tool = &tools[t];
            let tool_name = name_of(tool);
            let arg = tool
                .spec()
                .arg(&b.arg)
                .expect("filtered on the argument above");
            let at = format!("{here}, tool \"{tool_name}\"");
            if tool.binding_for(&b.arg).is_some() {
                diags.push(Diagnostic::error(format!(
                    "{at}: argument \"{}\" is already bound by an earlier binding; bind each argument once",
                    b.arg
                )));
                continue;
            }
            if b.when_unbound == WhenUnbound::Omit && arg.required {
                diags.push(Diagnostic::error(format!(
                    "{at}: `whenUnbound: omit` on required argument \"{}\"; a call cannot leave it out (use fail, or bind it to a parameter that always has a value)",
                    b.arg
                )));
                continue;
            }
            if let (Some(secret), Some(exposure)) = (&secret, arg.transport.secret_exposure()) {
                diags.push(Diagnostic::error(format!(
                    "{at}: {secret} is bound to argument \"{}\", {exposure}",
                    b.arg,
                )));
                continue;
            }
            if let (
                Some(carries),
                BindingValue::Literal(
                    l @ (serde_json::Value::Object(_) | serde_json::Value::Array(_)),
                ),
            ) = (arg.transport.scalars_only(), &b.value)
            {
                diags.push(Diagnostic::error(format!(
                    "{at}: the literal bound to argument \"{}\" is {}; {carries}",
                    b.arg,
                    bindery_params::value::json_kind(l)
                )));
                continue;
            }
            if mentions(&tool.spec().description, &b.arg) {
                diags.push(Diagnostic::warning(format!(
                    "{at}: the tool's description mentions the bound argument \"{}\"; the model will read about an argument it cannot see, consider rewording the description",
                    b.arg
                )));
            }
            tools[t] = tools[t].with_bindings([AppliedBinding {
                arg: b.arg.clone(),
                value: b.value.clone().into(),
                when_unbound: b.when_unbound,
            }]);
        }
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// Whether `text` mentions `word` as a word of its own.
fn mentions(text: &str, word: &str) -> bool {
    let is_word = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

#[cfg(test)]
mod tests {
    use super::mentions;

    #[test]
    fn word_mentions() {
        assert!(mentions("Query the tenant_id's invoices", "tenant_id"));
        assert!(!mentions("Query tenant_ids", "tenant_id"));
        assert!(!mentions("a token-bucket", "token"));
        assert!(mentions("pass token.", "token"));
    }
}
