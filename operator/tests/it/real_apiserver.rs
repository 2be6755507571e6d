//! The CRDs and the operator chart's RBAC against the real Kubernetes
//! control plane (tests/src/control_plane.rs: etcd, kube-apiserver and
//! kube-controller-manager built by tests/setup.sh): the API server
//! compiles the CRDs' schemas and CEL rules, enforces them,
//! prints the columns, resolves server-side apply conflicts and authorizes
//! the operator's ServiceAccount with RBAC, and its audit log shows what
//! that account asked for.
//!
//! One control plane for the test binary; each test has a namespace of its
//! own. The last test checks the controller manager the later tests rely
//! on: a Deployment gets its ReplicaSet and Pod, and collecting garbage
//! takes them with it.

use std::path::Path;
use std::time::Duration;

use crate::common::plane;
use bindery_operator::crd::{Agent, AgentTenant};
use bindery_tests::control_plane::{ControlPlane, ADMIN, OPERATOR_ACCOUNT, OPERATOR_NAMESPACE};
use bindery_tests::eventually::{eventually, eventually_or};
use bindery_tests::helm::{documents, Render};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy, WatchEvent,
    WatchParams,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
        .display()
        .to_string()
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A fresh namespace for one test; the administrator's client.
async fn namespace(name: &str) -> Client {
    let admin = plane().client(ADMIN).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
    admin
}

/// The refusal `create` met: its HTTP code and message.
async fn refused<K>(api: &Api<K>, object: Value) -> (u16, String)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).expect("the object deserializes");
    match api.create(&PostParams::default(), &object).await {
        Ok(created) => panic!("the API server accepted {created:?}"),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(e) => panic!("not an API error: {e}"),
    }
}

#[tokio::test]
async fn the_generated_crds_are_structural_and_their_cel_rules_compile() {
    let plane = plane();
    // Established (above), and neither condition the server sets on a
    // schema it cannot use.
    for crd in ["agents.bindery.dev", "agenttenants.bindery.dev"] {
        let out = plane.kubectl_ok(
            ADMIN,
            &["get", "crd", crd, "-o", "jsonpath={.status.conditions}"],
        );
        let conditions: Vec<Value> = serde_json::from_str(&out).expect("conditions");
        let status = |t: &str| {
            conditions
                .iter()
                .find(|c| c["type"] == t)
                .map(|c| c["status"].as_str().unwrap().to_string())
        };
        assert_eq!(
            status("Established").as_deref(),
            Some("True"),
            "{crd}: {out}"
        );
        assert_eq!(
            status("NamesAccepted").as_deref(),
            Some("True"),
            "{crd}: {out}"
        );
        assert_eq!(status("NonStructuralSchema"), None, "{crd}: {out}");
    }
    // The server is the release tests/control-plane builds, and says so.
    let version: Value =
        serde_json::from_str(&plane.kubectl_ok(ADMIN, &["version", "-o", "json"])).unwrap();
    assert_eq!(
        version["serverVersion"]["gitVersion"],
        bindery_tests::control_plane::kubernetes_version(),
        "{version}"
    );
    // And the examples are valid objects of them.
    let admin = namespace("real-crds").await;
    let agent: Agent = serde_json::from_value(yaml("examples/k8s/agent.yaml")).unwrap();
    let tenant: AgentTenant = serde_json::from_value(yaml("examples/k8s/tenant.yaml")).unwrap();
    Api::<Agent>::namespaced(admin.clone(), "real-crds")
        .create(&PostParams::default(), &agent)
        .await
        .expect("the example Agent is accepted");
    Api::<AgentTenant>::namespaced(admin, "real-crds")
        .create(&PostParams::default(), &tenant)
        .await
        .expect("the example AgentTenant is accepted");
}

