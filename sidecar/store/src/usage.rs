//! What runs use, as the session store keeps it: one row per model request
//! (its tokens and cost) and per tool call, and the questions a budget asks
//! of those rows. Pure: the stores answer with SQL, in one transaction
//! where a budget must not be passed twice (see [`SessionStore::claim`]).
//!
//! [`SessionStore::claim`]: crate::SessionStore::claim

use serde::Serialize;

use bindery_spec::budget::Meter;

/// One model request or tool call of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Use {
    /// Milliseconds since the epoch.
    pub at: i64,
    pub agent: String,
    pub session: String,
    pub run: String,
    /// The end user whose session it is (`None`: the owner's, or a
    /// session made before end users were kept on rows).
    pub subject: Option<String>,
    /// The model a request went to (a tool call's: the run's model).
    pub model: String,
    /// The tool called; `None` for a model request.
    pub tool: Option<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of `prompt_tokens`, those read from and written to the provider's
    /// prompt cache.
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// Of `completion_tokens`, those spent reasoning.
    pub reasoning_tokens: u64,
    /// The model reported no usage: the tokens are estimated.
    pub estimated: bool,
    pub tool_calls: u64,
    /// In the agent's pricing currency (0 without pricing).
    pub cost: f64,
}

impl Use {
    /// What this use counts against a budget of `meter` ([`meter_sql`]
    /// sums the same in the store).
    pub fn amount(&self, meter: Meter) -> f64 {
        match meter {
            Meter::Tokens => (self.prompt_tokens + self.completion_tokens) as f64,
            Meter::ToolCalls => self.tool_calls as f64,
            Meter::Cost => self.cost,
        }
    }
}

/// Use made but not written yet: rows no budget claimed, and what the
/// claimed rows (by id) came to. Written with the next claim, in its
/// transaction, or on their own ([`SessionStore::record`]).
///
/// [`SessionStore::record`]: crate::SessionStore::record
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Unwritten {
    pub rows: Vec<Use>,
    pub settled: Vec<(i64, Use)>,
}

impl Unwritten {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.settled.is_empty()
    }
}

/// Whose use a gauge sums.
#[derive(Clone, Debug, PartialEq)]
pub enum Scope {
    /// Every session of an agent.
    Agent(String),
    Session(String),
    Run(String),
    /// Every session of an agent that belongs to one end user.
    User {
        agent: String,
        subject: String,
    },
}

impl Scope {
    /// The condition on usage rows a scope sums, its placeholders
    /// numbered from 1 with the store's `mark` (`?` in SQLite, `$` in
    /// PostgreSQL), and their values in order.
    pub fn filter(&self, mark: char) -> (String, Vec<&str>) {
        match self {
            Scope::Agent(a) => (format!("agent = {mark}1"), vec![a]),
            Scope::Session(s) => (format!("session = {mark}1"), vec![s]),
            Scope::Run(r) => (format!("run = {mark}1"), vec![r]),
            Scope::User { agent, subject } => (
                format!("agent = {mark}1 AND subject = {mark}2"),
                vec![agent, subject],
            ),
        }
    }
}

/// What the largest of a budget's windows is taken over, for the tenant's
/// status of a budget whose windows are many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakBy {
    Session,
    Run,
    /// Each end user (rows of no end user are left out).
    User,
}

impl PeakBy {
    pub fn column(self) -> &'static str {
        match self {
            PeakBy::Session => "session",
            PeakBy::Run => "run",
            PeakBy::User => "subject",
        }
    }
}

/// The usage rows of agent `1` a peak groups, `2` its start (see
/// [`SessionStore::peak`](crate::SessionStore::peak)), with the store's
/// placeholder `mark`.
pub fn peak_rows(by: PeakBy, mark: char) -> String {
    match by {
        PeakBy::User => format!(
            "WHERE agent = {mark}1 AND subject IS NOT NULL AND at >= {mark}2 GROUP BY subject"
        ),
        PeakBy::Session | PeakBy::Run => format!(
            "WHERE agent = {mark}1 GROUP BY {} HAVING MAX(at) >= {mark}2",
            by.column()
        ),
    }
}

