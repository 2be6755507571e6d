//! Sessions: the conversation, its parameters, its runs and its storage.

#![forbid(unsafe_code)]

pub mod ask;
pub mod budget;
pub mod clients;
pub mod error;
mod fanout;
pub mod identity;
pub mod kube_events;
pub mod lease;
pub mod lineage;
pub mod lookups;
mod lru;
pub mod notify;
pub mod rate;
pub mod result;
pub mod run;
pub mod service;
pub mod state;
pub mod subagents;
pub mod toolgroups;
pub mod validate;