#[tokio::test]
async fn the_crds_cel_rules_refuse_invalid_objects_with_their_messages() {
    let admin = namespace("real-cel").await;
    let agents = Api::<Agent>::namespaced(admin.clone(), "real-cel");
    let mut agent = yaml("examples/k8s/agent.yaml");
    agent["spec"]["confirmTtl"] = json!("soon");
    let (code, message) = refused(&agents, agent).await;
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("spec.confirmTtl")
            && message.contains("confirmTtl is a number and a unit: 90s, 15m, 2h or 1d"),
        "{message}"
    );

    let tenants = Api::<AgentTenant>::namespaced(admin, "real-cel");
    let mut tenant = yaml("examples/k8s/tenant.yaml");
    tenant["spec"]["replicas"] = json!(2);
    tenant["spec"]["store"] = json!({"pvcSize": "1Gi"});
    let (code, message) = refused(&tenants, tenant).await;
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains(
            "replicas above 1 need a store they share (spec.store.postgres): \
             a pvcSize claim holds one pod's SQLite file"
        ),
        "{message}"
    );

    // A rule on list items: the same parameter twice.
    let mut tenant = yaml("examples/k8s/tenant.yaml");
    tenant["spec"]["parameters"] = json!([
        {"name": "tenant", "value": "a"},
        {"name": "tenant", "value": "b"},
    ]);
    let (code, message) = refused(&tenants, tenant).await;
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("spec.parameters")
            && message.contains("each parameter may be listed once"),
        "{message}"
    );
}

/// Budgets on the real API server: a second budget of a name is refused
/// (the list is keyed by name), and so are one capping two things and a
/// window that is no duration; on the Agent and on the AgentTenant alike.
/// A cost budget is accepted: its price (the model's, the tenant's or the
/// shipped table's) is for the operator's checks to find.
#[tokio::test]
async fn the_api_server_refuses_wrong_budgets_with_their_messages() {
    let ns = "real-budgets";
    let admin = namespace(ns).await;
    let agents = Api::<Agent>::namespaced(admin.clone(), ns);
    let tenants = Api::<AgentTenant>::namespaced(admin, ns);
    let agent = |budgets: Value, priced: bool| {
        let mut a = yaml("examples/k8s/agent.yaml");
        a["spec"]["budgets"] = budgets;
        if priced {
            a["spec"]["model"]["pricing"] =
                json!({"inputPerMillion": 0.15, "outputPerMillion": 0.6});
        }
        a
    };
    let tenant = |budgets: Value| {
        let mut t = yaml("examples/k8s/tenant.yaml");
        t["spec"]["budgets"] = budgets;
        t
    };
    let daily = json!({"name": "daily", "tokens": 200000, "per": "24h"});
    let shapes = [
        (
            json!([daily, {"name": "daily", "toolCalls": 5, "per": "run"}]),
            vec!["spec.budgets[1]", "Duplicate value"],
        ),
        (
            json!([{"name": "both", "tokens": 1, "cost": 2.0, "per": "1h"}]),
            vec![
                "spec.budgets[0]",
                "a budget caps exactly one of tokens, toolCalls and cost",
            ],
        ),
        (
            json!([{"name": "weekly", "tokens": 1, "per": "1w"}]),
            vec![
                "spec.budgets[0].per",
                "per is a duration (1h, 24h, 30d), `session` or `run`",
            ],
        ),
    ];
    for (budgets, want) in &shapes {
        for (kind, (code, message)) in [
            (
                "Agent",
                refused(&agents, agent(budgets.clone(), true)).await,
            ),
            (
                "AgentTenant",
                refused(&tenants, tenant(budgets.clone())).await,
            ),
        ] {
            assert_eq!(code, 422, "{kind}: {message}");
            for w in want {
                assert!(message.contains(w), "{kind}: want {w:?}: {message}");
            }
        }
    }
    // A cost budget's price may be the model's own or Bindery's price
    // table, which the API server does not have: the schema takes it, and
    // the operator's checks judge it (`Valid`; crd_schema's
    // `a_cost_budget_is_priced_by_the_operators_checks_not_the_schema`).
    let cost = json!([{"name": "spend", "cost": 25.0, "per": "30d"}]);
    // What is right is accepted, and kept as written.
    let good =
        json!([daily, {"name": "calls", "toolCalls": 50, "per": "session", "onExceed": "confirm"}]);
    let mut both = good.as_array().unwrap().clone();
    both.extend(cost.as_array().unwrap().iter().cloned());
    let created = agents
        .create(
            &PostParams::default(),
            &serde_json::from_value(agent(Value::Array(both), true)).unwrap(),
        )
        .await
        .expect("budgets with a priced model are accepted");
    assert_eq!(created.spec.budgets.len(), 3);
    let created = tenants
        .create(
            &PostParams::default(),
            &serde_json::from_value(tenant(cost)).unwrap(),
        )
        .await
        .expect("a tenant's cost budget is accepted");
    assert_eq!(created.spec.budgets[0].cost, Some(25.0));
}

