//! The CRD schemas, checked offline the way an apiserver checks objects
//! against them: structurally (the `openAPIV3Schema`, rewritten as JSON
//! Schema for the `jsonschema` crate) and by every CEL rule
//! (`x-kubernetes-validations`, evaluated by kube's client-side evaluator).
//!
//! Every check runs against both the checked-in `crds/*.yaml` and what
//! `crd_documents()` generates now.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use bindery_operator::crd::{KeyRef, ValueFrom};
use bindery_operator::desired::Rollout;
use kube::core::cel::{compile_schema, estimate_rule_cost, ErrorKind, ValidationError, Validator};
use serde_json::{json, Map, Value};

use crate::common::*;

// ---------------------------------------------------------------------------
// The schemas

/// One place the CRDs come from, and the `openAPIV3Schema` of each kind.
struct Source {
    name: &'static str,
    schemas: BTreeMap<String, Value>,
    /// The same schemas as JSON Schema, compiled once.
    validators: BTreeMap<String, jsonschema::Validator>,
}

impl Source {
    fn new(name: &'static str, schemas: BTreeMap<String, Value>) -> Source {
        let validators = schemas
            .iter()
            .map(|(kind, schema)| {
                let v = jsonschema::draft202012::options()
                    .should_validate_formats(true)
                    .build(&json_schema(schema, true))
                    .unwrap_or_else(|e| panic!("{name} {kind}: the rewritten schema: {e}"));
                (kind.clone(), v)
            })
            .collect();
        Source {
            name,
            schemas,
            validators,
        }
    }

    fn schema(&self, kind: &str) -> &Value {
        self.schemas
            .get(kind)
            .unwrap_or_else(|| panic!("{}: no CRD of kind {kind}", self.name))
    }

    /// What an apiserver would say about `object`, of kind `kind`.
    fn check(&self, kind: &str, object: &Value) -> Verdict {
        let structural = self.validators[kind]
            .iter_errors(object)
            .map(|e| format!("{} ({}): {e}", e.instance_path(), e.kind().keyword()))
            .collect();
        let cel = match Validator::new().validate(self.schema(kind), object, None) {
            Ok(()) => vec![],
            Err(errors) => errors.into_vec(),
        };
        Verdict { structural, cel }
    }
}

fn parse_crd(origin: &str, yaml: &str) -> (String, Value) {
    let crd: Value = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{origin}: {e}"));
    let kind = crd["spec"]["names"]["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("{origin}: no spec.names.kind"))
        .to_string();
    let versions = crd["spec"]["versions"].as_array().expect("spec.versions");
    assert_eq!(
        versions.len(),
        1,
        "{origin}: these tests know one version per CRD"
    );
    let schema = versions[0]["schema"]["openAPIV3Schema"].clone();
    assert!(schema.is_object(), "{origin}: no openAPIV3Schema");
    (kind, schema)
}

/// The checked-in CRDs and the generated ones, read and compiled once.
fn sources() -> &'static [Source] {
    static SOURCES: OnceLock<Vec<Source>> = OnceLock::new();
    SOURCES.get_or_init(load_sources)
}

fn load_sources() -> Vec<Source> {
    let dir = repo().join("crds");
    let mut on_disk = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let (kind, schema) = parse_crd(
                &path.display().to_string(),
                &std::fs::read_to_string(&path).unwrap(),
            );
            on_disk.insert(kind, schema);
        }
    }
    let generated = bindery_operator::crd::crd_documents()
        .into_iter()
        .map(|(name, yaml)| parse_crd(name, &yaml))
        .collect();
    let sources = vec![
        Source::new("crds/*.yaml", on_disk),
        Source::new("crd_documents()", generated),
    ];
    for s in &sources {
        let kinds: Vec<_> = s.schemas.keys().map(String::as_str).collect();
        assert_eq!(kinds, ["Agent", "AgentTenant"], "{}", s.name);
    }
    sources
}

/// The structural schema as JSON Schema (draft 2020-12), as an apiserver
/// reads it:
/// - `nullable: true` admits `null`;
/// - `x-kubernetes-int-or-string` is an integer or a string;
/// - an object with `properties` takes no other field (what `kubectl
///   apply`'s default strict field validation reports), unless it preserves
///   unknown fields;
/// - the root also has `apiVersion`, `kind` and `metadata`, which every
///   object has without the CRD naming them;
/// - other `x-kubernetes-*` keywords are left to be ignored (CEL is checked
///   apart).
fn json_schema(node: &Value, root: bool) -> Value {
    let Some(m) = node.as_object() else {
        return node.clone();
    };
    let flag = |k: &str| m.get(k).and_then(Value::as_bool).unwrap_or(false);
    let mut out = Map::new();
    for (k, v) in m {
        let v = match k.as_str() {
            "properties" => Value::Object(
                v.as_object()
                    .expect("properties is an object")
                    .iter()
                    .map(|(name, s)| (name.clone(), json_schema(s, false)))
                    .collect(),
            ),
            "items" | "additionalProperties" | "not" if v.is_object() => json_schema(v, false),
            "oneOf" | "anyOf" | "allOf" => Value::Array(
                v.as_array()
                    .expect("a junctor is a list")
                    .iter()
                    .map(|s| json_schema(s, false))
                    .collect(),
            ),
            "nullable" => continue,
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    let mut types: Vec<Value> = match m.get("type") {
        Some(t) => vec![t.clone()],
        None if flag("x-kubernetes-int-or-string") => vec![json!("integer"), json!("string")],
        None => vec![],
    };
    if !types.is_empty() {
        if flag("nullable") {
            types.push(json!("null"));
        }
        out.insert("type".into(), Value::Array(types));
    }
    if root {
        let props = out
            .entry("properties")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .unwrap();
        props.insert("apiVersion".into(), json!({"type": "string"}));
        props.insert("kind".into(), json!({"type": "string"}));
        props.insert("metadata".into(), json!({"type": "object"}));
    }
    if out.contains_key("properties")
        && !out.contains_key("additionalProperties")
        && !flag("x-kubernetes-preserve-unknown-fields")
    {
        out.insert("additionalProperties".into(), json!(false));
    }
    Value::Object(out)
}

/// What an apiserver would say about one object.
#[derive(Debug, Default)]
struct Verdict {
    /// `JSON pointer (keyword): message`.
    structural: Vec<String>,
    /// The failed CEL rules, as kube's evaluator reports them.
    cel: Vec<ValidationError>,
}

impl Verdict {
    fn is_clean(&self) -> bool {
        self.structural.is_empty() && self.cel.is_empty()
    }

    /// The one CEL message, and that it is a rule that said no (not one that
    /// failed to evaluate).
    fn cel_message(&self) -> Option<&str> {
        assert!(self.cel.len() <= 1, "more than one CEL failure: {self:#?}");
        self.cel.first().map(|e| {
            assert_eq!(e.kind, ErrorKind::ValidationFailure, "{e:#?}");
            e.message.as_str()
        })
    }
}

/// `check` against every source; the verdicts must agree.
fn check_all(kind: &str, object: &Value) -> Verdict {
    let mut verdicts = sources().iter().map(|s| (s.name, s.check(kind, object)));
    let (first_name, first) = verdicts.next().unwrap();
    for (name, v) in verdicts {
        assert_eq!(
            format!("{:?}", (&v.structural, &v.cel)),
            format!("{:?}", (&first.structural, &first.cel)),
            "{name} and {first_name} disagree on {object:#}"
        );
    }
    first
}

// ---------------------------------------------------------------------------
// The examples

fn example_documents() -> Vec<(String, Value)> {
    let mut docs = vec![];
    let dir = repo().join("examples/k8s");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let v: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{} document {i}: {e}", path.display()));
            let name = path.strip_prefix(repo()).unwrap().display().to_string();
            docs.push((format!("{name}#{i}"), v));
        }
    }
    docs
}

