//! The Helm charts (`charts/`) and the images (`*/Dockerfile`): the real
//! helm lints and renders both charts with their default values and every
//! example values file; every rendered manifest validates against the
//! Kubernetes schemas (`kubernetes-validate --strict`) and every custom
//! resource against our CRDs; the values schema refuses malformed
//! parameter rows with a readable message; and, against the real control
//! plane (installed with `helm install`), the operator reconciles tenants
//! installed from the tenant chart, as the chart's ServiceAccount, and its
//! RBAC grants exactly what the operator asked for (the API server's
//! audit). The tenants' pods run on a real node in `tests/tests/node/`.
//!
//! Needs helm (`tests/helm/install-helm.sh`), the control plane
//! (`tests/control-plane/build.sh`) and the Python tools of
//! `tests/requirements.txt`; `tests/setup.sh` installs them all.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bindery_tests::control_plane::{Audited, ControlPlane, Identity, ADMIN};
use bindery_tests::eventually::eventually_or_blocking;
use bindery_tests::helm::{
    both, documents, id, kubernetes_validate, operator_binary, repo_path, repo_root, Render,
};
use serde_json::{json, Map, Value};

const OPERATOR: &str = "charts/bindery-operator";
const TENANT: &str = "charts/bindery-tenant";
/// Kubernetes versions the built-in kinds are validated against: the
/// oldest Bindery supports and the newest kubernetes-validate knows.
const KUBE_VERSIONS: &[&str] = &["1.33.0", "1.37.0"];
/// API groups of custom resources kubernetes-validate has no schema for.
const CUSTOM_GROUPS: &[&str] = &["bindery.dev", "monitoring.coreos.com"];

/// Every rendering the tests check: each chart with its default values and
/// with each values file of the examples and of tests/charts.
fn renders() -> Vec<Render> {
    vec![
        Render::new(OPERATOR, "bindery").namespace("bindery-system"),
        Render::new(OPERATOR, "bindery")
            .namespace("bindery-system")
            .values("tests/charts/operator-watch-namespaces.yaml"),
        Render::new(OPERATOR, "bindery")
            .namespace("bindery-system")
            .values("tests/charts/operator-ha.yaml"),
        Render::new(TENANT, "acme"),
        Render::new(TENANT, "acme").values("examples/k8s/acme-values.yaml"),
        Render::new(TENANT, "globex").values("examples/k8s/globex-values.yaml"),
        Render::new(TENANT, "initech").values("tests/charts/tenant-inline-agent.yaml"),
        Render::new(TENANT, "acme").values("tests/charts/tenant-postgres.yaml"),
        Render::new(TENANT, "acme").values("tests/charts/tenant-network-policy.yaml"),
        Render::new(TENANT, "hooli").values("tests/charts/tenant-approval-webhook.yaml"),
        Render::new(TENANT, "acme").values("tests/charts/tenant-limits.yaml"),
    ]
}

fn render(r: &Render) -> String {
    r.template(&[])
        .unwrap_or_else(|e| panic!("helm template {r:?} failed:\n{e}"))
}

fn render_docs(r: &Render) -> Vec<Value> {
    documents(&render(r))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "one {kind} expected: {found:#?}");
    found[0]
}

#[test]
fn the_operator_charts_crds_are_the_repositorys_byte_for_byte() {
    let names = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let repo = repo_root().join("crds");
    let chart = repo_root().join(OPERATOR).join("crds");
    assert_eq!(names(&chart), names(&repo), "the same files");
    for name in names(&repo) {
        let (a, b) = (
            std::fs::read(repo.join(&name)).unwrap(),
            std::fs::read(chart.join(&name)).unwrap(),
        );
        assert!(
            a == b,
            "{OPERATOR}/crds/{name} differs from crds/{name}: cp crds/*.yaml {OPERATOR}/crds/"
        );
    }
}

#[test]
fn both_charts_lint_strictly_with_every_values_file() {
    for r in renders() {
        if let Err(out) = r.lint() {
            panic!("helm lint --strict {r:?}:\n{out}");
        }
    }
}

#[test]
fn every_rendered_manifest_validates_against_the_kubernetes_schemas() {
    for r in renders() {
        let yaml = render(&r);
        let kinds: BTreeSet<String> = documents(&yaml)
            .iter()
            .map(|d| d["kind"].as_str().unwrap_or("?").to_string())
            .collect();
        match kubernetes_validate(&yaml, KUBE_VERSIONS, CUSTOM_GROUPS) {
            Ok(report) => {
                // Every built-in kind was checked, not skipped.
                for kind in &kinds {
                    let custom =
                        ["Agent", "AgentTenant", "ServiceMonitor"].contains(&kind.as_str());
                    assert!(
                        custom
                            || report
                                .contains(&format!("passed for resource {}/", kind.to_lowercase())),
                        "{r:?}: no {kind} validated:\n{report}"
                    );
                }
            }
            Err(report) => panic!("{r:?} does not validate:\n{report}\n---\n{yaml}"),
        }
    }
}

#[test]
fn every_rendered_custom_resource_validates_against_our_crds() {
    let crds = CrdSchemas::load();
    let mut checked = BTreeSet::new();
    for r in renders() {
        for doc in render_docs(&r).iter().filter(|d| crds.covers(d)) {
            if let Err(e) = crds.validate(doc) {
                panic!("{r:?}: {e}");
            }
            checked.insert(id(doc));
        }
    }
    assert!(checked.contains("AgentTenant/acme"), "{checked:?}");
    assert!(checked.contains("Agent/initech"), "{checked:?}");
    // The examples are custom resources too.
    for f in ["examples/k8s/agent.yaml", "examples/k8s/tenant.yaml"] {
        for doc in documents(&std::fs::read_to_string(repo_path(f)).unwrap()) {
            crds.validate(&doc).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
    }
}

#[test]
fn the_crd_schemas_refuse_unknown_fields_and_wrong_types() {
    let crds = CrdSchemas::load();
    let tenant = |spec: Value| {
        json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "AgentTenant",
               "metadata": {"name": "t"}, "spec": spec})
    };
    assert!(crds
        .validate(&tenant(json!({"agentRef": {"name": "a"}})))
        .is_ok());
    for (spec, says) in [
        (
            json!({"agentRef": {"name": "a"}, "replicaz": 2}),
            "replicaz",
        ),
        (json!({"parameters": []}), "agentRef"),
        (json!({"agentRef": {"name": "a"}, "replicas": "two"}), "two"),
        (
            json!({"agentRef": {"name": "a"}, "parameters": [{"name": "t", "value": 1, "pinnned": true}]}),
            "pinnned",
        ),
        // The sidecar refuses a keep-alive of zero: so does the API server.
        (
            json!({"agentRef": {"name": "a"}, "eventsKeepAlive": "0s"}),
            "0s",
        ),
        (
            json!({"agentRef": {"name": "a"}, "eventsKeepAlive": "15"}),
            "15",
        ),
    ] {
        let err = crds
            .validate(&tenant(spec.clone()))
            .expect_err(&spec.to_string());
        assert!(err.contains(says), "{spec}: {err}");
    }
    // `nullable` admits null, as in OpenAPI.
    let agent = json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": "a"},
        "spec": {"model": {"url": "http://m", "name": "m", "apiKey": null}, "systemPrompt": "p"}});
    crds.validate(&agent).unwrap();
    let wrong_version =
        json!({"apiVersion": "bindery.dev/v1", "kind": "Agent", "metadata": {"name": "a"}});
    assert!(crds.validate(&wrong_version).is_err());
}