/// The operator's status apply (its very body, `status_apply`) and the
/// agent server's (field manager `bindery-sidecar`, `status.budgets` and
/// `status.budgetSummary` alone) share the status without a conflict and
/// without either removing the other's fields, however often each applies.
#[tokio::test]
async fn the_operators_status_and_the_agent_servers_budget_rows_keep_to_their_fields() {
    let ns = "real-budget-status";
    let admin = namespace(ns).await;
    let tenants = Api::<AgentTenant>::namespaced(admin, ns);
    let tenant: AgentTenant = serde_json::from_value(yaml("examples/k8s/tenant.yaml")).unwrap();
    tenants
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let mut world = crate::common::World::example();
    world.tenant.metadata.namespace = Some(ns.into());
    let status = world.run().status;
    let operator = |status: &bindery_operator::crd::AgentTenantStatus| {
        let body = bindery_operator::controller::status_apply(status);
        let tenants = tenants.clone();
        async move {
            tenants
                .patch_status(
                    "acme",
                    &PatchParams::apply(bindery_operator::names::FIELD_MANAGER).force(),
                    &Patch::Apply(body),
                )
                .await
                .expect("the operator's status apply")
        }
    };
    let row = |used: f64| {
        let r = bindery_operator::crd::BudgetStatus {
            name: "daily".into(),
            agent: "invoices".into(),
            meter: "tokens".into(),
            used,
            limit: 200000.0,
            per: "24h".into(),
            on_exceed: Default::default(),
            exhausted: false,
            measured_at: "2026-11-29T12:00:00Z".into(),
        };
        json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "AgentTenant",
               "status": {"budgets": [r], "budgetSummary": [r.summary()]}})
    };
    let sidecar = |used: f64| {
        let tenants = tenants.clone();
        async move {
            // Not forced: a conflict with the operator would fail here.
            tenants
                .patch_status(
                    "acme",
                    &PatchParams::apply("bindery-sidecar"),
                    &Patch::Apply(row(used)),
                )
                .await
                .expect("the agent server's status apply")
        }
    };
    operator(&status).await;
    sidecar(1200.0).await;
    let mut later = status.clone();
    later.params_bound = Some("1/2".into());
    let t = operator(&later).await;
    let s = t.status.as_ref().unwrap();
    assert_eq!(s.params_bound.as_deref(), Some("1/2"));
    assert_eq!(s.budgets.len(), 1, "the operator kept the rows: {s:?}");
    assert_eq!(s.budgets[0].used, 1200.0);
    assert_eq!(
        s.budget_summary,
        ["daily (agent invoices): 1200 of 200000 tokens per 24h, 0%"]
    );
    let t = sidecar(5000.0).await;
    let s = t.status.as_ref().unwrap();
    assert_eq!(s.budgets[0].used, 5000.0);
    assert_eq!(s.params_bound.as_deref(), Some("1/2"), "{s:?}");
    assert_eq!(s.conditions.len(), status.conditions.len(), "{s:?}");
    // Who owns what: the rows are the agent server's alone.
    let owners = |field: &str| -> Vec<String> {
        t.managed_fields()
            .iter()
            .filter(|m| {
                m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0["f:status"].get(field).is_some())
            })
            .filter_map(|m| m.manager.clone())
            .collect()
    };
    assert_eq!(owners("f:budgets"), ["bindery-sidecar"]);
    assert_eq!(owners("f:budgetSummary"), ["bindery-sidecar"]);
    assert_eq!(owners("f:paramsBound"), ["bindery-operator"]);
}

