//! Budgets: caps on what an agent's runs may use (tokens, tool calls,
//! cost) over a window, and what happens when one is used up. The types
//! are the file format and the CRD schema; [`Budget::limit`] and
//! [`Per::parse`] turn them into what the server measures.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::diagnostic::Diagnostic;

/// One cap. Exactly one of `tokens`, `toolCalls` and `cost` is set.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.tokens) ? 1 : 0) + (has(self.toolCalls) ? 1 : 0) + (has(self.cost) ? 1 : 0) == 1",
    "message": "a budget caps exactly one of tokens, toolCalls and cost"
}, {
    "rule": "!has(self.perUser) || !self.perUser || (self.per != 'session' && self.per != 'run')",
    "message": "perUser needs a rolling per (1h, 24h, 30d), not session or run"
}]))]
pub struct Budget {
    /// Unique among the agent's budgets; a tenant's budget of the same
    /// name replaces it.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Prompt plus completion tokens, as the model reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Tool calls (every tool; a helper agent's prompt counts as one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u64>,
    /// Money, in `spec.model.pricing`'s currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub cost: Option<f64>,
    /// The window use is counted over: a rolling duration (`1h`, `24h`,
    /// `30d`), or `session` or `run`.
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == 'session' || self == 'run' || self.matches('^[0-9]+[smhd]$')",
        "message": "per is a duration (1h, 24h, 30d), `session` or `run`"
    }]))]
    pub per: String,
    /// What a run that reaches the cap gets: `refuse` (the default) or
    /// `confirm` (it waits for a person, who may let it go on).
    #[serde(default)]
    pub on_exceed: OnExceed,
    /// Once this budget is used past `at` percent, the agent's model
    /// requests go to its model fallback named `to` (a cheaper one)
    /// instead of the model, until the window frees up: a `tokens` or
    /// `cost` budget only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downgrade: Option<Downgrade>,
    /// Count each end user apart: a rolling window then sums only that
    /// user's sessions of the agent (each user has their own), and
    /// sessions of no end user (the owner's) are not counted. Not with
    /// `per: session` or `run`, already one session's or run's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_user: bool,
}

/// A switch to a cheaper model as a budget nears its cap.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Downgrade {
    /// The percent of the budget's limit past which requests switch.
    #[schemars(range(min = 1, max = 99))]
    pub at: u8,
    /// The name of one of `spec.model.fallbacks`.
    #[schemars(length(min = 1, max = 256))]
    pub to: String,
}

/// What happens at a used-up budget.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub enum OnExceed {
    /// Nothing more starts: a message is answered 429, a run stops, a tool
    /// call is answered with why it did not run.
    #[default]
    Refuse,
    /// The run waits with a pending item of disposition `budget`; an
    /// approval lets this run go on to its end.
    Confirm,
}

/// What a budget's model is priced at, per million tokens.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pricing {
    #[schemars(range(min = 0.0))]
    pub input_per_million: f64,
    #[schemars(range(min = 0.0))]
    pub output_per_million: f64,
    /// Per million prompt tokens read from the provider's prompt cache
    /// (Anthropic's cache reads, OpenAI's cached input); the input price
    /// when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub cache_read_per_million: Option<f64>,
    /// Per million prompt tokens written to the provider's prompt cache
    /// (Anthropic's cache writes); the input price when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub cache_write_per_million: Option<f64>,
    /// Per million reply tokens spent reasoning, where a provider bills
    /// them apart; the output price when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub reasoning_per_million: Option<f64>,
    /// A label for reports (`USD`); Bindery converts nothing.
    #[serde(default = "default_currency")]
    #[schemars(length(max = 8))]
    pub currency: String,
}

fn default_currency() -> String {
    "USD".to_string()
}

/// One request's tokens as its reply reported them: the prompt's, of them
/// those read from and written to the prompt cache, the reply's, and of
/// them those spent reasoning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub prompt: u64,
    pub completion: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub reasoning: u64,
}

impl Pricing {
    /// What `prompt` and `completion` tokens cost.
    pub fn cost(&self, prompt: u64, completion: u64) -> f64 {
        self.cost_of(&Tokens {
            prompt,
            completion,
            ..Tokens::default()
        })
    }

