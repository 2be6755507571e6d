//! Calls that wait for a person: a confirmation holds its call until it is
//! answered, and `confirmTtl` closes it unanswered.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::harness::{agent, answer, no_params, Between, Client, Reply, World};
use crate::error::{Code, ServiceError};
use crate::service::{Answer, Service, ServiceConfig};
use crate::validate::Caller;
use bindery_store::model::SessionStatus;

const MINUTE: Duration = Duration::from_secs(60);

/// `io_system` needs a confirmation, which lapses after ten minutes.
fn careful() -> String {
    agent(
        "careful",
        "  confirm: [{tool: io_system}]\n  confirmTtl: 10m\n",
    )
}

fn approve() -> Answer {
    Answer {
        approve: Some(true),
        ..Default::default()
    }
}

/// A session of `careful` whose run waits for a person to confirm its
/// call of the date, the model to say `then` once the call is settled: the
/// world, the server, the session and the call's continuation token.
async fn waiting(then: &'static str) -> (World, Arc<Service>, String, String) {
    let world = World::new(&[careful()]).await;
    world
        .model
        .then(Reply::Calls(vec![(
            "io_system",
            json!({"capability": "date"}),
        )]))
        .then(Reply::Text(then));
    let server = world.server(ServiceConfig::default()).await;
    let client = Client(&server);
    let id = client.open("careful", no_params()).await;
    let rec = client.say(&id, "the date, please").await;
    assert_eq!(rec.status, SessionStatus::WaitingExternal);
    let items = server.approvals().pending_view(&rec);
    assert_eq!(items.len(), 1);
    let token = items[0].continuation_token.clone().unwrap();
    (world, server, id, token)
}

#[tokio::test(start_paused = true)]
async fn a_confirmation_answered_in_time_runs_the_call_and_the_run_goes_on() {
    let (_world, server, id, token) = waiting("done").await;
    let client = Client(&server);
    assert!(
        !client.kinds(&id).await.contains(&"tool_result".to_string()),
        "nothing ran before the answer"
    );

    tokio::time::advance(9 * MINUTE).await;
    assert_eq!(server.sessions().expire_due().await.unwrap(), 0);
    let (session, run) = server
        .sessions()
        .answer(&Caller::Owner, &token, approve())
        .await
        .unwrap();
    assert_eq!(session, id);
    run.expect("every call is answered: the run resumes")
        .finished()
        .await;

    let rec = server.record(&id).await.unwrap();
    assert_eq!(rec.status, SessionStatus::Idle);
    assert_eq!(answer(&rec), Some("done"));
    let kinds = client.kinds(&id).await;
    let result = kinds.iter().position(|k| k == "tool_result").unwrap();
    assert!(
        kinds[..result].contains(&"resolved".to_string()),
        "{kinds:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_confirmation_expires_at_its_ttl_and_a_late_answer_is_refused() {
    let (world, server, id, token) = waiting("it expired").await;
    let client = Client(&server);

    tokio::time::advance(10 * MINUTE + Duration::from_secs(1)).await;
    assert_eq!(server.sessions().expire_due().await.unwrap(), 1);
    let rec = super::harness::settled(&server, &id).await;

    assert_eq!(rec.status, SessionStatus::Idle);
    assert_eq!(answer(&rec), Some("it expired"));
    let seen = world.model.seen();
    let told = format!("{:?}", seen[1].messages.last().unwrap());
    assert!(told.contains("did not run"), "the model is told: {told}");
    let events = client.events(&id).await;
    let resolved = events.iter().find(|e| e.kind == "resolved").unwrap();
    assert_eq!(resolved.data["outcome"], "expired", "{}", resolved.data);
    assert!(!events
        .iter()
        .any(|e| e.kind == "tool_result" && e.data["ok"] == true));
    let late = server
        .sessions()
        .answer(&Caller::Owner, &token, approve())
        .await
        .err()
        .expect("a late answer is refused");
    assert_eq!(late.code, Code::ContinuationExpired, "{}", late.message);
    assert_eq!(server.sessions().expire_due().await.unwrap(), 0);
}

/// The CLI's `--follow` answers a call as soon as the view shows it
/// waiting, which can be before the run that stored the wait has let the
/// session go.
#[tokio::test(start_paused = true)]
async fn an_answer_sent_the_moment_the_wait_is_stored_resumes_the_run() {
    // The call approved the moment the run's wait is written, while the
    // run still holds the session.
    let hook = Between::new(SessionStatus::WaitingExternal, |server, rec| {
        Box::pin(async move {
            let token = server.approvals().pending_view(&rec)[0]
                .continuation_token
                .clone()
                .unwrap();
            let (_, run) = server
                .sessions()
                .answer(&Caller::Owner, &token, approve())
                .await?;
            Ok::<_, ServiceError>(run)
        })
    });
    let world = World::watched(&[careful()], false, hook.clone()).await;
    world
        .model
        .then(Reply::Calls(vec![(
            "io_system",
            json!({"capability": "date"}),
        )]))
        // The resumed run stays on: the first run's end must not end it.
        .then(Reply::Hang);
    let server = world.server(ServiceConfig::default()).await;
    hook.on(&server);
    let client = Client(&server);
    let id = client.open("careful", no_params()).await;
    client.say(&id, "the date, please").await;

    let run = hook
        .outcome()
        .await
        .unwrap_or_else(|e| panic!("the answer was refused: {} ({})", e.code, e.message))
        .expect("every call is answered: the run resumes");
    // The first run has ended (`say` saw it), and the resumed one is still
    // the session's run: one at a time.
    super::harness::asked(&world.model, 2).await;
    assert!(server.is_running(&id), "the resumed run is registered");
    // A second run is refused while the resumed one goes on.
    let second = client.refused(&id, "and the time?").await;
    assert_eq!(second.code, Code::RunInProgress, "{}", second.message);

    server.runs().cancel(&id).await.unwrap();
    run.finished().await;
    let rec = server.record(&id).await.unwrap();
    assert_eq!(rec.status, SessionStatus::Idle);
    assert_eq!(rec.status_detail.as_deref(), Some("cancelled"));
    let kinds = client.kinds(&id).await;
    let ran = kinds.iter().filter(|k| *k == "tool_result").count();
    assert_eq!(ran, 1, "the approved call ran once: {kinds:?}");
}
