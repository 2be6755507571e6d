//! How long a tenant takes from `helm install` to its first answered
//! session on a real node, against the floor: the same sidecar image run as
//! a bare Deployment with no operator, on the same node in the same run.
//!
//!     cargo bench -p bindery-tests --features node-tests --bench tenant_startup [-- --rounds N]
//!
//! It starts a node of its own ([`bindery_tests::node`]: needs root and
//! what `tests/setup.sh` builds, the images included), installs the
//! operator chart with its defaults, the mock model as a pod, the example
//! Agent and its tools (none of that timed), then times N rounds of each
//! (default 5), taking turns (floor, floor-np, tenant, floor, ...) after one
//! warm-up round of each that is not counted: the first pull of the
//! sidecar's image onto the node is not what it measures. Each round
//! starts after a pause of 0 to 1 s at random, out of step with the
//! node's servers' ticks of a second ([`random_phase`]).
//!
//! - **floor**: from the start of `kubectl apply` of a ConfigMap (the
//!   agent file and the params file, as the operator renders them), the
//!   owner token's Secret, a Deployment of the sidecar image with the pod
//!   the operator renders (its arguments, volumes, probes and
//!   securityContext) and a Service;
//! - **floor-np**: the floor with the NetworkPolicy the tenant chart makes,
//!   for its pods: what enforcing the policy (kube-router) adds, apart
//!   from the operator;
//! - **tenant**: from the start of `helm install` of the tenant chart
//!   (without `--wait`): the AgentTenant and its NetworkPolicy, then the
//!   operator's reconcile (the owner token, the ConfigMap, ServiceAccount,
//!   Deployment and Service);
//!
//! each until a session through the tenant's Service answers 201 with the
//! model's answer. The client is this process, in the node's network
//! namespace (the node's own address, which the NetworkPolicy enforcer
//! admits, as it admits a node's kubelet), asking the Service's cluster IP
//! every 150 ms, each ask on its own (one may wait up to 0.5 s for its
//! connection while kube-proxy has no rule for the address yet) and the
//! first answer's time kept; between its asks it notes when it first saw
//! the Deployment, the pod, the pod scheduled, its container running and the
//! pod Ready, so that a round says where its time went. Each round has a
//! name of its own and is removed after it (not timed). After the rounds
//! it prints the last round of each kind request by request, from the API
//! server's audit log (who wrote what when: helm, the operator, the
//! controllers, the scheduler, the kubelet), and the median of each
//! column.
//!
//! A benchmark: it prints the rounds, the medians and the ratio with its
//! goal's verdict, and asserts nothing about them.

use std::io::Read;
use std::time::{Duration, Instant};

use bindery_tests::bench;
use bindery_tests::control_plane::ADMIN;
use bindery_tests::helm::{both, repo_path};
use bindery_tests::node::Node;
use bindery_tests::node_fixtures::{
    apply_invoices_agent, invoices_agent, start_model, tenant_values, token_secret,
};
use bindery_tests::node_kube::{Kube, TIMEOUT};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::jiff;
use kube::api::ListParams;
use kube::Api;
use serde_json::json;

/// The namespace of the rounds (Pod Security `restricted`).
const NS: &str = "bench";
/// The billing tenant every round's parameter pins.
const BILLING: &str = "acme-corp";
/// What the model's answer holds for [`BILLING`]'s overdue invoices.
const ANSWER: &str = "INV-1002";
/// How often the client asks.
const POLL: Duration = Duration::from_millis(150);
/// How long a round may take before the bench gives up on it.
const GIVE_UP: Duration = Duration::from_secs(240);
/// The goal: the tenant's median at most this many times the floor's.
const GOAL: f64 = 1.3;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// The same image as a bare Deployment, no operator.
    Floor,
    /// The floor with the NetworkPolicy the tenant chart makes: what the
    /// policy's enforcement adds, apart from the operator.
    FloorPolicy,
    Tenant,
}

/// The kinds of round, in the order each round of them runs.
const KINDS: [Kind; 3] = [Kind::Floor, Kind::FloorPolicy, Kind::Tenant];

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Floor => "floor",
            Kind::FloorPolicy => "floor-np",
            Kind::Tenant => "tenant",
        }
    }
}

