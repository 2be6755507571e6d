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
    pub event: String,
    pub data: String,
}

/// An open `text/event-stream`, read incrementally.
pub struct EventStream {
    resp: reqwest::Response,
    buf: String,
    /// Every byte received, for secrecy checks.
    pub raw: String,
}

impl EventStream {
    /// The next event, or `None` when the stream ends.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = SseEvent {
                    id: None,
                    event: "message".into(),
                    data: String::new(),
                };
                let mut any = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        ev.id = Some(v.trim().to_string());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("event:") {
                        ev.event = v.trim().to_string();
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data:") {
                        if !ev.data.is_empty() {
                            ev.data.push('\n');
                        }
                        ev.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                        any = true;
                    }
                }
                if any {
                    return Some(ev);
                }
                continue; // a keep-alive comment
            }
            let chunk = self.resp.chunk().await.ok()??;
            let text = String::from_utf8_lossy(&chunk);
            self.raw.push_str(&text);
            self.buf.push_str(&text);
        }
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
        (
            status,
            Some(EventStream {
                resp,
                buf: String::new(),
                raw: String::new(),
            }),
        )
    }
}
