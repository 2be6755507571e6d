//! How long a session's secret values stay in memory: `--live-session-ttl`
//! (idle time) and `--max-live-sessions` (least recently used first).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use super::harness::{agent, answer, Between, Client, Hook, Reply, World};
use crate::error::Code;
use crate::service::{Service, ServiceConfig};
use bindery_store::model::{SessionRecord, SessionStatus};

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
    assert_eq!(refused.code, Code::ParamsRequired, "{}", refused.message);
    assert_eq!(refused.params, ["token"]);
}

/// The server's own sweep (what `serve` runs), on the paused clock: an
/// idle session's secrets go within a quarter of the TTL after it passes,
/// and the memory they held is let go.
#[tokio::test(start_paused = true)]
async fn the_servers_sweep_forgets_an_idle_sessions_secrets_after_its_ttl() {
    let (_world, server) = half_hour_vault(&[]).await;
    let released = Arc::new(AtomicBool::new(false));
    let told = released.clone();
    let stop = tokio_util::sync::CancellationToken::new();
    let sweep = tokio::spawn(
        server
            .clone()
            .forget_idle(stop.clone(), move || told.store(true, Ordering::SeqCst)),
    );
    let client = Client(&server);
    let id = client.open("vault", json!({"token": "s3cret"})).await;
    tokio::time::sleep(29 * MINUTE).await;
    assert_eq!(server.secrets().names(&id), ["token"]);
    assert!(!released.load(Ordering::SeqCst));
    tokio::time::sleep(MINUTE + 8 * MINUTE).await;
    assert!(server.secrets().names(&id).is_empty());
    assert_eq!(server.live_count(), 0);
    assert!(released.load(Ordering::SeqCst), "the memory was not let go");
    stop.cancel();
    sweep.await.unwrap();
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

/// A run longer than the TTL that never uses the secret: the clock moves
/// past the TTL as its start is written. Then `end` steps in as its end
/// is written.
struct LongRun {
    end: Arc<Between<usize>>,
    moved: AtomicBool,
}

#[async_trait]
impl Hook for LongRun {
    async fn read(&self, id: &str) {
        self.end.read(id).await;
    }

    async fn written(&self, rec: &SessionRecord) {
        if rec.status == SessionStatus::Running && !self.moved.swap(true, Ordering::SeqCst) {
            tokio::time::advance(31 * MINUTE).await;
        }
        self.end.written(rec).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_longer_than_the_ttl_keeps_its_secrets_as_it_ends() {
    // As the run's end is written, a token revocation queues for the
    // session's lock and sweeps idle sessions once through: after the
    // end's write, before the run's task has cleaned up after it.
    let end = Between::new(SessionStatus::Idle, |server, rec| {
        Box::pin(async move {
            server
                .tokens()
                .revoke(&crate::validate::Caller::Owner, &rec.id)
                .await
                .unwrap();
            server.secrets().expire()
        })
    });
    let hook = Arc::new(LongRun {
        end: end.clone(),
        moved: AtomicBool::new(false),
    });
    let world = World::watched(&[vault()], false, hook.clone()).await;
    world.model.then(Reply::Text("done"));
    let server = world
        .server(ServiceConfig {
            live_session_ttl: Some(30 * MINUTE),
            ..Default::default()
        })
        .await;
    end.on(&server);
    let client = Client(&server);
    let id = client.open("vault", json!({"token": "s3cret"})).await;

    let rec = client.say(&id, "a long one").await;
    assert_eq!(answer(&rec), Some("done"));
    assert!(
        hook.moved.load(Ordering::SeqCst),
        "the clock moved during the run"
    );
    assert_eq!(
        end.outcome().await,
        0,
        "a session whose run just ended is not idle"
    );
    assert_eq!(server.secrets().names(&id), ["token"]);
}