/// When the client first saw each step of a round, from its start.
#[derive(Default)]
struct Round {
    /// The round's start by the wall clock (the audit log's).
    wall_start: jiff::Timestamp,
    /// `kubectl apply` or `helm install` returned.
    command: Option<Duration>,
    deployment: Option<Duration>,
    pod: Option<Duration>,
    scheduled: Option<Duration>,
    started: Option<Duration>,
    ready: Option<Duration>,
    /// The first session answered 201 with the model's answer.
    answered: Duration,
    /// How long that session took (its model turns and tool run).
    session: Duration,
}

fn main() {
    let rounds = rounds_arg();
    println!("{}", bench::context());
    println!(
        "tenant startup on a real node: from the start of `helm install` of a tenant \
         (the operator installed and the Agent applied before) to its first session \
         answered, against the floor, the same sidecar image as a bare Deployment with no \
         operator, from the start of its `kubectl apply`; {rounds} rounds each, taking \
         turns, each after a pause of 0 to 1 s at random (out of step with the node's ticks \
         of a second), after a warm-up round of each that is not counted (the first pull of \
         the image onto the node is not measured)"
    );
    println!(
        "the client: this process in the node's network namespace, POST /v1/sessions?wait=true \
         to the Service's cluster IP every {} ms, each ask on its own, the first answer's time kept \
         (a session: 2 model turns, 1 bash tool run); each step's time is when the client \
         first saw it",
        POLL.as_millis()
    );

    println!(
        "floor includes: kubectl apply of a ConfigMap (the agent file, the params file), the \
         owner token's Secret, a Deployment (the pod the operator renders: arguments, volumes, \
         probes every 10 s, securityContext) and a Service; the ReplicaSet, scheduling, the \
         pod's start, its readiness, the Service's endpoints in kube-proxy's rules, one session"
    );
    println!(
        "floor-np includes: the floor's, and the tenant chart's NetworkPolicy for its pods \
         (kube-router enforcing it)"
    );
    println!(
        "tenant includes: helm install of the tenant chart (an AgentTenant, a NetworkPolicy) \
         without --wait; the operator's reconcile (the owner token, ConfigMap, ServiceAccount, \
         Deployment, Service); then all the floor's steps after its apply, and kube-router \
         enforcing the NetworkPolicy"
    );
    println!(
        "columns: seconds from the round's start until the client first saw: the command \
         return, the Deployment, the pod, the pod scheduled, its container running, the pod \
         Ready, the session answered; session: that session's own time"
    );

    let node = Node::start();
    // Before any runtime: its threads are in the namespace too.
    node.enter();
    let kube = Kube { node: &node };
    set_up(&kube);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let client = rt.block_on(node.plane.client(ADMIN));
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client");

    println!(
        "{:<8} {:<8} {:>9} {:>9} {:>11} {:>6} {:>10} {:>8} {:>6} {:>8}",
        "round",
        "kind",
        "answered",
        "command",
        "deployment",
        "pod",
        "scheduled",
        "started",
        "ready",
        "session"
    );
    let mut counted: [Vec<Round>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..=rounds {
        for (k, kind) in KINDS.into_iter().enumerate() {
            let name = format!("{}-{i}", kind.label());
            let round = run_round(&kube, &rt, &client, &http, kind, &name);
            let label = if i == 0 {
                "warm-up".into()
            } else {
                i.to_string()
            };
            println!("{}", row(&label, kind, &round));
            remove(&kube, kind, &name);
            if i > 0 {
                counted[k].push(round);
            }
        }
    }

    // The last round of each kind, request by request.
    for (kind, rounds) in KINDS.iter().zip(&counted) {
        let last = rounds.last().expect("at least one round");
        let name = format!("{}-{rounds}", kind.label(), rounds = rounds.len());
        println!("{}", timeline(&node, &name, last));
    }
    // Each column's median on its own: where the tenant's time goes.
    let medians = counted.each_ref().map(|rounds| median_round(rounds));
    for (kind, m) in KINDS.iter().zip(&medians) {
        println!("{}", row("median", *kind, m));
    }
    let [floor, policy, tenant] = medians.map(|m| m.answered.as_secs_f64());
    let ratio = tenant / floor;
    println!("{}", parts("median", [floor, policy, tenant]));
    // The answers fall on the node's ticks of a second, so a handful of
    // rounds' median can jump by a second: the mean says more per round.
    let means = counted.map(|rounds| {
        rounds.iter().map(|r| r.answered.as_secs_f64()).sum::<f64>() / rounds.len() as f64
    });
    println!("{}", parts("mean", means));
    println!(
        "{}",
        bench::goal(
            &format!("a tenant's startup ≤ x{GOAL} the floor's (medians)"),
            ratio <= GOAL,
            &format!("x{ratio:.2}"),
        )
    );
}

/// The answers' times of the three kinds, the tenant's over the floor's,
/// and what the NetworkPolicy and the operator add.
fn parts(what: &str, [floor, policy, tenant]: [f64; 3]) -> String {
    format!(
        "{what}: floor {floor:.2} s, floor with the NetworkPolicy {policy:.2} s, tenant \
         {tenant:.2} s; tenant over floor x{:.2} ({:+.2} s): the NetworkPolicy's enforcement \
         {:+.2} s, helm and the operator {:+.2} s",
        tenant / floor,
        tenant - floor,
        policy - floor,
        tenant - policy,
    )
}

/// `--rounds N`, at least 1 (cargo bench passes `--bench` too, which is
/// ignored).
fn rounds_arg() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--rounds")
        .map(|i| {
            args.get(i + 1)
                .and_then(|n| n.parse().ok())
                .filter(|n| *n > 0)
                .unwrap_or_else(|| panic!("--rounds takes a number of rounds, 1 or more"))
        })
        .unwrap_or(5)
}

