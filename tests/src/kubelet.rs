//! A kubelet stand-in for the real control plane ([`crate::control_plane`]):
//! it registers a Node, binds the Pods of the namespaces it is given to that
//! Node (there is no scheduler), runs each container as a local process and
//! writes the Pods' status; the real Deployment and ReplicaSet controllers
//! do the rest (rollouts, readiness counts). Each Service of those
//! namespaces gets a loopback address of its own, as a cluster IP, where
//! each of its ports reaches its ready Pods ([`Kubelet::service_address`]),
//! and every container sees its namespace's Services by name in its
//! `/etc/hosts` (`NAME`, `NAME.NS`, `NAME.NS.svc`, `NAME.NS.svc.cluster.local`),
//! as cluster DNS would give them. Every container also gets
//! `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, as a kubelet
//! gives those of the `kubernetes` Service whatever `enableServiceLinks`
//! says: here the real API server's own address (`127.0.0.1` and its
//! port), whose serving certificate the CA each namespace's
//! `kube-root-ca.crt` publishes verifies for that host.
//!
//! A container's image is mapped to a local program; its volumes
//! (ConfigMap, Secret, emptyDir, PersistentVolumeClaim) are directories
//! bind-mounted at their mount paths in a private mount namespace of the
//! process (`unshare --mount`); its environment comes from literal values
//! (`$(VAR)` of an earlier variable), `secretKeyRef`, `configMapKeyRef` and
//! `fieldRef`. Each Pod gets a loopback address of its own (127.x.y.z, at
//! random): an argument `0.0.0.0` becomes that address, and the container
//! is told to answer to any host name (`BINDERY_ALLOWED_HOSTS=*`), as on a
//! Pod's own address (a server on a loopback address otherwise answers to
//! loopback names only). Readiness probes
//! (`httpGet`) are polled. A container that exits runs again, unless the
//! Pod's `restartPolicy` says otherwise (`Never`; `OnFailure` after a
//! success): then the Pod ends `Succeeded` or `Failed`, as `helm test`
//! waits for. A Pod being deleted has its processes stopped (SIGTERM, then
//! SIGKILL) and is then removed. The processes die with the kubelet,
//! however the test process ends. Containers run as the test's user:
//! `securityContext` is not applied.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, KeyToPath, Node, Pod, Secret, Service, ServicePort, Volume,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::control_plane::{ControlPlane, ADMIN};

