//! Every kind of child a tool can leave behind (a background job, `nohup`,
//! `setsid`, a double fork, `disown`, one that ignores SIGTERM and SIGHUP,
//! one that closes its stdio): none outlives its call, none outlives the
//! server's orderly end (SIGTERM) while its call still runs, and none
//! outlives a server killed with SIGKILL — the tool's own process at once,
//! what it started by the server's next start, before it records the call
//! as interrupted; and a side effect the tool had not reached never
//! happens.

use std::path::{Path, PathBuf};

use crate::common::*;
use bindery_tests::eventually::{eventually_or_blocking, until_blocking};
use bindery_tests::fixtures::session::session;
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use bindery_tests::sidecar::{Api, Sidecar};
use serde_json::{json, Value};

/// How many children each call leaves.
const BROOD: usize = 50;

/// `run --mode leave|hang|effect`: starts [`BROOD`] children of every
/// kind, each writing its pid to `$DIR/pids` (the tool's own first, on
/// `own`); then `hang` sleeps, `effect` waits for `$DIR/gate` and then
/// writes `$DIR/effect`.
fn brood(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"#!/usr/bin/env bash
if [[ "${{1:-}}" == describe ]]; then
  echo '{{"slug": "brood", "description": "leaves children", "args": [{{"name": "mode", "description": "leave, hang or effect", "type": "string", "backing_type": "string", "arity": "single", "mode": "dashdashspace"}}]}}'
  exit 0
fi
mode=leave
[[ " $* " == *" --mode hang "* ]] && mode=hang
[[ " $* " == *" --mode effect "* ]] && mode=effect
d='{d}'; pids="$d/pids"
echo $$ > "$d/own"
for i in 1 2 3 4 5 6 7; do
  sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> "$pids"
  nohup sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> "$pids"
  setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> "$pids"
  ( sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> "$pids" )
  sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> "$pids"; disown
  bash -c 'trap "" TERM HUP INT; echo $$ >> "$0"; exec sleep 1000' "$pids" </dev/null >/dev/null 2>&1 &
  sleep 1000 <&- >&- 2>&- & echo $! >> "$pids"
done
setsid -f bash -c 'echo $$ >> "$0"; exec sleep 1000' "$pids" </dev/null >/dev/null 2>&1
until [ "$(wc -l < "$pids")" -ge {BROOD} ]; do sleep 0.01; done
case $mode in
  hang) echo started > "$d/started"; sleep 300 ;;
  effect) echo started > "$d/started"; until [ -e "$d/gate" ]; do sleep 0.01; done; echo done > "$d/effect" ;;
esac
echo left
"#
    )
}

/// A process that exists and is not a zombie.
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

struct Brood {
    dir: tempfile::TempDir,
    /// Where the tool writes (apart from the server's files).
    out: tempfile::TempDir,
    mock: MockLlm,
    agent: PathBuf,
}

impl Brood {
    async fn new() -> Brood {
        let dir = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        let tools = dir.path().join("tools");
        std::fs::create_dir_all(&tools).unwrap();
        let script = tools.join("brood");
        executable(&script, &brood(out.path()));
        let mock = MockLlm::start(|req: &Value| {
            let last = last_message(req);
            if last["role"] == "tool" {
                return MockReply::text("done");
            }
            let mode = last["content"].as_str().unwrap_or("leave").to_string();
            MockReply::tool_call("bash_brood", json!({ "mode": mode }))
        })
        .await;
        let agent = bash_agent(dir.path(), &mock.url(), &tools);
        Brood {
            dir,
            out,
            mock,
            agent,
        }
    }

    /// The server, its runs cut off one second after a SIGTERM.
    fn serve(&self) -> (Sidecar, Api) {
        self.serve_draining("1s")
    }

    fn serve_draining(&self, drain: &str) -> (Sidecar, Api) {
        serve(
            &self.agent,
            &sqlite_in(self.dir.path()),
            &["--tool-timeout", "300", "--drain-timeout", drain],
            &[],
            self.dir.path(),
        )
    }

    fn file(&self, name: &str) -> PathBuf {
        self.out.path().join(name)
    }

