//! A newcomer's first run: the README's commands, read out of README.md so
//! that they cannot drift, run in a fresh copy of the repository (no
//! `data/`, no owner token, no API key, no network) and talked to over TCP.
//!
//! `cargo run -p PACKAGE [--bin NAME] -- ARGS` is run as the binary Cargo
//! would build and run (this test's own `bindery-sidecar`), with ARGS as
//! written, in the copy: a nested `cargo run` would rebuild the crate for
//! the copy's path, for minutes. The one change made to a command: its
//! `--listen HOST:PORT` becomes port 0, so that the test never collides
//! with another server; each binary prints the address it got.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use bindery_tests::sidecar::{Api, Sidecar};

fn readme() -> String {
    std::fs::read_to_string(common::repo().join("README.md")).expect("README.md is readable")
}

/// The README's command line that starts with `start` (shell words,
/// split on whitespace: the README's commands quote nothing).
fn readme_command(readme: &str, start: &str) -> Vec<String> {
    let line = readme
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("README.md has no command line starting with `{start}`"));
    line.split_whitespace().map(str::to_owned).collect()
}

/// `cargo run -p PACKAGE [--bin NAME] -- ARGS` as `(PACKAGE, ARGS)`, with
/// `--listen`'s port made 0.
fn cargo_run_args(words: &[String]) -> (String, Vec<String>) {
    assert_eq!(words[..3], ["cargo", "run", "-p"], "{words:?}");
    let dashes = words
        .iter()
        .position(|w| w == "--")
        .unwrap_or_else(|| panic!("no `--` in {words:?}"));
    let mut args = words[dashes + 1..].to_vec();
    if let Some(i) = args.iter().position(|a| a == "--listen") {
        let host = args[i + 1]
            .rsplit_once(':')
            .map(|(host, _)| host.to_owned())
            .unwrap_or_else(|| panic!("--listen {} has no port", args[i + 1]));
        args[i + 1] = format!("{host}:0");
    }
    (words[3].clone(), args)
}

/// The repository as a fresh clone has it: the tracked files plus new
/// ones not ignored (work not committed yet), nothing else (no `data/`,
/// no `target/`).
fn fresh_copy() -> tempfile::TempDir {
    let repo = common::repo();
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(&repo)
        .output()
        .expect("git lists the repository's files");
    assert!(out.status.success(), "git ls-files: {out:?}");
    let copy = tempfile::tempdir().unwrap();
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = Path::new(std::str::from_utf8(name).expect("UTF-8 file names"));
        let from = repo.join(name);
        if !from.is_file() {
            continue; // deleted in the work tree, or a submodule
        }
        let to = copy.path().join(name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        // `copy` keeps the mode: the example's tools stay executable.
        std::fs::copy(&from, &to).unwrap();
    }
    assert!(!copy.path().join("data").exists());
    copy
}

/// `program ARGS` in `dir`, with only what a newcomer's shell has that
/// matters here: PATH and HOME; no BINDERY_*, no OPENAI_API_KEY.
fn in_copy(program: &Path, args: &[String], dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir);
    cmd
}

fn sidecar_bin() -> PathBuf {
    PathBuf::from(common::bin())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_main_command_serves_in_a_fresh_clone() {
    let readme = readme();
    let words = readme_command(&readme, "cargo run -p bindery-sidecar -- serve");
    let (package, args) = cargo_run_args(&words);
    assert_eq!(package, "bindery-sidecar");
    assert!(
        args.iter().any(|a| a == "--agent-file"),
        "the main command serves an agent file: {words:?}"
    );

    let copy = fresh_copy();
    let logs = tempfile::tempdir().unwrap();
    let mut sidecar = Sidecar::spawn(in_copy(&sidecar_bin(), &args, copy.path()), logs.path(), "");
    let api = Api::new(&sidecar.url);

    let health = api.call("GET", "/healthz", None, None).await;
    assert_eq!(health.status, 200, "{}", health.text);

    // The token it generated, where the README says to read it.
    let token = std::fs::read_to_string(copy.path().join("data/owner-token"))
        .expect("serve generated data/owner-token");
    let token = token.trim();
    assert!(!token.is_empty());
    assert!(copy.path().join("data/bindery.sqlite").is_file());

    let agents = api.call("GET", "/v1/agents", Some(token), None).await;
    assert_eq!(agents.status, 200, "{}", agents.text);
    let invoices = &agents.json["agents"][0];
    assert_eq!(invoices["slug"], "invoices", "{}", agents.text);
    let tenant = invoices["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "tenant")
        .expect("the tenant parameter is listed");
    assert_eq!(tenant["pinned"], true, "--pin tenant=acme-corp: {tenant}");
    let refused = api.call("GET", "/v1/agents", None, None).await;
    assert_eq!(refused.status, 401);

    // A second start reads the same token back rather than failing on it.
    sidecar.stop();
    let sidecar = Sidecar::spawn(
        in_copy(&sidecar_bin(), &args, copy.path()),
        logs.path(),
        token,
    );
    let again = Api::new(&sidecar.url)
        .call("GET", "/v1/agents", Some(token), None)
        .await;
    assert_eq!(again.status, 200, "{}\n{}", again.text, sidecar.logs());
}