/// How often a readiness probe runs (its `periodSeconds` is not waited for).
const PROBE_EVERY: Duration = Duration::from_millis(200);
/// How long a container that exited waits before it runs again.
const RESTART_AFTER: Duration = Duration::from_millis(500);
/// How long a container may take to stop on SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often a Pod that cannot start yet (a Secret missing) tries again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// A running kubelet stand-in; stopping it (dropping it) stops its Pods'
/// processes.
pub struct Kubelet {
    /// The Node it registered.
    pub node: String,
    root: PathBuf,
    services: Addresses,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Kubelet {
    /// Start a kubelet for the Pods and Services of `namespaces`, running
    /// each image of `images` as its program, with the Pods' files (volumes
    /// and container logs, `NAMESPACE/POD/CONTAINER.log`) under `root`.
    pub fn start(
        plane: &ControlPlane,
        namespaces: &[&str],
        images: &[(&str, &Path)],
        root: &Path,
    ) -> Kubelet {
        let node = format!("kubelet-{}", &crate::control_plane::random_token()[..10]);
        let kubeconfig = plane.kubeconfig(ADMIN).to_path_buf();
        let api = reqwest::Url::parse(&plane.url).expect("the API server's URL");
        let shared = Shared {
            node: node.clone(),
            root: root.to_path_buf(),
            // A bare address, as the variable holds it (an IPv6 one too).
            api_host: api
                .host_str()
                .expect("the API server's host")
                .trim_matches(['[', ']'])
                .to_string(),
            api_port: api
                .port_or_known_default()
                .expect("the API server's port")
                .to_string(),
            images: images
                .iter()
                .map(|(i, p)| (i.to_string(), p.to_path_buf()))
                .collect(),
        };
        let namespaces: Vec<String> = namespaces.iter().map(|n| n.to_string()).collect();
        let services = Addresses::default();
        let addresses = services.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        // The processes are children of this thread, which lives as long as
        // the kubelet: a child's parent-death signal follows the thread that
        // spawned it.
        let thread = std::thread::Builder::new()
            .name(format!("kubelet {node}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the kubelet");
                runtime.block_on(run(
                    kubeconfig, shared, namespaces, addresses, ready_tx, stop_rx,
                ));
            })
            .expect("a thread for the kubelet");
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(why)) => panic!("the kubelet did not start: {why}"),
            Err(_) => panic!("the kubelet's thread ended without a word"),
        }
        Kubelet {
            node,
            root: root.to_path_buf(),
            services,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// The address of the Service `ns/name` (its ports are its spec's),
    /// once the kubelet has seen it.
    pub fn service_address(&self, ns: &str, name: &str) -> Option<String> {
        self.services
            .lock()
            .unwrap()
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Where the Pods' files are.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Each Service's address, by (namespace, name).
type Addresses = Arc<Mutex<HashMap<(String, String), String>>>;

/// The proxy tasks of a Service's ports.
type Proxies = Mutex<HashMap<(String, String), Vec<tokio::task::JoinHandle<()>>>>;

/// What every task of the kubelet knows.
struct Shared {
    node: String,
    root: PathBuf,
    /// Where containers reach the API server: `KUBERNETES_SERVICE_HOST`
    /// and `KUBERNETES_SERVICE_PORT`.
    api_host: String,
    api_port: String,
    images: HashMap<String, PathBuf>,
}

/// The kubelet's state: its Pods, its Services' proxies.
struct State {
    client: Client,
    shared: Shared,
    /// Every Pod of each namespace, as watched (the proxies' endpoints).
    pods: HashMap<String, Store<Pod>>,
    /// Every Service of each namespace, as watched (their selectors).
    services: HashMap<String, Store<Service>>,
    running: Mutex<HashMap<(String, String), RunningPod>>,
    proxies: Proxies,
    addresses: Addresses,
}

struct RunningPod {
    uid: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn run(
    kubeconfig: PathBuf,
    shared: Shared,
    namespaces: Vec<String>,
    addresses: Addresses,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
    stop: tokio::sync::oneshot::Receiver<()>,
) {
    let client = match client(&kubeconfig).await {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if let Err(e) = register_node(&client, &shared.node).await {
        let _ = ready.send(Err(format!("registering Node {}: {e}", shared.node)));
        return;
    }
    let mut pods = HashMap::new();
    let mut services = HashMap::new();
    let mut streams = Vec::new();
    for ns in &namespaces {
        let (store, writer) = reflector::store();
        pods.insert(ns.clone(), store);
        let api = Api::<Pod>::namespaced(client.clone(), ns);
        streams.push(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .map_ok(|e| Change::Pod(Box::new(e)))
                .boxed(),
        );
        let (store, writer) = reflector::store();
        services.insert(ns.clone(), store);
        let api = Api::<Service>::namespaced(client.clone(), ns);
        streams.push(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .map_ok(|e| Change::Service(Box::new(e)))
                .boxed(),
        );
    }
    let state = Arc::new(State {
        client: client.clone(),
        shared,
        pods,
        services,
        running: Mutex::default(),
        proxies: Mutex::default(),
        addresses,
    });
    let _ = ready.send(Ok(()));
    let mut changes = futures::stream::select_all(streams);
    let mut stop = stop;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            change = changes.next() => match change {
                Some(Ok(Change::Pod(e))) => pod_event(&state, *e).await,
                Some(Ok(Change::Service(e))) => service_event(&state, *e).await,
                Some(Err(e)) => eprintln!("kubelet {}: watch: {e}", state.shared.node),
                None => break,
            },
        }
    }
    // Stopped: every Pod's processes, then the proxies.
    let running: Vec<RunningPod> = state
        .running
        .lock()
        .unwrap()
        .drain()
        .map(|(_, r)| r)
        .collect();
    for r in running {
        let _ = r.stop.send(true);
        let _ = r.task.await;
    }
    for (_, tasks) in state.proxies.lock().unwrap().drain() {
        tasks.iter().for_each(|t| t.abort());
    }
    let _ = Api::<Node>::all(client)
        .delete(&state.shared.node, &DeleteParams::default())
        .await;
}

enum Change {
    Pod(Box<watcher::Event<Pod>>),
    Service(Box<watcher::Event<Service>>),
}

async fn client(kubeconfig: &Path) -> Result<Client, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

async fn register_node(client: &Client, name: &str) -> Result<(), kube::Error> {
    let nodes = Api::<Node>::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    }))
    .expect("a Node");
    nodes.create(&PostParams::default(), &node).await?;
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "the test kubelet runs", "lastHeartbeatTime": now(),
                        "lastTransitionTime": now()}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

async fn pod_event(state: &Arc<State>, event: watcher::Event<Pod>) {
    match event {
        watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
            pod_changed(state, pod).await
        }
        watcher::Event::Delete(pod) => {
            let key = (pod.namespace().unwrap_or_default(), pod.name_any());
            let gone = state.running.lock().unwrap().remove(&key);
            if let Some(r) = gone {
                let _ = r.stop.send(true);
                let _ = r.task.await;
            }
        }
        _ => {}
    }
}

