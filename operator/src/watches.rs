//! The operator's watches, kept seeing: a watch that fails (the API
//! server restarted or is down, its resourceVersion expired with 410
//! Gone, the connection was cut) is started again from a fresh LIST, a
//! short backoff apart, for as long as it takes. Its errors stop here:
//! they are counted, logged and make `/readyz` answer 503 naming the
//! watch, and never reach the controller, whose one backoff for all its
//! watches would hold the healthy ones too. A watch that lists again
//! after a failure calls for a resync: everything it may have missed
//! (a deletion, a change) is caught by reconciling every tenant of its
//! scope.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

use crate::metrics::Metrics;

/// The first pause before a failed watch starts again; each next one is
/// twice as long, up to [`LONGEST_PAUSE`]. Short: a restarted API server
/// is seen within seconds of answering again, and only the leader's
/// handful of watches retry.
const FIRST_PAUSE: Duration = Duration::from_millis(250);
const LONGEST_PAUSE: Duration = Duration::from_secs(4);

/// The pauses between a watch's tries: doubling from [`FIRST_PAUSE`] to
/// [`LONGEST_PAUSE`], back to the first once a list completes.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: FIRST_PAUSE }
    }
}

impl Backoff {
    pub(crate) fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(LONGEST_PAUSE);
        pause
    }

    pub(crate) fn reset(&mut self) {
        self.next = FIRST_PAUSE;
    }
}

/// One watch as [`Health`] knows it.
#[derive(Debug)]
struct Watch {
    /// What it watches and where: `Deployment in namespace shop`.
    name: String,
    /// The kind, the label of its errors' metric.
    kind: String,
    /// Since when it has been failing, and its last error.
    failing: Option<(Instant, String)>,
    /// Whether it has listed since it started or last failed.
    listed: bool,
}

impl Watch {
    fn sees(&self) -> bool {
        self.listed && self.failing.is_none()
    }
}

/// Whether each of the operator's watches sees: what `/readyz` answers
/// and the watch metrics say.
#[derive(Debug)]
pub struct Health {
    watches: Mutex<Vec<Watch>>,
    metrics: Arc<Metrics>,
}

/// A watch's place in [`Health`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchId(usize);

impl Health {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Health {
            watches: Mutex::new(Vec::new()),
            metrics,
        }
    }

    /// A new watch, not seeing until its first list completes.
    pub(crate) fn register(&self, kind: &str, name: String) -> WatchId {
        let mut watches = self.watches.lock().unwrap();
        watches.push(Watch {
            name,
            kind: kind.to_string(),
            failing: None,
            listed: false,
        });
        let id = WatchId(watches.len() - 1);
        self.publish(&watches);
        id
    }

    /// The watch failed with `error`.
    pub(crate) fn failed(&self, id: WatchId, error: &str) {
        let mut watches = self.watches.lock().unwrap();
        let Some(w) = watches.get_mut(id.0) else {
            return;
        };
        let since = w.failing.take().map_or_else(Instant::now, |(t, _)| t);
        w.failing = Some((since, error.to_string()));
        w.listed = false;
        self.metrics.watch_failed(&w.kind);
        self.publish(&watches);
    }

    /// The watch completed a list; whether it had failed before (so that
    /// what it missed meanwhile calls for a resync).
    pub(crate) fn listed(&self, id: WatchId) -> bool {
        let mut watches = self.watches.lock().unwrap();
        let Some(w) = watches.get_mut(id.0) else {
            return false;
        };
        let recovered = w.failing.take().is_some();
        w.listed = true;
        self.publish(&watches);
        recovered
    }

    /// What `/readyz` names: each watch that does not see, and why.
    pub fn blind(&self) -> Vec<String> {
        let watches = self.watches.lock().unwrap();
        watches
            .iter()
            .filter(|w| !w.sees())
            .map(|w| match &w.failing {
                Some((since, error)) => format!(
                    "watch of {} failing for {} s: {error}",
                    w.name,
                    since.elapsed().as_secs()
                ),
                None => format!("watch of {}: first list not complete", w.name),
            })
            .collect()
    }

    fn publish(&self, watches: &[Watch]) {
        let blind = watches.iter().filter(|w| !w.sees()).count();
        self.metrics
            .watches(watches.len(), blind.try_into().unwrap_or(i64::MAX));
    }
}

