//! The desired state of a tenant, as a pure function: golden YAML of the
//! rendered objects for representative tenants, and the status for every
//! failure a human must fix.

use std::path::PathBuf;

use bindery_operator::crd::ParameterRow;
use bindery_operator::desired::{Desired, Rollout};
use bindery_spec::{from_yaml, AgentSpec};

use crate::common::*;

fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        want == text,
        "{} differs from what is rendered (UPDATE_GOLDEN=1 rewrites it after review):\n{text}",
        path.display()
    );
}

fn objects_yaml(d: &Desired) -> String {
    let o = d.objects.as_ref().expect("objects are rendered");
    let mut docs = vec![
        serde_yaml::to_string(&o.config_map).unwrap(),
        serde_yaml::to_string(&o.service_account).unwrap(),
        serde_yaml::to_string(&o.deployment).unwrap(),
        serde_yaml::to_string(&o.service).unwrap(),
    ];
    if let Some(c) = &o.claim {
        docs.push(serde_yaml::to_string(c).unwrap());
    }
    if let Some(a) = &o.events_access {
        docs.push(serde_yaml::to_string(&a.role).unwrap());
        docs.push(serde_yaml::to_string(&a.binding).unwrap());
    }
    docs.join("---\n")
}

fn cond<'a>(
    d: &'a Desired,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap()
}

/// A tenant refused as reconcile refuses one: `condition` false saying
/// `message`, not Ready, nothing deployed, and a Warning (of `reason`, if
/// given) saying it.
fn assert_refused(d: &Desired, condition: &str, reason: Option<&str>, message: &str, what: &str) {
    let c = cond(d, condition);
    assert_eq!(c.status, "False", "{what}");
    assert!(c.message.contains(message), "{what}: {}", c.message);
    assert_eq!(cond(d, "Ready").status, "False", "{what}");
    assert!(d.objects.is_none(), "{what}: nothing is deployed");
    assert!(
        d.warnings
            .iter()
            .any(|w| reason.is_none_or(|r| w.reason == r) && w.message.contains(message)),
        "{what}: {:?}",
        d.warnings
    );
}

fn row<'a>(d: &'a Desired, agent: &str, name: &str) -> &'a ParameterRow {
    d.status
        .parameters
        .iter()
        .find(|r| r.agent == agent && r.name == name)
        .unwrap()
}

#[test]
fn the_example_tenant_renders_its_objects() {
    let w = World::example();
    let d = w.run();
    golden("acme.yaml", &objects_yaml(&d));
    golden(
        "acme-status.yaml",
        &serde_yaml::to_string(&d.status).unwrap(),
    );
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert!(!d.generate_owner_token, "the owner-token Secret exists");
    assert_eq!(cond(&d, "ParametersResolved").status, "True");
    assert_eq!(cond(&d, "Ready").status, "False");
    assert_eq!(cond(&d, "Ready").reason, "Deploying");
    assert_eq!(d.status.params_bound.as_deref(), Some("2/2"));
    assert_eq!(row(&d, "invoices", "tenant").source, "pinned");
    assert_eq!(
        row(&d, "invoices", "billing_token").source,
        "secret acme-billing/token"
    );
    assert_eq!(
        d.status.endpoint.as_deref(),
        Some("http://acme.shop.svc.cluster.local")
    );
}

/// The example tenant with its sessions in PostgreSQL (the URL in the
/// Secret `acme-db`, key `url`) and three replicas.
fn postgres_world() -> World {
    let mut w = World::example();
    w.tenant.spec.store =
        Some(from_yaml("{postgres: {urlSecretRef: {name: acme-db, key: url}}}").unwrap());
    w.tenant.spec.replicas = Some(3);
    w.secrets.insert("acme-db".into(), obj(&["url"], "900"));
    w.secrets.insert(
        "acme-peer-tls".into(),
        obj(&["ca.crt", "tls.crt", "tls.key"], "902"),
    );
    w
}

#[test]
fn a_postgres_tenant_gets_its_url_from_the_secret_and_keeps_no_files() {
    let w = postgres_world();
    let d = w.run();
    let text = objects_yaml(&d);
    golden("acme-postgres.yaml", &text);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    let o = d.objects.as_ref().unwrap();
    assert!(o.claim.is_none());
    let spec = o.deployment.spec.as_ref().unwrap();
    assert_eq!(
        spec.replicas,
        Some(3),
        "a shared store takes any number of replicas"
    );
    let pod = spec.template.spec.as_ref().unwrap();
    let sidecar = &pod.containers[0];
    let env = sidecar.env.as_ref().unwrap();
    let store = env.iter().find(|e| e.name == "BINDERY_STORE").unwrap();
    assert!(store.value.is_none(), "never a value");
    let r = store
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!((r.name.as_str(), r.key.as_str()), ("acme-db", "url"));
    // Each replica tells the others where it is: its pod IP, declared
    // before the variable that refers to it.
    let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
    let ip = names.iter().position(|n| *n == "BINDERY_POD_IP").unwrap();
    let url = names
        .iter()
        .position(|n| *n == "BINDERY_ADVERTISE_URL")
        .unwrap();
    assert!(ip < url, "{names:?}");
    let field = env[ip].value_from.as_ref().unwrap().field_ref.as_ref();
    assert_eq!(field.unwrap().field_path, "status.podIP");
    // Where the others reach it is its peer port, over mutual TLS.
    assert_eq!(
        env[url].value.as_deref(),
        Some("https://$(BINDERY_POD_IP):8443")
    );
    let args = sidecar.args.as_ref().unwrap();
    assert!(!args.iter().any(|a| a.contains("--store")), "{args:?}");
    let joined = args.join(" ");
    assert!(
        joined.contains(
            "--peer-tls-dir /etc/bindery/peer-tls --peer-tls-name acme.shop.svc --peer-listen 0.0.0.0:8443"
        ),
        "{joined}"
    );
    let ports: Vec<(Option<&str>, i32)> = sidecar
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.name.as_deref(), p.container_port))
        .collect();
    assert_eq!(ports, [(Some("http"), 8080), (Some("peer"), 8443)]);
    let service_ports = o.service.spec.as_ref().unwrap().ports.as_ref().unwrap();
    assert_eq!(service_ports.len(), 1, "the peer port is not the clients'");
    let peer_tls = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "peer-tls")
        .unwrap();
    let source = peer_tls.secret.as_ref().unwrap();
    assert_eq!(source.secret_name.as_deref(), Some("acme-peer-tls"));
    assert!(!d.generate_peer_tls, "the Secret exists");
    let volumes: Vec<&str> = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert!(!volumes.contains(&"store"), "{volumes:?}");
    assert!(volumes.contains(&"owner-token"), "{volumes:?}");
    assert!(bindery_operator::desired::referenced(&w.tenant)
        .0
        .contains("acme-db"));
}

#[test]
fn more_than_one_replica_on_a_claimed_sqlite_store_is_not_deployed() {
    let mut w = World::example();
    w.tenant.spec.store = Some(from_yaml("{pvcSize: 1Gi}").unwrap());
    w.tenant.spec.replicas = Some(2);
    let d = w.run();
    assert!(d.objects.is_none());
    let c = cond(&d, "ParametersResolved");
    assert_eq!(c.status, "False");
    assert!(
        c.message.contains(
            "spec.replicas is 2, but the sessions are kept in SQLite on a claim (spec.store.pvcSize)"
        ) && c
            .message
            .contains("keep the sessions in PostgreSQL (spec.store.postgres), which replicas share"),
        "{}",
        c.message
    );
    // One replica is fine, and renders no peer address (nobody to reach it).
    w.tenant.spec.replicas = Some(1);
    let d = w.run();
    let o = d.objects.as_ref().expect("objects");
    let pod = o.deployment.spec.as_ref().unwrap().template.spec.as_ref();
    let env = pod.unwrap().containers[0].env.clone().unwrap_or_default();
    assert!(!env.iter().any(|e| e.name == "BINDERY_ADVERTISE_URL"));
    // Its pod is replaced, never joined by a second one on the claim.
    let strategy = o.deployment.spec.as_ref().unwrap().strategy.as_ref();
    assert_eq!(
        strategy.and_then(|s| s.type_.as_deref()),
        Some("Recreate"),
        "{strategy:?}"
    );
    // Without a claim each pod has its own file: the default rolling update.
    w.tenant.spec.store = None;
    let d = w.run();
    let o = d.objects.as_ref().expect("objects");
    assert_eq!(o.deployment.spec.as_ref().unwrap().strategy, None);
}

#[test]
fn a_postgres_store_without_its_secret_is_not_deployed() {
    for (what, change, message) in [
        ("missing", None, "the session store (spec.store.postgres.urlSecretRef): Secret `acme-db` does not exist"),
        ("no key", Some(obj(&["uri"], "901")), "the session store (spec.store.postgres.urlSecretRef): Secret `acme-db` has no key `url` (keys: uri)"),
    ] {
        let mut w = postgres_world();
        match change {
            Some(o) => w.secrets.insert("acme-db".into(), o),
            None => w.secrets.remove("acme-db"),
        };
        let d = w.run();
        assert!(d.objects.is_none(), "{what}");
        let c = cond(&d, "ParametersResolved");
        assert_eq!(c.status, "False", "{what}");
        assert!(c.message.contains(message), "{what}: {}", c.message);
        assert_eq!(cond(&d, "Ready").status, "False", "{what}");
        assert!(cond(&d, "Ready").message.contains(message), "{what}");
        assert!(d.warnings.iter().any(|w| w.message.contains(message)), "{what}: {:?}", d.warnings);
    }
}

