//! What every handler shares: the session service, the tokens, the
//! metrics, readiness, and the clients that forward a request to the
//! server holding a session (`holder.rs`). Its own module, so that the
//! router (`server`), `/mcp`, the chat page and the forwarding layer each
//! depend on it and not on one another.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::owner_token::OwnerToken;
use super::peers::PeerAuth;
use bindery_metrics::Metrics;
use bindery_session::service::Service;

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
    /// Which `Host` and `Origin` a request may carry (DNS rebinding).
    pub origins: Arc<super::origin::OriginPolicy>,
    /// The platform's identity provider (`--identity-issuer`): end users'
    /// identity tokens are taken when it is set.
    pub identity: Option<Arc<bindery_identity::Verifier>>,
    /// Requests per minute, the server's and each end user's.
    pub rates: super::rate_limit::RequestRates,
}
