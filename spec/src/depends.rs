//! Tool declarations (`tools:` on a toolbox or the agent): a tool that is
//! read-only although its kind says it may write, and the lookups a tool
//! depends on (`depends_on`). Pure: the checks here need no tool; those
//! that need the tools' descriptions run when an agent loads.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::jsonpath::Path;
use crate::diagnostic::Diagnostic;

/// What the author says about the tools a glob selects (on the names inside
/// the toolbox, or on model-visible names at agent level, like bindings).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolDecl {
    /// Glob (`*` matches any run of characters) on the tool name.
    pub tool: String,
    /// The tool changes nothing (a bash tool, which is otherwise taken to
    /// write): it may serve as a lookup.
    #[serde(default, rename = "readOnly", skip_serializing_if = "is_false")]
    pub read_only: bool,
    /// Read-only lookups run before the tool, in order; what they find fills
    /// the tool's API-owned arguments, which the model then never sees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<Dependency>,
    /// Its output may carry instructions from outside (a web page, a
    /// ticket, a free-text row): once a session has taken in one of its
    /// results, every `egress` tool's call asks a person first.
    #[serde(default, skip_serializing_if = "is_false")]
    pub untrusted: bool,
    /// It can send data out (an email, an HTTP post, a message): in a
    /// session that took in an `untrusted` result, its calls ask first.
    #[serde(default, skip_serializing_if = "is_false")]
    pub egress: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One lookup a tool needs before it can run.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Dependency {
    /// The lookup tool: a model-visible name, or a name inside the same toolbox.
    pub tool: String,
    #[serde(default)]
    pub when: When,
    /// The lookup's arguments, each read from the parent's arguments (`$.date`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arguments: BTreeMap<String, String>,
    /// The lookup returns options to choose from; absent: one object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<Select>,
    /// Parent destination (`$.slot_token`) to source (`$.slot_token`, read
    /// from the chosen option, or from the whole response without `select`).
    pub map: BTreeMap<String, String>,
    /// How long a lookup's result (and a choice or confirmation resting on
    /// it) stays valid, in milliseconds (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

/// When a lookup runs.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// Every time (a valid cached result may serve).
    #[default]
    Always,
    /// Only when one of its destinations is not given already.
    Missing,
}

/// How options are read from a lookup's response.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Select {
    /// The array of options in the response (`$.slots`).
    pub items_path: String,
    /// An option's id, relative to the option (`$.slot_token`).
    pub id_path: String,
    /// What a person reads (`$.label`); absent: the id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_path: Option<String>,
    /// Show opaque ids; the real one stays on the server.
    #[serde(default, skip_serializing_if = "is_false")]
    pub id_sensitive: bool,
    /// Values shown with each option and in the confirmation (`time: $.label`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: BTreeMap<String, String>,
    /// Choose by itself when exactly one option equals what the user said.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<Match>,
}

/// A preference of the user compared with each option: trimmed,
/// case-insensitive equality, nothing fuzzier.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// In the parent's arguments (`$.preferred_time`).
    pub input_path: String,
    /// In one option (`$.label`).
    pub item_path: String,
}

impl Dependency {
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms.unwrap_or(30_000)
    }

    /// The top-level parent arguments this dependency fills.
    pub fn destinations(&self) -> Vec<String> {
        self.map
            .keys()
            .filter_map(|d| Path::parse(d).ok())
            .filter_map(|p| p.top().map(str::to_string))
            .collect()
    }

    /// Every path it holds, with where it is written.
    fn paths(&self) -> Vec<(String, &str)> {
        let mut out: Vec<(String, &str)> = Vec::new();
        for (arg, p) in &self.arguments {
            out.push((format!("arguments.{arg}"), p));
        }
        for (d, s) in &self.map {
            out.push((format!("map key {d}"), d));
            out.push((format!("map.{d}"), s));
        }
        if let Some(s) = &self.select {
            out.push(("select.items_path".into(), &s.items_path));
            out.push(("select.id_path".into(), &s.id_path));
            if let Some(l) = &s.label_path {
                out.push(("select.label_path".into(), l));
            }
            for (k, f) in &s.facts {
                out.push((format!("select.facts.{k}"), f));
            }
            if let Some(m) = &s.match_ {
                out.push(("select.match.input_path".into(), &m.input_path));
                out.push(("select.match.item_path".into(), &m.item_path));
            }
        }
        out
    }
}