#[test]
fn every_example_resource_of_ours_validates() {
    let mut kinds = BTreeSet::new();
    for (name, doc) in example_documents() {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        if !api_version.starts_with("bindery.dev/") {
            continue;
        }
        assert_eq!(api_version, "bindery.dev/v1alpha1", "{name}");
        let kind = doc["kind"].as_str().unwrap();
        for source in sources() {
            let v = source.check(kind, &doc);
            assert!(v.is_clean(), "{name} against {}: {v:#?}", source.name);
        }
        kinds.insert(kind.to_string());
    }
    assert_eq!(
        kinds,
        BTreeSet::from(["Agent".to_string(), "AgentTenant".to_string()]),
        "examples/k8s has an Agent and an AgentTenant"
    );
}

// ---------------------------------------------------------------------------
// What the operator writes: the AgentTenant status

/// The tenant with the status the operator computed for it, as it would be
/// written to the status subresource, validates in full (spec and status).
#[test]
fn every_status_the_operator_writes_validates() {
    type Change = fn(&mut World);
    let cases: Vec<(&str, Change)> = vec![
        ("deploying", |_| {}),
        ("ready", |w| {
            w.rollout = Some(Rollout {
                replicas: 1,
                ready_replicas: 1,
            })
        }),
        ("missing secret", |w| {
            w.secrets.remove("acme-billing");
        }),
        ("unknown agent", |w| {
            w.tenant.spec.agent_ref.name = "nope".into()
        }),
        ("owner token generated", |w| {
            w.secrets.remove("acme-owner-token");
        }),
        ("missing MCP client token", |w| {
            w.tenant.spec.mcp_client_token_secret_ref = Some(KeyRef {
                name: "acme-mcp".into(),
                key: "token".into(),
            });
        }),
        ("missing approver token", |w| {
            w.tenant.spec.approver_token_secret_ref = Some(KeyRef {
                name: "acme-approver".into(),
                key: "token".into(),
            });
        }),
        ("tenant budgets", |w| {
            w.tenant.spec.budgets = serde_json::from_value(json!([
                {"name": "daily-tokens", "tokens": 20000, "per": "24h", "onExceed": "confirm"},
            ]))
            .unwrap();
        }),
        ("a tenant cost budget without the agent's pricing", |w| {
            w.tenant.spec.budgets =
                serde_json::from_value(json!([{"name": "spend", "cost": 5.0, "per": "30d"}]))
                    .unwrap();
        }),
    ];
    for (what, change) in cases {
        let mut w = World::example();
        change(&mut w);
        let d = w.run();
        // Nothing rendered is one of our kinds: the status is all the
        // operator writes of ours. (Validate it here too if that changes.)
        if let Some(o) = &d.objects {
            let mut rendered = vec![
                serde_json::to_value(&o.config_map).unwrap(),
                serde_json::to_value(&o.service_account).unwrap(),
                serde_json::to_value(&o.deployment).unwrap(),
                serde_json::to_value(&o.service).unwrap(),
            ];
            rendered.extend(o.claim.iter().map(|c| serde_json::to_value(c).unwrap()));
            for r in rendered {
                let api_version = r["apiVersion"].as_str().unwrap();
                assert!(
                    !api_version.starts_with("bindery.dev/"),
                    "{what}: the operator renders a {} {api_version}: validate it against its CRD",
                    r["kind"]
                );
            }
        }
        assert!(!d.status.conditions.is_empty(), "{what}");
        let mut tenant = w.tenant.clone();
        tenant.status = Some(d.status);
        let object = serde_json::to_value(&tenant).unwrap();
        assert!(object["status"]["conditions"].is_array(), "{what}");
        let v = check_all("AgentTenant", &object);
        assert!(v.is_clean(), "{what}: {v:#?}\n{object:#}");
    }
}

/// The status part of the schema is not empty: a wrong status is refused.
#[test]
fn a_wrong_status_is_refused() {
    let mut w = World::example();
    let d = w.run();
    w.tenant.status = Some(d.status);
    let mut object = serde_json::to_value(&w.tenant).unwrap();
    object["status"]["parameters"][0]["bound"] = json!("yes");
    object["status"]["conditions"][0]["lastTransitionTime"] = json!("noon");
    object["status"]["paramsBound"] = json!(2);
    let v = check_all("AgentTenant", &object);
    let want = [
        "/status/conditions/0/lastTransitionTime (format)",
        "/status/parameters/0/bound (type)",
        "/status/paramsBound (type)",
    ];
    for w in want {
        assert!(v.structural.iter().any(|e| e.starts_with(w)), "{w}: {v:#?}");
    }
    assert_eq!(v.structural.len(), want.len(), "{v:#?}");
}

