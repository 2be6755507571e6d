//! Two replicas of a tenant on PostgreSQL (itself a pod) on a real node: a
//! session created through one pod, whose secret value that pod holds in
//! memory, is answered through the other (which forwards to the holder
//! over mutual TLS on the peer port, through the tenant's NetworkPolicy),
//! the value never stored nor logged; deleting the pod that runs a session
//! loses nothing: the run ends there (the pod lets its runs end before it
//! exits) and the session goes on through the other once its value is
//! given again (it lived in the deleted pod's memory only).

use std::time::Duration;

use bindery_tests::node::Node;
use bindery_tests::node_fixtures::apply_invoices_agent;
use bindery_tests::node_kube::{Kube, TIMEOUT};
use bindery_tests::sidecar::Api;
use serde_json::{json, Value};

use crate::platform::connects;
use crate::shared::operator_and_model;

const NS: &str = "ledger";
/// How long the tool of this test's agent takes: a run is under way that
/// long, for the pod running it to be deleted meanwhile.
const TOOL_SECONDS: u64 = 8;

fn postgres(password: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: postgres, namespace: {NS}}}
stringData: {{password: {password}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: postgres, namespace: {NS}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: postgres}}}}
  template:
    metadata: {{labels: {{app: postgres}}}}
    spec:
      automountServiceAccountToken: false
      securityContext:
        runAsNonRoot: true
        runAsUser: 999
        runAsGroup: 999
        fsGroup: 999
        seccompProfile: {{type: RuntimeDefault}}
      containers:
      - name: postgres
        image: bindery.test/postgres:15
        env:
        - {{name: POSTGRES_DB, value: acme}}
        - name: POSTGRES_PASSWORD
          valueFrom: {{secretKeyRef: {{name: postgres, key: password}}}}
        ports: [{{name: pg, containerPort: 5432}}]
        readinessProbe: {{tcpSocket: {{port: pg}}, periodSeconds: 1}}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {{drop: [ALL]}}
        volumeMounts:
        - {{name: data, mountPath: /var/lib/postgresql/data}}
        - {{name: run, mountPath: /var/run/postgresql}}
      volumes:
      - {{name: data, emptyDir: {{}}}}
      - {{name: run, emptyDir: {{}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: postgres, namespace: {NS}}}
spec:
  selector: {{app: postgres}}
  ports: [{{name: pg, port: 5432, targetPort: pg}}]
"#
    )
}