#[test]
fn pods_roll_when_the_store_secret_changes() {
    let hash = |w: &World| {
        w.run()
            .objects
            .unwrap()
            .deployment
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap()["bindery.dev/config-hash"]
            .clone()
    };
    let mut w = postgres_world();
    let before = hash(&w);
    w.secrets.insert("acme-db".into(), obj(&["url"], "901"));
    assert_ne!(before, hash(&w));
}

#[test]
fn secrets_travel_as_secret_key_refs_only() {
    let d = World::example().run();
    let yaml = objects_yaml(&d);
    assert!(
        yaml.contains("name: BINDERY_PARAM_BILLING_TOKEN\n"),
        "{yaml}"
    );
    assert!(yaml.contains("secretKeyRef:"));
    // The pinned tenant is a value in the params file, not a secret.
    let params = &d
        .objects
        .as_ref()
        .unwrap()
        .config_map
        .data
        .as_ref()
        .unwrap()["params.json"];
    let v: serde_json::Value = serde_json::from_str(params).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"tenant": {"value": "acme-corp", "pinned": true}})
    );
}

/// A Secret whose metadata does not name its keys for certain (applied
/// server-side as `stringData`): the tenant deploys, its key unchecked,
/// and the parameter's row says so and what to do.
#[test]
fn a_secret_whose_key_names_are_unknown_deploys_and_its_row_says_so() {
    let mut w = World::example();
    let mut billing = obj(&[], "7");
    billing.keys = None;
    w.secrets.insert("acme-billing".into(), billing);
    let d = w.run();
    assert!(d.objects.is_some(), "deployed");
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(cond(&d, "ParametersResolved").status, "True");
    let r = row(&d, "invoices", "billing_token");
    assert!(r.bound);
    assert_eq!(r.source, "secret acme-billing/token");
    let m = r.message.as_deref().unwrap_or_default();
    assert!(
        m.starts_with("key `token` not checked: Secret `acme-billing`")
            && m.contains("CreateContainerConfigError"),
        "{m}"
    );
    // The other rows say nothing of it.
    assert_eq!(row(&d, "invoices", "tenant").message, None);
}

#[test]
fn ready_when_pods_are_and_transition_times_stay() {
    let mut w = World::example();
    w.rollout = Some(Rollout {
        replicas: 1,
        ready_replicas: 1,
    });
    let d = w.run();
    assert_eq!(cond(&d, "Ready").status, "True");
    assert_eq!(cond(&d, "Available").message, "1 of 1 pods ready");
    // A later reconcile with the same outcome keeps lastTransitionTime.
    w.tenant.status = Some(d.status.clone());
    w.now = time("2026-11-29T13:00:00Z");
    let again = w.run();
    assert_eq!(
        cond(&again, "Ready").last_transition_time,
        time("2026-11-29T12:00:00Z")
    );
    w.rollout = Some(Rollout {
        replicas: 1,
        ready_replicas: 0,
    });
    let down = w.run();
    assert_eq!(
        cond(&down, "Ready").last_transition_time,
        time("2026-11-29T13:00:00Z")
    );
}

#[test]
fn pods_roll_when_a_referenced_secret_changes() {
    let w = World::example();
    let hash = |d: &Desired| {
        d.objects
            .as_ref()
            .unwrap()
            .deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap()["bindery.dev/config-hash"]
            .clone()
    };
    let before = hash(&w.run());
    assert_eq!(before, hash(&w.run()), "deterministic");
    let mut changed = World::example();
    changed
        .secrets
        .insert("acme-billing".into(), obj(&["token"], "102"));
    assert_ne!(before, hash(&changed.run()));
    let mut tools = World::example();
    tools
        .config_maps
        .insert("invoices-tools".into(), obj(&["query-invoices"], "56"));
    assert_ne!(before, hash(&tools.run()));
}

/// A tenant on Postgres gets its replicas' peer certificate made when the
/// Secret is absent, never otherwise; a tenant on SQLite (one pod, nothing
/// to forward) has none.
#[test]
fn a_peer_certificate_is_made_for_a_postgres_tenant_when_absent() {
    let mut w = postgres_world();
    assert!(!w.run().generate_peer_tls);
    w.secrets.remove("acme-peer-tls");
    let d = w.run();
    assert!(d.generate_peer_tls);
    assert!(d.objects.is_some());
    let sqlite = World::example().run();
    assert!(!sqlite.generate_peer_tls);
    let pod = sqlite
        .objects
        .unwrap()
        .deployment
        .spec
        .unwrap()
        .template
        .spec
        .unwrap();
    assert!(!pod.containers[0]
        .args
        .as_ref()
        .unwrap()
        .iter()
        .any(|a| a.contains("peer")));
    assert!(!pod.volumes.unwrap().iter().any(|v| v.name == "peer-tls"));

    // One made by hand must hold the three files.
    w.secrets
        .insert("acme-peer-tls".into(), obj(&["tls.crt", "tls.key"], "3"));
    let d = w.run();
    assert!(d.objects.is_none());
    assert!(cond(&d, "ParametersResolved")
        .message
        .contains("the replicas' peer certificate: Secret `acme-peer-tls` has no key `ca.crt`"));
}

