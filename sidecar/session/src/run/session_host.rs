//! The server's side of a run's one port ([`Host`]): its turns go to the
//! store and the session's subscribers ([`SessionSink`]), and its budgets
//! are claimed in the store ([`RunBudget`]).

use async_trait::async_trait;

use super::run_budget::RunBudget;
use super::session_sink::SessionSink;
use crate::budget::{Gate, Spent};
use crate::rate::ToolRates;
use crate::run::{Events, Host, Unaudited};
use crate::state::audit::AuditLog;
use bindery_llm::Turn;
use bindery_metrics::Metrics;
use bindery_spec::ModelSpec;
use bindery_store::audit::{Action, Actor, Credential};
use bindery_store::clock::Clock;
use std::collections::BTreeMap;

/// A run of a session this server drives, as the run sees it.
pub(crate) struct SessionHost<'a> {
    pub(crate) sink: SessionSink<'a>,
    pub(crate) budget: RunBudget,
    pub(crate) audit: RunAudit<'a>,
    pub(crate) rates: RunRates<'a>,
}

/// Where the run's tool calls are recorded, and as whose.
pub(crate) struct RunAudit<'a> {
    pub(crate) log: &'a AuditLog,
    pub(crate) session: &'a str,
    /// The run, on behalf of whoever started it.
    pub(crate) by: Actor,
    /// Each secret parameter's origin (`session`, `pinned`, …).
    pub(crate) origins: BTreeMap<String, String>,
}

impl RunAudit<'_> {
    async fn before_call(
        &self,
        tool: &str,
        call_id: &str,
        secrets: &[String],
    ) -> Result<(), Unaudited> {
        let credentials = secrets
            .iter()
            .map(|name| Credential {
                name: name.clone(),
                // A helper's own parameter: its value came from its caller's.
                origin: self
                    .origins
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| "helper".to_string()),
            })
            .collect();
        let called = Action::ToolCalled {
            tool: tool.to_string(),
            tool_call_id: call_id.to_string(),
            credentials,
        };
        self.log
            .record(self.by.clone(), Some(self.session), called)
            .await
            .map(drop)
            .map_err(|_| Unaudited)
    }
}

/// The server's tool rate limits, as one run (of one end user's session,
/// or the owner's) takes from them.
pub(crate) struct RunRates<'a> {
    pub(crate) rates: &'a ToolRates,
    pub(crate) subject: Option<&'a str>,
    pub(crate) clock: &'a dyn Clock,
    pub(crate) metrics: &'a Metrics,
}

#[async_trait]
impl Host for SessionHost<'_> {
    async fn turn(&self, msg: &Turn, events: Events) {
        self.sink.turn(msg, events).await
    }
    async fn answer(&self, msg: &Turn, events: Events) {
        self.sink.answer(msg, events).await
    }
    async fn stored(&self) {
        self.sink.stored().await
    }
    fn delta(&self, text: &str) {
        self.sink.delta(text)
    }
    async fn before_model(
        &self,
        model: &ModelSpec,
        estimate: &(dyn Fn() -> u64 + Send + Sync),
    ) -> Gate {
        self.budget.before_model(model, estimate).await
    }
    async fn after_model(&self, claim: Option<i64>, model: &ModelSpec, used: Option<Spent>) {
        self.budget.after_model(claim, model, used).await
    }
    fn downgrade(&self, claim: Option<i64>) -> Option<crate::budget::Downgraded> {
        self.budget.downgrade(claim?)
    }
    fn rate_limited(&self, tool: &str) -> Option<String> {
        let r = &self.rates;
        if r.rates.is_empty() {
            return None;
        }
        let limited = r.rates.take(tool, r.subject, r.clock.now_ms()).err()?;
        r.metrics.rate_limited(bindery_metrics::RateLimited::Tool);
        Some(limited.detail(tool))
    }
    async fn before_tool(&self, tool: &str) -> Gate {
        self.budget.before_tool(tool).await
    }
    fn approve(&self, name: &str) {
        self.budget.approve(name)
    }
    async fn before_call(
        &self,
        tool: &str,
        call_id: &str,
        secrets: &[String],
    ) -> Result<(), Unaudited> {
        self.audit.before_call(tool, call_id, secrets).await
    }
}