/// A values file with one malformed parameter row (the second), and what
/// helm says about it. The messages are helm 4's (its JSON Schema
/// validator), the helm install-helm.sh installs.
const MALFORMED_ROWS: &[(&str, &str, &[&str])] = &[
    (
        "both value and valueFrom",
        "{name: billing_token, value: x, valueFrom: {secretKeyRef: {name: acme-billing, key: token}}}",
        &["at '/parameters/1': additional properties 'valueFrom' not allowed"],
    ),
    (
        "neither value nor valueFrom",
        "{name: billing_token, pinned: true}",
        &[
            "at '/parameters/1': 'anyOf' failed",
            "at '/parameters/1': missing property 'value'",
            "at '/parameters/1': missing property 'valueFrom'",
        ],
    ),
    (
        "a name that is no parameter name",
        "{name: Billing-Token, value: x}",
        &["at '/parameters/1/name': 'Billing-Token' does not match pattern '^[a-z][a-z0-9_]*$'"],
    ),
    (
        "no name",
        "{value: x}",
        &["at '/parameters/1': missing property 'name'"],
    ),
    (
        "an unknown key",
        "{name: billing_token, value: x, pinnned: true}",
        &["at '/parameters/1': additional properties 'pinnned' not allowed"],
    ),
    (
        "an unknown key beside valueFrom",
        "{name: billing_token, valueFrom: {secretKeyRef: {name: acme-billing, key: token}}, secret: true}",
        &["at '/parameters/1': additional properties 'secret' not allowed"],
    ),
    (
        "a secretKeyRef and a configMapKeyRef",
        "{name: billing_token, valueFrom: {secretKeyRef: {name: a, key: b}, configMapKeyRef: {name: c, key: d}}}",
        &["at '/parameters/1/valueFrom': additional properties 'configMapKeyRef' not allowed"],
    ),
    (
        "a valueFrom with no reference",
        "{name: billing_token, valueFrom: {}}",
        &["at '/parameters/1/valueFrom': 'anyOf' failed", "missing property 'secretKeyRef'"],
    ),
    (
        "a secretKeyRef without its key",
        "{name: billing_token, valueFrom: {secretKeyRef: {name: acme-billing}}}",
        &["at '/parameters/1/valueFrom/secretKeyRef': missing property 'key'"],
    ),
    (
        "pinned that is no boolean",
        "{name: billing_token, value: x, pinned: sure}",
        &["at '/parameters/1/pinned': got string, want boolean"],
    ),
];

#[test]
fn malformed_parameter_rows_are_refused_with_readable_messages() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (what, row, messages)) in MALFORMED_ROWS.iter().enumerate() {
        let file = dir.path().join(format!("malformed-{i}.yaml"));
        std::fs::write(
            &file,
            format!(
                "agentRef: invoices\nparameters:\n  - {{name: tenant, value: acme-corp, pinned: true}}\n  - {row}\n"
            ),
        )
        .unwrap();
        let r = Render::new(TENANT, "acme").values(file.display().to_string());
        let template = r
            .template(&[])
            .expect_err(&format!("{what}: helm template accepted {row}"));
        let lint = r
            .lint()
            .expect_err(&format!("{what}: helm lint accepted {row}"));
        for out in [&template, &lint] {
            assert!(
                out.contains("values don't meet the specifications of the schema"),
                "{what}: not the values schema:\n{out}"
            );
            for m in *messages {
                assert!(out.contains(m), "{what}: {m:?} missing from:\n{out}");
            }
        }
    }
    // The same rows, well formed, pass.
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "agentRef: invoices\nparameters:\n  - {name: tenant, value: {nested: [1, true]}, pinned: false}\n  - {name: region, valueFrom: {configMapKeyRef: {name: settings, key: region}}}\n",
    )
    .unwrap();
    Render::new(TENANT, "acme")
        .values(good.display().to_string())
        .template(&[])
        .unwrap();
}

#[test]
fn the_tenant_chart_refuses_other_mistakes_with_readable_messages() {
    let both_agents = Render::new(TENANT, "acme")
        .set("agentRef=invoices")
        .set("agent.systemPrompt=hi")
        .template(&[])
        .unwrap_err();
    assert!(
        both_agents.contains(
            "give agentRef (the name of an existing Agent, here \"invoices\") or an inline agent"
        ),
        "{both_agents}"
    );
    // A release name helm accepts but a Service cannot have.
    let bad_name = Render::new(TENANT, "9acme").template(&[]).unwrap_err();
    assert!(
        bad_name.contains(
            "the tenant name \"9acme\" (the release name, or nameOverride) must be a DNS label"
        ),
        "{bad_name}"
    );
    let bad_override = Render::new(TENANT, "acme")
        .set("nameOverride=Acme_Corp")
        .template(&[])
        .unwrap_err();
    assert!(
        bad_override.contains("at '/nameOverride': 'Acme_Corp' does not match pattern"),
        "{bad_override}"
    );
    let typo = Render::new(TENANT, "acme")
        .set("tool=x")
        .template(&[])
        .unwrap_err();
    assert!(
        typo.contains("additional properties 'tool' not allowed"),
        "{typo}"
    );
    let no_pause = Render::new(TENANT, "acme")
        .set("agentRef=invoices")
        .set("eventsKeepAlive=0s")
        .template(&[])
        .unwrap_err();
    assert!(
        no_pause.contains("at '/eventsKeepAlive': '0s' does not match pattern"),
        "{no_pause}"
    );
    // The MCP client token is a Secret key, never a value; both halves.
    let inline = Render::new(TENANT, "acme")
        .set("mcpClientTokenSecretRef=mcp-client-3b9d41")
        .template(&[])
        .unwrap_err();
    assert!(
        inline.contains("at '/mcpClientTokenSecretRef': got string, want object"),
        "{inline}"
    );
    assert!(!inline.contains("mcp-client-3b9d41"), "{inline}");
    let no_key = Render::new(TENANT, "acme")
        .set("mcpClientTokenSecretRef.name=acme-mcp")
        .template(&[])
        .unwrap_err();
    assert!(
        no_key.contains("at '/mcpClientTokenSecretRef': missing property 'key'"),
        "{no_key}"
    );
    // So is the approver token.
    let inline = Render::new(TENANT, "acme")
        .set("approverTokenSecretRef=approver-9a27c4")
        .template(&[])
        .unwrap_err();
    assert!(
        inline.contains("at '/approverTokenSecretRef': got string, want object"),
        "{inline}"
    );
    assert!(!inline.contains("approver-9a27c4"), "{inline}");
    let no_key = Render::new(TENANT, "acme")
        .set("approverTokenSecretRef.name=acme-approver")
        .template(&[])
        .unwrap_err();
    assert!(
        no_key.contains("at '/approverTokenSecretRef': missing property 'key'"),
        "{no_key}"
    );
    let typo = Render::new(OPERATOR, "bindery")
        .set("replica=2")
        .template(&[])
        .unwrap_err();
    assert!(
        typo.contains("additional properties 'replica' not allowed"),
        "{typo}"
    );
    let zero = Render::new(OPERATOR, "bindery")
        .set("replicas=0")
        .template(&[])
        .unwrap_err();
    assert!(
        zero.contains("at '/replicas': minimum: got 0, want 1"),
        "{zero}"
    );
}

#[test]
fn the_acme_values_render_the_acme_example_tenant() {
    let docs = render_docs(&Render::new(TENANT, "acme").values("examples/k8s/acme-values.yaml"));
    let tenant = one(&docs, "AgentTenant");
    let example =
        &documents(&std::fs::read_to_string(repo_path("examples/k8s/tenant.yaml")).unwrap())[0];
    assert_eq!(tenant["metadata"]["name"], "acme");
    assert_eq!(tenant["metadata"]["namespace"], "shop");
    for field in [
        "agentRef",
        "parameters",
        "tools",
        "liveSessionTtl",
        "maxLiveSessions",
        "eventsKeepAlive",
    ] {
        assert_eq!(
            tenant["spec"][field], example["spec"][field],
            "spec.{field}"
        );
    }
    assert!(
        of_kind(&docs, "Agent").is_empty(),
        "agentRef: no Agent of its own"
    );
    // No secret value in the values files or what they render.
    let rendered = render(&Render::new(TENANT, "acme").values("examples/k8s/acme-values.yaml"));
    for canary in ["demo-acme-billing-token", "demo-globex-billing-token"] {
        assert!(!rendered.contains(canary));
    }

    let globex =
        render_docs(&Render::new(TENANT, "globex").values("examples/k8s/globex-values.yaml"));
    let g = one(&globex, "AgentTenant");
    assert_eq!(g["spec"]["agentRef"]["name"], "invoices");
    assert_eq!(
        g["spec"]["parameters"],
        json!([
            {"name": "tenant", "value": "globex", "pinned": true},
            {"name": "billing_token", "valueFrom": {"secretKeyRef": {"name": "globex-billing", "key": "token"}}}
        ])
    );
    let secret = &documents(
        &std::fs::read_to_string(repo_path("examples/k8s/globex-billing-secret.yaml")).unwrap(),
    )[0];
    assert_eq!(secret["metadata"]["name"], "globex-billing");
    assert!(secret["stringData"]["token"].is_string());
}

#[test]
fn the_tenants_per_user_limits_are_passed_as_written() {
    let docs = render_docs(&Render::new(TENANT, "acme").values("tests/charts/tenant-limits.yaml"));
    let spec = &one(&docs, "AgentTenant")["spec"];
    assert_eq!(spec["perUser"], json!({"maxConcurrentRuns": 2}));
    assert_eq!(
        spec["rateLimits"],
        json!({"requestsPerMinute": 600, "perUserRequestsPerMinute": 60,
               "tools": [{"tool": "openapi_billing_*", "callsPerMinute": 10, "perUser": true}]})
    );
    assert_eq!(spec["budgets"][0]["perUser"], true);
    // Left out, neither is rendered.
    let plain = render_docs(&Render::new(TENANT, "acme"));
    let spec = &one(&plain, "AgentTenant")["spec"];
    assert!(spec.get("perUser").is_none() && spec.get("rateLimits").is_none());
}

