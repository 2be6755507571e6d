//! How fast the operator brings N AgentTenants from nothing to a status, on
//! the Kubernetes API emulator, as the operator chart's ServiceAccount:
//!
//!     cargo bench -p bindery-operator --bench reconcile -- [N]
//!
//! prints the emulator's own floor for N objects (one list, one watch from
//! the start), the time until every tenant has a status for its generation,
//! reconciles per second and the operator's peak RSS. A benchmark, not a
//! test: it asserts nothing about times. N defaults to 1000.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bindery_operator::crd::AgentTenant;
use bindery_tests::helm::Render;
use bindery_tests::kube::Emulator;
use futures::{StreamExt, TryStreamExt};
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

const NS: &str = "bench";

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

/// The peak resident set size of process `pid`, in MiB (Linux).
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn kubectl(emu: &Emulator, args: &[&str]) {
    let out = emu.kubectl(args);
    assert!(out.status.success(), "kubectl {args:?}: {out:?}");
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
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());
    let ns_file = dir.path().join("ns.yaml");
    std::fs::write(
        &ns_file,
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"),
    )
    .unwrap();
    kubectl(&emu, &["apply", "-f", ns_file.to_str().unwrap()]);
    kubectl(&emu, &["apply", "-f", &repo("crds")]);
    let identity = emu.install_operator_identity(
        &Render::new("charts/bindery-operator", "bindery")
            .namespace(NS)
            .set(format!("watchNamespaces={{{NS}}}")),
    );
    for f in ["agent.yaml", "tools-configmap.yaml", "billing-secret.yaml"] {
        kubectl(
            &emu,
            &["apply", "-n", NS, "-f", &repo(&format!("examples/k8s/{f}"))],
        );
    }
    let kubeconfig = Kubeconfig::read_from(&emu.kubeconfig).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
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

    // The emulator's floor: one list, and one watch from the start, of N.
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
    println!("emulator floor: list of {n} in {list_time:.2?}, watch of {n} in {watch_time:.2?}");

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
    let t = Instant::now();
    let deadline = t + Duration::from_secs(600);
    loop {
        let list = tenants.list(&ListParams::default()).await.unwrap();
        let done = list
            .items
            .iter()
            .filter(|t| {
                t.status.as_ref().and_then(|s| s.observed_generation) == t.metadata.generation
            })
            .count();
        if done == n || Instant::now() > deadline {
            println!(
                "{done} of {n} tenants with a status for their generation after {:.2?}",
                t.elapsed()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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
    println!("operator peak RSS: {:.1} MiB", peak_rss_mib(pid));
    let _ = child.kill();
    let _ = child.wait();
}
