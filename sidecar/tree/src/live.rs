//! An agent's tool list, which an MCP server may change while the agent
//! runs (`notifications/tools/list_changed`).
//!
//! Every reader takes a snapshot: a run keeps the list it started with. A
//! change re-lists that server's tools, applies its toolbox's bindings and
//! then the agent-level ones again, and swaps the list. After a change
//! every problem is a warning in the log, never a stop; a tool a binding
//! should hide but could not is withheld rather than shown whole.

use std::sync::{Arc, RwLock};

use bindery_bindings::{apply::apply_bindings_with, glob_matches, BindingLayer, BoundTool};
use bindery_spec::diagnostic::{Diagnostic, Level};
use bindery_spec::{Binding, BindingValue, ParameterDecl, WhenUnbound};

/// The tools of one agent, as of now; and the names that ever gave an
/// untrusted result in this process, which a change of the list does not
/// make trusted (a server that drops its untrusted tool after a call
/// would otherwise clear the taint of what it answered).
#[derive(Clone, Default)]
pub struct LiveTools(
    Arc<RwLock<Arc<Vec<BoundTool>>>>,
    Arc<RwLock<std::collections::BTreeSet<String>>>,
);

/// The names among `tools` whose results are untrusted: their own, or by
/// their lookups.
fn untrusted_names(tools: &[BoundTool]) -> impl Iterator<Item = String> + '_ {
    tools
        .iter()
        .filter(|t| {
            t.untrusted() || !bindery_bindings::depends::untrusted_lookups(tools, t).is_empty()
        })
        .map(|t| t.name().to_string())
}

impl LiveTools {
    pub fn new(tools: Vec<BoundTool>) -> Self {
        let untrusted = untrusted_names(&tools).collect();
        LiveTools(
            Arc::new(RwLock::new(Arc::new(tools))),
            Arc::new(RwLock::new(untrusted)),
        )
    }

    /// Whether a result of the tool called `name` is untrusted: by the
    /// tools now, or by any list this agent had before.
    pub fn untrusted(&self, name: &str) -> bool {
        self.1
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// The list as it is now; later changes do not touch it.
    pub fn snapshot(&self) -> Arc<Vec<BoundTool>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The tools of a snapshot, in order.
    pub fn iter(&self) -> std::vec::IntoIter<BoundTool> {
        self.snapshot().as_ref().clone().into_iter()
    }

    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    // Only MCP servers change a list.
    pub(crate) fn set(&self, tools: Vec<BoundTool>) {
        self.1
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(untrusted_names(&tools));
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tools);
    }
}

/// Bindings applied again after a change (pure): problems come back as
/// warnings, and a tool that has an argument a binding names but did not
/// get bound (an `omit` binding on an argument that became required) is
/// left out with a warning, so a bound argument never reaches the model.
pub fn rebind(
    mut tools: Vec<BoundTool>,
    bindings: &[Binding],
    layer: BindingLayer,
    params: &[ParameterDecl],
    place: &str,
) -> (Vec<BoundTool>, Vec<Diagnostic>) {
    let mut diags = Vec::new();
    apply_bindings_with(
        &mut tools,
        bindings,
        layer,
        params,
        place,
        |_| Level::Warning,
        &mut diags,
    );
    for d in &mut diags {
        d.level = Level::Warning;
    }
    let name_of = |t: &BoundTool| match layer {
        BindingLayer::Toolbox => t.spec().local_name.clone(),
        BindingLayer::Agent => t.spec().name.clone(),
    };
    tools.retain(|t| {
        let missed = bindings.iter().find(|b| {
            let declared = match &b.value {
                BindingValue::Param(p) => params.iter().find(|d| &d.name == p),
                BindingValue::Literal(_) | BindingValue::Identity(_) => None,
            };
            let skipped = matches!(&b.value, BindingValue::Param(_)) && declared.is_none()
                || b.when_unbound == WhenUnbound::Expose && declared.is_some_and(|d| d.secret);
            !skipped
                && glob_matches(b.tool.as_deref().unwrap_or("*"), &name_of(t))
                && t.spec().arg(&b.arg).is_some()
                && t.binding_for(&b.arg).is_none()
        });
        if let Some(b) = missed {
            diags.push(Diagnostic::warning(format!(
                "{place}: tool `{}` is withheld: argument \"{}\" could not be bound (see above)",
                t.name(),
                b.arg
            )));
        }
        missed.is_none()
    });
    (tools, diags)
}

/// A changed listing's tools whose listing may be shown: secrets as
/// markers, a tool whose name holds one left out (a warning). What can
/// leak here is what the server holds and every value live in the process.
pub fn guard_listings(tools: Vec<BoundTool>, place: &str) -> Vec<BoundTool> {
    let secrets = bindery_bindings::secrets_for(&bindery_params::Values::new(), &tools);
    let own = bindery_params::scrub::Scrubber::of(&secrets);
    let live = bindery_params::live::scrubber();
    let scrub = |x: &str| live.scrub(&own.scrub(x));
    let guard =
        bindery_bindings::listing::Guard::new(&scrub, secrets.iter().map(|(_, s)| s)).with_live();
    tools
        .into_iter()
        .filter_map(|t| match guard.check(t) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("{place}: {e}");
                None
            }
        })
        .collect()
}

