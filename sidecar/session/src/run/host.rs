//! The run's one port to its session: where it records what happens (each
//! turn, the answer, streamed text) and what it may spend (a budget's gate
//! before each model request and tool call, the use after). The server's
//! side is `run/session_host.rs`; the command line's records to the
//! terminal and a file and counts nothing. The budget methods have no
//! default: a host that counts nothing says so.

use async_trait::async_trait;

use super::Events;
use crate::budget::{Gate, Spent};
use bindery_llm::Turn;
use bindery_spec::ModelSpec;

/// The session a run runs in, as the run sees it.
#[async_trait]
pub trait Host: Send + Sync {
    /// A message to append to the history and the events it made for the
    /// session's stream (kind, data), persisted together, each event with
    /// an id. The host may still be storing it when this returns:
    /// [`Host::stored`] waits for that, and each turn is stored after the
    /// one before.
    async fn turn(&self, msg: &Turn, events: Events);
    /// The run's answer, its last turn: a host may keep it to store with
    /// the run's end.
    async fn answer(&self, msg: &Turn, events: Events) {
        self.turn(msg, events).await
    }
    /// Wait until every turn given so far is stored. The run calls it
    /// before anything that acts outside the run (a tool, a helper), so
    /// a call runs only once the turn that asked for it is on record (and
    /// not at all if that write found the run taken: it cancels the run).
    async fn stored(&self) {}
    /// Streamed text as it arrives (live only).
    fn delta(&self, text: &str);
    /// Before a request to `model`; `estimate` tells about how many tokens
    /// its prompt is (asked only when a budget claims the request). A host
    /// that counts nothing lets everything go.
    async fn before_model(
        &self,
        model: &ModelSpec,
        estimate: &(dyn Fn() -> u64 + Send + Sync),
    ) -> Gate;
    /// What the request `claim` was for used (`None`: the endpoint refused
    /// it, so it used nothing anyone bills; a cancelled or cut request
    /// comes with its prompt's estimate).
    async fn after_model(&self, claim: Option<i64>, model: &ModelSpec, used: Option<Spent>);
    /// Whether the request `claim` goes to a cheaper model: a budget of
    /// the run's agent is past its `downgrade.at`. A host that counts
    /// nothing, or a helper's run (its model is not the budget's agent's),
    /// says no.
    fn downgrade(&self, _claim: Option<i64>) -> Option<crate::budget::Downgraded> {
        None
    }
    /// Before a call of `tool` (a lookup's too), ahead of its budgets:
    /// why a rate limit refuses it, in the words the model is told, if one
    /// does. A host that limits nothing lets every call go.
    fn rate_limited(&self, _tool: &str) -> Option<String> {
        None
    }
    /// Before a call of `tool` (a lookup's too).
    async fn before_tool(&self, tool: &str) -> Gate;
    /// A person let the run go past budget `name`: it is not asked again
    /// in this run.
    fn approve(&self, name: &str);
    /// Before `tool` is called (call `call_id`; a lookup's too) with the
    /// secret parameters `secrets` bound into it: the server records it in
    /// the audit log, and the call is not made if it cannot. A host that
    /// keeps no audit log (the command line's) lets it go.
    async fn before_call(
        &self,
        tool: &str,
        call_id: &str,
        secrets: &[String],
    ) -> Result<(), Unaudited>;
}

/// A call the audit log could not record, which is therefore not made
/// (the server's log says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the audit log could not record this call, so it was not made; try again later")]
pub struct Unaudited;

/// A helper's own run: its turns stay its own (the caller gets its answer,
/// and traces the rest), while what it uses counts against the session's
/// budgets.
pub(super) struct Subrun<'a>(pub(super) &'a dyn Host);

#[async_trait]
impl Host for Subrun<'_> {
    async fn turn(&self, _: &Turn, _: Events) {}
    fn delta(&self, _: &str) {}
    async fn before_model(
        &self,
        model: &ModelSpec,
        estimate: &(dyn Fn() -> u64 + Send + Sync),
    ) -> Gate {
        self.0.before_model(model, estimate).await
    }
    async fn after_model(&self, claim: Option<i64>, model: &ModelSpec, used: Option<Spent>) {
        self.0.after_model(claim, model, used).await
    }
    fn rate_limited(&self, tool: &str) -> Option<String> {
        self.0.rate_limited(tool)
    }
    async fn before_tool(&self, tool: &str) -> Gate {
        self.0.before_tool(tool).await
    }
    fn approve(&self, name: &str) {
        self.0.approve(name)
    }
    async fn before_call(
        &self,
        tool: &str,
        call_id: &str,
        secrets: &[String],
    ) -> Result<(), Unaudited> {
        self.0.before_call(tool, call_id, secrets).await
    }
}
