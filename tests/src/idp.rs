//! A real OAuth 2.1 / OpenID Connect server for a test: Keycloak, installed
//! by `tests/idp/install.sh` (which `tests/setup.sh` runs), started by
//! `tests/idp/run.sh` on loopback ports chosen at run time, in a home
//! directory of its own (its H2 database, a copy of the install's seed).
//!
//! A test makes a realm of its own ([`Idp::realm`]: users, clients, client
//! scopes, token lifespans) through the admin REST API, then plays each
//! party against the realm's endpoints ([`Realm`]): a client with any of
//! the token endpoint's authentication methods, the person at the browser
//! ([`Realm::login`]), the token exchanger (RFC 8693), the administrator
//! rotating the signing key.
//!
//! [`Idp::shared`] starts one per test binary, stopped when the process
//! exits; [`Idp::start`] one for a test, stopped on drop. Keycloak is
//! killed too if the test process dies (its parent-death signal).

pub mod jwt;
mod login;
mod realm;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use crate::children::Children;
pub use jwt::{ClientKey, JwtError, Pkce};
pub use login::LoginError;
pub use realm::{
    query_param, Client, ClientAuth, Credentials, OAuthError, Realm, RealmBuilder, Tokens,
};

/// How long Keycloak may take to become ready: about 10 to 30 s on this
/// machine, much longer while cargo compiles beside it.
const START_TIMEOUT: Duration = Duration::from_secs(300);
const SETUP_HINT: &str = "run tests/setup.sh (it installs Keycloak with tests/idp/install.sh), \
     or set BINDERY_KEYCLOAK to a directory install.sh made";
/// The administrator the install's seed database holds: a service account
/// client of the master realm (its secret in `seed/admin-client-secret`).
const ADMIN_CLIENT: &str = "bindery-admin";

/// The Keycloak version tests/idp/install.sh installs.
pub fn keycloak_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        include_str!("../idp/install.sh")
            .lines()
            .find_map(|l| l.strip_prefix("version="))
            .expect("tests/idp/install.sh sets version=")
            .trim()
            .to_string()
    })
}

/// Where Keycloak is installed: `BINDERY_KEYCLOAK`, else where install.sh
/// puts it. Panics naming tests/setup.sh when it is not there.
pub fn install_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let (dir, from) = match std::env::var_os("BINDERY_KEYCLOAK") {
            Some(d) => (PathBuf::from(d), "BINDERY_KEYCLOAK"),
            None => (
                crate::helm::bindery_cache()
                    .join("keycloak")
                    .join(keycloak_version()),
                "where tests/idp/install.sh puts it",
            ),
        };
        for file in [
            ".installed",
            "java-home",
            "keycloak/lib/quarkus-run.jar",
            "seed/keycloakdb.mv.db",
            "seed/admin-client-secret",
        ] {
            assert!(
                dir.join(file).is_file(),
                "Keycloak is not installed: no {file} in {} ({from}): {SETUP_HINT}",
                dir.display()
            );
        }
        dir
    })
}

/// A running Keycloak.
pub struct Idp {
    url: String,
    admin_secret: String,
    http: reqwest::Client,
    /// A client that does not follow redirects (the login's).
    browser: reqwest::Client,
    realms: AtomicUsize,
    /// Dropped (or sent to), the keeper thread kills Keycloak and removes
    /// its home.
    stop: Mutex<Option<mpsc::Sender<()>>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Idp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idp").field("url", &self.url).finish()
    }
}

/// What a started Keycloak tells the thread that asked for it.
struct Started {
    url: String,
    took: Duration,
}

