//! The Kubernetes objects of a tenant whose agent and parameters resolved.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapKeySelector, ConfigMapProjection, ConfigMapVolumeSource,
    Container, ContainerPort, DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ProjectedVolumeSource, SeccompProfile, SecretKeySelector,
    SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServiceAccountTokenProjection,
    ServicePort, ServiceSpec, Volume, VolumeMount, VolumeProjection, VolumeResourceRequirements,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use super::params::Supply;
use super::tree::TreeAgent;
use super::Inputs;
use crate::names::{self, *};
use bindery_spec::budget::{self, Budget};
use bindery_spec::{AgentDocument, Metadata, Toolbox, API_VERSION, KIND};

/// Everything a tenant runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects {
    pub config_map: ConfigMap,
    pub service_account: ServiceAccount,
    pub deployment: Deployment,
    pub service: Service,
    pub claim: Option<PersistentVolumeClaim>,
    /// For a tenant whose agent tree has an approval webhook or a budget:
    /// what lets its pods post Warning Events on it (and, with a budget,
    /// write the budgets' use to its status). None otherwise, and then the
    /// pods hold no ServiceAccount token at all.
    pub events_access: Option<EventsAccess>,
}

/// A Role allowing its holder to create Events in the tenant's namespace
/// (`events.k8s.io`, nothing else: not read them, not change one) and,
/// for a tenant with budgets, to get and patch the status of its own
/// `AgentTenant` (by name: no other tenant's, not the spec); and its
/// binding to the tenant's ServiceAccount.
#[derive(Clone, Debug, PartialEq)]
pub struct EventsAccess {
    pub role: Role,
    pub binding: RoleBinding,
}

