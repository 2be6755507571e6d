//! The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`.
//!
//! Derived with utoipa, not written: each handler's `#[utoipa::path]` gives
//! its route, security, parameters and responses, `server::routes` registers
//! it once for both the router and the document (utoipa-axum's
//! `OpenApiRouter`), and the view and request types derive their schemas.
//! The events, pending items, turns and views are the types the API sends
//! (`session/wire.rs`, `api/views.rs`). This module holds what is not a
//! handler: the document's frame (info, tags, security schemes, the
//! events route's `x-events`) and a few request shapes; `errors` the error
//! bodies and the codes each route may answer, `links` how one answer
//! opens the next request, `mcp` the JSON-RPC messages of `/mcp`.

// utoipa's derives spell out paths that are in scope.
#![allow(unused_qualifications)]

mod errors;
mod links;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::tag::TagBuilder;
use utoipa::openapi::{ComponentsBuilder, InfoBuilder, LicenseBuilder, OpenApi as Document, RefOr};
use utoipa::{PartialSchema, ToSchema};

use bindery_store::wire::{Delta, SessionEvent};
pub use errors::*;

/// The `delta` event: streamed text, never stored, so not a
/// [`SessionEvent`]; `x-events` lists it with the stored kinds.
const DELTA: &str = "delta";

/// The path of the events route, whose 200 gets `x-events`.
pub const EVENTS_PATH: &str = "/v1/sessions/{id}/events";

/// The document for `api`, the routes' part that `server::routes`
/// collected; `version` is the server's, shown as `info.version`.
pub fn document(mut api: Document, version: &str) -> Value {
    api.info = InfoBuilder::new()
        .title("Bindery")
        .version(version)
        .description(Some(
            "Bindery's agent server: run an agent in a session, talk to it, watch its \
             events. Parameter values are write-only: no response ever carries a secret \
             value, and agent views carry no values at all.",
        ))
        .license(Some(
            LicenseBuilder::new()
                .name("Apache-2.0")
                .identifier(Some("Apache-2.0"))
                .build(),
        ))
        .build();
    api.tags = Some(
        [
            ("health", "Liveness, readiness, metrics and this document."),
            ("agents", "The agents this server runs."),
            (
                "sessions",
                "Conversations with an agent, their runs and parameters.",
            ),
            (
                "mcp",
                "The agents as MCP tools (MCP's Streamable HTTP transport).",
            ),
            (
                "approvals",
                "What waits for a person, for the approver and the links of webhook notices.",
            ),
            ("chat", "The chat page, for a person trying an agent."),
            (
                "audit",
                "The tenant's audit log: every decision that granted or used authority, hash-chained.",
            ),
        ]
        .into_iter()
        .map(|(name, description)| {
            TagBuilder::new()
                .name(name)
                .description(Some(description))
                .build()
        })
        .collect(),
    );
    api.security = Some(vec![SecurityRequirement::new(
        "ownerToken",
        Vec::<String>::new(),
    )]);
    let bearer = |description: &str| {
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(description))
                .build(),
        )
    };
    let components = ComponentsBuilder::new()
        .security_scheme(
            "ownerToken",
            bearer("The owner token, given to the server at start-up. Allowed everywhere."),
        )
        .security_scheme(
            "sessionToken",
            bearer(
                "A session token (`st_…`), handed out once when a session is created or \
                 forked with `session_token: true`. Valid for that session only, and only on \
                 the operations that list it.",
            ),
        )
        .security_scheme(
            "shareToken",
            bearer(
                "A share link's token (`bsh_…`), handed out once by `POST \
                 /v1/sessions/{id}/shares`. Valid for that session only: a `read` share on the \
                 operations that read it, a `write` share also on those that post a message or \
                 cancel a run; revoked one by one, or all with the session's tokens.",
            ),
        )
        .security_scheme(
            "approverToken",
            bearer(
                "The approver token (`serve --approver-token-file`): lists pending approvals \
                 and answers them; reads nothing else.",
            ),
        )
        .security_scheme(
            "identityToken",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "An end user's identity token: a JWT of the platform's identity provider \
                         (`serve --identity-issuer`, `--identity-audience`), verified against its \
                         published keys. The end user creates, lists and uses their own sessions \
                         only; another's is 404.",
                    ))
                    .build(),
            ),
        )
        .security_scheme(
            "mcpClientToken",
            bearer(
                "The MCP client token (`serve --mcp-client-token-file`): on `/mcp`, the \
                 agents' exposed tools only, answering nothing.",
            ),
        )
        .response_from::<Unauthorized>()
        .build();
    let mut schemas = vec![(Delta::name().into_owned(), Delta::schema())];
    SessionEvent::schemas(&mut schemas);
    let c = api.components.get_or_insert_with(Default::default);
    c.security_schemes.extend(components.security_schemes);
    c.responses.extend(components.responses);
    c.schemas.extend(schemas);
    let kinds = SessionEvent::kinds()
        .into_iter()
        .chain([(DELTA, Delta::name().into_owned())]);
    let events = kinds
        .map(|(kind, schema)| {
            let to = serde_json::json!({ "$ref": format!("#/components/schemas/{schema}") });
            (kind.to_string(), to)
        })
        .collect::<serde_json::Map<_, _>>();
    if let Some(RefOr::T(ok)) = api
        .paths
        .paths
        .get_mut(EVENTS_PATH)
        .and_then(|item| item.get.as_mut())
        .and_then(|op| op.responses.responses.get_mut("200"))
    {
        ok.extensions = Some(
            ExtensionsBuilder::new()
                .add("x-events", Value::Object(events))
                .build(),
        );
    }
    let mut doc = serde_json::to_value(&api).expect("the OpenAPI document serialises");
    if let Some(paths) = doc["paths"].as_object_mut() {
        paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
            .for_each(optional_means_absent);
    }
    links::add_links(&mut doc);
    doc
}