/// The checks that need no tool: paths that parse, no dependency twice, no
/// destination filled twice, no cycle among the names as written. `place`
/// says where the declarations are.
pub fn check_decls(decls: &[ToolDecl], place: &str, diags: &mut Vec<Diagnostic>) {
    for d in decls {
        let here = format!("{place}, tool `{}`", d.tool);
        let mut seen = BTreeSet::new();
        let mut filled: BTreeMap<String, usize> = BTreeMap::new();
        for (i, dep) in d.depends_on.iter().enumerate() {
            let at = format!("{here}, depends_on {} (tool `{}`)", i + 1, dep.tool);
            for (what, p) in dep.paths() {
                if let Err(e) = Path::parse(p) {
                    diags.push(Diagnostic::error(format!("{at}: {what} `{p}`: {e}")));
                }
            }
            if !seen.insert((dep.tool.as_str(), &dep.arguments)) {
                diags.push(Diagnostic::error(format!(
                    "{at}: a duplicate dependency (the same tool with the same arguments is listed twice); remove one"
                )));
            }
            for dest in dep.destinations() {
                if let Some(first) = filled.insert(dest.clone(), i + 1) {
                    diags.push(Diagnostic::error(format!(
                        "{at}: destination `$.{dest}` is already filled by depends_on {first}; each argument is filled by one dependency"
                    )));
                }
            }
        }
    }
    if let Some(cycle) = find_cycle(decls) {
        diags.push(Diagnostic::error(format!(
            "{place}, tool `{}`: its dependencies form a cycle ({}); a lookup cannot need itself",
            cycle[0],
            cycle.join(" -> ")
        )));
    }
}

/// A cycle among the tools as named in the declarations, if any.
fn find_cycle(decls: &[ToolDecl]) -> Option<Vec<String>> {
    let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for d in decls {
        edges
            .entry(d.tool.as_str())
            .or_default()
            .extend(d.depends_on.iter().map(|x| x.tool.as_str()));
    }
    fn walk<'a>(
        n: &'a str,
        edges: &BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| *s == n) {
            let mut c: Vec<String> = stack[at..].iter().map(|s| s.to_string()).collect();
            c.push(n.to_string());
            return Some(c);
        }
        stack.push(n);
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = walk(next, edges, stack) {
                return Some(c);
            }
        }
        stack.pop();
        None
    }
    edges.keys().find_map(|n| walk(n, &edges, &mut Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decls(yaml: &str) -> Vec<ToolDecl> {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn errors(yaml: &str) -> Vec<String> {
        let mut d = Vec::new();
        check_decls(&decls(yaml), "f.yaml", &mut d);
        d.into_iter().map(|d| d.message).collect()
    }

    #[test]
    fn the_seed_declaration_reads_and_passes() {
        let e = errors(
            "[{tool: book, depends_on: [{tool: availability, when: always, arguments: {date: $.date},
               select: {items_path: $.slots, id_path: $.slot_token, label_path: $.label, id_sensitive: true,
                        facts: {time: $.label}, match: {input_path: $.preferred_time, item_path: $.label}},
               map: {$.slot_token: $.slot_token}, ttl_ms: 30000}]}]",
        );
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn cycles_duplicates_and_overlaps_are_named() {
        let e = errors(
            "[{tool: a, depends_on: [{tool: b, map: {$.x: $.x}}]}, {tool: b, depends_on: [{tool: a, map: {$.y: $.y}}]}]",
        );
        assert!(e.iter().any(|m| m.contains("cycle (a -> b -> a)")), "{e:?}");
        let e = errors(
            "[{tool: a, depends_on: [{tool: b, map: {$.x: $.x}}, {tool: b, map: {$.y: $.y}}]}]",
        );
        assert!(
            e.iter().any(|m| m.contains("duplicate dependency")),
            "{e:?}"
        );
        let e = errors(
            "[{tool: a, depends_on: [{tool: b, map: {$.x: $.x}}, {tool: c, map: {$.x: $.z}}]}]",
        );
        assert!(
            e.iter().any(|m| m.contains("`$.x` is already filled")),
            "{e:?}"
        );
        let e = errors("[{tool: a, depends_on: [{tool: b, map: {x: $.x}}]}]");
        assert!(e.iter().any(|m| m.contains("map key x")), "{e:?}");
    }
}
