//! Heartbeats and the sweep: this server's beat in the store, and runs
//! whose server stopped beating closed as failed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Code, ErrorKind, ServiceError};
use crate::lease::{LeaseConfig, Liveness};
use crate::run::close_pending;
use crate::state::live_sessions::LiveSessions;
use crate::state::recorder::Recorder;
use bindery_metrics::RunOutcome;
use bindery_store::clock::Clock;
use bindery_store::model::{SessionRecord, SessionStatus};
use bindery_store::wire::{RunFinished, SessionEvent};
use bindery_store::{SessionStore, StoreError};

/// This server's heartbeat in the store, and its judgement of runs by the
/// servers' heartbeats.
pub struct Heartbeat {
    store: Arc<dyn SessionStore>,
    /// This server's instance id, as runs record who runs them.
    instance: Arc<str>,
    lease: LeaseConfig,
    /// Where the other servers reach this one, recorded with each beat.
    advertise: Option<String>,
    clock: Arc<dyn Clock>,
    /// Whether the last beat reached the store (readiness follows it).
    ok: AtomicBool,
    /// This server's runs, which are never lost while it has them.
    live: Arc<LiveSessions>,
    /// Where a lost run's end is written.
    recorder: Arc<Recorder>,
}

/// What a server knows of runs' liveness at one moment (see
/// [`Liveness`]).
pub(crate) struct Judgement {
    me: Arc<str>,
    exclusive: bool,
    now: i64,
    lease: Duration,
    heartbeats: HashMap<String, i64>,
}

impl Judgement {
    /// Whether `rec`'s run is lost; `running_here`: this process has it.
    pub fn is_lost(&self, rec: &SessionRecord, running_here: bool) -> bool {
        Liveness {
            me: &self.me,
            exclusive: self.exclusive,
            now: self.now,
            lease: self.lease,
            heartbeats: &self.heartbeats,
        }
        .is_lost(rec, running_here)
    }
}

impl Heartbeat {
    pub(crate) fn new(
        store: Arc<dyn SessionStore>,
        instance: Arc<str>,
        lease: LeaseConfig,
        advertise: Option<String>,
        clock: Arc<dyn Clock>,
        recorder: Arc<Recorder>,
    ) -> Heartbeat {
        Heartbeat {
            store,
            instance,
            lease,
            advertise,
            clock,
            ok: AtomicBool::new(true),
            live: recorder.live.clone(),
            recorder,
        }
    }

    /// Record this server's heartbeat: it vouches for its runs for a lease.
    pub async fn beat(&self) -> Result<(), ServiceError> {
        let at = self.clock.now_ms();
        Ok(self
            .store
            .beat(&self.instance, at, self.advertise.as_deref())
            .await?)
    }

    /// Whether the store took this server's last heartbeat: a server that
    /// cannot reach its store is not ready (`/readyz`), so a load balancer
    /// sends sessions elsewhere until it can.
    pub fn ok(&self) -> bool {
        self.ok.load(Ordering::Relaxed)
    }

    /// Beat, and say so in the log when the store stops or starts taking
    /// the beats again.
    pub(crate) async fn beat_and_tell(&self) {
        let beat = self.beat().await;
        let was_ok = self.ok.swap(beat.is_ok(), Ordering::Relaxed);
        match beat {
            Err(e) => tracing::warn!(
                lease = %humantime::format_duration(self.lease.lease),
                "cannot record this server's heartbeat ({e}); not ready until it can, and once the lease passes, other servers take its runs for lost"
            ),
            Ok(()) if !was_ok => tracing::info!("the session store answers again; ready"),
            Ok(()) => {}
        }
    }

    /// The servers' heartbeats as the store has them now.
    async fn judge(&self) -> Result<Judgement, ServiceError> {
        let heartbeats = self.store.heartbeats().await?;
        Ok(Judgement {
            me: self.instance.clone(),
            exclusive: !self.store.shared(),
            now: self.clock.now_ms(),
            lease: self.lease.lease,
            heartbeats,
        })
    }

    /// Drop heartbeats older than a lease at `now`: a stale one says no
    /// more than a missing one.
    async fn prune(&self, now: i64) -> Result<(), ServiceError> {
        let lease = i64::try_from(self.lease.lease.as_millis()).unwrap_or(i64::MAX);
        self.store.prune_runners(now.saturating_sub(lease)).await?;
        Ok(())
    }

