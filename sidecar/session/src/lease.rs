//! Whether a run is lost: recorded as running, but run by no live server.
//!
//! Every server process has an instance id and records a heartbeat in the
//! store every `heartbeat`; a run records which instance runs it. A run
//! whose instance has not beaten within the `lease` was cut off (a crash, a
//! killed pod) and is closed by whichever server notices first. Pure: the
//! service reads the store and the clock, and acts on the answer.

use std::collections::HashMap;
use std::time::Duration;

use bindery_store::model::{SessionRecord, SessionStatus};

/// How often a server beats, and how long a beat vouches for its runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub heartbeat: Duration,
    pub lease: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            heartbeat: Duration::from_secs(10),
            lease: Duration::from_secs(30),
        }
    }
}

/// Why `--runner-heartbeat` and `--runner-lease` cannot keep runs alive.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LeaseConfigError {
    #[error("--runner-heartbeat must be longer than 0s")]
    NoHeartbeat,
    #[error(
        "--runner-lease ({}) must be longer than --runner-heartbeat ({}), a few heartbeats long (the default is 30s for 10s)",
        humantime::format_duration(*.lease),
        humantime::format_duration(*.heartbeat)
    )]
    LeaseTooShort {
        lease: Duration,
        heartbeat: Duration,
    },
}

impl LeaseConfig {
    /// A lease no longer than the heartbeat would expire between two beats
    /// of a healthy server.
    pub fn check(&self) -> Result<(), LeaseConfigError> {
        if self.heartbeat.is_zero() {
            return Err(LeaseConfigError::NoHeartbeat);
        }
        if self.lease <= self.heartbeat {
            return Err(LeaseConfigError::LeaseTooShort {
                lease: self.lease,
                heartbeat: self.heartbeat,
            });
        }
        Ok(())
    }
}

/// Whether a heartbeat stamped `at` has lapsed at `now` (both milliseconds
/// since the epoch) under `lease`.
pub fn lapsed(lease: Duration, at: i64, now: i64) -> bool {
    let lease = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    now.saturating_sub(at) > lease
}

/// What a server knows when it judges runs.
#[derive(Debug)]
pub struct Liveness<'a> {
    /// This server's instance id.
    pub me: &'a str,
    /// No other server uses the store: a run this process does not have was
    /// cut by an earlier one, whatever its heartbeat says.
    pub exclusive: bool,
    /// Milliseconds since the epoch.
    pub now: i64,
    pub lease: Duration,
    /// Each server's last heartbeat.
    pub heartbeats: &'a HashMap<String, i64>,
}

