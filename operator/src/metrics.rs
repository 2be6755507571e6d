//! The operator's Prometheus metrics: reconciles by outcome, their
//! duration, and writes it made.

use std::sync::atomic::{AtomicU64, Ordering};

use bindery_sidecar::prom::{header, load, sample, Histogram};

const DURATION_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Debug)]
pub struct Metrics {
    ok: AtomicU64,
    error: AtomicU64,
    duration: Histogram,
    warnings: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ok: AtomicU64::new(0),
            error: AtomicU64::new(0),
            duration: Histogram::new(&DURATION_BUCKETS),
            warnings: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, seconds: f64, ok: bool) {
        self.duration.observe(seconds);
        if ok { &self.ok } else { &self.error }.fetch_add(1, Ordering::Relaxed);
    }

    pub fn warning_published(&self) {
        self.warnings.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "bindery_operator_reconciles_total",
            "counter",
            "Reconciles of AgentTenants, by outcome.",
        );
        sample(
            &mut out,
            "bindery_operator_reconciles_total",
            &[("outcome", "ok")],
            load(&self.ok),
        );
        sample(
            &mut out,
            "bindery_operator_reconciles_total",
            &[("outcome", "error")],
            load(&self.error),
        );
        header(
            &mut out,
            "bindery_operator_reconcile_duration_seconds",
            "histogram",
            "How long one reconcile took.",
        );
        self.duration
            .render(&mut out, "bindery_operator_reconcile_duration_seconds");
        header(
            &mut out,
            "bindery_operator_warning_events_total",
            "counter",
            "Warning events published for a human to act on.",
        );
        sample(
            &mut out,
            "bindery_operator_warning_events_total",
            &[],
            load(&self.warnings),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders() {
        let m = super::Metrics::default();
        m.reconciled(0.02, true);
        m.reconciled(3.0, false);
        let text = m.render();
        assert!(
            text.contains("bindery_operator_reconciles_total{outcome=\"ok\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("bindery_operator_reconciles_total{outcome=\"error\"} 1\n"));
        assert!(
            text.contains("bindery_operator_reconcile_duration_seconds_bucket{le=\"0.025\"} 1\n")
        );
        assert!(text.contains("bindery_operator_reconcile_duration_seconds_count 2\n"));
    }
}
