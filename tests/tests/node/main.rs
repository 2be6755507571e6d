//! Tests on a real node ([`bindery_tests::node`]): a kubelet, containerd
//! and runc, kube-proxy, CoreDNS and kube-router beside the real control
//! plane, in a network namespace of the test binary's own, with the
//! project's images built by `tests/images/build.sh`.
//!
//! They need what `tests/setup.sh` installs and builds (root too: the
//! kubelet and containerd mount, make cgroups and namespaces), and are
//! compiled with the `node-tests` feature only.
//!
//! Each test enters the node's network namespace on its own thread before
//! it builds a runtime (see [`bindery_tests::netns`]), so its clients reach
//! the node's addresses; one node serves the whole binary.
#![cfg(feature = "node-tests")]

mod platform;
mod replicas;
mod reports;
mod shared;
mod smoke;
