//! The Kubernetes API emulator (tests/k8s/emulator.py) against kubectl and
//! kube-rs, the two clients the operator's tests use. Each test starts and
//! stops its own emulator.

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use bindery_tests::kube::Emulator;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::{conditions, finalizer, wait::await_condition, watcher};
use kube::{Client, Config, CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Bound on every wait for the emulator to show a change.
const WAIT: Duration = Duration::from_secs(20);

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("k8s/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// Run kubectl and return its stdout; fail with both streams and the
/// emulator's log when it fails.
fn kubectl(emu: &Emulator, args: &[&str]) -> String {
    let out = emu.kubectl(args);
    assert!(out.status.success(), "{}", failure(emu, args, &out));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn kubectl_json(emu: &Emulator, args: &[&str]) -> Value {
    let text = kubectl(emu, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {text}"))
}

fn failure(emu: &Emulator, args: &[&str], out: &Output) -> String {
    format!(
        "kubectl {args:?} -> {}\nstdout:\n{}\nstderr:\n{}\nemulator log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        emu.logs()
    )
}

/// `kubectl apply [extra...] -f FILE` with the given manifest.
fn apply_manifest(emu: &Emulator, manifest: &str, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifest.yaml");
    std::fs::write(&path, manifest).unwrap();
    let mut args = vec!["apply"];
    args.extend(extra);
    args.extend(["-f", path.to_str().unwrap()]);
    kubectl(emu, &args)
}

#[test]
fn kubectl_drives_a_crd_and_its_custom_resources() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());

    let out = kubectl(&emu, &["apply", "-f", &fixture("widget-crd.yaml")]);
    assert!(out.contains("widgets.example.dev created"), "{out}");
    let out = kubectl(&emu, &["get", "crd"]);
    assert!(out.contains("widgets.example.dev"), "{out}");

    let out = kubectl(&emu, &["apply", "-f", &fixture("widget.yaml")]);
    assert!(out.contains("widget.example.dev/gizmo created"), "{out}");
    // The CRD's printer columns, as kubectl prints them.
    let out = kubectl(&emu, &["get", "widgets"]);
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "SIZE", "PHASE", "READY", "AGE"], "{out}");
    assert!(out.lines().any(|l| l.starts_with("gizmo   3 ")), "{out}");
    // A column whose JSONPath filters a list shows its first match.
    kubectl(
        &emu,
        &[
            "patch",
            "widget",
            "gizmo",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status": {"phase": "Running", "conditions": [
                {"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}}"#,
        ],
    );
    let out = kubectl(&emu, &["get", "widgets"]);
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(row[..4], ["gizmo", "3", "Running", "True"], "{out}");
    let out = kubectl(&emu, &["get", "wd"]); // the short name, from discovery
    assert!(out.contains("gizmo"), "{out}");

    let widget = kubectl_json(&emu, &["get", "widget", "gizmo", "-o", "json"]);
    let meta = &widget["metadata"];
    assert!(
        meta["uid"].as_str().is_some_and(|u| !u.is_empty()),
        "{widget}"
    );
    assert!(meta["creationTimestamp"].is_string(), "{widget}");
    assert_eq!(meta["generation"], 1, "{widget}");
    assert_eq!(meta["namespace"], "default", "{widget}");
    let rv1: u64 = meta["resourceVersion"].as_str().unwrap().parse().unwrap();
    assert_eq!(widget["spec"], json!({"size": 3, "color": "blue"}));

    let out = kubectl(&emu, &["describe", "widget", "gizmo"]);
    assert!(out.contains("Name:         gizmo"), "{out}");
    assert!(out.contains("Size:   3"), "{out}");

    // A changed spec: generation 2. The same again: nothing changes.
    let changed = std::fs::read_to_string(fixture("widget.yaml"))
        .unwrap()
        .replace("size: 3", "size: 5");
    assert!(apply_manifest(&emu, &changed, &[]).contains("gizmo configured"));
    let widget = kubectl_json(&emu, &["get", "widget", "gizmo", "-o", "json"]);
    assert_eq!(widget["metadata"]["generation"], 2, "{widget}");
    assert_eq!(widget["spec"]["size"], 5, "{widget}");
    let rv2: u64 = widget["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1, "{rv1} -> {rv2}");
    assert!(apply_manifest(&emu, &changed, &[]).contains("gizmo unchanged"));
    let again = kubectl_json(&emu, &["get", "widget", "gizmo", "-o", "json"]);
    assert_eq!(again["metadata"]["resourceVersion"], rv2.to_string());

    let out = kubectl(&emu, &["delete", "widget", "gizmo"]);
    assert!(out.contains("\"gizmo\" deleted"), "{out}");
    let gone = emu.kubectl(&["get", "widget", "gizmo"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("NotFound"),
        "{}",
        failure(&emu, &["get", "widget", "gizmo"], &gone)
    );
}

#[test]
fn kubectl_manages_namespaces_configmaps_and_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());

    let out = kubectl(&emu, &["get", "namespaces"]);
    assert!(
        out.contains("default") && out.contains("kube-system"),
        "{out}"
    );
    apply_manifest(
        &emu,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n",
        &[],
    );
    let out = kubectl(&emu, &["get", "ns"]);
    assert!(out.contains("team-a"), "{out}");
    let ns = kubectl_json(&emu, &["get", "namespace", "team-a", "-o", "json"]);
    assert_eq!(ns["status"]["phase"], "Active", "{ns}");

    let manifest = "apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team-a, labels: {app: demo}}
data: {mode: fast}
---
apiVersion: v1
kind: Secret
metadata: {name: token, namespace: team-a}
stringData: {token: s3cr3t}
";
    let out = apply_manifest(&emu, manifest, &[]);
    assert!(out.contains("configmap/settings created"), "{out}");
    assert!(out.contains("secret/token created"), "{out}");
    let get_secret = ["get", "secret", "token", "-n", "team-a", "-o", "json"];
    let secret = kubectl_json(&emu, &get_secret);
    // stringData is folded into data, base64-encoded.
    assert_eq!(secret["data"], json!({"token": "czNjcjN0"}), "{secret}");
    assert!(secret.get("stringData").is_none(), "{secret}");

    let out = apply_manifest(&emu, &manifest.replace("mode: fast", "mode: slow"), &[]);
    assert!(out.contains("configmap/settings configured"), "{out}");
    let cm = kubectl_json(
        &emu,
        &["get", "cm", "settings", "-n", "team-a", "-o", "json"],
    );
    assert_eq!(cm["data"], json!({"mode": "slow"}), "{cm}");
    // kubectl re-sends stringData (it never reads back), as with a cluster;
    // the server sees no change.
    let again = kubectl_json(&emu, &get_secret);
    assert_eq!(
        again["metadata"]["resourceVersion"],
        secret["metadata"]["resourceVersion"]
    );
    let out = kubectl(&emu, &["get", "cm", "-n", "team-a", "-l", "app=demo"]);
    assert!(out.contains("settings"), "{out}");
    let out = kubectl(&emu, &["get", "cm", "-n", "team-a", "-l", "app=other"]);
    assert!(!out.contains("settings"), "{out}");

    // Server-side apply through kubectl too.
    let out = apply_manifest(
        &emu,
        &manifest.replace("mode: fast", "mode: ssa"),
        &["--server-side"],
    );
    assert!(
        out.contains("configmap/settings serverside-applied"),
        "{out}"
    );
    let cm = kubectl_json(
        &emu,
        &["get", "cm", "settings", "-n", "team-a", "-o", "json"],
    );
    assert_eq!(cm["data"], json!({"mode": "ssa"}), "{cm}");

    kubectl(&emu, &["delete", "namespace", "team-a"]);
    let out = kubectl(&emu, &["get", "ns"]);
    assert!(!out.contains("team-a"), "{out}");
}

/// A kube-rs client for the emulator, from the kubeconfig it wrote.
async fn client(emu: &Emulator) -> Client {
    client_from(&emu.kubeconfig).await
}

async fn client_from(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

/// The `Status` of an API error (kube 5's name for what was `ErrorResponse`).
fn api_status(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn kube_rs_applies_reads_lists_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());
    let client = client(&emu).await;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "apps"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert!(names.contains(&"apps".to_string()), "{names:?}");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    let ssa = PatchParams::apply("emulator-test").force();
    let created = cms
        .patch("app", &ssa, &Patch::Apply(cm("app", json!({"a": "1"}))))
        .await
        .expect("server-side apply creates a missing object");
    let rv = created.resource_version().unwrap();
    assert!(created.uid().is_some());
    let same = cms
        .patch("app", &ssa, &Patch::Apply(cm("app", json!({"a": "1"}))))
        .await
        .unwrap();
    assert_eq!(
        same.resource_version().unwrap(),
        rv,
        "a no-op apply is a no-op"
    );
    let changed = cms
        .patch("app", &ssa, &Patch::Apply(cm("app", json!({"a": "2"}))))
        .await
        .unwrap();
    assert_ne!(changed.resource_version().unwrap(), rv);

    // PUT replaces the whole object; a stale resourceVersion is a Conflict.
    let data = Some([("b".to_string(), "3".to_string())].into());
    let mut stale = created.clone();
    stale.data = data.clone();
    let err = api_status(
        cms.replace("app", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.reason.as_str()),
        (409, "Conflict"),
        "{err:?}"
    );
    let mut fresh = changed.clone();
    fresh.data = data.clone();
    cms.replace("app", &PostParams::default(), &fresh)
        .await
        .unwrap();

    let got = cms.get("app").await.unwrap();
    assert_eq!(got.data, data);
    let list = cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert!(list.metadata.resource_version.is_some());

    let existing: ConfigMap = serde_json::from_value(cm("app", json!({}))).unwrap();
    let err = api_status(
        cms.create(&PostParams::default(), &existing)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.reason.as_str()),
        (409, "AlreadyExists"),
        "{err:?}"
    );

    cms.delete("app", &DeleteParams::default()).await.unwrap();
    let err = api_status(cms.get("app").await.unwrap_err());
    assert_eq!(
        (err.code, err.reason.as_str()),
        (404, "NotFound"),
        "{err:?}"
    );
    assert!(err.is_failure(), "{err:?}");
    assert_eq!(err.details.unwrap().name, "app");
    let err = api_status(
        cms.delete("app", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 404, "{err:?}");
}

#[tokio::test]
async fn kube_rs_watcher_sees_later_changes() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());
    let client = client(&emu).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let ssa = PatchParams::apply("emulator-test");
    cms.patch(
        "watched",
        &ssa,
        &Patch::Apply(cm("watched", json!({"v": "1"}))),
    )
    .await
    .unwrap();

    let mut events = watcher(cms.clone(), watcher::Config::default()).boxed();
    // The initial listing first...
    tokio::time::timeout(WAIT, async {
        while let Some(event) = events.try_next().await.unwrap() {
            if matches!(event, watcher::Event::InitDone) {
                break;
            }
        }
    })
    .await
    .expect("the watcher lists within the bound");
    // ...then a change made afterwards arrives as Apply.
    cms.patch(
        "watched",
        &ssa,
        &Patch::Apply(cm("watched", json!({"v": "2"}))),
    )
    .await
    .unwrap();
    let seen = tokio::time::timeout(WAIT, async {
        loop {
            match events.try_next().await.unwrap() {
                Some(watcher::Event::Apply(cm)) => break cm,
                Some(_) => continue,
                None => panic!("the watch stream ended"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no Apply event within {WAIT:?}; log:\n{}", emu.logs()));
    assert_eq!(seen.name_any(), "watched");
    assert_eq!(seen.data.unwrap()["v"], "2");
}

#[tokio::test]
async fn kube_rs_metadata_reads_get_metadata_only() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());
    let client = client(&emu).await;
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let secret = |name: &str| -> Secret {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "stringData": {"token": "s3cr3t"}}),
        )
        .unwrap()
    };
    secrets
        .create(&PostParams::default(), &secret("first"))
        .await
        .unwrap();

    // Api<PartialObjectMeta<_>> asks for PartialObjectMetadata: the data stays home.
    let meta: Api<PartialObjectMeta<Secret>> = Api::default_namespaced(client);
    let list = meta.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.types.kind, "PartialObjectMetadataList");
    assert_eq!(list.items.len(), 1);
    let kind = |m: &PartialObjectMeta<Secret>| m.types.as_ref().map(|t| t.kind.clone());
    assert_eq!(
        kind(&list.items[0]).as_deref(),
        Some("PartialObjectMetadata")
    );
    assert_eq!(list.items[0].name_any(), "first");
    let got = meta.get("first").await.unwrap();
    assert_eq!(kind(&got).as_deref(), Some("PartialObjectMetadata"));
    assert!(got.metadata.resource_version.is_some());

    let mut events = watcher(meta, watcher::Config::default()).boxed();
    let seen = tokio::time::timeout(WAIT, async {
        loop {
            match events.try_next().await.unwrap() {
                Some(watcher::Event::InitDone) => {
                    secrets
                        .create(&PostParams::default(), &secret("second"))
                        .await
                        .unwrap();
                }
                Some(watcher::Event::Apply(m)) => break m,
                Some(_) => continue,
                None => panic!("the watch stream ended"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no Apply event within {WAIT:?}; log:\n{}", emu.logs()));
    assert_eq!(seen.name_any(), "second");
    assert_eq!(kind(&seen).as_deref(), Some("PartialObjectMetadata"));
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "example.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    shortname = "wd"
)]
struct WidgetSpec {
    size: i64,
    color: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct WidgetStatus {
    phase: String,
}

/// Install the Widget CRD from its Rust type, as an operator would, and wait
/// until it is established.
async fn install_widget_crd(client: &Client) -> Api<Widget> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Widget::crd())
        .await
        .unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(
            crds,
            "widgets.example.dev",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("the CRD is established within the bound")
    .unwrap();
    Api::default_namespaced(client.clone())
}

#[tokio::test]
async fn kube_rs_status_subresource_changes_only_status() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());
    let client = client(&emu).await;
    let widgets = install_widget_crd(&client).await;

    let w = Widget::new(
        "w1",
        WidgetSpec {
            size: 1,
            color: "red".into(),
        },
    );
    let created = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));

    // Through /status: .status changes, nothing else (the spec in the body is ignored).
    let patch = json!({"spec": {"size": 99}, "status": {"phase": "Ready"}});
    let after = widgets
        .patch_status("w1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(after.status.as_ref().unwrap().phase, "Ready");
    assert_eq!(after.spec.size, 1);
    assert_eq!(after.metadata.generation, Some(1));
    assert_ne!(after.resource_version(), created.resource_version());

    // Through the main resource: .spec changes (generation 2), .status does not.
    let patch = json!({"spec": {"size": 2}, "status": {"phase": "Broken"}});
    let after = widgets
        .patch("w1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(after.spec.size, 2);
    assert_eq!(after.metadata.generation, Some(2));
    assert_eq!(after.status.as_ref().unwrap().phase, "Ready");
    let status = widgets.get_status("w1").await.unwrap();
    assert_eq!(status.status.unwrap().phase, "Ready");
}

/// A kube-rs client authenticating as `identity` (a ServiceAccount's token).
async fn client_as(identity: &bindery_tests::kube::Identity) -> Client {
    client_from(&identity.kubeconfig).await
}

/// The 403 of a refused request: its message.
fn forbidden(result: Result<impl std::fmt::Debug, kube::Error>) -> String {
    let status = api_status(result.expect_err("refused"));
    assert_eq!(
        (status.code, status.reason.as_str()),
        (403, "Forbidden"),
        "{status:?}"
    );
    status.message
}

const ROBOT_RBAC: &str = "apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: robot, namespace: team-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: team-a}
rules:
  - apiGroups: [\"\"]
    resources: [configmaps]
    verbs: [get, list, watch]
  - apiGroups: [\"\"]
    resources: [secrets]
    resourceNames: [mine]
    verbs: [get]
  - apiGroups: [example.dev]
    resources: [widgets/status]
    verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: robot-reads, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects: [{kind: ServiceAccount, name: robot, namespace: team-a}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: event-writer}
rules:
  - apiGroups: [\"\"]
    resources: [events]
    verbs: [\"*\"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: robot-writes-events, namespace: team-b}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: event-writer}
subjects: [{kind: ServiceAccount, name: robot, namespace: team-a}]
";

/// A ServiceAccount gets what its Roles grant (verbs, `*`, subresources,
/// resourceNames, a ClusterRole bound in one namespace) and a 403 in the
/// API server's words otherwise; every decision is in the audit; a token
/// dies with its ServiceAccount.
#[tokio::test]
async fn rbac_grants_what_roles_say_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());
    let admin = client(&emu).await;
    install_widget_crd(&admin).await;
    apply_manifest(&emu, ROBOT_RBAC, &[]);
    let admin_widgets: Api<Widget> = Api::namespaced(admin.clone(), "team-a");
    let w = Widget::new(
        "w1",
        WidgetSpec {
            size: 1,
            color: "red".into(),
        },
    );
    admin_widgets
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "team-a");
    for name in ["mine", "theirs"] {
        let s: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}}))
                .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }

    let robot = emu.service_account("team-a", "robot");
    assert_eq!(robot.user, "system:serviceaccount:team-a:robot");
    let client = client_as(&robot).await;
    let user = "User \"system:serviceaccount:team-a:robot\"";

    // Granted: reads of ConfigMaps in team-a (a missing one is a 404, not a 403).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team-a");
    cms.list(&ListParams::default()).await.unwrap();
    assert_eq!(api_status(cms.get("nope").await.unwrap_err()).code, 404);
    // Refused: another verb, another namespace, the cluster scope.
    let data = serde_json::from_value::<ConfigMap>(cm("x", json!({"a": "b"}))).unwrap();
    assert_eq!(
        forbidden(cms.create(&PostParams::default(), &data).await),
        format!("configmaps is forbidden: {user} cannot create resource \"configmaps\" in API group \"\" in the namespace \"team-a\"")
    );
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "team-b");
    assert!(
        forbidden(other.list(&ListParams::default()).await).ends_with(
            "cannot list resource \"configmaps\" in API group \"\" in the namespace \"team-b\""
        )
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    assert_eq!(
        forbidden(namespaces.list(&ListParams::default()).await),
        format!("namespaces is forbidden: {user} cannot list resource \"namespaces\" in API group \"\" at the cluster scope")
    );

    // resourceNames: one Secret, not another.
    let robot_secrets: Api<Secret> = Api::namespaced(client.clone(), "team-a");
    robot_secrets.get("mine").await.unwrap();
    assert_eq!(
        forbidden(robot_secrets.get("theirs").await),
        format!("secrets \"theirs\" is forbidden: {user} cannot get resource \"secrets\" in API group \"\" in the namespace \"team-a\"")
    );

    // A subresource is its own resource: widgets/status, not widgets.
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "team-a");
    let patch = Patch::Merge(json!({"status": {"phase": "Ready"}}));
    widgets
        .patch_status("w1", &PatchParams::default(), &patch)
        .await
        .unwrap();
    assert_eq!(
        forbidden(widgets.patch("w1", &PatchParams::default(), &patch).await),
        format!("widgets.example.dev \"w1\" is forbidden: {user} cannot patch resource \"widgets\" in API group \"example.dev\" in the namespace \"team-a\"")
    );

    // A ClusterRole's `*` verbs, bound in team-b only.
    let event = |ns: &str| -> k8s_openapi::api::core::v1::Event {
        serde_json::from_value(json!({
            "metadata": {"name": "e1", "namespace": ns},
            "involvedObject": {"kind": "Widget", "name": "w1", "namespace": ns},
            "reason": "Test", "message": "hello", "type": "Normal"
        }))
        .unwrap()
    };
    let events_b: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(client.clone(), "team-b");
    events_b
        .create(&PostParams::default(), &event("team-b"))
        .await
        .unwrap();
    events_b
        .delete("e1", &DeleteParams::default())
        .await
        .unwrap();
    let events_a: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(client.clone(), "team-a");
    forbidden(
        events_a
            .create(&PostParams::default(), &event("team-a"))
            .await,
    );

    // The audit: what the robot asked for, allowed or not.
    let audit = emu.audit();
    let seen = |verb: &str, resource: &str, ns: &str, allowed: bool| {
        audit.iter().any(|a| {
            a.user == robot.user
                && a.verb == verb
                && a.resource == resource
                && a.namespace.as_deref() == Some(ns)
                && a.allowed == allowed
        })
    };
    assert!(seen("list", "configmaps", "team-a", true), "{audit:#?}");
    assert!(seen("create", "configmaps", "team-a", false), "{audit:#?}");
    assert!(
        seen("patch", "widgets/status", "team-a", true),
        "{audit:#?}"
    );
    assert!(seen("delete", "events", "team-b", true), "{audit:#?}");

    // An unknown token, and the token of a deleted ServiceAccount: 401.
    let out = emu.kubectl(&["delete", "serviceaccount", "robot", "-n", "team-a"]);
    assert!(out.status.success(), "{out:?}");
    let status = api_status(cms.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (401, "Unauthorized"));
}