async fn pod_changed(state: &Arc<State>, pod: Pod) {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    let api = Api::<Pod>::namespaced(state.client.clone(), &ns);
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let deleting = pod.metadata.deletion_timestamp.is_some();
    match node {
        // The scheduler's part: bind it here.
        None if !deleting => {
            let binding = json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": state.shared.node},
            });
            if let Err(e) = api
                .create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
                .await
            {
                eprintln!("kubelet: binding {ns}/{name}: {e}");
            }
        }
        Some(n) if n == state.shared.node => {
            if deleting {
                let gone = state
                    .running
                    .lock()
                    .unwrap()
                    .remove(&(ns.clone(), name.clone()));
                if let Some(r) = gone {
                    let _ = r.stop.send(true);
                    let _ = r.task.await;
                }
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                if let Err(e) = api.delete(&name, &params).await {
                    if !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409) {
                        eprintln!("kubelet: removing {ns}/{name}: {e}");
                    }
                }
                return;
            }
            let mut running = state.running.lock().unwrap();
            let key = (ns, name);
            if running.get(&key).is_some_and(|r| r.uid == uid) {
                return;
            }
            let (stop, stopped) = watch::channel(false);
            let task = tokio::spawn(run_pod(state.clone(), pod, stopped));
            if let Some(old) = running.insert(key, RunningPod { uid, stop, task }) {
                let _ = old.stop.send(true);
            }
        }
        _ => {}
    }
}

/// Why a Pod does not run (yet): its waiting reason and message.
struct NotYet {
    reason: &'static str,
    message: String,
    /// Whether it can change (a Secret may yet appear; an image never).
    retry: bool,
}

impl NotYet {
    fn config(message: String) -> NotYet {
        NotYet {
            reason: "CreateContainerConfigError",
            message,
            retry: true,
        }
    }
}

/// One container, ready to launch.
struct Launch {
    name: String,
    image: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    /// (source directory, mount path, read only)
    mounts: Vec<(PathBuf, String, bool)>,
    /// The readiness probe's URL.
    probe: Option<String>,
}

/// What the Pod's status shows of one container.
#[derive(Clone, Default)]
struct ContainerState {
    name: String,
    image: String,
    running: bool,
    ready: bool,
    restarts: i32,
    started: String,
    /// Its exit code, once it exited for good (`restartPolicy`).
    exit: Option<i32>,
}

/// A Pod's containers as its status shows them, and what was last written.
struct PodState {
    ns: String,
    name: String,
    ip: String,
    /// `Always`, `OnFailure` or `Never`.
    restart: String,
    containers: Mutex<Vec<ContainerState>>,
    written: Mutex<Option<Value>>,
}

async fn run_pod(state: Arc<State>, pod: Pod, mut stop: watch::Receiver<bool>) {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let dir = state.shared.root.join(&ns).join(&name);
    let spec = pod.spec.clone().unwrap_or_default();
    let ports: Vec<i32> = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten().map(|p| p.container_port))
        .collect();
    let me = Arc::new(PodState {
        ns: ns.clone(),
        name: name.clone(),
        ip: free_address(&ports),
        restart: spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into()),
        containers: Mutex::default(),
        written: Mutex::default(),
    });
    let launches = loop {
        match prepare(&state, &pod, &me, &dir).await {
            Ok(l) => break l,
            Err(not_yet) => {
                write_status(&state, &me, "Pending", Some(&not_yet)).await;
                if !not_yet.retry {
                    let _ = until_stopped(&mut stop).await;
                    return;
                }
                tokio::select! {
                    _ = until_stopped(&mut stop) => return,
                    _ = tokio::time::sleep(RETRY_EVERY) => {}
                }
            }
        }
    };
    *me.containers.lock().unwrap() = launches
        .iter()
        .map(|l| ContainerState {
            name: l.name.clone(),
            image: l.image.clone(),
            ..Default::default()
        })
        .collect();
    write_status(&state, &me, "Running", None).await;
    let tasks: Vec<_> = launches
        .into_iter()
        .enumerate()
        .map(|(i, l)| keep_running(state.clone(), me.clone(), i, l, dir.clone(), stop.clone()))
        .collect();
    futures::future::join_all(tasks).await;
    // A Pod that ended keeps its files (its logs) until it is deleted.
    if stopped(&stop) {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The volumes as directories, and each container's argv, environment,
/// mounts and probe.
async fn prepare(
    state: &State,
    pod: &Pod,
    me: &PodState,
    dir: &Path,
) -> Result<Vec<Launch>, NotYet> {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut volumes = HashMap::new();
    for v in spec.volumes.iter().flatten() {
        volumes.insert(v.name.clone(), volume(state, pod, me, dir, v).await?);
    }
    let mut launches = Vec::new();
    for c in &spec.containers {
        launches.push(launch(state, pod, me, c, &volumes).await?);
    }
    Ok(launches)
}

async fn launch(
    state: &State,
    pod: &Pod,
    me: &PodState,
    c: &Container,
    volumes: &HashMap<String, PathBuf>,
) -> Result<Launch, NotYet> {
    let image = c.image.clone().unwrap_or_default();
    let program = program(&state.shared, &image)?;
    let mut argv: Vec<String> = match &c.command {
        Some(command) if !command.is_empty() => command.clone(),
        _ => vec![String::new()],
    };
    // The image's program, wherever the image keeps it.
    argv[0] = program.display().to_string();
    argv.extend(c.args.iter().flatten().cloned());
    for a in argv.iter_mut().skip(1) {
        *a = a.replace("0.0.0.0", &me.ip);
    }
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
        ),
        ("HOSTNAME".into(), me.name.clone()),
        // The `kubernetes` Service, as a kubelet gives it to every
        // container: the real API server (its certificate names 127.0.0.1).
        (
            "KUBERNETES_SERVICE_HOST".into(),
            state.shared.api_host.clone(),
        ),
        (
            "KUBERNETES_SERVICE_PORT".into(),
            state.shared.api_port.clone(),
        ),
    ];
    env.push(("BINDERY_ALLOWED_HOSTS".into(), "*".into()));
    for e in c.env.iter().flatten() {
        if let Some(value) = env_value(state, pod, me, e).await? {
            let value = if e.value.is_some() {
                expand(&value, &env)
            } else {
                value
            };
            env.retain(|(k, _)| k != &e.name);
            env.push((e.name.clone(), value));
        }
    }
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(source) = volumes.get(&m.name) else {
            return Err(NotYet::config(format!(
                "volume \"{}\" is not in the pod",
                m.name
            )));
        };
        mounts.push((
            source.clone(),
            m.mount_path.clone(),
            m.read_only.unwrap_or(false),
        ));
    }
    let probe = c
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .map(|h| {
            let port = match &h.port {
                IntOrString::Int(p) => p.to_string(),
                IntOrString::String(named) => c
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(named.as_str()))
                    .map(|p| p.container_port.to_string())
                    .unwrap_or_else(|| named.clone()),
            };
            format!(
                "http://{}:{port}{}",
                me.ip,
                h.path.clone().unwrap_or_else(|| "/".into())
            )
        });
    Ok(Launch {
        name: c.name.clone(),
        image,
        argv,
        env,
        mounts,
        probe,
    })
}

