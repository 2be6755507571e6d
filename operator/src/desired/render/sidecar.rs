//! The sidecar container (the agent server) and the parts of it that are
//! neither the store nor the events: its files, its flags, its tools.

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    HTTPGetAction, KeyToPath, Probe, SeccompProfile, SecretVolumeSource, SecurityContext, Volume,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::env::{literal_env, secret_env};
use super::mount;
use super::pod::Parts;
use crate::crd::AgentTenantSpec;
use crate::desired::tree::TreeAgent;
use crate::desired::Inputs;
use crate::names::{
    self, AGENTS_DIR, OWNER_DIR, OWNER_FILE, PARAMS_DIR, PARAMS_FILE, PORT, TOOLS_DIR,
};

/// What every sidecar has: the agents' files, the params file and the
/// owner token mounted, `serve` with them, its HTTP port, and the
/// parameters from Secrets and ConfigMaps (`params_env`).
pub(super) fn files_and_serve(
    inputs: &Inputs<'_>,
    tree: &[TreeAgent<'_>],
    params_env: Vec<EnvVar>,
) -> Parts {
    let tenant = inputs.tenant_name();
    let owner_ref = inputs.owner_token_ref();
    let volumes = vec![
        Volume {
            name: "agents".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::config_map(tenant),
                items: Some(
                    tree.iter()
                        .map(|a| KeyToPath {
                            key: format!("{}.yaml", a.name),
                            path: format!("{}.yaml", a.name),
                            mode: None,
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "params".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::config_map(tenant),
                items: Some(vec![KeyToPath {
                    key: PARAMS_FILE.into(),
                    path: PARAMS_FILE.into(),
                    mode: None,
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "owner-token".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(owner_ref.name.clone()),
                items: Some(vec![KeyToPath {
                    key: owner_ref.key.clone(),
                    path: OWNER_FILE.into(),
                    mode: None,
                }]),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mounts = vec![
        mount("agents", AGENTS_DIR, true),
        mount("params", PARAMS_DIR, true),
        mount("owner-token", OWNER_DIR, true),
    ];
    let args = vec![
        "serve".to_string(),
        "--agents-dir".into(),
        AGENTS_DIR.into(),
        // GET /v1/agents says they are `Agent` resources, not files.
        "--agents-source".into(),
        "crd".into(),
        "--params-file".into(),
        format!("{PARAMS_DIR}/{PARAMS_FILE}"),
        "--listen".into(),
        format!("0.0.0.0:{PORT}"),
    ];
    let ports = vec![ContainerPort {
        name: Some("http".into()),
        container_port: PORT,
        protocol: Some("TCP".into()),
        ..Default::default()
    }];
    Parts {
        volumes,
        mounts,
        args,
        ports,
        env: params_env,
    }
}

/// A writable `/tmp` on a read-only root filesystem.
pub(super) fn tmp() -> Parts {
    Parts {
        volumes: vec![Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }],
        mounts: vec![mount("tmp", "/tmp", false)],
        ..Default::default()
    }
}

/// The server's flags from the tenant's spec: the owner token's file, JSON
/// logs, the MCP client and approver tokens (from their Secrets, like a
/// secret parameter) and the live sessions' limits.
pub(super) fn server_flags(spec: &AgentTenantSpec) -> Parts {
    let mut args = vec![
        "--owner-token-file".into(),
        format!("{OWNER_DIR}/{OWNER_FILE}"),
        "--log-format".into(),
        "json".into(),
    ];
    let mut env = Vec::new();
    if let Some(r) = &spec.mcp_client_token_secret_ref {
        env.push(secret_env("BINDERY_MCP_CLIENT_TOKEN".into(), r));
    }
    if let Some(r) = &spec.approver_token_secret_ref {
        env.push(secret_env("BINDERY_APPROVER_TOKEN".into(), r));
    }
    if let Some(ttl) = &spec.live_session_ttl {
        args.extend(["--live-session-ttl".into(), ttl.clone()]);
    }
    if let Some(n) = spec.max_live_sessions {
        args.extend(["--max-live-sessions".into(), n.to_string()]);
    }
    if let Some(every) = &spec.events_keep_alive {
        args.extend(["--events-keep-alive".into(), every.clone()]);
    }
    if let Some(id) = &spec.identity {
        args.extend(["--identity-issuer".into(), id.issuer.clone()]);
        for a in &id.audiences {
            args.extend(["--identity-audience".into(), a.clone()]);
        }
        if let Some(u) = &id.jwks_url {
            args.extend(["--identity-jwks-url".into(), u.clone()]);
        }
        if let Some(c) = &id.subject_claim {
            args.extend(["--identity-subject-claim".into(), c.clone()]);
        }
        if let Some(s) = id.clock_skew_seconds {
            args.extend(["--identity-clock-skew".into(), s.to_string()]);
        }
        if let Some(x) = &id.exchange {
            args.extend(["--identity-exchange-client-id".into(), x.client_id.clone()]);
            if let Some(u) = &x.token_url {
                args.extend(["--identity-token-url".into(), u.clone()]);
            }
            env.push(secret_env(
                "BINDERY_IDENTITY_EXCHANGE_CLIENT_SECRET".into(),
                &x.client_secret_secret_ref,
            ));
        }
    }
    if let Some(n) = spec.per_user.as_ref().and_then(|p| p.max_concurrent_runs) {
        args.extend(["--max-runs-per-user".into(), n.to_string()]);
    }
    if let Some(r) = &spec.rate_limits {
        if let Some(n) = r.requests_per_minute {
            args.extend(["--requests-per-minute".into(), n.to_string()]);
        }
        if let Some(n) = r.per_user_requests_per_minute {
            args.extend(["--per-user-requests-per-minute".into(), n.to_string()]);
        }
        for t in &r.tools {
            let per_user = if t.per_user { "/user" } else { "" };
            args.extend([
                "--tool-rate-limit".into(),
                format!("{}={}{per_user}", t.tool, t.calls_per_minute),
            ]);
        }
    }
    Parts {
        args,
        env,
        ..Default::default()
    }
}

/// The tenant's tools ConfigMap, mounted executable where the agents'
/// files point.
pub(super) fn tools(spec: &AgentTenantSpec) -> Parts {
    let Some(t) = &spec.tools else {
        return Parts::default();
    };
    Parts {
        volumes: vec![Volume {
            name: "tools".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: t.config_map_ref.name.clone(),
                default_mode: Some(0o555),
                ..Default::default()
            }),
            ..Default::default()
        }],
        mounts: vec![mount("tools", TOOLS_DIR, true)],
        ..Default::default()
    }
}

/// The answer links of approval notices: the tenant's own address, or its
/// Service's inside the cluster when it has a webhook and says none.
pub(super) fn public_url(inputs: &Inputs<'_>, webhook: bool) -> Parts {
    let url = inputs.tenant.spec.public_url.clone().or_else(|| {
        webhook.then(|| {
            let ns = inputs
                .tenant
                .metadata
                .namespace
                .as_deref()
                .unwrap_or("default");
            format!("http://{}.{ns}.svc", inputs.tenant_name())
        })
    });
    Parts {
        env: url
            .map(|u| literal_env("BINDERY_PUBLIC_URL", u))
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

fn probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    }
}

/// The sidecar container from its parts (their volumes go to the pod):
/// probed, unprivileged, on a read-only root filesystem.
pub(super) fn container(inputs: &Inputs<'_>, parts: Parts) -> Container {
    let spec = &inputs.tenant.spec;
    let Parts {
        mounts,
        args,
        ports,
        env,
        ..
    } = parts;
    Container {
        name: "sidecar".into(),
        image: Some(
            spec.image
                .clone()
                .unwrap_or_else(|| inputs.config.sidecar_image.clone()),
        ),
        args: Some(args),
        env: (!env.is_empty()).then_some(env),
        ports: Some(ports),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(probe("/healthz")),
        resources: spec.resources.clone(),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}