/// The events of the watch that `start` makes, started again from a
/// fresh list after every error (and if it ever ended), a [`Backoff`]
/// apart. Errors are passed on, for [`observed`], each followed by a new
/// watch: one that begins with `Init`, so that a reflector fed by this
/// stream drops what it had and takes the new list whole.
pub(crate) fn relisting<K, S>(
    start: impl Fn() -> S + Send + 'static,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    enum Now<S> {
        Watching(std::pin::Pin<Box<S>>),
        Pausing(Duration),
    }
    futures::stream::unfold(
        (start, Now::Pausing(Duration::ZERO), Backoff::default()),
        |(start, mut now, mut backoff)| async move {
            loop {
                let mut stream = match now {
                    Now::Watching(s) => s,
                    Now::Pausing(pause) => {
                        tokio::time::sleep(pause).await;
                        Box::pin(start())
                    }
                };
                match stream.next().await {
                    Some(Ok(e)) => {
                        if matches!(e, watcher::Event::InitDone) {
                            backoff.reset();
                        }
                        return Some((Ok(e), (start, Now::Watching(stream), backoff)));
                    }
                    Some(Err(e)) => {
                        return Some((Err(e), (start, Now::Pausing(backoff.pause()), backoff)))
                    }
                    // A watcher does not end; one that did has missed
                    // nothing, and is started again.
                    None => now = Now::Pausing(backoff.pause()),
                }
            }
        },
    )
}

/// What a watch's failure and recovery do besides [`Health`]: forget
/// what the cache of the operator's own writes holds of its kind (the
/// watch could not tell it of others' changes), and ask for a resync.
pub(crate) struct OnFailure {
    pub forget: Box<dyn Fn() + Send + Sync>,
    pub resync: futures::channel::mpsc::UnboundedSender<()>,
}

