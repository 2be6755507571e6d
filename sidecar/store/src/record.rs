//! A `SessionRecord` as table columns, for every SQL store: the column
//! list, the JSON encoding of the structured fields, and decoding back.
//! Pure: each backend binds and reads the columns its own way and wraps
//! these messages with the operation and the database they concern.
//!
//! Messages name the session and the column, never the content: a stored
//! conversation may hold anything the user typed.

use crate::model::{SessionRecord, SessionStatus};
use bindery_llm::Turn;

/// The `sessions` columns in the order [`Columns`] lists them.
pub const SESSION_COLUMNS: &str = "id, agent, status, status_detail, created_at, updated_at, \
     version, turns, params, security, forked_from, runner, cancel_requested, pending, holder, \
     turn_count";

/// The columns of a session's row that [`bindery_tools::lineage::Kin`]
/// holds, in its order.
pub const KIN_COLUMNS: &str = "id, forked_from, agent, status, created_at, updated_at, turn_count";

/// The statement that reads the [`KIN_COLUMNS`] of session `id`'s fork
/// lineage from the table `sessions`: itself, the sessions it was forked
/// from and those forked from it, transitively (never another fork of an
/// ancestor), newest first, at most `max`. `id` and `max` are the
/// backend's placeholders, `id_order` how it orders ids byte-wise.
/// `UNION` drops a row seen before, so even a loop of ids ends.
pub fn lineage_query(sessions: &str, id: &str, max: &str, id_order: &str) -> String {
    format!(
        "WITH RECURSIVE
            up(id, forked_from) AS (
                SELECT id, forked_from FROM {sessions} WHERE id = {id}
                UNION
                SELECT s.id, s.forked_from FROM {sessions} s JOIN up ON s.id = up.forked_from),
            down(id) AS (
                SELECT id FROM {sessions} WHERE id = {id}
                UNION
                SELECT s.id FROM {sessions} s JOIN down ON s.forked_from = down.id)
        SELECT {KIN_COLUMNS} FROM {sessions}
        WHERE id IN (SELECT id FROM up UNION SELECT id FROM down)
        ORDER BY created_at DESC, {id_order} LIMIT {max}"
    )
}

/// One `sessions` row: the record's structured fields as JSON text.
#[derive(Clone, Debug, PartialEq)]
pub struct Columns {
    pub id: String,
    pub agent: String,
    pub status: String,
    pub status_detail: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub version: i64,
    /// JSON array of ChatMessage: turns an older server wrote into the
    /// row itself, after the turns the `turns` table holds. This version
    /// writes `[]`, and moves what it finds there into the table with its
    /// next write.
    pub turns: String,
    /// JSON object: StoredParams, never a secret.
    pub params: String,
    /// JSON Security: sealed flag, token digests.
    pub security: String,
    pub forked_from: Option<String>,
    pub runner: Option<String>,
    pub cancel_requested: bool,
    /// JSON Pending: calls waiting, token digests only.
    pub pending: String,
    pub holder: Option<String>,
    /// How many turns the `turns` table holds for the session.
    pub turn_count: i64,
}

/// Why a session's row cannot be written or read. A stored column that
/// does not decode is reported by its position only: serde's message may
/// quote the offending value.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot encode column {column} of session {session}: {source}")]
    Encode {
        session: String,
        column: &'static str,
        source: serde_json::Error,
    },
    #[error("column status of session {0} holds an unknown status")]
    UnknownStatus(String),
    #[error("column {column} of session {session} is not valid ({class:?} error at line {line}, column {at})")]
    Corrupt {
        session: String,
        column: String,
        class: serde_json::error::Category,
        line: usize,
        at: usize,
    },
}

/// The turns a write adds to the `turns` table: `(index, JSON text)`.
pub type NewTurns = Vec<(i64, String)>;

