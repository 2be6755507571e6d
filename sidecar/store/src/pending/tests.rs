//! The pending-call state machine, one rule a test: items and their ids,
//! what clients are shown, the answers each disposition takes, closing,
//! expiry, the status detail, digests and tokens, and what is stored.

use serde_json::{json, Value};

use super::*;
use crate::lookup::tests::offering;
use crate::wire::Exceeded;
use bindery_spec::budget::Meter;

// ---- builders ----------------------------------------------------------

/// An open `confirm` item `id` of tool `t`, whose token digest is `d-<id>`.
fn call(id: &str, expires_at: Option<i64>) -> PendingCall {
    PendingCall {
        budget: None,
        tool_call_id: id.into(),
        tool: "t".into(),
        disposition: Disposition::Confirm,
        call: json!({}),
        bound_params: vec![],
        digest: String::new(),
        nonce: String::new(),
        token_digest: format!("d-{id}"),
        expires_at,
        resolution: None,
        frames: vec![],
        lookup: None,
        tainted_by: vec![],
    }
}

/// An open item `id` of tool `tool` waiting for `d`.
fn waiting(id: &str, tool: &str, d: Disposition) -> PendingCall {
    PendingCall {
        tool: tool.into(),
        disposition: d,
        ..call(id, None)
    }
}

/// Item `id`, already answered with `r`.
fn answered(id: &str, r: Resolution) -> PendingCall {
    PendingCall {
        resolution: Some(r),
        ..call(id, None)
    }
}

/// Item `id` made inside the helpers `frames` (call id, tool), outermost first.
fn nested(id: &str, frames: &[(&str, &str)]) -> PendingCall {
    PendingCall {
        frames: frames
            .iter()
            .map(|(call_id, tool)| Frame {
                call_id: (*call_id).into(),
                tool: (*tool).into(),
                arguments: "{}".into(),
                history: vec![],
            })
            .collect(),
        ..call(id, None)
    }
}

fn pending(items: Vec<PendingCall>) -> Pending {
    Pending {
        items,
        ..Default::default()
    }
}

/// `a` open, `b` approved, and `c` open inside helper call `h`.
fn open_answered_open() -> Pending {
    pending(vec![
        call("a", None),
        answered("b", Resolution::Approved),
        nested("c", &[("h", "prompt_agent_x")]),
    ])
}

fn ids(items: &[String]) -> Vec<&str> {
    items.iter().map(String::as_str).collect()
}

/// A `needs_selection` item of tool `book` offering `opt_1` (10:00) and
/// `opt_2` (11:00), whose real ids are `real-opt_1` and `real-opt_2`.
fn selection() -> PendingCall {
    PendingCall {
        lookup: Some(offering(
            &["10:00", "11:00"],
            Some("several options match `10`; choose one"),
        )),
        ..waiting("s", "book", Disposition::NeedsSelection)
    }
}

fn exceeded(budget: &str) -> Exceeded {
    Exceeded {
        budget: budget.into(),
        meter: Meter::Tokens,
        limit: 100.0,
        used: 120.0,
        per: "24h".into(),
        retry_after: Some(60),
        per_user: false,
    }
}

fn approve(yes: bool) -> Reply<'static> {
    Reply {
        approve: Some(yes),
        ..Default::default()
    }
}

fn result(v: &Value) -> Reply<'_> {
    Reply {
        result: Some(v),
        ..Default::default()
    }
}

fn choose(c: &str) -> Reply<'_> {
    Reply {
        choice: Some(c),
        ..Default::default()
    }
}

fn input(m: &serde_json::Map<String, Value>) -> Reply<'_> {
    Reply {
        input: Some(m),
        ..Default::default()
    }
}

fn rejected(reason: Option<&str>) -> Resolution {
    Resolution::Rejected {
        reason: reason.map(str::to_string),
    }
}

/// `r` answers an item of `tool` waiting for `d`.
fn answer(d: Disposition, r: Reply<'_>) -> Result<Resolution, Misanswer> {
    resolution_for(&waiting("c", "bash_rm", d), r)
}

/// The answer's refusal as the client reads it.
fn said(r: Result<Resolution, Misanswer>) -> Result<Resolution, String> {
    r.map_err(|e| e.to_string())
}

const HEX64: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// ---- ids and helpers ---------------------------------------------------

