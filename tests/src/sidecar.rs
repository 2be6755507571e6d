//! Starting and stopping the real `bindery-sidecar serve` from a test, on a
//! port chosen at run time, with its logs kept for inspection.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running `bindery-sidecar serve`.
pub struct Sidecar {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    pub owner_token: String,
    stderr_log: PathBuf,
    stdout_lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// What `serve` is started with, besides `--listen`.
pub struct Launch<'a> {
    pub bin: &'a str,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Where stderr goes (kept after the process ends).
    pub log_dir: &'a Path,
    pub owner_token: &'a str,
}

impl Sidecar {
    /// Start and wait until it says where it listens (or fail with its log).
    pub fn start(l: Launch<'_>) -> Sidecar {
        let mut cmd = Command::new(l.bin);
        cmd.arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(&l.args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("BINDERY_OWNER_TOKEN", l.owner_token)
            .envs(l.env.iter().map(|(k, v)| (k, v)));
        Sidecar::spawn(cmd, l.log_dir, l.owner_token)
    }

    /// Run `cmd` (a `serve` however it was spelled: the README's first-run
    /// tests build it from the README) and wait until it prints `listening
    /// on URL` (or fail with its log). Its stderr goes to a file in
    /// `log_dir`; `owner_token` is the token it serves with.
    pub fn spawn(mut cmd: Command, log_dir: &Path, owner_token: &str) -> Sidecar {
        let n = std::fs::read_dir(log_dir).map(|d| d.count()).unwrap_or(0);
        let stderr_log = log_dir.join(format!("sidecar-{n}.stderr"));
        let stderr = std::fs::File::create(&stderr_log).expect("stderr log");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("bindery-sidecar starts");
        let stdout = child.stdout.take().expect("stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let keep = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
                keep.lock().unwrap().push(line);
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{:?} did not start; its stderr:\n{}",
                    cmd.get_program(),
                    std::fs::read_to_string(&stderr_log).unwrap_or_default()
                );
            }
        };
        Sidecar {
            child,
            url,
            owner_token: owner_token.to_string(),
            stderr_log,
            stdout_lines: lines,
        }
    }

    /// Everything the process wrote to stderr and stdout so far.
    pub fn logs(&self) -> String {
        let mut s = std::fs::read_to_string(&self.stderr_log).unwrap_or_default();
        for l in self.stdout_lines.lock().unwrap().iter() {
            s.push_str(l);
            s.push('\n');
        }
        s
    }

    /// The process id (for /proc readings in benchmarks).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: a crash, for restart tests.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Send `signal` (`STOP`, `CONT`, …) to the process: `STOP` freezes
    /// it as a stalled node would, heartbeats and all.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Its exit status once it has exited, waiting at most `within`.
    pub fn exited_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return None,
            }
        }
    }

    /// SIGTERM and wait for a graceful exit.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        self.child.wait().ok()
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A small client for the session API.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

/// A response: status, JSON body (or `Null`) and the raw text.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub json: serde_json::Value,
    pub text: String,
}

impl Api {
    pub fn new(base: &str) -> Api {
        Api {
            base: base.trim_end_matches('/').to_string(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("http client"),
        }
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&serde_json::Value>,
    ) -> Reply {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("request reaches the sidecar");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        Reply { status, json, text }
    }
}

/// One server-sent event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<String>,
    /// Its type: `message` unless it named one.
    pub event: String,
    pub data: String,
}

impl From<bindery_sse::Event> for SseEvent {
    fn from(e: bindery_sse::Event) -> SseEvent {
        SseEvent {
            event: e.kind().to_owned(),
            id: e.id,
            data: e.data,
        }
    }
}

/// An open `text/event-stream`, read incrementally.
pub struct EventStream {
    resp: reqwest::Response,
    parser: bindery_sse::Parser,
    /// Events parsed, not yet returned.
    ready: std::collections::VecDeque<SseEvent>,
    /// Every byte received, for secrecy checks (a character cut between
    /// two reads is added once whole).
    pub raw: String,
    /// The start of a character the last read cut, held for the next.
    cut: Vec<u8>,
}