/// means "may be left out": `null` is no value the server takes there.
fn optional_means_absent(operation: &mut Value) {
    if let Some(params) = operation
        .get_mut("parameters")
        .and_then(Value::as_array_mut)
    {
        for schema in params.iter_mut().filter_map(|p| p.get_mut("schema")) {
            drop_null(schema);
        }
    }
    if let Some(body) = operation.get_mut("requestBody") {
        let schema = body.pointer_mut("/content/application~1json/schema");
        if schema.is_some_and(drop_null) {
            body["required"] = Value::Bool(false);
        }
    }
}

/// Takes `null` out of `schema`'s types; whether there was one.
fn drop_null(schema: &mut Value) -> bool {
    let null = Value::from("null");
    let types = schema.get_mut("type").and_then(Value::as_array_mut);
    if let Some(types) = types.filter(|t| t.contains(&null)) {
        types.retain(|t| *t != null);
        if let [only] = types.as_slice() {
            schema["type"] = only.clone();
        }
        return true;
    }
    let mut one_of = match schema.get("oneOf").and_then(Value::as_array) {
        Some(items) if items.len() == 2 && items.iter().any(|i| i["type"] == null) => items.clone(),
        _ => return false,
    };
    one_of.retain(|i| i["type"] != null);
    *schema = one_of.remove(0);
    true
}

// ---------------------------------------------------------------------------
// Small shapes.

/// `{"status": "ok"}`.
#[derive(ToSchema)]
pub struct Health {
    pub status: HealthStatus,
}

#[derive(ToSchema)]
pub enum HealthStatus {
    #[serde(rename = "ok")]
    Ok,
}

/// `{"status": "ready"}`.
#[derive(ToSchema)]
pub struct Ready {
    pub status: ReadyStatus,
}

#[derive(ToSchema)]
pub enum ReadyStatus {
    #[serde(rename = "ready")]
    Ready,
}

/// Parameter name → JSON value; `null` removes the value. Secret values
/// must be strings.
#[derive(ToSchema)]
pub struct ParamValues(pub BTreeMap<String, Value>);

/// `POST /v1/sessions/{id}/fork`'s body.
#[derive(ToSchema)]
pub struct ForkRequest {
    #[serde(default)]
    pub params: ParamValues,
    /// Values pinned for the new session. The source's pins are kept;
    /// this replaces one (`null` drops it, and its value).
    #[serde(default)]
    pub pin: ParamValues,
    /// A first message: starts a run.
    #[serde(default)]
    pub prompt: String,
    #[serde(default)]
    pub seal: bool,
    /// Hand out a session token for the new session.
    #[serde(default)]
    pub session_token: bool,
    /// Copy only the turns before this index (0: none); past the source's
    /// last turn is a 400.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub at_turn: u64,
}

/// Without `params` (or with an empty body) nothing changes; any other key
/// is refused (422).
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetParamsRequest {
    #[serde(default)]
    pub params: ParamValues,
}

// ---------------------------------------------------------------------------
// Events.

/// One server-sent event: `id` (its sequence number), `event` (a key of
/// `x-events`) and `data` (that event's JSON).
#[derive(ToSchema)]
pub struct SseEvent {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub event: String,
    #[serde(default)]
    pub data: String,
}
