//! A real Kubernetes node for the tests: the control plane of
//! [`crate::control_plane`] with a kubelet, containerd and runc, kube-proxy,
//! kube-scheduler, CoreDNS and kube-router (the NetworkPolicy enforcer)
//! beside it, all in a network namespace of the test's own
//! ([`crate::netns`]), so pods get real addresses on a real bridge, Services
//! real cluster IPs and DNS names, and NetworkPolicies drop real packets,
//! while the machine's own network sees none of it.
//!
//! The namespace's loopback carries the node's address, [`NODE_IP`], where
//! the API server, the kubelet and the cluster DNS listen; pods get
//! addresses of [`POD_SUBNET`] on the bridge `cni0` (Debian's bridge and
//! host-local CNI plugins) with the node as their gateway. Images come from
//! a registry on the node's loopback serving, read-only, the storage
//! `tests/images/build.sh` filled (`BINDERY_CACHE/images/registry`): the
//! names `ghcr.io/...`, `docker.io/...`, `registry.k8s.io/...` and
//! `bindery.test/...` are pulled through it (containerd's registry mirrors),
//! so the charts' default image names work unchanged. A test's own image
//! (a program of the workspace on the distroless base) is imported
//! straight into containerd ([`Node::import_program`]).
//!
//! The binaries: containerd, runc, the CNI plugins, iptables, ipset and
//! docker-registry from Debian's packages; the Kubernetes servers, CoreDNS
//! and kube-router from their Go modules (`tests/node/build.sh`), in
//! `BINDERY_CACHE/node/<version>` (or `BINDERY_NODE`). `tests/setup.sh`
//! installs and builds them all.
//!
//! The kubelet runs its pods' cgroups under a root of the node's own
//! (`/bindery-node-<id>` in each controller, cgroup v1 with the cgroupfs
//! driver: what this machine has); stopping the node kills what is left in
//! them, ends containerd's shims, unmounts what the kubelet and containerd
//! mounted under the node's directory and removes the cgroups.

use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::children::{tail, Children};
use crate::control_plane::{kubernetes_version, ControlPlane, ADMIN, SERVICE_CIDR};
use crate::netns::{run_ok, NetNs};

/// The Node's name.
pub const NODE_NAME: &str = "bindery-node";
/// The node's address, on its namespace's loopback.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 255, 0, 1);
/// The pods' addresses.
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// Where the node's registry listens (on the namespace's loopback: only
/// containerd pulls from it).
const REGISTRY: &str = "127.0.0.1:5000";
/// The registries whose names the node's registry serves.
const MIRRORED: [&str; 4] = ["ghcr.io", "docker.io", "registry.k8s.io", "bindery.test"];
/// Where kube-proxy answers whether its rules are in place.
const KUBE_PROXY_HEALTH: &str = "127.0.0.1:10256";
/// Where kube-router answers whether its controllers run (on the
/// namespace's loopback and every address: nothing else listens there).
const KUBE_ROUTER_HEALTH_PORT: u16 = 20244;
/// Where CoreDNS answers whether it is ready (its `ready` plugin).
const DNS_READY: &str = "127.0.0.1:8181";
/// How long the node may take to be Ready with its DNS serving.
const START_TIMEOUT: Duration = Duration::from_secs(180);
const POLL: Duration = Duration::from_millis(200);
const SETUP_HINT: &str = "run tests/setup.sh: it installs containerd, runc, the CNI plugins, \
     iptables, ipset and docker-registry, builds the node's servers (tests/node/build.sh) and \
     the images (tests/images/build.sh)";

/// The users the node's servers authenticate as `(name, groups)`: the
/// kubelet as its Node (the Node authorizer's subject), the others as
/// Kubernetes' bootstrap roles name them or as the roles [`RBAC`] grants.
const USERS: [(&str, &str); 5] = [
    ("system:node:bindery-node", "system:nodes"),
    ("system:kube-proxy", ""),
    ("system:kube-scheduler", ""),
    ("bindery:coredns", ""),
    ("bindery:kube-router", ""),
];

/// What CoreDNS and kube-router may read (their upstream manifests' roles).
const RBAC: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "bindery:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "bindery:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "bindery:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "bindery:coredns"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "bindery:kube-router"}
rules:
- apiGroups: [""]
  resources: [namespaces, pods, services, nodes, endpoints]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "bindery:kube-router"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "bindery:kube-router"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "bindery:kube-router"}]