#[test]
fn an_inline_agent_is_rendered_as_an_agent_named_like_the_tenant() {
    let docs = render_docs(
        &Render::new(TENANT, "initech").values("tests/charts/tenant-inline-agent.yaml"),
    );
    let agent = one(&docs, "Agent");
    let tenant = one(&docs, "AgentTenant");
    assert_eq!(agent["metadata"]["name"], "initech");
    assert_eq!(tenant["spec"]["agentRef"]["name"], "initech");
    assert_eq!(agent["spec"]["model"]["name"], "local-model");
    let spec = &tenant["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(spec["image"], "registry.example.com/bindery-sidecar:0.1.0");
    assert_eq!(
        spec["store"],
        json!({"pvcSize": "2Gi", "storageClassName": "fast"})
    );
    assert_eq!(
        spec["tools"],
        json!({"configMapRef": {"name": "orders-tools"}})
    );
    assert_eq!(
        spec["ownerTokenSecretRef"],
        json!({"name": "initech-owner", "key": "token"})
    );
    assert_eq!(
        spec["mcpClientTokenSecretRef"],
        json!({"name": "initech-mcp", "key": "token"})
    );
    assert_eq!(
        spec["approverTokenSecretRef"],
        json!({"name": "initech-approver", "key": "token"})
    );
    assert_eq!(spec["publicUrl"], "https://initech.agents.example.com");
    assert_eq!(spec["liveSessionTtl"], "1h30m");
    assert_eq!(spec["maxLiveSessions"], 5000);
    assert_eq!(spec["eventsKeepAlive"], "20s");
    assert_eq!(spec["resources"]["limits"]["memory"], "512Mi");
    assert_eq!(
        spec["podOverrides"]["nodeSelector"],
        json!({"pool": "agents"})
    );
    assert_eq!(
        spec["podOverrides"]["serviceAccountAnnotations"]["azure.workload.identity/client-id"],
        "0b1c2d3e-aaaa-bbbb-cccc-123456789abc"
    );
    assert_eq!(
        spec["podOverrides"]["labels"]["azure.workload.identity/use"],
        "true"
    );
    assert_eq!(
        spec["pricing"],
        json!([{"model": "local-model", "price": {"inputPerMillion": 0.2, "outputPerMillion": 0.8, "currency": "EUR"}}])
    );

    // Default values: the tenant runs the Agent named like it; no image,
    // replicas or anything else the operator defaults.
    let docs = render_docs(&Render::new(TENANT, "acme"));
    let tenant = one(&docs, "AgentTenant");
    assert_eq!(tenant["spec"], json!({"agentRef": {"name": "acme"}}));
    let docs = render_docs(&Render::new(TENANT, "acme").set("nameOverride=acme-eu"));
    assert_eq!(one(&docs, "AgentTenant")["metadata"]["name"], "acme-eu");
}

#[test]
fn a_postgres_store_is_a_secret_reference_and_excludes_the_sqlite_fields() {
    let docs =
        render_docs(&Render::new(TENANT, "acme").values("tests/charts/tenant-postgres.yaml"));
    let spec = &one(&docs, "AgentTenant")["spec"];
    assert_eq!(
        spec["store"],
        json!({"postgres": {"urlSecretRef": {"name": "acme-db", "key": "url"}}})
    );
    assert_eq!(spec["replicas"], 3);

    for extra in ["store.pvcSize=1Gi", "store.storageClassName=fast"] {
        let err = Render::new(TENANT, "acme")
            .values("tests/charts/tenant-postgres.yaml")
            .set(extra)
            .template(&[])
            .unwrap_err();
        assert!(
            err.contains("store.postgres keeps sessions in PostgreSQL: give it without store.pvcSize and store.storageClassName"),
            "{extra}: {err}"
        );
    }
    // More than one replica cannot share a claim.
    let err = Render::new(TENANT, "acme")
        .set("replicas=2")
        .set("store.pvcSize=1Gi")
        .template(&[])
        .unwrap_err();
    assert!(
        err.contains("replicas above 1 need a store they share (store.postgres): store.pvcSize holds one pod's SQLite file"),
        "{err}"
    );
    let no_key = Render::new(TENANT, "acme")
        .set("store.postgres.urlSecretRef.name=acme-db")
        .template(&[])
        .unwrap_err();
    assert!(
        no_key.contains("at '/store/postgres/urlSecretRef': missing property 'key'"),
        "{no_key}"
    );
    // A URL in the values is not a value the chart takes.
    let url = Render::new(TENANT, "acme")
        .set("store.postgres.url=postgres://u:pw@db/x")
        .template(&[])
        .unwrap_err();
    assert!(
        url.contains("additional properties 'url' not allowed"),
        "{url}"
    );
}

/// The restricted Pod Security Standard, on one container and its pod.
fn assert_restricted(pod_spec: &Value, what: &str) {
    let pod = &pod_spec["securityContext"];
    assert_eq!(pod["runAsNonRoot"], true, "{what}: {pod}");
    assert_eq!(
        pod["seccompProfile"]["type"], "RuntimeDefault",
        "{what}: {pod}"
    );
    assert!(
        pod["runAsUser"].as_i64().is_some_and(|u| u > 0),
        "{what}: {pod}"
    );
    for c in pod_spec["containers"].as_array().unwrap() {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}: {c}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}: {c}");
        assert_eq!(sc["runAsNonRoot"], true, "{what}: {c}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}: {c}");
        assert_eq!(
            sc["seccompProfile"]["type"], "RuntimeDefault",
            "{what}: {c}"
        );
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{what}: {c}"
        );
    }
}

fn operator_args(docs: &[Value]) -> Vec<String> {
    one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_operator_deployment_follows_the_values() {
    let docs = render_docs(&Render::new(OPERATOR, "bindery").namespace("bindery-system"));
    let deployment = one(&docs, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "ghcr.io/bindery-dev/bindery-operator:0.1.0");
    assert_eq!(
        operator_args(&docs),
        [
            "run",
            "--sidecar-image=ghcr.io/bindery-dev/bindery-sidecar:0.1.0",
            "--cluster-domain=cluster.local",
            "--metrics-listen=0.0.0.0:8080",
            "--log-format=json",
        ]
    );
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(
        deployment["spec"]["strategy"]["type"], "Recreate",
        "never two writers"
    );
    assert_restricted(pod, "the operator");
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "metrics"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "metrics"})
    );
    let env: Vec<(String, Value)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["valueFrom"]["fieldRef"]["fieldPath"].clone(),
            )
        })
        .collect();
    assert!(
        env.contains(&("POD_NAME".into(), json!("metadata.name"))),
        "{env:?}"
    );
    assert!(
        env.contains(&("POD_NAMESPACE".into(), json!("metadata.namespace"))),
        "{env:?}"
    );
    let service = one(&docs, "Service");
    assert_eq!(
        service["metadata"]["name"],
        "bindery-bindery-operator-metrics"
    );
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(
        service["spec"]["selector"], deployment["spec"]["selector"]["matchLabels"],
        "the Service selects the operator's pods"
    );
    assert!(of_kind(&docs, "ServiceMonitor").is_empty());
    assert_eq!(of_kind(&docs, "CustomResourceDefinition").len(), 2);

    let docs = render_docs(
        &Render::new(OPERATOR, "bindery")
            .namespace("bindery-system")
            .values("tests/charts/operator-watch-namespaces.yaml"),
    );
    let args = operator_args(&docs);
    assert_eq!(
        args[..3],
        ["run", "--namespace=shop", "--namespace=billing"]
    );
    assert!(!args.contains(&"--leader-elect".to_string()), "{args:?}");

    let docs = render_docs(
        &Render::new(OPERATOR, "bindery")
            .namespace("bindery-system")
            .values("tests/charts/operator-ha.yaml"),
    );
    let deployment = one(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert!(
        deployment["spec"]["strategy"].is_null(),
        "rolling: the leader hands over"
    );
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "ghcr.io/bindery-dev/bindery-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000"
    );
    let args = operator_args(&docs);
    for a in [
        "--sidecar-image=registry.example.com/mirror/bindery-sidecar:0.1.0-rc1",
        "--leader-elect",
        "--lease-name=bindery-leader",
        "--lease-duration=30",
        "--log-format=text",
    ] {
        assert!(args.contains(&a.to_string()), "{a} missing: {args:?}");
    }
    let monitor = one(&docs, "ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        one(&docs, "Service")["metadata"]["labels"]
            .as_object()
            .map(|l| {
                l.iter()
                    .filter(|(k, _)| {
                        ["app.kubernetes.io/name", "app.kubernetes.io/instance"]
                            .contains(&k.as_str())
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Map<_, _>>()
            })
            .map(Value::Object)
            .unwrap()
    );
}

#[test]
fn the_operator_binary_takes_every_flag_the_chart_passes() {
    let help = Command::new(operator_binary())
        .args(["run", "--help"])
        .output()
        .expect("bindery-operator runs");
    assert!(help.status.success(), "{}", both(&help));
    let help = String::from_utf8(help.stdout).unwrap();
    for values in [
        None,
        Some("tests/charts/operator-watch-namespaces.yaml"),
        Some("tests/charts/operator-ha.yaml"),
    ] {
        let mut r = Render::new(OPERATOR, "bindery").namespace("bindery-system");
        if let Some(v) = values {
            r = r.values(v);
        }
        for arg in operator_args(&render_docs(&r)).iter().skip(1) {
            let flag = arg.split('=').next().unwrap();
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{flag} is no flag of `bindery-operator run`:\n{help}"
            );
        }
    }
    // The chart's default sidecar image is the operator's own default.
    assert!(
        help.contains(
            "[env: BINDERY_SIDECAR_IMAGE=] [default: ghcr.io/bindery-dev/bindery-sidecar:0.1.0]"
        ) || help.contains("[default: ghcr.io/bindery-dev/bindery-sidecar:0.1.0]"),
        "{help}"
    );
}

