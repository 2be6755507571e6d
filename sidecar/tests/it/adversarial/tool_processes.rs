//! A tool that leaves processes behind: a `setsid` child out of the
//! process group the server kills on a timeout, a daemon that
//! double-forks. None of them outlives its call, and the server goes on.

use std::os::unix::fs::PermissionsExt;

use crate::common::*;
use bindery_tests::mock_llm::{last_message, MockLlm, MockReply};
use bindery_tests::sidecar::{Api, Sidecar};
use serde_json::{json, Value};

const LEAVER: &str = r#"#!/usr/bin/env bash
if [[ "${1:-}" == "describe" ]]; then
  cat <<'JSON'
{"slug": "leaver", "description": "Leaves processes behind.",
 "args": [{"name": "mode", "description": "leave or hang", "type": "string",
           "backing_type": "string", "arity": "single", "mode": "dashdashspace"},
          {"name": "pids", "description": "where their ids go", "type": "string",
           "backing_type": "string", "arity": "single", "mode": "dashdashspace"}]}
JSON
  exit 0
fi
shift
while [[ $# -gt 0 ]]; do
  case "$1" in --mode) mode=$2; shift 2;; --pids) pids=$2; shift 2;; *) shift;; esac
done
setsid sleep 300 </dev/null >/dev/null 2>&1 &
echo $! >> "$pids"
( sleep 300 </dev/null >/dev/null 2>&1 & echo $! >> "$pids" )
if [[ "$mode" == hang ]]; then sleep 300; fi
echo left
"#;

fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_tool_starts_outlives_its_call() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let script = tools.join("leaver");
    executable(&script, LEAVER);
    let pids = dir.path().join("pids");
    let mock = MockLlm::start(|req: &Value| {
        let last = last_message(req);
        match last["role"].as_str() {
            Some("tool") => MockReply::text("done"),
            _ => {
                let mode = if last["content"].as_str().unwrap_or("").contains("hang") {
                    "hang"
                } else {
                    "leave"
                };
                MockReply::tool_call("bash_leaver", json!({"mode": mode}))
            }
        }
    })
    .await;
    let agent = dir.path().join("a.yaml");
    std::fs::write(
        &agent,
        format!(
            "apiVersion: bindery.dev/v1alpha1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  model: {{url: \"{}\", name: m}}\n  toolboxes:\n    - bash:\n        directory: \"{}\"\n        bindings:\n          - {{arg: pids, value: {{literal: \"{}\"}}}}\n",
            mock.url(),
            tools.display(),
            pids.display()
        ),
    )
    .unwrap();
    let (_sidecar, api) = serve(
        &agent,
        &sqlite_in(dir.path()),
        &["--tool-timeout", "2"],
        &[],
        dir.path(),
    );
    for prompt in ["leave", "hang"] {
        let _ = std::fs::remove_file(&pids);
        let id = new_session(&api, json!({"agent": "a"})).await;
        let r = message_waited(&api, &id, prompt).await;
        assert_eq!(r.json["status"], "idle", "{}", r.text);
        let left: Vec<String> = std::fs::read_to_string(&pids)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
        for pid in &left {
            assert!(!alive(pid), "{prompt}: process {pid} outlived its call");
        }
    }
    let r = api.call("GET", "/healthz", None, None).await;
    assert_eq!(r.status, 200);
    mock.shutdown().await;
}

/// One bash tool without arguments, `bash_<slug>`, whose script runs
/// `body`, and a model that calls it once and then answers.
struct OneTool {
    dir: tempfile::TempDir,
    mock: MockLlm,
    agent: std::path::PathBuf,
}