fn program(shared: &Shared, image: &str) -> Result<PathBuf, NotYet> {
    let bare = image
        .rsplit_once('@')
        .map_or(image, |(i, _)| i)
        .rsplit_once(':')
        .map_or(image, |(i, _)| i);
    shared
        .images
        .get(image)
        .or_else(|| shared.images.get(bare))
        .cloned()
        .ok_or_else(|| NotYet {
            reason: "ErrImagePull",
            message: format!("the test kubelet has no program for image \"{image}\""),
            retry: false,
        })
}

/// A literal env value as Kubernetes gives it: `$(VAR)` is an earlier
/// variable's value (an unknown one stays as written), `$$` one `$`.
fn expand(text: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after
            .strip_prefix('(')
            .and_then(|a| a.split_once(')'))
            .filter(|(n, _)| {
                !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        {
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A key of a Secret or ConfigMap of `ns`: its text, `None` when optional
/// and absent.
async fn key_of(
    state: &State,
    ns: &str,
    secret: bool,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<Vec<u8>>, NotYet> {
    let data = source_data(state, ns, secret, name, optional).await?;
    match data.and_then(|d| d.get(key).cloned()) {
        Some(v) => Ok(Some(v)),
        None if optional => Ok(None),
        None => Err(NotYet::config(format!(
            "couldn't find key {key} in {} {ns}/{name}",
            if secret { "Secret" } else { "ConfigMap" }
        ))),
    }
}

/// Every key of a Secret or ConfigMap of `ns`, `None` when optional and
/// absent.
async fn source_data(
    state: &State,
    ns: &str,
    secret: bool,
    name: &str,
    optional: bool,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, NotYet> {
    let found = if secret {
        Api::<Secret>::namespaced(state.client.clone(), ns)
            .get_opt(name)
            .await
            .map(|s| {
                s.map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect()
                })
            })
    } else {
        Api::<ConfigMap>::namespaced(state.client.clone(), ns)
            .get_opt(name)
            .await
            .map(|c| {
                c.map(|c| {
                    let mut all: BTreeMap<String, Vec<u8>> = c
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    all.extend(
                        c.binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0)),
                    );
                    all
                })
            })
    };
    let kind = if secret { "secret" } else { "configmap" };
    match found {
        Ok(Some(data)) => Ok(Some(data)),
        Ok(None) if optional => Ok(None),
        Ok(None) => Err(NotYet::config(format!("{kind} \"{name}\" not found"))),
        Err(e) => Err(NotYet::config(format!("reading {kind} \"{name}\": {e}"))),
    }
}

async fn env_value(
    state: &State,
    pod: &Pod,
    me: &PodState,
    e: &EnvVar,
) -> Result<Option<String>, NotYet> {
    if let Some(v) = &e.value {
        return Ok(Some(v.clone()));
    }
    let Some(from) = &e.value_from else {
        return Ok(Some(String::new()));
    };
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    if let Some(r) = &from.secret_key_ref {
        let optional = r.optional.unwrap_or(false);
        return Ok(key_of(state, &me.ns, true, &r.name, &r.key, optional)
            .await?
            .map(text));
    }
    if let Some(r) = &from.config_map_key_ref {
        let optional = r.optional.unwrap_or(false);
        return Ok(key_of(state, &me.ns, false, &r.name, &r.key, optional)
            .await?
            .map(text));
    }
    if let Some(f) = &from.field_ref {
        let spec = pod.spec.as_ref();
        return Ok(Some(match f.field_path.as_str() {
            "metadata.name" => me.name.clone(),
            "metadata.namespace" => me.ns.clone(),
            "status.podIP" => me.ip.clone(),
            "spec.nodeName" => state.shared.node.clone(),
            "spec.serviceAccountName" => spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
            _ => String::new(),
        }));
    }
    Ok(None)
}

/// A volume as a directory of its own.
async fn volume(
    state: &State,
    pod: &Pod,
    me: &PodState,
    dir: &Path,
    v: &Volume,
) -> Result<PathBuf, NotYet> {
    let ns = &me.ns;
    if let Some(claim) = &v.persistent_volume_claim {
        // The claim's data outlives the Pod.
        let path = state
            .shared
            .root
            .join(ns)
            .join("_claims")
            .join(&claim.claim_name);
        std::fs::create_dir_all(&path).expect("a claim's directory");
        return Ok(path);
    }
    let path = dir.join("volumes").join(&v.name);
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("a volume's directory");
    if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let keys = Keys::of(true, &name, s.optional, &s.items);
        write_items(state, ns, keys, s.default_mode, &path).await?;
    } else if let Some(c) = &v.config_map {
        let keys = Keys::of(false, &c.name, c.optional, &c.items);
        write_items(state, ns, keys, c.default_mode, &path).await?;
    } else if let Some(p) = &v.projected {
        // What the ServiceAccount admission plugin mounts: a token of the
        // Pod's account, the cluster's CA, its namespace.
        for source in p.sources.iter().flatten() {
            if let Some(t) = &source.service_account_token {
                let token = service_account_token(state, pod, ns, t.expiration_seconds).await?;
                write_file(&path.join(&t.path), token.as_bytes(), p.default_mode);
            }
            if let Some(c) = &source.config_map {
                let keys = Keys::of(false, &c.name, c.optional, &c.items);
                write_items(state, ns, keys, p.default_mode, &path).await?;
            }
            if let Some(s) = &source.secret {
                let keys = Keys::of(true, &s.name, s.optional, &s.items);
                write_items(state, ns, keys, p.default_mode, &path).await?;
            }
            if let Some(d) = &source.downward_api {
                for item in d.items.iter().flatten() {
                    let value = match item.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("metadata.namespace") => me.ns.clone(),
                        Some("metadata.name") => me.name.clone(),
                        _ => String::new(),
                    };
                    write_file(&path.join(&item.path), value.as_bytes(), p.default_mode);
                }
            }
        }
    } else if v.empty_dir.is_none() {
        return Err(NotYet {
            reason: "CreateContainerConfigError",
            message: format!(
                "volume \"{}\": the test kubelet mounts configMap, secret, projected, emptyDir and persistentVolumeClaim volumes only",
                v.name
            ),
            retry: false,
        });
    }
    Ok(path)
}

