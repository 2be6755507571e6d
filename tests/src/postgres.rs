//! A throwaway PostgreSQL server for a test: `initdb` into a temporary
//! directory, `postgres` on 127.0.0.1 and a port chosen at run time (its
//! Unix socket in the same directory), stopped and removed on drop.
//!
//! `initdb` and `postgres` refuse to run as root; as root (CI), they run as
//! the system's `postgres` user, which owns the directory. Connections over
//! TCP need the password ([`Postgres::PASSWORD`], SCRAM), so a test sees the
//! URL's password really used; the harness's own `psql` uses the socket.
//!
//! One server per test rather than per test binary: a server in a `static`
//! would never be dropped, and `initdb` takes about a second.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Gid, Pid, Uid, User};

/// A running server.
pub struct Postgres {
    child: Child,
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The TCP port on 127.0.0.1.
    pub port: u16,
    run_as: Option<(Uid, Gid)>,
    tls: bool,
}

/// `postgres` on the data of `dir`, on 127.0.0.1:`port`, its log appended
/// to `dir/postgres.log`.
fn spawn(bin: &Path, dir: &Path, port: u16, tls: bool, run_as: Option<(Uid, Gid)>) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("postgres.log"))
        .unwrap();
    let mut cmd = command(&bin.join("postgres"), run_as);
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args(["-c", "listen_addresses=127.0.0.1", "-p", &port.to_string()])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.display()))
        .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
        .args(if tls {
            vec![
                "-c".to_string(),
                "ssl=on".into(),
                "-c".into(),
                format!("ssl_cert_file={}", dir.join("server.crt").display()),
                "-c".into(),
                format!("ssl_key_file={}", dir.join("server.key").display()),
            ]
        } else {
            vec![]
        })
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // If the test process dies without dropping us, the server goes too
    // (immediate shutdown). SAFETY: the closure only calls prctl, which is
    // async-signal-safe, between fork and exec.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGQUIT).map_err(std::io::Error::from)
        });
    }
    cmd.spawn().expect("postgres starts")
}

