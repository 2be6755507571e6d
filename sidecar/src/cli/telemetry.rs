//! OpenTelemetry traces over OTLP/HTTP, when the operator asks for them.
//!
//! Setting `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL such as
//! `http://otel-collector:4318`; `/v1/traces` is appended) or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL) exports the spans the
//! sidecar makes (`run`, `model_turn`, `tool_call`, with their session, agent
//! and tool fields, and the log events inside them) as OTLP protobuf over
//! HTTP. The other standard variables apply as the OTLP exporter reads them
//! (`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`,
//! `OTEL_RESOURCE_ATTRIBUTES`, ...); the service is `bindery-sidecar` unless
//! `OTEL_SERVICE_NAME` (or a `service.name` resource attribute) says
//! otherwise, and `OTEL_SDK_DISABLED=true` turns exporting off.
//!
//! What is exported is what is logged: the same `BINDERY_LOG` filter picks
//! the spans and events, so what the logs keep out (secret values) stays out
//! of the traces too. As a last line of defence, every log record
//! ([`Scrubbed`]) and every exported span's name, attributes, events and
//! status (as the span ends) are scrubbed of the secret values live in the
//! process ([`bindery_params::live`]), whatever module wrote them. Spans go out in batches from a thread of their own; a
//! collector that is down costs failed exports and warnings, never a crash.
//! [`Telemetry::shutdown`] sends what is left before the process exits.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use bindery_params::live::Live;

/// The base URL of an OTLP/HTTP receiver; turns exporting on.
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The full URL for traces only; turns exporting on too.
pub const TRACES_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// The service name when the environment gives none.
pub const SERVICE_NAME: &str = "bindery-sidecar";

/// The exporter's own HTTP stack and the SDK's internal logs: never traced,
/// or each export would make spans to export.
/// (The SDK's internal logs use the package name as their target, hence
/// the hyphens.)
const UNTRACED: &[&str] = &[
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry_otlp",
    "opentelemetry-otlp",
    "opentelemetry_http",
    "opentelemetry-http",
    "reqwest",
    "hyper",
    "hyper_util",
    "h2",
];

/// How long the exit waits for the last spans to leave.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// A running span exporter. Shut it down before the process exits.
pub struct Telemetry {
    provider: SdkTracerProvider,
    /// Which variable gave the endpoint. (The URL itself is not repeated in
    /// logs: it may carry credentials.)
    variable: &'static str,
}

/// Why traces are not exported: the exporter the variable configures could
/// not be built (the server goes on without it).
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces ({variable}): {source}")]
pub struct ExportError {
    variable: &'static str,
    source: opentelemetry_otlp::ExporterBuildError,
}

fn env_set(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Telemetry {
    /// An exporter configured from the environment: `Ok(None)` when no
    /// endpoint is set, `Err` (a message for a warning) when it cannot be
    /// built, for instance from an endpoint that is no URL.
    pub fn from_env() -> Result<Option<Telemetry>, ExportError> {
        let variable = if env_set(TRACES_ENDPOINT_VAR).is_some() {
            TRACES_ENDPOINT_VAR
        } else if env_set(ENDPOINT_VAR).is_some() {
            ENDPOINT_VAR
        } else {
            return Ok(None);
        };
        if env_set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(|source| ExportError { variable, source })?;
        // Each span is scrubbed as it ends, while what it quotes is live.
        let batch = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter).build();
        let provider = SdkTracerProvider::builder()
            .with_resource(resource())
            .with_span_processor(ScrubbingProcessor(batch))
            .build();
        Ok(Some(Telemetry { provider, variable }))
    }

    /// The variable that configured the endpoint.
    pub fn variable(&self) -> &'static str {
        self.variable
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans, with
    /// `filter` (the logs' filter) less the exporter's own crates.
    pub fn layer<S>(&self, mut filter: tracing_subscriber::EnvFilter) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        for target in UNTRACED {
            if let Ok(d) = format!("{target}=off").parse() {
                filter = filter.add_directive(d);
            }
        }
        // The instrumentation scope is the library (as `tracing` targets
        // name it); the service, in the resource, is the process.
        let scope = InstrumentationScope::builder(env!("CARGO_CRATE_NAME"))
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer_with_scope(scope))
            .with_filter(filter)
    }

    /// Send the spans still buffered and stop the exporter; a failure is
    /// logged, not returned: telemetry never changes how the process ends.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(
                "the last spans may not have been exported ({}): {e}",
                self.variable
            );
        }
    }
}

