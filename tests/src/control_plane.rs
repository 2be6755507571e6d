//! The real Kubernetes control plane for a test: etcd, kube-apiserver and
//! kube-controller-manager, built from their Go modules by
//! `tests/control-plane/build.sh` (which `tests/setup.sh` runs), started on
//! loopback ports chosen at run time with their files in a temporary
//! directory.
//!
//! The API server authorizes with RBAC and authenticates with static tokens:
//! an administrator ([`ADMIN`], group `system:masters`) and one token per
//! ServiceAccount the test names (the user `system:serviceaccount:NS:NAME`,
//! as a pod's token would be; RBAC binds by that name, so the account object
//! itself need not exist). It serves TLS with a certificate from a CA made
//! for the run, signs ServiceAccount tokens with a key pair made for the run,
//! and writes an audit log at level `Metadata` ([`ControlPlane::audit`]).
//! The controller manager runs the garbage collector and the namespace,
//! deployment, replicaset and serviceaccount controllers, each with its own
//! ServiceAccount's credentials; there is no kubelet and no scheduler, so
//! Pods stay Pending.
//!
//! [`ControlPlane::shared`] starts one per test binary, stopped and removed
//! when the process exits; [`ControlPlane::start`] one for a test, stopped
//! and removed on drop.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::children::{tail, Children};
use crate::helm::{documents, Render};
pub use crate::kubectl::{Audited, Identity};

/// The kinds that make up who the operator is and what it may do, and
/// what the chart's admission policy lets others do about its objects.
const IDENTITY_KINDS: &[&str] = &[
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];
/// The signal [`ControlPlane::stop_api_server`] stops it with.
pub use nix::sys::signal::Signal;
use serde_json::Value;

/// The administrator's user name (group `system:masters`).
pub const ADMIN: &str = "bindery-admin";
/// The namespace of the operator's ServiceAccount in the
/// [`ControlPlane::shared`] instance: the operator chart installed as the
/// release `bindery-operator` in `bindery-system`.
pub const OPERATOR_NAMESPACE: &str = "bindery-system";
/// The name of that ServiceAccount.
pub const OPERATOR_ACCOUNT: &str = "bindery-operator";
/// The controller manager's own user (bound by Kubernetes' bootstrap RBAC).
const CONTROLLER_MANAGER: &str = "system:kube-controller-manager";
/// The controllers it runs. `pvc-protection` takes the finalizer the API
/// server puts on every claim off a deleted one that no Pod uses;
/// `root-ca-cert-publisher` gives each namespace the `kube-root-ca.crt`
/// ConfigMap a Pod's ServiceAccount volume holds.
const CONTROLLERS: &str = "garbagecollector,namespace,deployment,replicaset,serviceaccount,\
     pvc-protection,root-ca-cert-publisher";
/// What a node's control plane runs besides ([`ControlPlane::for_node`]):
/// the Services' endpoints (kube-proxy and cluster DNS read them), the
/// Node's taints (`not-ready` comes off once it is Ready), the aggregated
/// roles (`admin`, `edit`, `view`), Jobs and StatefulSets.
const NODE_CONTROLLERS: &str =
    "endpoint,endpointslice,nodelifecycle,clusterrole-aggregation,job,statefulset";
/// The Services' cluster IPs; the first is the `kubernetes` Service's.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's cluster IP, where pods reach the API server.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The ServiceAccounts whose existence says those controllers run (each
/// runs with its own account's credentials, created as it starts).
const CONTROLLER_ACCOUNTS: [(&str, &str); 7] = [
    ("kube-system", "generic-garbage-collector"),
    ("kube-system", "namespace-controller"),
    ("kube-system", "deployment-controller"),
    ("kube-system", "replicaset-controller"),
    ("kube-system", "pvc-protection-controller"),
    ("kube-system", "root-ca-cert-publisher"),
    ("default", "default"),
];

/// How long the whole control plane may take to become ready (seconds on
/// an idle machine; much longer while cargo compiles beside it).
const START_TIMEOUT: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(100);
const SETUP_HINT: &str = "run tests/setup.sh (it builds them with tests/control-plane/build.sh), \
     or set BINDERY_CONTROL_PLANE to a directory holding etcd, kube-apiserver and \
     kube-controller-manager";