/// A ConfigMap owned by `owners` (blocking their foreground deletion),
/// with `finalizers`.
fn dependent(name: &str, owners: &[&ConfigMap], finalizers: &[&str]) -> ConfigMap {
    let refs: Vec<Value> = owners
        .iter()
        .map(|o| {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "name": o.name_any(),
                   "uid": o.uid().unwrap(), "blockOwnerDeletion": true})
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": refs,
                                               "finalizers": finalizers}}))
    .unwrap()
}

/// Garbage collection: background (the default), foreground and orphan
/// deletion of an owner; a dependent with another owner keeps living;
/// finalizers hold a dependent as any deletion.
#[tokio::test]
async fn owners_take_their_dependents_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());
    let client = client(&emu).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let pp = PostParams::default();
    let mk = async |name: &str| {
        let owner: ConfigMap = serde_json::from_value(cm(name, json!({}))).unwrap();
        cms.create(&pp, &owner).await.unwrap()
    };
    let gone = async |name: &str| cms.get_opt(name).await.unwrap().is_none();
    let unfinalize = async |name: &str| {
        let patch = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        cms.patch(name, &PatchParams::default(), &patch)
            .await
            .unwrap();
    };

    // Background: the owner goes at once, then what it alone owned.
    let (owner, other) = (mk("owner").await, mk("other").await);
    for d in [
        dependent("only-mine", &[&owner], &[]),
        dependent("shared", &[&owner, &other], &[]),
        dependent("held", &[&owner], &["example.dev/hold"]),
    ] {
        cms.create(&pp, &d).await.unwrap();
    }
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    assert!(gone("owner").await && gone("only-mine").await);
    let shared = cms.get("shared").await.unwrap();
    let refs: Vec<_> = shared
        .owner_references()
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(refs, ["other"], "{shared:?}");
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some(), "{held:?}");
    unfinalize("held").await;
    assert!(gone("held").await);

    // Foreground: the owner waits for its blocking dependents.
    let owner = mk("parent").await;
    cms.create(&pp, &dependent("child", &[&owner], &["example.dev/hold"]))
        .await
        .unwrap();
    cms.delete("parent", &DeleteParams::foreground())
        .await
        .unwrap();
    let parent = cms.get("parent").await.unwrap();
    assert!(parent.metadata.deletion_timestamp.is_some(), "{parent:?}");
    assert_eq!(parent.finalizers(), ["foregroundDeletion"]);
    let child = cms.get("child").await.unwrap();
    assert!(child.metadata.deletion_timestamp.is_some(), "{child:?}");
    unfinalize("child").await;
    assert!(gone("child").await && gone("parent").await);

    // Orphan: the dependents stay, without the reference.
    let owner = mk("elder").await;
    cms.create(&pp, &dependent("orphan", &[&owner], &[]))
        .await
        .unwrap();
    cms.delete("elder", &DeleteParams::orphan()).await.unwrap();
    assert!(gone("elder").await);
    let orphan = cms.get("orphan").await.unwrap();
    assert!(orphan.owner_references().is_empty(), "{orphan:?}");

    // Written after its only owner went (a controller's late apply): collected.
    cms.create(&pp, &dependent("late", &[&owner], &[]))
        .await
        .unwrap();
    assert!(gone("late").await);
}