#[test]
fn an_items_id_is_its_call_id_when_the_sessions_own_agent_made_it() {
    let item = call("call_1", None);
    assert_eq!(item.id(), "call_1");
    assert!(item.via().is_empty());
}

#[test]
fn an_items_id_inside_helpers_is_the_helper_calls_then_its_own() {
    let item = nested(
        "call_9",
        &[("call_1", "prompt_agent_a"), ("call_4", "prompt_agent_b")],
    );
    assert_eq!(item.id(), "call_1/call_4/call_9");
    assert_eq!(item.via(), ["prompt_agent_a", "prompt_agent_b"]);
}

// ---- what clients are shown --------------------------------------------

#[test]
fn shown_carries_the_call_as_the_model_made_it_under_its_full_id() {
    let mut item = nested("c2", &[("c1", "prompt_agent_clerk")]);
    item.tool = "bash_rm".into();
    item.call = json!({"path": "a.txt"});
    item.budget = Some(exceeded("day"));
    item.tainted_by = vec![TaintSource {
        tool_call_id: "c0".into(),
        tool: "bash_fetch".into(),
    }];
    let shown = item.shown();
    assert_eq!(shown.tool_call_id, "c1/c2");
    assert_eq!(shown.tool, "bash_rm");
    assert_eq!(shown.via, ["prompt_agent_clerk"]);
    assert_eq!(shown.disposition, Disposition::Confirm);
    assert_eq!(shown.call, json!({"path": "a.txt"}));
    assert_eq!(shown.budget, Some(exceeded("day")));
    assert_eq!(shown.tainted_by, item.tainted_by);
}

#[test]
fn shown_has_no_token_no_expiry_and_nothing_of_how_the_token_is_checked() {
    let mut item = call("c", Some(1_000));
    item.nonce = "nonce-7f3a".into();
    item.digest = "digest-7f3a".into();
    item.token_digest = "tokendigest-7f3a".into();
    item.bound_params = vec!["billing_token".into()];
    let shown = item.shown();
    assert_eq!(shown.continuation_token, None);
    assert_eq!(shown.expires_at, None);
    let text = serde_json::to_string(&shown).unwrap();
    for hidden in ["7f3a", "continuation_token", "expires_at", "billing_token"] {
        assert!(!text.contains(hidden), "{hidden} in {text}");
    }
}

#[test]
fn shown_of_a_plain_call_asks_nothing_more() {
    let shown = call("c", None).shown();
    assert_eq!(
        (
            shown.missing,
            shown.lookup,
            shown.options,
            shown.facts,
            shown.note
        ),
        (None, None, None, None, None)
    );
}

#[test]
fn shown_of_a_selection_lists_its_options_in_order_without_their_real_ids() {
    let shown = selection().shown();
    assert_eq!(shown.lookup.as_deref(), Some("slots"));
    let options: Vec<(String, String, Value)> = shown
        .options
        .clone()
        .unwrap()
        .into_iter()
        .map(|o| (o.id, o.label, o.facts))
        .collect();
    assert_eq!(
        options,
        vec![
            ("opt_1".into(), "10:00".into(), json!({"time": "10:00"})),
            ("opt_2".into(), "11:00".into(), json!({"time": "11:00"})),
        ]
    );
    assert_eq!(
        shown.note.as_deref(),
        Some("several options match `10`; choose one")
    );
    let text = serde_json::to_string(&shown).unwrap();
    assert!(!text.contains("real-"), "{text}");
    assert!(
        !text.contains("book/1:slots"),
        "the key is server-side: {text}"
    );
}

// ---- resolutions -------------------------------------------------------

#[test]
fn only_a_refusal_tells_the_model_why_the_call_did_not_run() {
    let table = [
        (
            Resolution::Result {
                output: "x".into(),
            },
            None,
        ),
        (Resolution::Approved, None),
        (
            Resolution::Chosen {
                option: "o".into(),
            },
            None,
        ),
        (
            Resolution::Input {
                values: Default::default(),
            },
            None,
        ),
        (
            rejected(Some("not on Fridays")),
            Some("a person did not approve this call, so it did not run; their reason: not on Fridays"),
        ),
        (
            rejected(None),
            Some("a person did not approve this call, so it did not run"),
        ),
        (
            Resolution::Expired,
            Some("nobody approved this call in time, so it did not run"),
        ),
        (Resolution::Cancelled, Some("the run was cancelled")),
    ];
    for (r, why) in table {
        assert_eq!(r.refusal().as_deref(), why, "{r:?}");
    }
}