/// The tools of each toolbox of an agent (after the toolbox's own
/// bindings, before the agent-level ones) and what rebuilding the list needs.
pub struct Assembly {
    /// One entry per toolbox, in order.
    pub parts: Vec<Vec<BoundTool>>,
    pub agent_bindings: Vec<Binding>,
    /// The agent-level `tools` declarations (`readOnly`, `depends_on`).
    pub agent_decls: Vec<bindery_spec::ToolDecl>,
    pub params: Vec<ParameterDecl>,
    /// `agent.yaml: agent `invoices``.
    pub here: String,
}

impl Assembly {
    /// The agent's tool list from the parts (pure): a name taken by an
    /// earlier tool is dropped with a warning, then agent-level bindings.
    pub fn assemble(&self) -> (Vec<BoundTool>, Vec<Diagnostic>) {
        let mut all: Vec<BoundTool> = Vec::new();
        let mut diags = Vec::new();
        for t in self.parts.iter().flatten() {
            if all.iter().any(|x| x.name() == t.name()) {
                diags.push(Diagnostic::warning(format!(
                    "{}: tool `{}` is defined twice; the later one is left out",
                    self.here,
                    t.name()
                )));
                continue;
            }
            all.push(t.clone());
        }
        let (mut all, more) = rebind(
            all,
            &self.agent_bindings,
            BindingLayer::Agent,
            &self.params,
            &format!("{}, agent-level bindings", self.here),
        );
        diags.extend(more);
        bindery_bindings::depends::apply_agent_decls(&mut all, &self.agent_decls);
        (all, diags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_tools::{
        ArgSpec, CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec, Transport,
    };

    struct Fake(ToolSpec);

    #[async_trait::async_trait]
    impl Tool for Fake {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        async fn call(&self, _: CallArgs, _: &CallContext) -> Result<ToolOutput, ToolError> {
            Err(ToolError::Unavailable)
        }
    }

    fn tool(name: &str, args: &[(&str, bool)]) -> BoundTool {
        BoundTool::new(Arc::new(Fake(ToolSpec {
            name: format!("mcp_s_{name}"),
            local_name: name.to_string(),
            description: String::new(),
            args: args
                .iter()
                .map(|(a, required)| ArgSpec {
                    name: a.to_string(),
                    description: String::new(),
                    required: *required,
                    schema: serde_json::json!({"type": "string"}),
                    transport: Transport::Json,
                })
                .collect(),
            writes: true,
        })))
    }

    fn binding(yaml: &str) -> Binding {
        // Through JSON: serde_yaml reads enums as YAML tags.
        serde_json::from_value(serde_yaml::from_str(yaml).unwrap()).unwrap()
    }

    #[test]
    fn a_binding_that_matches_nothing_after_a_change_is_a_warning() {
        let tools = vec![tool("echo", &[("message", true)])];
        let (tools, diags) = rebind(
            tools,
            &[binding("{tool: gone, arg: x, value: {literal: 1}}")],
            BindingLayer::Toolbox,
            &[],
            "here",
        );
        assert_eq!(tools.len(), 1);
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].level, Level::Warning);
        assert!(diags[0].message.contains("matches no tool"), "{diags:?}");
    }

    #[test]
    fn a_tool_whose_bound_argument_cannot_be_bound_is_withheld() {
        // `omit` cannot bind a required argument: the tool must not show it.
        let tools = vec![tool("a", &[("tenant", true)]), tool("b", &[("x", true)])];
        let (tools, diags) = rebind(
            tools,
            &[binding(
                "{arg: tenant, value: {param: t}, whenUnbound: omit}",
            )],
            BindingLayer::Toolbox,
            &[serde_yaml::from_str("{name: t}").unwrap()],
            "here",
        );
        let names: Vec<&str> = tools.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["mcp_s_b"]);
        assert!(diags.iter().all(|d| d.level == Level::Warning));
        assert!(
            diags
                .iter()
                .any(|d| d.message.contains("`mcp_s_a` is withheld")),
            "{diags:?}"
        );
    }

    #[test]
    fn assembling_keeps_the_first_of_two_names_and_applies_agent_bindings() {
        let asm = Assembly {
            parts: vec![
                vec![tool("echo", &[("message", true)])],
                vec![tool("echo", &[]), tool("sum", &[("a", true)])],
            ],
            agent_bindings: vec![binding("{tool: mcp_s_sum, arg: a, value: {literal: 1}}")],
            agent_decls: vec![],
            params: vec![],
            here: "here".into(),
        };
        let (tools, diags) = asm.assemble();
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0].spec().args.len(), 1);
        assert_eq!(tools[1].bindings().len(), 1);
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert!(diags[0].message.contains("defined twice"));
    }

    #[test]
    fn a_changed_listing_shows_no_live_value_and_drops_a_tool_named_after_one() {
        let canary = "CANARY-live-listing-91c3";
        let _live = bindery_params::live::register(vec![(
            "api_token".into(),
            bindery_params::SecretString::new(canary),
        )]);
        let echo = tool("echo", &[("q", true)]);
        let described = BoundTool::new(Arc::new(Fake(ToolSpec {
            description: format!("auth {canary}"),
            ..echo.spec().clone()
        })));
        let named = tool(&format!("t_{canary}"), &[]);
        // A session's value as a name would hold it: not its exact text.
        let folded = tool(&canary.replace('-', "_").to_lowercase(), &[]);
        let folded_arg = tool("x", &[(&canary.replace('-', ""), true)]);
        let kept = guard_listings(
            vec![described, named, folded, folded_arg],
            "toolbox 1 (mcp s)",
        );
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].spec().description, "auth <secret:api_token>");
    }
}
