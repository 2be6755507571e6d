//! The server's side of a run's budgets ([`crate::run::Host`]'s gates): each run's budgets, asked of the session store
//! so that every replica counts against the same use, and what is told
//! when one nears or reaches its limit (the session's stream, a Warning
//! Event on the tenant, the metrics).

use super::Agents;
use super::Recorder;
use crate::error::Code;
use crate::error::ErrorKind;
use crate::error::ServiceError;
use crate::run::budget::{self, Crossing, Exceeded, Gate, Spent, Who};
use bindery_metrics::Metrics;
use bindery_spec::budget::{Limit, Meter, OnExceed};
use bindery_spec::ModelSpec;
use bindery_store::clock::Clock;
use bindery_store::model::SessionRecord;
use bindery_store::pending;
use bindery_store::usage::{Claimed, Gauge, SessionUsage, Totals, Unwritten, Use};
use bindery_store::wire::BudgetEvent;
use bindery_store::wire::BudgetState;
use bindery_store::wire::SessionEvent;
use bindery_store::SessionStore;
use bindery_tree::LoadedAgent;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

/// The budgets of the agents this server runs: what runs claim against
/// them, what is told when one nears or reaches its limit, and the
/// tenant's budget status.
pub struct Budgets {
    store: Arc<dyn SessionStore>,
    /// Where a crossing is said on the session's stream.
    recorder: Arc<Recorder>,
    metrics: Arc<Metrics>,
    agents: Arc<Agents>,
    clock: Arc<dyn Clock>,
    /// Warning Events and the budget status on the tenant, where the
    /// operator allows them.
    kube_events: Arc<std::sync::OnceLock<crate::kube_events::KubeEvents>>,
    /// Wakes the writer of the tenant's budget status before its next tick.
    status: tokio::sync::Notify,
}

