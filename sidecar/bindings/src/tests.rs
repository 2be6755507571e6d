//! The combinator on a tool that records what it was called with.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::json;

use super::*;
use crate::apply::{apply_bindings, BindingLayer, Level};
use bindery_params::SecretString;
use bindery_spec::{Binding, ParameterDecl, Scope};
use bindery_tools::bash::Mode;
use bindery_tools::{ArgSpec, ToolSpec};

struct Recorder {
    spec: ToolSpec,
    calls: Mutex<Vec<CallArgs>>,
}

#[async_trait]
impl Tool for Recorder {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, args: CallArgs, _: &CallContext) -> Result<ToolOutput, ToolError> {
        self.calls.lock().unwrap().push(args);
        Ok(ToolOutput::text("ok"))
    }
}

fn arg(name: &str, required: bool, transport: Transport) -> ArgSpec {
    ArgSpec {
        name: name.into(),
        description: format!("the {name}"),
        required,
        schema: json!({"type": "string", "description": format!("the {name}")}),
        transport,
    }
}

fn recorder(local: &str, args: Vec<ArgSpec>) -> Arc<Recorder> {
    Arc::new(Recorder {
        spec: ToolSpec {
            name: format!("bash_{local}"),
            local_name: local.into(),
            description: "Lists things.".into(),
            args,
            writes: true,
        },
        calls: Mutex::new(Vec::new()),
    })
}

fn invoices() -> Arc<Recorder> {
    recorder(
        "query-invoices",
        vec![
            arg("tenant_id", true, Transport::Bash(Mode::Dashdashspace)),
            arg("token", true, Transport::Bash(Mode::Env)),
            arg("since", false, Transport::Bash(Mode::Dashdashspace)),
        ],
    )
}

fn param(name: &str, secret: bool) -> ParameterDecl {
    ParameterDecl {
        name: name.into(),
        description: None,
        secret,
        scope: Scope::Session,
        required: true,
        default: None,
    }
}

fn bind(tool: Option<&str>, arg: &str, value: BindingValue, when: WhenUnbound) -> Binding {
    Binding {
        tool: tool.map(str::to_string),
        arg: arg.into(),
        value,
        when_unbound: when,
    }
}

fn p(name: &str) -> BindingValue {
    BindingValue::Param(name.into())
}

/// Apply toolbox bindings to the tools; panics on any error.
fn bound(
    tools: Vec<Arc<Recorder>>,
    bindings: &[Binding],
    params: &[ParameterDecl],
) -> Vec<BoundTool> {
    let mut out: Vec<BoundTool> = tools
        .into_iter()
        .map(|t| BoundTool::new(t as Arc<dyn Tool>))
        .collect();
    let mut diags = Vec::new();
    apply_bindings(
        &mut out,
        bindings,
        BindingLayer::Toolbox,
        params,
        "test",
        &mut diags,
    );
    assert!(diags.iter().all(|d| d.level != Level::Error), "{diags:?}");
    out
}