impl EventStream {
    fn new(resp: reqwest::Response) -> EventStream {
        EventStream {
            resp,
            parser: bindery_sse::Parser::default(),
            ready: Default::default(),
            raw: String::new(),
            cut: Vec::new(),
        }
    }

    /// The next event, or `None` when the stream ends.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(ev) = self.ready.pop_front() {
                return Some(ev);
            }
            let Some(chunk) = self.resp.chunk().await.ok().flatten() else {
                return self.parser.finish().map(SseEvent::from);
            };
            self.push_raw(&chunk);
            let events = self.parser.feed(&chunk).unwrap_or_else(|e| panic!("{e}"));
            self.ready.extend(events.into_iter().map(SseEvent::from));
        }
    }

    /// Appends `chunk` to [`EventStream::raw`], holding back a character
    /// cut at its end until the rest of it comes.
    fn push_raw(&mut self, chunk: &[u8]) {
        self.cut.extend_from_slice(chunk);
        let whole = match std::str::from_utf8(&self.cut) {
            // Cut inside its last character: keep that for the next read.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            _ => self.cut.len(),
        };
        let rest = self.cut.split_off(whole);
        self.raw.push_str(&String::from_utf8_lossy(&self.cut));
        self.cut = rest;
    }

    /// Events up to and including the first of `kind`, within `timeout`.
    pub async fn until(&mut self, kind: &str, timeout: Duration) -> Vec<SseEvent> {
        let mut seen = Vec::new();
        let read = async {
            while let Some(e) = self.next().await {
                let done = e.event == kind;
                seen.push(e);
                if done {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(timeout, read).await;
        seen
    }
}

impl Api {
    /// Open an event stream (status and the stream when it is 200).
    pub async fn events(
        &self,
        path: &str,
        token: Option<&str>,
        last_event_id: Option<&str>,
    ) -> (u16, Option<EventStream>) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        // No overall timeout: the stream stays open; callers bound their reads.
        let resp = req
            .timeout(Duration::from_secs(3600))
            .send()
            .await
            .expect("request reaches the sidecar");
        let status = resp.status().as_u16();
        if status != 200 {
            return (status, None);
        }
        (status, Some(EventStream::new(resp)))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::Api;

    /// An event stream whose HTTP chunks end inside a character (`é`, two
    /// bytes, and `✓`, three): the event's text comes out whole, and so
    /// does the stream's raw text.
    #[tokio::test]
    async fn a_character_cut_between_reads_comes_out_whole() {
        const BODY: &str = "id: 1\nevent: delta\ndata: {\"content\":\"héllo ✓\"}\n\n";
        let bytes = BODY.as_bytes();
        let inside = |c: &str| BODY.find(c).unwrap() + 1;
        let (e, check) = (inside("é"), inside("✓"));
        let pieces = [&bytes[..e], &bytes[e..check], &bytes[check..]];

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut buf = [0; 1024];
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                head.extend_from_slice(&buf[..n]);
            }
            // One HTTP chunk per piece: the client reads them apart.
            let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                transfer-encoding: chunked\r\n\r\n"
                .to_vec();
            for piece in pieces {
                out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                out.extend_from_slice(piece);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
            conn.write_all(&out).await.unwrap();
            conn
        });

        let (status, stream) = Api::new(&base).events("/events", None, None).await;
        assert_eq!(status, 200);
        let mut stream = stream.unwrap();
        let ev = stream.next().await.expect("one event");
        assert_eq!(ev.data, "{\"content\":\"héllo ✓\"}");
        assert_eq!((ev.id.as_deref(), ev.event.as_str()), (Some("1"), "delta"));
        assert!(stream.next().await.is_none(), "one event only");
        assert_eq!(stream.raw, BODY);
        drop(server.await.unwrap());
    }
}