/// The Kubernetes release `tests/control-plane/kubernetes/go.mod` requires
/// (`v1.Y.Z`): the one build.sh builds.
pub fn kubernetes_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        include_str!("../control-plane/kubernetes/go.mod")
            .lines()
            .find_map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                match words.as_slice() {
                    ["require", "k8s.io/kubernetes", v, ..] | ["k8s.io/kubernetes", v, ..] => {
                        Some(v.to_string())
                    }
                    _ => None,
                }
            })
            .expect("tests/control-plane/kubernetes/go.mod requires k8s.io/kubernetes")
    })
}

/// Where the binaries are: `BINDERY_CONTROL_PLANE`, else where build.sh
/// puts them. Panics naming tests/setup.sh when one is missing.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let (dir, from) = match std::env::var_os("BINDERY_CONTROL_PLANE") {
            Some(d) => (PathBuf::from(d), "BINDERY_CONTROL_PLANE"),
            None => (
                crate::helm::bindery_cache()
                    .join("control-plane")
                    .join(kubernetes_version()),
                "where tests/control-plane/build.sh puts them",
            ),
        };
        for bin in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            assert!(
                dir.join(bin).is_file(),
                "the Kubernetes control plane is not built: no {bin} in {} ({from}): {SETUP_HINT}",
                dir.display()
            );
        }
        dir
    })
}

/// A running control plane.
pub struct ControlPlane {
    /// `https://127.0.0.1:PORT`: the API server.
    pub url: String,
    dir: PathBuf,
    /// (user name, kubeconfig), the administrator first.
    users: Vec<(String, PathBuf)>,
    /// Orders for the keeper thread (which owns the processes and the
    /// directory); dropped, it stops them.
    orders: Mutex<Option<mpsc::Sender<Order>>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
}