/// The budget rows the tenant's agent server writes (`status.budgets`,
/// `status.budgetSummary`) validate beside the operator's status; a row
/// without its measurement time, or with a word for a number, is refused.
#[test]
fn the_budget_rows_the_agent_server_writes_validate() {
    let mut w = World::example();
    let d = w.run();
    w.tenant.status = Some(d.status);
    let mut object = serde_json::to_value(&w.tenant).unwrap();
    let row = bindery_operator::crd::BudgetStatus {
        name: "daily-tokens".into(),
        agent: "invoices".into(),
        meter: "tokens".into(),
        used: 1200.0,
        limit: 200000.0,
        per: "24h".into(),
        on_exceed: Default::default(),
        exhausted: false,
        measured_at: "2026-11-29T12:00:00Z".into(),
    };
    object["status"]["budgets"] = json!([row]);
    object["status"]["budgetSummary"] = json!([row.summary()]);
    let v = check_all("AgentTenant", &object);
    assert!(v.is_clean(), "{v:#?}\n{object:#}");
    assert_eq!(
        object["status"]["budgetSummary"][0],
        "daily-tokens (agent invoices): 1200 of 200000 tokens per 24h, 0%"
    );
    object["status"]["budgets"][0]
        .as_object_mut()
        .unwrap()
        .remove("measuredAt");
    object["status"]["budgets"][0]["used"] = json!("lots");
    let v = check_all("AgentTenant", &object);
    for want in [
        "/status/budgets/0 (required)",
        "/status/budgets/0/used (type)",
    ] {
        assert!(
            v.structural.iter().any(|e| e.starts_with(want)),
            "{want}: {v:#?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Budgets, on the Agent and on the AgentTenant

/// An Agent of `budgets`, its model priced when `priced`.
fn agent_with_budgets(budgets: Value, priced: bool) -> Value {
    let mut model = json!({"url": "http://llm/v1", "name": "m"});
    if priced {
        model["pricing"] = json!({"inputPerMillion": 0.15, "outputPerMillion": 0.6});
    }
    json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "Agent",
           "metadata": {"name": "clerk"},
           "spec": {"model": model, "budgets": budgets}})
}

fn tenant_with_budgets(budgets: Value) -> Value {
    let mut t = tenant_with(json!([]));
    t["spec"]["budgets"] = budgets;
    t
}

/// Each budget caps exactly one of tokens, tool calls and cost, over a
/// window that is a duration, `session` or `run`, on the Agent and on the
/// AgentTenant alike; its name, what happens past it and how many there
/// are have their bounds.
#[test]
fn a_budget_caps_one_thing_over_a_window() {
    let one = "a budget caps exactly one of tokens, toolCalls and cost";
    let per = "per is a duration (1h, 24h, 30d), `session` or `run`";
    let per_user = "perUser needs a rolling per (1h, 24h, 30d), not session or run";
    type Make = fn(Value) -> (&'static str, Value);
    let kinds: [Make; 2] = [
        |b| ("Agent", agent_with_budgets(b, true)),
        |b| ("AgentTenant", tenant_with_budgets(b)),
    ];
    for make in kinds {
        let check = |budgets: Value| {
            let (kind, object) = make(budgets);
            (kind, check_all(kind, &object), object)
        };
        for good in [
            json!([{"name": "daily", "tokens": 200000, "per": "24h"}]),
            json!([{"name": "calls", "toolCalls": 50, "per": "session", "onExceed": "confirm"}]),
            json!([{"name": "spend", "cost": 25.5, "per": "30d"}]),
            json!([{"name": "one-run", "tokens": 1, "per": "run"}, {"name": "m", "toolCalls": 3, "per": "90m"}]),
            json!([{"name": "mine", "tokens": 100, "per": "24h", "perUser": true}]),
            json!([{"name": "sess", "tokens": 100, "per": "session", "perUser": false}]),
        ] {
            let (kind, v, object) = check(good);
            assert!(v.is_clean(), "{kind}: {v:#?}\n{object:#}");
        }
        for (bad, message) in [
            (
                json!({"name": "b", "tokens": 1, "cost": 2.0, "per": "1h"}),
                one,
            ),
            (
                json!({"name": "b", "tokens": 1, "toolCalls": 2, "per": "1h"}),
                one,
            ),
            (json!({"name": "b", "per": "1h"}), one),
            (json!({"name": "b", "tokens": 1, "per": "1w"}), per),
            (json!({"name": "b", "tokens": 1, "per": "24"}), per),
            (json!({"name": "b", "tokens": 1, "per": "Session"}), per),
            (
                json!({"name": "b", "tokens": 1, "per": "session", "perUser": true}),
                per_user,
            ),
            (
                json!({"name": "b", "tokens": 1, "per": "run", "perUser": true}),
                per_user,
            ),
        ] {
            let (kind, v, object) = check(json!([bad]));
            assert!(v.structural.is_empty(), "{kind}: {v:#?}\n{object:#}");
            assert_eq!(v.cel_message(), Some(message), "{kind}: {object:#}");
        }
        for (bad, want) in [
            (
                json!([{"name": "b", "tokens": 1, "per": "1h", "onExceed": "ask"}]),
                "/spec/budgets/0/onExceed (enum)",
            ),
            (
                json!([{"name": "", "tokens": 1, "per": "1h"}]),
                "/spec/budgets/0/name (minLength)",
            ),
            (
                json!([{"name": "b", "tokens": -1, "per": "1h"}]),
                "/spec/budgets/0/tokens (minimum)",
            ),
            (
                json!([{"name": "b", "cost": 1.0}]),
                "/spec/budgets/0 (required)",
            ),
            (
                json!([{"name": "b", "tokens": 1, "per": "1h", "perDay": 2}]),
                "/spec/budgets/0 (additionalProperties)",
            ),
            (
                Value::Array(
                    (0..33)
                        .map(|i| json!({"name": format!("b{i}"), "tokens": 1, "per": "1h"}))
                        .collect(),
                ),
                "/spec/budgets (maxItems)",
            ),
        ] {
            let (kind, v, object) = check(bad);
            assert!(
                v.structural.iter().any(|e| e.starts_with(want)),
                "{kind}: want `{want}`: {v:#?}\n{object:#}"
            );
        }
    }
}

/// A cost budget needs a price: the model's `pricing`, the tenant's, or
/// Bindery's price table, which the API server does not have. The schema
/// accepts either way; the operator's checks refuse an unpriced one (the
/// Agent's `Valid` condition, the tenant's status:
/// `desired::a_wrong_tenant_budget_names_the_field_and_what_to_do`).
#[test]
fn a_cost_budget_is_priced_by_the_operators_checks_not_the_schema() {
    let cost = json!([{"name": "spend", "cost": 5.0, "per": "30d"}]);
    for priced in [false, true] {
        let v = check_all("Agent", &agent_with_budgets(cost.clone(), priced));
        assert!(v.is_clean(), "{v:#?}");
    }
    accepted(&tenant_with_budgets(cost));
    let unpriced: bindery_spec::AgentSpec = serde_json::from_value(
        agent_with_budgets(json!([{"name": "spend", "cost": 5.0, "per": "30d"}]), false)["spec"]
            .clone(),
    )
    .unwrap();
    let said = bindery_spec::checks::check_definition("a", &unpriced, "here");
    assert!(
        said.iter()
            .any(|d| d.message.contains("caps cost, so the model needs a price")),
        "{said:?}"
    );
}

/// Budgets are lists the API server keys by name (a second budget of a
/// name is refused, and server-side apply merges them by name); the status
/// rows by agent and name. The refusal itself is the real API server's
/// (real_apiserver.rs): a client-side check does not see list keys.
#[test]
fn budgets_are_lists_keyed_by_name() {
    for source in sources() {
        let keyed = |kind: &str, path: &[&str]| {
            let mut node = source.schema(kind);
            for p in path {
                node = &node["properties"][p];
            }
            (
                node["x-kubernetes-list-type"].clone(),
                node["x-kubernetes-list-map-keys"].clone(),
                node["maxItems"].clone(),
            )
        };
        assert_eq!(
            keyed("Agent", &["spec", "budgets"]),
            (json!("map"), json!(["name"]), json!(32)),
            "{}",
            source.name
        );
        assert_eq!(
            keyed("AgentTenant", &["spec", "budgets"]),
            (json!("map"), json!(["name"]), json!(32)),
            "{}",
            source.name
        );
        assert_eq!(
            keyed("AgentTenant", &["status", "budgets"]),
            (json!("map"), json!(["agent", "name"]), Value::Null),
            "{}",
            source.name
        );
    }
}

// ---------------------------------------------------------------------------
// The AgentTenant rules: each accepts and refuses what it is for

fn tenant_with(parameters: Value) -> Value {
    json!({
        "apiVersion": "bindery.dev/v1alpha1",
        "kind": "AgentTenant",
        "metadata": {"name": "acme"},
        "spec": {"agentRef": {"name": "invoices"}, "parameters": parameters},
    })
}

fn secret(name: &str, key: &str) -> Value {
    json!({"name": name, "key": key})
}

#[track_caller]
fn accepted(object: &Value) {
    let v = check_all("AgentTenant", object);
    assert!(v.is_clean(), "{v:#?}\n{object:#}");
}

/// Refused by exactly one CEL rule, with `message`, and by nothing else.
#[track_caller]
fn refused_by_rule(object: &Value, message: &str) {
    let v = check_all("AgentTenant", object);
    assert!(v.structural.is_empty(), "{v:#?}\n{object:#}");
    assert_eq!(v.cel_message(), Some(message), "{v:#?}\n{object:#}");
}

/// Refused structurally (by `keyword` at `pointer`), and by no CEL rule.
#[track_caller]
fn refused_by_schema(object: &Value, pointer: &str, keyword: &str) {
    let v = check_all("AgentTenant", object);
    assert!(v.cel.is_empty(), "{v:#?}\n{object:#}");
    let want = format!("{pointer} ({keyword}):");
    assert!(
        v.structural.iter().any(|e| e.starts_with(&want)),
        "want `{want}`: {v:#?}\n{object:#}"
    );
}

#[test]
fn exactly_one_of_value_or_value_from() {
    // Said by a `oneOf` of two `required`s, so with the apiserver's generic
    // oneOf message: `value` is free-form JSON, which an apiserver's CEL
    // cannot see (see `the_schemas_are_structural`).
    let both =
        json!({"name": "tenant", "value": "acme", "valueFrom": {"secretKeyRef": secret("s", "k")}});
    refused_by_schema(&tenant_with(json!([both])), "/spec/parameters/0", "oneOf");
    refused_by_schema(
        &tenant_with(json!([{"name": "tenant"}])),
        "/spec/parameters/0",
        "oneOf",
    );
    refused_by_schema(
        &tenant_with(json!([{"name": "tenant", "pinned": true}])),
        "/spec/parameters/0",
        "oneOf",
    );
    for value in [
        json!("acme"),
        json!(7),
        json!(false),
        json!({"a": [1, 2]}),
        json!([]),
    ] {
        accepted(&tenant_with(json!([{"name": "tenant", "value": value}])));
    }
    accepted(&tenant_with(
        json!([{"name": "tenant", "valueFrom": {"secretKeyRef": secret("s", "k")}}]),
    ));
    accepted(&tenant_with(
        json!([{"name": "tenant", "valueFrom": {"configMapKeyRef": secret("c", "k")}, "pinned": true}]),
    ));
    // The operator's status says it in words, should such a tenant exist
    // (stored before this schema, say).
    let mut w = World::example();
    w.tenant.spec.parameters[0].value_from = Some(ValueFrom {
        secret_key_ref: Some(KeyRef {
            name: "s".into(),
            key: "k".into(),
        }),
        config_map_key_ref: None,
    });
    let d = w.run();
    let c = d
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "ParametersResolved")
        .unwrap();
    assert_eq!(c.status, "False");
    assert!(
        c.message
            .contains("give exactly one of `value` or `valueFrom`"),
        "{}",
        c.message
    );
}

#[test]
fn value_from_names_exactly_one_source() {
    let msg = "give exactly one of secretKeyRef or configMapKeyRef";
    let both = json!({"secretKeyRef": secret("s", "k"), "configMapKeyRef": secret("c", "k")});
    refused_by_rule(
        &tenant_with(json!([{"name": "tenant", "valueFrom": both}])),
        msg,
    );
    refused_by_rule(
        &tenant_with(json!([{"name": "tenant", "valueFrom": {}}])),
        msg,
    );
    accepted(&tenant_with(
        json!([{"name": "tenant", "valueFrom": {"secretKeyRef": secret("s", "k")}}]),
    ));
    accepted(&tenant_with(
        json!([{"name": "tenant", "valueFrom": {"configMapKeyRef": secret("c", "k")}}]),
    ));
    // A source names both its object and its key.
    refused_by_schema(
        &tenant_with(json!([{"name": "tenant", "valueFrom": {"secretKeyRef": {"name": "s"}}}])),
        "/spec/parameters/0/valueFrom/secretKeyRef",
        "required",
    );
}

#[test]
fn parameter_names_are_lower_snake_case() {
    let msg = "a parameter name is lower-case letters, digits and _, starting with a letter";
    for bad in ["Tenant", "1x", "a-b", "_a", "tenant ", ""] {
        refused_by_rule(&tenant_with(json!([{"name": bad, "value": 1}])), msg);
    }
    for good in ["tenant", "billing_token2", "x", "a_", &"a".repeat(128)] {
        accepted(&tenant_with(json!([{"name": good, "value": 1}])));
    }
    // Bounded, for the apiserver's cost estimate of the uniqueness rule.
    refused_by_schema(
        &tenant_with(json!([{"name": "a".repeat(129), "value": 1}])),
        "/spec/parameters/0/name",
        "maxLength",
    );
}

#[test]
fn each_parameter_is_listed_once() {
    let msg = "each parameter may be listed once";
    let p = |name: &str| json!({"name": name, "value": name});
    refused_by_rule(&tenant_with(json!([p("tenant"), p("tenant")])), msg);
    refused_by_rule(
        &tenant_with(json!([p("tenant"), p("region"), p("tenant")])),
        msg,
    );
    // The same name, whatever its value's source.
    refused_by_rule(
        &tenant_with(json!([
            p("billing_token"),
            {"name": "billing_token", "valueFrom": {"secretKeyRef": secret("s", "k")}},
        ])),
        msg,
    );
    accepted(&tenant_with(json!([])));
    accepted(&tenant_with(json!([p("tenant")])));
    accepted(&tenant_with(json!([
        p("tenant"),
        p("region"),
        p("tenant2")
    ])));
    // At most 128, for the apiserver's cost estimate: the rule is quadratic.
    let many = |n: usize| Value::Array((0..n).map(|i| p(&format!("p{i}"))).collect());
    accepted(&tenant_with(many(128)));
    refused_by_schema(&tenant_with(many(129)), "/spec/parameters", "maxItems");
}

#[test]
fn confirm_ttl_is_a_number_and_a_unit() {
    let agent = |spec_extra: Value| {
        let mut spec = json!({"model": {"url": "http://llm/v1", "name": "m"}});
        spec.as_object_mut()
            .unwrap()
            .extend(spec_extra.as_object().unwrap().clone());
        json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "Agent",
               "metadata": {"name": "clerk"}, "spec": spec})
    };
    let msg = "confirmTtl is a number and a unit: 90s, 15m, 2h or 1d";
    for good in ["90s", "15m", "2h", "1d"] {
        let v = check_all("Agent", &agent(json!({"confirmTtl": good})));
        assert!(v.is_clean(), "{good}: {v:#?}");
    }
    for bad in ["15", "m", "15 m", "1w", "-1s"] {
        let v = check_all("Agent", &agent(json!({"confirmTtl": bad})));
        assert!(v.structural.is_empty(), "{bad}: {v:#?}");
        assert_eq!(v.cel_message(), Some(msg), "{bad}");
    }
    // The other new fields: selectors, a toolbox's `writes`, deferred tools.
    let v = check_all(
        "Agent",
        &agent(json!({
            "confirm": [{"tool": "bash_delete-*"}],
            "toolboxes": [
                {"bash": {"directory": "./tools", "confirm": "writes"}},
                {"bash": {"script": "./x", "confirm": [{"tool": "rm-*"}]}},
                {"deferred": {"tools": [{"name": "get_location",
                    "parameters": {"type": "object", "properties": {}}}]}},
            ],
        })),
    );
    assert!(v.is_clean(), "{v:#?}");
}