#[test]
fn a_resolution_has_its_outcome_and_is_stored_tagged_by_it() {
    let table = [
        (
            Resolution::Approved,
            Outcome::Approved,
            json!({"outcome": "approved"}),
        ),
        (
            rejected(None),
            Outcome::Rejected,
            json!({"outcome": "rejected"}),
        ),
        (
            rejected(Some("no")),
            Outcome::Rejected,
            json!({"outcome": "rejected", "reason": "no"}),
        ),
        (
            Resolution::Result {
                output: "Lyon".into(),
            },
            Outcome::Result,
            json!({"outcome": "result", "output": "Lyon"}),
        ),
        (
            Resolution::Chosen {
                option: "opt_2".into(),
            },
            Outcome::Chosen,
            json!({"outcome": "chosen", "option": "opt_2"}),
        ),
        (
            Resolution::Input {
                values: json!({"date": "d1"}).as_object().cloned().unwrap(),
            },
            Outcome::Input,
            json!({"outcome": "input", "values": {"date": "d1"}}),
        ),
        (
            Resolution::Expired,
            Outcome::Expired,
            json!({"outcome": "expired"}),
        ),
        (
            Resolution::Cancelled,
            Outcome::Cancelled,
            json!({"outcome": "cancelled"}),
        ),
    ];
    for (r, outcome, stored) in table {
        assert_eq!(r.outcome(), outcome, "{r:?}");
        assert_eq!(r.outcome().as_str(), stored["outcome"], "{r:?}");
        assert_eq!(serde_json::to_value(&r).unwrap(), stored);
        assert_eq!(serde_json::from_value::<Resolution>(stored).unwrap(), r);
    }
}

// ---- which answer fits which disposition -------------------------------

