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
use std::time::{Duration, SystemTime};

use serde_json::json;

/// Where the projected volume puts the token, the CA and the namespace.
pub const DIR_ENV: &str = "BINDERY_EVENTS_DIR";

/// The field manager of the tenant's `status.budgets`: the operator
/// applies the rest of the status as its own, so neither takes the other's.
pub const STATUS_MANAGER: &str = "bindery-sidecar";

/// The most an Event's note may hold, in bytes (the API server counts
/// bytes).
const NOTE_LIMIT: usize = 1024;

/// `text` cut to at most `limit` bytes, on a character boundary.
fn cut(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Why the pod cannot post Events although the operator meant it to.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{DIR_ENV} is set but {0} is not")]
    Missing(&'static str),
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Ca {
        path: PathBuf,
        source: reqwest::Error,
    },
    #[error("the Events client: {0}")]
    Client(reqwest::Error),
}

pub struct KubeEvents {
    client: reqwest::Client,
    /// `https://HOST:PORT/apis/events.k8s.io/v1/namespaces/NS/events`.
    url: String,
    /// `https://HOST:PORT/apis/bindery.dev/v1alpha1/namespaces/NS/agenttenants/T/status`.
    status_url: String,
    token: PathBuf,
    namespace: String,
    tenant: String,
    uid: String,
    instance: String,
}

impl KubeEvents {
    /// From the environment, when the operator set it up; `Err` says what
    /// is missing (the server starts without Events then, and says so).
    pub fn from_env() -> Result<Option<KubeEvents>, SetupError> {
        let Some(dir) = std::env::var_os(DIR_ENV).map(PathBuf::from) else {
            return Ok(None);
        };
        let var = |name: &'static str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .ok_or(SetupError::Missing(name))
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let tenant = var("BINDERY_TENANT")?;
        let uid = var("BINDERY_TENANT_UID")?;
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|source| SetupError::Read { path, source })
        };
        let namespace = String::from_utf8_lossy(&read("namespace")?)
            .trim()
            .to_string();
        let ca = reqwest::Certificate::from_pem_bundle(&read("ca.crt")?).map_err(|source| {
            SetupError::Ca {
                path: dir.join("ca.crt"),
                source,
            }
        })?;
        // The cluster's CA only: the API server is trusted for nothing else.
        let client = bindery_llm::egress::client(bindery_spec::Redirects::Never)
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .tls_certs_only(ca)
            .build()
            .map_err(SetupError::Client)?;
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
            status_url: format!(
                "https://{host}:{port}/apis/bindery.dev/v1alpha1/namespaces/{namespace}/agenttenants/{tenant}/status?fieldManager={STATUS_MANAGER}&force=true"
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

    /// The Event of a Warning with `reason`, `action` and `note` on the
    /// tenant, at `now`.
    fn event(&self, reason: &str, action: &str, note: &str, now: SystemTime) -> serde_json::Value {
        json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            // The API server checks the prefix as a name (a trailing `-`
            // aside): `acme.` would be refused.
            "metadata": {"generateName": format!("{}-", self.tenant), "namespace": self.namespace},
            "eventTime": humantime::format_rfc3339_micros(now).to_string(),
            "reportingController": "bindery.dev/sidecar",
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "type": "Warning",
            "note": cut(note, NOTE_LIMIT),
            "regarding": {
                "apiVersion": "bindery.dev/v1alpha1",
                "kind": "AgentTenant",
                "name": self.tenant,
                "namespace": self.namespace,
                "uid": self.uid,
            },
        })
    }

    /// The server-side apply body of the tenant's budget rows.
    fn status_patch(&self, rows: &[bindery_spec::budget::BudgetStatus]) -> serde_json::Value {
        json!({
            "apiVersion": "bindery.dev/v1alpha1",
            "kind": "AgentTenant",
            "metadata": {"name": self.tenant, "namespace": self.namespace},
            "status": {
                "budgets": rows,
                "budgetSummary": rows.iter().map(|r| r.summary()).collect::<Vec<_>>(),
            },
        })
    }

    /// Apply `rows` as the tenant's `status.budgets` (and their summary
    /// lines). A failure is logged: the next write tries again.
    pub async fn budget_status(&self, rows: &[bindery_spec::budget::BudgetStatus]) {
        let request = self
            .client
            .patch(&self.status_url)
            .header("Content-Type", "application/apply-patch+yaml")
            .body(self.status_patch(rows).to_string());
        if self.send(request, "the tenant's budget status").await {
            tracing::debug!(
                budgets = rows.len(),
                "the tenant's budget status was written"
            );
        }
    }

    /// Record a Warning with `reason` and `note` on the tenant. A failure
    /// is logged, never raised: an Event is a courtesy, the session and
    /// the metrics say it too.
    pub async fn warn(&self, reason: &str, action: &str, note: &str) {
        let event = self.event(reason, action, note, SystemTime::now());
        let request = self.client.post(&self.url).json(&event);
        if self
            .send(request, &format!("a Kubernetes Event ({reason})"))
            .await
        {
            tracing::info!(reason, "a Warning Event was recorded on the AgentTenant");
        }
    }

    /// Send `request` with the pod's token; whether the API server took
    /// it. A failure is logged as about `what`.
    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> bool {
        // Read each time: a projected token is renewed while the pod runs.
        let token = match std::fs::read_to_string(&self.token) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("cannot send {what}: {}: {e}", self.token.display());
                return false;
            }
        };
        match request.bearer_auth(token.trim()).send().await {
            Ok(r) if r.status().is_success() => true,
            Ok(r) => {
                let status = r.status().as_u16();
                // Its Status says why (a field of the object, never a value
                // of the session's).
                let why = r
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_string))
                    .unwrap_or_default();
                tracing::warn!(status, "the API server refused {what}: {why}");
                false
            }
            Err(e) => {
                tracing::warn!("cannot send {what}: {}", e.without_url());
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events() -> KubeEvents {
        KubeEvents {
            client: reqwest::Client::new(),
            url: String::new(),
            status_url: String::new(),
            token: PathBuf::new(),
            namespace: "shop".into(),
            tenant: "acme".into(),
            uid: "0b7c3b0e-1111-4a4a-9f9f-000000000001".into(),
            instance: "acme-7d4b9c-x2x5q".into(),
        }
    }

    #[test]
    fn the_event_is_what_events_k8s_io_v1_accepts() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_764_614_400_000_001);
        let e = events().event("ApprovalNoticeFailed", "Notify", "why", at);
        // A generateName is checked as a DNS subdomain once a trailing `-`
        // is set aside.
        let prefix = e["metadata"]["generateName"].as_str().unwrap();
        assert_eq!(prefix, "acme-");
        let name = prefix.trim_end_matches('-');
        assert!(
            name.split('.').all(|label| !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')),
            "{prefix}"
        );
        // MicroTime: microseconds, UTC.
        assert_eq!(e["eventTime"], "2025-12-01T18:40:00.000001Z");
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["reportingController"], "bindery.dev/sidecar");
        assert_eq!(e["reportingInstance"], "acme-7d4b9c-x2x5q");
        assert_eq!(
            e["regarding"],
            json!({"apiVersion": "bindery.dev/v1alpha1", "kind": "AgentTenant", "name": "acme",
                   "namespace": "shop", "uid": "0b7c3b0e-1111-4a4a-9f9f-000000000001"})
        );
    }

    #[test]
    fn a_long_note_is_cut_to_1024_bytes_on_a_character_boundary() {
        let note = "é".repeat(1000);
        let e = events().event("R", "A", &note, SystemTime::UNIX_EPOCH);
        let cut = e["note"].as_str().unwrap();
        assert_eq!(cut.len(), 1024);
        assert!(note.starts_with(cut));
        assert_eq!(super::cut("short", 1024), "short");
    }
}