type Grant = (String, String, String);

/// The (group, resource, verb) triples a Role or ClusterRole grants.
fn grants(role: &Value) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule.get("nonResourceURLs").is_none(), "{rule}");
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .unwrap_or_else(|| panic!("{k} in {rule}"))
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    assert!(g != "*" && r != "*" && v != "*", "a wildcard: {rule}");
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

fn binds(binding: &Value, role_kind: &str, role: &str, sa_namespace: &str) {
    assert_eq!(binding["roleRef"]["kind"], role_kind, "{binding}");
    assert_eq!(binding["roleRef"]["name"], role, "{binding}");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "bindery-bindery-operator", "namespace": sa_namespace}]),
        "{binding}"
    );
}

/// Where the operator's RBAC goes for each way of installing it, and that
/// each grants the same rules; which rules those are (exactly what the
/// operator asks for) is checked against the API server's audit by
/// `the_operator_reconciles_tenants_installed_from_the_tenant_chart`.
#[test]
fn the_operator_rbac_is_the_same_rules_in_each_scope() {
    let release_ns = "bindery-system";
    let base = || Render::new(OPERATOR, "bindery").namespace(release_ns);

    // All namespaces: one ClusterRole, no Role, no Lease.
    let docs = render_docs(&base());
    let role = one(&docs, "ClusterRole");
    let rules = grants(role);
    binds(
        one(&docs, "ClusterRoleBinding"),
        "ClusterRole",
        "bindery-bindery-operator",
        release_ns,
    );
    assert!(of_kind(&docs, "Role").is_empty() && of_kind(&docs, "RoleBinding").is_empty());
    assert_eq!(
        one(&docs, "ServiceAccount")["metadata"]["name"],
        "bindery-bindery-operator"
    );

    // Watched namespaces: a Role and RoleBinding in each, nothing cluster-wide.
    let docs = render_docs(&base().values("tests/charts/operator-watch-namespaces.yaml"));
    assert!(
        of_kind(&docs, "ClusterRole").is_empty() && of_kind(&docs, "ClusterRoleBinding").is_empty()
    );
    let roles = of_kind(&docs, "Role");
    let namespaces: BTreeSet<&str> = roles
        .iter()
        .map(|r| r["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(namespaces, BTreeSet::from(["shop", "billing"]));
    for role in roles {
        assert_eq!(grants(role), rules, "{role:#}");
    }
    let bindings = of_kind(&docs, "RoleBinding");
    assert_eq!(bindings.len(), 2);
    for b in bindings {
        binds(b, "Role", "bindery-bindery-operator", release_ns);
    }

    // Two replicas: the Lease, in the release namespace, by its name.
    let docs = render_docs(&base().values("tests/charts/operator-ha.yaml"));
    assert_eq!(grants(one(&docs, "ClusterRole")), rules);
    let lease_role = one(&docs, "Role");
    assert_eq!(lease_role["metadata"]["namespace"], release_ns);
    let leases: BTreeSet<_> = grants(lease_role)
        .into_iter()
        .map(|(g, r, _)| (g, r))
        .collect();
    assert_eq!(
        leases,
        BTreeSet::from([("coordination.k8s.io".into(), "leases".into())])
    );
    for rule in lease_role["rules"].as_array().unwrap() {
        let verbs = rule["verbs"].as_array().unwrap();
        if verbs.iter().any(|v| v == "get" || v == "update") {
            assert_eq!(rule["resourceNames"], json!(["bindery-leader"]), "{rule}");
        }
    }
    let binding = one(&docs, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], release_ns);
    binds(
        binding,
        "Role",
        "bindery-bindery-operator-leader-election",
        release_ns,
    );

    // rbac.create=false: bring your own.
    let docs = render_docs(&base().set("rbac.create=false"));
    for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert!(of_kind(&docs, kind).is_empty(), "{kind}");
    }
}

#[test]
fn the_tenant_test_hook_calls_readyz_in_a_restricted_pod() {
    let docs = render_docs(&Render::new(TENANT, "acme").values("examples/k8s/acme-values.yaml"));
    let pod = one(&docs, "Pod");
    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_restricted(spec, "the test pod");
    let c = &spec["containers"][0];
    let image = c["image"].as_str().unwrap();
    let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
    assert!(
        !tag.is_empty() && tag != "latest" && !tag.contains('/'),
        "pinned by tag: {image}"
    );
    let command: Vec<&str> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(command.first(), Some(&"curl"));
    assert_eq!(command.last(), Some(&"http://acme/readyz"));
    assert!(command.contains(&"--fail"), "{command:?}");
    // `helm template --skip-tests` leaves it out (what the e2e test applies).
    let skipped = Render::new(TENANT, "acme")
        .template(&["--skip-tests"])
        .unwrap();
    assert!(!skipped.contains("kind: Pod"));
}

/// The tenant's pods admit their own replicas on the peer port, and on the
/// session API only the clients the values name (and the chart's test
/// pod); the policy can be left out.
#[test]
fn the_tenant_network_policy_admits_its_replicas_and_the_named_clients_only() {
    let docs = render_docs(&Render::new(TENANT, "acme"));
    let policy = one(&docs, "NetworkPolicy");
    assert_eq!(policy["metadata"]["name"], "acme");
    let spec = &policy["spec"];
    let own = json!({"matchLabels": {"bindery.dev/tenant": "acme"}});
    assert_eq!(spec["podSelector"], own);
    assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    let rules = spec["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 2, "{rules:#?}");
    assert_eq!(rules[0]["from"], json!([{"podSelector": own}]));
    assert_eq!(
        rules[0]["ports"],
        json!([{"protocol": "TCP", "port": 8443}])
    );
    let tester = json!({"podSelector": {"matchLabels": {"bindery.dev/test-of": "acme"}}});
    assert_eq!(rules[1]["from"], json!([tester.clone()]));
    assert_eq!(
        rules[1]["ports"],
        json!([{"protocol": "TCP", "port": 8080}])
    );
    // The test pod carries the label the policy admits.
    let pod = one(&docs, "Pod");
    assert_eq!(pod["metadata"]["labels"]["bindery.dev/test-of"], "acme");

    let docs =
        render_docs(&Render::new(TENANT, "acme").values("tests/charts/tenant-network-policy.yaml"));
    let rules = &one(&docs, "NetworkPolicy")["spec"]["ingress"];
    assert_eq!(
        rules[1]["from"],
        json!([
            tester,
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shop-backend"}},
             "podSelector": {"matchLabels": {"app": "checkout"}}},
            {"podSelector": {"matchLabels": {"app": "storefront"}}},
        ])
    );
    assert_eq!(rules[0]["ports"][0]["port"], 8443, "the peer rule stays");

    let docs = render_docs(&Render::new(TENANT, "acme").set("networkPolicy.enabled=false"));
    assert!(of_kind(&docs, "NetworkPolicy").is_empty());
    // A client that is not a NetworkPolicy peer is refused by the schema.
    let err = Render::new(TENANT, "acme")
        .set("networkPolicy.clients[0].app=checkout")
        .template(&[])
        .unwrap_err();
    assert!(err.contains("networkPolicy"), "{err}");
}

#[test]
fn the_notes_say_what_to_do_next() {
    let notes = Render::new(TENANT, "acme")
        .values("examples/k8s/acme-values.yaml")
        .notes();
    for line in [
        "kubectl -n shop describe agenttenant acme",
        "kubectl -n shop port-forward service/acme 8080:80",
        "kubectl -n shop get secret acme-owner-token -o jsonpath='{.data.token}' | base64 -d",
        "localhost:8080/v1/agents",
        "helm test acme -n shop",
    ] {
        assert!(notes.contains(line), "{line:?} missing from:\n{notes}");
    }
    let notes = Render::new(TENANT, "initech")
        .values("tests/charts/tenant-inline-agent.yaml")
        .notes();
    assert!(
        notes.contains("get secret initech-owner -o jsonpath='{.data.token}'"),
        "{notes}"
    );
    assert!(
        notes.contains("runs the Agent `initech` (defined by this release)"),
        "{notes}"
    );

    let notes = Render::new(OPERATOR, "bindery")
        .namespace("bindery-system")
        .notes();
    for line in [
        "watching every namespace",
        "kubectl apply -f examples/k8s/agent.yaml",
        "helm install acme charts/bindery-tenant -f examples/k8s/acme-values.yaml",
        "kubectl describe agenttenant acme",
    ] {
        assert!(notes.contains(line), "{line:?} missing from:\n{notes}");
    }
    let notes = Render::new(OPERATOR, "bindery")
        .namespace("bindery-system")
        .values("tests/charts/operator-ha.yaml")
        .notes();
    assert!(
        notes.contains("2 replicas elect a leader on the Lease bindery-system/bindery-leader"),
        "{notes}"
    );
}

/// A Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions(path: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_path(path)).unwrap();
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && current.is_empty()) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(t);
                let (op, rest) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((op.to_uppercase(), rest.trim().to_string()));
                current.clear();
            }
        }
    }
    out
}