/// One budget's question: how much of `meter` has `scope` used since `since`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gauge {
    pub meter: Meter,
    pub scope: Scope,
    /// Milliseconds since the epoch (0: all of it).
    pub since: i64,
}

/// The SQL sum a meter reads.
pub fn meter_sql(meter: Meter) -> &'static str {
    match meter {
        Meter::Tokens => "prompt_tokens + completion_tokens",
        Meter::ToolCalls => "tool_calls",
        Meter::Cost => "cost",
    }
}

/// A gauge's answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Standing {
    pub used: f64,
    /// When the oldest counted use was (`None`: nothing counted): a
    /// rolling window frees up as it leaves the window.
    pub oldest: Option<i64>,
}

/// What [`SessionStore::claim`](crate::SessionStore::claim) did.
#[derive(Clone, Debug, PartialEq)]
pub enum Claimed {
    /// Every limit had room: the use is recorded (as claimed, until
    /// settled). `used`: each limit's use before it.
    Granted { id: i64, used: Vec<f64> },
    /// Limit `index` is used up; nothing was recorded.
    Exhausted { index: usize, standing: Standing },
}

/// How a usage report is grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    Agent,
    Session,
    Tool,
    Model,
    /// The end user (model requests and tool calls of sessions no end
    /// user has: a `null` key).
    User,
}

impl Group {
    /// The column; a tool report's model requests have none.
    pub fn column(self) -> &'static str {
        match self {
            Group::Agent => "agent",
            Group::Session => "session",
            Group::Tool => "tool",
            Group::Model => "model",
            Group::User => "subject",
        }
    }

    /// The group as `group_by` and the CSV's first column name it.
    pub fn name(self) -> &'static str {
        match self {
            Group::User => "user",
            other => other.column(),
        }
    }
}

/// Sums of use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Totals {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Of `total_tokens`, those estimated because the model reported none.
    pub estimated_tokens: u64,
    pub model_requests: u64,
    pub tool_calls: u64,
    pub cost: f64,
    /// Of `prompt_tokens`, those read from the providers' prompt caches.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Of `prompt_tokens`, those written to the providers' prompt caches.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Of `completion_tokens`, those the models spent reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Totals {
    /// `row` added, as the store's sums add it.
    pub fn add(&mut self, row: &Use) {
        let tokens = row.prompt_tokens + row.completion_tokens;
        self.prompt_tokens += row.prompt_tokens;
        self.completion_tokens += row.completion_tokens;
        self.total_tokens += tokens;
        if row.estimated {
            self.estimated_tokens += tokens;
        }
        self.model_requests += u64::from(row.tool.is_none());
        self.tool_calls += row.tool_calls;
        self.cost += row.cost;
        self.cache_read_tokens += row.cache_read_tokens;
        self.cache_write_tokens += row.cache_write_tokens;
        self.reasoning_tokens += row.reasoning_tokens;
    }
}

/// A session's use, as its view shows it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SessionUsage {
    #[serde(flatten)]
    pub totals: Totals,
    /// The currency of `cost` (null: the agent's model has no price).
    pub currency: Option<String>,
}

/// A token count a model did not report: about four characters a token,
/// the rule of thumb for English text with OpenAI's tokenizers.
pub fn estimate_tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

/// One report row: the group's key (`None`: model requests in a report by
/// tool) and its sums.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReportRow {
    pub key: Option<String>,
    #[serde(flatten)]
    pub totals: Totals,
}

/// The report as CSV, `group` the first column's name.
pub fn report_csv(group: Group, rows: &[ReportRow], currency: &str) -> String {
    let mut out = format!(
        "{},prompt_tokens,completion_tokens,total_tokens,estimated_tokens,model_requests,tool_calls,cost,currency,cache_read_tokens,cache_write_tokens,reasoning_tokens\n",
        group.name()
    );
    for r in rows {
        let t = &r.totals;
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{}\n",
            csv_field(r.key.as_deref().unwrap_or("")),
            t.prompt_tokens,
            t.completion_tokens,
            t.total_tokens,
            t.estimated_tokens,
            t.model_requests,
            t.tool_calls,
            t.cost,
            csv_field(currency),
            t.cache_read_tokens,
            t.cache_write_tokens,
            t.reasoning_tokens,
        ));
    }
    out
}