    /// What a request costs, each kind of token at its own price: the
    /// cache's reads and writes out of the prompt's, the reasoning out of
    /// the reply's (a count past its whole is cut to it).
    pub fn cost_of(&self, t: &Tokens) -> f64 {
        let cached = t.cache_read.saturating_add(t.cache_write).min(t.prompt);
        let read = t.cache_read.min(cached) as f64;
        let write = (cached as f64) - read;
        let reasoning = t.reasoning.min(t.completion);
        ((t.prompt - cached) as f64 * self.input_per_million
            + read
                * self
                    .cache_read_per_million
                    .unwrap_or(self.input_per_million)
            + write
                * self
                    .cache_write_per_million
                    .unwrap_or(self.input_per_million)
            + (t.completion - reasoning) as f64 * self.output_per_million
            + reasoning as f64
                * self
                    .reasoning_per_million
                    .unwrap_or(self.output_per_million))
            / 1_000_000.0
    }
}

/// What a budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Meter {
    Tokens,
    ToolCalls,
    Cost,
}

impl Meter {
    pub fn as_str(self) -> &'static str {
        match self {
            Meter::Tokens => "tokens",
            Meter::ToolCalls => "tool_calls",
            Meter::Cost => "cost",
        }
    }
}

/// A budget's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Per {
    /// The last this many milliseconds.
    Rolling(i64),
    Session,
    Run,
}

impl Per {
    pub fn parse(s: &str) -> Option<Per> {
        match s {
            "session" => Some(Per::Session),
            "run" => Some(Per::Run),
            _ => super::parse_ttl(s)
                .and_then(|secs| i64::try_from(secs).ok()?.checked_mul(1000))
                .map(Per::Rolling),
        }
    }
}

/// A budget as the server measures it.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub name: String,
    pub meter: Meter,
    pub limit: f64,
    pub per: Per,
    /// `per` as written (`24h`), for messages and reports.
    pub per_text: String,
    pub on_exceed: OnExceed,
    pub downgrade: Option<Downgrade>,
    /// Each end user's use counts apart (a rolling window only).
    pub per_user: bool,
}

impl Budget {
    /// What it caps and how much (`None` when not exactly one is set).
    pub fn meter(&self) -> Option<(Meter, f64)> {
        match (self.tokens, self.tool_calls, self.cost) {
            (Some(t), None, None) => Some((Meter::Tokens, t as f64)),
            (None, Some(c), None) => Some((Meter::ToolCalls, c as f64)),
            (None, None, Some(c)) => Some((Meter::Cost, c)),
            _ => None,
        }
    }

    /// The budget as measured; `None` for one `check` refuses.
    pub fn limit(&self) -> Option<Limit> {
        let (meter, limit) = self.meter()?;
        Some(Limit {
            name: self.name.clone(),
            meter,
            limit,
            per: Per::parse(&self.per)?,
            per_text: self.per.clone(),
            on_exceed: self.on_exceed,
            downgrade: self.downgrade.clone(),
            per_user: self.per_user,
        })
    }
}

/// A status string that `kubectl describe` prints as it is: no control
/// character (Unicode's Cc: C0, DEL, C1), so none ends a line or drives the
/// terminal (an OSC-8 link, a cursor move). The API server refuses one
/// whoever writes it: the tenant's pods write the budget rows with a token
/// of their own, and their code is not trusted.
pub const NO_CONTROL_CHARACTERS: &str = r"^[^\x00-\x1f\x7f-\x9f]*$";

/// One budget's use in its current window, as `AgentTenant.status.budgets`
/// shows it (the server that enforces it writes it).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    #[schemars(length(max = 253), regex(pattern = NO_CONTROL_CHARACTERS))]
    pub name: String,
    /// The agent whose runs it caps.
    #[schemars(length(max = 253), regex(pattern = NO_CONTROL_CHARACTERS))]
    pub agent: String,
    /// `tokens`, `tool_calls` or `cost`.
    #[schemars(length(max = 64), regex(pattern = NO_CONTROL_CHARACTERS))]
    pub meter: String,
    pub used: f64,
    pub limit: f64,
    /// The window, as written (`24h`, `session`, `run`). A `session` or
    /// `run` budget shows the most any one session or run has used.
    #[schemars(length(max = 64), regex(pattern = NO_CONTROL_CHARACTERS))]
    pub per: String,
    pub on_exceed: OnExceed,
    /// `used` has reached `limit`: nothing more starts against it.
    pub exhausted: bool,
    /// When it was measured (RFC 3339).
    #[schemars(length(max = 64), regex(pattern = NO_CONTROL_CHARACTERS))]
    pub measured_at: String,
}

