//! A run's session lineage over the store: what `list-sessions` and
//! `search-sessions` read ([`bindery_tools::lineage`] decides the scope
//! and the matches). Bound to the run's session, it reads no other
//! lineage.

use std::sync::Arc;

use async_trait::async_trait;

use bindery_spec::SessionScope;
use bindery_store::SessionStore;
use bindery_tools::lineage::{
    in_scope, search_session, terms, Found, Hit, Kin, LineageUnreadable, Listing, Read, Relation,
    SessionLineage, LINEAGE_MAX, SEARCH_BYTES,
};

pub struct StoreLineage {
    store: Arc<dyn SessionStore>,
    session: String,
}

impl StoreLineage {
    pub fn new(store: Arc<dyn SessionStore>, session: &str) -> StoreLineage {
        StoreLineage {
            store,
            session: session.to_owned(),
        }
    }

    async fn scoped(&self, scope: SessionScope) -> Result<Vec<(Kin, Relation)>, LineageUnreadable> {
        let kin = self
            .store
            .lineage(&self.session, LINEAGE_MAX)
            .await
            .map_err(unreadable)?;
        Ok(in_scope(kin, &self.session, scope))
    }
}

/// What the model is told when the store fails (the log has why: a
/// store's message may name files and hosts).
fn unreadable(e: bindery_store::StoreError) -> LineageUnreadable {
    tracing::warn!("a session capability could not read the store: {e}");
    LineageUnreadable
}

impl std::fmt::Debug for StoreLineage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreLineage")
            .field("session", &self.session)
            .finish()
    }
}

#[async_trait]
impl SessionLineage for StoreLineage {
    async fn list(&self, scope: SessionScope, limit: usize) -> Result<Listing, LineageUnreadable> {
        let mut sessions = self.scoped(scope).await?;
        let total = sessions.len();
        sessions.truncate(limit);
        Ok(Listing { sessions, total })
    }

    async fn search(
        &self,
        scope: SessionScope,
        query: &str,
        limit: usize,
        tool_outputs: bool,
    ) -> Result<Found, LineageUnreadable> {
        let terms = terms(query);
        let mut found = Found {
            hits: Vec::new(),
            total: 0,
            complete: true,
        };
        let mut read = 0;
        for (session, relation) in self.scoped(scope).await? {
            if read >= SEARCH_BYTES {
                found.complete = false;
                break;
            }
            // Gone since the lineage was read: nothing to search.
            let Some(rec) = self.store.get(&session.id).await.map_err(unreadable)? else {
                continue;
            };
            let (m, bytes) = search_session(&rec.turns, &terms, tool_outputs);
            read += bytes;
            let Some(m) = m else { continue };
            found.total += 1;
            if found.hits.len() < limit {
                found.hits.push(Hit {
                    session,
                    relation,
                    found: m,
                });
            }
        }
        Ok(found)
    }

    async fn read(&self, scope: SessionScope, id: &str) -> Result<Option<Read>, LineageUnreadable> {
        let Some((session, relation)) = self
            .scoped(scope)
            .await?
            .into_iter()
            .find(|(k, _)| k.id == id)
        else {
            return Ok(None);
        };
        let rec = self.store.get(id).await.map_err(unreadable)?;
        Ok(rec.map(|rec| Read {
            session,
            relation,
            turns: rec.turns,
        }))
    }
}
