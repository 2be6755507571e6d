//! The budgets of the agents this server runs: each run's budgets, asked of the session store
//! so that every replica counts against the same use, and what is told
//! when one nears or reaches its limit (the session's stream, a Warning
//! Event on the tenant, the metrics).

use crate::budget::{self, Crossing, Exceeded, Who, MODEL};
use crate::error::Code;
use crate::error::ErrorKind;
use crate::error::ServiceError;
use crate::state::agents::Agents;
use crate::state::recorder::Recorder;
use bindery_metrics::Metrics;
use bindery_spec::budget::{Limit, OnExceed};
use bindery_store::clock::Clock;
use bindery_store::model::SessionRecord;
use bindery_store::pending;
use bindery_store::usage::{Gauge, PeakBy, SessionUsage};
use bindery_store::wire::BudgetEvent;
use bindery_store::wire::BudgetState;
use bindery_store::wire::SessionEvent;
use bindery_store::SessionStore;
use bindery_tree::LoadedAgent;
use std::sync::Arc;

use bindery_store::usage::Unwritten;
use std::time::Duration;

/// The budgets of the agents this server runs: what runs claim against
/// them, what is told when one nears or reaches its limit, and the
/// tenant's budget status.
pub struct Budgets {
    pub(crate) store: Arc<dyn SessionStore>,
    /// Where a crossing is said on the session's stream.
    recorder: Arc<Recorder>,
    pub(crate) metrics: Arc<Metrics>,
    agents: Arc<Agents>,
    pub(crate) clock: Arc<dyn Clock>,
    /// Warning Events and the budget status on the tenant, where the
    /// operator allows them.
    kube_events: Arc<std::sync::OnceLock<crate::kube_events::KubeEvents>>,
    /// Wakes the writer of the tenant's budget status before its next tick.
    status: tokio::sync::Notify,
}

impl Budgets {
    pub(crate) fn new(
        store: Arc<dyn SessionStore>,
        recorder: Arc<Recorder>,
        metrics: Arc<Metrics>,
        agents: Arc<Agents>,
        clock: Arc<dyn Clock>,
        kube_events: Arc<std::sync::OnceLock<crate::kube_events::KubeEvents>>,
    ) -> Budgets {
        Budgets {
            store,
            recorder,
            metrics,
            agents,
            clock,
            kube_events,
            status: tokio::sync::Notify::new(),
        }
    }
}

impl Budgets {
    /// Write `left` on its own.
    pub(crate) async fn record_leftover(&self, session: &str, left: &Leftover) {
        if !left.usage.is_empty() {
            if let Err(e) = self.store.record(&left.usage).await {
                tracing::error!(session, "cannot record the run's usage: {e}");
            }
        }
        self.leftover_written(left);
    }

    /// `left` is written: the tenant's budget status follows.
    pub(crate) fn leftover_written(&self, left: &Leftover) {
        if left.status_due {
            self.status_due();
        }
    }
}

impl Budgets {
    /// A 429 for a message or resume of session `rec` when one of its
    /// agent's `refuse` budgets of tokens or cost is used up (a tool-call
    /// budget refuses each call instead).
    pub(crate) async fn refuse_if_spent(
        &self,
        agent: &LoadedAgent,
        rec: &SessionRecord,
        run: &pending::WaitingRun,
    ) -> Result<(), ServiceError> {
        let limits = agent.budget_limits();
        if limits.is_empty() {
            return Ok(());
        }
        let now = self.clock.now_ms();
        let who = Who {
            agent: &agent.name,
            session: &rec.id,
            run: &run.id,
            subject: rec.security.subject.as_ref().map(|s| s.as_str()),
        };
        let gauges: Vec<_> = budget::gauges(&limits, &MODEL, &[], &who, now)
            .into_iter()
            .filter(|(i, _)| limits[*i].on_exceed == OnExceed::Refuse)
            .collect();
        if gauges.is_empty() {
            return Ok(());
        }
        let asked: Vec<Gauge> = gauges.iter().map(|(_, g)| g.clone()).collect();
        let standings = self.store.measure(&asked).await?;
        for ((i, _), standing) in gauges.iter().zip(standings) {
            let limit = &limits[*i];
            if standing.used >= limit.limit {
                let e = Exceeded::of(limit, &standing, now);
                let mut err =
                    ServiceError::new(ErrorKind::Exhausted, Code::BudgetExceeded, e.detail());
                err.extra = Some(Box::new(e.fields()));
                return Err(err);
            }
        }
        Ok(())
    }

    /// A budget of `agent` went past 80% or its limit in session `id`:
    /// said on the session's stream and as a Warning Event on the tenant.
    pub(crate) async fn tell_crossing(
        &self,
        id: &str,
        agent: &str,
        limit: &Limit,
        used: f64,
        c: Crossing,
    ) {
        let (state, reason) = match c {
            Crossing::Nearly => (BudgetState::NearlyUsed, "BudgetNearlyUsed"),
            Crossing::UsedUp => (BudgetState::UsedUp, "BudgetUsedUp"),
        };
        let event = BudgetEvent {
            budget: limit.name.clone(),
            state,
            used,
            limit: limit.limit,
            meter: limit.meter,
            per: limit.per_text.clone(),
        };
        self.recorder.emit(id, SessionEvent::Budget(event)).await;
        if let Some(events) = self.kube_events.get() {
            let note = format!(
                "budget {} of agent {agent} has used {} of {} {} per {} (session {id})",
                limit.name,
                used.floor(),
                limit.limit,
                limit.meter.as_str().replace('_', " "),
                limit.per_text,
            );
            events.warn(reason, "Budget", &note).await;
        }
        self.status_due();
    }
}

