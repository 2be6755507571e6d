//! What the node's tests and benches run on the node ([`crate::node`]):
//! the mock model as a pod, the example Agent and its tools pointed at it,
//! a tenant's billing Secret and its tenant chart values.

use std::path::Path;

use crate::helm::repo_path;
use crate::node_kube::{Kube, TIMEOUT};

/// The mock model's image: the workspace's `mock-model` on the distroless
/// base, imported into the node.
pub const MODEL_IMAGE: &str = "bindery.test/mock-model:e2e";
/// The mock model's API, by its Service's name.
pub const MODEL_URL: &str = "http://mock-model.models.svc.cluster.local:9090/v1";

/// The mock model (`program`: the `mock-model` binary, which only a test
/// or bench target knows as `CARGO_BIN_EXE_mock-model`) as a Deployment
/// and Service `mock-model` in `models`, rolled out: it calls the invoices
/// tool for another tenant than the caller's (the pin decides), then
/// answers with the tool's output.
pub fn start_model(kube: &Kube<'_>, program: &Path) {
    kube.node.import_program(MODEL_IMAGE, program);
    kube.restricted_namespace("models");
    kube.apply(&format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: mock-model, namespace: models}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: mock-model}}}}
  template:
    metadata: {{labels: {{app: mock-model}}}}
    spec:
      automountServiceAccountToken: false
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        seccompProfile: {{type: RuntimeDefault}}
      containers:
      - name: model
        image: {MODEL_IMAGE}
        imagePullPolicy: Never
        args: [--listen, "0.0.0.0:9090", --tool, bash_query-invoices, --args, '{{"status":"overdue","tenant_id":"globex"}}']
        ports: [{{name: http, containerPort: 9090}}]
        readinessProbe: {{tcpSocket: {{port: http}}, periodSeconds: 1}}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {{drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata: {{name: mock-model, namespace: models}}
spec:
  selector: {{app: mock-model}}
  ports: [{{name: http, port: 9090, targetPort: http}}]
"#
    ));
    kube.ok(&[
        "rollout",
        "status",
        "-n",
        "models",
        "deployment/mock-model",
        "--timeout",
        TIMEOUT,
    ]);
}

/// The example Agent (`examples/k8s/agent.yaml`), its model the mock's
/// Service; as an agent file it is what the sidecar reads too.
pub fn invoices_agent() -> String {
    std::fs::read_to_string(repo_path("examples/k8s/agent.yaml"))
        .expect("examples/k8s/agent.yaml")
        .replace("https://api.openai.com/v1", MODEL_URL)
}

/// The example Agent ([`invoices_agent`]; its tools exposed on `/mcp`)
/// and its tools in `ns`.
pub fn apply_invoices_agent(kube: &Kube<'_>, ns: &str) {
    apply_agent(kube, ns, MODEL_URL, |agent| {
        let spec = "\nspec:\n";
        assert!(agent.contains(spec), "examples/k8s/agent.yaml changed");
        agent.replacen(spec, "\nspec:\n  mcp:\n    exposeTools: true\n", 1)
    });
}

/// The example Agent in `ns`, its model at `model_url`, then `edit`ed;
/// and its tools, the tool also printing the SHA-256 of the billing token
/// it was given (so a test sees which value reached it without the value
/// itself travelling anywhere).
pub fn apply_agent(
    kube: &Kube<'_>,
    ns: &str,
    model_url: &str,
    edit: impl FnOnce(String) -> String,
) {
    let agent = invoices_agent().replace(MODEL_URL, model_url).replace(
        "name: invoices\n",
        &format!("name: invoices\n  namespace: {ns}\n"),
    );
    kube.apply(&edit(agent));
    let tools = std::fs::read_to_string(repo_path("examples/k8s/tools-configmap.yaml")).unwrap();
    let anchor = "    invoices | awk";
    assert!(
        tools.contains(anchor),
        "examples/k8s/tools-configmap.yaml changed"
    );
    kube.apply(
        &tools
            .replacen(
                anchor,
                "    printf 'token-sha256: %s\\n' \"$(printf %s \"$TOKEN\" | sha256sum | cut -d' ' -f1)\"\n    invoices | awk",
                1,
            )
            .replace(
                "name: invoices-tools\n",
                &format!("name: invoices-tools\n  namespace: {ns}\n"),
            ),
    );
}

/// A Secret `name` holding `value` under `token` (a tenant's billing
/// token, its MCP clients' token).
pub fn token_secret(ns: &str, name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {ns}}}\nstringData: {{token: {value}}}\n"
    )
}

/// Values of the tenant chart for `tenant` (billing tenant `billing`, its
/// token from the Secret `<tenant>-billing`), its clients: pods labelled
/// `bindery.test/client: <tenant>`. The file's path.
pub fn tenant_values(kube: &Kube<'_>, tenant: &str, billing: &str) -> String {
    let file = kube.node.dir().join(format!("{tenant}-values.yaml"));
    std::fs::write(
        &file,
        format!(
            r#"agentRef: invoices
parameters:
  - name: tenant
    value: {billing}
    pinned: true
  - name: billing_token
    valueFrom:
      secretKeyRef: {{name: {tenant}-billing, key: token}}
tools: invoices-tools
networkPolicy:
  clients:
    - podSelector: {{matchLabels: {{bindery.test/client: {tenant}}}}}
"#
        ),
    )
    .unwrap();
    file.display().to_string()
}
