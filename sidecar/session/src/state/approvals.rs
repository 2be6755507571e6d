//! Pending calls as people and clients see them: each item's
//! continuation token (derived, never stored), the items a session shows,
//! the approver's list, and the notices an agent's approval webhook gets.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use crate::error::ServiceError;
use crate::kube_events::KubeEvents;
use crate::notify::Retries;
use crate::state::agents::Agents;
use crate::state::live_sessions::LiveSessions;
use bindery_metrics::Metrics;
use bindery_store::clock::Clock;
use bindery_store::model::{SessionRecord, SessionStatus};
use bindery_store::pending::{self, PendingCall};
use bindery_store::wire::{Approval, PendingItem};
use bindery_store::SessionStore;
use bindery_tools::Disposition;

/// The pending calls' tokens, views and notices.
pub struct Approvals {
    /// Derives continuation tokens: replicas that share it show the same.
    key: [u8; 32],
    store: Arc<dyn SessionStore>,
    live: Arc<LiveSessions>,
    agents: Arc<Agents>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    /// Sends approval notices (the outbound policy's client).
    notices: reqwest::Client,
    /// The base of the answer URLs in notices (`--public-url`).
    public_url: Option<String>,
    retries: Retries,
    /// A Warning Event on the tenant for a notice that failed for good.
    kube_events: Arc<OnceLock<KubeEvents>>,
}

