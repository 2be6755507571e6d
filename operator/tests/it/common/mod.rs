//! The example tenant and what `desired()` reads about it, shared by the
//! golden tests and the CRD schema tests; the control plane the controller
//! and API server tests share.
#![allow(dead_code)] // each test binary uses its own part

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use bindery_operator::crd::AgentTenant;
use bindery_operator::desired::{desired, Desired, Inputs, OperatorConfig, RefObject, Rollout};
use bindery_spec::{from_yaml, AgentDocument, AgentSpec};
#[cfg(feature = "cluster-tests")]
use bindery_tests::control_plane::{ControlPlane, ADMIN};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `examples/k8s/agent.yaml`: its name and spec.
pub fn example_agent() -> (String, AgentSpec) {
    let doc: AgentDocument =
        from_yaml(&std::fs::read_to_string(repo().join("examples/k8s/agent.yaml")).unwrap())
            .unwrap();
    (doc.metadata.name, doc.spec)
}

/// `examples/k8s/tenant.yaml`, as the API server would hand it over.
pub fn example_tenant() -> AgentTenant {
    let mut t: AgentTenant =
        from_yaml(&std::fs::read_to_string(repo().join("examples/k8s/tenant.yaml")).unwrap())
            .unwrap();
    t.metadata.namespace = Some("shop".into());
    t.metadata.uid = Some("0b7c3b0e-1111-4a4a-9f9f-000000000001".into());
    t.metadata.generation = Some(3);
    t
}

/// The test binary's control plane with the generated CRDs applied
/// (server-side: the AgentTenant CRD is too big for kubectl's last-applied
/// annotation) and established.
#[cfg(feature = "cluster-tests")]
pub fn plane() -> &'static ControlPlane {
    static READY: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let plane = ControlPlane::shared();
    READY.get_or_init(|| with_crds(plane));
    plane
}

/// The control plane whose API server the fault tests stop and start
/// ([`ControlPlane::faults`]), with the CRDs as in [`plane`].
#[cfg(feature = "cluster-tests")]
pub fn fault_plane() -> &'static ControlPlane {
    static READY: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let plane = ControlPlane::faults();
    READY.get_or_init(|| with_crds(plane));
    plane
}

#[cfg(feature = "cluster-tests")]
fn with_crds(plane: &ControlPlane) {
    let crds = repo().join("crds").display().to_string();
    let out = plane.kubectl_ok(ADMIN, &["apply", "--server-side", "-f", &crds]);
    for crd in ["agents.bindery.dev", "agenttenants.bindery.dev"] {
        assert!(out.contains(&format!("{crd} serverside-applied")), "{out}");
    }
    plane.kubectl_ok(
        ADMIN,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/agents.bindery.dev",
            "crd/agenttenants.bindery.dev",
        ],
    );
}

pub fn time(s: &str) -> Time {
    Time(s.parse().unwrap())
}

/// A referenced Secret or ConfigMap with these keys.
pub fn obj(keys: &[&str], rv: &str) -> RefObject {
    RefObject {
        keys: Some(keys.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>()),
        resource_version: rv.into(),
    }
}

/// Everything `desired()` reads, for one tenant.
pub struct World {
    pub tenant: AgentTenant,
    pub agents: BTreeMap<String, AgentSpec>,
    pub secrets: BTreeMap<String, RefObject>,
    pub config_maps: BTreeMap<String, RefObject>,
    pub rollout: Option<Rollout>,
    pub now: Time,
}

impl World {
    /// The example tenant with its agent, Secrets and tools ConfigMap.
    pub fn example() -> World {
        World {
            tenant: example_tenant(),
            agents: BTreeMap::from([example_agent()]),
            secrets: BTreeMap::from([
                ("acme-billing".into(), obj(&["token"], "101")),
                ("acme-owner-token".into(), obj(&["token"], "7")),
            ]),
            config_maps: BTreeMap::from([(
                "invoices-tools".into(),
                obj(&["query-invoices"], "55"),
            )]),
            rollout: None,
            now: time("2026-11-29T12:00:00Z"),
        }
    }

    pub fn run(&self) -> Desired {
        desired(&Inputs {
            tenant: &self.tenant,
            agents: &self.agents,
            secrets: &self.secrets,
            config_maps: &self.config_maps,
            config: &OperatorConfig::default(),
            rollout: self.rollout.clone(),
            now: self.now.clone(),
        })
    }
}