"#;

/// Where the node's Go servers are: `BINDERY_NODE`, else where
/// `tests/node/build.sh` puts them. Panics naming tests/setup.sh when one
/// is missing.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("BINDERY_NODE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                crate::helm::bindery_cache()
                    .join("node")
                    .join(kubernetes_version())
            });
        for bin in [
            "kubelet",
            "kube-proxy",
            "kube-scheduler",
            "coredns",
            "kube-router",
        ] {
            assert!(
                dir.join(bin).is_file(),
                "the node is not built: no {bin} in {}: {SETUP_HINT}",
                dir.display()
            );
        }
        dir
    })
}

/// The registry storage `tests/images/build.sh` filled.
pub fn registry_storage() -> PathBuf {
    let dir = crate::helm::bindery_cache().join("images").join("registry");
    assert!(
        dir.join("docker").is_dir(),
        "no images in {}: {SETUP_HINT}",
        dir.display()
    );
    dir
}

/// A running node; dropping it stops its pods and servers and removes
/// everything it made.
pub struct Node {
    /// Orders for the keeper thread (which owns the servers); dropped, it
    /// stops them. Before the control plane: the kubelet goes first.
    stop: Mutex<Option<mpsc::Sender<()>>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
    pub plane: ControlPlane,
    ns: NetNs,
    dir: PathBuf,
    /// The containerd socket, for importing images.
    containerd: PathBuf,
    /// Holds `dir` until the end.
    _tmp: tempfile::TempDir,
}