/// How often the tenant's budget status is written when nothing crosses a line.
const STATUS_EVERY: Duration = Duration::from_secs(30);

/// The least time between two writes of the tenant's budget status: a
/// busy tenant's runs ask for one each, and the API server need not hear
/// of every one.
const STATUS_GAP: Duration = Duration::from_secs(5);

impl Budgets {
    /// Write the tenant's budget status soon (a budget crossed a line, or
    /// a run that counts against budgets used something).
    pub(crate) fn status_due(&self) {
        self.status.notify_one();
    }

    /// Each budget of each agent this server serves, as measured now.
    pub async fn statuses(&self) -> Result<Vec<BudgetStatus>, ServiceError> {
        // One reading: the windows measured and the time shown are the same.
        let now = self.clock.now_ms();
        let at = std::time::UNIX_EPOCH + Duration::from_millis(now.max(0) as u64);
        let at = humantime::format_rfc3339_seconds(at).to_string();
        let mut out = Vec::new();
        for agent in self.agents.tree().agents.values() {
            for limit in agent.budget_limits() {
                let used = match limit.per {
                    // The most any one end user used in their window.
                    bindery_spec::budget::Per::Rolling(window) if limit.per_user => {
                        self.store
                            .peak(&agent.name, limit.meter, PeakBy::User, now - window)
                            .await?
                    }
                    bindery_spec::budget::Per::Rolling(window) => {
                        let gauge = Gauge {
                            meter: limit.meter,
                            scope: bindery_store::usage::Scope::Agent(agent.name.clone()),
                            since: now - window,
                        };
                        self.store.measure(&[gauge]).await?[0].used
                    }
                    // The largest session (or run) of the last day.
                    per => {
                        let since = now - 86_400_000;
                        let by = match per {
                            bindery_spec::budget::Per::Session => PeakBy::Session,
                            _ => PeakBy::Run,
                        };
                        self.store.peak(&agent.name, limit.meter, by, since).await?
                    }
                };
                out.push(BudgetStatus {
                    name: limit.name.clone(),
                    agent: agent.name.clone(),
                    meter: limit.meter.as_str().to_string(),
                    used,
                    limit: limit.limit,
                    per: limit.per_text.clone(),
                    on_exceed: limit.on_exceed,
                    exhausted: used >= limit.limit,
                    measured_at: at.clone(),
                });
            }
        }
        Ok(out)
    }

    /// Keep the tenant's `status.budgets` current, while the server runs:
    /// every 30 seconds, and soon after a budget crosses a line or a run
    /// that counts against one ends (at most every 5 seconds).
    /// Only where the operator gave the pod what it takes (see
    /// `kube_events`) and an agent has budgets.
    pub async fn write_status(self: Arc<Self>) {
        let Some(events) = self.kube_events.get() else {
            return;
        };
        if self
            .agents
            .tree()
            .agents
            .values()
            .all(|a| a.spec.budgets.is_empty())
        {
            return;
        }
        loop {
            match self.statuses().await {
                Ok(rows) => events.budget_status(&rows).await,
                Err(e) => tracing::warn!("cannot measure the budgets for the tenant's status: {e}"),
            }
            let written = tokio::time::Instant::now();
            let _ = tokio::time::timeout(STATUS_EVERY, self.status.notified()).await;
            tokio::time::sleep_until(written + STATUS_GAP).await;
        }
    }
}

use bindery_spec::budget::BudgetStatus;

impl Budgets {
    /// What session `rec` used, as its view shows it (`None`: the store
    /// could not say; the view is shown without it).
    pub async fn session_usage(&self, rec: &SessionRecord) -> Option<SessionUsage> {
        match self.store.session_totals(&rec.id).await {
            Ok(totals) => Some(SessionUsage {
                totals,
                currency: self
                    .agents
                    .agent(&rec.agent)
                    .ok()
                    .and_then(|a| a.spec.model.pricing.as_ref().map(|p| p.currency.clone())),
            }),
            Err(e) => {
                tracing::warn!(session = %rec.id, "cannot read the session's usage: {e}");
                None
            }
        }
    }

    /// The currency the served agents are priced in: `mixed` for several,
    /// `None` for none.
    pub fn pricing_currency(&self) -> Option<String> {
        let mut all: Vec<&str> = self
            .agents
            .tree()
            .agents
            .values()
            .filter_map(|a| a.spec.model.pricing.as_ref())
            .map(|p| p.currency.as_str())
            .collect();
        all.sort_unstable();
        all.dedup();
        match all.as_slice() {
            [] => None,
            [one] => Some(one.to_string()),
            _ => Some("mixed".to_string()),
        }
    }
}

/// What a run's part used that no claim wrote: stored with the run's end,
/// in the same transaction ([`SessionStore::update_with_usage`](bindery_store::SessionStore::update_with_usage)), or on its
/// own when the end is not stored here ([`Budgets::record_leftover`]).
#[derive(Default)]
pub(crate) struct Leftover {
    pub(crate) usage: Unwritten,
    /// The tenant's budget status is to follow once it is written.
    pub(crate) status_due: bool,
}
