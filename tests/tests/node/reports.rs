//! What a tenant's pods report to the API server on a real node, with the
//! credentials the operator gives them and the kubelet projects (the
//! `kubernetes` Service's address, a ServiceAccount token, the cluster's
//! CA): an approval notice its receiver refuses becomes a Warning Event on
//! the AgentTenant, and a tenant's budget, which replaces its Agent's,
//! is enforced in the pod and its use written to the tenant's status.
//!
//! The model and the approval receiver are servers of the test's own, on
//! the node's address (pods reach the node), so the test sees every
//! request the model got and every notice.

use std::collections::BTreeSet;

use bindery_tests::control_plane::ControlPlane;
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use bindery_tests::node::{Node, NODE_IP};
use bindery_tests::node_fixtures::{apply_agent, token_secret};
use bindery_tests::node_kube::{Kube, TIMEOUT};
use bindery_tests::sidecar::Api;
use serde_json::{json, Value};

use crate::shared::operator_and_model;

/// The model of these tests, on the node's address: it asks for another
/// tenant's overdue invoices (the pin decides), then answers with the
/// tool's output.
async fn invoices_model() -> MockLlm {
    let listener = tokio::net::TcpListener::bind((NODE_IP, 0)).await.unwrap();
    MockLlm::serve(listener, |req: &Value| {
        let last = last_message(req);
        if last["role"] == "tool" {
            MockReply::text(format!(
                "answer: {}",
                last["content"].as_str().unwrap_or("")
            ))
        } else {
            MockReply::tool_call(
                "bash_query-invoices",
                json!({"status": "overdue", "tenant_id": "globex"}),
            )
        }
    })
}