impl ControlPlane {
    /// The instance of this test binary, started on first use, with a token
    /// for the operator's ServiceAccount ([`OPERATOR_NAMESPACE`],
    /// [`OPERATOR_ACCOUNT`]); stopped, and its directory removed, when the
    /// process exits.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<ControlPlane> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(plane) = SHARED.get() {
                plane.shut_down();
            }
        }
        SHARED.get_or_init(|| {
            let plane = ControlPlane::start(&[(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)]);
            // SAFETY: atexit only stores the function pointer; the function
            // takes no arguments and stops our own child processes.
            #[allow(unsafe_code)]
            let registered = unsafe { libc::atexit(stop_shared) };
            assert_eq!(registered, 0, "atexit refused the control plane's stop");
            plane
        })
    }

    /// A second instance of this test binary, like [`Self::shared`], for
    /// the tests that stop and start its API server
    /// ([`Self::stop_api_server`]): the shared instance's tests would fail
    /// meanwhile. Those tests take turns among themselves.
    pub fn faults() -> &'static ControlPlane {
        static FAULTS: OnceLock<ControlPlane> = OnceLock::new();
        extern "C" fn stop_faults() {
            if let Some(plane) = FAULTS.get() {
                plane.shut_down();
            }
        }
        FAULTS.get_or_init(|| {
            let plane = ControlPlane::start(&[(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)]);
            // SAFETY: as in `shared`.
            #[allow(unsafe_code)]
            let registered = unsafe { libc::atexit(stop_faults) };
            assert_eq!(registered, 0, "atexit refused the control plane's stop");
            plane
        })
    }

    /// A control plane of its own, with a token for each ServiceAccount
    /// `(namespace, name)` besides the administrator's.
    pub fn start(service_accounts: &[(&str, &str)]) -> ControlPlane {
        ControlPlane::start_at(service_accounts, &[], At::Loopback)
    }

    /// A control plane for a node ([`crate::node`]): serving on `address`
    /// (the node's, in the caller's network namespace, where its processes
    /// run too) with a certificate that also names the `kubernetes`
    /// Service, as pods reach it; Node authorization for the kubelet; the
    /// controllers a cluster with pods needs (endpoints, endpoint slices, node lifecycle, …). The
    /// `users` `(name, groups)` get a token each: the node's kubelet and
    /// servers.
    pub fn for_node(address: Ipv4Addr, users: &[(&str, &str)]) -> ControlPlane {
        ControlPlane::start_at(&[], users, At::Node(address))
    }

    fn start_at(
        service_accounts: &[(&str, &str)],
        others: &[(&str, &str)],
        at: At,
    ) -> ControlPlane {
        let bin = bin_dir().to_path_buf();
        let tmp = tempfile::Builder::new()
            .prefix("bindery-control-plane-")
            .tempdir()
            .expect("a temporary directory");
        let dir = tmp.path().to_path_buf();
        let mut users = vec![(ADMIN.to_string(), "system:masters".to_string())];
        users.extend(service_accounts.iter().map(|(ns, name)| {
            (
                format!("system:serviceaccount:{ns}:{name}"),
                format!("system:serviceaccounts,system:serviceaccounts:{ns}"),
            )
        }));
        users.extend(others.iter().map(|(u, g)| (u.to_string(), g.to_string())));
        users.push((CONTROLLER_MANAGER.to_string(), String::new()));
        let tokens = write_files(&dir, &users, &at);
        let users_kubeconfigs: Vec<(String, PathBuf)> = tokens
            .iter()
            .map(|t| (t.user.clone(), t.kubeconfig.clone()))
            .collect();

        // The processes are children of a thread that lives as long as the
        // control plane: a child's parent-death signal follows the thread
        // that spawned it, and a test's thread ends with the test.
        let (ready_tx, ready_rx) = mpsc::channel();
        let (orders_tx, orders_rx) = mpsc::channel::<Order>();
        let keeper_dir = dir.clone();
        let keeper = std::thread::Builder::new()
            .name("control-plane".into())
            .spawn(move || {
                let started =
                    std::panic::catch_unwind(|| Processes::start(&bin, &keeper_dir, &tokens, &at));
                match started {
                    Ok(mut processes) => {
                        let _ = ready_tx.send(Ok(processes.url.clone()));
                        // Until told to stop, or the ControlPlane is gone.
                        while let Ok(order) = orders_rx.recv() {
                            match order {
                                Order::StopApiServer(signal, done) => {
                                    processes.children.stop_one("kube-apiserver", signal);
                                    let _ = done.send(());
                                }
                                Order::StartApiServer(done) => {
                                    let _ = done.send(processes.restart_api_server(&keeper_dir));
                                }
                            }
                        }
                        processes.children.stop();
                    }
                    Err(panic) => {
                        let why = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        let _ = ready_tx.send(Err(why));
                    }
                }
                drop(tmp);
            })
            .expect("a thread for the control plane");
        let url = match ready_rx.recv() {
            Ok(Ok(url)) => url,
            Ok(Err(why)) => {
                let _ = keeper.join();
                panic!("the Kubernetes control plane did not start: {why}")
            }
            Err(_) => panic!("the Kubernetes control plane's thread ended without a word"),
        };
        let users = users_kubeconfigs
            .into_iter()
            .filter(|(user, _)| user != CONTROLLER_MANAGER)
            .collect();
        ControlPlane {
            url,
            dir,
            users,
            orders: Mutex::new(Some(orders_tx)),
            keeper: Mutex::new(Some(keeper)),
        }
    }

    /// Stop the API server with `signal` (SIGKILL for a crash, SIGTERM for
    /// an orderly stop, as at an upgrade) and wait until it has exited;
    /// etcd and the controller manager keep running. Until the answer's
    /// [`ApiServerDown::start`] (or its drop) the server is down.
    pub fn stop_api_server(&self, signal: Signal) -> ApiServerDown<'_> {
        let (tx, rx) = mpsc::channel();
        self.order(Order::StopApiServer(signal, tx));
        rx.recv()
            .expect("the control plane's keeper answers a stop of the API server");
        ApiServerDown {
            plane: self,
            started: false,
        }
    }

    fn order(&self, order: Order) {
        self.orders
            .lock()
            .expect("the control plane's orders")
            .as_ref()
            .expect("the control plane is running")
            .send(order)
            .expect("the control plane's keeper takes orders");
    }

    /// The user name of the ServiceAccount `ns/name`.
    pub fn service_account_user(ns: &str, name: &str) -> String {
        format!("system:serviceaccount:{ns}:{name}")
    }

    /// A kubeconfig file (for kubectl, helm or kube-rs) authenticating as
    /// `user`: [`ADMIN`], or a ServiceAccount's user name given at start.
    pub fn kubeconfig(&self, user: &str) -> &Path {
        self.users
            .iter()
            .find(|(u, _)| u == user)
            .map(|(_, k)| k.as_path())
            .unwrap_or_else(|| {
                panic!(
                    "the control plane has no token for {user}; it has {:?}",
                    self.users.iter().map(|(u, _)| u).collect::<Vec<_>>()
                )
            })
    }

    /// The run's CA certificate (it signed the API server's certificate).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A kube-rs client authenticating as `user` (see [`Self::kubeconfig`]).
    pub async fn client(&self, user: &str) -> kube::Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig(user)).expect("the kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("a client config from the kubeconfig");
        kube::Client::try_from(config).expect("a kube client")
    }

    /// kubectl (the one tests/setup.sh installs) as `user`, with a
    /// discovery cache of this control plane's own.
    pub fn kubectl(&self, user: &str, args: &[&str]) -> Output {
        Command::new(crate::kubectl::kubectl_path())
            .args(args)
            .env("KUBECONFIG", self.kubeconfig(user))
            .env("KUBECACHEDIR", self.dir.join("kubectl-cache"))
            .stdin(Stdio::null())
            .output()
            .expect("kubectl runs")
    }

    /// A kubeconfig authenticating as the ServiceAccount `ns/name` (which
    /// must exist) with a token from its TokenRequest, as a pod's projected
    /// token would; written to `dir`.
    pub fn service_account(&self, ns: &str, name: &str, dir: &Path) -> Identity {
        let request = dir.join(format!("token-request-{ns}-{name}.json"));
        std::fs::write(
            &request,
            r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":86400}}"#,
        )
        .unwrap();
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token");
        let out = self.kubectl_ok(
            ADMIN,
            &["create", "--raw", &path, "-f", request.to_str().unwrap()],
        );
        let answer: Value = serde_json::from_str(&out).expect("a TokenRequest");
        let token = answer["status"]["token"].as_str().expect("a token");
        let user = Self::service_account_user(ns, name);
        let kubeconfig = dir.join(format!("kubeconfig-{ns}-{name}.yaml"));
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&self.url, &self.dir.join("ca.crt"), &user, token),
        )
        .unwrap();
        Identity { user, kubeconfig }
    }

    /// Apply the ServiceAccount and RBAC objects of the rendered operator
    /// chart (nothing else of it) as the administrator, and return that
    /// ServiceAccount's identity: what the operator runs as in a cluster.
    pub fn install_operator_identity(&self, chart: &Render, dir: &Path) -> Identity {
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
        let ns = account["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .to_string();
        let name = account["metadata"]["name"].as_str().unwrap().to_string();
        let yaml: Vec<String> = docs
            .iter()
            .map(|d| serde_yaml::to_string(d).unwrap())
            .collect();
        let file = dir.join(format!("identity-{ns}-{name}.yaml"));
        std::fs::write(&file, yaml.join("---\n")).unwrap();
        self.kubectl_ok(ADMIN, &["apply", "-f", file.to_str().unwrap()]);
        self.service_account(&ns, &name, dir)
    }

    /// kubectl as `user`, which must succeed; its stdout.
    pub fn kubectl_ok(&self, user: &str, args: &[&str]) -> String {
        let out = self.kubectl(user, args);
        assert!(
            out.status.success(),
            "kubectl {args:?} as {user} -> {}\nstdout:\n{}\nstderr:\n{}\n--- kube-apiserver (tail):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_tail("kube-apiserver", 4000)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }

    /// The audit log's requests for resources, as who asked for what and
    /// whether RBAC allowed it. An apply (a `patch`) that created its
    /// object counts as a `create` too: the server authorized it as both.
    pub fn audited(&self) -> Vec<Audited> {
        let mut out = Vec::new();
        for e in self.audit() {
            let Some(object) = e.get("objectRef") else {
                continue;
            };
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let mut resource = text(&object["resource"]);
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            let a = Audited {
                user: text(&e["user"]["username"]),
                verb: text(&e["verb"]),
                group: text(&object["apiGroup"]),
                resource,
                namespace: object["namespace"].as_str().map(str::to_string),
                allowed: e["annotations"]["authorization.k8s.io/decision"] == "allow",
            };
            if a.verb == "patch" && e["responseStatus"]["code"] == 201 {
                out.push(Audited {
                    verb: "create".into(),
                    ..a.clone()
                });
            }
            out.push(a);
        }
        out
    }

    /// Every event of the audit log so far (one JSON object per request
    /// at its ResponseComplete stage, level `Metadata`: `user.username`,
    /// `verb`, `objectRef`, `responseStatus.code`, …).
    pub fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("audit.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("an audit event is JSON"))
            .collect()
    }

    /// The last `n` bytes of one component's log (see [`Self::log`]).
    pub fn log_tail(&self, component: &str, n: usize) -> String {
        tail(&self.log(component), n).to_string()
    }

    /// The log of one component (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`), for failure messages.
    pub fn log(&self, component: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{component}.log"))).unwrap_or_default()
    }

    /// Stop the processes and remove the directory (once).
    pub fn shut_down(&self) {
        drop(self.orders.lock().map(|mut s| s.take()));
        if let Some(keeper) = self.keeper.lock().ok().and_then(|mut k| k.take()) {
            let _ = keeper.join();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Where a control plane serves.
enum At {
    /// On 127.0.0.1, for the tests that run no node.
    Loopback,
    /// On a node's address ([`ControlPlane::for_node`]).
    Node(Ipv4Addr),
}

impl At {
    fn address(&self) -> Ipv4Addr {
        match self {
            At::Loopback => Ipv4Addr::LOCALHOST,
            At::Node(address) => *address,
        }
    }
}

/// What the keeper thread is told to do with the processes it owns.
enum Order {
    /// Stop the API server with the signal; answer once it has exited.
    StopApiServer(Signal, mpsc::Sender<()>),
    /// Start it again with the same flags (its port, its etcd); answer
    /// once it is ready, or why it is not.
    StartApiServer(mpsc::Sender<Result<(), String>>),
}

/// A stopped API server ([`ControlPlane::stop_api_server`]), started
/// again by [`Self::start`] or, at the latest, on drop: a failed test
/// leaves the shared control plane serving.
pub struct ApiServerDown<'a> {
    plane: &'a ControlPlane,
    started: bool,
}

impl ApiServerDown<'_> {
    /// Start the API server again on the same port and etcd, and wait
    /// until it answers `/readyz`.
    pub fn start(mut self) {
        self.started = true;
        if let Err(why) = self.start_again() {
            panic!("the API server did not start again: {why}");
        }
    }

    fn start_again(&self) -> Result<(), String> {
        let (tx, rx) = mpsc::channel();
        self.plane.order(Order::StartApiServer(tx));
        rx.recv()
            .map_err(|_| "the control plane's keeper ended without a word".to_string())?
    }
}

impl Drop for ApiServerDown<'_> {
    fn drop(&mut self) {
        if !self.started {
            if let Err(why) = self.start_again() {
                eprintln!("the API server did not start again: {why}");
            }
        }
    }
}

/// A user of the token file.
struct Token {
    user: String,
    token: String,
    /// Where its kubeconfig goes once the server's port is known.
    kubeconfig: PathBuf,
}

/// The token file, the CA and serving certificate, the ServiceAccount
/// signing key pair and the audit policy, in `dir`; the tokens of `users`
/// (user name, groups), in their order.
fn write_files(dir: &Path, users: &[(String, String)], at: &At) -> Vec<Token> {
    crate::postgres::make_certificates(dir, None);
    if let At::Node(address) = at {
        // The serving certificate again, naming the node's address and the
        // `kubernetes` Service (how pods reach it); the API server's
        // client certificate for the kubelet.
        crate::postgres::sign_with_ca(
            dir,
            "server",
            "/CN=kube-apiserver",
            &format!(
                "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:{address},IP:{KUBERNETES_SERVICE_IP},\
                 DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,\
                 DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n"
            ),
        );
        crate::postgres::sign_with_ca(
            dir,
            "kubelet-client",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "extendedKeyUsage=clientAuth\n",
        );
    }
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            "sa.key",
        ],
    );
    openssl(dir, &["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
    std::fs::write(
        dir.join("audit-policy.yaml"),
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
    )
    .unwrap();
    let tokens: Vec<Token> = users
        .iter()
        .enumerate()
        .map(|(i, (user, _))| Token {
            user: user.clone(),
            token: random_token(),
            kubeconfig: dir.join(if user == CONTROLLER_MANAGER {
                "kube-controller-manager.kubeconfig".to_string()
            } else {
                format!("kubeconfig-{i}.yaml")
            }),
        })
        .collect();
    let csv: String = users
        .iter()
        .zip(&tokens)
        .enumerate()
        .map(|(i, ((user, groups), t))| format!("{},{user},uid-{i},\"{groups}\"\n", t.token))
        .collect();
    std::fs::write(dir.join("tokens.csv"), csv).unwrap();
    tokens
}

/// 32 hex digits from the system's random source.
pub(crate) fn random_token() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}: run tests/setup.sh"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A kubeconfig for `url` (the run's CA) with `token`.
fn kubeconfig_yaml(url: &str, ca: &Path, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: bindery-test
  cluster:
    server: {url}
    certificate-authority: {ca}
users:
- name: {user:?}
  user:
    token: {token}
contexts:
- name: bindery-test
  context:
    cluster: bindery-test
    user: {user:?}
    namespace: default
current-context: bindery-test
",
        ca = ca.display()
    )
}

