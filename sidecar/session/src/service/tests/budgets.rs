//! A rolling budget counts the agent's use in the last so long: the same
//! call it refused runs again once the window has moved past the use.

use std::time::Duration;

use serde_json::json;

use super::harness::{agent, no_params, Client, Reply, World};
use crate::service::ServiceConfig;

const MINUTE: Duration = Duration::from_secs(60);

fn date() -> Reply {
    Reply::Calls(vec![("io_system", json!({"capability": "date"}))])
}

/// The outputs of the session's tool results, in order.
async fn outputs(client: &Client<'_>, id: &str) -> Vec<String> {
    client
        .events(id)
        .await
        .into_iter()
        .filter(|e| e.kind == "tool_result")
        .map(|e| e.data["output"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_rolling_tool_call_budget_frees_up_as_its_window_moves_on() {
    let world = World::new(&[agent(
        "metered",
        "  budgets:\n    - {name: hourly-calls, toolCalls: 2, per: 1h}\n",
    )])
    .await;
    for _ in 0..4 {
        world.model.then(date()).then(Reply::Text("ok"));
    }
    let server = world.server(ServiceConfig::default()).await;
    let client = Client(&server);
    let a = client.open("metered", no_params()).await;
    let b = client.open("metered", no_params()).await;

    client.say(&a, "one").await;
    tokio::time::advance(20 * MINUTE).await;
    client.say(&b, "two").await;
    tokio::time::advance(20 * MINUTE).await;
    // Two calls in the last hour, one of each session: the agent's budget
    // is used up for both.
    client.say(&a, "three").await;
    let refused = outputs(&client, &a).await.pop().unwrap();
    assert_eq!(
        refused,
        "error: budget hourly-calls is used up: 2 of 2 tool calls per 1h; it frees up in 1200 s, so this call did not run",
        "the first call, 40 minutes ago, leaves the window in 20"
    );

    // An hour after the first call it no longer counts.
    tokio::time::advance(21 * MINUTE).await;
    client.say(&a, "four").await;
    let ran = outputs(&client, &a).await.pop().unwrap();
    assert!(ran.contains("\"capability\":\"date\""), "{ran}");
}
