//! The Prometheus text exposition format (0.0.4), hand-rolled: counters,
//! gauges and histograms are a few atomics; no metrics crate needed. Shared
//! by the sidecar's and the operator's `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The `Content-Type` of the exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A histogram over fixed bucket bounds. Each bucket counts the
/// observations that fell in it alone; they are summed up when rendered.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then the `+Inf` bucket.
    buckets: Vec<AtomicU64>,
    /// The `f64` sum, as bits.
    sum_bits: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        // NaN compares false with everything: it too becomes 0.
        let value = if value >= 0.0 { value } else { 0.0 };
        let bucket = self
            .bounds
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(self.bounds.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        if value.is_finite() {
            // The closure always returns `Some`: this cannot fail.
            let _ = self
                .sum_bits
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                    Some((f64::from_bits(bits) + value).to_bits())
                });
        }
    }

    pub fn render(&self, out: &mut String, name: &str) {
        let bucket_name = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (i, count) in self.buckets.iter().enumerate() {
            cumulative += load(count);
            let le = match self.bounds.get(i) {
                Some(bound) => format_float(*bound),
                None => "+Inf".to_owned(),
            };
            sample(out, &bucket_name, &[("le", &le)], cumulative);
        }
        let sum = f64::from_bits(self.sum_bits.load(Ordering::Relaxed));
        let _ = writeln!(out, "{name}_sum {}", format_float(sum));
        // The count is the `+Inf` bucket's, so the two always agree.
        sample(out, &format!("{name}_count"), &[], cumulative);
    }
}

pub fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The guarded value even if another thread panicked while holding the lock:
/// counters stay usable.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `# HELP` and `# TYPE` lines for a metric family.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// One sample line: `name{label="value",…} value`.
pub fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (label, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            out.push_str(&escape_label_value(value));
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the exposition format wants it: `\`, `"` and newline
/// escaped.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// `# HELP` text: only `\` and newline are escaped.
pub fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A float as Prometheus reads it (`0.005`, `1`, `+Inf`).
pub fn format_float(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value == f64::INFINITY {
        "+Inf".to_owned()
    } else if value == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        value.to_string()
    }
}