/// Which keys of a Secret or ConfigMap a volume holds, and as which files.
struct Keys<'a> {
    secret: bool,
    name: &'a str,
    optional: bool,
    /// (key, file, mode); none: every key under its own name.
    items: &'a [KeyToPath],
}

impl<'a> Keys<'a> {
    fn of(
        secret: bool,
        name: &'a str,
        optional: Option<bool>,
        items: &'a Option<Vec<KeyToPath>>,
    ) -> Keys<'a> {
        Keys {
            secret,
            name,
            optional: optional.unwrap_or(false),
            items: items.as_deref().unwrap_or_default(),
        }
    }
}

/// The keys of a Secret or ConfigMap as files under `path`, each with its
/// item's mode or `mode`.
async fn write_items(
    state: &State,
    ns: &str,
    keys: Keys<'_>,
    mode: Option<i32>,
    path: &Path,
) -> Result<(), NotYet> {
    let Keys {
        secret,
        name,
        optional,
        items,
    } = keys;
    let data = source_data(state, ns, secret, name, optional)
        .await?
        .unwrap_or_default();
    let items: Vec<(String, String, Option<i32>)> = if items.is_empty() {
        data.keys().map(|k| (k.clone(), k.clone(), None)).collect()
    } else {
        items
            .iter()
            .map(|i| (i.key.clone(), i.path.clone(), i.mode))
            .collect()
    };
    for (key, file, item_mode) in items {
        let Some(bytes) = data.get(&key) else {
            if optional {
                continue;
            }
            return Err(NotYet::config(format!("{name} has no key {key}")));
        };
        write_file(&path.join(file), bytes, item_mode.or(mode));
    }
    Ok(())
}