impl BudgetStatus {
    /// `daily-tokens (agent invoices): 1200 of 200000 tokens per 24h, 1%`.
    pub fn summary(&self) -> String {
        let pct = if self.limit > 0.0 {
            (self.used / self.limit * 100.0).floor()
        } else {
            100.0
        };
        let amount = |x: f64| match self.meter.as_str() {
            "cost" => format!("{x:.2}"),
            _ => format!("{x:.0}"),
        };
        format!(
            "{} (agent {}): {} of {} {} per {}, {pct}%{}",
            self.name,
            self.agent,
            amount(self.used),
            amount(self.limit),
            self.meter.replace('_', " "),
            self.per,
            if self.exhausted { ", exhausted" } else { "" }
        )
    }
}

/// `budgets` with each of `overrides` replacing the one of its name, or
/// added after them: a tenant's budgets over its agent's.
pub fn overlay(budgets: &[Budget], overrides: &[Budget]) -> Vec<Budget> {
    let mut out: Vec<Budget> = budgets
        .iter()
        .map(|b| {
            overrides
                .iter()
                .find(|o| o.name == b.name)
                .unwrap_or(b)
                .clone()
        })
        .collect();
    out.extend(
        overrides
            .iter()
            .filter(|o| !budgets.iter().any(|b| b.name == o.name))
            .cloned(),
    );
    out
}

/// The checks of an agent's budgets: names unique, one cap each, a window
/// that parses, and pricing for a cost budget.
pub fn check(
    budgets: &[Budget],
    pricing: Option<&Pricing>,
    here: &str,
    diags: &mut Vec<Diagnostic>,
) {
    let mut seen = std::collections::BTreeSet::new();
    for b in budgets {
        let place = format!("{here}, budget `{}`", b.name);
        if b.name.is_empty() || b.name.len() > 63 {
            diags.push(Diagnostic::error(format!(
                "{here}: a budget's name is 1 to 63 characters"
            )));
        }
        if !seen.insert(b.name.as_str()) {
            diags.push(Diagnostic::error(format!(
                "{place} is declared twice; give each budget its own name"
            )));
        }
        match b.meter() {
            None => diags.push(Diagnostic::error(format!(
                "{place}: set exactly one of `tokens`, `toolCalls` and `cost`"
            ))),
            Some((Meter::Cost, c)) if !c.is_finite() || c < 0.0 => diags.push(Diagnostic::error(
                format!("{place}: `cost` is a number of at least 0"),
            )),
            Some((Meter::Cost, _)) if pricing.is_none() => diags.push(Diagnostic::error(format!(
                "{place} caps cost, so the model needs a price, and Bindery's price table does not \
                 know it: add `spec.model.pricing` with `inputPerMillion` and `outputPerMillion`"
            ))),
            Some(_) => {}
        }
        match Per::parse(&b.per) {
            None => diags.push(Diagnostic::error(format!(
                "{place}: `per` is a duration such as `1h`, `24h` or `30d`, or `session` or `run`; got `{}`",
                b.per
            ))),
            Some(Per::Session | Per::Run) if b.per_user => diags.push(Diagnostic::error(format!(
                "{place}: `perUser: true` needs a rolling `per` (`1h`, `24h`, `30d`): a `{}` \
                 window is already one {}'s, which belongs to one user; remove `perUser` or give \
                 `per` a duration",
                b.per, b.per
            ))),
            Some(_) => {}
        }
    }
    if let Some(p) = pricing {
        check_pricing(p, &format!("{here}, model pricing"), diags);
    }
}

/// Every price of `p` is a finite number of at least 0: a negative one
/// (a cache price too) would make use earn budget back.
/// The highest price per million tokens taken: far past any model's.
pub const MAX_PRICE: f64 = 1_000_000_000.0;