/// What both kinds of round stand on, not timed: the operator chart with
/// its defaults, the mock model, the Agent and its tools.
fn set_up(kube: &Kube<'_>) {
    kube.helm(&[
        "install",
        "bindery",
        &repo_path("charts/bindery-operator"),
        "--namespace",
        "bindery-system",
        "--create-namespace",
        "--wait",
        "--timeout",
        TIMEOUT,
    ]);
    start_model(kube, env!("CARGO_BIN_EXE_mock-model").as_ref());
    kube.restricted_namespace(NS);
    apply_invoices_agent(kube, NS);
}

/// One round: its billing Secret (not timed), then its command on a thread
/// of its own while the client watches and asks.
fn run_round(
    kube: &Kube<'_>,
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    http: &reqwest::Client,
    kind: Kind,
    name: &str,
) -> Round {
    kube.apply(&token_secret(
        NS,
        &format!("{name}-billing"),
        &random_hex(16),
    ));
    let (args, program): (Vec<String>, _) = match kind {
        Kind::Floor | Kind::FloorPolicy => {
            let file = kube.node.dir().join(format!("{name}.yaml"));
            std::fs::write(&file, floor_manifest(name, kind == Kind::FloorPolicy))
                .expect("the floor's manifest");
            (
                vec!["apply".into(), "-f".into(), file.display().to_string()],
                "kubectl",
            )
        }
        Kind::Tenant => (
            vec![
                "install".into(),
                name.into(),
                repo_path("charts/bindery-tenant"),
                "--namespace".into(),
                NS.into(),
                "--values".into(),
                tenant_values(kube, name, BILLING),
            ],
            "helm",
        ),
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    std::thread::sleep(random_phase());
    let wall_start = jiff::Timestamp::now();
    let start = Instant::now();
    let (round, out) = std::thread::scope(|s| {
        let command = s.spawn(|| match kind {
            Kind::Floor | Kind::FloorPolicy => kube.node.kubectl(&args),
            Kind::Tenant => kube.node.helm(&args),
        });
        let round = rt.block_on(watch(client, http, name, start, || command.is_finished()));
        (round, command.join().expect("the round's command"))
    });
    let round = Round {
        wall_start,
        ..round
    };
    assert!(
        out.status.success(),
        "{program} for {name}: {}\n{}",
        both(&out),
        kube.node.logs()
    );
    round
}

/// Until the round's first session is answered: between asks, when the
/// Deployment, the pod and its steps were first seen.
async fn watch(
    client: &kube::Client,
    http: &reqwest::Client,
    name: &str,
    start: Instant,
    command_done: impl Fn() -> bool,
) -> Round {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let selector = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    let owner_token = format!("{name}-owner-token");
    let mut round = Round::default();
    let mut token: Option<String> = None;
    let mut address: Option<String> = None;
    let mut asks = tokio::task::JoinSet::new();
    let mut last = String::from("nothing asked yet");
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if round.command.is_none() && command_done() {
            round.command = Some(start.elapsed());
        }
        if round.deployment.is_none() && matches!(deployments.get_opt(name).await, Ok(Some(_))) {
            round.deployment = Some(start.elapsed());
        }
        if round.ready.is_none() {
            if let Some(pod) = pods
                .list(&selector)
                .await
                .ok()
                .and_then(|l| l.items.into_iter().next())
            {
                note_pod(&mut round, &pod, start.elapsed());
            }
        }
        if token.is_none() {
            token = secrets
                .get_opt(&owner_token)
                .await
                .ok()
                .flatten()
                .and_then(|s| s.data?.remove("token"))
                .map(|t| String::from_utf8_lossy(&t.0).into_owned());
        }
        if address.is_none() {
            address = services
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|s| s.spec?.cluster_ip)
                .filter(|ip| ip != "None");
        }
        // An ask waits for its connection (the Service's address goes
        // nowhere until kube-proxy's rules have it): each runs on its own,
        // so the watching goes on, and says when it was answered.
        if let (Some(token), Some(ip)) = (&token, &address) {
            let (http, url, token) = (
                http.clone(),
                format!("http://{ip}/v1/sessions?wait=true"),
                token.clone(),
            );
            asks.spawn(async move { ask(&http, &url, &token).await });
        } else {
            last = format!(
                "owner token {}, Service address {:?}",
                if token.is_some() { "read" } else { "not there" },
                address
            );
        }
        // The first answer of those back (one still out was asked later).
        let mut first: Option<(Instant, Duration)> = None;
        while let Some(done) = asks.try_join_next() {
            match done.expect("an ask's task") {
                Ok(a) => first = Some(first.map_or(a, |f| f.min(a))),
                Err(why) => last = why,
            }
        }
        if let Some((answered, session)) = first {
            asks.abort_all();
            round.answered = answered - start;
            round.session = session;
            return round;
        }
        assert!(
            start.elapsed() < GIVE_UP,
            "{name}: no session answered after {GIVE_UP:?}; last: {last}"
        );
    }
}