impl OneTool {
    async fn new(slug: &str, body: &str) -> OneTool {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join("tools");
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::create_dir_all(dir.path().join("logs")).unwrap();
        let script = tools.join(slug);
        std::fs::write(
            &script,
            format!(
                "#!/usr/bin/env bash\nif [[ \"${{1:-}}\" == describe ]]; then echo '{{\"slug\": \"{slug}\", \"description\": \"{slug}\", \"args\": []}}'; exit 0; fi\n{body}"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let call = format!("bash_{slug}");
        let mock = MockLlm::start(
            move |req: &Value| match last_message(req)["role"].as_str() {
                Some("tool") => MockReply::text("done"),
                _ => MockReply::tool_call(call.clone(), json!({})),
            },
        )
        .await;
        let agent = bash_agent(dir.path(), &mock.url(), &tools);
        OneTool { dir, mock, agent }
    }

    fn serve(&self, extra: &[&str]) -> (Sidecar, Api) {
        serve(
            &self.agent,
            &sqlite_in(self.dir.path()),
            extra,
            &[],
            self.dir.path(),
        )
    }

    /// The server run as `nobody`, as it runs in its pod as a user (some
    /// bounds are the kernel's, which it does not apply to root).
    fn serve_as_nobody(&self, extra: &[&str]) -> (Sidecar, Api) {
        use std::os::unix::process::CommandExt;
        const NOBODY: u32 = 65534;
        for d in [
            self.dir.path().to_path_buf(),
            self.dir.path().join("logs"),
            self.dir.path().join("tools"),
        ] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let mut cmd = std::process::Command::new(bin());
        cmd.arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .arg("--agent-file")
            .arg(&self.agent)
            .args(["--store", &sqlite_in(self.dir.path())])
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("BINDERY_OWNER_TOKEN", OWNER)
            .uid(NOBODY)
            .gid(NOBODY);
        let sidecar = Sidecar::spawn(cmd, &self.dir.path().join("logs"), OWNER);
        let api = Api::new(&sidecar.url);
        (sidecar, api)
    }

    /// One message, answered: the tool's output.
    async fn call(&self, api: &Api) -> String {
        let id = new_session(api, json!({"agent": "a"})).await;
        let r = message_waited(api, &id, "go").await;
        assert_eq!(r.json["status"], "idle", "{}", r.text);
        last_tool_output(&r)
    }
}

/// Each process of a tool's call writes to at most `--tool-memory` MiB:
/// past it its allocations fail (here Python's `MemoryError`), and the
/// server is left as it was. A process the tool starts has the same bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_process_allocates_within_its_memory_bound() {
    let w = OneTool::new(
        "hog",
        r#"python3 -c 'b = bytearray(256 * 1024 * 1024); print("took", len(b))' 2>&1 || echo "refused"
( python3 -c 'b = bytearray(256 * 1024 * 1024); print("child took", len(b))' 2>&1 || echo "child refused" )
python3 -c 'b = bytearray(8 * 1024 * 1024); print("small", len(b))'
"#,
    )
    .await;
    let (_sidecar, api) = w.serve(&["--tool-memory", "64"]);
    let out = w.call(&api).await;
    assert!(
        out.contains("MemoryError") && out.contains("refused"),
        "{out}"
    );
    assert!(out.contains("child refused"), "{out}");
    assert!(!out.contains("took"), "{out}");
    assert!(out.contains("small 8388608"), "{out}");
}

/// Shared memory, which RLIMIT_DATA does not count (a `MAP_SHARED`
/// anonymous mapping): the call's processes together are watched, and a
/// call over `--tool-memory` is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_its_memory_in_shared_pages_is_stopped() {
    let w = OneTool::new(
        "shm",
        r#"python3 -c '
import mmap, time
m = mmap.mmap(-1, 256 << 20)
for i in range(0, 256 << 20, 4096): m[i] = 1
time.sleep(30)
print("kept")
'
"#,
    )
    .await;
    let (_sidecar, api) = w.serve(&["--tool-memory", "64", "--tool-timeout", "60"]);
    let out = w.call(&api).await;
    assert!(
        out.contains("held more than 64 MiB together and were stopped"),
        "{out}"
    );
    assert!(!out.contains("kept"), "{out}");
}