impl Approvals {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        key: [u8; 32],
        store: Arc<dyn SessionStore>,
        live: Arc<LiveSessions>,
        agents: Arc<Agents>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        public_url: Option<String>,
        retries: Retries,
        kube_events: Arc<OnceLock<KubeEvents>>,
    ) -> Approvals {
        Approvals {
            key,
            store,
            live,
            agents,
            metrics,
            clock,
            notices: bindery_llm::egress::client(bindery_spec::Redirects::SameOrigin)
                .build()
                .unwrap_or_default(),
            public_url,
            retries,
            kube_events,
        }
    }

    /// The token of a pending item of session `id`.
    pub(crate) fn token_of(&self, id: &str, item: &PendingCall) -> String {
        pending::token_for(&self.key, id, &item.id(), &item.nonce)
    }

    /// When session `id` waits for one choice only and `text` names one of
    /// its options (a one-based number as shown, or an exact label): the
    /// item's token and the option's id.
    pub(crate) async fn chat_choice(
        &self,
        id: &str,
        text: &str,
    ) -> Result<Option<(String, Option<String>)>, ServiceError> {
        let rec = super::stored_session(&*self.store, id).await?;
        if rec.status != SessionStatus::WaitingExternal {
            return Ok(None);
        }
        let mut open = rec.pending.open();
        let (Some(item), None) = (open.next(), open.next()) else {
            return Ok(None);
        };
        if item.disposition != Disposition::NeedsSelection {
            return Ok(None);
        }
        Ok(item
            .lookup
            .as_ref()
            .and_then(|l| l.option_named(text))
            .map(|option| (self.token_of(id, item), Some(option))))
    }

    /// The open pending items as the API shows them, with their tokens
    /// (never a bound value).
    pub fn pending_view(&self, rec: &SessionRecord) -> Vec<PendingItem> {
        rec.pending
            .open()
            .map(|i| PendingItem {
                continuation_token: Some(self.token_of(&rec.id, i)),
                expires_at: i.expires_at.map(|t| {
                    let at = UNIX_EPOCH + Duration::from_millis(t.max(0) as u64);
                    humantime::format_rfc3339_millis(at).to_string()
                }),
                ..i.shown()
            })
            .collect()
    }

    /// Send the agent's approval webhook a notice for each item of `rec`
    /// that waits for a person's approval, in the background; one that
    /// fails for good says so in the session's `status_detail`.
    pub(crate) fn announce(self: &Arc<Self>, rec: &SessionRecord) {
        let Ok(agent) = self.agents.agent(&rec.agent) else {
            return;
        };
        let Some(hook) = agent
            .spec
            .approvals
            .as_ref()
            .and_then(|a| a.webhook.clone())
        else {
            return;
        };
        let values = agent.process_values();
        let Some(bindery_params::ParamValue::Secret(key)) = values.get(&hook.signing_key.param)
        else {
            tracing::warn!(agent = %rec.agent, param = %hook.signing_key.param, "no approval notice sent: the webhook's signing key has no value; give the parameter one");
            return;
        };
        let key = key.clone();
        // Without --public-url the links are relative (`/v1/approvals/…`):
        // the receiver knows where it reaches the tenant.
        let base = self.public_url.clone().unwrap_or_default();
        let items = self.pending_view(rec).into_iter().filter(|i| {
            matches!(
                i.disposition,
                Disposition::Confirm | Disposition::NeedsConfirmation
            )
        });
        for item in items {
            let item = serde_json::to_value(&item).expect("a pending item is plain JSON");
            let (id, body) =
                crate::notify::notice(&rec.id, &rec.agent, &item, &base, self.clock.now_ms());
            let client = self.notices.clone();
            let metrics = self.metrics.clone();
            let retries = self.retries;
            let me = Arc::downgrade(self);
            let session = rec.id.clone();
            let url = hook.url.clone();
            let key = key.clone();
            let tool = item["tool"].as_str().unwrap_or_default().to_string();
            tokio::spawn(async move {
                let (attempts, sent) = crate::notify::deliver(
                    &client,
                    &url,
                    key.expose().as_bytes(),
                    &id,
                    &body,
                    retries,
                )
                .await;
                let retried = attempts - u32::from(sent.is_ok());
                for _ in 0..retried {
                    metrics.approval_notice("retried");
                }
                match sent {
                    Ok(()) => {
                        metrics.approval_notice("delivered");
                        tracing::info!(session = %session, notice = %id, attempts, "approval notice delivered");
                    }
                    Err(why) => {
                        metrics.approval_notice("failed");
                        tracing::warn!(session = %session, notice = %id, "approval notice not delivered: {why}");
                        if let Some(me) = me.upgrade() {
                            me.notice_failed(&session, &tool, &why.to_string()).await;
                        }
                    }
                }
            });
        }
    }

    /// A notice failed for good: the waiting session's `status_detail`
    /// says so, and a Warning Event on the tenant where there are Events.
    async fn notice_failed(&self, id: &str, tool: &str, why: &str) {
        if let Some(events) = self.kube_events.get() {
            let note = format!(
                "the approval notice for {tool} in session {id} could not be delivered: {why}"
            );
            events.warn("ApprovalNoticeFailed", "Notify", &note).await;
        }
        let live = self.live.entry(id);
        let written = async {
            let _guard = live.lock.lock().await;
            let Some(mut rec) = self.store.get(id).await? else {
                return Ok(());
            };
            if rec.status != SessionStatus::WaitingExternal {
                return Ok(());
            }
            rec.status_detail = Some(format!(
                "{}; the approval webhook could not be told: {why}",
                rec.pending.detail()
            ));
            rec.version += 1;
            rec.updated_at = self.clock.now_ms();
            self.store
                .update(&mut rec)
                .await
                .map_err(ServiceError::from)
        }
        .await;
        drop(live);
        self.live.evict_if_idle(id);
        if let Err(e) = written {
            tracing::warn!(
                session = id,
                "cannot record that an approval notice failed: {}",
                e.message
            );
        }
    }

    /// Every open item that waits for a person, in every session that
    /// waits, as an approver sees it: the item as the session API shows it
    /// (its token included) with its session and agent, and nothing else
    /// of the conversation. Deferred calls wait for the client, not a person.
    pub async fn list(&self) -> Result<Vec<Approval>, ServiceError> {
        let mut out = Vec::new();
        for rec in self.store.waiting().await? {
            for item in self.pending_view(&rec) {
                if item.disposition == Disposition::Deferred {
                    continue;
                }
                out.push(Approval {
                    session_id: rec.id.clone(),
                    agent: rec.agent.clone(),
                    item,
                });
            }
        }
        Ok(out)
    }
}