/// The certificate the operator makes: a CA of the tenant's own, and one
/// certificate it issued for the tenant's Service names, good for a server
/// and a client (openssl checks it, as a replica's TLS would).
#[test]
fn the_peer_certificate_chains_to_the_tenant_ca_and_names_the_service() {
    let w = postgres_world();
    let inputs = bindery_operator::desired::Inputs {
        tenant: &w.tenant,
        agents: &w.agents,
        secrets: &w.secrets,
        config_maps: &w.config_maps,
        config: &bindery_operator::desired::OperatorConfig::default(),
        rollout: None,
        now: w.now.clone(),
    };
    let secret = bindery_operator::desired::generated_peer_tls(&inputs, w.now.0).unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(secret.metadata.name.as_deref(), Some("acme-peer-tls"));
    let owners = secret.metadata.owner_references.as_ref().unwrap();
    assert_eq!(owners[0].name, "acme");
    let data = secret.data.as_ref().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for k in ["ca.crt", "tls.crt", "tls.key"] {
        std::fs::write(dir.path().join(k), &data[k].0).unwrap();
    }
    let openssl = |args: &[&str]| {
        let o = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("openssl (tests/setup.sh installs it)");
        assert!(
            o.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    for purpose in ["sslserver", "sslclient"] {
        let out = openssl(&[
            "verify", "-CAfile", "ca.crt", "-purpose", purpose, "tls.crt",
        ]);
        assert!(out.contains("tls.crt: OK"), "{out}");
    }
    let names = openssl(&["x509", "-in", "tls.crt", "-noout", "-ext", "subjectAltName"]);
    for n in [
        "acme",
        "acme.shop",
        "acme.shop.svc",
        "acme.shop.svc.cluster.local",
    ] {
        assert!(
            names.contains(&format!("DNS:{n},")) || names.trim_end().ends_with(&format!("DNS:{n}")),
            "{names}"
        );
    }
    // The key is the certificate's.
    let from_key = openssl(&["pkey", "-in", "tls.key", "-pubout"]);
    let from_cert = openssl(&["x509", "-in", "tls.crt", "-noout", "-pubkey"]);
    assert_eq!(from_key, from_cert);
    // Each is made anew: no two tenants share a CA.
    let again = bindery_operator::desired::generated_peer_tls(&inputs, w.now.0).unwrap();
    assert_ne!(again.data.as_ref().unwrap()["ca.crt"], data["ca.crt"]);
}

#[test]
fn an_owner_token_is_generated_when_none_is_named() {
    let mut w = World::example();
    w.secrets.remove("acme-owner-token");
    let d = w.run();
    assert!(d.generate_owner_token);
    assert!(d.objects.is_some());
    let mut named = World::example();
    named.tenant.spec.owner_token_secret_ref = Some(bindery_operator::crd::KeyRef {
        name: "mine".into(),
        key: "t".into(),
    });
    let d = named.run();
    assert!(d.objects.is_none());
    assert!(cond(&d, "ParametersResolved")
        .message
        .contains("the owner token: Secret `mine` (spec.ownerTokenSecretRef) does not exist"));
}

/// The example tenant with an MCP client token in the Secret `acme-mcp`,
/// key `token`.
fn mcp_client_token_world() -> World {
    let mut w = World::example();
    w.tenant.spec.mcp_client_token_secret_ref = Some(bindery_operator::crd::KeyRef {
        name: "acme-mcp".into(),
        key: "token".into(),
    });
    w.secrets.insert("acme-mcp".into(), obj(&["token"], "300"));
    w
}

fn sidecar_env(d: &Desired) -> Vec<k8s_openapi::api::core::v1::EnvVar> {
    let o = d.objects.as_ref().expect("objects are rendered");
    let pod = o.deployment.spec.as_ref().unwrap().template.spec.as_ref();
    pod.unwrap().containers[0].env.clone().unwrap_or_default()
}

/// The MCP client token goes from its Secret to the sidecar's environment
/// as a `secretKeyRef`: never a value, never in the ConfigMap, the
/// arguments or the status. None is generated, and without a reference
/// the pod has no such variable.
#[test]
fn an_mcp_client_token_reaches_the_sidecar_from_its_secret_key_only() {
    let w = mcp_client_token_world();
    let d = w.run();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(cond(&d, "ParametersResolved").status, "True");
    let env = sidecar_env(&d);
    golden(
        "acme-mcp-client-token-env.yaml",
        &serde_yaml::to_string(&env).unwrap(),
    );
    let token: Vec<_> = env
        .iter()
        .filter(|e| e.name == "BINDERY_MCP_CLIENT_TOKEN")
        .collect();
    assert_eq!(token.len(), 1, "{env:?}");
    assert!(token[0].value.is_none(), "never a value");
    let r = token[0]
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (r.name.as_str(), r.key.as_str(), r.optional),
        ("acme-mcp", "token", Some(false))
    );
    // The Secret is named in one place of what is rendered: that
    // secretKeyRef (no volume, argument or ConfigMap key).
    let yaml = objects_yaml(&d);
    assert_eq!(yaml.matches("acme-mcp").count(), 1, "{yaml}");
    assert_eq!(yaml.matches("MCP_CLIENT_TOKEN").count(), 1, "{yaml}");
    let o = d.objects.as_ref().unwrap();
    let args = o.deployment.spec.as_ref().unwrap().template.spec.as_ref();
    let args = args.unwrap().containers[0].args.clone().unwrap_or_default();
    assert!(!args.join(" ").to_lowercase().contains("mcp"), "{args:?}");
    assert!(!serde_yaml::to_string(&d.status)
        .unwrap()
        .contains("acme-mcp"));
    // Watched like the other referenced Secrets.
    assert!(bindery_operator::desired::referenced(&w.tenant)
        .0
        .contains("acme-mcp"));
    // Never generated: the owner token is, the MCP client token is not.
    assert!(!d.generate_owner_token);

    // Without a reference: no variable, nothing else changes.
    let plain = World::example().run();
    assert!(
        !sidecar_env(&plain)
            .iter()
            .any(|e| e.name == "BINDERY_MCP_CLIENT_TOKEN"),
        "{:?}",
        sidecar_env(&plain)
    );
    assert!(!objects_yaml(&plain).contains("MCP_CLIENT_TOKEN"));
}

/// The pods roll when the MCP client token's Secret changes, and when the
/// reference does.
#[test]
fn pods_roll_when_the_mcp_client_token_changes() {
    let template = |w: &World| w.run().objects.unwrap().deployment.spec.unwrap().template;
    let hash = |w: &World| {
        template(w).metadata.unwrap().annotations.unwrap()["bindery.dev/config-hash"].clone()
    };
    let mut w = mcp_client_token_world();
    let before = hash(&w);
    assert_eq!(before, hash(&w), "deterministic");
    assert_ne!(before, hash(&World::example()), "the reference counts");
    w.secrets.insert("acme-mcp".into(), obj(&["token"], "301"));
    assert_ne!(before, hash(&w), "a new resourceVersion of the Secret");
    let mut other_key = mcp_client_token_world();
    other_key
        .secrets
        .insert("acme-mcp".into(), obj(&["token", "t2"], "300"));
    let first = template(&other_key);
    other_key
        .tenant
        .spec
        .mcp_client_token_secret_ref
        .as_mut()
        .unwrap()
        .key = "t2".into();
    assert_ne!(first, template(&other_key), "another key");
}

/// A missing Secret or key of the MCP client token: not ready, nothing
/// deployed, a condition and a Warning naming the field, the Secret and the
/// key, as for the owner token. Never generated in its place.
#[test]
fn an_mcp_client_token_without_its_secret_is_not_deployed() {
    for (what, change, message) in [
        (
            "missing",
            None,
            "the MCP client token: Secret `acme-mcp` (spec.mcpClientTokenSecretRef, key `token`) does not exist",
        ),
        (
            "no key",
            Some(obj(&["tok"], "301")),
            "the MCP client token: Secret `acme-mcp` (spec.mcpClientTokenSecretRef) has no key `token`",
        ),
    ] {
        let mut w = mcp_client_token_world();
        match change {
            Some(o) => w.secrets.insert("acme-mcp".into(), o),
            None => w.secrets.remove("acme-mcp"),
        };
        let d = w.run();
        assert_refused(&d, "ParametersResolved", Some("ParametersUnresolved"), message, what);
        assert!(!d.generate_owner_token, "{what}");
        assert_eq!(cond(&d, "ParametersResolved").reason, "Unresolved", "{what}");
        assert!(cond(&d, "Ready").message.contains(message), "{what}");
    }
}

/// The example tenant with an approver token in the Secret
/// `acme-approver`, key `token`.
fn approver_token_world() -> World {
    let mut w = World::example();
    w.tenant.spec.approver_token_secret_ref = Some(bindery_operator::crd::KeyRef {
        name: "acme-approver".into(),
        key: "token".into(),
    });
    w.secrets
        .insert("acme-approver".into(), obj(&["token"], "400"));
    w
}

/// The approver token goes from its Secret to the sidecar's environment
/// as a `secretKeyRef`: never a value, never in the ConfigMap, the
/// arguments or the status. None is generated, and without a reference
/// the pod has no such variable.
#[test]
fn an_approver_token_reaches_the_sidecar_from_its_secret_key_only() {
    let w = approver_token_world();
    let d = w.run();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(cond(&d, "ParametersResolved").status, "True");
    let env = sidecar_env(&d);
    golden(
        "acme-approver-token-env.yaml",
        &serde_yaml::to_string(&env).unwrap(),
    );
    let token: Vec<_> = env
        .iter()
        .filter(|e| e.name == "BINDERY_APPROVER_TOKEN")
        .collect();
    assert_eq!(token.len(), 1, "{env:?}");
    assert!(token[0].value.is_none(), "never a value");
    let r = token[0]
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (r.name.as_str(), r.key.as_str(), r.optional),
        ("acme-approver", "token", Some(false))
    );
    // The Secret is named in one place of what is rendered: that
    // secretKeyRef (no volume, argument or ConfigMap key).
    let yaml = objects_yaml(&d);
    assert_eq!(yaml.matches("acme-approver").count(), 1, "{yaml}");
    assert_eq!(yaml.matches("APPROVER_TOKEN").count(), 1, "{yaml}");
    let o = d.objects.as_ref().unwrap();
    let args = o.deployment.spec.as_ref().unwrap().template.spec.as_ref();
    let args = args.unwrap().containers[0].args.clone().unwrap_or_default();
    assert!(
        !args.join(" ").to_lowercase().contains("approver"),
        "{args:?}"
    );
    assert!(!serde_yaml::to_string(&d.status)
        .unwrap()
        .contains("acme-approver"));
    // Watched like the other referenced Secrets.
    assert!(bindery_operator::desired::referenced(&w.tenant)
        .0
        .contains("acme-approver"));
    // Never generated: the owner token is, the approver token is not.
    assert!(!d.generate_owner_token);

    // Without a reference: no variable, nothing else changes.
    let plain = World::example().run();
    assert!(
        !sidecar_env(&plain)
            .iter()
            .any(|e| e.name == "BINDERY_APPROVER_TOKEN"),
        "{:?}",
        sidecar_env(&plain)
    );
    assert!(!objects_yaml(&plain).contains("APPROVER_TOKEN"));
}

/// The approver and MCP client tokens side by side: each variable from
/// its own Secret, neither taking the other's place.
#[test]
fn the_approver_and_mcp_client_tokens_are_two_variables_from_two_secrets() {
    let mut w = approver_token_world();
    let mcp = mcp_client_token_world();
    w.tenant.spec.mcp_client_token_secret_ref = mcp.tenant.spec.mcp_client_token_secret_ref;
    w.secrets
        .insert("acme-mcp".into(), mcp.secrets["acme-mcp"].clone());
    let d = w.run();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    let refs: Vec<(String, String, String)> = sidecar_env(&d)
        .iter()
        .filter(|e| e.name == "BINDERY_APPROVER_TOKEN" || e.name == "BINDERY_MCP_CLIENT_TOKEN")
        .map(|e| {
            assert!(e.value.is_none(), "{e:?}");
            let r = e.value_from.as_ref().unwrap().secret_key_ref.as_ref();
            let r = r.unwrap();
            (e.name.clone(), r.name.clone(), r.key.clone())
        })
        .collect();
    assert_eq!(
        refs,
        [
            (
                "BINDERY_MCP_CLIENT_TOKEN".to_string(),
                "acme-mcp".to_string(),
                "token".to_string()
            ),
            (
                "BINDERY_APPROVER_TOKEN".to_string(),
                "acme-approver".to_string(),
                "token".to_string()
            ),
        ]
    );
    // One missing is reported alone; the other is not blamed.
    w.secrets.remove("acme-approver");
    let d = w.run();
    let c = cond(&d, "ParametersResolved");
    assert!(
        c.message.contains("spec.approverTokenSecretRef"),
        "{}",
        c.message
    );
    assert!(
        !c.message.contains("spec.mcpClientTokenSecretRef"),
        "{}",
        c.message
    );
}