#[tokio::test]
async fn kube_rs_finalizer_helper_adds_and_removes_its_finalizer() {
    const FINALIZER: &str = "example.dev/cleanup";
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path());
    let client = client(&emu).await;
    let widgets = install_widget_crd(&client).await;
    let w = Widget::new(
        "w2",
        WidgetSpec {
            size: 1,
            color: "green".into(),
        },
    );
    widgets.create(&PostParams::default(), &w).await.unwrap();

    // First pass: the helper adds its finalizer with a JSON patch whose `test`
    // op checks that /metadata/finalizers is absent (null).
    let obj = Arc::new(widgets.get("w2").await.unwrap());
    finalizer(&widgets, FINALIZER, obj, |_| async {
        Ok::<_, std::io::Error>(Action::await_change())
    })
    .await
    .unwrap_or_else(|e| panic!("adding the finalizer: {e}; log:\n{}", emu.logs()));
    let obj = widgets.get("w2").await.unwrap();
    assert_eq!(obj.finalizers(), [FINALIZER.to_string()]);

    // Deleting only marks it while the finalizer is there.
    widgets
        .delete("w2", &DeleteParams::default())
        .await
        .unwrap();
    let obj = widgets.get("w2").await.unwrap();
    assert!(obj.metadata.deletion_timestamp.is_some());

    // Second pass: cleanup, then the helper removes the finalizer and the object goes.
    let mut cleaned = false;
    finalizer(&widgets, FINALIZER, Arc::new(obj), |event| {
        cleaned = matches!(event, finalizer::Event::Cleanup(_));
        async { Ok::<_, std::io::Error>(Action::await_change()) }
    })
    .await
    .unwrap_or_else(|e| panic!("removing the finalizer: {e}; log:\n{}", emu.logs()));
    assert!(cleaned);
    let err = api_status(widgets.get("w2").await.unwrap_err());
    assert_eq!(err.reason, "NotFound");
}

#[test]
fn the_emulator_exits_cleanly_on_sigterm() {
    use std::io::{Read, Write};

    let dir = tempfile::tempdir().unwrap();
    let mut emu = Emulator::start(dir.path());
    assert!(emu.url.starts_with("http://127.0.0.1:"), "{}", emu.url);
    // An open watch must not hold the exit up: open one and read its headers.
    let mut watch = std::net::TcpStream::connect(emu.url.trim_start_matches("http://")).unwrap();
    watch.set_read_timeout(Some(WAIT)).unwrap();
    watch
        .write_all(b"GET /api/v1/namespaces/default/configmaps?watch=true HTTP/1.1\r\nHost: emulator\r\n\r\n")
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        watch.read_exact(&mut byte).expect("the watch answers");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");

    let status = emu.stop().expect("exits within the bound");
    assert!(status.success(), "{status:?}; log:\n{}", emu.logs());
}