/// An Agent whose `confirm` selectors carry a `when` is accepted, and
/// the API server keeps each condition as written (the schema has the
/// field: nothing is pruned), agent-level and in a toolbox. One that does
/// not compile is accepted too: the tenant's `AgentValid` says so, not the
/// schema. One over 4096 characters is refused.
#[tokio::test]
async fn the_api_server_keeps_a_confirm_condition_as_written() {
    let plane = plane();
    let ns = "real-confirm";
    let admin = namespace(ns).await;
    let agents = Api::<Agent>::namespaced(admin, ns);
    let with_when = |name: &str, when: &str| {
        let mut agent = yaml("examples/k8s/agent.yaml");
        agent["metadata"]["name"] = json!(name);
        agent["spec"]["confirm"] = json!([{"tool": "bash_query-invoices", "when": when}]);
        agent["spec"]["toolboxes"][0]["bash"]["confirm"] =
            json!([{"tool": "query-invoices", "when": when}]);
        agent
    };
    for (name, when) in [
        ("compiles", "args.amount > 100"),
        ("does-not-compile", "args.amount > > 100"),
    ] {
        let agent: Agent = serde_json::from_value(with_when(name, when)).unwrap();
        agents
            .create(&PostParams::default(), &agent)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let stored: Value = serde_json::from_str(
            &plane.kubectl_ok(ADMIN, &["get", "agent", name, "-n", ns, "-o", "json"]),
        )
        .unwrap();
        assert_eq!(
            stored["spec"]["confirm"],
            json!([{"tool": "bash_query-invoices", "when": when}]),
            "{name}: {stored:#}"
        );
        assert_eq!(
            stored["spec"]["toolboxes"][0]["bash"]["confirm"],
            json!([{"tool": "query-invoices", "when": when}]),
            "{name}: {stored:#}"
        );
    }
    let (code, message) = refused(&agents, with_when("too-long", &"x".repeat(4097))).await;
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec.confirm[0].when"), "{message}");
}

#[tokio::test]
async fn kubectl_get_agenttenants_shows_the_printer_columns() {
    let plane = plane();
    let admin = namespace("real-columns").await;
    let tenant: AgentTenant = serde_json::from_value(yaml("examples/k8s/tenant.yaml")).unwrap();
    Api::<AgentTenant>::namespaced(admin, "real-columns")
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let out = plane.kubectl_ok(ADMIN, &["get", "agenttenants", "-n", "real-columns"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    // The cells sit under their headers; an empty one (no status yet:
    // Ready and Params) is blank.
    let header = lines[0];
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || header.as_bytes()[i - 1] == b' '))
        .map(|(i, _)| i)
        .collect();
    let cells = |line: &str| -> Vec<String> {
        starts
            .iter()
            .enumerate()
            .map(|(n, &start)| {
                let end = starts
                    .get(n + 1)
                    .copied()
                    .unwrap_or(line.len())
                    .min(line.len());
                line.get(start.min(end)..end)
                    .unwrap_or("")
                    .trim()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        cells(header),
        ["NAME", "AGENT", "READY", "PARAMS", "AGE"],
        "{out}"
    );
    let row = cells(lines[1]);
    assert_eq!(row[..4], ["acme", "invoices", "", ""], "{out}");
    assert!(row[4].ends_with('s'), "AGE is a duration: {out}");
}

#[tokio::test]
async fn server_side_apply_by_two_managers_conflicts_until_forced() {
    let admin = namespace("real-ssa").await;
    let tenants = Api::<AgentTenant>::namespaced(admin, "real-ssa");
    let apply = |ttl: &str| {
        json!({
            "apiVersion": "bindery.dev/v1alpha1",
            "kind": "AgentTenant",
            "metadata": {"name": "acme"},
            "spec": {"agentRef": {"name": "invoices"}, "liveSessionTtl": ttl},
        })
    };
    tenants
        .patch(
            "acme",
            &PatchParams::apply("platform-team"),
            &Patch::Apply(apply("30m")),
        )
        .await
        .expect("the first manager's apply");
    let err = tenants
        .patch(
            "acme",
            &PatchParams::apply("tenant-admin"),
            &Patch::Apply(apply("1h")),
        )
        .await
        .expect_err("a second manager setting the same field conflicts");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 409, "{status:?}");
            assert!(
                status.message.contains("conflict with \"platform-team\"")
                    && status.message.contains(".spec.liveSessionTtl"),
                "{status:?}"
            );
        }
        e => panic!("not an API error: {e}"),
    }
    // Same value, no conflict: both managers own the field.
    tenants
        .patch(
            "acme",
            &PatchParams::apply("tenant-admin"),
            &Patch::Apply(apply("30m")),
        )
        .await
        .expect("agreeing on a value is no conflict");
    let forced = tenants
        .patch(
            "acme",
            &PatchParams::apply("tenant-admin").force(),
            &Patch::Apply(apply("1h")),
        )
        .await
        .expect("a forced apply takes the field");
    assert_eq!(forced.spec.live_session_ttl.as_deref(), Some("1h"));
    let owners: Vec<String> = forced
        .managed_fields()
        .iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0["f:spec"].get("f:liveSessionTtl").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(owners, ["tenant-admin"]);
}