impl Node {
    /// The instance of this test binary, started on first use; stopped,
    /// and its directory removed, when the process exits.
    pub fn shared() -> &'static Node {
        static SHARED: OnceLock<Node> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(node) = SHARED.get() {
                node.shut_down();
            }
        }
        SHARED.get_or_init(|| {
            let node = Node::start();
            // SAFETY: atexit only stores the function pointer; the function
            // takes no arguments and stops our own servers.
            #[allow(unsafe_code)]
            let registered = unsafe { libc::atexit(stop_shared) };
            assert_eq!(registered, 0, "atexit refused the node's stop");
            node
        })
    }

    /// A node of its own: its namespace, control plane and servers,
    /// started and Ready (the Node's condition; CoreDNS ready).
    pub fn start() -> Node {
        let tmp = tempfile::Builder::new()
            .prefix("bindery-node-")
            .tempdir()
            .expect("a temporary directory");
        let dir = tmp.path().to_path_buf();
        let ns = NetNs::new();
        ns.run(|| {
            run_ok(
                "ip",
                &["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"],
            );
            // Pods' packets are routed through the node; a pod's answer
            // to another pod of the bridge passes iptables too, so a
            // Service's translation is undone on the way back.
            run_ok("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
            run_ok("sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"]);
            // The Services' addresses are routed (to the node's loopback,
            // until kube-proxy's rules translate them), as a node's default
            // route would: the node itself reaches a Service.
            run_ok(
                "ip",
                &[
                    "route",
                    "add",
                    SERVICE_CIDR,
                    "dev",
                    "lo",
                    "src",
                    &NODE_IP.to_string(),
                ],
            );
        });
        let plane = ns.run(|| ControlPlane::for_node(NODE_IP, &USERS));
        ns.run(|| apply(&plane, &dir, "node-rbac.yaml", RBAC));

        let id = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a temporary directory's name")
            .to_string();
        let setup = Setup::write(&dir, &format!("/{id}"), &plane);
        let containerd = setup.containerd_socket.clone();

        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let keeper = {
            let setup = setup.clone();
            let ns_handle = ns.try_clone();
            std::thread::Builder::new()
                .name("node".into())
                .spawn(move || {
                    ns_handle.enter();
                    let mut servers = Children::new(&setup.dir, SETUP_HINT);
                    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        setup.start(&mut servers)
                    }));
                    match started {
                        Ok(()) => {
                            let _ = ready_tx.send(Ok(()));
                            // Until told to stop, or the Node is gone.
                            let _ = stop_rx.recv();
                        }
                        Err(panic) => {
                            let _ = ready_tx.send(Err(panic_text(panic)));
                        }
                    }
                    setup.tear_down(&mut servers);
                })
                .expect("a thread for the node")
        };
        let node = Node {
            stop: Mutex::new(Some(stop_tx)),
            keeper: Mutex::new(Some(keeper)),
            plane,
            ns,
            dir,
            containerd,
            _tmp: tmp,
        };
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(why)) => panic!("the node's servers did not start: {why}"),
            Err(_) => panic!("the node's thread ended without a word"),
        }
        node
    }

    /// Put the calling thread in the node's network namespace, for good
    /// (see [`crate::netns`]): a test does this first, then builds its
    /// runtime, so its clients reach the node's addresses.
    pub fn enter(&self) {
        self.ns.enter();
    }

    /// The open handle on the node's network namespace (for a process
    /// to enter it: `nsenter --net=/proc/PID/fd/FD`).
    pub fn namespace_handle(&self) -> &std::fs::File {
        self.ns.handle()
    }

    /// kubectl as the administrator (from the node's namespace).
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.ns.run(|| self.plane.kubectl(ADMIN, args))
    }

    /// helm as the administrator, as a platform team runs it.
    pub fn helm(&self, args: &[&str]) -> Output {
        self.ns.run(|| {
            crate::helm::helm_command(args)
                .env("KUBECONFIG", self.plane.kubeconfig(ADMIN))
                .env("HELM_CACHE_HOME", self.dir.join("helm-cache"))
                .env("HELM_CONFIG_HOME", self.dir.join("helm-config"))
                .env("HELM_DATA_HOME", self.dir.join("helm-data"))
                .stdin(Stdio::null())
                .output()
                .expect("helm runs")
        })
    }

    /// Make `program` (a binary of the workspace, linked against glibc)
    /// an image named `name` on the distroless base `tests/images/build.sh`
    /// made, run as uid 65532 with `program`'s file name as its
    /// entrypoint, and import it into the node's containerd: a pod with
    /// `imagePullPolicy: IfNotPresent` (or `Never`) runs it.
    pub fn import_program(&self, name: &str, program: &Path) {
        let archive = self.dir.join(format!(
            "{}.tar",
            name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        ));
        let file = program
            .file_name()
            .and_then(|f| f.to_str())
            .expect("a program's file name");
        let container = run_ok(
            "buildah",
            &["from", "--pull-never", "--quiet", DISTROLESS_BASE],
        );
        let container = container.trim();
        let built = (|| -> Result<(), String> {
            buildah(&[
                "copy",
                "--quiet",
                container,
                path_str(program),
                &format!("/{file}"),
            ])?;
            buildah(&[
                "config",
                "--entrypoint",
                &format!("[\"/{file}\"]"),
                "--cmd",
                "",
                "--user",
                "65532:65532",
                container,
            ])?;
            buildah(&[
                "commit",
                "--quiet",
                "--rm",
                container,
                &format!("oci-archive:{}:{name}", archive.display()),
            ])
        })();
        if let Err(why) = built {
            let _ = buildah(&["rm", container]);
            panic!("the image {name} of {}: {why}", program.display());
        }
        run_ok(
            "ctr",
            &[
                "--address",
                path_str(&self.containerd),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                "--no-unpack",
                path_str(&archive),
            ],
        );
        let _ = std::fs::remove_file(&archive);
    }

    /// The tail of the node's and the control plane's logs, for failure
    /// messages.
    pub fn logs(&self) -> String {
        let node: String = [
            "containerd",
            "kubelet",
            "kube-proxy",
            "kube-scheduler",
            "coredns",
            "kube-router",
            "registry",
        ]
        .iter()
        .map(|n| {
            let log =
                std::fs::read_to_string(self.dir.join(format!("{n}.log"))).unwrap_or_default();
            format!("--- {n} (tail) ---\n{}\n", tail(&log, 3000))
        })
        .collect();
        let plane: String = ["kube-apiserver", "kube-controller-manager"]
            .iter()
            .map(|c| format!("--- {c} (tail) ---\n{}\n", self.plane.log_tail(c, 3000)))
            .collect();
        let events = self.kubectl(&[
            "get",
            "events",
            "-A",
            "--sort-by=.lastTimestamp",
            "-o",
            "custom-columns=NS:.metadata.namespace,OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message",
        ]);
        let events = String::from_utf8_lossy(&events.stdout);
        format!(
            "{node}{plane}--- events (the last) ---\n{}\n",
            tail(&events, 4000)
        )
    }

    /// The directory of the node's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stop the servers, then the control plane, and remove the node's
    /// directory (once; also what a static instance gets at exit).
    fn shut_down(&self) {
        drop(self.stop.lock().map(|mut s| s.take()));
        if let Some(keeper) = self.keeper.lock().ok().and_then(|mut k| k.take()) {
            let _ = keeper.join();
            self.plane.shut_down();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The base of a test's own images ([`Node::import_program`]).
const DISTROLESS_BASE: &str = "gcr.io/distroless/cc-debian12:nonroot";

fn buildah(args: &[&str]) -> Result<(), String> {
    let out = Command::new("buildah")
        .args(args)
        .output()
        .map_err(|e| format!("buildah: {e}: {SETUP_HINT}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "buildah {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// `kubectl apply` of `yaml` as the administrator.
fn apply(plane: &ControlPlane, dir: &Path, name: &str, yaml: &str) {
    let file = dir.join(name);
    std::fs::write(&file, yaml).unwrap();
    plane.kubectl_ok(ADMIN, &["apply", "-f", path_str(&file)]);
}

/// Whether `GET path` on `addr` answers 200 (a plain HTTP/1.0 exchange:
/// the servers' readiness endpoints).
fn http_ok(addr: &str, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
}

/// The node's files and how its servers start.
#[derive(Clone)]
struct Setup {
    dir: PathBuf,
    /// The kubelet's cgroup root (in each controller's hierarchy).
    cgroup_root: String,
    bin: PathBuf,
    containerd_socket: PathBuf,
    /// (user, kubeconfig) of each server.
    kubeconfigs: Vec<(String, PathBuf)>,
    /// The administrator's, to see the Node registered and Ready.
    admin: PathBuf,
    ca: PathBuf,
}

impl Setup {
    /// Write the servers' configurations under `dir`.
    fn write(dir: &Path, cgroup_root: &str, plane: &ControlPlane) -> Setup {
        let setup = Setup {
            dir: dir.to_path_buf(),
            cgroup_root: cgroup_root.to_string(),
            bin: bin_dir().to_path_buf(),
            containerd_socket: dir.join("containerd/containerd.sock"),
            kubeconfigs: USERS
                .iter()
                .map(|(u, _)| (u.to_string(), plane.kubeconfig(u).to_path_buf()))
                .collect(),
            admin: plane.kubeconfig(ADMIN).to_path_buf(),
            ca: plane.ca(),
        };
        let path = |p: &str| dir.join(p).display().to_string();
        for d in [
            "containerd/root",
            "containerd/state",
            "containerd/opt",
            "cni/net.d",
            "cni/ipam",
            "cni/cache",
            "kubelet/pki",
            "pod-logs",
            "registry",
        ] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let write = |p: &str, text: String| std::fs::write(dir.join(p), text).unwrap();

        // containerd's CRI as a kubelet expects it on this machine: runc
        // with the cgroupfs driver (no systemd here); the sandbox image
        // the kubelet's version expects; no lowering of oom_score_adj
        // (root may not here); images through the node's registry; the
        // pods' network namespaces under the node's directory (not
        // /run/netns, which every node of the machine would share), as
        // the kubelet's pod logs are (not /var/log/pods, whose entries a
        // kubelet removes when it does not know their pods).
        write(
            "containerd/config.toml",
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{certs}"
"#,
                root = path("containerd/root"),
                state = path("containerd/state"),
                socket = setup.containerd_socket.display(),
                opt = path("containerd/opt"),
                cni = path("cni/net.d"),
                certs = path("containerd/certs.d"),
            ),
        );
        for registry in MIRRORED {
            std::fs::create_dir_all(dir.join("containerd/certs.d").join(registry)).unwrap();
            write(
                &format!("containerd/certs.d/{registry}/hosts.toml"),
                format!(
                    "server = \"https://{registry}\"\n[host.\"http://{REGISTRY}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
                ),
            );
        }

        // The pods' network: a bridge with the node as gateway.
        write(
            "cni/net.d/10-bindery.conflist",
            serde_json::to_string_pretty(&serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "bindery",
                "plugins": [{
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": path("cni/ipam"),
                    }
                }, {"type": "portmap", "capabilities": {"portMappings": true}}]
            }))
            .unwrap(),
        );

        // The node's registry: the images' storage, read-only (every node
        // of the run serves the same one).
        write(
            "registry/config.yml",
            format!(
                "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  maintenance:\n    uploadpurging: {{enabled: false}}\n    readonly: {{enabled: true}}\nhttp: {{addr: \"{REGISTRY}\"}}\n",
                registry_storage().display()
            ),
        );

        // An empty resolv.conf: the pods' DNS is the cluster's only.
        write("kubelet/resolv.conf", String::new());
        write(
            "kubelet/config.yaml",
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failSwapOn: false
failCgroupV1: false
address: {NODE_IP}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDNS: [{NODE_IP}]
clusterDomain: cluster.local
resolvConf: {resolv}
podLogsDir: {logs}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
"#,
                socket = setup.containerd_socket.display(),
                resolv = path("kubelet/resolv.conf"),
                logs = path("pod-logs"),
                ca = setup.ca.display(),
            ),
        );
        write(
            "kube-proxy.yaml",
            format!(
                r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {NODE_NAME}
mode: iptables
clusterCIDR: {POD_SUBNET}
conntrack: {{maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
"#,
                kubeconfig = setup.kubeconfig("system:kube-proxy").display(),
            ),
        );
        write(
            "Corefile",
            format!(
                r#".:53 {{
    errors
    health 127.0.0.1:8080
    ready {DNS_READY}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} bindery-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"#,
                kubeconfig = setup.kubeconfig("bindery:coredns").display(),
            ),
        );
        setup
    }

    fn kubeconfig(&self, user: &str) -> &Path {
        self.kubeconfigs
            .iter()
            .find(|(u, _)| u == user)
            .map(|(_, k)| k.as_path())
            .expect("a kubeconfig of each server")
    }

    fn path(&self, p: &str) -> String {
        self.dir.join(p).display().to_string()
    }

    /// Start the servers (the calling thread is in the node's namespace
    /// and lives as long as they do); panics with the log of one that
    /// exits or does not come up.
    fn start(&self, servers: &mut Children) {
        let bin = |name: &str| self.bin.join(name);
        servers.spawn(
            "registry",
            Path::new("/usr/bin/docker-registry"),
            &["serve".into(), self.path("registry/config.yml")],
        );
        servers.spawn(
            "containerd",
            Path::new("/usr/bin/containerd"),
            &["--config".into(), self.path("containerd/config.toml")],
        );
        self.until(servers, "containerd", || {
            std::os::unix::net::UnixStream::connect(&self.containerd_socket).is_ok()
        });
        self.until(servers, "registry", || http_ok(REGISTRY, "/v2/"));
        self.make_cgroup_root();
        servers.spawn(
            "kube-scheduler",
            &bin("kube-scheduler"),
            &[
                format!(
                    "--kubeconfig={}",
                    self.kubeconfig("system:kube-scheduler").display()
                ),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ],
        );
        servers.spawn(
            "kubelet",
            &bin("kubelet"),
            &[
                format!("--config={}", self.path("kubelet/config.yaml")),
                format!(
                    "--kubeconfig={}",
                    self.kubeconfig("system:node:bindery-node").display()
                ),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                format!("--root-dir={}", self.path("kubelet")),
                format!("--cert-dir={}", self.path("kubelet/pki")),
                "--v=1".into(),
            ],
        );
        servers.spawn(
            "coredns",
            &bin("coredns"),
            &["-conf".into(), self.path("Corefile")],
        );
        self.until(servers, "kubelet", || self.node_ready());
        self.until(servers, "coredns", || http_ok(DNS_READY, "/ready"));
        // Both find their Node by name as they start.
        servers.spawn(
            "kube-proxy",
            &bin("kube-proxy"),
            &[format!("--config={}", self.path("kube-proxy.yaml"))],
        );
        servers.spawn(
            "kube-router",
            &bin("kube-router"),
            &[
                format!(
                    "--kubeconfig={}",
                    self.kubeconfig("bindery:kube-router").display()
                ),
                format!("--hostname-override={NODE_NAME}"),
                "--run-firewall=true".into(),
                "--run-router=false".into(),
                "--run-service-proxy=false".into(),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--metrics-port=0".into(),
                format!("--health-port={KUBE_ROUTER_HEALTH_PORT}"),
            ],
        );
        self.until(servers, "kube-proxy", || {
            http_ok(KUBE_PROXY_HEALTH, "/healthz")
        });
        self.until(servers, "kube-router", || {
            http_ok(&format!("127.0.0.1:{KUBE_ROUTER_HEALTH_PORT}"), "/healthz")
        });
    }

    /// Whether the Node is registered and Ready (kubectl as the
    /// administrator).
    fn node_ready(&self) -> bool {
        let out = Command::new(crate::kubectl::kubectl_path())
            .args([
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .env("KUBECONFIG", &self.admin)
            .env("KUBECACHEDIR", self.dir.join("kubectl-cache"))
            .stdin(Stdio::null())
            .output();
        matches!(out, Ok(o) if o.status.success() && o.stdout == b"True")
    }

    /// The kubelet's cgroup root in each hierarchy (it must exist); a
    /// cpuset's CPUs and memory nodes are its parent's.
    fn make_cgroup_root(&self) {
        for h in hierarchies() {
            let root = h.join(self.cgroup_root.trim_start_matches('/'));
            std::fs::create_dir_all(&root)
                .unwrap_or_else(|e| panic!("the cgroup {}: {e}", root.display()));
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(parent) = std::fs::read_to_string(h.join(file)) {
                    let _ = std::fs::write(root.join(file), parent.trim());
                }
            }
        }
    }

    /// Poll `ok` until it holds, or panic with `name`'s log when a server
    /// exits or [`START_TIMEOUT`] passes.
    fn until(&self, servers: &mut Children, name: &str, ok: impl Fn() -> bool) {
        let deadline = Instant::now() + START_TIMEOUT;
        while !ok() {
            if let Some(exited) = servers.exited() {
                panic!(
                    "{exited} exited; its log:\n{}",
                    tail(&servers.log(&exited), 6000)
                );
            }
            assert!(
                Instant::now() < deadline,
                "{name} is not up after {START_TIMEOUT:?}; its log:\n{}",
                tail(&servers.log(name), 6000)
            );
            std::thread::sleep(POLL);
        }
    }

    /// Stop the servers and leave nothing behind: the pods' processes
    /// (what is left in the kubelet's cgroups), containerd's shims, the
    /// mounts under the node's directory, the cgroups.
    fn tear_down(&self, servers: &mut Children) {
        servers.stop_one("kubelet", nix::sys::signal::Signal::SIGTERM);
        for _ in 0..50 {
            if kill_cgroup_tree(&self.cgroup_root) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        servers.stop();
        end_shims(&self.containerd_socket);
        unmount_under(&self.dir);
        remove_cgroup_tree(&self.cgroup_root);
    }
}

/// The cgroup v1 hierarchies the kubelet makes its root in.
fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").is_file())
                .collect()
        })
        .unwrap_or_default()
}

/// Every cgroup under `root` in every hierarchy, the deepest first.
fn cgroup_tree(root: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    for h in hierarchies() {
        let top = h.join(root.trim_start_matches('/'));
        if top.is_dir() {
            walk(&top, &mut out);
        }
    }
    out
}

/// SIGKILL every process in the cgroups under `root`; how many there were.
fn kill_cgroup_tree(root: &str) -> usize {
    let mut n = 0;
    for cg in cgroup_tree(root) {
        let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            n += 1;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    n
}

fn remove_cgroup_tree(root: &str) {
    for cg in cgroup_tree(root) {
        let _ = std::fs::remove_dir(&cg);
    }
}

/// SIGKILL the containerd shims that served `socket`'s containerd (they
/// outlive it by design).
fn end_shims(socket: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let needle = socket.display().to_string();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("containerd-shim") && cmdline.contains(&needle) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Unmount (lazily, the deepest first) every mount point under `dir`.
fn unmount_under(dir: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.display().to_string();
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = nix::mount::umount2(p.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}
