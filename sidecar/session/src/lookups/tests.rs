//! The lookup states of `depends_on`, one rule a test: what a pending item
//! of an orchestration shows, which inputs a call lacks, the walk through a
//! tool's lookups (order, choices, confirmation, the cache and its `ttl_ms`
//! at the `now` it is given), and when an API's refusal means "stale".

use std::sync::{Arc, Mutex};

use super::*;
use bindery_bindings::{AppliedBinding, BoundValue};
use bindery_params::{ParamValue, SecretString};
use bindery_spec::{ToolDecl, WhenUnbound};
use bindery_tools::{ArgSpec, CallArgs, Tool, ToolOutput, ToolSpec, Transport};

// ---- builders ----------------------------------------------------------

type Calls = Arc<Mutex<Vec<String>>>;

/// What a fake tool answers.
#[derive(Clone)]
enum Answer {
    Json(Value),
    Text(&'static str),
    Fail(&'static str),
}

/// A tool answering `answer`, recording each call as `name {args}`.
struct Fake {
    spec: ToolSpec,
    answer: Answer,
    calls: Calls,
}

#[async_trait::async_trait]
impl Tool for Fake {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    async fn call(&self, args: CallArgs, _: &CallContext) -> Result<ToolOutput, ToolError> {
        let args: BTreeMap<_, _> = args
            .iter()
            .map(|(k, v)| (k.clone(), v.plain().cloned()))
            .collect();
        self.calls
            .lock()
            .unwrap()
            .push(format!("{} {}", self.spec.name, json!(args)));
        match &self.answer {
            Answer::Json(v) => Ok(ToolOutput::Json(v.clone())),
            Answer::Text(t) => Ok(ToolOutput::text(*t)),
            Answer::Fail(e) => Err(ToolError::Failed((*e).to_string())),
        }
    }
}

/// An argument: its name, whether it is required, its schema.
fn arg(name: &str, required: bool, schema: Value) -> ArgSpec {
    ArgSpec {
        name: name.into(),
        description: String::new(),
        required,
        schema,
        transport: Transport::Json,
    }
}

/// Required string arguments.
fn strings(names: &[&str]) -> Vec<ArgSpec> {
    names
        .iter()
        .map(|n| arg(n, true, json!({"type": "string"})))
        .collect()
}

fn fake(name: &str, args: Vec<ArgSpec>, writes: bool, answer: Answer, calls: &Calls) -> BoundTool {
    BoundTool::new(Arc::new(Fake {
        spec: ToolSpec {
            name: name.into(),
            local_name: name.into(),
            description: String::new(),
            args,
            writes,
        },
        answer,
        calls: calls.clone(),
    }))
}

fn decl(name: &str, deps: &str) -> ToolDecl {
    ToolDecl {
        tool: name.into(),
        read_only: false,
        depends_on: serde_yaml::from_str(deps).unwrap(),
        untrusted: false,
        egress: false,
    }
}

/// Tools, the session's values and everything [`resolve`] is given; the
/// tool resolved is `book`.
struct World {
    tools: Vec<BoundTool>,
    calls: Calls,
    session: String,
    values: Values,
    cache: LookupCache,
    now: i64,
    max_steps: u32,
    confirm: bool,
}

impl World {
    fn new() -> World {
        World {
            tools: Vec::new(),
            calls: Calls::default(),
            session: "s-1".into(),
            values: Values::new(),
            cache: LookupCache::default(),
            now: 1_000,
            max_steps: 10,
            confirm: false,
        }
    }

    /// Add a read-only lookup with required string arguments `args`.
    fn lookup(mut self, name: &str, args: &[&str], answer: Answer) -> World {
        let t = fake(name, strings(args), false, answer, &self.calls);
        self.tools.push(t);
        self
    }

    /// Give the last tool added the dependencies `deps` (YAML).
    fn depending(mut self, deps: &str) -> World {
        let t = self.tools.pop().expect("a tool");
        let name = t.name().to_string();
        self.tools.push(t.with_decl(&decl(&name, deps)));
        self
    }

    /// Add `book`, which writes, with required string arguments `args`
    /// and dependencies `deps`.
    fn book(mut self, args: &[&str], deps: &str) -> World {
        let t = fake(
            "book",
            strings(args),
            true,
            Answer::Json(json!({})),
            &self.calls,
        );
        self.tools.push(t);
        self.depending(deps)
    }

    fn target(&self) -> &BoundTool {
        self.tools.iter().find(|t| t.name() == "book").unwrap()
    }

    /// A state to start from in this world's context.
    fn start(&self, args: Value) -> LookupState {
        LookupState {
            args,
            context: context_digest(&self.session, &self.values),
            ..Default::default()
        }
    }

    async fn resolve(&self, state: LookupState) -> Step {
        self.resolve_with(state, false).await
    }

    async fn resolve_with(&self, state: LookupState, fresh: bool) -> Step {
        let call = CallContext {
            session_id: self.session.clone(),
            ..Default::default()
        };
        let scrubber = bindery_params::scrub::Scrubber::from_values(&self.values);
        let env = Env {
            tools: &self.tools,
            values: &self.values,
            call: &call,
            cache: &self.cache,
            scrubber: &scrubber,
            max_steps: self.max_steps,
            now: self.now,
            confirm: self.confirm,
            host: None,
        };
        resolve(&env, self.target(), state, fresh).await
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

/// A `slots` answer offering `(token, at)` pairs.
fn slots(pairs: &[(&str, &str)]) -> Answer {
    let slots: Vec<Value> = pairs
        .iter()
        .map(|(token, at)| json!({"token": token, "at": at}))
        .collect();
    Answer::Json(json!({ "slots": slots }))
}

/// `svc` fills `service_id`, then `slots`, selected by `select` (YAML
/// flow map), fills `slot_token`.
fn deps_selecting(select: &str) -> String {
    format!(
        r#"
- {{tool: svc, map: {{$.service_id: "$.services[0].id"}}}}
- tool: slots
  arguments: {{date: $.date, service_id: $.service_id}}
  select: {select}
  map: {{$.slot_token: $.token}}
"#
    )
}

const SELECT: &str =
    "{items_path: $.slots, id_path: $.token, label_path: $.at, facts: {time: $.at}}";
const SLOTS_KEY: &str = "book/2:slots";

/// The booking world: `svc` finds service `s1`, `slots` answers `slots`,
/// `book` writes with what `deps` fill.
fn booking_with(deps: &str, slots: Answer) -> World {
    World::new()
        .lookup(
            "svc",
            &[],
            Answer::Json(json!({"services": [{"id": "s1"}]})),
        )
        .lookup("slots", &["date", "service_id"], slots)
        .book(&["date", "service_id", "slot_token"], deps)
}

fn booking_selecting(select: &str, slots: Answer) -> World {
    booking_with(&deps_selecting(select), slots)
}

fn booking(slots: Answer) -> World {
    booking_selecting(SELECT, slots)
}

fn two_slots() -> Answer {
    slots(&[("t1", "10:00"), ("t2", "11:00")])
}

fn d1() -> Value {
    json!({"date": "d1"})
}

fn waits(step: Step) -> (Disposition, LookupState) {
    match step {
        Step::Wait(d, state) => (d, state),
        other => panic!("not waiting: {other:?}"),
    }
}

fn ready(step: Step) -> (Value, Vec<String>) {
    match step {
        Step::Ready(args, sensitive) => (args, sensitive),
        other => panic!("not ready: {other:?}"),
    }
}

fn failed(step: Step) -> String {
    match step {
        Step::Failed(why) => why,
        other => panic!("not failed: {other:?}"),
    }
}

/// The options of a selection: (id shown, label, real id).
fn options(state: &LookupState) -> Vec<(String, String, String)> {
    match &state.ask {
        Ask::Selection { options, .. } => options
            .iter()
            .map(|o| (o.id.clone(), o.label.clone(), o.real.clone()))
            .collect(),
        other => panic!("not a selection: {other:?}"),
    }
}

fn note(state: &LookupState) -> Option<&str> {
    match &state.ask {
        Ask::Selection { note, .. } | Ask::Confirmation { note, .. } => note.as_deref(),
        _ => None,
    }
}

fn facts(state: &LookupState) -> Value {
    match &state.ask {
        Ask::Confirmation { facts, .. } => Value::Object(facts.clone()),
        other => panic!("not a confirmation: {other:?}"),
    }
}

/// The state with its prepared call approved.
fn approved(mut state: LookupState) -> LookupState {
    if let Ask::Confirmation { prepared, .. } = &state.ask {
        state.approved = Some(prepared.clone());
    }
    state
}

/// The state with the option whose real id is `real` chosen at `key`.
fn chose(mut state: LookupState, key: &str, real: &str) -> LookupState {
    state.choices.insert(key.into(), real.into());
    state
}

// ---- the session context -----------------------------------------------

#[test]
fn the_context_changes_with_the_session_or_a_plain_value() {
    let acme: Values = [("tenant".to_string(), ParamValue::Plain(json!("acme")))].into();
    let globex: Values = [("tenant".to_string(), ParamValue::Plain(json!("globex")))].into();
    let base = context_digest("s-1", &acme);
    assert_eq!(base, context_digest("s-1", &acme));
    assert_ne!(base, context_digest("s-2", &acme));
    assert_ne!(base, context_digest("s-1", &globex));
    assert_ne!(base, context_digest("s-1", &Values::new()));
}

#[test]
fn the_context_ignores_secret_values() {
    let with = |secret: &str| -> Values {
        [
            ("tenant".to_string(), ParamValue::Plain(json!("acme"))),
            (
                "token".to_string(),
                ParamValue::Secret(SecretString::new(secret)),
            ),
        ]
        .into()
    };
    let plain: Values = [("tenant".to_string(), ParamValue::Plain(json!("acme")))].into();
    assert_eq!(
        context_digest("s-1", &with("sk-one-1234")),
        context_digest("s-1", &with("sk-two-5678"))
    );
    assert_eq!(
        context_digest("s-1", &with("sk-one-1234")),
        context_digest("s-1", &plain)
    );
}

// ---- which inputs a call lacks -----------------------------------------

/// `book` with arguments `args` and no dependency.
fn taking(args: Vec<ArgSpec>) -> BoundTool {
    fake(
        "book",
        args,
        true,
        Answer::Json(json!({})),
        &Calls::default(),
    )
}

#[test]
fn a_required_argument_absent_or_null_is_missing_and_an_optional_one_is_not() {
    let mut args = strings(&["date", "service", "name"]);
    args.push(arg("note", false, json!({"type": "string"})));
    let t = taking(args);
    let missing = missing_inputs(
        &t,
        &Values::new(),
        &json!({"service": null, "name": "x", "note": null}),
    );
    assert_eq!(missing, ["date", "service"], "in declaration order");
    let all = json!({"date": "d", "service": "s", "name": "x"});
    assert!(missing_inputs(&t, &Values::new(), &all).is_empty());
}

#[test]
fn an_argument_given_with_the_wrong_type_is_missing_even_if_optional() {
    let table = [
        (json!({"type": "string"}), json!(5), json!("5")),
        (json!({"type": "string"}), json!("  "), json!("x")),
        (json!({"type": "integer"}), json!(1.5), json!(2)),
        (json!({"type": "integer"}), json!("2"), json!(-2)),
        (json!({"type": "number"}), json!("1.5"), json!(1.5)),
        (json!({"type": "boolean"}), json!("true"), json!(false)),
        (json!({"type": "array"}), json!({}), json!([])),
        (json!({"type": "object"}), json!([]), json!({})),
    ];
    for (schema, wrong, right) in table {
        let t = taking(vec![arg("a", false, schema.clone())]);
        assert_eq!(
            missing_inputs(&t, &Values::new(), &json!({ "a": wrong })),
            ["a"],
            "{schema} {wrong}"
        );
        assert!(
            missing_inputs(&t, &Values::new(), &json!({ "a": right })).is_empty(),
            "{schema} {right}"
        );
    }
    // No simple type: anything fits.
    let t = taking(vec![arg("a", true, json!({"enum": ["x"]}))]);
    for v in [json!(1), json!(" "), json!([]), json!({})] {
        assert!(missing_inputs(&t, &Values::new(), &json!({ "a": v })).is_empty());
    }
}

#[test]
fn an_argument_a_dependency_fills_is_never_asked_for() {
    let w = booking(two_slots());
    assert_eq!(
        missing_inputs(w.target(), &w.values, &json!({})),
        ["date"],
        "service_id and slot_token are the lookups'"
    );
}

#[test]
fn a_bound_argument_is_never_asked_for_unless_exposed_while_unbound() {
    let bind = |value: BoundValue, when_unbound| AppliedBinding {
        arg: "tenant".into(),
        value,
        when_unbound,
    };
    let t = taking(strings(&["tenant"]));
    let literal = t.with_bindings([bind(BoundValue::Literal(json!("acme")), WhenUnbound::Fail)]);
    assert!(missing_inputs(&literal, &Values::new(), &json!({})).is_empty());
    let exposed = t.with_bindings([bind(
        BoundValue::Param("tenant".into()),
        WhenUnbound::Expose,
    )]);
    assert_eq!(
        missing_inputs(&exposed, &Values::new(), &json!({})),
        ["tenant"]
    );
    let bound: Values = [("tenant".to_string(), ParamValue::Plain(json!("acme")))].into();
    assert!(missing_inputs(&exposed, &bound, &json!({})).is_empty());
}

// ---- stale ---------------------------------------------------------------

#[test]
fn an_http_409_or_410_from_the_api_means_the_prepared_input_went_stale() {
    let http = |status: u16| ToolError::Http {
        status,
        message: format!("HTTP {status}"),
    };
    for (status, stale) in [(409, true), (410, true), (404, false), (500, false)] {
        assert_eq!(is_stale(&http(status)), stale, "{status}");
    }
    // Only the status says so, never a text that merely names one.
    for message in [
        "HTTP 409 Conflict",
        "POST /bookings: HTTP 409 slot taken",
        "HTTP 410",
    ] {
        assert!(!is_stale(&ToolError::Failed(message.into())), "{message}");
    }
    assert!(!is_stale(&ToolError::InvalidArguments("HTTP 409".into())));
    assert!(!is_stale(&ToolError::Unavailable));
}

// ---- the walk: inputs first --------------------------------------------

#[tokio::test]
async fn a_missing_input_stops_the_call_before_any_lookup() {
    let w = booking(two_slots());
    let mut start = w.start(json!({}));
    start.expires_at = Some(5);
    let (d, state) = waits(w.resolve(start).await);
    assert_eq!(d, Disposition::NeedsInput);
    assert_eq!(
        state.ask,
        Ask::Input {
            missing: vec!["date".into()]
        }
    );
    assert_eq!(state.expires_at, None, "an input does not expire");
    assert!(w.calls().is_empty(), "{:?}", w.calls());
}

// ---- the walk: lookups -------------------------------------------------

#[tokio::test]
async fn a_lookups_own_dependencies_run_first_under_its_key() {
    let w = World::new()
        .lookup(
            "svc",
            &[],
            Answer::Json(json!({"services": [{"id": "s1"}, {"id": "s2"}]})),
        )
        .lookup("slots", &["service_id"], slots(&[("t1", "10:00")]))
        .depending(
            "[{tool: svc, select: {items_path: $.services, id_path: $.id}, map: {$.service_id: $.id}}]",
        )
        .book(
            &["slot_token"],
            "[{tool: slots, map: {$.slot_token: \"$.slots[0].token\"}}]",
        );
    let (d, state) = waits(w.resolve(w.start(json!({}))).await);
    assert_eq!(d, Disposition::NeedsSelection);
    assert!(
        matches!(&state.ask, Ask::Selection { key, lookup, .. } if key == "book/1:slots/1:svc" && lookup == "svc"),
        "{:?}",
        state.ask
    );
    let (d, _) = waits(w.resolve(chose(state, "book/1:slots/1:svc", "s2")).await);
    assert_eq!(d, Disposition::NeedsConfirmation);
    assert_eq!(
        w.calls(),
        [
            "svc {}".to_string(),
            r#"slots {"service_id":"s2"}"#.to_string()
        ]
    );
}

#[tokio::test]
async fn a_lookup_that_cannot_serve_fails_the_call_saying_why() {
    let table = [
        (
            "nope",
            Answer::Json(json!({})),
            "$.id",
            "the lookup `nope` is not available",
        ),
        (
            "svc",
            Answer::Fail("boom"),
            "$.id",
            "the lookup `svc` failed: boom",
        ),
        (
            "svc",
            Answer::Text("service s1"),
            "$.id",
            "the lookup `svc` did not answer with JSON",
        ),
        (
            "svc",
            Answer::Json(json!({"id": "s1"})),
            "$.nope",
            "the lookup `svc` gave nothing at `$.nope` for `$.x`",
        ),
        (
            "svc",
            Answer::Json(json!({"id": null})),
            "$.id",
            "the lookup `svc` gave nothing at `$.id` for `$.x`",
        ),
    ];
    for (named, answer, source, why) in table {
        let w = World::new().lookup("svc", &[], answer).book(
            &["x"],
            &format!("[{{tool: {named}, map: {{$.x: {source}}}}}]"),
        );
        assert_eq!(failed(w.resolve(w.start(json!({}))).await), why);
    }
}

#[tokio::test]
async fn when_missing_runs_a_lookup_when_a_destination_is_absent_or_null() {
    let deps = "[{tool: svc, when: missing, map: {$.x: $.id}}]";
    let w = World::new()
        .lookup("svc", &[], Answer::Json(json!({"id": "s1"})))
        .book(&["x"], deps);
    for given in [json!({}), json!({"x": null})] {
        let (_, state) = waits(w.resolve(w.start(given)).await);
        assert!(matches!(state.ask, Ask::Confirmation { .. }));
    }
    assert_eq!(w.calls().len(), 1, "the second came from the cache");
    let (_, state) = waits(w.resolve(w.start(json!({"x": "mine"}))).await);
    let (args, _) = ready(w.resolve(approved(state)).await);
    assert_eq!(args, json!({"x": "mine"}), "a given destination is kept");
    assert_eq!(w.calls().len(), 1);
}

// ---- the walk: steps ---------------------------------------------------

#[tokio::test]
async fn max_steps_allows_exactly_that_many_lookups_and_a_cached_one_is_no_step() {
    let mut w = booking(slots(&[("t1", "10:00")]));
    w.max_steps = 2;
    waits(w.resolve(w.start(d1())).await);
    w.max_steps = 0;
    let (d, _) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(
        d,
        Disposition::NeedsConfirmation,
        "both came from the cache"
    );
    let mut w = booking(slots(&[("t1", "10:00")]));
    w.max_steps = 1;
    assert_eq!(
        failed(w.resolve(w.start(d1())).await),
        "resolving the inputs took more than 1 lookups (the agent's maxSteps)"
    );
    assert_eq!(w.calls(), ["svc {}"], "the second lookup never ran");
}

// ---- the walk: the cache -----------------------------------------------

#[tokio::test]
async fn a_lookup_is_cached_until_its_ttl_ends_and_not_at_its_end() {
    let mut w = booking(slots(&[("t1", "10:00")]));
    waits(w.resolve(w.start(d1())).await);
    w.now = 1_000 + 30_000 - 1;
    waits(w.resolve(w.start(d1())).await);
    assert_eq!(w.calls().len(), 2, "served from the cache");
    w.now = 1_000 + 30_000;
    waits(w.resolve(w.start(d1())).await);
    assert_eq!(w.calls().len(), 4, "stale at exactly its ttl");
}

#[tokio::test]
async fn a_fresh_walk_ignores_the_cache() {
    let w = booking(slots(&[("t1", "10:00")]));
    waits(w.resolve(w.start(d1())).await);
    waits(w.resolve_with(w.start(d1()), true).await);
    assert_eq!(w.calls().len(), 4);
}

#[tokio::test]
async fn a_lookup_is_cached_per_arguments_and_session_context() {
    let mut w = booking(slots(&[("t1", "10:00")]));
    waits(w.resolve(w.start(d1())).await);
    waits(w.resolve(w.start(json!({"date": "d2"}))).await);
    assert_eq!(w.calls().len(), 3, "svc served, slots asked for d2");
    w.session = "s-2".into();
    waits(w.resolve(w.start(d1())).await);
    assert_eq!(w.calls().len(), 5, "another session runs both again");
}

#[test]
fn a_cache_entry_is_fresh_before_its_end_and_gone_at_it() {
    let cache = LookupCache::default();
    cache.put([1; 32], 100, 200, json!({"a": 1}));
    assert_eq!(cache.get(&[1; 32], 199), Some((100, json!({"a": 1}))));
    assert_eq!(cache.get(&[2; 32], 199), None);
    assert_eq!(cache.get(&[1; 32], 200), None);
}

// ---- the walk: expiry --------------------------------------------------

#[tokio::test]
async fn a_stop_expires_with_the_earliest_lookup_it_rests_on() {
    let deps = deps_selecting(SELECT).replacen(
        "map: {$.service_id",
        "ttl_ms: 5000, map: {$.service_id",
        1,
    );
    let mut w = booking_with(&deps, two_slots());
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(state.expires_at, Some(1_000 + 5_000));
    // Served from the cache later, it still rests on when they were fetched.
    w.now = 3_000;
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(state.expires_at, Some(1_000 + 5_000));
    assert_eq!(w.calls().len(), 2);
}

// ---- the walk: selections ----------------------------------------------

#[tokio::test]
async fn a_single_option_is_taken_without_asking() {
    let w = booking(slots(&[("t9", "10:00")]));
    let (d, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(d, Disposition::NeedsConfirmation);
    assert_eq!(facts(&state), json!({"time": "10:00"}));
}

#[tokio::test]
async fn several_options_ask_for_a_choice_in_the_apis_order_with_their_facts() {
    let w = booking(slots(&[("t2", "11:00"), ("t1", "10:00"), ("t3", "12:00")]));
    let (d, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(d, Disposition::NeedsSelection);
    let Ask::Selection {
        key,
        lookup,
        options,
        note,
    } = &state.ask
    else {
        panic!("{:?}", state.ask)
    };
    assert_eq!(
        (key.as_str(), lookup.as_str(), note),
        (SLOTS_KEY, "slots", &None)
    );
    let shown: Vec<(&str, &str, &str, Value)> = options
        .iter()
        .map(|o| {
            (
                o.id.as_str(),
                o.label.as_str(),
                o.real.as_str(),
                Value::Object(o.facts.clone()),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("t2", "11:00", "t2", json!({"time": "11:00"})),
            ("t1", "10:00", "t1", json!({"time": "10:00"})),
            ("t3", "12:00", "t3", json!({"time": "12:00"})),
        ]
    );
    assert_eq!(state.expires_at, Some(1_000 + 30_000));
    assert_eq!(state.args, d1(), "the state keeps the arguments as given");
}

#[tokio::test]
async fn a_choice_fills_the_arguments_from_the_chosen_option() {
    let w = booking(two_slots());
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    let (d, state) = waits(w.resolve(chose(state, SLOTS_KEY, "t2")).await);
    assert_eq!(d, Disposition::NeedsConfirmation);
    assert_eq!(facts(&state), json!({"time": "11:00"}));
    let (args, sensitive) = ready(w.resolve(approved(state)).await);
    assert_eq!(
        args,
        json!({"date": "d1", "service_id": "s1", "slot_token": "t2"})
    );
    assert!(sensitive.is_empty());
}

#[tokio::test]
async fn a_choice_no_longer_offered_asks_again_and_says_why() {
    let w = booking(two_slots());
    let (_, state) = waits(w.resolve(chose(w.start(d1()), SLOTS_KEY, "t7")).await);
    assert_eq!(
        note(&state),
        Some("the option chosen before is no longer offered; choose again")
    );
    assert_eq!(options(&state).len(), 2);
}

#[tokio::test]
async fn a_choice_made_in_another_context_is_dropped() {
    let w = booking(two_slots());
    let mut old = chose(w.start(d1()), SLOTS_KEY, "t2");
    old.context = "another".into();
    old.approved = Some("a prepared call".into());
    let (d, state) = waits(w.resolve(old).await);
    assert_eq!(d, Disposition::NeedsSelection);
    assert!(state.choices.is_empty());
    assert_eq!(state.approved, None);
    assert_eq!(state.context, context_digest("s-1", &Values::new()));
    assert_eq!(note(&state), None, "nothing was chosen in this context");
}

#[tokio::test]
async fn no_option_is_an_outcome_not_an_error() {
    let w = booking(slots(&[]));
    assert!(matches!(
        w.resolve(w.start(d1())).await,
        Step::NoOptions { lookup } if lookup == "slots"
    ));
}

#[tokio::test]
async fn options_that_cannot_be_told_apart_fail_the_call_saying_why() {
    let table = [
        (
            json!({"slots": {"t1": "10:00"}}),
            "the lookup `slots` answered without a list at `$.slots`",
        ),
        (
            json!({"slots": [{"token": "t1"}, {"at": "11:00"}, {"token": {"no": "text"}}]}),
            "the lookup `slots`: option 2 has no id at `$.token`, so it cannot be chosen",
        ),
        (
            json!({"slots": [{"token": "t1"}, {"token": "t2"}, {"token": "t1"}]}),
            "the lookup `slots`: options 1 and 3 have the same id, so a choice would be ambiguous",
        ),
    ];
    for (answer, why) in table {
        let w = booking(Answer::Json(answer));
        assert_eq!(failed(w.resolve(w.start(d1())).await), why);
    }
}

#[tokio::test]
async fn an_option_without_a_label_is_labelled_by_its_id_and_numbers_serve_as_text() {
    let w = booking_selecting("{items_path: $.slots, id_path: $.token}", two_slots());
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(
        options(&state),
        [
            ("t1".into(), "t1".into(), "t1".into()),
            ("t2".into(), "t2".into(), "t2".into())
        ]
    );
    let w = booking(Answer::Json(
        json!({"slots": [{"token": 7, "at": true}, {"token": 8, "at": 1.5}]}),
    ));
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(
        options(&state),
        [
            ("7".into(), "true".into(), "7".into()),
            ("8".into(), "1.5".into(), "8".into())
        ]
    );
}

// ---- the walk: sensitive ids -------------------------------------------

const SENSITIVE: &str = "{items_path: $.slots, id_path: $.token, id_sensitive: true}";

#[tokio::test]
async fn a_sensitive_id_is_shown_opaque_and_labelled_by_its_number() {
    let w = booking_selecting(SENSITIVE, two_slots());
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    let options = options(&state);
    for (n, (id, label, real)) in options.iter().enumerate() {
        assert_eq!(label, &format!("option {}", n + 1));
        assert_eq!(real, &format!("t{}", n + 1));
        let hex = id.strip_prefix("opt_").unwrap();
        assert_eq!(hex.len(), 16, "{id}");
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
    assert_ne!(options[0].0, options[1].0);
    let shown = format!("{:?}", state.asked());
    assert!(!shown.contains("t1") && !shown.contains("t2"), "{shown}");
}

#[tokio::test]
async fn a_chosen_sensitive_id_is_handed_back_to_keep_out_of_the_logs() {
    let w = booking_selecting(SENSITIVE, two_slots());
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    let (_, state) = waits(w.resolve(chose(state, SLOTS_KEY, "t2")).await);
    let (args, sensitive) = ready(w.resolve(approved(state)).await);
    assert_eq!(args["slot_token"], "t2");
    assert_eq!(sensitive, ["t2"]);
}

#[tokio::test]
async fn a_secret_in_a_lookups_answer_never_reaches_an_option() {
    let mut w = booking(slots(&[("t1", "sk-canary-7f3a9c"), ("t2", "11:00")]));
    w.values.insert(
        "token".into(),
        ParamValue::Secret(SecretString::new("sk-canary-7f3a9c")),
    );
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(options(&state)[0].1, "<secret:token>");
    let stored = serde_json::to_string(&state).unwrap();
    assert!(!stored.contains("7f3a9c"), "{stored}");
}

// ---- the walk: match ---------------------------------------------------

const MATCHING: &str =
    "{items_path: $.slots, id_path: $.token, label_path: $.at, match: {input_path: $.preferred, item_path: $.at}}";

#[tokio::test]
async fn a_match_takes_the_one_option_equal_to_the_users_trimmed_and_case_blind() {
    let w = booking_selecting(MATCHING, slots(&[("t1", "Morning"), ("t2", "Evening")]));
    let (d, _) = waits(
        w.resolve(w.start(json!({"date": "d1", "preferred": "  evening "})))
            .await,
    );
    assert_eq!(d, Disposition::NeedsConfirmation);
    assert_eq!(w.calls().len(), 2);
    let (_, state) = waits(
        w.resolve(w.start(json!({"date": "d1", "preferred": "EVENING"})))
            .await,
    );
    let (args, _) = ready(w.resolve(approved(state)).await);
    assert_eq!(args["slot_token"], "t2");
}

#[tokio::test]
async fn a_match_of_no_option_asks_and_says_so_even_when_one_is_offered() {
    for offered in [
        vec![("t1", "Morning"), ("t2", "Evening")],
        vec![("t1", "Morning")],
    ] {
        let w = booking_selecting(MATCHING, slots(&offered));
        let (d, state) = waits(
            w.resolve(w.start(json!({"date": "d1", "preferred": " Noon "})))
                .await,
        );
        assert_eq!(d, Disposition::NeedsSelection);
        assert_eq!(options(&state).len(), offered.len());
        assert_eq!(
            note(&state),
            Some("no option matches `noon` exactly; these are the alternatives")
        );
    }
}

#[tokio::test]
async fn a_match_of_several_options_asks_and_says_so() {
    let w = booking_selecting(
        MATCHING,
        slots(&[("t1", "Morning"), ("t2", "morning "), ("t3", "Evening")]),
    );
    let (_, state) = waits(
        w.resolve(w.start(json!({"date": "d1", "preferred": "Morning"})))
            .await,
    );
    assert_eq!(
        note(&state),
        Some("several options match `morning`; choose one")
    );
    assert_eq!(options(&state).len(), 3, "every option is offered");
}

#[tokio::test]
async fn a_match_without_the_users_value_takes_a_single_option_and_asks_among_several() {
    let w = booking_selecting(MATCHING, slots(&[("t1", "Morning")]));
    let (d, _) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(d, Disposition::NeedsConfirmation);
    let w = booking_selecting(MATCHING, slots(&[("t1", "Morning"), ("t2", "Evening")]));
    let (d, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(d, Disposition::NeedsSelection);
    assert_eq!(note(&state), None);
}

// ---- the walk: confirmation --------------------------------------------

#[tokio::test]
async fn a_tool_that_writes_nothing_is_ready_without_confirmation() {
    let calls = Calls::default();
    let mut w = World::new().lookup("svc", &[], Answer::Json(json!({"id": "s1"})));
    w.tools.push(
        fake(
            "book",
            strings(&["x"]),
            false,
            Answer::Json(json!({})),
            &calls,
        )
        .with_decl(&decl("book", "[{tool: svc, map: {$.x: $.id}}]")),
    );
    let (args, _) = ready(w.resolve(w.start(json!({}))).await);
    assert_eq!(args, json!({"x": "s1"}));
    w.confirm = true;
    let (d, state) = waits(w.resolve(w.start(json!({}))).await);
    assert_eq!(d, Disposition::NeedsConfirmation, "a confirm selector asks");
    assert_eq!(state.expires_at, Some(1_000 + 30_000));
}

#[tokio::test]
async fn the_confirmation_is_of_the_prepared_call_in_canonical_json() {
    let w = booking(slots(&[("t9", "10:00")]));
    let (_, state) = waits(w.resolve(w.start(d1())).await);
    let args = json!({"slot_token": "t9", "service_id": "s1", "date": "d1"});
    let digest = hex::encode(Sha256::digest(canonical(&args).to_string().as_bytes()));
    assert!(
        matches!(&state.ask, Ask::Confirmation { prepared, note: None, .. } if *prepared == digest),
        "{:?}",
        state.ask
    );
}

#[tokio::test]
async fn an_approval_of_another_prepared_call_asks_again() {
    let w = booking(slots(&[("t9", "10:00")]));
    let mut state = w.start(d1());
    state.approved = Some("the digest of another call".into());
    let (d, state) = waits(w.resolve(state).await);
    assert_eq!(d, Disposition::NeedsConfirmation);
    assert_eq!(state.approved, None);
}

#[tokio::test]
async fn after_the_api_refused_a_write_the_confirmation_says_the_lookups_ran_again() {
    let w = booking(slots(&[("t9", "10:00")]));
    let mut state = w.start(d1());
    state.refreshed = true;
    let (_, state) = waits(w.resolve_with(state, true).await);
    assert_eq!(
        note(&state),
        Some("the API refused the earlier call (409/410); the lookups ran again: review this one")
    );
}

// ---- earlier tests -----------------------------------------------------

#[tokio::test]
async fn a_later_dependency_reads_what_an_earlier_map_filled_and_a_write_waits() {
    let w = booking(slots(&[("t9", "10:00")]));
    let (d, state) = waits(w.resolve(w.start(d1())).await);
    assert_eq!(d, Disposition::NeedsConfirmation);
    assert_eq!(
        w.calls(),
        vec![
            "svc {}".to_string(),
            r#"slots {"date":"d1","service_id":"s1"}"#.to_string()
        ]
    );
    assert_eq!(facts(&state), json!({"time": "10:00"}));
    assert_eq!(state.expires_at, Some(31_000));
    // Approved: ready, from the cache.
    let (args, sensitive) = ready(w.resolve(approved(state)).await);
    assert!(sensitive.is_empty(), "{sensitive:?}");
    assert_eq!(
        args,
        json!({"date": "d1", "service_id": "s1", "slot_token": "t9"})
    );
    assert_eq!(w.calls().len(), 2, "a cached lookup ran again");
}

#[tokio::test]
async fn when_missing_skips_a_given_destination_and_max_steps_bounds_the_lookups() {
    let w = booking_with(
        "[{tool: svc, when: missing, map: {$.service_id: \"$.services[0].id\"}},
          {tool: slots, when: missing, arguments: {date: $.date, service_id: $.service_id}, map: {$.slot_token: \"$.slots[0].token\"}}]",
        slots(&[("t9", "10:00")]),
    );
    let given = w.start(json!({"date": "d1", "service_id": "s7", "slot_token": "t1"}));
    let (d, _) = waits(w.resolve(given).await);
    assert_eq!(d, Disposition::NeedsConfirmation);
    assert!(w.calls().is_empty(), "{:?}", w.calls());
    let mut w = booking(slots(&[("t9", "10:00")]));
    w.max_steps = 1;
    let why = failed(w.resolve(w.start(d1())).await);
    assert!(why.contains("more than 1 lookups"), "{why}");
}