#[test]
fn a_deferred_call_takes_a_string_result_as_it_is_and_any_other_as_its_json() {
    for (v, text) in [
        (json!("Lyon"), "Lyon"),
        (json!(""), ""),
        (json!(42), "42"),
        (json!(true), "true"),
        (json!(null), "null"),
        (json!([1, "a"]), r#"[1,"a"]"#),
        (json!({"city": "Lyon"}), r#"{"city":"Lyon"}"#),
    ] {
        assert_eq!(
            answer(Disposition::Deferred, result(&v)),
            Ok(Resolution::Result {
                output: text.into()
            })
        );
    }
}

#[test]
fn an_answer_that_does_not_fit_is_refused_saying_what_fits() {
    let x = json!("x");
    let fields = serde_json::Map::new();
    let with_result = Reply {
        approve: Some(true),
        ..result(&x)
    };
    let confirm = "the call of bash_rm waits for approval: send `approve: true` or `approve: false` (and no `result`)";
    let confirming = [
        Reply::default(),
        result(&x),
        with_result,
        choose("o"),
        input(&fields),
    ];
    let table: [(Disposition, &[Reply<'_>], &str); 5] = [
        (
            Disposition::Deferred,
            &[Reply::default(), approve(true), with_result, choose("o")],
            "the call of bash_rm is deferred: send its `result` (and no `approve`)",
        ),
        (Disposition::Confirm, &confirming, confirm),
        (Disposition::NeedsConfirmation, &confirming, confirm),
        (
            Disposition::Budget,
            &[Reply::default(), result(&x), choose("o"), input(&fields)],
            "the run waits at a used-up budget: send `approve: true` to let it go on, or `approve: false` to end it",
        ),
        (
            Disposition::NeedsInput,
            &[Reply::default(), approve(true), result(&x), choose("o")],
            "the call of bash_rm waits for the user's input: send `input` with the missing fields (or `approve: false` to decline)",
        ),
    ];
    for (d, replies, why) in table {
        for r in replies {
            assert_eq!(said(answer(d, *r)), Err(why.to_string()), "{d:?} {r:?}");
        }
    }
}

#[test]
fn a_yes_approves_each_disposition_that_waits_for_one_whatever_its_reason() {
    let with_reason = Reply {
        reason: Some("fine"),
        ..approve(true)
    };
    for d in [
        Disposition::Confirm,
        Disposition::NeedsConfirmation,
        Disposition::Budget,
    ] {
        assert_eq!(answer(d, approve(true)), Ok(Resolution::Approved), "{d:?}");
        assert_eq!(answer(d, with_reason), Ok(Resolution::Approved), "{d:?}");
    }
}

#[test]
fn a_no_is_a_rejection_with_its_reason_if_given() {
    for d in [
        Disposition::Confirm,
        Disposition::NeedsConfirmation,
        Disposition::Budget,
        Disposition::NeedsSelection,
        Disposition::NeedsInput,
    ] {
        assert_eq!(answer(d, approve(false)), Ok(rejected(None)), "{d:?}");
        let with_reason = Reply {
            reason: Some("not on Fridays"),
            ..approve(false)
        };
        assert_eq!(
            answer(d, with_reason),
            Ok(rejected(Some("not on Fridays"))),
            "{d:?}"
        );
    }
}

#[test]
fn a_selection_takes_the_id_of_an_offered_option() {
    assert_eq!(
        resolution_for(&selection(), choose("opt_1")),
        Ok(Resolution::Chosen {
            option: "opt_1".into()
        })
    );
}

#[test]
fn a_selection_refuses_an_option_not_offered_naming_it() {
    for c in ["opt_3", "real-opt_1", "10:00", "1", ""] {
        assert_eq!(
            said(resolution_for(&selection(), choose(c))),
            Err(format!(
                "`{c}` is not one of the options offered for book; send the `id` of one of them"
            ))
        );
    }
    // Without its lookup's state, it offers nothing to choose.
    let mut lost = selection();
    lost.lookup = None;
    assert!(matches!(
        resolution_for(&lost, choose("opt_1")),
        Err(Misanswer::NotOffered { id, .. }) if id == "opt_1"
    ));
}

#[test]
fn a_selection_may_be_declined_but_not_approved() {
    let why = "the call of book waits for a choice: send `choice` with an option's `id` (or `approve: false` to decline)";
    assert_eq!(
        resolution_for(&selection(), approve(false)),
        Ok(rejected(None))
    );
    assert_eq!(
        said(resolution_for(&selection(), approve(true))),
        Err(why.into())
    );
    let both = Reply {
        approve: Some(false),
        ..choose("opt_1")
    };
    assert_eq!(said(resolution_for(&selection(), both)), Err(why.into()));
    assert_eq!(
        said(resolution_for(&selection(), Reply::default())),
        Err(why.into())
    );
}

#[test]
fn an_input_item_takes_the_fields_sent() {
    let fields = json!({"date": "2026-10-01"}).as_object().cloned().unwrap();
    assert_eq!(
        answer(Disposition::NeedsInput, input(&fields)),
        Ok(Resolution::Input {
            values: fields.clone()
        })
    );
}

// ---- the state of a pending set ----------------------------------------

#[test]
fn nothing_pending_is_empty_and_has_nothing_open() {
    let p = Pending::default();
    assert!(p.is_empty());
    assert!(p.all_resolved());
    assert_eq!(p.open().count(), 0);
}

#[test]
fn the_run_resumes_only_once_every_item_is_answered() {
    let mut p = open_answered_open();
    assert!(!p.is_empty());
    assert!(!p.all_resolved());
    assert_eq!(
        p.open().map(PendingCall::id).collect::<Vec<_>>(),
        ["a", "h/c"]
    );
    p.items[0].resolution = Some(rejected(None));
    assert!(!p.all_resolved());
    p.items[2].resolution = Some(Resolution::Approved);
    assert!(p.all_resolved());
    assert_eq!(p.open().count(), 0);
}

#[test]
fn close_all_closes_only_the_open_items_and_says_which_in_order() {
    let mut p = open_answered_open();
    let closed = p.close_all(&Resolution::Cancelled);
    assert_eq!(ids(&closed), ["a", "h/c"]);
    let resolutions: Vec<_> = p.items.iter().map(|i| i.resolution.clone()).collect();
    assert_eq!(
        resolutions,
        [
            Some(Resolution::Cancelled),
            Some(Resolution::Approved),
            Some(Resolution::Cancelled)
        ]
    );
    assert_eq!(p.used, ["d-a", "d-b", "d-c"]);
    assert!(p.expired.is_empty(), "cancelled is not expired");
    assert!(
        p.close_all(&Resolution::Expired).is_empty(),
        "nothing is open"
    );
    assert_eq!(p.items[0].resolution, Some(Resolution::Cancelled));
}

#[test]
fn retiring_tokens_records_each_answered_token_once_and_no_open_one() {
    let mut p = pending(vec![answered("a", Resolution::Approved), call("b", None)]);
    p.used = vec!["d-old".into()];
    p.retire_tokens();
    p.retire_tokens();
    assert_eq!(p.used, ["d-old", "d-a"]);
}

#[test]
fn an_item_expires_at_exactly_its_time_and_not_a_millisecond_before() {
    let mut p = pending(vec![call("a", Some(10))]);
    assert!(p.expire(9).is_empty());
    assert_eq!(p.items[0].resolution, None);
    assert_eq!(ids(&p.expire(10)), ["a"]);
    assert_eq!(p.items[0].resolution, Some(Resolution::Expired));
}

#[test]
fn expiry_passes_over_items_without_a_time_and_answered_ones() {
    let mut p = pending(vec![
        call("a", None),
        PendingCall {
            expires_at: Some(10),
            ..answered("b", Resolution::Approved)
        },
    ]);
    assert!(p.expire(i64::MAX).is_empty());
    assert_eq!(p.items[0].resolution, None);
    assert_eq!(p.items[1].resolution, Some(Resolution::Approved));
    assert!(p.expired.is_empty());
}

#[test]
fn an_item_expires_once_however_often_the_sweep_runs_named_by_its_full_id() {
    let mut p = pending(vec![PendingCall {
        expires_at: Some(10),
        ..nested("c", &[("h1", "prompt_agent_a"), ("h2", "prompt_agent_b")])
    }]);
    assert_eq!(ids(&p.expire(10)), ["h1/h2/c"]);
    assert!(p.expire(20).is_empty());
    assert_eq!(p.used, ["d-c"]);
    assert_eq!(p.expired, ["d-c"]);
}

#[test]
fn only_tokens_of_calls_that_expired_unanswered_are_marked_expired() {
    let mut p = pending(vec![
        answered("a", Resolution::Approved),
        call("b", Some(10)),
        call("c", Some(30)),
    ]);
    assert_eq!(ids(&p.expire(20)), ["b"]);
    assert_eq!(p.used, ["d-a", "d-b"]);
    assert_eq!(p.expired, ["d-b"]);
    p.close_all(&Resolution::Cancelled);
    assert_eq!(p.used, ["d-a", "d-b", "d-c"]);
    assert_eq!(p.expired, ["d-b"], "c was cancelled, not expired");
}

// ---- the status detail -------------------------------------------------

#[test]
fn the_detail_says_what_each_disposition_waits_for() {
    let budget = Some(exceeded("daily-tokens"));
    #[rustfmt::skip]
    let table = [
        (Disposition::Confirm, None, "a person's approval of bash_rm"),
        (Disposition::Deferred, None, "the client's result of bash_rm"),
        (Disposition::NeedsInput, None, "the user's input to bash_rm"),
        (Disposition::NeedsSelection, None, "a person's choice for bash_rm"),
        (Disposition::NeedsConfirmation, None, "a person's confirmation of bash_rm"),
        (Disposition::Budget, None, "a person to let the run go past a budget"),
        (Disposition::Budget, budget, "a person to let the run go past budget daily-tokens"),
    ];
    for (d, budget, what) in table {
        let item = PendingCall {
            budget,
            ..waiting("c", "bash_rm", d)
        };
        assert_eq!(pending(vec![item]).detail(), format!("waiting for {what}"));
    }
}

#[test]
fn the_detail_names_the_innermost_helper_a_call_waits_in() {
    let p = pending(vec![nested(
        "c",
        &[("h1", "prompt_agent_a"), ("h2", "prompt_agent_b")],
    )]);
    assert_eq!(
        p.detail(),
        "waiting for a person's approval of t (in prompt_agent_b)"
    );
}

#[test]
fn the_detail_lists_the_open_items_in_order_and_leaves_out_answered_ones() {
    let p = pending(vec![
        waiting("a", "bash_a", Disposition::Deferred),
        PendingCall {
            resolution: Some(Resolution::Approved),
            ..waiting("b", "bash_b", Disposition::Confirm)
        },
        waiting("c", "bash_c", Disposition::NeedsInput),
    ]);
    assert_eq!(
        p.detail(),
        "waiting for the client's result of bash_a, the user's input to bash_c"
    );
}

#[test]
fn the_detail_of_a_set_with_nothing_open_says_it_waits_for_a_resume() {
    // The last open call expired: the sweep writes the detail before the
    // run resumes, and a message to the session quotes it.
    let mut p = pending(vec![
        answered("a", Resolution::Approved),
        call("b", Some(10)),
    ]);
    assert_eq!(ids(&p.expire(10)), ["b"]);
    assert_eq!(
        p.detail(),
        "waiting for a resume: every pending call is answered"
    );
}

// ---- digests -----------------------------------------------------------

#[test]
fn the_digest_changes_with_the_tool_the_arguments_or_the_bound_names_but_not_their_order() {
    let base = call_digest("t", &json!({"a": 1}), &["x".into(), "y".into()]);
    assert_eq!(
        base,
        call_digest("t", &json!({"a": 1}), &["y".into(), "x".into()])
    );
    for other in [
        call_digest("u", &json!({"a": 1}), &["x".into(), "y".into()]),
        call_digest("t", &json!({"a": "1"}), &["x".into(), "y".into()]),
        call_digest("t", &json!({"a": 1, "b": null}), &["x".into(), "y".into()]),
        call_digest("t", &json!({"a": 1}), &["x".into()]),
        call_digest("t", &json!({"a": 1}), &[]),
    ] {
        assert_ne!(base, other);
    }
    assert_eq!(base.len(), 64);
    assert!(base.chars().all(|c| c.is_ascii_hexdigit()), "{base}");
}

#[test]
fn the_digest_ignores_key_order_at_every_depth_but_not_array_order() {
    let d = |v: Value| call_digest("t", &v, &[]);
    assert_eq!(
        d(json!({"o": {"b": 1, "a": [{"y": 1, "x": 2}]}})),
        d(json!({"o": {"a": [{"x": 2, "y": 1}], "b": 1}}))
    );
    assert_ne!(d(json!({"a": [1, 2]})), d(json!({"a": [2, 1]})));
}

#[test]
fn canonical_json_sorts_object_keys_and_keeps_everything_else() {
    let v = json!({"b": [{"d": 1, "c": null}, 3], "a": "x"});
    assert_eq!(
        canonical(&v).to_string(),
        r#"{"a":"x","b":[{"c":null,"d":1},3]}"#
    );
    for scalar in [json!(null), json!(1.5), json!("s"), json!(false)] {
        assert_eq!(canonical(&scalar), scalar);
    }
}

// ---- tokens ------------------------------------------------------------

#[test]
fn a_token_is_ct_its_session_and_a_hex_mac_and_the_session_may_hold_underscores() {
    let t = token_for(&[1u8; 32], "s_with_parts", "c", "n");
    let mac = t.strip_prefix("ct_s_with_parts_").unwrap();
    assert_eq!(mac.len(), 64);
    assert!(mac.chars().all(|c| c.is_ascii_hexdigit()), "{t}");
    assert_eq!(token_session(&t), Some("s_with_parts"));
}

#[test]
fn a_text_not_shaped_like_a_token_names_no_session() {
    for text in [
        String::new(),
        "ct_".into(),
        "ct_s".into(),
        format!("ct__{HEX64}"),
        format!("st_s_{HEX64}"),
        format!("ct_s_{}", &HEX64[1..]),
        format!("ct_s_{HEX64}0"),
        format!("s_{HEX64}"),
    ] {
        assert_eq!(token_session(&text), None, "{text}");
    }
    assert_eq!(token_session(&format!("ct_s_{HEX64}")), Some("s"));
}

#[test]
fn a_token_is_stored_as_its_sha256() {
    assert_eq!(
        token_digest("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let t = token_for(&[1u8; 32], "s", "c", "n");
    assert_ne!(token_digest(&t), t);
    assert_eq!(token_digest(&t), token_digest(&t));
}

#[test]
fn the_mac_is_hmac_sha256_as_rfc_4231_gives_it() {
    // A key shorter than SHA-256's block is padded with zeros, so a
    // 32-byte key ending in zeros is the RFC's shorter key.
    let padded = |k: &[u8]| {
        let mut key = [0u8; 32];
        key[..k.len()].copy_from_slice(k);
        key
    };
    assert_eq!(
        hex::encode(hmac(&padded(&[0x0b; 20]), b"Hi There")),
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
    );
    assert_eq!(
        hex::encode(hmac(&padded(b"Jefe"), b"what do ya want for nothing?")),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

// ---- what is stored ----------------------------------------------------

#[test]
fn a_record_from_before_expired_calls_were_kept_reads_with_none_expired() {
    let p: Pending = serde_json::from_value(json!({"items": [], "used": ["d-a"]})).unwrap();
    assert_eq!(
        p,
        Pending {
            used: vec!["d-a".into()],
            ..Default::default()
        }
    );
}

#[test]
fn a_stored_item_holds_its_tokens_digest_never_the_token() {
    let key = [3u8; 32];
    let token = token_for(&key, "s-1", "c", "n-1");
    let mut p = pending(vec![PendingCall {
        nonce: "n-1".into(),
        token_digest: token_digest(&token),
        ..call("c", None)
    }]);
    p.retire_tokens();
    let text = serde_json::to_string(&p).unwrap();
    assert!(!text.contains(&token), "{text}");
    assert!(text.contains(&token_digest(&token)), "{text}");
    // The nonce is stored, so the token can be shown again after a restart.
    let back: Pending = serde_json::from_str(&text).unwrap();
    assert_eq!(token_for(&key, "s-1", "c", &back.items[0].nonce), token);
}

#[test]
fn a_pending_set_round_trips_with_everything_it_holds() {
    let mut budget = waiting("budget-day", "", Disposition::Budget);
    budget.budget = Some(exceeded("day"));
    let mut p = pending(vec![
        PendingCall {
            expires_at: Some(1_000),
            ..nested("c", &[("h", "prompt_agent_x")])
        },
        selection(),
        budget,
        answered("d", rejected(Some("no"))),
    ]);
    p.client_call = true;
    p.run = Some(WaitingRun {
        id: "r1".into(),
        budgets_approved: vec!["week".into()],
    });
    p.retire_tokens();
    p.expired = vec!["d-x".into()];
    let back: Pending = serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}

#[test]
fn a_pending_set_stores_its_flags_only_when_set() {
    assert_eq!(
        serde_json::to_value(Pending::default()).unwrap(),
        json!({"items": []})
    );
    let mut p = pending(vec![]);
    p.client_call = true;
    p.run = Some(WaitingRun {
        id: "r1".into(),
        budgets_approved: vec![],
    });
    assert_eq!(
        serde_json::to_value(&p).unwrap(),
        json!({"items": [], "client_call": true, "run": {"id": "r1"}})
    );
}

// ---- earlier tests ----------------------------------------------------

#[test]
fn a_token_names_its_session_and_depends_on_key_call_and_nonce() {
    let key = [7u8; 32];
    let t = token_for(&key, "s-1", "call_1", "n1");
    assert_eq!(token_session(&t), Some("s-1"));
    assert_eq!(t, token_for(&key, "s-1", "call_1", "n1"));
    assert_ne!(t, token_for(&[8u8; 32], "s-1", "call_1", "n1"));
    assert_ne!(t, token_for(&key, "s-1", "call_1", "n2"));
    assert_ne!(t, token_for(&key, "s-1", "call_2", "n1"));
    let mac = |t: &str| t.rsplit_once('_').unwrap().1.to_string();
    assert_ne!(mac(&t), mac(&token_for(&key, "s-2", "call_1", "n1")));
    // The fields are kept apart: moving text between them changes the mac.
    assert_ne!(t, token_for(&key, "s-1", "call_1n", "1"));
    assert_eq!(token_session("ct_nope"), None);
}

#[test]
fn expiry_closes_only_open_items_past_their_time() {
    let item = call;
    let mut p = Pending {
        run: None,
        items: vec![item("a", Some(10)), item("b", Some(20)), item("c", None)],
        used: vec![],
        expired: vec![],
        client_call: false,
    };
    assert_eq!(p.expire(15), vec!["a".to_string()]);
    assert_eq!(p.used, vec!["d-a".to_string()]);
    assert_eq!(p.expired, p.used, "it expired, nobody answered it");
    assert!(!p.all_resolved());
    assert_eq!(
        p.detail(),
        "waiting for a person's approval of t, a person's approval of t"
    );
}

#[test]
fn an_ended_run_leaves_nothing_to_resume_but_its_used_tokens() {
    let mut p = Pending {
        items: vec![waiting("c", "bash_rm", Disposition::Confirm)],
        client_call: true,
        run: Some(WaitingRun {
            id: "run-1".into(),
            budgets_approved: vec!["daily".into()],
        }),
        ..Pending::default()
    };
    let digest = p.items[0].token_digest.clone();
    assert_eq!(p.end_run(&Resolution::Cancelled), vec!["c".to_string()]);
    assert!(p.is_empty());
    assert!(!p.client_call);
    assert!(p.run.is_none());
    assert_eq!(p.used, vec![digest]);
}
