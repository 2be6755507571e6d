//! The error bodies of the session API and the `error` codes each route
//! may answer (the handlers' `responses(...)` name them).

// utoipa's derives spell out paths that are in scope.
#![allow(unused_qualifications)]

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr, Response, ResponseBuilder};
use utoipa::{PartialSchema, ToResponse, ToSchema};

/// Every error of the session API (`/mcp` answers JSON-RPC errors instead).
#[derive(ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// A stable, machine-readable code.
    pub error: String,
    /// For people.
    pub message: String,
    /// The parameters the error is about, when it is about some.
    #[serde(default)]
    pub params: Vec<String>,
}

/// The 401 of every route but the public ones and `/mcp`, a shared
/// response under `components`.
pub struct Unauthorized;

impl<'r> ToResponse<'r> for Unauthorized {
    fn response() -> (&'r str, RefOr<Response>) {
        let response = ResponseBuilder::new()
            .description(
                "No valid token: none given, a wrong one, or a session token for another \
                 session.",
            )
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Error")))
                    .build(),
            )
            .build();
        ("Unauthorized", response.into())
    }
}

/// The `Error` schema with `error` narrowed to `codes`.
fn error_with(codes: &[&str]) -> RefOr<Schema> {
    AllOfBuilder::new()
        .item(Ref::from_schema_name("Error"))
        .item(
            ObjectBuilder::new().property(
                "error",
                ObjectBuilder::new()
                    .schema_type(SchemaType::Type(Type::String))
                    .enum_values(Some(codes.iter().copied())),
            ),
        )
        .into()
}

/// An error response body that may carry only these `error` codes; used
/// inline in a handler's `responses(...)`.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $name:ident = [$($code:literal),+ $(,)?];)*) => {$(
        $(#[$doc])*
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                error_with(&[$($code),+])
            }
        }

        impl ToSchema for $name {
            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                schemas.push((ErrorBody::name().into(), ErrorBody::schema()));
                ErrorBody::schemas(schemas);
            }
        }
    )*};
}

error_codes! {
    /// The body or a query parameter cannot be read.
    BadRequest = ["bad_request"];
    /// No such agent, session or pending call.
    NotFound = ["not_found"];
    /// Parameters this caller may not set.
    ForbiddenParams = ["forbidden_params"];
    /// Parameters this caller may not set, or a pending call only the
    /// owner may answer.
    ForbiddenAnswer = ["forbidden", "forbidden_params"];
    /// Parameters refused on a new session.
    NewSessionParams = ["unknown_params", "invalid_params", "params_required"];
    /// Parameters refused on an existing session.
    SessionParams = ["unknown_params", "invalid_params"];
    /// A run cannot start now.
    RunBlocked = ["run_in_progress", "waiting_external", "params_required", "peer_tls_required"];
    /// A resume cannot start now, or has nothing to go on from.
    ResumeBlocked = [
        "run_in_progress",
        "waiting_external",
        "params_required",
        "peer_tls_required",
        "nothing_to_resume",
    ];
    /// Nothing to cancel.
    NotRunning = ["not_running"];
    /// Not this caller's to do.
    Forbidden = ["forbidden"];
    /// A session's live share links are at their cap.
    TooManyShares = ["too_many_shares"];
    /// An answer to a pending call that cannot be taken.
    AnswerRefused = [
        "continuation_used",
        "call_changed",
        "continuation_expired",
        "params_required",
        "run_in_progress",
        "peer_tls_required",
    ];
    /// Not ready.
    NotReady = ["starting", "store_unavailable", "store_corrupt"];
    /// Agents are not kept over the API on this server.
    StoredAgentsDisabled = ["stored_agents_disabled"];
    /// A file agent has this slug.
    AgentExists = ["agent_exists"];
    /// The agent's definition does not load.
    InvalidAgent = ["invalid_agent"];
}

/// The text of a 422 for parameters (each route adds its codes).
pub const INVALID_PARAMS: &str = "Parameters that are not declared by the agent \
    (`unknown_params`), values that do not fit (`invalid_params`: wrong type, a secret that \
    is not a string, a message-scope parameter where only session values are taken) or \
    required parameters left unbound (`params_required`). `params` names the parameters.";

/// The text of a 400.
pub const BAD_REQUEST: &str = "The body is not valid JSON or does not have the expected \
    shape, or a query parameter is malformed.";