/// The pods roll when the approver token's Secret changes, and when the
/// reference does.
#[test]
fn pods_roll_when_the_approver_token_changes() {
    let template = |w: &World| w.run().objects.unwrap().deployment.spec.unwrap().template;
    let hash = |w: &World| {
        template(w).metadata.unwrap().annotations.unwrap()["bindery.dev/config-hash"].clone()
    };
    let mut w = approver_token_world();
    let before = hash(&w);
    assert_eq!(before, hash(&w), "deterministic");
    assert_ne!(before, hash(&World::example()), "the reference counts");
    w.secrets
        .insert("acme-approver".into(), obj(&["token"], "401"));
    assert_ne!(before, hash(&w), "a new resourceVersion of the Secret");
    let mut other_key = approver_token_world();
    other_key
        .secrets
        .insert("acme-approver".into(), obj(&["token", "t2"], "400"));
    let first = template(&other_key);
    other_key
        .tenant
        .spec
        .approver_token_secret_ref
        .as_mut()
        .unwrap()
        .key = "t2".into();
    assert_ne!(first, template(&other_key), "another key");
}

/// A missing Secret or key of the approver token: not ready, nothing
/// deployed, a condition and a Warning naming the field, the Secret and
/// the key, as for the MCP client token. Never generated in its place.
#[test]
fn an_approver_token_without_its_secret_is_not_deployed() {
    for (what, change, message) in [
        (
            "missing",
            None,
            "the approver token: Secret `acme-approver` (spec.approverTokenSecretRef, key `token`) does not exist",
        ),
        (
            "no key",
            Some(obj(&["tok"], "401")),
            "the approver token: Secret `acme-approver` (spec.approverTokenSecretRef) has no key `token`",
        ),
    ] {
        let mut w = approver_token_world();
        match change {
            Some(o) => w.secrets.insert("acme-approver".into(), o),
            None => w.secrets.remove("acme-approver"),
        };
        let d = w.run();
        assert_refused(&d, "ParametersResolved", Some("ParametersUnresolved"), message, what);
        assert!(!d.generate_owner_token, "{what}");
        assert_eq!(cond(&d, "ParametersResolved").reason, "Unresolved", "{what}");
        assert!(cond(&d, "Ready").message.contains(message), "{what}");
    }
}

/// Every failure: not ready, nothing rendered, a message naming what to
/// fix, and a Warning event.
#[test]
fn every_failure_names_what_to_fix() {
    type Change = fn(&mut World);
    let cases: Vec<(&str, Change, &str, &str)> = vec![
        ("missing secret", |w| { w.secrets.remove("acme-billing"); },
         "ParametersResolved", "parameter `billing_token` of Agent `invoices`: Secret `acme-billing` does not exist"),
        ("missing key", |w| { w.secrets.insert("acme-billing".into(), obj(&["tok"], "1")); },
         "ParametersResolved", "parameter `billing_token` of Agent `invoices`: Secret `acme-billing` has no key `token` (keys: tok)"),
        ("missing configmap key", |w| {
            w.tenant.spec.parameters[1].value_from = Some(bindery_operator::crd::ValueFrom { secret_key_ref: None, config_map_key_ref: Some(bindery_operator::crd::KeyRef { name: "cfg".into(), key: "k".into() }) });
         }, "ParametersResolved", "ConfigMap `cfg` does not exist"),
        ("unknown agent", |w| { w.tenant.spec.agent_ref.name = "nope".into(); },
         "AgentValid", "Agent `nope` does not exist in this namespace"),
        ("undeclared parameter", |w| {
            let mut p = w.tenant.spec.parameters[0].clone();
            p.name = "tenantt".into();
            w.tenant.spec.parameters.push(p);
         }, "ParametersResolved", "spec.parameters[2] `tenantt`: no agent of the tree declares it (declared: billing_token, tenant)"),
        ("a parameter for an agent that declares none", |w| {
            w.agents.insert("invoices".into(), from_yaml("{model: {url: 'https://llm.example', name: m}}").unwrap());
         }, "ParametersResolved", "spec.parameters[0] `tenant`: no agent of the tree declares it (the tree declares no parameters)"),
        ("plain value for a secret", |w| {
            w.tenant.spec.parameters[1].value = Some(serde_json::json!("canary-7f3a9c"));
            w.tenant.spec.parameters[1].value_from = None;
         }, "ParametersResolved", "parameter `billing_token` of Agent `invoices`: a secret parameter cannot take a plain `value`"),
        ("required process parameter without source", |w| {
            w.tenant.spec.parameters.remove(1);
         }, "ParametersResolved", "parameter `billing_token` of Agent `invoices`: required and unbound: add `{name: billing_token, value: …}` or a `valueFrom` to spec.parameters"),
        ("missing helper", |w| {
            let spec = w.agents.get_mut("invoices").unwrap();
            spec.helpers.push(from_yaml("{agent: ledger}").unwrap());
         }, "AgentValid", "Agent `invoices`, helper 1: Agent `ledger` does not exist in this namespace"),
        ("BINDERY_ env override", |w| {
            w.tenant.spec.pod_overrides = Some(from_yaml("{env: [{name: BINDERY_PARAM_TENANT, value: x}]}").unwrap());
         }, "ParametersResolved", "spec.podOverrides.env `BINDERY_PARAM_TENANT`: BINDERY_ variables are set by the operator"),
        ("invalid agent", |w| {
            let spec = w.agents.get_mut("invoices").unwrap();
            spec.parameters.push(from_yaml("{name: Bad-Name}").unwrap());
         }, "AgentValid", "Agent `invoices`, parameter `Bad-Name`: a parameter name is lower-case letters"),
    ];
    for (what, change, type_, message) in cases {
        let mut w = World::example();
        change(&mut w);
        let d = w.run();
        assert_refused(&d, type_, None, message, what);
        assert!(
            !serde_yaml::to_string(&d.status)
                .unwrap()
                .contains("canary-7f3a9c"),
            "{what}"
        );
    }
}

/// A `confirm` selector's `when` that does not compile: the Agent is
/// invalid (its own `Valid` False; the tenant's `AgentValid` False, a
/// Warning, nothing deployed) with a message naming the selector and
/// where in the condition the mistake is, for an agent-level selector and
/// a toolbox's alike. A condition that compiles is valid and reported
/// nowhere.
#[test]
fn a_confirm_condition_that_does_not_compile_makes_the_agent_invalid() {
    const BAD: &str = "args.amount > > 100";
    const GOOD: &str = "args.amount > 100";
    let agent_level = |when: &str| {
        let mut w = World::example();
        let spec = w.agents.get_mut("invoices").unwrap();
        spec.confirm =
            from_yaml(&format!("[{{tool: bash_query-invoices, when: {when:?}}}]")).unwrap();
        w
    };
    let in_toolbox = |when: &str| {
        let mut w = World::example();
        let spec = w.agents.get_mut("invoices").unwrap();
        let bindery_spec::Toolbox::Bash(b) = &mut spec.toolboxes[0] else {
            panic!("examples/k8s/agent.yaml: its first toolbox is no longer bash");
        };
        b.confirm =
            Some(from_yaml(&format!("[{{tool: query-invoices, when: {when:?}}}]")).unwrap());
        w
    };
    type Make = fn(&str) -> World;
    let cases: [(&str, Make, &str); 2] = [
        (
            "agent-level",
            agent_level,
            "Agent `invoices`, agent-level confirm `bash_query-invoices`: the condition `when: args.amount > > 100` does not compile at line 1, column",
        ),
        (
            "toolbox",
            in_toolbox,
            "Agent `invoices`, toolbox 1 (bash directory tools), confirm `query-invoices`: the condition `when: args.amount > > 100` does not compile at line 1, column",
        ),
    ];
    let now = time("2026-11-29T12:00:00Z");
    let valid = |w: &World| {
        let st = bindery_operator::desired::agent_status("invoices", &w.agents, Some(2), &[], &now);
        st.conditions
            .into_iter()
            .find(|c| c.type_ == "Valid")
            .unwrap()
    };
    for (what, make, message) in cases {
        let own = valid(&make(BAD));
        assert_eq!(own.status, "False", "{what}: {own:?}");
        assert!(own.message.contains(message), "{what}: {}", own.message);
        let d = make(BAD).run();
        assert_refused(&d, "AgentValid", Some("InvalidAgent"), message, what);
        assert_eq!(cond(&d, "AgentValid").reason, "InvalidAgent", "{what}");

        let own = valid(&make(GOOD));
        assert_eq!(own.status, "True", "{what}: {own:?}");
        let d = make(GOOD).run();
        let c = cond(&d, "AgentValid");
        assert_eq!(c.status, "True", "{what}: {:?}", d.status.conditions);
        assert!(d.warnings.is_empty(), "{what}: {:?}", d.warnings);
        let status = serde_yaml::to_string(&d.status).unwrap();
        assert!(!status.contains("does not compile"), "{what}: {status}");
        assert!(d.objects.is_some(), "{what}: deployed");
    }
}