impl Columns {
    /// The row of `rec`, and the turns the store does not hold yet (those
    /// after `rec.stored_turns`).
    pub fn encode(rec: &SessionRecord) -> Result<(Columns, NewTurns), RecordError> {
        let json = |column: &'static str, r: serde_json::Result<String>| {
            r.map_err(|source| RecordError::Encode {
                session: rec.id.clone(),
                column,
                source,
            })
        };
        let from = rec.stored_turns.min(rec.turns.len());
        let mut new = Vec::with_capacity(rec.turns.len() - from);
        for (i, turn) in rec.turns.iter().enumerate().skip(from) {
            new.push((i as i64, turn.json().to_owned()));
        }
        let cols = Columns {
            id: rec.id.clone(),
            agent: rec.agent.clone(),
            status: rec.status.as_str().to_owned(),
            status_detail: rec.status_detail.clone(),
            created_at: rec.created_at,
            updated_at: rec.updated_at,
            version: rec.version,
            turns: "[]".to_owned(),
            params: json("params", serde_json::to_string(&rec.params))?,
            security: json("security", serde_json::to_string(&rec.security))?,
            forked_from: rec.forked_from.clone(),
            runner: rec.runner.clone(),
            cancel_requested: rec.cancel_requested,
            pending: json("pending", serde_json::to_string(&rec.pending))?,
            holder: rec.holder.clone(),
            turn_count: rec.turns.len() as i64,
        };
        Ok((cols, new))
    }

    /// The record of this row and its turns from the `turns` table (JSON
    /// text, in order).
    pub fn decode(self, stored: Vec<String>) -> Result<SessionRecord, RecordError> {
        self.decode_after(Vec::new(), stored)
    }

    /// [`decode`](Self::decode) given the table's first turns already
    /// decoded (`known`, as read before: turns are never rewritten) and
    /// the rest of them as text (`stored`).
    pub fn decode_after(
        self,
        mut turns: Vec<Turn>,
        stored: Vec<String>,
    ) -> Result<SessionRecord, RecordError> {
        let id = self.id;
        let status = SessionStatus::parse(&self.status)
            .ok_or_else(|| RecordError::UnknownStatus(id.clone()))?;
        let known = turns.len();
        let stored_turns = known + stored.len();
        turns.reserve(stored.len());
        for (i, text) in stored.iter().enumerate() {
            let turn = Turn::from_json(text)
                .map_err(|e| corrupt(&id, &format!("message (turn {})", known + i), &e))?;
            turns.push(turn);
        }
        let older: Vec<Turn> =
            serde_json::from_str(&self.turns).map_err(|e| corrupt(&id, "turns", &e))?;
        turns.extend(older);
        let params = serde_json::from_str(&self.params).map_err(|e| corrupt(&id, "params", &e))?;
        let security =
            serde_json::from_str(&self.security).map_err(|e| corrupt(&id, "security", &e))?;
        let pending =
            serde_json::from_str(&self.pending).map_err(|e| corrupt(&id, "pending", &e))?;
        Ok(SessionRecord {
            id,
            agent: self.agent,
            status,
            status_detail: self.status_detail,
            created_at: self.created_at,
            updated_at: self.updated_at,
            version: self.version,
            turns,
            stored_turns,
            params,
            security,
            forked_from: self.forked_from,
            runner: self.runner,
            cancel_requested: self.cancel_requested,
            pending,
            holder: self.holder,
        })
    }
}

/// An event's stored `data` column, decoded.
pub fn decode_event_data(
    session: &str,
    seq: i64,
    data: &str,
) -> Result<serde_json::Value, RecordError> {
    serde_json::from_str(data).map_err(|e| corrupt(session, &format!("data (event {seq})"), &e))
}