/// `name = "..."` of the `[[bin]]` table of a crate's Cargo.toml.
fn bin_name(manifest: &str) -> String {
    let text = std::fs::read_to_string(repo_path(manifest)).unwrap();
    let bin = text.split("[[bin]]").nth(1).expect("a [[bin]] table");
    bin.lines()
        .find_map(|l| l.trim().strip_prefix("name = "))
        .expect("a bin name")
        .trim_matches('"')
        .to_string()
}

#[test]
fn the_dockerfiles_pin_their_bases_build_locked_and_run_as_non_root() {
    for (dockerfile, manifest, package) in [
        (
            "sidecar/Dockerfile",
            "sidecar/Cargo.toml",
            "bindery-sidecar",
        ),
        (
            "operator/Dockerfile",
            "operator/Cargo.toml",
            "bindery-operator",
        ),
    ] {
        let bin = bin_name(manifest);
        let steps = instructions(dockerfile);
        let mut stages = Vec::new();
        for (op, rest) in &steps {
            match op.as_str() {
                "FROM" => {
                    let words: Vec<&str> = rest.split_whitespace().collect();
                    let image = words[0];
                    let (name, tag) = match image.split_once('@') {
                        Some((_, digest)) => {
                            assert!(digest.starts_with("sha256:"), "{dockerfile}: {image}");
                            (image, "digest")
                        }
                        None => {
                            let (name, tag) = image.rsplit_once(':').unwrap_or((image, ""));
                            assert!(
                                !tag.is_empty() && !tag.contains('/'),
                                "{dockerfile}: {image} has no tag"
                            );
                            assert_ne!(tag, "latest", "{dockerfile}: {image}");
                            (name, tag)
                        }
                    };
                    assert!(!name.is_empty() && !tag.is_empty());
                    if let Some(alias) = words.iter().position(|w| w.eq_ignore_ascii_case("as")) {
                        stages.push(words[alias + 1].to_string());
                    }
                }
                "COPY" => {
                    if let Some(from) = rest
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("--from="))
                    {
                        assert!(
                            stages.contains(&from.to_string()),
                            "{dockerfile}: no stage {from}"
                        );
                    }
                }
                "RUN" if rest.contains("cargo build") => {
                    assert!(rest.contains("--locked"), "{dockerfile}: {rest}");
                    assert!(
                        rest.contains(&format!("-p {package} ")),
                        "{dockerfile}: {rest}"
                    );
                    assert!(
                        rest.contains(&format!("--bin {bin} ")),
                        "{dockerfile}: {rest}"
                    );
                    assert!(
                        rest.contains(&format!("target/release/{bin} ")),
                        "{dockerfile}: {rest}"
                    );
                }
                _ => {}
            }
        }
        assert_eq!(
            steps.iter().filter(|(op, _)| op == "FROM").count(),
            2,
            "{dockerfile}: multi-stage"
        );
        // The final stage: a numeric non-root user, the binary as entrypoint.
        let last_from = steps.iter().rposition(|(op, _)| op == "FROM").unwrap();
        let last = &steps[last_from..];
        let user = last
            .iter()
            .rev()
            .find(|(op, _)| op == "USER")
            .map(|(_, u)| u.as_str());
        let uid = user
            .and_then(|u| u.split(':').next())
            .and_then(|u| u.parse::<u32>().ok());
        assert!(
            uid.is_some_and(|u| u != 0),
            "{dockerfile}: USER {user:?} is not a numeric non-root user"
        );
        let entrypoint = last
            .iter()
            .find(|(op, _)| op == "ENTRYPOINT")
            .map(|(_, e)| e.clone())
            .unwrap();
        let entrypoint: Vec<String> =
            serde_json::from_str(&entrypoint).expect("ENTRYPOINT in exec form");
        assert!(
            entrypoint[0].ends_with(&format!("/{bin}")),
            "{dockerfile}: {entrypoint:?}"
        );
        let copies_bin = last.iter().any(|(op, rest)| {
            op == "COPY" && rest.contains("--from=") && rest.ends_with(&entrypoint[0])
        });
        assert!(
            copies_bin,
            "{dockerfile}: the final stage copies {} from the build",
            entrypoint[0]
        );
    }
    // What tool scripts expect in the sidecar's image.
    let sidecar = std::fs::read_to_string(repo_path("sidecar/Dockerfile")).unwrap();
    for pkg in ["bash", "ca-certificates", "curl", "jq"] {
        assert!(
            sidecar.contains(&format!(" {pkg}")),
            "sidecar image without {pkg}"
        );
    }
    // The build context: the workspace in, the rest out.
    let ignore = std::fs::read_to_string(repo_path(".dockerignore")).unwrap();
    let ignored: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    for dir in ["target", ".git"] {
        assert!(ignored.contains(&dir), ".dockerignore keeps {dir}");
    }
    for needed in ["Cargo.toml", "Cargo.lock", "sidecar", "operator", "tests"] {
        assert!(!ignored.contains(&needed), ".dockerignore drops {needed}");
    }
}

// ---------------------------------------------------------------------------
// End to end: the charts' output applied to the real control plane, the
// operator reconciling.

/// How long the operator may take to get a tenant to the expected status.
const RECONCILE_TIMEOUT: &str = "90s";

/// A control plane of the test's own (the examples name their namespaces:
/// `shop`, `bindery-system`). No node: what the operator applies is what
/// is checked here; the real node's tests (`tests/tests/node/`) run the
/// tenants' pods.
struct Cluster {
    plane: ControlPlane,
    dir: PathBuf,
}

impl Cluster {
    /// The control plane, the test's files under `dir`.
    fn start(dir: &Path) -> Cluster {
        Cluster {
            plane: ControlPlane::start(&[]),
            dir: dir.to_path_buf(),
        }
    }

    /// kubectl as the administrator.
    fn kubectl(&self, args: &[&str]) -> Output {
        self.plane.kubectl(ADMIN, args)
    }

    /// helm as the administrator, as a platform team runs it.
    fn helm(&self, args: &[&str]) -> Output {
        bindery_tests::helm::helm_command(args)
            .env("KUBECONFIG", self.plane.kubeconfig(ADMIN))
            .env("HELM_CACHE_HOME", self.dir.join("helm-cache"))
            .output()
            .expect("helm runs")
    }

    /// The tail of the control plane's logs, for failure messages.
    fn logs(&self) -> String {
        ["kube-apiserver", "kube-controller-manager"]
            .iter()
            .map(|c| format!("--- {c} (tail) ---\n{}\n", self.plane.log_tail(c, 3000)))
            .collect()
    }

    /// A kubeconfig of the ServiceAccount `ns/name` (a TokenRequest token).
    fn service_account(&self, ns: &str, name: &str) -> Identity {
        self.plane.service_account(ns, name, &self.dir)
    }

    /// Who asked the API server for what (its audit log).
    fn audit(&self) -> Vec<Audited> {
        self.plane.audited()
    }
}

