//! OpenTelemetry export, for real: a tiny OTLP/HTTP receiver in the test,
//! the real binary (`tool-call`, and `serve` until SIGTERM) pointed at it
//! with `OTEL_EXPORTER_OTLP_ENDPOINT`, and the protobuf bodies it receives
//! checked for the spans, the service name and the absence of a secret.

use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::Router;

use crate::common::{message_waited, new_session, tool_then_answer, World, CANARY};
use serde_json::json;

/// Bound on every wait for an export (they come within a second when the
/// machine is idle).
const WAIT: Duration = Duration::from_secs(30);

/// One request as the receiver got it.
#[derive(Debug)]
struct Export {
    method: Method,
    path: String,
    content_type: String,
    body: Vec<u8>,
}

/// An OTLP/HTTP receiver on a loopback port: records every request and
/// answers 200 with an empty `Export*ServiceResponse`.
struct Receiver {
    url: String,
    got: mpsc::Receiver<Export>,
    _rt: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Receiver {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, got) = mpsc::channel();
        let app = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let tx = tx.clone();
                async move {
                    let content_type = headers
                        .get(header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let _ = tx.send(Export {
                        method,
                        path: uri.path().to_string(),
                        content_type,
                        body: body.to_vec(),
                    });
                    (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                        .into_response()
                }
            },
        );
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        rt.spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver { url, got, _rt: rt }
    }

    /// The first export (waiting at most [`WAIT`]), then every one already
    /// received.
    fn exports(&self) -> Vec<Export> {
        let first = self
            .got
            .recv_timeout(WAIT)
            .expect("an export reached the receiver in time");
        let mut all = vec![first];
        all.extend(self.got.try_iter());
        all
    }
}

/// `tool-call` of the invoices example for tenant acme-corp, with the
/// canary as the billing token and `env` added.
fn tool_call(env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bindery-sidecar"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("BINDERY_PARAM_BILLING_TOKEN", CANARY)
        .envs(env.iter().copied())
        .args(["tool-call", "--agent-file"])
        .arg(crate::common::repo().join("examples/invoices/agent.yaml"))
        .args([
            "--set",
            "tenant=acme-corp",
            "--tool",
            "bash_query-invoices",
            "--args",
            "{}",
        ])
        .output()
        .expect("the binary runs")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// The `service.name` resource attribute of an export: the string value
/// right after the key, as protobuf lays out a `KeyValue` (key, then an
/// `AnyValue` holding a `string_value`), lengths being under 128 here.
fn service_name(body: &[u8]) -> Option<String> {
    let key = b"service.name";
    let at = body.windows(key.len()).position(|w| w == key)? + key.len();
    // field 2 (value), length-delimited; then field 1 (string_value).
    match body.get(at..at + 4)? {
        [0x12, _, 0x0a, len] => {
            let text = body.get(at + 4..at + 4 + *len as usize)?;
            Some(String::from_utf8_lossy(text).into_owned())
        }
        _ => None,
    }
}

/// Whether a span called `name` is in an export: a `Span`'s `name` is its
/// field 5, a string (tag 0x2a, then the length).
fn has_span(body: &[u8], name: &str) -> bool {
    let mut encoded = vec![0x2a, name.len() as u8];
    encoded.extend_from_slice(name.as_bytes());
    body.windows(encoded.len()).any(|w| w == encoded.as_slice())
}

fn assert_the_call_worked(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("INV-1002"), "{stdout}");
    assert!(!stdout.contains(CANARY) && !stderr.contains(CANARY));
}

#[test]
fn tool_call_spans_reach_the_collector_without_the_secret() {
    let receiver = Receiver::start();
    let out = tool_call(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
        ("BINDERY_LOG", "debug"),
    ]);
    assert_the_call_worked(&out);
    let exports = receiver.exports();
    for e in &exports {
        assert_eq!(e.method, Method::POST);
        assert_eq!(e.path, "/v1/traces", "{e:?}");
        assert_eq!(e.content_type, "application/x-protobuf");
    }
    let bodies: Vec<&[u8]> = exports.iter().map(|e| e.body.as_slice()).collect();
    assert!(
        bodies.iter().any(|b| has_span(b, "tool_call")),
        "no `tool_call` span in {bodies:?}"
    );
    // The bash tool's events travel inside the span, the tool named.
    assert!(bodies.iter().any(|b| contains(b, "bash tool started")));
    assert!(bodies.iter().any(|b| contains(b, "bash_query-invoices")));
    // The service is named, by default after the binary.
    for b in &bodies {
        assert_eq!(service_name(b).as_deref(), Some("bindery-sidecar"));
    }
    // The token went to the script (it printed invoices), never to the collector.
    for b in &bodies {
        assert!(!contains(b, CANARY), "the canary was exported");
    }
}

#[test]
fn otel_service_name_renames_the_service() {
    let receiver = Receiver::start();
    let out = tool_call(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
        ("OTEL_SERVICE_NAME", "billing-assistant"),
    ]);
    assert_the_call_worked(&out);
    for e in receiver.exports() {
        assert_eq!(service_name(&e.body).as_deref(), Some("billing-assistant"));
    }
}

