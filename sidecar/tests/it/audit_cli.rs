//! `bindery-sidecar audit export` from a real `serve` over TCP, and
//! `audit verify` of what it wrote: intact, then with a record removed, a
//! field altered, a record hashed again after an alteration, and the last
//! record cut off (found only against the head the export printed).

use std::path::Path;

use crate::common::*;
use crate::server_pending::clerk;
use bindery_store::audit::{canonical, digest};
use bindery_tests::fixtures::clerk::waiting;
use bindery_tests::fixtures::session::{answer, token_of};
use serde_json::{json, Map, Value};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `bindery-sidecar audit ARGS…`.
async fn audit(args: &[&str]) -> Out {
    let o = tokio::process::Command::new(bin())
        .arg("audit")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .await
        .unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `lines` written to `dir/name`; its path.
fn file(dir: &Path, name: &str, lines: &[String]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.display().to_string()
}

/// `line` with `f` applied to its record (its hash left as it was).
fn altered(line: &str, f: impl FnOnce(&mut Map<String, Value>)) -> String {
    let mut record: Map<String, Value> = serde_json::from_str(line).unwrap();
    f(&mut record);
    canonical(&Value::Object(record))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_verifies_and_each_tampering_is_named_by_its_seq() {
    let c = clerk("").await;
    let (sidecar, api) = c.start(&[]);
    let r = waiting(&api, "delete invoice 7").await;
    let r = answer(&api, &token_of(&r), json!({"approve": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(c.runs(), 1);

    let dir = c.dir.path();
    let token = dir.join("owner-token");
    std::fs::write(&token, format!("{OWNER}\n")).unwrap();
    let export = dir.join("audit.jsonl").display().to_string();
    let token_arg = token.display().to_string();
    let out = audit(&[
        "export",
        "--server",
        &sidecar.url,
        "--token-file",
        &token_arg,
        "--output",
        &export,
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines: Vec<String> = std::fs::read_to_string(&export)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let last: Value = serde_json::from_str(&lines[3]).unwrap();
    let head = last["hash"].as_str().unwrap().to_string();
    assert!(
        out.stderr.contains(&format!("seq 4, hash {head}")),
        "{}",
        out.stderr
    );
    // The canary secret is neither in the export nor in the store's files.
    assert!(!lines.iter().any(|l| l.contains(CANARY)));
    assert!(!contains(&raw_files(dir, "store.sqlite"), CANARY));

    let intact = audit(&["verify", &export]).await;
    assert_eq!(intact.code, 0, "{}", intact.stderr);
    assert_eq!(
        intact.stdout.trim(),
        format!("the audit log holds: 4 records, seq 1 to 4, head {head}")
    );
    let anchored = audit(&["verify", &export, "--head", &head, "--count", "4"]).await;
    assert_eq!(anchored.code, 0, "{}", anchored.stderr);

    let mut removed = lines.clone();
    removed.remove(1);
    let out = audit(&["verify", &file(dir, "removed.jsonl", &removed)]).await;
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("record seq 2 was removed: line 2 holds seq 3"),
        "{}",
        out.stderr
    );

    let mut changed = lines.clone();
    changed[2] = altered(&lines[2], |r| {
        r.insert("actor".into(), json!({"kind": "approver"}));
    });
    let out = audit(&["verify", &file(dir, "altered.jsonl", &changed)]).await;
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stderr.contains("record seq 3 (line 3) was altered"),
        "{}",
        out.stderr
    );

    let mut rehashed = lines.clone();
    rehashed[1] = altered(&lines[1], |r| {
        r.insert("actor".into(), json!({"kind": "approver"}));
        let hash = digest(r);
        r.insert("hash".into(), hash.into());
    });
    let out = audit(&["verify", &file(dir, "rehashed.jsonl", &rehashed)]).await;
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("the chain breaks at record seq 3 (line 3)"),
        "{}",
        out.stderr
    );

    // The last record cut off: the chain alone holds; the anchor does not.
    let cut = file(dir, "cut.jsonl", &lines[..3]);
    assert_eq!(audit(&["verify", &cut]).await.code, 0);
    let out = audit(&["verify", &cut, "--head", &head]).await;
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stderr.contains("records from seq 4 on were removed"),
        "{}",
        out.stderr
    );
    let out = audit(&["verify", &cut, "--count", "4"]).await;
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(out.stderr.contains("from seq 4"), "{}", out.stderr);

    // From stdin too; a wrong token is named.
    let piped = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{} audit verify - < {export}", bin()))
        .output()
        .await
        .unwrap();
    assert!(piped.status.success());
    std::fs::write(&token, "not-the-owner\n").unwrap();
    let out = audit(&[
        "export",
        "--server",
        &sidecar.url,
        "--token-file",
        &token_arg,
    ])
    .await;
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("check --token-file"), "{}", out.stderr);
}
