//! How long a session's secret values stay in memory: `--live-session-ttl`
//! (idle time) and `--max-live-sessions` (least recently used first).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::task::JoinHandle;

use super::harness::{agent, answer, Client, Hook, Reply, World};
use crate::session::model::{SessionRecord, SessionStatus};
use crate::session::service::{Service, ServiceConfig};

const MINUTE: Duration = Duration::from_secs(60);

/// An agent with a secret a client gives per session.
fn vault() -> String {
    agent(
        "vault",
        "  parameters: [{name: token, secret: true, scope: session}]\n",
    )
}

/// A world of [`vault`] whose model answers `replies`, and a server of it
/// that forgets idle sessions' secrets after half an hour.
async fn half_hour_vault(replies: &[&'static str]) -> (World, Arc<Service>) {
    let world = World::new(&[vault()]).await;
    for reply in replies {
        world.model.then(Reply::Text(reply));
    }
    let server = world
        .server(ServiceConfig {
            live_session_ttl: Some(30 * MINUTE),
            ..Default::default()
        })
        .await;
    (world, server)
}

#[tokio::test(start_paused = true)]
async fn an_idle_sessions_secrets_are_forgotten_once_its_ttl_passes_and_not_before() {
    let (_world, server) = half_hour_vault(&[]).await;
    let client = Client(&server);
    let id = client.open("vault", json!({"token": "s3cret"})).await;
    assert_eq!(server.secrets().names(&id), ["token"]);

    tokio::time::advance(29 * MINUTE).await;
    assert_eq!(server.secrets().expire(), 0);
    assert_eq!(server.secrets().names(&id), ["token"]);

    tokio::time::advance(2 * MINUTE).await;
    assert_eq!(server.secrets().expire(), 1);
    assert!(server.secrets().names(&id).is_empty());
    assert_eq!(server.live_count(), 0, "nothing of it is left in memory");
    // A message without the secret is refused.
    let refused = client.refused(&id, "still there?").await;
    assert_eq!(refused.code, "params_required", "{}", refused.message);
    assert_eq!(refused.params, ["token"]);
}

#[tokio::test(start_paused = true)]
async fn a_message_renews_the_ttl() {
    let (_world, server) = half_hour_vault(&["hello"]).await;
    let client = Client(&server);
    let id = client.open("vault", json!({"token": "s3cret"})).await;

    tokio::time::advance(20 * MINUTE).await;
    assert_eq!(answer(&client.say(&id, "hi").await), Some("hello"));
    tokio::time::advance(20 * MINUTE).await;
    assert_eq!(server.secrets().expire(), 0, "40 minutes old, 20 idle");
    tokio::time::advance(11 * MINUTE).await;
    assert_eq!(server.secrets().expire(), 1);
}

/// Past `max_live_sessions` the session used least recently forgets its
/// secrets first; one that was just used is kept.
#[tokio::test(start_paused = true)]
async fn past_the_limit_the_least_recently_used_session_forgets_first() {
    let world = World::new(&[vault()]).await;
    world.model.then(Reply::Text("ok"));
    let server = world
        .server(ServiceConfig {
            max_live_sessions: Some(2),
            ..Default::default()
        })
        .await;
    let client = Client(&server);
    let a = client.open("vault", json!({"token": "a"})).await;
    tokio::time::advance(MINUTE).await;
    let b = client.open("vault", json!({"token": "b"})).await;
    tokio::time::advance(MINUTE).await;
    client.say(&a, "still here").await;
    tokio::time::advance(MINUTE).await;

    let c = client.open("vault", json!({"token": "c"})).await;

    assert_eq!(server.secrets().names(&a), ["token"], "used a minute ago");
    assert!(
        server.secrets().names(&b).is_empty(),
        "used two minutes ago"
    );
    assert_eq!(server.secrets().names(&c), ["token"]);
    assert_eq!(server.live_count(), 2);
}

/// Moves the clock past the TTL while the run's start is stored (a long
/// run that never uses the secret), and, as the run's end is stored,
/// queues a request on the session's lock (a token revocation) that
/// sweeps idle sessions once it is through: the sweep runs after the end's write, before the run's
/// task has cleaned up after it.
#[derive(Default)]
struct SweepAtTheEnd {
    server: OnceLock<Weak<Service>>,
    /// The run's start was written (and the clock moved on).
    started: AtomicBool,
    /// The request at the end has read the session: it is queued for the
    /// session's lock.
    queued: AtomicBool,
    swept: Mutex<Option<JoinHandle<usize>>>,
}

#[async_trait]
impl Hook for SweepAtTheEnd {
    async fn read(&self, _id: &str) {
        if self.swept.lock().unwrap().is_some() {
            self.queued.store(true, Ordering::SeqCst);
        }
    }

    async fn written(&self, rec: &SessionRecord) {
        if rec.status == SessionStatus::Running && !self.started.swap(true, Ordering::SeqCst) {
            tokio::time::advance(31 * MINUTE).await;
            return;
        }
        if rec.status != SessionStatus::Idle || self.swept.lock().unwrap().is_some() {
            return;
        }
        let server = self.server.get().and_then(Weak::upgrade).unwrap();
        let id = rec.id.clone();
        let swept = tokio::spawn(async move {
            // A revocation of its tokens: it reads the session, then
            // queues for its lock, and uses no secret.
            server.tokens().revoke(&id).await.unwrap();
            server.secrets().expire()
        });
        *self.swept.lock().unwrap() = Some(swept);
        while !self.queued.load(Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_longer_than_the_ttl_keeps_its_secrets_as_it_ends() {
    let hook = Arc::new(SweepAtTheEnd::default());
    let world = World::watched(&[vault()], false, hook.clone()).await;
    world.model.then(Reply::Text("done"));
    let server = world
        .server(ServiceConfig {
            live_session_ttl: Some(30 * MINUTE),
            ..Default::default()
        })
        .await;
    hook.server.set(Arc::downgrade(&server)).unwrap();
    let client = Client(&server);
    let id = client.open("vault", json!({"token": "s3cret"})).await;

    let rec = client.say(&id, "a long one").await;
    assert_eq!(answer(&rec), Some("done"));
    assert!(
        hook.started.load(Ordering::SeqCst),
        "the clock moved during the run"
    );
    let swept = hook.swept.lock().unwrap().take();
    let swept = swept.expect("the run's end was written").await.unwrap();
    assert_eq!(swept, 0, "a session whose run just ended is not idle");
    assert_eq!(server.secrets().names(&id), ["token"]);
}