/// Where the server binaries and their client tools are: beside the
/// `initdb` on PATH (often a link into the versioned directory, which also
/// holds `pg_isready` and `psql`), else Debian's newest versioned directory.
fn bin_dir() -> PathBuf {
    let on_path = crate::on_path("initdb");
    if let Some(dir) = on_path
        .and_then(|f| std::fs::canonicalize(f).ok())
        .and_then(|f| f.parent().map(Path::to_path_buf))
        .filter(|d| {
            ["postgres", "pg_isready", "psql", "pg_dump"]
                .iter()
                .all(|t| d.join(t).is_file())
        })
    {
        return dir;
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().unwrap_or_else(|| {
        panic!("the PostgreSQL server binaries (initdb, postgres) are missing: run tests/setup.sh")
    })
}

impl Postgres {
    /// The user and password of the server's superuser.
    pub const USER: &'static str = "bindery";
    pub const PASSWORD: &'static str = "pg-pass-8c41e7";

    pub fn start() -> Postgres {
        Postgres::start_with(false)
    }

    /// A server that also takes TLS, with a certificate for `localhost`
    /// and `127.0.0.1` from a CA of its own ([`Postgres::ca_file`]).
    pub fn start_tls() -> Postgres {
        Postgres::start_with(true)
    }

    /// The CA (PEM) of a [`Postgres::start_tls`] server's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir_file("ca.crt")
    }

    /// A file of the server's directory (`server.crt`, `postgres.log`, …).
    pub fn dir_file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn start_with(tls: bool) -> Postgres {
        let bin = bin_dir();
        let mut dir = tempfile::tempdir().expect("a temporary directory");
        let run_as = Uid::effective().is_root().then(|| {
            let u = User::from_name("postgres")
                .ok()
                .flatten()
                .expect("running as root, the tests run PostgreSQL as the user `postgres`: run tests/setup.sh");
            (u.uid, u.gid)
        });
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid.as_raw()), Some(gid.as_raw()))
                .expect("chown the data dir");
        }
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, Postgres::PASSWORD).unwrap();
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&pwfile, Some(uid.as_raw()), Some(gid.as_raw())).unwrap();
        }
        let data = dir.path().join("data");
        let init = command(&bin.join("initdb"), run_as)
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                Postgres::USER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(["--no-sync", "--encoding=UTF8", "--locale=C.UTF-8"])
            .output()
            .expect("initdb runs");
        check("initdb", &init);
        if tls {
            make_certificates(dir.path(), run_as);
        }

        // A port is chosen by binding 0 and letting go; if another process
        // takes it meanwhile, the server exits and we pick again.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let child = spawn(&bin, dir.path(), port, tls, run_as);
            let mut pg = Postgres {
                child,
                dir,
                bin: bin.clone(),
                port,
                run_as,
                tls,
            };
            if pg.wait_ready() {
                return pg;
            }
            let log = pg.log();
            if !log.contains("could not bind") && !log.contains("Address already in use") {
                panic!("postgres did not start; its log:\n{log}");
            }
            dir = pg.into_dir();
        }
        panic!("postgres found no free port in five tries");
    }

    /// Until the server accepts connections (`true`) or has exited.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let ready = self
                .tool("pg_isready")
                .args(["-d", "postgres", "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("postgres was not ready after 60s; its log:\n{}", self.log());
    }

    /// An outage: the server stops at once (every connection cut), its
    /// data kept for [`Postgres::recover`].
    pub fn outage(&mut self) {
        self.stop();
    }

    /// The server again, on the same data and port, once it accepts
    /// connections.
    pub fn recover(&mut self) {
        self.child = spawn(&self.bin, self.dir.path(), self.port, self.tls, self.run_as);
        assert!(
            self.wait_ready(),
            "postgres did not come back; its log:\n{}",
            self.log()
        );
    }

    /// Stop the server, keeping the directory (for another try).
    fn into_dir(mut self) -> tempfile::TempDir {
        self.stop();
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }

    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGQUIT);
            let _ = self.child.wait();
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// A client tool (`psql`, `pg_dump`, …) aimed at the socket.
    fn tool(&self, name: &str) -> Command {
        let mut cmd = command(&self.bin.join(name), self.run_as);
        cmd.args(["-h", &self.dir.path().display().to_string()])
            .args(["-p", &self.port.to_string(), "-U", Postgres::USER]);
        cmd
    }

    /// A new empty database, for one test.
    pub fn create_database(&self, name: &str) {
        self.sql("postgres", &format!("CREATE DATABASE \"{name}\""));
    }

    /// `postgres://bindery:PASSWORD@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:{}/{db}",
            Postgres::USER,
            Postgres::PASSWORD,
            self.port
        )
    }

    /// Run SQL in `db`; its rows, one a line, columns separated by `|`.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let out = self
            .tool("psql")
            .args([
                "-d",
                db,
                "-X",
                "-q",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("psql runs");
        check("psql", &out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `pg_dump` of `db`: its schema and every row.
    pub fn dump(&self, db: &str) -> String {
        let out = self
            .tool("pg_dump")
            .args(["-d", db])
            .output()
            .expect("pg_dump runs");
        check("pg_dump", &out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A CA and a server certificate it signed for `localhost` and
/// 127.0.0.1, with openssl; the key readable by the server's user only.
pub(crate) fn make_certificates(dir: &Path, run_as: Option<(Uid, Gid)>) {
    openssl_in(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=bindery-test-ca",
            "-days",
            "2",
        ],
    );
    sign_with_ca(
        dir,
        "server",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    let server_key = dir.join("server.key");
    std::fs::set_permissions(
        &server_key,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    if let Some((uid, gid)) = run_as {
        for f in ["server.key", "server.crt", "ca.crt"] {
            std::os::unix::fs::chown(dir.join(f), Some(uid.as_raw()), Some(gid.as_raw())).unwrap();
        }
    }
}

/// `NAME.key` and `NAME.crt` in `dir`, a P-256 key and its certificate for
/// `subject` signed by the CA there (`ca.key`, `ca.crt`) for two days,
/// with the extensions `ext` (after `basicConstraints` and `keyUsage`).
pub(crate) fn sign_with_ca(dir: &Path, name: &str, subject: &str, ext: &str) {
    let ext_file = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext_file),
        format!("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n{ext}"),
    )
    .unwrap();
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl_in(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    );
    openssl_in(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext_file,
        ],
    );
}

/// `openssl ARGS` in `dir`, which must succeed.
fn openssl_in(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}: run tests/setup.sh"));
    check("openssl", &out);
}

fn command(program: &Path, run_as: Option<(Uid, Gid)>) -> Command {
    let mut cmd = Command::new(program);
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid.as_raw()).gid(gid.as_raw());
    }
    // Not our root's environment: a HOME the server user cannot read makes
    // psql complain.
    cmd.env_remove("PGPASSWORD").env("HOME", "/tmp");
    cmd
}

fn check(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