#[tokio::test]
async fn the_operator_chart_rbac_lets_its_account_list_and_watch_and_the_audit_shows_it() {
    let plane = plane();
    let ns = "real-rbac";
    let admin = namespace(ns).await;
    if Api::<Namespace>::all(admin.clone())
        .get_opt(OPERATOR_NAMESPACE)
        .await
        .unwrap()
        .is_none()
    {
        let n: Namespace =
            serde_json::from_value(json!({"metadata": {"name": OPERATOR_NAMESPACE}})).unwrap();
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &n)
            .await
            .unwrap();
    }
    // The chart's ServiceAccount and RBAC (cluster-wide: no watchNamespaces),
    // nothing else of it, applied as a platform team would.
    let rendered = Render::new("charts/bindery-operator", "bindery-operator")
        .namespace(OPERATOR_NAMESPACE)
        .template(&[])
        .unwrap_or_else(|e| panic!("helm template: {e}"));
    let identity: Vec<String> = documents(&rendered)
        .into_iter()
        .filter(|d| {
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
            ]
            .iter()
            .any(|k| d["kind"] == *k)
        })
        .map(|d| serde_yaml::to_string(&d).unwrap())
        .collect();
    let account = ControlPlane::service_account_user(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT);
    assert!(
        identity
            .iter()
            .any(|d| d.contains(&format!("name: {OPERATOR_ACCOUNT}"))),
        "the chart's ServiceAccount is not {OPERATOR_ACCOUNT}:\n{}",
        identity.join("---\n")
    );
    let file =
        std::env::temp_dir().join(format!("bindery-operator-rbac-{}.yaml", std::process::id()));
    std::fs::write(&file, identity.join("---\n")).unwrap();
    let out = plane.kubectl_ok(ADMIN, &["apply", "-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert!(
        out.contains("clusterrolebinding.rbac.authorization.k8s.io/bindery-operator"),
        "{out}"
    );

    let operator = plane.client(&account).await;
    let agents = Api::<Agent>::namespaced(operator.clone(), ns);
    let tenants = Api::<AgentTenant>::namespaced(operator.clone(), ns);
    // RBAC is evaluated as bindings land: wait until the account may list.
    eventually_or(
        "the operator to be allowed to list Agents",
        WAIT,
        async || {
            Api::<Agent>::all(operator.clone())
                .list(&Default::default())
                .await
                .map(drop)
                .map_err(|e| format!("the operator still cannot list Agents: {e}"))
        },
    )
    .await;
    tenants
        .list(&Default::default())
        .await
        .expect("list AgentTenants");

    // A watch sees an Agent the administrator creates.
    let mut events = tenants
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .expect("watch AgentTenants")
        .boxed();
    let agent: Agent = serde_json::from_value(yaml("examples/k8s/agent.yaml")).unwrap();
    Api::<Agent>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &agent)
        .await
        .unwrap();
    let tenant: AgentTenant = serde_json::from_value(yaml("examples/k8s/tenant.yaml")).unwrap();
    Api::<AgentTenant>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let seen = loop {
        match events.try_next().await.expect("the watch goes on") {
            Some(WatchEvent::Added(t)) => break t.name_any(),
            Some(WatchEvent::Error(e)) => panic!("watch error: {e:?}"),
            Some(_) => continue,
            None => panic!("the watch ended before the tenant was added"),
        }
    };
    assert_eq!(seen, "acme");
    drop(events);
    let listed = agents.list(&Default::default()).await.expect("list Agents");
    assert_eq!(
        listed
            .items
            .iter()
            .map(|a| a.name_any())
            .collect::<Vec<_>>(),
        ["invoices"]
    );

    // What the chart does not grant is refused: the operator never deletes
    // a Secret, and reads Agents by list and watch only.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "billing"}, "stringData": {"token": "t"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let forbidden = |r: Result<_, kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("expected 403, got {other:?}"),
    };
    let m = forbidden(
        Api::<Secret>::namespaced(operator.clone(), ns)
            .delete("billing", &DeleteParams::default())
            .await
            .map(|_| ()),
    );
    assert!(
        m.contains(&account) && m.contains("cannot delete resource \"secrets\""),
        "{m}"
    );
    let m = forbidden(agents.get("invoices").await.map(|_| ()));
    assert!(m.contains("cannot get resource \"agents\""), "{m}");

    // The audit log: the account's requests, with the authorizer's decision.
    let want = [
        ("list", "agents", "allow"),
        ("list", "agenttenants", "allow"),
        ("watch", "agenttenants", "allow"),
        ("delete", "secrets", "forbid"),
        ("get", "agents", "forbid"),
    ];
    eventually_or(
        "the account's requests in the audit log",
        WAIT,
        async || {
            let audit = plane.audit();
            let missing: Vec<_> = want
                .iter()
                .filter(|(verb, resource, decision)| {
                    !audit.iter().any(|e| {
                        e["user"]["username"] == account.as_str()
                            && e["verb"] == *verb
                            && e["objectRef"]["resource"] == *resource
                            && e["objectRef"]["namespace"] == ns
                            && e["annotations"]["authorization.k8s.io/decision"] == *decision
                            && e["level"] == "Metadata"
                    })
                })
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            Err(format!(
                "the audit log lacks {missing:?}; the account's entries:\n{:#?}",
                audit
                    .iter()
                    .filter(|e| e["user"]["username"] == account.as_str())
                    .collect::<Vec<_>>()
            ))
        },
    )
    .await;
}