    /// Forget this server, so that others take its runs for lost at once.
    pub(crate) async fn forget(&self) {
        if let Err(e) = self.store.forget_runner(&self.instance).await {
            tracing::warn!("cannot remove this server's heartbeat: {e}");
        }
    }

    /// Close every lost run (see [`Liveness`]); how many. At startup on a
    /// store of our own that is every run in progress: the last process's.
    pub async fn sweep(&self) -> Result<usize, ServiceError> {
        // Running sessions first, heartbeats second: a server beats before
        // it starts runs, so any runner in the list has its beat read here.
        let running = self.store.running().await?;
        let liveness = self.judge().await?;
        let mut closed = 0;
        for rec in running {
            if rec.cancel_requested && rec.runner.as_deref() == Some(&*self.instance) {
                self.live.cancel_here(&rec.id);
            }
            if liveness.is_lost(&rec, self.live.is_running(&rec.id))
                && self.close_interrupted(rec).await?
            {
                closed += 1;
            }
        }
        self.prune(liveness.now).await?;
        Ok(closed)
    }

    /// A session recorded as running that this process does not run: the
    /// run goes on elsewhere (409), or it is lost and closed here, and the
    /// fresh record returned. The caller holds the session's lock.
    pub(crate) async fn close_if_lost(
        &self,
        mut rec: SessionRecord,
    ) -> Result<SessionRecord, ServiceError> {
        for _ in 0..3 {
            if rec.status != SessionStatus::Running {
                return Ok(rec);
            }
            let liveness = self.judge().await?;
            if !liveness.is_lost(&rec, self.live.is_running(&rec.id)) {
                break;
            }
            // Closed here, or by another server first: read what it says now.
            let id = rec.id.clone();
            self.close_interrupted(rec).await?;
            rec = crate::state::stored_session(&*self.store, &id).await?;
        }
        Err(ServiceError::new(
            ErrorKind::Conflict,
            Code::RunInProgress,
            "a run is in progress on this session on another server; wait for it to end",
        ))
    }

    /// Close an interrupted run (`rec` as it was read): unanswered tool
    /// calls are answered, the session fails, `run_finished` is emitted.
    /// Nothing is retried blind. `false` when the session changed since it
    /// was read (another server closed it first, or the run moved on).
    pub(crate) async fn close_interrupted(
        &self,
        mut rec: SessionRecord,
    ) -> Result<bool, ServiceError> {
        let (detail, call) = if rec.runner.as_deref() == Some(&*self.instance) {
            // This very process ran it, and the run ended without its end
            // on record: the store refused the run's last writes.
            (
                "failed: the session store did not take this run's last writes (see the server's log); what the run did after its last recorded step is not on record",
                "error: the session store failed before this call's result was recorded; the call may have run",
            )
        } else if self.store.shared() {
            (
                "interrupted: the server running it stopped",
                "error: the server running this call stopped during it; it was not retried, and its side effect may have happened: check before calling it again",
            )
        } else {
            (
                "interrupted by a restart of the server",
                "error: the server restarted during this call; it was not retried, and its side effect may have happened: check before calling it again",
            )
        };
        let runner = rec.runner.take();
        rec.cancel_requested = false;
        rec.turns = close_pending(std::mem::take(&mut rec.turns), call);
        rec.status = SessionStatus::Failed;
        rec.status_detail = Some(detail.into());
        rec.version += 1;
        rec.updated_at = self.clock.now_ms();
        match self.store.update(&mut rec).await {
            Ok(()) => {}
            Err(StoreError::Conflict(_)) => {
                tracing::debug!(session = %rec.id, "a lost run changed meanwhile: left to whoever changed it");
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
        let finished = RunFinished {
            status: RunOutcome::Failed,
            detail: Some(detail.to_string()),
            session_status: SessionStatus::Failed,
            usage: None,
        };
        self.recorder
            .emit_for(&rec, SessionEvent::RunFinished(finished))
            .await;
        tracing::warn!(session = %rec.id, runner = ?runner, "{detail}: run marked failed");
        Ok(true)
    }
}
