//! What the credentials' tests share: an environment of their own, a clock
//! they move, and a loopback HTTP server that records what it is sent and
//! answers what the test says (or nothing, or too much).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{Clock, Env};

/// An environment of the given variables only.
pub(crate) struct MapEnv(HashMap<String, String>);

impl MapEnv {
    pub(crate) fn of(vars: &[(&str, &str)]) -> Arc<dyn Env> {
        Arc::new(MapEnv(
            vars.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ))
    }
}

impl Env for MapEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

/// A clock that stands still until moved.
#[derive(Clone)]
pub(crate) struct TestClock(Arc<AtomicU64>);

/// 2024-01-02T03:04:05Z, when every test starts.
pub(crate) const START: u64 = 1_704_164_645;

impl TestClock {
    pub(crate) fn new() -> Self {
        TestClock(Arc::new(AtomicU64::new(START)))
    }

    pub(crate) fn clock(&self) -> Clock {
        let at = self.0.clone();
        Arc::new(move || SystemTime::UNIX_EPOCH + Duration::from_secs(at.load(Ordering::SeqCst)))
    }

    pub(crate) fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_secs(), Ordering::SeqCst);
    }

    pub(crate) fn now(&self) -> SystemTime {
        (self.clock())()
    }
}

/// `t` as RFC 3339 (`2024-01-02T04:04:05Z`).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    aws_smithy_types::DateTime::from(t)
        .fmt(aws_smithy_types::date_time::Format::DateTime)
        .unwrap()
}

/// A request as the server read it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The form body's value of `key`.
    pub(crate) fn form(&self, key: &str) -> Option<String> {
        form_urlencoded::parse(self.body.as_bytes())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    }
}

/// What the server answers.
pub(crate) struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Send no content-length: the body ends when the connection does.
    pub no_length: bool,
}

impl Answer {
    pub(crate) fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Answer {
            status,
            content_type,
            body: body.into(),
            delay: Duration::ZERO,
            no_length: false,
        }
    }
}

type Handler = Arc<dyn Fn(&Seen) -> Answer + Send + Sync>;

/// A loopback HTTP/1.1 server, one request per connection.
pub(crate) struct Server {
    pub base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub(crate) async fn start(handler: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let handler = handler.clone();
                let record = record.clone();
                tokio::spawn(async move {
                    let Some(request) = read_request(&mut socket).await else {
                        return;
                    };
                    record.lock().unwrap().push(request.clone());
                    let answer = handler(&request);
                    tokio::time::sleep(answer.delay).await;
                    let mut head = format!(
                        "HTTP/1.1 {} X\r\ncontent-type: {}\r\nconnection: close\r\n",
                        answer.status, answer.content_type
                    );
                    if !answer.no_length {
                        head.push_str(&format!("content-length: {}\r\n", answer.body.len()));
                    }
                    head.push_str("\r\n");
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&answer.body).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Server { base, seen, task }
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 1 << 20 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Seen {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A client as the model clients build theirs: no redirect followed.
pub(crate) fn http() -> reqwest::Client {
    crate::egress::client(bindery_spec::Redirects::Never)
        .build()
        .unwrap()
}

/// A URL nothing listens at.
pub(crate) async fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// A file holding `text`, in a directory of its own removed on drop.
pub(crate) struct TokenFile {
    pub path: std::path::PathBuf,
}

impl TokenFile {
    pub(crate) fn new(text: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "bindery-credentials-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, text).unwrap();
        TokenFile { path }
    }

    pub(crate) fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }

    pub(crate) fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
