//! Rate limits: so many requests, or calls of a tool, per minute. Each is a
//! token bucket per key (the server, an end user, a tool): it holds up to
//! the limit, so a burst of that many passes at once, and refills at the
//! limit per minute, one every `60 / limit` seconds. Kept in this server's
//! memory: with several replicas each counts what it serves. Pure but for
//! the lock: the caller says what time it is.

use std::collections::HashMap;
use std::sync::Mutex;

use bindery_bindings::glob_matches;

/// Past this many keys, the buckets that are full again (their key idle
/// long enough) are forgotten: a full bucket is what a new key gets.
const PRUNE_AT: usize = 10_000;

/// One limit: `per_minute` per key.
#[derive(Debug)]
pub struct Limiter {
    per_minute: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    /// When `tokens` was counted, milliseconds since the epoch.
    at: i64,
}

impl Limiter {
    /// `per_minute` is at least 1 (a flag of 0 is refused at load).
    pub fn new(per_minute: u32) -> Limiter {
        Limiter {
            per_minute: per_minute.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    fn capacity(&self) -> f64 {
        f64::from(self.per_minute)
    }

    /// Tokens per millisecond.
    fn rate(&self) -> f64 {
        f64::from(self.per_minute) / 60_000.0
    }

    fn refilled(&self, b: Bucket, now: i64) -> f64 {
        let elapsed = (now - b.at).max(0) as f64;
        (b.tokens + elapsed * self.rate()).min(self.capacity())
    }

    /// Take one for `key` at `now` (milliseconds): `Err` with the whole
    /// seconds (at least 1) until one is back when none is left.
    pub fn take(&self, key: &str, now: i64) -> Result<(), u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= PRUNE_AT && !buckets.contains_key(key) {
            buckets.retain(|_, b| self.refilled(*b, now) < self.capacity());
        }
        let b = buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: self.capacity(),
            at: now,
        });
        let tokens = self.refilled(*b, now);
        b.at = now.max(b.at);
        if tokens >= 1.0 {
            b.tokens = tokens - 1.0;
            Ok(())
        } else {
            b.tokens = tokens;
            let ms = (1.0 - tokens) / self.rate();
            Err(((ms / 1000.0).ceil() as u64).max(1))
        }
    }
}

/// A limit on the calls of the tools a glob names, as `--tool-rate-limit`
/// and `AgentTenant.spec.rateLimits.tools` give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolRate {
    /// A glob over tool names (`openapi_billing_*`).
    pub tool: String,
    pub calls_per_minute: u32,
    /// Each end user has their own bucket (calls in sessions of no end
    /// user share one).
    pub per_user: bool,
}

/// Why a `--tool-rate-limit` does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadToolRate {
    #[error("`{0}` is not a tool rate limit: write TOOL=CALLS (calls per minute), or TOOL=CALLS/user to count each end user apart, e.g. `openapi_billing_*=10/user`")]
    Form(String),
    #[error("`{0}`: the calls per minute are a whole number from 1 up")]
    Calls(String),
}

impl std::str::FromStr for ToolRate {
    type Err = BadToolRate;

    fn from_str(s: &str) -> Result<ToolRate, BadToolRate> {
        let (tool, rest) = s
            .split_once('=')
            .filter(|(t, _)| !t.trim().is_empty())
            .ok_or_else(|| BadToolRate::Form(s.to_string()))?;
        let (calls, per_user) = match rest.split_once('/') {
            Some((calls, "user")) => (calls, true),
            Some(_) => return Err(BadToolRate::Form(s.to_string())),
            None => (rest, false),
        };
        let calls_per_minute = calls
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| BadToolRate::Calls(s.to_string()))?;
        Ok(ToolRate {
            tool: tool.trim().to_string(),
            calls_per_minute,
            per_user,
        })
    }
}

impl std::fmt::Display for ToolRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.tool, self.calls_per_minute)?;
        if self.per_user {
            f.write_str("/user")?;
        }
        Ok(())
    }
}

/// A call a tool's rate limit refused: what the model is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolLimited {
    pub limit: ToolRate,
    pub retry_after: u64,
}

impl ToolLimited {
    /// `tool openapi_billing_x is rate limited (10 calls per minute of
    /// openapi_billing_*, for each user): this call did not run; …`.
    pub fn detail(&self, tool: &str) -> String {
        format!(
            "tool {tool} is rate limited ({} calls per minute of `{}`{}), so this call did not run; \
             a call may go through again in {} s",
            self.limit.calls_per_minute,
            self.limit.tool,
            if self.limit.per_user {
                ", for each user"
            } else {
                ""
            },
            self.retry_after
        )
    }
}

/// The server's tool rate limits, each with its buckets.
#[derive(Debug, Default)]
pub struct ToolRates {
    rules: Vec<(ToolRate, Limiter)>,
}

