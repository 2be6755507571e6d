//! How fast the operator brings N AgentTenants from nothing to a status, on
//! the real control plane (kube-apiserver, etcd and kube-controller-manager
//! built by tests/control-plane/build.sh), as the operator chart's
//! ServiceAccount:
//!
//!     cargo bench -p bindery-operator --bench reconcile -- [N]
//!
//! prints the API server's own floor for N objects (one list, one watch
//! from the start), the time until every tenant has a status for its
//! generation, reconciles per second, the operator's peak RSS, and the API
//! server's floor for the operator's work: the requests of N first
//! reconciles sent without the operator (the same objects, the same
//! concurrency), which bounds what any operator can do on this server. The
//! controller manager runs beside it, as in a cluster: each Deployment
//! becomes a ReplicaSet and a Pod (which stays Pending: no kubelet). A
//! benchmark, not a test: it asserts nothing about times. N defaults to
//! 1000.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bindery_operator::crd::AgentTenant;
use bindery_operator::names;
use bindery_tests::bench::Process;
use bindery_tests::control_plane::{ControlPlane, ADMIN};
use bindery_tests::helm::Render;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::Api;

const NS: &str = "bench";
/// Where the API server's floor for the operator's work is measured.
const FLOOR: &str = "floor";

fn repo(path: &str) -> String {
    format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
}

