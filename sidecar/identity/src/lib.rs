//! End users: who a request's identity token says the caller is.
//!
//! The platform's identity provider signs a JWT for a person; the session
//! API takes it as `Authorization: Bearer`. [`Verifier`] checks it against
//! the issuer's published keys ([`jwks`], fetched, cached and refetched
//! when a token names a key not seen yet) and the configured issuer,
//! audience and clock skew ([`verify`], pure), and answers an [`EndUser`]:
//! the [`Subject`] (an id, kept on sessions, events and usage rows) and
//! the claims a binding may read. The token itself stays a secret value.
#![forbid(unsafe_code)]

pub mod config;
pub mod exchange;
pub mod jwks;
pub mod subject;
#[cfg(any(test, feature = "test-keys"))]
pub mod testkeys;
pub mod verifier;
pub mod verify;

pub use config::{ConfigError, IdentityConfig};
pub use exchange::{ExchangeClient, ExchangeError, Exchanger};
pub use subject::{BadSubject, Subject};
pub use verifier::{EndUser, Person, Refusal, Verifier};
pub use verify::Rejected;
