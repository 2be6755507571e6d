//! Parameters: declarations, values, where each value comes from, and the
//! order in which they win.

#![forbid(unsafe_code)]

pub mod agent;
pub mod inherited;
pub mod live;
pub mod process;
pub mod random;
pub mod resolve;
pub mod scrub;
pub mod secret;
pub mod shape;
pub mod sources;
pub mod value;

pub use agent::{AgentParams, ParamStatus};
pub use process::{ProcessValue, ProcessValues};
pub use resolve::{Origin, Source};
pub use secret::SecretString;
pub use sources::ApiKeys;
pub use value::{ParamValue, Supplied, Values};

/// What a parameter name may be: the definition's rule, in `spec`.
pub use bindery_spec::valid_param_name as valid_name;
