//! What the node's tests share, made once per test binary: the operator
//! chart installed with its defaults (the operator watches every
//! namespace) and the mock model's pod.

use std::sync::OnceLock;

use bindery_tests::helm::repo_path;
use bindery_tests::node_fixtures::start_model;
use bindery_tests::node_kube::{Kube, TIMEOUT};

/// The operator chart installed (`helm install` with its defaults, in a
/// namespace that enforces Pod Security `restricted`; the operator's pod
/// Ready) and the mock model serving.
pub fn operator_and_model(kube: &Kube<'_>) {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        kube.restricted_namespace("bindery-system");
        let out = kube.helm(&[
            "install",
            "bindery",
            &repo_path("charts/bindery-operator"),
            "--namespace",
            "bindery-system",
            "--wait",
            "--timeout",
            TIMEOUT,
        ]);
        assert!(out.contains("STATUS: deployed"), "{out}");
        start_model(kube, env!("CARGO_BIN_EXE_mock-model").as_ref());
    });
}
