//! Helpers and narrowing through the real server, where only it shows
//! them: no secret in its logs while a narrowing travels down the chain
//! or is refused (root → middle → leaf, each agent's model scripted by
//! the mock LLM). The rest of narrowing's logic is tested in process
//! (`sidecar/api/tests/inproc/helpers.rs`).

use crate::common::*;
use bindery_tests::fixtures::chain::{self, answer, message, root_session};
use bindery_tests::mock_llm::tool_schema;
use bindery_tests::scripts::chain_script;
use bindery_tests::sidecar::{Api, Sidecar};
use serde_json::{json, Value};

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

async fn start(w: &World) -> (Sidecar, Api) {
    let root = chain::agents(w.dir.path(), &w.mock.url());
    serve(&root, &w.store, &["--no-stream"], &[], w.dir.path())
}

/// Root binds a leaf tool's argument two levels down in one call; middle
/// narrows further but cannot rebind what root bound; describe_agent from
/// middle does not show it; the token travels root → middle → leaf by
/// parameter (message scope through `with`) and no model ever sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_travels_down_the_chain_and_only_narrows() {
    let w = World::new(chain_script).await;
    let (sidecar, api) = start(&w).await;
    let r = api
        .call(
            "POST",
            "/v1/sessions?wait=true",
            Some(OWNER),
            Some(&json!({"agent": "root", "prompt": "go", "params": {"gh_token": CANARY}})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let out = answer(&r);
    assert!(
        out.contains("argv: [--repo] [r-root] [n-mid]"),
        "root's value won over middle's and the model's: {out}"
    );
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(CANARY.as_bytes()));
    assert!(
        out.contains(&format!("token-sha256: {digest}")),
        "the token reached the leaf's env: {out}"
    );
    assert!(out.contains("agent: leaf"), "{out}");
    // What middle's describe_agent showed of leaf: repo (bound by root) and
    // repo-token (bound by leaf's file) are not open; note is.
    let described = out
        .split("middle described: ")
        .nth(1)
        .unwrap()
        .split(" | leaf:")
        .next()
        .unwrap();
    let view: Value = serde_json::from_str(described).unwrap();
    assert_eq!(view["slug"], "leaf");
    let open: Vec<&str> = view["tools"][0]["open"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| text(&a["arg"]))
        .collect();
    assert_eq!(open, ["note", "level", "body"], "{view}");
    assert_eq!(view["parameters"][0]["name"], "token");
    assert_eq!(
        view["parameters"][0]["bound"], true,
        "covered by middle's with"
    );

    // What each model was shown.
    let requests = w.mock.requests();
    for req in &requests {
        assert!(!req.to_string().contains(CANARY), "a model saw the token");
        if text(&req["messages"][0]["content"]) == "You are LEAF." {
            let schema = tool_schema(req, "bash_probe").unwrap();
            assert!(
                schema["properties"].get("repo").is_none(),
                "root bound repo for this call: {schema}"
            );
            assert!(schema["properties"].get("repo-token").is_none());
            assert!(
                schema["properties"].get("note").is_none(),
                "middle bound note for this call"
            );
        }
        if text(&req["messages"][0]["content"]) == "You are ROOT." {
            let names = bindery_tests::mock_llm::tool_names(req);
            assert_eq!(
                names,
                [
                    "prompt_agent_middle",
                    "prompt_agent_sealed",
                    "describe_agent",
                    "derive_agent"
                ]
            );
            let sealed = tool_schema(req, "prompt_agent_sealed").unwrap();
            assert!(
                sealed["properties"].get("bindings").is_none(),
                "not narrowable: no bindings offered"
            );
        }
    }
    assert!(!r.text.contains(CANARY));
    assert!(!sidecar.logs().contains(CANARY));
}

/// Narrowings aimed below the helper are checked before it runs: a secret
/// routed into a command-line argument, a `**` binding that fills nothing,
/// a value of the wrong type; and a call-time `with` cannot set a
/// helper's process-scope parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowings_below_are_checked_before_the_helper_runs() {
    let w = World::new(chain_script).await;
    let (sidecar, api) = start(&w).await;
    let id = root_session(&api).await;
    let before = w.mock.request_count();
    for (prompt, refusal) in [
        ("secret argv", "helper `middle`: `agent: leaf`: `note` of `bash_probe` is passed on the command line (positional), where other processes can read it; a secret may fill only an `env` or `stdin` argument"),
        ("nothing below", "helper `middle`: `agent: **`: no tool matching `*` of `middle` or of its narrowable helpers has an argument `colour`"),
        ("wrong type below", "helper `middle`: `agent: leaf`: `level` of `bash_probe` takes an integer, got a string"),
        ("with process", "`with.region`: a process-scope parameter of helper `middle`; only the operator sets it"),
    ] {
        let out = answer(&message(&api, &id, prompt).await);
        assert!(out.contains(refusal), "{prompt}: {out}");
    }
    // Only root's model was asked: no helper ran.
    assert_eq!(w.mock.request_count() - before, 8);
    assert!(!sidecar.logs().contains(CANARY));
}
