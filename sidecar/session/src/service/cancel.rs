//! Cancelling a run, here or, on a shared store, on the server that runs
//! it, or a run that waits for pending calls. The run driver's ([`Runs`]).

use super::CANCEL_WAIT;
use crate::error::Code;
use crate::error::ErrorKind;
use crate::error::ServiceError;
use crate::run::close_pending;
use crate::run::Runs;
use crate::run::CANCELLED;
use crate::state::live_sessions::RunWait;
use bindery_metrics::RunOutcome;
use bindery_store::model::SessionStatus;
use bindery_store::pending::Resolution;
use bindery_store::wire::RunFinished;
use bindery_store::wire::SessionEvent;
use bindery_store::wire::{Outcome, Resolved};
use bindery_store::StoreError;
use std::time::Duration;

impl Runs {
    /// Cancel session `id`'s run, and wait (a while) for it to record its
    /// end.
    pub async fn cancel(&self, id: &str) -> Result<(), ServiceError> {
        self.record(id).await?;
        let handle = self
            .live
            .peek(id)
            .and_then(|l| l.run.lock().unwrap_or_else(|p| p.into_inner()).clone());
        let Some(handle) = handle else {
            if self.cancel_waiting(id).await? {
                return Ok(());
            }
            return self.request_cancel(id).await;
        };
        handle.cancel.cancel();
        // The run closes its last turn and records its end; wait for that.
        let _ = RunWait(handle.done).wait(CANCEL_WAIT).await;
        Ok(())
    }

    /// Cancel a run that another server runs: the request is recorded in
    /// the session, that server acts on it within a heartbeat (its sweep,
    /// or the run's next write), and the run's end is awaited here as a
    /// local cancel awaits it. A lost run is closed, as any request would.
    pub(super) async fn request_cancel(&self, id: &str) -> Result<(), ServiceError> {
        let not_running = || {
            ServiceError::new(
                ErrorKind::Conflict,
                Code::NotRunning,
                "no run is in progress on this session",
            )
        };
        let live = self.live.entry(id);
        let requested = async {
            let _guard = live.lock.lock().await;
            for _ in 0..3 {
                match self.heartbeat.close_if_lost(self.record(id).await?).await {
                    // Not running (any more), or lost and closed just now.
                    Ok(_) => return Err(not_running()),
                    Err(e) if e.code == Code::RunInProgress => {}
                    Err(e) => return Err(e),
                }
                let mut rec = self.record(id).await?;
                if rec.status != SessionStatus::Running {
                    return Err(not_running());
                }
                if rec.cancel_requested {
                    return Ok(rec.runner);
                }
                rec.cancel_requested = true;
                rec.version += 1;
                rec.updated_at = self.clock.now_ms();
                match self.store.update(&mut rec).await {
                    Ok(()) => return Ok(rec.runner),
                    Err(StoreError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(ServiceError::new(
                ErrorKind::Conflict,
                Code::Conflict,
                format!("session {id} kept changing concurrently; try the cancel again"),
            ))
        }
        .await;
        drop(live);
        self.live.evict_if_idle(id);
        let runner = requested?;
        tracing::info!(session = id, runner = ?runner, "cancel requested of the server running the run");
        // Until that run has ended (or another has replaced it).
        let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(self.poll_interval()).await;
            let rec = self.record(id).await?;
            if rec.status != SessionStatus::Running || rec.runner != runner {
                break;
            }
        }
        Ok(())
    }

    /// How often a server reads the store for the end of a run it asked
    /// another server to cancel. A quarter second, or the heartbeat if that
    /// is shorter.
    pub(super) fn poll_interval(&self) -> Duration {
        self.heartbeat_every.min(Duration::from_millis(250))
    }

    /// Cancel a run that waits for pending calls: each is closed the way a
    /// cancel closes a call in progress. `false` when the session does not wait.
    pub(super) async fn cancel_waiting(&self, id: &str) -> Result<bool, ServiceError> {
        let live = self.live.entry(id);
        let r = async {
            let _guard = live.lock.lock().await;
            let mut rec = self.record(id).await?;
            if rec.status != SessionStatus::WaitingExternal {
                return Ok::<_, ServiceError>(None);
            }
            let closed = rec.pending.end_run(&Resolution::Cancelled);
            rec.turns = close_pending(std::mem::take(&mut rec.turns), CANCELLED);
            rec.status = SessionStatus::Idle;
            rec.status_detail = Some("cancelled".into());
            rec.version += 1;
            rec.updated_at = self.clock.now_ms();
            self.store.update(&mut rec).await?;
            Ok::<_, ServiceError>(Some(closed))
        }
        .await;
        drop(live);
        self.live.evict_if_idle(id);
        let Some(closed) = r? else {
            return Ok(false);
        };
        for call in closed {
            let closed = Resolved::closed(call, Outcome::Cancelled);
            self.recorder.emit(id, SessionEvent::Resolved(closed)).await;
        }
        self.metrics.run_finished(RunOutcome::Cancelled);
        let finished = RunFinished {
            status: RunOutcome::Cancelled,
            detail: Some("cancelled".into()),
            session_status: SessionStatus::Idle,
            usage: Some(bindery_store::usage::Totals::default()),
        };
        self.recorder
            .emit(id, SessionEvent::RunFinished(finished))
            .await;
        tracing::info!(session = id, "a waiting run was cancelled");
        Ok(true)
    }
}