    /// The pids the last call wrote: its own, then its children's.
    fn pids(&self) -> Vec<String> {
        let mut all: Vec<String> = std::fs::read_to_string(self.file("own"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        all.extend(
            std::fs::read_to_string(self.file("pids"))
                .unwrap_or_default()
                .lines()
                .map(str::to_string),
        );
        all
    }

    fn forget(&self) {
        for f in ["own", "pids", "started", "effect", "gate"] {
            let _ = std::fs::remove_file(self.file(f));
        }
    }

    /// A new session's message `mode`, not waited for; once the tool has
    /// started its brood.
    async fn start(&self, api: &Api, mode: &str) -> String {
        self.forget();
        let id = new_session(api, json!({"agent": "a"})).await;
        let r = api
            .call(
                "POST",
                &format!("/v1/sessions/{id}/messages"),
                Some(OWNER),
                Some(&json!({ "prompt": mode })),
            )
            .await;
        assert!(r.status == 202 || r.status == 200, "{}", r.text);
        let started = self.file("started");
        until("the tool started its children", PATIENCE, || {
            started.exists()
        })
        .await;
        id
    }

    /// Every process of the last call gone, within the patience.
    fn all_gone(&self, after: &str) {
        let pids = self.pids();
        assert_eq!(pids.len(), BROOD + 1, "{pids:?}");
        eventually_or_blocking(after, PATIENCE, || {
            let left: Vec<&String> = pids.iter().filter(|p| alive(p)).collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{} of {} alive: {left:?}", left.len(), pids.len()))
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_child_goes_with_its_call_and_with_the_server() {
    let b = Brood::new().await;
    let (mut sidecar, api) = b.serve();
    // A call that ends, leaving its brood.
    b.forget();
    let id = new_session(&api, json!({"agent": "a"})).await;
    let r = message_waited(&api, &id, "leave").await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(last_tool_output(&r).trim(), "left");
    b.all_gone("every child goes with its call");
    // A call still running at the server's SIGTERM.
    let id = b.start(&api, "hang").await;
    let status = tokio::task::block_in_place(|| sidecar.stop());
    assert!(status.is_some());
    b.all_gone("every process of a running call goes with the server");
    // Its answer says what may have happened, however it was closed.
    let (_again, api) = b.serve();
    let r = eventually_or("the call is answered", PATIENCE, async || {
        let r = session(&api, &id).await;
        match r.json["status"].as_str() {
            Some("running") | None => Err(r.text),
            _ => Ok(r),
        }
    })
    .await;
    assert!(
        last_tool_output(&r).contains("its side effect may have happened"),
        "{}",
        r.text
    );
    b.mock.shutdown().await;
}

/// A run under way at SIGTERM ends before the server does (a pod being
/// replaced loses none of its work): its tool finishes and its answer is
/// stored, while the server takes no new connection; then it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_under_way_at_sigterm_ends_before_the_server_exits() {
    let b = Brood::new().await;
    let (mut sidecar, api) = b.serve_draining("60s");
    let id = b.start(&api, "effect").await;
    sidecar.signal("TERM");
    // The listener goes at once; the run goes on.
    let addr = api.base.trim_start_matches("http://").to_string();
    until("the server to stop taking connections", PATIENCE, || {
        std::net::TcpStream::connect(&addr).is_err()
    })
    .await;
    assert!(
        sidecar
            .exited_within(std::time::Duration::from_millis(500))
            .is_none(),
        "the server exited with a run under way"
    );
    std::fs::write(b.file("gate"), "").unwrap();
    let status = tokio::task::block_in_place(|| sidecar.exited_within(PATIENCE));
    assert!(
        status.is_some_and(|s| s.success()),
        "the server's exit once its run ended: {status:?}\n{}",
        sidecar.logs()
    );
    assert!(b.file("effect").exists(), "the tool did not finish");
    // Its answer is stored: another server reads the run as ended.
    let (_again, api) = b.serve();
    let r = session(&api, &id).await;
    assert_eq!(r.json["status"], "idle", "{}", r.text);
    assert_eq!(last_tool_output(&r).trim(), "left", "{}", r.text);
    b.all_gone("every child goes with its call");
    b.mock.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tool_process_outlives_a_server_killed_with_sigkill() {
    let b = Brood::new().await;
    let (mut sidecar, api) = b.serve();
    let id = b.start(&api, "effect").await;
    let own = b.pids()[0].clone();
    tokio::task::block_in_place(|| sidecar.kill());
    // The tool's own process goes with the server: it never reaches its
    // side effect.
    until_blocking("the tool's process goes with the server", PATIENCE, || {
        !alive(&own)
    });
    std::fs::write(b.file("gate"), "").unwrap();
    // What it started goes at the next start, before the call is closed.
    let (_again, api) = b.serve();
    b.all_gone("every process of the call goes by the next start");
    assert!(
        !b.file("effect").exists(),
        "the side effect happened after the server died"
    );
    let r = session(&api, &id).await;
    assert_eq!(r.json["status"], "failed", "{}", r.text);
    assert!(
        last_tool_output(&r).contains("its side effect may have happened"),
        "{}",
        r.text
    );
    b.mock.shutdown().await;
}

/// An MCP stdio server's children (one in its group, one in a session of
/// its own, one double-forked) go with the server's SIGTERM; after a
/// SIGKILL, by the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_servers_children_go_with_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let pids = out.path().join("pids");
    let server = repo().join("sidecar/tests/fixtures/mcp/changing-server.py");
    let start = format!(
        r#"echo $$ >> '{p}'
sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> '{p}'
setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> '{p}'
( sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >> '{p}' )
exec python3 '{s}'"#,
        p = pids.display(),
        s = server.display()
    );
    let mock = MockLlm::start(|_: &Value| MockReply::text("done")).await;
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: \"{}\", name: m}}\n  toolboxes:\n    - mcp:\n        name: changing\n        command: [bash, -c, {}]\n",
            mock.url(),
            serde_json::to_string(&start).unwrap()
        ),
    )
    .unwrap();
    let read = || -> Vec<String> {
        std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let gone = |what: &str, left: &[String]| {
        eventually_or_blocking(what, PATIENCE, || {
            let alive: Vec<&String> = left.iter().filter(|p| alive(p)).collect();
            if alive.is_empty() {
                Ok(())
            } else {
                Err(format!("{alive:?}"))
            }
        })
    };
    for how in ["TERM", "KILL"] {
        let _ = std::fs::remove_file(&pids);
        let (mut sidecar, _api) = serve(&agent, &sqlite_in(dir.path()), &[], &[], dir.path());
        until("the MCP server started its children", PATIENCE, || {
            read().len() == 4
        })
        .await;
        let left = read();
        tokio::task::block_in_place(|| {
            if how == "TERM" {
                sidecar.stop();
                gone(
                    "every process of the MCP server goes with the server",
                    &left,
                );
            } else {
                sidecar.kill();
                // What the server left, at the next start.
                let _ = std::fs::remove_file(&pids);
                let (_again, _api) = serve(&agent, &sqlite_in(dir.path()), &[], &[], dir.path());
                gone(
                    "every process of the MCP server goes by the next start",
                    &left,
                );
            }
        });
    }
    mock.shutdown().await;
}