/// Helpers: the tree's parameters all get rows, marked with their agent and
/// whether the caller's `with` fills them.
#[test]
fn helper_parameters_have_rows() {
    let mut w = World::example();
    let support: AgentSpec = from_yaml(
        r#"
model: {url: "http://model", name: m}
parameters:
  - {name: customer, scope: session}
  - {name: billing_token, secret: true}
helpers:
  - agent: invoices
    with:
      tenant: {param: customer}
"#,
    )
    .unwrap();
    w.agents.insert("support".into(), support);
    w.tenant.spec.agent_ref.name = "support".into();
    w.tenant.spec.parameters.remove(0);
    let d = w.run();
    assert_eq!(cond(&d, "AgentValid").status, "True", "{:?}", d.status);
    assert_eq!(
        cond(&d, "ParametersResolved").status,
        "True",
        "{:?}",
        d.status.conditions
    );
    assert_eq!(row(&d, "support", "customer").source, "per-session");
    assert_eq!(row(&d, "invoices", "tenant").source, "with");
    assert!(row(&d, "invoices", "tenant").bound);
    assert_eq!(
        row(&d, "invoices", "billing_token").source,
        "secret acme-billing/token"
    );
    assert_eq!(d.status.params_bound.as_deref(), Some("3/4"));
    let data = d.objects.unwrap().config_map.data.unwrap();
    assert!(data.contains_key("support.yaml") && data.contains_key("invoices.yaml"));
    assert!(data["invoices.yaml"].contains("directory: /etc/bindery/tools"));
}

#[test]
fn an_mcp_program_given_by_a_relative_path_comes_from_the_tools_config_map() {
    let mut w = World::example();
    let toolboxes = &mut w.agents.get_mut("invoices").unwrap().toolboxes;
    toolboxes.push(
        from_yaml(r#"{mcp: {name: billing, command: [./servers/billing-mcp.py, --stdio], env: {MODE: {literal: ro}}}}"#)
            .unwrap(),
    );
    toolboxes.push(from_yaml(r#"{mcp: {name: search, command: [mcp-search, stdio]}}"#).unwrap());
    toolboxes.push(from_yaml(r#"{mcp: {name: crm, url: "http://127.0.0.1:8931/mcp"}}"#).unwrap());
    let d = w.run();
    assert_eq!(
        cond(&d, "AgentValid").status,
        "True",
        "{:?}",
        d.status.conditions
    );
    let data = d.objects.unwrap().config_map.data.unwrap();
    let file: bindery_spec::AgentDocument = from_yaml(&data["invoices.yaml"]).unwrap();
    let commands: Vec<(String, Vec<String>, Option<String>)> = file
        .spec
        .toolboxes
        .iter()
        .filter_map(|t| match t {
            bindery_spec::Toolbox::Mcp(m) => {
                Some((m.name.clone(), m.command.clone(), m.url.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        commands,
        [
            (
                "billing".to_string(),
                vec![
                    "/etc/bindery/tools/billing-mcp.py".to_string(),
                    "--stdio".into()
                ],
                None
            ),
            (
                "search".into(),
                vec!["mcp-search".into(), "stdio".into()],
                None
            ),
            (
                "crm".into(),
                vec![],
                Some("http://127.0.0.1:8931/mcp".into())
            ),
        ]
    );
}

#[test]
fn an_mcp_server_env_from_a_session_parameter_makes_the_agent_invalid() {
    let mut w = World::example();
    w.agents.get_mut("invoices").unwrap().toolboxes.push(
        from_yaml(
            r#"{mcp: {name: billing, command: [mcp-billing], env: {TENANT: {param: tenant}}}}"#,
        )
        .unwrap(),
    );
    let now = time("2026-11-29T12:00:00Z");
    let st = bindery_operator::desired::agent_status("invoices", &w.agents, Some(2), &[], &now);
    assert_eq!(st.conditions[0].status, "False");
    assert!(
        st.conditions[0].message.contains(
            "env `TENANT`: parameter `tenant` is session-scope, but the MCP server is started once"
        ),
        "{:?}",
        st.conditions
    );
}

#[test]
fn the_status_lists_the_tools_that_wait() {
    let mut w = World::example();
    let spec = w.agents.get_mut("invoices").unwrap();
    spec.confirm = from_yaml("[{tool: 'bash_delete-*'}]").unwrap();
    spec.toolboxes
        .push(from_yaml("{deferred: {tools: [{name: get_location}]}}").unwrap());
    spec.toolboxes.push(
        from_yaml("{openapi: {spec: ./api.yaml, baseUrl: 'http://api', confirm: writes}}").unwrap(),
    );
    let now = time("2026-11-29T12:00:00Z");
    let st = bindery_operator::desired::agent_status("invoices", &w.agents, Some(2), &[], &now);
    assert_eq!(
        st.waiting_tools,
        [
            "confirm bash_delete-*",
            "deferred get_location",
            "confirm toolbox 3 (openapi ./api.yaml): every write",
        ]
    );
    // The tenant's status lists them too, naming the agent.
    let d = w.run();
    assert_eq!(
        d.status.waiting_tools,
        [
            "confirm bash_delete-* (invoices)",
            "deferred get_location (invoices)",
            "confirm toolbox 3 (openapi ./api.yaml): every write (invoices)",
        ]
    );
}

#[test]
fn an_agent_is_valid_or_says_why() {
    let w = World::example();
    let now = time("2026-11-29T12:00:00Z");
    let ok = bindery_operator::desired::agent_status("invoices", &w.agents, Some(2), &[], &now);
    assert_eq!(ok.conditions[0].type_, "Valid");
    assert_eq!(ok.conditions[0].status, "True");
    assert_eq!(ok.observed_generation, Some(2));
    let mut agents = w.agents.clone();
    agents
        .get_mut("invoices")
        .unwrap()
        .helpers
        .push(from_yaml("{agent: ledger}").unwrap());
    let bad =
        bindery_operator::desired::agent_status("invoices", &agents, Some(3), &ok.conditions, &now);
    assert_eq!(bad.conditions[0].status, "False");
    assert!(
        bad.conditions[0]
            .message
            .contains("Agent `ledger` does not exist in this namespace"),
        "{:?}",
        bad
    );
}

#[test]
fn a_dependency_cycle_duplicate_or_overlap_makes_the_agent_invalid() {
    let mut w = World::example();
    let spec = w.agents.get_mut("invoices").unwrap();
    spec.tools = from_yaml(
        r#"[{tool: bash_book, depends_on: [{tool: bash_slots, map: {$.slot: $.id}},
                                       {tool: bash_slots, map: {$.other: $.id}},
                                       {tool: bash_rooms, map: {$.slot: $.room}}]},
            {tool: bash_slots, depends_on: [{tool: bash_book, map: {$.x: $.y}}]}]"#,
    )
    .unwrap();
    let now = time("2026-11-29T12:00:00Z");
    let st = bindery_operator::desired::agent_status("invoices", &w.agents, Some(2), &[], &now);
    assert_eq!(st.conditions[0].status, "False");
    let msg = &st.conditions[0].message;
    for want in [
        "Agent `invoices`, agent-level tools, tool `bash_book`, depends_on 2 (tool `bash_slots`): a duplicate dependency",
        "depends_on 3 (tool `bash_rooms`): destination `$.slot` is already filled by depends_on 1",
        "tool `bash_book`: its dependencies form a cycle (bash_book -> bash_slots -> bash_book)",
    ] {
        assert!(msg.contains(want), "{want} not in {msg}");
    }
}

/// The sidecar's arguments as rendered for `w`.
fn sidecar_args(w: &World) -> Vec<String> {
    let d = w.run();
    let o = d.objects.as_ref().expect("objects are rendered");
    let pod = o.deployment.spec.as_ref().unwrap().template.spec.as_ref();
    pod.unwrap().containers[0].args.clone().unwrap_or_default()
}

/// The value `flag` is given in `args`, if it is there.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

#[test]
fn a_tenant_sets_how_long_idle_sessions_keep_their_secrets_or_turns_it_off() {
    let mut w = World::example();
    let flag = "--live-session-ttl";
    assert_eq!(flag_value(&sidecar_args(&w), flag), Some("30m"));
    // Left out: the sidecar's own default (an hour) applies.
    w.tenant.spec.live_session_ttl = None;
    assert_eq!(flag_value(&sidecar_args(&w), flag), None);
    w.tenant.spec.live_session_ttl = Some("off".into());
    assert_eq!(flag_value(&sidecar_args(&w), flag), Some("off"));
}

#[test]
fn a_tenants_per_user_cap_and_rate_limits_become_the_servers_flags() {
    let mut w = World::example();
    let args = sidecar_args(&w);
    for flag in [
        "--max-runs-per-user",
        "--requests-per-minute",
        "--per-user-requests-per-minute",
        "--tool-rate-limit",
    ] {
        assert_eq!(flag_value(&args, flag), None, "{flag} without the field");
    }
    w.tenant.spec.per_user = Some(from_yaml("{maxConcurrentRuns: 3}").unwrap());
    w.tenant.spec.rate_limits = Some(
        from_yaml(
            "{requestsPerMinute: 600, perUserRequestsPerMinute: 60, tools: [\
             {tool: 'openapi_billing_*', callsPerMinute: 10, perUser: true}, \
             {tool: bash_report, callsPerMinute: 2}]}",
        )
        .unwrap(),
    );
    let args = sidecar_args(&w);
    assert_eq!(flag_value(&args, "--max-runs-per-user"), Some("3"));
    assert_eq!(flag_value(&args, "--requests-per-minute"), Some("600"));
    assert_eq!(
        flag_value(&args, "--per-user-requests-per-minute"),
        Some("60")
    );
    let tools: Vec<_> = args
        .windows(2)
        .filter(|p| p[0] == "--tool-rate-limit")
        .map(|p| p[1].as_str())
        .collect();
    assert_eq!(tools, ["openapi_billing_*=10/user", "bash_report=2"]);
}

/// The example tenant whose agent announces the calls that wait for a
/// person to an approval webhook, its signing key from the Secret
/// `acme-approvals`, key `key`.
fn approval_webhook_world() -> World {
    let mut w = World::example();
    let spec = w.agents.get_mut("invoices").unwrap();
    spec.approvals = Some(
        from_yaml("{webhook: {url: 'https://approvals.example.com/bindery', signingKey: {param: approvals_key}}}")
            .unwrap(),
    );
    spec.parameters
        .push(from_yaml("{name: approvals_key, secret: true, scope: process}").unwrap());
    w.tenant.spec.parameters.push(
        from_yaml(
            "{name: approvals_key, valueFrom: {secretKeyRef: {name: acme-approvals, key: key}}}",
        )
        .unwrap(),
    );
    w.secrets
        .insert("acme-approvals".into(), obj(&["key"], "500"));
    w
}

fn pod_spec(d: &Desired) -> k8s_openapi::api::core::v1::PodSpec {
    let o = d.objects.as_ref().expect("objects are rendered");
    let template = &o.deployment.spec.as_ref().unwrap().template;
    template.spec.clone().unwrap()
}

/// A tenant whose agent has an approval webhook: a Role that may create
/// Events in its namespace and do nothing else, bound to the tenant's
/// ServiceAccount, both owned and labelled like the rest; the sidecar gets
/// a projected token of that account, the cluster's CA and the namespace,
/// and the variables that say where they are and which tenant to post on.
/// The pod and account still mount no token of their own accord.
#[test]
fn an_approval_webhook_lets_the_tenant_post_events_and_nothing_more() {
    let w = approval_webhook_world();
    let d = w.run();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(cond(&d, "ParametersResolved").status, "True");
    golden("acme-approval-webhook.yaml", &objects_yaml(&d));
    let o = d.objects.as_ref().unwrap();
    let access = o.events_access.as_ref().expect("a Role and a RoleBinding");
    let plain = World::example().run();
    let labels = plain
        .objects
        .as_ref()
        .unwrap()
        .service
        .metadata
        .labels
        .clone();
    for meta in [&access.role.metadata, &access.binding.metadata] {
        assert_eq!(meta.name.as_deref(), Some("acme"));
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        assert_eq!(meta.labels, labels, "labelled like the other owned objects");
        let owners = meta.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "AgentTenant");
        assert_eq!(owners[0].uid, "0b7c3b0e-1111-4a4a-9f9f-000000000001");
        assert_eq!(owners[0].controller, Some(true));
    }
    let rules = serde_json::to_value(&access.role.rules).unwrap();
    assert_eq!(
        rules,
        serde_json::json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}])
    );
    let binding = serde_json::to_value(&access.binding).unwrap();
    assert_eq!(
        binding["roleRef"],
        serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "acme"})
    );
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "acme", "namespace": "shop"}])
    );

    // The token: projected, of the tenant's account, for an hour.
    let pod = pod_spec(&d);
    assert_eq!(pod.service_account_name.as_deref(), Some("acme"));
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(
        o.service_account.automount_service_account_token,
        Some(false)
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "events")
        .expect("the events volume");
    assert_eq!(
        serde_json::to_value(volume).unwrap(),
        serde_json::json!({"name": "events", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
        ]}})
    );
    let sidecar = &pod.containers[0];
    let mount = sidecar
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "events")
        .expect("the events mount");
    assert_eq!(mount.mount_path, "/var/run/secrets/bindery/events");
    assert_eq!(mount.read_only, Some(true));
    let env = sidecar_env(&d);
    let var = |name: &str| {
        let found: Vec<_> = env.iter().filter(|e| e.name == name).collect();
        assert_eq!(found.len(), 1, "{name}: {env:?}");
        serde_json::to_value(found[0]).unwrap()
    };
    assert_eq!(
        var("BINDERY_EVENTS_DIR")["value"],
        "/var/run/secrets/bindery/events"
    );
    assert_eq!(var("BINDERY_TENANT")["value"], "acme");
    assert_eq!(
        var("BINDERY_TENANT_UID")["value"],
        "0b7c3b0e-1111-4a4a-9f9f-000000000001"
    );
    assert_eq!(
        var("POD_NAME")["valueFrom"],
        serde_json::json!({"fieldRef": {"fieldPath": "metadata.name"}})
    );
    // The signing key, like any secret parameter: a secretKeyRef only.
    let key = var("BINDERY_PARAM_APPROVALS_KEY");
    assert!(key.get("value").is_none(), "{key}");
    assert_eq!(
        key["valueFrom"]["secretKeyRef"],
        serde_json::json!({"name": "acme-approvals", "key": "key", "optional": false})
    );
}

