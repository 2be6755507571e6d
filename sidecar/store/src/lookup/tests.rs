//! What a pending item of an orchestration shows, and how a chat message
//! names one of its options.

use serde_json::json;

use super::*;

const SLOTS_KEY: &str = "book/2:slots";

/// A selection at [`SLOTS_KEY`] among options labelled `labels`, whose
/// ids are `opt_1`, `opt_2`, … and real ids `real-opt_1`, …, each with the
/// fact `time`: its label.
pub(crate) fn offering(labels: &[&str], note: Option<&str>) -> LookupState {
    let options = labels
        .iter()
        .enumerate()
        .map(|(i, label)| Choice {
            id: format!("opt_{}", i + 1),
            label: label.to_string(),
            facts: json!({ "time": label }).as_object().cloned().unwrap(),
            real: format!("real-opt_{}", i + 1),
        })
        .collect();
    LookupState {
        ask: Ask::Selection {
            key: SLOTS_KEY.into(),
            lookup: "slots".into(),
            options,
            note: note.map(str::to_string),
        },
        ..Default::default()
    }
}

// ---- what an item shows ------------------------------------------------

#[test]
fn an_input_shows_the_missing_fields_alone_and_nothing_asked_shows_nothing() {
    assert_eq!(LookupState::default().asked(), Asked::default());
    let state = LookupState {
        ask: Ask::Input {
            missing: vec!["date".into(), "service".into()],
        },
        ..Default::default()
    };
    assert_eq!(
        state.asked(),
        Asked {
            missing: Some(vec!["date".into(), "service".into()]),
            ..Asked::default()
        }
    );
}

#[test]
fn a_selection_shows_its_lookup_options_and_note_but_no_real_id() {
    let state = offering(&["10:00", "11:00"], Some("choose again"));
    assert_eq!(
        state.asked(),
        Asked {
            lookup: Some("slots".into()),
            options: Some(vec![
                PendingOption {
                    id: "opt_1".into(),
                    label: "10:00".into(),
                    facts: json!({"time": "10:00"}),
                },
                PendingOption {
                    id: "opt_2".into(),
                    label: "11:00".into(),
                    facts: json!({"time": "11:00"}),
                },
            ]),
            note: Some("choose again".into()),
            ..Asked::default()
        }
    );
}

#[test]
fn a_confirmation_shows_its_facts_and_note_but_not_the_prepared_digest() {
    let state = LookupState {
        ask: Ask::Confirmation {
            prepared: "prepared-7f3a".into(),
            facts: json!({"time": "11:00"}).as_object().cloned().unwrap(),
            note: Some("review this one".into()),
        },
        ..Default::default()
    };
    let asked = state.asked();
    assert_eq!(
        asked,
        Asked {
            facts: Some(json!({"time": "11:00"})),
            note: Some("review this one".into()),
            ..Asked::default()
        }
    );
    assert!(!format!("{asked:?}").contains("7f3a"));
}

#[test]
fn a_chat_message_names_an_option_by_its_number_from_one_or_its_exact_label() {
    let state = offering(&["Morning", "Evening", "10:00"], None);
    let table = [
        ("1", Some("opt_1")),
        (" 2\n", Some("opt_2")),
        ("0", None),
        ("4", None),
        ("-1", None),
        ("Evening", Some("opt_2")),
        ("  Morning ", Some("opt_1")),
        ("10:00", Some("opt_3")),
        ("10", None),
        ("morning", None),
        ("Even", None),
        ("", None),
    ];
    for (text, id) in table {
        assert_eq!(state.option_named(text).as_deref(), id, "{text:?}");
    }
    // Only a selection has options to name.
    let input = LookupState {
        ask: Ask::Input {
            missing: vec!["1".into()],
        },
        ..Default::default()
    };
    assert_eq!(input.option_named("1"), None);
}
