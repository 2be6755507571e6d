//! The platform team's path on a real node, with the project's images
//! pulled under the charts' default names: `helm install` of the operator
//! chart with its defaults (the operator runs in a pod, as its
//! ServiceAccount), the example Agent and tools, `helm install` of the
//! tenant chart for two tenants in a namespace that enforces Pod Security
//! `restricted`; a client pod reaches each tenant by its Service name and
//! gets its answer from the mock model (itself a pod); `helm test`;
//! `kubectl describe` shows each parameter's row and no secret; the
//! NetworkPolicy refuses a pod it does not admit; a changed Secret and a
//! `helm upgrade` roll the pods; `helm uninstall` takes what the tenant
//! owned.

use std::collections::BTreeSet;

use bindery_tests::helm::repo_path;
use bindery_tests::node::Node;
use bindery_tests::node_fixtures::{apply_invoices_agent, tenant_values, token_secret};
use bindery_tests::node_kube::{curl_pod, Kube, TIMEOUT};
use bindery_tests::sidecar::{Api, Reply};
use serde_json::{json, Value};

use crate::shared::operator_and_model;

const NS: &str = "shop";

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// A session of `tenant`'s through its Service, from a client pod the
/// NetworkPolicy admits: the phase and what curl printed.
pub fn ask(kube: &Kube<'_>, tenant: &str, pod: &str) -> (String, String) {
    let url = format!("http://{tenant}.{NS}.svc.cluster.local/v1/sessions?wait=true");
    kube.run_pod(
        NS,
        pod,
        &curl_pod(
            NS,
            pod,
            &[("bindery.test/client", tenant)],
            Some((&format!("{tenant}-owner-token"), "token")),
            &[
                "--silent",
                "--show-error",
                "--max-time",
                "120",
                "--retry",
                "5",
                "--retry-all-errors",
                "--header",
                "Authorization: Bearer $(TOKEN)",
                "--header",
                "Content-Type: application/json",
                "--data",
                r#"{"agent": "invoices", "prompt": "which invoices are overdue?"}"#,
                "--write-out",
                "\nstatus=%{http_code}\n",
                &url,
            ],
        ),
    )
}

/// Whether a pod with `labels` connects to `url`, trying for 20 s (a
/// policy enforcer admits a new pod's address once it has seen the pod):
/// curl's last exit code is neither 7 (refused) nor 28 (timed out, the
/// packets dropped); a TLS or HTTP error after connecting counts as
/// connected.
pub fn connects(
    kube: &Kube<'_>,
    ns: &str,
    pod: &str,
    labels: &[(&str, &str)],
    url: &str,
) -> (bool, String) {
    let (_, log) = kube.run_pod(
        ns,
        pod,
        &curl_pod(
            ns,
            pod,
            labels,
            None,
            &[
                "--silent",
                "--insecure",
                "--connect-timeout",
                "3",
                "--max-time",
                "5",
                "--retry",
                "20",
                "--retry-delay",
                "1",
                "--retry-max-time",
                "20",
                "--retry-connrefused",
                "--output",
                "/dev/null",
                "--write-out",
                "exit=%{exitcode} status=%{http_code}\n",
                url,
            ],
        ),
    );
    let code = log
        .split_whitespace()
        .find_map(|w| w.strip_prefix("exit="))
        .and_then(|c| c.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("curl said no exit code: {log}"));
    (!matches!(code, 7 | 28), log)
}

/// The cluster IP and port of `tenant`'s Service.
fn cluster_ip(kube: &Kube<'_>, tenant: &str) -> String {
    let svc = kube.json(&["get", "-n", NS, "service", tenant]);
    format!(
        "{}:{}",
        svc["spec"]["clusterIP"].as_str().expect("a cluster IP"),
        svc["spec"]["ports"][0]["port"]
    )
}

/// One JSON-RPC request on a tenant's `/mcp` (the stateless POST of
/// protocol 2025-03-26) with `token` as the bearer.
async fn mcp(base: &str, token: &str, method: &str, params: Value) -> Reply {
    Api::new(base)
        .call(
            "POST",
            "/mcp",
            Some(token),
            Some(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})),
        )
        .await
}