/// The pod's steps first seen now: it exists, it is scheduled, its
/// container runs, it is Ready.
fn note_pod(round: &mut Round, pod: &Pod, now: Duration) {
    round.pod.get_or_insert(now);
    let spec_node = pod.spec.as_ref().and_then(|s| s.node_name.as_ref());
    if spec_node.is_some() {
        round.scheduled.get_or_insert(now);
    }
    let status = pod.status.as_ref();
    let running = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        });
    if running {
        round.started.get_or_insert(now);
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if ready {
        round.ready.get_or_insert(now);
    }
}

/// One session at `url`: when it was answered and how long it took, once
/// it answers 201 with the model's answer; else what it said.
async fn ask(
    http: &reqwest::Client,
    url: &str,
    token: &str,
) -> Result<(Instant, Duration), String> {
    let asked = Instant::now();
    let res = http
        .post(url)
        .bearer_auth(token)
        .header("Content-Type", "application/json")
        .body(r#"{"agent": "invoices", "prompt": "which invoices are overdue?"}"#)
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let status = res.status();
    let body = res.text().await.map_err(|e| format!("{e:?}"))?;
    if status == reqwest::StatusCode::CREATED && body.contains(ANSWER) {
        let answered = Instant::now();
        Ok((answered, answered - asked))
    } else {
        Err(format!(
            "{status}: {}",
            body.chars().take(400).collect::<String>()
        ))
    }
}

/// The floor: what the operator would make for a tenant of the invoices
/// Agent with the tenant pinned, written by hand (the agent file and the
/// params file, the owner token, the pod the operator renders:
/// operator/src/desired/render/, operator/tests/golden/acme.yaml), with no
/// ServiceAccount of its own and no owner; with `policy`, the NetworkPolicy
/// the tenant chart makes (its rules, for the floor's pods), else none.
fn floor_manifest(name: &str, policy: bool) -> String {
    let agent = invoices_agent();
    let tools = "directory: tools\n";
    assert!(agent.contains(tools), "examples/k8s/agent.yaml changed");
    let agent = agent.replace(tools, "directory: /etc/bindery/tools\n");
    let labels = json!({"app.kubernetes.io/instance": name});
    let meta = |n: String| json!({"name": n, "namespace": NS, "labels": labels});
    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(format!("{name}-agents")),
        "data": {
            "invoices.yaml": agent,
            "params.json": json!({"tenant": {"pinned": true, "value": BILLING}}).to_string(),
        },
    });
    let owner_token = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(format!("{name}-owner-token")),
        "stringData": {"token": random_hex(32)},
    });
    let probe =
        |path: &str| json!({"httpGet": {"path": path, "port": "http"}, "periodSeconds": 10});
    let mount = |n: &str, path: &str, read_only: bool| json!({"name": n, "mountPath": path, "readOnly": read_only});
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(name.to_string()),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "sidecar",
                        "image": "ghcr.io/bindery-dev/bindery-sidecar:0.1.0",
                        "args": [
                            "serve",
                            "--agents-dir", "/etc/bindery/agents",
                            "--params-file", "/etc/bindery/params/params.json",
                            "--listen", "0.0.0.0:8080",
                            "--store", "sqlite:///var/lib/bindery/bindery.sqlite",
                            "--owner-token-file", "/etc/bindery/owner/token",
                            "--log-format", "json",
                        ],
                        "env": [{
                            "name": "BINDERY_PARAM_BILLING_TOKEN",
                            "valueFrom": {"secretKeyRef": {
                                "name": format!("{name}-billing"), "key": "token", "optional": false,
                            }},
                        }],
                        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                        "readinessProbe": probe("/readyz"),
                        "livenessProbe": probe("/healthz"),
                        "securityContext": {
                            "runAsNonRoot": true,
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "volumeMounts": [
                            mount("agents", "/etc/bindery/agents", true),
                            mount("params", "/etc/bindery/params", true),
                            mount("owner-token", "/etc/bindery/owner", true),
                            mount("store", "/var/lib/bindery", false),
                            mount("tmp", "/tmp", false),
                            mount("tools", "/etc/bindery/tools", true),
                        ],
                    }],
                    "volumes": [
                        {"name": "agents", "configMap": {
                            "name": format!("{name}-agents"),
                            "items": [{"key": "invoices.yaml", "path": "invoices.yaml"}],
                        }},
                        {"name": "params", "configMap": {
                            "name": format!("{name}-agents"),
                            "items": [{"key": "params.json", "path": "params.json"}],
                        }},
                        {"name": "owner-token", "secret": {
                            "secretName": format!("{name}-owner-token"),
                            "items": [{"key": "token", "path": "token"}],
                            "defaultMode": 0o440,
                        }},
                        {"name": "store", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "tools", "configMap": {"name": "invoices-tools", "defaultMode": 0o555}},
                    ],
                },
            },
        },
    });
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(name.to_string()),
        "spec": {
            "selector": labels,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}],
        },
    });
    // charts/bindery-tenant/templates/networkpolicy.yaml, with the
    // clients of the bench's tenant values (node_fixtures::tenant_values).
    let network_policy = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(name.to_string()),
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": labels}}],
                 "ports": [{"protocol": "TCP", "port": 8443}]},
                {"from": [
                    {"podSelector": {"matchLabels": {"bindery.dev/test-of": name}}},
                    {"podSelector": {"matchLabels": {"bindery.test/client": name}}},
                 ],
                 "ports": [{"protocol": "TCP", "port": 8080}]},
            ],
        },
    });
    [config_map, owner_token, deployment, service]
        .into_iter()
        .chain(policy.then_some(network_policy))
        .collect::<Vec<_>>()
        .iter()
        .map(|d| serde_yaml::to_string(d).expect("YAML of JSON"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Remove a round (not timed) and wait until its pods are gone.
fn remove(kube: &Kube<'_>, kind: Kind, name: &str) {
    match kind {
        Kind::Floor | Kind::FloorPolicy => {
            let file = kube.node.dir().join(format!("{name}.yaml"));
            kube.ok(&["delete", "--wait", "-f", &file.display().to_string()]);
        }
        Kind::Tenant => {
            kube.helm(&["uninstall", name, "-n", NS, "--wait", "--timeout", TIMEOUT]);
        }
    }
    kube.ok(&["delete", "-n", NS, "secret", &format!("{name}-billing")]);
    let selector = format!("app.kubernetes.io/instance={name}");
    kube.until(&format!("{name}'s pods to be gone"), || {
        let left = kube.ok(&["get", "pods", "-n", NS, "-l", &selector, "-o", "name"]);
        if left.trim().is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    });
}

/// A round's line: each step in seconds from the round's start, `-` for a
/// step not seen before the answer.
fn row(label: &str, kind: Kind, r: &Round) -> String {
    let s = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64()));
    format!(
        "{label:<8} {:<8} {:>9} {:>9} {:>11} {:>6} {:>10} {:>8} {:>6} {:>8}",
        kind.label(),
        format!("{:.2} s", r.answered.as_secs_f64()),
        s(r.command),
        s(r.deployment),
        s(r.pod),
        s(r.scheduled),
        s(r.started),
        s(r.ready),
        s(Some(r.session)),
    )
}