/// A stored JSON column that does not decode, by its position.
fn corrupt(session: &str, column: &str, e: &serde_json::Error) -> RecordError {
    RecordError::Corrupt {
        session: session.to_string(),
        column: column.to_string(),
        class: e.classify(),
        line: e.line(),
        at: e.column(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::full_record;

    /// A row and its turns as a store would read them back.
    fn stored(rec: &SessionRecord) -> (Columns, Vec<String>) {
        let (cols, new) = Columns::encode(rec).unwrap();
        (cols, new.into_iter().map(|(_, text)| text).collect())
    }

    #[test]
    fn a_record_survives_encode_and_decode() {
        let rec = full_record();
        let (cols, turns) = stored(&rec);
        assert_eq!(cols.turns, "[]", "turns are rows of their own");
        assert_eq!(cols.turn_count, rec.turns.len() as i64);
        let back = cols.decode(turns).unwrap();
        assert_eq!(back.stored_turns, rec.turns.len());
        assert_eq!(back.turns, rec.turns);
    }

    #[test]
    fn a_write_carries_only_the_turns_the_store_does_not_hold() {
        let mut rec = full_record();
        rec.stored_turns = rec.turns.len() - 1;
        let (_, new) = Columns::encode(&rec).unwrap();
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].0, rec.turns.len() as i64 - 1);
        rec.stored_turns = rec.turns.len();
        assert!(Columns::encode(&rec).unwrap().1.is_empty());
    }

    #[test]
    fn turns_an_older_server_wrote_into_the_row_follow_the_stored_ones() {
        let rec = full_record();
        let (mut cols, mut turns) = stored(&rec);
        let older = turns.split_off(2);
        cols.turns = format!("[{}]", older.join(","));
        let back = cols.decode(turns).unwrap();
        assert_eq!(back.turns, rec.turns);
        // The next write moves them into the table.
        assert_eq!(back.stored_turns, 2);
        let (cols, new) = Columns::encode(&back).unwrap();
        assert_eq!(cols.turns, "[]");
        assert_eq!(new.len(), rec.turns.len() - 2);
    }

    #[test]
    fn a_bad_column_is_named_without_its_content() {
        let (mut cols, turns) = stored(&full_record());
        cols.security = "{\"sealed\": \"wizard-4d1e\"}".into();
        let msg = cols.clone().decode(turns.clone()).unwrap_err();
        assert!(
            matches!(&msg, RecordError::Corrupt { column, .. } if column == "security"),
            "{msg:?}"
        );
        let msg = msg.to_string();
        assert!(msg.contains("column security of session s-full"), "{msg}");
        assert!(!msg.contains("wizard-4d1e"), "{msg}");
        cols.status = "wizard-4d1e".into();
        let msg = cols.clone().decode(turns).unwrap_err();
        assert!(matches!(msg, RecordError::UnknownStatus(_)), "{msg:?}");
        let msg = msg.to_string();
        assert!(msg.contains("column status"), "{msg}");
        assert!(!msg.contains("wizard-4d1e"), "{msg}");
        cols.status = "idle".into();
        cols.security = "{}".into();
        let msg = cols
            .decode(vec!["{\"role\": \"wizard-4d1e\"}".into()])
            .unwrap_err();
        assert!(matches!(msg, RecordError::Corrupt { .. }), "{msg:?}");
        let msg = msg.to_string();
        assert!(msg.contains("message (turn 0) of session s-full"), "{msg}");
        assert!(!msg.contains("wizard-4d1e"), "{msg}");
        let msg = decode_event_data("s1", 3, "{\"x\": wizard-4d1e")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("column data (event 3) of session s1"), "{msg}");
        assert!(!msg.contains("wizard-4d1e"), "{msg}");
    }

    #[test]
    fn a_session_stored_before_pins_reads_as_unpinned() {
        let (mut cols, turns) = stored(&full_record());
        cols.security = r#"{"sealed": false, "token_digests": []}"#.into();
        let rec = cols.decode(turns).unwrap();
        assert!(rec.security.pinned.is_empty());
        // …and an unpinned one is written as before.
        let (again, _) = Columns::encode(&rec).unwrap();
        assert!(!again.security.contains("pinned"), "{}", again.security);
    }
}
