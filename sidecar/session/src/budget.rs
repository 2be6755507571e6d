//! Budgets while a run goes on: before each model request and each tool
//! call the run asks its session ([`Host`](crate::run::Host)) whether it may
//! start, and after a model request it says what was used. The questions
//! a budget asks of the store ([`gauges`]), where a use crosses a line
//! ([`crossing`]) and what a used-up one tells the client ([`Exceeded`])
//! are plain functions here, tested without I/O; the server's side
//! (`service/budgets.rs`) asks the store.

use bindery_spec::budget::{Limit, Meter, OnExceed, Per};
use bindery_store::usage::{Gauge, Scope};

/// The meters a model request counts.
pub const MODEL: [Meter; 2] = [Meter::Tokens, Meter::Cost];

/// Whether work may start.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// It may; the claimed row to settle once its use is known, if any.
    Go(Option<i64>),
    /// A `refuse` budget is used up.
    Refuse(Exceeded),
    /// A `confirm` budget is used up: the run waits for a person.
    Ask(Exceeded),
}

pub use bindery_store::wire::Exceeded;

/// A budget past its `downgrade.at`: the request goes to model fallback
/// `to` instead of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Downgraded {
    pub to: String,
    pub budget: String,
    pub used: f64,
    pub limit: f64,
    pub at: u8,
}

/// The first of `limits` (each with its use before a request) past its
/// downgrade's mark, if any.
pub fn downgraded<'a>(before: impl IntoIterator<Item = (&'a Limit, f64)>) -> Option<Downgraded> {
    before.into_iter().find_map(|(limit, used)| {
        let d = limit.downgrade.as_ref()?;
        (limit.limit > 0.0 && used >= limit.limit * f64::from(d.at) / 100.0).then(|| Downgraded {
            to: d.to.clone(),
            budget: limit.name.clone(),
            used,
            limit: limit.limit,
            at: d.at,
        })
    })
}

/// A model request's tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spent {
    /// All of the prompt's tokens, the cached ones included.
    pub prompt: u64,
    pub completion: u64,
    /// Of `prompt`, those read from and written to the provider's cache.
    pub cache_read: u64,
    pub cache_write: u64,
    /// Of `completion`, those spent reasoning.
    pub reasoning: u64,
    /// The model reported no usage.
    pub estimated: bool,
}

/// What a run's limits ask of the store for work that counts `meters`,
/// at `now`: each limit's index with its gauge. Limits a person let the
/// run pass (`approved`) are not asked.
pub fn gauges(
    limits: &[Limit],
    meters: &[Meter],
    approved: &[String],
    who: &Who<'_>,
    now: i64,
) -> Vec<(usize, Gauge)> {
    limits
        .iter()
        .enumerate()
        .filter(|(_, l)| meters.contains(&l.meter))
        .filter(|(_, l)| !(l.on_exceed == OnExceed::Confirm && approved.contains(&l.name)))
        // A per-user budget counts end users' sessions only: the owner's
        // have no user to count against.
        .filter(|(_, l)| !l.per_user || who.subject.is_some())
        .map(|(i, l)| {
            let (scope, since) = match (l.per, who.subject) {
                (Per::Rolling(window), Some(subject)) if l.per_user => (
                    Scope::User {
                        agent: who.agent.to_string(),
                        subject: subject.to_string(),
                    },
                    now - window,
                ),
                (Per::Rolling(window), _) => (Scope::Agent(who.agent.to_string()), now - window),
                (Per::Session, _) => (Scope::Session(who.session.to_string()), 0),
                (Per::Run, _) => (Scope::Run(who.run.to_string()), 0),
            };
            (
                i,
                Gauge {
                    meter: l.meter,
                    scope,
                    since,
                },
            )
        })
        .collect()
}

/// Whose use a run counts against.
#[derive(Clone, Copy, Debug)]
pub struct Who<'a> {
    pub agent: &'a str,
    pub session: &'a str,
    pub run: &'a str,
    /// The end user whose session it is (`None`: the owner's).
    pub subject: Option<&'a str>,
}

/// Where a use crosses: the warning line (80%) or the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crossing {
    Nearly,
    UsedUp,
}