/// A `confirm` selector's `when` is a string of at most 4096 characters,
/// agent-level and in a toolbox. Whether it compiles is not the schema's
/// to say (the Agent's status says it, from `check_definition`): one that
/// does not is accepted here like one that does.
#[test]
fn a_confirm_condition_is_a_bounded_string() {
    let agent = |when: Value| {
        json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": "clerk"},
        "spec": {
            "model": {"url": "http://llm/v1", "name": "m"},
            "confirm": [{"tool": "bash_pay", "when": when}],
            "toolboxes": [{"bash": {"script": "./x",
                "confirm": [{"tool": "pay", "when": when}]}}],
        }})
    };
    for good in [
        "args.amount > 100",
        "args.amount > 100 || args.currency != 'EUR'",
        "args.amount > > 100",
    ] {
        let v = check_all("Agent", &agent(json!(good)));
        assert!(v.is_clean(), "{good}: {v:#?}");
    }
    let v = check_all("Agent", &agent(json!("x".repeat(4096))));
    assert!(v.is_clean(), "{v:#?}");
    let v = check_all("Agent", &agent(json!("x".repeat(4097))));
    assert!(
        v.structural
            .iter()
            .any(|e| e.starts_with("/spec/confirm/0/when (maxLength)")),
        "{v:#?}"
    );
    let v = check_all("Agent", &agent(json!(100)));
    assert!(
        v.structural
            .iter()
            .any(|e| e.starts_with("/spec/confirm/0/when (type)")),
        "{v:#?}"
    );
}