/// The median of each column over `rounds` (of the rounds that saw the
/// step).
fn median_round(rounds: &[Round]) -> Round {
    let of =
        |step: fn(&Round) -> Option<Duration>| median(rounds.iter().filter_map(step).collect());
    Round {
        wall_start: rounds[0].wall_start,
        command: of(|r| r.command),
        deployment: of(|r| r.deployment),
        pod: of(|r| r.pod),
        scheduled: of(|r| r.scheduled),
        started: of(|r| r.started),
        ready: of(|r| r.ready),
        answered: of(|r| Some(r.answered)).expect("at least one round"),
        session: of(|r| Some(r.session)).expect("at least one round"),
    }
}

fn median(mut times: Vec<Duration>) -> Option<Duration> {
    times.sort();
    let n = times.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(times[n / 2]),
        _ => Some((times[n / 2 - 1] + times[n / 2]) / 2),
    }
}

/// `n` random bytes in hex (a token of the bench's own).
fn random_hex(n: usize) -> String {
    hex::encode(random_bytes(n))
}

/// A pause of 0 to 1 s, at random. The node's servers work in ticks of
/// a second (the kubelet looks at its containers every second, kube-proxy
/// writes its rules at most once a second), and a round that starts when
/// the last one's removal is seen starts in step with them: every round
/// of a kind would then catch or miss the same tick, and a difference of
/// 0.2 s could read as 0 or 1 s. Started at random, each round's wait for
/// a tick is what it is on average.
fn random_phase() -> Duration {
    let b = random_bytes(2);
    Duration::from_millis(u64::from(u16::from_le_bytes([b[0], b[1]])) % 1000)
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom");
    bytes
}