impl Budgets {
    pub(super) fn new(
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

/// One run's budgets.
pub(super) struct RunBudget {
    budgets: Arc<Budgets>,
    agent: String,
    session: String,
    run: String,
    /// The session's agent's budgets (a helper's count against them).
    limits: Vec<Limit>,
    /// `confirm` budgets a person let this run go past.
    approved: Mutex<Vec<String>>,
    /// The session's agent's model: what its tool calls are reported under.
    model: String,
    /// Each model request in flight (helpers' may run at once), by its
    /// claim: its limits' use before it.
    before: Mutex<HashMap<i64, Vec<(usize, f64)>>>,
    /// What this part of the run used (until it ends or waits).
    spent: Mutex<Totals>,
    /// Use not written yet (rows no budget claimed, and what claimed
    /// model requests came to): with the next claim, in its transaction,
    /// or with the run's part's end ([`RunBudget::leftover`]).
    unwritten: Mutex<Unwritten>,
}

/// What a run's part used that no claim wrote: stored with the run's end,
/// in the same transaction ([`SessionStore::update_with_usage`]), or on its
/// own when the end is not stored here ([`Budgets::record_leftover`]).
#[derive(Default)]
pub(super) struct Leftover {
    pub(super) usage: Unwritten,
    /// The tenant's budget status is to follow once it is written.
    pub(super) status_due: bool,
}

impl Budgets {
    /// Write `left` on its own.
    pub(super) async fn record_leftover(&self, session: &str, left: &Leftover) {
        if !left.usage.is_empty() {
            if let Err(e) = self.store.record(&left.usage).await {
                tracing::error!(session, "cannot record the run's usage: {e}");
            }
        }
        self.leftover_written(left);
    }

    /// `left` is written: the tenant's budget status follows.
    pub(super) fn leftover_written(&self, left: &Leftover) {
        if left.status_due {
            self.status_due();
        }
    }
}

/// The meters a model request counts.
const MODEL: [Meter; 2] = [Meter::Tokens, Meter::Cost];

impl RunBudget {
    pub(super) fn new(
        budgets: &Arc<Budgets>,
        agent: &LoadedAgent,
        session: &str,
        run: &pending::WaitingRun,
    ) -> RunBudget {
        RunBudget {
            budgets: budgets.clone(),
            agent: agent.name.clone(),
            session: session.to_string(),
            run: run.id.clone(),
            limits: agent.budget_limits(),
            approved: Mutex::new(run.budgets_approved.clone()),
            model: agent.spec.model.name.clone(),
            before: Mutex::new(HashMap::new()),
            spent: Mutex::new(Totals::default()),
            unwritten: Mutex::new(Unwritten::default()),
        }
    }

    /// The run's part ends: the use no claim has written yet, for its end
    /// to write ([`Leftover`]).
    pub(super) fn leftover(&self) -> Leftover {
        Leftover {
            usage: self.take_unwritten(),
            status_due: !self.limits.is_empty() && self.spent() != Totals::default(),
        }
    }

    fn unwritten(&self) -> std::sync::MutexGuard<'_, Unwritten> {
        self.unwritten.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_unwritten(&self) -> Unwritten {
        std::mem::take(&mut *self.unwritten())
    }

    /// What this part of the run used.
    pub(super) fn spent(&self) -> Totals {
        self.spent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn add(&self, row: &Use) {
        self.spent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(row);
    }

    /// The budgets a person let the run go past, for its next part.
    pub(super) fn approved(&self) -> Vec<String> {
        self.approved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn who(&self) -> Who<'_> {
        Who {
            agent: &self.agent,
            session: &self.session,
            run: &self.run,
        }
    }

    fn row(&self, at: i64, model: &str, tool: Option<&str>) -> Use {
        Use {
            at,
            agent: self.agent.clone(),
            session: self.session.clone(),
            run: self.run.clone(),
            model: model.to_string(),
            tool: tool.map(str::to_string),
            prompt_tokens: 0,
            completion_tokens: 0,
            estimated: false,
            tool_calls: 0,
            cost: 0.0,
        }
    }

    /// What the limits that count `meters` ask of the store at `at`.
    fn gauges(&self, meters: &[Meter], at: i64) -> Vec<(usize, Gauge)> {
        budget::gauges(&self.limits, meters, &self.approved(), &self.who(), at)
    }

    /// Claim `row` against `gauges` (never empty). A store that fails
    /// lets the work go on (`Go(None)`): the caller keeps the row.
    async fn claim(&self, gauges: &[(usize, Gauge)], row: &Use) -> (Gate, Vec<(usize, f64)>) {
        let limits: Vec<(Gauge, f64)> = gauges
            .iter()
            .map(|(i, g)| (g.clone(), self.limits[*i].limit))
            .collect();
        let earlier = self.take_unwritten();
        match self.budgets.store.claim(&limits, &earlier, row).await {
            Ok(Claimed::Granted { id, used }) => {
                let before = gauges.iter().map(|(i, _)| *i).zip(used).collect();
                (Gate::Go(Some(id)), before)
            }
            Ok(Claimed::Exhausted { index, standing }) => {
                let limit = &self.limits[gauges[index].0];
                let e = Exceeded::of(limit, &standing, row.at);
                tracing::info!(session = %self.session, budget = %e.budget, "{}", e.detail());
                let gate = match limit.on_exceed {
                    OnExceed::Refuse => Gate::Refuse(e),
                    OnExceed::Confirm => Gate::Ask(e),
                };
                (gate, Vec::new())
            }
            Err(e) => {
                // The run's own writes go to the same store; failing them
                // is its business. Usage is not worth stopping a run for.
                tracing::error!(session = %self.session, "cannot count usage: {e}");
                // Kept for the next write.
                let mut unwritten = self.unwritten();
                unwritten.rows.extend(earlier.rows);
                unwritten.settled.extend(earlier.settled);
                (Gate::Go(None), Vec::new())
            }
        }
    }

    /// Tell of each limit in `before` that `row` took past a line.
    async fn crossed(&self, before: &[(usize, f64)], row: &Use) {
        for (i, used) in before {
            let limit = &self.limits[*i];
            let after = used + row.amount(limit.meter);
            self.budgets
                .metrics
                .budget_remaining(&self.agent, &limit.name, limit.limit - after);
            if let Some(c) = budget::crossing(*used, after, limit.limit) {
                self.budgets
                    .tell_crossing(&self.session, &self.agent, limit, after, c)
                    .await;
            }
        }
    }
}

/// The run's gates, as its [`SessionHost`](super::session_host::SessionHost) asks them.
impl RunBudget {
    pub(super) async fn before_model(
        &self,
        model: &ModelSpec,
        estimate: &(dyn Fn() -> u64 + Send + Sync),
    ) -> Gate {
        let now = self.budgets.clock.now_ms();
        let gauges = self.gauges(&MODEL, now);
        if gauges.is_empty() {
            // Nothing to claim against: the request's row is written once,
            // when its use is known.
            return Gate::Go(None);
        }
        let mut row = self.row(now, &model.name, None);
        // Claimed at the estimate; settled at what the model reports. If
        // the claim fails, the request's row is written once its use is
        // known, like one no budget claims.
        let estimate = estimate();
        row.prompt_tokens = estimate;
        row.estimated = true;
        row.cost = model.pricing.as_ref().map_or(0.0, |p| p.cost(estimate, 0));
        let (gate, before) = self.claim(&gauges, &row).await;
        if let Gate::Go(Some(id)) = gate {
            self.before
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, before);
        }
        gate
    }

    pub(super) async fn after_model(
        &self,
        claim: Option<i64>,
        model: &ModelSpec,
        used: Option<Spent>,
    ) {
        let before = claim
            .and_then(|id| {
                self.before
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id)
            })
            .unwrap_or_default();
        let mut row = self.row(self.budgets.clock.now_ms(), &model.name, None);
        if let Some(s) = used {
            row.prompt_tokens = s.prompt;
            row.completion_tokens = s.completion;
            row.estimated = s.estimated;
            row.cost = model
                .pricing
                .as_ref()
                .map_or(0.0, |p| p.cost(s.prompt, s.completion));
            let currency = model.pricing.as_ref().map_or("", |p| p.currency.as_str());
            self.budgets.metrics.model_usage(
                &self.agent,
                &model.name,
                s.prompt,
                s.completion,
                row.cost,
                currency,
            );
        }
        self.add(&row);
        // Written with the next claim (which so counts it exactly) or at
        // the run's end, not on the run's way.
        match claim {
            Some(id) => {
                self.crossed(&before, &row).await;
                self.unwritten().settled.push((id, row));
            }
            None => self.unwritten().rows.push(row),
        }
    }

    pub(super) async fn before_tool(&self, tool: &str) -> Gate {
        let now = self.budgets.clock.now_ms();
        let mut row = self.row(now, &self.model, Some(tool));
        row.tool_calls = 1;
        let gauges = self.gauges(&[Meter::ToolCalls], now);
        let (gate, before) = match gauges.is_empty() {
            true => (Gate::Go(None), Vec::new()),
            false => self.claim(&gauges, &row).await,
        };
        match gate {
            Gate::Go(claimed) => {
                self.add(&row);
                self.crossed(&before, &row).await;
                if claimed.is_none() {
                    // Not written by a claim: written with the next one.
                    self.unwritten().rows.push(row);
                }
            }
            Gate::Refuse(_) | Gate::Ask(_) => {}
        }
        gate
    }

    pub(super) fn approve(&self, name: &str) {
        let mut approved = self.approved.lock().unwrap_or_else(|p| p.into_inner());
        if !approved.iter().any(|a| a == name) {
            approved.push(name.to_string());
        }
    }
}

impl Budgets {
    /// A 429 for a message or resume of session `rec` when one of its
    /// agent's `refuse` budgets of tokens or cost is used up (a tool-call
    /// budget refuses each call instead).
    pub(super) async fn refuse_if_spent(
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
    async fn tell_crossing(&self, id: &str, agent: &str, limit: &Limit, used: f64, c: Crossing) {
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
    pub(super) fn status_due(&self) {
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
                        let by_session = per == bindery_spec::budget::Per::Session;
                        self.store
                            .peak(&agent.name, limit.meter, by_session, since)
                            .await?
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