/// What a tenant whose agents have no approval webhook must not have: a
/// Role or RoleBinding of its own, a ServiceAccount token in its pods.
fn assert_no_api_access(kube: &Kube<'_>, tenant: &str) {
    let selector = format!("bindery.dev/tenant={tenant}");
    let rbac = kube.ok(&[
        "get",
        "-n",
        NS,
        "roles,rolebindings",
        "-l",
        &selector,
        "-o",
        "name",
    ]);
    assert_eq!(rbac.trim(), "", "{tenant} has RBAC of its own");
    let pods = kube.json(&["get", "-n", NS, "pods", "-l", &selector]);
    for pod in pods["items"].as_array().unwrap() {
        let spec = &pod["spec"];
        assert_eq!(spec["automountServiceAccountToken"], false, "{spec:#}");
        let text = spec.to_string();
        for what in ["serviceAccountToken", "projected", "BINDERY_EVENTS_DIR"] {
            assert!(!text.contains(what), "{what} in {tenant}'s pods: {spec:#}");
        }
    }
}

fn deployment_settled(kube: &Kube<'_>, name: &str, replicas: u64) -> Result<Value, String> {
    let d = kube.json(&["get", "-n", NS, "deployment", name]);
    let s = &d["status"];
    if s["observedGeneration"] == d["metadata"]["generation"]
        && s["updatedReplicas"] == replicas
        && s["readyReplicas"] == replicas
        && s["replicas"] == replicas
    {
        Ok(d)
    } else {
        Err(format!("{s:#}"))
    }
}

fn pod_names(kube: &Kube<'_>, tenant: &str) -> BTreeSet<String> {
    kube.ok(&[
        "get",
        "-n",
        NS,
        "pods",
        "-l",
        &format!("bindery.dev/tenant={tenant}"),
        "-o",
        "name",
    ])
    .lines()
    .map(String::from)
    .collect()
}

