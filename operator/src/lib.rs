//! Bindery's operator: the `Agent` and `AgentTenant` custom resources, the
//! desired state of a tenant as a pure function, and the controller that
//! applies it.

pub mod controller;
pub mod crd;
pub mod desired;
pub mod events;
pub mod key_names;
pub mod leader;
pub mod metrics;
pub mod names;
mod own_writes;
pub mod retries;
pub mod watches;