fn kubectl(emu: &Cluster, args: &[&str]) -> String {
    let out = emu.kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}\ncontrol plane logs:\n{}",
        both(&out),
        emu.logs()
    );
    String::from_utf8(out.stdout).unwrap()
}

fn kubectl_json(emu: &Cluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(emu, &all)).unwrap()
}

/// `kubectl apply -f` of rendered manifests (they carry their namespaces).
fn apply(emu: &Cluster, yaml: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("manifests.yaml");
    std::fs::write(&file, yaml).unwrap();
    kubectl(emu, &["apply", "-f", file.to_str().unwrap()])
}

/// The operator binary, running against the control plane until dropped.
struct Operator {
    child: Child,
    stderr: PathBuf,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    metrics: String,
}

impl Operator {
    /// The operator as `identity`, watching `namespace`, with `args` after
    /// the usual ones.
    fn start(identity: &Identity, dir: &Path, namespace: &str, args: &[&str]) -> Operator {
        let stderr = dir.join("operator.stderr");
        let mut child = Command::new(operator_binary())
            .args([
                "run",
                "--namespace",
                namespace,
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .env("KUBECONFIG", &identity.kubeconfig)
            .env("BINDERY_LOG", "info,bindery_operator=debug")
            .env("POD_NAME", "bindery-operator-test")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("bindery-operator starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let keep = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("metrics on ") {
                    let _ = tx.send(url.trim().to_string());
                }
                keep.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let metrics = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => url,
            Err(_) => panic!(
                "the operator did not start; stderr:\n{}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            ),
        };
        Operator {
            child,
            stderr,
            stdout: seen,
            metrics,
        }
    }

    fn logs(&self) -> String {
        logs_of(&self.stdout, &self.stderr)
    }

    /// SIGTERM; the exit status once it stopped (within 30 s, or a panic
    /// with its logs).
    fn stop(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        eventually_or_blocking(
            "the operator to exit on SIGTERM",
            Duration::from_secs(30),
            || match self.child.try_wait() {
                Ok(Some(status)) => Ok(status),
                other => Err(format!(
                    "{other:?}\n{}",
                    logs_of(&self.stdout, &self.stderr)
                )),
            },
        )
    }
}

/// The operator's stdout so far, then its stderr.
fn logs_of(stdout: &std::sync::Mutex<String>, stderr: &Path) -> String {
    format!(
        "{}{}",
        stdout.lock().unwrap(),
        std::fs::read_to_string(stderr).unwrap_or_default()
    )
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A plain HTTP/1.1 GET on loopback: (status line, body).
fn http_get(base: &str, path: &str) -> (String, String) {
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// `kubectl wait` on one tenant (a watch, bounded by its timeout).
fn wait_for(emu: &Cluster, op: &Operator, tenant: &str, condition: &str) {
    let target = format!("agenttenant/{tenant}");
    let for_ = format!("--for={condition}");
    let timeout = format!("--timeout={RECONCILE_TIMEOUT}");
    let args = ["wait", "-n", "shop", &target, &for_, &timeout];
    let out: Output = emu.kubectl(&args);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}\ntenant: {}\noperator log:\n{}",
        both(&out),
        String::from_utf8_lossy(
            &emu.kubectl(&["get", "-n", "shop", &target, "-o", "yaml"])
                .stdout
        ),
        op.logs()
    );
}

fn condition<'a>(tenant: &'a Value, type_: &str) -> &'a Value {
    tenant["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition: {tenant:#}"))
}

