//! Where an orchestration of `depends_on` stands, kept with its pending
//! item in the session's record: the arguments as given, the choices made,
//! what the item asks, and what clients see of it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::{Asked, PendingOption};

/// Where an orchestration stands, kept with its pending item (server-side:
/// clients see [`PendingCall::shown`](crate::pending::PendingCall::shown), never a
/// real option id).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LookupState {
    /// The parent's arguments as the model and the client gave them (never
    /// a bound value, never a filled one).
    pub args: Value,
    /// The real id chosen at each selection, by dependency key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub choices: BTreeMap<String, String>,
    /// The session context the choices were made in (a digest).
    pub context: String,
    /// The digest of the prepared call a person approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<String>,
    /// The lookups ran again after the API refused the call (409/410).
    #[serde(default)]
    pub refreshed: bool,
    /// What the item asks.
    pub ask: Ask,
    /// Past this (ms since the epoch) a choice or approval is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

/// What a pending item of an orchestration asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Ask {
    #[default]
    Nothing,
    /// User-owned fields that are missing or invalid.
    Input { missing: Vec<String> },
    /// A choice among a lookup's options.
    Selection {
        key: String,
        lookup: String,
        options: Vec<Choice>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// The approval of the prepared call (its digest) with its facts.
    Confirmation {
        prepared: String,
        facts: serde_json::Map<String, Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
}

/// One option of a selection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// The id clients see (opaque when `id_sensitive`).
    pub id: String,
    pub label: String,
    pub facts: serde_json::Map<String, Value>,
    /// The API's id: server-side only.
    pub real: String,
}

impl LookupState {
    /// What clients see of it: options without their real ids, facts,
    /// missing fields.
    pub fn asked(&self) -> Asked {
        match &self.ask {
            Ask::Nothing => Asked::default(),
            Ask::Input { missing } => Asked {
                missing: Some(missing.clone()),
                ..Asked::default()
            },
            Ask::Selection {
                lookup,
                options,
                note,
                ..
            } => Asked {
                lookup: Some(lookup.clone()),
                options: Some(
                    options
                        .iter()
                        .map(|o| PendingOption {
                            id: o.id.clone(),
                            label: o.label.clone(),
                            facts: Value::Object(o.facts.clone()),
                        })
                        .collect(),
                ),
                note: note.clone(),
                ..Asked::default()
            },
            Ask::Confirmation { facts, note, .. } => Asked {
                facts: Some(Value::Object(facts.clone())),
                note: note.clone(),
                ..Asked::default()
            },
        }
    }

    /// The option a chat message names: its one-based number as shown, or
    /// its exact label.
    pub fn option_named(&self, text: &str) -> Option<String> {
        let Ask::Selection { options, .. } = &self.ask else {
            return None;
        };
        let text = text.trim();
        if let Ok(n) = text.parse::<usize>() {
            return n
                .checked_sub(1)
                .and_then(|i| options.get(i))
                .map(|o| o.id.clone());
        }
        options
            .iter()
            .find(|o| o.label == text)
            .map(|o| o.id.clone())
    }
}

#[cfg(test)]
pub(crate) mod tests;