#[test]
fn per_user_limits_and_rate_limits_take_counts_from_one_and_plain_tool_globs() {
    let with = |field: &str, value: Value| {
        let mut t = tenant_with(json!([{"name": "tenant", "value": "acme"}]));
        t["spec"][field] = value;
        t
    };
    accepted(&with("perUser", json!({"maxConcurrentRuns": 3})));
    accepted(&with(
        "rateLimits",
        json!({"requestsPerMinute": 600, "perUserRequestsPerMinute": 60,
               "tools": [{"tool": "openapi_billing_*", "callsPerMinute": 10, "perUser": true}]}),
    ));
    refused_by_schema(
        &with("perUser", json!({"maxConcurrentRuns": 0})),
        "/spec/perUser/maxConcurrentRuns",
        "minimum",
    );
    refused_by_schema(
        &with("rateLimits", json!({"requestsPerMinute": 0})),
        "/spec/rateLimits/requestsPerMinute",
        "minimum",
    );
    // A comma would split the server's flag in two.
    refused_by_schema(
        &with(
            "rateLimits",
            json!({"tools": [{"tool": "a,b=1", "callsPerMinute": 1}]}),
        ),
        "/spec/rateLimits/tools/0/tool",
        "pattern",
    );
}

#[test]
fn live_session_ttl_is_a_duration_over_zero_or_off() {
    let with = |ttl: &str| {
        let mut t = tenant_with(json!([{"name": "tenant", "value": "acme"}]));
        t["spec"]["liveSessionTtl"] = json!(ttl);
        t
    };
    for good in ["1h", "30m", "90s", "1h30m", "off"] {
        accepted(&with(good));
    }
    // The sidecar refuses a zero TTL (it would forget at once) and
    // anything that is not a duration or `off`.
    for bad in ["0s", "0", "30", "never", "", "Off "] {
        refused_by_schema(&with(bad), "/spec/liveSessionTtl", "pattern");
    }
}

