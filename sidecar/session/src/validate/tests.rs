//! The validation table, one rule a test: which values each caller may
//! give on each request, by a parameter's scope, secrecy, pins and
//! requirement, and the exact error (kind, code, names, message) when not.

use super::*;
use bindery_params::{ApiKeys, ProcessValues, SecretString};
use bindery_spec::ParameterDecl;
use serde_json::json;

// ---- builders ----------------------------------------------------------

fn decl(name: &str, scope: Scope, secret: bool, required: bool) -> ParameterDecl {
    ParameterDecl {
        name: name.into(),
        description: None,
        secret,
        scope,
        required,
        default: None,
    }
}

/// `tenant` (session, required), `token` (session, secret, required),
/// `otp` (message, secret, optional), `region` (process, set to `eu`),
/// `plan` (session, optional, pinned by the operator to `gold`), and
/// `extra`.
fn agent_with(extra: Vec<ParameterDecl>) -> AgentParams {
    let mut decls = vec![
        decl("tenant", Scope::Session, false, true),
        decl("token", Scope::Session, true, true),
        decl("otp", Scope::Message, true, false),
        decl("region", Scope::Process, false, true),
        decl("plan", Scope::Session, false, false),
    ];
    decls.extend(extra);
    let mut pv = ProcessValues::new();
    pv.add_flag("--set", "region=eu").unwrap();
    pv.add_flag("--pin", "plan=gold").unwrap();
    let (p, errors) =
        AgentParams::build(&decls, &pv, std::path::Path::new("."), &ApiKeys::default());
    assert!(errors.is_empty());
    p
}

fn agent() -> AgentParams {
    agent_with(vec![])
}

/// The agent with a required message-scope `code` as well.
fn asking_a_code() -> AgentParams {
    agent_with(vec![decl("code", Scope::Message, false, true)])
}

fn map(v: serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    serde_json::from_value(v).unwrap()
}

fn check(
    op: Op,
    caller: Caller,
    sealed: bool,
    current: &Values,
    v: serde_json::Value,
) -> Result<Accepted, ParamsError> {
    validate(&agent(), op, &caller, sealed, &[], current, &map(v))
}

/// `v` from the owner, on an unsealed session holding `current`.
fn owner(op: Op, current: &Values, v: serde_json::Value) -> Result<Accepted, ParamsError> {
    check(op, Caller::Owner, false, current, v)
}

