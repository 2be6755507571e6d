//! The operator under a restart of the kube-apiserver (killed, or stopped
//! as at an upgrade, and started again on the same port and etcd): what
//! changes afterwards reaches its tenants within [`CONVERGE`], and
//! `/readyz` says so while the operator's watches cannot see.
//!
//! And under a network cut between the operator and the API server (a
//! [`Relay`] the test cuts and mends), during which an object it owns is
//! deleted: it comes back.
//!
//! The restarts are on a control plane of their own ([`fault_plane`]):
//! stopping the shared one's API server would fail the tests running
//! beside them. They take turns ([`ONE_AT_A_TIME`]), each stopping and
//! starting that server once.

use super::*;
use crate::common::fault_plane;
use bindery_tests::control_plane::Signal;
use bindery_tests::relay::Relay;
use std::time::Instant;

/// What docs/operator.md promises: a change after the API server is back
/// reaches its tenant within this.
const CONVERGE: Duration = Duration::from_secs(30);

/// A restarted kube-apiserver refuses an owner reference that blocks its
/// owner's deletion to a kind it does not map yet ("cannot find
/// RESTMapping"), and its admission re-reads its kinds every 30 s: an
/// object the operator creates (owned by its tenant) may wait that long
/// after the restart, then for the operator's next retry (at most 16 s
/// apart then, and a quarter more for its spread).
const CREATE_AFTER_RESTART: Duration = Duration::from_secs(60);

/// One test at a time stops the API server of [`fault_plane`].
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The example tenant, resolved under a running operator, on the fault
/// tests' control plane.
async fn deployed(ns: &str) -> (Cluster, Operator) {
    let cluster = Cluster::start_on(fault_plane(), ns).await;
    cluster.apply_examples();
    let operator = Operator::start(&cluster, "main", &[], &[]);
    cluster.wait_tenant("acme", "resolved", resolved).await;
    cluster.wait_object::<Deployment>("acme").await;
    (cluster, operator)
}

/// Stop the API server with `signal` and start it again; the operator
/// keeps running throughout.
fn restart_api_server(cluster: &Cluster, signal: Signal) {
    cluster.plane.stop_api_server(signal).start();
}

