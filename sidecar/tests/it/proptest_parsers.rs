//! Fuzz targets (proptest) for what reads untrusted or hand-written input:
//! the agent file parsers (native YAML and agents-exe JSON), the bash
//! `describe` parser, the OpenAPI document loader and the bindings
//! combinator. None may panic, and each keeps its promise on the inputs it
//! accepts. `cargo test` runs proptest's default case count (256, or
//! `PROPTEST_CASES`); docs/benchmarks.md shows a longer run.

use std::sync::Arc;

use bindery_bindings::{AppliedBinding, BoundTool, BoundValue};
use bindery_params::{ParamValue, SecretString, Values};
use bindery_spec::WhenUnbound;
use bindery_tools::bash::{parse_description, Mode};
use bindery_tools::openapi::document::operations;
use bindery_tools::{
    ArgSpec, CallArgs, CallContext, Tool, ToolError, ToolOutput, ToolSpec, Transport,
};
use bindery_tree::files::parse_text;
use proptest::prelude::*;
use serde_json::{json, Value};

/// Any JSON value, a few levels deep, with keys the parsers look for.
fn any_json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("tag".to_string()),
        Just("contents".to_string()),
        Just("name".to_string()),
        Just("type".to_string()),
        Just("paths".to_string()),
        Just("parameters".to_string()),
        Just("in".to_string()),
        Just("schema".to_string()),
        Just("$ref".to_string()),
        "[a-z]{1,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        Just(json!("#/components/schemas/X")),
        Just(json!("OpenAIAgentDescription")),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const NATIVE: &str = include_str!("../fixtures/valid/probe.yaml");
const AGENTS_EXE: &str = include_str!("../../../examples/invoices/agents-exe/invoices.json");

/// `text` with `len` bytes at `at` replaced by `with` (on char boundaries).
fn splice(text: &str, at: usize, len: usize, with: &str) -> String {
    let mut at = at % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let mut end = (at + len).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{with}{}", &text[..at], &text[end..])
}

