//! Parameters: declarations, values, where each value comes from, and the
//! order in which they win.

pub mod secret;

pub use secret::SecretString;
