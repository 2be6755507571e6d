//! Two servers on one shared store: a run is vouched for by its server's
//! heartbeat, and taken for lost only once the lease has passed without one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::harness::{agent, asked, no_params, Client, Reply, World};
use crate::error::Code;
use crate::service::{RunMode, RunWait, Service, ServiceConfig};
use crate::validate::Caller;
use bindery_store::model::SessionStatus;

/// The default lease: a beat every 10 s vouches for 30 s.
const LEASE: Duration = Duration::from_secs(30);

/// A run on `server` that waits on the model.
async fn hanging_run(world: &World, server: &Arc<Service>) -> (String, RunWait) {
    world.model.then(Reply::Hang);
    let id = Client(server).open("clerk", no_params()).await;
    let run = server
        .sessions()
        .post_message(
            &Caller::Owner,
            &id,
            "hello?".into(),
            &BTreeMap::new(),
            RunMode::UntilBlocked,
        )
        .await
        .unwrap();
    asked(&world.model, 1).await;
    (id, run)
}

#[tokio::test(start_paused = true)]
async fn a_run_is_taken_for_lost_only_once_its_servers_lease_has_passed() {
    let world = World::shared(&[agent("clerk", "")]).await;
    let a = world.server(ServiceConfig::default()).await;
    let b = world.server(ServiceConfig::default()).await;
    let (id, _run) = hanging_run(&world, &a).await;

    // A beat a second short of the lease ago vouches for the run: b
    // leaves it, and refuses a message meanwhile.
    let beat = world.store.heartbeats().await.unwrap()[a.instance()];
    let lease_ms = i64::try_from(LEASE.as_millis()).unwrap();
    let to = beat + lease_ms - 1000 - a.now_ms();
    tokio::time::advance(Duration::from_millis(u64::try_from(to).unwrap())).await;
    assert_eq!(b.heartbeat().sweep().await.unwrap(), 0);
    // The run goes on elsewhere.
    let busy = Client(&b).refused(&id, "me too").await;
    assert_eq!(busy.code, Code::RunInProgress, "{}", busy.message);

    // a stopped beating (no keep_alive runs here): once the lease has
    // passed, b closes the run as failed.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(b.heartbeat().sweep().await.unwrap(), 1);
    let rec = b.record(&id).await.unwrap();
    assert_eq!(rec.status, SessionStatus::Failed);
    assert_eq!(
        rec.status_detail.as_deref(),
        Some("interrupted: the server running it stopped")
    );
    assert_eq!(b.heartbeat().sweep().await.unwrap(), 0, "closed once");
}

#[tokio::test(start_paused = true)]
async fn a_server_that_keeps_beating_keeps_its_run_and_one_that_stops_gives_it_up_at_once() {
    let world = World::shared(&[agent("clerk", "")]).await;
    let a = world.server(ServiceConfig::default()).await;
    let b = world.server(ServiceConfig::default()).await;
    let (id, _run) = hanging_run(&world, &a).await;
    let stop = CancellationToken::new();
    let beating = tokio::spawn(a.clone().keep_alive(stop.clone()));

    // Five leases long, a beat every 10 s: each time, once a has beaten
    // (its beat is a store write, which takes time of its own), b finds
    // the run vouched for.
    for _ in 0..15 {
        tokio::time::advance(Duration::from_secs(10)).await;
        let due = a.now_ms();
        bindery_tests::eventually::eventually("a beats", Duration::from_secs(60), async || {
            let beats = world.store.heartbeats().await.unwrap();
            beats.get(a.instance()).filter(|&&at| at >= due).map(drop)
        })
        .await;
        assert_eq!(b.heartbeat().sweep().await.unwrap(), 0);
    }
    assert_eq!(b.record(&id).await.unwrap().status, SessionStatus::Running);

    // A server that stops forgets its heartbeat: its runs are lost at once.
    stop.cancel();
    beating.await.unwrap();
    assert_eq!(b.heartbeat().sweep().await.unwrap(), 1);
    assert_eq!(b.record(&id).await.unwrap().status, SessionStatus::Failed);
}

/// Found by the attack review on the real node: a server being deleted
/// still started runs that a peer forwarded to it (a session whose values
/// it holds), then cut them off at its drain timeout. Once it drains, its
/// run under way goes on to its end and no new run starts: a message is
/// refused as `server_stopping` (503), and nothing of it is recorded.
#[tokio::test(start_paused = true)]
async fn a_draining_server_lets_its_run_end_and_starts_no_new_one() {
    let world = World::shared(&[agent("clerk", "")]).await;
    let a = world.server(ServiceConfig::default()).await;
    let (id, run) = hanging_run(&world, &a).await;
    let other = Client(&a).open("clerk", no_params()).await;

    let draining = {
        let a = a.clone();
        tokio::spawn(async move { a.drain(Duration::from_secs(25)).await })
    };
    tokio::task::yield_now().await;
    let refused = Client(&a).refused(&other, "hello?").await;
    assert_eq!(refused.code, Code::ServerStopping, "{}", refused.message);
    assert_eq!(
        a.record(&other).await.unwrap().status,
        SessionStatus::Idle,
        "the refused message started nothing"
    );
    // The run under way goes on (a cancel is not a new run); once it
    // ends, so does the drain.
    assert_eq!(a.live_runs(), 1);
    a.runs().cancel(&id).await.unwrap();
    let _ = run.wait(Duration::from_secs(5)).await;
    assert_eq!(draining.await.unwrap(), 0, "no run left at the end");
    assert_ne!(a.record(&id).await.unwrap().status, SessionStatus::Running);
}