/// `GET path` on the operator's metrics server: the body.
fn http_get(base: &str, path: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("the metrics server listens");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn kubectl(plane: &ControlPlane, args: &[&str]) {
    plane.kubectl_ok(ADMIN, args);
}

fn tenant(i: usize) -> AgentTenant {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "bindery.dev/v1alpha1", "kind": "AgentTenant",
        "metadata": {"name": format!("t{i:05}"), "namespace": NS},
        "spec": {
            "agentRef": {"name": "invoices"},
            "parameters": [
                {"name": "tenant", "value": format!("tenant-{i}"), "pinned": true},
                {"name": "billing_token", "valueFrom": {"secretKeyRef": {"name": "acme-billing", "key": "token"}}}
            ],
            "tools": {"configMapRef": {"name": "invoices-tools"}}
        }
    }))
    .unwrap()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("{}", bindery_tests::bench::context());
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let dir = tempfile::tempdir().unwrap();
    let emu = ControlPlane::start(&[]);
    kubectl(&emu, &["create", "namespace", NS]);
    kubectl(&emu, &["apply", "--server-side", "-f", &repo("crds")]);
    kubectl(
        &emu,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/agents.bindery.dev",
            "crd/agenttenants.bindery.dev",
        ],
    );
    let identity = emu.install_operator_identity(
        &Render::new("charts/bindery-operator", "bindery")
            .namespace(NS)
            .set(format!("watchNamespaces={{{NS}}}")),
        dir.path(),
    );
    for f in ["agent.yaml", "tools-configmap.yaml", "billing-secret.yaml"] {
        kubectl(
            &emu,
            &["apply", "-n", NS, "-f", &repo(&format!("examples/k8s/{f}"))],
        );
    }
    let client = emu.client(ADMIN).await;
    let tenants: Api<AgentTenant> = Api::namespaced(client, NS);

    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let tenants = tenants.clone();
            async move {
                tenants
                    .create(&PostParams::default(), &tenant(i))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    println!("created {n} AgentTenants in {:.2?}", started.elapsed());

    // The API server's floor: one list, and one watch from the start, of N.
    let t = Instant::now();
    let listed = tenants.list(&ListParams::default()).await.unwrap();
    let list_time = t.elapsed();
    assert_eq!(listed.items.len(), n);
    let t = Instant::now();
    let mut seen = 0;
    let stream = tenants
        .watch(&WatchParams::default().timeout(60), "0")
        .await
        .unwrap();
    futures::pin_mut!(stream);
    while let Some(event) = stream.try_next().await.unwrap() {
        if matches!(event, WatchEvent::Added(_)) {
            seen += 1;
            if seen == n {
                break;
            }
        }
    }
    let watch_time = t.elapsed();
    println!("API server floor: list of {n} in {list_time:.2?}, watch of {n} in {watch_time:.2?}");

    // The operator, from nothing.
    let log = std::fs::File::create(dir.path().join("operator.stderr")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bindery-operator"))
        .args(["run", "--metrics-listen", "127.0.0.1:0", "--namespace", NS])
        .env("KUBECONFIG", &identity.kubeconfig)
        .env("BINDERY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("the operator starts");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("metrics on ") {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let metrics = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("metrics address");
    // Followed with one watch: polling lists of N would load the API
    // server as much as the operator does.
    let t = Instant::now();
    let mut done = std::collections::BTreeMap::new();
    let stream = tenants
        .watch(&WatchParams::default().timeout(290), "0")
        .await
        .unwrap();
    futures::pin_mut!(stream);
    let deadline = tokio::time::sleep(Duration::from_secs(600));
    tokio::pin!(deadline);
    while done.len() < n || done.values().any(|ok| !ok) {
        let event = tokio::select! {
            e = stream.try_next() => e.unwrap(),
            _ = &mut deadline => None,
        };
        let Some(WatchEvent::Added(t) | WatchEvent::Modified(t)) = event else {
            if event.is_none() {
                break;
            }
            continue;
        };
        let ok = t.status.as_ref().and_then(|s| s.observed_generation) == t.metadata.generation;
        done.insert(t.metadata.name.clone().unwrap_or_default(), ok);
    }
    println!(
        "{} of {n} tenants with a status for their generation after {:.2?}",
        done.values().filter(|ok| **ok).count(),
        t.elapsed()
    );
    let elapsed = t.elapsed().as_secs_f64();
    let text = http_get(&metrics, "/metrics");
    let reconciles: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("bindery_operator_reconciles_total{outcome=\"ok\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    println!(
        "{reconciles} reconciles in {elapsed:.2} s: {:.1} reconciles/s",
        reconciles / elapsed
    );
    println!(
        "operator peak RSS: {:.1} MiB",
        Process::read(pid).peak_rss_kib as f64 / 1024.0
    );
    let _ = child.kill();
    let _ = child.wait();

    let floor = writes_floor(&emu, tenants.clone(), n).await;
    println!(
        "API server floor: the {n} first reconciles' requests ({FIRST_RECONCILE} each, {} at once, \
         no operator) in {floor:.2?}",
        bindery_operator::controller::RECONCILES_AT_ONCE
    );
}

/// Where a tenant's objects are written: its Deployment, Service,
/// ServiceAccount, ConfigMap and Secret.
type OwnedApis = (
    Api<Deployment>,
    Api<Service>,
    Api<ServiceAccount>,
    Api<ConfigMap>,
    Api<Secret>,
);

/// The requests of a tenant's first reconcile: GET the tenant, its two
/// Secrets, its tools ConfigMap and its Deployment; create the owner-token
/// Secret; apply the ConfigMap, ServiceAccount, Deployment and Service;
/// list (by metadata) what it owns of each of seven kinds (the five, and
/// the Role and RoleBinding of a tenant with an approval webhook); apply
/// its status.
const FIRST_RECONCILE: usize = 18;

/// An object as the operator sends it: read back from namespace `NS`,
/// without what the API server sets (status, uid, owners...), named `name`
/// in namespace `ns`.
fn as_sent<K: kube::Resource + serde::Serialize>(
    obj: &K,
    ns: &str,
    name: &str,
) -> serde_json::Value {
    let mut v = serde_json::to_value(obj).unwrap();
    let map = v.as_object_mut().unwrap();
    map.remove("status");
    // What the API server allocated: a copy gets its own.
    if let Some(spec) = map.get_mut("spec").and_then(|s| s.as_object_mut()) {
        spec.remove("clusterIP");
        spec.remove("clusterIPs");
    }
    map.insert(
        "metadata".into(),
        serde_json::json!({
            "name": name,
            "namespace": ns,
            "labels": obj.meta().labels,
            "annotations": obj.meta().annotations,
        }),
    );
    v
}

/// Server-side apply of a copy of `obj` (see [`as_sent`]) as `name`.
async fn apply_copy<K>(api: &Api<K>, name: &str, obj: &K)
where
    K: kube::Resource + serde::Serialize + serde::de::DeserializeOwned + Clone + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(names::FIELD_MANAGER).force(),
        &Patch::Apply(as_sent(obj, FLOOR, name)),
    )
    .await
    .unwrap();
}