/// What an approval receiver got: each notice's `Bindery-Signature` and
/// body.
type Notices = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// An approval receiver on the node's address that refuses every notice
/// (400, which the sidecar takes as final); its URL and what it got.
async fn refusing_receiver() -> (String, Notices) {
    let seen = Notices::default();
    let keep = seen.clone();
    let app = axum::Router::new().fallback(
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                let signature = headers
                    .get("bindery-signature")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let body = String::from_utf8_lossy(&body).into_owned();
                keep.lock().unwrap().push((signature, body));
                (axum::http::StatusCode::BAD_REQUEST, "not taken")
            }
        },
    );
    let listener = tokio::net::TcpListener::bind((NODE_IP, 0)).await.unwrap();
    let url = format!("http://{}/bindery/notices", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`, in hex.
fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    hex::encode(
        Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize(),
    )
}

/// The test's thread in the node's namespace, and a runtime built there.
fn runtime_in(node: &Node) -> tokio::runtime::Runtime {
    node.enter();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The tenant chart's `acme` in `ns` from the example values, edited by
/// `edit`; Ready. Its Service's base URL and owner token.
fn install_acme(
    kube: &Kube<'_>,
    ns: &str,
    edit: impl FnOnce(String) -> String,
) -> (String, String) {
    let values = std::fs::read_to_string(bindery_tests::helm::repo_path(
        "examples/k8s/acme-values.yaml",
    ))
    .unwrap();
    let file = kube.node.dir().join(format!("{ns}-acme-values.yaml"));
    std::fs::write(&file, edit(values)).unwrap();
    kube.helm(&[
        "install",
        "acme",
        &bindery_tests::helm::repo_path("charts/bindery-tenant"),
        "--namespace",
        ns,
        "--values",
        file.to_str().unwrap(),
        "--wait",
        "--timeout",
        TIMEOUT,
    ]);
    kube.ok(&[
        "wait",
        "-n",
        ns,
        "agenttenant/acme",
        "--for=condition=Ready",
        "--timeout",
        TIMEOUT,
    ]);
    let svc = kube.json(&["get", "-n", ns, "service", "acme"]);
    let base = format!(
        "http://{}:{}",
        svc["spec"]["clusterIP"].as_str().unwrap(),
        svc["spec"]["ports"][0]["port"]
    );
    let s: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(kube.json(&["get", "-n", ns, "secret", "acme-owner-token"]))
            .unwrap();
    let owner = String::from_utf8(s.data.unwrap()["token"].0.clone()).unwrap();
    (base, owner)
}

/// The logs of the operator and of `ns`'s pods.
fn pod_logs(kube: &Kube<'_>, ns: &str) -> String {
    let mut logs = String::new();
    for (ns, selector) in [
        ("bindery-system", "app.kubernetes.io/name=bindery-operator"),
        (ns, "bindery.dev/tenant"),
    ] {
        let out = kube.node.kubectl(&[
            "logs",
            "-n",
            ns,
            "-l",
            selector,
            "--tail=-1",
            "--all-containers",
        ]);
        logs.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    logs
}

/// What a tenant whose agents have no approval webhook must not have: a
/// Role or RoleBinding of its own, a ServiceAccount token in its pods.
fn no_api_access(kube: &Kube<'_>, ns: &str) -> Result<(), String> {
    let selector = "bindery.dev/tenant=acme";
    let rbac = kube.ok(&[
        "get",
        "-n",
        ns,
        "roles,rolebindings",
        "-l",
        selector,
        "-o",
        "name",
    ]);
    if !rbac.trim().is_empty() {
        return Err(format!("RBAC of its own: {rbac}"));
    }
    let d = kube.json(&["get", "-n", ns, "deployment", "acme"]);
    let pods = kube.json(&["get", "-n", ns, "pods", "-l", selector]);
    let mut specs = vec![d["spec"]["template"]["spec"].clone()];
    specs.extend(
        pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["spec"].clone()),
    );
    for spec in specs {
        let text = spec.to_string();
        if spec["automountServiceAccountToken"] != false
            || ["serviceAccountToken", "projected", "BINDERY_EVENTS_DIR"]
                .iter()
                .any(|w| text.contains(w))
        {
            return Err(format!("a token in a pod: {spec:#}"));
        }
    }
    let s = &d["status"];
    if s["updatedReplicas"] == 1
        && s["readyReplicas"] == 1
        && s["replicas"] == 1
        && pods["items"].as_array().is_some_and(|p| p.len() == 1)
    {
        Ok(())
    } else {
        Err(format!("not rolled: {s:#}"))
    }
}

/// An Agent whose model's first call waits for a person (`confirm`) and
/// which announces it to an approval webhook, with the real sidecar in
/// the tenant's pod: the receiver refuses the notice (400), so the sidecar
/// posts a Warning Event `ApprovalNoticeFailed` on the AgentTenant as the
/// tenant's ServiceAccount, with the token, CA and namespace the operator
/// projects and the API server's address the kubelet gives; `kubectl
/// describe` shows it, its note names the session and the tool and carries
/// no secret, and the signing key (from a Secret) signed the notice but is
/// in no Event, object or log. The tenant's account asked the API server
/// for that Event and nothing else. Once the webhook goes, so do the
/// Role, the RoleBinding and the pods' token.
#[test]
fn an_approval_notice_that_fails_for_good_is_a_warning_on_the_tenant() {
    const NS: &str = "approvals";
    const KEY: &str = "whsec-approvals-canary-61f0c8";
    const CANARY: &str = "billing-canary-0d7e42";
    let node = Node::shared();
    let kube = Kube { node };
    operator_and_model(&kube);
    let runtime = runtime_in(node);
    let (llm, (hook, notices)) =
        runtime.block_on(async { (invoices_model().await, refusing_receiver().await) });
    kube.restricted_namespace(NS);

    // The example Agent, its query confirmed by a person and announced to
    // the receiver, the signing key a secret process parameter...
    let declare = "  parameters:\n";
    let with_webhook = |webhook: bool| {
        let hook = hook.clone();
        move |agent: String| {
            assert!(agent.contains(declare), "examples/k8s/agent.yaml changed");
            let agent = agent.replacen(
                declare,
                "  parameters:\n    - {name: approvals_key, secret: true, scope: process}\n",
                1,
            );
            if !webhook {
                return agent;
            }
            agent.replacen(
                "\nspec:\n",
                &format!(
                    "\nspec:\n  confirm:\n    - tool: bash_query-invoices\n  approvals:\n    webhook:\n      url: \"{hook}\"\n      signingKey: {{param: approvals_key}}\n"
                ),
                1,
            )
        }
    };
    apply_agent(&kube, NS, &llm.url(), with_webhook(true));
    // ... which the tenant maps from its Secret.
    kube.apply(&token_secret(NS, "acme-billing", CANARY));
    kube.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: acme-approvals, namespace: {NS}}}\nstringData: {{key: {KEY}}}\n"
    ));
    let (base, owner) = install_acme(&kube, NS, |values| {
        assert!(
            values.contains("\nparameters:\n"),
            "examples/k8s/acme-values.yaml changed"
        );
        values.replacen(
            "\nparameters:\n",
            "\nparameters:\n  - name: approvals_key\n    valueFrom:\n      secretKeyRef: {name: acme-approvals, key: key}\n",
            1,
        )
    });
    let acme = kube.json(&["get", "-n", NS, "agenttenant", "acme"]);
    let uid = acme["metadata"]["uid"].as_str().unwrap().to_string();
    let role = kube.json(&["get", "-n", NS, "role", "acme"]);
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}]),
        "{role:#}"
    );
    kube.ok(&["get", "-n", NS, "rolebinding", "acme"]);

    // A session: the model's first call waits for a person; the notice is
    // refused, for good.
    let api = Api::new(&base);
    let r = runtime.block_on(api.call(
        "POST",
        "/v1/sessions?wait=true",
        Some(&owner),
        Some(&json!({"agent": "invoices", "prompt": "which invoices are overdue?"})),
    ));
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "waiting_external", "{}", r.text);
    let session = r.json["session_id"].as_str().unwrap().to_string();
    kube.until("the notice at the receiver", || {
        if notices.lock().unwrap().is_empty() {
            Err(pod_logs(&kube, NS))
        } else {
            Ok(())
        }
    });
    // Signed with the Secret's key: it reached the sidecar, and only it.
    let (signature, body) = notices.lock().unwrap()[0].clone();
    let parts: std::collections::BTreeMap<&str, &str> = signature
        .split(',')
        .filter_map(|p| p.split_once('='))
        .collect();
    let signed = format!("{}.{body}", parts["t"]);
    assert_eq!(
        parts["v1"],
        hmac_sha256_hex(KEY.as_bytes(), signed.as_bytes()),
        "{signature}"
    );
    let notice: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(notice["session_id"], session.as_str(), "{body}");
    assert_eq!(notice["tool"], "bash_query-invoices", "{body}");
    // Its answer link is the tenant's Service inside the cluster (no
    // `publicUrl` given), and names the item's one-time token.
    let link = notice["answer_url"].as_str().unwrap_or_default();
    assert!(
        link.starts_with(&format!("http://acme.{NS}.svc/v1/approvals/ct_")),
        "{body}"
    );

    // The Warning on the tenant, posted by the sidecar.
    let failed = || -> Vec<Value> {
        kube.json(&["get", "-n", NS, "events.events.k8s.io"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["reason"] == "ApprovalNoticeFailed")
            .cloned()
            .collect()
    };
    let events = kube.until("an ApprovalNoticeFailed Event", || {
        let events = failed();
        if events.is_empty() {
            Err(pod_logs(&kube, NS))
        } else {
            Ok(events)
        }
    });
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["type"], "Warning", "{event:#}");
    assert_eq!(event["action"], "Notify", "{event:#}");
    assert_eq!(
        event["reportingController"], "bindery.dev/sidecar",
        "{event:#}"
    );
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "AgentTenant",
               "name": "acme", "namespace": NS, "uid": uid}),
        "{event:#}"
    );
    let pods = kube.json(&["get", "-n", NS, "pods", "-l", "bindery.dev/tenant=acme"]);
    let pod_names: Vec<&str> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert!(
        pod_names.contains(&event["reportingInstance"].as_str().unwrap_or_default()),
        "{event:#} {pod_names:?}"
    );
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&session) && note.contains("bash_query-invoices"),
        "{note}"
    );
    for secret in [KEY, CANARY, hook.as_str(), "/bindery/notices"] {
        assert!(!note.contains(secret), "{secret} in the note: {note}");
    }
    let described = kube.ok(&["describe", "-n", NS, "agenttenant", "acme"]);
    assert!(
        described.contains("ApprovalNoticeFailed") && described.contains("bash_query-invoices"),
        "{described}"
    );
    // The session says it too.
    let s = runtime.block_on(api.call(
        "GET",
        &format!("/v1/sessions/{session}"),
        Some(&owner),
        None,
    ));
    assert!(
        s.json["status_detail"]
            .as_str()
            .unwrap_or_default()
            .contains("the approval webhook could not be told"),
        "{}",
        s.text
    );
    // What the tenant's account asked of the API server: that Event.
    let account = ControlPlane::service_account_user(NS, "acme");
    let asked: BTreeSet<(String, String, String, bool)> = node
        .plane
        .audited()
        .into_iter()
        .filter(|a| a.user == account)
        .map(|a| (a.group, a.resource, a.verb, a.allowed))
        .collect();
    assert_eq!(
        asked,
        BTreeSet::from([(
            "events.k8s.io".into(),
            "events".into(),
            "create".into(),
            true
        )]),
        "the tenant's account asked for"
    );

    // The key is in no Event, object or log: only in its Secret.
    let mut everywhere = kube.all_of(&[
        "agenttenants",
        "agents",
        "deployments",
        "pods",
        "configmaps",
        "services",
        "serviceaccounts",
        "roles",
        "rolebindings",
        "events",
        "events.events.k8s.io",
    ]);
    everywhere.push_str(&described);
    everywhere.push_str(&pod_logs(&kube, NS));
    everywhere.push_str(&s.text);
    everywhere.push_str(&serde_json::to_string(&llm.requests()).unwrap());
    for (_, body) in notices.lock().unwrap().iter() {
        everywhere.push_str(body);
    }
    for value in [KEY, CANARY] {
        assert!(!everywhere.contains(value), "{value} left its Secret");
    }

    // The webhook goes: so do the Role, the RoleBinding and the token.
    apply_agent(&kube, NS, &llm.url(), with_webhook(false));
    kube.until(
        "acme's pods to roll without the token, and its RBAC to go",
        || no_api_access(&kube, NS),
    );
    kube.uninstall("acme", NS);
    runtime.block_on(llm.shutdown());
}