/// Without a webhook anywhere in the tree: no Role, no RoleBinding, no
/// token, no variables for Events (the example tenant, and one whose
/// agents have approvals without a webhook). A helper's webhook counts:
/// its failures are the tenant's Events too.
#[test]
fn only_a_webhook_somewhere_in_the_tree_brings_a_token_and_a_role() {
    let bare = |d: &Desired| {
        let o = d.objects.as_ref().expect("objects are rendered");
        let yaml = objects_yaml(d);
        o.events_access.is_none()
            && !yaml.contains("serviceAccountToken")
            && !yaml.contains("kube-root-ca.crt")
            && !yaml.contains("BINDERY_EVENTS_DIR")
            && !yaml.contains("BINDERY_TENANT")
            && !yaml.contains("POD_NAME")
            && !pod_spec(d)
                .volumes
                .iter()
                .flatten()
                .any(|v| v.projected.is_some())
    };
    assert!(bare(&World::example().run()));
    let mut no_hook = World::example();
    no_hook.agents.get_mut("invoices").unwrap().approvals = Some(from_yaml("{}").unwrap());
    assert!(bare(&no_hook.run()));

    // The webhook on a helper of the tenant's agent.
    let mut w = approval_webhook_world();
    let support: AgentSpec =
        from_yaml("{model: {url: 'http://model', name: m}, helpers: [{agent: invoices}]}").unwrap();
    w.agents.insert("support".into(), support);
    w.tenant.spec.agent_ref.name = "support".into();
    let d = w.run();
    assert_eq!(
        cond(&d, "ParametersResolved").status,
        "True",
        "{:?}",
        d.status.conditions
    );
    assert!(!bare(&d));
    assert!(d.objects.unwrap().events_access.is_some());
}

/// The answer links of approval notices: a tenant's `publicUrl`, else, for
/// a tenant with a webhook, its Service inside the cluster; nothing for a
/// tenant that has neither.
#[test]
fn approval_answer_links_point_at_the_tenants_address() {
    let public_url = |d: &Desired| {
        sidecar_env(d)
            .into_iter()
            .find(|e| e.name == "BINDERY_PUBLIC_URL")
            .and_then(|e| e.value)
    };
    assert_eq!(public_url(&World::example().run()), None);
    assert_eq!(
        public_url(&approval_webhook_world().run()).as_deref(),
        Some("http://acme.shop.svc")
    );
    let mut w = approval_webhook_world();
    w.tenant.spec.public_url = Some("https://acme.agents.example.com".into());
    assert_eq!(
        public_url(&w.run()).as_deref(),
        Some("https://acme.agents.example.com")
    );
    let mut w = World::example();
    w.tenant.spec.public_url = Some("https://acme.agents.example.com".into());
    assert_eq!(
        public_url(&w.run()).as_deref(),
        Some("https://acme.agents.example.com")
    );
}

// ---------------------------------------------------------------------------
// Budgets

/// The example tenant whose agent has a price and two budgets, of which
/// the tenant overrides one (`daily-tokens`: fewer tokens, and a person
/// confirms past it) and adds one (`monthly-spend`, a cost).
fn budget_world() -> World {
    let mut w = World::example();
    let spec = w.agents.get_mut("invoices").unwrap();
    spec.model.pricing = Some(from_yaml("{inputPerMillion: 0.15, outputPerMillion: 0.6}").unwrap());
    spec.budgets = from_yaml(
        "[{name: daily-tokens, tokens: 200000, per: 24h}, {name: tool-calls, toolCalls: 50, per: session}]",
    )
    .unwrap();
    w.tenant.spec.budgets = from_yaml(
        "[{name: daily-tokens, tokens: 20000, per: 24h, onExceed: confirm}, {name: monthly-spend, cost: 25.0, per: 30d}]",
    )
    .unwrap();
    w
}