/// A field quoted when it must be (RFC 4180), and defused when a
/// spreadsheet would read it as a formula. A spreadsheet may split on `,`,
/// `;` (the separator in many locales) or a tab: a field holding any of
/// them is quoted, so no part of it starts a cell of its own (where
/// `;=cmd|…` would be a formula).
fn csv_field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', ';', '\t', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_and_defuses_what_it_must() {
        let rows = vec![
            ReportRow {
                key: Some("a,\"b\"".into()),
                totals: Totals {
                    prompt_tokens: 3,
                    completion_tokens: 2,
                    total_tokens: 5,
                    model_requests: 1,
                    cost: 0.5,
                    ..Totals::default()
                },
            },
            ReportRow {
                key: Some("=HYPERLINK(1)".into()),
                totals: Totals::default(),
            },
            ReportRow {
                key: None,
                totals: Totals::default(),
            },
            ReportRow {
                key: Some("x;=cmd|' /C calc'!A0\t+1".into()),
                totals: Totals::default(),
            },
        ];
        let csv = report_csv(Group::Session, &rows, "USD");
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "session,prompt_tokens,completion_tokens,total_tokens,estimated_tokens,model_requests,tool_calls,cost,currency,cache_read_tokens,cache_write_tokens,reasoning_tokens");
        assert_eq!(lines[1], "\"a,\"\"b\"\"\",3,2,5,0,1,0,0.5,USD,0,0,0");
        assert_eq!(lines[2], "'=HYPERLINK(1),0,0,0,0,0,0,0,USD,0,0,0");
        assert_eq!(lines[3], ",0,0,0,0,0,0,0,USD,0,0,0");
        assert_eq!(
            lines[4],
            "\"x;=cmd|' /C calc'!A0\t+1\",0,0,0,0,0,0,0,USD,0,0,0"
        );
    }

    #[test]
    fn a_row_adds_to_the_totals_and_counts_by_meter() {
        let mut request = Use {
            at: 1,
            agent: "a".into(),
            session: "s".into(),
            run: "r".into(),
            subject: None,
            model: "m".into(),
            tool: None,
            prompt_tokens: 30,
            completion_tokens: 10,
            cache_read_tokens: 20,
            cache_write_tokens: 5,
            reasoning_tokens: 4,
            estimated: true,
            tool_calls: 0,
            cost: 0.5,
        };
        let call = Use {
            tool: Some("bash_x".into()),
            prompt_tokens: 0,
            completion_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            reasoning_tokens: 0,
            estimated: false,
            tool_calls: 1,
            cost: 0.0,
            ..request.clone()
        };
        let mut t = Totals::default();
        t.add(&request);
        t.add(&call);
        assert_eq!(
            t,
            Totals {
                prompt_tokens: 30,
                completion_tokens: 10,
                total_tokens: 40,
                estimated_tokens: 40,
                model_requests: 1,
                tool_calls: 1,
                cost: 0.5,
                cache_read_tokens: 20,
                cache_write_tokens: 5,
                reasoning_tokens: 4,
            }
        );
        assert_eq!(request.amount(Meter::Tokens), 40.0);
        assert_eq!(call.amount(Meter::ToolCalls), 1.0);
        request.cost = 0.25;
        assert_eq!(request.amount(Meter::Cost), 0.25);
    }

    #[test]
    fn estimates_round_up() {
        assert_eq!(estimate_tokens(0), 0);
        assert_eq!(estimate_tokens(1), 1);
        assert_eq!(estimate_tokens(8), 2);
        assert_eq!(estimate_tokens(9), 3);
    }
}