proptest! {
    /// Native YAML: any text, and any edit of a valid file, parses or fails
    /// with a message; a valid file with another name and parameter keeps them.
    #[test]
    fn native_agent_files(
        garbage in ".{0,200}",
        at in 0usize..2000,
        len in 0usize..20,
        with in prop_oneof![Just(String::new()), Just(":".to_string()), Just("- ".to_string()),
            Just("{".to_string()), Just("\n  ".to_string()), ".{0,8}"],
        name in "[a-z][a-z0-9-]{0,20}",
        param in "[a-z][a-z0-9_]{0,12}",
    ) {
        let _ = parse_text(&garbage);
        let _ = parse_text(&splice(NATIVE, at, len, &with));
        let renamed = NATIVE
            .replace("name: prober", &format!("name: {name}"))
            .replace("{name: repo, scope: session}", &format!("{{name: {param}, scope: session}}"))
            .replace("value: {param: repo}", &format!("value: {{param: {param}}}"));
        let parsed = parse_text(&renamed).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parsed.len(), 1);
        prop_assert_eq!(&parsed[0].name, &name);
        prop_assert_eq!(&parsed[0].spec.parameters[0].name, &param);
    }

    /// agents-exe JSON: any JSON value (tagged or not) and any edit of the
    /// example parses or fails with a message.
    #[test]
    fn agents_exe_files(
        value in any_json(),
        at in 0usize..3000,
        len in 0usize..20,
        with in prop_oneof![Just(String::new()), Just("\"".to_string()), Just("{}".to_string()),
            Just("[".to_string()), Just("null".to_string()), ".{0,8}"],
    ) {
        let _ = parse_text(&value.to_string());
        let tagged = json!({"tag": "OpenAIAgentDescription", "contents": value});
        let _ = parse_text(&tagged.to_string());
        let _ = parse_text(&splice(AGENTS_EXE, at, len, &with));
    }

    /// `describe` output: any bytes are read or refused; a well-formed
    /// description keeps its slug and arguments.
    #[test]
    fn bash_describe(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        value in any_json(),
        slug in "[a-z][a-z0-9-]{0,16}",
        args in prop::collection::vec(("[a-z][a-z-]{0,10}", 0usize..5, any::<bool>()), 0..5),
    ) {
        let _ = parse_description(&bytes);
        let _ = parse_description(value.to_string().as_bytes());
        let modes = ["positional", "dashdashspace", "dashdashequal", "stdin", "env"];
        let described = json!({
            "slug": slug,
            "description": "d",
            "args": args.iter().map(|(name, mode, required)| json!({
                "name": name, "description": "", "type": "string",
                "arity": if *required { "single" } else { "optional" },
                "mode": modes[*mode],
            })).collect::<Vec<_>>(),
        });
        let info = parse_description(described.to_string().as_bytes())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(info.slug, slug);
        prop_assert_eq!(info.args.len(), args.len());
    }

    /// OpenAPI documents: any JSON is loaded or refused; a document of GET
    /// operations gives one tool each, with its path parameters required.
    #[test]
    fn openapi_documents(
        value in any_json(),
        paths in prop::collection::btree_map("[a-z]{1,8}", ("[a-z]{1,8}", any::<bool>()), 0..6),
    ) {
        let _ = operations(&value);
        let _ = operations(&json!({"openapi": "3.0.3", "paths": value}));
        let mut doc_paths = serde_json::Map::new();
        for (segment, (param, query)) in &paths {
            let (path, location) = if *query {
                (format!("/{segment}"), "query")
            } else {
                (format!("/{segment}/{{{param}}}"), "path")
            };
            doc_paths.insert(path, json!({"get": {
                "operationId": format!("get_{segment}"),
                "parameters": [{"name": param, "in": location, "required": !query,
                    "schema": {"type": "string"}}],
                "responses": {"200": {"description": "ok"}},
            }}));
        }
        let doc = json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": doc_paths});
        let (ops, _) = operations(&doc).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(ops.len(), paths.len());
        for op in &ops {
            let query = op.path.matches('{').count() == 0;
            prop_assert_eq!(op.spec.args.len(), 1);
            prop_assert_eq!(op.spec.args[0].required, !query);
        }
    }

    /// The combinator: a bound argument always gets its bound value (never
    /// the model's), leaves no trace in the model's schema, and an unbound
    /// `fail` binding refuses the call rather than passing anything.
    #[test]
    fn bindings_combinator(
        nargs in 1usize..6,
        bound in prop::collection::vec((0usize..6, 0usize..3, any::<bool>()), 0..6),
        model in prop::collection::btree_map("[a-e]", any_json(), 0..6),
        have_values in any::<bool>(),
    ) {
        let names = ["a", "b", "c", "d", "e", "f"];
        let spec = ToolSpec {
            name: "t".into(),
            local_name: "t".into(),
            description: String::new(),
            args: names[..nargs].iter().map(|n| ArgSpec {
                name: n.to_string(),
                description: String::new(),
                required: true,
                schema: json!({"type": "string"}),
                transport: Transport::Bash(Mode::Env),
            }).collect(),
            writes: false,
        };
        let bindings: Vec<AppliedBinding> = bound.iter().map(|(arg, kind, fail)| AppliedBinding {
            arg: names[*arg % nargs].to_string(),
            value: match kind {
                0 => BoundValue::Param("p".into()),
                1 => BoundValue::Literal(json!("lit")),
                _ => BoundValue::Fixed(ParamValue::Secret(SecretString::new("s3cr3t"))),
            },
            when_unbound: if *fail { WhenUnbound::Fail } else { WhenUnbound::Omit },
        }).collect();
        let tool = BoundTool::new(Arc::new(Nop(spec))).with_bindings(bindings.clone());
        let mut values = Values::new();
        if have_values {
            values.insert("p".into(), ParamValue::Plain(json!("param-value")));
        }
        let schema = tool.model_schema(&values);
        for b in &bindings {
            prop_assert!(schema["properties"].get(&b.arg).is_none(), "{} shows", b.arg);
        }
        let model_args: serde_json::Map<String, Value> = model.into_iter().collect();
        match tool.merge(model_args.clone(), &values) {
            Ok(merged) => {
                for b in &bindings {
                    let first = bindings.iter().find(|x| x.arg == b.arg).unwrap();
                    let got = merged.args.get(&b.arg);
                    match (&first.value, got) {
                        (BoundValue::Literal(l), Some(v)) => prop_assert_eq!(v.plain(), Some(l)),
                        (BoundValue::Fixed(_), Some(v)) => prop_assert!(v.is_secret()),
                        (BoundValue::Param(_), Some(v)) => {
                            prop_assert_eq!(v.plain(), Some(&json!("param-value")))
                        }
                        // Omitted: unbound, and the model's value is not used either.
                        (BoundValue::Param(_), None) => prop_assert!(!have_values),
                        (_, None) => prop_assert!(false, "{} was dropped", b.arg),
                    }
                    if model_args.contains_key(&b.arg) {
                        prop_assert!(merged.dropped.contains(&b.arg));
                    }
                }
            }
            Err(_) => {
                // Only the first binding of an argument counts.
                let fails = bindings.iter().enumerate().any(|(i, b)| {
                    bindings[..i].iter().all(|x| x.arg != b.arg)
                        && matches!(b.value, BoundValue::Param(_))
                        && b.when_unbound == WhenUnbound::Fail
                });
                prop_assert!(fails && !have_values);
            }
        }
    }
}

struct Nop(ToolSpec);

#[async_trait::async_trait]
impl Tool for Nop {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn call(&self, _: CallArgs, _: &CallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text(""))
    }
}
