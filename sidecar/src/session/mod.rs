//! Sessions: the conversation, its parameters, its runs and its storage.

pub mod model;
pub mod store;