/// The ready pods of the tenant `acme`: (name, address).
fn pods(kube: &Kube<'_>) -> Vec<(String, String)> {
    let list = kube.json(&["get", "-n", NS, "pods", "-l", "bindery.dev/tenant=acme"]);
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_string(),
                p["status"]["podIP"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn last_answer(session: &Value) -> String {
    session["turns"]
        .as_array()
        .and_then(|t| t.last())
        .map(|t| t["content"].to_string())
        .unwrap_or_default()
}

#[test]
fn two_replicas_on_postgres_share_sessions_and_a_deleted_pod_loses_nothing() {
    const CANARY: &str = "ledger-billing-canary-4b8e21";
    const RUNNING: &str = "ledger-billing-running-77c0d3";
    let node = Node::shared();
    let kube = Kube { node };
    operator_and_model(&kube);
    kube.restricted_namespace(NS);
    let password = "pg-password-9d1c3e";
    kube.apply(&postgres(password));
    kube.ok(&[
        "rollout",
        "status",
        "-n",
        NS,
        "deployment/postgres",
        "--timeout",
        TIMEOUT,
    ]);

    // The example agent, its tool slowed down; the tenant: two replicas
    // on the database.
    apply_invoices_agent(&kube, NS);
    let agent = kube.json(&["get", "-n", NS, "agent", "invoices"]);
    let rows = agent["spec"]["parameters"].as_array().unwrap();
    let token_row = rows
        .iter()
        .position(|p| p["name"] == "billing_token")
        .unwrap();
    kube.ok(&[
        "patch",
        "-n",
        NS,
        "agent",
        "invoices",
        "--type=json",
        "-p",
        &json!([{"op": "add", "path": format!("/spec/parameters/{token_row}/scope"), "value": "session"}])
            .to_string(),
    ]);
    let tools = kube.json(&["get", "-n", NS, "configmap", "invoices-tools"]);
    let script = tools["data"]["query-invoices"].as_str().unwrap();
    let anchor = "[[ \"${1:-}\" == \"run\" ]]";
    assert!(script.contains(anchor), "the example tool changed");
    let slowed = script.replacen(anchor, &format!("sleep {TOOL_SECONDS}\n{anchor}"), 1);
    kube.ok(&[
        "patch",
        "-n",
        NS,
        "configmap",
        "invoices-tools",
        "--type=merge",
        "-p",
        &json!({"data": {"query-invoices": slowed}}).to_string(),
    ]);
    kube.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: acme-db, namespace: {NS}}}\nstringData:\n  url: postgres://postgres:{password}@postgres.{NS}.svc.cluster.local:5432/acme?sslmode=disable\n"
    ));
    let values = node.dir().join("ledger-acme-values.yaml");
    std::fs::write(
        &values,
        r#"agentRef: invoices
replicas: 2
store:
  postgres:
    urlSecretRef: {name: acme-db, key: url}
parameters:
  - name: tenant
    value: acme-corp
    pinned: true
tools: invoices-tools
networkPolicy:
  clients:
    - podSelector: {matchLabels: {bindery.test/client: acme}}
"#,
    )
    .unwrap();
    kube.helm(&[
        "install",
        "acme",
        &bindery_tests::helm::repo_path("charts/bindery-tenant"),
        "--namespace",
        NS,
        "--values",
        values.to_str().unwrap(),
        "--wait",
        "--timeout",
        TIMEOUT,
    ]);
    let both = kube.until("both replicas ready", || {
        let p = pods(&kube);
        if p.len() == 2 {
            Ok(p)
        } else {
            Err(format!("ready: {p:?}"))
        }
    });
    let owner = {
        let s: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(kube.json(&["get", "-n", NS, "secret", "acme-owner-token"]))
                .unwrap();
        String::from_utf8(s.data.unwrap()["token"].0.clone()).unwrap()
    };

    // The peer port admits the tenant's own replicas only (they forward
    // to each other below): another pod of the namespace, even one the
    // session API admits, is refused there.
    let peer = format!("https://{}:8443/", both[1].1);
    for (pod, labels) in [
        ("stranger-peer", &[][..]),
        ("client-peer", &[("bindery.test/client", "acme")][..]),
    ] {
        let (ok, log) = connects(&kube, NS, pod, labels, &peer);
        assert!(!ok, "{pod} reached the peer port: {log}");
    }

    // The test's own client, from the node (its requests reach each pod's
    // own address: the NetworkPolicy admits the node, as its probes).
    node.enter();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let api = |ip: &str| Api::new(&format!("http://{ip}:8080"));
    let (a, b) = (both[0].clone(), both[1].clone());
    let digest = |v: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(v.as_bytes()))
    };
    let running_id = runtime.block_on(async {
        // Created through `a` with its value, which `a` holds in memory...
        let r = api(&a.1)
            .call(
                "POST",
                "/v1/sessions?wait=true",
                Some(&owner),
                Some(
                    &json!({"agent": "invoices", "prompt": "which invoices are overdue?",
                             "params": {"billing_token": CANARY}}),
                ),
            )
            .await;
        assert_eq!(r.status, 201, "through {}: {}", a.0, r.text);
        assert!(
            last_answer(&r.json["session"]).contains(&digest(CANARY)),
            "{}",
            r.text
        );
        let id = r.json["session_id"].as_str().unwrap().to_string();
        // ... answered through `b`, which forwards to `a` on the peer port.
        let r = api(&b.1)
            .call(
                "POST",
                &format!("/v1/sessions/{id}/messages?wait=true"),
                Some(&owner),
                Some(&json!({"prompt": "and now?"})),
            )
            .await;
        assert_eq!(r.status, 200, "through {}: {}", b.0, r.text);
        let answer = last_answer(&r.json["session"]);
        assert!(answer.contains("INV-1002"), "{}", r.text);
        assert!(
            answer.contains(&digest(CANARY)),
            "the held value, through b: {}",
            r.text
        );

        // A run under way on `a` when its pod is deleted.
        let r = api(&a.1)
            .call(
                "POST",
                "/v1/sessions",
                Some(&owner),
                Some(
                    &json!({"agent": "invoices", "prompt": "which invoices are overdue?",
                             "params": {"billing_token": RUNNING}}),
                ),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        let running = r.json["session_id"].as_str().unwrap().to_string();
        let seen = api(&b.1)
            .call(
                "GET",
                &format!("/v1/sessions/{running}"),
                Some(&owner),
                None,
            )
            .await;
        assert_eq!(seen.json["status"], "running", "{}", seen.text);
        // Its log, followed until it ends (the pod is gone with it).
        let a_log = node.dir().join("deleted-pod.log");
        let mut follow = std::process::Command::new(bindery_tests::kubectl::kubectl_path())
            .args(["logs", "-f", "-n", NS, &a.0])
            .env(
                "KUBECONFIG",
                node.plane.kubeconfig(bindery_tests::control_plane::ADMIN),
            )
            .stdout(std::fs::File::create(&a_log).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("kubectl logs -f");
        kube.ok(&["delete", "-n", NS, "pod", &a.0, "--wait=false"]);

        // Nothing lost: the run ends with its answer, read through `b`.
        let done = bindery_tests::eventually::eventually_or(
            "the run under way to end",
            Duration::from_secs(120),
            async || {
                let s = api(&b.1)
                    .call(
                        "GET",
                        &format!("/v1/sessions/{running}"),
                        Some(&owner),
                        None,
                    )
                    .await;
                if s.json["status"] == "running" {
                    Err(s.text)
                } else {
                    Ok(s.json)
                }
            },
        )
        .await;
        let _ = tokio::task::block_in_place(|| follow.wait());
        let a_log = std::fs::read_to_string(&a_log).unwrap_or_default();
        assert_eq!(done["status"], "idle", "{done:#}\n{}'s log:\n{a_log}", a.0);
        let answer = last_answer(&done["session"]);
        assert!(
            answer.contains(&digest(RUNNING)),
            "{done:#}\n{}'s log:\n{a_log}",
            a.0
        );
        assert!(
            !a_log.contains(RUNNING) && !a_log.contains(CANARY),
            "a value in a's log"
        );
        // The session goes on through `b`: its value lived in `a`'s memory
        // only, so it is asked for, given again, and used.
        let say = |prompt: &str| json!({ "prompt": prompt });
        let path = format!("/v1/sessions/{running}/messages?wait=true");
        let r = api(&b.1)
            .call("POST", &path, Some(&owner), Some(&say("once more?")))
            .await;
        assert_eq!(r.status, 409, "{}", r.text);
        assert_eq!(r.json["error"], "params_required", "{}", r.text);
        let r = api(&b.1)
            .call(
                "PUT",
                &format!("/v1/sessions/{running}/params"),
                Some(&owner),
                Some(&json!({"params": {"billing_token": RUNNING}})),
            )
            .await;
        assert!(r.status < 300, "{}", r.text);
        let r = api(&b.1)
            .call("POST", &path, Some(&owner), Some(&say("once more?")))
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert!(
            last_answer(&r.json["session"]).contains(&digest(RUNNING)),
            "{}",
            r.text
        );
        running
    });

    // The Deployment replaces the pod; the value stayed out of every log.
    kube.until("two replicas again", || {
        let p = pods(&kube);
        if p.len() == 2 && p.iter().all(|(n, _)| *n != a.0) {
            Ok(())
        } else {
            Err(format!("ready: {p:?}"))
        }
    });
    let logs = kube.ok(&[
        "logs",
        "-n",
        NS,
        "-l",
        "bindery.dev/tenant=acme",
        "--tail=-1",
    ]);
    let dump = kube.ok(&[
        "exec",
        "-n",
        NS,
        "deployment/postgres",
        "--",
        "pg_dump",
        "--username=postgres",
        "acme",
    ]);
    assert!(dump.contains(&running_id), "the dump holds the sessions");
    for value in [CANARY, RUNNING] {
        assert!(!logs.contains(value), "a session's value in a log");
        assert!(!dump.contains(value), "a session's value in the store");
    }
    kube.uninstall("acme", NS);
}
