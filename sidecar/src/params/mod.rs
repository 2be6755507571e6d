//! Parameters: declarations, values, where each value comes from, and the
//! order in which they win.

pub mod agent;
pub mod process;
pub mod resolve;
pub mod scrub;
pub mod secret;
pub mod sources;
pub mod value;

pub use agent::{AgentParams, ParamStatus};
pub use process::{ProcessValue, ProcessValues};
pub use resolve::{Origin, Source};
pub use secret::SecretString;
pub use sources::ApiKeys;
pub use value::{ParamValue, Supplied, Values};

/// `[a-z][a-z0-9_]*`.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}