/// The events of `stream` (a [`relisting`] watch, maybe through a
/// reflector) with its errors taken out: each is logged, counted and
/// marks the watch `id` as not seeing until its next list completes. A
/// list completed after a failure asks for a resync, with the watch's
/// kind forgotten from the own-writes cache again (a write recorded while
/// the watch was failing may be of an object since deleted unseen).
pub(crate) fn observed<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    health: Arc<Health>,
    id: WatchId,
    name: String,
    on_failure: OnFailure,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    stream.filter_map(move |item| {
        let out = match item {
            Err(e) => {
                let error = e.to_string();
                tracing::warn!(watch = %name, "watch failed, starting it again with a fresh list: {error}");
                health.failed(id, &error);
                (on_failure.forget)();
                None
            }
            Ok(watcher::Event::InitDone) => {
                if health.listed(id) {
                    tracing::info!(watch = %name, "watch sees again; reconciling everything it may have missed");
                    (on_failure.forget)();
                    let _ = on_failure.resync.unbounded_send(());
                }
                Some(Ok(watcher::Event::InitDone))
            }
            Ok(e) => Some(Ok(e)),
        };
        futures::future::ready(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;

    #[test]
    fn the_pauses_double_to_a_ceiling_and_start_over_after_a_list() {
        let mut b = Backoff::default();
        let pauses: Vec<Duration> = (0..7).map(|_| b.pause()).collect();
        let ms: Vec<u128> = pauses.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 4000, 4000]);
        b.reset();
        assert_eq!(b.pause(), FIRST_PAUSE);
    }

    #[test]
    fn a_watch_sees_once_listed_and_not_while_failing() {
        let metrics = Arc::new(Metrics::default());
        let health = Health::new(metrics.clone());
        let a = health.register("Deployment", "Deployment in namespace shop".into());
        let b = health.register("Agent", "Agent in namespace shop".into());
        assert_eq!(health.blind().len(), 2, "nothing listed yet");
        assert!(!health.listed(a), "a first list is no recovery");
        assert!(!health.listed(b));
        assert!(health.blind().is_empty());
        assert!(metrics
            .render()
            .contains("bindery_operator_watches_blind 0\n"));

        health.failed(a, "too old resource version: 239 (257): Expired");
        health.failed(a, "client error (Connect)");
        let blind = health.blind();
        assert_eq!(blind.len(), 1, "{blind:?}");
        assert!(
            blind[0].starts_with("watch of Deployment in namespace shop failing for ")
                && blind[0].ends_with(": client error (Connect)"),
            "{blind:?}"
        );
        let text = metrics.render();
        assert!(
            text.contains("bindery_operator_watch_errors_total{kind=\"Deployment\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("bindery_operator_watches_blind 1\n"),
            "{text}"
        );
        assert!(text.contains("bindery_operator_watches 2\n"), "{text}");

        assert!(health.listed(a), "listed after a failure: a resync is due");
        assert!(health.blind().is_empty());
        assert!(!health.listed(a), "once");
    }

    /// A watch that fails is started again with a new list (its stream
    /// begins with `Init`), its error passed on once; one that ends is
    /// started again too, with no error to tell.
    #[tokio::test(start_paused = true)]
    async fn a_failed_watch_starts_again_from_a_new_list() {
        let starts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = starts.clone();
        let stream = relisting::<u8, _>(move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut events: Vec<Result<watcher::Event<u8>, watcher::Error>> = vec![
                Ok(watcher::Event::Init),
                Ok(watcher::Event::InitApply(n as u8)),
                Ok(watcher::Event::InitDone),
            ];
            if n == 0 {
                events.push(Err(watcher::Error::NoResourceVersion));
            }
            let rest = if n == 1 {
                futures::stream::empty().boxed() // it ends
            } else {
                futures::stream::pending().boxed()
            };
            futures::stream::iter(events).chain(rest)
        });
        let seen: Vec<String> = stream
            .take(10)
            .map(|e| match e {
                Ok(watcher::Event::Init) => "init".to_string(),
                Ok(watcher::Event::InitApply(n)) => format!("apply {n}"),
                Ok(watcher::Event::InitDone) => "done".to_string(),
                Ok(_) => "other".to_string(),
                Err(_) => "error".to_string(),
            })
            .collect()
            .await;
        assert_eq!(
            seen,
            [
                "init", "apply 0", "done", "error", "init", "apply 1", "done", "init", "apply 2",
                "done"
            ]
        );
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    /// Errors stop at `observed`; the list after one asks for a resync and
    /// forgets the kind again, the first list does not.
    #[tokio::test]
    async fn errors_stop_here_and_a_recovery_asks_for_a_resync() {
        let health = Arc::new(Health::new(Arc::new(Metrics::default())));
        let id = health.register("Secret", "Secret in namespace shop".into());
        let forgotten = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let f = forgotten.clone();
        let (tx, mut rx) = mpsc::unbounded();
        let events: Vec<Result<watcher::Event<u8>, watcher::Error>> = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
            Err(watcher::Error::NoResourceVersion),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(1)),
            Ok(watcher::Event::InitDone),
        ];
        let out: Vec<_> = observed(
            futures::stream::iter(events),
            health.clone(),
            id,
            "Secret in namespace shop".into(),
            OnFailure {
                forget: Box::new(move || {
                    f.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }),
                resync: tx,
            },
        )
        .collect()
        .await;
        assert_eq!(out.len(), 5);
        assert!(out.iter().all(Result::is_ok));
        // Forgotten at the failure and again at the list after it.
        assert_eq!(forgotten.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(rx.try_recv().ok(), Some(()));
        assert!(rx.try_recv().is_err(), "one resync");
        assert!(health.blind().is_empty());
    }
}