/// The SDK's resource (`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`,
/// the SDK's name and version), named `bindery-sidecar` unless the
/// environment names the service.
fn resource() -> Resource {
    let named = env_set("OTEL_SERVICE_NAME").is_some()
        || env_set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attrs| {
            attrs
                .split(',')
                .any(|kv| kv.split('=').next().map(str::trim) == Some("service.name"))
        });
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name(SERVICE_NAME).build()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_text_record_cannot_forge_another_or_move_the_cursor() {
        let forged =
            "INFO tool=bash_x arg=a\n2026-01-01 INFO forged\r\u{1b}[2K\u{1b}]0;t\u{7}\u{9b}x\n";
        let out = escape_controls(forged, false);
        assert_eq!(
            out,
            "INFO tool=bash_x arg=a\\n2026-01-01 INFO forged\\r\\u{1b}[2K\\u{1b}]0;t\\u{7}\\u{9b}x\n"
        );
        assert_eq!(out.matches('\n').count(), 1);
        // Colours the formatter writes stay on a terminal; anything else does not.
        let coloured = "\u{1b}[32mINFO\u{1b}[0m a=\u{1b}[1A\n";
        assert_eq!(
            escape_controls(coloured, true),
            "\u{1b}[32mINFO\u{1b}[0m a=\\u{1b}[1A\n"
        );
        assert_eq!(
            escape_controls("a\u{2028}b\u{202e}c\u{2066}d\n", false),
            "a\\u{2028}b\\u{202e}c\\u{2066}d\n"
        );
        assert!(matches!(
            escape_controls("plain\ttext\n", false),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    use super::*;

    #[test]
    fn every_untraced_target_is_a_valid_directive() {
        for target in UNTRACED {
            let d: Result<tracing_subscriber::filter::Directive, _> =
                format!("{target}=off").parse();
            assert!(d.is_ok(), "{target}: {d:?}");
        }
    }
}

/// A log writer that scrubs each record of the live secret values before
/// it is written (the formatter writes one record at a time). With `json`,
/// each string in the record is scrubbed as it reads once unescaped: a
/// value the logged text already had escaped once is still found.
pub struct Scrubbed<M> {
    pub inner: M,
    pub json: bool,
    /// The text format colours its records: its own colour codes stay.
    pub ansi: bool,
}

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for Scrubbed<M>
{
    type Writer = ScrubbedWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbedWriter {
            inner: self.inner.make_writer(),
            json: self.json,
            ansi: self.ansi,
        }
    }
}

pub struct ScrubbedWriter<W> {
    inner: W,
    json: bool,
    ansi: bool,
}

impl<W: std::io::Write> std::io::Write for ScrubbedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let live = bindery_params::live::scrubber();
        if self.json && live.is_empty() {
            // JSON escapes every control character itself.
            return self.inner.write(buf);
        }
        let text = String::from_utf8_lossy(buf);
        let scrubbed = match (self.json, live.is_empty()) {
            (true, _) => scrub_json_lines(&text, &live),
            (false, true) => escape_controls(&text, self.ansi).into_owned(),
            (false, false) => escape_controls(&live.scrub(&text), self.ansi).into_owned(),
        };
        self.inner.write_all(scrubbed.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A text record (one line, ending in `\n`) with every control character
/// inside it escaped (`\n`, `\r`, `\u{1b}`, ...): a value it quotes (a
/// tool's model-chosen argument, an MCP server's stderr) cannot end the
/// line and forge the next record, nor move the terminal's cursor. With
/// `ansi`, colour codes (`ESC [ digits m`) stay, which the formatter
/// writes itself and which forge nothing.
pub fn escape_controls(record: &str, ansi: bool) -> std::borrow::Cow<'_, str> {
    use super::terminal_text::{push_escaped, shown_as_is as plain};
    let body = record.strip_suffix('\n').unwrap_or(record);
    if body.chars().all(plain) {
        return std::borrow::Cow::Borrowed(record);
    }
    let mut out = String::with_capacity(record.len() + 16);
    let mut rest = body;
    while let Some(c) = rest.chars().next() {
        if ansi && c == '\u{1b}' {
            let sgr = rest[1..].strip_prefix('[').and_then(|r| {
                let n = r.find(|c: char| !(c.is_ascii_digit() || c == ';'))?;
                r[n..].starts_with('m').then_some(n + 3)
            });
            if let Some(n) = sgr {
                out.push_str(&rest[..n]);
                rest = &rest[n..];
                continue;
            }
        }
        if plain(c) {
            out.push(c);
        } else {
            push_escaped(&mut out, c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out.push_str(&record[body.len()..]);
    std::borrow::Cow::Owned(out)
}

/// Each line of `text` that is a JSON record with its strings (keys too)
/// scrubbed, and the whole line scrubbed as text after; a line that is no
/// JSON as text.
fn scrub_json_lines(text: &str, live: &Live) -> String {
    fn strings(v: &mut serde_json::Value, live: &Live) {
        match v {
            serde_json::Value::String(s) => *s = live.scrub(s),
            serde_json::Value::Array(items) => items.iter_mut().for_each(|i| strings(i, live)),
            serde_json::Value::Object(map) => {
                let old = std::mem::take(map);
                for (k, mut v) in old {
                    strings(&mut v, live);
                    map.insert(live.scrub(&k), v);
                }
            }
            _ => {}
        }
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches('\n');
        match serde_json::from_str::<serde_json::Value>(body) {
            Ok(mut v) => {
                strings(&mut v, live);
                out.push_str(&live.scrub(&v.to_string()));
                out.push_str(&line[body.len()..]);
            }
            Err(_) => out.push_str(&live.scrub(line)),
        }
    }
    out
}

/// A span processor that scrubs each span of the live secret values as it
/// ends (when the values it may quote are still live), before the one it
/// wraps batches it for export.
#[derive(Debug)]
struct ScrubbingProcessor<P>(P);

impl<P: opentelemetry_sdk::trace::SpanProcessor> opentelemetry_sdk::trace::SpanProcessor
    for ScrubbingProcessor<P>
{
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.0.on_start(span, cx)
    }

    fn on_end(&self, mut span: opentelemetry_sdk::trace::SpanData) {
        let live = bindery_params::live::scrubber();
        if !live.is_empty() {
            scrub_span(&mut span, &live);
        }
        self.0.on_end(span)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource)
    }
}

fn scrub_span(span: &mut opentelemetry_sdk::trace::SpanData, live: &Live) {
    if let std::borrow::Cow::Owned(name) = scrub_cow(live, &span.name) {
        span.name = name.into();
    }
    scrub_attributes(&mut span.attributes, live);
    for event in span.events.events.iter_mut() {
        if let std::borrow::Cow::Owned(name) = scrub_cow(live, &event.name) {
            event.name = name.into();
        }
        scrub_attributes(&mut event.attributes, live);
    }
    if let opentelemetry::trace::Status::Error { description } = &mut span.status {
        if let std::borrow::Cow::Owned(d) = scrub_cow(live, description) {
            *description = d.into();
        }
    }
}

fn scrub_attributes(attributes: &mut [opentelemetry::KeyValue], live: &Live) {
    use opentelemetry::{Array, StringValue, Value};
    let scrub = |s: &StringValue| match scrub_cow(live, s.as_str()) {
        std::borrow::Cow::Owned(t) => Some(StringValue::from(t)),
        std::borrow::Cow::Borrowed(_) => None,
    };
    for kv in attributes {
        match &mut kv.value {
            Value::String(s) => {
                if let Some(t) = scrub(s) {
                    *s = t;
                }
            }
            Value::Array(Array::String(items)) => {
                for s in items {
                    if let Some(t) = scrub(s) {
                        *s = t;
                    }
                }
            }
            _ => {}
        }
    }
}

/// `text` scrubbed; borrowed when nothing changed.
fn scrub_cow<'t>(live: &Live, text: &'t str) -> std::borrow::Cow<'t, str> {
    let out = live.scrub(text);
    if out == text {
        std::borrow::Cow::Borrowed(text)
    } else {
        std::borrow::Cow::Owned(out)
    }
}
