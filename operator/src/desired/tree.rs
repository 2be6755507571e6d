//! The agent tree of a tenant: its agent and every helper below it,
//! resolved by name among the namespace's `Agent`s.

use std::collections::{BTreeMap, BTreeSet};

use bindery_spec::{AgentSpec, BindingValue};

/// One agent of the tree, with how its caller refers to it.
#[derive(Clone, Debug)]
pub(crate) struct TreeAgent<'a> {
    pub name: String,
    pub spec: &'a AgentSpec,
    /// Parameters the caller's `with` fills (empty for the root).
    pub filled_by_caller: BTreeSet<String>,
    /// The root is the tenant's agent.
    pub root: bool,
}

/// The tree in breadth-first order (root first), or what is missing.
pub(crate) fn resolve<'a>(
    root: &str,
    agents: &'a BTreeMap<String, AgentSpec>,
) -> Result<Vec<TreeAgent<'a>>, Vec<String>> {
    let Some(spec) = agents.get(root) else {
        return Err(vec![format!(
            "Agent `{root}` does not exist in this namespace"
        )]);
    };
    let mut out = vec![TreeAgent {
        name: root.to_string(),
        spec,
        filled_by_caller: BTreeSet::new(),
        root: true,
    }];
    let mut problems = Vec::new();
    let mut seen = BTreeSet::from([root.to_string()]);
    let mut next = 0;
    while next < out.len() {
        let caller = out[next].clone();
        next += 1;
        for (i, h) in caller.spec.helpers.iter().enumerate() {
            let Some(name) = &h.agent else {
                problems.push(format!(
                    "Agent `{}`, helper {}: in Kubernetes a helper is another Agent, given by `agent: NAME` (not `path`)",
                    caller.name,
                    i + 1
                ));
                continue;
            };
            let Some(spec) = agents.get(name) else {
                problems.push(format!(
                    "Agent `{}`, helper {}: Agent `{name}` does not exist in this namespace",
                    caller.name,
                    i + 1
                ));
                continue;
            };
            let filled: BTreeSet<String> = h
                .with
                .iter()
                .filter(|(_, v)| matches!(v, BindingValue::Param(_) | BindingValue::Literal(_)))
                .map(|(k, _)| k.clone())
                .collect();
            // A helper reached twice (or a cycle) is one agent of the tree.
            if seen.insert(name.clone()) {
                out.push(TreeAgent {
                    name: name.clone(),
                    spec,
                    filled_by_caller: filled,
                    root: false,
                });
            } else if let Some(existing) = out.iter_mut().find(|a| &a.name == name && !a.root) {
                existing.filled_by_caller = existing
                    .filled_by_caller
                    .intersection(&filled)
                    .cloned()
                    .collect();
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}
