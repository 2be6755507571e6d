//! A `SessionRecord` as table columns, for every SQL store: the column
//! list, the JSON encoding of the structured fields, and decoding back.
//! Pure: each backend binds and reads the columns its own way and wraps
//! these messages with the operation and the database they concern.
//!
//! Messages name the session and the column, never the content: a stored
//! conversation may hold anything the user typed.

use crate::session::model::{SessionRecord, SessionStatus};

/// The `sessions` columns in the order [`Columns`] lists them.
pub const SESSION_COLUMNS: &str = "id, agent, status, status_detail, created_at, updated_at, \
     version, turns, params, security, forked_from, runner, cancel_requested, pending, holder";

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
    /// JSON array of ChatMessage.
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
}

impl Columns {
    pub fn encode(rec: &SessionRecord) -> Result<Columns, String> {
        let json = |column: &str, r: serde_json::Result<String>| {
            r.map_err(|e| format!("cannot encode column {column} of session {}: {e}", rec.id))
        };
        Ok(Columns {
            id: rec.id.clone(),
            agent: rec.agent.clone(),
            status: rec.status.as_str().to_owned(),
            status_detail: rec.status_detail.clone(),
            created_at: rec.created_at,
            updated_at: rec.updated_at,
            version: rec.version,
            turns: json("turns", serde_json::to_string(&rec.turns))?,
            params: json("params", serde_json::to_string(&rec.params))?,
            security: json("security", serde_json::to_string(&rec.security))?,
            forked_from: rec.forked_from.clone(),
            runner: rec.runner.clone(),
            cancel_requested: rec.cancel_requested,
            pending: json("pending", serde_json::to_string(&rec.pending))?,
            holder: rec.holder.clone(),
        })
    }

    pub fn decode(self) -> Result<SessionRecord, String> {
        let id = self.id;
        let status = SessionStatus::parse(&self.status)
            .ok_or_else(|| format!("column status of session {id} holds an unknown status"))?;
        let turns = serde_json::from_str(&self.turns).map_err(|e| corrupt(&id, "turns", &e))?;
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
pub fn decode_event_data(session: &str, seq: i64, data: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(data).map_err(|e| corrupt(session, &format!("data (event {seq})"), &e))
}

/// A stored JSON column that does not decode. serde's message may quote the
/// offending value, so only its position is reported.
fn corrupt(session: &str, column: &str, e: &serde_json::Error) -> String {
    format!(
        "column {column} of session {session} is not valid ({:?} error at line {}, column {})",
        e.classify(),
        e.line(),
        e.column()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::store::contract::full_record;

    #[test]
    fn a_record_survives_encode_and_decode() {
        let rec = full_record();
        assert_eq!(Columns::encode(&rec).unwrap().decode().unwrap(), rec);
    }

    #[test]
    fn a_bad_column_is_named_without_its_content() {
        let mut cols = Columns::encode(&full_record()).unwrap();
        cols.security = "{\"sealed\": \"wizard-4d1e\"}".into();
        let msg = cols.clone().decode().unwrap_err();
        assert!(msg.contains("column security of session s-full"), "{msg}");
        assert!(!msg.contains("wizard-4d1e"), "{msg}");
        cols.status = "wizard-4d1e".into();
        let msg = cols.decode().unwrap_err();
        assert!(msg.contains("column status"), "{msg}");
        assert!(!msg.contains("wizard-4d1e"), "{msg}");
        let msg = decode_event_data("s1", 3, "{\"x\": wizard-4d1e").unwrap_err();
        assert!(msg.contains("column data (event 3) of session s1"), "{msg}");
        assert!(!msg.contains("wizard-4d1e"), "{msg}");
    }

    #[test]
    fn a_session_stored_before_pins_reads_as_unpinned() {
        let mut cols = Columns::encode(&full_record()).unwrap();
        cols.security = r#"{"sealed": false, "token_digests": []}"#.into();
        let rec = cols.decode().unwrap();
        assert!(rec.security.pinned.is_empty());
        // …and an unpinned one is written as before.
        let again = Columns::encode(&rec).unwrap();
        assert!(!again.security.contains("pinned"), "{}", again.security);
    }
}