/// The API server's own floor for the operator's work: the requests of N
/// first reconciles, as `FIRST_RECONCILE` says, with the operator's
/// objects (copied from the first tenant's), its concurrency and no
/// operator, in a namespace of their own. Returns how long they took.
async fn writes_floor(emu: &ControlPlane, tenants: Api<AgentTenant>, n: usize) -> Duration {
    let client = tenants.clone().into_client();
    let sample = tenants.get("t00000").await.unwrap();
    let at = |ns: &str| -> OwnedApis {
        (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        )
    };
    let (deployments, services, accounts, config_maps, secrets) = at(NS);
    let deployment = deployments.get(&names::workload("t00000")).await.unwrap();
    let service = services.get(&names::workload("t00000")).await.unwrap();
    let account = accounts.get(&names::workload("t00000")).await.unwrap();
    let config_map = config_maps.get(&names::config_map("t00000")).await.unwrap();
    let token = secrets
        .get(&names::owner_token_secret("t00000"))
        .await
        .unwrap();
    let status = sample.status.clone();

    let ns_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        ns_file.path(),
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {FLOOR}}}\n"),
    )
    .unwrap();
    kubectl(emu, &["apply", "-f", ns_file.path().to_str().unwrap()]);
    for f in ["tools-configmap.yaml", "billing-secret.yaml"] {
        kubectl(
            emu,
            &[
                "apply",
                "-n",
                FLOOR,
                "-f",
                &repo(&format!("examples/k8s/{f}")),
            ],
        );
    }
    let floor_tenants: Api<AgentTenant> = Api::namespaced(client.clone(), FLOOR);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = floor_tenants.clone();
            async move {
                let mut t = tenant(i);
                t.metadata.namespace = Some(FLOOR.into());
                api.create(&PostParams::default(), &t).await.unwrap()
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;

    let (deployments, services, accounts, config_maps, secrets) = at(FLOOR);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), FLOOR);
    let roles: Api<Role> = Api::namespaced(client.clone(), FLOOR);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), FLOOR);
    let apply = PatchParams::apply(names::FIELD_MANAGER).force();
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let name = format!("t{i:05}");
            let (tenants, deployments, services, accounts, config_maps, secrets, claims) = (
                floor_tenants.clone(),
                deployments.clone(),
                services.clone(),
                accounts.clone(),
                config_maps.clone(),
                secrets.clone(),
                claims.clone(),
            );
            let (roles, bindings) = (roles.clone(), bindings.clone());
            let (deployment, service, account, config_map, token, status, apply) = (
                &deployment,
                &service,
                &account,
                &config_map,
                &token,
                &status,
                &apply,
            );
            async move {
                let workload = names::workload(&name);
                tenants.get(&name).await.unwrap();
                secrets.get("acme-billing").await.unwrap();
                secrets
                    .get_opt(&names::owner_token_secret(&name))
                    .await
                    .unwrap();
                config_maps.get("invoices-tools").await.unwrap();
                deployments.get_opt(&workload).await.unwrap();
                secrets
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(as_sent(
                            token,
                            FLOOR,
                            &names::owner_token_secret(&name),
                        ))
                        .unwrap(),
                    )
                    .await
                    .unwrap();
                let cm = names::config_map(&name);
                apply_copy(&config_maps, &cm, config_map).await;
                apply_copy(&accounts, &workload, account).await;
                apply_copy(&deployments, &workload, deployment).await;
                apply_copy(&services, &workload, service).await;
                // What it no longer wants: each owned kind, by label.
                let by_label =
                    ListParams::default().labels(&format!("{}={name}", names::TENANT_LABEL));
                claims.list_metadata(&by_label).await.unwrap();
                config_maps.list_metadata(&by_label).await.unwrap();
                accounts.list_metadata(&by_label).await.unwrap();
                deployments.list_metadata(&by_label).await.unwrap();
                services.list_metadata(&by_label).await.unwrap();
                roles.list_metadata(&by_label).await.unwrap();
                bindings.list_metadata(&by_label).await.unwrap();
                tenants
                    .patch_status(
                        &name,
                        apply,
                        &Patch::Apply(serde_json::json!({
                            "apiVersion": "bindery.dev/v1alpha1",
                            "kind": "AgentTenant",
                            "status": status,
                        })),
                    )
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(usize::from(
            bindery_operator::controller::RECONCILES_AT_ONCE,
        ))
        .collect::<Vec<_>>()
        .await;
    t.elapsed()
}
