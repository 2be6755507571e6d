//! What the service keeps of sessions, shared by the run (`crate::run`)
//! and the API's flows (`crate::service`): the live map (`live_sessions`:
//! what exists in memory only, a session's lock and its run), the
//! recorder (writes and the events subscribers hear of), secret values
//! (`secrets`), the agents and their model clients (`agents`), pending
//! calls' notices (`approvals`) and the budgets (`budgets`).

use crate::error::ServiceError;
use bindery_store::model::SessionRecord;
use bindery_store::SessionStore;

pub mod agents;
pub mod approvals;
pub mod audit;
pub mod budgets;
pub mod live_sessions;
pub mod recorder;
pub mod secrets;

/// Session `id` as `store` has it, or a 404 naming it: how every
/// collaborator reads a session it must find.
pub(crate) async fn stored_session(
    store: &dyn SessionStore,
    id: &str,
) -> Result<SessionRecord, ServiceError> {
    store
        .get(id)
        .await?
        .ok_or_else(|| ServiceError::not_found(format!("no session {id}")))
}
