//! How many tool processes run at once: a bound per server and one per
//! run, so that the model does not decide it (one turn may ask for a
//! thousand calls). A tool process is a bash tool's call (its script and
//! all it starts count as one); a call waits for a slot of its run, then
//! one of the server, in the order the calls asked (tokio's semaphores are
//! fair), and holds both while its process runs. Waiting is not an error:
//! the model sees the call's result, later. A run's bound below the
//! server's leaves room for other sessions: no run starves the rest.
//!
//! Not counted: MCP stdio servers and parameters' value commands, which
//! the agent's files start (not the model), one at a time or once.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// [`ProcessSlots`]' bounds unless flags say otherwise.
pub const DEFAULT_PER_SERVER: usize = 32;
pub const DEFAULT_PER_RUN: usize = 8;

/// The slots a call's process takes: the server's, and its run's once the
/// run has its own ([`ProcessSlots::for_run`]). Default: no bound.
#[derive(Clone, Debug, Default)]
pub struct ProcessSlots {
    /// Where how many wait and run is reported (`None`: nowhere).
    gauges: Option<bindery_metrics::ToolProcessGauges>,
    server: Option<Arc<Semaphore>>,
    /// How many each run may hold (`None`: no bound of its own).
    per_run: Option<usize>,
    run: Option<Arc<Semaphore>>,
}

/// A process's slots, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    _run: Option<OwnedSemaphorePermit>,
    _server: Option<OwnedSemaphorePermit>,
    _counted: Option<bindery_metrics::GaugeHeld>,
}

impl ProcessSlots {
    /// A server's slots: at most `per_server` processes at once, and
    /// `per_run` of one run (`None`: no bound).
    pub fn new(per_server: Option<usize>, per_run: Option<usize>) -> ProcessSlots {
        ProcessSlots {
            gauges: None,
            server: per_server.map(|n| Arc::new(Semaphore::new(n.max(1)))),
            per_run,
            run: None,
        }
    }

    /// These slots, reporting how many calls wait and run to `gauges`.
    pub fn reported_to(self, gauges: bindery_metrics::ToolProcessGauges) -> ProcessSlots {
        ProcessSlots {
            gauges: Some(gauges),
            ..self
        }
    }

    /// The slots of a new run: the server's, and its own.
    pub fn for_run(&self) -> ProcessSlots {
        ProcessSlots {
            run: self.per_run.map(|n| Arc::new(Semaphore::new(n.max(1)))),
            ..self.clone()
        }
    }

    /// Wait for a slot of the run, then of the server. The run's first:
    /// a call its run holds back takes none of the server's meanwhile.
    pub async fn take(&self) -> Slot {
        async fn one(s: &Option<Arc<Semaphore>>) -> Option<OwnedSemaphorePermit> {
            // A semaphore that is never closed: acquiring fails never.
            s.as_ref()?.clone().acquire_owned().await.ok()
        }
        // Counted as waiting until it has both (or is dropped waiting).
        let waiting = self.gauges.as_ref().map(|g| g.waiting());
        let run = one(&self.run).await;
        let server = one(&self.server).await;
        drop(waiting);
        Slot {
            _run: run,
            _server: server,
            _counted: self.gauges.as_ref().map(|g| g.running()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Many calls of two runs: never more than the server's bound at
    /// once, never more than a run's of one run; every call runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_wait_for_their_runs_and_the_servers_slots() {
        let server = ProcessSlots::new(Some(5), Some(3));
        let (a, b) = (server.for_run(), server.for_run());
        let now = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let most = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let most_both = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..60 {
            let (slots, r) = if i % 2 == 0 {
                (a.clone(), 0)
            } else {
                (b.clone(), 1)
            };
            let (now, most, most_both) = (now.clone(), most.clone(), most_both.clone());
            tasks.push(tokio::spawn(async move {
                let _slot = slots.take().await;
                let mine = now[r].fetch_add(1, Ordering::SeqCst) + 1;
                most[r].fetch_max(mine, Ordering::SeqCst);
                let both = now[0].load(Ordering::SeqCst) + now[1].load(Ordering::SeqCst);
                most_both.fetch_max(both, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                now[r].fetch_sub(1, Ordering::SeqCst);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(most[0].load(Ordering::SeqCst) <= 3);
        assert!(most[1].load(Ordering::SeqCst) <= 3);
        assert!(most_both.load(Ordering::SeqCst) <= 5);
        assert_eq!(most[0].load(Ordering::SeqCst), 3, "a run uses its slots");
    }

    /// No bound: a slot at once, however many are held.
    #[tokio::test]
    async fn without_bounds_a_slot_is_free() {
        let slots = ProcessSlots::default().for_run();
        let held: Vec<Slot> = futures_take(&slots, 1000).await;
        assert_eq!(held.len(), 1000);
    }

    async fn futures_take(slots: &ProcessSlots, n: usize) -> Vec<Slot> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(slots.take().await);
        }
        out
    }
}