/// What `bindery_operator::key_names` relies on: a metadata-only read of a
/// Secret names its keys (in `managedFields`), however it was written, and
/// names them again once they change; a cleared record names none.
#[tokio::test]
async fn a_secrets_metadata_names_its_keys_however_it_was_written() {
    let ns = "secret-key-names";
    let admin = namespace(ns).await;
    let secrets = Api::<Secret>::namespaced(admin.clone(), ns);
    let dir = tempfile::tempdir().unwrap();
    let kubectl = |args: &[&str]| {
        let mut all = vec!["-n", ns];
        all.extend_from_slice(args);
        plane().kubectl_ok(ADMIN, &all)
    };
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let create = async |body: Value| {
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap();
    };
    // The names from the metadata against the names of the whole Secret.
    let names = async |name: &str| {
        let meta = secrets.get_metadata(name).await.unwrap().metadata;
        eprintln!(
            "DUMP {name}: {}",
            serde_json::to_string(&meta.managed_fields).unwrap()
        );
        let whole = secrets.get(name).await.unwrap();
        let keys: Vec<String> = whole.data.unwrap_or_default().into_keys().collect();
        (
            bindery_operator::key_names::secret_key_names(&meta).map(|k| k.into_iter().collect()),
            keys,
        )
    };
    let expect = async |name: &str, want: &[&str]| {
        let (from_meta, keys) = names(name).await;
        assert_eq!(keys, want, "{name}: the Secret's own keys");
        assert_eq!(from_meta, Some(keys), "{name}: the keys its metadata names");
    };

    create(json!({"metadata": {"name": "data"}, "data": {"a": "eA==", "b": "eA=="}})).await;
    expect("data", &["a", "b"]).await;
    create(json!({"metadata": {"name": "string-data"}, "stringData": {"token": "t"}})).await;
    expect("string-data", &["token"]).await;
    create(json!({"metadata": {"name": "both"}, "data": {"x": "eA=="}, "stringData": {"y": "y"}}))
        .await;
    expect("both", &["x", "y"]).await;
    kubectl(&[
        "create",
        "secret",
        "generic",
        "literal",
        "--from-literal=k1=v",
        "--from-literal=k2=v",
    ]);
    expect("literal", &["k1", "k2"]).await;
    let applied = |keys: &str| {
        format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: applied\nstringData:\n{keys}")
    };
    kubectl(&[
        "apply",
        "-f",
        &file("applied.yaml", &applied("  s: v\n  t: v\n")),
    ]);
    expect("applied", &["s", "t"]).await;
    // Client-side apply again without `s`: kubectl's three-way patch names
    // `stringData.s`, which the Secret never stores, so `s` stays.
    kubectl(&[
        "apply",
        "-f",
        &file("applied2.yaml", &applied("  t: v\n  u: v\n")),
    ]);
    expect("applied", &["s", "t", "u"]).await;
    // Server-side apply records the fields as applied: `stringData`, which
    // the Secret never stores and which stays on record once another
    // writer removes the key, so such a record names no key for certain.
    let ssa = |name: &str, field: &str, keys: &str| {
        let text =
            format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n{field}:\n{keys}");
        kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &file(&format!("{name}.yaml"), &text),
        ]);
    };
    ssa("ssa-string-data", "stringData", "  p: v\n");
    let (from_meta, keys) = names("ssa-string-data").await;
    assert_eq!(keys, ["p"]);
    assert_eq!(
        from_meta, None,
        "a key applied as stringData is not known for certain"
    );
    ssa("ssa", "data", "  p: eA==\n");
    expect("ssa", &["p"]).await;

    // Another writer adds a key, a third removes one, the applier applies
    // another, a replace swaps them.
    secrets
        .patch(
            "ssa",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"q": "eA=="}})),
        )
        .await
        .unwrap();
    expect("ssa", &["p", "q"]).await;
    secrets
        .patch(
            "ssa",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([{"op": "remove", "path": "/data/p"}])).unwrap(),
            ),
        )
        .await
        .unwrap();
    expect("ssa", &["q"]).await;
    ssa("ssa", "data", "  r: eA==\n");
    expect("ssa", &["q", "r"]).await;
    let mut whole = secrets.get("data").await.unwrap();
    let data = whole.data.as_mut().unwrap();
    data.remove("a");
    data.insert("c".into(), k8s_openapi::ByteString(b"x".to_vec()));
    secrets
        .replace("data", &PostParams::default(), &whole)
        .await
        .unwrap();
    expect("data", &["b", "c"]).await;

    // A writer that clears the record: the names are unknown, not none.
    secrets
        .patch(
            "both",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"managedFields": [{}]}})),
        )
        .await
        .unwrap();
    let (from_meta, keys) = names("both").await;
    assert_eq!(keys, ["x", "y"]);
    assert_eq!(from_meta, None, "a cleared record names no key");
}

