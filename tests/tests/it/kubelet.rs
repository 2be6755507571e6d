//! The test kubelet (`bindery_tests::kubelet`) on the real control plane:
//! a Deployment's Pods run as local processes and become ready through
//! their probe, so the real controllers count them; a Service reaches them
//! at its address and by name from a Pod; a Pod that may not restart ends
//! `Succeeded` or `Failed`; a deleted Deployment's Pods stop and go; a
//! container reaches the API server where `KUBERNETES_SERVICE_HOST` and
//! `KUBERNETES_SERVICE_PORT` say, checking it with the CA of
//! `kube-root-ca.crt`, as its projected ServiceAccount token.

use std::time::Duration;

use bindery_tests::control_plane::{ControlPlane, ADMIN};
use bindery_tests::eventually::eventually_or;
use bindery_tests::kubelet::Kubelet;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

fn program(name: &str) -> std::path::PathBuf {
    bindery_tests::on_path(name).unwrap_or_else(|| panic!("{name} is not on PATH"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_become_ready_and_are_reached_through_their_service() {
    let plane = ControlPlane::shared();
    let ns = "kubelet";
    plane.kubectl_ok(ADMIN, &["create", "namespace", ns]);
    let dir = tempfile::tempdir().unwrap();
    // The interpreter itself, not a shim that looks at its own name.
    let python = std::process::Command::new(program("python3"))
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 runs");
    let python = std::path::PathBuf::from(String::from_utf8(python.stdout).unwrap().trim());
    let sh = program("sh");
    let kubelet = Kubelet::start(
        plane,
        &[ns],
        &[("web:1", python.as_path()), ("shell", sh.as_path())],
        &dir.path().join("pods"),
    );
    let client = plane.client(ADMIN).await;
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    std::fs::write(served.join("hello.txt"), "hello from a pod\n").unwrap();
    let web: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [{
                        "name": "web",
                        "image": "web:1",
                        "args": ["-m", "http.server", "8080", "--bind", "0.0.0.0",
                                 "--directory", served.display().to_string()],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/hello.txt", "port": "http"}},
                    }],
                },
            },
        },
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &web)
        .await
        .unwrap();
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
    });
    let file = dir.path().join("svc.json");
    std::fs::write(&file, svc.to_string()).unwrap();
    plane.kubectl_ok(ADMIN, &["apply", "-f", file.to_str().unwrap()]);

    // The real controllers count the Pods the kubelet runs ready.
    eventually_or("the Deployment's two replicas ready", WAIT, async || {
        let d = deployments.get("web").await.map_err(|e| e.to_string())?;
        let ready = d.status.as_ref().and_then(|s| s.ready_replicas);
        if ready == Some(2) {
            return Ok(());
        }
        let pods = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let seen: Vec<String> = pods
            .items
            .iter()
            .map(|p| format!("{:?}: {:?}", p.metadata.name, p.status))
            .collect();
        Err(format!("{:?}\npods: {seen:#?}", d.status))
    })
    .await;
    let address = eventually_or("the Service's address", WAIT, async || {
        kubelet
            .service_address(ns, "web")
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    let body = reqwest::get(format!("http://{address}:80/hello.txt"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "hello from a pod\n");

    // A Pod that may not restart: it finds the Service by name and ends.
    let lookup: Pod = serde_json::from_value(json!({
        "metadata": {"name": "lookup"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "lookup", "image": "shell",
                            "command": ["sh", "-c", "getent hosts web.kubelet.svc.cluster.local"]}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &lookup).await.unwrap();
    eventually_or("the lookup Pod to succeed", WAIT, async || {
        let p = pods.get("lookup").await.map_err(|e| e.to_string())?;
        match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => Ok(()),
            other => Err(format!("{other:?}: {:?}", p.status)),
        }
    })
    .await;
    let log = std::fs::read_to_string(
        dir.path()
            .join("pods")
            .join(ns)
            .join("lookup")
            .join("lookup.log"),
    )
    .unwrap();
    assert!(log.starts_with(&format!("{address} ")), "{log}");
    let failing: Pod = serde_json::from_value(json!({
        "metadata": {"name": "failing"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "failing", "image": "shell", "command": ["sh", "-c", "exit 3"]}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &failing).await.unwrap();
    eventually_or("the failing Pod to fail", WAIT, async || {
        let p = pods.get("failing").await.map_err(|e| e.to_string())?;
        let status = p.status.clone().unwrap_or_default();
        let code = status
            .container_statuses
            .iter()
            .flatten()
            .find_map(|c| c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code));
        match (status.phase.as_deref(), code) {
            (Some("Failed"), Some(3)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The Deployment goes: its Pods stop and are removed (the garbage
    // collector deletes them gracefully; the kubelet finishes the job).
    deployments
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually_or("the web Pods to be gone", WAIT, async || {
        let left = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.items.len()))
        }
    })
    .await;
    let reached = reqwest::Client::new()
        .get(format!("http://{address}:80/hello.txt"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(reached.is_err(), "the Service still answers: {reached:?}");
}

/// As a real kubelet does, the stand-in tells every container where the
/// API server is (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`,
/// with `enableServiceLinks: false` too), and the server's certificate
/// verifies for that host against the CA the namespace's
/// `kube-root-ca.crt` publishes: a Pod with the projected volume a
/// ServiceAccount token comes in (token, CA, namespace) asks the server who
/// it is, over TLS checked with that CA only, and is told its account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_reach_the_api_server_with_the_published_ca_as_their_account() {
    let plane = ControlPlane::shared();
    let ns = "kubelet-api";
    plane.kubectl_ok(ADMIN, &["create", "namespace", ns]);
    let dir = tempfile::tempdir().unwrap();
    let sh = program("sh");
    program("curl");
    let _kubelet = Kubelet::start(
        plane,
        &[ns],
        &[("shell", sh.as_path())],
        &dir.path().join("pods"),
    );
    let client = plane.client(ADMIN).await;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let config_maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns);
    // Published by the controller manager in every namespace, as is the
    // namespace's `default` ServiceAccount.
    let ca = eventually_or(
        "kube-root-ca.crt in the namespace",
        WAIT,
        async || match config_maps.get_opt("kube-root-ca.crt").await {
            Ok(Some(c)) => c
                .data
                .and_then(|d| d.get("ca.crt").cloned())
                .ok_or_else(|| "no ca.crt".to_string()),
            Ok(None) => Err("not yet".into()),
            Err(e) => Err(e.to_string()),
        },
    )
    .await;
    let accounts =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), ns);
    eventually_or("the default ServiceAccount", WAIT, async || match accounts
        .get_opt("default")
        .await
    {
        Ok(Some(_)) => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;
    let dir_in_pod = "/var/run/secrets/kubernetes.io/serviceaccount";
    let script = format!(
        r#"echo "api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
curl -sS --fail --cacert {dir_in_pod}/ca.crt \
  -H "Authorization: Bearer $(cat {dir_in_pod}/token)" -H 'Content-Type: application/json' \
  -d '{{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}}' \
  "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/apis/authentication.k8s.io/v1/selfsubjectreviews"
echo
echo "namespace=$(cat {dir_in_pod}/namespace)""#
    );
    let who: Pod = serde_json::from_value(json!({
        "metadata": {"name": "who"},
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": false,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "who", "image": "shell", "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "api", "mountPath": dir_in_pod, "readOnly": true}],
            }],
            "volumes": [{"name": "api", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]}}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &who).await.unwrap();
    let log_file = dir.path().join("pods").join(ns).join("who").join("who.log");
    eventually_or("the Pod to succeed", WAIT, async || {
        let p = pods.get("who").await.map_err(|e| e.to_string())?;
        match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => Ok(()),
            other => Err(format!(
                "{other:?}: {:?}\nlog: {}",
                p.status,
                std::fs::read_to_string(&log_file).unwrap_or_default()
            )),
        }
    })
    .await;
    let log = std::fs::read_to_string(&log_file).unwrap();
    let url = reqwest::Url::parse(&plane.url).unwrap();
    let address = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    assert!(log.contains(&format!("api={address}\n")), "{log}");
    let review: serde_json::Value = log
        .find('{')
        .zip(log.rfind('}'))
        .and_then(|(from, to)| serde_json::from_str(&log[from..=to]).ok())
        .unwrap_or_else(|| panic!("no SelfSubjectReview in the log: {log}"));
    assert_eq!(
        review["status"]["userInfo"]["username"],
        format!("system:serviceaccount:{ns}:default"),
        "{log}"
    );
    assert!(log.contains(&format!("namespace={ns}\n")), "{log}");

    // The same check from here: the published CA, and nothing else, is
    // enough for that host.
    let http = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
        .no_proxy()
        .build()
        .unwrap();
    let version = http
        .get(format!("https://{address}/version"))
        .send()
        .await
        .expect("the API server's certificate verifies against kube-root-ca.crt");
    assert!(version.status().is_success(), "{version:?}");
}
