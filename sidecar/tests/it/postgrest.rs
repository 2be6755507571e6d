//! PostgREST toolboxes through the real binary.
//!
//! No PostgREST server can be installed on the test machines, so these
//! tests run against a real PostgreSQL (tests/src/postgres.rs) behind
//! `bindery_tests::postgrest::PostgrestLike`, a small server that follows
//! PostgREST's conventions: its OpenAPI 2.0 document at `/`, filters as
//! `?col=op.value`, `select`/`order`/`limit`/`offset`, `Prefer:
//! return=representation`, a JWT as `Authorization: Bearer`.

use std::process::Command;

use bindery_tests::postgres::Postgres;
use bindery_tests::postgrest::PostgrestLike;
use serde_json::{json, Value};

const CANARY: &str = "canary-jwt-5e2b71";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn run(args: Vec<String>, env: Vec<(&'static str, String)>) -> Out {
    let o = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_bindery-sidecar"))
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    // The JWT is a secret: in no output, no log line.
    assert!(
        !out.stdout.contains(CANARY) && !out.stderr.contains(CANARY),
        "the secret leaked:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    out
}

/// An invoices table shared by two tenants.
fn database(pg: &Postgres) {
    pg.create_database("shop");
    pg.sql(
        "shop",
        "CREATE TABLE invoices (id serial PRIMARY KEY, tenant_id text NOT NULL, number text NOT NULL, \
           amount numeric NOT NULL, status text NOT NULL DEFAULT 'open');
         INSERT INTO invoices (tenant_id, number, amount, status) VALUES
           ('acme', 'INV-1', 100, 'paid'), ('acme', 'INV-2', 250.5, 'overdue'),
           ('globex', 'INV-3', 999, 'overdue');",
    );
}

/// Tenant and token bound the same way for an OpenAPI toolbox: the column
/// `tenant_id` pins every read, insert and update, and the session's
/// secret JWT goes in a header the model never sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgrest_tools_are_bound_like_openapi_ones() {
    let pg = Postgres::start();
    database(&pg);
    let server = PostgrestLike::start(&pg.url("shop"), Some(CANARY)).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("shop.yaml");
    std::fs::write(
        &agent,
        format!(
            r#"apiVersion: bindery.dev/v1alpha1
kind: Agent
metadata: {{name: shop}}
spec:
  model: {{url: "http://127.0.0.1:9/v1", name: m}}
  parameters:
    - {{name: tenant, scope: session}}
    - {{name: db_token, secret: true, scope: session}}
  toolboxes:
    - postgrest:
        name: shop
        baseUrl: "{url}"
        allowedMethods: [GET, POST, PATCH]
        secrets:
          - source: {{param: db_token}}
            header: {{name: Authorization, template: "Bearer {{{{secret}}}}"}}
        bindings:
          - {{arg: tenant_id, value: {{param: tenant}}}}
          - {{tool: "patch_*", arg: set_tenant_id, value: {{param: tenant}}}}
"#,
            url = server.url
        ),
    )
    .unwrap();
    let agent = agent.display().to_string();
    let env = || vec![("BINDERY_PARAM_DB_TOKEN", CANARY.to_string())];
    let base = |cmd: &str| -> Vec<String> {
        [cmd, "--agent-file", &agent, "--set", "tenant=acme"]
            .map(String::from)
            .to_vec()
    };

    // What the model sees: no tenant column, no credential.
    let out = run(base("describe"), env()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let doc: Value = serde_json::from_str(&out.stdout).unwrap();
    let tools = doc["tools"].as_array().unwrap();
    let names: Vec<&str> = tools
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "postgrest_shop_get_invoices",
            "postgrest_shop_post_invoices",
            "postgrest_shop_patch_invoices"
        ]
    );
    for t in tools {
        let props = t["function"]["parameters"]["properties"]
            .as_object()
            .unwrap();
        assert!(
            !props.contains_key("tenant_id") && !props.contains_key("set_tenant_id"),
            "{t}"
        );
        assert!(
            props.keys().all(|k| !k.starts_with("bindery-secret")),
            "{t}"
        );
    }
    let get_props = tools[0]["function"]["parameters"]["properties"]
        .as_object()
        .unwrap();
    for k in [
        "id", "number", "status", "select", "order", "limit", "offset",
    ] {
        assert!(get_props.contains_key(k), "{k}: {get_props:?}");
    }

    let call = |tool: &str, args: Value| {
        let mut a = base("tool-call");
        a.extend([
            "--tool".to_string(),
            tool.to_string(),
            "--args".to_string(),
            args.to_string(),
        ]);
        run(a, env())
    };
    // A read: the model asks for globex's overdue invoices; it gets acme's.
    let out = call(
        "postgrest_shop_get_invoices",
        json!({"tenant_id": "globex", "status": "overdue", "select": "number,amount,tenant_id"}),
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let rows: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(
        rows,
        json!([{"number": "INV-2", "amount": 250.5, "tenant_id": "acme"}])
    );
    // Operators go through; a bare value means eq.
    let out = call(
        "postgrest_shop_get_invoices",
        json!({"amount": "gt.50", "order": "amount.desc", "select": "number"}),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(out.stdout.trim()).unwrap(),
        json!([{"number": "INV-2"}, {"number": "INV-1"}]),
        "{}",
        out.stderr
    );

    // An insert lands in the bound tenant, whatever the model said.
    let out = call(
        "postgrest_shop_post_invoices",
        json!({"tenant_id": "globex", "number": "INV-9", "amount": 12.5}),
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let rows: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(rows[0]["tenant_id"], "acme");
    assert_eq!(rows[0]["status"], "open", "the column's default applies");
    // An update touches only the tenant's rows and cannot move them.
    let out = call(
        "postgrest_shop_patch_invoices",
        json!({"status": "overdue", "set_status": "reminded", "set_tenant_id": "globex"}),
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let rows: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(
        (rows[0]["number"].as_str(), rows[0]["tenant_id"].as_str()),
        (Some("INV-2"), Some("acme"))
    );
    assert_eq!(
        pg.sql(
            "shop",
            "SELECT tenant_id, number, status FROM invoices ORDER BY id"
        ),
        "acme|INV-1|paid\nacme|INV-2|reminded\nglobex|INV-3|overdue\nacme|INV-9|open\n"
    );

    // What reached the server: the pinned filters, Prefer on writes, the JWT.
    let seen = server.seen();
    let targets: Vec<&str> = seen.iter().map(|s| s.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            "/invoices?tenant_id=eq.acme&status=eq.overdue&select=number,amount,tenant_id",
            "/invoices?tenant_id=eq.acme&amount=gt.50&select=number&order=amount.desc",
            "/invoices",
            "/invoices?tenant_id=eq.acme&status=eq.overdue",
        ]
    );
    assert!(seen.iter().all(|s| s.authorized), "{seen:?}");
    assert_eq!(seen[2].prefer.as_deref(), Some("return=representation"));
    assert_eq!(seen[0].prefer, None);

    // A wrong token is the server's 401, told to the model as a tool error.
    let mut a = base("tool-call");
    a.extend(["--tool", "postgrest_shop_get_invoices", "--args", "{}"].map(String::from));
    let out = run(a, vec![("BINDERY_PARAM_DB_TOKEN", "wrong".to_string())]).await;
    assert_ne!(out.code, 0);
    assert!(
        out.stdout.contains("HTTP 401") || out.stderr.contains("HTTP 401"),
        "{}{}",
        out.stdout,
        out.stderr
    );
}

/// agents-exe's `postgrestToolboxes` load unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_exe_postgrest_toolboxes_load() {
    let pg = Postgres::start();
    database(&pg);
    let server = PostgrestLike::start(&pg.url("shop"), None).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("shop.json");
    std::fs::write(
        &agent,
        json!({"tag": "OpenAIAgentDescription", "contents": {
            "slug": "shop", "modelUrl": "http://127.0.0.1:9/v1", "modelName": "m",
            "parameters": [{"name": "tenant", "scope": "session"}],
            "postgrestToolboxes": [{"tag": "PostgRESTServer", "contents": {
                "name": "shop", "specUrl": format!("{}/", server.url), "baseUrl": server.url,
                "bindings": [{"arg": "tenant_id", "value": {"tag": "Param", "contents": "tenant"}}]}}]}})
        .to_string(),
    )
    .unwrap();
    let agent = agent.display().to_string();
    let out = run(
        ["check", "--agent-file", &agent, "--tools=list"]
            .map(String::from)
            .to_vec(),
        vec![],
    )
    .await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("- **postgrest_postgrest_get_invoices**: Reads rows of table `invoices`."),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("post_invoices"),
        "read-only by default: {}",
        out.stdout
    );
    let out = run(
        [
            "tool-call",
            "--agent-file",
            &agent,
            "--set",
            "tenant=globex",
            "--tool",
            "postgrest_postgrest_get_invoices",
            "--args",
            r#"{"subset": {"columns": "number"}, "filters": {"tenant_id": "acme"}}"#,
        ]
        .map(String::from)
        .to_vec(),
        vec![],
    )
    .await;
    // The bound column is in no group: the model cannot filter another
    // tenant's rows in.
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(
        out.stderr.contains("takes no key `tenant_id`"),
        "{}",
        out.stderr
    );
    let out = run(
        [
            "tool-call",
            "--agent-file",
            &agent,
            "--set",
            "tenant=globex",
            "--tool",
            "postgrest_postgrest_get_invoices",
            "--args",
            r#"{"subset": {"columns": "number"}, "filters": {"number": "like.INV*"}}"#,
        ]
        .map(String::from)
        .to_vec(),
        vec![],
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(out.stdout.trim()).unwrap(),
        json!([{"number": "INV-3"}])
    );
}
