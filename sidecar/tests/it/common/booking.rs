//! The booking example as a test fixture: its agent with the model at a
//! mock that only extracts what the user owns, its real bash tools over a
//! file-backed fake API, and what that API saw.

use std::path::PathBuf;

use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use bindery_tests::sidecar::{Api, Sidecar};
use serde_json::{json, Value};

use super::{repo, serve, sqlite_in, CANARY};

/// The model: a user message `book {…}` calls `bash_book` with those
/// arguments; after a tool result it answers with it.
pub fn script(req: &Value) -> MockReply {
    let last = last_message(req);
    match last["role"].as_str() {
        Some("tool") => {
            MockReply::text(format!("done: {}", last["content"].as_str().unwrap_or("")))
        }
        _ => {
            let text = last["content"].as_str().unwrap_or("");
            let args: Value =
                serde_json::from_str(text.trim_start_matches("book ")).unwrap_or(json!({}));
            MockReply::tool_call("bash_book", args)
        }
    }
}

pub struct Booking {
    pub dir: tempfile::TempDir,
    pub _mock: MockLlm,
    pub agent: PathBuf,
    pub store: PathBuf,
}

/// The example agent with its model at a mock, its tools where they are,
/// its fake API's data in a temporary directory (`slots` by day), and
/// `edit` applied to its text.
pub async fn booking(slots: Value, edit: impl Fn(String) -> String) -> Booking {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(script).await;
    let example = repo().join("examples/booking");
    let text = super::example_agent_text("booking", &mock.url())
        .replace("      default:\n        file: demo-api-key\n", "");
    let agent = dir.path().join("booking.yaml");
    std::fs::write(&agent, edit(text)).unwrap();
    let store = dir.path().join("api");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::copy(
        example.join("data/services.json"),
        store.join("services.json"),
    )
    .unwrap();
    std::fs::write(store.join("slots.json"), slots.to_string()).unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    Booking {
        dir,
        _mock: mock,
        agent,
        store,
    }
}

pub const DAY: &str = "2026-10-01";

pub fn two_slots() -> Value {
    json!({DAY: [
        {"slot_token": "slot-a", "label": "10:00", "service": "svc-cut"},
        {"slot_token": "slot-b", "label": "11:00", "service": "svc-cut"},
        {"slot_token": "slot-c", "label": "10:00", "service": "svc-colour"}
    ]})
}

impl Booking {
    pub fn start(&self) -> (Sidecar, Api) {
        let store = format!("booking_store={}", self.store.display());
        serve(
            &self.agent,
            &sqlite_in(self.dir.path()),
            &["--set", &store],
            &[("BINDERY_PARAM_API_KEY", CANARY)],
            self.dir.path(),
        )
    }

    pub fn lines(&self, file: &str) -> Vec<String> {
        std::fs::read_to_string(self.store.join(file))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// What the fake API booked.
    pub fn bookings(&self) -> Vec<String> {
        self.lines("bookings.log")
    }

    /// How many lookups reached the fake API.
    pub fn lookups(&self) -> usize {
        self.lines("lookups.log").len()
    }

    pub fn put(&self, file: &str, v: Value) {
        std::fs::write(self.store.join(file), v.to_string()).unwrap();
    }
}