impl Liveness<'_> {
    /// Whether `rec`'s run is lost. `running_here`: this process has the
    /// run in memory (then it is never lost).
    pub fn is_lost(&self, rec: &SessionRecord, running_here: bool) -> bool {
        if rec.status != SessionStatus::Running || running_here {
            return false;
        }
        let stale = |at: i64| lapsed(self.lease, at, self.now);
        match rec.runner.as_deref() {
            // Ours by the record yet not in memory: its end could not be
            // recorded, and nobody else will close it while we beat.
            Some(r) if r == self.me => true,
            _ if self.exclusive => true,
            Some(r) => self.heartbeats.get(r).is_none_or(|&at| stale(at)),
            // Started by a server that did not record runners (an older
            // version): a live run writes its turns, a cut one falls silent.
            None => stale(rec.updated_at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bindery_store::contract::record;

    const LEASE: Duration = Duration::from_secs(30);

    fn running(runner: Option<&str>, updated_at: i64) -> SessionRecord {
        let mut rec = record("s1", 0);
        rec.status = SessionStatus::Running;
        rec.runner = runner.map(str::to_owned);
        rec.updated_at = updated_at;
        rec
    }

    fn shared<'a>(now: i64, heartbeats: &'a HashMap<String, i64>) -> Liveness<'a> {
        Liveness {
            me: "me",
            exclusive: false,
            now,
            lease: LEASE,
            heartbeats,
        }
    }

    fn beats(pairs: &[(&str, i64)]) -> HashMap<String, i64> {
        pairs.iter().map(|(i, at)| ((*i).to_owned(), *at)).collect()
    }

    #[test]
    fn a_run_is_lost_once_its_servers_heartbeat_is_older_than_the_lease() {
        let hb = beats(&[("other", 100_000)]);
        let rec = running(Some("other"), 0);
        assert!(!shared(100_000, &hb).is_lost(&rec, false));
        assert!(
            !shared(130_000, &hb).is_lost(&rec, false),
            "exactly the lease"
        );
        assert!(shared(130_001, &hb).is_lost(&rec, false));
        // A clock behind the beat's is no reason to call it lost.
        assert!(!shared(90_000, &hb).is_lost(&rec, false));
    }

    #[test]
    fn a_run_whose_server_left_no_heartbeat_is_lost() {
        let hb = beats(&[("other", 100_000)]);
        assert!(shared(100_000, &hb).is_lost(&running(Some("gone"), 100_000), false));
    }

    #[test]
    fn only_running_sessions_have_lost_runs() {
        let hb = beats(&[]);
        for status in [SessionStatus::Idle, SessionStatus::Failed] {
            let mut rec = running(Some("gone"), 0);
            rec.status = status;
            assert!(!shared(100_000, &hb).is_lost(&rec, false), "{status:?}");
        }
    }

    #[test]
    fn a_run_in_this_process_is_never_lost() {
        let hb = beats(&[]);
        for (runner, exclusive) in [(Some("me"), false), (Some("gone"), true), (None, true)] {
            let l = Liveness {
                exclusive,
                ..shared(i64::MAX, &hb)
            };
            assert!(!l.is_lost(&running(runner, 0), true), "{runner:?}");
        }
    }

    #[test]
    fn a_run_recorded_as_ours_but_not_in_memory_is_lost_despite_our_beat() {
        let hb = beats(&[("me", 100_000)]);
        assert!(shared(100_000, &hb).is_lost(&running(Some("me"), 100_000), false));
    }

    #[test]
    fn on_a_store_of_our_own_every_run_we_do_not_have_is_lost() {
        let hb = beats(&[("before", 100_000)]);
        let l = Liveness {
            exclusive: true,
            ..shared(100_000, &hb)
        };
        assert!(l.is_lost(&running(Some("before"), 100_000), false));
        assert!(l.is_lost(&running(None, 100_000), false));
    }

    #[test]
    fn a_run_without_a_runner_is_lost_once_it_has_been_silent_for_the_lease() {
        let hb = beats(&[]);
        let rec = running(None, 100_000);
        assert!(!shared(120_000, &hb).is_lost(&rec, false));
        assert!(shared(130_001, &hb).is_lost(&rec, false));
    }

    fn cfg(hb: u64, lease: u64) -> LeaseConfig {
        LeaseConfig {
            heartbeat: Duration::from_millis(hb),
            lease: Duration::from_millis(lease),
        }
    }

    #[test]
    fn a_lease_must_outlast_the_heartbeat() {
        assert!(LeaseConfig::default().check().is_ok());
        assert!(cfg(200, 1000).check().is_ok());
        let err = cfg(10_000, 10_000).check().unwrap_err().to_string();
        assert!(
            err.contains("--runner-lease (10s) must be longer than --runner-heartbeat (10s)"),
            "{err}"
        );
        assert!(cfg(0, 1000).check().is_err());
    }

    #[test]
    fn a_heartbeat_lapses_only_past_the_lease_and_never_overflows() {
        assert!(!lapsed(LEASE, 0, 30_000), "exactly the lease");
        assert!(lapsed(LEASE, 0, 30_001));
        assert!(!lapsed(LEASE, 50_000, 0), "a clock behind the beat");
        assert!(lapsed(LEASE, i64::MIN, i64::MAX));
        assert!(
            !lapsed(Duration::MAX, 0, i64::MAX),
            "a lease too long for i64"
        );
        assert!(lapsed(Duration::ZERO, 0, 1));
    }

    #[test]
    fn a_waiting_session_has_no_run_to_lose() {
        let mut rec = running(None, 0);
        rec.status = SessionStatus::WaitingExternal;
        let hb = beats(&[]);
        let l = Liveness {
            exclusive: true,
            ..shared(i64::MAX, &hb)
        };
        assert!(!l.is_lost(&rec, false));
    }

    #[test]
    fn a_beating_server_vouches_for_its_run_however_old_the_record() {
        let hb = beats(&[("other", 1_000_000)]);
        let rec = running(Some("other"), 0);
        assert!(!shared(1_000_000, &hb).is_lost(&rec, false));
        // Another server's beat says nothing of this one's run.
        let hb = beats(&[("third", 1_000_000), ("other", 0)]);
        assert!(shared(1_000_000, &hb).is_lost(&rec, false));
    }

    #[test]
    fn a_lease_check_says_which_flag_is_wrong() {
        assert_eq!(cfg(0, 1000).check(), Err(LeaseConfigError::NoHeartbeat));
        assert_eq!(
            cfg(0, 1000).check().unwrap_err().to_string(),
            "--runner-heartbeat must be longer than 0s"
        );
        assert_eq!(
            cfg(10_000, 5_000).check().unwrap_err().to_string(),
            "--runner-lease (5s) must be longer than --runner-heartbeat (10s), a few heartbeats long (the default is 30s for 10s)"
        );
        assert_eq!(cfg(10_000, 10_001).check(), Ok(()));
    }
}