impl Idp {
    /// The instance of this test binary, started on first use; stopped,
    /// and its home removed, when the process exits. Tests share it by
    /// each making realms of their own.
    pub fn shared() -> &'static Idp {
        static SHARED: OnceLock<Idp> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(idp) = SHARED.get() {
                idp.shut_down();
            }
        }
        SHARED.get_or_init(|| {
            let idp = Idp::start();
            // SAFETY: atexit only stores the function pointer; the function
            // takes no arguments and stops our own child process.
            #[allow(unsafe_code)]
            let registered = unsafe { libc::atexit(stop_shared) };
            assert_eq!(registered, 0, "atexit refused Keycloak's stop");
            idp
        })
    }

    /// A Keycloak of its own, stopped on drop. Blocks until it is ready
    /// (not on a thread of an async runtime that must keep running).
    pub fn start() -> Idp {
        let install = install_dir().to_path_buf();
        let admin_secret = std::fs::read_to_string(install.join("seed/admin-client-secret"))
            .expect("the install's admin-client-secret")
            .trim()
            .to_string();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<Started, String>>();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        // Keycloak is the child of a thread that lives as long as the Idp:
        // a child's parent-death signal follows the thread that spawned it,
        // and a test's thread ends with the test.
        let keeper = std::thread::Builder::new()
            .name("keycloak".into())
            .spawn(move || {
                let home = tempfile::Builder::new()
                    .prefix("bindery-keycloak-")
                    .tempdir()
                    .expect("a temporary directory");
                let mut children = Children::new(home.path(), SETUP_HINT);
                match start_keycloak(&mut children, &install, home.path()) {
                    Ok(started) => {
                        let _ = ready_tx.send(Ok(started));
                        // Until told to stop, or the Idp is gone.
                        let _ = stop_rx.recv();
                    }
                    Err(why) => {
                        let _ = ready_tx.send(Err(why));
                    }
                }
                // Its database is thrown away: no orderly stop needed.
                children.stop_one("keycloak", nix::sys::signal::Signal::SIGKILL);
                drop(children);
                drop(home);
            })
            .expect("a thread for Keycloak");
        let started = match ready_rx.recv() {
            Ok(Ok(started)) => started,
            Ok(Err(why)) => {
                let _ = keeper.join();
                panic!("Keycloak did not start: {why}")
            }
            Err(_) => panic!("Keycloak's thread ended without a word"),
        };
        eprintln!(
            "Keycloak {} ready at {} in {:.1} s",
            keycloak_version(),
            started.url,
            started.took.as_secs_f64()
        );
        // No idle connections kept: each test has a runtime of its own,
        // and a pooled connection dies with the runtime that opened it.
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .build()
            .expect("an HTTP client");
        let browser = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client");
        Idp {
            url: started.url,
            admin_secret,
            http,
            browser,
            realms: AtomicUsize::new(0),
            stop: Mutex::new(Some(stop_tx)),
            keeper: Mutex::new(Some(keeper)),
        }
    }

    /// `http://127.0.0.1:PORT`: the server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The issuer of `realm`'s tokens (`iss`): `URL/realms/REALM`; its
    /// discovery document is at `ISSUER/.well-known/openid-configuration`.
    pub fn issuer(&self, realm: &str) -> String {
        format!("{}/realms/{realm}", self.url)
    }

    /// A realm to make, named `PREFIX-N` (unique in this server).
    pub fn realm(&self, prefix: &str) -> RealmBuilder<'_> {
        let n = self.realms.fetch_add(1, Ordering::Relaxed);
        RealmBuilder::new(self, format!("{prefix}-{n}"))
    }

    /// A token of the master realm's administrator (each call a new one:
    /// the master realm's tokens live a minute).
    async fn admin_token(&self) -> String {
        let answer = self
            .http
            .post(format!(
                "{}/protocol/openid-connect/token",
                self.issuer("master")
            ))
            .basic_auth(ADMIN_CLIENT, Some(&self.admin_secret))
            .form(&[("grant_type", "client_credentials")])
            .send()
            .await
            .expect("Keycloak answers the admin's token request");
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or_default();
        body["access_token"]
            .as_str()
            .unwrap_or_else(|| {
                panic!(
                    "Keycloak refused the administrator's client credentials ({status}: {body}): \
                     the seed's secret does not match; run tests/idp/install.sh again"
                )
            })
            .to_string()
    }

    /// An admin REST call (`/admin/realms...`), panicking on an error
    /// status: the body of the answer (`null` when empty) and its
    /// `Location` (the created object's URL).
    async fn admin(&self, method: Method, path: &str, body: Option<&Value>) -> (Value, String) {
        let token = self.admin_token().await;
        let mut request = self
            .http
            .request(method.clone(), format!("{}/admin/realms{path}", self.url))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let answer = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("Keycloak's admin API ({method} {path}): {e}"));
        let status = answer.status();
        let location = answer
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let text = answer.text().await.unwrap_or_default();
        assert!(
            status.is_success(),
            "Keycloak's admin API refused {method} {path}: {status}: {text}"
        );
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        (value, location)
    }

    /// Stop Keycloak and remove its home (idempotent).
    fn shut_down(&self) {
        if let Ok(mut stop) = self.stop.lock() {
            stop.take();
        }
        let keeper = self.keeper.lock().ok().and_then(|mut k| k.take());
        if let Some(keeper) = keeper {
            let _ = keeper.join();
        }
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Two free loopback ports (the HTTP and the management one).
fn free_ports() -> [u16; 2] {
    let listeners = [(); 2].map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"));
    listeners.map(|l| l.local_addr().expect("a bound port").port())
}

/// Start Keycloak under `home` and wait until `/health/ready` says so.
fn start_keycloak(children: &mut Children, install: &Path, home: &Path) -> Result<Started, String> {
    let [port, management] = free_ports();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("idp/run.sh");
    let began = Instant::now();
    children.spawn_with(
        "keycloak",
        Command::new(script)
            .arg(install)
            .arg(home.join("home"))
            .arg(format!("--http-port={port}"))
            .arg(format!("--http-management-port={management}")),
    );
    let mut last = String::new();
    while began.elapsed() < START_TIMEOUT {
        if children.exited().is_some() {
            return Err(format!("it exited; its log:\n{}", children.logs(4000)));
        }
        match health_ready(management) {
            Ok(()) => {
                return Ok(Started {
                    url: format!("http://127.0.0.1:{port}"),
                    took: began.elapsed(),
                })
            }
            Err(seen) => last = seen,
        }
        // A poll between askings, not a wait for a time to pass.
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "not ready within {START_TIMEOUT:?} (last: {last}); its log:\n{}",
        children.logs(4000)
    ))
}

/// `GET /health/ready` on the management port: Ok on 200.
fn health_ready(port: u16) -> Result<(), String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /health/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    let status = answer.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        Ok(())
    } else {
        Err(status.to_string())
    }
}
