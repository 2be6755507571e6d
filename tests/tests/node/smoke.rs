//! The node itself: a pod under Pod Security `restricted` pulls its image
//! through the node's registry and reaches the API server by the
//! `kubernetes` Service's name.

use bindery_tests::node::Node;

#[test]
fn a_restricted_pod_pulls_through_the_registry_and_resolves_a_service() {
    let node = Node::shared();
    let ok = |args: &[&str]| {
        let out = node.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            node.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&["create", "namespace", "smoke"]);
    ok(&[
        "label",
        "namespace",
        "smoke",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let pod = node.dir().join("smoke-pod.yaml");
    std::fs::write(
        &pod,
        r#"apiVersion: v1
kind: Pod
metadata: {name: livez, namespace: smoke}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: curl
    image: curlimages/curl:8.11.1
    command: [curl, --fail, --silent, --show-error, --insecure, "https://kubernetes.default.svc/livez"]
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
"#,
    )
    .unwrap();
    ok(&["apply", "-f", pod.to_str().unwrap()]);
    let done = ok(&[
        "wait",
        "-n",
        "smoke",
        "pod/livez",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=120s",
    ]);
    assert!(done.contains("condition met"), "{done}");
    let log = ok(&["logs", "-n", "smoke", "livez"]);
    assert_eq!(log.trim(), "ok", "{log}");
}