pub fn check_pricing(p: &Pricing, place: &str, diags: &mut Vec<Diagnostic>) {
    // A bound far past any model's price, so that no cost can be
    // infinite (2^32 tokens at it stay finite).
    let bad = |x: f64| !x.is_finite() || !(0.0..=MAX_PRICE).contains(&x);
    let prices = [
        Some(p.input_per_million),
        Some(p.output_per_million),
        p.cache_read_per_million,
        p.cache_write_per_million,
        p.reasoning_per_million,
    ];
    if prices.into_iter().flatten().any(bad) {
        diags.push(Diagnostic::error(format!(
            "{place}: prices (inputPerMillion, outputPerMillion, cacheReadPerMillion, cacheWritePerMillion, reasoningPerMillion) are numbers from 0 to 1000000000"
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(yaml: &str) -> Budget {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn windows_parse_and_bad_ones_do_not() {
        assert_eq!(Per::parse("24h"), Some(Per::Rolling(86_400_000)));
        assert_eq!(Per::parse("30d"), Some(Per::Rolling(2_592_000_000)));
        assert_eq!(Per::parse("session"), Some(Per::Session));
        assert_eq!(Per::parse("run"), Some(Per::Run));
        for bad in ["", "0h", "24", "h", "1w", "Session", "-1h"] {
            assert_eq!(Per::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_tenant_budget_replaces_its_namesake_and_adds_the_rest() {
        let agent = vec![
            budget("{name: daily, tokens: 100, per: 24h}"),
            budget("{name: calls, toolCalls: 5, per: session}"),
        ];
        let tenant = vec![
            budget("{name: daily, tokens: 10, per: 1h, onExceed: confirm}"),
            budget("{name: spend, cost: 2.5, per: 30d}"),
        ];
        let names: Vec<_> = overlay(&agent, &tenant)
            .into_iter()
            .map(|b| (b.name, b.tokens, b.on_exceed))
            .collect();
        assert_eq!(
            names,
            vec![
                ("daily".into(), Some(10), OnExceed::Confirm),
                ("calls".into(), None, OnExceed::Refuse),
                ("spend".into(), None, OnExceed::Refuse),
            ]
        );
    }

    #[test]
    fn check_names_each_mistake_and_where() {
        let budgets = vec![
            budget("{name: a, tokens: 1, per: 1h}"),
            budget("{name: a, tokens: 1, per: 1h}"),
            budget("{name: b, tokens: 1, toolCalls: 2, per: run}"),
            budget("{name: c, cost: 1.0, per: 1w}"),
        ];
        let mut diags = Vec::new();
        check(&budgets, None, "agent.yaml", &mut diags);
        let text: Vec<String> = diags.iter().map(|d| d.message.clone()).collect();
        let has = |s: &str| text.iter().any(|t| t.contains(s));
        assert!(has("budget `a` is declared twice"), "{text:#?}");
        assert!(has("budget `b`: set exactly one of"), "{text:#?}");
        assert!(
            has("budget `c` caps cost, so the model needs a price"),
            "{text:#?}"
        );
        assert!(has("budget `c`: `per` is a duration"), "{text:#?}");
        let mut ok = Vec::new();
        let pricing = Pricing {
            input_per_million: 0.15,
            output_per_million: 0.6,
            cache_read_per_million: None,
            cache_write_per_million: None,
            reasoning_per_million: None,
            currency: "USD".into(),
        };
        check(
            &[budget("{name: c, cost: 1.0, per: 30d}")],
            Some(&pricing),
            "x",
            &mut ok,
        );
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn a_per_user_budget_needs_a_rolling_window_and_keeps_its_flag() {
        let mut diags = Vec::new();
        let budgets = vec![
            budget("{name: daily, tokens: 100, per: 24h, perUser: true}"),
            budget("{name: sess, tokens: 100, per: session, perUser: true}"),
            budget("{name: runs, toolCalls: 3, per: run, perUser: true}"),
            budget("{name: plain, tokens: 100, per: session}"),
        ];
        check(&budgets, None, "agent.yaml", &mut diags);
        let texts: Vec<_> = diags.iter().map(|d| d.to_string()).collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(
            texts[0].contains("budget `sess`: `perUser: true` needs a rolling `per`")
                && texts[0].contains("remove `perUser` or give `per` a duration"),
            "{texts:?}"
        );
        assert!(texts[1].contains("budget `runs`"), "{texts:?}");
        assert!(budgets[0].limit().unwrap().per_user);
        assert!(!budgets[3].limit().unwrap().per_user);
        // Written back only when set.
        let yaml = serde_yaml::to_string(&budgets[3]).unwrap();
        assert!(!yaml.contains("perUser"), "{yaml}");
        assert!(serde_yaml::to_string(&budgets[0])
            .unwrap()
            .contains("perUser: true"));
    }

    #[test]
    fn cached_prompt_tokens_cost_their_own_prices() {
        let p = Pricing {
            input_per_million: 3.0,
            output_per_million: 15.0,
            cache_read_per_million: Some(0.3),
            cache_write_per_million: Some(3.75),
            reasoning_per_million: None,
            currency: "USD".into(),
        };
        let cached = |prompt, completion, cache_read, cache_write| Tokens {
            prompt,
            completion,
            cache_read,
            cache_write,
            reasoning: 0,
        };
        // 1M prompt tokens of which 600k read and 100k written, 1M out.
        let c = p.cost_of(&cached(1_000_000, 1_000_000, 600_000, 100_000));
        assert!(
            (c - (0.3 * 3.0 + 0.6 * 0.3 + 0.1 * 3.75 + 15.0)).abs() < 1e-9,
            "{c}"
        );
        // Unpriced caches cost the input price; counts past the prompt's are cut to it.
        let plain = Pricing {
            cache_read_per_million: None,
            cache_write_per_million: None,
            ..p.clone()
        };
        assert!((plain.cost_of(&cached(1000, 0, 600, 100)) - plain.cost(1000, 0)).abs() < 1e-12);
        assert!(p.cost_of(&cached(10, 0, 50, 50)).is_finite());
        assert!((p.cost_of(&cached(10, 0, 50, 50)) - 10.0 * 0.3 / 1e6).abs() < 1e-12);
    }

    #[test]
    fn reasoning_tokens_cost_their_price_or_the_outputs() {
        let p = Pricing {
            input_per_million: 1.0,
            output_per_million: 4.0,
            cache_read_per_million: None,
            cache_write_per_million: None,
            reasoning_per_million: Some(10.0),
            currency: "USD".into(),
        };
        let t = Tokens {
            completion: 1_000_000,
            reasoning: 250_000,
            ..Tokens::default()
        };
        assert!((p.cost_of(&t) - (0.75 * 4.0 + 0.25 * 10.0)).abs() < 1e-9);
        let billed_as_output = Pricing {
            reasoning_per_million: None,
            ..p.clone()
        };
        assert!((billed_as_output.cost_of(&t) - 4.0).abs() < 1e-9);
        // More reasoning than the reply is cut to the reply.
        let over = Tokens {
            completion: 10,
            reasoning: 1000,
            ..Tokens::default()
        };
        assert!((p.cost_of(&over) - 10.0 * 10.0 / 1e6).abs() < 1e-12);
    }

    #[test]
    fn every_price_a_cache_price_too_is_at_least_zero() {
        let base = Pricing {
            input_per_million: 1.0,
            output_per_million: 1.0,
            cache_read_per_million: None,
            cache_write_per_million: None,
            reasoning_per_million: None,
            currency: "USD".into(),
        };
        let said = |p: Pricing| {
            let mut d = Vec::new();
            check_pricing(&p, "here", &mut d);
            d.len()
        };
        assert_eq!(said(base.clone()), 0);
        for p in [
            Pricing {
                cache_read_per_million: Some(-100.0),
                ..base.clone()
            },
            Pricing {
                cache_write_per_million: Some(-1e308),
                ..base.clone()
            },
            Pricing {
                cache_read_per_million: Some(f64::NAN),
                ..base.clone()
            },
            Pricing {
                input_per_million: -1.0,
                ..base.clone()
            },
            // Review 69 (second): a price past any model's makes every
            // cost infinite.
            Pricing {
                output_per_million: 1.797_693_134_862_315_7e308,
                ..base.clone()
            },
            Pricing {
                reasoning_per_million: Some(MAX_PRICE * 2.0),
                ..base.clone()
            },
        ] {
            assert_eq!(said(p), 1);
        }
        assert_eq!(
            said(Pricing {
                input_per_million: MAX_PRICE,
                ..base.clone()
            }),
            0
        );
    }

    #[test]
    fn cost_is_priced_per_million() {
        let p = Pricing {
            input_per_million: 0.15,
            output_per_million: 0.6,
            cache_read_per_million: None,
            cache_write_per_million: None,
            reasoning_per_million: None,
            currency: "USD".into(),
        };
        assert!((p.cost(1_000_000, 1_000_000) - 0.75).abs() < 1e-12);
        assert!((p.cost(2000, 500) - 0.0006).abs() < 1e-12);
    }

    #[test]
    fn a_budget_reads_with_refuse_by_default() {
        let b = budget("{name: x, toolCalls: 50, per: session}");
        let l = b.limit().unwrap();
        assert_eq!(l.meter, Meter::ToolCalls);
        assert_eq!(l.limit, 50.0);
        assert_eq!(l.on_exceed, OnExceed::Refuse);
        assert!(
            serde_yaml::from_str::<Budget>("{name: x, tokens: 1, per: run, extra: 1}").is_err()
        );
    }
}
