//! Runs as a client sees them: events in order, bound arguments, timeouts
//! and cancels.

use serde_json::json;

use super::harness::{agent, answer, asked, no_params, shown, Client, Reply, World, MODEL_TIMEOUT};
use crate::service::ServiceConfig;
use crate::validate::Caller;
use bindery_store::model::SessionStatus;

#[tokio::test(start_paused = true)]
async fn a_message_runs_the_tool_the_model_calls_and_records_each_step_in_order() {
    let world = World::new(&[agent("clerk", "")]).await;
    world
        .model
        .then(Reply::Calls(vec![(
            "io_system",
            json!({"capability": "date"}),
        )]))
        .then(Reply::Text("It is today."));
    let server = world.server(ServiceConfig::default()).await;
    let client = Client(&server);
    let id = client.open("clerk", no_params()).await;

    let rec = client.say(&id, "what day is it?").await;

    assert_eq!(rec.status, SessionStatus::Idle);
    assert_eq!(answer(&rec), Some("It is today."));
    assert_eq!(
        client.kinds(&id).await,
        [
            "run_started",
            "tool_call",
            "tool_result",
            "message",
            "run_finished"
        ]
    );
    let seen = world.model.seen();
    assert_eq!(seen.len(), 2, "one request before the call, one after");
    let result = seen[1].messages.last().unwrap();
    let bindery_llm::ChatMessage::Tool { content, .. } = result else {
        panic!("the second request ends with the tool's result: {result:?}");
    };
    let content = content.text();
    assert!(content.contains("\"capability\":\"date\""), "{content}");
    // The second request is the first one and what the run added since
    // (the model's call, its result): the conversation as stored so far.
    let (first, second) = (&seen[0].messages, &seen[1].messages);
    assert_eq!(second.len(), first.len() + 2, "{second:?}");
    assert_eq!(second[..first.len()], first[..]);
    assert!(
        second.len() >= rec.turns.len() - 1
            && rec.turns[..rec.turns.len() - 1]
                .iter()
                .rev()
                .zip(second.iter().rev())
                .all(|(turn, sent)| turn == sent),
        "{second:?}"
    );
}

/// A bound argument is not in the schema the model sees, and a value the
/// model makes up for it anyway is overridden by the bound one.
#[tokio::test(start_paused = true)]
async fn the_model_never_sees_a_bound_argument_and_cannot_override_it() {
    let world = World::new(&[agent(
        "clerk",
        "  bindings: [{tool: io_system, arg: capability, value: {literal: date}}]\n",
    )])
    .await;
    world
        .model
        .then(Reply::Calls(vec![(
            "io_system",
            json!({"capability": "hostname"}),
        )]))
        .then(Reply::Text("done"));
    let server = world.server(ServiceConfig::default()).await;
    let client = Client(&server);
    let id = client.open("clerk", no_params()).await;

    client.say(&id, "which host?").await;

    let seen = world.model.seen();
    let schema = shown(&seen[0], "io_system");
    assert_eq!(schema["properties"], json!({}), "{schema}");
    let result = &client
        .events(&id)
        .await
        .into_iter()
        .find(|e| e.kind == "tool_result")
        .unwrap()
        .data;
    let output = result["output"].as_str().unwrap();
    assert!(output.contains("\"capability\":\"date\""), "{output}");
}

/// A model that never answers fails the run once the endpoint's timeout
/// has passed, and not before: no one waits an hour for it here.
#[tokio::test(start_paused = true)]
async fn a_model_that_never_answers_fails_the_run_at_the_endpoints_timeout() {
    let world = World::new(&[agent("clerk", "")]).await;
    world.model.then(Reply::Hang);
    let server = world.server(ServiceConfig::default()).await;
    let client = Client(&server);
    let id = client.open("clerk", no_params()).await;
    let start = tokio::time::Instant::now();

    let rec = client.say(&id, "hello?").await;

    assert!(start.elapsed() >= MODEL_TIMEOUT, "{:?}", start.elapsed());
    assert_eq!(rec.status, SessionStatus::Failed);
    let detail = rec.status_detail.unwrap_or_default();
    assert!(detail.contains("did not answer in time"), "{detail}");
    assert_eq!(client.kinds(&id).await.last().unwrap(), "run_finished");
}

/// A cancel ends a run that waits on the model at once, records it, and
/// the session takes the next message.
#[tokio::test(start_paused = true)]
async fn a_cancel_ends_a_run_that_waits_on_the_model_and_the_session_goes_on() {
    let world = World::new(&[agent("clerk", "")]).await;
    world.model.then(Reply::Hang).then(Reply::Text("here now"));
    let server = world.server(ServiceConfig::default()).await;
    let client = Client(&server);
    let id = client.open("clerk", no_params()).await;
    let run = server
        .sessions()
        .post_message(
            &Caller::Owner,
            &id,
            "hello?".into(),
            &Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    asked(&world.model, 1).await;
    let start = tokio::time::Instant::now();

    server.runs().cancel(&id).await.unwrap();
    run.finished().await;

    assert!(start.elapsed() < MODEL_TIMEOUT, "{:?}", start.elapsed());
    let rec = server.record(&id).await.unwrap();
    assert_ne!(rec.status, SessionStatus::Running);
    let finished = client.events(&id).await.pop().unwrap();
    assert_eq!(finished.kind, "run_finished");
    assert_eq!(finished.data["status"], "cancelled", "{}", finished.data);
    let rec = client.say(&id, "and now?").await;
    assert_eq!(answer(&rec), Some("here now"));
}

/// A panic in a run (review 68: a hostile model's usage overflowed an
/// addition) fails that run and lets its session go: the next message runs.
#[tokio::test(start_paused = true)]
async fn a_run_that_panics_is_failed_and_its_session_goes_on() {
    let world = World::new(&[agent("clerk", "")]).await;
    world.model.then(Reply::Panic).then(Reply::Text("fine now"));
    let server = world.server(ServiceConfig::default()).await;
    let client = Client(&server);
    let id = client.open("clerk", no_params()).await;

    let rec = client.say(&id, "first").await;
    assert_eq!(rec.status, SessionStatus::Failed);
    assert_eq!(
        rec.status_detail.as_deref(),
        Some(crate::run::PANICKED),
        "{rec:?}"
    );
    let rec = client.say(&id, "again").await;
    assert_eq!(answer(&rec), Some("fine now"));
}
