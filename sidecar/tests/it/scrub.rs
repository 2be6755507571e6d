//! Tool output is scrubbed of secrets through the real server, one test per
//! toolbox kind: a bash tool, an OpenAPI operation (a 200 body and an error
//! body), an MCP tool and a helper each print a secret in every encoding
//! `fixtures/leaky/leak_forms.py` knows. None of those forms may reach the
//! model, an API reply, the event stream, the store or the logs; the model
//! sees `<secret:NAME>` in their place.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::common::*;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use bindery_tests::mock_llm::{last_message, tool_results, MockLlm, MockReply};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// The session's secret: its base64 differs between the alphabets, and
/// URL- and JSON-encoding change it.
const TOKEN: &str = "canary-SEKRIT \"q\" /+&=?\\ ~~~???";
/// The helper's own process-scope secret, which its caller never holds.
const VAULT: &str = "vault-SEKRIT 'k' /+&=?~~~ 456";
/// The OpenAPI toolbox's credential, read from the environment at load.
const API_KEY: &str = "apikey-SEKRIT/+?~~~ 789";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/leaky")
}

/// `form: text` lines for `value`, as the leaky tools print them.
async fn leak_lines(value: &str) -> String {
    let mut child = tokio::process::Command::new("python3")
        .arg(fixtures().join("leak_forms.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(value.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// Every encoded form of `value` (the text after `form: `).
async fn forms(value: &str) -> Vec<String> {
    let lines = leak_lines(value).await;
    let forms: Vec<String> = lines
        .lines()
        .map(|l| l.split_once(": ").unwrap().1.to_string())
        .collect();
    assert!(forms.len() >= 10, "{lines}");
    forms
}

/// An API whose `leak` operation prints the bearer token and its API key
/// in every form, and whose `reject` operation fails quoting them.
async fn start_api() -> std::net::SocketAddr {
    async fn leaked(headers: &HeaderMap) -> String {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let bearer = header("authorization");
        let token = bearer.trim_start_matches("Bearer ");
        format!(
            "authorization: {bearer}\n{}{}",
            leak_lines(token).await,
            leak_lines(&header("x-api-key")).await
        )
    }
    let doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "leaky", "version": "1"},
        "paths": {
            "/leak": {"get": {"operationId": "leak_http", "summary": "Prints the credentials",
                "responses": {"200": {"description": "ok"}}}},
            "/reject": {"get": {"operationId": "reject_http", "summary": "Refuses the credentials",
                "responses": {"401": {"description": "no"}}}}
        }
    });
    let app = Router::new()
        .route("/openapi.json", get(move || async move { Json(doc) }))
        .route("/leak", get(|h: HeaderMap| async move { leaked(&h).await }))
        .route(
            "/reject",
            get(|h: HeaderMap| async move {
                (
                    StatusCode::UNAUTHORIZED,
                    format!("bad credentials:\n{}", leaked(&h).await),
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The leaky agent (all four kinds of toolbox) and its helper `vault`.
fn agent_files(dir: &Path, model_url: &str, api: std::net::SocketAddr) -> PathBuf {
    let f = fixtures();
    let tools = f.join("tools");
    std::fs::write(
        dir.join("vault.yaml"),
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: vault
spec:
  model: {{url: "{model_url}", name: mock-model}}
  systemPrompt: You are VAULT.
  parameters:
    - {{name: vault_key, secret: true, default: {{env: VAULT_KEY}}}}
  toolboxes:
    - bash:
        directory: "{tools}"
        bindings:
          - {{arg: token, value: {{param: vault_key}}}}
"#,
            tools = tools.display()
        ),
    )
    .unwrap();
    let path = dir.join("leaky.yaml");
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata:
  name: leaky
spec:
  model: {{url: "{model_url}", name: mock-model}}
  systemPrompt: You are LEAKY.
  parameters:
    - {{name: token, secret: true, scope: session}}
  toolboxes:
    - bash:
        directory: "{tools}"
        bindings:
          - {{arg: token, value: {{param: token}}}}
    - openapi:
        spec: "http://{api}/openapi.json"
        baseUrl: "http://{api}"
        secrets:
          - source: {{param: token}}
            header: {{name: Authorization, template: "Bearer {{{{secret}}}}"}}
          - source: {{env: LEAKY_API_KEY}}
            header: {{name: X-Api-Key}}
    - mcp:
        name: leaky
        command: [python3, "{mcp}"]
        bindings:
          - {{tool: leak, arg: token, value: {{param: token}}}}
  helpers:
    - path: vault.yaml
"#,
            tools = tools.display(),
            mcp = f.join("leak-mcp.py").display()
        ),
    )
    .unwrap();
    path
}

/// LEAKY calls `tool` (with `args`) once, then answers with the result;
/// VAULT calls its bash tool once, then answers with the result.
fn script(tool: &'static str, args: Value) -> impl Fn(&Value) -> MockReply {
    move |req: &Value| {
        let system = req["messages"][0]["content"].as_str().unwrap_or("");
        let results = tool_results(req);
        match (system, results.len()) {
            ("You are VAULT.", 0) => MockReply::tool_call("bash_leak", json!({})),
            (_, 0) => MockReply::tool_call(tool, args.clone()),
            _ => MockReply::text(format!(
                "the tool said: {}",
                last_message(req)["content"].as_str().unwrap_or("")
            )),
        }
    }
}

/// Run one message calling `tool`, then check that no form of any secret
/// went anywhere and that the model saw `<secret:NAME>` for each in `named`.
async fn leak_through(tool: &'static str, args: Value, named: &[(&str, &str)]) {
    let api_addr = start_api().await;
    let mock = MockLlm::start(script(tool, args)).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::create_dir_all(dir.path().join("store")).unwrap();
    let agent = agent_files(dir.path(), &mock.url(), api_addr);
    let store = sqlite_in(&dir.path().join("store"));
    let (mut sidecar, api) = serve(
        &agent,
        &store,
        &[],
        &[
            ("BINDERY_LOG", "debug"),
            ("VAULT_KEY", VAULT),
            ("LEAKY_API_KEY", API_KEY),
        ],
        dir.path(),
    );
    let id = new_session(&api, json!({"agent": "leaky", "params": {"token": TOKEN}})).await;
    let reply = message_waited(&api, &id, "print your token").await;
    assert_eq!(reply.json["status"], "idle", "{}", reply.text);
    let (status, events) = api
        .events(&format!("/v1/sessions/{id}/events"), Some(OWNER), None)
        .await;
    assert_eq!(status, 200);
    let mut events = events.unwrap();
    let seen = events
        .until("run_finished", std::time::Duration::from_secs(30))
        .await;
    assert!(seen.iter().any(|e| e.event == "run_finished"), "{seen:?}");
    assert!(seen.iter().any(|e| e.event == "tool_result"), "{seen:?}");
    // An open stream would hold the server's graceful shutdown.
    let stream = std::mem::take(&mut events.raw);
    drop(events);
    let view = api
        .call("GET", &format!("/v1/sessions/{id}"), Some(OWNER), None)
        .await;
    sidecar.stop();

    // The model saw the tool's output, every secret replaced by its name.
    let requests = mock.requests();
    let result = requests
        .iter()
        .filter(|r| r["messages"][0]["content"] == "You are LEAKY.")
        .flat_map(|r| tool_results(r).into_iter().map(str::to_string))
        .next_back()
        .expect("the tool's result reached the model");
    for (name, _) in named {
        let marker = format!("<secret:{name}>");
        for form in ["raw", "base64", "base64url", "urlencoded", "form"] {
            let prefix = if form == "form" { "form: t=" } else { "" };
            let line = if prefix.is_empty() {
                format!("{form}: {marker}")
            } else {
                format!("{prefix}{marker}")
            };
            assert!(result.contains(&line), "no `{line}` in:\n{result}");
        }
        assert!(result.contains(&format!("json: \"{marker}\"")), "{result}");
        for form in [
            "basic-auth",
            "base64-shift0",
            "base64-shift1",
            "base64-shift2",
        ] {
            let line = result
                .lines()
                .filter(|l| l.starts_with(&format!("{form}: ")))
                .find(|l| l.contains(&marker));
            assert!(
                line.is_some(),
                "{form} is not scrubbed to {marker}:\n{result}"
            );
        }
    }

    // No form of any secret anywhere.
    let mut places: Vec<(String, String)> = vec![
        ("the reply".into(), reply.text.clone()),
        ("the session".into(), view.text.clone()),
        ("the event stream".into(), stream),
        ("the logs".into(), sidecar.logs()),
        (
            "the log files".into(),
            String::from_utf8_lossy(&raw_files(&dir.path().join("logs"), "")).into_owned(),
        ),
        (
            "the store".into(),
            String::from_utf8_lossy(&raw_files(&dir.path().join("store"), "")).into_owned(),
        ),
    ];
    for (headers, body) in mock.raw_requests() {
        places.push(("a model request".into(), body));
        places.push(("a model request's headers".into(), format!("{headers:?}")));
    }
    for secret in [TOKEN, VAULT, API_KEY] {
        for form in forms(secret).await {
            let escaped = serde_json::to_string(&form).unwrap();
            let escaped = &escaped[1..escaped.len() - 1];
            for (place, text) in &places {
                assert!(
                    !text.contains(&form) && !text.contains(escaped),
                    "{form:?} (a form of a secret) is in {place}:\n{text}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_output_is_scrubbed() {
    leak_through("bash_leak", json!({}), &[("token", TOKEN)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_bodies_and_errors_are_scrubbed() {
    leak_through(
        "leak_http",
        json!({}),
        &[("token", TOKEN), ("x-api-key", API_KEY)],
    )
    .await;
    leak_through(
        "reject_http",
        json!({}),
        &[("token", TOKEN), ("x-api-key", API_KEY)],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_results_are_scrubbed() {
    leak_through("mcp_leaky_leak", json!({}), &[("token", TOKEN)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helpers_own_secrets_are_scrubbed() {
    leak_through(
        "prompt_agent_vault",
        json!({"what": "print your key"}),
        &[("vault_key", VAULT)],
    )
    .await;
}

/// Properties of the scrubber itself, over random values, encodings and
/// surrounding text (proptest; `PROPTEST_CASES` sets the count).
///
/// A case is a secret `s` (at least `MIN_LEN` bytes: printable ASCII and
/// some non-ASCII, one character outside the BMP among them), one of the
/// promised encodings `E` of it (plain; JSON with each character literal,
/// short-escaped or `\u`-escaped in either case; percent-encoded byte by
/// byte in either case with `+` or `%20` for a space; base64 standard or
/// URL-safe, padded or not, of `s` between 0..=4 bytes before and 0..=3
/// after, wrapped at any width with `\n` or `\r\n`; hex in either case),
/// and text `P` and `S` before and after it drawn from characters that no
/// form of `s` uses. `T = P + E + S`; `m` is where the part of `E` that
/// depends on `s` alone begins.
///
/// - scrubbed: `scrub(T)` is `P`, then at most the base64 characters that
///   hold bits of the bytes before `s` (and line breaks), one marker, at
///   most those of the bytes after `s` and the padding, then `S`. So it
///   holds neither `s` nor any part of `E` that depends on `s` alone.
/// - cut: for every limit `l` (`0..=len(T)`), with `(o, cut) =
///   scrub_cut(T, l)`: `o` is a prefix of `scrub(T)` (so, by the first
///   property, it holds no byte of `E`'s part that depends on `s` alone);
///   when `l > m` it holds the marker (the form that starts before the
///   limit is replaced whole, none of its leading bytes kept); and `cut`
///   is false exactly when `o` is all of `scrub(T)`.
mod properties {
    use bindery_params::scrub::{Scrubber, MIN_LEN};
    use bindery_params::SecretString;
    use proptest::prelude::*;

    const MARKER: &str = "<secret:t>";

    /// How one case encodes its secret.
    #[derive(Clone, Debug)]
    enum Encoding {
        Plain,
        /// Per character: 0 literal (where JSON allows it), 1 short
        /// escape (where there is one), 2 `\u` lower, 3 `\u` upper.
        Json(Vec<u8>),
        /// Per byte: encoded or not (reserved bytes always are), upper
        /// case; `+` for a space or not.
        Percent(Vec<(bool, bool)>, bool),
        Base64 {
            url: bool,
            pad: bool,
            before: Vec<u8>,
            after: Vec<u8>,
            /// 0: one line.
            width: usize,
            crlf: bool,
        },
        Hex(bool),
    }

    fn secret() -> impl Strategy<Value = String> {
        let ch = prop_oneof![
            8 => (0x20u8..0x7f)
                .prop_filter("not a surrounding character", |b| !b"|#".contains(b))
                .prop_map(char::from),
            1 => prop::sample::select(vec!['\u{e9}', '\u{df}', '\u{20ac}', '\u{4e2d}', '\u{1F600}']),
        ];
        prop::collection::vec(ch, MIN_LEN..40).prop_map(|c| c.into_iter().collect())
    }

    fn encoding() -> impl Strategy<Value = Encoding> {
        prop_oneof![
            Just(Encoding::Plain),
            prop::collection::vec(0u8..4, 40).prop_map(Encoding::Json),
            (
                prop::collection::vec(any::<(bool, bool)>(), 160),
                any::<bool>()
            )
                .prop_map(|(b, plus)| Encoding::Percent(b, plus)),
            (
                any::<bool>(),
                any::<bool>(),
                prop::collection::vec(any::<u8>(), 0..=4),
                prop::collection::vec(any::<u8>(), 0..=3),
                prop_oneof![Just(0usize), 1usize..100, Just(76usize)],
                any::<bool>()
            )
                .prop_map(|(url, pad, before, after, width, crlf)| Encoding::Base64 {
                    url,
                    pad,
                    before,
                    after,
                    width,
                    crlf
                }),
            any::<bool>().prop_map(Encoding::Hex),
        ]
    }

    fn surrounding() -> impl Strategy<Value = String> {
        "[|# ]{0,12}".prop_map(|s| s.replace(' ', "\t"))
    }

    const STD: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    /// `E`, and how many of its characters (line breaks not counted) come
    /// before the part that depends on the secret alone.
    fn encode(s: &str, e: &Encoding) -> (String, usize) {
        match e {
            Encoding::Plain => (s.to_string(), 0),
            Encoding::Json(how) => {
                let mut out = String::new();
                for (i, c) in s.chars().enumerate() {
                    let short = match c {
                        '"' => Some("\\\""),
                        '\\' => Some("\\\\"),
                        '/' => Some("\\/"),
                        _ => None,
                    };
                    match (how[i % how.len()], short) {
                        (0, None) => out.push(c),
                        (0 | 1, Some(short)) => out.push_str(short),
                        (1, None) => out.push(c),
                        (n, _) => {
                            let mut units = [0u16; 2];
                            for u in c.encode_utf16(&mut units) {
                                if n == 2 {
                                    out.push_str(&format!("\\u{u:04x}"));
                                } else {
                                    out.push_str(&format!("\\u{u:04X}"));
                                }
                            }
                        }
                    }
                }
                (out, 0)
            }
            Encoding::Percent(how, plus) => {
                let mut out = String::new();
                for (i, &b) in s.as_bytes().iter().enumerate() {
                    let (encode, upper) = how[i % how.len()];
                    if b == b' ' && *plus {
                        out.push('+');
                    } else if b.is_ascii_alphanumeric() && !encode {
                        out.push(char::from(b));
                    } else if upper {
                        out.push_str(&format!("%{b:02X}"));
                    } else {
                        out.push_str(&format!("%{b:02x}"));
                    }
                }
                (out, 0)
            }
            Encoding::Hex(upper) => {
                let h = hex::encode(s);
                (if *upper { h.to_uppercase() } else { h }, 0)
            }
            Encoding::Base64 {
                url,
                pad,
                before,
                after,
                width,
                crlf,
            } => {
                let mut data = before.clone();
                data.extend_from_slice(s.as_bytes());
                data.extend_from_slice(after);
                let alphabet = if *url { URL } else { STD };
                let mut text = String::new();
                for chunk in data.chunks(3) {
                    let n = chunk
                        .iter()
                        .enumerate()
                        .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
                    for k in 0..4 {
                        if k <= chunk.len() {
                            text.push(char::from(alphabet[((n >> (18 - 6 * k)) & 63) as usize]));
                        } else if *pad {
                            text.push('=');
                        }
                    }
                }
                let wrapped = if *width == 0 {
                    text
                } else {
                    let chars: Vec<char> = text.chars().collect();
                    chars
                        .chunks(*width)
                        .map(|c| c.iter().collect::<String>())
                        .collect::<Vec<_>>()
                        .join(if *crlf { "\r\n" } else { "\n" })
                };
                (wrapped, (before.len() * 8).div_ceil(6))
            }
        }
    }

    /// Characters other than line breaks.
    fn visible(text: &str) -> usize {
        text.chars().filter(|c| !matches!(c, '\r' | '\n')).count()
    }

    /// The case's text, its secret's scrubber, the parts and where `m` is.
    struct Case {
        text: String,
        scrubber: Scrubber,
        before: String,
        after: String,
        /// At most this many characters may stay before the marker, and
        /// after it, besides `P` and `S` (and line breaks).
        left: (usize, usize),
        m: usize,
    }

    fn case(s: &str, e: &Encoding, before: String, after: String) -> Option<Case> {
        if let Encoding::Base64 { before: b, .. } = e {
            // At a shifted alignment a value needs 5 bytes to leave the
            // 6 characters looked for (see the module's doc).
            if b.len() % 3 != 0 && s.len() < 5 {
                return None;
            }
        }
        let (encoded, lead) = encode(s, e);
        let left = match e {
            Encoding::Base64 { after, .. } => (lead, (after.len() * 8).div_ceil(6) + 3),
            _ => (0, 0),
        };
        // `m`: past `lead` visible characters of `E`.
        let mut m = before.len();
        let mut seen = 0;
        for c in encoded.chars() {
            if seen == lead && !matches!(c, '\r' | '\n') {
                break;
            }
            if !matches!(c, '\r' | '\n') {
                seen += 1;
            }
            m += c.len_utf8();
        }
        let mut scrubber = Scrubber::default();
        scrubber.add("t", &SecretString::new(s));
        Some(Case {
            text: format!("{before}{encoded}{after}"),
            scrubber,
            before,
            after,
            left,
            m,
        })
    }

    proptest! {
        #[test]
        fn every_promised_form_is_scrubbed(
            s in secret(),
            e in encoding(),
            before in surrounding(),
            after in surrounding(),
        ) {
            let Some(c) = case(&s, &e, before, after) else { return Ok(()) };
            let out = c.scrubber.scrub(&c.text);
            prop_assert!(!out.contains(&s), "{:?} in {:?}", s, out);
            prop_assert_eq!(out.matches(MARKER).count(), 1, "{:?} from {:?}", out, c.text);
            let (head, tail) = out.split_once(MARKER).unwrap();
            prop_assert!(head.starts_with(&c.before), "{:?}", out);
            prop_assert!(tail.ends_with(&c.after), "{:?}", out);
            prop_assert!(visible(&head[c.before.len()..]) <= c.left.0, "{:?} from {:?}", out, c.text);
            prop_assert!(visible(&tail[..tail.len() - c.after.len()]) <= c.left.1, "{:?} from {:?}", out, c.text);
        }

        #[test]
        fn a_cut_never_leaves_part_of_a_secret(
            s in secret(),
            e in encoding(),
            before in surrounding(),
            after in surrounding(),
        ) {
            let Some(c) = case(&s, &e, before, after) else { return Ok(()) };
            let full = c.scrubber.scrub(&c.text);
            for limit in 0..=c.text.len() {
                let (out, cut) = c.scrubber.scrub_cut(&c.text, limit);
                prop_assert!(full.starts_with(&out), "{} of {:?}: {:?} vs {:?}", limit, c.text, out, full);
                if limit > c.m {
                    prop_assert!(out.contains(MARKER), "{} of {:?}: {:?}", limit, c.text, out);
                }
                prop_assert_eq!(cut, out.len() < full.len(), "{} of {:?}: {:?}", limit, c.text, out);
            }
        }
    }
}