/// Whether an agent of the tree announces calls that wait for a person to
/// an approval webhook (whose failures the sidecar reports as Events).
pub(crate) fn has_webhook(tree: &[TreeAgent<'_>]) -> bool {
    tree.iter().any(|a| {
        a.spec
            .approvals
            .as_ref()
            .is_some_and(|p| p.webhook.is_some())
    })
}

/// Whether an agent of the tree, as rendered for the tenant, has a budget
/// (whose use the sidecar writes to the tenant's status, and whose
/// exhaustion it posts as an Event): the tenant's own budgets, which
/// overlay its agent's, or any agent's of the tree.
pub(crate) fn has_budgets(tree: &[TreeAgent<'_>], tenant_budgets: &[Budget]) -> bool {
    !tenant_budgets.is_empty() || tree.iter().any(|a| !a.spec.budgets.is_empty())
}

/// An environment variable from the Pod's own fields (the downward API).
fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                api_version: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn literal_env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// Variable `name` from a Secret's key, which must exist: the value goes
/// from the Secret to the pod and never through the operator.
fn secret_env(name: String, r: &crate::crd::KeyRef) -> EnvVar {
    EnvVar {
        name,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: r.name.clone(),
                key: r.key.clone(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn meta(name: String, inputs: &Inputs<'_>, owner: &OwnerReference) -> ObjectMeta {
    let tenant = inputs.tenant_name();
    ObjectMeta {
        name: Some(name),
        namespace: inputs.tenant.metadata.namespace.clone(),
        labels: Some(labels(tenant)),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    }
}

/// An agent's file as the pod reads it: bash tools come from the tenant's
/// tools ConfigMap, mounted at one directory, and so does an MCP server
/// program given by a relative path (`./servers/billing.py`). The tenant's
/// agent (the root) carries the tenant's budgets over its own; a helper
/// keeps its own.
fn agent_file(agent: &TreeAgent<'_>, tenant_budgets: &[Budget]) -> String {
    let mut spec = agent.spec.clone();
    if agent.root {
        spec.budgets = budget::overlay(&spec.budgets, tenant_budgets);
    }
    for tb in &mut spec.toolboxes {
        // OpenAPI toolboxes name a URL or a file the author placed; left as
        // written. So do MCP programs found in `PATH` or by an absolute path
        // (they are the image's) and remote MCP servers.
        let b = match tb {
            Toolbox::Bash(b) => b,
            Toolbox::Mcp(m) => {
                if let Some(program) = m.command.first_mut() {
                    if program.contains('/') && !program.starts_with('/') {
                        let base = program.rsplit('/').next().unwrap_or(program);
                        *program = format!("{TOOLS_DIR}/{base}");
                    }
                }
                continue;
            }
            Toolbox::Openapi(_)
            | Toolbox::Deferred(_)
            | Toolbox::Postgrest(_)
            | Toolbox::Builtin(_)
            | Toolbox::Sqlite(_) => continue,
        };
        if b.directory.is_some() {
            b.directory = Some(TOOLS_DIR.to_string());
        }
        if let Some(s) = &b.script {
            let base = s.rsplit('/').next().unwrap_or(s);
            b.script = Some(format!("{TOOLS_DIR}/{base}"));
        }
    }
    let doc = AgentDocument {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        metadata: Metadata {
            name: agent.name.clone(),
            ..Default::default()
        },
        spec,
    };
    bindery_spec::to_yaml(&doc).expect("an agent document serializes")
}

pub(crate) fn render(
    inputs: &Inputs<'_>,
    tree: &[TreeAgent<'_>],
    supplies: &BTreeMap<String, (Supply, bool)>,
    owner: &OwnerReference,
) -> Objects {
    let tenant = inputs.tenant_name();
    let spec = &inputs.tenant.spec;

    // Non-secret values: the params file. Secret and referenced ones: env.
    let mut params_file = serde_json::Map::new();
    let mut env = Vec::new();
    for (name, (supply, pinned)) in supplies {
        match supply {
            Supply::Value(v) => {
                params_file.insert(
                    name.clone(),
                    serde_json::json!({"value": v, "pinned": pinned}),
                );
            }
            Supply::Secret(r) => env.push(secret_env(param_env(name, *pinned), r)),
            Supply::ConfigMap(r) => env.push(EnvVar {
                name: param_env(name, *pinned),
                value_from: Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: r.name.clone(),
                        key: r.key.clone(),
                        optional: Some(false),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }
    let mut data = BTreeMap::new();
    for a in tree {
        data.insert(format!("{}.yaml", a.name), agent_file(a, &spec.budgets));
    }
    data.insert(
        PARAMS_FILE.to_string(),
        serde_json::to_string_pretty(&params_file).expect("JSON serializes"),
    );
    let config_map = ConfigMap {
        metadata: meta(config_map(tenant), inputs, owner),
        data: Some(data.clone()),
        ..Default::default()
    };

    // Pods roll when the files change or a referenced object does (by its
    // resourceVersion: values never pass through here).
    let mut hash = Sha256::new();
    for (k, v) in &data {
        hash.update(k.as_bytes());
        hash.update([0]);
        hash.update(v.as_bytes());
        hash.update([0]);
    }
    let owner_ref = inputs.owner_token_ref();
    let mut referenced: Vec<(&str, &str)> = supplies
        .values()
        .filter_map(|(s, _)| match s {
            Supply::Secret(r) => Some(("secret", r.name.as_str())),
            Supply::ConfigMap(r) => Some(("configmap", r.name.as_str())),
            Supply::Value(_) => None,
        })
        .collect();
    referenced.push(("secret", owner_ref.name.as_str()));
    if let Some(r) = &spec.mcp_client_token_secret_ref {
        referenced.push(("secret", r.name.as_str()));
    }
    if let Some(r) = &spec.approver_token_secret_ref {
        referenced.push(("secret", r.name.as_str()));
    }
    let postgres = super::postgres_url(inputs.tenant);
    let peer_tls = peer_tls_secret(tenant);
    if let Some(r) = postgres {
        referenced.push(("secret", r.name.as_str()));
        referenced.push(("secret", peer_tls.as_str()));
    }
    if let Some(t) = &spec.tools {
        referenced.push(("configmap", t.config_map_ref.name.as_str()));
    }
    referenced.sort();
    referenced.dedup();
    for (kind, name) in referenced {
        let objs = if kind == "secret" {
            inputs.secrets
        } else {
            inputs.config_maps
        };
        let rv = objs.get(name).map_or("", |o| o.resource_version.as_str());
        hash.update(format!("{kind}/{name}@{rv}\0").as_bytes());
    }
    let config_hash = hex::encode(hash.finalize());

    // A Postgres store keeps no files: no claim, no store volume.
    let claim = spec
        .store
        .as_ref()
        .filter(|_| postgres.is_none())
        .and_then(|s| s.pvc_size.as_ref())
        .map(|size| PersistentVolumeClaim {
            metadata: meta(store_claim(tenant), inputs, owner),
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: spec
                    .store
                    .as_ref()
                    .and_then(|s| s.storage_class_name.clone()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity(size.clone()))])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });

    let mut volumes = vec![
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
    let mut mounts = vec![
        mount("agents", AGENTS_DIR, true),
        mount("params", PARAMS_DIR, true),
        mount("owner-token", OWNER_DIR, true),
    ];
    let mut args = vec![
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
    let mut ports = vec![ContainerPort {
        name: Some("http".into()),
        container_port: PORT,
        protocol: Some("TCP".into()),
        ..Default::default()
    }];
    match postgres {
        // The URL holds a password: like a secret parameter, it goes from
        // the Secret to the pod's environment, never through here.
        Some(r) => {
            // Replicas forward to each other over mutual TLS, with the
            // certificate all of them share (made by the operator).
            volumes.push(Volume {
                name: "peer-tls".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(peer_tls.clone()),
                    items: Some(
                        PEER_TLS_KEYS
                            .iter()
                            .map(|k| KeyToPath {
                                key: (*k).into(),
                                path: (*k).into(),
                                mode: None,
                            })
                            .collect(),
                    ),
                    default_mode: Some(0o440),
                    ..Default::default()
                }),
                ..Default::default()
            });
            mounts.push(mount("peer-tls", PEER_TLS_DIR, true));
            args.extend([
                "--peer-tls-dir".into(),
                PEER_TLS_DIR.into(),
                "--peer-tls-name".into(),
                peer_tls_name(inputs),
                "--peer-listen".into(),
                format!("0.0.0.0:{PEER_PORT}"),
            ]);
            // On the pod only: the Service is for clients.
            ports.push(ContainerPort {
                name: Some("peer".into()),
                container_port: PEER_PORT,
                protocol: Some("TCP".into()),
                ..Default::default()
            });
            env.extend([
                secret_env("BINDERY_STORE".into(), r),
                // Replicas forward to each other the requests that need what
                // one pod holds in memory: each says, with its heartbeat, where
                // it is reached (its pod IP, from the downward API).
                field_env("BINDERY_POD_IP", "status.podIP"),
                literal_env(
                    "BINDERY_ADVERTISE_URL",
                    format!("https://$(BINDERY_POD_IP):{PEER_PORT}"),
                ),
            ]);
        }
        None => {
            volumes.push(match &claim {
                Some(c) => Volume {
                    name: "store".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: c.metadata.name.clone().unwrap_or_default(),
                        read_only: None,
                    }),
                    ..Default::default()
                },
                None => Volume {
                    name: "store".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
            });
            mounts.push(mount("store", STORE_DIR, false));
            args.extend([
                "--store".into(),
                format!("sqlite://{STORE_DIR}/bindery.sqlite"),
            ]);
        }
    }
    volumes.push(Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    mounts.push(mount("tmp", "/tmp", false));
    args.extend([
        "--owner-token-file".into(),
        format!("{OWNER_DIR}/{OWNER_FILE}"),
        "--log-format".into(),
        "json".into(),
    ]);
    // Like a secret parameter: from the Secret to the pod's environment.
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
    if let Some(t) = &spec.tools {
        volumes.push(Volume {
            name: "tools".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: t.config_map_ref.name.clone(),
                default_mode: Some(0o555),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount("tools", TOOLS_DIR, true));
    }
    // An approval notice that fails for good, or a budget used up, is a
    // Warning Event on the tenant, which the sidecar posts itself; and a
    // tenant with budgets has their use in its status (`status.budgets`),
    // which the sidecar writes too. For that it gets a token of the pod's
    // ServiceAccount (allowed to create Events and, with budgets, to get
    // and patch its tenant's status, nothing else: the Role below), the CA
    // to check the API server with and its namespace. A tenant with neither
    // a webhook nor a budget gets no token at all (the account's and the
    // pod's automountServiceAccountToken stay false either way).
    let webhook = has_webhook(tree);
    let budgets = has_budgets(tree, &spec.budgets);
    let events_access = (webhook || budgets).then(|| {
        volumes.push(Volume {
            name: "events".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            path: "token".into(),
                            expiration_seconds: Some(3600),
                            audience: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: ROOT_CA_CONFIG_MAP.into(),
                            items: Some(vec![KeyToPath {
                                key: "ca.crt".into(),
                                path: "ca.crt".into(),
                                mode: None,
                            }]),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        downward_api: Some(DownwardAPIProjection {
                            items: Some(vec![DownwardAPIVolumeFile {
                                path: "namespace".into(),
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.namespace".into(),
                                    api_version: None,
                                }),
                                ..Default::default()
                            }]),
                        }),
                        ..Default::default()
                    },
                ]),
                default_mode: None,
            }),
            ..Default::default()
        });
        mounts.push(mount("events", EVENTS_DIR, true));
        env.extend([
            literal_env("BINDERY_EVENTS_DIR", EVENTS_DIR),
            literal_env("BINDERY_TENANT", tenant),
            literal_env(
                "BINDERY_TENANT_UID",
                inputs.tenant.metadata.uid.clone().unwrap_or_default(),
            ),
            field_env("POD_NAME", "metadata.name"),
        ]);
        events_rbac(inputs, owner, budgets)
    });
    // The answer links of approval notices: the tenant's own address, or
    // its Service's inside the cluster when it has a webhook and says none.
    let public_url = spec.public_url.clone().or_else(|| {
        webhook.then(|| {
            let ns = inputs
                .tenant
                .metadata
                .namespace
                .as_deref()
                .unwrap_or("default");
            format!("http://{tenant}.{ns}.svc")
        })
    });
    if let Some(url) = public_url {
        env.push(literal_env("BINDERY_PUBLIC_URL", url));
    }
    let overrides = spec.pod_overrides.clone().unwrap_or_default();
    volumes.extend(overrides.volumes);
    env.extend(overrides.env);

    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(10),
        ..Default::default()
    };
    let sidecar = Container {
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
    };
    let mut containers = vec![sidecar];
    containers.extend(overrides.containers);
    let mut pod_annotations = overrides.annotations;
    pod_annotations.insert(CONFIG_HASH.into(), config_hash);

    let deployment = Deployment {
        metadata: meta(workload(tenant), inputs, owner),
        spec: Some(DeploymentSpec {
            replicas: Some(spec.replicas.unwrap_or(1)),
            // A SQLite file on a claim is one pod's: a rolling update would
            // start the new pod while the old one holds the volume (on
            // another node it never attaches, and the rollout stalls; on
            // the same one two servers would share the file). The old pod
            // goes first.
            strategy: claim.is_some().then(|| DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..Default::default()
            }),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    TENANT_LABEL.to_string(),
                    tenant.to_string(),
                )])),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(tenant)),
                    annotations: Some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(workload(tenant)),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        run_as_group: Some(65532),
                        fs_group: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    containers,
                    volumes: Some(volumes),
                    tolerations: (!overrides.tolerations.is_empty())
                        .then_some(overrides.tolerations),
                    node_selector: (!overrides.node_selector.is_empty())
                        .then_some(overrides.node_selector),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let service = Service {
        metadata: meta(workload(tenant), inputs, owner),
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(
                TENANT_LABEL.to_string(),
                tenant.to_string(),
            )])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let service_account = ServiceAccount {
        metadata: meta(workload(tenant), inputs, owner),
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    Objects {
        config_map,
        service_account,
        deployment,
        service,
        claim,
        events_access,
    }
}

