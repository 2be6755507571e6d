//! The booking example served by the binary: its files
//! ([`bindery_tests::fixtures::booking`]) with the model at a mock.

use std::ops::Deref;

use bindery_tests::mock_llm::MockLlm;
use bindery_tests::sidecar::{Api, Sidecar};
use serde_json::Value;

// The benches include this file too and use only some of it.
#[allow(unused_imports)]
pub use bindery_tests::fixtures::booking::{ask, script, two_slots, BookingFiles, DAY};

use super::{serve, sqlite_in, CANARY};

/// The booking example in a directory of its own, its model at a mock.
pub struct Booking {
    pub dir: tempfile::TempDir,
    pub _mock: MockLlm,
    pub files: BookingFiles,
}

impl Deref for Booking {
    type Target = BookingFiles;
    fn deref(&self) -> &BookingFiles {
        &self.files
    }
}

/// The example agent with its model at a mock, its tools where they are,
/// its fake API's data in a temporary directory (`slots` by day), and
/// `edit` applied to its text.
pub async fn booking(slots: Value, edit: impl Fn(String) -> String) -> Booking {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockLlm::start(script).await;
    let files = BookingFiles::write(dir.path(), &mock.url(), slots, edit);
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    Booking {
        dir,
        _mock: mock,
        files,
    }
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
}
