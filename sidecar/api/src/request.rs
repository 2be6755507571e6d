//! What a request carries beside its route: a JSON body whatever its
//! `Content-Type`, `?wait=` and `?timeout=`, the run it asks for, and a
//! continuation's answer. Its own module, so that the router (`server`)
//! and the approvals' routes both read them without reaching into each
//! other.

// utoipa's `IntoParams` expansion spells out paths that are in scope.
#![allow(unused_qualifications)]

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use crate::openapi::ParamValues;
use bindery_session::error::ServiceError;
use bindery_session::run::RunMode;
use bindery_session::service::Answer;
use bindery_session::state::live_sessions::{Ended, RunWait};
use bindery_store::wire::{RunRequest, StartRun};

/// Default and upper bound of `?timeout=` (seconds) with `?wait=true`.
const DEFAULT_WAIT: u64 = 60;
const MAX_WAIT: u64 = 600;

/// A JSON body, whatever `Content-Type` says (agents-server clients, and
/// plain `curl -d`, often send none). An empty body is the default value.
pub(crate) fn body<T: serde::de::DeserializeOwned + Default>(
    bytes: &Bytes,
) -> Result<T, ServiceError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ServiceError::bad_request(format!(
            "the request body is not what this route takes: {e}"
        ))
    })
}

#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Wait for the run this request starts to finish before answering.
    #[serde(default)]
    #[param(value_type = bool, default = false)]
    wait: Option<bool>,
    /// With `wait=true`: how many seconds to wait at most (default 60, at
    /// most 600; more is a 400). A run still going then is answered with 202.
    #[serde(default)]
    #[param(value_type = u64, minimum = 0, maximum = 600, default = 60)]
    timeout: Option<u64>,
}

impl WaitQuery {
    /// A `timeout` past the documented bound is refused, not cut short.
    pub(crate) fn check(&self) -> Result<(), ServiceError> {
        match self.timeout {
            Some(t) if t > MAX_WAIT => Err(ServiceError::bad_request(format!(
                "`timeout` is at most {MAX_WAIT} seconds; got {t}"
            ))),
            _ => Ok(()),
        }
    }

    /// The run's end, when asked to wait and it came in time.
    pub(crate) async fn wait(&self, run: Option<RunWait>) -> Option<Ended> {
        match (self.wait.unwrap_or(false), run) {
            (true, Some(r)) => {
                r.wait(Duration::from_secs(
                    self.timeout.unwrap_or(DEFAULT_WAIT).min(MAX_WAIT),
                ))
                .await
            }
            _ => None,
        }
    }
}

/// A request's `run`: `None` for `none` (no run at all).
pub(crate) fn run_mode(run: RunRequest) -> Option<RunMode> {
    match run {
        RunRequest::UntilBlocked => Some(RunMode::UntilBlocked),
        RunRequest::Step => Some(RunMode::Step),
        RunRequest::None => None,
    }
}

/// The run a message or a resume starts.
pub(crate) fn start_mode(run: StartRun) -> RunMode {
    match run {
        StartRun::UntilBlocked => RunMode::UntilBlocked,
        StartRun::Step => RunMode::Step,
    }
}

/// `POST /v1/continuations/:token` body: `result` for a deferred call,
/// `approve` (and `reason`) for a confirmation, `choice` for a selection,
/// `input` for missing user-owned fields.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ContinuationRequest)]
pub struct ContinuationBody {
    /// The session the caller means; a token of another session is unknown.
    #[schema(value_type = String, required = false)]
    pub(crate) session_id: Option<String>,
    /// The deferred tool's result: any JSON value.
    #[schema(value_type = Value, required = false)]
    result: Option<serde_json::Value>,
    /// A confirmation's decision.
    #[schema(value_type = bool, required = false)]
    approve: Option<bool>,
    /// Why the call is refused; the model reads it.
    #[schema(value_type = String, required = false)]
    reason: Option<String>,
    /// A selection's answer: the `id` of an offered option.
    #[schema(value_type = String, required = false)]
    choice: Option<String>,
    /// A `needs_input` item's answer: the missing fields.
    #[schema(value_type = Object, required = false)]
    input: Option<serde_json::Map<String, serde_json::Value>>,
    /// `false`: record the answer only; a later resume goes on.
    #[schema(value_type = bool, required = false)]
    resume: Option<bool>,
    /// `true`: the untrusted results the session took in so far no longer
    /// hold its egress calls (the taint guard); a new one holds them again.
    #[serde(default)]
    clear_taint: bool,
    #[serde(default)]
    #[schema(value_type = ParamValues)]
    params: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    run: RunRequest,
}

impl ContinuationBody {
    /// The answer the body gives.
    pub(crate) fn into_answer(self) -> Result<Answer, ServiceError> {
        let b = self;
        let mode = run_mode(b.run);
        Ok(Answer {
            session_id: b.session_id,
            result: b.result,
            approve: b.approve,
            reason: b.reason,
            choice: b.choice,
            input: b.input,
            // `run: none` records the answer and starts nothing, like `resume: false`.
            resume: if mode.is_none() {
                Some(false)
            } else {
                b.resume
            },
            params: b.params,
            clear_taint: b.clear_taint,
            by: None,
            mode: mode.unwrap_or_default(),
        })
    }
}