/// The three processes, children of the keeper thread.
struct Processes {
    children: Children,
    url: String,
    /// How the API server was started, to start it again the same way.
    api_server: (PathBuf, Vec<String>),
    /// The administrator's token, to ask the API server whether it is ready.
    admin_token: String,
}

/// How one try at starting ended, when it did not.
enum Failed {
    /// A port was taken between choosing and binding it: try others.
    PortTaken,
}

impl Processes {
    /// Start etcd, the API server and the controller manager, and wait
    /// until all three serve. Panics with the log of the one that failed.
    fn start(bin: &Path, dir: &Path, tokens: &[Token], at: &At) -> Processes {
        for _ in 0..5 {
            match Processes::try_start(bin, dir, tokens, at) {
                Ok(processes) => return processes,
                Err(Failed::PortTaken) => continue,
            }
        }
        panic!("found no free ports in five tries");
    }

    fn try_start(bin: &Path, dir: &Path, tokens: &[Token], at: &At) -> Result<Processes, Failed> {
        let [etcd_port, peer_port, api_port] = free_ports();
        let address = at.address();
        let url = format!("https://{address}:{api_port}");
        let ca = dir.join("ca.crt");
        let controller_manager = tokens
            .iter()
            .find(|t| t.user == CONTROLLER_MANAGER)
            .expect("the controller manager has a token");
        for t in tokens {
            std::fs::write(&t.kubeconfig, kubeconfig_yaml(&url, &ca, &t.user, &t.token)).unwrap();
        }
        let path = |name: &str| dir.join(name).display().to_string();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut api_server_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--bind-address={address}"),
            format!("--advertise-address={address}"),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", path("server.crt")),
            format!("--tls-private-key-file={}", path("server.key")),
            format!("--cert-dir={}", path("apiserver-certs")),
            format!("--token-auth-file={}", path("tokens.csv")),
            format!("--service-account-key-file={}", path("sa.pub")),
            format!("--service-account-signing-key-file={}", path("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--audit-policy-file={}", path("audit-policy.yaml")),
            format!("--audit-log-path={}", path("audit.log")),
            "--audit-log-mode=blocking".into(),
            "--profiling=false".into(),
        ];
        match at {
            // As OpenShift does: an ownerReference that blocks its owner's
            // deletion needs leave to update the owner's finalizers (the
            // operator chart grants it).
            At::Loopback => api_server_args.extend([
                "--authorization-mode=RBAC".into(),
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".into(),
            ]),
            // A kubelet's credentials reach only its own Node and Pods'
            // objects, as in a cluster; the API server reaches the kubelet
            // (logs, exec) with a client certificate of the run's CA.
            At::Node(_) => api_server_args.extend([
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement,NodeRestriction"
                    .into(),
                format!(
                    "--kubelet-client-certificate={}",
                    path("kubelet-client.crt")
                ),
                format!("--kubelet-client-key={}", path("kubelet-client.key")),
                "--kubelet-preferred-address-types=InternalIP".into(),
            ]),
        }
        let controllers = match at {
            At::Loopback => CONTROLLERS.to_string(),
            At::Node(_) => format!("{CONTROLLERS},{NODE_CONTROLLERS}"),
        };
        let mut processes = Processes {
            children: Children::new(dir, SETUP_HINT),
            url: url.clone(),
            api_server: (bin.join("kube-apiserver"), api_server_args.clone()),
            admin_token: tokens[0].token.clone(),
        };
        processes.children.spawn(
            "etcd",
            &bin.join("etcd"),
            &[
                "--name=bindery".into(),
                format!("--data-dir={}", path("etcd")),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=bindery={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        );
        processes.children.spawn(
            "kube-apiserver",
            &bin.join("kube-apiserver"),
            &api_server_args,
        );
        processes.children.spawn(
            "kube-controller-manager",
            &bin.join("kube-controller-manager"),
            &[
                format!("--kubeconfig={}", controller_manager.kubeconfig.display()),
                format!("--controllers={controllers}"),
                format!("--root-ca-file={}", path("ca.crt")),
                "--use-service-account-credentials=true".into(),
                "--secure-port=0".into(),
                "--leader-elect=false".into(),
            ],
        );

        let get = processes.getter(dir);
        let mut waiting: Vec<String> = std::iter::once("/readyz".to_string())
            .chain(
                CONTROLLER_ACCOUNTS
                    .iter()
                    .map(|(ns, name)| format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}")),
            )
            .collect();
        let deadline = Instant::now() + START_TIMEOUT;
        while !waiting.is_empty() {
            if let Some(failed) = processes.children.exited() {
                let log = processes.children.log(&failed);
                processes.children.stop();
                if log.contains("address already in use") {
                    for name in ["etcd", "kube-apiserver", "kube-controller-manager"] {
                        let _ = std::fs::remove_file(dir.join(format!("{name}.log")));
                    }
                    return Err(Failed::PortTaken);
                }
                panic!("{failed} exited; its log:\n{}", tail(&log, 8000));
            }
            if Instant::now() > deadline {
                let logs = processes.children.logs(4000);
                processes.children.stop();
                panic!(
                    "not ready after {START_TIMEOUT:?} (still waiting for {waiting:?}); the logs:\n{logs}"
                );
            }
            // In order: the server first, then what the controllers make.
            if get(waiting[0].clone()) {
                waiting.remove(0);
            } else {
                std::thread::sleep(POLL);
            }
        }
        Ok(processes)
    }

    /// A GET of a path on the API server as the administrator: whether
    /// it answered with success.
    fn getter(&self, dir: &Path) -> impl Fn(String) -> bool {
        let ca_pem = std::fs::read(dir.join("ca.crt")).expect("the CA");
        let http = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca_pem).expect("the CA is PEM")])
            .build()
            .expect("an HTTP client");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (url, token) = (self.url.clone(), self.admin_token.clone());
        move |path: String| {
            let request = http.get(format!("{url}{path}")).bearer_auth(&token);
            runtime.block_on(async move {
                match request.send().await {
                    Ok(r) => r.status().is_success(),
                    Err(_) => false,
                }
            })
        }
    }

    /// Start the API server again, as it was started, on the same port
    /// and etcd (its log goes on in the same file); wait until it is ready.
    fn restart_api_server(&mut self, dir: &Path) -> Result<(), String> {
        const NAME: &str = "kube-apiserver";
        if self.children.running(NAME) {
            return Err("the API server is running".into());
        }
        self.children.stop_one(NAME, Signal::SIGKILL);
        let (program, args) = self.api_server.clone();
        self.children.spawn(NAME, &program, &args);
        let get = self.getter(dir);
        let deadline = Instant::now() + START_TIMEOUT;
        while !get("/readyz".into()) {
            if self.children.exited().as_deref() == Some(NAME) {
                return Err(format!(
                    "it exited; its log:\n{}",
                    tail(&self.children.log(NAME), 8000)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("not ready after {START_TIMEOUT:?}"));
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}

/// Three distinct free loopback ports (bound together, then let go).
fn free_ports() -> [u16; 3] {
    let listeners: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    let port = |i: usize| listeners[i].local_addr().unwrap().port();
    [port(0), port(1), port(2)]
}