#[tokio::test]
async fn after_an_api_server_restart_an_agent_change_reaches_its_tenant() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (cluster, _operator) = deployed("restart-agent").await;
    restart_api_server(&cluster, Signal::SIGKILL);

    let region = "    - name: region\n      required: false\n      default:\n        value: eu\n";
    let since = Instant::now();
    cluster.apply(&agent_with_parameter(region));
    let tenants = cluster.tenants();
    cluster
        .wait_within(
            "a row for region, the Agent's new parameter",
            CONVERGE,
            async || match tenants.get_opt("acme").await {
                Ok(Some(t)) if row(&t, "region") == Some(("default".into(), true)) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    println!(
        "the Agent change reached the tenant in {:?}",
        since.elapsed()
    );
}

#[tokio::test]
async fn after_an_api_server_restart_a_deleted_deployment_comes_back() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (cluster, _operator) = deployed("restart-owned").await;
    let before: Deployment = cluster.api().get("acme").await.unwrap();
    restart_api_server(&cluster, Signal::SIGKILL);

    let since = Instant::now();
    cluster.kubectl(&["delete", "deployment", "acme", "--wait=true"]);
    let deployments = cluster.api::<Deployment>();
    cluster
        .wait_within(
            "Deployment acme created again",
            CREATE_AFTER_RESTART,
            async || match deployments.get_opt("acme").await {
                Ok(Some(d)) if d.metadata.uid != before.metadata.uid => Ok(()),
                Ok(Some(_)) => Err("the deleted one is still there".into()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    println!("the Deployment was back in {:?}", since.elapsed());
}

#[tokio::test]
async fn after_an_api_server_restart_a_secret_change_reaches_its_tenant() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (cluster, _operator) = deployed("restart-secret").await;
    let before = cluster.wait_hash_of("acme").await;
    // Stopped as at an upgrade this time: SIGTERM.
    restart_api_server(&cluster, Signal::SIGTERM);

    // A rotated value: the pods roll (the config hash names the Secret's
    // resourceVersion).
    let since = Instant::now();
    cluster.apply(&billing_secret("token", "rotated"));
    cluster
        .wait_within("the config hash to change", CONVERGE, async || {
            let h = cluster.config_hash("acme").await;
            if h != before && !h.is_empty() {
                Ok(())
            } else {
                Err(h)
            }
        })
        .await;
    println!(
        "the Secret change reached the pods in {:?}",
        since.elapsed()
    );
}

/// `/readyz` of `operator`, as `(code, body)`.
fn readyz(operator: &Operator) -> (u16, String) {
    http_get(&operator.metrics, "/readyz")
}

#[tokio::test]
async fn readiness_says_when_the_watches_cannot_see() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (cluster, operator) = deployed("restart-ready").await;
    cluster
        .wait_within(
            "/readyz 200: every watch listed",
            CONVERGE,
            async || match readyz(&operator) {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;

    let down = cluster.plane.stop_api_server(Signal::SIGKILL);
    let since = Instant::now();
    let watch = "watch of Deployment (owned) in namespace restart-ready failing for";
    let body = cluster
        .wait_within(
            "/readyz 503 naming the failing watches",
            CONVERGE,
            async || match readyz(&operator) {
                (503, body) if body.contains(watch) => Ok(body),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    println!(
        "/readyz 503 {:?} after the API server stopped:\n{body}",
        since.elapsed()
    );
    // Down long enough for the watches' pauses to reach their longest
    // (the fifth failure follows 0.25 + 0.5 + 1 + 2 s of them, the next
    // comes 4 s later): as long as the outages fault injection made.
    let errors = "bindery_operator_watch_errors_total{kind=\"Deployment\"}";
    let text = cluster
        .wait_within(
            "six failures of the Deployment watch",
            CONVERGE,
            async || {
                let (_, text) = http_get(&operator.metrics, "/metrics");
                match sample(&text, errors) {
                    Some(n) if n >= 6.0 => Ok(text),
                    _ => Err(text),
                }
            },
        )
        .await;
    println!("down {:?}", since.elapsed());
    // Liveness is the process's: no restart cures an absent API server.
    assert_eq!(http_get(&operator.metrics, "/healthz").0, 200);
    assert_eq!(readyz(&operator).0, 503);
    assert!(
        sample(&text, "bindery_operator_watches_blind").is_some_and(|n| n >= 1.0),
        "{text}"
    );

    down.start();
    let since = Instant::now();
    cluster
        .wait_within("/readyz 200 again", CONVERGE, async || {
            match readyz(&operator) {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    println!(
        "/readyz 200 {:?} after the API server was back",
        since.elapsed()
    );
    let (_, text) = http_get(&operator.metrics, "/metrics");
    assert_eq!(
        sample(&text, "bindery_operator_watches_blind"),
        Some(0.0),
        "{text}"
    );
    assert!(
        sample(&text, "bindery_operator_watches").is_some_and(|n| n >= 12.0),
        "{text}"
    );
}

/// The operator talks to the API server through a relay; while the relay
/// is cut (the operator blind, `/readyz` 503) the tenant's Deployment is
/// deleted. That deletion shows in no list the operator makes afterwards,
/// and the operator's record of its own last apply must not stand for it:
/// once the relay is mended, the Deployment comes back.
#[tokio::test]
async fn a_deployment_deleted_while_the_operator_is_cut_off_comes_back() {
    let cluster = Cluster::start("cut-off").await;
    cluster.apply_examples();
    let server: std::net::SocketAddr = cluster
        .plane
        .url
        .trim_start_matches("https://")
        .parse()
        .expect("the API server's address");
    let relay = Relay::start(server);
    let kubeconfig = cluster.dir.path().join("kubeconfig-through-relay.yaml");
    let through = std::fs::read_to_string(&cluster.operator.kubeconfig)
        .unwrap()
        .replace(&cluster.plane.url, &format!("https://{}", relay.addr));
    std::fs::write(&kubeconfig, through).unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    let operator = Operator::start(&cluster, "main", &[], &[("KUBECONFIG", &kubeconfig)]);
    cluster.wait_tenant("acme", "resolved", resolved).await;
    let before: Deployment = cluster.wait_object("acme").await;
    cluster
        .wait_within("/readyz 200", CONVERGE, async || match readyz(&operator) {
            (200, _) => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .await;

    relay.cut();
    cluster
        .wait_within(
            "/readyz 503 while cut off",
            CONVERGE,
            async || match readyz(&operator) {
                (503, body) if body.contains("watch of Deployment (owned)") => Ok(()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    cluster.kubectl(&["delete", "deployment", "acme", "--wait=true"]);

    relay.mend();
    let since = Instant::now();
    let deployments = cluster.api::<Deployment>();
    cluster
        .wait_within(
            "Deployment acme created again",
            CREATE_AFTER_RESTART,
            async || match deployments.get_opt("acme").await {
                Ok(Some(d)) if d.metadata.uid != before.metadata.uid => Ok(()),
                Ok(Some(_)) => Err("the deleted one is still there".into()),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
    println!(
        "the Deployment was back {:?} after the network",
        since.elapsed()
    );
}