/// Every CEL rule of the AgentTenant is one the tests above exercise; a new
/// rule needs its own accept-and-refuse test.
#[test]
fn every_rule_is_tested_above() {
    for source in sources() {
        let mut rules = vec![];
        walk(source.schema("AgentTenant"), "", &mut |path, node| {
            for r in rules_of(node) {
                rules.push(format!("{path}: {}", r.1));
            }
        });
        assert_eq!(
            rules,
            [
                "spec: replicas above 1 need a store they share (spec.store.postgres): a pvcSize claim holds one pod's SQLite file",
                "spec.budgets[]: a budget caps exactly one of tokens, toolCalls and cost",
                "spec.budgets[]: perUser needs a rolling per (1h, 24h, 30d), not session or run",
                "spec.budgets[].per: per is a duration (1h, 24h, 30d), `session` or `run`",
                "spec.parameters: each parameter may be listed once",
                "spec.parameters[].name: a parameter name is lower-case letters, digits and _, starting with a letter",
                "spec.parameters[].valueFrom: give exactly one of secretKeyRef or configMapKeyRef",
                "spec.store: store.postgres keeps sessions in PostgreSQL: give it without pvcSize and storageClassName (they are for the SQLite store)",
            ],
            "{}",
            source.name
        );
        let mut agent_rules = vec![];
        walk(source.schema("Agent"), "", &mut |path, node| {
            for r in rules_of(node) {
                agent_rules.push(format!("{path}: {}", r.1));
            }
        });
        assert_eq!(
            agent_rules,
            [
                "spec.budgets[]: a budget caps exactly one of tokens, toolCalls and cost",
                "spec.budgets[]: perUser needs a rolling per (1h, 24h, 30d), not session or run",
                "spec.budgets[].per: per is a duration (1h, 24h, 30d), `session` or `run`",
                "spec.confirmTtl: confirmTtl is a number and a unit: 90s, 15m, 2h or 1d",
            ],
            "{}: a new Agent rule needs its own test",
            source.name
        );
    }
}

// ---------------------------------------------------------------------------
// Structurally invalid objects

#[test]
fn structurally_invalid_tenants_are_refused() {
    let base = || tenant_with(json!([{"name": "tenant", "value": "acme"}]));
    type Change = fn(&mut Value);
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "replicas: \"two\"",
            |t| t["spec"]["replicas"] = json!("two"),
            "/spec/replicas (type)",
        ),
        (
            "no agentRef",
            |t| {
                t["spec"].as_object_mut().unwrap().remove("agentRef");
            },
            "/spec (required)",
        ),
        (
            "agentRef without a name",
            |t| t["spec"]["agentRef"] = json!({}),
            "/spec/agentRef (required)",
        ),
        (
            "no spec",
            |t| {
                t.as_object_mut().unwrap().remove("spec");
            },
            " (required)",
        ),
        (
            "a misspelt field",
            |t| t["spec"]["agentref"] = json!({"name": "invoices"}),
            "/spec (additionalProperties)",
        ),
        (
            "parameters as a map",
            |t| t["spec"]["parameters"] = json!({"tenant": "acme"}),
            "/spec/parameters (type)",
        ),
        (
            "pinned: \"yes\"",
            |t| t["spec"]["parameters"][0]["pinned"] = json!("yes"),
            "/spec/parameters/0/pinned (type)",
        ),
        (
            "tools without a ConfigMap",
            |t| t["spec"]["tools"] = json!({}),
            "/spec/tools (required)",
        ),
        (
            "an MCP client token without its key",
            |t| t["spec"]["mcpClientTokenSecretRef"] = json!({"name": "acme-mcp"}),
            "/spec/mcpClientTokenSecretRef (required)",
        ),
        (
            "an MCP client token as a value",
            |t| t["spec"]["mcpClientTokenSecretRef"] = json!("canary-7f3a9c"),
            "/spec/mcpClientTokenSecretRef (type)",
        ),
        (
            "an approver token without its key",
            |t| t["spec"]["approverTokenSecretRef"] = json!({"name": "acme-approver"}),
            "/spec/approverTokenSecretRef (required)",
        ),
        (
            "an approver token as a value",
            |t| t["spec"]["approverTokenSecretRef"] = json!("approver-5c81d0"),
            "/spec/approverTokenSecretRef (type)",
        ),
    ];
    accepted(&base());
    let mut with_token = base();
    with_token["spec"]["mcpClientTokenSecretRef"] = secret("acme-mcp", "token");
    accepted(&with_token);
    let mut with_approver = base();
    with_approver["spec"]["approverTokenSecretRef"] = secret("acme-approver", "token");
    accepted(&with_approver);
    with_approver["spec"]["mcpClientTokenSecretRef"] = secret("acme-mcp", "token");
    accepted(&with_approver);
    for (what, change, want) in cases {
        let mut t = base();
        change(&mut t);
        let v = check_all("AgentTenant", &t);
        assert!(
            v.structural.iter().any(|e| e.starts_with(want)),
            "{what}: want `{want}`: {v:#?}"
        );
    }
    // And an Agent without a model.
    let agent = json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": "a"}, "spec": {"systemPrompt": "hi"}});
    let v = check_all("Agent", &agent);
    assert!(
        v.structural
            .iter()
            .any(|e| e.starts_with("/spec (required)")),
        "{v:#?}"
    );
}

// ---------------------------------------------------------------------------
// The schemas are structural, and their rules are ones an apiserver admits

/// Calls `visit(path, node)` on every schema node: `properties`, `items`
/// (`[]`) and `additionalProperties` (`{}`). Junctors (`oneOf` …) are not
/// nodes of their own: `visit` sees them on the node that holds them.
fn walk(node: &Value, path: &str, visit: &mut dyn FnMut(&str, &Value)) {
    visit(path, node);
    let join = |name: &str| {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    };
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            walk(child, &join(name), visit);
        }
    }
    if let Some(items) = node.get("items") {
        walk(items, &format!("{path}[]"), visit);
    }
    if let Some(extra) = node.get("additionalProperties").filter(|v| v.is_object()) {
        walk(extra, &format!("{path}{{}}"), visit);
    }
}

