//! The hands of the node's tests and benches on the node ([`crate::node`]):
//! kubectl and helm as the administrator, manifests applied from text,
//! pods run to their end and read.

use std::time::Duration;

use crate::eventually::eventually_or_blocking;
use crate::helm::both;
use crate::node::Node;
use serde_json::Value;

/// How long a pod, a rollout or a reconcile may take on the node (image
/// pulls and starts included, the two cores shared with the build).
pub const WITHIN: Duration = Duration::from_secs(240);
/// The same, as helm and kubectl take it.
pub const TIMEOUT: &str = "240s";

/// kubectl and helm on one node.
pub struct Kube<'a> {
    pub node: &'a Node,
}

impl Kube<'_> {
    /// `kubectl args`, which must succeed; its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.node.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\n{}",
            both(&out),
            self.node.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether `kubectl args` succeeds.
    pub fn succeeds(&self, args: &[&str]) -> bool {
        self.node.kubectl(args).status.success()
    }

    /// `kubectl get ... -o json`.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&args)).expect("kubectl's JSON")
    }

    /// `kubectl apply` of `yaml`.
    pub fn apply(&self, yaml: &str) -> String {
        let file = tempfile::Builder::new()
            .suffix(".yaml")
            .tempfile_in(self.node.dir())
            .unwrap();
        std::fs::write(file.path(), yaml).unwrap();
        self.ok(&["apply", "-f", file.path().to_str().unwrap()])
    }

    /// A namespace that enforces Pod Security `restricted`.
    pub fn restricted_namespace(&self, ns: &str) {
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    \
             pod-security.kubernetes.io/enforce: restricted\n    \
             pod-security.kubernetes.io/enforce-version: latest\n"
        ));
    }

    /// `helm args`, which must succeed; its standard output.
    pub fn helm(&self, args: &[&str]) -> String {
        let out = self.node.helm(args);
        assert!(
            out.status.success(),
            "helm {args:?}: {}\n{}",
            both(&out),
            self.node.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every object of each of `kinds` in every namespace, as JSON text
    /// (where a test looks for a value that must not be there).
    pub fn all_of(&self, kinds: &[&str]) -> String {
        kinds
            .iter()
            .map(|kind| self.ok(&["get", "-A", kind, "-o", "json"]))
            .collect()
    }

    /// `helm uninstall RELEASE -n NS --wait`: what the release owned is
    /// gone when it returns.
    pub fn uninstall(&self, release: &str, ns: &str) {
        self.helm(&[
            "uninstall",
            release,
            "-n",
            ns,
            "--wait",
            "--timeout",
            TIMEOUT,
        ]);
    }

    /// Wait until `check` answers, at most [`WITHIN`]; on timeout, panic
    /// with what it last saw and the node's logs.
    pub fn until<T>(&self, what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
        eventually_or_blocking(what, WITHIN, || {
            check().map_err(|seen| format!("{seen}\n{}", self.node.logs()))
        })
    }

    /// Run `pod` (a Pod manifest with `restartPolicy: Never`) to its end,
    /// and return its phase and log; the pod is deleted.
    pub fn run_pod(&self, ns: &str, name: &str, pod: &str) -> (String, String) {
        self.apply(pod);
        let phase = self.until(&format!("pod {ns}/{name} to end"), || {
            let p = self.json(&["get", "-n", ns, "pod", name]);
            match p["status"]["phase"].as_str() {
                Some(phase @ ("Succeeded" | "Failed")) => Ok(phase.to_string()),
                _ => Err(format!("{:#}", p["status"])),
            }
        });
        let log = self.ok(&["logs", "-n", ns, name]);
        self.ok(&["delete", "-n", ns, "pod", name, "--wait=false"]);
        (phase, log)
    }
}

/// A pod of the chart's test image (curl, as uid 65532, restricted) with
/// `labels`, running `curl args`; `$(TOKEN)` in an argument is the value of
/// the Secret key `token_from` (`name/key`), if given.
pub fn curl_pod(
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    token_from: Option<(&str, &str)>,
    args: &[&str],
) -> String {
    let labels: String = labels
        .iter()
        .map(|(k, v)| format!("\n    {k}: {v:?}"))
        .collect();
    let env = token_from
        .map(|(secret, key)| {
            format!(
                "\n    env:\n    - name: TOKEN\n      valueFrom: {{secretKeyRef: {{name: {secret}, key: {key}}}}}"
            )
        })
        .unwrap_or_default();
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels:
    bindery.test/pod: {name}{labels}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile: {{type: RuntimeDefault}}
  containers:
  - name: curl
    image: curlimages/curl:8.11.1
    command: [curl]
    args: [{args}]{env}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {{drop: [ALL]}}
"#,
        args = args.join(", "),
    )
}