/// What the API server was asked during round `name` (from its audit
/// log), in order: each request in the round's namespace but Events,
/// watches and this process's own asks, from the round's start to its
/// answer, with when it was answered, how long it took and who asked. The
/// steps between the client's columns, and who waited for whom.
fn timeline(node: &Node, name: &str, round: &Round) -> String {
    let end = round.wall_start
        + jiff::SignedDuration::try_from(round.answered).expect("a round's length");
    let at = |v: &serde_json::Value| v.as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let mut lines = vec![format!(
        "{name}, request by request (the API server's audit, the bench's own asks left out: \
         answered at, took, who, what):"
    )];
    for e in node.plane.audit() {
        let object = &e["objectRef"];
        let resource = object["resource"].as_str().unwrap_or_default();
        let verb = e["verb"].as_str().unwrap_or_default();
        let user = e["user"]["username"].as_str().unwrap_or_default();
        // This process's own asks: the administrator's, not kubectl's or
        // helm's (kube-rs sends no user agent).
        let agent = e["userAgent"].as_str().unwrap_or_default();
        let ours = user == ADMIN && !(agent.starts_with("kubectl") || agent.starts_with("Helm"));
        if object["namespace"] != NS
            || matches!(resource, "events" | "leases")
            || verb == "watch"
            || ours
        {
            continue;
        }
        let (Some(received), Some(answered)) =
            (at(&e["requestReceivedTimestamp"]), at(&e["stageTimestamp"]))
        else {
            continue;
        };
        if answered < round.wall_start || answered > end {
            continue;
        }
        let since = answered.duration_since(round.wall_start).as_secs_f64();
        let took = answered.duration_since(received).as_secs_f64() * 1000.0;
        let who = user
            .trim_start_matches("system:serviceaccount:")
            .trim_start_matches("system:");
        let what = match object["subresource"].as_str() {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        };
        let code = &e["responseStatus"]["code"];
        lines.push(format!(
            "  {since:6.3} s {took:5.0} ms  {who:<40} {verb} {what} {} -> {code}",
            object["name"].as_str().unwrap_or("(new)"),
        ));
    }
    lines.join("\n")
}