#[tokio::test]
async fn the_controller_manager_rolls_out_a_deployment_and_collects_its_garbage() {
    let ns = "real-controllers";
    let admin = namespace(ns).await;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]},
            },
        },
    }))
    .unwrap();
    let deployments = Api::<Deployment>::namespaced(admin.clone(), ns);
    let created = deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let replica_sets = Api::<ReplicaSet>::namespaced(admin.clone(), ns);
    let pods = Api::<Pod>::namespaced(admin.clone(), ns);
    let owned_by = |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
                    uid: &str| {
        refs.iter()
            .any(|r| r.uid == uid && r.controller == Some(true))
    };
    // The deployment controller makes a ReplicaSet; the replicaset
    // controller a Pod (Pending: no scheduler, no kubelet), once the
    // serviceaccount controller has made the namespace's `default`.
    let rs = eventually("the Deployment's ReplicaSet", WAIT, async || {
        let list = replica_sets.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .find(|rs| owned_by(rs.owner_references(), created.uid().as_deref().unwrap()))
    })
    .await;
    let pod = eventually("the ReplicaSet's Pod", WAIT, async || {
        let list = pods.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .find(|p| owned_by(p.owner_references(), rs.uid().as_deref().unwrap()))
    })
    .await;
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Pending"));

    // Deleting the Deployment in the background: the garbage collector
    // deletes what it owned, and what that owned.
    deployments
        .delete(
            "web",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    eventually(
        "the garbage collector to delete the ReplicaSet and its Pod",
        WAIT,
        async || {
            let sets = replica_sets.list(&ListParams::default()).await.unwrap();
            let left = pods.list(&ListParams::default()).await.unwrap();
            (sets.items.is_empty()
                && left
                    .items
                    .iter()
                    .all(|p| p.metadata.deletion_timestamp.is_some()))
            .then_some(())
        },
    )
    .await;
}