fn values(pairs: &[(&str, ParamValue)]) -> Values {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

#[test]
fn bound_arguments_vanish_from_the_schema() {
    let t = invoices();
    let tools = bound(
        vec![t],
        &[
            bind(None, "tenant_id", p("tenant"), WhenUnbound::Fail),
            bind(None, "token", p("api_token"), WhenUnbound::Fail),
        ],
        &[param("tenant", false), param("api_token", true)],
    );
    let schema = tools[0].model_schema(&Values::new());
    assert_eq!(
        schema,
        json!({
            "type": "object",
            "properties": {"since": {"type": "string", "description": "the since"}},
            "required": [],
        })
    );
    let text = schema.to_string();
    assert!(
        !text.contains("tenant") && !text.contains("token"),
        "{text}"
    );
}

#[tokio::test]
async fn bound_value_wins_over_what_the_model_sends() {
    let t = invoices();
    let tools = bound(
        vec![t.clone()],
        &[
            bind(None, "tenant_id", p("tenant"), WhenUnbound::Fail),
            bind(None, "token", p("api_token"), WhenUnbound::Fail),
        ],
        &[param("tenant", false), param("api_token", true)],
    );
    let vals = values(&[
        ("tenant", ParamValue::Plain(json!("acme"))),
        ("api_token", ParamValue::Secret(SecretString::new("s3cr3t"))),
    ]);
    let out = tools[0]
        .call(
            json!({"tenant_id": "evil", "token": "guess", "since": "2026-01-01"}),
            &vals,
            &CallContext::default(),
        )
        .await
        .unwrap();
    assert_eq!(out, ToolOutput::text("ok"));
    let calls = t.calls.lock().unwrap();
    assert_eq!(calls[0]["tenant_id"], ParamValue::Plain(json!("acme")));
    assert!(calls[0]["token"].is_secret());
    assert_eq!(calls[0]["since"], ParamValue::Plain(json!("2026-01-01")));

    let merged = tools[0]
        .merge(
            json!({"tenant_id": "evil", "since": "x"})
                .as_object()
                .unwrap()
                .clone(),
            &vals,
        )
        .unwrap();
    assert_eq!(merged.dropped, vec!["tenant_id".to_string()]);
}

#[test]
fn globs_pick_the_tools_a_binding_applies_to() {
    let a = recorder("export-csv", vec![arg("format", true, Transport::Json)]);
    let b = recorder("export-pdf", vec![arg("format", true, Transport::Json)]);
    let c = recorder("import", vec![arg("format", true, Transport::Json)]);
    let tools = bound(
        vec![a, b, c],
        &[bind(
            Some("export-*"),
            "format",
            BindingValue::Literal(json!("csv")),
            WhenUnbound::Fail,
        )],
        &[],
    );
    let hidden: Vec<bool> = tools
        .iter()
        .map(|t| t.hidden_args(&Values::new()).contains("format"))
        .collect();
    assert_eq!(hidden, vec![true, true, false]);
}

#[tokio::test]
async fn omit_leaves_an_unbound_optional_argument_out() {
    let t = invoices();
    let tools = bound(
        vec![t.clone()],
        &[bind(None, "since", p("start"), WhenUnbound::Omit)],
        &[param("start", false)],
    );
    // Hidden whether or not the parameter is bound (the schema is static).
    assert!(tools[0].hidden_args(&Values::new()).contains("since"));
    tools[0]
        .call(
            json!({"tenant_id": "a", "token": "b", "since": "model-chose"}),
            &Values::new(),
            &CallContext::default(),
        )
        .await
        .unwrap();
    let calls = t.calls.lock().unwrap();
    assert!(!calls[0].contains_key("since"), "{:?}", calls[0]);
}

#[tokio::test]
async fn fail_refuses_the_call_with_a_generic_error() {
    let t = invoices();
    let tools = bound(
        vec![t.clone()],
        &[bind(None, "tenant_id", p("tenant"), WhenUnbound::Fail)],
        &[param("tenant", false)],
    );
    let err = tools[0]
        .call(
            json!({"token": "b"}),
            &Values::new(),
            &CallContext::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err, ToolError::Unavailable);
    assert_eq!(err.to_string(), "tool unavailable");
    assert!(t.calls.lock().unwrap().is_empty());
    assert_eq!(
        tools[0]
            .merge(Default::default(), &Values::new())
            .unwrap_err(),
        MergeError::Unbound {
            arg: "tenant_id".into(),
            param: "tenant".into()
        }
    );
}

#[tokio::test]
async fn expose_flips_with_the_parameters_presence() {
    let t = invoices();
    let tools = bound(
        vec![t.clone()],
        &[bind(None, "tenant_id", p("tenant"), WhenUnbound::Expose)],
        &[param("tenant", false)],
    );
    let unbound = Values::new();
    let set = values(&[("tenant", ParamValue::Plain(json!("acme")))]);
    assert!(tools[0].model_schema(&unbound)["properties"]
        .get("tenant_id")
        .is_some());
    assert_eq!(
        tools[0].model_schema(&unbound)["required"],
        json!(["tenant_id", "token"])
    );
    assert!(tools[0].model_schema(&set)["properties"]
        .get("tenant_id")
        .is_none());

    // Unbound: the model's value is used. Bound: the parameter's wins.
    for (vals, want) in [(&unbound, "model-choice"), (&set, "acme")] {
        tools[0]
            .call(
                json!({"tenant_id": "model-choice", "token": "t"}),
                vals,
                &CallContext::default(),
            )
            .await
            .unwrap();
        let last = t.calls.lock().unwrap().last().unwrap().clone();
        assert_eq!(last["tenant_id"], ParamValue::Plain(json!(want)));
    }
}

#[tokio::test]
async fn object_values_never_reach_a_bash_argument() {
    let t = invoices();
    let tools = bound(
        vec![t.clone()],
        &[bind(None, "tenant_id", p("tenant"), WhenUnbound::Fail)],
        &[param("tenant", false)],
    );
    let vals = values(&[("tenant", ParamValue::Plain(json!({"id": 1})))]);
    let err = tools[0]
        .call(json!({"token": "t"}), &vals, &CallContext::default())
        .await
        .unwrap_err();
    assert_eq!(err, ToolError::Unavailable);
    assert!(t.calls.lock().unwrap().is_empty());
}

#[test]
fn later_layers_can_only_bind_what_is_still_open() {
    let t = invoices();
    let mut tools = bound(
        vec![t],
        &[bind(None, "tenant_id", p("tenant"), WhenUnbound::Fail)],
        &[param("tenant", false)],
    );
    let mut diags = Vec::new();
    apply_bindings(
        &mut tools,
        &[bind(
            Some("bash_query-*"),
            "tenant_id",
            BindingValue::Literal(json!("other")),
            WhenUnbound::Fail,
        )],
        BindingLayer::Agent,
        &[param("tenant", false)],
        "agent-level",
        &mut diags,
    );
    assert_eq!(diags.len(), 1);
    assert!(
        diags[0].message.contains("already bound"),
        "{}",
        diags[0].message
    );
    assert_eq!(tools[0].bindings().len(), 1);
}

#[test]
fn an_agent_level_binding_aimed_at_mcp_tools_that_matches_nothing_is_a_warning() {
    let mut tools = vec![BoundTool::new(invoices() as Arc<dyn Tool>)];
    let acme = BindingValue::Literal(json!("acme"));
    let bindings = [
        bind(
            Some("mcp_billing_*"),
            "tenant_id",
            acme.clone(),
            WhenUnbound::Fail,
        ),
        bind(
            Some("bash_query-invoice"),
            "tenant_id",
            acme,
            WhenUnbound::Fail,
        ),
    ];
    let mut diags = Vec::new();
    apply::apply_bindings_with(
        &mut tools,
        &bindings,
        BindingLayer::Agent,
        &[],
        "agent.yaml",
        apply::agent_typo_level,
        &mut diags,
    );
    let levels: Vec<(Level, bool)> = diags
        .iter()
        .map(|d| (d.level, d.message.contains("mcp_billing_*")))
        .collect();
    assert_eq!(
        levels,
        [(Level::Warning, true), (Level::Error, false)],
        "{diags:?}"
    );
}

#[test]
fn declarations_hide_filled_arguments_and_read_only_tools_are_not_writes() {
    let decls: Vec<bindery_spec::ToolDecl> = serde_yaml::from_str(
        "[{tool: 'slot*', readOnly: true},
          {tool: book, depends_on: [{tool: slots, map: {$.slot_token: $.token}}]}]",
    )
    .unwrap();
    let mut tools = vec![
        BoundTool::new(recorder("slots", vec![arg("date", true, Transport::Json)])),
        BoundTool::new(recorder(
            "book",
            vec![
                arg("date", true, Transport::Json),
                arg("slot_token", true, Transport::Json),
            ],
        )),
    ];
    depends::apply_toolbox_decls(&mut tools, &decls);
    confirm::apply_toolbox_confirm(
        &mut tools,
        Some(&serde_json::from_value(json!("writes")).unwrap()),
    );
    assert!(!tools[0].writes() && tools[0].disposition().is_none());
    assert!(tools[1].writes() && tools[1].disposition().is_some());
    let schema = tools[1].model_schema(&Values::new());
    assert_eq!(schema["required"], json!(["date"]));
    assert!(schema["properties"].get("slot_token").is_none());
    let mut diags = Vec::new();
    depends::check_loaded(&tools, "a.yaml", &mut diags);
    assert!(diags.is_empty(), "{diags:?}");
}