/// The agent file `name` of the tenant's ConfigMap, as the sidecar reads it.
fn agent_file(d: &Desired, name: &str) -> AgentSpec {
    let o = d.objects.as_ref().expect("objects are rendered");
    let data = o.config_map.data.as_ref().unwrap();
    let doc: bindery_spec::AgentDocument = from_yaml(&data[&format!("{name}.yaml")]).unwrap();
    doc.spec
}

fn budget_names(spec: &AgentSpec) -> Vec<(String, Option<u64>, Option<f64>, String)> {
    spec.budgets
        .iter()
        .map(|b| {
            (
                b.name.clone(),
                b.tokens.or(b.tool_calls),
                b.cost,
                format!("{:?}", b.on_exceed),
            )
        })
        .collect()
}

/// The tenant's agent's file carries the tenant's budgets over the
/// agent's: the one of the same name replaced where it was, the new one
/// after them. The pods get a token of the tenant's account and a Role that
/// may create Events and get and patch this tenant's status, nothing more;
/// no webhook, so no default answer-link URL.
#[test]
fn a_tenant_overrides_its_agents_budget_and_adds_one() {
    let w = budget_world();
    let d = w.run();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(
        cond(&d, "ParametersResolved").status,
        "True",
        "{:?}",
        d.status.conditions
    );
    golden("acme-budgets.yaml", &objects_yaml(&d));
    assert_eq!(
        budget_names(&agent_file(&d, "invoices")),
        [
            ("daily-tokens".into(), Some(20000), None, "Confirm".into()),
            ("tool-calls".into(), Some(50), None, "Refuse".into()),
            ("monthly-spend".into(), None, Some(25.0), "Refuse".into()),
        ]
    );
    let o = d.objects.as_ref().unwrap();
    let access = o.events_access.as_ref().expect("a Role and a RoleBinding");
    assert_eq!(
        serde_json::to_value(&access.role.rules).unwrap(),
        serde_json::json!([
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
            {"apiGroups": ["bindery.dev"], "resources": ["agenttenants/status"],
             "resourceNames": ["acme"], "verbs": ["get", "patch"]},
        ])
    );
    assert_eq!(
        serde_json::to_value(&access.binding.subjects).unwrap(),
        serde_json::json!([{"kind": "ServiceAccount", "name": "acme", "namespace": "shop"}])
    );
    let pod = pod_spec(&d);
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert!(pod.volumes.iter().flatten().any(|v| v.name == "events"));
    let env = sidecar_env(&d);
    let value = |name: &str| {
        let found: Vec<_> = env.iter().filter(|e| e.name == name).collect();
        assert_eq!(found.len(), 1, "{name}: {env:?}");
        found[0].value.clone()
    };
    assert_eq!(
        value("BINDERY_EVENTS_DIR").as_deref(),
        Some("/var/run/secrets/bindery/events")
    );
    assert_eq!(value("BINDERY_TENANT").as_deref(), Some("acme"));
    assert_eq!(
        value("BINDERY_TENANT_UID").as_deref(),
        Some("0b7c3b0e-1111-4a4a-9f9f-000000000001")
    );
    assert!(
        !env.iter().any(|e| e.name == "BINDERY_PUBLIC_URL"),
        "no webhook, no default public URL: {env:?}"
    );
    // The operator writes no budget rows: the agent server does.
    assert!(d.status.budgets.is_empty() && d.status.budget_summary.is_empty());
}

/// Where the budgets come from does not matter for the token and the Role:
/// the tenant's alone, the agent's alone, or a helper's. With a webhook
/// too, one Role has both rules; without a budget anywhere, a webhook's
/// Role is Events alone (`an_approval_webhook_lets_the_tenant_post_events_and_nothing_more`).
#[test]
fn a_budget_anywhere_in_the_tree_brings_the_token_and_the_status_rule() {
    let status_rule = serde_json::json!({"apiGroups": ["bindery.dev"],
        "resources": ["agenttenants/status"], "resourceNames": ["acme"], "verbs": ["get", "patch"]});
    let rules = |w: &World| {
        let d = w.run();
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        let access = d.objects.unwrap().events_access.expect("a Role");
        serde_json::to_value(access.role.rules.unwrap()).unwrap()
    };
    let events_rule = serde_json::json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]});

    let mut tenant_only = World::example();
    tenant_only.tenant.spec.budgets =
        from_yaml("[{name: calls, toolCalls: 10, per: run}]").unwrap();
    assert_eq!(
        rules(&tenant_only),
        serde_json::json!([events_rule, status_rule])
    );

    let mut agent_only = World::example();
    agent_only.agents.get_mut("invoices").unwrap().budgets =
        from_yaml("[{name: calls, toolCalls: 10, per: run}]").unwrap();
    assert_eq!(
        rules(&agent_only),
        serde_json::json!([events_rule, status_rule])
    );

    let mut helper_only = World::example();
    let support: AgentSpec =
        from_yaml("{model: {url: 'http://model', name: m}, helpers: [{agent: invoices}]}").unwrap();
    helper_only.agents.insert("support".into(), support);
    helper_only.agents.get_mut("invoices").unwrap().budgets =
        from_yaml("[{name: calls, toolCalls: 10, per: run}]").unwrap();
    helper_only.tenant.spec.agent_ref.name = "support".into();
    assert_eq!(
        rules(&helper_only),
        serde_json::json!([events_rule, status_rule])
    );

    let mut both = approval_webhook_world();
    both.tenant.spec.budgets = from_yaml("[{name: calls, toolCalls: 10, per: run}]").unwrap();
    assert_eq!(rules(&both), serde_json::json!([events_rule, status_rule]));
    let env = sidecar_env(&both.run());
    assert!(
        env.iter().any(|e| e.name == "BINDERY_PUBLIC_URL"
            && e.value.as_deref() == Some("http://acme.shop.svc")),
        "the webhook's answer links: {env:?}"
    );
    assert_eq!(
        rules(&approval_webhook_world()),
        serde_json::json!([events_rule])
    );
}

/// A tenant's budgets are its agent's, not its helpers': a helper's file
/// keeps the helper's own budgets, whatever their names.
#[test]
fn a_tenants_budgets_do_not_reach_its_helpers() {
    let mut w = budget_world();
    let ledger: AgentSpec = from_yaml(
        "{model: {url: 'http://model', name: m}, budgets: [{name: daily-tokens, tokens: 5, per: 1h}]}",
    )
    .unwrap();
    w.agents.insert("ledger".into(), ledger);
    w.agents
        .get_mut("invoices")
        .unwrap()
        .helpers
        .push(from_yaml("{agent: ledger}").unwrap());
    let d = w.run();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(
        budget_names(&agent_file(&d, "ledger")),
        [("daily-tokens".into(), Some(5), None, "Refuse".into())]
    );
    assert_eq!(agent_file(&d, "invoices").budgets.len(), 3);
}

/// A new budget is a new agent file: the pods roll.
#[test]
fn pods_roll_when_the_tenants_budgets_change() {
    let hash = |w: &World| {
        let d = w.run();
        let template = &d.objects.unwrap().deployment.spec.unwrap().template;
        template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap()["bindery.dev/config-hash"]
            .clone()
    };
    let mut w = budget_world();
    let before = hash(&w);
    w.tenant.spec.budgets[0].tokens = Some(30000);
    assert_ne!(hash(&w), before);
}

/// A tenant budget the checks refuse: `ParametersResolved` False naming
/// `spec.budgets`, the budget and what to do, a Warning, nothing deployed
/// (what runs keeps running). The shape mistakes are the CRD's to refuse
/// too; the status says them for a tenant stored before the schema.
#[test]
fn a_wrong_tenant_budget_names_the_field_and_what_to_do() {
    type Change = fn(&mut World);
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "a cost without the agent's pricing",
            |w| w.agents.get_mut("invoices").unwrap().model.pricing = None,
            "spec.budgets, budget `monthly-spend` caps cost, but Agent `invoices` gives its model no price (and Bindery's price table does not know it): add `spec.model.pricing` (inputPerMillion, outputPerMillion) to the Agent, or cap tokens or toolCalls in this budget instead",
        ),
        (
            "two caps",
            |w| w.tenant.spec.budgets[1].tokens = Some(10),
            "spec.budgets, budget `monthly-spend`: set exactly one of `tokens`, `toolCalls` and `cost`",
        ),
        (
            "a week",
            |w| w.tenant.spec.budgets[0].per = "1w".into(),
            "spec.budgets, budget `daily-tokens`: `per` is a duration such as `1h`, `24h` or `30d`, or `session` or `run`; got `1w`",
        ),
        (
            "the same name twice",
            |w| {
                let again = w.tenant.spec.budgets[0].clone();
                w.tenant.spec.budgets.push(again);
            },
            "spec.budgets, budget `daily-tokens` is declared twice; give each budget its own name",
        ),
    ];
    for (what, change, message) in cases {
        let mut w = budget_world();
        change(&mut w);
        let d = w.run();
        assert_refused(
            &d,
            "ParametersResolved",
            Some("ParametersUnresolved"),
            message,
            what,
        );
        assert_eq!(cond(&d, "AgentValid").status, "True", "{what}");
    }
    // A two-cap budget is one mistake, not also a cost to price.
    let mut w = budget_world();
    w.agents.get_mut("invoices").unwrap().model.pricing = None;
    w.tenant.spec.budgets[1].tokens = Some(10);
    let c = w.run();
    let m = &cond(&c, "ParametersResolved").message;
    assert!(!m.contains("gives its model no price"), "{m}");
    // Tokens and tool calls need no price.
    let mut w = budget_world();
    w.agents.get_mut("invoices").unwrap().model.pricing = None;
    w.tenant.spec.budgets.pop();
    assert!(w.run().objects.is_some());
}

