//! Which operations of an HTTP API become tools: a predicate on each
//! operation's method, path, operationId and (PostgREST) table, the same
//! predicates agents-exe's `Filter` has. An operation the filter refuses
//! is never a tool, so the model cannot call it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A predicate on an endpoint. In YAML:
/// `filter: {and: [{methodEquals: GET}, {not: {pathPrefix: /admin}}]}`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum EndpointFilter {
    /// Every one holds (none given: always).
    And(Vec<EndpointFilter>),
    /// One at least holds (none given: never).
    Or(Vec<EndpointFilter>),
    Not(Box<EndpointFilter>),
    /// The path starts with these whole segments: `/api` matches
    /// `/api/v1`, not `/apikey`.
    PathPrefix(String),
    /// The path ends with these whole segments.
    PathSuffix(String),
    PathEqual(String),
    /// The path holds this text anywhere.
    PathContains(String),
    /// `GET`, `post`, …: case does not matter.
    MethodEquals(String),
    /// An OpenAPI operation's `operationId`, exactly.
    OperationIdEquals(String),
    /// A PostgREST table (the path without its leading `/`), exactly.
    TableNameEquals(String),
    AlwaysTrue,
    AlwaysFalse,
}

/// What a filter looks at in one operation.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint<'a> {
    pub method: &'a str,
    /// The path template as the document writes it (`/pets/{id}`).
    pub path: &'a str,
    pub operation_id: Option<&'a str>,
    /// PostgREST's table; `None` for an OpenAPI operation.
    pub table: Option<&'a str>,
}

/// A path with one leading `/`, no trailing `/` and no empty segment.
pub fn normalize_path(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    format!("/{}", segments.join("/"))
}

fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

impl EndpointFilter {
    pub fn matches(&self, e: &Endpoint<'_>) -> bool {
        let path = normalize_path(e.path);
        match self {
            EndpointFilter::And(all) => all.iter().all(|f| f.matches(e)),
            EndpointFilter::Or(any) => any.iter().any(|f| f.matches(e)),
            EndpointFilter::Not(f) => !f.matches(e),
            EndpointFilter::PathPrefix(p) => segments(&path).starts_with(&segments(p)),
            EndpointFilter::PathSuffix(p) => segments(&path).ends_with(&segments(p)),
            EndpointFilter::PathEqual(p) => path == normalize_path(p),
            EndpointFilter::PathContains(p) => path.contains(p.as_str()),
            EndpointFilter::MethodEquals(m) => e.method.eq_ignore_ascii_case(m),
            EndpointFilter::OperationIdEquals(id) => e.operation_id == Some(id.as_str()),
            EndpointFilter::TableNameEquals(t) => e.table == Some(t.as_str()),
            EndpointFilter::AlwaysTrue => true,
            EndpointFilter::AlwaysFalse => false,
        }
    }
}

/// The schema the `Agent` resource shows for `filter`: a recursive type
/// has no structural schema, so the API server keeps it as written and
/// `check` (and the operator) read it.
pub fn filter_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "Which operations become tools: `{methodEquals: GET}`, `{pathPrefix: /pets}`, `{pathSuffix: …}`, `{pathEqual: …}`, `{pathContains: …}`, `{operationIdEquals: …}`, `{tableNameEquals: …}`, `alwaysTrue`, `alwaysFalse`, combined with `{and: [...]}`, `{or: [...]}`, `{not: …}`. Without it, every operation is a tool.",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use EndpointFilter as F;

    fn op<'a>(method: &'a str, path: &'a str) -> Endpoint<'a> {
        Endpoint {
            method,
            path,
            operation_id: None,
            table: None,
        }
    }

    #[test]
    fn paths_match_by_whole_segments_after_normalising() {
        assert_eq!(normalize_path("api//v1/"), "/api/v1");
        assert_eq!(normalize_path(""), "/");
        let prefix = F::PathPrefix("/api".into());
        assert!(prefix.matches(&op("GET", "/api/v1/pets")));
        assert!(prefix.matches(&op("GET", "/api")));
        assert!(!prefix.matches(&op("GET", "/apikey")));
        let suffix = F::PathSuffix("pets/".into());
        assert!(suffix.matches(&op("GET", "/v1/pets")));
        assert!(!suffix.matches(&op("GET", "/v1/carpets")));
        assert!(F::PathEqual("pets".into()).matches(&op("GET", "/pets/")));
        assert!(F::PathContains("et".into()).matches(&op("GET", "/pets")));
        assert!(F::PathPrefix("/".into()).matches(&op("GET", "/anything")));
    }

    #[test]
    fn methods_ignore_case_and_ids_and_tables_are_exact() {
        assert!(F::MethodEquals("get".into()).matches(&op("GET", "/")));
        assert!(!F::MethodEquals("GET".into()).matches(&op("DELETE", "/")));
        let e = Endpoint {
            method: "GET",
            path: "/pets/{id}",
            operation_id: Some("getPet"),
            table: None,
        };
        assert!(F::OperationIdEquals("getPet".into()).matches(&e));
        assert!(!F::OperationIdEquals("getpet".into()).matches(&e));
        assert!(!F::TableNameEquals("pets".into()).matches(&e));
        let row = Endpoint {
            table: Some("pets"),
            ..op("GET", "/pets")
        };
        assert!(F::TableNameEquals("pets".into()).matches(&row));
    }

    #[test]
    fn combinators_read_from_yaml() {
        // As agent files are read: YAML to a JSON value, then the types.
        let read = |yaml: &str| {
            let v: serde_json::Value = serde_yaml::from_str(yaml).unwrap();
            serde_json::from_value::<EndpointFilter>(v)
        };
        let f =
            read("and: [{methodEquals: GET}, {not: {or: [{pathPrefix: /admin}, alwaysFalse]}}]")
                .unwrap();
        assert!(f.matches(&op("GET", "/pets")));
        assert!(!f.matches(&op("DELETE", "/pets")));
        assert!(!f.matches(&op("GET", "/admin/users")));
        assert!(F::And(vec![]).matches(&op("GET", "/")));
        assert!(!F::Or(vec![]).matches(&op("GET", "/")));
        let err = read("methodIs: GET").unwrap_err();
        assert!(
            err.to_string().contains("unknown variant `methodIs`"),
            "{err}"
        );
    }
}
