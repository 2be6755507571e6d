//! Which calls wait for a person: `confirm` selectors, matched like
//! bindings' `tool` globs (a toolbox's on the names inside it, the agent's
//! on model-visible names).

use super::{glob_matches, BoundTool};
use bindery_spec::diagnostic::{Diagnostic, Level};
use bindery_spec::{ConfirmKeyword, ConfirmSelector, ToolboxConfirm};
use bindery_tools::Disposition;

/// Mark the tools of one toolbox that its `confirm` selects.
pub fn apply_toolbox_confirm(tools: &mut [BoundTool], confirm: Option<&ToolboxConfirm>) {
    let Some(confirm) = confirm else {
        return;
    };
    for t in tools.iter_mut() {
        if toolbox_selects(confirm, &t.spec().local_name, t.writes()) {
            *t = t.with_disposition(Disposition::Confirm);
        } else if let ToolboxConfirm::Tools(sel) = confirm {
            let local = t.spec().local_name.clone();
            for c in conditions(sel, &local) {
                *t = t.with_confirm_when(c);
            }
        }
    }
}

/// The conditions of the selectors that match `name` and ask only when
/// their condition holds.
pub fn conditions<'a>(
    selectors: &'a [ConfirmSelector],
    name: &'a str,
) -> impl Iterator<Item = &'a str> + 'a {
    selectors
        .iter()
        .filter(move |s| glob_matches(&s.tool, name))
        .filter_map(|s| s.when.as_deref())
}

/// Whether a toolbox's `confirm` selects the tool called `local` in it,
/// which `writes` (or may).
pub fn toolbox_selects(confirm: &ToolboxConfirm, local: &str, writes: bool) -> bool {
    match confirm {
        ToolboxConfirm::Writes(ConfirmKeyword::Writes) => writes,
        ToolboxConfirm::Tools(sel) => selects(sel, local),
    }
}

/// The typo guard: a selector that matches none of `names` protects
/// nothing, so it is reported at `level` (a warning where tools come late,
/// from an MCP server). `place` says where the selectors were written.
pub fn check_selectors(
    selectors: &[ConfirmSelector],
    names: &[&str],
    place: &str,
    level: impl Fn(&ConfirmSelector) -> Level,
    diags: &mut Vec<Diagnostic>,
) {
    for s in selectors {
        if !names.iter().any(|n| glob_matches(&s.tool, n)) {
            diags.push(Diagnostic {
                level: level(s),
                message: format!(
                    "{place}: confirm selector `{}` matches no tool (tools: {}); fix the name, or no call will wait for approval",
                    s.tool,
                    names.join(", ")
                ),
            });
        }
    }
}

/// The selectors of a toolbox's `confirm` (none for `writes`).
pub fn toolbox_selectors(confirm: Option<&ToolboxConfirm>) -> &[ConfirmSelector] {
    match confirm {
        Some(ToolboxConfirm::Tools(sel)) => sel,
        _ => &[],
    }
}

/// Whether one of `selectors` without a condition matches `name`: every
/// call of it asks.
pub fn selects(selectors: &[ConfirmSelector], name: &str) -> bool {
    selectors
        .iter()
        .any(|s| s.when.is_none() && glob_matches(&s.tool, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confirm(yaml: &str) -> ToolboxConfirm {
        serde_json::from_value(serde_yaml::from_str(yaml).unwrap()).unwrap()
    }

    #[test]
    fn writes_selects_effectful_tools_and_globs_select_by_name() {
        let w = confirm("writes");
        assert!(toolbox_selects(&w, "delete_invoice", true));
        assert!(!toolbox_selects(&w, "list_invoices", false));
        let g = confirm("[{tool: 'delete-*'}]");
        assert!(toolbox_selects(&g, "delete-user", false));
        assert!(!toolbox_selects(&g, "list-users", true));
        assert!(serde_json::from_str::<ToolboxConfirm>("\"reads\"").is_err());
    }
}