/// A tenant's prices win over its agents' own, for the model and any
/// fallback of that name in every agent of the tenant; a new price is a
/// new agent file, so the pods roll.
#[test]
fn a_tenants_prices_are_its_agents_prices() {
    let mut w = budget_world();
    let model = w.agents["invoices"].model.name.clone();
    let ledger: AgentSpec = from_yaml(&format!(
        "{{model: {{url: 'http://model', name: {model}}}}}"
    ))
    .unwrap();
    w.agents.insert("ledger".into(), ledger);
    w.agents
        .get_mut("invoices")
        .unwrap()
        .helpers
        .push(from_yaml("{agent: ledger}").unwrap());
    let before = w.run();
    w.tenant.spec.pricing = from_yaml(&format!(
        "[{{model: {model}, price: {{inputPerMillion: 0.1, outputPerMillion: 0.4, cacheReadPerMillion: 0.02}}}}]"
    ))
    .unwrap();
    let d = w.run();
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    let priced = |d: &Desired, agent: &str| agent_file(d, agent).model.pricing;
    let want: bindery_spec::budget::Pricing =
        from_yaml("{inputPerMillion: 0.1, outputPerMillion: 0.4, cacheReadPerMillion: 0.02}")
            .unwrap();
    assert_eq!(priced(&d, "invoices"), Some(want.clone()));
    // The helper's model is the same one: the tenant's price there too.
    assert_eq!(priced(&d, "ledger"), Some(want));
    let hash = |d: &Desired| {
        d.objects
            .as_ref()
            .unwrap()
            .deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap()["bindery.dev/config-hash"]
            .clone()
    };
    assert_ne!(hash(&d), hash(&before));
}

/// A tenant price that is not one, one for no model of the tenant's, one
/// that breaks an agent's checks: each refused, naming `spec.pricing`.
#[test]
fn a_wrong_tenant_price_names_the_field_and_what_to_do() {
    let model = budget_world().agents["invoices"].model.name.clone();
    for (what, pricing, message) in [
        (
            "negative",
            format!("[{{model: {model}, price: {{inputPerMillion: -1, outputPerMillion: 1}}}}]"),
            format!("spec.pricing[0], model `{model}`: prices (inputPerMillion, outputPerMillion, cacheReadPerMillion, cacheWritePerMillion, reasoningPerMillion) are numbers from 0 to 1000000000"),
        ),
        (
            "no such model",
            "[{model: gpt-nope, price: {inputPerMillion: 1, outputPerMillion: 1}}]".to_owned(),
            "spec.pricing[0], model `gpt-nope`: no model or fallback of the tenant's agents is named so (the price would count nothing); write a model's `name`".to_owned(),
        ),
        (
            "twice",
            format!("[{{model: {model}, price: {{inputPerMillion: 1, outputPerMillion: 1}}}}, {{model: {model}, price: {{inputPerMillion: 2, outputPerMillion: 2}}}}]"),
            format!("spec.pricing[1], model `{model}` is priced twice; give each model one price"),
        ),
    ] {
        let mut w = budget_world();
        w.tenant.spec.pricing = from_yaml(&pricing).unwrap();
        let d = w.run();
        assert_refused(&d, "ParametersResolved", Some("ParametersUnresolved"), &message, what);
    }
    // A fallback priced in USD under a model the tenant prices in EUR.
    let mut w = budget_world();
    w.agents.get_mut("invoices").unwrap().model.fallbacks = from_yaml(
        "[{url: 'http://f', name: cheap, pricing: {inputPerMillion: 0.1, outputPerMillion: 0.1}}]",
    )
    .unwrap();
    w.tenant.spec.pricing = from_yaml(&format!(
        "[{{model: {model}, price: {{inputPerMillion: 1, outputPerMillion: 1, currency: EUR}}}}]"
    ))
    .unwrap();
    let d = w.run();
    let m = &cond(&d, "ParametersResolved").message;
    assert!(m.contains("spec.pricing, Agent `invoices`, model fallback 1 (`cheap`): priced in USD, the model in EUR"), "{m}");
    assert!(d.objects.is_none());
}

/// A cloud identity for the tenant's pods: the ServiceAccount carries the
/// annotations (IRSA's role, AKS's client id), the pods the labels (AKS's
/// `azure.workload.identity/use`); the operator's own labels stay, being
/// the Deployment's selector.
#[test]
fn a_tenants_cloud_identity_reaches_its_service_account_and_pods() {
    let mut w = World::example();
    w.tenant.spec.pod_overrides = Some(
        from_yaml(
            "{serviceAccountAnnotations: {eks.amazonaws.com/role-arn: 'arn:aws:iam::123456789012:role/acme'},
              labels: {azure.workload.identity/use: 'true', app.kubernetes.io/instance: hijack}}",
        )
        .unwrap(),
    );
    let d = w.run();
    let o = d.objects.as_ref().expect("objects are rendered");
    assert_eq!(
        o.service_account.metadata.annotations.as_ref().unwrap()["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::123456789012:role/acme"
    );
    let deployment = o.deployment.spec.as_ref().unwrap();
    let labels = deployment
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    assert_eq!(labels["azure.workload.identity/use"], "true");
    let selector = deployment.selector.match_labels.clone().unwrap();
    for (k, v) in &selector {
        assert_eq!(
            labels.get(k),
            Some(v),
            "the selector's {k} is the operator's"
        );
    }
    // Without overrides, the ServiceAccount has no annotations.
    let plain = World::example().run();
    assert!(plain
        .objects
        .unwrap()
        .service_account
        .metadata
        .annotations
        .is_none());
}

/// A tenant's identity provider: its issuer and audiences become the
/// server's flags, the exchange client's secret comes from its Secret key
/// as a `secretKeyRef` only, and a missing Secret stops the tenant saying
/// which field names it.
#[test]
fn a_tenants_identity_provider_reaches_the_server_and_its_exchange_secret_only_by_reference() {
    use bindery_operator::crd::{KeyRef, TenantExchange, TenantIdentity};
    let mut w = World::example();
    w.tenant.spec.identity = Some(TenantIdentity {
        issuer: "https://login.example.com/realms/acme".into(),
        audiences: vec!["acme-chat".into(), "acme-portal".into()],
        jwks_url: None,
        subject_claim: Some("email".into()),
        clock_skew_seconds: Some(30),
        exchange: Some(TenantExchange {
            client_id: "bindery-acme".into(),
            client_secret_secret_ref: KeyRef {
                name: "acme-idp".into(),
                key: "client-secret".into(),
            },
            token_url: None,
        }),
    });
    let missing = w.run();
    assert_eq!(cond(&missing, "ParametersResolved").status, "False");
    assert!(
        cond(&missing, "ParametersResolved")
            .message
            .contains("spec.identity.exchange.clientSecretSecretRef"),
        "{:?}",
        cond(&missing, "ParametersResolved")
    );
    w.secrets
        .insert("acme-idp".into(), obj(&["client-secret"], "7"));
    let d = w.run();
    assert_eq!(cond(&d, "ParametersResolved").status, "True");
    let o = d.objects.as_ref().unwrap();
    let pod = o
        .deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let args = pod.containers[0].args.clone().unwrap_or_default().join(" ");
    for flag in [
        "--identity-issuer https://login.example.com/realms/acme",
        "--identity-audience acme-chat --identity-audience acme-portal",
        "--identity-subject-claim email",
        "--identity-clock-skew 30",
        "--identity-exchange-client-id bindery-acme",
    ] {
        assert!(args.contains(flag), "{flag}: {args}");
    }
    let env = sidecar_env(&d);
    let secret: Vec<_> = env
        .iter()
        .filter(|e| e.name == "BINDERY_IDENTITY_EXCHANGE_CLIENT_SECRET")
        .collect();
    assert_eq!(secret.len(), 1, "{env:?}");
    assert!(secret[0].value.is_none(), "never a value");
    let r = secret[0]
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!(
        (r.name.as_str(), r.key.as_str()),
        ("acme-idp", "client-secret")
    );
    assert!(bindery_operator::desired::referenced(&w.tenant)
        .0
        .contains("acme-idp"));
}
