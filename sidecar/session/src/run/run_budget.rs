//! One run's budgets, the server's side of its [`Host`](crate::run::Host)'s
//! gates: each model request and tool call claimed in the session store,
//! so that every replica counts against the same use; what the run used,
//! and what no claim wrote yet, for its end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::budget::{self, Exceeded, Gate, Spent, Who, MODEL};
use crate::state::budgets::Budgets;
use crate::state::budgets::Leftover;
use bindery_spec::budget::{Limit, Meter, OnExceed};
use bindery_spec::ModelSpec;
use bindery_store::pending;
use bindery_store::usage::{Claimed, Gauge, Totals, Unwritten, Use};
use bindery_tree::LoadedAgent;

/// One run's budgets.
pub(crate) struct RunBudget {
    budgets: Arc<Budgets>,
    agent: String,
    session: String,
    run: String,
    /// The end user whose session it is (`None`: the owner's).
    subject: Option<String>,
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

impl RunBudget {
    pub(crate) fn new(
        budgets: &Arc<Budgets>,
        agent: &LoadedAgent,
        session: &str,
        subject: Option<&str>,
        run: &pending::WaitingRun,
    ) -> RunBudget {
        RunBudget {
            budgets: budgets.clone(),
            agent: agent.name.clone(),
            session: session.to_string(),
            run: run.id.clone(),
            subject: subject.map(str::to_string),
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
    pub(crate) fn leftover(&self) -> Leftover {
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
    pub(crate) fn spent(&self) -> Totals {
        self.spent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn add(&self, row: &Use) {
        self.spent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(row);
    }

    /// The budgets a person let the run go past, for its next part.
    pub(crate) fn approved(&self) -> Vec<String> {
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
            subject: self.subject.as_deref(),
        }
    }

    fn row(&self, at: i64, model: &str, tool: Option<&str>) -> Use {
        Use {
            at,
            agent: self.agent.clone(),
            session: self.session.clone(),
            run: self.run.clone(),
            subject: self.subject.clone(),
            model: model.to_string(),
            tool: tool.map(str::to_string),
            prompt_tokens: 0,
            completion_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            reasoning_tokens: 0,
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
    pub(crate) async fn before_model(
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
        row.cost = model.price().map_or(0.0, |(p, _)| p.cost(estimate, 0));
        let (gate, before) = self.claim(&gauges, &row).await;
        if let Gate::Go(Some(id)) = gate {
            self.before
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, before);
        }
        gate
    }

    /// Whether the request `claim` goes to a cheaper model (see
    /// [`budget::downgraded`]), by its limits' use before it.
    pub(crate) fn downgrade(&self, claim: i64) -> Option<budget::Downgraded> {
        let before = self.before.lock().unwrap_or_else(|p| p.into_inner());
        budget::downgraded(
            before
                .get(&claim)?
                .iter()
                .filter_map(|(i, used)| Some((self.limits.get(*i)?, *used))),
        )
    }

    pub(crate) async fn after_model(
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
            row.cache_read_tokens = s.cache_read;
            row.cache_write_tokens = s.cache_write;
            row.reasoning_tokens = s.reasoning;
            row.estimated = s.estimated;
            let price = model.price().map(|(p, _)| p);
            row.cost = price.as_ref().map_or(0.0, |p| {
                p.cost_of(&bindery_spec::budget::Tokens {
                    prompt: s.prompt,
                    completion: s.completion,
                    cache_read: s.cache_read,
                    cache_write: s.cache_write,
                    reasoning: s.reasoning,
                })
            });
            let currency = price.as_ref().map_or("", |p| p.currency.as_str());
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

    pub(crate) async fn before_tool(&self, tool: &str) -> Gate {
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

    pub(crate) fn approve(&self, name: &str) {
        let mut approved = self.approved.lock().unwrap_or_else(|p| p.into_inner());
        if !approved.iter().any(|a| a == name) {
            approved.push(name.to_string());
        }
    }
}