/// The tenant's Role to create Events and, with `budgets`, to write its
/// own status, bound to its ServiceAccount.
fn events_rbac(inputs: &Inputs<'_>, owner: &OwnerReference, budgets: bool) -> EventsAccess {
    let tenant = inputs.tenant_name();
    let mut rules = vec![PolicyRule {
        api_groups: Some(vec!["events.k8s.io".into()]),
        resources: Some(vec!["events".into()]),
        verbs: vec!["create".into()],
        ..Default::default()
    }];
    if budgets {
        // The sidecar applies `status.budgets` server-side (a patch) and
        // may read what it last wrote (a get); of this tenant only.
        rules.push(PolicyRule {
            api_groups: Some(vec!["bindery.dev".into()]),
            resources: Some(vec!["agenttenants/status".into()]),
            resource_names: Some(vec![tenant.to_string()]),
            verbs: vec!["get".into(), "patch".into()],
            ..Default::default()
        });
    }
    let role = Role {
        metadata: meta(workload(tenant), inputs, owner),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: meta(workload(tenant), inputs, owner),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: workload(tenant),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: workload(tenant),
            namespace: inputs.tenant.metadata.namespace.clone(),
            api_group: None,
        }]),
    };
    EventsAccess { role, binding }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The owner-token Secret a tenant gets when it names none (created once,
/// never overwritten: the token is the caller's to keep).
pub(crate) fn generated_owner_token(
    inputs: &Inputs<'_>,
    owner: &OwnerReference,
    token: &str,
) -> k8s_openapi::api::core::v1::Secret {
    let tenant = inputs.tenant_name();
    k8s_openapi::api::core::v1::Secret {
        metadata: meta(owner_token_secret(tenant), inputs, owner),
        string_data: Some(BTreeMap::from([(
            OWNER_FILE.to_string(),
            token.to_string(),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The DNS names of the tenant's Service, which its replicas' shared
/// certificate carries.
pub(crate) fn peer_dns_names(inputs: &Inputs<'_>) -> Vec<String> {
    let svc = workload(inputs.tenant_name());
    let ns = inputs
        .tenant
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    vec![
        svc.clone(),
        format!("{svc}.{ns}"),
        format!("{svc}.{ns}.svc"),
        format!("{svc}.{ns}.svc.{}", inputs.config.cluster_domain),
    ]
}

/// The one name a replica checks on a peer's certificate.
pub(crate) fn peer_tls_name(inputs: &Inputs<'_>) -> String {
    peer_dns_names(inputs).swap_remove(2)
}

/// The peer certificate's Secret of a tenant on Postgres (created once,
/// never overwritten): a CA of the tenant's own and one certificate,
/// issued by it for the tenant's Service names, that every replica
/// presents as server and as client. The CA's key is not kept: a new
/// certificate is had by deleting the Secret (the pods roll with the new
/// one).
pub(crate) fn generated_peer_tls(
    inputs: &Inputs<'_>,
    owner: &OwnerReference,
    now: jiff::Timestamp,
) -> Result<k8s_openapi::api::core::v1::Secret, rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let tenant = inputs.tenant_name();
    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    // From yesterday (a node whose clock is behind), for ten years.
    let since = today.yesterday().unwrap_or(today);
    let from = rcgen::date_time_ymd(
        i32::from(since.year()),
        since.month() as u8,
        since.day() as u8,
    );
    let until = rcgen::date_time_ymd(
        i32::from(today.year()) + 10,
        today.month() as u8,
        today.day().min(28) as u8,
    );

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{tenant} replicas CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = from;
    ca.not_after = until;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let names = peer_dns_names(inputs);
    let mut leaf = CertificateParams::new(names.clone())?;
    leaf.distinguished_name
        .push(DnType::CommonName, names[2].clone());
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf.not_before = from;
    leaf.not_after = until;
    let cert = leaf.signed_by(&key, &issuer)?;

    let file = |text: String| k8s_openapi::ByteString(text.into_bytes());
    Ok(k8s_openapi::api::core::v1::Secret {
        metadata: meta(peer_tls_secret(tenant), inputs, owner),
        data: Some(BTreeMap::from([
            ("ca.crt".to_string(), file(ca_cert.pem())),
            ("tls.crt".to_string(), file(cert.pem())),
            ("tls.key".to_string(), file(key.serialize_pem())),
        ])),
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    })
}
