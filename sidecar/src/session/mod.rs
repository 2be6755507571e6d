//! Sessions: the conversation, its parameters, its runs and its storage.

pub mod ask;
pub mod clients;
pub mod clock;
pub mod depends;
pub mod error;
mod fanout;
pub mod helpers;
pub mod kube_events;
pub mod lease;
pub mod ledger;
pub mod lineage;
mod lru;
pub mod model;
pub mod notify;
pub mod pending;
pub mod result;
pub mod runner;
pub mod service;
pub mod store;
pub mod toolgroups;
pub mod usage;
pub mod validate;
pub mod wire;
