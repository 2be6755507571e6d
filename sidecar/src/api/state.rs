//! What every handler shares: the session service, the owner token, the
//! metrics, readiness, and the client that forwards a request to the
//! server holding a session. Its own module, so that the router
//! (`server`), `/mcp` and the chat page each depend on it and not on one
//! another.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::Response;

use super::auth::{caller, Door, OwnerToken};
use super::peers::{forward, is_forwarded, secret_values_in, tls_required, Incoming, PeerAuth};
use crate::metrics::Metrics;
use crate::session::error::ServiceError;
use crate::session::service::Service;
use crate::session::validate::Caller;

pub struct AppState {
    pub service: Arc<Service>,
    pub owner: OwnerToken,
    /// The MCP client token (`--mcp-client-token-file`): it opens `/mcp`
    /// for the agents' exposed tools only.
    pub mcp_client: Option<OwnerToken>,
    /// The approver token (`--approver-token-file`): pending approvals
    /// and their answers only.
    pub approver: Option<OwnerToken>,
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    /// Forwards requests to other servers on a shared store.
    pub peers: reqwest::Client,
    /// The same over mutual TLS, with `--peer-tls-dir`: the only way a
    /// forward carrying a secret value goes.
    pub peers_tls: Option<reqwest::Client>,
    /// Checks the forwards of other servers.
    pub peer_auth: Arc<PeerAuth>,
}

impl AppState {
    /// Who sends this request on `session` through `door`.
    pub(crate) async fn caller(
        &self,
        headers: &HeaderMap,
        session: Option<&str>,
        door: Door,
    ) -> Result<Caller, ServiceError> {
        let tokens = super::auth::Tokens {
            owner: &self.owner,
            approver: self.approver.as_ref(),
        };
        caller(headers, tokens, &self.service, session, door).await
    }

    /// `req` on session `id` sent on to the server holding what it needs
    /// in memory (see [`Service::held_elsewhere`]); `None`: serve it here
    /// (it came from a peer already, no other live server holds it, or
    /// that server cannot be reached). Refused: it would carry a secret
    /// value over plain HTTP.
    pub(super) async fn forward_to_holder(
        &self,
        id: &str,
        who: &Caller,
        req: &Incoming,
    ) -> Result<Option<Response>, ServiceError> {
        if is_forwarded(&req.headers) {
            return Ok(None);
        }
        let Some(to) = self.service.held_elsewhere(id).await else {
            return Ok(None);
        };
        let client = if to.starts_with("https://") {
            let Some(client) = &self.peers_tls else {
                tracing::warn!(session = id, peer = %to, "cannot forward a request to the server holding the session: it takes forwards over TLS, and this server has no --peer-tls-dir");
                return Ok(None);
            };
            client
        } else {
            let secrets = self.secret_values_in(id, req).await;
            if !secrets.is_empty() {
                return Err(tls_required(secrets));
            }
            &self.peers
        };
        let key = self.owner.peer_key();
        match forward(client, &key, &to, who, req).await {
            Ok(r) => Ok(Some(r)),
            Err(why) => {
                tracing::warn!(session = id, peer = %to, "cannot forward a request to the server holding the session: {why}");
                Ok(None)
            }
        }
    }

    /// The secret values `req` gives for session `id`'s agent (all the
    /// values it gives when the session cannot be read: none may go in
    /// clear by mistake).
    async fn secret_values_in(&self, id: &str, req: &Incoming) -> Vec<String> {
        let agent = match self.service.record(id).await {
            Ok(rec) => self.service.find_agent(&rec.agent).map(|(a, _)| a),
            Err(_) => None,
        };
        secret_values_in(&req.body, |name| {
            agent
                .as_ref()
                .is_none_or(|a| a.params.decl(name).is_none_or(|d| d.secret))
        })
    }

    /// A request refused here for want of secret values another live
    /// server holds is answered by that server; anything else stands.
    pub(super) async fn or_forward(
        &self,
        e: ServiceError,
        id: &str,
        who: &Caller,
        req: &Incoming,
    ) -> Result<Response, ServiceError> {
        if e.code != "params_required" {
            return Err(e);
        }
        self.forward_to_holder(id, who, req).await?.ok_or(e)
    }
}