fn write_file(file: &Path, bytes: &[u8], mode: Option<i32>) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).expect("a volume's directory");
    }
    std::fs::write(file, bytes).expect("a volume's file");
    let mode = mode.unwrap_or(0o644) as u32;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode))
        .expect("a volume file's mode");
}

/// A token of the Pod's ServiceAccount, from its TokenRequest.
async fn service_account_token(
    state: &State,
    pod: &Pod,
    ns: &str,
    expiration: Option<i64>,
) -> Result<String, NotYet> {
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": expiration.unwrap_or(3607)},
    });
    let api =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(state.client.clone(), ns);
    let answer: Value = api
        .create_subresource("token", &account, &PostParams::default(), &request)
        .await
        .map_err(|e| NotYet::config(format!("a token of ServiceAccount {account}: {e}")))?;
    answer["status"]["token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| NotYet::config(format!("no token for ServiceAccount {account}")))
}

/// Run one container until the Pod stops, again whenever it exits; probe
/// its readiness meanwhile.
async fn keep_running(
    state: Arc<State>,
    me: Arc<PodState>,
    index: usize,
    launch: Launch,
    dir: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    // The program is opened before any mount: an emptyDir at /tmp hides it
    // when the workspace (and so the built binary) lives below /tmp. A
    // mount over an ancestor of the Pods' directory would hide the other
    // volumes' directories: it comes last.
    let mut script = vec!["set -e".to_string(), "exec 3<\"$1\"".into(), "shift".into()];
    let root = state
        .shared
        .root
        .canonicalize()
        .unwrap_or(state.shared.root.clone());
    let shadows = |target: &str| {
        root.display()
            .to_string()
            .starts_with(&format!("{}/", target.trim_end_matches('/')))
    };
    // The namespace's Services by name (as cluster DNS would answer);
    // first, while the Pods' directory is still in sight.
    let hosts_file = dir.join(format!("{}.hosts", launch.name));
    script.push(format!(
        "mount --bind {} /etc/hosts",
        shell_quote(&hosts_file.display().to_string())
    ));
    let mut mounts = launch.mounts.clone();
    mounts.sort_by_key(|(_, target, _)| shadows(target));
    for (source, target, read_only) in &mounts {
        let (s, t) = (
            shell_quote(&source.display().to_string()),
            shell_quote(target),
        );
        script.push(format!("mkdir -p {t} && mount --bind {s} {t}"));
        if *read_only {
            script.push(format!("mount -o remount,bind,ro {t}"));
        }
    }
    script.push("exec /proc/self/fd/3 \"$@\"".into());
    let log = dir.join(format!("{}.log", launch.name));
    let probe = tokio::spawn(probe_readiness(
        state.clone(),
        me.clone(),
        index,
        launch.probe.clone(),
        stop.clone(),
    ));
    while !stopped(&stop) {
        if let Err(e) = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&hosts_file, hosts(&state, &me.ns, &me)))
        {
            eprintln!(
                "kubelet: {}/{} {}: hosts file: {e}",
                me.ns, me.name, launch.name
            );
            break;
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("a container's log");
        let mut cmd = tokio::process::Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(script.join("\n"))
            .arg("sh")
            .args(&launch.argv)
            .env_clear()
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("the log"))
            .stderr(out)
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: between fork and exec the closure only calls prctl, which
        // is async-signal-safe.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("kubelet: {}/{} {}: {e}", me.ns, me.name, launch.name);
                break;
            }
        };
        set_container(&me, index, |c| {
            c.running = true;
            c.started = now();
        });
        write_status(&state, &me, "Running", None).await;
        let pid = child.id().map(|p| Pid::from_raw(p as i32));
        let code = tokio::select! {
            status = child.wait() => status.ok().and_then(|s| s.code()).unwrap_or(-1),
            _ = until_stopped(&mut stop) => {
                if let Some(pid) = pid {
                    let _ = killpg(pid, Signal::SIGTERM);
                    if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                        let _ = killpg(pid, Signal::SIGKILL);
                        let _ = child.wait().await;
                    }
                }
                break;
            }
        };
        if me.restart == "Never" || (me.restart == "OnFailure" && code == 0) {
            set_container(&me, index, |c| {
                c.running = false;
                c.ready = false;
                c.exit = Some(code);
            });
            write_status(&state, &me, "Running", None).await;
            break;
        }
        set_container(&me, index, |c| {
            c.running = false;
            c.ready = false;
            c.restarts += 1;
        });
        write_status(&state, &me, "Running", None).await;
        tokio::select! {
            _ = until_stopped(&mut stop) => break,
            _ = tokio::time::sleep(RESTART_AFTER) => {}
        }
    }
    probe.abort();
}

