//! An operation's arguments as agents-exe gives them to the model, so an
//! agents-exe agent's prompts and recorded calls keep matching
//! (`naming: agentsExe`):
//!
//! - OpenAPI: each path and query parameter is `p_<name>`, the JSON body
//!   is one object argument `b`;
//! - PostgREST: the column filters are one object `filters`
//!   (`{"col": "op.value"}`), `limit`/`offset`/`select` are `subset`
//!   (`{"limit", "offset", "columns"}`), `order` is `ranking`
//!   (`{"order"}`), and the body of an insert or update is `body`.
//!
//! Pure: the operation Bindery read, regrouped. Each group still says
//! which keys it takes, so the model can send no query parameter the
//! document does not offer.
//!
//! An argument the agent binds (or a `depends_on` lookup fills) keeps
//! Bindery's name and place: the model never sees it, so agents-exe's
//! spelling does not matter for it, and its binding (`tenant_id`) keeps
//! pinning what it pins. No group takes its key: the model cannot send it
//! inside `filters` or `body` instead.

use serde_json::{json, Map, Value};

use super::document::{Location, Operation};
use crate::{ArgSpec, Transport};

/// `op` with agents-exe's arguments; `kept(arg)` keeps an argument as it is.
pub fn regroup(mut op: Operation, kept: impl Fn(&str) -> bool) -> Operation {
    let old: Vec<(ArgSpec, Location)> = std::mem::take(&mut op.spec.args)
        .into_iter()
        .zip(
            std::mem::take(&mut op.locations)
                .into_iter()
                .map(|(_, l)| l),
        )
        .collect();
    let mut args = Vec::new();
    let mut body = Group::default();
    let mut filters = Group::default();
    let mut subset = Group::default();
    let mut ranking = Group::default();
    // What a kept argument sets, by its name, its column and its wire
    // name: no group may set it another way.
    let mut reserved: Vec<String> = Vec::new();
    for (arg, location) in &old {
        if kept(&arg.name) {
            reserved.push(folded(&arg.name));
            match location {
                Location::Path(w) | Location::Query(w) | Location::BodyField(w) => {
                    reserved.push(folded(w))
                }
                _ => {}
            }
        }
    }
    let is_reserved = |key: &str| reserved.contains(&folded(key));
    for (arg, location) in old {
        if kept(&arg.name) {
            args.push((arg, location));
            continue;
        }
        match location {
            Location::Path(_) | Location::Query(_) if op.table.is_none() => {
                let name = format!("p_{}", arg.name);
                args.push((ArgSpec { name, ..arg }, location));
            }
            Location::Query(wire) => match wire.as_str() {
                "order" => ranking.add("order", &arg, string(&arg)),
                "select" => subset.add("columns", &arg, string(&arg)),
                _ => subset.add(&wire, &arg, string(&arg)),
            },
            Location::Filter => filters.add(&arg.name, &arg, string(&arg)),
            Location::Body if !is_reserved(&arg.name) => {
                body.add(&arg.name, &arg, arg.schema.clone())
            }
            Location::BodyField(ref col) if !is_reserved(col) => {
                body.add(col, &arg, arg.schema.clone())
            }
            Location::Body | Location::BodyField(_) => {}
            other => args.push((arg, other)),
        }
    }
    let postgrest = op.table.is_some();
    if !filters.is_empty() {
        let columns = filters.keys();
        args.push(filters.into_arg(
            "filters",
            "Row filters on columns, each a PostgREST operator and value (eq.5, gt.5, in.(1,2), like.*x*, is.null); a bare value means eq.",
            Location::Filters(columns),
        ));
    }
    if !subset.is_empty() {
        let keys = subset.keys();
        args.push(subset.into_arg(
            "subset",
            "Pagination and column selection",
            Location::Subset(keys),
        ));
    }
    if !ranking.is_empty() {
        args.push(ranking.into_arg("ranking", "Result ordering", Location::Ranking));
    }
    if op.has_body {
        let name = if postgrest { "body" } else { "b" };
        let required = !postgrest && !body.required.is_empty();
        let keys = (!body.is_empty()).then(|| body.keys());
        let mut arg = body.into_arg(name, "Request body", Location::WholeBody { keys, reserved });
        arg.0.required = required;
        args.push(arg);
    }
    let (specs, locations): (Vec<ArgSpec>, Vec<Location>) = args.into_iter().unzip();
    op.locations = specs
        .iter()
        .map(|a| a.name.clone())
        .zip(locations)
        .collect();
    op.spec.args = specs;
    op
}

/// A key as a lenient server may read it: case folded the way Unicode
/// lets it (`ı`, `İ`, the Kelvin sign, `ſ`), then letters and digits only
/// (`tenant-id`, `tenantId`, `tenant_id `, a soft hyphen: all `tenantid`).
/// A body key that folds to a bound argument's name is not the body's.
pub fn folded(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            'ı' | 'İ' => 'i',
            '\u{212a}' => 'k',
            'ſ' => 's',
            c => c,
        })
        .flat_map(char::to_lowercase)
        .filter(char::is_ascii_alphanumeric)
        .collect()
}

/// agents-exe offers a PostgREST query value as a string.
fn string(arg: &ArgSpec) -> Value {
    json!({"type": "string", "description": arg.description})
}

/// The properties one object argument gathers.
#[derive(Default)]
struct Group {
    properties: Map<String, Value>,
    required: Vec<String>,
}

impl Group {
    fn add(&mut self, key: &str, arg: &ArgSpec, schema: Value) {
        if arg.required {
            self.required.push(key.to_string());
        }
        self.properties.insert(key.to_string(), schema);
    }

    fn is_empty(&self) -> bool {
        self.properties.is_empty()
    }

    fn keys(&self) -> Vec<String> {
        self.properties.keys().cloned().collect()
    }

    fn into_arg(self, name: &str, description: &str, location: Location) -> (ArgSpec, Location) {
        // A body the document lists no property of takes any key (but a
        // bound one): the schema says so rather than promise none.
        let free = matches!(location, Location::WholeBody { keys: None, .. });
        let mut schema = json!({
            "type": "object",
            "description": description,
            "properties": self.properties,
            "additionalProperties": free,
        });
        if !self.required.is_empty() {
            schema["required"] = json!(self.required);
        }
        let arg = ArgSpec {
            name: name.to_string(),
            description: description.to_string(),
            required: false,
            schema,
            transport: Transport::Json,
        };
        (arg, location)
    }
}