/// A tenant's budget replaces its Agent's of the same name, through the
/// tenant chart and the operator, and the real sidecar in the tenant's pod
/// enforces it: the run stops at the tenant's cap, the next message is
/// refused with a 429 through the tenant's Service, and the pod writes each
/// budget's use to the AgentTenant's status (as the tenant's own
/// ServiceAccount, owning only those fields) and a Warning Event when the
/// budget is used up; `kubectl describe` shows both.
#[test]
fn a_tenants_budget_overrides_its_agents_and_its_pods_enforce_and_report_it() {
    const NS: &str = "budgets";
    const CANARY: &str = "billing-canary-5e1d77";
    let node = Node::shared();
    let kube = Kube { node };
    operator_and_model(&kube);
    let runtime = runtime_in(node);
    let llm = runtime.block_on(invoices_model());
    kube.restricted_namespace(NS);
    // The Agent allows plenty; the tenant allows one token a day.
    apply_agent(&kube, NS, &llm.url(), |agent| {
        agent.replacen(
            "\nspec:\n",
            "\nspec:\n  budgets:\n    - {name: daily-tokens, tokens: 1000000, per: 24h}\n    - {name: calls, toolCalls: 100, per: session}\n",
            1,
        )
    });
    kube.apply(&token_secret(NS, "acme-billing", CANARY));
    let (base, owner) = install_acme(&kube, NS, |values| {
        format!("{values}\nbudgets:\n  - {{name: daily-tokens, tokens: 1, per: 24h}}\n")
    });

    let api = Api::new(&base);
    let r = runtime.block_on(api.call(
        "POST",
        "/v1/sessions?wait=true",
        Some(&owner),
        Some(&json!({"agent": "invoices", "prompt": "which invoices are overdue?"})),
    ));
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    assert!(
        r.json["status_detail"]
            .as_str()
            .unwrap_or_default()
            .starts_with("budget_exceeded: budget daily-tokens is used up:"),
        "{}",
        r.text
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "the second model turn did not start"
    );
    let session = r.json["session_id"].as_str().unwrap();
    let refused = runtime.block_on(api.call(
        "POST",
        &format!("/v1/sessions/{session}/messages"),
        Some(&owner),
        Some(&json!({"prompt": "and now?"})),
    ));
    assert_eq!(refused.status, 429, "{}", refused.text);
    assert_eq!(refused.json["budget"], "daily-tokens");
    assert_eq!(
        refused.json["limit"], 1.0,
        "the tenant's limit, not the Agent's"
    );

    let rows = || kube.json(&["get", "-n", NS, "agenttenant", "acme"])["status"]["budgets"].clone();
    // Written when the budget is used up, and again after the run (its
    // tool call counted).
    let rows = kube.until("the pods' budget rows on the tenant's status", || {
        let rows = rows();
        let done = rows.as_array().is_some_and(|r| {
            r.iter()
                .any(|b| b["name"] == "daily-tokens" && b["exhausted"] == true)
                && r.iter()
                    .any(|b| b["name"] == "calls" && b["used"].as_f64() == Some(1.0))
        });
        if done {
            Ok(rows)
        } else {
            Err(format!("{rows:#}\n{}", pod_logs(&kube, NS)))
        }
    });
    let row = |name: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} row: {rows:#}"))
    };
    let daily = row("daily-tokens");
    assert_eq!(daily["agent"], "invoices", "{rows:#}");
    // The API server writes whole numbers without a fraction.
    assert_eq!(daily["limit"].as_f64(), Some(1.0), "{rows:#}");
    assert_eq!(daily["per"], "24h", "{rows:#}");
    let calls = row("calls");
    assert_eq!(calls["limit"].as_f64(), Some(100.0), "{rows:#}");
    assert_eq!(calls["used"].as_f64(), Some(1.0), "{rows:#}");
    kube.until("a BudgetUsedUp Event", || {
        let events = kube.json(&["get", "-n", NS, "events.events.k8s.io"]);
        let found = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "BudgetUsedUp" && e["type"] == "Warning");
        if found {
            Ok(())
        } else {
            Err(pod_logs(&kube, NS))
        }
    });
    let described = kube.ok(&["describe", "-n", NS, "agenttenant", "acme"]);
    assert!(
        described.contains("daily-tokens (agent invoices):")
            && described.contains("of 1 tokens per 24h")
            && described.contains("BudgetUsedUp"),
        "{described}"
    );
    // The rows are the pods' (their field manager), and no secret is in them.
    let acme = kube.json(&[
        "get",
        "-n",
        NS,
        "agenttenant",
        "acme",
        "--show-managed-fields",
    ]);
    let managers: Vec<&str> = acme["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["fieldsV1"]["f:status"]["f:budgets"].is_object())
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert_eq!(managers, ["bindery-sidecar"], "{acme:#}");
    assert!(!described.contains(CANARY));
    kube.uninstall("acme", NS);
    runtime.block_on(llm.shutdown());
}