/// `helm` against the control plane as its administrator, which must succeed;
/// its stdout.
fn helm_ok(emu: &Cluster, args: &[&str]) -> String {
    let out = emu.helm(args);
    assert!(
        out.status.success(),
        "helm {args:?}: {}\ncontrol plane logs:\n{}",
        both(&out),
        emu.logs()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `helm install` of `chart` with `extra` arguments.
fn helm_install(emu: &Cluster, chart: &Render, extra: &[&str]) -> String {
    let mut args = chart.install_args();
    args.extend(extra.iter().map(|s| s.to_string()));
    helm_ok(emu, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The namespace `shop`, and `helm install` of the operator chart into
/// `bindery-system` (created by helm), watching `shop`, with `sets`. The
/// documents of the installed release (`helm get manifest`).
fn install_operator_chart(emu: &Cluster, sets: &[&str]) -> Vec<Value> {
    apply(
        emu,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
    );
    let mut chart = Render::new(OPERATOR, "bindery")
        .namespace("bindery-system")
        .set("watchNamespaces={shop}");
    for s in sets {
        chart = chart.set(*s);
    }
    let out = helm_install(emu, &chart, &["--create-namespace"]);
    assert!(out.contains("STATUS: deployed"), "{out}");
    // helm applies the chart's crds/ directory itself, outside the release.
    for crd in ["agents.bindery.dev", "agenttenants.bindery.dev"] {
        kubectl(emu, &["get", "crd", crd]);
    }
    let manifest = helm_ok(emu, &["get", "manifest", "bindery", "-n", "bindery-system"]);
    let docs = documents(&manifest);
    for kind in ["Deployment", "Role", "RoleBinding", "ServiceAccount"] {
        assert!(
            docs.iter().any(|d| d["kind"] == kind),
            "no {kind} in the release:\n{manifest}"
        );
    }
    docs
}

#[test]
fn the_operator_reconciles_tenants_installed_from_the_tenant_chart() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Cluster::start(dir.path());
    let ns = "shop";
    // With two replicas (leader election).
    let roles: Vec<Value> = install_operator_chart(&emu, &["replicas=2"])
        .into_iter()
        .filter(|d| d["kind"] == "Role")
        .collect();

    // The agent, its tools and the demo Secrets; then two tenants from
    // the tenant chart with the example values, and a third whose inline
    // agent has an approval webhook (its signing key in a Secret).
    for f in [
        "examples/k8s/agent.yaml",
        "examples/k8s/tools-configmap.yaml",
        "examples/k8s/billing-secret.yaml",
        "examples/k8s/globex-billing-secret.yaml",
    ] {
        kubectl(&emu, &["apply", "-n", ns, "-f", &repo_path(f)]);
    }
    const HOOLI_KEY: &str = "whsec-hooli-5be2d0";
    apply(
        &emu,
        &format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: hooli-approvals, namespace: shop}}\nstringData: {{key: {HOOLI_KEY}}}\n"),
    );
    let hooli = Render::new(TENANT, "hooli").values("tests/charts/tenant-approval-webhook.yaml");
    for (release, values) in [
        ("acme", "examples/k8s/acme-values.yaml"),
        ("globex", "examples/k8s/globex-values.yaml"),
        ("hooli", "tests/charts/tenant-approval-webhook.yaml"),
    ] {
        let yaml = Render::new(TENANT, release)
            .values(values)
            .template(&["--skip-tests"])
            .unwrap();
        let out = apply(&emu, &yaml);
        assert!(
            out.contains(&format!("agenttenant.bindery.dev/{release} created")),
            "{out}"
        );
    }

    // The operator runs as the chart's ServiceAccount, with the chart's RBAC.
    let identity = emu.service_account("bindery-system", "bindery-bindery-operator");
    let lease_args = [
        "--leader-elect",
        "--lease-namespace",
        "bindery-system",
        "--lease-name",
        "bindery-bindery-operator",
        // Renewed (updated) every 2 s; long enough not to be lost on a
        // loaded machine.
        "--lease-duration",
        "6",
    ];
    let mut op = Operator::start(&identity, dir.path(), ns, &lease_args);
    for tenant in ["acme", "globex"] {
        wait_for(&emu, &op, tenant, "condition=ParametersResolved=True");
        wait_for(&emu, &op, tenant, "jsonpath={.status.paramsBound}=2/2");
    }
    wait_for(&emu, &op, "hooli", "condition=ParametersResolved=True");

    let acme = kubectl_json(&emu, &["get", "-n", ns, "agenttenant", "acme"]);
    let status = &acme["status"];
    assert_eq!(
        condition(&acme, "AgentValid")["status"],
        "True",
        "{status:#}"
    );
    // Nothing runs the tenants' image here: the Deployment never becomes
    // available.
    assert_eq!(condition(&acme, "Ready")["status"], "False", "{status:#}");
    assert_eq!(
        status["endpoint"], "http://acme.shop.svc.cluster.local",
        "{status:#}"
    );
    let rows: Vec<(&str, &str)> = status["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["source"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rows,
        [
            ("tenant", "pinned"),
            ("billing_token", "secret acme-billing/token")
        ]
    );
    let globex = kubectl_json(&emu, &["get", "-n", ns, "agenttenant", "globex"]);
    assert!(
        globex["status"]["summary"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().ends_with("secret globex-billing/token")),
        "{globex:#}"
    );

    // What the operator created for each tenant.
    for tenant in ["acme", "globex"] {
        for (kind, name) in [
            ("deployment", tenant.to_string()),
            ("service", tenant.to_string()),
            ("serviceaccount", tenant.to_string()),
            ("configmap", format!("{tenant}-agents")),
            ("secret", format!("{tenant}-owner-token")),
        ] {
            let obj = kubectl_json(&emu, &["get", "-n", ns, kind, &name]);
            assert_eq!(
                obj["metadata"]["ownerReferences"][0]["name"], tenant,
                "{kind}/{name}: {obj:#}"
            );
        }
    }
    let token = kubectl_json(&emu, &["get", "-n", ns, "secret", "acme-owner-token"]);
    assert!(token["data"]["token"].is_string(), "{token:#}");
    // hooli's agent has an approval webhook: a Role to create Events and
    // its binding to hooli's ServiceAccount; the others have neither.
    let role = kubectl_json(&emu, &["get", "-n", ns, "role", "hooli"]);
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}]),
        "{role:#}"
    );
    let binding = kubectl_json(&emu, &["get", "-n", ns, "rolebinding", "hooli"]);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "hooli", "namespace": ns}]),
        "{binding:#}"
    );
    for obj in [&role, &binding] {
        assert_eq!(
            obj["metadata"]["ownerReferences"][0]["name"], "hooli",
            "{obj:#}"
        );
    }
    let roles_of = |tenant: &str| {
        let selector = format!("bindery.dev/tenant={tenant}");
        kubectl(
            &emu,
            &[
                "get",
                "-n",
                ns,
                "roles,rolebindings",
                "-l",
                &selector,
                "-o",
                "name",
            ],
        )
    };
    for tenant in ["acme", "globex"] {
        assert_eq!(roles_of(tenant).trim(), "", "{tenant}");
    }
    let claim = kubectl_json(
        &emu,
        &["get", "-n", ns, "persistentvolumeclaim", "globex-store"],
    );
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
    let deployment = kubectl_json(&emu, &["get", "-n", ns, "deployment", "acme"]);
    let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
    let env_names: Vec<&str> = env
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        env_names.contains(&"BINDERY_PARAM_BILLING_TOKEN"),
        "{env:#}"
    );
    assert!(
        env_names.contains(&"OPENAI_API_KEY"),
        "podOverrides.env: {env:#}"
    );

    // kubectl describe tells how each parameter is bound.
    let described = kubectl(&emu, &["describe", "-n", ns, "agenttenant", "acme"]);
    assert!(
        described.contains(
            "billing_token (invoices; process, secret, required): secret acme-billing/token"
        ),
        "{described}"
    );
    assert!(described.contains("2/2"), "{described}");

    // Never a secret's value outside its Secret: not in any other object,
    // nor in the operator's output.
    for kind in [
        "agenttenants",
        "deployments",
        "configmaps",
        "services",
        "serviceaccounts",
        "events",
        "persistentvolumeclaims",
    ] {
        let all = kubectl(&emu, &["get", "-n", ns, kind, "-o", "json"]);
        for canary in [
            "demo-acme-billing-token",
            "demo-globex-billing-token",
            HOOLI_KEY,
        ] {
            assert!(!all.contains(canary), "{canary} in {kind}: {all}");
        }
    }

    // Until `ok` holds (at most 90 s; else a panic with the operator's
    // logs).
    let wait_until = |what: &str, ok: &dyn Fn() -> bool| {
        eventually_or_blocking(what, Duration::from_secs(90), || {
            if ok() {
                Ok(())
            } else {
                Err(op.logs())
            }
        })
    };

    // hooli's agent drops its webhook: its Role and RoleBinding go (the
    // tenant's label finds them), and its pods hold no token any more.
    apply(
        &emu,
        &hooli
            .clone()
            .set("agent.approvals=null")
            .template(&["--skip-tests"])
            .unwrap(),
    );
    wait_until("hooli's Role and RoleBinding to be deleted", &|| {
        roles_of("hooli").trim().is_empty()
    });
    let deployment = kubectl_json(&emu, &["get", "-n", ns, "deployment", "hooli"]);
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    assert!(
        !volumes.to_string().contains("serviceAccountToken"),
        "{volumes:#}"
    );

    // globex moves its sessions to Postgres: its claim is deleted once the
    // new Deployment is applied.
    apply(
        &emu,
        "apiVersion: v1\nkind: Secret\nmetadata: {name: globex-db, namespace: shop}\n\
         stringData: {url: 'postgres://bindery@db:5432/globex'}\n",
    );
    let values = std::fs::read_to_string(repo_path("examples/k8s/globex-values.yaml")).unwrap();
    let store = "store:\n  pvcSize: 1Gi\n";
    assert!(
        values.contains(store),
        "examples/k8s/globex-values.yaml changed"
    );
    let postgres = dir.path().join("globex-postgres.yaml");
    std::fs::write(
        &postgres,
        values.replace(
            store,
            "store:\n  postgres:\n    urlSecretRef: {name: globex-db, key: url}\n",
        ),
    )
    .unwrap();
    let yaml = Render::new(TENANT, "globex")
        .values(postgres.display().to_string())
        .template(&["--skip-tests"])
        .unwrap();
    apply(&emu, &yaml);
    // Deleted: gone, or held (Terminating) by the API server's claim
    // protection until no Pod uses it any more. Here that is never: the
    // old Pod stays until a new one is ready, and nothing runs globex's
    // image in this test.
    wait_until("globex-store to be deleted", &|| {
        let out = emu.kubectl(&[
            "get",
            "-n",
            ns,
            "persistentvolumeclaim",
            "globex-store",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ]);
        !out.status.success() || !out.stdout.is_empty()
    });

    // A problem a human must fix: a Warning Event; fixed; and again: the
    // same Event counts 2 (its series).
    let warnings = || -> Vec<i64> {
        kubectl_json(&emu, &["get", "-n", ns, "events.events.k8s.io"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["regarding"]["name"] == "globex" && e["type"] == "Warning")
            .map(|e| e["series"]["count"].as_i64().unwrap_or(1))
            .collect()
    };
    let billing = repo_path("examples/k8s/globex-billing-secret.yaml");
    kubectl(&emu, &["delete", "-n", ns, "secret", "globex-billing"]);
    wait_until("a Warning about globex", &|| warnings() == [1]);
    // The operator publishes a Warning before it writes the status (a
    // failed publish is then tried again, not lost): until that write,
    // `ParametersResolved=True` below would hold on the old status, and
    // the Secret's return and second deletion could reach the operator as
    // one change it never sees as a fix.
    wait_for(&emu, &op, "globex", "condition=ParametersResolved=False");
    kubectl(&emu, &["apply", "-n", ns, "-f", &billing]);
    wait_for(&emu, &op, "globex", "condition=ParametersResolved=True");
    kubectl(&emu, &["delete", "-n", ns, "secret", "globex-billing"]);
    wait_until("the Warning about globex to count 2", &|| warnings() == [2]);
    // The Lease was renewed (updated), not only created.
    let lease = kubectl_json(
        &emu,
        &[
            "get",
            "-n",
            "bindery-system",
            "lease",
            "bindery-bindery-operator",
        ],
    );
    assert!(lease["spec"]["renewTime"].is_string(), "{lease:#}");

    // An operator upgrade: what the old one left under other names (of
    // every kind a tenant owns) is deleted by the new one, by the tenant's
    // label, once it has applied what the tenant wants (acme's: globex
    // lacks its Secret now, so nothing of it is applied).
    let stopped = op.stop();
    assert!(stopped.success(), "{stopped:?}");
    let tenant = kubectl_json(&emu, &["get", "-n", ns, "agenttenant", "acme"]);
    let uid = tenant["metadata"]["uid"].as_str().unwrap();
    let meta = format!(
        "metadata:\n  name: acme-v0\n  namespace: {ns}\n  labels: {{bindery.dev/tenant: acme}}\n  ownerReferences:\n  - {{apiVersion: bindery.dev/v1alpha1, kind: AgentTenant, name: acme, uid: {uid}, controller: true}}\n"
    );
    apply(
        &emu,
        &[
            format!("apiVersion: v1\nkind: ConfigMap\n{meta}data: {{agent.yaml: old}}\n"),
            format!("apiVersion: v1\nkind: ServiceAccount\n{meta}"),
            format!("apiVersion: v1\nkind: Service\n{meta}spec:\n  ports: [{{port: 80}}]\n"),
            format!(
                "apiVersion: apps/v1\nkind: Deployment\n{meta}spec:\n  replicas: 0\n  selector: {{matchLabels: {{old: acme}}}}\n  template:\n    metadata: {{labels: {{old: acme}}}}\n    spec: {{containers: [{{name: c, image: old}}]}}\n"
            ),
            format!("apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n{meta}rules: []\n"),
            format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n{meta}roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: acme-v0}}\nsubjects: [{{kind: ServiceAccount, name: acme}}]\n"
            ),
        ]
        .join("---\n"),
    );
    let mut op = Operator::start(&identity, dir.path(), ns, &lease_args);
    for kind in [
        "configmap",
        "serviceaccount",
        "service",
        "deployment",
        "role",
        "rolebinding",
    ] {
        let what = format!("{kind} acme-v0 to be deleted");
        eventually_or_blocking(&what, Duration::from_secs(90), || {
            let got = emu.kubectl(&["get", "-n", ns, kind, "acme-v0"]);
            if got.status.success() {
                Err(op.logs())
            } else {
                Ok(())
            }
        });
    }

    // The chart grants exactly what the operator asked for in this run,
    // namespace by namespace (the API server's audit): nothing was refused,
    // nothing granted goes unused.
    let audit: Vec<_> = emu
        .audit()
        .into_iter()
        .filter(|a| a.user == identity.user)
        .collect();
    let refused: Vec<_> = audit.iter().filter(|a| !a.allowed).collect();
    assert!(refused.is_empty(), "refused: {refused:#?}\n{}", op.logs());
    let asked_in = |namespace: &str| -> BTreeSet<Grant> {
        audit
            .iter()
            .filter(|a| a.namespace.as_deref() == Some(namespace))
            .map(|a| (a.group.clone(), a.resource.clone(), a.verb.clone()))
            .collect()
    };
    let elsewhere: Vec<_> = audit
        .iter()
        .filter(|a| !matches!(a.namespace.as_deref(), Some("shop" | "bindery-system")))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "outside its namespaces: {elsewhere:#?}"
    );
    // Asked of RBAC by an admission plugin rather than by a request, so
    // not in the audit: an ownerReference that blocks its owner's deletion
    // needs leave to update the owner's finalizers. The control plane runs
    // that plugin (OwnerReferencesPermissionEnforcement), so without the
    // grant the operator's applies would be refused above.
    let by_admission: (String, String, String) = (
        "bindery.dev".into(),
        "agenttenants/finalizers".into(),
        "update".into(),
    );
    // Held only to be granted: RBAC lets the operator give a budget
    // tenant's pods leave to read their tenant's status only if it may
    // itself (the escalation rule); it reads that status as a watch.
    let to_grant: (String, String, String) = (
        "bindery.dev".into(),
        "agenttenants/status".into(),
        "get".into(),
    );
    for role in &roles {
        let namespace = role["metadata"]["namespace"].as_str().unwrap();
        let mut asked = asked_in(namespace);
        if namespace == "shop" {
            asked.insert(by_admission.clone());
            asked.insert(to_grant.clone());
        }
        let granted = grants(role);
        assert!(
            granted == asked,
            "Role {namespace}/{}: granted but never asked for: {:?}; asked for: {:?}",
            role["metadata"]["name"],
            granted.difference(&asked).collect::<Vec<_>>(),
            asked
        );
    }
    assert_eq!(roles.len(), 2, "the shop Role and the Lease's: {roles:#?}");

    // The operator's health and metrics endpoints.
    let (status_line, body) = http_get(&op.metrics, "/readyz");
    assert!(status_line.contains(" 200 "), "{status_line} {body}");
    let (_, metrics) = http_get(&op.metrics, "/metrics");
    assert!(
        metrics.contains("bindery_operator_reconciles_total{outcome=\"ok\"}"),
        "{metrics}"
    );

    let stopped = op.stop();
    assert!(
        stopped.success(),
        "the operator on SIGTERM: {stopped:?}\n{}",
        op.logs()
    );
    let logs = op.logs();
    for canary in [
        "demo-acme-billing-token",
        "demo-globex-billing-token",
        HOOLI_KEY,
    ] {
        assert!(!logs.contains(canary), "{canary} in the operator's logs");
    }
}
/// The custom resources' schemas of `crds/`, as JSON Schema validators.
struct CrdSchemas {
    /// (apiVersion, kind) → validator.
    validators: Vec<(String, String, jsonschema::Validator)>,
}