/// The same memory held by a process the call left with `setsid` (an
/// orphan, no longer below the call, now the server's child): the orphan
/// is held to the bound on its own and killed; the call, whose it cannot
/// be told to be (it could be another session's), goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_held_by_a_process_the_call_left_counts_too() {
    let w = OneTool::new(
        "orphan-shm",
        r#"f=$(mktemp)
( setsid python3 -c '
import mmap, os, time
m = mmap.mmap(-1, 256 << 20)
for i in range(0, 256 << 20, 4096): m[i] = 1
print(os.getpid(), flush=True)
time.sleep(30)
' </dev/null 2>/dev/null > "$f" & )
for _ in $(seq 1 400); do [ -s "$f" ] && break; sleep 0.05; done
pid=$(cat "$f"); rm -f "$f"
for _ in $(seq 1 400); do kill -0 "$pid" 2>/dev/null || { echo "orphan gone"; break; }; sleep 0.05; done
echo "call done"
"#,
    )
    .await;
    let (_sidecar, api) = w.serve(&["--tool-memory", "64", "--tool-timeout", "60"]);
    let out = w.call(&api).await;
    assert!(out.contains("orphan gone"), "{out}");
    assert!(out.contains("call done"), "{out}");
}

/// A tree deeper than a sweep could take layer by layer (a chain of 80
/// processes a tool leaves behind, out of its group): stopped whole, then
/// killed; none is alive once the call has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_tree_a_tool_leaves_goes_whole() {
    const DEPTH: usize = 80;
    let pids_dir = tempfile::tempdir().unwrap();
    let pids = pids_dir.path().join("pids");
    let w = OneTool::new(
        "chain",
        &format!(
            r#"chain() {{ echo $BASHPID >> '{pids}'; if [ "$1" -gt 0 ]; then chain $(( $1 - 1 )) & wait; else sleep 300; fi; }}
( setsid bash -c "$(declare -f chain); chain {DEPTH}" </dev/null >/dev/null 2>&1 & )
for _ in $(seq 1 400); do
  [ "$(wc -l < '{pids}' 2>/dev/null || echo 0)" -gt {DEPTH} ] && break
  sleep 0.05
done
echo started
"#,
            pids = pids.display()
        ),
    )
    .await;
    let (_sidecar, api) = w.serve(&[]);
    assert_eq!(w.call(&api).await.trim(), "started");
    let left: Vec<String> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(left.len() > DEPTH, "{}", left.len());
    let alive: Vec<&String> = left.iter().filter(|p| alive(p)).collect();
    assert!(
        alive.is_empty(),
        "{} of {} outlived the call",
        alive.len(),
        left.len()
    );
}

/// A fork bomb (bounded here at 200): under a server that runs as an
/// ordinary user, as in its pod, the tool's forks fail once the user has
/// `--tool-processes` (the tool sees bash's "Resource temporarily
/// unavailable"), and what it started goes with the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_forks_stop_at_the_process_bound() {
    let w = OneTool::new(
        "bomb",
        r#"started=0
for _ in $(seq 1 200); do
  if sleep 300 </dev/null >/dev/null 2>&1 & then started=$((started + 1)); fi
done
echo "started=$started"
"#,
    )
    .await;
    let (sidecar, api) = w.serve_as_nobody(&["--tool-processes", "64"]);
    let id = new_session(&api, json!({"agent": "a"})).await;
    let r = message_waited(&api, &id, "bomb").await;
    let out = last_tool_output(&r);
    assert!(
        out.contains("fork: Resource temporarily unavailable"),
        "{out}"
    );
    assert!(!out.contains("started=200"), "{out}");
    // Nothing it started outlived the call.
    let left = std::process::Command::new("pgrep")
        .args(["-u", "nobody", "-x", "sleep"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
    drop(sidecar);
}

/// The server (as an ordinary user, as in its pod) is not dumpable: a
/// tool running as the same user cannot read its environment or memory
/// from /proc, where the owner token is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_cannot_read_the_servers_environment() {
    let w = OneTool::new(
        "peek",
        r#"tr '\0' '\n' < /proc/$PPID/environ 2>&1 | rev
head -c 100 /proc/$PPID/mem 2>&1 | rev
echo done
"#,
    )
    .await;
    let (_sidecar, api) = w.serve_as_nobody(&[]);
    let out = w.call(&api).await;
    assert!(out.contains("done"), "{out}");
    let reversed: String = OWNER.chars().rev().collect();
    assert!(
        !out.contains(&reversed),
        "the tool read the owner token:\n{out}"
    );
    assert!(
        !out.contains("HTAP="),
        "the tool read the server's environment:\n{out}"
    );
    w.mock.shutdown().await;
}
