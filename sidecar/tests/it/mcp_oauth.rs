//! The MCP toolbox's OAuth against real counterparts: Keycloak as the
//! authorization server (`bindery_tests::idp`) and the official MCP Python
//! SDK as the protected MCP server (`tests/mcp/protected_server.py`, which
//! checks Keycloak's signatures, the audience and the scope), with the
//! binary in between, the way a tenant's agent reaches a hosted server.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{repo, serve, sqlite_in};
use bindery_tests::children::Children;
use bindery_tests::fixtures::session::OWNER;
use bindery_tests::idp::{Client, ClientAuth, Idp};
use bindery_tests::mock_llm::{first_tool_then_answer, MockLlm};

/// The audience the protected server takes, and the scope it asks for.
const AUDIENCE: &str = "mcp-tools";
const SCOPE: &str = "tools";

/// The official SDK's protected server, trusting `issuer`: its MCP URL.
async fn protected_server(children: &mut Children, issuer: &str) -> String {
    let python = std::env::var_os("BINDERY_MCP_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo().join("tests/mcp/.venv/bin/python"));
    children.spawn(
        "protected",
        &python,
        &[
            repo()
                .join("tests/mcp/protected_server.py")
                .display()
                .to_string(),
            issuer.to_string(),
            AUDIENCE.to_string(),
            SCOPE.to_string(),
        ],
    );
    let mut url = None;
    bindery_tests::eventually::until(
        "the protected MCP server listens",
        Duration::from_secs(60),
        || {
            url = children
                .log("protected")
                .lines()
                .find(|l| l.starts_with("http://"))
                .map(str::to_string);
            url.is_some()
        },
    )
    .await;
    url.unwrap()
}

/// An agent whose `crm` toolbox is the protected server at `url`, its
/// client `client_id` with the secret from `CRM_SECRET`, trusting `issuer`
/// (none: the MCP server's own origin only).
fn agent(
    dir: &Path,
    model: &str,
    url: &str,
    client_id: &str,
    issuer: Option<&str>,
) -> std::path::PathBuf {
    let path = dir.join(format!("crm-{}.yaml", issuer.is_some()));
    let issuer = issuer.map_or(String::new(), |i| format!("issuer: \"{i}\""));
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: crm}}
spec:
  model: {{url: "{model}", name: mock-model}}
  parameters:
    - {{name: crm_secret, secret: true, scope: process, default: {{env: CRM_SECRET}}}}
  toolboxes:
    - mcp:
        name: crm
        url: "{url}"
        oauth:
          grant: client-credentials
          clientId: {{literal: {client_id}}}
          clientSecret: {{param: crm_secret}}
          {issuer}
"#
        ),
    )
    .unwrap();
    path
}

/// The tenant's own connection: Bindery discovers Keycloak through the
/// SDK's protected-resource metadata, gets a client-credentials token for
/// the scope the server names, and its tool call reaches the server as
/// that client. A wrong secret never connects, and no secret reaches a log.
#[tokio::test]
async fn client_credentials_from_keycloak_reach_the_sdks_protected_server() {
    let idp = Idp::shared();
    let realm = idp
        .realm("bindery-mcp")
        .scope(SCOPE)
        .client(
            Client::confidential("bindery-crm", ClientAuth::SecretBasic)
                .audience(AUDIENCE)
                .optional_scope(SCOPE),
        )
        .create()
        .await;
    let issuer = realm.issuer();
    let secret = realm
        .credentials("bindery-crm")
        .secret()
        .expect("a client secret")
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let mut children = Children::new(dir.path(), "run tests/setup.sh (tests/mcp/.venv)");
    let url = protected_server(&mut children, &issuer).await;
    let mock = MockLlm::start(first_tool_then_answer(
        Some("mcp_crm_whoami".into()),
        json!({}),
    ))
    .await;
    let file = agent(dir.path(), &mock.url(), &url, "bindery-crm", Some(&issuer));

    let (server, api) = serve(
        &file,
        &sqlite_in(dir.path()),
        &[],
        &[("CRM_SECRET", &secret)],
        dir.path(),
    );
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "crm", "prompt": "who are you to the CRM?"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let said = bindery_tests::fixtures::session::last_tool_output(&r);
    let said: Value = serde_json::from_str(said.trim()).unwrap_or_else(|_| panic!("{}", r.text));
    assert_eq!(said["client"], "bindery-crm", "{said}");
    assert!(
        said["scopes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == SCOPE),
        "the scope the server named was asked for: {said}"
    );
    assert!(!server.logs().contains(&secret), "{}", server.logs());
    drop(server);

    // The wrong secret: Keycloak refuses the client, the toolbox does not
    // connect, and the load says why without the secret.
    let wrong = "not-the-secret-8f2a";
    let dir2 = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir2.path().join("logs")).unwrap();
    let out = std::process::Command::new(crate::common::bin())
        .args(["describe", "--agent-file"])
        .arg(&file)
        .env("CRM_SECRET", wrong)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("crm"), "{text}");
    assert!(!text.contains(wrong), "{text}");

    // Without `issuer`, Keycloak (another origin than the MCP server's) is
    // not trusted with the client's secret: nothing is sent to it.
    let unpinned = agent(dir.path(), &mock.url(), &url, "bindery-crm", None);
    let out = std::process::Command::new(crate::common::bin())
        .args(["describe", "--agent-file"])
        .arg(&unpinned)
        .env("CRM_SECRET", &secret)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("oauth.issuer"), "{text}");
    assert!(!text.contains(&secret), "{text}");
    children.stop();
}