/// One rule for string arguments: a bound number or boolean, whatever bound
/// it (a literal, a parameter, a narrowing), reaches a JSON tool as the
/// string of its JSON text, as a bash tool gets it on its command line.
#[test]
fn numbers_and_booleans_bound_to_string_arguments_arrive_as_their_json_text() {
    let tool = BoundTool::new(recorder(
        "search",
        vec![
            arg("strict", true, Transport::Json),
            arg("limit", true, Transport::Json),
            arg("ratio", true, Transport::Json),
        ],
    ))
    .with_bindings([
        AppliedBinding {
            arg: "strict".into(),
            value: BoundValue::Literal(json!(true)),
            when_unbound: WhenUnbound::Fail,
        },
        AppliedBinding {
            arg: "limit".into(),
            value: BoundValue::Param("limit".into()),
            when_unbound: WhenUnbound::Fail,
        },
        AppliedBinding {
            arg: "ratio".into(),
            value: BoundValue::Fixed(ParamValue::Plain(json!(1.5))),
            when_unbound: WhenUnbound::Fail,
        },
    ]);
    let mut values = Values::new();
    values.insert("limit".into(), ParamValue::Plain(json!(42)));
    let merged = tool.merge(serde_json::Map::new(), &values).unwrap();
    let got: Vec<(&str, serde_json::Value)> = merged
        .args
        .iter()
        .map(|(k, v)| (k.as_str(), v.plain().unwrap().clone()))
        .collect();
    assert_eq!(
        got,
        [
            ("limit", json!("42")),
            ("ratio", json!("1.5")),
            ("strict", json!("true"))
        ]
    );
}