fn err(r: Result<Accepted, ParamsError>) -> (ErrorKind, &'static str, Vec<String>) {
    let e = r.unwrap_err();
    (e.kind(), e.code().as_str(), e.names().to_vec())
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

fn plain(v: serde_json::Value) -> ParamValue {
    ParamValue::Plain(v)
}

fn secret(s: &str) -> ParamValue {
    ParamValue::Secret(SecretString::new(s))
}

/// A session holding every required session value: `tenant` acme and
/// the secret `token`.
fn held() -> Values {
    [
        ("tenant".to_string(), plain(json!("acme"))),
        ("token".to_string(), secret("sk-held-7f3a")),
    ]
    .into()
}

const ALL_OPS: [Op; 7] = [
    Op::Create,
    Op::CreateIdle,
    Op::Fork,
    Op::ForkIdle,
    Op::Message,
    Op::Resume,
    Op::PutParams,
];

// ---- what an accepted request changes ----------------------------------

#[test]
fn a_complete_creation_keeps_each_value_by_scope_and_a_secret_as_secret() {
    let ok = owner(
        Op::Create,
        &Values::new(),
        json!({"tenant": "acme", "token": "sk-new-7f3a", "otp": "123456"}),
    )
    .unwrap();
    assert_eq!(ok.session.keys().collect::<Vec<_>>(), ["tenant", "token"]);
    assert_eq!(ok.session["tenant"], plain(json!("acme")));
    assert!(ok.session["token"].is_secret());
    assert_eq!(ok.message.keys().collect::<Vec<_>>(), ["otp"]);
    assert!(ok.message["otp"].is_secret());
    assert_eq!(ok.changed, names(&["otp", "tenant", "token"]));
    // Nothing of what was accepted shows the secret.
    let shown = format!("{ok:?} {}", serde_json::to_string(&ok.session).unwrap());
    assert!(!shown.contains("7f3a"), "{shown}");
}

#[test]
fn values_the_request_does_not_give_carry_over() {
    let ok = owner(Op::PutParams, &held(), json!({"tenant": "globex"})).unwrap();
    assert_eq!(ok.session["tenant"], plain(json!("globex")));
    assert_eq!(ok.session["token"], secret("sk-held-7f3a"));
    assert_eq!(ok.changed, names(&["tenant"]));
    assert!(ok.message.is_empty());
}

#[test]
fn a_plain_parameter_takes_any_json() {
    for v in [json!(7), json!(true), json!(["a"]), json!({"id": 1})] {
        let ok = owner(Op::PutParams, &held(), json!({ "tenant": v.clone() })).unwrap();
        assert_eq!(ok.session["tenant"], plain(v));
    }
}

#[test]
fn null_for_a_value_the_session_lacks_changes_nothing_but_is_reported() {
    let ok = owner(Op::Message, &held(), json!({"otp": null})).unwrap();
    assert_eq!(ok.session, held());
    assert!(ok.message.is_empty());
    assert_eq!(ok.changed, names(&["otp"]));
}

#[test]
fn nothing_given_by_anyone_changes_nothing() {
    for caller in [
        Caller::Owner,
        Caller::SessionToken("s".into()),
        Caller::Approver,
    ] {
        let ok = check(Op::Message, caller.clone(), true, &held(), json!({})).unwrap();
        assert_eq!(ok.session, held(), "{caller:?}");
        assert!(ok.changed.is_empty(), "{caller:?}");
    }
}

// ---- who may give values -----------------------------------------------

#[test]
fn unknown_names_are_refused_before_anything_else_and_all_named() {
    let e = check(
        Op::Message,
        Caller::SessionToken("s".into()),
        true,
        &held(),
        json!({"zz": 1, "tenant": "x", "aa": 2, "region": "us"}),
    )
    .unwrap_err();
    assert_eq!(e, ParamsError::Unknown(names(&["aa", "zz"])));
    assert_eq!(e.message(), "the agent declares no parameter named aa, zz");
}

#[test]
fn a_session_token_sets_no_parameter_on_any_request() {
    for op in ALL_OPS {
        let e = check(
            op,
            Caller::SessionToken("s".into()),
            false,
            &held(),
            json!({"tenant": "x", "otp": "1"}),
        )
        .unwrap_err();
        assert_eq!(
            e,
            ParamsError::Forbidden(
                names(&["otp", "tenant"]),
                "a session token cannot set parameters".into()
            ),
            "{op:?}"
        );
        assert_eq!(
            e.message(),
            "otp, tenant: a session token cannot set parameters"
        );
    }
}

#[test]
fn an_approver_sets_no_parameter() {
    let e = check(
        Op::Resume,
        Caller::Approver,
        false,
        &held(),
        json!({"otp": "1"}),
    )
    .unwrap_err();
    assert_eq!(
        e.message(),
        "otp: an approver answers pending calls and sets no parameters"
    );
    assert_eq!(e.kind(), ErrorKind::Forbidden);
}

#[test]
fn a_process_scope_name_is_refused_to_every_request_naming_only_it() {
    for op in ALL_OPS {
        let e = owner(op, &held(), json!({"region": "us", "tenant": "b"})).unwrap_err();
        assert_eq!(
            e,
            ParamsError::Forbidden(
                names(&["region"]),
                "process-scope parameters are set by the operator only".into()
            ),
            "{op:?}"
        );
    }
}

#[test]
fn an_operator_pin_is_refused_to_every_request() {
    for op in ALL_OPS {
        let e = owner(op, &held(), json!({"plan": "free"})).unwrap_err();
        assert_eq!(
            e.message(),
            "plan: pinned by the operator; no client can override it",
            "{op:?}"
        );
    }
}

#[test]
fn refusals_come_process_scope_first_then_operator_pins_then_session_pins() {
    let refused = |v| {
        validate(
            &agent(),
            Op::PutParams,
            &Caller::Owner,
            false,
            &names(&["tenant"]),
            &held(),
            &map(v),
        )
        .unwrap_err()
        .names()
        .to_vec()
    };
    let all = json!({"plan": "free", "region": "us", "tenant": "b"});
    assert_eq!(refused(all), names(&["region"]));
    assert_eq!(
        refused(json!({"plan": "free", "tenant": "b"})),
        names(&["plan"])
    );
    assert_eq!(refused(json!({"tenant": "b"})), names(&["tenant"]));
}

#[test]
fn a_lost_pinned_secret_may_be_given_again_but_not_removed() {
    let mut lost = held();
    lost.remove("token");
    let pinned = |v| {
        validate(
            &agent(),
            Op::PutParams,
            &Caller::Owner,
            false,
            &names(&["token"]),
            &lost,
            &map(v),
        )
    };
    assert!(pinned(json!({"token": "sk-again-1234"})).unwrap().session["token"].is_secret());
    assert_eq!(
        err(pinned(json!({"token": null}))),
        (ErrorKind::Forbidden, "forbidden_params", names(&["token"]))
    );
}

#[test]
fn a_pinned_plain_value_is_never_lost_so_never_given_again() {
    let mut without = held();
    without.remove("tenant");
    let e = validate(
        &agent(),
        Op::PutParams,
        &Caller::Owner,
        false,
        &names(&["tenant"]),
        &without,
        &map(json!({"tenant": "acme"})),
    )
    .unwrap_err();
    assert_eq!(e.names(), names(&["tenant"]));
}

// ---- the shape of values -----------------------------------------------

#[test]
fn a_secret_takes_only_a_string_and_the_error_never_shows_the_value() {
    let e = owner(
        Op::Message,
        &held(),
        json!({"token": 4242, "otp": {"k": "canary"}, "tenant": "b"}),
    )
    .unwrap_err();
    assert_eq!(
        e,
        ParamsError::Invalid(
            names(&["otp", "token"]),
            "a secret parameter takes a string".into()
        )
    );
    let shown = format!("{} {e:?}", e.message());
    assert!(
        !shown.contains("4242") && !shown.contains("canary"),
        "{shown}"
    );
}

#[test]
fn message_scope_names_are_refused_on_put_params() {
    let e = owner(Op::PutParams, &held(), json!({"otp": "1", "tenant": "b"})).unwrap_err();
    assert_eq!(
        e,
        ParamsError::Invalid(
            names(&["otp"]),
            "message-scope parameters last one run; send them with a message, not with PUT params"
                .into()
        )
    );
}

// ---- required values ---------------------------------------------------

#[test]
fn put_params_never_asks_for_required_values() {
    let ok = owner(Op::PutParams, &Values::new(), json!({"tenant": "acme"})).unwrap();
    assert_eq!(
        ok.session.keys().collect::<Vec<_>>(),
        ["tenant"],
        "no token yet"
    );
}

#[test]
fn a_required_value_missing_is_invalid_on_creation_and_a_conflict_on_a_session() {
    let table = [
        (Op::Create, ErrorKind::Invalid, false),
        (Op::CreateIdle, ErrorKind::Invalid, false),
        (Op::Fork, ErrorKind::Invalid, false),
        (Op::ForkIdle, ErrorKind::Invalid, false),
        (Op::Message, ErrorKind::Conflict, true),
        (Op::Resume, ErrorKind::Conflict, true),
    ];
    for (op, kind, existing) in table {
        let e = owner(op, &Values::new(), json!({"tenant": "acme"})).unwrap_err();
        assert_eq!(
            e,
            ParamsError::Required {
                names: names(&["token"]),
                existing,
                per_message: vec![],
            },
            "{op:?}"
        );
        assert_eq!((e.kind(), e.code()), (kind, Code::ParamsRequired), "{op:?}");
    }
}

#[test]
fn a_default_satisfies_a_requirement_without_being_stored() {
    let locale = |default: Option<serde_json::Value>| {
        let mut d = decl("locale", Scope::Session, false, true);
        d.default = default.map(bindery_spec::ValueSource::Value);
        let params = agent_with(vec![d]);
        validate(
            &params,
            Op::Message,
            &Caller::Owner,
            false,
            &[],
            &held(),
            &BTreeMap::new(),
        )
    };
    let ok = locale(Some(json!("fr"))).unwrap();
    assert!(
        !ok.session.contains_key("locale"),
        "a default is not stored"
    );
    assert_eq!(locale(None).unwrap_err().names(), names(&["locale"]));
}

#[test]
fn only_a_start_that_runs_needs_message_scope_values_and_it_says_which() {
    let table = [
        (Op::CreateIdle, None),
        (Op::ForkIdle, None),
        (Op::PutParams, None),
        (Op::Create, Some(false)),
        (Op::Fork, Some(false)),
        (Op::Message, Some(true)),
        (Op::Resume, Some(true)),
    ];
    for (op, refused) in table {
        let r = validate(
            &asking_a_code(),
            op,
            &Caller::Owner,
            false,
            &[],
            &held(),
            &BTreeMap::new(),
        );
        let expected = refused.map(|existing| ParamsError::Required {
            names: names(&["code"]),
            existing,
            per_message: names(&["code"]),
        });
        assert_eq!(r.err(), expected, "{op:?}");
    }
}

#[test]
fn a_message_value_meets_a_message_requirement_for_that_run_only() {
    let ok = validate(
        &asking_a_code(),
        Op::Message,
        &Caller::Owner,
        false,
        &[],
        &held(),
        &map(json!({"code": "X1"})),
    )
    .unwrap();
    assert_eq!(ok.message["code"], plain(json!("X1")));
    assert_eq!(ok.session, held());
}

#[test]
fn the_creation_message_says_to_give_the_values_in_params() {
    let e = owner(Op::Create, &Values::new(), json!({})).unwrap_err();
    assert_eq!(
        e.message(),
        "required parameters have no value: tenant, token; supply them in `params`"
    );
}

#[test]
fn the_conflict_message_says_how_to_give_each_kind_of_value() {
    let e = validate(
        &asking_a_code(),
        Op::Message,
        &Caller::Owner,
        false,
        &[],
        &Values::new(),
        &map(json!({"tenant": "acme"})),
    )
    .unwrap_err();
    assert_eq!(
        e.message(),
        "required parameters are not bound: token, code; \
         send code with the message, in its `params` (message scope: a value lasts one run, PUT /v1/sessions/:id/params does not take it); \
         the session's owner can supply token with PUT /v1/sessions/:id/params or in the message's `params`"
    );
    // Session values alone: only how to give those.
    let e = owner(Op::Resume, &Values::new(), json!({})).unwrap_err();
    assert_eq!(
        e.message(),
        "required parameters are not bound: tenant, token; the session's owner can supply tenant, token with PUT /v1/sessions/:id/params or in the message's `params`"
    );
}

// ---- earlier tests -----------------------------------------------------

#[test]
fn the_validation_table() {
    use ErrorKind::{Conflict, Forbidden, Invalid};
    let none = Values::new();
    let current: Values = [("tenant".to_string(), plain(json!("acme")))].into();
    let mut with_token = current.clone();
    with_token.insert("token".into(), secret("t"));
    let st = Caller::SessionToken("s".into());
    let o = Caller::Owner;
    // (op, caller, sealed, current, values, the error if refused)
    #[rustfmt::skip]
    let table = [
        (Op::Create, &o, false, &none, json!({"tenant": "acme", "token": "t"}), None),
        (Op::Create, &o, false, &none, json!({"tenant": "a", "token": "t", "tennant": 1}), Some((Invalid, "unknown_params", "tennant"))),
        (Op::Create, &o, false, &none, json!({"tenant": "a", "token": "t", "region": "us"}), Some((Forbidden, "forbidden_params", "region"))),
        (Op::Create, &o, false, &none, json!({"tenant": "a", "token": "t", "plan": "free"}), Some((Forbidden, "forbidden_params", "plan"))),
        (Op::Create, &o, false, &none, json!({"tenant": "a", "token": 42}), Some((Invalid, "invalid_params", "token"))),
        (Op::Create, &o, false, &none, json!({"tenant": "a"}), Some((Invalid, "params_required", "token"))),
        (Op::Fork, &o, false, &none, json!({"tenant": "a"}), Some((Invalid, "params_required", "token"))),
        (Op::Message, &o, false, &current, json!({}), Some((Conflict, "params_required", "token"))),
        (Op::Resume, &o, false, &current, json!({}), Some((Conflict, "params_required", "token"))),
        (Op::Message, &st, false, &current, json!({"tenant": "x"}), Some((Forbidden, "forbidden_params", "tenant"))),
        (Op::PutParams, &o, false, &current, json!({"otp": "1"}), Some((Invalid, "invalid_params", "otp"))),
        // Sealed: the owner is exempt.
        (Op::Message, &o, true, &with_token, json!({"tenant": "b"}), None),
        (Op::Message, &st, true, &with_token, json!({"tenant": "b"}), Some((Forbidden, "forbidden_params", "tenant"))),
    ];
    for (op, caller, sealed, current, v, refused) in table {
        let row = format!("{op:?} {caller:?} sealed={sealed} {v}");
        let given: Vec<String> = map(v.clone()).into_keys().collect();
        let r = check(op, caller.clone(), sealed, current, v);
        match refused {
            None => assert_eq!(r.unwrap().changed, given, "{row}"),
            Some((kind, code, name)) => assert_eq!(err(r), (kind, code, names(&[name])), "{row}"),
        }
    }
}

#[test]
fn null_removes_and_message_values_stay_apart() {
    let current: Values = [
        ("tenant".to_string(), ParamValue::Plain(json!("acme"))),
        (
            "token".to_string(),
            ParamValue::Secret(SecretString::new("t")),
        ),
    ]
    .into();
    let ok = check(
        Op::Message,
        Caller::Owner,
        false,
        &current,
        json!({"otp": "123456"}),
    )
    .unwrap();
    assert!(ok.message["otp"].is_secret());
    assert!(!ok.session.contains_key("otp"));
    let ok = check(
        Op::PutParams,
        Caller::Owner,
        false,
        &current,
        json!({"token": null}),
    )
    .unwrap();
    assert!(!ok.session.contains_key("token"));
    assert_eq!(ok.changed, names(&["token"]));
    // Removing a required value is allowed by PUT; the next message gets 409.
    assert_eq!(
        err(check(
            Op::Message,
            Caller::Owner,
            false,
            &ok.session,
            json!({})
        )),
        (ErrorKind::Conflict, "params_required", names(&["token"]))
    );
}

#[test]
fn a_session_pin_is_refused_to_everyone_unless_a_lost_secret_comes_back() {
    let pins = names(&["tenant", "token"]);
    let held: Values = [
        ("tenant".to_string(), ParamValue::Plain(json!("acme"))),
        (
            "token".to_string(),
            ParamValue::Secret(SecretString::new("t")),
        ),
    ]
    .into();
    let pinned = |op, caller: &Caller, current: &Values, v| {
        validate(&agent(), op, caller, false, &pins, current, &map(v))
    };
    for op in [Op::Message, Op::Resume, Op::PutParams] {
        for v in [json!({"tenant": "other"}), json!({"tenant": null})] {
            let e = pinned(op, &Caller::Owner, &held, v).unwrap_err();
            assert_eq!(e.code(), Code::ForbiddenParams);
            assert_eq!(e.names(), names(&["tenant"]));
            assert!(
                e.message().contains("pinned for this session"),
                "{}",
                e.message()
            );
            assert!(e.message().contains("fork"), "{}", e.message());
        }
    }
    // A held secret is pinned like any value.
    let e = pinned(Op::PutParams, &Caller::Owner, &held, json!({"token": "u"})).unwrap_err();
    assert_eq!(e.names(), names(&["token"]));
    // Lost (not held any more): the owner gives it again; a session
    // token never does.
    let mut lost = held.clone();
    lost.remove("token");
    assert!(pinned(Op::PutParams, &Caller::Owner, &lost, json!({"token": "t"})).is_ok());
    let st = Caller::SessionToken("s".into());
    assert_eq!(
        pinned(Op::PutParams, &st, &lost, json!({"token": "t"}))
            .unwrap_err()
            .code(),
        Code::ForbiddenParams
    );
    // Names that are not pinned go through.
    assert!(pinned(Op::Message, &Caller::Owner, &held, json!({"otp": "1"})).is_ok());
}