impl CrdSchemas {
    /// Read every CRD of the repository's `crds/`.
    fn load() -> CrdSchemas {
        let dir = repo_root().join("crds");
        let mut validators = Vec::new();
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("crds/")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        for f in files {
            for crd in documents(&std::fs::read_to_string(&f).expect("read a CRD")) {
                let group = crd["spec"]["group"].as_str().expect("group");
                let kind = crd["spec"]["names"]["kind"].as_str().expect("kind");
                for v in crd["spec"]["versions"].as_array().expect("versions") {
                    let mut schema = openapi_to_json_schema(&v["schema"]["openAPIV3Schema"], true);
                    // Every custom resource has these; a CRD's schema
                    // need not say so.
                    let props = schema["properties"].as_object_mut().expect("properties");
                    props.insert("apiVersion".into(), json!({"type": "string"}));
                    props.insert("kind".into(), json!({"type": "string"}));
                    props.insert("metadata".into(), json!({"type": "object"}));
                    let validator = jsonschema::draft202012::new(&schema).unwrap_or_else(|e| {
                        panic!(
                            "the {kind} schema of {} is no JSON Schema: {e}",
                            f.display()
                        )
                    });
                    let api_version = format!("{group}/{}", v["name"].as_str().expect("name"));
                    validators.push((api_version, kind.to_string(), validator));
                }
            }
        }
        assert!(!validators.is_empty(), "no CRDs in {}", dir.display());
        CrdSchemas { validators }
    }

    /// Whether `doc` is one of our custom resources.
    fn covers(&self, doc: &Value) -> bool {
        self.validators
            .iter()
            .any(|(_, kind, _)| doc["kind"] == *kind)
    }

    /// Validate one custom resource; `Err` lists every error with its path.
    fn validate(&self, doc: &Value) -> Result<(), String> {
        let (api_version, kind) = (doc["apiVersion"].as_str(), doc["kind"].as_str());
        let Some((_, _, validator)) = self
            .validators
            .iter()
            .find(|(a, k, _)| Some(a.as_str()) == api_version && Some(k.as_str()) == kind)
        else {
            return Err(format!(
                "{}: no CRD serves {kind:?} in {api_version:?}",
                id(doc)
            ));
        };
        let errors: Vec<String> = validator
            .iter_errors(doc)
            .map(|e| format!("  at {}: {e}", e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!("{}:\n{}", id(doc), errors.join("\n")))
        }
    }
}

/// A CRD's OpenAPI v3 schema as JSON Schema (2020-12), the way the API
/// server reads it: `nullable: true` also admits null;
/// `x-kubernetes-int-or-string` is an integer or a string; and, as with
/// kubectl's strict field validation, an object with `properties` and
/// without `x-kubernetes-preserve-unknown-fields` admits no other field.
/// `structural` is false inside `oneOf`/`anyOf`/`allOf`/`not`, whose
/// branches only restate required fields of the enclosing object. CEL
/// rules (`x-kubernetes-validations`) are not evaluated here.
fn openapi_to_json_schema(schema: &Value, structural: bool) -> Value {
    let Some(obj) = schema.as_object() else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (k, v) in obj {
        let converted = match k.as_str() {
            "properties" => Value::Object(
                v.as_object()
                    .expect("properties is a map")
                    .iter()
                    .map(|(name, s)| (name.clone(), openapi_to_json_schema(s, true)))
                    .collect(),
            ),
            "items" | "additionalProperties" if v.is_object() => openapi_to_json_schema(v, true),
            "oneOf" | "anyOf" | "allOf" => Value::Array(
                v.as_array()
                    .expect("a list of schemas")
                    .iter()
                    .map(|s| openapi_to_json_schema(s, false))
                    .collect(),
            ),
            "not" => openapi_to_json_schema(v, false),
            "nullable" => continue,
            // Annotations for the API server (CEL rules, list and map
            // types) that JSON Schema does not know.
            k if k.starts_with("x-kubernetes-") => continue,
            _ => v.clone(),
        };
        out.insert(k.clone(), converted);
    }
    let flag = |name: &str| obj.get(name).and_then(Value::as_bool).unwrap_or(false);
    if flag("x-kubernetes-int-or-string") {
        out.insert(
            "anyOf".into(),
            json!([{"type": "integer"}, {"type": "string"}]),
        );
    }
    if structural
        && obj.contains_key("properties")
        && !obj.contains_key("additionalProperties")
        && !flag("x-kubernetes-preserve-unknown-fields")
    {
        out.insert("additionalProperties".into(), Value::Bool(false));
    }
    let out = Value::Object(out);
    if flag("nullable") {
        json!({"anyOf": [out, {"type": "null"}]})
    } else {
        out
    }
}
