//! One status row per parameter of the agent tree, and the problems a
//! human must fix: which parameter, which Secret or ConfigMap and key.

use std::collections::{BTreeMap, BTreeSet};

use bindery_spec::{ParameterDecl, Scope, ValueSource};

use super::tree::TreeAgent;
use super::{Inputs, RefObject};
use crate::crd::{KeyRef, ParameterRow, TenantParameter};

/// How the tenant supplies one parameter to the pod.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Supply {
    /// A value written into the params file (never for a secret).
    Value(serde_json::Value),
    /// An environment variable from a Secret key.
    Secret(KeyRef),
    /// An environment variable from a ConfigMap key.
    ConfigMap(KeyRef),
}

#[derive(Debug, Default)]
pub(crate) struct Resolution {
    pub rows: Vec<ParameterRow>,
    /// Name → (how, pinned), for parameters the pod gets.
    pub supplies: BTreeMap<String, (Supply, bool)>,
    /// Problems, each naming the parameter and the object and key.
    pub problems: Vec<String>,
}

pub(crate) fn resolve(tree: &[TreeAgent<'_>], inputs: &Inputs<'_>) -> Resolution {
    let params: &[TenantParameter] = &inputs.tenant.spec.parameters;
    let mut out = Resolution::default();
    let declared: BTreeSet<&str> = tree
        .iter()
        .flat_map(|a| a.spec.parameters.iter().map(|d| d.name.as_str()))
        .collect();
    let known = if declared.is_empty() {
        "the tree declares no parameters".to_string()
    } else {
        format!(
            "declared: {}",
            declared.iter().copied().collect::<Vec<_>>().join(", ")
        )
    };
    for (i, p) in params.iter().enumerate() {
        if !declared.contains(p.name.as_str()) {
            out.problems.push(format!(
                "spec.parameters[{i}] `{}`: no agent of the tree declares it ({known})",
                p.name,
            ));
        }
    }
    // What each tenant parameter gives, checked once per name.
    let mut given: BTreeMap<&str, (Result<Supply, SupplyError>, bool)> = BTreeMap::new();
    for p in params {
        let secret = tree
            .iter()
            .flat_map(|a| a.spec.parameters.iter())
            .any(|d| d.name == p.name && d.secret);
        given.insert(p.name.as_str(), (supply(p, secret, inputs), p.pinned));
    }
    for agent in tree {
        for decl in &agent.spec.parameters {
            let mut row = row(agent, decl, given.get(decl.name.as_str()));
            if let Some((Ok(Supply::Secret(r)), _)) = given.get(decl.name.as_str()) {
                row.message = row.message.or_else(|| unchecked(r, inputs.secrets));
            }
            if let Some(msg) = row.message.as_ref().filter(|_| !row.bound && problem(&row)) {
                out.problems.push(format!(
                    "parameter `{}` of Agent `{}`: {msg}",
                    decl.name, agent.name
                ));
            }
            out.rows.push(row);
        }
    }
    for p in params {
        if let Some((Ok(s), pinned)) = given.get(p.name.as_str()) {
            out.supplies.insert(p.name.clone(), (s.clone(), *pinned));
        }
    }
    out
}

/// Whether an unbound row is something to fix (rather than a value each
/// session supplies).
fn problem(row: &ParameterRow) -> bool {
    row.source != "per-session"
}

/// Why a tenant parameter supplies no value, in the words of the Tenant's
/// `spec.parameters` (and what to write instead).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SupplyError {
    #[error("a secret parameter cannot take a plain `value` (it would land in a ConfigMap): put it in a Secret and use `valueFrom.secretKeyRef`")]
    SecretAsValue,
    #[error("`valueFrom` takes exactly one of secretKeyRef or configMapKeyRef")]
    ValueFromNotOne,
    #[error("give exactly one of `value` or `valueFrom`")]
    NotOne,
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// A Secret or ConfigMap key a Tenant refers to that is not there.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum KeyError {
    #[error("{kind} `{name}` does not exist")]
    NoObject { kind: &'static str, name: String },
    /// `keys`: those it has, for the user to pick from.
    #[error("{kind} `{name}` has no key `{key}` (keys: {keys})")]
    NoKey {
        kind: &'static str,
        name: String,
        key: String,
        keys: String,
    },
}

/// The most key names a status row lists (a ConfigMap may hold thousands).
const LISTED_KEYS: usize = 20;

/// `keys` for a status row: the first [`LISTED_KEYS`], then how many more.
fn listed(keys: &BTreeSet<String>) -> String {
    let total = keys.len();
    let mut out = keys
        .iter()
        .take(LISTED_KEYS)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if total > LISTED_KEYS {
        out.push_str(&format!(", and {} more", total - LISTED_KEYS));
    }
    out
}

/// Whether the Secret or ConfigMap key `r` exists; if not, which of the
/// object or the key is missing (and the keys there are).
pub(crate) fn check_key(
    kind: &'static str,
    r: &KeyRef,
    objs: &BTreeMap<String, RefObject>,
) -> Result<(), KeyError> {
    match objs.get(&r.name) {
        None => Err(KeyError::NoObject {
            kind,
            name: r.name.clone(),
        }),
        Some(o) if o.lacks(&r.key) => Err(KeyError::NoKey {
            kind,
            name: r.name.clone(),
            key: r.key.clone(),
            keys: o.keys.as_ref().map(listed).unwrap_or_default(),
        }),
        Some(_) => Ok(()),
    }
}

/// What a row says of a Secret key that could not be checked: the Secret
/// exists, but its metadata does not name its keys for certain.
pub(crate) fn unchecked(r: &KeyRef, secrets: &BTreeMap<String, RefObject>) -> Option<String> {
    secrets.get(&r.name).filter(|o| o.keys.is_none()).map(|_| {
        format!(
            "key `{}` not checked: Secret `{}` was written by a server-side apply of `stringData` (or its managedFields were cleared), so its key names are not on record; a missing key shows on the pod (CreateContainerConfigError). Write it with `data`, or `kubectl create secret`, to have it checked",
            r.key, r.name
        )
    })
}

fn supply(p: &TenantParameter, secret: bool, inputs: &Inputs<'_>) -> Result<Supply, SupplyError> {
    let check = check_key;
    match (&p.value, &p.value_from) {
        (Some(_), _) if secret => Err(SupplyError::SecretAsValue),
        (Some(v), None) => Ok(Supply::Value(v.clone())),
        (None, Some(vf)) => {
            match (&vf.secret_key_ref, &vf.config_map_key_ref) {
                (Some(r), None) => {
                    Ok(check("Secret", r, inputs.secrets).map(|_| Supply::Secret(r.clone()))?)
                }
                (None, Some(r)) => Ok(check("ConfigMap", r, inputs.config_maps)
                    .map(|_| Supply::ConfigMap(r.clone()))?),
                _ => Err(SupplyError::ValueFromNotOne),
            }
        }
        _ => Err(SupplyError::NotOne),
    }
}

fn row(
    agent: &TreeAgent<'_>,
    d: &ParameterDecl,
    given: Option<&(Result<Supply, SupplyError>, bool)>,
) -> ParameterRow {
    let mut row = ParameterRow {
        name: d.name.clone(),
        agent: agent.name.clone(),
        scope: d.scope.as_str().to_string(),
        secret: d.secret,
        required: d.required,
        source: "unbound".into(),
        bound: false,
        pinned: false,
        message: None,
    };
    match given {
        Some((Ok(s), pinned)) => {
            row.bound = true;
            row.pinned = *pinned;
            row.source = match s {
                Supply::Value(_) if *pinned => "pinned".into(),
                Supply::Value(_) => "value".into(),
                Supply::Secret(r) => format!("secret {}/{}", r.name, r.key),
                Supply::ConfigMap(r) => format!("configmap {}/{}", r.name, r.key),
            };
            if d.secret && matches!(s, Supply::ConfigMap(_)) {
                row.message = Some("a secret read from a ConfigMap: prefer a Secret".into());
            }
        }
        Some((Err(e), pinned)) => {
            row.pinned = *pinned;
            row.source = "invalid".into();
            row.message = Some(e.to_string());
        }
        None if agent.filled_by_caller.contains(&d.name) => {
            row.source = "with".into();
            row.bound = true;
            row.message = Some("filled by the calling agent's `with`".into());
        }
        None => match (&d.default, d.scope) {
            (Some(src), _) => {
                row.source = "default".into();
                row.bound = true;
                if !matches!(src, ValueSource::Value(_)) {
                    row.message = Some(format!("default read in the pod: {}", src.describe()));
                }
            }
            (None, Scope::Session | Scope::Message) => {
                row.source = "per-session".into();
                if d.required {
                    row.message =
                        Some("each session must supply it (or set it in spec.parameters)".into());
                }
            }
            (None, Scope::Process) if d.required => {
                row.message = Some(format!(
                    "required and unbound: add `{{name: {}, value: …}}` or a `valueFrom` to spec.parameters",
                    d.name
                ));
            }
            (None, Scope::Process) => {}
        },
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_lists_twenty_keys_then_how_many_more() {
        let few: BTreeSet<String> = ["a", "b"].map(String::from).into();
        assert_eq!(listed(&few), "a, b");
        let many: BTreeSet<String> = (0..25).map(|i| format!("k{i:02}")).collect();
        let text = listed(&many);
        assert!(text.starts_with("k00, k01,"), "{text}");
        assert!(text.ends_with("k19, and 5 more"), "{text}");
    }
}
