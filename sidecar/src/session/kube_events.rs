//! Warning Events on the pod's `AgentTenant`, for what a person must know
//! and only the server sees: an approval notice that could not be
//! delivered. Only where the operator gives the pod what it takes
//! (`BINDERY_EVENTS_DIR`: a projected ServiceAccount token, the cluster's
//! CA and the namespace; `BINDERY_TENANT` and `BINDERY_TENANT_UID`), which
//! it does for a tenant whose agents have an approval webhook, its account
//! allowed to create Events and nothing else.
//!
//! An Event names the session and the tool and says why, never a value:
//! the notice's URL, the call's arguments and the key stay out of it.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

/// Where the projected volume puts the token, the CA and the namespace.
pub const DIR_ENV: &str = "BINDERY_EVENTS_DIR";

pub struct KubeEvents {
    client: reqwest::Client,
    /// `https://HOST:PORT/apis/events.k8s.io/v1/namespaces/NS/events`.
    url: String,
    token: PathBuf,
    namespace: String,
    tenant: String,
    uid: String,
    instance: String,
}

impl KubeEvents {
    /// From the environment, when the operator set it up; `Err` says what
    /// is missing (the server starts without Events then, and says so).
    pub fn from_env() -> Result<Option<KubeEvents>, String> {
        let Some(dir) = std::env::var_os(DIR_ENV).map(PathBuf::from) else {
            return Ok(None);
        };
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| format!("{DIR_ENV} is set but {name} is not"))
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let tenant = var("BINDERY_TENANT")?;
        let uid = var("BINDERY_TENANT_UID")?;
        let read = |file: &str| {
            std::fs::read(dir.join(file)).map_err(|e| format!("{}: {e}", dir.join(file).display()))
        };
        let namespace = String::from_utf8_lossy(&read("namespace")?)
            .trim()
            .to_string();
        let ca = reqwest::Certificate::from_pem_bundle(&read("ca.crt")?)
            .map_err(|e| format!("{}: {e}", dir.join("ca.crt").display()))?;
        // The cluster's CA only: the API server is trusted for nothing else.
        let client = crate::llm::egress::client(crate::spec::Redirects::Never)
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .tls_certs_only(ca)
            .build()
            .map_err(|e| format!("the Events client: {e}"))?;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Ok(Some(KubeEvents {
            client,
            url: format!(
                "https://{host}:{port}/apis/events.k8s.io/v1/namespaces/{namespace}/events"
            ),
            token: dir.join("token"),
            namespace,
            tenant,
            uid,
            instance: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "bindery-sidecar".into()),
        }))
    }

    /// Record a Warning with `reason` and `note` on the tenant. A failure
    /// is logged, never raised: an Event is a courtesy, the session and
    /// the metrics say it too.
    pub async fn warn(&self, reason: &str, action: &str, note: &str) {
        let event = json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"generateName": format!("{}.", self.tenant), "namespace": self.namespace},
            "eventTime": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            "reportingController": "bindery.dev/sidecar",
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "type": "Warning",
            "note": note.chars().take(1024).collect::<String>(),
            "regarding": {
                "apiVersion": "bindery.dev/v1alpha1",
                "kind": "AgentTenant",
                "name": self.tenant,
                "namespace": self.namespace,
                "uid": self.uid,
            },
        });
        // Read each time: a projected token is renewed while the pod runs.
        let token = match std::fs::read_to_string(&self.token) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(
                    "cannot record a Kubernetes Event ({reason}): {}: {e}",
                    self.token.display()
                );
                return;
            }
        };
        let sent = self
            .client
            .post(&self.url)
            .bearer_auth(token.trim())
            .json(&event)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                tracing::info!(reason, "a Warning Event was recorded on the AgentTenant")
            }
            Ok(r) => tracing::warn!(
                reason,
                status = r.status().as_u16(),
                "the API server refused a Kubernetes Event"
            ),
            Err(e) => tracing::warn!(
                reason,
                "cannot record a Kubernetes Event: {}",
                e.without_url()
            ),
        }
    }
}