/// Until the Pod is told to stop (or whoever could tell it is gone).
async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    while !stopped(stop) {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Whether the Pod is stopping (the guard is not held across an await).
fn stopped(stop: &watch::Receiver<bool>) -> bool {
    let now = *stop.borrow();
    now
}

fn set_container(me: &PodState, index: usize, change: impl FnOnce(&mut ContainerState)) {
    if let Some(c) = me.containers.lock().unwrap().get_mut(index) {
        change(c);
    }
}

async fn probe_readiness(
    state: Arc<State>,
    me: Arc<PodState>,
    index: usize,
    url: Option<String>,
    stop: watch::Receiver<bool>,
) {
    let Some(url) = url else {
        // No probe: ready once started.
        loop {
            let running = me.containers.lock().unwrap()[index].running;
            if running {
                set_container(&me, index, |c| c.ready = true);
                write_status(&state, &me, "Running", None).await;
                return;
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .build()
        .expect("an HTTP client");
    while !stopped(&stop) {
        let ok = match http.get(&url).send().await {
            Ok(r) => r.status().is_success() || r.status().is_redirection(),
            Err(_) => false,
        };
        let (was, running) = {
            let c = &me.containers.lock().unwrap()[index];
            (c.ready, c.running)
        };
        let ok = ok && running;
        if ok != was {
            set_container(&me, index, |c| c.ready = ok);
            write_status(&state, &me, "Running", None).await;
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// Write the Pod's status when it changed.
async fn write_status(state: &State, me: &PodState, phase: &str, not_yet: Option<&NotYet>) {
    let containers = me.containers.lock().unwrap().clone();
    // Every container exited for good: the Pod ended.
    let ended: Option<Vec<i32>> = containers.iter().map(|c| c.exit).collect();
    let phase = match ended {
        Some(codes) if !codes.is_empty() && not_yet.is_none() => {
            if codes.iter().all(|c| *c == 0) {
                "Succeeded"
            } else {
                "Failed"
            }
        }
        _ => phase,
    };
    let ready = phase == "Running" && !containers.is_empty() && containers.iter().all(|c| c.ready);
    let cond = if ready { "True" } else { "False" };
    let previous = me.written.lock().unwrap().clone();
    let condition = |type_: &str, status: &str| {
        let before = previous.as_ref().and_then(|p| {
            p["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        });
        let at = match before {
            Some(b) if b["status"] == status => b["lastTransitionTime"].clone(),
            _ => json!(now()),
        };
        json!({"type": type_, "status": status, "lastTransitionTime": at})
    };
    let mut status = json!({
        "phase": phase,
        "podIP": me.ip,
        "podIPs": [{"ip": me.ip}],
        "hostIP": "127.0.0.1",
        "conditions": [
            condition("PodScheduled", "True"),
            condition("Initialized", "True"),
            condition("ContainersReady", cond),
            condition("Ready", cond),
        ],
        "containerStatuses": containers.iter().map(|c| json!({
            "name": c.name,
            "ready": c.ready,
            "restartCount": c.restarts,
            "started": c.running,
            "image": c.image,
            "imageID": "",
            "state": match (c.running, c.exit) {
                (true, _) => json!({"running": {"startedAt": c.started}}),
                (false, Some(code)) => json!({"terminated": {
                    "exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" },
                    "startedAt": c.started,
                    "finishedAt": now(),
                }}),
                (false, None) => json!({"waiting": {"reason": "ContainerCreating"}}),
            },
        })).collect::<Vec<_>>(),
    });
    if let Some(n) = not_yet {
        status["reason"] = json!(n.reason);
        status["message"] = json!(n.message);
        status["containerStatuses"] = json!([]);
    }
    // The times aside, what changed: an unchanged status is no write.
    let strip = |v: &Value| {
        let mut v = v.clone();
        for c in v["conditions"].as_array_mut().into_iter().flatten() {
            c["lastTransitionTime"] = Value::Null;
        }
        v
    };
    if previous.as_ref().map(strip) == Some(strip(&status)) {
        return;
    }
    let api = Api::<Pod>::namespaced(state.client.clone(), &me.ns);
    match api
        .patch_status(
            &me.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
    {
        Ok(_) => *me.written.lock().unwrap() = Some(status),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => eprintln!("kubelet: status of {}/{}: {e}", me.ns, me.name),
    }
}

async fn service_event(state: &Arc<State>, event: watcher::Event<Service>) {
    match event {
        watcher::Event::Apply(svc) | watcher::Event::InitApply(svc) => {
            let key = (svc.namespace().unwrap_or_default(), svc.name_any());
            if state.proxies.lock().unwrap().contains_key(&key) {
                return;
            }
            let ports: Vec<ServicePort> = svc
                .spec
                .as_ref()
                .and_then(|s| s.ports.clone())
                .unwrap_or_default();
            let wanted: Vec<i32> = ports.iter().map(|p| p.port).collect();
            let ip = free_address(&wanted);
            let mut tasks = Vec::new();
            for port in &ports {
                match tokio::net::TcpListener::bind((ip.as_str(), port.port as u16)).await {
                    Ok(listener) => tasks.push(tokio::spawn(proxy(
                        state.clone(),
                        key.clone(),
                        port.clone(),
                        listener,
                    ))),
                    Err(e) => eprintln!(
                        "kubelet: Service {}/{} port {}: {e}",
                        key.0, key.1, port.port
                    ),
                }
            }
            state.proxies.lock().unwrap().insert(key.clone(), tasks);
            state.addresses.lock().unwrap().insert(key, ip);
        }
        watcher::Event::Delete(svc) => {
            let key = (svc.namespace().unwrap_or_default(), svc.name_any());
            if let Some(tasks) = state.proxies.lock().unwrap().remove(&key) {
                tasks.iter().for_each(|t| t.abort());
            }
            state.addresses.lock().unwrap().remove(&key);
        }
        _ => {}
    }
}

/// `/etc/hosts` for a Pod of `ns`: its own name, and every Service of its
/// namespace the kubelet knows, by the names cluster DNS gives them.
fn hosts(state: &State, ns: &str, pod: &PodState) -> String {
    let mut out = format!(
        "127.0.0.1 localhost\n::1 localhost\n{} {}\n",
        pod.ip, pod.name
    );
    let addresses = state.addresses.lock().unwrap();
    let mut services: Vec<_> = addresses.iter().filter(|((n, _), _)| n == ns).collect();
    services.sort();
    for ((_, name), ip) in services {
        out.push_str(&format!(
            "{ip} {name} {name}.{ns} {name}.{ns}.svc {name}.{ns}.svc.cluster.local\n"
        ));
    }
    out
}

/// Each connection to a Service's local port goes to one of its ready
/// Pods, in turn.
async fn proxy(
    state: Arc<State>,
    (ns, name): (String, String),
    port: ServicePort,
    listener: tokio::net::TcpListener,
) {
    let mut turn = 0usize;
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            return;
        };
        let endpoints = endpoints(&state, &ns, &name, &port);
        if endpoints.is_empty() {
            continue; // dropped: nothing ready to answer
        }
        let target = endpoints[turn % endpoints.len()].clone();
        turn += 1;
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// The ready Pods' addresses for a Service's port.
fn endpoints(state: &State, ns: &str, name: &str, port: &ServicePort) -> Vec<String> {
    let Some(svc) = state
        .services
        .get(ns)
        .and_then(|s| s.get(&ObjectRef::new(name).within(ns)))
    else {
        return Vec::new();
    };
    let selector = svc
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    if selector.is_empty() {
        return Vec::new();
    }
    let target = port
        .target_port
        .clone()
        .unwrap_or(IntOrString::Int(port.port));
    let Some(store) = state.pods.get(ns) else {
        return Vec::new();
    };
    let mut found: Vec<String> = store
        .state()
        .iter()
        .filter(|p| {
            let labels = p.labels();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            let port = match &target {
                IntOrString::Int(n) => *n,
                IntOrString::String(named) => {
                    p.spec
                        .as_ref()?
                        .containers
                        .iter()
                        .flat_map(|c| c.ports.iter().flatten())
                        .find(|cp| cp.name.as_deref() == Some(named.as_str()))?
                        .container_port
                }
            };
            Some(format!("{ip}:{port}"))
        })
        .collect();
    found.sort();
    found
}

/// A loopback address for a new Pod, random in 127.0.0.0/8 and with its
/// containers' ports free there (other tests on the machine hold addresses
/// of their own).
fn free_address(ports: &[i32]) -> String {
    let mut last = String::new();
    for _ in 0..100 {
        let b = crate::control_plane::random_token();
        let byte = |i: usize| u8::from_str_radix(&b[i..i + 2], 16).unwrap_or(1);
        last = format!(
            "127.{}.{}.{}",
            byte(0).max(1),
            byte(2),
            byte(4).clamp(1, 254)
        );
        if ports
            .iter()
            .all(|p| std::net::TcpListener::bind((last.as_str(), *p as u16)).is_ok())
        {
            break;
        }
    }
    last
}

/// `s` as one word of a POSIX shell's command line (shlex's quoting).
fn shell_quote(s: &str) -> String {
    shlex::try_quote(s)
        .expect("a path with a NUL byte")
        .into_owned()
}

fn now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_second(d.as_secs() as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn env_values_expand_earlier_variables_as_kubernetes_does() {
        let env = vec![("A".to_string(), "x".to_string())];
        assert_eq!(super::expand("$(A)-$(B)-$$(A)-$", &env), "x-$(B)-$(A)-$");
    }
}