impl ToolRates {
    pub fn new(rates: &[ToolRate]) -> ToolRates {
        ToolRates {
            rules: rates
                .iter()
                .map(|r| (r.clone(), Limiter::new(r.calls_per_minute)))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Take a call of `tool` by end user `subject` (`None`: the owner's
    /// session) at `now` from every limit whose glob matches it: the
    /// first with none left refuses it. A limit passed before the one that
    /// refuses keeps the call taken (a refused call is rare; the limits'
    /// order is the operator's).
    pub fn take(&self, tool: &str, subject: Option<&str>, now: i64) -> Result<(), ToolLimited> {
        for (rate, limiter) in &self.rules {
            if !glob_matches(&rate.tool, tool) {
                continue;
            }
            // The bucket is the glob's, not the tool's: `openapi_billing_*`
            // limits the calls of all those tools together.
            let key = match (rate.per_user, subject) {
                (true, Some(s)) => format!("u:{s}"),
                (true, None) => "owner".to_string(),
                (false, _) => String::new(),
            };
            limiter.take(&key, now).map_err(|retry_after| ToolLimited {
                limit: rate.clone(),
                retry_after,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_passes_its_burst_then_one_as_each_refills() {
        let l = Limiter::new(2);
        assert_eq!(l.take("k", 0), Ok(()));
        assert_eq!(l.take("k", 0), Ok(()));
        assert_eq!(l.take("k", 0), Err(30), "one back every 30 s");
        assert_eq!(l.take("other", 0), Ok(()), "each key its own");
        assert_eq!(l.take("k", 29_000), Err(1));
        assert_eq!(l.take("k", 30_000), Ok(()));
        assert_eq!(l.take("k", 30_000), Err(30));
        // Idle long enough, it is full again, never more.
        assert_eq!(l.take("k", 10_000_000), Ok(()));
        assert_eq!(l.take("k", 10_000_000), Ok(()));
        assert!(l.take("k", 10_000_000).is_err());
    }

    #[test]
    fn a_clock_that_goes_back_refills_nothing() {
        let l = Limiter::new(1);
        assert_eq!(l.take("k", 60_000), Ok(()));
        assert!(l.take("k", 0).is_err());
        assert!(l.take("k", 60_000).is_err());
        assert_eq!(l.take("k", 120_000), Ok(()));
    }

    #[test]
    fn idle_keys_are_forgotten_past_the_prune_mark() {
        let l = Limiter::new(60);
        for i in 0..PRUNE_AT {
            l.take(&i.to_string(), 0).unwrap();
        }
        // A second later each bucket is full again: all go.
        l.take("new", 1_000).unwrap();
        assert_eq!(l.buckets.lock().unwrap().len(), 1);
    }

    #[test]
    fn tool_limits_read_as_written_and_bad_ones_say_how() {
        let r: ToolRate = "openapi_billing_*=10/user".parse().unwrap();
        assert_eq!(
            r,
            ToolRate {
                tool: "openapi_billing_*".into(),
                calls_per_minute: 10,
                per_user: true
            }
        );
        assert_eq!(r.to_string(), "openapi_billing_*=10/user");
        assert!(!"bash_x=3".parse::<ToolRate>().unwrap().per_user);
        for bad in ["bash_x", "=3", "bash_x=3/team"] {
            assert_eq!(
                bad.parse::<ToolRate>(),
                Err(BadToolRate::Form(bad.into())),
                "{bad}"
            );
        }
        for bad in ["bash_x=0", "bash_x=-1", "bash_x=ten/user"] {
            assert_eq!(
                bad.parse::<ToolRate>(),
                Err(BadToolRate::Calls(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_tool_limit_counts_its_globs_tools_together_and_users_apart() {
        let rates = ToolRates::new(&[
            "openapi_billing_*=1/user".parse().unwrap(),
            "bash_*=1".parse().unwrap(),
        ]);
        assert!(rates.take("openapi_billing_get", Some("alice"), 0).is_ok());
        let refused = rates
            .take("openapi_billing_put", Some("alice"), 0)
            .unwrap_err();
        assert_eq!(refused.retry_after, 60);
        assert_eq!(
            refused.detail("openapi_billing_put"),
            "tool openapi_billing_put is rate limited (1 calls per minute of `openapi_billing_*`, \
             for each user), so this call did not run; a call may go through again in 60 s"
        );
        assert!(rates.take("openapi_billing_put", Some("bob"), 0).is_ok());
        assert!(rates.take("openapi_billing_put", None, 0).is_ok());
        assert!(rates.take("openapi_billing_put", None, 0).is_err());
        assert!(rates.take("bash_a", Some("alice"), 0).is_ok());
        assert!(
            rates.take("bash_b", Some("bob"), 0).is_err(),
            "one bucket for all"
        );
        assert!(
            rates.take("fetch", Some("alice"), 0).is_ok(),
            "no limit matches"
        );
    }
}