fn flag(node: &Value, key: &str) -> bool {
    node.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// `(rule, message)` of each `x-kubernetes-validations` entry.
fn rules_of(node: &Value) -> Vec<(String, String)> {
    node.get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(|rules| {
            rules
                .iter()
                .map(|r| {
                    (
                        r["rule"].as_str().unwrap_or_default().to_string(),
                        r["message"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether CEL source `rule` selects field `name` (`….name`, not `….names`).
fn selects(rule: &str, name: &str) -> bool {
    let needle = format!(".{name}");
    rule.match_indices(&needle).any(|(i, _)| {
        !rule[i + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

const COMPREHENSIONS: [&str; 5] = [".all(", ".exists(", ".exists_one(", ".map(", ".filter("];

/// Where free-form JSON is meant: the literal value of a binding, the
/// `value` source of a default (and of the model's API key, the same type),
/// an MCP server's `env` and `headers` literals, a deferred tool's JSON
/// schema, a toolbox's `confirm` (`writes` or a list of selectors), and a
/// tenant parameter's `value`.
const FREE_FORM: [(&str, &str); 33] = [
    ("Agent", "spec.bindings[].value.literal"),
    // A filter nests (`and`, `or`, `not`): a recursive type has no
    // structural schema; check and the operator read it.
    ("Agent", "spec.toolboxes[].openapi.filter"),
    ("Agent", "spec.toolboxes[].postgrest.filter"),
    // A file sandbox's predicate nests the same way (`and`, `any`, `not`).
    ("Agent", "spec.toolboxes[].builtin.fileSandbox.predicate"),
    ("Agent", "spec.toolboxes[].bash.confirm"),
    ("Agent", "spec.toolboxes[].deferred.tools[].parameters"),
    ("Agent", "spec.toolboxes[].mcp.confirm"),
    ("Agent", "spec.toolboxes[].openapi.confirm"),
    ("Agent", "spec.toolboxes[].postgrest.confirm"),
    ("Agent", "spec.helpers[].with{}.literal"),
    ("Agent", "spec.model.apiKey.value"),
    ("Agent", "spec.model.fallbacks[].apiKey.value"),
    ("Agent", "spec.model.bedrock.accessKeyId.value"),
    ("Agent", "spec.model.bedrock.secretAccessKey.value"),
    ("Agent", "spec.model.bedrock.sessionToken.value"),
    ("Agent", "spec.model.fallbacks[].bedrock.accessKeyId.value"),
    (
        "Agent",
        "spec.model.fallbacks[].bedrock.secretAccessKey.value",
    ),
    ("Agent", "spec.model.fallbacks[].bedrock.sessionToken.value"),
    ("Agent", "spec.parameters[].default.value"),
    ("Agent", "spec.toolboxes[].bash.bindings[].value.literal"),
    ("Agent", "spec.toolboxes[].builtin.bindings[].value.literal"),
    ("Agent", "spec.toolboxes[].mcp.bindings[].value.literal"),
    ("Agent", "spec.toolboxes[].mcp.env{}.literal"),
    ("Agent", "spec.toolboxes[].mcp.headers{}.literal"),
    ("Agent", "spec.toolboxes[].mcp.oauth.clientId.literal"),
    ("Agent", "spec.toolboxes[].mcp.oauth.clientSecret.literal"),
    ("Agent", "spec.toolboxes[].mcp.oauth.privateKey.literal"),
    ("Agent", "spec.toolboxes[].openapi.bindings[].value.literal"),
    ("Agent", "spec.toolboxes[].openapi.secrets[].source.value"),
    (
        "Agent",
        "spec.toolboxes[].postgrest.bindings[].value.literal",
    ),
    ("Agent", "spec.toolboxes[].postgrest.secrets[].source.value"),
    ("Agent", "spec.toolboxes[].sqlite.bindings[].value.literal"),
    ("AgentTenant", "spec.parameters[].value"),
];

/// Everything wrong with one schema node, in words.
fn node_problems(path: &str, node: &Value, problems: &mut Vec<String>) {
    let at = if path.is_empty() { "(root)" } else { path };
    let ty = node.get("type").and_then(Value::as_str);
    let int_or_string = flag(node, "x-kubernetes-int-or-string");
    let preserve = flag(node, "x-kubernetes-preserve-unknown-fields");
    if ty.is_none() && !int_or_string && !preserve {
        problems.push(format!(
            "{at}: no `type` (only x-kubernetes-int-or-string or x-kubernetes-preserve-unknown-fields nodes may omit it)"
        ));
    }
    if ty.is_some() && int_or_string {
        problems.push(format!("{at}: x-kubernetes-int-or-string with a `type`"));
    }
    if node.get("properties").is_some() && node.get("additionalProperties").is_some() {
        problems.push(format!(
            "{at}: both `properties` and `additionalProperties`"
        ));
    }
    if node.get("properties").is_some() && ty != Some("object") {
        problems.push(format!("{at}: `properties` on a {ty:?}, not an object"));
    }
    if node.get("items").is_some() != (ty == Some("array")) {
        problems.push(format!("{at}: `items` and `type: array` go together"));
    }
    // Junctors hold value validations only; the fields they name are the
    // node's own.
    let props = node.get("properties").and_then(Value::as_object);
    for junctor in ["oneOf", "anyOf", "allOf"] {
        for alt in node
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for key in alt.as_object().into_iter().flat_map(|m| m.keys()) {
                if [
                    "type",
                    "description",
                    "default",
                    "nullable",
                    "additionalProperties",
                    "properties",
                    "items",
                ]
                .contains(&key.as_str())
                    || key.starts_with("x-kubernetes-")
                {
                    problems.push(format!(
                        "{at}: `{key}` inside `{junctor}` (junctors may only hold value validations)"
                    ));
                }
            }
            for req in alt
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let req = req.as_str().unwrap_or_default();
                if !props.is_some_and(|p| p.contains_key(req)) {
                    problems.push(format!(
                        "{at}: `{junctor}` requires `{req}`, which is not one of its properties"
                    ));
                }
            }
        }
    }
    // CEL rules: an apiserver type-checks them against the schema and
    // estimates their cost before it admits the CRD.
    for (rule, message) in rules_of(node) {
        let it = format!("{at}: rule `{rule}` ({message})");
        // Fields the rule can reach: the node's own, or its items' when it
        // is a list.
        let fields = node
            .get("properties")
            .or_else(|| node.get("items").and_then(|i| i.get("properties")))
            .and_then(Value::as_object);
        for (name, field) in fields.into_iter().flatten() {
            let typed = field.get("type").is_some() || flag(field, "x-kubernetes-int-or-string");
            if !typed && selects(&rule, name) {
                problems.push(format!(
                    "{it} reads `{name}`, which has no `type`: an apiserver's CEL only sees typed fields, so the rule does not compile there and the CRD is refused"
                ));
            }
        }
        if COMPREHENSIONS.iter().any(|c| rule.contains(c)) {
            if ty == Some("array") && node.get("maxItems").is_none() {
                problems.push(format!(
                    "{it} iterates a list without `maxItems`: its estimated cost is unbounded"
                ));
            }
            for (name, field) in fields.into_iter().flatten() {
                if field.get("type").and_then(Value::as_str) == Some("string")
                    && selects(&rule, name)
                    && field.get("maxLength").is_none()
                {
                    problems.push(format!(
                        "{it} iterates over `{name}`, a string without `maxLength`: its estimated cost is unbounded"
                    ));
                }
            }
        }
        // kube's coarse estimate too. (Not its scope check, `analyze_rule`:
        // that takes a comprehension's own variables for unknown ones.)
        for w in estimate_rule_cost(&rule, &compile_schema(node)) {
            problems.push(format!("{it}: {} ({:?})", w.message, w.kind));
        }
    }
}

#[test]
fn the_schemas_are_structural() {
    for source in sources() {
        let mut problems = vec![];
        let mut free_form = BTreeSet::new();
        for (kind, schema) in &source.schemas {
            if schema.get("type").and_then(Value::as_str) != Some("object") {
                problems.push(format!("{kind}: the root is not `type: object`"));
            }
            walk(schema, "", &mut |path, node| {
                node_problems(path, node, &mut problems);
                if flag(node, "x-kubernetes-preserve-unknown-fields") {
                    free_form.insert((kind.clone(), path.to_string()));
                }
            });
            let compiled = compile_schema(schema);
            for e in compiled.compilation_errors() {
                problems.push(format!("{kind}: a rule does not compile: {e}"));
            }
        }
        let want: BTreeSet<_> = FREE_FORM
            .iter()
            .map(|(k, p)| (k.to_string(), p.to_string()))
            .collect();
        for (kind, path) in free_form.difference(&want) {
            problems.push(format!(
                "{kind} {path}: x-kubernetes-preserve-unknown-fields where no free-form JSON is meant"
            ));
        }
        for (kind, path) in want.difference(&free_form) {
            problems.push(format!(
                "{kind} {path}: meant as free-form JSON, but does not preserve unknown fields"
            ));
        }
        assert!(
            problems.is_empty(),
            "{}:\n  {}",
            source.name,
            problems.join("\n  ")
        );
    }
}

/// The structural check catches what it is for.
#[test]
fn the_structural_check_catches_what_it_is_for() {
    let problems = |schema: Value| {
        let mut p = vec![];
        walk(&schema, "", &mut |path, node| {
            node_problems(path, node, &mut p)
        });
        p
    };
    assert!(
        problems(json!({"type": "object", "properties": {"a": {"type": "string"}}})).is_empty()
    );
    let untyped = problems(json!({"type": "object", "properties": {"a": {"description": "?"}}}));
    assert!(untyped[0].starts_with("a: no `type`"), "{untyped:?}");
    let both = problems(
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}),
    );
    assert!(
        both[0].contains("both `properties` and `additionalProperties`"),
        "{both:?}"
    );
    let has_untyped = problems(json!({
        "type": "object",
        "properties": {"value": {"x-kubernetes-preserve-unknown-fields": true}, "valueFrom": {"type": "string"}},
        "x-kubernetes-validations": [{"rule": "has(self.value) != has(self.valueFrom)", "message": "m"}],
    }));
    assert_eq!(has_untyped.len(), 1, "{has_untyped:?}");
    assert!(
        has_untyped[0].contains("reads `value`, which has no `type`"),
        "{has_untyped:?}"
    );
    let unbounded = problems(json!({
        "type": "array",
        "items": {"type": "object", "properties": {"name": {"type": "string"}}},
        "x-kubernetes-validations": [{"rule": "self.all(p, self.exists_one(q, q.name == p.name))", "message": "m"}],
    }));
    assert!(
        unbounded.iter().any(|p| p.contains("without `maxItems`")),
        "{unbounded:?}"
    );
    assert!(
        unbounded.iter().any(|p| p.contains("without `maxLength`")),
        "{unbounded:?}"
    );
    let junctor = problems(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"], "type": "object"}],
    }));
    assert_eq!(junctor.len(), 2, "{junctor:?}");
}

#[test]
fn a_postgres_store_excludes_the_sqlite_volume_fields() {
    let msg = "store.postgres keeps sessions in PostgreSQL: give it without pvcSize and storageClassName (they are for the SQLite store)";
    let with_store = |store: Value| {
        let mut t = tenant_with(json!([]));
        t["spec"]["store"] = store;
        t
    };
    let pg = json!({"urlSecretRef": secret("acme-db", "url")});
    refused_by_rule(&with_store(json!({"postgres": pg, "pvcSize": "1Gi"})), msg);
    refused_by_rule(
        &with_store(json!({"postgres": pg, "storageClassName": "fast"})),
        msg,
    );
    accepted(&with_store(json!({"postgres": pg})));
    accepted(&with_store(
        json!({"pvcSize": "1Gi", "storageClassName": "fast"}),
    ));
    accepted(&with_store(json!({})));
    refused_by_schema(
        &with_store(json!({"postgres": {"urlSecretRef": {"name": "acme-db"}}})),
        "/spec/store/postgres/urlSecretRef",
        "required",
    );
    refused_by_schema(
        &with_store(json!({"postgres": {}})),
        "/spec/store/postgres",
        "required",
    );
}

#[test]
fn more_than_one_replica_needs_a_postgres_store() {
    let msg = "replicas above 1 need a store they share (spec.store.postgres): a pvcSize claim holds one pod's SQLite file";
    let with = |replicas: Option<i32>, store: Option<Value>| {
        let mut t = tenant_with(json!([]));
        if let Some(n) = replicas {
            t["spec"]["replicas"] = json!(n);
        }
        if let Some(s) = store {
            t["spec"]["store"] = s;
        }
        t
    };
    let pg = json!({"postgres": {"urlSecretRef": secret("acme-db", "url")}});
    refused_by_rule(&with(Some(3), Some(json!({"pvcSize": "1Gi"}))), msg);
    accepted(&with(Some(3), Some(pg.clone())));
    // An emptyDir each: sessions of each pod's own, as before.
    accepted(&with(Some(2), None));
    accepted(&with(Some(1), Some(json!({"pvcSize": "1Gi"}))));
    accepted(&with(None, None));
    accepted(&with(Some(0), None));
}