/// An endpoint that is no URL, or one where nothing listens, costs a
/// warning; the command works as without telemetry.
#[test]
fn a_bad_endpoint_is_a_warning_not_a_failure() {
    let out = tool_call(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[not a url")]);
    assert_the_call_worked(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("going on without exporting traces"),
        "{stderr}"
    );

    // Bind a port, then free it: nothing listens there any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = tool_call(&[(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        &format!("http://127.0.0.1:{port}"),
    )]);
    assert_the_call_worked(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ExportError"), "{stderr}");
}

/// A session run by `serve`: its `run`, `model_turn` and `tool_call` spans
/// leave when the server stops on SIGTERM, without the session's secret.
#[test]
fn a_served_run_is_exported_when_the_server_stops() {
    let receiver = Receiver::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        let w = World::new(tool_then_answer).await;
        let (mut sidecar, api) = w.start(
            &["--pin", "tenant=acme-corp"],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)],
        );
        let id = new_session(
            &api,
            json!({"agent": "invoices", "params": {"billing_token": CANARY}}),
        )
        .await;
        message_waited(&api, &id, "which invoices are overdue?").await;
        let status = sidecar.stop();
        assert!(!sidecar.logs().contains(CANARY));
        status
    });
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let exports = receiver.exports();
    let bodies: Vec<&[u8]> = exports.iter().map(|e| e.body.as_slice()).collect();
    for span in ["run", "model_turn", "tool_call"] {
        assert!(
            bodies.iter().any(|b| has_span(b, span)),
            "no `{span}` span in {bodies:?}"
        );
    }
    assert!(bodies.iter().any(|b| contains(b, "bash tool started")));
    for b in &bodies {
        assert_eq!(service_name(b).as_deref(), Some("bindery-sidecar"));
        assert!(!contains(b, CANARY), "the canary was exported");
    }
}

/// A lookup's only option, chosen by a selection marked `id_sensitive`, is
/// the argument of a read-only bash tool: the tool's `bash tool started`
/// event (its command line holds the id) is exported scrubbed, and the log
/// does not show the id either.
#[test]
fn an_id_sensitive_id_is_scrubbed_from_exported_spans() {
    const SLOT: &str = "slot-SENSITIVE-otlp-5e93a1";
    let receiver = Receiver::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let tool = |slug: &str, args: &str, run: &str| {
        format!(
            "#!/usr/bin/env python3\nimport json, sys\nif sys.argv[1:] == ['describe']:\n    print(json.dumps({{'slug': '{slug}', 'description': '{slug}', 'args': [{args}]}}))\n    sys.exit(0)\n{run}\n"
        )
    };
    crate::common::executable(
        &tools.join("slots"),
        &tool(
            "slots",
            "",
            &format!(
                "print(json.dumps({{'slots': [{{'slot_token': '{SLOT}', 'label': '09:00'}}]}}))"
            ),
        ),
    );
    crate::common::executable(
        &tools.join("show"),
        &tool(
            "show",
            "{'name': 'slot_token', 'description': 'the slot', 'type': 'string', 'backing_type': 'string', 'arity': 'single', 'mode': 'dashdashspace'}",
            "print('shown')",
        ),
    );
    let status = rt.block_on(async {
        let mock = bindery_tests::mock_llm::MockLlm::start(|req: &serde_json::Value| {
            match bindery_tests::mock_llm::last_message(req)["role"].as_str() {
                Some("tool") => bindery_tests::mock_llm::MockReply::text("done"),
                _ => bindery_tests::mock_llm::MockReply::tool_call("bash_show", json!({})),
            }
        })
        .await;
        let agent = dir.path().join("slots.yaml");
        std::fs::write(
            &agent,
            format!(
                r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: slots
spec:
  model: {{url: "{url}", name: mock-model}}
  toolboxes:
    - bash:
        directory: "{tools}"
        tools:
          - tool: slots
            readOnly: true
          - tool: show
            readOnly: true
            depends_on:
              - tool: slots
                select: {{items_path: $.slots, id_path: $.slot_token, label_path: $.label, id_sensitive: true}}
                map: {{$.slot_token: $.slot_token}}
"#,
                url = mock.url(),
                tools = tools.display()
            ),
        )
        .unwrap();
        let (mut sidecar, api) = crate::common::serve(
            &agent,
            &crate::common::sqlite_in(dir.path()),
            &[],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)],
            dir.path(),
        );
        let id = new_session(&api, json!({"agent": "slots"})).await;
        let reply = message_waited(&api, &id, "show the slot").await;
        assert!(reply.text.contains("shown"), "{}", reply.text);
        let status = sidecar.stop();
        let logs = sidecar.logs();
        assert!(logs.contains("bash tool started"), "{logs}");
        assert!(!logs.contains(SLOT), "the id is in the log:\n{logs}");
        status
    });
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let mut bodies: Vec<Vec<u8>> = Vec::new();
    // Every export until the one with the tool's event (its arguments are
    // not logged any more; the id must not be in any span either).
    while !bodies.iter().any(|b| contains(b, "bash tool started")) {
        bodies.extend(receiver.exports().into_iter().map(|e| e.body));
    }
    for b in &bodies {
        assert!(!contains(b, SLOT), "the id_sensitive id was exported");
    }
}
