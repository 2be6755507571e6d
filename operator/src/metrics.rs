//! The operator's Prometheus metrics: reconciles by outcome, their
//! duration by outcome, failed ones by what failed, the Warnings it
//! published, and its watches (how many, how many do not see, their
//! errors by kind), in a `prometheus-client` registry served as
//! OpenMetrics text.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const DURATION_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Failure {
    error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: String,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Outcome, Counter>,
    duration: Family<Outcome, Histogram>,
    failures: Family<Failure, Counter>,
    warnings: Counter,
    watch_errors: Family<Kind, Counter>,
    watches: Gauge,
    watches_blind: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let reconciles = Family::<Outcome, Counter>::default();
        for outcome in ["ok", "error"] {
            drop(reconciles.get_or_create(&Outcome { outcome }));
        }
        let duration =
            Family::<Outcome, Histogram>::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        let failures = Family::<Failure, Counter>::default();
        let warnings = Counter::default();
        let watch_errors = Family::<Kind, Counter>::default();
        let (watches, watches_blind) = (Gauge::default(), Gauge::default());
        let mut registry = Registry::default();
        registry.register(
            "bindery_operator_reconciles",
            "Reconciles of AgentTenants, by outcome",
            reconciles.clone(),
        );
        registry.register(
            "bindery_operator_reconcile_duration_seconds",
            "How long one reconcile took, by outcome",
            duration.clone(),
        );
        registry.register(
            "bindery_operator_reconcile_failures",
            "Failed reconciles, by what failed",
            failures.clone(),
        );
        registry.register(
            "bindery_operator_warning_events",
            "Warning events published for a human to act on",
            warnings.clone(),
        );
        registry.register(
            "bindery_operator_watch_errors",
            "Errors of the operator's watches, by kind; each starts its watch again with a fresh list",
            watch_errors.clone(),
        );
        registry.register(
            "bindery_operator_watches",
            "The operator's watches (on the leader: its kinds per watched namespace)",
            watches.clone(),
        );
        registry.register(
            "bindery_operator_watches_blind",
            "Watches that have not completed a list since they started or last failed; /readyz answers 503 while this is not 0",
            watches_blind.clone(),
        );
        Metrics {
            registry,
            reconciles,
            duration,
            failures,
            warnings,
            watch_errors,
            watches,
            watches_blind,
        }
    }
}

impl Metrics {
    /// One reconcile that took `seconds`: it succeeded (`failed` is
    /// `None`) or failed with an error of that kind.
    pub(crate) fn reconciled(&self, seconds: f64, failed: Option<&'static str>) {
        let outcome = Outcome {
            outcome: if failed.is_some() { "error" } else { "ok" },
        };
        self.duration
            .get_or_create(&outcome)
            .observe(if seconds.is_finite() && seconds >= 0.0 {
                seconds
            } else {
                0.0
            });
        self.reconciles.get_or_create(&outcome).inc();
        if let Some(error) = failed {
            self.failures.get_or_create(&Failure { error }).inc();
        }
    }

    pub(crate) fn warning_published(&self) {
        self.warnings.inc();
    }

    /// A watch of `kind` failed.
    pub(crate) fn watch_failed(&self, kind: &str) {
        self.watch_errors
            .get_or_create(&Kind {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// How many watches there are and how many of them do not see.
    pub(crate) fn watches(&self, total: usize, blind: i64) {
        self.watches.set(total.try_into().unwrap_or(i64::MAX));
        self.watches_blind.set(blind);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders() {
        let m = super::Metrics::default();
        m.reconciled(0.02, None);
        m.reconciled(3.0, Some("api_conflict"));
        let text = m.render();
        assert!(
            text.contains("bindery_operator_reconciles_total{outcome=\"ok\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("bindery_operator_reconciles_total{outcome=\"error\"} 1\n"));
        assert!(
            text.contains(
                "bindery_operator_reconcile_duration_seconds_bucket{le=\"0.025\",outcome=\"ok\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "bindery_operator_reconcile_duration_seconds_bucket{le=\"5.0\",outcome=\"error\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("bindery_operator_reconcile_failures_total{error=\"api_conflict\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("bindery_operator_warning_events_total 0\n"));
    }
}