/// The line `before → after` crosses of `limit`, if any.
pub fn crossing(before: f64, after: f64, limit: f64) -> Option<Crossing> {
    if before < limit && after >= limit {
        Some(Crossing::UsedUp)
    } else if before < 0.8 * limit && after >= 0.8 * limit {
        Some(Crossing::Nearly)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_spec::budget::Budget;
    use bindery_store::usage::Standing;

    #[test]
    fn a_budget_past_its_mark_downgrades_and_one_below_does_not() {
        let daily = limit("{name: daily, cost: 10, per: 24h, downgrade: {at: 80, to: cheap}}");
        let plain = limit("{name: plain, tokens: 100, per: 24h}");
        assert_eq!(downgraded([(&plain, 99.0), (&daily, 7.9)]), None);
        let d = downgraded([(&plain, 99.0), (&daily, 8.0)]).unwrap();
        assert_eq!(
            (d.to.as_str(), d.budget.as_str(), d.at),
            ("cheap", "daily", 80)
        );
        assert_eq!((d.used, d.limit), (8.0, 10.0));
    }

    fn limit(yaml: &str) -> Limit {
        serde_yaml::from_str::<Budget>(yaml)
            .unwrap()
            .limit()
            .unwrap()
    }

    const WHO: Who<'static> = Who {
        agent: "a",
        session: "s",
        run: "r",
        subject: None,
    };

    #[test]
    fn each_window_asks_its_own_scope_and_approved_confirms_are_skipped() {
        let limits = vec![
            limit("{name: day, tokens: 10, per: 24h}"),
            limit("{name: sess, tokens: 10, per: session, onExceed: confirm}"),
            limit("{name: calls, toolCalls: 3, per: run}"),
            limit("{name: spend, cost: 1.5, per: 1h}"),
        ];
        let now = 100_000_000;
        let model = gauges(&limits, &[Meter::Tokens, Meter::Cost], &[], &WHO, now);
        let scopes: Vec<_> = model
            .iter()
            .map(|(i, g)| (*i, g.scope.clone(), g.since))
            .collect();
        assert_eq!(
            scopes,
            vec![
                (0, Scope::Agent("a".into()), now - 86_400_000),
                (1, Scope::Session("s".into()), 0),
                (3, Scope::Agent("a".into()), now - 3_600_000),
            ]
        );
        let approved = vec!["sess".to_string(), "day".to_string()];
        let model = gauges(&limits, &[Meter::Tokens], &approved, &WHO, now);
        // A refuse budget cannot be approved past.
        assert_eq!(model.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0]);
        let tools = gauges(&limits, &[Meter::ToolCalls], &[], &WHO, now);
        assert_eq!(tools[0].1.scope, Scope::Run("r".into()));
    }

    #[test]
    fn a_per_user_budget_asks_the_users_window_and_skips_the_owners_sessions() {
        let limits = vec![
            limit("{name: mine, tokens: 10, per: 24h, perUser: true}"),
            limit("{name: all, tokens: 10, per: 1h}"),
        ];
        let now = 100_000_000;
        let alice = Who {
            subject: Some("alice"),
            ..WHO
        };
        let asked: Vec<_> = gauges(&limits, &[Meter::Tokens], &[], &alice, now)
            .into_iter()
            .map(|(i, g)| (i, g.scope, g.since))
            .collect();
        assert_eq!(
            asked,
            vec![
                (
                    0,
                    Scope::User {
                        agent: "a".into(),
                        subject: "alice".into()
                    },
                    now - 86_400_000
                ),
                (1, Scope::Agent("a".into()), now - 3_600_000),
            ]
        );
        let owners = gauges(&limits, &[Meter::Tokens], &[], &WHO, now);
        assert_eq!(owners.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [1]);
        let e = Exceeded::of(
            &limits[0],
            &Standing {
                used: 12.0,
                oldest: None,
            },
            now,
        );
        assert_eq!(
            e.detail(),
            "budget mine is used up for this user (it counts each end user apart): 12 of 10 tokens per 24h"
        );
        assert_eq!(serde_json::Value::Object(e.fields())["per_user"], true);
    }

    #[test]
    fn a_rolling_budget_says_when_it_frees_up_and_the_others_do_not() {
        let day = limit("{name: day, tokens: 100, per: 24h}");
        let standing = Standing {
            used: 120.0,
            oldest: Some(1_000),
        };
        let e = Exceeded::of(&day, &standing, 1_000 + 86_400_000 - 1_500);
        assert_eq!(e.retry_after, Some(2));
        assert_eq!(
            e.detail(),
            "budget day is used up: 120 of 100 tokens per 24h; it frees up in 2 s"
        );
        let body = serde_json::Value::Object(e.fields());
        assert_eq!(body["budget"], "day");
        assert_eq!(body["limit"], 100.0);
        assert_eq!(body["used"], 120.0);
        let sess = limit("{name: s, toolCalls: 5, per: session}");
        let e = Exceeded::of(&sess, &standing, 0);
        assert_eq!(e.retry_after, None);
        assert!(!serde_json::Value::Object(e.fields())
            .as_object()
            .unwrap()
            .contains_key("retry_after"));
    }

    #[test]
    fn crossings_are_told_once() {
        assert_eq!(crossing(0.0, 79.0, 100.0), None);
        assert_eq!(crossing(70.0, 85.0, 100.0), Some(Crossing::Nearly));
        assert_eq!(crossing(85.0, 90.0, 100.0), None);
        assert_eq!(crossing(70.0, 100.0, 100.0), Some(Crossing::UsedUp));
        assert_eq!(crossing(100.0, 120.0, 100.0), None);
    }

    #[test]
    fn reaching_a_line_exactly_crosses_it_and_the_limit_wins_over_the_warning() {
        assert_eq!(crossing(79.0, 80.0, 100.0), Some(Crossing::Nearly));
        assert_eq!(crossing(80.0, 90.0, 100.0), None, "past it already");
        assert_eq!(crossing(99.0, 100.0, 100.0), Some(Crossing::UsedUp));
        assert_eq!(crossing(0.0, 150.0, 100.0), Some(Crossing::UsedUp));
        assert_eq!(crossing(10.0, 10.0, 100.0), None, "no use, no crossing");
    }

    #[test]
    fn a_rolling_budget_frees_up_in_whole_seconds_and_never_in_none() {
        let hour = limit("{name: h, tokens: 10, per: 1h}");
        let at = |oldest: Option<i64>, now: i64| {
            Exceeded::of(&hour, &Standing { used: 10.0, oldest }, now).retry_after
        };
        assert_eq!(at(Some(0), 3_600_000 - 1_000), Some(1));
        assert_eq!(at(Some(0), 3_600_000 - 1_001), Some(2));
        assert_eq!(
            at(Some(0), 3_600_000),
            Some(1),
            "due now: at least a second"
        );
        assert_eq!(at(Some(0), 3_600_000 + 5_000), Some(1));
        assert_eq!(at(None, 0), None, "nothing counted, nothing leaves");
        let run = limit("{name: r, tokens: 10, per: run}");
        let e = Exceeded::of(
            &run,
            &Standing {
                used: 10.0,
                oldest: Some(0),
            },
            1,
        );
        assert_eq!(e.retry_after, None);
    }

    #[test]
    fn a_used_up_budget_states_its_amounts_as_its_meter_counts_them() {
        let standing = |used| Standing { used, oldest: None };
        let spend = limit("{name: spend, cost: 1.5, per: session}");
        assert_eq!(
            Exceeded::of(&spend, &standing(1.61234), 0).detail(),
            "budget spend is used up: 1.6123 of 1.5000 cost per session"
        );
        let calls = limit("{name: calls, toolCalls: 3, per: run}");
        assert_eq!(
            Exceeded::of(&calls, &standing(3.0), 0).detail(),
            "budget calls is used up: 3 of 3 tool calls per run"
        );
    }

    #[test]
    fn work_no_limit_counts_asks_the_store_nothing() {
        let tokens = vec![limit("{name: day, tokens: 10, per: 24h}")];
        assert!(gauges(&tokens, &[Meter::ToolCalls], &[], &WHO, 0).is_empty());
        assert!(gauges(&tokens, &[], &[], &WHO, 0).is_empty());
        assert!(gauges(&[], &[Meter::Tokens], &[], &WHO, 0).is_empty());
    }
}