#[test]
fn the_platform_teams_path_on_a_real_node() {
    const ACME: &str = "acme-billing-canary-7d31f0";
    const GLOBEX: &str = "globex-billing-canary-2c9e44";
    const ROTATED: &str = "acme-billing-rotated-e08b5a";
    const MCP_ACME: &str = "acme-mcp-client-canary-e47b10";
    const MCP_GLOBEX: &str = "globex-mcp-client-canary-91ad3c";
    let node = Node::shared();
    let kube = Kube { node };
    // The test's own requests (MCP) come from the node, as a platform
    // team's tooling on it would: the policy admits the node.
    node.enter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // 1. The operator chart with its defaults: the operator's pod, from
    // the chart's default image, Ready; the mock model's pod.
    operator_and_model(&kube);
    let operator = kube.json(&["get", "-n", "bindery-system", "pods"]);
    let image = operator["items"][0]["spec"]["containers"][0]["image"].clone();
    assert_eq!(
        image, "ghcr.io/bindery-dev/bindery-operator:0.1.0",
        "{operator:#}"
    );

    // 2. The example Agent and tools, each tenant's Secret.
    kube.restricted_namespace(NS);
    apply_invoices_agent(&kube, NS);
    kube.apply(&token_secret(NS, "acme-billing", ACME));
    kube.apply(&token_secret(NS, "globex-billing", GLOBEX));
    kube.apply(&token_secret(NS, "acme-mcp", MCP_ACME));
    kube.apply(&token_secret(NS, "globex-mcp", MCP_GLOBEX));

    // 3. Two tenants from the tenant chart: Ready under the chart's
    // securityContext in the restricted namespace.
    for (tenant, billing) in [("acme", "acme-corp"), ("globex", "globex")] {
        let values = tenant_values(&kube, tenant, billing);
        let mcp_token = format!("mcpClientTokenSecretRef.name={tenant}-mcp");
        let out = kube.helm(&[
            "install",
            tenant,
            &repo_path("charts/bindery-tenant"),
            "--namespace",
            NS,
            "--values",
            &values,
            "--set",
            &mcp_token,
            "--set",
            "mcpClientTokenSecretRef.key=token",
            "--wait",
            "--timeout",
            TIMEOUT,
        ]);
        assert!(out.contains("STATUS: deployed"), "{out}");
        kube.ok(&[
            "wait",
            "-n",
            NS,
            &format!("agenttenant/{tenant}"),
            "--for=condition=Ready",
            "--timeout",
            TIMEOUT,
        ]);
        let d = kube.until(&format!("{tenant}'s pods ready"), || {
            deployment_settled(&kube, tenant, 1)
        });
        let image = &d["spec"]["template"]["spec"]["containers"][0]["image"];
        assert_eq!(image, "ghcr.io/bindery-dev/bindery-sidecar:0.1.0", "{d:#}");
    }

    // 4. A client pod of each tenant's gets its tenant's answer, by the
    // Service's name, with its Secret's value reaching the tool only.
    for (tenant, invoice, other, canary) in [
        ("acme", "INV-1002", "INV-2002", ACME),
        ("globex", "INV-2002", "INV-1002", GLOBEX),
    ] {
        let (phase, log) = ask(&kube, tenant, &format!("{tenant}-client"));
        assert_eq!(phase, "Succeeded", "{log}");
        assert!(log.contains("status=201"), "{log}");
        assert!(log.contains(invoice), "{tenant}'s overdue invoice: {log}");
        assert!(!log.contains(other), "another tenant's invoice: {log}");
        assert!(
            log.contains(&sha256_hex(canary)),
            "the Secret's value did not reach the tool: {log}"
        );
    }

    // An MCP client with acme's token sees the agent's own tool as the
    // model does (the bound arguments are not there) and calls it: the
    // pinned tenant wins over the one it asks for; the agent itself is
    // not its to ask; globex's token opens nothing of acme's.
    let acme = format!("http://{}", cluster_ip(&kube, "acme"));
    runtime.block_on(async {
        let listed = mcp(&acme, MCP_ACME, "tools/list", json!({})).await;
        assert_eq!(listed.status, 200, "{}", listed.text);
        let tools = listed.json["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(
            names,
            ["bash_query-invoices"],
            "{}\n{}\n{}",
            listed.text,
            kube.ok(&["get", "-n", NS, "agent", "invoices", "-o", "yaml"]),
            kube.ok(&["get", "-n", NS, "configmap", "acme-agents", "-o", "yaml"])
        );
        let properties = &tools[0]["inputSchema"]["properties"];
        assert!(properties.get("status").is_some(), "{}", listed.text);
        for bound in ["tenant_id", "token"] {
            assert!(
                properties.get(bound).is_none(),
                "{bound} listed: {}",
                listed.text
            );
        }
        let called = mcp(
            &acme,
            MCP_ACME,
            "tools/call",
            json!({"name": "bash_query-invoices",
                   "arguments": {"status": "overdue", "tenant_id": "globex"}}),
        )
        .await;
        let answer = called.json["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(called.json["result"]["isError"], false, "{}", called.text);
        assert!(answer.contains("INV-1002"), "{}", called.text);
        assert!(!answer.contains("INV-2002"), "{}", called.text);
        assert!(answer.contains(&sha256_hex(ACME)), "{}", called.text);
        let asked = mcp(
            &acme,
            MCP_ACME,
            "tools/call",
            json!({"name": "ask_invoices", "arguments": {"prompt": "which invoices are overdue?"}}),
        )
        .await;
        assert!(asked.json["result"].is_null(), "{}", asked.text);
        let wrong = mcp(&acme, MCP_GLOBEX, "tools/list", json!({})).await;
        assert_eq!(wrong.status, 401, "{}", wrong.text);
    });
    // No agent has an approval webhook: no RBAC, no token in the pods.
    assert_no_api_access(&kube, "acme");

    // 5. `helm test`: the chart's own pod reaches the tenant by name.
    let tested = kube.helm(&["test", "acme", "-n", NS, "--timeout", TIMEOUT]);
    assert!(tested.contains("Phase:          Succeeded"), "{tested}");
    kube.ok(&["delete", "-n", NS, "pod", "acme-test-readyz"]);

    // 6. describe: a row per parameter, no secret value.
    let acme = kube.json(&["get", "-n", NS, "agenttenant", "acme"]);
    let described = kube.ok(&["describe", "-n", NS, "agenttenant", "acme"]);
    let summary = acme["status"]["summary"].as_array().expect("a summary");
    assert_eq!(summary.len(), 2, "{acme:#}");
    for line in summary {
        assert!(
            described.contains(line.as_str().unwrap()),
            "{line} not in:\n{described}"
        );
    }
    assert!(!described.contains(ACME), "{described}");

    // 7. The NetworkPolicy is enforced: a pod it does not admit, or
    // another tenant's client, gets no answer on the API port, by the
    // Service or the pod's own address; acme's client does.
    let acme_pod_ip = kube.json(&["get", "-n", NS, "pods", "-l", "bindery.dev/tenant=acme"])
        ["items"][0]["status"]["podIP"]
        .as_str()
        .expect("acme's pod has an address")
        .to_string();
    let by_pod = format!("http://{acme_pod_ip}:8080/readyz");
    for url in ["http://acme.shop.svc.cluster.local/readyz", by_pod.as_str()] {
        let admitted = [("bindery.test/client", "acme")];
        let (ok, log) = connects(&kube, NS, "admitted", &admitted, url);
        assert!(ok, "the admitted client, to {url}: {log}");
        let (ok, log) = connects(&kube, NS, "stranger", &[], url);
        assert!(!ok, "a pod the policy does not admit, to {url}: {log}");
        let globex = [("bindery.test/client", "globex")];
        let (ok, log) = connects(&kube, NS, "globex-to-acme", &globex, url);
        assert!(!ok, "another tenant's client, to {url}: {log}");
    }

    // 8. A changed Secret rolls acme's pods; the new value reaches the tool.
    let before = pod_names(&kube, "acme");
    kube.apply(&token_secret(NS, "acme-billing", ROTATED));
    kube.until("acme's pods to roll", || {
        let d = deployment_settled(&kube, "acme", 1)?;
        let now = pod_names(&kube, "acme");
        if now.is_disjoint(&before) && now.len() == 1 {
            Ok(d)
        } else {
            Err(format!("pods {now:?}, before {before:?}"))
        }
    });
    let (phase, log) = ask(&kube, "acme", "acme-client-rotated");
    assert_eq!(phase, "Succeeded", "{log}");
    assert!(log.contains(&sha256_hex(ROTATED)), "{log}");

    // 9. `helm upgrade` with a changed value rolls them too.
    let before = pod_names(&kube, "acme");
    let values = tenant_values(&kube, "acme", "acme-corp");
    kube.helm(&[
        "upgrade",
        "acme",
        &repo_path("charts/bindery-tenant"),
        "--namespace",
        NS,
        "--values",
        &values,
        "--set",
        "mcpClientTokenSecretRef.name=acme-mcp,mcpClientTokenSecretRef.key=token",
        "--set",
        "liveSessionTtl=45m",
        "--wait",
        "--timeout",
        TIMEOUT,
    ]);
    kube.until("acme's pods to roll to the upgrade", || {
        let d = deployment_settled(&kube, "acme", 1)?;
        let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        let now = pod_names(&kube, "acme");
        if args.contains("\"45m\"") && now.is_disjoint(&before) {
            Ok(())
        } else {
            Err(format!("args {args}, pods {now:?}"))
        }
    });
    let (phase, log) = ask(&kube, "acme", "acme-client-upgraded");
    assert_eq!(phase, "Succeeded", "{log}");
    assert!(log.contains("status=201"), "{log}");

    // No secret value anywhere but in its Secret: objects, the pods' logs.
    let mut everywhere = kube.all_of(&[
        "agenttenants",
        "agents",
        "deployments",
        "pods",
        "configmaps",
        "events",
    ]);
    for (ns, selector) in [
        ("bindery-system", "app.kubernetes.io/name=bindery-operator"),
        (NS, "bindery.dev/tenant"),
        ("models", "app=mock-model"),
    ] {
        everywhere.push_str(&kube.ok(&[
            "logs",
            "-n",
            ns,
            "-l",
            selector,
            "--tail=-1",
            "--all-containers",
        ]));
    }
    everywhere.push_str(&kube.helm(&["get", "all", "acme", "-n", NS]));
    for value in [ACME, GLOBEX, ROTATED, MCP_ACME, MCP_GLOBEX] {
        assert!(!everywhere.contains(value), "{value} left its Secret");
    }

    // 10. `helm uninstall` of acme takes what it owned; globex stays.
    kube.uninstall("acme", NS);
    kube.until("everything acme owned to be gone", || {
        let left: Vec<String> = [
            ("agenttenant", "acme"),
            ("deployment", "acme"),
            ("service", "acme"),
            ("serviceaccount", "acme"),
            ("secret", "acme-owner-token"),
            ("networkpolicy", "acme"),
        ]
        .iter()
        .filter(|(kind, name)| kube.succeeds(&["get", "-n", NS, kind, name]))
        .map(|(kind, name)| format!("{kind}/{name}"))
        .chain(pod_names(&kube, "acme"))
        .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("left: {left:?}"))
        }
    });
    let (phase, log) = ask(&kube, "globex", "globex-client-after");
    assert_eq!(phase, "Succeeded", "{log}");
    assert!(log.contains("INV-2002"), "{log}");
}
